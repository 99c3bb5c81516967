"""Kafka's own load tools, run against any broker's bootstrap address, their printed
results read back; and the CPU time of the processes serving them.

The tools are the classes behind ``kafka-producer-perf-test``, ``kafka-consumer-perf-test``
and ``kafka-e2e-latency`` (``bench.kafka.run_tool``, Kafka 4.4's options), plus one small
Java program of our own for one-record transactions (``bench/java``), which those tools
cannot express; all run on Kafka's classpath, so the load generator is the same JVM
program whichever broker it drives.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import psycopg
from confluent_kafka.admin import AdminClient, NewTopic

from app.storage.driver import libpq_conninfo
from bench.kafka import cache_dir, kafka_classpath, run_tool
from bench.timing import process_cpu_s

TOOLS = "org.apache.kafka.tools."
ONE_RECORD_TRANSACTIONS = Path(__file__).resolve().parent / "java" / "OneRecordTransactions.java"
# Generous: a tool that hangs (a broker not answering) fails the run, not the machine.
TOOL_TIMEOUT_S = 900.0


class ToolError(RuntimeError):
    """A tool exited non-zero or printed no result: its command and output's tail."""


def _text(out: str | bytes | None) -> str:
    return out.decode(errors="replace") if isinstance(out, bytes) else (out or "")


def _run(main_class: str, args: list[str]) -> str:
    done = run_tool(main_class, args, TOOL_TIMEOUT_S)
    stdout, stderr = _text(done.stdout), _text(done.stderr)
    if done.returncode != 0:
        raise ToolError(
            f"{main_class} {' '.join(args)} exited {done.returncode}:\n{stderr[-3000:]}"
        )
    return stdout


def _search(pattern: str, text: str, what: str) -> re.Match[str]:
    found = re.search(pattern, text, re.MULTILINE)
    if found is None:
        raise ToolError(f"no {what} in the tool's output:\n{text[-3000:]}")
    return found


def _props(props: dict[str, str]) -> list[str]:
    return ["--command-property", *(f"{k}={v}" for k, v in props.items())] if props else []


def create_topics(
    bootstrap: str, topics: dict[str, int], config: dict[str, str] | None = None
) -> None:
    """Create ``topics`` (name → partitions, replication factor 1) with ``config``, the same
    admin request to either broker, and wait for each."""
    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 4})
    futures = admin.create_topics(
        [NewTopic(name, n, 1, config=dict(config or {})) for name, n in topics.items()]
    )
    for future in futures.values():
        future.result(60)


# ---------------------------------------------------------------- the tools


def producer_perf(
    bootstrap: str,
    topic: str,
    records: int,
    record_size: int,
    props: dict[str, str] | None = None,
    transaction_ms: int | None = None,
) -> float:
    """Records per second of ``ProducerPerformance`` (kafka-producer-perf-test) sending
    ``records`` records of ``record_size`` bytes as fast as it can, with the producer's
    defaults but ``props``, committing a transaction every ``transaction_ms`` if given:
    the tool's own figure, from its producer made to its last record acknowledged."""
    args = ["--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records),
            "--record-size", str(record_size), "--throughput", "-1",
            "--reporting-interval", "600000", *_props(props or {})]  # fmt: skip
    if transaction_ms is not None:
        args += ["--transaction-duration-ms", str(transaction_ms)]
    out = _run(TOOLS + "ProducerPerformance", args)
    found = _search(r"^(\d+) records sent, ([\d.]+) records/sec .*50th", out, "total")
    if int(found[1]) != records:
        raise ToolError(f"{found[1]} of {records} records acknowledged:\n{out[-3000:]}")
    return float(found[2])


def consumer_perf(
    bootstrap: str, topic: str, records: int, group: str, props: dict[str, str] | None = None
) -> float:
    """Records per second of ``ConsumerPerformance`` (kafka-consumer-perf-test) reading
    ``records`` records of ``topic`` in group ``group`` from the earliest offset: its
    ``fetch.nMsg.sec``, the rate once the group's join is done (the join is not the
    fetch path, and its delay differs by broker)."""
    args = ["--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records),
            "--group", group, "--timeout", "60000", *_props(props or {})]  # fmt: skip
    out = _run(TOOLS + "ConsumerPerformance", args)
    lines = [line for line in out.splitlines() if line.count(",") >= 9]
    header = [h.strip() for h in _search(r"^start\.time,.*$", out, "header")[0].split(",")]
    row = dict(zip(header, (v.strip() for v in lines[-1].split(",")), strict=False))
    read = int(row["data.consumed.in.nMsg"])
    if read < records:
        raise ToolError(f"{read} of {records} records read:\n{out[-3000:]}")
    return float(row["fetch.nMsg.sec"])


@dataclass(frozen=True)
class Latency:
    """``EndToEndLatency``'s figures (ms): the mean, and p50 and p99 as the tool prints
    them, whole milliseconds cut down."""

    mean_ms: float
    p50_ms: float
    p99_ms: float


def end_to_end(
    bootstrap: str, topic: str, records: int, record_size: int, props: dict[str, str]
) -> Latency:
    """``EndToEndLatency`` (kafka-e2e-latency): one record at a time sent with acks=all and
    waited for, then polled by a consumer (``fetch.max.wait.ms`` 0) configured by
    ``props`` (its ``--command-config``, also given to its producer and admin client)."""
    with tempfile.NamedTemporaryFile("w", suffix=".properties") as config:
        config.write("".join(f"{k}={v}\n" for k, v in props.items()))
        config.flush()
        out = _run(
            TOOLS + "EndToEndLatency",
            ["--bootstrap-server", bootstrap, "--topic", topic, "--num-records", str(records),
             "--producer-acks", "all", "--record-size", str(record_size),
             "--command-config", config.name],
        )  # fmt: skip
    mean = _search(r"^Avg latency: ([\d.]+) ms", out, "mean")
    pcts = _search(r"^Percentiles: 50th = (\d+), 99th = (\d+)", out, "percentiles")
    return Latency(float(mean[1]), float(pcts[1]), float(pcts[2]))


def compiled(source: Path = ONE_RECORD_TRANSACTIONS) -> Path:
    """The directory holding ``source`` compiled against Kafka's classpath (javac, once per
    version of the source, kept in Kafka's cache beside its jars)."""
    text = source.read_bytes()
    out = cache_dir() / "bench-classes" / hashlib.sha256(text).hexdigest()[:16]
    if (out / f"{source.stem}.class").exists():
        return out
    javac = shutil.which("javac")
    if javac is None:
        raise ToolError("javac not found: the Kafka lines need a JDK (scripts/setup installs one)")
    out.parent.mkdir(parents=True, exist_ok=True)
    building = Path(tempfile.mkdtemp(prefix="building-", dir=out.parent))
    done = subprocess.run(
        [javac, "-d", str(building), "-cp", kafka_classpath(), str(source)],
        capture_output=True,
        text=True,
        timeout=TOOL_TIMEOUT_S,
    )
    if done.returncode != 0:
        shutil.rmtree(building, ignore_errors=True)
        raise ToolError(f"javac {source.name} failed:\n{done.stderr[-3000:]}")
    try:
        building.rename(out)
    except OSError:  # another run compiled it meanwhile
        shutil.rmtree(building, ignore_errors=True)
    return out


def one_record_transactions(bootstrap: str, topic: str, count: int, record_size: int) -> float:
    """Transactions per second of ``bench/java/OneRecordTransactions.java`` on Kafka's
    classpath: ``count`` transactions of one record each, one after the other."""
    classpath = f"{compiled()}{os.pathsep}{kafka_classpath()}"
    cmd = ["java", "-Xmx256m", "-cp", classpath, ONE_RECORD_TRANSACTIONS.stem,
           bootstrap, topic, str(count), str(record_size)]  # fmt: skip
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=TOOL_TIMEOUT_S)
    if done.returncode != 0:
        raise ToolError(f"OneRecordTransactions exited {done.returncode}:\n{done.stderr[-3000:]}")
    return float(_search(r"([\d.]+) transactions/s", done.stdout, "rate")[1])


# ---------------------------------------------------------------- CPU time


def postmaster_pid(url: str) -> int:
    """The PostgreSQL server's postmaster: the parent of a backend of ``url``'s (the
    server runs on this host, as the bench's does)."""
    with psycopg.connect(libpq_conninfo(url)) as conn:
        row = conn.execute("SELECT pg_backend_pid()").fetchone()
    assert row is not None
    return _ppid(int(row[0]))


def _stat(pid: int) -> list[str]:
    """/proc/PID/stat's fields after the command's name (state, ppid, ...)."""
    with open(f"/proc/{pid}/stat") as fh:
        return fh.read().rsplit(")", 1)[1].split()


def _ppid(pid: int) -> int:
    return int(_stat(pid)[1])


def postgres_cpu_s(postmaster: int) -> float:
    """CPU-seconds of the PostgreSQL server: its postmaster's own, its live children's
    (backends, checkpointer, WAL writer, autovacuum, ...) and its children that have
    exited (the postmaster waits for them, so Linux adds theirs to its cutime/cstime)."""
    ticks = os.sysconf("SC_CLK_TCK")
    fields = _stat(postmaster)
    total = sum(int(f) for f in fields[11:15]) / ticks
    return total + sum(process_cpu_s(pid) for pid in _children(postmaster))


def _children(parent: int) -> Iterable[int]:
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            if _ppid(int(entry)) == parent:
                yield int(entry)
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile


def cpu_s(pids: dict[str, int], postmaster: int | None = None) -> dict[str, float]:
    """Each process's CPU-seconds so far by name, with ``postgres`` for the server's."""
    seconds = {name: process_cpu_s(pid) for name, pid in pids.items()}
    if postmaster is not None:
        seconds["postgres"] = postgres_cpu_s(postmaster)
    return seconds


def durability(url: str) -> str:
    """How a commit on ``url`` is made durable, as its server's settings say."""
    with psycopg.connect(libpq_conninfo(url)) as conn:
        fsync = conn.execute("SHOW fsync").fetchone()
        sync = conn.execute("SHOW synchronous_commit").fetchone()
    assert fsync is not None and sync is not None
    off = [
        name
        for name, value in (("fsync", fsync[0]), ("synchronous_commit", sync[0]))
        if value == "off"
    ]
    return ", ".join(f"{name}=off" for name in off) or "commit fsynced"
