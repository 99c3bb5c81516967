"""Records waiting to be sent, grouped per partition, and the batches formed from them.

A batch is formed only when its partition has nothing in flight, and its sequence numbers
are fixed at that moment and kept across every retry. Both rules together are what make
retries safe under KIP-98: the broker sees each partition's batches in sequence order,
so a resent batch is either recognised as a duplicate or is the next one expected.

Each partition belongs to one of the sender's lanes (``max.in.flight``: up to that many
requests in flight at once), fixed when its queue is created: the lanes are dealt out in
turn, so the first partitions written each get a lane of their own. A lane forms, sends
and retries only its own partitions' batches, so the rules above hold per lane unchanged,
whichever lane's request completes first (docs/design.md rule 28).
"""

from __future__ import annotations

import threading
from bisect import bisect_right
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from itertools import accumulate
from typing import Any

from app.errors import KafkaError
from app.protocol import (
    NO_PRODUCER_EPOCH,
    NO_PRODUCER_ID,
    NO_SEQUENCE,
    ProduceRequest,
    RecordFields,
    increment_sequence,
    record_size_bytes,
)

DeliveryCallback = Callable[[KafkaError | None, Any], Any]


class PendingRecords:
    """A run of one partition's produced records, in produce order, from ``produce()`` until
    their delivery reports are served: what one batch sends and one outcome reports.

    Kept as columns, not as an object per record. ``produce()`` runs once per record on the
    application's thread, where building a dataclass or a NamedTuple (through its Python
    ``__new__``) costs more than the appends here; and any object but a plain tuple of
    plain values (an object holding a callback, a tuple subclass) stays tracked by the
    garbage collector, whose full collections then walk every queued record again each
    time the queue grows by a quarter: measured, half of ``produce()``'s time. A record is
    one plain ``RecordFields`` tuple, which the collector stops tracking at its first
    look, and one entry in each of two lists.

    ``records`` are what the Produce handler takes (headers encoded for storage), so a
    request costs no per-record work; ``callbacks`` are each record's ``on_delivery`` (None:
    the config's); ``enqueued`` each record's ``time.monotonic()`` at ``produce()``, for
    linger.ms, message.timeout.ms and the report's latency; ``size`` the run's bytes as
    ``record_size_bytes`` counts them. A run is never empty.
    """

    __slots__ = ("callbacks", "enqueued", "records", "size")

    def __init__(
        self,
        records: list[RecordFields] | None = None,
        callbacks: list[DeliveryCallback | None] | None = None,
        enqueued: list[float] | None = None,
        size: int = 0,
    ) -> None:
        self.records: list[RecordFields] = records if records is not None else []
        self.callbacks: list[DeliveryCallback | None] = callbacks if callbacks is not None else []
        self.enqueued: list[float] = enqueued if enqueued is not None else []
        self.size = size

    @classmethod
    def one(
        cls, record: RecordFields, callback: DeliveryCallback | None, enqueued: float, size: int
    ) -> PendingRecords:
        return cls([record], [callback], [enqueued], size)

    def __len__(self) -> int:
        return len(self.records)

    def tail(self, start: int) -> PendingRecords:
        """``records[start:]`` as a run of its own (a report left unserved)."""
        records = self.records[start:]
        return PendingRecords(
            records, self.callbacks[start:], self.enqueued[start:], _size_of(records)
        )

    def take_head(self, count: int) -> PendingRecords:
        """Remove the first ``count`` records and return them as a run (expired ones)."""
        head = PendingRecords(self.records[:count], self.callbacks[:count], self.enqueued[:count])
        head.size = _size_of(head.records)
        del self.records[:count], self.callbacks[:count], self.enqueued[:count]
        self.size -= head.size
        return head


def _size_of(records: list[RecordFields]) -> int:
    """The bytes of ``records`` as ``produce()`` counted them (rare paths only)."""
    return sum(record_size_bytes(key, value, headers) for key, value, _, headers in records)


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    """The (producer_id, producer_epoch) batches are stamped with; -1/-1 when not idempotent."""

    producer_id: int = NO_PRODUCER_ID
    producer_epoch: int = NO_PRODUCER_EPOCH

    @property
    def idempotent(self) -> bool:
        return self.producer_id != NO_PRODUCER_ID


@dataclass(slots=True)
class Batch:
    topic: str
    partition: int
    records: PendingRecords
    producer_id: int
    producer_epoch: int
    base_sequence: int
    transactional_id: str | None = None
    is_transactional: bool = False
    attempts: int = 0
    next_attempt: float = 0.0
    # Set after a lost connection: the batch may already be in the log.
    ambiguous: bool = False
    # Sent with its transaction's EndTxn (a commit's last batches): if its outcome is
    # unknown, the transaction may have committed with it, so it is retried until the
    # answer is known rather than failed by message.timeout.ms (see ``Sender``).
    ends_transaction: bool = False
    # The sender lane of its partition; a batch sent with its transaction's EndTxn is
    # retried with the others of that request (``together``), by the first one's lane,
    # since an answer that was lost must be asked for again with the very same request.
    lane: int = 0
    together: list[Batch] | None = None
    # An attempt is under way (on its lane's thread, or the committing thread's
    # ``Sender.send_all_here``): not to be retried or purged meanwhile.
    sending: bool = False
    last_error: KafkaError | None = None
    # Built on the first attempt; every retry sends the very same request.
    _request: ProduceRequest | None = None

    @property
    def first_enqueued(self) -> float:
        return self.records.enqueued[0]

    def request(self) -> ProduceRequest:
        if self._request is None:
            self._request = ProduceRequest(
                topic=self.topic,
                partition=self.partition,
                records=self.records.records,
                producer_id=self.producer_id,
                producer_epoch=self.producer_epoch,
                base_sequence=self.base_sequence,
                transactional_id=self.transactional_id,
                is_transactional=self.is_transactional,
            )
        return self._request


@dataclass(slots=True)
class PartitionQueue:
    # Each run within one batch's limits, cut as records arrive: the first is the next
    # batch, formed without touching its records (``RecordAccumulator.append``).
    runs: deque[PendingRecords] = field(default_factory=deque)
    count: int = 0  # records queued
    size: int = 0  # their bytes
    in_flight: Batch | None = None
    # The sender lane that sends this partition's batches, for the producer's life.
    lane: int = 0
    # Sequence numbers belong to one producer identity; a new identity starts at 0.
    sequence_owner: ProducerIdentity = field(default_factory=ProducerIdentity)
    next_sequence: int = 0

    def take_sequence(self, identity: ProducerIdentity, count: int) -> int:
        if not identity.idempotent:
            return NO_SEQUENCE
        if self.sequence_owner != identity:
            self.sequence_owner = identity
            self.next_sequence = 0
        base = self.next_sequence
        self.next_sequence = increment_sequence(base, count)
        return base


@dataclass(frozen=True, slots=True)
class BatchLimits:
    max_records: int
    max_bytes: int
    linger_s: float


class RecordAccumulator:
    """The queues shared by ``produce()`` callers and the sender thread, under one lock.

    ``cond`` is public so the sender's lanes can wait on it for new work; ``lock`` is its
    lock, which ``produce()`` takes directly (a Condition's own ``with`` costs a Python call
    per record). ``lanes``: how many sender lanes the partitions are dealt to; ``new_lane``
    is called (holding the lock) when a lane gets its first partition, so its thread need
    only run once it has something to send.
    """

    def __init__(self, limits: BatchLimits, lanes: int = 1) -> None:
        self.limits = limits
        self.lanes = lanes
        self.new_lane: Callable[[int], None] | None = None
        self.lock = threading.RLock()
        self.cond = threading.Condition(self.lock)
        self._queues: dict[tuple[str, int], PartitionQueue] = {}
        self._queued_records = 0
        # Public for ``produce()``'s queue.buffering.max.kbytes check (holding lock).
        self.queued_bytes = 0
        # While positive, batches are sent without waiting for linger.ms (flush, close).
        self.flushing = 0
        # Lanes waiting on ``cond`` and not woken yet: only then can a new record be news.
        self.sender_waiting = 0
        # Counts the wake-ups that reset ``sender_waiting``, so a lane woken by one does
        # not count itself out a second time.
        self._wakes = 0
        # Requests a lane (or a commit on the caller's thread) is sending: each thread
        # sending one needs the GIL back when its answer comes (``produce()`` reads it).
        self.requests_out = 0

    # --- caller side (holding lock) ------------------------------------------------------

    def partitions(self) -> int:
        """How many partitions have had records queued."""
        return len(self._queues)

    def queued(self) -> tuple[int, int]:
        """(records, bytes) not yet formed into a batch."""
        return self._queued_records, self.queued_bytes

    def append(
        self,
        topic: str,
        partition: int,
        record: RecordFields,
        size: int,
        callback: DeliveryCallback | None,
        enqueued: float,
    ) -> bool:
        """Queue a record; returns whether it completed a batch's worth of records or bytes
        in its partition's queue (the sticky partitioner moves on then, as Kafka's does
        when a batch fills, however fast records arrive).

        The record joins its queue's last run unless that run is a batch's worth already
        (``max_records``, or ``max_bytes`` with this record; a record bigger than that
        alone makes a run), so runs are the batches a drain takes, largest first, as
        ``drain`` once cut them; this costs a comparison here instead of a record's move
        on the sender's side, which holds the GIL the caller needs too.
        """
        limits = self.limits
        queue = self._queues.get((topic, partition))
        if queue is None:
            queue = self._new_queue(topic, partition)
        runs = queue.runs
        if (
            not runs
            or len((run := runs[-1]).records) >= limits.max_records
            or run.size + size > limits.max_bytes
        ):
            run = PendingRecords()
            runs.append(run)
        run.records.append(record)
        run.callbacks.append(callback)
        run.enqueued.append(enqueued)
        run.size += size
        before = queue.size
        queue.size = after = before + size
        queue.count = count = queue.count + 1
        self._queued_records += 1
        self.queued_bytes += size
        # Wake a waiting sender when its deadline changes (first record) or a batch is full.
        # A busy sender looks at every queue again before it waits, so it needs no wake-up:
        # notifying it per record would cost the caller a Python call each time.
        if self.sender_waiting and (count == 1 or self._full(queue) or limits.linger_s <= 0):
            self._wake_waiting()  # woken: each looks at its queues before waiting again
        return (
            count % limits.max_records == 0
            or before // limits.max_bytes != after // limits.max_bytes
        )

    def append_many(
        self,
        topic: str,
        partition: int,
        records: list[RecordFields],
        sizes: list[int],
        enqueued: float,
    ) -> None:
        """Queue many records of one partition at once (``Producer.produce_batch``), cut into
        runs exactly as ``append`` would cut them one by one, with one wake-up at the end.
        (``append`` keeps its own copy of the cut: it runs once per ``produce()``, where a
        call more is a tenth of its time.)"""
        limits = self.limits
        queue = self._queues.get((topic, partition))
        if queue is None:
            queue = self._new_queue(topic, partition)
        runs = queue.runs
        run = runs[-1] if runs else None
        # Whole slices at a time: the last record that fits is found by bisecting the
        # sizes' running sums, so the work per record is the slices' copies, in C.
        sums = list(accumulate(sizes, initial=0))
        at, n = 0, len(records)
        while at < n:
            if run is None or len(run.records) >= limits.max_records:
                run = PendingRecords()
                runs.append(run)
            fits = bisect_right(sums, sums[at] + limits.max_bytes - run.size) - 1
            end = min(fits, at + limits.max_records - len(run.records), n)
            if end <= at:
                if run.records:  # this record does not fit in the run under way
                    run = None
                    continue
                end = at + 1  # a record bigger than the limit alone makes a run
            run.records += records[at:end]
            run.callbacks += [None] * (end - at)
            run.enqueued += [enqueued] * (end - at)
            run.size += sums[end] - sums[at]
            at = end
        added = sum(sizes)
        before = queue.count
        queue.size += added
        queue.count += len(records)
        self._queued_records += len(records)
        self.queued_bytes += added
        if self.sender_waiting and (before == 0 or self._full(queue) or limits.linger_s <= 0):
            self._wake_waiting()

    def _new_queue(self, topic: str, partition: int) -> PartitionQueue:
        index = len(self._queues)
        queue = self._queues[(topic, partition)] = PartitionQueue(lane=index % self.lanes)
        if index < self.lanes and self.new_lane is not None:
            self.new_lane(index)
        return queue

    def _wake_waiting(self) -> None:
        self.sender_waiting = 0
        self._wakes += 1
        self.cond.notify_all()

    def fits_one_batch_each(self) -> bool:
        """Whether every partition's queued records fit in one batch (holding lock)."""
        return all(len(q.runs) <= 1 for q in self._queues.values())

    def wait(self, timeout: float | None) -> None:
        """A sender lane's wait for work (holding lock)."""
        self.sender_waiting += 1
        wakes = self._wakes
        try:
            self.cond.wait(timeout)
        finally:
            if self._wakes == wakes:  # not counted out by the wake-up
                self.sender_waiting -= 1

    # --- sender side (holding cond) ------------------------------------------------------

    def mark_sending(self, batches: list[Batch]) -> None:
        """``batches`` go out now in one request: no retry of theirs starts meanwhile."""
        if batches:
            self.requests_out += 1
            for batch in batches:
                batch.sending = True

    def sent(self, batches: list[Batch]) -> None:
        """The request of ``mark_sending``'s ``batches`` is answered or given up."""
        if batches:
            self.requests_out -= 1
            for batch in batches:
                batch.sending = False

    def _full(self, queue: PartitionQueue) -> bool:
        return queue.count >= self.limits.max_records or queue.size >= self.limits.max_bytes

    def drain(
        self,
        now: float,
        identity: ProducerIdentity,
        transactional_id: str | None = None,
        is_transactional: bool = False,
        lane: int | None = None,
    ) -> tuple[list[Batch], float | None]:
        """Form a batch for every idle partition (of ``lane``; None: of every lane) that is
        ready; also return when the next becomes ready by linger.ms (None if none waits)."""
        batches: list[Batch] = []
        next_ready: float | None = None
        for (topic, partition), queue in self._queues.items():
            if queue.in_flight is not None or not queue.runs:
                continue
            if lane is not None and queue.lane != lane:
                continue
            ready_at = queue.runs[0].enqueued[0] + self.limits.linger_s
            if not (self.flushing or ready_at <= now or self._full(queue)):
                next_ready = ready_at if next_ready is None else min(next_ready, ready_at)
                continue
            records = self._take(queue)
            batch = Batch(
                topic,
                partition,
                records,
                identity.producer_id,
                identity.producer_epoch,
                queue.take_sequence(identity, len(records)),
                transactional_id,
                is_transactional,
                lane=queue.lane,
            )
            queue.in_flight = batch
            batches.append(batch)
        return batches, next_ready

    def _take(self, queue: PartitionQueue) -> PendingRecords:
        """The next batch's records: the queue's first run, as ``append`` cut it."""
        records = queue.runs.popleft()
        queue.count -= len(records.records)
        queue.size -= records.size
        self._queued_records -= len(records.records)
        self.queued_bytes -= records.size
        return records

    def complete(self, batch: Batch) -> None:
        """The batch is finished (delivered or failed): its partition may send again."""
        queue = self._queues[(batch.topic, batch.partition)]
        if queue.in_flight is batch:
            queue.in_flight = None
        # News to a waiting lane only if the partition has records to send now.
        if queue.runs and self.sender_waiting:
            self._wake_waiting()

    def in_flight(self, lane: int | None = None) -> list[Batch]:
        """The batches in flight (of ``lane``; None: of every lane)."""
        return [
            q.in_flight
            for q in self._queues.values()
            if q.in_flight is not None and (lane is None or q.lane == lane)
        ]

    def expire(
        self, now: float, timeout_s: float, lane: int | None = None
    ) -> list[tuple[str, int, PendingRecords]]:
        """Remove records (of ``lane``; None: of every lane) that waited longer than
        message.timeout.ms without being sent, as runs in their queues' order.

        Only records not yet in a batch: they have no sequence number, so dropping them
        leaves no gap for the broker to see.
        """
        expired: list[tuple[str, int, PendingRecords]] = []
        for (topic, partition), queue in self._queues.items():
            if lane is not None and queue.lane != lane:
                continue
            runs = queue.runs
            while runs and now - runs[0].enqueued[0] >= timeout_s:
                run = runs[0]
                old = _leading_at_least(run.enqueued, now - timeout_s)
                if old == len(run.records):
                    runs.popleft()
                else:
                    run = run.take_head(old)
                queue.count -= len(run.records)
                queue.size -= run.size
                self._queued_records -= len(run.records)
                self.queued_bytes -= run.size
                expired.append((topic, partition, run))
        return expired

    def oldest_enqueued(self, lane: int | None = None) -> float | None:
        oldest = [
            q.runs[0].enqueued[0]
            for q in self._queues.values()
            if q.runs and (lane is None or q.lane == lane)
        ]
        return min(oldest) if oldest else None

    def reset_sequences(self) -> None:
        """Forget sequence numbering (after a new producer identity, numbering restarts)."""
        for queue in self._queues.values():
            queue.sequence_owner = ProducerIdentity()
            queue.next_sequence = 0


def _leading_at_least(enqueued: list[float], cutoff: float) -> int:
    """How many of the first ``enqueued`` times are at or before ``cutoff``, up to the first
    later one (records leave a queue only from its front)."""
    for index, at in enumerate(enqueued):
        if at > cutoff:
            return index
    return len(enqueued)
