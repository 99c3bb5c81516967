"""Appends on a remembered partition row (docs/design.md rule 32).

A process remembers each partition row as its last append left it, and its next append to
the partition decides on that instead of reading the row under the lock; the advance,
which goes first, checks that the row is still that version. These tests make the
remembered row wrong in each way it can be (another process appended since, the DB
transaction that wrote it rolled back, a marker moved it) and check that the append then
decides on the row as it is, as if nothing had been remembered.
"""

from __future__ import annotations

import itertools
import threading
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.broker import Broker, strategy
from app.broker.produce import produce, produce_batches
from app.broker.write import under_locks
from app.coordinator.producer_id import init_producer_id
from app.errors import KafkaError
from app.log.partition_lock import remembered
from app.log.topics import create_topic
from app.protocol import (
    InitProducerIdRequest,
    ProduceBatchesRequest,
    ProduceRequest,
    ProduceResponse,
    RecordIn,
)
from app.server.metrics import write_strategies
from app.storage.context import BrokerContext
from tests.helpers.txn_driver import TxnDriver, partition_offsets, read_values
from tests.helpers.write_strategy import Ways

pytestmark = pytest.mark.broker(topics={"t": 1})


def batch(producer_id: int, seq: int, *values: str) -> ProduceRequest:
    records = [RecordIn(None, v.encode(), 0) for v in values]
    return ProduceRequest("t", 0, records, producer_id, 0, seq)


def answer(response: ProduceResponse) -> tuple[int, int, bool]:
    return response.error_code, response.base_offset, response.duplicate


def new_producer(broker: BrokerContext) -> int:
    return init_producer_id(broker, InitProducerIdRequest(None, 60_000)).producer_id


def test_an_append_remembers_the_row_it_wrote(broker: Broker) -> None:
    pid = new_producer(broker)
    assert answer(produce(broker, batch(pid, 0, "a", "b"))) == (0, 0, False)
    with broker.engine.connect() as conn:
        hint = remembered(conn, ("t", 0))
        version = conn.execute(
            text("SELECT CAST(xmin AS text) FROM partitions WHERE topic = 't'")
        ).scalar_one()
    assert hint is not None
    assert (hint.version.xmin, hint.version.next_offset) == (version, 2)
    entry = hint.row.producer_entry()
    assert entry is not None
    assert (entry.producer_id, entry.last_sequence) == (pid, 1)
    # And the next append goes on from it.
    assert answer(produce(broker, batch(pid, 2, "c"))) == (0, 2, False)
    assert read_values(broker, "t", 0) == ["a", "b", "c"]


def _strategy_samples() -> dict[tuple[str, ...], float]:
    """serve's ``kip98_broker_write_strategy_total`` samples, by their labels."""
    return {
        tuple(sample.labels.values()): sample.value
        for sample in write_strategies().samples
        if sample.name == "kip98_broker_write_strategy_total"
    }


def test_each_way_is_counted_for_prometheus(broker: Broker, elsewhere: BrokerContext) -> None:
    """The first append of a producer goes under the locks (nothing remembered), its next
    in one query string, one after another process wrote the row is refused and then
    sent under the locks, and a duplicate is declined: each counted, as serve's /metrics
    shows them."""
    before = _strategy_samples()
    pid, theirs = new_producer(broker), new_producer(elsewhere)
    assert answer(produce(broker, batch(pid, 0, "a"))) == (0, 0, False)
    assert answer(produce(broker, batch(pid, 1, "b"))) == (0, 1, False)
    assert answer(produce(elsewhere, batch(theirs, 0, "x"))) == (0, 2, False)
    assert answer(produce(broker, batch(pid, 2, "c"))) == (0, 3, False)
    assert answer(produce(broker, batch(pid, 2, "c"))) == (0, 3, True)
    after = _strategy_samples()
    counted = {k: after[k] - before.get(k, 0) for k in after if after[k] != before.get(k, 0)}
    # In this process only: the other's producer counts in its own (the same here).
    assert counted == {
        ("produce", "locked", "sent"): 2 + 2,  # a, x; c after its refusal, the duplicate
        ("produce", "one_query", "sent"): 1,  # b
        ("produce", "one_query", "refused"): 1,  # c
        ("produce", "one_query", "declined"): 1,  # the duplicate
    }


def test_another_process_appending_since_is_seen(broker: Broker, elsewhere: BrokerContext) -> None:
    """Without the advance's version check, the third append would take offset 1 again."""
    mine, theirs = new_producer(broker), new_producer(elsewhere)
    assert answer(produce(broker, batch(mine, 0, "a"))) == (0, 0, False)
    assert answer(produce(elsewhere, batch(theirs, 0, "x", "y"))) == (0, 1, False)
    assert answer(produce(broker, batch(mine, 1, "b"))) == (0, 3, False)
    # A plain batch, which needs no producer state, likewise.
    assert answer(produce(elsewhere, ProduceRequest("t", 0, [RecordIn(None, b"z", 0)]))) == (
        0,
        4,
        False,
    )
    assert answer(produce(broker, batch(mine, 2, "c"))) == (0, 5, False)
    assert read_values(broker, "t", 0) == ["a", "x", "y", "b", "z", "c"]
    assert partition_offsets(broker, "t", 0) == (6, 6)


def test_a_row_written_by_a_rolled_back_transaction_is_never_remembered(broker: Broker) -> None:
    """The rows a request wrote are remembered only once it commits (``Work.remember``):
    an append that rolled back left the row as the last committed one did, so its batch,
    retried, is appended, not taken for a duplicate answered with offsets nothing holds."""
    pid = new_producer(broker)
    assert answer(produce(broker, batch(pid, 0, "a"))) == (0, 0, False)
    retried = batch(pid, 1, "b")
    with broker.engine.connect() as conn:
        tx = conn.begin()
        work, answered = under_locks(broker, conn, ProduceBatchesRequest([retried]))
        [first] = answered.batches
        assert answer(first) == (0, 1, False)
        assert work.left[("t", 0)][1].next_offset == 2  # to remember, had it committed
        tx.rollback()
    hint = remembered(broker.engine.connect(), ("t", 0))
    assert hint is not None and hint.version.next_offset == 1  # the committed append's
    assert answer(produce(broker, retried)) == (0, 1, False)
    assert read_values(broker, "t", 0) == ["a", "b"]
    # A duplicate of a batch that is in the log is still one.
    assert answer(produce(broker, retried)) == (0, 1, True)
    assert read_values(broker, "t", 0) == ["a", "b"]


def test_a_batch_after_a_rolled_back_one_is_out_of_order(broker: Broker) -> None:
    """A client with several requests in flight (librdkafka's max.in.flight) sends the
    next batch while the one before fails and rolls back. On the remembered row the next
    batch follows on and would be appended after a sequence and offset gap; it must be
    refused, and the two go in, in order, once retried."""
    pid = new_producer(broker)
    assert answer(produce(broker, batch(pid, 0, "a"))) == (0, 0, False)
    first, second = batch(pid, 1, "b", "c"), batch(pid, 3, "d")
    with broker.engine.connect() as conn:
        tx = conn.begin()
        [lost] = under_locks(broker, conn, ProduceBatchesRequest([first]))[1].batches
        assert answer(lost) == (0, 1, False)
        tx.rollback()
    refused = produce(broker, second)
    assert refused.error_code == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert read_values(broker, "t", 0) == ["a"]
    assert partition_offsets(broker, "t", 0) == (1, 1)
    assert answer(produce(broker, first)) == (0, 1, False)
    assert answer(produce(broker, second)) == (0, 3, False)
    assert read_values(broker, "t", 0) == ["a", "b", "c", "d"]


def test_plain_batches_take_the_lock(broker: Broker) -> None:
    """A plain batch could come from any of the process's writers: it is decided on the
    row read under the lock, and leaves the row remembered for the next producer."""
    pid = new_producer(broker)
    assert answer(produce(broker, batch(pid, 0, "a"))) == (0, 0, False)
    assert produce(broker, ProduceRequest("t", 0, [RecordIn(None, b"x", 0)])).base_offset == 1
    with broker.engine.connect() as conn:
        hint = remembered(conn, ("t", 0))
    assert hint is not None and hint.version.next_offset == 2
    assert answer(produce(broker, batch(pid, 1, "b"))) == (0, 2, False)
    assert read_values(broker, "t", 0) == ["a", "x", "b"]


def test_markers_written_since_are_seen(broker: Broker) -> None:
    """A transaction's commit marker takes an offset and closes the producer's open
    transaction; the next transaction's first batch must open a new one after it."""
    d = TxnDriver(broker, "remembered")
    assert d.init() == 0
    assert d.send("t", 0, "a").base_offset == 0
    assert d.end(commit=True) == 0  # the marker at offset 1
    assert d.send("t", 0, "b").base_offset == 2
    assert partition_offsets(broker, "t", 0) == (3, 2)  # open from offset 2
    assert d.end(commit=False) == 0
    assert read_values(broker, "t", 0) == ["a"]
    assert partition_offsets(broker, "t", 0) == (4, 4)


def test_a_lost_connection_forgets_every_row(broker: Broker) -> None:
    """After a lost connection the server may be a restored backup, its transaction ids
    counting again from an earlier point: nothing remembered is trusted."""
    pid = new_producer(broker)
    assert answer(produce(broker, batch(pid, 0, "a"))) == (0, 0, False)
    with broker.engine.connect() as conn:
        assert remembered(conn, ("t", 0)) is not None
        conn.invalidate()
    with broker.engine.connect() as conn:
        assert remembered(conn, ("t", 0)) is None
    assert answer(produce(broker, batch(pid, 1, "b"))) == (0, 1, False)
    with broker.engine.connect() as conn:
        assert remembered(conn, ("t", 0)) is not None


def test_threads_racing_on_one_remembered_row(broker: Broker) -> None:
    """Appends of one process racing for a partition all start from the same remembered
    row: one advances it, the others' advances wait for its lock, then find a newer
    version and go the lock's way. Offsets stay unique and gapless, nothing is lost."""
    per_thread, threads = 40, 4
    pids = [new_producer(broker) for _ in range(threads)]
    assert produce(broker, ProduceRequest("t", 0, [RecordIn(None, b"first", 0)])).base_offset == 0
    errors: list[BaseException] = []

    def run(n: int) -> None:
        try:
            for seq in range(per_thread):
                plain = ProduceRequest("t", 0, [RecordIn(None, f"p{n}-{seq}".encode(), 0)])
                idempotent = batch(pids[n], seq, f"i{n}-{seq}")
                for req in (plain, idempotent):
                    assert produce(broker, req).error_code == 0
        except BaseException as exc:  # checked below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(n,)) for n in range(threads)]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
    assert not errors, errors[:1]
    values = read_values(broker, "t", 0)
    assert len(values) == len(set(values)) == 1 + 2 * per_thread * threads
    for n in range(threads):  # each producer's records in its own order
        mine = [v for v in values if v.startswith(f"i{n}-")]
        assert mine == [f"i{n}-{seq}" for seq in range(per_thread)]
    with broker.engine.connect() as conn:
        offsets = [
            r[0]
            for r in conn.execute(
                text('SELECT "offset" FROM records WHERE topic = \'t\' ORDER BY "offset"')
            )
        ]
    assert offsets == list(range(len(values)))


def batches(
    producer_id: int, topic: str, values: dict[int, list[str]], seqs: dict[int, int]
) -> ProduceBatchesRequest:
    """One request with a batch per partition, each at its producer's next sequence."""
    reqs = []
    for partition, vs in values.items():
        records = [RecordIn(None, v.encode(), 0) for v in vs]
        reqs.append(ProduceRequest(topic, partition, records, producer_id, 0, seqs[partition]))
        seqs[partition] += len(vs)
    return ProduceBatchesRequest(reqs)


def test_a_request_over_several_remembered_rows_goes_in_one_query(
    broker: Broker, elsewhere: BrokerContext
) -> None:
    """Every batch of the request on a row its process remembers: the advances and the
    COPY in one query string. One of the rows written by another process since: that
    advance matches nothing, the whole write is failed with nothing written (the other
    row's advance with it), and the request goes the lock's way, each partition gapless."""
    create_topic(broker, "m", 3)
    mine, theirs = new_producer(broker), new_producer(elsewhere)
    writes = Ways("produce")
    seqs = {0: 0, 1: 0, 2: 0}
    first = broker.handle(batches(mine, "m", {0: ["a0"], 1: ["a1", "b1"], 2: ["a2"]}, seqs))
    assert [answer(r) for r in first.batches] == [(0, 0, False)] * 3
    assert (writes.one, writes.refused) == (0, 0)  # nothing remembered yet: the lock's way
    second = broker.handle(batches(mine, "m", {0: ["c0"], 1: ["c1"], 2: ["c2", "d2"]}, seqs))
    assert [answer(r) for r in second.batches] == [(0, 1, False), (0, 2, False), (0, 1, False)]
    assert (writes.one, writes.refused) == (1, 0)
    other = ProduceRequest("m", 1, [RecordIn(None, b"x1", 0)], theirs, 0, 0)
    assert answer(produce(elsewhere, other)) == (0, 3, False)
    third = broker.handle(batches(mine, "m", {0: ["e0"], 1: ["e1"], 2: ["e2"]}, seqs))
    assert [answer(r) for r in third.batches] == [(0, 2, False), (0, 4, False), (0, 3, False)]
    assert (writes.one, writes.refused) == (1, 1)  # refused, then under the locks
    fourth = broker.handle(batches(mine, "m", {0: ["f0"], 1: ["f1"]}, seqs))
    assert [answer(r) for r in fourth.batches] == [(0, 3, False), (0, 5, False)]
    assert (writes.one, writes.refused) == (2, 1)
    assert read_values(broker, "m", 0) == ["a0", "c0", "e0", "f0"]
    assert read_values(broker, "m", 1) == ["a1", "b1", "c1", "x1", "e1", "f1"]
    assert read_values(broker, "m", 2) == ["a2", "c2", "d2", "e2"]
    for partition, end in ((0, 4), (1, 6), (2, 4)):
        assert partition_offsets(broker, "m", partition) == (end, end)


def test_a_request_with_a_batch_not_remembered_takes_the_locks(broker: Broker) -> None:
    """One partition of the request never written by this process: no advance runs on
    the others' remembered rows, the whole request is decided under the locks."""
    create_topic(broker, "m", 2)
    mine = new_producer(broker)
    writes = Ways("produce")
    seqs = {0: 0, 1: 0}
    broker.handle(batches(mine, "m", {0: ["a0"]}, seqs))
    both = broker.handle(batches(mine, "m", {0: ["b0"], 1: ["b1"]}, seqs))
    assert [answer(r) for r in both.batches] == [(0, 1, False), (0, 0, False)]
    assert (writes.one, writes.refused) == (0, 0)
    again = broker.handle(batches(mine, "m", {0: ["c0"], 1: ["c1"]}, seqs))
    assert [answer(r) for r in again.batches] == [(0, 2, False), (0, 1, False)]
    assert (writes.one, writes.refused) == (1, 0)


# Steps of the property below: the remembering producer's next batch (a retry first if its
# last attempt rolled back), the same attempted and rolled back, its last committed batch
# sent again, another process's producer's batch, a plain batch, a lost connection.
STEPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["mine", "rolled back", "theirs", "plain"]), st.integers(1, 3)),
        st.tuples(st.sampled_from(["again", "lost"]), st.just(0)),
    ),
    min_size=1,
    max_size=25,
)
EXAMPLES = itertools.count()
# The property tests against a model of the log: each example starts a fresh topic on the
# same database, so the fixtures are shared and examples are slow.
MODEL_RUNS = settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


@MODEL_RUNS
@given(steps=STEPS)
def test_remembered_rows_against_a_model(
    broker: Broker, elsewhere: BrokerContext, steps: list[tuple[str, int]]
) -> None:
    """Any interleaving of one process's producer, its rolled-back attempts and retries,
    duplicates, another process's producer, plain batches and lost connections leaves the
    log and every answer as a model of the log says: offsets gapless, each batch once."""
    topic = f"model{next(EXAMPLES)}"
    create_topic(broker, topic, 1)
    mine, theirs = new_producer(broker), new_producer(elsewhere)
    log: list[str] = []
    sequences = {mine: 0, theirs: 0}
    pending: ProduceRequest | None = None  # my attempt that rolled back: retried next
    last: tuple[ProduceRequest, int] | None = None  # my last committed batch, its offset

    def next_batch(pid: int, n: int) -> ProduceRequest:
        values = [f"{pid}-{sequences[pid] + i}" for i in range(n)]
        records = [RecordIn(None, v.encode(), 0) for v in values]
        return ProduceRequest(topic, 0, records, pid, 0, sequences[pid])

    def appended(req: ProduceRequest, response: ProduceResponse) -> None:
        assert answer(response) == (0, len(log), False)
        log.extend(bytes(r.value or b"").decode() for r in req.records)
        sequences[req.producer_id] = req.base_sequence + len(req.records)

    for kind, n in steps:
        if kind in ("mine", "rolled back"):
            req = pending or next_batch(mine, n)
            if kind == "rolled back":
                with broker.engine.connect() as conn:
                    tx = conn.begin()
                    [lost] = under_locks(broker, conn, ProduceBatchesRequest([req]))[1].batches
                    assert answer(lost) == (0, len(log), False)
                    tx.rollback()
                pending = req
                continue
            offset = len(log)
            appended(req, produce(broker, req))
            pending, last = None, (req, offset)
        elif kind == "again" and last is not None and pending is None:
            assert answer(produce(broker, last[0])) == (0, last[1], True)
        elif kind == "theirs":
            req = next_batch(theirs, n)
            appended(req, produce(elsewhere, req))
        elif kind == "plain":
            req = ProduceRequest(topic, 0, [RecordIn(None, f"plain-{len(log)}".encode(), 0)])
            assert answer(produce(broker, req)) == (0, len(log), False)
            log.append(f"plain-{len(log)}")
        elif kind == "lost":
            with broker.engine.connect() as conn:
                conn.invalidate()
    assert read_values(broker, topic, 0) == log
    assert partition_offsets(broker, topic, 0) == (len(log), len(log))


def test_requests_over_shared_rows_racing_from_two_processes(
    broker: Broker, elsewhere: BrokerContext
) -> None:
    """Producers in two processes (two engines, each remembering its own appends), two
    threads each, requests with a batch for each of three partitions (the second
    process's every other one for one partition only): their one-query writes wait on
    each other's advances (taken in the same order, so none deadlocks), find some or all
    of their rows moved and take the locks. Every partition ends gapless, each
    producer's records once and in order."""
    create_topic(broker, "race", 3)
    writes = Ways("produce")
    per_thread = 25
    contexts = [broker, broker, elsewhere, elsewhere]
    pids = [new_producer(context) for context in contexts]
    errors: list[BaseException] = []
    together = threading.Barrier(len(contexts))

    def run(n: int) -> None:
        try:
            together.wait(60)  # all start at once, however slow thread starts are
            seqs = {0: 0, 1: 0, 2: 0}
            for i in range(per_thread):
                # The other process's producers write one partition every other request,
                # moving one of the rows the first process remembers and not the others.
                partitions = (i % 3,) if n >= 2 and i % 2 else (0, 1, 2)
                values = {p: [f"{n}-{p}-{seqs[p]}"] for p in partitions}
                response = produce_batches(contexts[n], batches(pids[n], "race", values, seqs))
                assert [r.error_code for r in response.batches] == [0] * len(partitions)
        except BaseException as exc:  # checked below
            errors.append(exc)

    workers = [threading.Thread(target=run, args=(n,)) for n in range(len(contexts))]
    for w in workers:
        w.start()
    for w in workers:
        w.join(120)
        assert not w.is_alive()
    assert not errors, errors[:1]
    # Both ways were raced: one-query writes that went through and ones refused.
    assert writes.one and writes.refused, (writes.one, writes.refused)
    for p in (0, 1, 2):
        values = read_values(broker, "race", p)
        assert len(values) == len(set(values))
        for n in range(len(contexts)):
            mine = [v for v in values if v.startswith(f"{n}-")]
            assert mine == [f"{n}-{p}-{i}" for i in range(len(mine))]
            assert len(mine) >= per_thread // 2
        assert partition_offsets(broker, "race", p) == (len(values), len(values))


# Steps of the property below: the remembering producer's next request over some of the
# partitions (a retry first if its last attempt rolled back), the same attempted and rolled
# back, its last committed request sent again, another process's producer's batch or a
# plain batch on one partition, a lost connection.
SOME_PARTITIONS = st.sampled_from([(0,), (1,), (0, 1)])
ONE_PARTITION = st.sampled_from([(0,), (1,)])
REQUEST_STEPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["mine", "rolled back"]), SOME_PARTITIONS, st.integers(1, 3)),
        st.tuples(st.sampled_from(["theirs", "plain"]), ONE_PARTITION, st.integers(1, 2)),
        st.tuples(st.sampled_from(["again", "lost"]), st.just(()), st.just(0)),
    ),
    min_size=1,
    max_size=25,
)


@MODEL_RUNS
@given(steps=REQUEST_STEPS)
def test_requests_over_several_remembered_rows_against_a_model(
    broker: Broker, elsewhere: BrokerContext, steps: list[tuple[str, tuple[int, ...], int]]
) -> None:
    """The same as above with requests of a batch per partition over two partitions, the
    one-query write advancing several remembered rows at once: every interleaving leaves
    each partition's log and every answer as the model says."""
    topic = f"requests{next(EXAMPLES)}"
    create_topic(broker, topic, 2)
    mine, theirs = new_producer(broker), new_producer(elsewhere)
    logs: dict[int, list[str]] = {0: [], 1: []}
    sequences = {(pid, p): 0 for pid in (mine, theirs) for p in (0, 1)}
    pending: ProduceBatchesRequest | None = None  # my attempt that rolled back
    last: tuple[ProduceBatchesRequest, list[int]] | None = None  # my last committed one

    def next_request(pid: int, partitions: tuple[int, ...], n: int) -> ProduceBatchesRequest:
        reqs = []
        for p in partitions:
            seq = sequences[(pid, p)]
            records = [RecordIn(None, f"{pid}-{p}-{seq + i}".encode(), 0) for i in range(n)]
            reqs.append(ProduceRequest(topic, p, records, pid, 0, seq))
        return ProduceBatchesRequest(reqs)

    def expected(req: ProduceBatchesRequest) -> list[tuple[int, int, bool]]:
        return [(0, len(logs[b.partition]), False) for b in req.batches]

    def appended(req: ProduceBatchesRequest, responses: list[ProduceResponse]) -> list[int]:
        assert [answer(r) for r in responses] == expected(req)
        for b in req.batches:
            logs[b.partition].extend(bytes(r.value or b"").decode() for r in b.records)
            sequences[(b.producer_id, b.partition)] = b.base_sequence + len(b.records)
        return [r.base_offset for r in responses]

    for kind, partitions, n in steps:
        if kind in ("mine", "rolled back"):
            req = pending or next_request(mine, partitions, n)
            if kind == "rolled back":
                with broker.engine.connect() as conn:
                    tx = conn.begin()
                    lost = under_locks(broker, conn, req)[1].batches
                    assert [answer(r) for r in lost] == expected(req)
                    tx.rollback()
                pending = req
                continue
            offsets = appended(req, broker.handle(req).batches)
            pending, last = None, (req, offsets)
        elif kind == "again" and last is not None and pending is None:
            again = broker.handle(last[0]).batches
            assert [answer(r) for r in again] == [(0, o, True) for o in last[1]]
        elif kind == "theirs":
            req = next_request(theirs, partitions, n)
            appended(req, [produce(elsewhere, req.batches[0])])
        elif kind == "plain":
            (p,) = partitions
            value = f"plain-{len(logs[p])}"
            plain = ProduceRequest(topic, p, [RecordIn(None, value.encode(), 0)])
            assert answer(produce(broker, plain)) == (0, len(logs[p]), False)
            logs[p].append(value)
        elif kind == "lost":
            with broker.engine.connect() as conn:
                conn.invalidate()
    for p in (0, 1):
        assert read_values(broker, topic, p) == logs[p]
        assert partition_offsets(broker, topic, p) == (len(logs[p]), len(logs[p]))


# Steps of the comparison below: my producer's request with a batch for each partition
# listed (a partition listed twice: two batches for it, one after the other), my last
# request sent again (its batches duplicates), another process's producer's batch, a
# plain batch.
REQUESTS = st.lists(
    st.one_of(
        st.tuples(st.just("mine"), st.lists(st.integers(0, 2), min_size=1, max_size=4)),
        st.tuples(st.just("again"), st.just([0])),
        st.tuples(st.sampled_from(["theirs", "plain"]), st.lists(st.integers(0, 2), max_size=1)),
    ),
    min_size=1,
    max_size=12,
)

_PRODUCE_TABLES = {
    "records": """SELECT partition, "offset", value, producer_epoch, sequence,
                         batch_base_offset, is_transactional
                  FROM records WHERE topic = :topic ORDER BY partition, "offset\"""",
    "partitions": """SELECT partition, next_offset, log_start_offset, last_stable_offset
                     FROM partitions WHERE topic = :topic ORDER BY partition""",
    "producer_states": """SELECT partition, producer_epoch, last_sequence, last_offset, batches
                          FROM producer_states WHERE topic = :topic
                          ORDER BY partition, last_offset""",
}


@settings(
    max_examples=20,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(steps=REQUESTS)
def test_produce_requests_leave_what_the_lock_way_leaves(
    broker: Broker, elsewhere: BrokerContext, steps: list[tuple[str, list[int]]]
) -> None:
    """The same idempotent and plain produce requests (several partitions, several
    batches for one partition, duplicates, another process's producer in between) on two
    topics, on one each request going the way the strategy chooses, on the other every
    one under the locks: the same answers, records, partition rows and producer states."""
    n = next(EXAMPLES)
    worlds = {"one": f"one{n}", "lock": f"lock{n}"}
    for topic in worlds.values():
        create_topic(broker, topic, 3)
    mine = {w: new_producer(broker) for w in worlds}
    theirs = {w: new_producer(elsewhere) for w in worlds}
    seqs: dict[tuple[str, int, int], int] = {}
    last: dict[str, ProduceBatchesRequest] = {}

    def request(world: str, pid: int, partitions: list[int], i: int) -> ProduceBatchesRequest:
        reqs = []
        for partition in partitions:
            key = (world, pid, partition)
            seq = seqs.get(key, 0)
            records = [RecordIn(None, f"{i}-{partition}-{seq}".encode(), 0)]
            reqs.append(ProduceRequest(worlds[world], partition, records, pid, 0, seq))
            seqs[key] = seq + 1
        return ProduceBatchesRequest(reqs)

    eligible = strategy.one_query
    lock_topic = worlds["lock"]

    def only_on_one(context: BrokerContext, conn: Any, req: ProduceBatchesRequest) -> bool:
        if any(b.topic == lock_topic for b in req.batches):
            return False
        return eligible(context, conn, req)

    ways = Ways("produce")
    with pytest.MonkeyPatch.context() as patched:
        patched.setattr(strategy, "one_query", only_on_one)
        for i, (kind, partitions) in enumerate(steps):
            answers = {}
            for world in worlds:
                if kind == "mine":
                    req = last[world] = request(world, mine[world], partitions, i)
                    got = produce_batches(broker, req).batches
                elif kind == "again":
                    if world not in last:
                        continue
                    got = produce_batches(broker, last[world]).batches
                elif kind == "theirs" and partitions:
                    got = produce_batches(
                        elsewhere, request(world, theirs[world], partitions, i)
                    ).batches
                elif kind == "plain" and partitions:
                    records = [RecordIn(None, f"{i}-plain".encode(), 0)]
                    got = [produce(broker, ProduceRequest(worlds[world], partitions[0], records))]
                else:
                    continue
                answers[world] = [answer(r) for r in got]
            assert answers.get("one") == answers.get("lock"), (kind, partitions)
    assert ways.lock or not last  # every request of the lock world, at least
    with broker.engine.connect() as conn:
        tables = {
            world: {
                name: [tuple(r) for r in conn.execute(text(q), {"topic": topic})]
                for name, q in _PRODUCE_TABLES.items()
            }
            for world, topic in worlds.items()
        }
    assert tables["one"] == tables["lock"]


def test_what_the_strategy_sends_under_the_locks_from_the_start(broker: Broker) -> None:
    """The one choice (``strategy.one_query``) sends under the locks, without trying the
    remembered row, what that row cannot decide: a plain batch. Two batches of one
    producer for one partition are decided one after the other on the remembered row and
    go in one query string, as the producer's next lone batch does."""
    pid = new_producer(broker)
    assert answer(produce(broker, batch(pid, 0, "a"))) == (0, 0, False)
    ways = Ways("produce")
    assert answer(produce(broker, ProduceRequest("t", 0, [RecordIn(None, b"p", 0)]))) == (
        0,
        1,
        False,
    )
    assert (ways.one, ways.lock, ways.refused, ways.declined) == (0, 1, 0, 0)
    # The plain batch left the row: the producer's next batches are decided under the lock,
    # and the row is remembered as they leave it.
    twice = produce_batches(broker, ProduceBatchesRequest([batch(pid, 1, "b"), batch(pid, 2, "c")]))
    assert [answer(r) for r in twice.batches] == [(0, 2, False), (0, 3, False)]
    assert (ways.one, ways.lock, ways.refused, ways.declined) == (0, 2, 0, 0)
    again = produce_batches(broker, ProduceBatchesRequest([batch(pid, 3, "d"), batch(pid, 4, "e")]))
    assert [answer(r) for r in again.batches] == [(0, 4, False), (0, 5, False)]
    assert (ways.one, ways.lock, ways.refused, ways.declined) == (1, 2, 0, 0)
    assert answer(produce(broker, batch(pid, 5, "f"))) == (0, 6, False)
    assert (ways.one, ways.lock, ways.refused, ways.declined) == (2, 2, 0, 0)
    assert read_values(broker, "t", 0) == ["a", "p", "b", "c", "d", "e", "f"]
