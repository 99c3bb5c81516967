"""``kip98 metrics``: the metrics snapshot for people (tables) or for Prometheus.

``--format prometheus`` prints the text exposition format, so a node-exporter textfile
collector or a cron job can publish it without a long-running exporter.
"""

from __future__ import annotations

import sys

import click
from rich.table import Table

from app.broker import Broker
from app.cli.output import stdout_console
from app.metrics import Snapshot, gather, prometheus_text


def _summary(snap: Snapshot) -> Table:
    table = Table(title="kip98", box=None, header_style="bold", pad_edge=False)
    table.add_column("METRIC")
    table.add_column("VALUE", justify="right")
    table.add_row("producer ids live", str(snap.producer_ids_live))
    for state, count in snap.transactional_ids.items():
        table.add_row(f"transactional ids {state}", str(count))
    for outcome, count in snap.transactions.items():
        table.add_row(f"transactions {outcome.replace('_', ' ')}", str(count))
    table.add_row("partitions with late transactions", str(snap.partitions_with_late_transactions))
    return table


def _partitions(snap: Snapshot) -> Table:
    table = Table(title="partitions", box=None, header_style="bold", pad_edge=False)
    names = (
        "TOPIC",
        "PARTITION",
        "LOG-START-OFFSET",
        "HIGH-WATERMARK",
        "LSO",
        "LSO-LAG",
        "OPEN-TXNS",
        "CLEANER-LAG",
        "REMOVED",
    )
    for name in names:
        table.add_column(name, justify="left" if name == "TOPIC" else "right")
    for p in snap.partitions:
        table.add_row(
            p.topic,
            str(p.partition),
            str(p.log_start_offset),
            str(p.high_watermark),
            str(p.last_stable_offset),
            str(p.lso_lag),
            str(p.open_transactions),
            str(p.cleaner_lag),
            str(p.records_removed),
        )
    return table


@click.command()
@click.option(
    "--format",
    "-f",
    "fmt",
    type=click.Choice(["text", "prometheus"]),
    default="text",
    show_default=True,
)
def metrics(fmt: str) -> None:
    """Producer ids, LSO lag, transactions by state and outcome, late transactions,
    what the log cleaner removed and has yet to reach."""
    snap = gather(Broker.connect().engine)
    if fmt == "prometheus":
        sys.stdout.write(prometheus_text(snap).decode("utf-8"))
        return
    console = stdout_console()
    console.print(_summary(snap))
    console.print()
    console.print(_partitions(snap))
