"""Named crash points for fault-injection tests of recovery.

``KIP98_CRASH_AT=<name>`` makes the process kill itself with SIGKILL when it reaches that
point, so tests exercise the real thing (a process dying with a DB transaction in flight)
rather than a simulation. Unset, a crash point costs one environment lookup.
"""

from __future__ import annotations

import os
import signal

ENV = "KIP98_CRASH_AT"


def crash_point(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
