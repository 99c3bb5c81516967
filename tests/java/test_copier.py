"""An exactly-once copier written with Kafka 4.4's Java clients, as an application writes
it, against kip98 and Apache Kafka, its members SIGKILLed while they copy
(tests/java/src/main/java/kip98/clients/Copier.java).

Three copier processes in one KIP-848 consumer group (``group.protocol=consumer``), each
with its own transactional id, copy an input topic of three partitions, filled by
transactions in rounds (an aborted transaction in each round too), to an output topic:
each poll's records and the poll's offsets in one transaction (transaction version 2,
which the Java producer takes on its own as the broker finalizes it). After each round
but the last, once the output moves, a member that copied in this round is SIGKILLed and
started again: its transactional id fences the dead one and aborts its open transaction,
and the dead member's partitions wait for its session to expire (KIP-447's requireStable
offset fetch keeps a new owner from reading offsets still pending). At the end a
read_committed reader sees every committed input record exactly once and no aborted one
(once no transaction is open on the output), and the producer epoch moved by one at every
transaction's end and again at each restart's initTransactions.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import partial
from pathlib import Path
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import OffsetSpec

from tests.conformance.harness import Target, run_both, wait_until
from tests.java.processes import JavaProcess

PARTITIONS = 3
COPIERS = 3
ROUNDS = 4
PER_ROUND = 600  # committed records per round
ABORTED_PER_ROUND = 30
KILLS = ROUNDS - 1  # one after each round but the last
GUARD = 300.0  # seconds: a hang guard for each wait (a dead member's session is 45 s)


class Copier(JavaProcess):
    """One Copier process; the JSON lines it prints, per life, read from its files."""

    main = "kip98.clients.Copier"

    def steps(self, start: int | None = None) -> list[dict[str, Any]]:
        """The steps one life printed (the current one by default)."""
        path = self.out_file(start)
        lines = path.read_text(errors="replace").splitlines() if path.exists() else []
        return [json.loads(line) for line in lines if line.startswith('{"step"')]

    def commits(self) -> int:
        return sum(1 for step in self.steps() if step["step"] == "commit")


def fill_round(target: Target, topic: str, txid: str, first: int) -> None:
    """``PER_ROUND`` records numbered from ``first`` (record n on partition n % 3) in one
    committed transaction, and ``ABORTED_PER_ROUND`` others in an aborted one."""
    producer = ck.Producer(target.config(**{"transactional.id": txid, "linger.ms": 5}))
    producer.init_transactions(60)
    producer.begin_transaction()
    for n in range(first, first + PER_ROUND):
        producer.produce(topic, key=str(n), value=str(n), partition=n % PARTITIONS)
    producer.commit_transaction(60)
    producer.begin_transaction()
    for n in range(first, first + ABORTED_PER_ROUND):
        producer.produce(topic, key=f"a{n}", value=f"a{n}", partition=n % PARTITIONS)
    producer.abort_transaction(60)


class Output:
    """The output topic as a read_committed reader sees it while the copiers run."""

    def __init__(self, target: Target, topic: str) -> None:
        self.consumer = ck.Consumer(
            target.config(**{
                "group.id": target.name_for("reader"),
                "isolation.level": "read_committed",
                "enable.auto.commit": False,
            })
        )  # fmt: skip
        self.consumer.assign(
            [ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(PARTITIONS)]
        )
        self.values: Counter[str] = Counter()

    def poll(self) -> int:
        for message in self.consumer.consume(1000, timeout=0.2):
            if message.error() is not None:
                raise ck.KafkaException(message.error())
            value = message.value()
            assert value is not None
            self.values[value.decode()] += 1
        return sum(self.values.values())


def read_to_end(target: Target, topic: str) -> Counter[str]:
    """Every value a fresh read_committed reader sees, once no transaction is open on the
    topic (its last stable offset at its high watermark on every partition)."""
    admin = target.admin()
    tps = [ck.TopicPartition(topic, p) for p in range(PARTITIONS)]

    def ends(isolation: ck.IsolationLevel) -> dict[int, int]:
        futures = admin.list_offsets({tp: OffsetSpec.latest() for tp in tps},
                                     isolation_level=isolation)  # fmt: skip
        return {tp.partition: f.result(30).offset for tp, f in futures.items()}

    high = ends(ck.IsolationLevel.READ_UNCOMMITTED)
    wait_until(lambda: ends(ck.IsolationLevel.READ_COMMITTED) == high, f"{topic} stable", GUARD)
    consumer = ck.Consumer(
        target.config(**{
            "group.id": target.name_for("final"),
            "isolation.level": "read_committed",
            "enable.partition.eof": True,
        })
    )  # fmt: skip
    consumer.assign([ck.TopicPartition(topic, p, ck.OFFSET_BEGINNING) for p in range(PARTITIONS)])
    values: Counter[str] = Counter()
    at_end: set[int] = set()

    def read() -> bool:
        for message in consumer.consume(1000, timeout=0.2):
            error = message.error()
            if error is not None and error.code() == ck.KafkaError._PARTITION_EOF:
                at_end.add(message.partition() or 0)
            elif error is not None:
                raise ck.KafkaException(error)
            else:
                value = message.value()
                assert value is not None
                values[value.decode()] += 1
        return len(at_end) == PARTITIONS

    try:
        wait_until(read, f"{topic} read to its end", GUARD)
    finally:
        consumer.close()
    return values


def epochs_check(copiers: list[Copier]) -> dict[str, Any]:
    """The producer epochs each transactional id went through: the steps between one
    transaction's end and the next within a life (1 each on transaction version 2), and
    the jump from a dead life's last epoch to its restart's initTransactions: 1, or 2 when
    the dead one was killed inside a transaction, which the fencing init aborted (one bump
    for the abort, one for the producer's retried init)."""
    steps: set[int] = set()
    jumps: list[int] = []
    for copier in copiers:
        last = None
        for start in range(1, copier.starts + 1):
            life = copier.steps(start)
            assert life and life[0]["step"] == "init", (copier.args[4], start, life[:3])
            if last is not None:
                jumps.append(life[0]["epoch"] - last)
            ends = [s["epoch"] for s in life if s["step"] in ("commit", "abort")]
            steps.update(b - a for a, b in zip([life[0]["epoch"], *ends], ends, strict=False))
            last = max(s["epoch"] for s in life)
    return {
        "steps": sorted(steps),
        "restart_jumps": sorted(set(jumps)),
        "killed_in_a_transaction": jumps.count(2),
    }


def run_copiers(target: Target, classpath: str, workdir: Path) -> dict[str, Any]:
    source = target.create_topic("cin", partitions=PARTITIONS)
    sink = target.create_topic("cout", partitions=PARTITIONS)
    group, filler = target.name_for("copiers"), target.name_for("filler")
    copiers = [
        Copier(classpath, [target.bootstrap, group, source, sink, target.name_for(f"copier{i}")],
               workdir / f"copier{i}", grace=90)
        for i in range(COPIERS)
    ]  # fmt: skip
    output = Output(target, sink)
    expected = 0

    def progressed(beyond: int) -> bool:
        for copier in copiers:
            copier.check_alive()
        return output.poll() > beyond

    kills: list[str] = []
    try:
        for copier in copiers:
            copier.start()
        for round_ in range(ROUNDS):
            before = output.poll()
            commits = [c.commits() for c in copiers]
            fill_round(target, source, filler, round_ * PER_ROUND)
            expected += PER_ROUND
            wait_until(partial(progressed, before), f"output beyond {before}", GUARD)
            if round_ < KILLS:
                # A member that copied in this round, the next in turn if it did.
                def copying(r: int = round_, done: list[int] = commits) -> Copier | None:
                    progressed(-1)
                    active = [c for c, n in zip(copiers, done, strict=True) if c.commits() > n]
                    turn = copiers[r % COPIERS]
                    return turn if turn in active else (active[0] if active else None)

                victim = wait_until(copying, "a member copying", GUARD)
                victim.kill()
                kills.append(victim.args[4])
                victim.start()
                moved = output.poll()
                wait_until(lambda m=moved, e=expected: progressed(m) or output.poll() >= e,
                           f"output beyond {moved}", GUARD)  # fmt: skip
        wanted = {str(n) for n in range(expected)}
        wait_until(lambda: progressed(-1) and wanted <= set(output.values), "every record", GUARD)
        # Each life's first line is its initTransactions (epochs_check reads it).
        wait_until(lambda: all(c.steps() for c in copiers), "every copier initialised", GUARD)
    finally:
        for copier in copiers:
            copier.stop()
        output.consumer.close()

    values = read_to_end(target, sink)
    duplicates = sorted(v for v, n in values.items() if n > 1)
    missing = sorted(wanted - set(values), key=int)
    aborted_copied = sorted(v for v in values if v.startswith("a"))
    assert (missing, duplicates, aborted_copied) == ([], [], []), (
        f"{target.kind}: missing {missing[:20]}, duplicated {duplicates[:20]}, "
        f"aborted input copied {aborted_copied[:20]}"
    )
    assert sum(values.values()) == expected
    steps = [s for c in copiers for start in range(1, c.starts + 1) for s in c.steps(start)]
    return {
        "values": sorted(values, key=int),
        "kills": len(kills),
        "starts": sum(c.starts for c in copiers),
        "transactions": sum(1 for s in steps if s["step"] in ("commit", "abort")) > 0,
        "fatal": [s for s in steps if s["step"] == "fatal"],
        "epochs": epochs_check(copiers),
    }


@pytest.mark.slow
@pytest.mark.timeout(1500)
def test_exactly_once_copy_through_kills(
    targets: tuple[Target, Target], java_classpath: str, tmp_path: Path
) -> None:
    """The same copiers, input and kills on each broker: each copies every committed input
    record exactly once (run_copiers asserts it), and the two observe the same output, the
    epochs of transaction version 2 (one step per transaction's end) and no fatal error;
    each restart moves its id's epoch by 1, or by 2 when the kill left a transaction open
    and the fencing init aborted it."""

    def scenario(target: Target) -> Any:
        return run_copiers(target, java_classpath, tmp_path / target.kind)

    observed, on_kafka = run_both(scenario, *targets)
    # How many kills landed inside a transaction depends on timing: not compared.
    inside = [o["epochs"].pop("killed_in_a_transaction") for o in (observed, on_kafka)]
    jumps = [o["epochs"].pop("restart_jumps") for o in (observed, on_kafka)]
    assert all(set(j) <= {1, 2} for j in jumps), jumps
    assert all(0 <= n <= KILLS for n in inside), inside
    print(f"kills inside a transaction: kip98 {inside[0]}, kafka {inside[1]} of {KILLS}")
    assert observed == on_kafka
    assert len(observed["values"]) == ROUNDS * PER_ROUND
    assert observed["kills"] == KILLS and observed["starts"] == COPIERS + KILLS
    assert observed["fatal"] == []
    assert observed["epochs"] == {"steps": [1]}
