"""The partition-log handlers against a real PostgreSQL: topics, Produce, Fetch, ListOffsets,
producer-state expiry and rebuilding the projections from the log."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.broker.produce import produce
from app.broker.rebuild import rebuild_all
from app.client.message import decode_headers, encode_headers
from app.clock import ManualClock
from app.errors import KafkaError, KafkaException
from app.log.expiry import expire_producer_states
from app.log.fetch import fetch, list_offsets
from app.log.rebuild import compute_partition_log, live_rows, projection_rows
from app.log.topics import create_topic, delete_topic, describe_topic, list_topics
from app.protocol import (
    EARLIEST_TIMESTAMP,
    INT32_MAX,
    LATEST_TIMESTAMP,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RECORD_HEADERS,
    RECORD_OFFSET,
    RECORD_PRODUCER_ID,
    FetchRequest,
    ListOffsetsRequest,
    ProduceRequest,
    RecordIn,
    increment_sequence,
    payload_bytes,
)
from app.settings import BrokerSettings
from tests.helpers.identities import hand_out, identity_at_epoch, init_transactional

pytestmark = pytest.mark.broker(
    topics={"t": 2}, manual_clock=True, settings=BrokerSettings(producer_id_expiration_ms=60_000)
)


@pytest.fixture(autouse=True)
def producer_ids(request: pytest.FixtureRequest) -> None:
    """The producer ids the tests send with, handed out on the broker of those that take it."""
    if "broker" in request.fixturenames:
        hand_out(request.getfixturevalue("broker"), 77, 1, 2)


def recs(n: int, tag: str = "v") -> list[RecordIn]:
    return [RecordIn(f"k{i}".encode(), f"{tag}{i}".encode(), 0) for i in range(n)]


def send(broker: Broker, seq: int, n: int = 3, epoch: int = 0, pid: int = 77, partition: int = 0):  # type: ignore[no-untyped-def]
    return produce(
        broker,
        ProduceRequest(
            "t", partition, recs(n), producer_id=pid, producer_epoch=epoch, base_sequence=seq
        ),
    )


def count(broker: Broker, where: str = "true") -> int:
    with broker.engine.connect() as conn:
        return int(conn.execute(text(f"SELECT count(*) FROM records WHERE {where}")).scalar_one())


# ------------------------------------------------------------------ topics


@pytest.mark.parametrize(
    "name",
    ["", ".", "..", "a" * 250, "bad name", "semi;colon", "quote'", "__internal", "é", "orders\n"],
)
def test_topic_names_follow_kafka_rules(broker: Broker, name: str) -> None:
    with pytest.raises(KafkaException) as info:
        create_topic(broker, name, 1)
    assert info.value.error.code() == KafkaError.INVALID_TOPIC_EXCEPTION
    assert [t.topic for t in list_topics(broker)] == ["t"]


@pytest.mark.parametrize("n", [0, -1, True, "3", 10_001])
def test_partition_count_must_be_positive_int(broker: Broker, n: object) -> None:
    with pytest.raises(KafkaException) as info:
        create_topic(broker, "x", n)  # type: ignore[arg-type]
    assert info.value.error.code() == KafkaError.INVALID_PARTITIONS


def test_topic_lifecycle(broker: Broker) -> None:
    create_topic(broker, "a.b_c-d", 3, {"cleanup.policy": "delete"})
    with pytest.raises(KafkaException) as info:
        create_topic(broker, "a.b_c-d", 1)
    assert info.value.error.code() == KafkaError.TOPIC_ALREADY_EXISTS
    info_ = describe_topic(broker, "a.b_c-d")
    assert [p.partition for p in info_.partitions] == [0, 1, 2]
    produce(broker, ProduceRequest("a.b_c-d", 1, recs(2)))
    delete_topic(broker, "a.b_c-d")
    assert count(broker, "topic = 'a.b_c-d'") == 0
    r = produce(broker, ProduceRequest("a.b_c-d", 1, recs(2)))
    assert r.error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION


# ------------------------------------------------------------------ produce rules


def test_unknown_partition_and_empty_batch(broker: Broker) -> None:
    assert (
        produce(broker, ProduceRequest("t", 2, recs(1))).error_code
        == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert (
        produce(broker, ProduceRequest("nope", 0, recs(1))).error_code
        == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert produce(broker, ProduceRequest("t", 0, [])).error_code == KafkaError.INVALID_RECORD
    assert count(broker) == 0


def test_message_max_bytes(broker: Broker) -> None:
    big = [RecordIn(None, b"x" * (broker.settings.message_max_bytes + 1), 0)]
    assert produce(broker, ProduceRequest("t", 0, big)).error_code == KafkaError.MSG_SIZE_TOO_LARGE
    assert count(broker) == 0


def test_offsets_are_gapless_and_non_idempotent_writes_allowed(broker: Broker) -> None:
    assert produce(broker, ProduceRequest("t", 0, recs(5))).base_offset == 0
    assert send(broker, 0).base_offset == 5
    assert produce(broker, ProduceRequest("t", 0, recs(2))).base_offset == 8
    with broker.engine.connect() as conn:
        offsets = [r[0] for r in conn.execute(text('SELECT "offset" FROM records ORDER BY 1'))]
    assert offsets == list(range(10))


def test_duplicate_batch_returns_original_offsets_and_writes_nothing(broker: Broker) -> None:
    first = send(broker, 0)
    send(broker, 3)
    again = send(broker, 0)
    assert again.error_code == 0 and again.duplicate and again.base_offset == first.base_offset
    assert count(broker) == 6


def test_sequence_gap_is_out_of_order(broker: Broker) -> None:
    send(broker, 0)
    r = send(broker, 4)
    assert r.error_code == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert count(broker) == 3


def test_older_epoch_is_rejected(broker: Broker) -> None:
    pid, _ = identity_at_epoch(broker, "bumped", 1)
    send(broker, 0, epoch=1, pid=pid)
    assert send(broker, 3, epoch=0, pid=pid).error_code == KafkaError.INVALID_PRODUCER_EPOCH


def test_new_epoch_starts_at_zero(broker: Broker) -> None:
    pid, _ = identity_at_epoch(broker, "bumped", 1)
    send(broker, 0, epoch=0, pid=pid)
    assert send(broker, 3, epoch=1, pid=pid).error_code == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    assert send(broker, 0, epoch=1, pid=pid).error_code == 0


def test_sequences_are_per_partition(broker: Broker) -> None:
    send(broker, 0, partition=0)
    assert send(broker, 0, partition=1).error_code == 0
    assert send(broker, 3, partition=1).error_code == 0


def test_sequence_wraps_around(broker: Broker) -> None:
    start = INT32_MAX - 1
    assert send(broker, start, n=4).error_code == 0
    nxt = increment_sequence(start, 4)
    assert nxt == 2
    assert send(broker, nxt, n=2).error_code == 0
    assert send(broker, start, n=4).duplicate
    with broker.engine.connect() as conn:
        seqs = [r[0] for r in conn.execute(text('SELECT sequence FROM records ORDER BY "offset"'))]
    assert seqs == [INT32_MAX - 1, INT32_MAX, 0, 1, 2, 3]


def test_idle_producer_state_expires_but_not_with_open_transaction(
    broker: Broker, clock: ManualClock
) -> None:
    send(broker, 0, pid=1)
    clock.advance(59_000)
    assert expire_producer_states(broker) == 0
    clock.advance(1_000)
    assert expire_producer_states(broker) == 1
    # After expiry the producer is unknown: its next batch is accepted with any sequence.
    assert send(broker, 3, pid=1).error_code == 0
    with broker.engine.begin() as conn:
        conn.execute(text("UPDATE producer_states SET txn_first_offset = 0 WHERE producer_id = 1"))
    clock.advance(10 * 60_000)
    assert expire_producer_states(broker) == 0


def test_stale_state_is_ignored_by_append_even_before_the_expiry_loop_runs(
    broker: Broker, clock: ManualClock
) -> None:
    send(broker, 0, pid=2)
    clock.advance(60_000)
    # The dedup window is gone with the expired state: sequence 100 is accepted as a fresh start.
    assert send(broker, 100, pid=2).error_code == 0


# ------------------------------------------------------------------ fetch and list offsets


def test_fetch_limits_and_out_of_range(broker: Broker) -> None:
    produce(broker, ProduceRequest("t", 0, [RecordIn(None, b"x" * 100, 0) for _ in range(50)]))
    r = fetch(broker, FetchRequest("t", 0, 10, max_bytes=500, isolation_level=READ_UNCOMMITTED))
    assert [x[RECORD_OFFSET] for x in r.records] == [10, 11, 12, 13]
    assert r.next_offset == 14 and r.high_watermark == 50
    one = fetch(broker, FetchRequest("t", 0, 0, max_bytes=1, isolation_level=READ_UNCOMMITTED))
    assert len(one.records) == 1, "a record larger than max_bytes is still returned alone"
    end = fetch(broker, FetchRequest("t", 0, 50, isolation_level=READ_UNCOMMITTED))
    assert end.records == [] and end.next_offset == 50
    assert fetch(broker, FetchRequest("t", 0, 51)).error_code == KafkaError.OFFSET_OUT_OF_RANGE
    assert fetch(broker, FetchRequest("t", 0, -1)).error_code == KafkaError.OFFSET_OUT_OF_RANGE
    assert (
        fetch(broker, FetchRequest("t", 9, 0)).error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    )
    assert (
        fetch(broker, FetchRequest("t", 0, 0, max_bytes=0)).error_code
        == KafkaError.INVALID_FETCH_SIZE
    )


def test_fetch_returns_plain_tuples_with_headers_as_stored_text(broker: Broker) -> None:
    stored = encode_headers([("h", b"\x00\xff"), ("n", None)])
    produce(
        broker,
        ProduceRequest(
            "t",
            0,
            [RecordIn(b"k", b"v", 7, stored), RecordIn(None, None, 8), RecordIn(b"e", b"", 9, [])],
        ),
    )
    for level in (READ_UNCOMMITTED, READ_COMMITTED):
        r = fetch(broker, FetchRequest("t", 0, 0, isolation_level=level))
        assert all(type(x) is tuple for x in r.records), "plain tuples: see RecordOut"
        first, tombstone, empty = r.records
        assert first[:4] == (0, 7, b"k", b"v") and tombstone[:4] == (1, 8, None, None)
        assert isinstance(first[RECORD_HEADERS], str)
        assert decode_headers(first[RECORD_HEADERS]) == [("h", b"\x00\xff"), ("n", None)]
        assert tombstone[RECORD_HEADERS] is None
        assert decode_headers(empty[RECORD_HEADERS]) == []
        assert r.records[0][RECORD_PRODUCER_ID] == tombstone[RECORD_PRODUCER_ID]


def test_payload_bytes_counts_what_the_fetch_statement_counts(broker: Broker) -> None:
    """The consumer charges fetch.max.bytes with ``payload_bytes``; the statement cut the
    read by its own sum: the same sizes, so a limit of exactly n records returns n."""
    stored = encode_headers([("h", b"\x00\xff")])
    records = [RecordIn(None, b"x" * 10, 0), RecordIn(b"k", None, 0, stored),
               RecordIn(None, None, 0), RecordIn(b"kk", b"v" * 5, 0, [])]  # fmt: skip
    produce(broker, ProduceRequest("t", 0, records))
    rows = fetch(broker, FetchRequest("t", 0, 0, isolation_level=READ_UNCOMMITTED)).records
    sizes = [payload_bytes([row]) for row in rows]
    assert sizes[0] == 24 + 10 and sizes[2] == 24 and sizes[3] == 24 + 7 + len("[]")
    assert sizes[1] == 24 + 1 + len(str(rows[1][RECORD_HEADERS]).encode())
    assert payload_bytes(rows) == sum(sizes) and payload_bytes([]) == 0
    for n in range(1, 5):
        for level in (READ_UNCOMMITTED, READ_COMMITTED):
            r = fetch(
                broker, FetchRequest("t", 0, 0, max_bytes=sum(sizes[:n]), isolation_level=level)
            )
            assert r.records == rows[:n] and r.next_offset == n
            r = fetch(
                broker, FetchRequest("t", 0, 0, max_bytes=sum(sizes[:n]) - 1, isolation_level=level)
            )
            assert r.records == rows[: max(1, n - 1)]


def test_fetch_steps_over_control_records(broker: Broker) -> None:
    produce(broker, ProduceRequest("t", 0, recs(3)))
    with broker.engine.begin() as conn:  # a marker row, as the coordinator writes them
        conn.execute(
            text(
                "INSERT INTO records VALUES ('t', 0, 3, 0, NULL, NULL, NULL, 5, 0, -1, 3, true, true, 1, 0)"
            )
        )
        conn.execute(
            text(
                "UPDATE partitions SET next_offset = 4, last_stable_offset = 4 WHERE partition = 0"
            )
        )
    produce(broker, ProduceRequest("t", 0, recs(2)))
    r = fetch(broker, FetchRequest("t", 0, 0, isolation_level=READ_UNCOMMITTED))
    assert [x[RECORD_OFFSET] for x in r.records] == [0, 1, 2, 4, 5]
    r = fetch(broker, FetchRequest("t", 0, 3, isolation_level=READ_UNCOMMITTED))
    assert [x[RECORD_OFFSET] for x in r.records] == [4, 5]


def test_list_offsets(broker: Broker, clock: ManualClock) -> None:
    t0 = clock.now_ms()
    produce(broker, ProduceRequest("t", 0, [RecordIn(None, b"a", t0 + i * 10) for i in range(5)]))
    assert list_offsets(broker, ListOffsetsRequest("t", 0, EARLIEST_TIMESTAMP)).offset == 0
    assert list_offsets(broker, ListOffsetsRequest("t", 0, LATEST_TIMESTAMP)).offset == 5
    by_ts = list_offsets(broker, ListOffsetsRequest("t", 0, t0 + 15))
    assert (by_ts.offset, by_ts.timestamp) == (2, t0 + 20)
    assert list_offsets(broker, ListOffsetsRequest("t", 0, t0 + 1000)).offset == -1
    assert (
        list_offsets(broker, ListOffsetsRequest("t", 5, 0)).error_code
        == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    )


# ------------------------------------------------------------------ projections = fold of the log


def test_rebuild_equals_live_after_randomized_workload(broker: Broker, clock: ManualClock) -> None:
    rng = random.Random(98)
    next_seq: dict[tuple[int, int], int] = {}
    # Five producers whose epochs the coordinator bumps (InitProducerId) now and then.
    ids = {k: init_transactional(broker, f"p{k}")[0] for k in range(1, 6)}
    epochs = dict.fromkeys(ids.values(), 0)
    for _ in range(300):
        action = rng.random()
        k, part = rng.randint(1, 5), rng.randint(0, 1)
        pid = ids[k]
        if action < 0.1:
            produce(broker, ProduceRequest("t", part, recs(rng.randint(1, 4))))
        elif action < 0.15:
            epochs[pid] += 1
            assert init_transactional(broker, f"p{k}") == (pid, epochs[pid])
            for p in (0, 1):
                next_seq[(pid, p)] = 0
        elif action < 0.2:
            clock.advance(rng.choice([1_000, 30_000, 70_000]))
        elif action < 0.25:
            expire_producer_states(broker)
        else:
            seq = next_seq.get((pid, part), 0)
            if rng.random() < 0.15 and seq > 0:
                send(
                    broker,
                    max(0, seq - rng.randint(1, 3)),
                    epoch=epochs[pid],
                    pid=pid,
                    partition=part,
                )
                continue
            n = rng.randint(1, 5)
            r = send(broker, seq, n=n, epoch=epochs[pid], pid=pid, partition=part)
            if r.error_code == 0 and not r.duplicate:
                next_seq[(pid, part)] = seq + n
            elif r.error_code == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER:
                next_seq[(pid, part)] = seq  # a stale guess after a retry; try again later
    expire_producer_states(broker)
    with broker.engine.connect() as conn:
        computed = projection_rows(
            compute_partition_log(conn, clock.now_ms(), broker.settings).values()
        )
        live = live_rows(conn)
    assert computed == live
    assert len(live["producer_states"]) > 0

    with broker.engine.begin() as conn:
        conn.execute(text("DELETE FROM producer_states"))
        conn.execute(text("UPDATE partitions SET next_offset = 0, last_stable_offset = 0"))
    rebuild_all(broker.engine, now_ms=clock.now_ms(), settings=broker.settings)
    with broker.engine.connect() as conn:
        assert live_rows(conn) == live


def test_materialisation_table_names_are_matched_whole() -> None:
    """Run and partition names go into DDL: a trailing newline must not pass as the
    generated shape."""
    from app.spark.sql import check_child_name, check_work_name

    good = "rc_run_" + "0" * 32
    assert check_work_name(good) == good
    assert check_child_name(good + "_3") == good + "_3"
    with pytest.raises(ValueError):
        check_work_name(good + "\n")
    with pytest.raises(ValueError):
        check_child_name(good + "_3\n")
