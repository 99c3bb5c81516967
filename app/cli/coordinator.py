"""``kip98 coordinator run``: a dedicated process doing the coordinator's scheduled work.

Every ``kip98 serve`` node runs the same loop itself; this is for deployments with no
server, only native clients. Client processes run the loop in a thread too; a dedicated
one keeps timeouts, roll-forwards and the log cleaner going when no client is alive (and,
logged in as an admin, cleans where clients with the ``kip98_client`` role may not) (set
``KIP98_CLIENT_COORDINATOR_LOOP=0`` on the clients then). It stops cleanly on SIGINT or SIGTERM and releases its leases, so a
successor takes over at once instead of waiting for them to lapse.
"""

from __future__ import annotations

import datetime as dt
import signal
import threading
from types import FrameType
from typing import Any

import click

from app.broker import Broker
from app.broker.loop import CoordinatorLoop, PassStats
from app.cli.errors import one_line
from app.cli.output import emit, output_option

WORK = (
    "timed_out",
    "rolled_forward",
    "expired_ids",
    "expired_producers",
    "cleaned_records",
    "fenced",
)
LABELS = {
    "timed_out": "timed out",
    "rolled_forward": "rolled forward",
    "expired_ids": "expired transactional ids",
    "expired_producers": "expired producer states",
    "cleaned_records": "records cleaned",
    "fenced": "leases lost",
}


def stats_record(stats: PassStats) -> dict[str, Any]:
    return {"leases": len(stats.leases), **{name: getattr(stats, name) for name in WORK}}


def describe_work(stats: PassStats) -> str:
    return ", ".join(f"{LABELS[name]} {getattr(stats, name)}" for name in WORK)


def _stamp() -> str:
    return dt.datetime.now().astimezone().isoformat(timespec="seconds")


@click.group("coordinator")
def coordinator_group() -> None:
    """The transaction coordinator's background work."""


@coordinator_group.command()
@click.option("--once", is_flag=True, help="Run one pass, print what it did, and exit.")
@click.option(
    "--interval-ms",
    type=click.IntRange(min=1),
    default=None,
    help="Pause between passes (default: KIP98_COORDINATOR_INTERVAL_MS, 1000).",
)
@output_option
def run(once: bool, interval_ms: int | None, output: str) -> None:
    """Time out stalled transactions, roll forward prepared ones, expire idle ids."""
    broker = Broker.connect()
    loop = CoordinatorLoop(broker)
    if once:
        try:
            stats = loop.run_once()
        finally:
            loop.stop()
        emit(stats_record(stats), output)
        return

    stop = threading.Event()

    def request_stop(signum: int, _frame: FrameType | None) -> None:
        stop.set()

    for signum in (signal.SIGINT, signal.SIGTERM):
        signal.signal(signum, request_stop)
    interval = (interval_ms or broker.settings.coordinator_interval_ms) / 1000.0
    click.echo(
        f"coordinator {loop.owner} running every {interval:g}s (SIGINT/SIGTERM stops)", err=True
    )
    passes = failures = 0
    leases = -1
    try:
        while not stop.is_set():
            passes += 1
            try:
                stats = loop.run_once()
            except Exception as exc:  # an outage: say so, keep going, as the client loop does
                failures += 1
                click.echo(f"{_stamp()} pass failed: {one_line(exc)}", err=True)
            else:
                if len(stats.leases) != leases:
                    leases = len(stats.leases)
                    total = broker.settings.transaction_log_partitions
                    click.echo(f"{_stamp()} holding {leases} of {total} transaction-log partitions")
                if any(getattr(stats, name) for name in WORK):
                    click.echo(f"{_stamp()} {describe_work(stats)}")
            stop.wait(interval)
    finally:
        loop.stop()
    click.echo(
        f"coordinator stopped after {passes} pass(es), {failures} failed: "
        f"{describe_work(loop.totals)}; leases released"
    )
