"""The overview's time series, derived from the tables for the window shown, so they are
there the moment the console starts and the same in every console process: produce
rate, commit rate, commit latency, and the LSO lag of the busiest partitions.

What each reads, bounded whatever the log's size (no scan of ``records``):

- **Commits** come from the coordinator's log: its last ``EVENTS`` events by primary key.
  A commit is a COMPLETE_COMMIT at its time; its latency, that time less the PREPARE_COMMIT
  before it of the same transactional id (EndTxn to the markers written). When more
  events than that fall in the window, the series start at the oldest event read
  (``horizon_ms``), not at the window's start.
- **Records appended** come from the records' own timestamps, probed by primary key: in
  each partition with a record in the window, the record at ``high watermark - d`` for d
  = 1, √2, 2, 2√2, … and at its log start (at most 82 point reads a partition). Between probes the offset is
  interpolated in time, so a rate is exact at steady production and smoothed between
  probes otherwise; timestamps are the producers' (CreateTime) unless a topic says
  LogAppendTime, so a producer's skewed clock skews them.
- **The LSO lag** of a partition at a moment is the records appended since the oldest
  transaction then open on it was added to it (the LSO stays at that transaction's first
  offset until its marker). Which transactions were open when comes from the same
  events (each names its partitions and start), and from the transactions still open;
  the partitions drawn are the five that took the most records in the window; the point
  at now is the partition's own lag.

Everything here but ``read`` is pure.
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from app.console import sql

WINDOW_MS = 10 * 60_000
POINTS = 20
EVENTS = 20_000
BUSIEST = 5
_OPEN = ("BEGIN", "PREPARE_COMMIT", "PREPARE_ABORT")

Point = tuple[int, float]


@dataclass(frozen=True)
class Probes:
    """A partition's (offset, timestamp) probes, oldest first, and its high watermark."""

    topic: str
    partition: int
    high_watermark: int
    offsets: list[int]
    times: list[int]  # made non-decreasing in offset (a later record cannot be earlier)
    last_stable_offset: int | None = None  # now; None: the high watermark

    @classmethod
    def of(
        cls,
        topic: str,
        partition: int,
        hw: int,
        pairs: list[tuple[int, int]],
        lso: int | None = None,
    ) -> Probes:
        pairs = sorted(pairs)
        times, top = [], -(2**63)
        for _o, t in pairs:
            top = max(top, t)
            times.append(top)
        return cls(topic, partition, hw, [o for o, _t in pairs], times, lso)

    @property
    def lag_now(self) -> int:
        lso = self.high_watermark if self.last_stable_offset is None else self.last_stable_offset
        return max(self.high_watermark - lso, 0)

    def appended_before(self, at_ms: int) -> float:
        """About how many offsets the partition had by ``at_ms`` (interpolated)."""
        if not self.offsets:
            return float(self.high_watermark)
        i = bisect.bisect_left(self.times, at_ms)
        if i == len(self.times):
            return float(self.high_watermark) if at_ms > self.times[-1] else self.offsets[-1] + 1
        if i == 0:
            return float(self.offsets[0])
        o0, t0, o1, t1 = self.offsets[i - 1], self.times[i - 1], self.offsets[i], self.times[i]
        return o0 + 1 + (o1 - o0) * (at_ms - t0) / max(t1 - t0, 1)


@dataclass(frozen=True)
class Span:
    """A transaction's stay on a partition: from its addition to its markers (None: open)."""

    topic: str
    partition: int
    start_ms: int
    end_ms: int | None


def bucket_ends(now_ms: int, window_ms: int = WINDOW_MS, points: int = POINTS) -> list[int]:
    step = window_ms // points
    return [now_ms - window_ms + step * (i + 1) for i in range(points)]


def produce_rate(probes: list[Probes], ends: list[int], step_ms: int) -> list[Point]:
    out = []
    for end in ends:
        n = sum(max(p.appended_before(end) - p.appended_before(end - step_ms), 0) for p in probes)
        out.append((end, n * 1000 / step_ms))
    return out


def commits(
    events: list[dict[str, Any]], ends: list[int], step_ms: int, horizon_ms: int
) -> tuple[list[Point], list[Point]]:
    """The commit rate and the mean commit latency per bucket, from events oldest first;
    buckets before ``horizon_ms`` (older than the events read) are left out."""
    prepared: dict[str, int] = {}
    done: list[tuple[int, int | None]] = []
    for e in events:
        if e["state"] == "PREPARE_COMMIT":
            prepared[e["transactional_id"]] = e["updated_ms"]
        elif e["state"] == "COMPLETE_COMMIT":
            started = prepared.pop(e["transactional_id"], None)
            done.append((e["updated_ms"], None if started is None else e["updated_ms"] - started))
    rate: list[Point] = []
    latency: list[Point] = []
    for end in ends:
        if end - step_ms < horizon_ms:
            continue
        inside = [lat for at, lat in done if end - step_ms < at <= end]
        rate.append((end, len(inside) * 1000 / step_ms))
        known = [lat for lat in inside if lat is not None]
        if known:
            latency.append((end, sum(known) / len(known)))
    return rate, latency


def spans(events: list[dict[str, Any]], still_open: list[dict[str, Any]]) -> list[Span]:
    """Each transaction's stay on each of its partitions: added at the first event naming
    the partition, ended at its COMPLETE_* (the markers written), open otherwise."""
    added: dict[tuple[str, int, str, int], int] = {}
    ended: dict[tuple[str, int], int] = {}
    for e in events:
        txn = (e["transactional_id"], int(e["txn_start_ms"]))
        for t, p in e["partitions"] or []:
            added.setdefault((*txn, str(t), int(p)), int(e["updated_ms"]))
        if str(e["state"]).startswith("COMPLETE_"):
            ended[txn] = int(e["updated_ms"])
    for o in still_open:  # begun before the events read: its start is all that is known
        txn = (o["transactional_id"], int(o["txn_start_ms"]))
        for t, p in o["partitions"] or []:
            added.setdefault((*txn, str(t), int(p)), int(o["txn_start_ms"]))
    return [
        Span(t, p, at, ended.get((tid, start)))
        for (tid, start, t, p), at in added.items()
        if (tid, start) in ended or any(o["transactional_id"] == tid for o in still_open)
    ]


def lso_lag(probes: Probes, spans_here: list[Span], ends: list[int]) -> list[Point]:
    """The lag at each of ``ends``; the last point, at now, is the partition's own (its
    high watermark less its LSO). A transaction the coordinator still holds open on a
    partition with nothing open now was closed by a marker it did not write (KIP-664's
    abort): it is taken to end with the partition's last record."""
    if probes.lag_now == 0 and probes.times:
        spans_here = [
            s if s.end_ms is not None else Span(s.topic, s.partition, s.start_ms, probes.times[-1])
            for s in spans_here
        ]
    out = []
    for end in ends:
        starts = [
            s.start_ms
            for s in spans_here
            if s.start_ms <= end and (s.end_ms is None or s.end_ms > end)
        ]
        lag = probes.appended_before(end) - probes.appended_before(min(starts)) if starts else 0
        out.append((end, max(float(lag), 0.0)))
    if out:
        out[-1] = (out[-1][0], float(probes.lag_now))
    return out


def derive(
    now_ms: int,
    probes: list[Probes],
    events: list[dict[str, Any]],
    still_open: list[dict[str, Any]],
    capped: bool,
    window_ms: int = WINDOW_MS,
    points: int = POINTS,
) -> dict[str, Any]:
    """The series for the window ending ``now_ms``; ``events`` oldest first, ``capped``
    when more events may precede them than were read."""
    step = window_ms // points
    ends = bucket_ends(now_ms, window_ms, points)
    horizon = int(events[0]["updated_ms"]) if capped and events else now_ms - window_ms
    commit_rate, latency = commits(events, ends, step, horizon)
    busiest = sorted(
        probes,
        key=lambda p: p.appended_before(now_ms) - p.appended_before(now_ms - window_ms),
        reverse=True,
    )[:BUSIEST]
    all_spans = spans(events, still_open)
    by_partition: dict[tuple[str, int], list[Span]] = defaultdict(list)
    for s in all_spans:
        by_partition[(s.topic, s.partition)].append(s)
    return {
        "window_ms": window_ms,
        "horizon_ms": max(horizon, now_ms - window_ms),
        "produce_rate": produce_rate(probes, ends, step),
        "commit_rate": commit_rate,
        "commit_latency_ms": latency,
        "lso_lag": {
            f"{p.topic}-{p.partition}": lso_lag(p, by_partition[(p.topic, p.partition)], ends)
            for p in busiest
        },
    }


def read(conn: Connection, now_ms: int, window_ms: int = WINDOW_MS) -> dict[str, Any]:
    """The series from the tables (three bounded statements)."""
    since = now_ms - window_ms
    pairs: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    hws: dict[tuple[str, int], tuple[int, int]] = {}
    for r in conn.execute(sql.OFFSET_PROBES, {"since": since}):
        pairs[(r.topic, r.partition)].append((r.offset, r.timestamp))
        hws[(r.topic, r.partition)] = (r.next_offset, r.last_stable_offset)
    probes = []
    for (t, p), ps in pairs.items():
        hw, lso = hws[(t, p)]
        probes.append(Probes.of(t, p, hw, ps, lso))
    events = [dict(r._mapping) for r in conn.execute(sql.RECENT_EVENTS, {"limit": EVENTS})]
    events.reverse()
    still_open = [dict(r._mapping) for r in conn.execute(sql.OPEN_TRANSACTION_SPANS)]
    return derive(now_ms, probes, events, still_open, capped=len(events) == EVENTS)
