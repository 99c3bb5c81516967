"""Named fault points for fault-injection tests of recovery.

``KIP98_CRASH_AT=<name>`` makes the process kill itself with SIGKILL when it reaches that
point, so tests exercise the real thing (a process dying with a DB transaction in flight)
rather than a simulation. ``KIP98_STOP_AT=<name>`` makes it stop itself with SIGSTOP there,
the first time only: a paused process holding whatever that point holds, until someone
sends SIGCONT. With ``KIP98_CRASH_ONCE_DIR`` also set, the crash happens once across
processes: the first process to reach the point leaves a file of its name there and dies,
the others (a retried Spark task, say) go on. Unset, a fault point costs two environment
lookups.
"""

from __future__ import annotations

import os
import signal
import threading

ENV = "KIP98_CRASH_AT"
STOP_ENV = "KIP98_STOP_AT"
ONCE_ENV = "KIP98_CRASH_ONCE_DIR"

_stopped: set[str] = set()


def crash_point(name: str) -> None:
    if os.environ.get(ENV) == name and _first_crash(name):
        os.kill(os.getpid(), signal.SIGKILL)
    if os.environ.get(STOP_ENV) == name and name not in _stopped:
        _stopped.add(name)
        # Raised on this thread, the stop takes it here and now. Sent to the process
        # (os.kill), the kernel may hand it to another thread first, and this one would
        # run on past the point until that thread stops them all.
        signal.pthread_kill(threading.get_ident(), signal.SIGSTOP)


def _first_crash(name: str) -> bool:
    once = os.environ.get(ONCE_ENV)
    if not once:
        return True
    try:  # O_EXCL: of racing processes exactly one creates it
        os.close(os.open(os.path.join(once, name), os.O_CREAT | os.O_EXCL | os.O_WRONLY))
    except FileExistsError:
        return False
    return True
