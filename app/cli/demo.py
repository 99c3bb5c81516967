"""``kip98 demo``: the exactly-once pipeline end to end, then Spark over its output.

1. Create ``demo-input`` and ``demo-output`` (4 partitions each; recreated on every run).
2. Write input records with an idempotent producer, and one aborted transaction whose
   records must never show up anywhere.
3. Copy input to output, upper-cased, with the consume-transform-produce loop
   (``app.pipeline``), input offsets committed inside each transaction.
4. Check: the output holds every input record exactly once, per partition in order; the
   group's committed offsets equal the input's end; the aborted records are nowhere.
5. Materialise ``demo-output`` with Spark and compare with the ``committed_records`` view.
6. In the same Spark session, a streaming query from ``demo-orders`` to
   ``demo-orders-enriched`` through the ``kip98`` source and sink (``demo_streaming``).
"""

from __future__ import annotations

import os
import threading
import time

import click
from rich.console import Console
from rich.table import Table
from sqlalchemy import text

from app.admin import AdminClient, NewTopic
from app.cli.db import safe_url
from app.cli.output import stderr_console
from app.client import Consumer, Producer, TopicPartition
from app.errors import KafkaException
from app.pipeline import Copier
from app.storage.embedded import kip98_home
from app.storage.engine import get_engine, resolve_url

INPUT, OUTPUT, GROUP = "demo-input", "demo-output", "demo-copier"
PARTITIONS = 4


def _recreate_topics(admin: AdminClient) -> None:
    existing = admin.list_topics().topics
    for name in (INPUT, OUTPUT):
        if name in existing:
            admin.delete_topics([name])[name].result()
        admin.create_topics([NewTopic(name, PARTITIONS)])[name].result()


def _write_input(url: str, records: int) -> float:
    started = time.monotonic()
    with Producer({"database.url": url, "linger.ms": 20, "client.id": "demo-writer"}) as producer:
        for i in range(records):
            producer.produce(INPUT, f"record {i}".encode(), f"key-{i}".encode())
            if i % 10_000 == 0:
                producer.poll(0)
        if producer.flush(120):
            raise click.ClickException("the input was not fully written")
    with Producer({"database.url": url, "transactional.id": "demo-aborted"}) as producer:
        producer.init_transactions()
        producer.begin_transaction()
        for p in range(PARTITIONS):
            producer.produce(INPUT, b"ABORTED", partition=p)
        producer.abort_transaction()
    return time.monotonic() - started


def _verify(url: str, records: int) -> dict[str, object]:
    engine = get_engine(url)
    with engine.connect() as conn:
        output = conn.execute(
            text("SELECT count(*), count(DISTINCT value) FROM committed_records WHERE topic = :t"),
            {"t": OUTPUT},
        ).one()
        aborted_visible = conn.execute(
            text("SELECT count(*) FROM committed_records WHERE value = 'ABORTED'::bytea")
        ).scalar_one()
        # Each partition's values in offset order, compared here: a join of the two sides
        # by row number leaves PostgreSQL to guess their sizes before autovacuum has
        # analysed the fresh rows, and a guess of one row made it a nested loop of minutes.
        in_order = text(
            "SELECT partition, array_agg(convert_from(value, 'UTF8') ORDER BY \"offset\") "
            "FROM committed_records WHERE topic = :t GROUP BY partition"
        )
        inputs: dict[int, list[str]] = dict(conn.execute(in_order, {"t": INPUT}).tuples().all())
        outputs: dict[int, list[str]] = dict(conn.execute(in_order, {"t": OUTPUT}).tuples().all())
    with Consumer({"database.url": url, "group.id": GROUP}) as consumer:
        committed = consumer.committed(
            [TopicPartition(INPUT, p) for p in range(PARTITIONS)], timeout=30
        )
        ends = [
            consumer.get_watermark_offsets(TopicPartition(INPUT, p))[1] for p in range(PARTITIONS)
        ]
    exactly_once = output[0] == records == output[1] and outputs == {
        partition: [value.upper() for value in values] for partition, values in inputs.items()
    }
    return {
        "output records": output[0],
        "exactly once, in order": exactly_once,
        "aborted records visible": aborted_visible,
        "committed offsets = input end": [tp.offset for tp in committed] == ends,
    }


def _spark_steps(url: str, streaming: bool) -> tuple[int, float, bool, dict[str, object]]:
    from app.cli.demo_streaming import streaming_step
    from app.cli.spark import jvm_output_to
    from app.spark.materialize import materialize
    from app.spark.session import build_spark_session

    os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    with jvm_output_to(kip98_home() / "logs" / "spark.log"):
        spark = build_spark_session(app_name="kip98-demo")
        spark.sparkContext.setLogLevel("ERROR")
    try:
        started = time.monotonic()
        counts = materialize(spark, url, [OUTPUT])
        elapsed = time.monotonic() - started
        streamed = streaming_step(spark, url) if streaming else {}
    finally:
        spark.stop()
    with get_engine(url).connect() as conn:
        differs = conn.execute(
            text(
                'SELECT count(*) FROM ((SELECT partition, "offset", value FROM committed_records WHERE topic = :t '
                'EXCEPT SELECT partition, "offset", value FROM read_committed_records WHERE topic = :t) UNION ALL '
                '(SELECT partition, "offset", value FROM read_committed_records WHERE topic = :t '
                'EXCEPT SELECT partition, "offset", value FROM committed_records WHERE topic = :t)) d'
            ),
            {"t": OUTPUT},
        ).scalar_one()
    return sum(counts.values()), elapsed, differs == 0, streamed


@click.command()
@click.option("--records", default=20_000, show_default=True, help="Input records to copy.")
@click.option(
    "--spark/--no-spark", default=True, show_default=True, help="Materialise the output with Spark."
)
@click.option(
    "--spark-streaming/--no-spark-streaming",
    default=True,
    show_default=True,
    help="Then run a streaming query through the kip98 Spark source and sink.",
)
def demo(records: int, spark: bool, spark_streaming: bool) -> None:
    """Run the exactly-once pipeline demo (and the Spark materialisation) and summarise."""
    console = stderr_console()
    url = resolve_url()
    click.echo(f"database: {safe_url(url)}")
    admin = AdminClient({"database.url": url})
    summary: dict[str, object] = {}
    with console.status("creating topics"):
        _recreate_topics(admin)
    with console.status(f"writing {records:,} input records"):
        write_s = _write_input(url, records)
    summary["input written (records/s)"] = f"{records / write_s:,.0f}"
    copier = Copier(INPUT, OUTPUT, GROUP, "demo-copier-0", database_url=url, batch_size=1000)
    with console.status("copying exactly once (consume → transform → produce + offsets)"):
        started = time.monotonic()
        worker = threading.Thread(target=lambda: copier.run(idle_exit_s=2.0), daemon=True)
        worker.start()
        worker.join()
        # From the group's first assignment (its first rebalance waits
        # group.initial.rebalance.delay.ms) to the last record, the idle wait not counted.
        copy_s = time.monotonic() - (copier.stats.assigned or started) - 2.0
    stats = copier.stats
    summary["transactions committed"] = stats.transactions
    summary["transactions aborted"] = stats.aborted
    summary["copy throughput (records/s)"] = f"{stats.records / max(copy_s, 1e-9):,.0f}"
    with console.status("verifying"):
        summary.update(_verify(url, records))
    if spark:
        with console.status("Spark: materialising read_committed_records, then streaming"):
            try:
                rows, spark_s, same, streamed = _spark_steps(url, spark_streaming)
            except KafkaException as exc:
                raise click.ClickException(f"Spark materialisation failed: {exc}") from exc
        summary["Spark rows materialised"] = rows
        summary["Spark rows/s"] = f"{rows / max(spark_s, 1e-9):,.0f}"
        summary["Spark = committed_records view"] = same
        summary.update(streamed)
    table = Table(title="kip98 demo: exactly-once copy")
    out = Console()
    table.add_column("")
    table.add_column("value", justify="right")
    for key, value in summary.items():
        table.add_row(key, str(value))
    out.print(table)
    ok = (
        summary["exactly once, in order"] is True
        and summary["aborted records visible"] == 0
        and summary["committed offsets = input end"] is True
        and summary.get("Spark = committed_records view", True) is True
        and summary.get("Spark streaming: exactly once (consumer and views)", True) is True
    )
    click.echo(
        f"summary: {'OK' if ok else 'FAILED'} — {records:,} records copied exactly once"
        if ok
        else "summary: FAILED"
    )
    if not ok:
        raise SystemExit(1)
