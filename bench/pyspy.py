"""A sampled profile of a running Python process (py-spy), and its top costs.

py-spy attaches to the process by its pid (ptrace) and samples its Python stacks without
stopping it (``--nonblocking``), so the process runs as it does unprofiled, give or take
the sampler's own CPU. Only the thread holding the GIL is sampled (``--gil``): a thread
waiting for PostgreSQL, for a socket or for work does not hold it, so the samples are the
Python code the process ran, and their count over the samples a whole run would take is
how busy its interpreter was. The samples are kept as py-spy's raw (collapsed) stacks, one
line per distinct stack with its count, which flamegraph tools read.
"""

from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

# A frame as py-spy writes it: "function (path/to/file.py:line)".
_LINE = re.compile(r":\d+\)$")
RATE = 100  # samples a second


def py_spy() -> str:
    """The py-spy command: the one beside this Python (the project's .venv), else on PATH."""
    beside = Path(sys.executable).parent / "py-spy"
    found = str(beside) if beside.exists() else shutil.which("py-spy")
    if found is None:
        raise RuntimeError("py-spy is not installed (pip install -e '.[dev]')")
    return found


@contextmanager
def profiled(pid: int, out: Path, rate: int = RATE) -> Iterator[None]:
    """Sample process ``pid`` (``rate`` times a second, the thread holding the GIL) while
    the block runs; its stacks written to ``out``."""
    spy = subprocess.Popen(
        [py_spy(), "record", "--pid", str(pid), "--format", "raw", "--rate", str(rate),
         "--gil", "--nonblocking", "--output", str(out)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes its output when interrupted
        _, err = spy.communicate(timeout=60)
    if not out.exists():
        raise RuntimeError(f"py-spy wrote no profile (exit {spy.returncode}): {err[-2000:]}")


def _frames(folded: str) -> Iterator[tuple[list[str], int]]:
    for line in folded.splitlines():
        stack, _, count = line.rpartition(" ")
        if stack and count.isdigit():
            yield [_LINE.sub(")", frame) for frame in stack.split(";")], int(count)


def samples(folded: str) -> int:
    return sum(count for _, count in _frames(folded))


def top_costs(folded: str, of: float, n: int = 12) -> list[tuple[str, float]]:
    """The ``n`` functions most often on top of the stack (their own time, not their
    callees'), each with its samples over ``of`` (the samples the whole run would take:
    its share of the run's time)."""
    own: Counter[str] = Counter()
    for frames, count in _frames(folded):
        own[frames[-1]] += count
    return [(frame, count / of) for frame, count in own.most_common(n)]


def top_inclusive(
    folded: str, of: float, within: str = "app/", n: int = 12
) -> list[tuple[str, float]]:
    """The ``n`` functions of files under ``within`` most often anywhere on the stack
    (their time with their callees'), each with its samples over ``of``."""
    seen: Counter[str] = Counter()
    for frames, count in _frames(folded):
        for frame in set(frames):
            if f"({within}" in frame or f"/{within}" in frame:
                seen[frame] += count
    return [(frame, count / of) for frame, count in seen.most_common(n)]
