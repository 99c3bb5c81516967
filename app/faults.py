"""Named fault points for fault-injection tests of recovery.

``KIP98_CRASH_AT=<name>`` makes the process kill itself with SIGKILL when it reaches that
point, so tests exercise the real thing (a process dying with a DB transaction in flight)
rather than a simulation. ``KIP98_STOP_AT=<name>`` makes it stop itself with SIGSTOP there,
the first time only: a paused process holding whatever that point holds, until someone
sends SIGCONT. Unset, a fault point costs two environment lookups.
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "KIP98_CRASH_AT"
STOP_ENV = "KIP98_STOP_AT"

_stopped: set[str] = set()


def crash_point(name: str) -> None:
    if os.environ.get(ENV) == name:
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(STOP_ENV) == name and name not in _stopped:
        _stopped.add(name)
        # Raised on this thread, the stop takes it here and now. Sent to the process
        # (os.kill), the kernel may hand it to another thread first, and this one would
        # run on past the point until that thread stops them all.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)
