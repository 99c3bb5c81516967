"""Transactions: the transactional Producer against the idempotent one and its floor,
exactly-once's consume-transform-produce loop, and one-record transactions."""

from __future__ import annotations

import os
import statistics
import time
import uuid
from typing import Any, cast

from sqlalchemy import event

from app.broker import Broker
from app.client import Consumer, Producer, TopicPartition
from app.log.topics import create_topic
from app.storage.one_query import QueryCopies
from bench.data import VALUE_BYTES
from bench.database import fresh_database
from bench.produce import idempotent_spread
from bench.section import Line, Measured, Run, Section, console
from bench.timing import timed


def transactional_produce(
    url: str, data: list[tuple[bytes, bytes]], per_txn: int, partitions: int = 4
) -> tuple[float, int]:
    topic = f"tx-{uuid.uuid4().hex[:6]}"
    create_topic(Broker.connect(url), topic, partitions)
    p = Producer(
        {
            "database.url": url,
            "transactional.id": f"bench-{uuid.uuid4().hex[:6]}",
            "linger.ms": 50,
            "batch.num.messages": 1000,
        }
    )
    p.init_transactions()
    txns = 0

    def run() -> None:
        nonlocal txns
        for start in range(0, len(data), per_txn):
            p.begin_transaction()
            for i, (k, v) in enumerate(data[start : start + per_txn]):
                p.produce(topic, v, k, partition=i % partitions)
            p.commit_transaction()
            txns += 1

    t = timed(run, url)
    p.close()
    return t, txns


# Kafka's published cost of transactions: 1 KB records sent as fast as the producer can,
# a transaction committed every 100 ms, against the same producer without transactions.
KAFKA_VALUE_BYTES = 1000
KAFKA_COMMIT_INTERVAL_S = 0.1


def paced_produce(url: str, records: int, mode: str, partitions: int = 4) -> float:
    """``records`` 1 KB records over ``partitions`` partitions of a new topic, as fast as
    the Producer takes them (its own defaults), timed to the last acknowledgement.
    ``mode``: ``idempotent`` (one flush at the end), ``transactional`` (a transaction
    committed every 100 ms), ``flushed`` (the idempotent Producer waiting for its records
    every 100 ms, as a commit makes its application wait: the transactional one's floor)."""
    topic = f"kafka-{uuid.uuid4().hex[:6]}"
    create_topic(Broker.connect(url), topic, partitions)
    config: dict[str, Any] = {"database.url": url}
    if mode == "transactional":
        config["transactional.id"] = f"kafka-{uuid.uuid4().hex[:6]}"
    p = Producer(config)
    if mode == "transactional":
        p.init_transactions()
    value = os.urandom(KAFKA_VALUE_BYTES)

    def settle_now() -> None:
        if mode == "transactional":
            p.commit_transaction()
        else:
            assert p.flush(120) == 0

    def run() -> None:
        if mode == "transactional":
            p.begin_transaction()
        due = time.perf_counter() + KAFKA_COMMIT_INTERVAL_S
        for i in range(records):
            while True:
                try:
                    p.produce(topic, value, partition=i % partitions)
                    break
                except BufferError:
                    p.poll(0.001)
            if mode != "idempotent" and i % 100 == 99 and time.perf_counter() >= due:
                settle_now()
                if mode == "transactional":
                    p.begin_transaction()
                due = time.perf_counter() + KAFKA_COMMIT_INTERVAL_S
        settle_now()

    t = timed(run, url)
    p.close()
    return t


def consume_transform_produce(
    url: str, data: list[tuple[bytes, bytes]], per_txn: int, offsets: bool, partitions: int = 4
) -> float:
    """Exactly-once's own case, timed: a read_committed Consumer reads ``data`` back from an
    input topic ``per_txn`` records at a time, and a transactional Producer writes each
    record to the same partition of an output topic in one transaction per read, with the
    consumer's positions (``offsets``: sent with ``send_offsets_to_transaction``, as a
    consume-transform-produce application does; else the same transactions without them)."""
    tag = uuid.uuid4().hex[:6]
    source, sink = f"ctp-in-{tag}", f"ctp-out-{tag}"
    idempotent_spread(url, data, partitions, topic=source)  # the input, not timed here
    create_topic(Broker.connect(url), sink, partitions)
    consumer = Consumer(
        {
            "database.url": url,
            "group.id": f"ctp-{tag}",
            "isolation.level": "read_committed",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition(source, p, 0) for p in range(partitions)])
    producer = Producer(
        {
            "database.url": url,
            "transactional.id": f"ctp-{tag}",
            "linger.ms": 50,
            "batch.num.messages": 1000,
        }
    )
    producer.init_transactions()

    def run() -> None:
        done = 0
        while done < len(data):
            messages = consumer.consume(per_txn, timeout=10)
            assert messages, f"{done} of {len(data)} records read"
            producer.begin_transaction()
            for m in messages:
                producer.produce(sink, m.value(), m.key(), partition=cast(int, m.partition()))
            if offsets:
                producer.send_offsets_to_transaction(
                    consumer.position(consumer.assignment()), consumer.consumer_group_metadata()
                )
            producer.commit_transaction()
            done += len(messages)

    t = timed(run, url)
    producer.close()
    consumer.close()
    return t


def small_transactions(url: str, count: int) -> tuple[float, float]:
    """One-record transactions per second, and DB commits per transaction."""
    create_topic(Broker.connect(url), "one", 1)
    # The default linger.ms: the record waits for the commit, which sends it with the EndTxn.
    p = Producer({"database.url": url, "transactional.id": "bench-one"})
    p.init_transactions()
    commits = 0

    def count_commit(*_: Any) -> None:
        nonlocal commits
        commits += 1

    event.listen(p.broker.engine, "commit", count_commit)
    # A query string that commits on its own (docs/design.md §3.9, §3.11) is a DB commit
    # too, one SQLAlchemy does not see.
    enter_query = QueryCopies.__enter__

    def count_query(self: QueryCopies) -> QueryCopies:
        if self.committed:
            count_commit()
        return enter_query(self)

    QueryCopies.__enter__ = count_query  # type: ignore[method-assign]
    try:
        start = time.perf_counter()
        for i in range(count):
            p.begin_transaction()
            p.produce("one", b"x" * VALUE_BYTES, f"{i:016d}".encode())
            p.commit_transaction()
        elapsed = time.perf_counter() - start
    finally:
        QueryCopies.__enter__ = enter_query  # type: ignore[method-assign]
    p.close()
    return count / elapsed, commits / count


# ---------------------------------------------------------------- cases


def transactional(run: Run) -> Measured:
    """Transactions of 1000 records over 4 partitions, the idempotent Producer writing the
    same rows freely, and the same flushing every 1000 (the floor)."""
    data = run.data
    with console.status("transactional produce"):
        # Rounds alternate the two sides, so drift in the machine's speed hits both; each
        # side starts from an empty database, so neither writes into the other's rows.
        rounds = []
        for i in range(run.settings.txn_rounds):
            times = {}
            # Which side goes first alternates too: a round's first phase can run on a
            # quieter machine than its second, and neither side should always get it.
            sides = ("idem", "flushed", "txn")
            for side in sides if i % 2 == 0 else sides[::-1]:
                with fresh_database(run.server) as url:
                    if side == "idem":
                        times[side] = idempotent_spread(url, data)
                    elif side == "flushed":
                        times[side] = idempotent_spread(url, data, flush_every=1000)
                    else:
                        times[side] = transactional_produce(url, data, 1000)[0]
            rounds.append((times["idem"], times["txn"], times["flushed"]))
        run.results["transactional_rounds_s"] = rounds
    return {"records": len(data), "rounds": rounds}


def ctp(run: Run) -> Measured:
    """Consume-transform-produce over half the records, with the consumer's offsets in each
    transaction and without, rounds taking turns to lead, each side on a fresh database."""
    half = run.data[: run.settings.records // 2]
    with console.status("consume-transform-produce"):
        rounds = []
        for i in range(run.settings.txn_rounds):
            times = {}
            for with_offsets in (True, False) if i % 2 == 0 else (False, True):
                with fresh_database(run.server) as url:
                    times[with_offsets] = consume_transform_produce(url, half, 1000, with_offsets)
            rounds.append((times[True], times[False]))
        run.results["ctp_rounds_s"] = rounds
    return {"records": len(half), "rounds": rounds}


def commits_100ms(run: Run) -> Measured:
    """Kafka's headline figure: half the run's record count of 1 KB records over 4
    partitions, transactions committed every 100 ms against the idempotent Producer, and
    its floor (the idempotent Producer waiting for its records every 100 ms); rounds taking
    turns to lead, each side on a fresh database."""
    records = run.settings.records // 2
    with console.status("transactions every 100 ms"):
        rounds = []
        for i in range(run.settings.txn_rounds):
            times = {}
            sides = ("idempotent", "flushed", "transactional")
            for side in sides if i % 2 == 0 else sides[::-1]:
                with fresh_database(run.server) as url:
                    times[side] = paced_produce(url, records, side)
            rounds.append((times["idempotent"], times["transactional"], times["flushed"]))
        run.results["commits_100ms_rounds_s"] = rounds
    return {"records": records, "rounds": rounds}


def small_txns(run: Run) -> Measured:
    with console.status("one-record transactions"), fresh_database(run.server) as url:
        tps, commits = small_transactions(url, run.settings.small_txns)
    return {"per_s": tps, "commits": commits}


# ---------------------------------------------------------------- notes (docs/benchmarks.md)

TRANSACTIONAL_READING = """\
The transactional lines (`--only transactional`) time, in rounds taking turns to
lead, each on a fresh database: transactions of 1000 records over 4 partitions; the
idempotent Producer writing the same rows freely; and the same idempotent Producer
flushing every 1000 records, its application waiting for them to be acknowledged as a
commit makes it wait: the floor of a transactional producer, which does that and more."""

COMMITS_100MS_READING = """\
The 100 ms lines (`--only commits-100ms`) are Kafka's published cost of transactions:
a producer sending 1 KB records as fast as it can, committing a transaction every
100 ms, runs at about 0.97 of the same producer without transactions. Half `--records`
records over 4 partitions, the Producer's default settings, timed to the last
acknowledgement; against the idempotent Producer, and against its floor, the
idempotent Producer waiting for its records every 100 ms as a commit makes the
application wait; `--txn-rounds` rounds taking turns to lead, each side on a fresh
database, median of the rounds' ratios."""

CTP_READING = """\
The consume-transform-produce lines (`--only ctp`) time exactly-once's own loop over
half the records: a read_committed Consumer reads 1000 records from a 4-partition
topic, a transactional Producer writes each to the same partition of another in one
transaction, with `send_offsets_to_transaction` of the consumer's positions before
each commit; against the same loop without the offsets, `--txn-rounds` rounds taking
turns to lead, each side on a fresh database, median of the rounds' ratios."""

TXN_100MS_NOTE = """\
**Transactions every 100 ms (target 0.97): 0.95 (0.89-1.00) in 0.23.0's table (five
runs; two runs of three the same session: 0.96 and 0.97), at its floor, which keeps it
at the target's edge: the idempotent Producer waiting for its records every 100 ms, as
a commit makes the application wait, is 0.96 (0.92-1.03) of the idempotent Producer
(0.95 and 0.97 in the other runs), and the transactional Producer is 0.96 (0.94-0.99)
of that floor (1.00 and 0.97).** What a transaction adds beyond the wait is now within
the rounds' spread; the wait itself is the floor's cost: while the application waits,
the sender drains what it holds, then idles until the next batch fills or lingers out.
How it got here. 0.21.0 timed it by phase: each produce request of a transaction cost
more of the sender's time than an idempotent one (7.0-7.5 against 6.3-6.4 µs a
record), because a transactional batch was admitted by reading its transactional id's
row FOR SHARE (rule 6) before anything else, which kept it from the one query string
(§3.9) and sent it the lock's way. 0.22.0 remembers the id's row with its version, and
a transaction's later requests go as one query string that checks it (§3.12, rule 53):
0.90 → 0.91 against the idempotent Producer, 0.89 → 0.95 against the floor. 0.23.0
timed each kind of request (four rounds side by side with the floor, 100,000 records):
the transactional sender spent 65 ms more than the floor's over ~0.7 s, all of it in
two requests a transaction, its first, which registers its partitions (11.8 µs a record
against 6.6 in a later request), and its commit (8.9 µs). Both still took the lock's
way: ten and nine round trips, each of which waits for the application's thread, busy
producing, to hand over the interpreter lock (`app/client/handoff.py`). Both now go in
one query string on the rows the id's last request left (§3.11): the registration as a
commit does, and a commit whose partitions hold its own open transaction with a read of
the other producers' open transactions after its locks (rule 14). The same run before
and after: 0.92 (0.90-0.94) → 0.95-0.97 against the idempotent Producer, 0.94
(0.93-0.96) → 0.96-1.00 against the floor. The client's coordinator loop costs nothing
measurable here (eight rounds with and without it: 0.96 both)."""

TRANSACTIONAL_NOTE = """\
**Transactional / idempotent (target 0.85 on the median of rounds): 0.57 (0.56-0.59)
in 0.23.0's table (0.55 in 0.22.0's, 0.57 in 0.20.0's and 0.18.0's, 0.56 in 0.17.0's),
from 0.69 in 0.16.0's; its floor 0.62 (0.61-0.63), below the target; transactional /
floor 0.90 (0.88-0.91), 0.92 in 0.22.0's, 0.87 in 0.20.0's (a transaction's batches
sent before its commit go in one query string, §3.12, and in 0.23.0 its first request
and its commit too, §3.11: 0.22.0's code and 0.23.0's in the same session, 0.54 → 0.57,
126,000 → 137,000 records/s).** Timed by
phase in 0.19.0 (three runs of 200 transactions each): the transactional Producer's
1000 `produce()` calls 1.38 ms against the flushing idempotent one's 1.21 ms, its
commit 4.6 ms against the flush's 4.05 ms, of which ~0.3 ms more waiting on the
server (the markers, the transaction's events and row, in the same query string as
the rows) and ~0.23 ms more Python. In 0.17.0 the idempotent Producer it is
divided by became a quarter faster (its application no longer keeps the sender waiting
for the interpreter lock, see the Producer line) while the transactional one, whose
records wait for the commit with no request out, stayed as fast (1.19-1.20 s for
200,000 records side by side; ~157,000 records/s in this table against ~136,000 on
0.16.0's slower machine); so did the floor, the idempotent Producer flushing every 1000
records. In 0.16.0 a transactional id's commit after its process's previous one
now goes as one query string when the rows it touches are as that commit left them
(docs/design.md §3.11, rule 33): decided in full on the remembered id row, lease epoch
and partition rows, then the id's row and the partitions locked with their versions
read, the transitions and the markers' write as `EXECUTE`s of prepared statements, and
the COPYs, committed as the last COPY ends; refused with nothing written if any
version moved. It took BEGIN with the id's row and lease (0.35 ms), the partition locks
(0.42 ms), the COPY, a pipeline of the transitions, advance and markers (0.6 ms) and
COMMIT (0.5 ms) as five round trips beside the COPY's; 1000 records over four
partitions per commit 5.9 → 4.9 ms (median of 100 commits, measured side by side; sent as
literal statements instead of prepared ones, planned every time, it was 5.5 ms). The
one-record transactions went from 420 to 668 per second. What is left between the
transactional Producer and its floor (the idempotent one waiting for its 1000 records
each time, whose request is one query string too) is the commit's own work: deciding
the registration, PREPARE, markers and COMPLETE (~0.2 ms of Python), the statements
that write them (the events and the markers, ~0.3 ms of the server), and rendering
their values (0.05 ms). The application's `produce()` calls (1.45 ms for 1000
records) and the commit follow one another, which is what keeps the floor below 1:
the idempotent Producer's application waits on nothing but its queue (about 1.4 µs of
CPU a record) and its database work overlaps its `produce()` calls. Since 0.18.0 a
consume-transform-produce transaction's commit goes in one query string too (see its
line)."""

CTP_NOTE = """\
**Consume-transform-produce (report): 0.79 (0.79-0.80) of the same transactions
without offsets (0.80 in 0.18.0's table), from 0.66 in 0.17.0's; 96 transactions of
1000 records a second (94-96), from 75.** Exactly-once's own loop, a read_committed Consumer's 1000 records
written by a transactional Producer with the consumer's positions sent in each
transaction. In 0.17.0 the offsets cost ~4 ms a transaction: their own request (one
TxnOffsetCommit that adds them to the transaction, KIP-890's transaction version 2;
3.2 → 2.2 ms against AddOffsetsToTxn and TxnOffsetCommit), and the commit taking the
lock's way, 6.1-6.2 ms against the one-query commit's 4.4-4.6 ms, because the
offsets' transition moved the id's row the process remembered. In 0.18.0 that
TxnOffsetCommit remembers the row it leaves, with its lease's epoch, and the pending
offsets' completion is queued with the markers' writes (docs/design.md §3.11): the
commit with offsets is one query string too, 4.5-4.6 ms, as one without; and the
request's writes go in one pipeline with the row's version read after them (§8), 1.64
→ 1.37 ms timed alone, 2.3 → 1.9 ms in the loop. A transaction 12.5 → 10.5 ms (five
alternating runs against 0.17.0). What is left is that request: five round trips
(BEGIN, the id's row with its lease, the partitions' check, the pipeline, COMMIT) and
the commit's flush, against 0.38 ms for a bare INSERT and COMMIT on this server."""


# ---------------------------------------------------------------- the lines

LINES = (
    Line(
        "txn_best",
        "transactional (1000/txn, 4 partitions) / idempotent, best",
        "transactional",
        lambda m: min(r[0] for r in m["rounds"]) / min(r[1] for r in m["rounds"]),
    ),
    Line(
        "txn",
        "transactional (1000/txn, 4 partitions) / idempotent, median of the rounds",
        "transactional",
        lambda m: statistics.median(i / t for i, t, _ in m["rounds"]),
        target=">= 0.85",
        floor="txn_floor",
        note=TRANSACTIONAL_NOTE,
    ),
    Line(
        "txn_floor",
        "floor: idempotent, the application waiting for acknowledgement every 1000 "
        "records (as a commit makes it) / idempotent, median of the rounds",
        "transactional",
        lambda m: statistics.median(i / f for i, _, f in m["rounds"]),
    ),
    Line(
        "txn_to_floor",
        "transactional / that floor (idempotent, flushing every 1000), median",
        "transactional",
        lambda m: statistics.median(f / t for _, t, f in m["rounds"]),
    ),
    Line(
        "idempotent_rate",
        "idempotent Producer, 4 partitions: records/s (median of rounds)",
        "transactional",
        lambda m: statistics.median(m["records"] / r[0] for r in m["rounds"]),
        "{:,.0f}",
    ),
    Line(
        "transactional_rate",
        "transactional Producer, 4 partitions: records/s (median of rounds)",
        "transactional",
        lambda m: statistics.median(m["records"] / r[1] for r in m["rounds"]),
        "{:,.0f}",
    ),
    Line(
        "txn_100ms",
        "transactions committed every 100 ms (1 KB records, 4 partitions) / idempotent, "
        "median of the rounds",
        "commits-100ms",
        lambda m: statistics.median(i / t for i, t, _ in m["rounds"]),
        target=">= 0.97",
        floor="txn_100ms_floor",
        note=TXN_100MS_NOTE,
    ),
    Line(
        "txn_100ms_floor",
        "floor: idempotent, the application waiting for acknowledgement every 100 ms / "
        "idempotent (1 KB records), median of the rounds",
        "commits-100ms",
        lambda m: statistics.median(i / f for i, _, f in m["rounds"]),
    ),
    Line(
        "txn_100ms_to_floor",
        "transactions every 100 ms / that floor, median of the rounds",
        "commits-100ms",
        lambda m: statistics.median(f / t for _, t, f in m["rounds"]),
    ),
    Line(
        "ctp_offsets",
        "consume-transform-produce (1000/txn, 4 partitions, the consumer's offsets in "
        "each transaction) / the same transactions without offsets, median of rounds",
        "ctp",
        lambda m: statistics.median(without / with_ for with_, without in m["rounds"]),
        note=CTP_NOTE,
    ),
    Line(
        "ctp_rate",
        "consume-transform-produce transactions per second (median of rounds)",
        "ctp",
        lambda m: statistics.median(m["records"] / 1000 / with_ for with_, _ in m["rounds"]),
        "{:,.0f}",
    ),
    Line(
        "small_txns",
        "one-record transactions per second",
        "small-txns",
        lambda m: m["per_s"],
        "{:.0f}",
    ),
    Line(
        "small_txn_commits",
        "DB commits per one-record transaction",
        "small-txns",
        lambda m: m["commits"],
        "{:.1f}",
    ),
)

SECTION = Section(
    "transactional",
    {
        "transactional": transactional,
        "commits-100ms": commits_100ms,
        "ctp": ctp,
        "small-txns": small_txns,
    },
    LINES,
    reading=(TRANSACTIONAL_READING, COMMITS_100MS_READING, CTP_READING),
)
