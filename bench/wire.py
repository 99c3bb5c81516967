"""Kafka clients through ``kip98 serve``: what the wire costs a Kafka client, as ratios to
the native client in the same run.

The native Producer and Consumer call the broker in process; a Kafka client (librdkafka,
through confluent-kafka) reaches the very same handlers through ``kip98 serve``. Both
sides here are given the same rows and the same settings (an idempotent producer with
``linger.ms`` 5, a read_committed consumer reading from offset 0), so a ratio shows what
the server adds or saves: frames, record batches and a socket on one side, the native
client's Python per record on the other.
"""

from __future__ import annotations

import statistics
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import confluent_kafka as ck

from app.broker import Broker
from app.client import Consumer, Producer, TopicPartition
from app.log.topics import create_topic
from app.server.process import ServeProcess
from bench.database import fresh_database, settle
from bench.section import SPREAD, Line, Measured, Run, Section, console
from bench.timing import process_cpu_s

Rows = Sequence[tuple[bytes, bytes]]
PRODUCER = {"enable.idempotence": True, "linger.ms": 5}
CONSUMER = {
    "group.id": "bench-wire",
    "isolation.level": "read_committed",
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
}


def _produce_all(
    produce: Callable[[bytes, bytes], None], poll: Callable[[], Any], data: Rows
) -> None:
    for key, value in data:
        while True:
            try:
                produce(key, value)
                break
            except BufferError:
                poll()


def native_produce(url: str, topic: str, data: Rows) -> float:
    """Seconds for the native idempotent Producer to produce ``data`` to partition 0 and
    have every record acknowledged."""
    p = Producer({"database.url": url, **PRODUCER})
    try:
        return _timed_produce(p, topic, data)
    finally:
        p.close()


def wire_produce(bootstrap: str, topic: str, data: Rows) -> float:
    """The same through ``kip98 serve``, by librdkafka's idempotent producer."""
    return _timed_produce(ck.Producer({"bootstrap.servers": bootstrap, **PRODUCER}), topic, data)


def _timed_produce(p: Any, topic: str, data: Rows) -> float:
    """Both producers have confluent-kafka's API: produce, poll, flush, delivery reports."""
    errors: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)

    start = time.perf_counter()
    _produce_all(
        lambda k, v: p.produce(topic, v, k, partition=0, on_delivery=report),
        lambda: p.poll(0.01),
        data,
    )
    assert p.flush(120) == 0
    elapsed = time.perf_counter() - start
    assert not errors, errors[:3]
    return elapsed


def native_consume(url: str, topic: str, expected: int) -> float:
    """Seconds for a read_committed native Consumer to read partition 0 from offset 0 up
    to ``expected`` records."""
    c = Consumer({"database.url": url, **CONSUMER})
    try:
        c.assign([TopicPartition(topic, 0, 0)])
        return _consume_all(lambda: c.consume(1000, timeout=5), expected)
    finally:
        c.close()


def wire_consume(bootstrap: str, topic: str, expected: int) -> float:
    """The same through ``kip98 serve``, by librdkafka's consumer."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, **CONSUMER})
    try:
        c.assign([ck.TopicPartition(topic, 0, 0)])
        return _consume_all(lambda: c.consume(1000, timeout=5), expected)
    finally:
        c.close()


def _consume_all(consume: Callable[[], list[Any]], expected: int) -> float:
    n = 0
    start = time.perf_counter()
    while n < expected:
        msgs = consume()
        if not msgs:
            raise RuntimeError(f"{n} of {expected} records read, then nothing for 5 s")
        n += sum(1 for m in msgs if m.error() is None)
    return time.perf_counter() - start


def wire_latency(bootstrap: str, topic: str, samples: int) -> tuple[float, float]:
    """Produce → returned by an idle read_committed consumer's poll, through ``kip98 serve``
    (ms, p50 and p99): one record at a time from a producer with ``linger.ms`` 0, each
    acknowledged before the next, 50 ms apart as the native latency figure has them."""
    c = ck.Consumer({"bootstrap.servers": bootstrap, **CONSUMER, "fetch.wait.max.ms": 500})
    c.assign([ck.TopicPartition(topic, 0, 0)])
    p = ck.Producer({"bootstrap.servers": bootstrap, **PRODUCER, "linger.ms": 0})
    sent_at: dict[bytes, float] = {}
    latencies: list[float] = []
    arrived = threading.Event()
    done = threading.Event()

    def reader() -> None:
        while not done.is_set():
            m = c.poll(0.5)
            if m is not None and m.error() is None:
                sent = sent_at.get(m.value() or b"")
                if sent is not None:
                    latencies.append((time.perf_counter() - sent) * 1000)
                arrived.set()

    thread = threading.Thread(target=reader)
    thread.start()
    try:
        # The consumer is connected and fetching before the first sample.
        p.produce(topic, b"warm-up", partition=0)
        assert p.flush(30) == 0
        if not arrived.wait(30):
            raise RuntimeError("the consumer never received the warm-up record")
        for i in range(samples):
            value = f"v{i}".encode()
            sent_at[value] = time.perf_counter()
            p.produce(topic, value, partition=0)
            assert p.flush(30) == 0
            time.sleep(0.05)
        deadline = time.monotonic() + 10
        while len(latencies) < samples and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        done.set()
        thread.join()
        c.close()
    qs = statistics.quantiles(latencies, n=100)
    return statistics.median(latencies), qs[98]


# ---------------------------------------------------------------- the case


def _sides(i: int) -> tuple[str, str]:
    """Which side leads round ``i``: each leads every other round."""
    return ("native", "wire") if i % 2 == 0 else ("wire", "native")


def wire(run: Run) -> Measured:
    """Kafka clients (librdkafka, through confluent-kafka) against a ``kip98 serve`` process
    on the same database, against the native clients: rounds in which the two sides take
    turns to lead."""
    data, rounds = run.data, run.settings.wire_rounds
    n = len(data)
    with console.status("Kafka clients through kip98 serve: produce"):
        produced = []
        # CPU-seconds per round: the bench process's (the native Producer with the broker
        # in it; or the Kafka client, librdkafka's threads included) and kip98 serve's.
        cpu: dict[str, list[float]] = {"native": [], "client": [], "serve": []}
        for i in range(rounds):
            times = {}
            for side in _sides(i):  # each side on a fresh database
                with fresh_database(run.server) as url:
                    create_topic(Broker.connect(url), "w", 1)
                    if side == "native":
                        settle(url)
                        mine = time.process_time()
                        times[side] = native_produce(url, "w", data)
                        cpu["native"].append(time.process_time() - mine)
                    else:
                        with ServeProcess(url) as serve:
                            assert serve.proc is not None
                            pid = serve.proc.pid
                            settle(url)
                            mine, theirs = time.process_time(), process_cpu_s(pid)
                            times[side] = wire_produce(serve.address, "w", data)
                            cpu["client"].append(time.process_time() - mine)
                            cpu["serve"].append(process_cpu_s(pid) - theirs)
            produced.append((times["native"], times["wire"]))
        run.results["wire_produce_rounds_s"] = produced
    with (
        console.status("Kafka clients through kip98 serve: read_committed consume"),
        fresh_database(run.server) as url,
        ServeProcess(url) as serve,
    ):
        create_topic(Broker.connect(url), "w", 1)
        native_produce(url, "w", data)
        settle(url)  # the first reader of fresh rows sets their hint bits: neither side
        consumed = []
        for i in range(rounds):
            times = {}
            for side in _sides(i):
                if side == "native":
                    times[side] = native_consume(url, "w", n)
                else:
                    times[side] = wire_consume(serve.address, "w", n)
            consumed.append((times["native"], times["wire"]))
        run.results["wire_consume_rounds_s"] = consumed
    with (
        console.status("Kafka clients through kip98 serve: latency"),
        fresh_database(run.server) as url,
        ServeProcess(url) as serve,
    ):
        create_topic(Broker.connect(url), "lat", 1)
        p50, p99 = wire_latency(serve.address, "lat", run.settings.latency_samples)
    return {
        "records": n,
        "produced": sorted(native / through for native, through in produced),
        "produced_s": produced,
        "cpu": cpu,
        "consumed": sorted(native / through for native, through in consumed),
        "p50_ms": p50,
        "p99_ms": p99,
    }


# ---------------------------------------------------------------- notes (docs/benchmarks.md)

WIRE_READING = """\
Kafka-client lines (`--only wire`): the same rows produced to one partition by
librdkafka's idempotent producer (confluent-kafka, `linger.ms` 5, its other defaults)
through a `kip98 serve` process the bench starts on the same database, and by the native
idempotent Producer with the same settings, each side on a fresh database, taking turns
to lead over `--wire-rounds` rounds; the figure is the median of the rounds' ratios, with
the lowest and highest round beside it. The consumer line reads the same committed
records from offset 0 (`assign()`, read_committed) with librdkafka through the server
and with the native Consumer, in alternating rounds over one database. The latency lines
time a record from a confluent producer's `produce()` (`linger.ms` 0, each record
acknowledged before the next, 50 ms apart) to an idle confluent read_committed
consumer's poll, both through the server. The CPU lines give, per 100,000 records
produced, the CPU-seconds of the bench's own process (the native Producer, with the
broker in it; or the confluent-kafka producer, librdkafka's threads included) and of
the `kip98 serve` process, median of the rounds."""

WIRE_NOTE = """\
**Kafka clients through `kip98 serve` (targets 1.0 and 0.8).** librdkafka's idempotent
producer keeps one ProduceRequest in flight per partition, so a produce costs one round
trip per batch of ~1 MB (~7,900 of these records): the server reads the batch (under
1 µs a record) and appends it with the same COPY and commit as the native Producer.
The producer ratio is 0.53 (0.53-0.54) (librdkafka ~151,000 records/s, the native
Producer ~279,000 on one partition, which 0.17.0 made a sixth faster: see the Producer
line; 0.52 in 0.18.0's table; 0.67 with ~131,000 and ~194,000 in 0.16.0's table, 0.65 with ~142,000 and
~222,000 in 0.15.0's; librdkafka was ~103,000-128,000 when this ratio was 0.79-1.34).
A switch interval of 0.5 ms in `kip98 serve` (its asyncio loop and its workers share
one lock) changed nothing: ~146,000 records/s either way. A librdkafka batch on one partition goes the one-query
way through the server too, in one COPY (its ~7,900 rows are past where cutting pays):
`kip98 serve` spends 0.15 CPU-seconds per 100,000 records (0.18 in 0.16.0's table,
0.11 in 0.13.0's).
The Kafka client is what takes the time: per 100,000 records its own process spends
0.46 CPU-seconds (librdkafka's threads, confluent-kafka's calls and a Python
callback per record), more than the native Producer's whole process with the broker
in it (0.31), while `kip98 serve` spends 0.16 and, sampled (py-spy), its
worker is idle about half the run, waiting for the client's next request. A librdkafka
producer whose queue is not the default 100,000 records (1,000,000) takes a quarter
less time: the client's own flow. A fetch cuts at `max_bytes` in the partition query, sizes its
later reads by the bytes per offset seen, reads a batch's fields once per batch and
builds record batches column by column; librdkafka keeps one fetch in flight, so the
server's reading and the client's work do not overlap. **The consumer ratio is 0.81
(0.71-0.84; single rounds 0.70-1.10; 0.80 in 0.18.0's table, 0.73 in 0.17.0's, 0.75 in 0.16.0's, 0.72 in
0.15.0's, the path unchanged), at its target of 0.8 on this table's median but not on
every run, because the native Consumer it is divided by got faster in 0.15.0**: a native fetch whose window fits max_bytes is
now read without the running sum (see the read_committed Consumer line), 0.39-0.45 s
→ 0.30-0.37 s for the 200,000 records, while librdkafka through the server takes the
same 0.42-0.46 s as in 0.14.0's table (0.40-0.46 s). A wire fetch fills ~1 MB from
windows sized by the bytes per offset read so far, each after a look that sums the
window's sizes (the same plain sum the native fetch now makes); sampled (py-spy),
the server's fetch spends about as long in that look as in reading the records. The
way on is to cut at max_bytes without a pass over the window's rows (a byte position
kept per record, as Kafka's offset index keeps one); it is not built. A record goes from `produce()` to a consumer's poll in
about 3-5 ms at the median and 5-10 ms at p99: a produce through the server ends the long
poll of a fetch waiting there at once."""


# ---------------------------------------------------------------- the lines


def _cpu(key: str) -> Callable[[Measured], float]:
    """CPU-seconds per 100,000 records produced by one process, median of the rounds."""
    return lambda m: statistics.median(m["cpu"][key]) * 100_000 / m["records"]


def _rate(side: int) -> Callable[[Measured], float]:
    """Records per second of one side of the produce rounds, at their median time."""
    return lambda m: m["records"] / statistics.median(r[side] for r in m["produced_s"])


LINES = (
    Line(
        "wire_producer",
        "confluent-kafka idempotent producer through kip98 serve / native idempotent Producer",
        "wire",
        lambda m: statistics.median(m["produced"]),
        target=">= 1.0",
        note=WIRE_NOTE,
    ),
    Line(
        "wire_producer_spread",
        "the same (producers), lowest and highest round",
        "wire",
        lambda m: (m["produced"][0], m["produced"][-1]),
        SPREAD,
    ),
    Line(
        "native_rate",
        "native idempotent Producer records/s (median of rounds)",
        "wire",
        _rate(0),
        "{:,.0f}",
    ),
    Line(
        "wire_rate",
        "confluent-kafka producer records/s (median of rounds)",
        "wire",
        _rate(1),
        "{:,.0f}",
    ),
    Line(
        "native_cpu",
        "CPU-seconds per 100,000 records produced: the native Producer's process (broker "
        "in it), median of rounds",
        "wire",
        _cpu("native"),
    ),
    Line(
        "client_cpu",
        "CPU-seconds per 100,000 records produced: the confluent-kafka producer's process, "
        "median of rounds",
        "wire",
        _cpu("client"),
    ),
    Line(
        "serve_cpu",
        "CPU-seconds per 100,000 records produced: kip98 serve's process, for that "
        "producer, median of rounds",
        "wire",
        _cpu("serve"),
    ),
    Line(
        "wire_consumer",
        "confluent-kafka read_committed consumer through kip98 serve / native Consumer",
        "wire",
        lambda m: statistics.median(m["consumed"]),
        target=">= 0.8",
    ),
    Line(
        "wire_consumer_spread",
        "the same (consumers), lowest and highest round",
        "wire",
        lambda m: (m["consumed"][0], m["consumed"][-1]),
        SPREAD,
    ),
    Line(
        "wire_latency_p50",
        "confluent-kafka produce -> read_committed poll through kip98 serve p50 (ms)",
        "wire",
        lambda m: m["p50_ms"],
        "{:.1f}",
    ),
    Line(
        "wire_latency_p99",
        "confluent-kafka produce -> read_committed poll through kip98 serve p99 (ms)",
        "wire",
        lambda m: m["p99_ms"],
        "{:.1f}",
    ),
)

SECTION = Section("wire", {"wire": wire}, LINES, reading=(WIRE_READING,), core=False)
