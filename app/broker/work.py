"""One request's unit of work: what a handler that combines the libraries carries through
its DB transaction, instead of threading "already read" and "already locked" arguments
through every call.

The log, the coordinator and the groups take the parts they need from it (a connection, the
metadata read, the partition rows locked, where writes go); only the broker builds one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from app.coordinator.metadata import TxnMetadata
from app.coordinator.txn_log import (
    Leased,
    Persist,
    RememberedTxn,
    TransitionBatch,
    persist,
    remember_txn,
)
from app.log.markers import MarkerLocks
from app.log.partition_lock import PartitionRow, remember
from app.protocol import ProduceBatchesResponse, TopicPartitionKey
from app.storage.context import BrokerContext
from app.storage.driver import WriteBehind


@dataclass(frozen=True)
class Plan:
    """A request decided in full, nothing of it written yet (docs/design.md §3.9): its
    answer, its writes in order (each a statement and its parameters) and its COPY
    payloads. Either executor sends it whole: under the locks (``broker.write``), or as
    one query string checked by the versions of the rows it was decided on
    (``broker.commit_remembered``)."""

    response: ProduceBatchesResponse
    writes: list[tuple[str, dict[str, Any]]]
    copies: list[bytes]


@dataclass
class Work:
    """``conn``: the request's one DB transaction. ``loaded``: the transactional ids' metadata
    read in it so far (FOR SHARE by a produce, FOR UPDATE by a registration or an EndTxn).
    ``locked``: the partition rows it holds locked, with the producer whose state they hold,
    kept as its appends leave them (None while it locks as it goes). ``transitions`` and
    ``writes``: where its transitions and its last writes are queued to be sent together
    before COMMIT (None: each runs at once). ``copies``: where the appends leave their COPY
    payloads instead of sending them, for a request decided in full before anything is
    sent (``broker.commit_remembered``; None: sent at once). ``appended``: the partition
    rows the appends under the locks left, their versions known once the writes are sent.
    ``seen`` and ``left``: the transactional ids' rows and the partition rows as this DB
    transaction read or left them, with their versions, which the process remembers once
    it commits (``remember``; docs/design.md rule 32, §3.12).
    """

    context: BrokerContext
    conn: Connection
    loaded: dict[str, TxnMetadata | None] = field(default_factory=dict)
    locked: MarkerLocks | None = None
    transitions: TransitionBatch | None = None
    writes: WriteBehind | None = None
    copies: list[bytes] | None = None
    appended: dict[TopicPartitionKey, PartitionRow] = field(default_factory=dict)
    seen: dict[str, RememberedTxn] = field(default_factory=dict)
    left: dict[TopicPartitionKey, tuple[str, PartitionRow]] = field(default_factory=dict)

    @property
    def record(self) -> Persist:
        """How this request persists a transition: queued with the others, or at once."""
        return persist if self.transitions is None else self.transitions.persist

    def send(self, read: tuple[str, dict[str, Any]] | None = None) -> tuple[Any, ...] | None:
        """Write what was queued, in order: the last writes, then the transitions; with
        ``read`` (only with ``writes``), its first row, read after them in the same round
        trip (``WriteBehind.send``)."""
        if self.transitions is not None:
            self.transitions.flush(self.conn, self.writes)
        if self.writes is not None:
            return self.writes.send(self.conn, read)
        assert read is None, "a read after the writes needs them queued"
        return None

    def plan(self, response: ProduceBatchesResponse) -> Plan:
        """What the decision queued on this work (its transitions, its writes, its COPY
        payloads), taken off it as one value, with the answer."""
        assert self.writes is not None and self.copies is not None, "a plan is queued"
        if self.transitions is not None:
            self.transitions.flush(self.conn, self.writes)
        copies, self.copies = self.copies, []
        return Plan(response, self.writes.take(), copies)

    def leave(
        self, version: str, leased: Leased, rows: dict[TopicPartitionKey, PartitionRow]
    ) -> None:
        """What a registration or a commit written at ``version`` leaves: its id's row
        (``leased``) and the partition rows it wrote."""
        assert leased.meta is not None
        self.seen[leased.meta.transactional_id] = RememberedTxn(version, leased)
        self.left.update((tp, (version, row)) for tp, row in rows.items())

    def remember(self) -> None:
        """Once the request committed: the rows it read or left, for the process's next
        requests to decide on. The only place the process's memory of rows is written."""
        for memory in self.seen.values():
            remember_txn(self.conn, memory.xmin, memory.leased)
        for tp, (version, row) in self.left.items():
            remember(self.conn, tp, version, row)
