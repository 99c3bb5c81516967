"""Delivery reports: produced by the sender thread, served on the application's thread.

As in librdkafka, callbacks never run on the background thread: the application decides
when (and on which thread) its ``on_delivery`` code runs by calling ``poll``/``flush``.
A message counts as outstanding (``len(producer)``) until its report has been served,
which is what lets ``flush()`` mean "every callback has run".
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from app.client.batching import DeliveryCallback, PendingRecords
from app.client.message import DeliveredMessage
from app.errors import KafkaError


@dataclass(slots=True)
class Outcome:
    """How records sent together ended: stored at ``base_offset`` onwards, or ``error``.

    One per batch, not one per record: the sender thread only hands the batch over, and the
    per-record work (a ``Message`` for each callback) happens on the thread that serves the
    reports, and only for records that have a callback to receive it.
    """

    topic: str
    partition: int
    records: PendingRecords
    base_offset: int
    error: KafkaError | None
    completed: float  # time.monotonic() when the outcome was known

    def rest(self, start: int) -> Outcome:
        """The outcome of ``records[start:]``."""
        offset = self.base_offset + start if self.error is None else self.base_offset
        return Outcome(
            self.topic,
            self.partition,
            self.records.tail(start),
            offset,
            self.error,
            self.completed,
        )


class DeliveryReports:
    """Outcomes waiting to be served, and the count of messages not served yet.

    ``lock`` may be shared with the record queues (the producer passes its accumulator's):
    ``produce()`` then checks the queue limits, counts the message and queues it under one
    lock, and the sender thread has one lock less to contend for with the caller.
    ``outstanding`` is public for that check, guarded by ``lock``.
    """

    def __init__(self, lock: threading.RLock | None = None) -> None:
        self._lock = lock or threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._outcomes: deque[Outcome] = deque()
        self.outstanding = 0

    def __len__(self) -> int:
        return self.outstanding  # one int read: needs no lock

    def accepted(self, count: int = 1) -> None:
        """Messages handed to the producer: outstanding until their reports are served."""
        with self._lock:
            self.outstanding += count

    def push(self, outcomes: list[Outcome]) -> None:
        if not outcomes:
            return
        with self._lock:
            self._outcomes.extend(outcomes)
            self._cond.notify_all()

    def push_one(
        self,
        topic: str,
        partition: int,
        records: PendingRecords,
        base_offset: int,
        error: KafkaError | None,
    ) -> None:
        self.push([Outcome(topic, partition, records, base_offset, error, time.monotonic())])

    def wake(self) -> None:
        """Let a waiting ``serve`` re-check (e.g. on close)."""
        with self._lock:
            self._cond.notify_all()

    def serve(self, timeout: float | None, default_callback: DeliveryCallback | None) -> int:
        """Run the callbacks of every report ready, waiting up to ``timeout`` seconds
        (None: without limit) for the first. Returns how many were served.

        The reports taken are counted as served at once, under the one lock that takes
        them, rather than with one lock per record. The one difference it makes: a
        callback asking ``len()`` no longer counts the reports this poll serves after its
        own. (A thread that ``flush``es concurrently could always return while another's
        last callback still ran.)

        A callback that raises stops the serving and the exception propagates, as from
        confluent-kafka's poll(); the remaining reports stay queued, in their order, and
        outstanding again.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        with self._lock:
            while not self._outcomes:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return 0
                self._cond.wait(remaining)
            outcomes = list(self._outcomes)
            self._outcomes.clear()
            served = sum(len(outcome.records.records) for outcome in outcomes)
            self.outstanding -= served
        for position, outcome in enumerate(outcomes):
            if default_callback is not None or any(outcome.records.callbacks):
                self._serve_one(outcome, outcomes, position, default_callback)
        return served

    def _serve_one(
        self,
        outcome: Outcome,
        outcomes: list[Outcome],
        position: int,
        default_callback: DeliveryCallback | None,
    ) -> None:
        """Run each record's callback (its own, else ``default_callback``) with its report;
        ``outcome`` is ``outcomes[position]``, the later ones to requeue if one raises.

        The per-record loop of every delivery, on the application's thread: the fields
        the records share are read once and a report is built only for a record with a
        callback.
        """
        topic, partition, error, completed = (
            outcome.topic,
            outcome.partition,
            outcome.error,
            outcome.completed,
        )
        run = outcome.records
        records, enqueued = run.records, run.enqueued
        offset, step = (outcome.base_offset, 1) if error is None else (-1, 0)
        for index, callback in enumerate(run.callbacks):
            callback = callback or default_callback
            if callback is None:
                continue
            message = DeliveredMessage(
                topic, partition, offset + step * index, records[index], error,
                completed - enqueued[index],
            )  # fmt: skip
            try:
                callback(error, message)
            except BaseException:
                self._requeue([outcome.rest(index + 1), *outcomes[position + 1 :]])
                raise

    def _requeue(self, unserved: list[Outcome]) -> None:
        """Put reports a raising callback left unserved back at the front, outstanding."""
        unserved = [outcome for outcome in unserved if outcome.records.records]
        with self._lock:
            self._outcomes.extendleft(reversed(unserved))
            self.outstanding += sum(len(outcome.records.records) for outcome in unserved)
