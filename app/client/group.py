"""The consumer's group membership: subscribe, rebalance, offsets.

A heartbeat thread keeps the member alive and notices a rebalance; the rebalance itself
(revoke, join, wait for the assignment, fetch committed offsets, assign) runs on the
application's thread inside ``poll()``/``consume()``, as librdkafka serves rebalance
callbacks there. The protocol is eager: every partition is revoked before the new
assignment is taken, and the coordinator hands out the new one only when every member has
joined, so no partition is read by two members of one generation. Committed offsets are
read with require_stable (KIP-447): while a transaction still holds pending offsets for a
partition, the member waits rather than starting from an offset that may yet move.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from typing import Any

from app.broker import Broker
from app.client.connection import retry_connection_loss
from app.client.message import OFFSET_INVALID, TopicPartition
from app.client.transactions import ConsumerGroupMetadata
from app.errors import KafkaError, KafkaException, fail
from app.protocol import (
    HeartbeatRequest,
    JoinGroupRequest,
    LeaveGroupRequest,
    OffsetAndMetadata,
    OffsetCommitRequest,
    OffsetFetchRequest,
    SyncGroupRequest,
)

log = logging.getLogger(__name__)

RebalanceCallback = Callable[[Any, list[TopicPartition]], None]

# Heartbeat answers that mean: rejoin (and for UNKNOWN_MEMBER_ID, as a new member).
REJOIN = frozenset(
    {KafkaError.REBALANCE_IN_PROGRESS, KafkaError.ILLEGAL_GENERATION, KafkaError.UNKNOWN_MEMBER_ID}
)


class GroupMember:
    def __init__(
        self,
        broker: Broker,
        group_id: str,
        client_id: str,
        session_timeout_ms: int,
        heartbeat_interval_ms: int,
        retry_backoff_s: float,
        request_timeout_s: float,
        group_instance_id: str | None = None,
        max_poll_interval_ms: int = 300_000,
    ) -> None:
        self.broker = broker
        self.max_poll_interval_s = max_poll_interval_ms / 1000.0
        self.last_poll = time.monotonic()
        self.group_instance_id = group_instance_id
        self.group_id = group_id
        self.client_id = client_id
        self.session_timeout_ms = session_timeout_ms
        self.heartbeat_interval_s = heartbeat_interval_ms / 1000.0
        self.retry_backoff_s = retry_backoff_s
        self.request_timeout_s = request_timeout_s
        self.member_id = ""
        self.generation_id = -1
        self.topics: list[str] = []
        self.on_assign: RebalanceCallback | None = None
        self.on_revoke: RebalanceCallback | None = None
        self.subscribed = False
        self.assigned: list[TopicPartition] = []
        # Set by the heartbeat thread, cleared by the application thread once rejoined.
        self.needs_rejoin = threading.Event()
        self.joined = False
        # Joined a generation, assignment not taken yet (others still joining, or offsets unstable).
        self._pending_assignment = False
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ------------------------------------------------------------ requests
    def _retrying(self, fn: Callable[[], Any], timeout: float | None = None) -> Any:
        deadline = time.monotonic() + (self.request_timeout_s if timeout is None else timeout)
        return retry_connection_loss(fn, deadline, self.retry_backoff_s)

    def metadata(self) -> ConsumerGroupMetadata:
        return ConsumerGroupMetadata(
            self.group_id,
            self.generation_id if self.subscribed else -1,
            self.member_id if self.subscribed else "",
        )

    # ------------------------------------------------------------ subscribe / heartbeat
    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None,
        on_revoke: RebalanceCallback | None,
    ) -> None:
        self.topics = sorted(set(topics))
        self.on_assign, self.on_revoke = on_assign, on_revoke
        self.subscribed = True
        self.joined = False
        self.polled()
        self.needs_rejoin.set()
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(
                target=self._heartbeat_loop, name="kip98-heartbeat", daemon=True
            )
            self._thread.start()

    def rebalance_pending(self) -> bool:
        """A rejoin or a new assignment waits to be driven by the next poll."""
        return self.subscribed and (self.needs_rejoin.is_set() or self._pending_assignment)

    def polled(self) -> None:
        """The application called poll()/consume(): it is making progress."""
        self.last_poll = time.monotonic()

    def _heartbeat_loop(self) -> None:
        while not self._stop.wait(self.heartbeat_interval_s):
            if not self.joined or not self.member_id:
                continue
            if time.monotonic() - self.last_poll > self.max_poll_interval_s:
                # Alive but not polling: leave, so the group's rebalance is not held up by a
                # member that cannot give up its partitions (Kafka's max.poll.interval.ms).
                log.warning("no poll for max.poll.interval.ms; leaving group %s", self.group_id)
                member_id, self.member_id, self.joined = self.member_id, "", False
                try:
                    self.broker.handle(LeaveGroupRequest(self.group_id, member_id))
                except Exception as exc:  # the session timeout removes us anyway
                    log.info("leave group failed: %s", exc)
                self.needs_rejoin.set()
                continue
            try:
                r = self.broker.handle(
                    HeartbeatRequest(self.group_id, self.member_id, self.generation_id)
                )
            except Exception as exc:
                log.info("heartbeat failed, will retry: %s", exc)
                continue
            if r.error_code in REJOIN:
                if r.error_code == KafkaError.UNKNOWN_MEMBER_ID:
                    self.member_id = ""
                self.needs_rejoin.set()

    # ------------------------------------------------------------ rebalance (app thread)
    def rebalance_if_needed(
        self, consumer: Any, commit_on_revoke: Callable[[], None] | None
    ) -> bool:
        """Drive a pending rebalance one step. True once the member holds a stable assignment."""
        if not self.subscribed:
            return True
        if self.needs_rejoin.is_set():
            self._revoke(consumer, commit_on_revoke)
            r = self._retrying(
                lambda: self.broker.handle(
                    JoinGroupRequest(
                        self.group_id,
                        self.member_id,
                        self.topics,
                        self.session_timeout_ms,
                        self.client_id,
                    ),
                )
            )
            if r.error_code:
                raise KafkaException(KafkaError(r.error_code, r.error_message))
            self.member_id, self.generation_id = r.member_id, r.generation_id
            self.needs_rejoin.clear()
            self.joined = True
            self._pending_assignment = True
        if self._pending_assignment:
            s = self._retrying(
                lambda: self.broker.handle(
                    SyncGroupRequest(self.group_id, self.member_id, self.generation_id)
                )
            )
            if s.error_code == KafkaError.REBALANCE_IN_PROGRESS:
                return False
            if s.error_code:
                # Our generation moved on while we waited: join again.
                self.needs_rejoin.set()
                return False
            partitions = [TopicPartition(t, p) for t, p in s.assignment]
            committed = self.committed_offsets(partitions, timeout=0)
            if committed is None:
                return False  # transactional offsets still pending: ask again next poll
            self._pending_assignment = False
            self._assign(
                consumer,
                [
                    TopicPartition(
                        tp.topic,
                        tp.partition,
                        committed[(tp.topic, tp.partition)].offset
                        if (tp.topic, tp.partition) in committed
                        else OFFSET_INVALID,
                    )
                    for tp in partitions
                ],
            )
        return True

    def _revoke(self, consumer: Any, commit_on_revoke: Callable[[], None] | None) -> None:
        if not self.assigned:
            return
        revoked = list(self.assigned)
        if self.on_revoke is not None:
            self.on_revoke(consumer, revoked)
        elif commit_on_revoke is not None:
            commit_on_revoke()
        self.assigned = []
        consumer._assign_internal([])

    def _assign(self, consumer: Any, partitions: list[TopicPartition]) -> None:
        self.assigned = [TopicPartition(tp.topic, tp.partition) for tp in partitions]
        consumer._assign_internal(partitions)
        if self.on_assign is not None:
            self.on_assign(consumer, partitions)

    # ------------------------------------------------------------ offsets
    def committed_offsets(
        self, partitions: list[TopicPartition], timeout: float | None
    ) -> dict[tuple[str, int], OffsetAndMetadata] | None:
        """Committed offsets (with their metadata) with require_stable; None if still
        unstable when time is up."""
        deadline = time.monotonic() + (self.request_timeout_s if timeout is None else timeout)
        keys = [(tp.topic, tp.partition) for tp in partitions]
        while True:
            r = self._retrying(
                lambda: self.broker.handle(
                    OffsetFetchRequest(self.group_id, keys, require_stable=True)
                )
            )
            if r.error_code == KafkaError.NO_ERROR:
                return {tp: om for tp, om in r.offsets.items() if om.offset >= 0}
            if r.error_code != KafkaError.UNSTABLE_OFFSET_COMMIT:
                raise KafkaException(KafkaError(r.error_code, r.error_message))
            if time.monotonic() + self.retry_backoff_s >= deadline:
                return None
            time.sleep(self.retry_backoff_s)

    def commit(self, offsets: list[TopicPartition]) -> list[TopicPartition]:
        values = {
            (tp.topic, tp.partition): OffsetAndMetadata(
                tp.offset, tp.metadata, -1 if tp.leader_epoch is None else tp.leader_epoch
            )
            for tp in offsets
            if tp.offset >= 0
        }
        if not values:
            raise fail(KafkaError._NO_OFFSET, "no offsets to commit")
        meta = self.metadata()
        r = self._retrying(
            lambda: self.broker.handle(
                OffsetCommitRequest(self.group_id, values, meta.generation_id, meta.member_id),
            )
        )
        if r.error_code in REJOIN:
            self.needs_rejoin.set()
        if r.error_code:
            raise KafkaException(KafkaError(r.error_code, r.error_message))
        codes = {tp: r.results.get(tp, KafkaError.NO_ERROR) for tp in values}
        if all(codes.values()):  # nothing committed: the first partition's refusal
            first = min(codes)
            raise KafkaException(KafkaError(codes[first], r.error_message))
        # As librdkafka answers a commit: each partition with its own error, if it has one.
        committed = []
        for (t, p), om in sorted(values.items()):
            tp = TopicPartition(t, p, om.offset, om.metadata)
            if codes[(t, p)]:
                tp.error = KafkaError(codes[(t, p)])
            committed.append(tp)
        return committed

    # ------------------------------------------------------------ leaving
    def leave(self, consumer: Any, commit_on_revoke: Callable[[], None] | None) -> None:
        if not self.subscribed:
            return
        self._revoke(consumer, commit_on_revoke)
        self.subscribed = False
        self.joined = False
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
        if self.member_id:
            try:
                self.broker.handle(LeaveGroupRequest(self.group_id, self.member_id))
            except Exception as exc:  # the session timeout removes us anyway
                log.info("leave group failed: %s", exc)
        self.member_id, self.generation_id = "", -1
