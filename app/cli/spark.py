"""``kip98 spark``: Spark jobs over kip98's PostgreSQL.

Progress goes to stderr, one line per stage as it completes, so stdout carries only the
result table (or JSON) and stays pipeable.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import click
from rich.console import Console

from app.cli.errors import CliError
from app.cli.output import emit, output_option, stderr_console
from app.storage.embedded import kip98_home
from app.storage.engine import resolve_url


def stages(console: Console) -> Callable[[str, str], None]:
    """A job's progress: a line per stage as it completes, with the seconds since now."""
    started = time.monotonic()

    def progress(stage: str, message: str) -> None:
        elapsed = time.monotonic() - started
        console.print(f"[bold cyan]{stage:>7}[/] {message} [dim]{elapsed:.1f}s[/]", soft_wrap=True)

    return progress


@contextlib.contextmanager
def jvm_output_to(path: Path) -> Iterator[None]:
    """Point this process's stderr at ``path`` while the JVM starts: the JVM inherits it and
    keeps its start-up banner and log4j lines there, while failures still reach the user
    as Python exceptions."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(path, "ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


@click.group("spark")
def spark_group() -> None:
    """Spark jobs: materialise read_committed views over JDBC, and compact them."""


@spark_group.command()
@click.option(
    "--topic",
    "-t",
    "topics",
    multiple=True,
    metavar="TOPIC",
    help="Materialise only this topic (repeatable); all topics by default.",
)
@click.option(
    "--replica-url",
    default=None,
    metavar="URL",
    help="A standby of the database: LSOs and records are read there, the results "
    "written on the primary.",
)
@output_option
def materialize(topics: tuple[str, ...], replica_url: str | None, output: str) -> None:
    """Bring read_committed_records up to every partition's current LSO.

    Adds exactly the records read_committed consumers would return since the last run;
    safe to re-run and to interrupt.
    """
    from app.spark.materialize import run_materialization
    from app.spark.session import build_spark_session

    console = stderr_console()
    url = resolve_url()
    log_path = kip98_home() / "logs" / "spark.log"
    with console.status("starting Spark"), jvm_output_to(log_path):
        # Spark warns when the host name resolves to loopback unless told which address to use.
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
        spark = build_spark_session(app_name="kip98-materialize")
        spark.sparkContext.setLogLevel("ERROR")
    console.print(f"Spark {spark.version} ready (JVM log: {log_path})", soft_wrap=True)
    results = run_materialization(
        spark, url, list(topics) or None, progress=stages(console), replica_url=replica_url
    )
    unknown = sorted(set(topics) - {r.topic for r in results})
    if unknown:
        raise CliError(f"unknown topic(s): {', '.join(unknown)}")
    rows = [
        {
            "topic": r.topic,
            "partition": r.partition,
            "from_offset": r.from_offset,
            "up_to_offset": r.up_to_offset,
            "new_rows": r.rows,
        }
        for r in results
    ]
    emit(rows, output, columns=["topic", "partition", "from_offset", "up_to_offset", "new_rows"])


@spark_group.command()
@click.option(
    "--small-rows",
    type=click.IntRange(min=1),
    default=None,
    help="Partitions with fewer rows are merged, until a merged one has this many "
    "(default 1,000,000).",
)
@output_option
def compact(small_rows: int | None, output: str) -> None:
    """Merge the small partitions of read_committed_records that many runs leave.

    Readers see the old partitions or the merged one, never both nor neither; safe to
    interrupt (the next run or compaction drops what an interrupted one wrote).
    """
    from app.spark.compact import SMALL_ROWS
    from app.spark.compact import compact as run_compaction

    merges = run_compaction(
        resolve_url(), small_rows or SMALL_ROWS, progress=stages(stderr_console())
    )
    rows = [
        {
            "topic": m.topic,
            "partition": m.partition,
            "from_offset": m.from_offset,
            "to_offset": m.to_offset,
            "merged_partitions": len(m.parts),
        }
        for m in merges
    ]
    emit(
        rows,
        output,
        columns=["topic", "partition", "from_offset", "to_offset", "merged_partitions"],
    )
