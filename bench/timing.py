"""Timing a phase: wall seconds once the server has settled, and CPU-seconds from /proc."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from bench.database import settle


def timed(fn: Callable[[], Any], url: str | None = None, cpu: list[float] | None = None) -> float:
    """Seconds ``fn`` takes; given the database's ``url``, once the server has settled.
    Given ``cpu``, the CPU-seconds the whole machine spent meanwhile (client, server and
    all) are appended to it."""
    if url is not None:
        settle(url)
    busy = 0.0 if cpu is None else machine_busy_s()
    start = time.perf_counter()
    fn()
    elapsed = time.perf_counter() - start
    if cpu is not None:
        cpu.append(machine_busy_s() - busy)
    return elapsed


def best_of(repeats: int, fn: Callable[[], float]) -> float:
    """The least of ``repeats`` timings: the quiet machine's speed, as ``timeit`` takes it."""
    return min(fn() for _ in range(repeats))


def process_cpu_s(pid: int) -> float:
    """CPU-seconds process ``pid`` has spent, all its threads (Linux's /proc/PID/stat)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def machine_busy_s() -> float:
    """CPU-seconds every core of the machine has spent busy since boot (Linux's
    /proc/stat: all but idle and I/O wait)."""
    with open("/proc/stat") as fh:
        ticks = [int(t) for t in fh.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")
