"""What replication costs and how long a failover takes, on embedded nodes of this host.

Each figure is the median of ``runs`` runs, each on nodes of its own (a temporary
``KIP98_HOME``, fsync on):

- acks=all with one synchronous standby against none: the idempotent Producer's
  throughput, and a transactional commit's latency (p50 and p99; ``--commit`` chooses
  PostgreSQL's ``synchronous_commit``, ``on`` or ``remote_apply``, to compare the two);
- seconds from the primary's death (its processes SIGKILLed, its data deleted) to the
  first transaction committed on the new primary, by a producer that was committing in a
  loop and found the new primary by itself (promotion by ``kip98 db failover``'s code);
- a read_committed Consumer reading a topic from a standby against from the primary.

``python -m app.bench.replicas [--runs 3] [--records N] [--failovers 5]`` prints the table.
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

import psycopg

from app.admin import AdminClient, NewTopic
from app.client import Consumer, KafkaException, Producer, TopicPartition
from app.storage.cluster import EmbeddedCluster
from app.storage.embedded import SUPERUSER
from app.storage.migrate import upgrade_to_head
from app.torture.failover import kill_node

TOPIC = "bench"
VALUE = b"v" * 100


@dataclass(frozen=True)
class Nodes:
    cluster: EmbeddedCluster
    url: str  # every node, reaching the primary
    standby_url: str | None


@contextlib.contextmanager
def nodes(standbys: int, synchronous_commit: str = "on") -> Iterator[Nodes]:
    """A primary and ``standbys`` standbys (one synchronous) under a temporary home, the
    schema migrated and a one-partition topic made; all of it removed after."""
    home = Path(tempfile.mkdtemp(prefix="kip98-bench-", dir="/var/tmp"))
    home.chmod(0o755)
    previous = os.environ.get("KIP98_EMBEDDED_DURABILITY")
    os.environ["KIP98_EMBEDDED_DURABILITY"] = "on"
    cluster = EmbeddedCluster(home)
    try:
        layout = cluster.start(standbys=standbys)
        port = layout.ports[layout.primary]
        if synchronous_commit != "on":
            _set(port, "synchronous_commit", synchronous_commit)
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


def _set(port: int, name: str, value: str) -> None:
    with psycopg.connect(
        host="127.0.0.1", port=port, user=SUPERUSER, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f"ALTER SYSTEM SET {name} = '{value}'")
        conn.execute("SELECT pg_reload_conf()")


def producer_throughput(url: str, records: int) -> float:
    """Records a second of the idempotent Producer, acks=all."""
    with Producer({"database.url": url, "linger.ms": 5}) as producer:
        started = time.perf_counter()
        for i in range(records):
            producer.produce(TOPIC, VALUE, partition=0)
            if i % 10_000 == 0:
                producer.poll(0)
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


def measure(runs: int, records: int, commits: int, failovers: int, commit: str) -> dict[str, float]:
    """Every figure, each the median of ``runs`` (failover: p50 of ``failovers``)."""
    figures: dict[str, list[float]] = {}

    def add(name: str, value: float) -> None:
        figures.setdefault(name, []).append(value)

    for _ in range(runs):
        for standbys, label in ((1, "1 sync standby"), (0, "no standby")):
            with nodes(standbys, commit) as node_set:
                add(f"producer acks=all, {label} (records/s)",
                    producer_throughput(node_set.url, records))  # fmt: skip
                took = commit_latencies(node_set.url, commits)
                add(f"commit p50, {label} (ms)", percentile(took, 50))
                add(f"commit p99, {label} (ms)", percentile(took, 99))
                if node_set.standby_url is not None:
                    add("consumer read_committed from the primary (records/s)",
                        records / consumer_seconds(node_set.url, records))  # fmt: skip
                    add("consumer read_committed from a standby (records/s)",
                        records / consumer_seconds(node_set.url, records,
                                                   node_set.standby_url))  # fmt: skip
    with nodes(2, commit) as node_set:
        figures["failover: primary lost -> first commit, p50 (s)"] = [
            statistics.median(failover_seconds(node_set) for _ in range(failovers))
        ]
    return {name: statistics.median(values) for name, values in figures.items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--records", type=int, default=100_000)
    parser.add_argument("--commits", type=int, default=300)
    parser.add_argument("--failovers", type=int, default=5)
    parser.add_argument("--commit", choices=("on", "remote_apply"), default="on")
    args = parser.parse_args(argv)
    results = measure(args.runs, args.records, args.commits, args.failovers, args.commit)
    width = max(map(len, results))
    for name, value in results.items():
        print(f"{name:<{width}}  {value:12.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
