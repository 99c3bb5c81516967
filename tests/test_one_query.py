"""Statements and COPYs sent as one query string (``app.storage.one_query``,
docs/design.md §3.9 and §3.10): committed together outside a transaction, or all inside an
open one; all or nothing is written, a refused or failed one leaves the connection usable,
and the Produce handler's lone batch on a remembered row goes this way and falls back when
it must."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import Connection, text

from app.broker import Broker
from app.broker.produce import produce
from app.client import Producer
from app.log import sql
from app.log.topics import create_topic
from app.protocol import ProduceRequest, RecordIn
from app.storage.driver import driver_connection, in_transaction
from app.storage.one_query import (
    QueryCopies,
    as_prepared,
    call,
    prepare_once,
    prepared_call,
    unprepared,
)
from tests.helpers.identities import hand_out

PID = 11
ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def conn(broker: Broker) -> Iterator[Connection]:
    """A connection of the test's broker, with the scratch tables the query strings write."""
    with broker.engine.begin() as c:
        c.exec_driver_sql("CREATE TABLE scratch_rows (n int PRIMARY KEY)")
        c.exec_driver_sql("CREATE TABLE scratch_copied (line text)")
    with broker.engine.connect() as c:
        yield c


def written(broker: Broker) -> tuple[list[int], list[str]]:
    with broker.engine.connect() as c:
        rows = [r[0] for r in c.execute(text("SELECT n FROM scratch_rows ORDER BY n"))]
        copied = [r[0] for r in c.execute(text("SELECT line FROM scratch_copied ORDER BY 1"))]
    return rows, copied


INSERT = b"INSERT INTO scratch_rows VALUES (1), (2) RETURNING n"
COPY = "COPY scratch_copied (line) FROM STDIN"


def committed(conn: Connection, copy: str = COPY, copies: int = 1) -> QueryCopies:
    return QueryCopies(conn, copy, copies, committed=True, statements=[INSERT])


def test_placeholders_become_numbered_parameters() -> None:
    statement = "SELECT %(b)s, %(a)s, %(b)s"
    assert as_prepared(statement, ("a", "b")) == "SELECT $2, $1, $2"


def test_values_are_literals_quoted_by_libpq(conn: Connection) -> None:
    statement = call(conn, "p", [None, 7, -3, "it's"])
    assert statement == b"EXECUTE p(NULL, 7, -3, 'it''s')"


def test_the_statement_and_the_copy_commit_together(broker: Broker, conn: Connection) -> None:
    with committed(conn) as copy:
        [result] = copy.results
        assert result.ntuples == 2
        copy.write([b"x\ny\n"])
    assert not in_transaction(conn)
    assert written(broker) == ([1, 2], ["x", "y"])


def test_a_refused_copy_takes_the_statement_back(broker: Broker, conn: Connection) -> None:
    with committed(conn) as copy:
        copy.refuse("changed my mind")
    assert written(broker) == ([], [])
    assert conn.exec_driver_sql("SELECT 1").scalar() == 1  # usable again


def test_an_error_in_the_writer_writes_nothing(broker: Broker, conn: Connection) -> None:
    with pytest.raises(ZeroDivisionError), committed(conn) as copy:
        copy.write([b"x\n"])
        raise ZeroDivisionError
    assert written(broker) == ([], [])
    assert not in_transaction(conn)


def test_an_error_before_any_data_writes_nothing(broker: Broker, conn: Connection) -> None:
    """Raised once the COPY started, nothing written to it: the statement is taken back."""
    with pytest.raises(ZeroDivisionError), committed(conn):
        raise ZeroDivisionError
    assert written(broker) == ([], [])
    assert not in_transaction(conn)
    assert conn.exec_driver_sql("SELECT 1").scalar() == 1


def test_several_statements_answer_in_order_and_commit_with_the_copy(
    broker: Broker, conn: Connection
) -> None:
    statements = [INSERT, b"INSERT INTO scratch_rows VALUES (3) RETURNING n"]
    with QueryCopies(conn, COPY, 1, committed=True, statements=statements) as copy:
        assert [r.ntuples for r in copy.results] == [2, 1]
        copy.write([b"x\n"])
    assert written(broker) == ([1, 2, 3], ["x"])


@pytest.mark.parametrize(
    "statements",
    [
        [b"INSERT INTO scratch_rows VALUES (1), (1)"],
        [INSERT, b"INSERT INTO scratch_rows VALUES (2)"],  # the first ran: taken back
    ],
    ids=["alone", "after-another"],
)
def test_a_failing_statement_raises_and_runs_no_copy(
    broker: Broker, conn: Connection, statements: list[bytes]
) -> None:
    with (
        pytest.raises(psycopg.errors.UniqueViolation),
        QueryCopies(conn, COPY, 1, committed=True, statements=statements),
    ):
        raise AssertionError("the COPY never starts")
    assert written(broker) == ([], [])
    assert not in_transaction(conn)


def test_a_failing_copy_raises_and_writes_nothing(broker: Broker, conn: Connection) -> None:
    with (
        pytest.raises(psycopg.errors.InvalidTextRepresentation),
        committed(conn, "COPY scratch_rows (n) FROM STDIN") as copy,
    ):
        copy.write([b"3\nnot a number\n"])
    assert written(broker) == ([], [])
    assert not in_transaction(conn)


def test_committed_only_outside_a_transaction(conn: Connection) -> None:
    conn.exec_driver_sql("SELECT 1")
    with pytest.raises(RuntimeError, match="outside any transaction"):
        committed(conn)


def test_uncommitted_only_inside_a_transaction(conn: Connection) -> None:
    with pytest.raises(RuntimeError, match="open transaction"):
        QueryCopies(conn, COPY, 1, committed=False)


def test_several_copies_commit_with_the_statement(broker: Broker, conn: Connection) -> None:
    with committed(conn, copies=3) as copy:
        copy.write([b"a\n", b"b\nc\n", b"d\n"])
    assert not in_transaction(conn)
    assert written(broker) == ([1, 2], ["a", "b", "c", "d"])


def test_a_later_copy_failing_takes_back_the_earlier_ones(broker: Broker, conn: Connection) -> None:
    """The second COPY's error is raised as its data is ended; the first COPY's rows and
    the statement's, in the same implicit transaction, are not kept."""
    with (
        pytest.raises(psycopg.errors.UniqueViolation),
        committed(conn, "COPY scratch_rows (n) FROM STDIN", copies=3) as copy,
    ):
        copy.write([b"3\n", b"4\n4\n", b"5\n"])
    assert written(broker) == ([], [])
    assert not in_transaction(conn)
    assert conn.exec_driver_sql("SELECT 1").scalar() == 1


def test_an_error_in_a_later_copy_writes_nothing(broker: Broker, conn: Connection) -> None:
    """The first COPY ended and the second started when its data cannot be sent."""
    with pytest.raises(TypeError), committed(conn, copies=2) as copy:
        copy.write([b"x\n", None])  # type: ignore[list-item]
    assert written(broker) == ([], [])
    assert not in_transaction(conn)
    assert conn.exec_driver_sql("SELECT 1").scalar() == 1


def test_copies_inside_a_transaction_are_the_transaction_s(
    broker: Broker, conn: Connection
) -> None:
    """Inside an open transaction the COPYs commit or roll back with it, not on their own."""
    conn.exec_driver_sql("INSERT INTO scratch_rows VALUES (9)")
    with QueryCopies(conn, COPY, 2, committed=False) as copy:
        copy.write([b"p\n", b"q\n"])
    assert in_transaction(conn)
    assert written(broker) == ([], [])  # not committed yet
    conn.rollback()
    assert written(broker) == ([], [])
    conn.exec_driver_sql("INSERT INTO scratch_rows VALUES (9)")
    with QueryCopies(conn, COPY, 2, committed=False) as copy:
        copy.write([b"p\n", b"q\n"])
    conn.commit()
    assert written(broker) == ([9], ["p", "q"])


def test_a_failing_copy_inside_a_transaction_aborts_it(broker: Broker, conn: Connection) -> None:
    conn.exec_driver_sql("INSERT INTO scratch_copied VALUES ('before')")
    with (
        pytest.raises(psycopg.errors.InvalidTextRepresentation),
        QueryCopies(conn, "COPY scratch_rows (n) FROM STDIN", 2, committed=False) as copy,
    ):
        copy.write([b"1\n", b"oops\n"])
    with pytest.raises(Exception, match="aborted"):
        conn.exec_driver_sql("SELECT 1")
    conn.rollback()
    assert written(broker) == ([], [])


def test_a_statement_is_prepared_once_per_connection(conn: Connection) -> None:
    prepare_once(conn, "scratch_twice", "SELECT $1::int * 2")
    prepare_once(conn, "scratch_twice", "SELECT $1::int * 2")  # a second PREPARE would fail
    raw = driver_connection(conn)
    assert raw.execute("EXECUTE scratch_twice(21)").fetchone() == (42,)


def test_a_statement_still_there_after_its_name_was_forgotten_counts_as_prepared(
    conn: Connection,
) -> None:
    """``unprepared`` forgets every name when one is found gone, though others may still
    be on the session: preparing one of those again is taken as done, not an error."""
    prepare_once(conn, "scratch_kept", "SELECT $1::int * 3")
    unprepared(conn)
    prepare_once(conn, "scratch_kept", "SELECT $1::int * 3")
    assert conn.connection.info[("kip98_prepared", "scratch_kept")]
    raw = driver_connection(conn)
    assert raw.execute("EXECUTE scratch_kept(14)").fetchone() == (42,)


# ------------------------------------------------------------------- the Produce handler


def batch(seq: int, *values: str) -> ProduceRequest:
    return ProduceRequest("t", 0, [RecordIn(None, v.encode(), 0) for v in values], PID, 0, seq)


@pytest.fixture
def producing(broker: Broker) -> Broker:
    create_topic(broker, "t", 1)
    hand_out(broker, PID)
    return broker


def values(broker: Broker) -> list[tuple[int, bytes]]:
    with broker.engine.connect() as c:
        return [
            (r[0], r[1])
            for r in c.execute(
                text("SELECT \"offset\", value FROM records WHERE topic = 't' ORDER BY 1")
            )
        ]


def prepared_on(broker: Broker) -> bool:
    """Whether the pooled connection has the advance prepared (the one-query write ran)."""
    with broker.engine.connect() as c:
        return bool(c.connection.info.get(("kip98_prepared", sql.ADVANCE_REMEMBERED_NAME)))


def test_a_lone_batch_on_a_remembered_row_goes_in_one_query(producing: Broker) -> None:
    assert produce(producing, batch(0, "a")).base_offset == 0  # the lock's way: no memory
    assert not prepared_on(producing)
    assert produce(producing, batch(1, "b", "c")).base_offset == 1
    assert prepared_on(producing)
    assert values(producing) == [(0, b"a"), (1, b"b"), (2, b"c")]


def test_a_deallocated_statement_falls_back_then_is_prepared_again(producing: Broker) -> None:
    produce(producing, batch(0, "a"))
    produce(producing, batch(1, "b"))
    with producing.engine.connect() as c:
        c.exec_driver_sql("DEALLOCATE ALL")
        c.commit()
    assert produce(producing, batch(2, "c")).base_offset == 2  # decided under the lock
    assert not prepared_on(producing)
    assert produce(producing, batch(3, "d")).base_offset == 3
    assert prepared_on(producing)
    assert values(producing) == [(0, b"a"), (1, b"b"), (2, b"c"), (3, b"d")]


def run_child(db_url: str, mode: str, crash_at: str | None = None) -> int:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    env.pop("KIP98_CRASH_AT", None)
    if crash_at is not None:
        env["KIP98_CRASH_AT"] = crash_at
    child = subprocess.run(
        [sys.executable, "-m", "tests.children.one_query_child", db_url, mode],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    return child.returncode


def test_a_process_killed_inside_its_one_query_write_leaves_nothing(
    db_url: str, producing: Broker
) -> None:
    """Killed with the COPY's data handed over and its end not sent: the server rolls the
    implicit transaction back, the advance with it; the next producer appends where the
    first batch left the partition."""
    assert run_child(db_url, "producer", "append.in_one_query") == -signal.SIGKILL
    assert values(producing) == [(0, b"a")]
    offsets: list[int] = []
    with Producer({"database.url": db_url, "linger.ms": 0}) as producer:
        producer.produce(
            "t", value=b"c", partition=0, on_delivery=lambda _e, m: offsets.append(m.offset())
        )
        assert producer.flush(30) == 0
    assert offsets == [1]
    assert values(producing) == [(0, b"a"), (1, b"c")]


def test_a_process_killed_inside_a_write_over_several_rows_leaves_nothing(
    db_url: str, producing: Broker
) -> None:
    """Killed inside the one query string that advances two remembered rows and COPYs a
    batch to each: neither partition keeps its advance or its record, and the next
    producer appends on both where the first request left them."""
    create_topic(producing, "two", 2)
    assert run_child(db_url, "partitions") == -signal.SIGKILL
    for partition in (0, 1):
        with producing.engine.connect() as c:
            rows = c.execute(
                text(
                    "SELECT \"offset\", value FROM records WHERE topic = 'two' "
                    "AND partition = :p ORDER BY 1"
                ),
                {"p": partition},
            ).all()
        assert [(r[0], r[1]) for r in rows] == [(0, f"a{partition}".encode())]
    offsets: list[tuple[int | None, int | None]] = []
    with Producer({"database.url": db_url, "linger.ms": 0}) as producer:
        for partition in (0, 1):
            producer.produce(
                "two", value=b"c", partition=partition,
                on_delivery=lambda _e, m: offsets.append((m.partition(), m.offset())),
            )  # fmt: skip
        assert producer.flush(30) == 0
    assert sorted(offsets) == [(0, 1), (1, 1)]


def test_two_batches_for_one_partition_commit_together_or_not_at_all(
    db_url: str, producing: Broker
) -> None:
    """Two batches for one partition in one request are decided one after the other and
    written in one COPY and one advance; only the request's end commits (docs/design.md
    §3.2): killed after the COPY, the request left nothing."""
    assert run_child(db_url, "twice") == -signal.SIGKILL
    assert values(producing) == [(0, b"a")]


_ELEMENTS = st.one_of(
    st.none(),
    st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00")),
    st.sampled_from(['"', "\\", "{", "}", ",", " ", "NULL", "", "a b", '\\"', "'"]),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    texts=st.lists(_ELEMENTS, max_size=6),
    ints=st.lists(st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)), max_size=6),
    flag=st.booleans(),
    one=st.one_of(st.none(), st.integers(-(2**63), 2**63 - 1)),
    word=st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00")),
)
def test_prepared_calls_carry_their_values_exactly(
    conn: Connection,
    texts: list[str | None],
    ints: list[int | None],
    flag: bool,
    one: int | None,
    word: str,
) -> None:
    """A statement sent as an ``EXECUTE`` of it prepared (``prepared_call``) gets its
    values as psycopg would bind them: text arrays with quotes, backslashes, braces,
    commas, blanks, the word NULL and empty strings; bigint arrays with NULLs; booleans,
    NULL and text scalars."""
    statement = (
        "SELECT CAST(%(texts)s AS text[]), CAST(%(ints)s AS bigint[]), %(flag)s, "
        "CAST(%(one)s AS bigint), CAST(%(word)s AS text), '100%%'"
    )
    params = {"texts": texts, "ints": ints, "flag": flag, "one": one, "word": word}
    executed = prepared_call(conn, statement, params)
    row = driver_connection(conn).execute(executed).fetchone()
    driver_connection(conn).rollback()
    assert row == (texts, ints, flag, one, word, "100%")
