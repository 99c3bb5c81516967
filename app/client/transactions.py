"""The transactional half of the Producer: init/begin/send_offsets/commit/abort.

It sends the coordinator's requests, and is the sender's ``TransactionHooks``, and keeps the
client-side state machine (``txn_manager``) honest: commit flushes first and refuses to
end a transaction any of whose batches failed; abort purges what was never sent; every
EndTxn answer carries the (producer_id, epoch) of the next transaction (KIP-890), which
becomes the sender's identity with sequences back at 0.

The flush of a commit usually carries the transaction's last batches: when they are all
that is left, they go out with the EndTxn in one request (a ``ProduceBatchesRequest`` with ``end``), so a
transaction whose records fit its linger costs one DB transaction. Its answer is kept for
``_end``; a request whose outcome is unknown is retried as it was, never as a bare EndTxn.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from app.broker import Broker, background
from app.client import txn_manager as tm
from app.client.batching import Batch, ProducerIdentity
from app.client.connection import is_connection_error, retry_connection_loss
from app.client.delivery import Outcome
from app.client.message import TopicPartition
from app.client.sender import Sender
from app.errors import KafkaError, KafkaException
from app.protocol import (
    AddPartitionsToTxnRequest,
    AddPartitionsToTxnResponse,
    EndTxnRequest,
    EndTxnResponse,
    InitProducerIdRequest,
    OffsetAndMetadata,
    ProduceBatchesRequest,
    ProduceResponse,
    TxnOffsetCommitRequest,
)

R = TypeVar("R")

# Answers worth asking again after a pause (another request on the id is in progress, or
# a completion is being rolled forward; too few synchronous standbys, before or after the
# write).
RETRY_CODES = frozenset(
    {
        KafkaError.CONCURRENT_TRANSACTIONS,
        KafkaError.NOT_ENOUGH_REPLICAS,
        KafkaError.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        KafkaError.COORDINATOR_LOAD_IN_PROGRESS,
        KafkaError.NOT_COORDINATOR,
        KafkaError.COORDINATOR_NOT_AVAILABLE,
    }
)


# A commit's combined answer that leaves the ending to a bare EndTxn (its batches have all
# been delivered by then).
NOT_ENDED = RETRY_CODES | {KafkaError.OPERATION_NOT_ATTEMPTED}


@dataclass(frozen=True)
class ConsumerGroupMetadata:
    """What ``Consumer.consumer_group_metadata()`` returns: enough for the group
    coordinator to fence a zombie of an older generation (KIP-447)."""

    group_id: str
    generation_id: int = -1
    member_id: str = ""


@dataclass(frozen=True)
class PreparedTxnState:
    """A prepared transaction's identity (KIP-939): what its outcome is decided on."""

    producer_id: int
    producer_epoch: int


@dataclass(frozen=True)
class TxnSettings:
    """The transactional producer's configuration, read once from its config."""

    transactional_id: str
    # transaction.timeout.ms: what InitProducerId asks the coordinator for.
    timeout_ms: int
    request_timeout_s: float
    retry_backoff_s: float


class Transactions:
    def __init__(
        self,
        broker: Broker,
        settings: TxnSettings,
        sender: Sender,
        *,
        flush: Callable[[float | None], int],
        await_delivery: Callable[[float | None], int],
    ) -> None:
        """``flush`` and ``await_delivery`` are the producer's: a commit flushes first, an
        abort waits for what is in flight."""
        self.broker, self.settings, self.sender = broker, settings, sender
        self.accumulator, self.reports = sender.accumulator, sender.reports
        self._flush = flush
        self._await_delivery = await_delivery
        self.manager = tm.TransactionManager()
        self.identity = ProducerIdentity()
        self._added: set[tuple[str, int]] = set()
        # Partitions whose registration went out with batches whose fate is unknown (the
        # connection was lost): the coordinator may or may not have them.
        self._maybe_added: set[tuple[str, int]] = set()
        self._offsets_added = False
        # The EndTxn answer of a commit that went out with the last batches (sender thread).
        self._ended: EndTxnResponse | None = None
        self._lock = threading.Lock()
        self._loop_key: str | None = None
        sender.attach(self)

    @property
    def transactional_id(self) -> str:
        return self.settings.transactional_id

    # ------------------------------------------------------------ requests with retries
    def _call(self, fn: Callable[[], R], code_of: Callable[[R], int], timeout: float | None) -> R:
        """Call a handler, retrying lost connections and retriable answers until timeout
        (then a retriable ``_TIMED_OUT``)."""
        deadline = time.monotonic() + (
            self.settings.request_timeout_s if timeout is None or timeout < 0 else timeout
        )

        def retriable(response: R) -> KafkaError | None:
            return KafkaError(code_of(response)) if code_of(response) in RETRY_CODES else None

        return retry_connection_loss(
            fn, deadline, self.settings.retry_backoff_s, KafkaError._TIMED_OUT, retriable
        )

    def _raise(self, code: int, message: str | None) -> None:
        raise KafkaException(self.manager.fail(KafkaError(code, message)))

    def _set_identity(self, producer_id: int, producer_epoch: int) -> None:
        self.identity = ProducerIdentity(producer_id, producer_epoch)
        with self.accumulator.cond:
            self.sender.identity = self.identity
            self.accumulator.reset_sequences()
            self.accumulator.cond.notify_all()

    # ------------------------------------------------------------ API
    def init_transactions(self, timeout: float | None) -> None:
        if self.manager.state != tm.UNINITIALIZED:
            raise KafkaException(
                KafkaError(KafkaError._STATE, f"init_transactions in state {self.manager.state}")
            )
        request = InitProducerIdRequest(self.transactional_id, self.settings.timeout_ms)
        r = self._call(lambda: self.broker.handle(request), lambda x: x.error_code, timeout)
        if r.error_code != KafkaError.NO_ERROR:
            self._raise(r.error_code, r.error_message)
        self._set_identity(r.producer_id, r.producer_epoch)
        self.manager.fire("initialized", "init_transactions")
        if self._loop_key is None:
            self._loop_key = background.acquire(
                self.broker.engine.url.render_as_string(hide_password=False), self.broker
            )

    def begin_transaction(self) -> None:
        self.manager.fire("begin", "begin_transaction")
        with self._lock:
            self._added.clear()
            self._maybe_added.clear()
            self._offsets_added = False
            self._ended = None
        with self.accumulator.cond:
            self.sender.transactional_id = self.transactional_id
            self.sender.is_transactional = True

    def check_can_produce(self) -> None:
        """librdkafka refuses produce() outside a transaction on a transactional producer."""
        state = self.manager.state
        if state == tm.IN_TRANSACTION:
            return
        if self.manager.fatal_error is not None:
            err = self.manager.fatal_error
            raise KafkaException(KafkaError(err.code(), err.str(), fatal=True))
        if state == tm.ABORTABLE_ERROR and self.manager.abortable_error is not None:
            err = self.manager.abortable_error
            raise KafkaException(KafkaError(err.code(), err.str(), txn_requires_abort=True))
        raise KafkaException(
            KafkaError(KafkaError._STATE, f"produce() outside a transaction (state {state})")
        )

    def send_offsets_to_transaction(
        self, positions: list[TopicPartition], group_metadata: Any, timeout: float | None
    ) -> None:
        if not isinstance(group_metadata, ConsumerGroupMetadata):
            raise KafkaException(
                KafkaError(
                    KafkaError._INVALID_ARG,
                    "group_metadata must come from Consumer.consumer_group_metadata()",
                )
            )
        offsets = {
            (tp.topic, tp.partition): OffsetAndMetadata(
                tp.offset, tp.metadata, -1 if tp.leader_epoch is None else tp.leader_epoch
            )
            for tp in positions
            if tp.offset >= 0
        }
        if self.manager.state != tm.IN_TRANSACTION:
            self.check_can_produce()
        if not offsets:
            return
        ident = self.identity
        # KIP-890's transaction version 2: the first offsets of a transaction add the
        # group's offsets to it in the same request (no AddOffsetsToTxn of their own), so
        # they cost one DB transaction, and either both happen or neither.
        commit = TxnOffsetCommitRequest(
            self.transactional_id, group_metadata.group_id, ident.producer_id, ident.producer_epoch,
            offsets, group_metadata.generation_id, group_metadata.member_id,
            add_offsets=not self._offsets_added,
        )  # fmt: skip
        c = self._call(lambda: self.broker.handle(commit), lambda x: x.error_code, timeout)
        if c.error_code:
            self._raise(c.error_code, c.error_message)
        self._offsets_added = True

    def commit_transaction(self, timeout: float | None) -> None:
        if self.manager.state != tm.COMMITTING:
            self.manager.fire("start_commit", "commit_transaction")
        # The last batches go out with the EndTxn from this thread when the sender is idle
        # (COMMITTING: no record can be added meanwhile); else the flush has the sender
        # send them. Either way, their reports are served before the commit goes on.
        if self.sender.send_all_here():
            remaining = self._await_delivery(timeout)
        else:
            remaining = self._flush(timeout)
        if remaining:
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    f"{remaining} messages not yet delivered; call commit_transaction() again",
                    retriable=True,
                )
            )
        if self.manager.state == tm.ABORTABLE_ERROR:
            self.manager.fire("start_commit", "commit_transaction")  # raises the abortable error
        self._end(commit=True, timeout=timeout)

    def prepare_transaction(self, timeout: float | None) -> PreparedTxnState:
        """KIP-939's prepareTransaction: every record of the transaction delivered, the
        transaction left open, its identity returned for whoever decides its outcome (an
        exactly-once sink's driver, which ends it with the others of its batch). A failed
        batch makes it abortable, as it would make a commit fail."""
        self.check_can_produce()
        remaining = self._flush(timeout)
        if remaining:
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT,
                    f"{remaining} messages not yet delivered; call prepare_transaction() again",
                    retriable=True,
                )
            )
        self.check_can_produce()  # a batch that failed for good made it abortable
        ident = self.identity
        return PreparedTxnState(ident.producer_id, ident.producer_epoch)

    def abort_transaction(self, timeout: float | None) -> None:
        if self.manager.state != tm.ABORTING:
            self.manager.fire("start_abort", "abort_transaction")
        self._purge_unsent()
        remaining = self._flush(timeout)
        if remaining:
            raise KafkaException(
                KafkaError(
                    KafkaError._TIMED_OUT, f"{remaining} messages still in flight", retriable=True
                )
            )
        self._end(commit=False, timeout=timeout)

    def _end(self, commit: bool, timeout: float | None) -> None:
        with self._lock:
            touched = bool(self._added) or self._offsets_added
            maybe = bool(self._maybe_added) and not touched
            ended, self._ended = self._ended, None
        if commit and ended is not None and ended.error_code not in NOT_ENDED:
            # Ended with the last batches; their delivery was settled by the flush.
            if ended.error_code:
                self._raise(ended.error_code, ended.error_message)
            self._set_identity(ended.producer_id, ended.producer_epoch)
        elif touched or maybe:
            ident = self.identity
            request = EndTxnRequest(
                self.transactional_id, ident.producer_id, ident.producer_epoch, commit
            )
            r = self._call(lambda: self.broker.handle(request), lambda x: x.error_code, timeout)
            if maybe and r.error_code == KafkaError.INVALID_TXN_STATE:
                # The lost registration never happened: nothing of this transaction reached
                # the log (registration and batches commit together). Same identity; the
                # sequences of the lost batches were never used. (The coordinator answers
                # the same when the transaction ended committed, but no abort follows a
                # commit whose outcome is unknown: ``txn_manager`` refuses it.)
                self._set_identity(ident.producer_id, ident.producer_epoch)
            elif r.error_code:
                self._raise(r.error_code, r.error_message)
            else:
                self._set_identity(r.producer_id, r.producer_epoch)
        with self.accumulator.cond:
            self.sender.is_transactional = False
        with self._lock:
            self._added.clear()
            self._maybe_added.clear()
            self._offsets_added = False
            self._ended = None
        self.manager.reset_abortable()
        self.manager.fire("completed", "commit_transaction" if commit else "abort_transaction")

    def _purge_unsent(self) -> None:
        """Records not yet sent never reach the log: report them as purged (librdkafka)."""
        now = time.monotonic()
        purged = KafkaError(KafkaError._PURGE_QUEUE, "Local: Purged in queue (transaction aborted)")
        with self.accumulator.cond:
            pending = self.accumulator.expire(now, float("-inf"))
        self.reports.push([Outcome(t, p, r, -1, purged, now) for t, p, r in pending])

    # ------------------------------------------------------------ the sender's hooks
    def send_together(self, batches: list[Batch]) -> list[ProduceResponse | KafkaError]:
        """The batches in one request that also registers their new partitions (one DB
        transaction: registration and data commit together or not at all), and ends the
        transaction too when they are the last batches of a commit."""
        new = self._unregistered(batches)
        end = self._final_commit(batches)
        with self._lock:
            self._ended = None  # an earlier answer is void once anything is sent again
        ident = self.identity
        add = None
        if new:
            add = AddPartitionsToTxnRequest(
                self.transactional_id, ident.producer_id, ident.producer_epoch, new
            )
        if end is not None:
            together = list(batches)
            for batch in batches:
                batch.ends_transaction = True
                batch.together = together
        request = ProduceBatchesRequest([b.request() for b in batches], add, end)
        try:
            response = self.sender.transport(request)
        except Exception as exc:
            if new and is_connection_error(exc):
                with self._lock:
                    self._maybe_added.update(new)
            raise
        if end is not None:
            with self._lock:
                self._ended = response.end
        if response.registered is None:
            return list(response.batches)
        refused = self._registered(new, response.registered)
        return [
            refused.get((b.topic, b.partition), r)
            for b, r in zip(batches, response.batches, strict=True)
        ]

    def _final_commit(self, batches: list[Batch]) -> EndTxnRequest | None:
        """The EndTxn to send with ``batches`` if they are all a committing transaction
        still has to send (nothing queued, nothing else in flight); else None."""
        if not all(b.is_transactional for b in batches):
            return None
        # One look under the lock the lanes settle their batches under: a batch of another
        # lane that failed for good has moved the transaction out of COMMITTING before it
        # left the in-flight set, so it is never mistaken for delivered.
        with self.accumulator.cond:
            if (
                self.manager.state != tm.COMMITTING
                or self.accumulator.queued()[0]
                or len(self.accumulator.in_flight()) != len(batches)
            ):
                return None
        ident = self.identity
        return EndTxnRequest(self.transactional_id, ident.producer_id, ident.producer_epoch, True)

    def _unregistered(self, batches: list[Batch]) -> list[tuple[str, int]]:
        """The batches' partitions not yet in the transaction. Lanes ask at once, each for
        its own partitions (a partition is sent by one lane only), so no two requests in
        flight register the same partition; each registers its own under the transactional
        id's row lock, one after the other, and none loses another's."""
        wanted = {(b.topic, b.partition) for b in batches if b.is_transactional}
        with self._lock:
            return sorted(wanted - self._added)

    def _registered(
        self, new: list[tuple[str, int]], r: AddPartitionsToTxnResponse
    ) -> dict[tuple[str, int], KafkaError]:
        """Record a registration's answer; the error for each partition it refused."""
        if r.error_code == KafkaError.NO_ERROR:
            with self._lock:
                self._added.update(new)
            return {}
        err = KafkaError(r.error_code, r.error_message)
        if r.error_code in RETRY_CODES:
            return dict.fromkeys(new, KafkaError(r.error_code, r.error_message, retriable=True))
        # Not retriable: fail these batches; the transaction cannot commit.
        return dict.fromkeys(new, KafkaError(err.code(), err.str(), retriable=False))

    def batch_failed(self, batch: Batch, error: KafkaError) -> None:
        if batch.is_transactional and self.manager.state in (tm.IN_TRANSACTION, tm.COMMITTING):
            self.manager.fail(error)

    def records_expired(self, error: KafkaError) -> None:
        """Unsent records only exist inside a transaction (abort purges them, commit flushes
        them first), so records timing out belong to the open one: it must not commit."""
        if self.manager.state in (tm.IN_TRANSACTION, tm.COMMITTING):
            self.manager.fail(error)

    def close(self) -> None:
        background.release(self._loop_key)
        self._loop_key = None
