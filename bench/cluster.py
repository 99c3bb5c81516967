"""A cluster of ``kip98 serve`` nodes: what ``--processes 2`` gives librdkafka producers
over one process, and how long a node's death stops a transactional producer.

Four librdkafka producer processes (idempotent, ``linger.ms`` 5, each its own partition
of one topic) write the same rows through ``kip98 serve --processes 2`` and through one
``kip98 serve`` process, each side on a fresh database, taking turns to lead; the
figures are records per second and the servers' CPU-seconds per 100,000 records. Then
three nodes on one database and a librdkafka transactional producer bootstrapped with
all three, committing one small transaction after another: the node coordinating its
transactions is SIGKILLed, and the time from the kill to the first transaction
committed after it (through another node) is taken, five times.

``python -m bench.cluster BOOTSTRAP TOPIC PARTITION RECORDS`` is one of the producer
processes; ``python -m bench.cluster --committer BOOTSTRAP TOPIC`` the committer.
"""

from __future__ import annotations

import argparse
import itertools
import os
import select
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import confluent_kafka as ck

from app.broker import Broker
from app.log.topics import create_topic
from app.placement import coordinator
from app.protocol import COORDINATOR_TRANSACTION, DescribeClusterRequest
from app.server.process import ServeProcess
from bench.data import VALUE_BYTES
from bench.database import fresh_database, settle
from bench.section import SPREAD, Line, Measured, Run, Section, console
from bench.timing import process_cpu_s

PRODUCERS = 4
NODES = 3
KILLS = 5
ROOT = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- the child processes


def produce(bootstrap: str, topic: str, partition: int, records: int) -> None:
    """One producer process: ``records`` values to ``partition``, each acknowledged. It
    says "ready" once started and connected, and begins when a line comes on stdin."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True, "linger.ms": 5})
    p.list_topics(topic, timeout=60)
    value = os.urandom(VALUE_BYTES // 2).hex().encode()
    print("ready", flush=True)
    sys.stdin.readline()
    failed: list[ck.KafkaError] = []

    def report(err: ck.KafkaError | None, msg: ck.Message) -> None:
        if err is not None:
            failed.append(err)

    for i in range(records):
        while True:
            try:
                p.produce(topic, value, str(i).encode(), partition=partition, on_delivery=report)
                break
            except BufferError:
                p.poll(0.01)
    if p.flush(300) != 0 or failed:
        raise SystemExit(f"{len(failed)} records failed: {failed[:3]}")


def commit_forever(bootstrap: str, topic: str) -> None:
    """Commit one small transaction after another; print when each began and when its
    commit returned (wall clock)."""
    p = ck.Producer({"bootstrap.servers": bootstrap, "transactional.id": "bench-failover",
                     "linger.ms": 1, "transaction.timeout.ms": 60_000})  # fmt: skip
    p.init_transactions(60)
    print("ready", flush=True)
    for i in itertools.count():
        began = time.time()
        p.begin_transaction()
        p.produce(topic, f"t{i}".encode(), partition=i % 2)
        while True:
            try:
                p.commit_transaction(60)
                break
            except ck.KafkaException as exc:
                if not exc.args[0].retriable():
                    raise
        print(f"{began:.6f} {time.time():.6f}", flush=True)


# ---------------------------------------------------------------- the cases


def _producers(bootstrap: str, records: int) -> float:
    """Seconds for ``PRODUCERS`` producer processes, started and connected, to write
    ``records`` between them."""
    each = records // PRODUCERS
    command = [sys.executable, "-m", "bench.cluster", bootstrap, "c"]
    procs = []
    for i in range(PRODUCERS):
        proc = subprocess.Popen(
            [*command, str(i), str(each)],
            cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        procs.append(proc)
    for proc in procs:
        assert proc.stdout is not None
        if _line(proc.stdout) != "ready":
            raise RuntimeError("a producer process did not start")
    start = time.perf_counter()
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    codes = [proc.wait() for proc in procs]
    elapsed = time.perf_counter() - start
    if any(codes):
        raise RuntimeError(f"a producer process failed: {codes}")
    return elapsed


def _node_pids(url: str, serve: ServeProcess, processes: int) -> list[int]:
    """The pids answering for ``serve``: its own, or its ``processes`` registered nodes'."""
    assert serve.proc is not None
    if processes == 1:
        return [serve.proc.pid]
    broker = Broker.connect(url)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        nodes = broker.handle(DescribeClusterRequest()).nodes
        if len(nodes) == processes:
            return [n.pid for n in nodes]
        time.sleep(0.1)
    raise RuntimeError(f"{processes} nodes never registered")


def processes(run: Run) -> Measured:
    """Four producer processes through ``--processes 2`` and through one process, rounds
    in which each side leads every other one."""
    records = run.settings.records - run.settings.records % PRODUCERS
    seconds: dict[int, list[float]] = {1: [], 2: []}
    cpu: dict[int, list[float]] = {1: [], 2: []}
    with console.status("A cluster of kip98 serve nodes: four producers, 1 and 2 processes"):
        for i in range(run.settings.cluster_rounds):
            for count in (1, 2) if i % 2 == 0 else (2, 1):
                with fresh_database(run.server) as url:
                    create_topic(Broker.connect(url), "c", PRODUCERS)
                    with ServeProcess(url, args=("--processes", str(count))) as serve:
                        pids = _node_pids(url, serve, count)
                        settle(url)
                        before = sum(process_cpu_s(pid) for pid in pids)
                        seconds[count].append(_producers(serve.address, records))
                        cpu[count].append(sum(process_cpu_s(pid) for pid in pids) - before)
    run.results["cluster_processes_s"] = seconds
    return {"records": records, "seconds": seconds, "cpu": cpu}


def failover(run: Run) -> Measured:
    """Seconds from the SIGKILL of the node coordinating a transactional producer's
    transactions to its first commit after it, ``KILLS`` times."""
    waits = []
    with console.status("A cluster of kip98 serve nodes: failover"):
        for _ in range(KILLS):
            with fresh_database(run.server) as url:
                create_topic(Broker.connect(url), "f", 2)
                waits.append(_one_failover(url))
    run.results["cluster_failover_s"] = waits
    return {"waits": sorted(waits)}


def _one_failover(url: str) -> float:
    serves = [ServeProcess(url, args=("--node-id", str(i))) for i in range(NODES)]
    try:
        for serve in serves:
            serve.start()
        _wait(lambda: len(Broker.connect(url).handle(DescribeClusterRequest()).nodes) == NODES)
        bootstrap = ",".join(s.address for s in serves)
        committer = subprocess.Popen(
            [sys.executable, "-m", "bench.cluster", "--committer", bootstrap, "f"],
            cwd=ROOT, stdout=subprocess.PIPE, text=True,
        )  # fmt: skip
        assert committer.stdout is not None
        try:
            if _line(committer.stdout) != "ready":
                raise RuntimeError("the committer did not start")
            for _ in range(20):  # its transactions are under way
                _line(committer.stdout)
            doomed = coordinator(COORDINATOR_TRANSACTION, "bench-failover", range(NODES))
            assert doomed is not None
            serves[doomed].kill()
            killed = time.time()
            while True:  # the first transaction begun after the kill, through another node
                began, committed = (float(t) for t in _line(committer.stdout).split())
                if began > killed:
                    return committed - killed
        finally:
            committer.kill()
            committer.wait()
    finally:
        for serve in serves:
            try:
                serve.stop()
            finally:
                serve.kill()


def _line(stream: IO[str], timeout: float = 300) -> str:
    """A child process's next line; RuntimeError if it stops or says nothing for
    ``timeout`` seconds (a hang guard)."""
    if not select.select([stream], [], [], timeout)[0]:
        raise RuntimeError(f"a child process said nothing for {timeout} s")
    line = stream.readline()
    if not line:
        raise RuntimeError("a child process stopped")
    return line.strip()


def _wait(condition: Callable[[], bool], timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise RuntimeError("the nodes never registered")
        time.sleep(0.1)


# ---------------------------------------------------------------- notes and lines

READING = """\
Cluster lines (`--only cluster-processes,cluster-failover`): four librdkafka producer
processes (confluent-kafka, idempotent, `linger.ms` 5, each writing a quarter of
`--records` to its own partition of a 4-partition topic, timed from when all four are
started and connected) through `kip98 serve
--processes 2` and through one `kip98 serve` process, each side on a fresh database,
leading every other of `--cluster-rounds` rounds: records per second at each side's
median time, and the server processes' CPU-seconds (every node's, read from /proc) per
100,000 records. Failover: three nodes on one database, a librdkafka transactional
producer bootstrapped with all three committing one record per transaction; once it has
committed 20, the node coordinating its transactions is SIGKILLed; the figure is the time
from the kill to the commit of the first transaction begun after it (through another
node once the dead node's lease has lapsed, `KIP98_NODE_SESSION_TIMEOUT_MS`, 6000),
median of five kills, each on a fresh database."""

NOTE = """\
**A cluster of kip98 serve nodes (reported).** `--processes 2` runs two nodes on the
same port; each producer's connections land on either process, so the two cores share
the four producers' requests. On a 2-core machine the clients, the servers and
PostgreSQL share the same two cores, so the gain there is bounded by what they leave.
A node's death stops a transactional producer until its lease lapses and its clients'
next Metadata and FindCoordinator name another node: about the session timeout plus a
client's back-off."""


def _rate(count: int) -> Callable[[Measured], float]:
    return lambda m: m["records"] / statistics.median(m["seconds"][count])


def _cpu(count: int) -> Callable[[Measured], float]:
    return lambda m: statistics.median(m["cpu"][count]) * 100_000 / m["records"]


LINES = (
    Line("cluster_rate_2", "four librdkafka producers through --processes 2: records/s",
         "cluster-processes", _rate(2), "{:,.0f}", note=NOTE),
    Line("cluster_rate_1", "four librdkafka producers through one process: records/s",
         "cluster-processes", _rate(1), "{:,.0f}"),
    Line("cluster_speedup", "the same, --processes 2 / one process",
         "cluster-processes", lambda m: _rate(2)(m) / _rate(1)(m)),
    Line("cluster_cpu_2", "CPU-seconds per 100,000 records: the --processes 2 nodes",
         "cluster-processes", _cpu(2)),
    Line("cluster_cpu_1", "CPU-seconds per 100,000 records: the one process",
         "cluster-processes", _cpu(1)),
    Line("cluster_failover_p50",
         "seconds from a node's SIGKILL to the first transaction committed through another "
         "node, p50 of 5", "cluster-failover", lambda m: statistics.median(m["waits"]),
         "{:.1f}"),
    Line("cluster_failover_spread", "the same, quickest and slowest", "cluster-failover",
         lambda m: (m["waits"][0], m["waits"][-1]), SPREAD),
)  # fmt: skip


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--cluster-rounds", type=int, default=3,
        help="rounds of the --processes figures, each side leading every other round",
    )  # fmt: skip


SECTION = Section(
    "cluster",
    {"cluster-processes": processes, "cluster-failover": failover},
    LINES,
    reading=(READING,),
    core=False,
    options=options,
)


if __name__ == "__main__":
    if sys.argv[1] == "--committer":
        commit_forever(sys.argv[2], sys.argv[3])
    else:
        produce(sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]))
    os._exit(0)
