"""The two ways of writing (``broker.write``, docs/design.md §3.9) leave the same log, for
every request kind: transactional produces, registrations (KIP-890's implicit add) and
commits with their last batches, retried, aborted, with another process's producer and
plain batches in between. One world's requests go the way the strategy chooses; the
other's always under the locks."""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.broker import Broker, strategy
from app.broker.produce import produce, produce_batches
from app.coordinator.handlers import end_txn
from app.coordinator.producer_id import init_producer_id
from app.log.topics import create_topic
from app.protocol import (
    AddPartitionsToTxnRequest,
    EndTxnRequest,
    InitProducerIdRequest,
    ProduceBatchesRequest,
    ProduceBatchesResponse,
    ProduceRequest,
    RecordIn,
)
from app.storage.context import BrokerContext
from tests.helpers.write_strategy import Ways

EXAMPLES = itertools.count()

# A step: the transaction's batches for the partitions listed (a partition twice: two
# batches for it), registering those new to it; the same, ending it with a commit; an
# abort; the last request sent again; another process's idempotent producer's batch; a
# plain batch.
PARTITIONS = st.lists(st.integers(0, 2), min_size=1, max_size=4)
STEPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["produce", "commit"]), PARTITIONS),
        st.tuples(st.sampled_from(["abort", "again"]), st.just([])),
        st.tuples(st.sampled_from(["theirs", "plain"]), st.lists(st.integers(0, 2), max_size=1)),
    ),
    min_size=1,
    max_size=10,
)

# What each world's log holds, without what differs by nature (producer ids, times).
_TABLES = {
    "records": """SELECT partition, "offset", value, producer_epoch, sequence,
                         batch_base_offset, is_transactional, is_control, control_type
                  FROM records WHERE topic = :topic ORDER BY partition, "offset\"""",
    "partitions": """SELECT partition, next_offset, log_start_offset, last_stable_offset
                     FROM partitions WHERE topic = :topic ORDER BY partition""",
    "producer_states": """SELECT partition, producer_epoch, last_sequence, last_offset,
                                 batches, txn_first_offset
                          FROM producer_states WHERE topic = :topic
                          ORDER BY partition, last_offset""",
    "transaction_log": """SELECT state, producer_epoch, partitions
                          FROM transaction_log WHERE transactional_id = :topic
                          ORDER BY event_id""",
}


@dataclass
class _World:
    """One world's transactional producer, as its client would keep it."""

    topic: str
    producer_id: int
    producer_epoch: int
    sequences: dict[int, int] = field(default_factory=dict)
    registered: set[int] = field(default_factory=set)
    last: ProduceBatchesRequest | None = None

    def batches(self, partitions: list[int], step: int) -> list[ProduceRequest]:
        out = []
        for p in partitions:
            seq = self.sequences.get(p, 0)
            out.append(
                ProduceRequest(
                    self.topic, p, [RecordIn(None, f"{step}-{p}-{seq}".encode(), 0)],
                    self.producer_id, self.producer_epoch, seq, self.topic, True,
                )
            )  # fmt: skip
            self.sequences[p] = seq + 1
        return out

    def request(self, partitions: list[int], step: int, end: bool) -> ProduceBatchesRequest:
        new = sorted(set(partitions) - self.registered)
        add = None
        if new:
            add = AddPartitionsToTxnRequest(
                self.topic, self.producer_id, self.producer_epoch, [(self.topic, p) for p in new]
            )
        ending = None
        if end:
            ending = EndTxnRequest(self.topic, self.producer_id, self.producer_epoch, True)
        return ProduceBatchesRequest(self.batches(partitions, step), add, ending)

    def answered(self, req: ProduceBatchesRequest, r: ProduceBatchesResponse) -> None:
        """Keep the client's side: a refused batch's sequence is not taken, a registration
        counts, an ended transaction moves to the identity EndTxn returned."""
        for batch, b in zip(req.batches, r.batches, strict=True):
            if b.error_code:
                self.sequences[batch.partition] = min(
                    self.sequences[batch.partition], batch.base_sequence
                )
        if req.add is not None and r.registered is not None and not r.registered.error_code:
            self.registered |= {p for _, p in req.add.partitions}
        if r.end is not None and not r.end.error_code:
            self.ended(r.end.producer_id, r.end.producer_epoch)

    def ended(self, producer_id: int, producer_epoch: int) -> None:
        self.producer_id, self.producer_epoch = producer_id, producer_epoch
        self.sequences.clear()
        self.registered.clear()


def _unnamed(value: Any, topic: str) -> Any:
    """``value`` with its world's topic name taken out (the transaction log names it)."""
    if value == topic:
        return "topic"
    if isinstance(value, (list, tuple)):
        return type(value)(_unnamed(v, topic) for v in value)
    return value


def _shape(r: ProduceBatchesResponse) -> tuple[Any, ...]:
    """An answer without what differs by nature between the worlds (producer ids)."""
    return (
        [(b.error_code, b.base_offset, b.duplicate) for b in r.batches],
        None
        if r.registered is None
        else (r.registered.error_code, sorted(r.registered.results.values())),
        None if r.end is None else (r.end.error_code, r.end.producer_epoch),
    )


@settings(
    max_examples=50,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=STEPS)
def test_transactional_requests_leave_what_the_lock_way_leaves(
    broker: Broker, elsewhere: BrokerContext, steps: list[tuple[str, list[int]]]
) -> None:
    """The same transactional requests in two worlds (a topic and a transactional id
    each): one written the way the strategy chooses, the other every request under the
    locks. The same answers, records (control records too), partition rows, producer
    states and transaction log."""
    n = next(EXAMPLES)
    worlds: dict[str, _World] = {}
    for name in ("one", "lock"):
        topic = f"{name}{n}"
        create_topic(broker, topic, 3)
        ident = init_producer_id(broker, InitProducerIdRequest(topic, 60_000))
        worlds[name] = _World(topic, ident.producer_id, ident.producer_epoch)
    theirs = {
        name: init_producer_id(elsewhere, InitProducerIdRequest(None, 60_000)).producer_id
        for name in worlds
    }
    their_seqs: dict[tuple[str, int], int] = {}
    lock_topic = worlds["lock"].topic
    eligible = strategy.one_query

    def only_on_one(context: BrokerContext, conn: Any, req: ProduceBatchesRequest) -> bool:
        if any(b.topic == lock_topic for b in req.batches):
            return False
        return eligible(context, conn, req)

    ways = {kind: Ways(kind) for kind in strategy.REQUESTS}
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(strategy, "one_query", only_on_one)
        # A first transaction, under the locks in both worlds, leaves the rows the one
        # world's next requests may decide on, starting with the next one's first batch.
        first = [("produce", [0, 1]), ("commit", [2]), ("produce", [0])]
        for i, (kind, partitions) in enumerate([*first, *steps]):
            answers: dict[str, Any] = {}
            for name, w in worlds.items():
                if kind in ("produce", "commit"):
                    req = w.last = w.request(partitions, i, end=kind == "commit")
                    r = produce_batches(broker, req)
                    w.answered(req, r)
                    answers[name] = _shape(r)
                elif kind == "again" and w.last is not None:
                    r = produce_batches(broker, w.last)
                    answers[name] = _shape(r)
                elif kind == "abort":
                    e = end_txn(
                        broker, EndTxnRequest(w.topic, w.producer_id, w.producer_epoch, False)
                    )
                    if not e.error_code:
                        w.ended(e.producer_id, e.producer_epoch)
                    answers[name] = (e.error_code, e.producer_epoch)
                elif kind == "theirs" and partitions:
                    seq = their_seqs.get((name, partitions[0]), 0)
                    record = RecordIn(None, f"{i}-theirs".encode(), 0)
                    batch = ProduceRequest(w.topic, partitions[0], [record], theirs[name], 0, seq)
                    b = produce(elsewhere, batch)
                    their_seqs[(name, partitions[0])] = seq + 1
                    answers[name] = (b.error_code, b.base_offset, b.duplicate)
                elif kind == "plain" and partitions:
                    record = RecordIn(None, f"{i}-plain".encode(), 0)
                    b = produce(broker, ProduceRequest(w.topic, partitions[0], [record]))
                    answers[name] = (b.error_code, b.base_offset, b.duplicate)
            assert answers.get("one") == answers.get("lock"), (i, kind, partitions)
    with broker.engine.connect() as conn:
        tables = {
            name: {
                table: [
                    _unnamed(tuple(r), w.topic) for r in conn.execute(text(q), {"topic": w.topic})
                ]
                for table, q in _TABLES.items()
            }
            for name, w in worlds.items()
        }
    assert tables["one"] == tables["lock"]
    # The one world tried its requests in one query string wherever the strategy chose
    # it; the lock world's all went under the locks.
    assert sum(w.one + w.refused + w.declined for w in ways.values()) >= 1


def test_a_transactions_requests_go_in_one_query_once_their_rows_are_remembered(
    broker: Broker,
) -> None:
    """A transaction's registering request, its next batches (two for one partition) and
    its commit: the first registration goes under the locks (nothing is remembered yet),
    and each request after it in one query string, decided on the rows the request
    before left."""
    create_topic(broker, "t", 2)
    ident = init_producer_id(broker, InitProducerIdRequest("t", 60_000))
    w = _World("t", ident.producer_id, ident.producer_epoch)
    ways = {kind: Ways(kind) for kind in strategy.REQUESTS}

    def send(partitions: list[int], step: int, end: bool) -> ProduceBatchesResponse:
        req = w.request(partitions, step, end)
        r = produce_batches(broker, req)
        w.answered(req, r)
        assert all(b.error_code == 0 and not b.duplicate for b in r.batches)
        return r

    for step in range(3):
        registered = send([0, 1], step * 3, end=False).registered
        assert registered is not None and registered.error_code == 0
        send([0, 0, 1], step * 3 + 1, end=False)
        ended = send([1], step * 3 + 2, end=True).end
        assert ended is not None and ended.error_code == 0
    assert (ways["register"].one, ways["register"].lock) == (2, 1)
    assert (ways["produce"].one, ways["produce"].lock) == (3, 0)
    assert (ways["commit"].one, ways["commit"].lock) == (3, 0)
    assert sum(w.refused + w.declined for w in ways.values()) == 0
