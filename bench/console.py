"""The web console (``kip98 console``): its overview and a 1,000-record page of its record
browser over a large topic with aborted transactions, against the SQL they run.

Each figure is the page's time (the console's reads, ACL filtering with authorization on
for a super user, and the template's rendering; no HTTP) over the time of its statements
run bare through psycopg: what the console adds to the database's own work.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import replace

import psycopg

from app.console import charts, data, series
from app.console import sql as console_sql
from app.console.templates import environment
from app.groups import sql as groups_sql
from app.log import sql as log_sql
from app.storage.context import BrokerContext
from app.storage.driver import libpq_conninfo
from bench.consume import build_log_with_aborts
from bench.database import fresh_database, settle
from bench.section import Line, Measured, Run, Section, console
from bench.timing import best_of

PAGE = 1_000


def _timed(fn: Callable[[], None]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _bare(url: str, statements: list[tuple[str, dict[str, object]]]) -> float:
    """The statements' time through psycopg, their rows fetched into tuples, on a
    connection that has run them once (as the console's pooled one has: a new backend's
    first statements also load its catalog caches, which the page does not pay)."""
    with psycopg.connect(libpq_conninfo(url)) as conn:
        for statement, params in statements:
            conn.execute(statement, params).fetchall()
        start = time.perf_counter()
        for statement, params in statements:
            conn.execute(statement, params).fetchall()
        return time.perf_counter() - start


def _compiled(statement: object) -> str:
    """A SQLAlchemy text() statement in psycopg's placeholders."""
    return re.sub(r"(?<!:):(\w+)", r"%(\1)s", str(statement))


def pages(run: Run) -> Measured:
    n = run.settings.records
    with fresh_database(run.server) as url:
        console.print(f"  console: a topic of {n:,} records, 1 in 10 transactions aborted")
        build_log_with_aborts(url, n, 0.1)
        settle(url)
        base = BrokerContext.connect(url)
        broker = replace(
            base, settings=replace(base.settings, authorization=1), principal="User:admin"
        )
        templates = environment()
        offset = n // 2

        def overview() -> None:
            d = data.overview(broker)
            templates.get_template("overview.html").render(
                d=d, **charts.overview_page(d), user="admin"
            )

        def records() -> None:
            d = data.topic(broker, "ab", 0, offset, PAGE, "read_uncommitted")
            assert len(d["records"]) == PAGE
            templates.get_template("topic.html").render(d=d, user="admin")

        topics = ["ab"]
        since = int(time.time() * 1000) - series.WINDOW_MS
        overview_sql: list[tuple[str, dict[str, object]]] = [
            (_compiled(console_sql.TOPICS), {}),
            (_compiled(console_sql.PARTITION_STATUS), {"topics": topics}),
            (_compiled(groups_sql.GROUP_IDS), {}),
            (_compiled(console_sql.OPEN_TRANSACTIONS), {}),
            (_compiled(console_sql.CLUSTER_NODES), {}),
            (_compiled(console_sql.COORDINATOR_LEASES), {}),
            (_compiled(console_sql.IN_RECOVERY), {}),
            (_compiled(console_sql.STANDBYS), {}),
            (_compiled(console_sql.OFFSET_PROBES), {"since": since}),
            (_compiled(console_sql.RECENT_COMMITS), {"limit": series.EVENTS, "since": since}),
            (_compiled(console_sql.OLDEST_OPEN_AT),
             {"limit": series.EVENTS, "topics": topics, "partitions": [0], "closed_ms": [None],
              "ends": series.bucket_ends(since + series.WINDOW_MS)}),
        ]  # fmt: skip
        records_sql: list[tuple[str, dict[str, object]]] = [
            (_compiled(log_sql.TOPIC_EXISTS), {"topic": "ab"}),
            (_compiled(console_sql.TOPIC_CONFIG), {"topic": "ab"}),
            (_compiled(console_sql.LOG_SIZE), {}),
            (_compiled(console_sql.PARTITION_STATUS), {"topics": topics}),
            (_compiled(log_sql.PARTITION_FOR_FETCH),
             {"topic": "ab", "partition": 0, "read_committed": True, "from_offset": offset,
              "max_records": PAGE, "record_overhead": 0}),
            (log_sql.FETCH_LOG_EVERY_BATCH,
             {"topic": "ab", "partition": 0, "from_offset": offset, "to_offset": offset + PAGE}),
        ]  # fmt: skip
        repeats = max(run.settings.repeats, 5)
        overview()
        records()
        measured = {
            "overview_s": best_of(repeats, lambda: _timed(overview)),
            "overview_sql_s": best_of(repeats, lambda: _bare(url, overview_sql)),
            "records_s": best_of(repeats, lambda: _timed(records)),
            "records_sql_s": best_of(repeats, lambda: _bare(url, records_sql)),
            "records": n,
        }
        base.engine.dispose()
    run.results["console"] = measured
    return measured


LINES = (
    Line(
        "console_overview",
        "console overview over {records:,} records vs its SQL (time ratio)",
        "console",
        lambda m: m["overview_s"] / m["overview_sql_s"],
    ),
    Line(
        "console_records",
        "console record browser, 1,000 records of {records:,} vs its SQL (time ratio)",
        "console",
        lambda m: m["records_s"] / m["records_sql_s"],
    ),
)

SECTION = Section(
    "console",
    {"console": pages},
    LINES,
    reading=(
        "The console's figures (`--only console`) are times over the bare SQL's: lower is\n"
        "better, 1.0 would be the statements alone. The page is the console's reads (a\n"
        "connection from the pool, the ACL queries with authorization on, for a super user), the\n"
        "rows' decoding and the template's rendering, no HTTP; its SQL is the same statements run\n"
        "through psycopg on a connection that has run them once (as the pool's have), their rows\n"
        "fetched into tuples. The record page is 1,000 records from the middle of one partition\n"
        "of the topic, 1 in 10 transactions aborted, under read_uncommitted.",
    ),
    core=False,
    default=False,
)
