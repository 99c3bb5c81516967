"""Operation histories: one JSON-lines file per process incarnation.

Each line is an event ``{"type": invoke|ok|fail|info, "f": ..., "process": ...,
"mono": ..., "wall": ...}`` plus fields of the operation. ``info`` means the outcome is
unknown (a crash, a lost connection, a timeout during commit); the checker decides such
operations from the final log, never the history. Lines are flushed one by one so that a
SIGKILL loses at most the line being written; a torn last line is skipped on reading.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

Event = dict[str, Any]

INVOKE = "invoke"
OK = "ok"
FAIL = "fail"
INFO = "info"


class HistoryWriter:
    """Appends events of one process; ``mono`` is CLOCK_MONOTONIC, which is shared by all
    processes of one machine, so events of different processes can be ordered by it."""

    def __init__(self, path: Path, process: str) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.process = process
        self._fh: TextIO = open(path, "a", encoding="utf-8")  # noqa: SIM115 - long-lived

    @classmethod
    def of_incarnation(cls, out: Path, name: str, incarnation: int) -> HistoryWriter:
        """The history of one incarnation of a restarted process: a file of its own, its
        events told apart from the previous incarnations' by ``name#incarnation``."""
        return cls(out / "history" / f"{name}-{incarnation}.jsonl", f"{name}#{incarnation}")

    def record(self, type_: str, f: str, **fields: Any) -> Event:
        event: Event = {
            "type": type_,
            "f": f,
            "process": self.process,
            "pid": os.getpid(),
            "mono": time.monotonic(),
            "wall": time.time(),
            **fields,
        }
        self._fh.write(json.dumps(event, separators=(",", ":")) + "\n")
        self._fh.flush()
        return event

    def close(self) -> None:
        self._fh.close()


def read_events(path: Path) -> Iterator[Event]:
    with open(path, encoding="utf-8") as fh:
        for line in fh:
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                continue  # the last line of a process killed while writing it


def load_histories(directory: Path) -> list[Event]:
    """All events of a run, ordered by monotonic time."""
    events = [e for path in sorted(directory.glob("*.jsonl")) for e in read_events(path)]
    events.sort(key=lambda e: e["mono"])
    return events
