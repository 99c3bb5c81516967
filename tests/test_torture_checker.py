"""The torture checker against hand-made histories: a clean run passes, and each kind of
broken history is caught by its own check (and only a few others)."""

from __future__ import annotations

import copy
import itertools
from typing import Any

from app.torture.checker import ANOMALIES, check, longest_wait_beside_a_stop
from app.torture.history import Event

T, C = "torture", "torture-copy"


class History:
    """Builds events with increasing monotonic times, as processes would record them."""

    def __init__(self) -> None:
        self.events: list[Event] = []
        self._clock = itertools.count(1)

    def add(self, type_: str, f: str, process: str, **fields: Any) -> None:
        t = float(next(self._clock))
        self.events.append(
            {"type": type_, "f": f, "process": process, "mono": t, "wall": t, **fields}
        )

    def txn(
        self, process: str, txn: str, sends: list[tuple[str, int, str]], outcome: str = "ok"
    ) -> None:
        self.add("invoke", "txn", process, txn=txn)
        for s in sends:
            self.add("invoke", "send", process, txn=txn, sends=[list(s)])
        if outcome != "fail":
            self.add("invoke", "commit", process, txn=txn)
        if outcome != "none":
            self.add(outcome, "txn", process, txn=txn)

    def poll(self, process: str, records: list[tuple[str, int, int, str]]) -> None:
        self.add("invoke", "poll", process)
        self.add("ok", "poll", process, records=[list(r) for r in records])

    def assign(self, process: str, starts: list[tuple[str, int, int | None]]) -> None:
        self.add("ok", "assign", process, start=[list(s) for s in starts])


def make_dump(
    committed: dict[str, dict[int, list[tuple[int, str]]]],
    next_offsets: dict[tuple[str, int], int],
    group: dict[int, int],
) -> dict[str, Any]:
    partitions = []
    stats = []
    for (topic, p), nxt in sorted(next_offsets.items()):
        partitions.append(
            {
                "topic": topic,
                "partition": p,
                "log_start_offset": 0,
                "next_offset": nxt,
                "last_stable_offset": nxt,
            }
        )
        if nxt:
            stats.append(
                {
                    "topic": topic,
                    "partition": p,
                    "rows": nxt,
                    "distinct": nxt,
                    "min": 0,
                    "max": nxt - 1,
                }
            )
    final = [
        [t, p, o, v] for t, parts in committed.items() for p, rows in parts.items() for o, v in rows
    ]
    return {
        "partitions": partitions,
        "committed": {
            t: {str(p): [[o, v] for o, v in rows] for p, rows in parts.items()}
            for t, parts in committed.items()
        },
        "offset_stats": stats,
        "aborted_txns": [],
        "group_offsets": {"copiers": [[T, p, o] for p, o in group.items()]},
        "pending_txn_offsets": 0,
        "copy": {"group": "copiers", "input": T, "output": C, "partitions": 2},
        "final_read": {"complete": True, "seconds": 0.1, "records": final},
    }


def clean_run() -> tuple[History, dict[str, Any]]:
    """Two partitions; w0 commits a transaction over both, aborts one, commits another; a
    reader polls everything; a copier copies partition 0 and 1 exactly once."""
    h = History()
    h.assign("r#1", [(T, 0, 0), (T, 1, 0)])
    h.txn("w0#1", "w0-1", [(T, 0, "w0-1"), (T, 1, "w0-2")])  # offsets 0 (p0), 0 (p1), markers 1
    h.txn("w0#1", "w0-2", [(T, 0, "w0-3")], outcome="fail")  # offset 2 aborted, marker 3
    h.txn("w0#1", "w0-3", [(T, 0, "w0-4"), (T, 1, "w0-5")])  # p0: 4 (+marker 5), p1: 2 (+marker 3)
    h.poll("r#1", [(T, 0, 0, "w0-1"), (T, 1, 0, "w0-2"), (T, 0, 4, "w0-4")])
    h.poll("r#1", [(T, 1, 2, "w0-5")])
    h.txn("c0#1", "c0-1", [(C, 0, "W0-1"), (C, 0, "W0-4"), (C, 1, "W0-2"), (C, 1, "W0-5")])
    committed = {
        T: {0: [(0, "w0-1"), (4, "w0-4")], 1: [(0, "w0-2"), (2, "w0-5")]},
        C: {0: [(0, "W0-1"), (1, "W0-4")], 1: [(0, "W0-2"), (1, "W0-5")]},
    }
    nexts = {(T, 0): 6, (T, 1): 4, (C, 0): 3, (C, 1): 3}
    return h, make_dump(committed, nexts, {0: 6, 1: 4})


def found(h: History, dump: dict[str, Any]) -> dict[str, int]:
    return {k: n for k, n in check(h.events, dump).counts().items() if n}


def test_clean_history_passes() -> None:
    h, dump = clean_run()
    result = check(h.events, dump)
    assert result.ok, result.anomalies
    assert result.stats["worker_transactions"] == {"ok": 2, "fail": 1, "info": 0}
    assert result.stats["reads"] == 4
    assert set(result.counts()) == set(ANOMALIES)


def test_unknown_outcomes_are_decided_by_the_log() -> None:
    h, dump = clean_run()
    h.txn("w1#1", "w1-1", [(T, 0, "w1-1")], outcome="info")  # never committed: fine
    h.txn("w1#1", "w1-2", [(T, 1, "w1-2")], outcome="none")  # process died: fine
    result = check(h.events, dump)
    assert result.ok, result.anomalies
    assert result.stats["info_resolved"] == {"aborted": 2}


def test_injected_duplicate() -> None:
    h, dump = clean_run()
    dump["committed"][T]["1"].append([3, "w0-1"])
    dump["final_read"]["records"].append([T, 1, 3, "w0-1"])
    assert "duplicate" in found(h, dump)


def test_aborted_read() -> None:
    h, dump = clean_run()
    h.poll("r#2", [(T, 0, 2, "w0-3")])
    got = found(h, dump)
    assert got.get("aborted-read") == 1
    assert got.get("uncommitted-read") == 1  # offset 2 is not in the committed log either


def test_read_of_an_unknown_outcome_that_never_committed_is_an_aborted_read() -> None:
    h, dump = clean_run()
    h.txn("w1#1", "w1-1", [(T, 0, "w1-1")], outcome="info")
    h.poll("r#2", [(T, 0, 6, "w1-1")])
    assert found(h, dump).get("aborted-read") == 1


def test_lost_write() -> None:
    h, dump = clean_run()
    h.txn("w1#1", "w1-1", [(T, 0, "w1-9")])
    assert found(h, dump) == {"lost-write": 1}


def test_torn_transaction() -> None:
    h, dump = clean_run()
    dump["committed"][T]["1"].remove([2, "w0-5"])
    dump["final_read"]["records"].remove([T, 1, 2, "w0-5"])
    got = found(h, dump)
    assert got.get("torn-transaction") == 1
    assert got.get("lost-write") == 1


def test_torn_transaction_of_unknown_outcome() -> None:
    h, dump = clean_run()
    h.txn("w1#1", "w1-1", [(T, 0, "w1-1"), (T, 1, "w1-2")], outcome="info")
    dump["committed"][T]["0"].append([6, "w1-1"])
    dump["final_read"]["records"].append([T, 0, 6, "w1-1"])
    dump["partitions"][0].update(next_offset=8, last_stable_offset=8)
    dump["offset_stats"][0].update(rows=8, distinct=8, max=7)
    assert found(h, dump).get("torn-transaction") == 1


def test_poll_skip() -> None:
    h, dump = clean_run()
    h.assign("r#2", [(T, 0, 0)])
    h.poll("r#2", [(T, 0, 4, "w0-4")])  # offset 0 is committed and was jumped over
    assert found(h, dump) == {"poll-skip": 1}


def test_poll_skip_is_not_judged_across_a_reset() -> None:
    h, dump = clean_run()
    h.assign("r#2", [(T, 0, 0)])
    h.poll("r#2", [(T, 0, 0, "w0-1")])
    h.add("ok", "seek", "r#2", start=[[T, 0, 4]])
    h.poll("r#2", [(T, 0, 4, "w0-4")])
    assert check(h.events, dump).ok


def test_non_monotonic_poll() -> None:
    h, dump = clean_run()
    h.assign("r#2", [(T, 0, 0)])
    h.poll("r#2", [(T, 0, 0, "w0-1"), (T, 0, 4, "w0-4"), (T, 0, 0, "w0-1")])
    assert found(h, dump) == {"nonmonotonic-poll": 1}


def test_non_monotonic_offsets_in_the_log() -> None:
    h, dump = clean_run()
    dump["offset_stats"][0].update(rows=7, distinct=6)  # an offset written twice
    assert found(h, dump) == {"offset-anomaly": 1}


def test_read_before_commit_was_asked() -> None:
    h, dump = clean_run()
    h.add("invoke", "txn", "w1#1", txn="w1-1")
    h.add("invoke", "send", "w1#1", txn="w1-1", sends=[[T, 1, "w1-1"]])
    h.poll("r#2", [(T, 1, 4, "w1-1")])
    h.add("invoke", "commit", "w1#1", txn="w1-1")
    h.add("ok", "txn", "w1#1", txn="w1-1")
    dump = copy.deepcopy(dump)
    dump["committed"][T]["1"].append([4, "w1-1"])
    dump["final_read"]["records"].append([T, 1, 4, "w1-1"])
    dump["partitions"][1].update(next_offset=6, last_stable_offset=6)
    dump["offset_stats"][1].update(rows=6, distinct=6, max=5)
    got = found(h, dump)
    assert got.get("premature-read") == 1
    assert not got.get("aborted-read") and not got.get("uncommitted-read")


def test_copy_duplicate_and_loss() -> None:
    h, dump = clean_run()
    dump["committed"][C]["0"] = [[0, "W0-1"], [1, "W0-1"], [2, "W0-4"]]
    dump["committed"][C]["1"] = [[0, "W0-2"]]
    dump["final_read"]["records"] = [r for r in dump["final_read"]["records"] if r[0] != C]
    dump["final_read"]["records"] += [
        [C, 0, 0, "W0-1"],
        [C, 0, 1, "W0-1"],
        [C, 0, 2, "W0-4"],
        [C, 1, 0, "W0-2"],
    ]
    got = found(h, dump)
    assert got.get("copy-mismatch") == 2
    assert got.get("duplicate") == 1


def test_lso_stuck_and_liveness() -> None:
    h, dump = clean_run()
    dump["partitions"][0]["last_stable_offset"] = 3
    dump["final_read"]["complete"] = False
    got = found(h, dump)
    assert got.get("lso-not-hw") == 1
    assert got.get("liveness") == 1


def test_acknowledged_abort_that_became_visible() -> None:
    h, dump = clean_run()
    h.txn("w1#1", "w1-1", [(T, 0, "w1-1")], outcome="fail")
    dump["committed"][T]["0"].append([6, "w1-1"])
    dump["final_read"]["records"].append([T, 0, 6, "w1-1"])
    dump["partitions"][0].update(next_offset=8, last_stable_offset=8)
    dump["offset_stats"][0].update(rows=8, distinct=8, max=7)
    got = found(h, dump)
    assert got.get("aborted-visible") == 1
    assert got.get("commit-without-request") == 1


def test_abort_accepted_after_a_commit_timed_out() -> None:
    """Refused, an abort after a timed-out commit is fine and the commit's outcome counts;
    accepted, it breaks the contract, and when the transaction committed, the told
    "aborted" contradicts the log."""
    h, dump = clean_run()
    h.txn("w1#1", "w1-1", [(T, 0, "w1-1")], outcome="none")
    h.add("invoke", "abort-after-commit", "w1#1", txn="w1-1")
    h.add("fail", "abort-after-commit", "w1#1", txn="w1-1", error="refused")
    h.add("ok", "txn", "w1#1", txn="w1-1")
    h.txn("w1#1", "w1-2", [(T, 1, "w1-2")], outcome="none")
    h.add("invoke", "abort-after-commit", "w1#1", txn="w1-2")
    h.add("ok", "abort-after-commit", "w1#1", txn="w1-2")
    h.add("fail", "txn", "w1#1", txn="w1-2")
    dump["committed"][T]["0"].append([6, "w1-1"])
    dump["committed"][T]["1"].append([4, "w1-2"])
    dump["final_read"]["records"] += [[T, 0, 6, "w1-1"], [T, 1, 4, "w1-2"]]
    dump["partitions"][0].update(next_offset=8, last_stable_offset=8)
    dump["partitions"][1].update(next_offset=6, last_stable_offset=6)
    dump["offset_stats"][0].update(rows=8, distinct=8, max=7)
    dump["offset_stats"][1].update(rows=6, distinct=6, max=5)
    got = found(h, dump)
    del got["copy-lagging"]  # the copier did not copy the new records: not judged here
    assert got == {"abort-after-commit": 1, "aborted-visible": 1}, got


def test_commit_of_an_instance_fenced_by_a_racer() -> None:
    """Two racers on one fresh id: r1's init started after r0's returned, so r0's commit
    asked after r1's init returned must have failed; r1's own commit is fine."""
    h, dump = clean_run()
    h.add("invoke", "race-init", "r0#1", tid="race-1")
    h.add("ok", "race-init", "r0#1", tid="race-1")
    h.add("invoke", "race-init", "r1#1", tid="race-1")
    h.add("ok", "race-init", "r1#1", tid="race-1")
    for racer in ("r0", "r1"):
        h.add("invoke", "txn", f"{racer}#1", txn=f"{racer}-1", tid="race-1")
        h.add("invoke", "commit", f"{racer}#1", txn=f"{racer}-1")
        h.add("ok", "txn", f"{racer}#1", txn=f"{racer}-1")
    got = found(h, dump)
    assert got == {"zombie-commit": 1}, got
    assert check(h.events, dump).anomalies["zombie-commit"][0]["txn"] == "r0-1"


def test_the_longest_wait_beside_a_stop_is_another_clients_step_during_it() -> None:
    """What a stopped process cost the others: the longest step of another client while it
    was stopped; the stopped process's own steps, and steps outside stops, do not count."""
    h = History()
    h.add("invoke", "poll", "w1#1")  # t=1: a step before any stop
    h.add("ok", "poll", "w1#1")  # t=2
    h.add("invoke", "fault", "nemesis", kind="stall")  # t=3: worker-0 stopped
    h.add("invoke", "send", "w0#2")  # t=4: the stopped one's own step
    h.add("invoke", "send", "w1#1")  # t=5: another client's step begins...
    h.add("ok", "fault", "nemesis", kind="stall", target="worker-0 (4 stops, 1 past the bound)")
    h.add("invoke", "commit", "w1#1")  # t=7: ...and ends with its next event
    h.add("ok", "poll", "w0#2")  # t=8
    assert longest_wait_beside_a_stop(h.events) == {
        "seconds": 2.0,
        "process": "w1#1",
        "step": "send",
        "while_stopped": "worker-0",
    }
    quiet = History()
    quiet.add("invoke", "poll", "w1#1")
    quiet.add("ok", "poll", "w1#1")
    assert longest_wait_beside_a_stop(quiet.events) is None
