"""The Consumer: confluent-kafka's API for reading partitions over the in-process broker.

Reads go through the Fetch handler, which filters by isolation level in SQL
(read_committed by default, as KIP-98 recommends for exactly-once pipelines). When
nothing is available, ``poll`` waits with a growing back-off rather than querying in a
tight loop; a newly committed record is still seen within the back-off's ceiling.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping
from typing import Any

from app.broker import Broker
from app.client.args import partition_arg, partitions_arg
from app.client.closing import ClientClosedError, Closing
from app.client.connection import configured_broker, kafka_errors, retry_connection_loss
from app.client.fetcher import Fetcher, FetchSettings, StoredOffsetPending
from app.client.group import GroupMember, RebalanceCallback
from app.client.message import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    Message,
    TopicPartition,
)
from app.client.transactions import ConsumerGroupMetadata
from app.config import CONSUMER, ClientConfig, parse_config
from app.errors import KafkaError, KafkaException, fail
from app.protocol import (
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    READ_UNCOMMITTED,
    ListOffsetsRequest,
    MetadataRequest,
)

log = logging.getLogger(__name__)

# Idle back-off: start fast so a fresh record is picked up at once, grow to bound load.
IDLE_BACKOFF_MIN_S = 0.005
IDLE_BACKOFF_MAX_S = 0.1

MAX_CONSUME_MESSAGES = 1_000_000


class Consumer(Closing):
    """A consumer of explicitly assigned partitions.

    ``client.id`` becomes the PostgreSQL ``application_name`` of the consumer's own
    connections; the keyword-only ``broker`` replaces them with a given broker context.
    """

    def __init__(
        self, config: Mapping[str, Any] | None = None, *, broker: Broker | None = None
    ) -> None:
        self._config: ClientConfig = parse_config(CONSUMER, config)
        cfg = self._config
        # database.replica.url: records fetched on that standby (KIP-392), the rest here.
        self._broker, self._owns_broker = configured_broker(
            cfg, broker, replica_url=cfg.get_str("database.replica.url")
        )
        self._request_timeout_s = cfg.get_int("request.timeout.ms") / 1000.0
        self._retry_backoff_s = cfg.get_int("retry.backoff.ms") / 1000.0
        self._fetcher = Fetcher(self._broker, FetchSettings.from_config(cfg))
        # Held for each call; released while poll waits, so other threads are not blocked.
        self._lock = threading.RLock()
        self._closed = False
        group_id = cfg.get_str("group.id")
        self._group: GroupMember | None = None
        if group_id:
            self._group = GroupMember(
                self._broker,
                group_id,
                cfg.get_str("client.id") or "consumer",
                cfg.get_int("session.timeout.ms"),
                cfg.get_int("heartbeat.interval.ms"),
                self._retry_backoff_s,
                self._request_timeout_s,
                cfg.get_str("group.instance.id"),
                cfg.get_int("max.poll.interval.ms"),
            )
            self._fetcher.stored_offset = self._stored_offset
        self._auto_commit = bool(group_id) and cfg.get_bool("enable.auto.commit")
        self._auto_commit_interval_s = cfg.get_int("auto.commit.interval.ms") / 1000.0
        self._next_auto_commit = time.monotonic() + self._auto_commit_interval_s
        self._on_commit = cfg.get_callable("on_commit")

    # --- assignment ----------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise ClientClosedError("Consumer")

    def assign(self, partitions: list[TopicPartition]) -> None:
        """Replace the assignment. Each partition starts at its offset: absolute,
        OFFSET_BEGINNING, OFFSET_END, or (OFFSET_INVALID / OFFSET_STORED) per
        ``auto.offset.reset``."""
        self._check_open()
        entries = []
        for tp in partitions_arg(partitions, "assign() partitions"):
            if tp.partition < 0:
                raise fail(
                    KafkaError._INVALID_ARG, f"invalid partition {tp.partition} for {tp.topic!r}"
                )
            entries.append((tp.topic, tp.partition, tp.offset))
        self._auto_create(sorted({topic for topic, _, _ in entries}))
        with self._lock:
            self._fetcher.assign(entries)

    def _auto_create(self, topics: list[str]) -> None:
        """With ``allow.auto.create.topics`` (false by default, as librdkafka's consumer),
        ask the broker to create the topics that do not exist; one it will not create (the
        broker does not auto-create, the principal may not) is left as it is: there is
        nothing to read, as with librdkafka."""
        if not topics or not self._config.get_bool("allow.auto.create.topics"):
            return
        request = MetadataRequest(topics, allow_auto_topic_creation=True)
        try:
            with kafka_errors():
                self._broker.handle(request)
        except KafkaException as exc:
            log.info("auto-creating %s failed: %s", topics, exc)

    def _assign_internal(self, partitions: list[TopicPartition]) -> None:
        """The group's assignment (revoke: empty), bypassing the argument checks."""
        with self._lock:
            self._fetcher.assign([(tp.topic, tp.partition, tp.offset) for tp in partitions])

    def unassign(self) -> None:
        self._check_open()
        with self._lock:
            self._fetcher.assign([])

    def assignment(self) -> list[TopicPartition]:
        self._check_open()
        with self._lock:
            return [TopicPartition(t, p) for t, p in self._fetcher.cursors]

    # --- reading -------------------------------------------------------------------------

    def poll(self, timeout: float | None = None) -> Message | None:
        """The next record or event (``error()`` set: partition EOF, an offset that cannot
        be reset, ...), or None after ``timeout`` seconds (None or negative: wait forever)."""
        messages = self._consume(1, timeout)
        return messages[0] if messages else None

    def consume(self, num_messages: int = 1, timeout: float | None = None) -> list[Message]:
        """Up to ``num_messages``, waiting at most ``timeout`` seconds to fill the list (as
        librdkafka's batch consume does)."""
        if not isinstance(num_messages, int) or not 1 <= num_messages <= MAX_CONSUME_MESSAGES:
            raise ValueError(f"num_messages must be between 1 and {MAX_CONSUME_MESSAGES}")
        return self._consume(num_messages, timeout)

    def _consume(self, count: int, timeout: float | None) -> list[Message]:
        self._check_open()
        if timeout is not None and timeout < 0:
            timeout = None
        deadline = None if timeout is None else time.monotonic() + timeout
        result: list[Message] = []
        backoff = IDLE_BACKOFF_MIN_S
        while True:
            with self._lock:
                self._check_open()
                group = self._group
                if result and group is not None and group.rebalance_pending():
                    # Records collected under the current assignment go out before a
                    # rebalance may revoke their partitions or rewind them; a transaction
                    # carrying them still commits under the generation that owned them.
                    return result
                if group is not None:
                    group.polled()
                result_ready = True
                if not result:
                    # Only between batches: positions then cover exactly what the
                    # application was given, for auto commit and for a revocation.
                    if group is not None and not group.rebalance_if_needed(
                        self, self._commit_on_revoke
                    ):
                        result_ready = False
                    self._maybe_auto_commit()
                self._drain(result, count)
                if result_ready and len(result) < count:
                    self._fetcher.fill()
                    before = len(result)
                    self._drain(result, count)
                    if len(result) > before:
                        backoff = IDLE_BACKOFF_MIN_S
            if len(result) >= count:
                return result
            now = time.monotonic()
            if deadline is not None and now >= deadline:
                return result
            pause = backoff if deadline is None else min(backoff, deadline - now)
            time.sleep(pause)
            backoff = min(backoff * 2, IDLE_BACKOFF_MAX_S)

    def _drain(self, into: list[Message], count: int) -> None:
        if len(into) < count:
            into.extend(self._fetcher.take(count - len(into)))

    # --- positions -----------------------------------------------------------------------

    def seek(self, partition: TopicPartition) -> None:
        """Move an assigned partition's position: absolute, OFFSET_BEGINNING or OFFSET_END
        (the LSO in read_committed). Takes effect at the next poll."""
        self._check_open()
        partition_arg(partition, "seek() partition")
        with self._lock:
            cursor = self._fetcher.cursors.get((partition.topic, partition.partition))
            if cursor is None:
                raise fail(
                    KafkaError._UNKNOWN_PARTITION,
                    f"{partition.topic} [{partition.partition}] is not assigned",
                )
            if partition.offset < 0 and partition.offset not in (OFFSET_BEGINNING, OFFSET_END):
                raise fail(KafkaError._INVALID_ARG, f"cannot seek to offset {partition.offset}")
            cursor.reset(partition.offset)

    def position(self, partitions: list[TopicPartition]) -> list[TopicPartition]:
        """The offset of the next record poll() will return, per partition (OFFSET_INVALID
        when unassigned or not yet known)."""
        self._check_open()
        result = []
        with self._lock:
            for tp in partitions_arg(partitions, "position() partitions"):
                cursor = self._fetcher.cursors.get((tp.topic, tp.partition))
                offset = cursor.position if cursor is not None else OFFSET_INVALID
                result.append(TopicPartition(tp.topic, tp.partition, offset))
        return result

    def get_watermark_offsets(
        self, partition: TopicPartition, timeout: float | None = None, cached: bool = False
    ) -> tuple[int, int]:
        """(low, high): the log start offset and the high watermark. ``cached`` answers
        from the last fetch without a query (OFFSET_INVALID when none has happened)."""
        self._check_open()
        partition_arg(partition, "get_watermark_offsets() partition")
        if cached:
            with self._lock:
                cursor = self._fetcher.cursors.get((partition.topic, partition.partition))
                if cursor is None:
                    return (OFFSET_INVALID, OFFSET_INVALID)
                return (cursor.low_watermark, cursor.high_watermark)
        deadline = time.monotonic() + (self._request_timeout_s if timeout is None else timeout)
        low = self._list_offset(partition, EARLIEST_TIMESTAMP, deadline)
        high = self._list_offset(partition, LATEST_TIMESTAMP, deadline)
        return (low, high)

    def _list_offset(self, tp: TopicPartition, timestamp: int, deadline: float) -> int:
        request = ListOffsetsRequest(tp.topic, tp.partition, timestamp, READ_UNCOMMITTED)
        response = retry_connection_loss(
            lambda: self._broker.handle(request),
            deadline,
            self._retry_backoff_s,
            KafkaError._TIMED_OUT,
        )
        if response.error_code != KafkaError.NO_ERROR:
            raise KafkaException(KafkaError(response.error_code, response.error_message))
        return response.offset

    # --- consumer groups ------------------------------------------------------------------

    def _require_group(self) -> GroupMember:
        if self._group is None:
            raise fail(
                KafkaError._INVALID_ARG, "this operation needs group.id in the configuration"
            )
        return self._group

    def subscribe(
        self,
        topics: list[str],
        on_assign: RebalanceCallback | None = None,
        on_revoke: RebalanceCallback | None = None,
        on_lost: RebalanceCallback | None = None,
    ) -> None:
        """Join the group for ``topics``; partitions arrive through the rebalance, which
        runs (with its callbacks) inside poll()/consume()."""
        self._check_open()
        group = self._require_group()
        if (
            not isinstance(topics, list | tuple)
            or not topics
            or not all(isinstance(t, str) and t and "\x00" not in t for t in topics)
        ):
            raise fail(KafkaError._INVALID_ARG, "subscribe() takes a non-empty list of topic names")
        self._auto_create(sorted({t for t in topics if not t.startswith("^")}))
        with self._lock:
            group.subscribe(list(topics), on_assign, on_revoke or on_lost)

    def unsubscribe(self) -> None:
        self._check_open()
        if self._group is not None:
            with self._lock:
                self._group.leave(self, self._commit_on_revoke)

    def consumer_group_metadata(self) -> ConsumerGroupMetadata:
        """Group id, generation and member id, for send_offsets_to_transaction (generation
        -1 when this consumer never subscribed)."""
        return self._require_group().metadata()

    def _positions(self) -> list[TopicPartition]:
        return [
            TopicPartition(t, p, c.position)
            for (t, p), c in self._fetcher.cursors.items()
            if c.position >= 0
        ]

    def commit(
        self,
        message: Message | None = None,
        offsets: list[TopicPartition] | None = None,
        asynchronous: bool = True,
    ) -> list[TopicPartition] | None:
        """Commit a message (its offset + 1), explicit offsets, or the current positions.
        Returns the committed partitions when ``asynchronous`` is False."""
        self._check_open()
        group = self._require_group()
        if message is not None and offsets is not None:
            raise fail(KafkaError._INVALID_ARG, "commit() takes a message or offsets, not both")
        if message is not None:
            if not isinstance(message, Message):
                raise fail(KafkaError._INVALID_ARG, "commit() message must be a Message")
            if message.error() is not None or message.offset() is None:
                raise fail(KafkaError._INVALID_ARG, "cannot commit an event or error message")
            chosen = [
                TopicPartition(
                    message.topic() or "", message.partition() or 0, (message.offset() or 0) + 1
                )
            ]
        elif offsets is not None:
            chosen = partitions_arg(offsets, "commit() offsets")
        else:
            with self._lock:
                chosen = self._positions()
        try:
            done = group.commit(chosen)
        except KafkaException as exc:
            if self._on_commit is not None:
                self._on_commit(exc.args[0], chosen)
            raise
        if self._on_commit is not None:
            self._on_commit(None, done)
        return None if asynchronous else done

    def committed(
        self, partitions: list[TopicPartition], timeout: float | None = None
    ) -> list[TopicPartition]:
        """The group's committed offsets (OFFSET_INVALID where none); waits while
        transactional offsets for them are pending (KIP-447)."""
        self._check_open()
        partitions = partitions_arg(partitions, "committed() partitions")
        found = self._require_group().committed_offsets(partitions, timeout)
        if found is None:
            raise fail(KafkaError._TIMED_OUT, "offsets are still pending in an open transaction")
        out = []
        for tp in partitions:
            om = found.get((tp.topic, tp.partition))
            out.append(
                TopicPartition(tp.topic, tp.partition, OFFSET_INVALID)
                if om is None
                else TopicPartition(
                    tp.topic,
                    tp.partition,
                    om.offset,
                    om.metadata,
                    None if om.leader_epoch < 0 else om.leader_epoch,
                )
            )
        return out

    def _stored_offset(self, topic: str, partition: int) -> int | None:
        assert self._group is not None
        # One attempt: while offsets are pending, poll() keeps its own timeout and the
        # cursor asks again at the next fill (never auto.offset.reset meanwhile).
        found = self._group.committed_offsets([TopicPartition(topic, partition)], 0)
        if found is None:
            raise StoredOffsetPending(f"{topic} [{partition}]: transactional offsets pending")
        om = found.get((topic, partition))
        return None if om is None else om.offset

    def _commit_on_revoke(self) -> None:
        if self._auto_commit:
            self._commit_positions_quietly()

    def _maybe_auto_commit(self) -> None:
        if self._auto_commit and time.monotonic() >= self._next_auto_commit:
            self._next_auto_commit = time.monotonic() + self._auto_commit_interval_s
            self._commit_positions_quietly()

    def _commit_positions_quietly(self) -> None:
        positions = self._positions()
        if not positions or self._group is None:
            return
        try:
            self._group.commit(positions)
        except KafkaException as exc:
            log.info("auto commit failed: %s", exc)

    # --- lifecycle ------------------------------------------------------------------------

    def close(self) -> None:
        """Commit (with enable.auto.commit), leave the group, release the connections;
        later calls raise."""
        with self._lock:
            if self._closed:
                return
            if self._group is not None:
                if self._auto_commit:
                    self._commit_positions_quietly()
                self._group.leave(self, None)
            self._closed = True
            self._fetcher.assign([])
        if self._owns_broker:
            self._broker.engine.dispose()
            if self._broker.replica_engine is not None:
                self._broker.replica_engine.dispose()
