"""kip98 benchmarks: every figure as a ratio against raw PostgreSQL measured in the same run.

Absolute times on shared machines mean little; a ratio of two measurements taken minutes
apart on the same server means more. Each case runs on a fresh database; results are
printed as a table and written as JSON (and, with --markdown, as docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import gc
import json
import multiprocessing as mp
import os
import platform
import statistics
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import psycopg  # noqa: E402
from rich.console import Console  # noqa: E402
from rich.table import Table  # noqa: E402
from sqlalchemy import event  # noqa: E402
from sqlalchemy.engine import make_url  # noqa: E402

from app.broker import Broker  # noqa: E402
from app.broker.produce import produce as produce_handler  # noqa: E402
from app.client import Consumer, Producer, TopicPartition  # noqa: E402
from app.coordinator.producer_id import init_producer_id  # noqa: E402
from app.log.copy_records import Columns, copy_payloads_of, encode_rows  # noqa: E402
from app.log.fetch import fetch as fetch_handler  # noqa: E402
from app.log.sql import (  # noqa: E402
    ADVANCE_REMEMBERED,
    ADVANCE_REMEMBERED_PARAMS,
    COPY_RECORDS,
)
from app.log.topics import create_topic  # noqa: E402
from app.protocol import (  # noqa: E402
    READ_COMMITTED,
    READ_UNCOMMITTED,
    FetchRequest,
    InitProducerIdRequest,
    ProduceRequest,
    RecordIn,
)
from app.storage.driver import libpq_conninfo  # noqa: E402
from app.storage.embedded import database_url  # noqa: E402
from app.storage.engine import dispose_engines  # noqa: E402
from app.storage.migrate import upgrade_to_head  # noqa: E402
from app.storage.one_query import QueryCopies, as_prepared  # noqa: E402

console = Console()
KEY_BYTES, VALUE_BYTES = 16, 100


# ---------------------------------------------------------------- plumbing


@contextmanager
def fresh_database(server_url: str) -> Iterator[str]:
    name = f"kip98_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq_conninfo(server_url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(server_url).set(database=name).render_as_string(hide_password=False)
    upgrade_to_head(url)
    try:
        yield url
    finally:
        dispose_engines()
        with psycopg.connect(
            libpq_conninfo(server_url, dbname="postgres"), autocommit=True
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def rows(n: int, partition: int = 0) -> list[tuple[bytes, bytes]]:
    return [
        (f"{i:016d}".encode()[:KEY_BYTES], os.urandom(VALUE_BYTES // 2).hex().encode())
        for i in range(n)
    ]


def timed(fn: Callable[[], Any], url: str | None = None, cpu: list[float] | None = None) -> float:
    """Seconds ``fn`` takes; given the database's ``url``, once the server has settled.
    Given ``cpu``, the CPU-seconds the whole machine spent meanwhile (client, server and
    all) are appended to it."""
    if url is not None:
        settle(url)
    busy = 0.0 if cpu is None else machine_busy_s()
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    if cpu is not None:
        cpu.append(machine_busy_s() - busy)
    return elapsed


def process_cpu_s(pid: int) -> float:
    """CPU-seconds process ``pid`` has spent, all its threads (Linux's /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU-seconds every core of the machine has spent busy since boot (Linux's
    /proc/stat: all but idle and I/O wait)."""
    with open("/proc/stat") as fh:
        ticks = [int(t) for t in fh.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")


def settle(url: str) -> None:
    """Finish the background work the previous phase left the server (autovacuum of the
    rows it wrote, a checkpoint of its WAL) and Python (a full collection of the objects
    it and the next phase's set-up made: the input records, ~400,000 of them, would
    otherwise be scanned by a collection of the oldest generation inside whichever timed
    phase allocates next) before the next phase is timed, so on this small machine that
    work lands in neither phase: a ratio compares the two phases' own work."""
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    gc.collect()


def best_of(repeats: int, fn: Callable[[], float]) -> float:
    return min(fn() for _ in range(repeats))


# ---------------------------------------------------------------- raw PostgreSQL baselines


def raw_copy(url: str, data: list[tuple[bytes, bytes]]) -> float:
    """Binary COPY of the same rows into a bare table: the ceiling for an append."""
    return raw_copy_batched(url, data, len(data))


def raw_copy_batched(url: str, data: list[tuple[bytes, bytes]], batch: int) -> float:
    """The same COPY, committed every ``batch`` rows: the durability a produce pays for."""
    with psycopg.connect(libpq_conninfo(url)) as conn:
        conn.execute(
            'CREATE TABLE IF NOT EXISTS bench_raw (topic text, partition int, "offset" bigint, '
            '"timestamp" bigint, key bytea, value bytea)'
        )
        conn.execute("TRUNCATE bench_raw")
        conn.commit()
        now = int(time.time() * 1000)

        def run() -> None:
            for start in range(0, len(data), batch):
                with (
                    conn.cursor() as cur,
                    cur.copy("COPY bench_raw FROM STDIN (FORMAT BINARY)") as copy,
                ):
                    copy.set_types(["text", "int4", "int8", "int8", "bytea", "bytea"])
                    for i, (k, v) in enumerate(data[start : start + batch]):
                        copy.write_row(("raw", 0, start + i, now, k, v))
                conn.commit()

        return timed(run, url)


def _floor_batches(
    data: list[tuple[bytes, bytes]], batch: int, topic: str = "floor", partition: int = 0
) -> list[tuple[list[bytes], int]]:
    """The rows a produce of ``data`` in ``batch``-record batches writes to ``partition``
    of ``topic``, each batch encoded as the Produce handler encodes it (``encode_rows``'
    parts and the row count, as ``copy_payloads_of`` takes them)."""
    now = int(time.time() * 1000)
    return [
        _encoded(
            topic, partition, [RecordIn(k, v, now) for k, v in data[start : start + batch]], start
        )
        for start in range(0, len(data), batch)
    ]


def _encoded(
    topic: str, partition: int, records: list[RecordIn], start: int
) -> tuple[list[bytes], int]:
    """One batch's COPY rows at offset ``start``, as the Produce handler encodes them."""
    columns = Columns(records)
    req = ProduceRequest(
        topic, partition, records, producer_id=1, producer_epoch=0, base_sequence=start
    )
    return encode_rows(req, start, columns, columns.stamped(0)), len(columns)


def records_copy(
    url: str, data: list[tuple[bytes, bytes]], batch: int, sql: bool = False, encode: bool = False
) -> float:
    """The floor of a produce: the very rows the Produce handler writes (every column of
    ``records``), COPYed into ``records`` itself ``batch`` at a time, each COPY committed,
    as each acknowledged batch must be; no produce logic. Each batch is its own
    transaction (autocommit), its rows cut into COPYs as the handler cuts them
    (``copy_payloads_of``, docs/design.md §3.10) and sent as one query string: the
    fewest round trips PostgreSQL allows (a COPY's start, then its data and the next's
    start or the commit). With ``sql``, each transaction also runs the statement a produce
    runs beside its COPYs once its process remembers the partition row (rule 32), prepared
    and sent with them in one query string as the handler sends it (no round trip more),
    with values known in advance: the partition and the producer's state advanced if the
    row is still the version the last batch wrote. That is the produce's SQL
    without its Python. With ``encode`` too, each batch's rows are encoded in the loop, as
    the handler must (from the records it is given, at the offsets the remembered row
    tells): everything a produce does but deciding and SQLAlchemy's transaction."""
    payloads = [copy_payloads_of([rows]) for rows in _floor_batches(data, batch)]
    now = int(time.time() * 1000)
    inputs = [
        [RecordIn(k, v, now) for k, v in data[start : start + batch]]
        for start in range(0, len(data), batch)
    ]
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        conn.execute("DELETE FROM records WHERE topic = 'floor'")  # an earlier repeat's
        conn.execute("DELETE FROM producer_states WHERE topic = 'floor'")
        if conn.execute("SELECT 1 FROM topics WHERE topic = 'floor'").fetchone() is None:
            create_topic(Broker.connect(url), "floor", 1)
        conn.execute("UPDATE partitions SET next_offset = 0 WHERE topic = 'floor'")
        version = conn.execute(
            "SELECT CAST(xmin AS text) FROM partitions WHERE topic = 'floor'"
        ).fetchone()
        prepared = as_prepared(ADVANCE_REMEMBERED, ADVANCE_REMEMBERED_PARAMS)
        conn.execute(f"PREPARE floor_advance AS {prepared}")

        def advance(start: int, xmin: str) -> dict[str, Any]:
            end = min(start + batch, len(data))
            return {
                "topic": "floor", "partition": 0, "next_offset": end, "lso": end,
                "xmin": xmin, "expected": start,
                "producer_id": 1, "producer_epoch": 0, "last_sequence": end - 1,
                "last_offset": end - 1, "last_timestamp": 0,
                "batches": f"[[{start}, {end - 1}, {start}, {end - 1}]]",
                "coordinator_epoch": -1, "txn_first_offset": None,
            }  # fmt: skip

        def run() -> None:
            assert version is not None
            xmin = version[0]
            for i, pieces in enumerate(payloads):
                if encode:
                    pieces = copy_payloads_of([_encoded("floor", 0, inputs[i], i * batch)])
                if sql:
                    xmin = _advance_and_copy(conn, advance(i * batch, xmin), pieces)
                    continue
                _copies(conn, pieces)

        return timed(run, url)


def _advance_and_copy(
    conn: psycopg.Connection[Any], params: dict[str, Any], payloads: list[bytes]
) -> str:
    """The prepared advance and the COPYs in one query string, one implicit transaction,
    as the handler's ``storage.one_query`` sends them: the partition row's new version."""
    escaping = psycopg.pq.Escaping(conn.pgconn)
    values = b", ".join(
        b"NULL"
        if (v := params[name]) is None
        else b"%d" % v
        if isinstance(v, int)
        else escaping.escape_literal(v.encode())
        for name in ADVANCE_REMEMBERED_PARAMS
    )
    advanced = _copies(conn, payloads, b"EXECUTE floor_advance(" + values + b")")
    assert advanced is not None
    version = advanced.get_value(0, 2)
    assert version is not None
    return version.decode()


def _copies(
    conn: psycopg.Connection[Any], payloads: list[bytes], statement: bytes | None = None
) -> psycopg.pq.abc.PGresult | None:
    """``[statement; ]COPY; COPY...`` as one query string on ``conn`` (in autocommit: one
    implicit transaction), one COPY per payload, with psycopg's libpq wrapper directly:
    the statement's result. (``storage.one_query`` does this on the handler's pooled
    connection; floors run no kip98 code but its SQL text.)"""
    pg = conn.pgconn
    copies = [COPY_RECORDS.encode()] * len(payloads)
    pg.send_query(b"; ".join(([statement] if statement else []) + copies))
    results = conn.wait(psycopg.generators.execute(pg))
    first = results[0] if statement else None
    for payload in payloads:
        assert results[-1].status == psycopg.pq.ExecStatus.COPY_IN, results[-1].error_message
        conn.wait(psycopg.generators.copy_to(pg, payload, flush=False))
        pg.put_copy_end(None)
        results = conn.wait(psycopg.generators.execute(pg))
    assert results[-1].status == psycopg.pq.ExecStatus.COMMAND_OK, results[-1].error_message
    return first


def records_copy_side_by_side(
    url: str, data: list[tuple[bytes, bytes]], partitions: int, side_by_side: bool
) -> float:
    """The floor of in-flight requests: ``data`` dealt over ``partitions`` partitions, the
    rows COPYed into ``records`` 1000 per partition at a time. Side by side, one connection
    per partition COPYs and commits its own rows (lanes, their commits overlapping); else
    one connection COPYs every partition's next 1000 and commits them together (one lane).
    Each transaction's rows are cut into COPYs as the handler cuts a request's
    (``copy_payloads_of``: a lane's 1000 in three, a round's 4000 in one) and sent as one
    query string in autocommit. No produce logic: what PostgreSQL alone gains from
    overlapping commits here."""
    topic = f"lanes-{uuid.uuid4().hex[:6]}"
    create_topic(Broker.connect(url), topic, partitions)
    share = len(data) // partitions
    batches = [
        _floor_batches(data[p * share : (p + 1) * share], 1000, topic, p) for p in range(partitions)
    ]
    connections = [psycopg.connect(libpq_conninfo(url), autocommit=True) for _ in range(partitions)]

    def transactions(mine: list[list[tuple[list[bytes], int]]]) -> list[list[bytes]]:
        return [copy_payloads_of(round_) for round_ in zip(*mine, strict=True)]

    together = transactions(batches)
    alone = [transactions([mine]) for mine in batches]

    def lane(conn: psycopg.Connection[Any], payloads: list[list[bytes]]) -> None:
        for pieces in payloads:
            _copies(conn, pieces)

    def run() -> None:
        if not side_by_side:
            lane(connections[0], together)
            return
        threads = [
            threading.Thread(target=lane, args=(conn, mine))
            for conn, mine in zip(connections, alone, strict=True)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()

    try:
        return timed(run, url)
    finally:
        for conn in connections:
            conn.close()


def raw_select(url: str, topic: str, partition: int) -> tuple[float, int]:
    """A plain SELECT of the same rows and columns a fetch returns, in offset order, into
    Python tuples. Binary results, as the fetch reads them: the ratio then measures kip98's
    work, not a difference in wire format (text makes this baseline ~25% slower)."""
    with psycopg.connect(libpq_conninfo(url)) as conn:
        start = time.perf_counter()
        with conn.cursor(name="bench", binary=True) as cur:
            cur.itersize = 2000
            cur.execute(
                'SELECT "offset", "timestamp", key, value, CAST(headers AS text), producer_id '
                "FROM records WHERE topic = %s AND partition = %s AND NOT is_control "
                'ORDER BY "offset"',
                (topic, partition),
            )
            n = sum(1 for _ in cur)
        return time.perf_counter() - start, n


# ---------------------------------------------------------------- kip98 cases


def handler_produce(
    url: str, data: list[tuple[bytes, bytes]], batch: int, topic: str = "h"
) -> float:
    broker = Broker.connect(url)
    create_topic(broker, topic, 1)
    ident = init_producer_id(broker, InitProducerIdRequest(None, 60_000))
    batches = [
        [RecordIn(k, v, 0) for k, v in data[i : i + batch]] for i in range(0, len(data), batch)
    ]

    def run() -> None:
        seq = 0
        for recs in batches:
            r = produce_handler(
                broker,
                ProduceRequest(topic, 0, recs, ident.producer_id, ident.producer_epoch, seq),
            )
            assert r.error_code == 0, r
            seq += len(recs)

    return timed(run, url)


def client_produce(
    url: str,
    data: list[tuple[bytes, bytes]],
    batch: int,
    topic: str = "c",
    partitions: int = 1,
    partition: int = 0,
    config: dict[str, Any] | None = None,
) -> float:
    broker = Broker.connect(url)
    try:
        create_topic(broker, topic, partitions)
    except Exception:
        pass
    p = Producer(
        {"database.url": url, "batch.num.messages": batch, "linger.ms": 50, **(config or {})}
    )
    errors: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)

    def run() -> None:
        for k, v in data:
            while True:
                try:
                    p.produce(topic, v, k, partition=partition, on_delivery=report)
                    break
                except BufferError:
                    p.poll(0.01)
        assert p.flush(120) == 0

    t = timed(run, url)
    p.close()
    assert not errors, errors[:3]
    return t


def _producer_process(url: str, partition: int, n: int, batch: int, out: Any) -> None:
    data = rows(n)
    out.put(client_produce(url, data, batch, topic="par", partitions=4, partition=partition))


def parallel_produce(url: str, n: int, batch: int, producers: int) -> float:
    create_topic(Broker.connect(url), "par", 4)
    dispose_engines()
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    per = n // producers
    procs = [
        ctx.Process(target=_producer_process, args=(url, i, per, batch, out))
        for i in range(producers)
    ]
    start = time.perf_counter()
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    elapsed = time.perf_counter() - start
    assert all(proc.exitcode == 0 for proc in procs)
    return elapsed


def transactional_produce(
    url: str, data: list[tuple[bytes, bytes]], per_txn: int, partitions: int = 4
) -> tuple[float, int]:
    topic = f"tx-{uuid.uuid4().hex[:6]}"
    create_topic(Broker.connect(url), topic, partitions)
    p = Producer(
        {
            "database.url": url,
            "transactional.id": f"bench-{uuid.uuid4().hex[:6]}",
            "linger.ms": 50,
            "batch.num.messages": 1000,
        }
    )
    p.init_transactions()
    txns = 0

    def run() -> None:
        nonlocal txns
        for start in range(0, len(data), per_txn):
            p.begin_transaction()
            for i, (k, v) in enumerate(data[start : start + per_txn]):
                p.produce(topic, v, k, partition=i % partitions)
            p.commit_transaction()
            txns += 1

    t = timed(run, url)
    p.close()
    return t, txns


def idempotent_spread(
    url: str,
    data: list[tuple[bytes, bytes]],
    partitions: int = 4,
    in_flight: int | None = None,
    flush_every: int | None = None,
    cpu: list[float] | None = None,
    topic: str | None = None,
) -> float:
    """The idempotent Producer over ``partitions`` partitions of a new topic (``topic``, or
    a name of its own); with ``flush_every``, the application waits for its records to be
    acknowledged every so many, as a transaction's commit makes it wait (the floor of the
    transactional line). ``cpu`` as ``timed``'s."""
    topic = topic or f"id4-{uuid.uuid4().hex[:6]}"
    create_topic(Broker.connect(url), topic, partitions)
    p = Producer(
        {
            "database.url": url,
            "linger.ms": 50,
            "batch.num.messages": 1000,
            **({} if in_flight is None else {"max.in.flight": in_flight}),
        }
    )

    def run() -> None:
        for i, (k, v) in enumerate(data):
            while True:
                try:
                    p.produce(topic, v, k, partition=i % partitions)
                    break
                except BufferError:
                    p.poll(0.01)
            if flush_every and (i + 1) % flush_every == 0:
                assert p.flush(120) == 0
        assert p.flush(120) == 0

    t = timed(run, url, cpu)
    p.close()
    return t


def consume_transform_produce(
    url: str, data: list[tuple[bytes, bytes]], per_txn: int, offsets: bool, partitions: int = 4
) -> float:
    """Exactly-once's own case, timed: a read_committed Consumer reads ``data`` back from an
    input topic ``per_txn`` records at a time, and a transactional Producer writes each
    record to the same partition of an output topic in one transaction per read, with the
    consumer's positions (``offsets``: sent with ``send_offsets_to_transaction``, as a
    consume-transform-produce application does; else the same transactions without them)."""
    tag = uuid.uuid4().hex[:6]
    source, sink = f"ctp-in-{tag}", f"ctp-out-{tag}"
    idempotent_spread(url, data, partitions, topic=source)  # the input, not timed here
    create_topic(Broker.connect(url), sink, partitions)
    consumer = Consumer(
        {
            "database.url": url,
            "group.id": f"ctp-{tag}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(source, p, 0) for p in range(partitions)])
    producer = Producer(
        {
            "database.url": url,
            "transactional.id": f"ctp-{tag}",
            "linger.ms": 50,
            "batch.num.messages": 1000,
        }
    )
    producer.init_transactions()

    def run() -> None:
        done = 0
        while done < len(data):
            messages = consumer.consume(per_txn, timeout=10)
            assert messages, f"{done} of {len(data)} records read"
            producer.begin_transaction()
            for m in messages:
                producer.produce(sink, m.value(), m.key(), partition=m.partition())
            if offsets:
                producer.send_offsets_to_transaction(
                    consumer.position(consumer.assignment()), consumer.consumer_group_metadata()
                )
            producer.commit_transaction()
            done += len(messages)

    t = timed(run, url)
    producer.close()
    consumer.close()
    return t


def small_transactions(url: str, count: int) -> tuple[float, float]:
    """One-record transactions per second, and DB commits per transaction."""
    create_topic(Broker.connect(url), "one", 1)
    # The default linger.ms: the record waits for the commit, which sends it with the EndTxn.
    p = Producer({"database.url": url, "transactional.id": "bench-one"})
    p.init_transactions()
    commits = 0

    def count_commit(*_: Any) -> None:
        nonlocal commits
        commits += 1

    event.listen(p.broker.engine, "commit", count_commit)
    # A query string that commits on its own (docs/design.md §3.9, §3.11) is a DB commit
    # too, one SQLAlchemy does not see.
    enter_query = QueryCopies.__enter__

    def count_query(self: QueryCopies) -> QueryCopies:
        if self.committed:
            count_commit()
        return enter_query(self)

    QueryCopies.__enter__ = count_query  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        for i in range(count):
            p.begin_transaction()
            p.produce("one", b"x" * VALUE_BYTES, f"{i:016d}".encode())
            p.commit_transaction()
        elapsed = time.perf_counter() - start
    finally:
        QueryCopies.__enter__ = enter_query  # type: ignore[method-assign]
    p.close()
    return count / elapsed, commits / count


def fetch_all(url: str, topic: str, partition: int, level: int) -> tuple[float, int]:
    broker = Broker.connect(url)
    start = time.perf_counter()
    offset, n = 0, 0
    while True:
        r = fetch_handler(broker, FetchRequest(topic, partition, offset, 64 * 1024 * 1024, level))
        assert r.error_code == 0, r
        n += len(r.records)
        if r.next_offset == offset:
            break
        offset = r.next_offset
    return time.perf_counter() - start, n


def build_log_with_aborts(url: str, n: int, abort_ratio: float, per_txn: int = 100) -> None:
    create_topic(Broker.connect(url), "ab", 1)
    p = Producer({"database.url": url, "transactional.id": "bench-ab", "linger.ms": 20})
    p.init_transactions()
    data = rows(n)
    for t, start in enumerate(range(0, n, per_txn)):
        p.begin_transaction()
        for k, v in data[start : start + per_txn]:
            p.produce("ab", v, k, partition=0)
        if (t % round(1 / abort_ratio)) == 0:
            p.flush()  # the aborted records must reach the log, or there is nothing to skip
            p.abort_transaction()
        else:
            p.commit_transaction()
    p.close()


def consumer_read(url: str, topic: str, expected: int) -> float:
    c = Consumer(
        {
            "database.url": url,
            "group.id": "bench",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition(topic, 0, 0)])
    n = 0
    start = time.perf_counter()
    while n < expected:
        msgs = c.consume(1000, timeout=5)
        if not msgs:
            break
        n += sum(1 for m in msgs if m.error() is None)
    elapsed = time.perf_counter() - start
    c.close()
    return elapsed


def end_to_end_latency(url: str, samples: int) -> tuple[float, float]:
    """Committed → returned by an idle read_committed consumer's poll (ms, p50 and p99)."""
    create_topic(Broker.connect(url), "lat", 1)
    c = Consumer(
        {
            "database.url": url,
            "group.id": "lat",
            "isolation.level": "read_committed",
            "auto.offset.reset": "latest",
            "enable.auto.commit": False,
        }
    )
    c.assign([TopicPartition("lat", 0, 0)])
    p = Producer({"database.url": url, "transactional.id": "bench-lat", "linger.ms": 0})
    p.init_transactions()
    latencies: list[float] = []
    committed_at: dict[bytes, float] = {}
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            m = c.poll(0.5)
            if m is not None and m.error() is None and m.value() in committed_at:
                latencies.append((time.perf_counter() - committed_at[m.value()]) * 1000)

    thread = threading.Thread(target=reader)
    thread.start()
    for i in range(samples):
        value = f"v{i}".encode()
        p.begin_transaction()
        p.produce("lat", value, partition=0)
        p.commit_transaction()
        committed_at[value] = time.perf_counter()
        time.sleep(0.05)
    deadline = time.time() + 10
    while len(latencies) < samples and time.time() < deadline:
        time.sleep(0.05)
    done.set()
    thread.join()
    p.close()
    c.close()
    qs = statistics.quantiles(latencies, n=100)
    return statistics.median(latencies), qs[98]


# ---------------------------------------------------------------- the run

# The sections of a run, in order. ``--only`` takes a comma-separated list of them, or of
# groups (``core``: every section but the wire's, the cleaner's and Spark's); without it,
# every section runs but Spark's, which ``--spark`` adds.
CORE_SECTIONS = (
    "handler",
    "client1000",
    "client100",
    "parallel",
    "inflight",
    "transactional",
    "ctp",
    "acks",
    "small-txns",
    "aborts",
    "latency",
)
SECTIONS = (*CORE_SECTIONS, "wire", "cleaner", "spark")
GROUPS = {"core": CORE_SECTIONS}

Add = Callable[..., None]
# A (lowest, highest) pair of ratios, as a figure's value.
SPREAD = "{0[0]:.2f} to {0[1]:.2f}"
Wanted = Callable[[str], bool]


def chosen_sections(only: str | None, spark: bool) -> set[str]:
    """The sections ``--only`` (and ``--spark``) select; exits on an unknown name."""
    if not only:
        names = set(SECTIONS) - {"spark"}
    else:
        names = set()
        for name in filter(None, (n.strip() for n in only.split(","))):
            if name in GROUPS:
                names.update(GROUPS[name])
            elif name in SECTIONS:
                names.add(name)
            else:
                choices = ", ".join((*GROUPS, *SECTIONS))
                raise SystemExit(f"unknown --only section {name!r} (choose from {choices})")
    if spark:
        names.add("spark")
    return names


def produce_phases(server: str, data: list[tuple[bytes, bytes]], repeats: int) -> dict[str, float]:
    """The best of ``repeats`` of the handler produce and of the floors it is divided by,
    each phase on a fresh database (none COPYs into a ``records`` the others filled), the
    phases' order reversed every other repeat."""
    phases: dict[str, Callable[[str], float]] = {
        "floor": lambda url: records_copy(url, data, 1000),
        "handler": lambda url: handler_produce(url, data, 1000),
        "sql": lambda url: records_copy(url, data, 1000, sql=True),
        "encoded": lambda url: records_copy(url, data, 1000, sql=True, encode=True),
    }
    best = dict.fromkeys(phases, float("inf"))
    for r in range(repeats):
        for name in phases if r % 2 == 0 else reversed(phases):
            with fresh_database(server) as url:
                best[name] = min(best[name], phases[name](url))
    return best


def core_cases(
    server: str, args: argparse.Namespace, results: dict[str, Any], add: Add, wanted: Wanted
) -> None:
    """Every figure but the cleaner's and Spark's, each case on a fresh database."""
    n = args.records
    data = rows(n)
    if wanted("handler"):
        with console.status("raw COPY and idempotent produce"):
            with fresh_database(server) as url:
                copy_s = best_of(args.repeats, lambda: raw_copy(url, data))
                batched_s = best_of(args.repeats, lambda: raw_copy_batched(url, data, 1000))
            results["raw_copy_rows_per_s"] = n / copy_s
            add("raw COPY, one commit per 1000 rows / raw COPY", copy_s / batched_s, "{:.2f}")
            best = produce_phases(server, data, args.repeats)
            floor_s, handler_s = best["floor"], best["handler"]
            add(
                "floor: the produce's rows COPYed into records, one commit per 1000 / raw COPY",
                copy_s / floor_s,
                "{:.2f}",
            )
            add("handler produce (batch 1000) / raw COPY", copy_s / handler_s, "{:.2f}")
            add(
                "handler produce (batch 1000) / raw COPY, one commit per 1000 rows",
                batched_s / handler_s,
                "{:.2f}",
            )
            add(
                "handler produce (batch 1000) / floor (records COPY, one commit per 1000)",
                floor_s / handler_s,
                "{:.2f}",
                ">= 0.8",
            )
            add(
                "handler produce (batch 1000) / the produce's SQL alone (advance, COPY)",
                best["sql"] / handler_s,
                "{:.2f}",
            )
            add("floor: the produce's SQL alone / floor", floor_s / best["sql"], "{:.2f}")
            add(
                "floor: the produce's SQL, its rows encoded in the loop (all but deciding "
                "and SQLAlchemy's transaction) / floor",
                floor_s / best["encoded"],
                "{:.2f}",
            )
    if wanted("client1000"):
        with console.status("client produce, batch 1000"), fresh_database(server) as url:
            copy_s = best_of(args.repeats, lambda: raw_copy(url, data))
            handler_s = handler_produce(url, data, 1000)
            client_s = client_produce(url, data, 1000)
            add("idempotent Producer (batch 1000) / raw COPY", copy_s / client_s, "{:.2f}")
            add(
                "idempotent Producer (batch 1000) / handler produce (batch 1000)",
                handler_s / client_s,
                "{:.2f}",
                ">= 0.6",
            )
            results["idempotent_rows_per_s"] = n / client_s
            settle(url)  # the first reader of fresh rows sets their hint bits: neither side
            _, got = raw_select(url, "c", 0)
            _, fetched = fetch_all(url, "c", 0, READ_UNCOMMITTED)
            assert got == fetched == n
            sel_s = best_of(args.repeats, lambda: raw_select(url, "c", 0)[0])
            fetch_s = best_of(args.repeats, lambda: fetch_all(url, "c", 0, READ_UNCOMMITTED)[0])
            add("read_uncommitted fetch / raw SELECT", sel_s / fetch_s, "{:.2f}", ">= 0.5")
            consume_s = best_of(args.repeats, lambda: consumer_read(url, "c", n))
            add("read_committed Consumer / raw SELECT", sel_s / consume_s, "{:.2f}", ">= 0.5")
    if wanted("client100"):
        with console.status("client produce, batch 100"), fresh_database(server) as url:
            copy_s = best_of(args.repeats, lambda: raw_copy(url, data))
            add(
                "idempotent Producer (batch 100) / raw COPY",
                copy_s / client_produce(url, data, 100),
                "{:.2f}",
            )
    if wanted("parallel"):
        with console.status("4 producers on 4 partitions"), fresh_database(server) as url:
            one = parallel_produce(url, n, 1000, 1)
        with fresh_database(server) as url:
            four = parallel_produce(url, n, 1000, 4)
            add("4 producers x 4 partitions / 1 producer (throughput)", one / four, "{:.2f}")
    if wanted("inflight"):
        with console.status("idempotent producer, in-flight 5 and 1"):
            # The same rows over 4 partitions, five requests in flight (a lane per
            # partition) against one; rounds alternate which side leads, each side on a
            # fresh database.
            rounds, ceilings = [], []
            cores = os.cpu_count() or 1
            for i in range(args.inflight_rounds):
                times, cpu = {}, {}
                for side in (5, 1) if i % 2 == 0 else (1, 5):
                    with fresh_database(server) as url:
                        cpu[side] = []
                        times[side] = idempotent_spread(url, data, in_flight=side, cpu=cpu[side])
                rounds.append((times[1], times[5]))
                # In-flight 5 can finish no sooner than its CPU-seconds spread over every
                # core: the most it could gain on this machine, doing the work it does.
                ceilings.append(times[1] / (cpu[5][0] / cores))
            results["inflight_rounds_s"] = rounds
            ratios = [one / five for one, five in rounds]
            with fresh_database(server) as url:
                together = best_of(
                    args.repeats, lambda: records_copy_side_by_side(url, data, 4, False)
                )
                apart = best_of(args.repeats, lambda: records_copy_side_by_side(url, data, 4, True))
            add(
                "floor: 4 partitions' rows COPYed, a connection each committing side by side / "
                "one connection committing them together",
                together / apart,
                "{:.2f}",
            )
            add(
                "idempotent Producer, 4 partitions: in-flight 5 / in-flight 1 (median of rounds)",
                statistics.median(ratios),
                "{:.2f}",
                ">= 1.5",
            )
            add(
                "in-flight 5 / in-flight 1, lowest and highest round",
                (min(ratios), max(ratios)),
                SPREAD,
            )
            add(
                "ceiling: in-flight 1 / in-flight 5 keeping every core busy (its machine "
                "CPU-seconds / cores), median of rounds",
                statistics.median(ceilings),
                "{:.2f}",
            )
            for side, at in ((1, 0), (5, 1)):
                add(
                    f"idempotent Producer, 4 partitions, in-flight {side}: records/s "
                    "(median of rounds)",
                    statistics.median(n / r[at] for r in rounds),
                    "{:,.0f}",
                )
    if wanted("transactional"):
        with console.status("transactional produce"):
            # Rounds alternate the two sides, so drift in the machine's speed hits both; each
            # side starts from an empty database, so neither writes into the other's rows.
            rounds = []
            for i in range(args.txn_rounds):
                times = {}
                # Which side goes first alternates too: a round's first phase can run on a
                # quieter machine than its second, and neither side should always get it.
                sides = ("idem", "flushed", "txn")
                for side in sides if i % 2 == 0 else sides[::-1]:
                    with fresh_database(server) as url:
                        if side == "idem":
                            times[side] = idempotent_spread(url, data)
                        elif side == "flushed":
                            times[side] = idempotent_spread(url, data, flush_every=1000)
                        else:
                            times[side] = transactional_produce(url, data, 1000)[0]
                rounds.append((times["idem"], times["txn"], times["flushed"]))
            idem_s = min(r[0] for r in rounds)
            txn_s = min(r[1] for r in rounds)
            results["transactional_rounds_s"] = rounds
            add(
                "transactional (1000/txn, 4 partitions) / idempotent, best",
                idem_s / txn_s,
                "{:.2f}",
            )
            add(
                "transactional (1000/txn, 4 partitions) / idempotent, median of the rounds",
                statistics.median(i / t for i, t, _ in rounds),
                "{:.2f}",
                ">= 0.85",
            )
            add(
                "floor: idempotent, the application waiting for acknowledgement every 1000 "
                "records (as a commit makes it) / idempotent, median of the rounds",
                statistics.median(i / f for i, _, f in rounds),
                "{:.2f}",
            )
            add(
                "transactional / that floor (idempotent, flushing every 1000), median",
                statistics.median(f / t for _, t, f in rounds),
                "{:.2f}",
            )
            for name, at in (("idempotent", 0), ("transactional", 1)):
                add(
                    f"{name} Producer, 4 partitions: records/s (median of rounds)",
                    statistics.median(n / r[at] for r in rounds),
                    "{:,.0f}",
                )
    if wanted("ctp"):
        with console.status("consume-transform-produce"):
            half = data[: n // 2]
            ctp_rounds = []
            for i in range(args.txn_rounds):
                ctp_times = {}
                for with_offsets in (True, False) if i % 2 == 0 else (False, True):
                    with fresh_database(server) as url:
                        ctp_times[with_offsets] = consume_transform_produce(
                            url, half, 1000, with_offsets
                        )
                ctp_rounds.append((ctp_times[True], ctp_times[False]))
            results["ctp_rounds_s"] = ctp_rounds
            add(
                "consume-transform-produce (1000/txn, 4 partitions, the consumer's offsets in "
                "each transaction) / the same transactions without offsets, median of rounds",
                statistics.median(without / with_ for with_, without in ctp_rounds),
                "{:.2f}",
            )
            add(
                "consume-transform-produce transactions per second (median of rounds)",
                statistics.median(len(half) / 1000 / with_ for with_, _ in ctp_rounds),
                "{:,.0f}",
            )
    if wanted("acks"):
        with console.status("acks all, 1 and 0"):
            # A plain producer (no idempotence): acks=1 and acks=0 commit with
            # synchronous_commit local and off, Kafka's weaker acknowledgements.
            acks_s = {}
            for acks in ("all", "1", "0"):
                with fresh_database(server) as url:
                    extra = {"enable.idempotence": False, "acks": acks}
                    acks_s[acks] = client_produce(url, data, 1000, config=extra)
            add("plain Producer acks=1 / acks=all", acks_s["all"] / acks_s["1"], "{:.2f}")
            add("plain Producer acks=0 / acks=all", acks_s["all"] / acks_s["0"], "{:.2f}")
    if wanted("small-txns"):
        with console.status("one-record transactions"), fresh_database(server) as url:
            tps, commits = small_transactions(url, args.small_txns)
            add("one-record transactions per second", tps, "{:.0f}")
            add("DB commits per one-record transaction", commits, "{:.1f}")
    if wanted("aborts"):
        with console.status("read_committed with 10% aborted"), fresh_database(server) as url:
            build_log_with_aborts(url, n, 0.1)
            settle(url)  # hint bits set for both sides, not by whichever reads first
            _, rc_n = fetch_all(url, "ab", 0, READ_COMMITTED)
            _, ru_n = fetch_all(url, "ab", 0, READ_UNCOMMITTED)
            assert rc_n < ru_n
            rc_s = best_of(args.repeats, lambda: fetch_all(url, "ab", 0, READ_COMMITTED)[0])
            ru_s = best_of(args.repeats, lambda: fetch_all(url, "ab", 0, READ_UNCOMMITTED)[0])
            add(
                "read_committed fetch (10% aborted) / read_uncommitted",
                ru_s / rc_s,
                "{:.2f}",
                ">= 0.8",
            )
    if wanted("latency"):
        with console.status("end-to-end latency"), fresh_database(server) as url:
            p50, p99 = end_to_end_latency(url, args.latency_samples)
            add("commit -> idle read_committed poll p50 (ms)", p50, "{:.1f}")
            add("commit -> idle read_committed poll p99 (ms)", p99, "{:.1f}")


def wire_case(server: str, args: argparse.Namespace, results: dict[str, Any], add: Add) -> None:
    """Kafka clients (librdkafka, through confluent-kafka) against a ``kip98 serve`` process
    on the same database, as ratios to the native clients: the median of rounds in which
    the two sides take turns to lead, with the lowest and highest round beside it."""
    from app.server import bench as wire
    from app.server.process import ServeProcess

    n = args.records
    data = rows(n)

    def sides(i: int) -> tuple[str, str]:
        return ("native", "wire") if i % 2 == 0 else ("wire", "native")

    def report(name: str, side: str, rounds: list[tuple[float, float]], target: str) -> None:
        ratios = sorted(native / through for native, through in rounds)
        add(name, statistics.median(ratios), "{:.2f}", target)
        add(f"the same ({side}), lowest and highest round", (ratios[0], ratios[-1]), SPREAD)

    with console.status("Kafka clients through kip98 serve: produce"):
        produced = []
        # CPU-seconds per round: the bench process's (the native Producer with the broker
        # in it; or the Kafka client, librdkafka's threads included) and kip98 serve's.
        cpu: dict[str, list[float]] = {"native": [], "client": [], "serve": []}
        for i in range(args.wire_rounds):
            times = {}
            for side in sides(i):  # each side on a fresh database
                with fresh_database(server) as url:
                    create_topic(Broker.connect(url), "w", 1)
                    if side == "native":
                        settle(url)
                        mine = time.process_time()
                        times[side] = wire.native_produce(url, "w", data)
                        cpu["native"].append(time.process_time() - mine)
                    else:
                        with ServeProcess(url) as serve:
                            settle(url)
                            mine, theirs = time.process_time(), process_cpu_s(serve.proc.pid)
                            times[side] = wire.wire_produce(serve.address, "w", data)
                            cpu["client"].append(time.process_time() - mine)
                            cpu["serve"].append(process_cpu_s(serve.proc.pid) - theirs)
            produced.append((times["native"], times["wire"]))
        results["wire_produce_rounds_s"] = produced
        report(
            "confluent-kafka idempotent producer through kip98 serve / native idempotent Producer",
            "producers",
            produced,
            ">= 1.0",
        )
        for side, name in ((0, "native idempotent Producer"), (1, "confluent-kafka producer")):
            median_s = statistics.median(r[side] for r in produced)
            add(f"{name} records/s (median of rounds)", n / median_s, "{:,.0f}")
        for key, name in (
            ("native", "the native Producer's process (broker in it)"),
            ("client", "the confluent-kafka producer's process"),
            ("serve", "kip98 serve's process, for that producer"),
        ):
            add(
                f"CPU-seconds per 100,000 records produced: {name}, median of rounds",
                statistics.median(cpu[key]) * 100_000 / n,
                "{:.2f}",
            )
    with (
        console.status("Kafka clients through kip98 serve: read_committed consume"),
        fresh_database(server) as url,
        ServeProcess(url) as serve,
    ):
        create_topic(Broker.connect(url), "w", 1)
        wire.native_produce(url, "w", data)
        settle(url)  # the first reader of fresh rows sets their hint bits: neither side
        consumed = []
        for i in range(args.wire_rounds):
            times = {}
            for side in sides(i):
                if side == "native":
                    times[side] = wire.native_consume(url, "w", n)
                else:
                    times[side] = wire.wire_consume(serve.address, "w", n)
            consumed.append((times["native"], times["wire"]))
        results["wire_consume_rounds_s"] = consumed
        report(
            "confluent-kafka read_committed consumer through kip98 serve / native Consumer",
            "consumers",
            consumed,
            ">= 0.8",
        )
    with (
        console.status("Kafka clients through kip98 serve: latency"),
        fresh_database(server) as url,
        ServeProcess(url) as serve,
    ):
        create_topic(Broker.connect(url), "lat", 1)
        p50, p99 = wire.wire_latency(serve.address, "lat", args.latency_samples)
        add(
            "confluent-kafka produce -> read_committed poll through kip98 serve p50 (ms)",
            p50,
            "{:.1f}",
        )
        add(
            "confluent-kafka produce -> read_committed poll through kip98 serve p99 (ms)",
            p99,
            "{:.1f}",
        )


def cleaner_case(server: str, args: argparse.Namespace, results: dict[str, Any], add: Add) -> None:
    """Retention and compaction speed, and producers' speed while the cleaner works."""
    from app.bench.cleaner import bench_cleaner

    with console.status("log cleaner"), fresh_database(server) as url:
        c = bench_cleaner(url, args.records, lambda: settle(url))
    results["cleaner"] = c
    add(
        "compaction: records examined per second (10% aborted)",
        c["compaction_examined_per_s"],
        "{:,.0f}",
    )
    add("retention: records deleted per second", c["retention_deleted_per_s"], "{:,.0f}")
    add(
        "produce while the cleaner compacts the same partition, pass after pass / alone",
        c["producer_with_cleaner_ratio_forced"],
        "{:.2f}",
    )
    add(
        "the same, passes heeding min.cleanable.dirty.ratio (the loop's way) / alone",
        c["producer_with_cleaner_ratio_dirty_ratio"],
        "{:.2f}",
    )
    add("slowest produce (100 records), no cleaner (ms)", c["produce_max_ms_quiet"], "{:.1f}")
    add(
        f"slowest produce while retention deletes {2 * args.records:,} records (ms)",
        c["produce_max_ms_during_retention"],
        "{:.1f}",
    )


def spark_case(server: str, args: argparse.Namespace, results: dict[str, Any], add: Add) -> None:
    """Spark materialisation against a plain Spark JDBC read of the same rows."""
    from app.spark.bench import bench_materialize
    from app.spark.session import build_spark_session

    with console.status("Spark materialisation"), fresh_database(server) as url:
        spark = build_spark_session("kip98-bench")
        try:
            sres = bench_materialize(
                spark, url, n_records=args.spark_records, partitions=8, settle=lambda: settle(url)
            )
        finally:
            spark.stop()
        results["spark"] = sres
        add(
            "Spark materialise / plain Spark JDBC read + append of the same rows (throughput)",
            sres["ratio_to_read_append"],
            "{:.2f}",
            ">= 0.8",
        )
        add(
            "Spark materialise / plain Spark JDBC read (throughput)",
            sres["plain_read_s"] / sres["materialize_s"],
            "{:.2f}",
        )
        add(
            f"Spark materialise rows/s ({sres['records']:,} records, {sres['partitions']} partitions)",
            sres["materialize_rows_per_s"],
            "{:,.0f}",
        )
        add("plain Spark JDBC read rows/s", sres["plain_read_rows_per_s"], "{:,.0f}")
        add(
            "floor: plain Spark read / PostgreSQL alone writing the rows into "
            "read_committed_records",
            sres["plain_read_s"] / sres["postgres_write_s"],
            "{:.2f}",
        )


def run(args: argparse.Namespace) -> dict[str, Any]:
    server = os.environ.get("KIP98_DATABASE_URL") or database_url()
    n = args.records
    results: dict[str, Any] = {"records": n, "key_bytes": KEY_BYTES, "value_bytes": VALUE_BYTES}
    figures: list[tuple[str, str, str, str]] = []
    formats: dict[str, str] = {}

    def add(name: str, value: float | tuple[float, ...], fmt: str, target: str = "report") -> None:
        results[name] = value
        formats[name] = fmt
        figures.append((name, fmt.format(value), target, verdict(value, target)))

    sections = chosen_sections(args.only, args.spark)
    if sections & set(CORE_SECTIONS):
        core_cases(server, args, results, add, sections.__contains__)
    if "wire" in sections:
        wire_case(server, args, results, add)
    if "cleaner" in sections:
        cleaner_case(server, args, results, add)
    if "spark" in sections:
        spark_case(server, args, results, add)
    results["figures"] = figures
    results["formats"] = formats
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    return results


def verdict(value: float | tuple[float, ...], target: str) -> str:
    if target == "report" or isinstance(value, tuple):
        return "ok"
    return "ok" if value >= float(target.split()[-1]) else "below"


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of the same figures as one: each figure's median over the runs, with
    the lowest and highest run beside it (a figure that is itself a spread keeps the first
    run's), judged against its target by the median."""
    first = runs[0]
    combined = {**first, "runs": [{n: r[n] for n, *_ in r["figures"]} for r in runs]}
    figures = []
    for name, shown, target, _ in first["figures"]:
        values = [r[name] for r in runs if name in r]
        if any(isinstance(v, tuple) for v in values):
            figures.append((name, shown, target, "ok"))
            continue
        fmt = first["formats"][name]
        middle = statistics.median(values)
        combined[name] = middle
        spread = f"{fmt.format(min(values))} to {fmt.format(max(values))}"
        figures.append((name, f"{fmt.format(middle)} ({spread})", target, verdict(middle, target)))
    combined["figures"] = figures
    return combined


def render(results: dict[str, Any]) -> None:
    table = Table(
        title=f"kip98 bench — {results['records']:,} records of {KEY_BYTES}+{VALUE_BYTES} bytes"
    )
    for col in ("figure", "value", "target", ""):
        table.add_column(col)
    for name, value, target, verdict in results["figures"]:
        table.add_row(name, value, target, verdict)
    console.print(table)


NOTES = """
How to read these figures:

- With `--runs N`, each figure is the median of N runs of the whole selection, the lowest
  and highest run beside it; a figure that is itself a spread of rounds shows the first
  run's. Every ratio compares two measurements taken in the same run on the same PostgreSQL
  server, so machine noise largely cancels; absolute rates are given only as context.
  Each timed write phase starts once the server has settled (VACUUM ANALYZE, CHECKPOINT)
  and Python has collected its garbage, so the autovacuum and checkpoint a phase causes,
  and the collection of the input records a phase built, do not land in the next one.
  Raw baselines are the best of `--repeats` runs; the handler produce and the floors it
  is divided by are each the best of `--repeats` runs on fresh databases, the phases'
  order reversed every other repeat (none COPYs into a `records` another filled); the
  transactional ratio compares each side's
  best of `--txn-rounds` rounds, each side on a fresh database (the quiet machine's
  speed, as `timeit` takes the minimum), each side leading every other round (a round's
  first phase tends to run on a quieter machine), and the median of the rounds' own
  ratios is given beside it.
- Kafka-client lines (`--only wire`): the same rows produced to one partition by
  librdkafka's idempotent producer (confluent-kafka, `linger.ms` 5, its other defaults)
  through a `kip98 serve` process the bench starts on the same database, and by the native
  idempotent Producer with the same settings, each side on a fresh database, taking turns
  to lead over `--wire-rounds` rounds; the figure is the median of the rounds' ratios, with
  the lowest and highest round beside it. The consumer line reads the same committed
  records from offset 0 (`assign()`, read_committed) with librdkafka through the server
  and with the native Consumer, in alternating rounds over one database. The latency lines
  time a record from a confluent producer's `produce()` (`linger.ms` 0, each record
  acknowledged before the next, 50 ms apart) to an idle confluent read_committed
  consumer's poll, both through the server. The CPU lines give, per 100,000 records
  produced, the CPU-seconds of the bench's own process (the native Producer, with the
  broker in it; or the confluent-kafka producer, librdkafka's threads included) and of
  the `kip98 serve` process, median of the rounds.
- The in-flight line (`--only inflight`) times the idempotent Producer over 4 partitions
  (`linger.ms` 50, 1000-record batches) with `max.in.flight` 5 (a lane per partition,
  four requests committing side by side) against 1 (one request for all four partitions
  at a time), each side on a fresh database, `--inflight-rounds` rounds taking turns to
  lead; the figure is the median of the rounds' ratios. Its floor does the same with
  PostgreSQL alone: the same rows, pre-encoded, COPYed 1000 per partition by four
  connections committing side by side against one connection committing each round's
  4000 together, each transaction's rows cut into COPYs as the handler cuts a request's
  (docs/design.md §3.10: a lane's 1000 in three COPYs, a round's 4000 in one). Its ceiling is the time in-flight 5 would take if it kept every
  core of the machine busy with the work it does (the machine's busy CPU-seconds over
  the run, client, server and all, from /proc/stat, divided by the cores): in-flight 1's
  time over that, median of the rounds.
- The transactional lines (`--only transactional`) time, in rounds taking turns to
  lead, each on a fresh database: transactions of 1000 records over 4 partitions; the
  idempotent Producer writing the same rows freely; and the same idempotent Producer
  flushing every 1000 records, its application waiting for them to be acknowledged as a
  commit makes it wait: the floor of a transactional producer, which does that and more.
- The consume-transform-produce lines (`--only ctp`) time exactly-once's own loop over
  half the records: a read_committed Consumer reads 1000 records from a 4-partition
  topic, a transactional Producer writes each to the same partition of another in one
  transaction, with `send_offsets_to_transaction` of the consumer's positions before
  each commit; against the same loop without the offsets, `--txn-rounds` rounds taking
  turns to lead, each side on a fresh database, median of the rounds' ratios.
- "floor" lines measure PostgreSQL alone doing the unavoidable part of a case, with no
  kip98 code: the most the case's ratio could reach on this machine with this schema.
- "raw COPY" is one binary COPY of the same rows (16-byte keys, 100-byte values) into a
  bare table without indexes, in one transaction. A produce commits once per batch (each
  acknowledged batch is durable, as with Kafka's acks=all), keeps a primary key, and
  validates and advances producer state in the same transaction; the "raw COPY, one
  commit per 1000 rows" line shows how much of the gap is the commits alone. The produce's
  floor COPYs the very rows a produce writes (every column of `records`, encoded as the
  handler encodes them, beforehand) into `records` itself, each batch its own
  transaction (autocommit), its rows cut into three COPYs sent as one query string, as
  the handler cuts them (docs/design.md §3.10: the way that costs the server least, in
  the fewest round trips PostgreSQL allows): the table and the commits, no produce logic.
  "The produce's SQL alone" adds, in each of those transactions, the statement a produce
  runs beside its COPYs while its process remembers the partition row (docs/design.md
  rule 32), sent as the handler sends a lone batch's (prepared, then `EXECUTE` and the
  COPYs in one query string, §3.9), with values known
  in advance: the partition and the producer's state advanced if the row is still the
  version the previous batch wrote. What is left between it and the handler is kip98's
  Python. "Its rows encoded in the loop" adds the one piece of that Python no produce can
  skip: each batch's rows encoded from the records it is given (as the handler encodes
  them, at the offsets the row tells). Between that and the handler are the produce's
  decisions (shape and size checks, ACLs, the sequence rules) and SQLAlchemy's
  connection (pool checkout and check-in; a produce whose one query string commits
  itself starts no SQLAlchemy transaction, `storage.engine.lazy_transaction`).
- The acks lines time a plain (non-idempotent) Producer with `acks=1` and `acks=0`
  against `acks=all`, each on a fresh database: the weaker acknowledgements commit with
  `synchronous_commit` local and off, so they gain what a commit's WAL flush costs.
- Client figures include the Python client's per-record work (validation, partitioning,
  batching, delivery reports) on top of the handler.
- "raw SELECT" reads the same rows and columns in binary, as the fetch does, into Python.
  Read figures are taken once the server has settled (VACUUM sets the fresh rows' hint
  bits, which the first reader would otherwise pay for alone), as the best of `--repeats`
  reads per side.
- The plain Spark JDBC read reads the same relation, slices and fetch size as the
  materialisation. The plain read + append adds Spark's plain JDBC append of those rows,
  with the materialisation's batch settings, into a fresh logged table of
  `read_committed_records`' shape (primary-keyed): the least any Spark materialisation of
  the rows costs, since each row is read once and written once; the materialisation's
  ratio to it is what filtering and the exactly-once attach cost on top. The PostgreSQL
  floor line times PostgreSQL alone inserting the same rows from `records` into such a
  table.
- Cleaner figures: compaction throughput counts the records one forced pass examined (a
  partition of 10,000 keys updated over and over, one transaction in ten aborted);
  producer ratios append to the partition being compacted while a cleaner process cleans
  it pass after pass, with forced full passes or heeding `min.cleanable.dirty.ratio` as
  the background loop does. The slowest-produce lines show whether retention deleting a
  large prefix locks producers out (it deletes in slices, one transaction each).

## Where the gaps are

- **Handler produce vs its floor (target 0.8): 0.80 (0.79-0.81; runs 0.809, 0.803,
  0.788 in this table), at the target on the median (0.79 in 0.18.0's table, runs 0.792,
  0.793, 0.792; 0.794 in 0.17.0's, 0.796 in 0.16.0's, 0.8029 in 0.15.0's)**. In 0.19.0
  a produce's DB transaction begins with its first statement
  (`storage.engine.lazy_transaction`), so a batch on a remembered row, whose query
  string commits itself, no longer starts and ends SQLAlchemy's transaction around it
  (its connection's checkout to check-in 76 → 63 µs a batch, timed in place: the
  batch's rows have pushed SQLAlchemy's objects out of the CPU caches, and the same
  calls timed alone cost a third of that), and a COPY piece within one batch copies the
  batch's parts once instead of twice (~11 µs). The handler's thread, measured side by
  side (eight alternating runs against 0.18.0): 834 → 818 µs of CPU a 1000-record
  batch; its wall time, ~3.35 ms a batch, moved less than the machine's noise. The
  handler waits on the server ~2.6 ms of its ~3.3 ms a batch; of its ~0.65 ms of Python
  outside those waits, ~0.43 ms is the rows' encoding (which the "encoded in the loop"
  floor pays too), the rest is spread thin over the decision (~45 µs), the request's
  bookkeeping and the connection (~60 µs). Measured and not kept in 0.19.0: the batch
  transposed without `zip`'s iterator per record (no garbage collection a batch, but no
  faster: the columns cost the same to gather), a timestamps' maximum taken with their
  minimum (only a broker-stamped batch gains). Against a floor ~10% faster
  than 0.13.0's (0.81 then, 0.77 in 0.12.0's table against a slower floor still, 0.68
  before rule 32); against the committed raw COPY the handler went from 0.63 to 0.71. A 1000-row COPY spends ~1 ms of the server's CPU on the bookkeeping of the
  rows it buffers, growing with their square (docs/design.md §3.10, measured with perf
  and by timing the backend against rows per COPY: ~0.16 ms per COPY and commit, ~1 ns
  per pair of buffered rows, ~1.55 µs per row); the handler now sends a 1000-record
  batch as three COPYs in its one query string, 3.8 → 3.4 ms a batch (its backend's CPU
  down a sixth), and the floor, which must be the cheapest way PostgreSQL takes these
  rows, does the same: its batches went from 3.05 to ~2.75 ms, a little more in
  proportion than the handler's, hence the line at its target rather than above it. The
  floor COPYs the produce's rows, encoded beforehand, into `records`, each batch its own
  transaction in one query string: the fewest round trips PostgreSQL allows. (It used
  to be BEGIN, the COPY and COMMIT, four round trips; once the handler took two, that
  floor was slower than the handler and no floor.) A produce must also advance the partition row and the producer's state (what
  makes offsets gapless and duplicates detectable, rules 4, 5 and 13), decide on that
  state, and encode the rows it was given. While one producer writes a partition, the
  process remembers the row as its last append left it and decides on that (rule 32);
  a request that is that one batch now sends the advance, prepared once per connection,
  and the COPY as one query string, which PostgreSQL runs as one implicit transaction
  and commits as the COPY ends (docs/design.md §3.9): a batch costs two round trips
  instead of five (BEGIN, the advance, the COPY's start, its end, COMMIT), 4.15 ms →
  3.77 ms a 1000-record batch here (0.13.0). PostgreSQL running that query string with
  values known in advance costs no more than the floor, 1.01 (0.99-1.01): the advance is
  free once it travels with the COPYs. With the rows encoded in the loop, 0.86
  (0.86-0.88): encoding from records the process made long before costs ~0.45 ms a
  batch, half of it memory (the same batch encoded again, its records in the cache,
  takes ~0.25 ms). The handler reaches 0.93 of that; the rest, ~0.2 ms, is its decisions and SQLAlchemy's
  transaction (checkout, the BEGIN event, a commit with nothing left to commit,
  check-in). Measured and not kept: the rows encoded while the server runs the advance
  (the query sent first, its answer read after): 3.6 ms a batch, this line 0.85
  (0.84-0.87), the idempotent Producer / handler 0.75 and in-flight 1.17 over three full
  runs, the sender's answer being in when it asks and its thread not waiting for the
  interpreter lock once more; but from the advance on the session holds the partition
  row and waits for the COPY's data, which no PostgreSQL timeout bounds (a
  `statement_timeout` is only acted on when the data comes), so a process paused in
  those ~0.3 ms would stall the partition's other writers until it resumed, a window
  rule 24 keeps to the hand-over of a payload already encoded. The rows encoded and
  written in chunks of 100-250, so PostgreSQL parses one while the next is encoded (no
  gain in alternating A/B runs: with the client writing in pieces the backend waits for
  data between them, and the COPY took longer by what the overlap saved); the advance
  sent in psycopg's pipeline mode while the rows are encoded (psycopg syncs after BEGIN
  and at the pipeline's end, two round trips for the one it hides); a batch's integers
  packed with the prefix in one `struct` call per record, four parts a record instead of
  five (no gain: the call per record is the cost).
- **Idempotent Producer vs handler produce (target 0.6): 0.71 (0.69-0.76; 0.73 in
  0.18.0's and 0.17.0's tables)**, from 0.64 in 0.16.0's table (0.63 in 0.14.0's, 0.68 in 0.13.0's; 0.44-0.55 before 0.10.0). In
  0.17.0 `produce()` gives the interpreter lock to the sender's threads at most once a
  millisecond while a request is out (docs/design.md §8, `client/handoff.py`): CPython
  hands the lock from a thread that computes to one that waits for it only after its 5
  ms switch interval, and the application's `produce()` loop never gave it up on its own,
  so each answered request waited up to 5 ms before the sender could serve it and send
  the next, about as long as the request itself. `time.sleep(0)` is the call that hands
  it over (it sleeps the kernel's timer slack, ~60-80 µs here); `os.sched_yield()` and a
  zero-timeout `select` release the lock and take it back before the waiter wakes, and
  the waiter, seeing the lock change hands, waits a whole interval again (measured: its
  wake-up latency grew from 5 ms to ~400 ms). Measured side by side (five alternating
  runs of each, with and without): one partition, 1000-record batches 1.00 → 0.86 s for
  200,000 records; four partitions on one lane 0.84 → 0.67 s, on four lanes 0.80 → 0.73
  s; transactions of 1000 records and the idempotent Producer flushing every 1000
  unchanged (1.19-1.20 s and 1.08 s: no request is out while their application
  produces). Handing off every half millisecond gained one lane 3% more and cost four
  lanes 8%; a switch interval of 0.5 ms for the whole process gained a tenth, and would
  change it for the application too. `produce()` queues a record
  as one plain tuple (key, value, timestamp, stored headers) in its partition's current
  run, columns of records, callbacks and enqueue times cut at a batch's limits as they
  arrive, with one lock and one call into the accumulator: about 1.4 µs of CPU a
  record, from 3.7. Half of the old cost was the garbage collector: an object per record
  (a dataclass holding the callback, a NamedTuple) stays tracked, and with up to 100,000
  records queued its full collections walked them all again each time the queue grew by
  a quarter; a plain tuple of bytes and ints is untracked at its first look. Delivery
  reports are counted out with one lock per poll and their messages built in one
  positional call, only for records with a callback (~0.3 µs a record). What remains is
  the sender's own work sharing the GIL with the application's thread, and PostgreSQL
  sharing the 2 CPUs with both.
- **In-flight 5 / in-flight 1 (target 1.5): 0.97 (0.97-1.02; 0.98 in 0.18.0's and
  0.17.0's tables, 1.04 in 0.16.0's); PostgreSQL alone 1.26 (1.21-1.27; 1.30 in 0.18.0's,
  1.24 in 0.17.0's, 1.38 in 0.16.0's), below the target; the ceiling on this machine
  1.23 (1.22-1.26; 1.22, 1.22, 1.47), below it too.** Measured in 0.19.0 (three
  alternating runs): the machine's busy CPU 0.89-0.93 CPU-seconds a run with one lane,
  1.14-1.20 with four, the client's process 0.48-0.52 and 0.58-0.63 of them; with four
  lanes the machine is 79-84% busy, PostgreSQL's share 40% more for the same rows
  (four commits and twelve COPYs where one lane sends one of each). Both sides got faster in 0.17.0,
  one lane more: ~279,000 and ~279,000 records/s (~195,000 and ~202,000 in 0.16.0's
  table, on a machine ~15% slower), the application's `produce()` now handing the
  interpreter lock to the sender while a request is out (see the line above). With the
  client no longer waiting 5 ms for the lock after each answer, it is what the machine's
  two cores have to share: five lanes commit four times as often, each request costing
  the client ~0.6 ms and the server more of their fixed work (the client's process 0.49
  CPU-seconds a run with one lane, 0.60 with four), and the ceiling, all of the
  machine's work spread over both cores, fell to 1.22. Measured side by side in 0.17.0
  (three runs each): one lane 0.661 s, two lanes 0.641 s, three 0.669 s, four (five in
  flight) 0.724 s; the garbage collector off, one lane 0.654 s and four 0.671 s. In 0.15.0 the line fell from 1.09 because in-flight 1 got faster: its requests, each the four
  partitions' batches on rows the process remembers, now go as one query string, the
  four advances and the COPY, committed as the COPY ends (docs/design.md §3.9, extended
  from the lone batch), where they took BEGIN, the lock's read, the COPY, the advance
  and COMMIT: 1000 records over four partitions 5.2 → 3.9 ms in the handler, in-flight 1
  0.93-0.99 s → 0.86-0.87 s measured side by side (A/B, two runs of three rounds), while
  in-flight 5, whose lanes already sent a lone batch that way, stayed at 0.81-0.90 s
  (now ~235,000 records/s against ~220,000). In 0.14.0 PostgreSQL alone went from
  1.62 to 1.29 here: its one-connection side had COPYed each partition's 1000 rows on
  their own, four COPYs a transaction, paying the cost a COPY's buffered rows carry
  (docs/design.md §3.10) four times, where the Producer's one lane writes a request's
  4000 rows in one COPY and pays it once, and was slower than the Producer's own
  in-flight 1 writes. Each side writes as the handler does (a round's 4000 rows in one
  COPY, a lane's 1000 in three), and four connections gain 1.26 over one: what
  PostgreSQL alone, with no client work at all, gains here from overlapping commits.
  The Producer reaches 0.84 of that. Its lanes' backends came to spend a sixth less CPU
  in 0.14.0 (0.65 → 0.55 CPU-seconds a run), which moved this line little (1.08 →
  1.09-1.11): the lanes wait on the client. Until 0.17.0 the
  ceiling (the machine's CPU-seconds over the run, spread over both cores) stayed above
  the target only because it assumed the client's work overlapped everything else
  perfectly, which one interpreter lock does not allow. Lanes send one batch per request, which goes in one
  query string (§3.9); lanes that encoded while their advance ran reached 1.17 in 0.13.0
  (see the handler line for why they do not). Measured in 0.13.0 (200,000 records): with four lanes each request spends ~16 ms in the
  broker, four at a time, against 3.8 ms for one alone; two, three or five lanes all take
  0.80-0.88 s; sampled while it holds the interpreter lock, the client spends ~40% of it
  in the application's `produce()` calls; a switch interval of 0.5 ms takes one lane from
  0.91 to 0.84 s and five from 0.84 to 0.72 s (ratio 1.16). With the application out of
  the way (200,000 records queued first, then drained) one lane takes 0.67 s and five
  0.57 s (1.18): sampled every millisecond meanwhile, the four backends are on CPU 37% of
  the time, waiting for their client 31% (idle between requests 19%, inside the COPY
  for its data 12%), and on the WAL and the table's growth about 30% (`IO:WALSync` 11%,
  `LWLock:WALBufMapping` 6%, `LWLock:WALWrite` 6%, `Lock:extend` 4%: four COPYs
  extending the one `records` heap), where one lane's backend is on CPU 66% of the time.
  The analysis below, measured on 0.12.0, still holds in kind. PostgreSQL alone gains from four
  connections committing side by side: its backends run on both CPUs and the flushes
  merge. The Producer gains less because with one lane a request already carries every
  partition's ready batch in one DB transaction, while five lanes commit four times as
  often (a request per partition): over a run the machine's work grows from about 1.05 to
  1.47 CPU-seconds (the client's process 0.52 to 0.71, PostgreSQL 0.52 to 0.76). Spread
  over both cores, that work could take no less than in-flight 1's time over 1.48 (1.44-1.50):
  the ceiling line, measured each round from /proc/stat. What keeps the lanes from it is
  the client's one interpreter lock: sampled from `pg_stat_activity`, three of the four
  backends are on average waiting for their client (`Client:ClientRead`) while the
  client's threads use 0.65 s of CPU in a 1.0 s run, each lane's round trip ending in a
  wait for the lock the application's `produce()` holds (CPython hands it over every 5
  ms). A switch interval of 0.1 ms makes both sides faster (one lane 0.98 to 0.87 s, five
  1.03 to 0.94 s), not their ratio; the application giving up the lock every 512 records
  makes one lane ~10% faster and five ~6% slower (0.17.0 gives it up by time, only while
  a request is out: see the Producer line). A commit's WAL flush, what lanes
  overlap, is ~4% of a backend's time here (`IO:WALSync`). So `max.in.flight` defaults
  to 1; lanes pay where commits' flushes are slow (a remote or replicated server) and the
  client has cores to spare.
- **Transactional / idempotent (target 0.85 on the median of rounds): 0.56 (0.55-0.56;
  0.57 in 0.18.0's table, 0.56 in 0.17.0's), from 0.69 in 0.16.0's; its floor 0.64
  (0.62-0.64), below the target; transactional / floor 0.87 (0.87-0.89).** Timed by
  phase in 0.19.0 (three runs of 200 transactions each): the transactional Producer's
  1000 `produce()` calls 1.38 ms against the flushing idempotent one's 1.21 ms, its
  commit 4.6 ms against the flush's 4.05 ms, of which ~0.3 ms more waiting on the
  server (the markers, the transaction's events and row, in the same query string as
  the rows) and ~0.23 ms more Python. In 0.17.0 the idempotent Producer it is
  divided by became a quarter faster (its application no longer keeps the sender waiting
  for the interpreter lock, see the Producer line) while the transactional one, whose
  records wait for the commit with no request out, stayed as fast (1.19-1.20 s for
  200,000 records side by side; ~157,000 records/s in this table against ~136,000 on
  0.16.0's slower machine); so did the floor, the idempotent Producer flushing every 1000
  records. In 0.16.0 a transactional id's commit after its process's previous one
  now goes as one query string when the rows it touches are as that commit left them
  (docs/design.md §3.11, rule 33): decided in full on the remembered id row, lease epoch
  and partition rows, then the id's row and the partitions locked with their versions
  read, the transitions and the markers' write as `EXECUTE`s of prepared statements, and
  the COPYs, committed as the last COPY ends; refused with nothing written if any
  version moved. It took BEGIN with the id's row and lease (0.35 ms), the partition locks
  (0.42 ms), the COPY, a pipeline of the transitions, advance and markers (0.6 ms) and
  COMMIT (0.5 ms) as five round trips beside the COPY's; 1000 records over four
  partitions per commit 5.9 → 4.9 ms (median of 100 commits, measured side by side; sent as
  literal statements instead of prepared ones, planned every time, it was 5.5 ms). The
  one-record transactions went from 420 to 668 per second. What is left between the
  transactional Producer and its floor (the idempotent one waiting for its 1000 records
  each time, whose request is one query string too) is the commit's own work: deciding
  the registration, PREPARE, markers and COMPLETE (~0.2 ms of Python), the statements
  that write them (the events and the markers, ~0.3 ms of the server), and rendering
  their values (0.05 ms). The application's `produce()` calls (1.45 ms for 1000
  records) and the commit follow one another, which is what keeps the floor below 1:
  the idempotent Producer's application waits on nothing but its queue (about 1.4 µs of
  CPU a record) and its database work overlaps its `produce()` calls. Since 0.18.0 a
  consume-transform-produce transaction's commit goes in one query string too (see its
  line).
- **Consume-transform-produce (report): 0.79 (0.79-0.80) of the same transactions
  without offsets (0.80 in 0.18.0's table), from 0.66 in 0.17.0's; 96 transactions of
  1000 records a second (94-96), from 75.** Exactly-once's own loop, a read_committed Consumer's 1000 records
  written by a transactional Producer with the consumer's positions sent in each
  transaction. In 0.17.0 the offsets cost ~4 ms a transaction: their own request (one
  TxnOffsetCommit that adds them to the transaction, KIP-890's transaction version 2;
  3.2 → 2.2 ms against AddOffsetsToTxn and TxnOffsetCommit), and the commit taking the
  lock's way, 6.1-6.2 ms against the one-query commit's 4.4-4.6 ms, because the
  offsets' transition moved the id's row the process remembered. In 0.18.0 that
  TxnOffsetCommit remembers the row it leaves, with its lease's epoch, and the pending
  offsets' completion is queued with the markers' writes (docs/design.md §3.11): the
  commit with offsets is one query string too, 4.5-4.6 ms, as one without; and the
  request's writes go in one pipeline with the row's version read after them (§8), 1.64
  → 1.37 ms timed alone, 2.3 → 1.9 ms in the loop. A transaction 12.5 → 10.5 ms (five
  alternating runs against 0.17.0). What is left is that request: five round trips
  (BEGIN, the id's row with its lease, the partitions' check, the pipeline, COMMIT) and
  the commit's flush, against 0.38 ms for a bare INSERT and COMMIT on this server.
- **read_committed Consumer vs raw SELECT (target 0.5): 0.49 (0.49-0.53; 0.53 in 0.18.0's
  table, 0.52 in 0.17.0's, 0.48 in 0.16.0's and 0.51 in 0.15.0's, the path unchanged
  since), from 0.44 in 0.14.0's; at the target within its runs' spread.** Timed alone in
  0.19.0 (six reads of 200,000 records): the raw SELECT 0.17-0.19 s, the read_uncommitted
  fetch 0.20-0.23 s, the Consumer 0.33-0.36 s; a message built from a fetched row costs
  ~150 ns (one holding only the row would save ~40 ns, 2% of the read).
  A fetch's max_bytes cut is a running sum over the window in SQL, which over the wide
  rows cost as much as reading them; the partition's look now sums the window's stored
  sizes first (narrow: a value's length is in its row or TOAST pointer), and a window
  within the limit, nearly every consumer's, is read whole without the running sum
  (docs/design.md §5). The read_uncommitted fetch went from 0.58-0.60 to 0.75-0.77 of the
  raw SELECT, the Consumer from 0.39-0.41 to 0.47-0.50 measured side by side (A/B, three
  runs). What is left is the client's per-record work: a Message per record (~0.15 µs)
  and the garbage collector, which the Message objects the application holds keep
  promoting (one full collection per ~200,000 records read here, ~33 ms with the
  process's ~88,000 tracked objects; the read takes ~0.27 s with the collector off, 0.33
  s with it). The read_committed fetch over a log with one transaction in ten aborted
  keeps 0.87 of the read_uncommitted one (0.97 in 0.14.0's table, target 0.8): the
  read_uncommitted fetch it is divided by gained more from reading windows whole than
  the read_committed one, which still filters the aborted ranges in each window.
- **acks (report): acks=1 0.98 (0.97-1.02), acks=0 1.05 (1.04-1.05) of acks=all.** A commit's WAL flush is a small
  share of a 1000-record batch here; the weaker acks gain more where fsync is slow.
- **Kafka clients through `kip98 serve` (targets 1.0 and 0.8).** librdkafka's idempotent
  producer keeps one ProduceRequest in flight per partition, so a produce costs one round
  trip per batch of ~1 MB (~7,900 of these records): the server reads the batch (under
  1 µs a record) and appends it with the same COPY and commit as the native Producer.
  The producer ratio is 0.53 (0.53-0.54) (librdkafka ~151,000 records/s, the native
  Producer ~279,000 on one partition, which 0.17.0 made a sixth faster: see the Producer
  line; 0.52 in 0.18.0's table; 0.67 with ~131,000 and ~194,000 in 0.16.0's table, 0.65 with ~142,000 and
  ~222,000 in 0.15.0's; librdkafka was ~103,000-128,000 when this ratio was 0.79-1.34).
  A switch interval of 0.5 ms in `kip98 serve` (its asyncio loop and its workers share
  one lock) changed nothing: ~146,000 records/s either way. A librdkafka batch on one partition goes the one-query
  way through the server too, in one COPY (its ~7,900 rows are past where cutting pays):
  `kip98 serve` spends 0.15 CPU-seconds per 100,000 records (0.18 in 0.16.0's table,
  0.11 in 0.13.0's).
  The Kafka client is what takes the time: per 100,000 records its own process spends
  0.46 CPU-seconds (librdkafka's threads, confluent-kafka's calls and a Python
  callback per record), more than the native Producer's whole process with the broker
  in it (0.31), while `kip98 serve` spends 0.16 and, sampled (py-spy), its
  worker is idle about half the run, waiting for the client's next request. A librdkafka
  producer whose queue is not the default 100,000 records (1,000,000) takes a quarter
  less time: the client's own flow. A fetch cuts at `max_bytes` in the partition query, sizes its
  later reads by the bytes per offset seen, reads a batch's fields once per batch and
  builds record batches column by column; librdkafka keeps one fetch in flight, so the
  server's reading and the client's work do not overlap. **The consumer ratio is 0.81
  (0.71-0.84; single rounds 0.70-1.10; 0.80 in 0.18.0's table, 0.73 in 0.17.0's, 0.75 in 0.16.0's, 0.72 in
  0.15.0's, the path unchanged), at its target of 0.8 on this table's median but not on
  every run, because the native Consumer it is divided by got faster in 0.15.0**: a native fetch whose window fits max_bytes is
  now read without the running sum (see the read_committed Consumer line), 0.39-0.45 s
  → 0.30-0.37 s for the 200,000 records, while librdkafka through the server takes the
  same 0.42-0.46 s as in 0.14.0's table (0.40-0.46 s). A wire fetch fills ~1 MB from
  windows sized by the bytes per offset read so far, each after a look that sums the
  window's sizes (the same plain sum the native fetch now makes); sampled (py-spy),
  the server's fetch spends about as long in that look as in reading the records. The
  way on is to cut at max_bytes without a pass over the window's rows (a byte position
  kept per record, as Kafka's offset index keeps one); it is not built. A record goes from `produce()` to a consumer's poll in
  about 3-5 ms at the median and 5-10 ms at p99: a produce through the server ends the long
  poll of a fetch waiting there at once.
- **Spark (target 0.8): 0.96 (0.94-0.97; 1.00 in 0.18.0's table, 0.96 in 0.17.0's).** A run writes each row once: Spark appends into the
  run's own logged partitions, which one transaction attaches to `read_committed_records`
  with the progress (no second copy), so the materialisation costs the plain read +
  append plus filtering, a count of the written rows and the attach. Against the plain
  read alone the write dominates: PostgreSQL alone inserting the same rows into a logged,
  primary-keyed table takes 2-3 times the plain Spark read here. Each of these phases now
  starts once the server has settled, as the others' do: the plain append's million rows
  used to be checkpointed during the materialisation timed after it (0.78-0.93 then).
- Figures vary from run to run on this shared 2-CPU machine, by ±10% on most ratios.
"""


def markdown(results: dict[str, Any]) -> str:
    runs = len(results.get("runs", ()))
    value = f"median of {runs} runs (lowest to highest)" if runs > 1 else "value"
    lines = [
        f"| figure | {value} | target |",
        "|---|---|---|",
        *(f"| {name} | {value} | {target} |" for name, value, target, _ in results["figures"]),
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--small-txns", type=int, default=300)
    parser.add_argument(
        "--txn-rounds",
        type=int,
        default=6,
        help="idempotent/transactional rounds, each side leading every other round; each "
        "side's best is compared",
    )
    parser.add_argument(
        "--inflight-rounds",
        type=int,
        default=3,
        help="in-flight 5 / in-flight 1 rounds, each side leading every other round",
    )
    parser.add_argument(
        "--wire-rounds",
        type=int,
        default=5,
        help="rounds of the Kafka-client figures, each side leading every other round",
    )
    parser.add_argument("--latency-samples", type=int, default=100)
    parser.add_argument(
        "--spark", action="store_true", help="include the Spark materialisation figures"
    )
    parser.add_argument("--spark-records", type=int, default=1_000_000)
    parser.add_argument(
        "--only",
        metavar="SECTIONS",
        help="comma-separated sections to run (core, "
        + ", ".join(SECTIONS)
        + "); default: all but spark",
    )
    parser.add_argument(
        "--runs",
        type=int,
        default=1,
        help="run the chosen sections this many times; each figure is then the median of "
        "the runs, with the lowest and highest beside it",
    )
    parser.add_argument("--json", type=Path, default=ROOT / "bench-results.json")
    parser.add_argument("--markdown", action="store_true", help="print the table as Markdown too")
    parser.add_argument(
        "--write-docs", action="store_true", help="regenerate docs/benchmarks.md from this run"
    )
    parser.add_argument(
        "--docs-from",
        type=Path,
        metavar="JSON",
        help="regenerate docs/benchmarks.md from a saved run's JSON (its table, today's notes)",
    )
    args = parser.parse_args()
    if args.docs_from is not None:
        write_docs(json.loads(args.docs_from.read_text()))
        return
    runs = []
    for i in range(args.runs):
        if args.runs > 1:
            console.print(f"run {i + 1} of {args.runs}")
        runs.append(run(args))
    results = combine(runs) if args.runs > 1 else runs[0]
    results["command"] = " ".join(sys.argv[1:])
    results["date"] = time.strftime("%Y-%m-%d")
    render(results)
    args.json.write_text(json.dumps(results, indent=2, default=str))
    console.print(f"wrote {args.json}")
    if args.markdown:
        print(markdown(results))
    if args.write_docs:
        write_docs(results)


def write_docs(results: dict[str, Any]) -> None:
    """docs/benchmarks.md: the run's table, then the notes on reading it."""
    machine = results["machine"]
    doc = (
        f"# Benchmarks\n\nGenerated by `scripts/bench {results['command']}` on "
        f"{results['date']} ({machine['cpus']} CPUs, Python {machine['python']}), "
        f"{results['records']:,} records.\n\n" + markdown(results) + "\n" + NOTES
    )
    (ROOT / "docs" / "benchmarks.md").write_text(doc)
    console.print("wrote docs/benchmarks.md")


if __name__ == "__main__":
    main()
