"""Fetch and ListOffsets: reading a partition at either isolation level.

A read needs no lock. Offsets below the high watermark are all committed and visible
(appends hold the partition lock to COMMIT), so reading the partition row first and then
the records below the bound it gave returns every record there is up to it (gaps are only
what the log cleaner removed, below the LSO; offsets never move). Nor does it need a
transaction: at READ COMMITTED every statement takes its own snapshot anyway, so a fetch
runs in autocommit and saves the BEGIN and ROLLBACK round trips. read_committed is
bounded by the LSO and filtered in SQL (markers and aborted transactions never leave the
database). So is max_bytes: the statement stops returning records at the limit, and the
values of those it leaves out are never read (see ``sql.FETCH_UNCOMMITTED``); a window
the partition's look finds within max_bytes is read whole, without the running sum
(``sql.FETCH_UNCOMMITTED_WHOLE``). A fetch of
the log's batches (the wire protocol's) learns where the limit cuts its window with the
partition's offsets and then reads the window up to there (see
``sql.PARTITION_FOR_BATCHES_FETCH``).
"""

from __future__ import annotations

from bisect import bisect_right
from operator import itemgetter
from typing import Any

from sqlalchemy import Connection

from app.errors import KafkaError, KafkaException, fail
from app.log import sql
from app.log.leader_epoch import current_epoch_refusal, epoch_at, leader_epoch_history
from app.log.naming import could_exist
from app.protocol import (
    BATCHES_WINDOW_FACTOR,
    EARLIEST_TIMESTAMP,
    LATEST_TIMESTAMP,
    LOG_BATCH,
    LOG_BATCH_BASE_OFFSET,
    MAX_TIMESTAMP,
    READ_COMMITTED,
    READ_UNCOMMITTED,
    RECORD_HEADERS,
    RECORD_KEY,
    RECORD_OFFSET,
    RECORD_OVERHEAD_BYTES,
    RECORD_TIMESTAMP,
    RECORD_VALUE,
    AbortedTransaction,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
    LogRecord,
    RecordOut,
)
from app.security import needs
from app.security.authorizer import authorize_all
from app.storage.context import BrokerContext

_batch_base = itemgetter(LOG_BATCH_BASE_OFFSET)
_key_of = itemgetter(RECORD_KEY)
_value_of = itemgetter(RECORD_VALUE)
_headers_of = itemgetter(RECORD_HEADERS)


def _partition_offsets(conn: Connection, topic: str, partition: int) -> Any:
    if not could_exist(topic):
        raise fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} [{partition}] does not exist")
    row = conn.execute(sql.PARTITION_OFFSETS, {"topic": topic, "partition": partition}).first()
    if row is None:
        raise fail(KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{topic} [{partition}] does not exist")
    return row


def read_records(conn: Connection, statement: str, params: dict[str, object]) -> list[Any]:
    """Run a fetch statement (sql.FETCH_*) on the connection's DBAPI cursor.

    psycopg builds each row as a plain tuple in C, so a record costs no Python call here;
    SQLAlchemy's Row per record cost more than the query itself. Binary results spare
    PostgreSQL the hex encoding of keys and values and psycopg the decoding (about a third
    of the read's time).
    """
    driver = conn.connection.driver_connection
    assert driver is not None, "a checked-out connection has its psycopg connection"
    with driver.cursor(binary=True) as cursor:
        cursor.execute(statement, params)
        return cursor.fetchall()


def _runs_have_batches(records: list[LogRecord]) -> bool:
    """Whether the first record of every run of one batch has its batch's fields: not so
    where the cleaner removed the records a batch started with (or the fetch's start)."""
    start, end = 0, len(records)
    while start < end:
        if records[start][LOG_BATCH] is None:
            return False
        base = records[start][LOG_BATCH_BASE_OFFSET]
        start = bisect_right(records, base, start, end, key=_batch_base)
    return True


def fetch(broker: BrokerContext, req: FetchRequest) -> FetchResponse:
    try:
        return _fetch(broker, req)
    except KafkaException as exc:
        return FetchResponse(exc.error.code(), error_message=exc.error.str())


def _fetch(broker: BrokerContext, req: FetchRequest) -> FetchResponse:
    if req.isolation_level not in (READ_COMMITTED, READ_UNCOMMITTED):
        raise fail(KafkaError.INVALID_REQUEST, f"unknown isolation level {req.isolation_level}")
    if not could_exist(req.topic):
        raise fail(
            KafkaError.UNKNOWN_TOPIC_OR_PARTITION, f"{req.topic} [{req.partition}] does not exist"
        )
    if req.max_bytes <= 0:
        raise fail(
            KafkaError.INVALID_FETCH_SIZE, f"max_bytes must be positive, got {req.max_bytes}"
        )
    cap = broker.settings.fetch_max_records
    # A fetch of batches is bounded by its bytes (the cut), so its window may be wider.
    limit = min(req.max_records or cap, cap * BATCHES_WINDOW_FACTOR if req.batches else cap)
    read_committed = req.isolation_level == READ_COMMITTED
    params: dict[str, object] = {
        "topic": req.topic,
        "partition": req.partition,
        "from_offset": req.fetch_offset,
        "max_records": limit,
        "read_committed": read_committed,
        "max_bytes": req.max_bytes,
        "min_one_record": req.min_one_record,
        "record_overhead": RECORD_OVERHEAD_BYTES,
    }
    with broker.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        authorize_all(conn, broker, needs.fetch(req.topic))
        look = sql.PARTITION_FOR_BATCHES_FETCH if req.batches else sql.PARTITION_FOR_FETCH
        part = conn.execute(look, params).first()
        if part is None:
            raise fail(
                KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
                f"{req.topic} [{req.partition}] does not exist",
            )
        hw, log_start, lso = part.next_offset, part.log_start_offset, part.last_stable_offset
        if refused := current_epoch_refusal(req.current_leader_epoch, part.leader_epoch):
            raise refused
        if req.fetch_offset < log_start or req.fetch_offset > hw:
            # With the partition's bounds: a reader of a standby tells a position beyond
            # what the standby has replayed from one beyond the log (``broker.follower``).
            return FetchResponse(
                KafkaError.OFFSET_OUT_OF_RANGE, hw, lso, log_start,
                error_message=f"offset {req.fetch_offset} is outside [{log_start}, {hw}] "
                f"of {req.topic} [{req.partition}]",
            )  # fmt: skip
        upper = lso if read_committed else hw
        served = {
            "log_append_time": part.log_append_time, "compression_type": part.compression_type,
            "leader_epoch": part.leader_epoch, "epochs": tuple(part.epochs or ()),
            "epoch_starts": tuple(part.epoch_starts or ()),
        }  # fmt: skip
        if req.fetch_offset >= upper:
            return FetchResponse(
                KafkaError.NO_ERROR, hw, lso, log_start, [], req.fetch_offset, [], **served
            )
        # A window of ``limit`` offsets holds at most ``limit`` records, so the read is
        # bounded by offsets, not by how many records filtering happens to drop.
        window_end = min(upper, req.fetch_offset + limit)
        params["to_offset"] = window_end
        ranges = [
            (pid, first, last)
            for pid, first, last in zip(
                part.producer_ids or (),
                part.first_offsets or (),
                part.last_offsets or (),
                strict=True,
            )
            if first < window_end
        ]
        if req.batches:  # markers and aborted records too: the client filters
            # The window ends where max_bytes cuts it (the cut record is where the next
            # fetch starts), or whole.
            params["to_offset"] = window_end = part.cut if part.cut is not None else window_end
            log_records: list[LogRecord] = read_records(conn, sql.FETCH_LOG, params)
            if not _runs_have_batches(log_records):
                log_records = read_records(conn, sql.FETCH_LOG_EVERY_BATCH, params)
            aborted = [AbortedTransaction(pid, f) for pid, f, _ in ranges if f < window_end]
            return FetchResponse(
                KafkaError.NO_ERROR, hw, lso, log_start, [], window_end, aborted,
                log_records=log_records, **served,
            )  # fmt: skip
        whole = part.window_bytes is None or part.window_bytes <= req.max_bytes
        statement = sql.FETCH_UNCOMMITTED_WHOLE if whole else sql.FETCH_UNCOMMITTED
        if ranges:
            statement = sql.FETCH_COMMITTED_WHOLE if whole else sql.FETCH_COMMITTED
            params["aborted_pids"] = [pid for pid, _, _ in ranges]
            params["aborted_firsts"] = [first for _, first, _ in ranges]
            params["aborted_lasts"] = [last for _, _, last in ranges]
        records: list[RecordOut] = read_records(conn, statement, params)
    # The whole window was examined unless max_bytes cut the read short: then the last row
    # is the first record left out (only its offset), where the next fetch starts.
    next_offset = window_end
    if records and records[-1][RECORD_TIMESTAMP] is None:
        next_offset = records.pop()[RECORD_OFFSET]
    aborted = [AbortedTransaction(pid, first) for pid, first, _ in ranges if first < next_offset]
    return FetchResponse(
        KafkaError.NO_ERROR, hw, lso, log_start, records, next_offset, aborted, **served
    )


def list_offsets(broker: BrokerContext, req: ListOffsetsRequest) -> ListOffsetsResponse:
    """Earliest (-2), latest (-1; the LSO in read_committed), the record with the largest
    timestamp (-3), or the first offset whose timestamp is at or after the given one;
    markers count by their timestamps, and what is found at or past the isolation's
    bound (the LSO in read_committed) is no answer (-1), as in Kafka."""
    try:
        with broker.engine.connect() as conn:
            authorize_all(conn, broker, needs.list_offsets(req.topic))
            part = _partition_offsets(conn, req.topic, req.partition)
            if refused := current_epoch_refusal(req.current_leader_epoch, part.leader_epoch):
                raise refused
            upper = (
                part.last_stable_offset
                if req.isolation_level == READ_COMMITTED
                else part.next_offset
            )
            history: list[tuple[int, int]] = []
            if part.leader_epoch > 0:
                history = leader_epoch_history(conn, req.topic, req.partition)

            def epoch_of(offset: int) -> int:
                return epoch_at([e for e, _ in history], [s for _, s in history], offset)

            if req.timestamp == EARLIEST_TIMESTAMP:
                start = part.log_start_offset
                return ListOffsetsResponse(KafkaError.NO_ERROR, start, leader_epoch=epoch_of(start))
            if req.timestamp == LATEST_TIMESTAMP:
                return ListOffsetsResponse(
                    KafkaError.NO_ERROR, upper, leader_epoch=part.leader_epoch
                )
            if req.timestamp == MAX_TIMESTAMP:
                newest = conn.execute(
                    sql.MAX_TIMESTAMP_RECORD,
                    {"topic": req.topic, "partition": req.partition,
                     "log_start": part.log_start_offset},
                ).first()  # fmt: skip
                if newest is None or newest.offset >= upper:
                    return ListOffsetsResponse(KafkaError.NO_ERROR, -1, -1)
                return ListOffsetsResponse(
                    KafkaError.NO_ERROR, newest.offset, newest.timestamp,
                    leader_epoch=epoch_of(newest.offset),
                )  # fmt: skip
            if req.timestamp < 0:
                raise fail(KafkaError.INVALID_REQUEST, f"invalid timestamp {req.timestamp}")
            row = conn.execute(
                sql.OFFSET_FOR_TIMESTAMP,
                {
                    "topic": req.topic,
                    "partition": req.partition,
                    "timestamp": req.timestamp,
                    "log_start": part.log_start_offset,
                    "upper": upper,
                },
            ).first()
            if row is None:
                return ListOffsetsResponse(KafkaError.NO_ERROR, -1, -1)
            return ListOffsetsResponse(
                KafkaError.NO_ERROR, row.offset, row.timestamp, leader_epoch=epoch_of(row.offset)
            )
    except KafkaException as exc:
        return ListOffsetsResponse(exc.error.code(), error_message=exc.error.str())
