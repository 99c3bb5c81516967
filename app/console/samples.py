"""The overview's time series: produce rate, commit rate, commit latency and LSO lag,
sampled by the console while it runs (the database keeps no history of them).

Each sample reads the partitions' offsets (one row per partition) and the coordinator's
events since the last sample (by ``event_id``, the log's primary key), so a sample costs
the same on a log of millions of records. A commit's latency is its COMPLETE_COMMIT's
time less its PREPARE_COMMIT's: EndTxn to the markers written. ``rates`` is pure.
"""

from __future__ import annotations

import threading
from collections import deque
from dataclasses import dataclass
from itertools import pairwise
from typing import Any

from app.console import sql
from app.storage.context import BrokerContext

INTERVAL_S = 5.0
KEEP = 120  # ten minutes of samples
_EVENTS_PER_SAMPLE = 50_000


@dataclass(frozen=True)
class Sample:
    at_ms: int
    records: int  # the sum of the high watermarks
    lso_lag: int  # the sum of high watermark - LSO
    commits: int  # COMPLETE_COMMIT events since the previous sample
    commit_latency_ms: float | None  # their mean latency


def rates(samples: list[Sample]) -> dict[str, list[tuple[int, float]]]:
    """Each series as (time, value) points: the rates per second between samples."""
    out: dict[str, list[tuple[int, float]]] = {
        "produce_rate": [], "commit_rate": [], "commit_latency_ms": [], "lso_lag": [],
    }  # fmt: skip
    for before, s in pairwise(samples):
        seconds = max((s.at_ms - before.at_ms) / 1000, 1e-3)
        out["produce_rate"].append((s.at_ms, max(s.records - before.records, 0) / seconds))
        out["commit_rate"].append((s.at_ms, s.commits / seconds))
        if s.commit_latency_ms is not None:
            out["commit_latency_ms"].append((s.at_ms, s.commit_latency_ms))
    out["lso_lag"] = [(s.at_ms, float(s.lso_lag)) for s in samples]
    return out


class Sampler:
    def __init__(self, broker: BrokerContext) -> None:
        self._broker = broker
        self._samples: deque[Sample] = deque(maxlen=KEEP)
        self._after: int | None = None
        self._prepared: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="console-sampler", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def samples(self) -> list[Sample]:
        return list(self._samples)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.sample()
            except Exception:  # the database away for a while: no point for that moment
                pass
            self._stop.wait(INTERVAL_S)

    def sample(self) -> None:
        with self._broker.engine.connect() as conn:
            totals = conn.execute(sql.OFFSET_TOTALS).one()
            if self._after is None:
                self._after = conn.execute(sql.LAST_EVENT_ID).scalar() or 0
                events: list[Any] = []
            else:
                events = list(
                    conn.execute(
                        sql.EVENTS_AFTER, {"after": self._after, "limit": _EVENTS_PER_SAMPLE}
                    )
                )
        latencies = []
        for e in events:
            self._after = e.event_id
            if e.state == "PREPARE_COMMIT":
                self._prepared[e.transactional_id] = e.updated_ms
            elif e.state == "COMPLETE_COMMIT":
                started = self._prepared.pop(e.transactional_id, None)
                latencies.append(None if started is None else e.updated_ms - started)
        if len(self._prepared) > 100_000:  # ids whose commit never came: forget them
            self._prepared.clear()
        known = [x for x in latencies if x is not None]
        self._samples.append(
            Sample(
                self._broker.clock.now_ms(), int(totals.records or 0), int(totals.lso_lag or 0),
                len(latencies), sum(known) / len(known) if known else None,
            )
        )  # fmt: skip
