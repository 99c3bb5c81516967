"""The floors: PostgreSQL alone doing the unavoidable part of a case, with no kip98 code.

Each is the most its case's ratio could reach on this machine with this schema: a raw
COPY into a bare table, the produce's very rows COPYed into ``records`` as the handler
cuts them, the produce's SQL without its Python, four connections committing side by
side, a plain SELECT of what a fetch returns. They reach PostgreSQL through psycopg
directly and run no kip98 code but its SQL text and its row encoding.
"""

from __future__ import annotations

import threading
import time
import uuid
from typing import Any

import psycopg

from app.broker import Broker
from app.log.copy_records import Columns, copy_payloads_of, encode_rows
from app.log.sql import ADVANCE_REMEMBERED, ADVANCE_REMEMBERED_PARAMS, COPY_RECORDS
from app.log.topics import create_topic
from app.protocol import ProduceRequest, RecordIn
from app.storage.driver import libpq_conninfo
from app.storage.one_query import as_prepared
from bench.timing import timed


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
