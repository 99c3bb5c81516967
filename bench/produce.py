"""Produce: the handler against its floors, the idempotent Producer, in-flight requests, acks.

Every figure is a ratio to PostgreSQL doing the same rows in the same run (a raw COPY, or
a floor of ``bench.floors``), or to another kip98 path; each case on a fresh database.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import statistics
import time
import uuid
from collections.abc import Callable
from typing import Any

from app.broker import Broker
from app.broker.produce import produce as produce_handler
from app.client import Producer
from app.coordinator.producer_id import init_producer_id
from app.log.topics import create_topic
from app.protocol import InitProducerIdRequest, ProduceRequest, RecordIn
from app.storage.engine import dispose_engines
from bench import consume
from bench.data import rows
from bench.database import fresh_database
from bench.floors import raw_copy, raw_copy_batched, records_copy, records_copy_side_by_side
from bench.section import SPREAD, Line, Measured, Run, Section, console
from bench.timing import best_of, timed


def handler_produce(
    url: str, data: list[tuple[bytes, bytes]], batch: int, topic: str = "h"
) -> float:
    broker = Broker.connect(url)
    create_topic(broker, topic, 1)
    ident = init_producer_id(broker, InitProducerIdRequest(None, 60_000))
    batches = [
        [RecordIn(k, v, 0) for k, v in data[i : i + batch]] for i in range(0, len(data), batch)
    ]

    def run() -> None:
        seq = 0
        for recs in batches:
            r = produce_handler(
                broker,
                ProduceRequest(topic, 0, recs, ident.producer_id, ident.producer_epoch, seq),
            )
            assert r.error_code == 0, r
            seq += len(recs)

    return timed(run, url)


def client_produce(
    url: str,
    data: list[tuple[bytes, bytes]],
    batch: int,
    topic: str = "c",
    partitions: int = 1,
    partition: int = 0,
    config: dict[str, Any] | None = None,
) -> float:
    broker = Broker.connect(url)
    try:
        create_topic(broker, topic, partitions)
    except Exception:
        pass
    p = Producer(
        {"database.url": url, "batch.num.messages": batch, "linger.ms": 50, **(config or {})}
    )
    errors: list[Any] = []

    def report(err: Any, msg: Any) -> None:
        if err is not None:
            errors.append(err)

    def run() -> None:
        for k, v in data:
            while True:
                try:
                    p.produce(topic, v, k, partition=partition, on_delivery=report)
                    break
                except BufferError:
                    p.poll(0.01)
        assert p.flush(120) == 0

    t = timed(run, url)
    p.close()
    assert not errors, errors[:3]
    return t


def _producer_process(url: str, partition: int, n: int, batch: int, out: Any) -> None:
    data = rows(n)
    out.put(client_produce(url, data, batch, topic="par", partitions=4, partition=partition))


def parallel_produce(url: str, n: int, batch: int, producers: int) -> float:
    create_topic(Broker.connect(url), "par", 4)
    dispose_engines()
    ctx = mp.get_context("spawn")
    out: Any = ctx.Queue()
    per = n // producers
    procs = [
        ctx.Process(target=_producer_process, args=(url, i, per, batch, out))
        for i in range(producers)
    ]
    start = time.perf_counter()
    for proc in procs:
        proc.start()
    for proc in procs:
        proc.join()
    elapsed = time.perf_counter() - start
    assert all(proc.exitcode == 0 for proc in procs)
    return elapsed


def idempotent_spread(
    url: str,
    data: list[tuple[bytes, bytes]],
    partitions: int = 4,
    in_flight: int | None = None,
    flush_every: int | None = None,
    cpu: list[float] | None = None,
    topic: str | None = None,
) -> float:
    """The idempotent Producer over ``partitions`` partitions of a new topic (``topic``, or
    a name of its own); with ``flush_every``, the application waits for its records to be
    acknowledged every so many, as a transaction's commit makes it wait (the floor of the
    transactional line). ``cpu`` as ``timed``'s."""
    topic = topic or f"id4-{uuid.uuid4().hex[:6]}"
    create_topic(Broker.connect(url), topic, partitions)
    p = Producer(
        {
            "database.url": url,
            "linger.ms": 50,
            "batch.num.messages": 1000,
            **({} if in_flight is None else {"max.in.flight": in_flight}),
        }
    )

    def run() -> None:
        for i, (k, v) in enumerate(data):
            while True:
                try:
                    p.produce(topic, v, k, partition=i % partitions)
                    break
                except BufferError:
                    p.poll(0.01)
            if flush_every and (i + 1) % flush_every == 0:
                assert p.flush(120) == 0
        assert p.flush(120) == 0

    t = timed(run, url, cpu)
    p.close()
    return t


def produce_phases(server: str, data: list[tuple[bytes, bytes]], repeats: int) -> dict[str, float]:
    """The best of ``repeats`` of the handler produce and of the floors it is divided by,
    each phase on a fresh database (none COPYs into a ``records`` the others filled), the
    phases' order reversed every other repeat."""
    phases: dict[str, Callable[[str], float]] = {
        "floor": lambda url: records_copy(url, data, 1000),
        "handler": lambda url: handler_produce(url, data, 1000),
        "sql": lambda url: records_copy(url, data, 1000, sql=True),
        "encoded": lambda url: records_copy(url, data, 1000, sql=True, encode=True),
    }
    best = dict.fromkeys(phases, float("inf"))
    for r in range(repeats):
        for name in phases if r % 2 == 0 else reversed(phases):
            with fresh_database(server) as url:
                best[name] = min(best[name], phases[name](url))
    return best


# ---------------------------------------------------------------- cases


def handler(run: Run) -> Measured:
    """The raw COPYs, the Produce handler and the floors it is divided by."""
    data, repeats = run.data, run.settings.repeats
    with console.status("raw COPY and idempotent produce"):
        with fresh_database(run.server) as url:
            copy_s = best_of(repeats, lambda: raw_copy(url, data))
            batched_s = best_of(repeats, lambda: raw_copy_batched(url, data, 1000))
        run.results["raw_copy_rows_per_s"] = len(data) / copy_s
        return {
            "copy_s": copy_s,
            "batched_s": batched_s,
            **produce_phases(run.server, data, repeats),
        }


def client1000(run: Run) -> Measured:
    """The idempotent Producer in batches of 1000 against the raw COPY and the handler on
    the same database; then its rows read back (``bench.consume``'s lines)."""
    data, repeats = run.data, run.settings.repeats
    with console.status("client produce, batch 1000"), fresh_database(run.server) as url:
        copy_s = best_of(repeats, lambda: raw_copy(url, data))
        handler_s = handler_produce(url, data, 1000)
        client_s = client_produce(url, data, 1000)
        run.results["idempotent_rows_per_s"] = len(data) / client_s
        reads = consume.read_back(url, "c", len(data), repeats)
    return {"copy_s": copy_s, "handler_s": handler_s, "client_s": client_s, **reads}


def client100(run: Run) -> Measured:
    """The idempotent Producer in batches of 100 against the raw COPY."""
    data = run.data
    with console.status("client produce, batch 100"), fresh_database(run.server) as url:
        copy_s = best_of(run.settings.repeats, lambda: raw_copy(url, data))
        return {"copy_s": copy_s, "client_s": client_produce(url, data, 100)}


def parallel(run: Run) -> Measured:
    """Four Producer processes, a partition each, against one."""
    n = run.settings.records
    with console.status("4 producers on 4 partitions"), fresh_database(run.server) as url:
        one = parallel_produce(url, n, 1000, 1)
    with fresh_database(run.server) as url:
        four = parallel_produce(url, n, 1000, 4)
    return {"one_s": one, "four_s": four}


def inflight(run: Run) -> Measured:
    """The same rows over 4 partitions, five requests in flight (a lane per partition)
    against one; rounds alternate which side leads, each side on a fresh database."""
    data, settings = run.data, run.settings
    with console.status("idempotent producer, in-flight 5 and 1"):
        rounds, ceilings = [], []
        cores = os.cpu_count() or 1
        for i in range(settings.inflight_rounds):
            times: dict[int, float] = {}
            cpu: dict[int, list[float]] = {}
            for side in (5, 1) if i % 2 == 0 else (1, 5):
                with fresh_database(run.server) as url:
                    cpu[side] = []
                    times[side] = idempotent_spread(url, data, in_flight=side, cpu=cpu[side])
            rounds.append((times[1], times[5]))
            # In-flight 5 can finish no sooner than its CPU-seconds spread over every
            # core: the most it could gain on this machine, doing the work it does.
            ceilings.append(times[1] / (cpu[5][0] / cores))
        run.results["inflight_rounds_s"] = rounds
        with fresh_database(run.server) as url:
            together = best_of(
                settings.repeats, lambda: records_copy_side_by_side(url, data, 4, False)
            )
            apart = best_of(settings.repeats, lambda: records_copy_side_by_side(url, data, 4, True))
    return {
        "records": len(data),
        "rounds": rounds,
        "ratios": [one / five for one, five in rounds],
        "ceilings": ceilings,
        "together_s": together,
        "apart_s": apart,
    }


def acks(run: Run) -> Measured:
    """A plain producer (no idempotence) with acks all, 1 and 0: acks=1 and acks=0 commit
    with synchronous_commit local and off, Kafka's weaker acknowledgements."""
    acks_s = {}
    with console.status("acks all, 1 and 0"):
        for level in ("all", "1", "0"):
            with fresh_database(run.server) as url:
                extra = {"enable.idempotence": False, "acks": level}
                acks_s[level] = client_produce(url, run.data, 1000, config=extra)
    return {"acks_s": acks_s}


# ---------------------------------------------------------------- notes (docs/benchmarks.md)

RAW_COPY_READING = """\
"raw COPY" is one binary COPY of the same rows (16-byte keys, 100-byte values) into a
bare table without indexes, in one transaction. A produce commits once per batch (each
acknowledged batch is durable, as with Kafka's acks=all), keeps a primary key, and
validates and advances producer state in the same transaction; the "raw COPY, one
commit per 1000 rows" line shows how much of the gap is the commits alone. The produce's
floor COPYs the very rows a produce writes (every column of `records`, encoded as the
handler encodes them, beforehand) into `records` itself, each batch its own
transaction (autocommit), its rows cut into three COPYs sent as one query string, as
the handler cuts them (docs/design.md §3.10: the way that costs the server least, in
the fewest round trips PostgreSQL allows): the table and the commits, no produce logic.
"The produce's SQL alone" adds, in each of those transactions, the statement a produce
runs beside its COPYs while its process remembers the partition row (docs/design.md
rule 32), sent as the handler sends a lone batch's (prepared, then `EXECUTE` and the
COPYs in one query string, §3.9), with values known
in advance: the partition and the producer's state advanced if the row is still the
version the previous batch wrote. What is left between it and the handler is kip98's
Python. "Its rows encoded in the loop" adds the one piece of that Python no produce can
skip: each batch's rows encoded from the records it is given (as the handler encodes
them, at the offsets the row tells). Between that and the handler are the produce's
decisions (shape and size checks, ACLs, the sequence rules) and SQLAlchemy's
connection (pool checkout and check-in; a produce whose one query string commits
itself starts no SQLAlchemy transaction, `storage.engine.lazy_transaction`)."""

INFLIGHT_READING = """\
The in-flight line (`--only inflight`) times the idempotent Producer over 4 partitions
(`linger.ms` 50, 1000-record batches) with `max.in.flight` 5 (a lane per partition,
four requests committing side by side) against 1 (one request for all four partitions
at a time), each side on a fresh database, `--inflight-rounds` rounds taking turns to
lead; the figure is the median of the rounds' ratios. Its floor does the same with
PostgreSQL alone: the same rows, pre-encoded, COPYed 1000 per partition by four
connections committing side by side against one connection committing each round's
4000 together, each transaction's rows cut into COPYs as the handler cuts a request's
(docs/design.md §3.10: a lane's 1000 in three COPYs, a round's 4000 in one). Its ceiling is the time in-flight 5 would take if it kept every
core of the machine busy with the work it does (the machine's busy CPU-seconds over
the run, client, server and all, from /proc/stat, divided by the cores): in-flight 1's
time over that, median of the rounds."""

ACKS_READING = """\
The acks lines time a plain (non-idempotent) Producer with `acks=1` and `acks=0`
against `acks=all`, each on a fresh database: the weaker acknowledgements commit with
`synchronous_commit` local and off, so they gain what a commit's WAL flush costs."""

HANDLER_NOTE = """\
**Handler produce vs its floor (target 0.8): 0.87 (0.81-0.94) in 0.22.0's table, 0.83
(0.80-0.85) in 0.20.0's, at the target on the median (0.80 in 0.19.0's, 0.79 in
0.18.0's).** 0.22.0's transactional one-query path (docs/design.md §3.12) adds to an
idempotent request one check of its batches' transactional ids. 0.20.0 watches every
engine for sessions stalled by a stopped client (docs/design.md rule 34) and bounds each
commit's wait for standbys (rule 41); measured the same day, `--only handler --runs 3`,
the commit before the watch gave 0.81 (0.79-0.82) and 0.20.0 0.86 (0.83-0.86): the
produce path did not get slower. In 0.19.0
a produce's DB transaction begins with its first statement
(`storage.engine.lazy_transaction`), so a batch on a remembered row, whose query
string commits itself, no longer starts and ends SQLAlchemy's transaction around it
(its connection's checkout to check-in 76 → 63 µs a batch, timed in place: the
batch's rows have pushed SQLAlchemy's objects out of the CPU caches, and the same
calls timed alone cost a third of that), and a COPY piece within one batch copies the
batch's parts once instead of twice (~11 µs). The handler's thread, measured side by
side (eight alternating runs against 0.18.0): 834 → 818 µs of CPU a 1000-record
batch; its wall time, ~3.35 ms a batch, moved less than the machine's noise. The
handler waits on the server ~2.6 ms of its ~3.3 ms a batch; of its ~0.65 ms of Python
outside those waits, ~0.43 ms is the rows' encoding (which the "encoded in the loop"
floor pays too), the rest is spread thin over the decision (~45 µs), the request's
bookkeeping and the connection (~60 µs). Measured and not kept in 0.19.0: the batch
transposed without `zip`'s iterator per record (no garbage collection a batch, but no
faster: the columns cost the same to gather), a timestamps' maximum taken with their
minimum (only a broker-stamped batch gains). Against a floor ~10% faster
than 0.13.0's (0.81 then, 0.77 in 0.12.0's table against a slower floor still, 0.68
before rule 32); against the committed raw COPY the handler went from 0.63 to 0.71. A 1000-row COPY spends ~1 ms of the server's CPU on the bookkeeping of the
rows it buffers, growing with their square (docs/design.md §3.10, measured with perf
and by timing the backend against rows per COPY: ~0.16 ms per COPY and commit, ~1 ns
per pair of buffered rows, ~1.55 µs per row); the handler now sends a 1000-record
batch as three COPYs in its one query string, 3.8 → 3.4 ms a batch (its backend's CPU
down a sixth), and the floor, which must be the cheapest way PostgreSQL takes these
rows, does the same: its batches went from 3.05 to ~2.75 ms, a little more in
proportion than the handler's, hence the line at its target rather than above it. The
floor COPYs the produce's rows, encoded beforehand, into `records`, each batch its own
transaction in one query string: the fewest round trips PostgreSQL allows. (It used
to be BEGIN, the COPY and COMMIT, four round trips; once the handler took two, that
floor was slower than the handler and no floor.) A produce must also advance the partition row and the producer's state (what
makes offsets gapless and duplicates detectable, rules 4, 5 and 13), decide on that
state, and encode the rows it was given. While one producer writes a partition, the
process remembers the row as its last append left it and decides on that (rule 32);
a request that is that one batch now sends the advance, prepared once per connection,
and the COPY as one query string, which PostgreSQL runs as one implicit transaction
and commits as the COPY ends (docs/design.md §3.9): a batch costs two round trips
instead of five (BEGIN, the advance, the COPY's start, its end, COMMIT), 4.15 ms →
3.77 ms a 1000-record batch here (0.13.0). PostgreSQL running that query string with
values known in advance costs no more than the floor, 1.01 (0.99-1.01): the advance is
free once it travels with the COPYs. With the rows encoded in the loop, 0.86
(0.86-0.88): encoding from records the process made long before costs ~0.45 ms a
batch, half of it memory (the same batch encoded again, its records in the cache,
takes ~0.25 ms). The handler reaches 0.93 of that; the rest, ~0.2 ms, is its decisions and SQLAlchemy's
transaction (checkout, the BEGIN event, a commit with nothing left to commit,
check-in). Measured and not kept: the rows encoded while the server runs the advance
(the query sent first, its answer read after): 3.6 ms a batch, this line 0.85
(0.84-0.87), the idempotent Producer / handler 0.75 and in-flight 1.17 over three full
runs, the sender's answer being in when it asks and its thread not waiting for the
interpreter lock once more; but from the advance on the session holds the partition
row and waits for the COPY's data, which no PostgreSQL timeout bounds (a
`statement_timeout` is only acted on when the data comes), so a process paused in
those ~0.3 ms would stall the partition's other writers until it resumed, a window
rule 24 keeps to the hand-over of a payload already encoded. The rows encoded and
written in chunks of 100-250, so PostgreSQL parses one while the next is encoded (no
gain in alternating A/B runs: with the client writing in pieces the backend waits for
data between them, and the COPY took longer by what the overlap saved); the advance
sent in psycopg's pipeline mode while the rows are encoded (psycopg syncs after BEGIN
and at the pipeline's end, two round trips for the one it hides); a batch's integers
packed with the prefix in one `struct` call per record, four parts a record instead of
five (no gain: the call per record is the cost)."""

PRODUCER_NOTE = """\
**Idempotent Producer vs handler produce (target 0.6): 0.71 (0.69-0.76; 0.73 in
0.18.0's and 0.17.0's tables)**, from 0.64 in 0.16.0's table (0.63 in 0.14.0's, 0.68 in 0.13.0's; 0.44-0.55 before 0.10.0). In
0.17.0 `produce()` gives the interpreter lock to the sender's threads at most once a
millisecond while a request is out (docs/design.md §8, `client/handoff.py`): CPython
hands the lock from a thread that computes to one that waits for it only after its 5
ms switch interval, and the application's `produce()` loop never gave it up on its own,
so each answered request waited up to 5 ms before the sender could serve it and send
the next, about as long as the request itself. `time.sleep(0)` is the call that hands
it over (it sleeps the kernel's timer slack, ~60-80 µs here); `os.sched_yield()` and a
zero-timeout `select` release the lock and take it back before the waiter wakes, and
the waiter, seeing the lock change hands, waits a whole interval again (measured: its
wake-up latency grew from 5 ms to ~400 ms). Measured side by side (five alternating
runs of each, with and without): one partition, 1000-record batches 1.00 → 0.86 s for
200,000 records; four partitions on one lane 0.84 → 0.67 s, on four lanes 0.80 → 0.73
s; transactions of 1000 records and the idempotent Producer flushing every 1000
unchanged (1.19-1.20 s and 1.08 s: no request is out while their application
produces). Handing off every half millisecond gained one lane 3% more and cost four
lanes 8%; a switch interval of 0.5 ms for the whole process gained a tenth, and would
change it for the application too. `produce()` queues a record
as one plain tuple (key, value, timestamp, stored headers) in its partition's current
run, columns of records, callbacks and enqueue times cut at a batch's limits as they
arrive, with one lock and one call into the accumulator: about 1.4 µs of CPU a
record, from 3.7. Half of the old cost was the garbage collector: an object per record
(a dataclass holding the callback, a NamedTuple) stays tracked, and with up to 100,000
records queued its full collections walked them all again each time the queue grew by
a quarter; a plain tuple of bytes and ints is untracked at its first look. Delivery
reports are counted out with one lock per poll and their messages built in one
positional call, only for records with a callback (~0.3 µs a record). What remains is
the sender's own work sharing the GIL with the application's thread, and PostgreSQL
sharing the 2 CPUs with both."""

INFLIGHT_NOTE = """\
**In-flight 5 / in-flight 1 (target 1.5): 0.97 (0.97-1.02; 0.98 in 0.18.0's and
0.17.0's tables, 1.04 in 0.16.0's); PostgreSQL alone 1.26 (1.21-1.27; 1.30 in 0.18.0's,
1.24 in 0.17.0's, 1.38 in 0.16.0's), below the target; the ceiling on this machine
1.23 (1.22-1.26; 1.22, 1.22, 1.47), below it too.** Measured in 0.19.0 (three
alternating runs): the machine's busy CPU 0.89-0.93 CPU-seconds a run with one lane,
1.14-1.20 with four, the client's process 0.48-0.52 and 0.58-0.63 of them; with four
lanes the machine is 79-84% busy, PostgreSQL's share 40% more for the same rows
(four commits and twelve COPYs where one lane sends one of each). Both sides got faster in 0.17.0,
one lane more: ~279,000 and ~279,000 records/s (~195,000 and ~202,000 in 0.16.0's
table, on a machine ~15% slower), the application's `produce()` now handing the
interpreter lock to the sender while a request is out (see the line above). With the
client no longer waiting 5 ms for the lock after each answer, it is what the machine's
two cores have to share: five lanes commit four times as often, each request costing
the client ~0.6 ms and the server more of their fixed work (the client's process 0.49
CPU-seconds a run with one lane, 0.60 with four), and the ceiling, all of the
machine's work spread over both cores, fell to 1.22. Measured side by side in 0.17.0
(three runs each): one lane 0.661 s, two lanes 0.641 s, three 0.669 s, four (five in
flight) 0.724 s; the garbage collector off, one lane 0.654 s and four 0.671 s. In 0.15.0 the line fell from 1.09 because in-flight 1 got faster: its requests, each the four
partitions' batches on rows the process remembers, now go as one query string, the
four advances and the COPY, committed as the COPY ends (docs/design.md §3.9, extended
from the lone batch), where they took BEGIN, the lock's read, the COPY, the advance
and COMMIT: 1000 records over four partitions 5.2 → 3.9 ms in the handler, in-flight 1
0.93-0.99 s → 0.86-0.87 s measured side by side (A/B, two runs of three rounds), while
in-flight 5, whose lanes already sent a lone batch that way, stayed at 0.81-0.90 s
(now ~235,000 records/s against ~220,000). In 0.14.0 PostgreSQL alone went from
1.62 to 1.29 here: its one-connection side had COPYed each partition's 1000 rows on
their own, four COPYs a transaction, paying the cost a COPY's buffered rows carry
(docs/design.md §3.10) four times, where the Producer's one lane writes a request's
4000 rows in one COPY and pays it once, and was slower than the Producer's own
in-flight 1 writes. Each side writes as the handler does (a round's 4000 rows in one
COPY, a lane's 1000 in three), and four connections gain 1.26 over one: what
PostgreSQL alone, with no client work at all, gains here from overlapping commits.
The Producer reaches 0.84 of that. Its lanes' backends came to spend a sixth less CPU
in 0.14.0 (0.65 → 0.55 CPU-seconds a run), which moved this line little (1.08 →
1.09-1.11): the lanes wait on the client. Until 0.17.0 the
ceiling (the machine's CPU-seconds over the run, spread over both cores) stayed above
the target only because it assumed the client's work overlapped everything else
perfectly, which one interpreter lock does not allow. Lanes send one batch per request, which goes in one
query string (§3.9); lanes that encoded while their advance ran reached 1.17 in 0.13.0
(see the handler line for why they do not). Measured in 0.13.0 (200,000 records): with four lanes each request spends ~16 ms in the
broker, four at a time, against 3.8 ms for one alone; two, three or five lanes all take
0.80-0.88 s; sampled while it holds the interpreter lock, the client spends ~40% of it
in the application's `produce()` calls; a switch interval of 0.5 ms takes one lane from
0.91 to 0.84 s and five from 0.84 to 0.72 s (ratio 1.16). With the application out of
the way (200,000 records queued first, then drained) one lane takes 0.67 s and five
0.57 s (1.18): sampled every millisecond meanwhile, the four backends are on CPU 37% of
the time, waiting for their client 31% (idle between requests 19%, inside the COPY
for its data 12%), and on the WAL and the table's growth about 30% (`IO:WALSync` 11%,
`LWLock:WALBufMapping` 6%, `LWLock:WALWrite` 6%, `Lock:extend` 4%: four COPYs
extending the one `records` heap), where one lane's backend is on CPU 66% of the time.
The analysis below, measured on 0.12.0, still holds in kind. PostgreSQL alone gains from four
connections committing side by side: its backends run on both CPUs and the flushes
merge. The Producer gains less because with one lane a request already carries every
partition's ready batch in one DB transaction, while five lanes commit four times as
often (a request per partition): over a run the machine's work grows from about 1.05 to
1.47 CPU-seconds (the client's process 0.52 to 0.71, PostgreSQL 0.52 to 0.76). Spread
over both cores, that work could take no less than in-flight 1's time over 1.48 (1.44-1.50):
the ceiling line, measured each round from /proc/stat. What keeps the lanes from it is
the client's one interpreter lock: sampled from `pg_stat_activity`, three of the four
backends are on average waiting for their client (`Client:ClientRead`) while the
client's threads use 0.65 s of CPU in a 1.0 s run, each lane's round trip ending in a
wait for the lock the application's `produce()` holds (CPython hands it over every 5
ms). A switch interval of 0.1 ms makes both sides faster (one lane 0.98 to 0.87 s, five
1.03 to 0.94 s), not their ratio; the application giving up the lock every 512 records
makes one lane ~10% faster and five ~6% slower (0.17.0 gives it up by time, only while
a request is out: see the Producer line). A commit's WAL flush, what lanes
overlap, is ~4% of a backend's time here (`IO:WALSync`). So `max.in.flight` defaults
to 1; lanes pay where commits' flushes are slow (a remote or replicated server) and the
client has cores to spare."""

ACKS_NOTE = """\
**acks (report): acks=1 0.98 (0.97-1.02), acks=0 1.05 (1.04-1.05) of acks=all.** A commit's WAL flush is a small
share of a 1000-record batch here; the weaker acks gain more where fsync is slow."""


# ---------------------------------------------------------------- the lines


def _rate(at: int) -> Callable[[Measured], float]:
    """Records per second of one side of the in-flight rounds, median of the rounds."""
    return lambda m: statistics.median(m["records"] / r[at] for r in m["rounds"])


LINES = (
    Line(
        "raw_commits",
        "raw COPY, one commit per 1000 rows / raw COPY",
        "handler",
        lambda m: m["copy_s"] / m["batched_s"],
    ),
    Line(
        "floor_raw",
        "floor: the produce's rows COPYed into records, one commit per 1000 / raw COPY",
        "handler",
        lambda m: m["copy_s"] / m["floor"],
    ),
    Line(
        "handler_raw",
        "handler produce (batch 1000) / raw COPY",
        "handler",
        lambda m: m["copy_s"] / m["handler"],
    ),
    Line(
        "handler_raw_commits",
        "handler produce (batch 1000) / raw COPY, one commit per 1000 rows",
        "handler",
        lambda m: m["batched_s"] / m["handler"],
    ),
    Line(
        "handler_floor",
        "handler produce (batch 1000) / floor (records COPY, one commit per 1000)",
        "handler",
        lambda m: m["floor"] / m["handler"],
        target=">= 0.8",
        floor="encoded_floor",
        note=HANDLER_NOTE,
    ),
    Line(
        "handler_sql",
        "handler produce (batch 1000) / the produce's SQL alone (advance, COPY)",
        "handler",
        lambda m: m["sql"] / m["handler"],
    ),
    Line(
        "sql_floor",
        "floor: the produce's SQL alone / floor",
        "handler",
        lambda m: m["floor"] / m["sql"],
    ),
    Line(
        "encoded_floor",
        "floor: the produce's SQL, its rows encoded in the loop (all but deciding and "
        "SQLAlchemy's transaction) / floor",
        "handler",
        lambda m: m["floor"] / m["encoded"],
    ),
    Line(
        "producer_raw",
        "idempotent Producer (batch 1000) / raw COPY",
        "client1000",
        lambda m: m["copy_s"] / m["client_s"],
    ),
    Line(
        "producer_handler",
        "idempotent Producer (batch 1000) / handler produce (batch 1000)",
        "client1000",
        lambda m: m["handler_s"] / m["client_s"],
        target=">= 0.6",
        note=PRODUCER_NOTE,
    ),
    Line(
        "producer100_raw",
        "idempotent Producer (batch 100) / raw COPY",
        "client100",
        lambda m: m["copy_s"] / m["client_s"],
    ),
    Line(
        "parallel",
        "4 producers x 4 partitions / 1 producer (throughput)",
        "parallel",
        lambda m: m["one_s"] / m["four_s"],
    ),
    Line(
        "inflight_floor",
        "floor: 4 partitions' rows COPYed, a connection each committing side by side / "
        "one connection committing them together",
        "inflight",
        lambda m: m["together_s"] / m["apart_s"],
    ),
    Line(
        "inflight",
        "idempotent Producer, 4 partitions: in-flight 5 / in-flight 1 (median of rounds)",
        "inflight",
        lambda m: statistics.median(m["ratios"]),
        target=">= 1.5",
        floor="inflight_floor",
        note=INFLIGHT_NOTE,
    ),
    Line(
        "inflight_spread",
        "in-flight 5 / in-flight 1, lowest and highest round",
        "inflight",
        lambda m: (min(m["ratios"]), max(m["ratios"])),
        SPREAD,
    ),
    Line(
        "inflight_ceiling",
        "ceiling: in-flight 1 / in-flight 5 keeping every core busy (its machine "
        "CPU-seconds / cores), median of rounds",
        "inflight",
        lambda m: statistics.median(m["ceilings"]),
    ),
    Line(
        "inflight1_rate",
        "idempotent Producer, 4 partitions, in-flight 1: records/s (median of rounds)",
        "inflight",
        _rate(0),
        "{:,.0f}",
    ),
    Line(
        "inflight5_rate",
        "idempotent Producer, 4 partitions, in-flight 5: records/s (median of rounds)",
        "inflight",
        _rate(1),
        "{:,.0f}",
    ),
    Line(
        "acks1",
        "plain Producer acks=1 / acks=all",
        "acks",
        lambda m: m["acks_s"]["all"] / m["acks_s"]["1"],
        note=ACKS_NOTE,
    ),
    Line(
        "acks0",
        "plain Producer acks=0 / acks=all",
        "acks",
        lambda m: m["acks_s"]["all"] / m["acks_s"]["0"],
    ),
)

SECTION = Section(
    "produce",
    {
        "handler": handler,
        "client1000": client1000,
        "client100": client100,
        "parallel": parallel,
        "inflight": inflight,
        "acks": acks,
    },
    LINES,
    reading=(RAW_COPY_READING, INFLIGHT_READING, ACKS_READING),
)
