"""The producer's background sender: batches out, delivery reports back.

All produce requests are sent here, one batch per partition in flight, by the sender's
lanes (or, for a commit's last batches, on the committing thread: ``send_all_here``).
``max.in.flight.requests.per.connection`` lanes at most, each a thread with at most one
request in flight, each request on a connection of its own from the producer's pool:
PostgreSQL merges the WAL flushes of commits that overlap, so a producer writing several
partitions keeps up to that many requests committing at once. Each partition belongs to
one lane (``RecordAccumulator``: dealt out in turn as partitions are first written), and
a lane's batches ready at the same time go out in one request (one DB transaction, one
COMMIT), each answered on its own, as Kafka sends one request per leader; a partition's
batches, and the retries among them, therefore go out in order whichever lane's request
completes first (docs/design.md rule 28). With one lane, every partition's batches share
one request at a time. A batch that
fails retriably (including a lost database connection, whose outcome is unknown) is resent
unchanged, with the same producer_id, producer_epoch and base_sequence, so the broker
either appends it or recognises it and answers with the offsets it was first given. A
batch fails for good on a non-retriable error, after ``retries`` attempts, or once its
oldest record is older than ``message.timeout.ms``; none of these fails a batch that went
out with its transaction's EndTxn and whose outcome is unknown (an unresolved commit):
reporting it failed could contradict a transaction that committed with it, so it is sent
again until an answer settles it, and the commit's own timeout, which is retriable,
governs instead.

Requests go out through ``transport`` (``Broker.handle`` in process). A transactional
producer attaches its transaction manager (``attach``, a ``TransactionHooks``), so the
manager never forms or sends batches itself: ``transactional_id``/``is_transactional`` stamp
the batches formed while a transaction is open; the hooks send the ready batches, with
their new partitions' registration and, for a commit's last batches, the EndTxn, in the
same request; and they hear of batches that failed for good and of records that timed out
before they were sent (either moves the transaction to an abortable state: a commit must
never succeed without them).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Protocol

from app.broker import Broker
from app.client.batching import Batch, ProducerIdentity, RecordAccumulator
from app.client.connection import is_connection_error, kafka_error
from app.client.delivery import DeliveryReports, Outcome
from app.errors import KafkaError
from app.protocol import (
    ACKS_ALL,
    ProduceBatchesRequest,
    ProduceBatchesResponse,
    ProduceResponse,
)

log = logging.getLogger(__name__)

ProduceTransport = Callable[[ProduceBatchesRequest], ProduceBatchesResponse]


class TransactionHooks(Protocol):
    """What a transaction manager does with the sender's batches."""

    def send_together(self, batches: list[Batch]) -> list[ProduceResponse | KafkaError]:
        """One request for ``batches``: per batch, the broker's answer, or an error decided
        before the broker answered it (its partition's registration refused)."""

    def batch_failed(self, batch: Batch, error: KafkaError) -> None:
        """A batch failed for good."""

    def records_expired(self, error: KafkaError) -> None:
        """Records timed out before they were sent."""


class Sender:
    def __init__(
        self,
        broker: Broker,
        accumulator: RecordAccumulator,
        reports: DeliveryReports,
        *,
        identity: ProducerIdentity,
        require_identity: bool,
        retry_backoff_s: float,
        message_timeout_s: float | None,
        max_retries: int,
        acks: int = ACKS_ALL,
        identity_provider: Callable[[], ProducerIdentity] | None = None,
        on_batch_formed: Callable[[Batch], None] | None = None,
        name: str = "kip98-producer-sender",
    ) -> None:
        self.broker = broker
        self.accumulator = accumulator
        self.reports = reports
        # Guarded by accumulator.cond; batches copy it when they are formed.
        self.identity = identity
        # An idempotent producer must not send before it has an identity.
        self.require_identity = require_identity
        self.retry_backoff_s = retry_backoff_s
        self.message_timeout_s = message_timeout_s
        self.max_retries = max_retries
        self.acks = acks
        # Called on this thread for a fresh identity after a batch failed for good, since its
        # sequence numbers may or may not be in the log and later batches would not line up.
        self.identity_provider = identity_provider
        self.on_batch_formed = on_batch_formed
        # Where requests go: the broker in process (fault-injection tests wrap it).
        self.transport: ProduceTransport = broker.handle
        # --- transactions (see module docstring) ---
        self.transactional_id: str | None = None
        self.is_transactional = False
        self._transactions: TransactionHooks | None = None

        self._needs_identity = False
        self._renewing = False
        self._stopping = False
        self._name = name
        # One thread per lane, started when the lane gets its first partition (the
        # accumulator deals partitions to lanes); guarded by accumulator.cond.
        self._lanes: dict[int, threading.Thread] = {}
        self._started = False
        accumulator.new_lane = self._lane_needed

    def attach(self, transactions: TransactionHooks) -> None:
        """Hand the ready batches to a transaction manager (before ``start``)."""
        self._transactions = transactions

    # --- lifecycle ---------------------------------------------------------------------

    @property
    def lanes(self) -> int:
        """How many requests may be in flight at once (``max.in.flight``)."""
        return self.accumulator.lanes

    def start(self) -> None:
        with self.accumulator.cond:
            self._started = True
            for lane in range(min(self.lanes, self.accumulator.partitions())):
                self._lane_needed(lane)

    def _lane_needed(self, lane: int) -> None:
        """Start ``lane``'s thread unless it runs already (holding accumulator.cond)."""
        if not self._started or self._stopping or lane in self._lanes:
            return
        name = self._name if self.lanes == 1 else f"{self._name}-{lane}"
        thread = threading.Thread(target=self._run, args=(lane,), name=name, daemon=True)
        self._lanes[lane] = thread
        thread.start()

    def stop(self, timeout: float | None = None) -> None:
        """Stop every lane; whatever is still queued or in flight is reported as _DESTROY
        (by each lane as it stops, and here for whatever no lane was left to report)."""
        with self.accumulator.cond:
            self._stopping = True
            self.accumulator.cond.notify_all()
            threads = list(self._lanes.values())
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in threads:
            if thread.is_alive() and threading.current_thread() is not thread:
                thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        with self.accumulator.cond:
            self._purge(time.monotonic(), None)

    def wake(self) -> None:
        with self.accumulator.cond:
            self.accumulator.cond.notify_all()

    # --- the loop ----------------------------------------------------------------------

    def _run(self, lane: int) -> None:
        while True:
            try:
                if not self._step(lane):
                    return
            except Exception:
                # The thread must outlive any surprise, or flush() would wait forever.
                log.exception("producer sender: unexpected error; continuing")
                time.sleep(self.retry_backoff_s)

    def _step(self, lane: int) -> bool:
        """Wait for ``lane``'s work, then send it: one request, so a lane has at most one
        in flight. False once stopped."""
        acc = self.accumulator
        renew = False
        batches: list[Batch] = []
        fresh: list[Batch] = []
        with acc.cond:
            while True:
                now = time.monotonic()
                if self._stopping:
                    self._purge(now, lane)
                    return False
                expired = (
                    acc.expire(now, self.message_timeout_s, lane) if self.message_timeout_s else []
                )
                if expired and self._transactions is not None:
                    # Under the lock, before any lane can send a commit's EndTxn without them.
                    self._transactions.records_expired(
                        KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out")
                    )
                if self._needs_identity:
                    # One lane renews it; the others send nothing until it is renewed.
                    renew = not self._renewing
                    self._renewing = True
                    if renew or expired:
                        break
                    oldest = acc.oldest_enqueued(lane)
                    acc.wait(
                        None
                        if oldest is None or not self.message_timeout_s
                        else max(0.0, oldest + self.message_timeout_s - now)
                    )
                    continue
                retries = self._due_retries(lane, now)
                next_ready = None
                if self.identity.idempotent or not self.require_identity:
                    fresh, next_ready = acc.drain(
                        now, self.identity, self.transactional_id, self.is_transactional, lane
                    )
                batches = retries + fresh
                if expired or batches:
                    break
                acc.wait(self._wait_time(now, next_ready, lane))
            acc.mark_sending(batches)
        if expired:
            timed_out = KafkaError(KafkaError._MSG_TIMED_OUT, "Local: Message timed out")
            self.reports.push([Outcome(t, p, r, -1, timed_out, now) for t, p, r in expired])
        if renew:
            self._renew_identity()
            return True
        if self.on_batch_formed is not None:
            for batch in fresh:
                self.on_batch_formed(batch)
        self._attempt(batches)
        return True

    def _attempt(self, batches: list[Batch]) -> None:
        """``send``, then the batches are open to retries (and to a stopping purge) again."""
        if not batches:
            return
        try:
            self.send(batches)
        finally:
            with self.accumulator.cond:
                self.accumulator.sent(batches)

    def send_all_here(self) -> bool:
        """Send everything queued now, ignoring linger.ms, on the calling thread, if the
        sender has nothing in flight and one batch per partition takes it all; returns
        whether it did (else nothing was sent, and ``flush`` is the way).

        For ``commit_transaction``: its last batches then go out (with the EndTxn) without
        waking the sender's lanes and waiting to be woken by them, two thread hand-offs
        that cost as much as the commit's statements. The batches are in flight as if the
        lanes had formed them, so the lanes leave their partitions alone; marked as being
        sent, they are not retried by their lanes while this attempt runs. A retriable
        failure leaves them to their lanes' retries, as any attempt does.
        """
        acc = self.accumulator
        with acc.cond:
            now = time.monotonic()
            oldest = acc.oldest_enqueued()
            if (
                self._stopping
                or self._needs_identity
                or (self.require_identity and not self.identity.idempotent)
                or acc.in_flight()
                or not acc.fits_one_batch_each()
                # Records past message.timeout.ms are the lanes' to expire, not to send.
                or (
                    self.message_timeout_s
                    and oldest is not None
                    and now - oldest >= self.message_timeout_s
                )
            ):
                return False
            acc.flushing += 1
            try:
                fresh, _ = acc.drain(
                    now, self.identity, self.transactional_id, self.is_transactional
                )
            finally:
                acc.flushing -= 1
            acc.mark_sending(fresh)
        try:
            if self.on_batch_formed is not None:
                for batch in fresh:
                    self.on_batch_formed(batch)
            self._attempt(fresh)
        finally:
            with acc.cond:
                if acc.in_flight():
                    acc.cond.notify_all()  # a retry to make: its lane's from now on
        return True

    def _retries(self, lane: int) -> list[Batch]:
        """The batches in flight that ``lane`` is to retry (holding the lock): its own,
        and those of a commit's last request whose first batch is its own."""
        retries = []
        for batch in self.accumulator.in_flight():
            if batch.attempts and not batch.sending:
                owner = batch.together[0].lane if batch.together else batch.lane
                if owner == lane:
                    retries.append(batch)
        return retries

    def _due_retries(self, lane: int, now: float) -> list[Batch]:
        """The retries ``lane`` is to make now; the batches still in flight of a commit's
        last request go again all together, as the request they went in."""
        retries = self._retries(lane)
        due = [b for b in retries if b.next_attempt <= now]
        if any(b.together for b in due):
            due = [b for b in retries if b.next_attempt <= now or b.together]
        return due

    def _wait_time(self, now: float, next_ready: float | None, lane: int) -> float | None:
        deadlines = [b.next_attempt for b in self._retries(lane)]
        if next_ready is not None:
            deadlines.append(next_ready)
        oldest = self.accumulator.oldest_enqueued(lane)
        if self.message_timeout_s and oldest is not None:
            deadlines.append(oldest + self.message_timeout_s)
        if not deadlines:
            return None
        return max(0.0, min(deadlines) - now)

    # --- sending -----------------------------------------------------------------------

    def send(self, batches: list[Batch]) -> None:
        """One attempt for each batch, all in one request and one DB transaction: the
        single place produce requests are sent."""
        if not batches:
            return
        for batch in batches:
            batch.attempts += 1
        try:
            if self._transactions is not None:
                outcomes = self._transactions.send_together(batches)
            else:
                request = ProduceBatchesRequest([b.request() for b in batches], acks=self.acks)
                outcomes = list(self.transport(request).batches)
        except Exception as exc:
            for batch in batches:
                self._settle_exception(batch, exc)
            return
        delivered = []
        for batch, outcome in zip(batches, outcomes, strict=True):
            if isinstance(outcome, KafkaError):
                self._settle_error(batch, outcome)
            elif outcome.error_code == KafkaError.NO_ERROR:
                delivered.append((batch, outcome.base_offset))
            else:
                self._settle(batch, outcome)
        self._succeed_all(delivered)

    def _settle_exception(self, batch: Batch, exc: Exception) -> None:
        if is_connection_error(exc):
            batch.ambiguous = True
            log.info(
                "produce to %s [%d]: connection lost, will retry: %s",
                batch.topic,
                batch.partition,
                exc,
            )
            self._retry_or_fail(batch, KafkaError(KafkaError._TRANSPORT, f"connection lost: {exc}"))
        elif self._unresolved_commit(batch):
            # An earlier attempt may have committed the transaction with this batch; only
            # an answer can tell, so it is asked again, however this attempt failed.
            log.error("commit to %s [%d] failed", batch.topic, batch.partition, exc_info=exc)
            self._retry_or_fail(batch, _failure(exc))
        else:
            log.error("produce to %s [%d] failed", batch.topic, batch.partition, exc_info=exc)
            self._fail(batch, _failure(exc))

    def _settle(self, batch: Batch, response: ProduceResponse) -> None:
        if response.error_code == KafkaError.NO_ERROR:
            self._succeed_all([(batch, response.base_offset)])
            return
        self._settle_error(batch, KafkaError(response.error_code, response.error_message))

    def _settle_error(self, batch: Batch, error: KafkaError) -> None:
        if error.code() == KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND:
            # Committed on the primary, not confirmed by the standbys: as after a lost
            # answer, only a retry can tell what the log holds (docs/design.md rule 42).
            batch.ambiguous = True
        if error.retriable():
            self._retry_or_fail(batch, error)
        else:
            self._fail(batch, error)

    def _retry_or_fail(self, batch: Batch, error: KafkaError) -> None:
        now = time.monotonic()
        retry_at = now + self.retry_backoff_s
        unresolved_commit = self._unresolved_commit(batch)
        if batch.attempts > self.max_retries and not unresolved_commit:
            self._fail(batch, error)
            return
        if (
            self.message_timeout_s
            and retry_at - batch.first_enqueued >= self.message_timeout_s
            and not unresolved_commit
        ):
            self._fail(
                batch,
                KafkaError(
                    KafkaError._MSG_TIMED_OUT,
                    f"Local: Message timed out (last error: {error.str()})",
                ),
            )
            return
        with self.accumulator.cond:
            batch.last_error = error
            batch.next_attempt = retry_at

    @staticmethod
    def _unresolved_commit(batch: Batch) -> bool:
        """Whether the batch went out with its transaction's EndTxn and an attempt's outcome
        is unknown: the transaction may have committed with it."""
        return batch.ends_transaction and batch.ambiguous

    def _succeed_all(self, delivered: list[tuple[Batch, int]]) -> None:
        """Delivered batches, reported together: one wake-up for whoever serves them."""
        if not delivered:
            return
        now = time.monotonic()
        outcomes = [
            Outcome(batch.topic, batch.partition, batch.records, base_offset, None, now)
            for batch, base_offset in delivered
        ]
        with self.accumulator.cond:
            for batch, _ in delivered:
                self.accumulator.complete(batch)
        self.reports.push(outcomes)

    def _fail(self, batch: Batch, error: KafkaError) -> None:
        outcome = Outcome(batch.topic, batch.partition, batch.records, -1, error, time.monotonic())
        with self.accumulator.cond:
            # The transaction hears of it before the batch leaves the in-flight set, in one
            # step: another lane deciding that its batches are a commit's last (nothing
            # else in flight) must see the transaction failed, not merely the batch gone.
            if self._transactions is not None:
                self._transactions.batch_failed(batch, error)
            if batch.producer_id >= 0 and self.identity_provider is not None:
                self._needs_identity = True
            self.accumulator.complete(batch)
        self.reports.push([outcome])

    def _renew_identity(self) -> None:
        assert self.identity_provider is not None
        try:
            identity = self.identity_provider()
        except Exception as exc:
            log.warning("producer sender: could not renew the producer id, retrying: %s", exc)
            time.sleep(self.retry_backoff_s)
            with self.accumulator.cond:
                self._renewing = False
            return
        with self.accumulator.cond:
            self.identity = identity
            self.accumulator.reset_sequences()
            self._needs_identity = False
            self._renewing = False
            self.accumulator.cond.notify_all()  # the other lanes wait for it

    def _purge(self, now: float, lane: int | None) -> None:
        """Called holding the lock when stopping: report everything unsent (of ``lane``;
        None: of every lane) as _DESTROY, but for batches an attempt is still sending,
        whose lane reports them when it stops."""
        acc = self.accumulator
        destroyed = KafkaError(KafkaError._DESTROY, "Local: Producer closed before delivery")
        outcomes = [
            Outcome(t, p, r, -1, destroyed, now) for t, p, r in acc.expire(now, float("-inf"), lane)
        ]
        for batch in acc.in_flight(lane):
            if batch.sending:
                continue
            outcomes.append(
                Outcome(batch.topic, batch.partition, batch.records, -1, destroyed, now)
            )
            acc.complete(batch)
        self.reports.push(outcomes)


def _failure(exc: Exception) -> KafkaError:
    """What a delivery report says of a produce that raised: the database failure's own
    code and flags (docs/design.md rule 25), else a local failure."""
    return kafka_error(exc) or KafkaError(KafkaError._FAIL, f"produce failed: {exc}")
