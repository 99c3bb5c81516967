"""Replication: what acks=all costs with a synchronous standby, how long a failover
takes, and reading from a standby, each on embedded nodes of its own.

Each case starts its own nodes under a temporary ``KIP98_HOME`` (fsync on) rather than
using the run's server: a primary alone, a primary with one synchronous standby, a
primary with two for the failovers. The figures are ratios of the same work with and
without the standby in one run, the commit latencies in milliseconds, and the seconds
from the primary's death (its processes SIGKILLed, its data deleted) to the first
transaction committed on the new primary by a producer that was committing in a loop and
found it by itself (the promotion is ``kip98 db failover``'s code), the median of
``--failovers``.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from app.admin import AdminClient, NewTopic
from app.client import Consumer, KafkaException, Producer, TopicPartition
from app.storage.migrate import upgrade_to_head
from app.storage.replica_set import EmbeddedReplicaSet
from app.torture.failover import kill_node
from bench.section import Line, Measured, Run, Section, console

TOPIC = "bench"
VALUE = b"v" * 100


@dataclass(frozen=True)
class Nodes:
    cluster: EmbeddedReplicaSet
    url: str  # every node, reaching the primary
    standby_url: str | None


@contextlib.contextmanager
def nodes(standbys: int) -> Iterator[Nodes]:
    """A primary and ``standbys`` standbys (one synchronous) under a temporary home, the
    schema migrated and a one-partition topic made; all of it removed after."""
    home = Path(tempfile.mkdtemp(prefix="kip98-bench-", dir="/var/tmp"))
    home.chmod(0o755)
    previous = os.environ.get("KIP98_EMBEDDED_DURABILITY")
    os.environ["KIP98_EMBEDDED_DURABILITY"] = "on"
    cluster = EmbeddedReplicaSet(home)
    try:
        layout = cluster.start(standbys=standbys)
        url = cluster.url(layout)
        upgrade_to_head(url)
        AdminClient({"database.url": url}).create_topics([NewTopic(TOPIC, 1)])[TOPIC].result()
        yield Nodes(cluster, url, cluster.url(layout, standby=True) if standbys else None)
    finally:
        cluster.stop()
        for name in cluster.layout().nodes:
            shutil.rmtree(cluster.node(name).data_dir.resolve().parent, ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)
        if previous is None:
            os.environ.pop("KIP98_EMBEDDED_DURABILITY", None)
        else:
            os.environ["KIP98_EMBEDDED_DURABILITY"] = previous


def producer_throughput(url: str, records: int) -> float:
    """Records a second of the idempotent Producer, acks=all."""
    with Producer({"database.url": url, "linger.ms": 5}) as producer:
        started = time.perf_counter()
        for _ in range(records):
            while True:
                try:
                    producer.produce(TOPIC, VALUE, partition=0)
                    break
                except BufferError:  # the queue is full: wait for deliveries, as users do
                    producer.poll(0.01)
        assert producer.flush(300) == 0
        return records / (time.perf_counter() - started)


def commit_latencies(url: str, transactions: int) -> list[float]:
    """Milliseconds of each ``commit_transaction()`` of 10-record transactions."""
    took = []
    with Producer({"database.url": url, "transactional.id": "bench-commits"}) as producer:
        producer.init_transactions()
        for _ in range(transactions):
            producer.begin_transaction()
            for _ in range(10):
                producer.produce(TOPIC, VALUE, partition=0)
            started = time.perf_counter()
            producer.commit_transaction()
            took.append((time.perf_counter() - started) * 1000)
    return took


def consumer_seconds(url: str, records: int, replica_url: str | None = None) -> float:
    """Seconds for a read_committed Consumer to read the topic's first ``records``."""
    config = {"database.url": url, "isolation.level": "read_committed"}
    if replica_url is not None:
        config["database.replica.url"] = replica_url
    with Consumer(config) as consumer:
        consumer.assign([TopicPartition(TOPIC, 0, 0)])
        started, read = time.perf_counter(), 0
        while read < records:
            read += sum(1 for m in consumer.consume(10_000, 1.0) if m.error() is None)
        return time.perf_counter() - started


def failover_seconds(node_set: Nodes) -> float:
    """Seconds from the primary's death (its processes SIGKILLed) to the end of the first
    transaction begun after it, committed on the new primary by a producer that was
    committing one-record transactions in a loop and found it by itself."""
    died: list[float] = []
    committed: list[float] = []
    stop = threading.Event()

    def commit_in_a_loop() -> None:
        with Producer(
            {"database.url": node_set.url, "transactional.id": f"bench-{time.time_ns()}"}
        ) as producer:
            producer.init_transactions()
            while not stop.is_set():
                began = time.monotonic()
                producer.begin_transaction()
                producer.produce(TOPIC, VALUE, partition=0)
                while True:
                    try:
                        producer.commit_transaction(30)
                        break
                    except KafkaException as exc:
                        if not exc.args[0].retriable():
                            raise
                if died and began > died[0] and not committed:
                    committed.append(time.monotonic())

    writer = threading.Thread(target=commit_in_a_loop, daemon=True)
    writer.start()
    time.sleep(1.0)  # committing steadily before the loss
    primary = node_set.cluster.primary()
    kill_node(primary)
    died.append(time.monotonic())
    shutil.rmtree(primary.data_dir.resolve(), ignore_errors=True)  # the machine is gone
    node_set.cluster.failover()
    deadline = time.monotonic() + 120
    while not committed and time.monotonic() < deadline:
        time.sleep(0.01)
    stop.set()
    writer.join(60)
    node_set.cluster.start()  # the lost node back as a standby, for the next failover
    if not committed:
        raise RuntimeError("nothing committed within 120 s of the failover")
    return committed[0] - died[0]


def percentile(values: list[float], p: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(p / 100 * (len(ordered) - 1)))]


# ---------------------------------------------------------------- the cases


def replicas(run: Run) -> Measured:
    """acks=all with one synchronous standby against none: the idempotent Producer's
    throughput and a transactional commit's latency; then read_committed from the standby
    against from the primary, on the nodes with the standby."""
    records, commits = run.settings.records, run.settings.small_txns
    measured: Measured = {"records": records, "commits": commits}
    for standbys, side in ((0, "alone"), (1, "standby")):
        with console.status(f"replicas: {side}"), nodes(standbys) as node_set:
            measured[f"produce_per_s_{side}"] = producer_throughput(node_set.url, records)
            took = commit_latencies(node_set.url, commits)
            measured[f"commit_p50_ms_{side}"] = percentile(took, 50)
            measured[f"commit_p99_ms_{side}"] = percentile(took, 99)
            if node_set.standby_url is not None:
                measured["read_s_primary"] = consumer_seconds(node_set.url, records)
                measured["read_s_standby"] = consumer_seconds(
                    node_set.url, records, node_set.standby_url
                )
    run.results["replicas"] = measured
    return measured


def failovers(run: Run) -> Measured:
    """``--failovers`` failovers of a primary with two standbys, one after the other (the
    lost node back as a standby each time)."""
    count = run.settings.failovers
    with console.status(f"replicas: {count} failovers"), nodes(2) as node_set:
        seconds = [failover_seconds(node_set) for _ in range(count)]
    measured: Measured = {"failovers": count, "seconds": seconds}
    run.results["failover"] = measured
    return measured


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--failovers", type=int, default=5, help="failovers timed by the replicas section"
    )


# ---------------------------------------------------------------- notes (docs/benchmarks.md)

REPLICAS_READING = """\
Replication figures: each side on embedded nodes of its own, fsync on; the standby is
PostgreSQL's synchronous standby (`synchronous_commit = on`: a commit waits until the
standby has flushed it), on the same host, so the figures show the standby's flush and
one more round trip, not a network. The failover line is the median of the failovers'
seconds from the primary's processes being SIGKILLed to the end of the first transaction
begun after it, committed on the new primary: the promotion and the clients finding it
included (docs/operations.md)."""


# ---------------------------------------------------------------- the lines

LINES = (
    Line(
        "acks_all_standby",
        "acks=all Producer, 1 synchronous standby / no standby (throughput)",
        "replicas",
        lambda m: m["produce_per_s_standby"] / m["produce_per_s_alone"],
    ),
    Line(
        "commit_p50_standby",
        "transactional commit p50, 1 synchronous standby (ms)",
        "replicas",
        lambda m: m["commit_p50_ms_standby"],
        "{:.1f}",
    ),
    Line(
        "commit_p50_alone",
        "transactional commit p50, no standby (ms)",
        "replicas",
        lambda m: m["commit_p50_ms_alone"],
        "{:.1f}",
    ),
    Line(
        "commit_p99_standby",
        "transactional commit p99, 1 synchronous standby (ms)",
        "replicas",
        lambda m: m["commit_p99_ms_standby"],
        "{:.1f}",
    ),
    Line(
        "commit_p99_alone",
        "transactional commit p99, no standby (ms)",
        "replicas",
        lambda m: m["commit_p99_ms_alone"],
        "{:.1f}",
    ),
    Line(
        "failover_seconds",
        "seconds from the primary's death to the first commit on the new primary "
        "(p50 of {failovers})",
        "failover",
        lambda m: statistics.median(m["seconds"]),
        "{:.2f}",
    ),
    Line(
        "follower_read",
        "read_committed Consumer from a standby / from the primary (throughput)",
        "replicas",
        lambda m: m["read_s_primary"] / m["read_s_standby"],
    ),
)

SECTION = Section(
    "replicas",
    {"replicas": replicas, "failover": failovers},
    LINES,
    reading=(REPLICAS_READING,),
    core=False,
    options=options,
)
