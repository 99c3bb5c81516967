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
  events (each names its partitions and start), and from the transactions still open,
  reduced in SQL to one time per partition and point;
  the partitions drawn are the five that took the most records in the window; the point
  at now is the partition's own lag.

The events are reduced in SQL (a few rows come back, not the events: reading 20,000
events' JSON into Python was most of the overview's time). Everything but ``read`` is
pure.
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
    done: list[tuple[int, int | None]], ends: list[int], step_ms: int, horizon_ms: int
) -> tuple[list[Point], list[Point]]:
    """The commit rate and the mean commit latency per bucket, from the commits' times and
    latencies (None: its PREPARE_COMMIT was older than the events read); buckets before
    ``horizon_ms`` (older than the events read) are left out."""
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


def lso_lag(probes: Probes, oldest_open: dict[int, int], ends: list[int]) -> list[Point]:
    """The lag at each of ``ends``: the records appended since the oldest transaction
    then open on the partition was added to it (``oldest_open``: end -> that time; none:
    nothing open). The last point, at now, is the partition's own lag (its high
    watermark less its LSO)."""
    out = []
    for end in ends:
        since = oldest_open.get(end)
        lag = 0.0 if since is None else probes.appended_before(end) - probes.appended_before(since)
        out.append((end, max(float(lag), 0.0)))
    if out:
        out[-1] = (out[-1][0], float(probes.lag_now))
    return out


def busiest(probes: list[Probes], now_ms: int, window_ms: int = WINDOW_MS) -> list[Probes]:
    """The partitions that took the most records in the window, most first."""
    return sorted(
        probes,
        key=lambda p: p.appended_before(now_ms) - p.appended_before(now_ms - window_ms),
        reverse=True,
    )[:BUSIEST]


def read(conn: Connection, now_ms: int, window_ms: int = WINDOW_MS) -> dict[str, Any]:
    """The series from the tables: three bounded statements, each answering few rows
    (the commits in the window among the last events; the probes; the oldest open
    transaction's start per busiest partition and point)."""
    since = now_ms - window_ms
    step = window_ms // POINTS
    ends = bucket_ends(now_ms, window_ms)
    pairs: dict[tuple[str, int], list[tuple[int, int]]] = defaultdict(list)
    hws: dict[tuple[str, int], tuple[int, int]] = {}
    for r in conn.execute(sql.OFFSET_PROBES, {"since": since}):
        pairs[(r.topic, r.partition)].append((r.offset, r.timestamp))
        hws[(r.topic, r.partition)] = (r.next_offset, r.last_stable_offset)
    probes = []
    for (t, p), ps in pairs.items():
        hw, lso = hws[(t, p)]
        probes.append(Probes.of(t, p, hw, ps, lso))
    rows = conn.execute(sql.RECENT_COMMITS, {"limit": EVENTS, "since": since}).all()
    capped = bool(rows) and rows[0].events == EVENTS
    horizon = int(rows[0].oldest_ms) if capped else since
    done = [(int(r.updated_ms), None if r.latency_ms is None else int(r.latency_ms)) for r in rows]
    commit_rate, latency = commits(done, ends, step, horizon)
    top = busiest(probes, now_ms, window_ms)
    oldest: dict[tuple[str, int], dict[int, int]] = defaultdict(dict)
    if top:
        # A partition with nothing open now: what the coordinator still holds open on it
        # was closed by a marker it did not write (KIP-664's abort), at its last record.
        closed = [p.times[-1] if p.lag_now == 0 and p.times else None for p in top]
        for r in conn.execute(
            sql.OLDEST_OPEN_AT,
            {"limit": EVENTS, "topics": [p.topic for p in top],
             "partitions": [p.partition for p in top], "closed_ms": closed, "ends": ends},
        ):  # fmt: skip
            oldest[(r.topic, r.partition)][int(r.at)] = int(r.oldest_ms)
    return {
        "window_ms": window_ms,
        "horizon_ms": max(horizon, since),
        "produce_rate": produce_rate(probes, ends, step),
        "commit_rate": commit_rate,
        "commit_latency_ms": latency,
        "lso_lag": {
            f"{p.topic}-{p.partition}": lso_lag(p, oldest[(p.topic, p.partition)], ends)
            for p in top
        },
    }
