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
from operator import attrgetter

from app.client.batching import DeliveryCallback, PendingRecord
from app.client.message import TIMESTAMP_CREATE_TIME, Message
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
    records: list[PendingRecord]
    base_offset: int
    error: KafkaError | None
    completed: float  # time.monotonic() when the outcome was known

    def message(self, index: int) -> Message:
        record = self.records[index]
        stored = record.record
        return Message(
            topic=self.topic,
            partition=self.partition,
            offset=self.base_offset + index if self.error is None else -1,
            key=stored.key,
            value=stored.value,
            headers=record.headers,
            timestamp=stored.timestamp,
            timestamp_type=TIMESTAMP_CREATE_TIME,
            error=self.error,
            latency=self.completed - record.enqueued,
        )

    def rest(self, start: int) -> Outcome:
        """The outcome of ``records[start:]``."""
        offset = self.base_offset + start if self.error is None else self.base_offset
        return Outcome(
            self.topic, self.partition, self.records[start:], offset, self.error, self.completed
        )


_ON_DELIVERY = attrgetter("on_delivery")


class DeliveryReports:
    """Outcomes waiting to be served, and the count of messages not served yet.

    ``lock`` may be shared with the record queues (the producer passes its accumulator's):
    ``produce()`` then checks the queue limits, counts the message and queues it under one
    lock, and the sender thread has one lock less to contend for with the caller.
    """

    def __init__(self, lock: threading.RLock | None = None) -> None:
        self._lock = lock or threading.RLock()
        self._cond = threading.Condition(self._lock)
        self._outcomes: deque[Outcome] = deque()
        self._outstanding = 0

    def __len__(self) -> int:
        return self._outstanding  # one int read: needs no lock

    def accepted(self, count: int = 1) -> None:
        """Messages handed to the producer: outstanding until their reports are served."""
        with self._lock:
            self._outstanding += count

    def accept(self, limit: int) -> bool:
        """Count one more message as outstanding unless ``limit`` are already."""
        with self._lock:
            if self._outstanding >= limit:
                return False
            self._outstanding += 1
            return True

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
        records: list[PendingRecord],
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

        A callback that raises stops the serving and the exception propagates, as from
        confluent-kafka's poll(); the remaining reports stay queued.
        """
        deadline = None if timeout is None else time.monotonic() + max(0.0, timeout)
        lock = self._lock
        with lock:
            while not self._outcomes:
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return 0
                self._cond.wait(remaining)
            outcomes = list(self._outcomes)
            self._outcomes.clear()
        served = 0
        for position, outcome in enumerate(outcomes):
            error = outcome.error
            if default_callback is None and not any(map(_ON_DELIVERY, outcome.records)):
                # No callback to run: the whole batch is served at once (one lock, not one
                # per record; nothing can observe the count in between).
                with lock:
                    self._outstanding -= len(outcome.records)
                served += len(outcome.records)
                continue
            for index, record in enumerate(outcome.records):
                served += 1
                with lock:
                    self._outstanding -= 1
                callback = record.on_delivery or default_callback
                if callback is None:
                    continue
                try:
                    callback(error, outcome.message(index))
                except BaseException:
                    unserved = [outcome.rest(index + 1), *outcomes[position + 1 :]]
                    with lock:
                        self._outcomes.extendleft(reversed([o for o in unserved if o.records]))
                    raise
        return served
