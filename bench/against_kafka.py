"""The speed anchor: the same workloads against ``kip98 serve`` and Apache Kafka in one
run, driven by Kafka's own load tools (``bench.kafka_tools``), so the load generator is the
same JVM program on both sides and never a Python client. Each figure is kip98's over
Kafka's, with each side's durability in its label: kip98 fsyncs each commit, Kafka
acknowledges from the page cache, so two equal-durability pairs are measured too.
"""

from __future__ import annotations

import argparse
import os
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import psycopg

from app.server.process import ServeProcess
from app.storage.driver import libpq_conninfo
from bench import kafka_tools as tools
from bench.database import fresh_database, settle
from bench.kafka import KafkaBroker
from bench.pyspy import RATE, profiled, samples, top_costs, top_inclusive
from bench.section import Line, Measured, Run, Section, console

# Every throughput workload writes 4 partitions, as the transactional lines of the
# in-process table do; the latency tool's topic has one.
PARTITIONS = 4
SMALL, LARGE = 100, 1000
TRANSACTION_MS = 100
KAFKA = "Kafka (page cache)"
KAFKA_FLUSHED = "Kafka (flush.messages=1)"


@dataclass(frozen=True)
class Target:
    """One broker as the tools see it: its address, how many times the base record count
    its throughput runs send (``scale``), and for kip98 the database to settle first."""

    kind: str
    bootstrap: str
    scale: int = 1
    url: str | None = None

    def topic(
        self, stem: str, partitions: int = PARTITIONS, config: dict[str, str] | None = None
    ) -> str:
        name = f"{stem}-{uuid.uuid4().hex[:8]}"
        tools.create_topics(self.bootstrap, {name: partitions}, config)
        return name

    def settle(self) -> None:
        """kip98's database finishes the previous run's background work first (as every
        timed phase of the bench does); Kafka has none the bench can ask for."""
        if self.url is not None:
            settle(self.url)


# ---------------------------------------------------------------- the workloads

IDEMPOTENT = {"acks": "all", "enable.idempotence": "true"}
ACKS_1 = {"acks": "1", "enable.idempotence": "false"}


def produce(
    size: int, props: dict[str, str], config: dict[str, str] | None = None
) -> Callable[[Target, int], float]:
    """kafka-producer-perf-test: ``n`` records of ``size`` bytes, the producer's defaults
    but ``props``, to a new topic (created with ``config``)."""

    def workload(target: Target, n: int) -> float:
        topic = target.topic(f"perf-{size}", config=config)
        target.settle()
        return tools.producer_perf(target.bootstrap, topic, n * target.scale, size, props)

    return workload


def transactional(target: Target, n: int) -> tuple[float, float, str]:
    """kafka-producer-perf-test with a transaction committed every 100 ms, 1 KB records;
    then (untimed here) the topic it wrote, for the read_committed consumer."""
    topic = target.topic("txn-100ms")
    target.settle()
    records = n * target.scale
    rate = tools.producer_perf(
        target.bootstrap, topic, records, LARGE, transaction_ms=TRANSACTION_MS
    )
    target.settle()
    group = f"perf-{uuid.uuid4().hex[:8]}"
    read = tools.consumer_perf(
        target.bootstrap, topic, records, group, {"isolation.level": "read_committed"}
    )
    return rate, read, topic


def one_record(config: dict[str, str] | None = None) -> Callable[[Target, int], float]:
    def workload(target: Target, n: int) -> float:
        topic = target.topic("txn-1", config=config)
        target.settle()
        return tools.one_record_transactions(target.bootstrap, topic, n, SMALL)

    return workload


def latency(target: Target, n: int) -> dict[str, float]:
    topic = target.topic("e2e", partitions=1)
    target.settle()
    return asdict(
        tools.end_to_end(target.bootstrap, topic, n, SMALL, {"isolation.level": "read_committed"})
    )


# ---------------------------------------------------------------- the case


def _relaxed(url: str) -> None:
    """kip98's equal-durability side: its commits on this database wait for no WAL flush
    (PostgreSQL's ``synchronous_commit=off``, set for the database before serve connects)."""
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        row = conn.execute("SELECT current_database()").fetchone()
        assert row is not None
        conn.execute(f'ALTER DATABASE "{row[0]}" SET synchronous_commit = off')


def kafka(run: Run) -> Measured:
    """Each workload on kip98 (a ``kip98 serve`` over a fresh database of the bench's
    server) and on Kafka 4.4 (a single-node broker the bench starts), one side leading
    every other workload."""
    s = run.settings
    # The conditions: on a shared machine the tools, both brokers and PostgreSQL compete
    # with whatever else runs; the JSON keeps the load average around the section.
    load = [os.getloadavg()[0]]
    small, large = s.kafka_records, max(s.kafka_records // 5, 1)
    rates: dict[str, dict[str, float]] = {}
    m: Measured = {"rates": rates, "records": small}
    with (
        console.status("Kafka's load tools: starting the brokers"),
        fresh_database(run.server) as url,
        fresh_database(run.server) as relaxed_url,
        KafkaBroker() as broker,
        ServeProcess(url) as serve,
    ):
        _relaxed(relaxed_url)
        assert serve.proc is not None
        ours = Target("kip98", serve.address, url=url)
        theirs = Target("kafka", broker.bootstrap, scale=s.kafka_scale)
        m["kip98_durability"] = tools.durability(url)
        m["kip98_relaxed"] = tools.durability(relaxed_url)
        postmaster = tools.postmaster_pid(url)
        order = 0

        def both(name: str, fn: Callable[[Target, int], Any], n: int) -> dict[str, Any]:
            nonlocal order
            sides = (ours, theirs) if order % 2 == 0 else (theirs, ours)
            order += 1
            start = time.perf_counter()
            got = {t.kind: fn(t, n) for t in sides}
            console.print(f"  {name} ({time.perf_counter() - start:.0f} s): {got}")
            return got

        rates["p100_acks1"] = both("producer 100 B acks=1", produce(SMALL, ACKS_1), small)
        # The 100 B idempotent line, with each process's CPU time around each side's run.
        cpu: dict[str, float] = {}
        for target, pids, pm in (
            (ours, {"serve": serve.proc.pid}, postmaster),
            (theirs, {"kafka": broker.pid}, None),
        ):
            fn = produce(SMALL, IDEMPOTENT)
            target.settle()
            before = tools.cpu_s(pids, pm)
            rate = fn(target, small)
            after = tools.cpu_s(pids, pm)
            rates.setdefault("p100_idem", {})[target.kind] = rate
            for name in after:
                cpu[name] = (after[name] - before[name]) * 100_000 / (small * target.scale)
        m["cpu_per_100k"] = cpu
        console.print(f"  producer 100 B idempotent: {rates['p100_idem']}, CPU-s/100k {cpu}")
        rates["p1k_acks1"] = both("producer 1 KB acks=1", produce(LARGE, ACKS_1), large)
        rates["p1k_idem"] = both("producer 1 KB idempotent", produce(LARGE, IDEMPOTENT), large)
        txn = both("transactions every 100 ms, then read_committed", transactional, large)
        rates["txn_100ms"] = {k: v[0] for k, v in txn.items()}
        rates["consume"] = {k: v[1] for k, v in txn.items()}
        m["latency"] = both("end-to-end latency", latency, s.kafka_latency_records)
        rates["txn_1"] = both("one-record transactions", one_record(), s.kafka_txns)
        # The equal-durability pairs: Kafka flushing each append against kip98's default,
        # and kip98 not waiting for its commits' WAL flush against Kafka's default.
        flushed = {"flush.messages": "1"}
        rates["p100_idem_flushed"] = {"kafka": produce(SMALL, IDEMPOTENT, flushed)(theirs, small)}
        rates["txn_1_flushed"] = {"kafka": one_record(flushed)(theirs, s.kafka_txns)}
        with ServeProcess(relaxed_url) as relaxed_serve:
            loose = Target("kip98", relaxed_serve.address, url=relaxed_url)
            rates["p100_idem_relaxed"] = {"kip98": produce(SMALL, IDEMPOTENT)(loose, small)}
            rates["txn_1_relaxed"] = {"kip98": one_record()(loose, s.kafka_txns)}
        pairs = ("p100_idem_flushed", "txn_1_flushed", "p100_idem_relaxed", "txn_1_relaxed")
        console.print(f"  equal durability: { {k: rates[k] for k in pairs} }")
        if s.kafka_profile is not None:
            m["profile"] = profile(ours, serve.proc.pid, small, s.kafka_profile)
            run.results["kafka_serve_profile"] = m["profile"]
    load.append(os.getloadavg()[0])
    run.results["kafka_load_average"] = load
    run.results["kafka_durability"] = {k: m[k] for k in ("kip98_durability", "kip98_relaxed")}
    run.results["kafka_rates"] = rates
    run.results["kafka_latency_ms"] = m["latency"]
    return m


def profile(target: Target, pid: int, n: int, out: Path) -> dict[str, Any]:
    """An untimed pass of the 100 B idempotent line on kip98 with ``kip98 serve`` sampled
    by py-spy (its raw stacks written to ``out``): the functions most often on top of its
    stacks, and its own (``app/``) functions most often anywhere on them."""
    with (
        console.status("profiling kip98 serve (py-spy) on the 100 B producer line"),
        profiled(pid, out),
    ):
        # The samples the producer's run would take: from its first record to its last
        # acknowledgement, as the tool's rate says (the tool's start is not in it).
        whole = n / produce(SMALL, IDEMPOTENT)(target, n) * RATE
    folded = out.read_text()
    found: dict[str, Any] = {
        "gil_held": samples(folded) / whole,
        "own": top_costs(folded, whole),
        "inclusive": top_inclusive(folded, whole),
    }
    console.print(
        f"kip98 serve's profile ({out}): its Python ran {found['gil_held']:.0%} of the pass"
    )
    for kind in ("own", "inclusive"):
        console.print(f"  top {kind}, as a share of the pass's time:")
        for frame, share in found[kind]:
            console.print(f"    {share:6.1%}  {frame}")
    return found


# ---------------------------------------------------------------- the lines


def _ratio(
    workload: str, ours: str = "kip98", theirs: str = "kafka"
) -> Callable[[Measured], float]:
    def figure(m: Measured) -> float:
        rates = m["rates"]
        mine = rates[f"{workload}_relaxed"] if ours == "relaxed" else rates[workload]
        other = rates[f"{workload}_flushed"] if theirs == "flushed" else rates[workload]
        return float(mine["kip98"] / other["kafka"])

    return figure


def _rate(workload: str, side: str) -> Callable[[Measured], float]:
    return lambda m: float(m["rates"][workload][side])


def _within(side: str) -> Callable[[Measured], float]:
    """A side's transactional (100 ms) rate over its idempotent one, 1 KB records."""
    return lambda m: float(m["rates"]["txn_100ms"][side] / m["rates"]["p1k_idem"][side])


def _latency(side: str, which: str) -> Callable[[Measured], float]:
    return lambda m: float(m["latency"][side][which])


def _cpu(name: str) -> Callable[[Measured], float]:
    return lambda m: float(m["cpu_per_100k"][name])


def _vs(what: str) -> str:
    """A line of kip98 (its durability as measured) against Kafka's defaults."""
    return "kip98 ({kip98_durability}) / " + KAFKA + ": " + what


def _pair(ours: str, theirs: str, what: str) -> str:
    """A line of an equal-durability pair: kip98's side by the field naming its
    durability, Kafka's as given."""
    return f"equal durability: kip98 ({{{ours}}}) / {theirs}: {what}"


PER_S = "{:,.0f}"
RATIO = "{:.3f}"

KAFKA_READING = """\
Kafka lines (`--only kafka`): each workload run against a `kip98 serve` over a fresh
database of the bench's PostgreSQL server and against Apache Kafka 4.4 (one combined
broker and controller the bench starts, `bench/kafka`), by Kafka's own load tools on
Kafka's classpath: `ProducerPerformance` (kafka-producer-perf-test: `--throughput -1`,
the Java producer's defaults, `batch.size` 16 KB, `linger.ms` 5, 5 requests in flight,
but the acks and idempotence named), `ConsumerPerformance` (kafka-consumer-perf-test, a
group reading from the earliest offset, `isolation.level=read_committed`; its
`fetch.nMsg.sec`, the rate after the group's join) and `EndToEndLatency`
(kafka-e2e-latency: one 100 B record at a time, acks=all, waited for, then polled by a
read_committed consumer with `fetch.max.wait.ms` 0; the tool prints whole
milliseconds). One-record transactions are `bench/java/OneRecordTransactions.java`, run
on the same classpath against each broker (begin, send one 100 B record, commit, one
after the other): ProducerPerformance commits on elapsed time (at least 1 ms), so its
transactions hold every record sent meanwhile and cannot be one record long. The
throughput topics have 4 partitions. kip98's side runs `--kafka-records` records (100
B; a fifth of them for 1 KB), Kafka's `--kafka-scale` times as many, so that both run
for seconds; each figure is the tool's records per second for its whole run. Each line
is kip98's figure over Kafka's in the same run, the side that runs first alternating
from workload to workload; kip98's database is settled before each of its runs. The
labels give each side's durability: kip98 commits with the bench's PostgreSQL server's
settings (`commit fsynced` when `fsync` and `synchronous_commit` are on: the WAL flushed
before the acknowledgement), Kafka acknowledges from the page cache (its default: no
flush per append). The equal-durability pairs set kip98's database to
`synchronous_commit=off` (commits acknowledged before their WAL is flushed, as Kafka's
are) against Kafka's default, and kip98's default against a Kafka topic with
`flush.messages=1` (an fsync of the partition's log after each append). The CPU lines
read /proc around the 100 B idempotent line: `kip98 serve`'s process, the PostgreSQL
server's (its postmaster, its live processes, and those that exited meanwhile), and
Kafka's JVM (`bench/kafka`'s: a heap of at most 768 MB, the serial collector), per
100,000 records. The machine has 2 cores: the load tool, the broker and PostgreSQL share
them, on both sides, with whatever else runs (the JSON keeps the load average at the
section's start and end). `--kafka-profile FILE` adds an untimed pass of the 100 B
idempotent line with `kip98 serve` sampled by py-spy, 100 times a second, the thread
holding the GIL (raw stacks in FILE; the top costs, as shares of the producer's run,
printed and kept in the JSON)."""

KAFKA_NOTE = """\
**kip98 against Apache Kafka 4.4 (no targets yet: these figures set them).** 0.23.0's
run was made while other work kept this 2-core machine's load average at 14-38 (24 on
average): the tools, both brokers and PostgreSQL waited in a long run queue, so every
absolute rate here is far below what either broker does on an idle machine, and the
ratios moved from run to run (the spreads beside them). A single run at a load of about
13 shortly before gave Kafka more of the CPU and widened the gap: the 100 B idempotent
producer 15,158 against 64,197 records/s (0.24), 1 KB 0.20, the read_committed
consumer 0.24, one-record transactions 24 against 65 per second (0.36). On the producer
lines kip98 reaches about half of Kafka's rate at 100 B (0.50 idempotent, 0.39 acks=1)
and less at 1 KB (0.64 and 0.48 here, 0.20 in the quieter run): Kafka's producer puts
at most 16 KB in a partition's batch, so a 1 KB record costs kip98 seven times the
requests a 100 B one does, and each request is a PostgreSQL transaction.
**Where the time goes (the 100 B idempotent line):** per 100,000 records, `kip98 serve`
spends 0.85 CPU-seconds and PostgreSQL 1.23 (2.08 together), Kafka's JVM 1.20 here and
0.42 in the quieter run (0.69 and 1.05 for serve and PostgreSQL there): kip98 spends two
to four times Kafka's CPU on a record, more than half of it in PostgreSQL (the records'
COPY and the statements and commit around it). Sampled by py-spy
(`--kafka-profile`, the thread holding the GIL), serve's Python runs only 11-15% of the
pass: the produce path (`Server.answer` → `Broker.handle` → `produce_batches` →
`append_batches` → the one-query append, `append.append_one_query`) holds it 9-10% of the time, and
no function of its own takes more than about 1%: the records' encoding for COPY
(`copy_records._piece`, `_nullable`, `encode_rows`, `copy_payloads_of`), psycopg's
`copy_to`, the remembered partition row's parameters (`partition_lock._remembered_params`),
`ProducerEntry.from_row`, the worker pool's hand-off (`ThreadPoolExecutor.submit`). So
serve's CPU is not what bounds the rate: the producer waits on round trips. The Java
producer keeps up to 5 requests in flight per connection and Kafka appends them one
after another from the page cache; `kip98 serve` answers a connection's requests one at
a time, each a commit, so a producer gets one commit's latency per request (on a loaded
machine, a run queue's wait at each step). The way on is to take a connection's waiting
produce requests into one transaction (a group commit), not built. **Durability** is
much of a one-record transaction's cost and none of the producer's:
`synchronous_commit=off` lifts kip98's one-record transactions from 0.44 to 0.75 of
Kafka's default (28 to 48 per second in the first run), while the 100 B producer gains
nothing (0.26 against 0.50 here, 0.20 against 0.24 in the quieter run: within the
noise). Against Kafka flushing each append (`flush.messages=1`), kip98 with its fsynced
commits is level on the 100 B producer (1.06) and ahead on one-record transactions
(1.48): Kafka flushes the partition's log for the record and again for its commit
marker, where kip98's commit is one WAL flush. **Transactions every
100 ms** cost neither broker here (1.10 of the idempotent producer on kip98, 1.00 on
Kafka; the 1 KB idempotent and transactional runs are within each other's noise),
and kip98's transactional producer is 0.71 of Kafka's. The **read_committed
consumer** is 0.69 of Kafka's (0.24 at the lower load), and a record's **end-to-end
latency** (acks=all, then a read_committed poll) is 16 ms at p50 and 167 ms at p99 on
kip98 against 5 and 80 ms on Kafka, its mean 1.56 times Kafka's."""


LINES = (
    Line(
        "vs_p100_acks1",
        _vs("producer, 100 B records, acks=1"),
        "kafka",
        _ratio("p100_acks1"),
        RATIO,
        note=KAFKA_NOTE,
    ),
    Line(
        "vs_p100_idem",
        _vs("producer, 100 B records, acks=all, idempotent"),
        "kafka",
        _ratio("p100_idem"),
        RATIO,
    ),
    Line(
        "kip98_p100_idem",
        "kip98: producer, 100 B records, acks=all, idempotent: records/s",
        "kafka",
        _rate("p100_idem", "kip98"),
        PER_S,
    ),
    Line(
        "kafka_p100_idem",
        "Kafka: producer, 100 B records, acks=all, idempotent: records/s",
        "kafka",
        _rate("p100_idem", "kafka"),
        PER_S,
    ),
    Line(
        "vs_p1k_acks1", _vs("producer, 1 KB records, acks=1"), "kafka", _ratio("p1k_acks1"), RATIO
    ),
    Line(
        "vs_p1k_idem",
        _vs("producer, 1 KB records, acks=all, idempotent"),
        "kafka",
        _ratio("p1k_idem"),
        RATIO,
    ),
    Line(
        "vs_txn_100ms",
        _vs("transactional producer, 1 KB records, a transaction every 100 ms"),
        "kafka",
        _ratio("txn_100ms"),
        RATIO,
    ),
    Line(
        "kip98_txn_100ms",
        "kip98: transactional producer (100 ms) / idempotent producer, 1 KB records",
        "kafka",
        _within("kip98"),
    ),
    Line(
        "kafka_txn_100ms",
        "Kafka: transactional producer (100 ms) / idempotent producer, 1 KB records",
        "kafka",
        _within("kafka"),
    ),
    Line(
        "vs_consume",
        _vs("read_committed consumer, 1 KB records"),
        "kafka",
        _ratio("consume"),
        RATIO,
    ),
    Line(
        "kip98_consume",
        "kip98: read_committed consumer, 1 KB records: records/s",
        "kafka",
        _rate("consume", "kip98"),
        PER_S,
    ),
    Line(
        "kafka_consume",
        "Kafka: read_committed consumer, 1 KB records: records/s",
        "kafka",
        _rate("consume", "kafka"),
        PER_S,
    ),
    Line(
        "kip98_e2e_p50",
        "kip98: end-to-end latency (acks=all, read_committed) p50 (ms)",
        "kafka",
        _latency("kip98", "p50_ms"),
        "{:.0f}",
    ),
    Line(
        "kafka_e2e_p50",
        "Kafka: end-to-end latency (acks=all, read_committed) p50 (ms)",
        "kafka",
        _latency("kafka", "p50_ms"),
        "{:.0f}",
    ),
    Line(
        "kip98_e2e_p99",
        "kip98: end-to-end latency p99 (ms)",
        "kafka",
        _latency("kip98", "p99_ms"),
        "{:.0f}",
    ),
    Line(
        "kafka_e2e_p99",
        "Kafka: end-to-end latency p99 (ms)",
        "kafka",
        _latency("kafka", "p99_ms"),
        "{:.0f}",
    ),
    Line(
        "vs_e2e_mean",
        "end-to-end latency, mean: kip98's / Kafka's (lower is better)",
        "kafka",
        lambda m: m["latency"]["kip98"]["mean_ms"] / m["latency"]["kafka"]["mean_ms"],
    ),
    Line("vs_txn_1", _vs("one-record transactions per second"), "kafka", _ratio("txn_1"), RATIO),
    Line(
        "kip98_txn_1",
        "kip98: one-record transactions per second",
        "kafka",
        _rate("txn_1", "kip98"),
        PER_S,
    ),
    Line(
        "kafka_txn_1",
        "Kafka: one-record transactions per second",
        "kafka",
        _rate("txn_1", "kafka"),
        PER_S,
    ),
    Line(
        "vs_p100_relaxed",
        _pair("kip98_relaxed", KAFKA, "producer, 100 B records, acks=all, idempotent"),
        "kafka",
        _ratio("p100_idem", ours="relaxed"),
        RATIO,
    ),
    Line(
        "vs_p100_flushed",
        _pair("kip98_durability", KAFKA_FLUSHED, "producer, 100 B records, acks=all, idempotent"),
        "kafka",
        _ratio("p100_idem", theirs="flushed"),
        RATIO,
    ),
    Line(
        "vs_txn_1_relaxed",
        _pair("kip98_relaxed", KAFKA, "one-record transactions per second"),
        "kafka",
        _ratio("txn_1", ours="relaxed"),
        RATIO,
    ),
    Line(
        "vs_txn_1_flushed",
        _pair("kip98_durability", KAFKA_FLUSHED, "one-record transactions per second"),
        "kafka",
        _ratio("txn_1", theirs="flushed"),
        RATIO,
    ),
    Line(
        "cpu_serve",
        "CPU-seconds per 100,000 records (producer, 100 B, idempotent): kip98 serve",
        "kafka",
        _cpu("serve"),
    ),
    Line(
        "cpu_postgres",
        "CPU-seconds per 100,000 records (producer, 100 B, idempotent): PostgreSQL",
        "kafka",
        _cpu("postgres"),
    ),
    Line(
        "cpu_kafka",
        "CPU-seconds per 100,000 records (producer, 100 B, idempotent): Kafka's JVM",
        "kafka",
        _cpu("kafka"),
    ),
)


def options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--kafka-records", type=int, default=40_000,
                   help="kip98's records per 100 B throughput run of the Kafka lines (a fifth "
                   "for 1 KB)")  # fmt: skip
    p.add_argument("--kafka-scale", type=int, default=4,
                   help="Kafka's throughput runs send this many times kip98's records")  # fmt: skip
    p.add_argument("--kafka-latency-records", type=int, default=300)
    p.add_argument("--kafka-txns", type=int, default=200, help="one-record transactions per side")
    p.add_argument("--kafka-profile", type=Path, metavar="FILE",
                   help="profile kip98 serve (py-spy) on an extra 100 B producer run; its raw "
                   "stacks go to FILE")  # fmt: skip


SECTION = Section(
    "kafka",
    {"kafka": kafka},
    LINES,
    reading=(KAFKA_READING,),
    core=False,
    default=False,
    options=options,
)
