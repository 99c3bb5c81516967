"""Judges a run: pure functions over the histories and the final dump of the log.

The final log is the ground truth for outcomes the clients could not know (``info``):
a transaction whose outcome is unknown counts as committed if its values are in the
committed log and as aborted otherwise. Everything a client saw (acknowledged commits,
acknowledged aborts, polled records) must then agree with that log.

Dump layout (see ``dump.py``): ``committed`` {topic: {partition: [[offset, value]]}},
``partitions`` [{topic, partition, log_start_offset, next_offset, last_stable_offset}],
``offset_stats`` [{topic, partition, rows, distinct, min, max}], ``group_offsets``
{group: [[topic, partition, offset]]}, ``final_read`` {complete, records}.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from app.protocol import TopicPartitionKey
from app.torture.history import FAIL, INFO, INVOKE, OK, Event

ANOMALIES = (
    "lost-write",
    "duplicate",
    "aborted-read",
    "phantom-read",
    "premature-read",
    "uncommitted-read",
    "offset-anomaly",
    "nonmonotonic-poll",
    "poll-skip",
    "torn-transaction",
    "aborted-visible",
    "abort-after-commit",
    "zombie-commit",
    "commit-without-request",
    "phantom-write",
    "copy-mismatch",
    "copy-lagging",
    "lso-not-hw",
    "liveness",
    "final-read-mismatch",
)


@dataclass
class Txn:
    id: str
    process: str
    status: str | None = None  # ok / fail / info; None: never completed (process died)
    sends: list[tuple[str, int, str]] = field(default_factory=list)
    commit_mono: float | None = None
    copier: bool = False

    @property
    def outcome(self) -> str:
        return INFO if self.status is None else self.status


@dataclass
class Log:
    """The committed log as the checks need it."""

    values: dict[TopicPartitionKey, dict[int, str | None]]
    offsets: dict[TopicPartitionKey, list[int]]
    where: dict[str, dict[str | None, list[tuple[int, int]]]]

    @classmethod
    def from_dump(cls, committed: dict[str, dict[str, list[list[Any]]]]) -> Log:
        values: dict[TopicPartitionKey, dict[int, str | None]] = {}
        where: dict[str, dict[str | None, list[tuple[int, int]]]] = defaultdict(
            lambda: defaultdict(list)
        )
        for topic, parts in committed.items():
            for p, rows in parts.items():
                key = (topic, int(p))
                values[key] = {int(o): v for o, v in rows}
                for o, v in rows:
                    where[topic][v].append((int(p), int(o)))
        offsets = {k: sorted(v) for k, v in values.items()}
        return cls(values, offsets, where)

    def count(self, topic: str, value: str) -> int:
        return len(self.where.get(topic, {}).get(value, ()))

    def committed_between(self, key: TopicPartitionKey, low: int, high: int) -> list[int]:
        """Committed offsets o with low <= o < high."""
        offs = self.offsets.get(key, [])
        return offs[bisect.bisect_left(offs, low) : bisect.bisect_left(offs, high)]


@dataclass
class Result:
    anomalies: dict[str, list[dict[str, Any]]]
    stats: dict[str, Any]

    @property
    def ok(self) -> bool:
        return not any(self.anomalies.values())

    def counts(self) -> dict[str, int]:
        return {k: len(self.anomalies.get(k, [])) for k in ANOMALIES}


Report = Callable[..., None]


def collect_txns(events: Iterable[Event]) -> dict[str, Txn]:
    txns: dict[str, Txn] = {}
    for e in events:
        tid = e.get("txn")
        if tid is None:
            continue
        f = e["f"]
        if f == "txn" and e["type"] == INVOKE:
            txns[tid] = Txn(tid, e["process"], copier=e["process"].startswith("c"))
            continue
        txn = txns.get(tid)
        if txn is None:
            continue
        if f == "send":
            txn.sends.extend((t, int(p), v) for t, p, v in e["sends"])
        elif f == "commit" and e["type"] == INVOKE:
            txn.commit_mono = e["mono"]
        elif f == "txn" and e["type"] in (OK, FAIL, INFO):
            txn.status = e["type"]
    return txns


def check_log(dump: dict[str, Any], log: Log, report: Report) -> None:
    """Offsets unique and gapless per partition, LSO = HW, no value committed twice."""
    bounds = {(p["topic"], p["partition"]): p for p in dump["partitions"]}
    for s in dump["offset_stats"]:
        key = (s["topic"], s["partition"])
        part = bounds.get(key)
        expected_rows = 0 if part is None else part["next_offset"] - part["log_start_offset"]
        if (
            s["rows"] != s["distinct"]
            or s["rows"] != expected_rows
            or (
                s["rows"]
                and (s["min"] != part["log_start_offset"] or s["max"] != part["next_offset"] - 1)  # type: ignore[index]
            )
        ):
            report("offset-anomaly", partition=list(key), stats=s, bounds=part)
    for key, offs in log.offsets.items():
        if len(set(offs)) != len(offs):
            report("offset-anomaly", partition=list(key), detail="offset repeated in committed log")
    for part in dump["partitions"]:
        if part["last_stable_offset"] != part["next_offset"]:
            report(
                "lso-not-hw",
                partition=[part["topic"], part["partition"]],
                lso=part["last_stable_offset"],
                hw=part["next_offset"],
            )
    for topic, by_value in log.where.items():
        for value, places in by_value.items():
            if len(places) > 1:
                report("duplicate", topic=topic, value=value, at=places)


def check_transactions(txns: dict[str, Txn], log: Log, report: Report) -> dict[str, int]:
    """Acknowledged writes present; every transaction all-or-nothing; aborted stays out."""
    resolved = Counter[str]()
    for txn in txns.values():
        present = [s for s in txn.sends if log.count(s[0], s[2]) > 0]
        if txn.outcome == OK:
            for t, p, v in txn.sends:
                if log.count(t, v) == 0:
                    report("lost-write", txn=txn.id, topic=t, partition=p, value=v)
        if txn.copier:
            # Copier outputs repeat across retries of the same input; the copy check judges them.
            continue
        if present and len(present) != len(txn.sends):
            missing = [s for s in txn.sends if s not in present]
            report(
                "torn-transaction", txn=txn.id, status=txn.outcome, present=present, missing=missing
            )
        if present and txn.outcome == FAIL:
            report("aborted-visible", txn=txn.id, present=present)
        if present and txn.commit_mono is None:
            report("commit-without-request", txn=txn.id, present=present)
        if txn.outcome == INFO and txn.sends:
            resolved["committed" if present else "aborted"] += 1
    return dict(resolved)


def check_abort_after_commit(events: Iterable[Event], report: Report) -> None:
    """An abort that returned after the transaction's commit had timed out: the commit may
    have committed, so only committing again may end it (whether the log agrees with the
    "aborted" told is judged with the other told outcomes)."""
    for e in events:
        if e["f"] == "abort-after-commit" and e["type"] == OK:
            report("abort-after-commit", txn=e.get("txn"), process=e["process"])


def check_races(events: Iterable[Event], txns: dict[str, Txn], report: Report) -> None:
    """Racers on one fresh transactional id: an instance whose init_transactions() returned
    before another one's started is fenced by it, so a commit it asks for after the other
    one's returned must fail."""
    invoked: dict[tuple[str, str], float] = {}
    inits: dict[str, list[tuple[str, float, float]]] = defaultdict(list)
    tid_of: dict[str, str] = {}
    for e in events:
        if e["f"] == "race-init":
            key = (e["process"], e["tid"])
            if e["type"] == INVOKE:
                invoked[key] = e["mono"]
            elif e["type"] == OK and key in invoked:
                inits[e["tid"]].append((e["process"], invoked[key], e["mono"]))
        elif e["f"] == "txn" and e["type"] == INVOKE and "tid" in e:
            tid_of[e["txn"]] = e["tid"]
    for txn in txns.values():
        tid = tid_of.get(txn.id)
        if tid is None or txn.status != OK or txn.commit_mono is None:
            continue
        mine = [ok for process, _, ok in inits[tid] if process == txn.process]
        for process, other_invoked, other_ok in inits[tid]:
            if process == txn.process or not mine:
                continue
            if other_invoked > mine[0] and other_ok < txn.commit_mono:
                report("zombie-commit", txn=txn.id, tid=tid, fenced_by=process)


def writer_index(txns: dict[str, Txn]) -> dict[tuple[str, str], Txn]:
    """(topic, value) → the worker transaction that sent it (worker values are unique)."""
    return {(t, v): txn for txn in txns.values() if not txn.copier for t, _p, v in txn.sends}


def check_reads(
    events: Iterable[Event], txns: dict[str, Txn], log: Log, report: Report
) -> dict[str, int]:
    """Each polled record is committed, in the log at that offset with that value, from a
    transaction that committed and had asked to commit before the poll returned; per
    partition, polls advance without skipping a committed offset until a reset."""
    writers = writer_index(txns)
    # (process, topic, partition) → ("start", offset) after a reset, ("last", offset) after a read.
    position: dict[tuple[str, str, int], tuple[str, int | None]] = {}
    reads = 0
    for e in events:
        f, proc = e["f"], e["process"]
        if e["type"] == OK and f in ("assign", "seek"):
            if f == "assign":
                for k in [k for k in position if k[0] == proc]:
                    del position[k]
            for t, p, start in e["start"]:
                position[(proc, t, int(p))] = ("start", start)
            continue
        if e["type"] == OK and f == "revoke":
            for t, p in e["partitions"]:
                position.pop((proc, t, int(p)), None)
            continue
        if e["type"] != OK or f != "poll":
            continue
        for t, p, o, v in e["records"]:
            reads += 1
            key = (t, int(p))
            where = {"process": proc, "partition": [t, p], "offset": o, "value": v}
            if log.values.get(key, {}).get(o, "\0missing") != v:
                report("uncommitted-read", **where, log_value=log.values.get(key, {}).get(o))
            writer = writers.get((t, v))
            if writer is not None:
                in_log = log.count(t, v) > 0
                if writer.outcome == FAIL or (writer.outcome == INFO and not in_log):
                    report("aborted-read", **where, txn=writer.id, status=writer.outcome)
                elif writer.commit_mono is None or writer.commit_mono > e["mono"]:
                    report(
                        "premature-read",
                        **where,
                        txn=writer.id,
                        commit_mono=writer.commit_mono,
                        poll_mono=e["mono"],
                    )
            elif t == "torture":
                report("phantom-read", **where)
            state = position.get((proc, t, int(p)))
            at = None if state is None else state[1]
            if state is not None and at is not None:
                low = at if state[0] == "start" else at + 1
                if o < low:
                    report("nonmonotonic-poll", **where, previous=state)
                else:
                    skipped = log.committed_between(key, low, o)
                    if skipped:
                        report("poll-skip", **where, previous=state, skipped=skipped[:10])
            position[(proc, t, int(p))] = ("last", o)
    return {"reads": reads}


def check_copy(
    dump: dict[str, Any], log: Log, report: Report, transform: Callable[[str], str]
) -> None:
    """Output = the transformed committed input below the group's committed offsets, each
    exactly once and in order, per partition; and the copiers caught up with the input."""
    cfg = dump["copy"]
    committed_offsets = {
        (t, int(p)): int(o) for t, p, o in dump["group_offsets"].get(cfg["group"], [])
    }
    for p in range(cfg["partitions"]):
        src, dst = (cfg["input"], p), (cfg["output"], p)
        upto = committed_offsets.get(src, 0)
        expected = [
            transform(v)
            for o, v in sorted(log.values.get(src, {}).items())
            if o < upto and v is not None
        ]
        got = [v for _o, v in sorted(log.values.get(dst, {}).items())]
        if got != expected:
            first = next(
                (i for i, (a, b) in enumerate(zip(got, expected, strict=False)) if a != b),
                min(len(got), len(expected)),
            )
            report(
                "copy-mismatch",
                partition=p,
                committed_offset=upto,
                output_len=len(got),
                expected_len=len(expected),
                first_difference=first,
                got=got[first : first + 3],
                expected=expected[first : first + 3],
            )
        end = next(
            (
                q["last_stable_offset"]
                for q in dump["partitions"]
                if (q["topic"], q["partition"]) == src
            ),
            0,
        )
        if upto != end:
            report("copy-lagging", partition=p, committed_offset=upto, input_end=end)


def check_final_read(dump: dict[str, Any], log: Log, report: Report) -> None:
    final = dump["final_read"]
    if not final["complete"]:
        report(
            "liveness",
            detail="a fresh read_committed consumer did not reach the end",
            seconds=final.get("seconds"),
        )
    got: dict[TopicPartitionKey, list[list[Any]]] = defaultdict(list)
    for t, p, o, v in final["records"]:
        got[(t, int(p))].append([o, v])
    for key, values in log.values.items():
        want = [[o, v] for o, v in sorted(values.items())]
        if got.get(key, []) != want:
            report(
                "final-read-mismatch",
                partition=list(key),
                got=len(got.get(key, [])),
                expected=len(want),
            )


def check_phantom_writes(txns: dict[str, Txn], log: Log, report: Report, topic: str) -> None:
    sent = {v for txn in txns.values() for t, _p, v in txn.sends if t == topic}
    for value, places in log.where.get(topic, {}).items():
        if value not in sent:
            report("phantom-write", topic=topic, value=value, at=places)


def operation_stats(events: list[Event]) -> dict[str, Any]:
    ops = Counter(f"{e['f']}:{e['type']}" for e in events if e["process"] != "nemesis")
    faults = Counter(
        e["kind"]
        for e in events
        if e["process"] == "nemesis" and e["f"] == "fault" and e["type"] == OK
    )
    return {"operations": dict(ops), "faults": dict(faults)}


# A client's steps timed by the longest-wait figure: each from its invoke to its process's
# next event (a whole transaction, which may be slow on purpose, is not one).
WAITED_STEPS = frozenset({"init", "send", "commit", "commit-offsets", "poll", "assign", "seek"})
STOPS = ("pause", "stall")


def stop_windows(events: list[Event]) -> list[tuple[float, float, str]]:
    """The nemesis' stops: (from, to, the stopped role), from its fault events (it injects
    one fault at a time, so each invoke is followed by its own outcome)."""
    windows: list[tuple[float, float, str]] = []
    started: Event | None = None
    for e in events:
        if e["process"] != "nemesis" or e["f"] != "fault":
            continue
        if e["type"] == INVOKE:
            started = e if e.get("kind") in STOPS else None
        elif e["type"] == OK and started is not None and "target" in e:
            windows.append((started["mono"], e["mono"], str(e["target"]).split(" ")[0]))
            started = None
    return windows


def history_name(role: str) -> str:
    """A role's processes as their histories name them: ``worker-2`` records as ``w2``
    (``w2#1``, ``w2#2``, ... by incarnation), ``copier-0`` as ``c0``, ``racer-1`` as ``r1``."""
    kind, _, index = role.partition("-")
    return f"{kind[:1]}{index}"


def longest_wait_beside_a_stop(events: list[Event]) -> dict[str, Any] | None:
    """The longest step of any client while another process was stopped: what a stopped
    process holding locks cost the others (docs/design.md rule 34 bounds it). Reported,
    not judged: it depends on the machine."""
    windows = stop_windows(events)
    if not windows:
        return None
    last: dict[str, Event] = {}
    longest: dict[str, Any] | None = None
    for e in events:
        process = e["process"]
        if process == "nemesis":
            continue
        begun = last.get(process)
        last[process] = e
        if begun is None or begun["type"] != INVOKE or begun["f"] not in WAITED_STEPS:
            continue
        name = process.split("#")[0]
        start, end = begun["mono"], e["mono"]
        for w_from, w_to, stopped in windows:
            if history_name(stopped) != name and start < w_to and end > w_from:
                if longest is None or end - start > longest["seconds"]:
                    longest = {
                        "seconds": round(end - start, 3),
                        "process": process,
                        "step": begun["f"],
                        "while_stopped": stopped,
                    }
                break
    return longest


def progress(events: list[Event]) -> dict[str, int]:
    """What a run has done so far, as flat counts: ``f:type`` of every operation (as in
    ``operation_stats``), and ``worker_transactions:ok`` and the like."""
    counts: dict[str, int] = dict(operation_stats(events)["operations"])
    txns = collect_txns(events).values()
    for group, copier in (("worker", False), ("copier", True)):
        outcomes = Counter(t.outcome for t in txns if t.copier == copier)
        counts.update({f"{group}_transactions:{k}": n for k, n in outcomes.items()})
    return counts


def check(
    events: list[Event], dump: dict[str, Any], transform: Callable[[str], str] = str.upper
) -> Result:
    anomalies: dict[str, list[dict[str, Any]]] = {k: [] for k in ANOMALIES}

    def report(kind: str, **details: Any) -> None:
        anomalies[kind].append(details)

    events = sorted(events, key=lambda e: e["mono"])
    log = Log.from_dump(dump["committed"])
    txns = collect_txns(events)
    check_log(dump, log, report)
    resolved = check_transactions(txns, log, report)
    check_abort_after_commit(events, report)
    check_races(events, txns, report)
    read_stats = check_reads(events, txns, log, report)
    check_phantom_writes(txns, log, report, dump["copy"]["input"])
    check_copy(dump, log, report, transform)
    check_final_read(dump, log, report)
    stats = operation_stats(events)
    for group, copier in (("worker", False), ("copier", True)):
        outcomes = Counter(t.outcome for t in txns.values() if t.copier == copier)
        stats[f"{group}_transactions"] = {k: outcomes.get(k, 0) for k in (OK, FAIL, INFO)}
    stats["info_resolved"] = resolved
    stats["longest_wait_beside_a_stop"] = longest_wait_beside_a_stop(events)
    stats.update(read_stats)
    stats["committed_records"] = {
        t: sum(len(v) for (tt, _p), v in log.values.items() if tt == t)
        for t in {k[0] for k in log.values}
    }
    return Result(anomalies, stats)
