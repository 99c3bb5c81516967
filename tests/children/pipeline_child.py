"""A process the session-bounds tests pause with SIGSTOP while a pipeline of its waits:
``markers`` locks partition t/0 for markers (``markers.lock_for_markers``) while the test
holds that row, so its statement waits for the lock; ``writes`` sends a request's last
writes (``WriteBehind``), the first of which waits for that row too; ``read`` does too,
with a read after them in the same round trip (as a TxnOffsetCommit reads the version
it leaves).

argv: database URL, ``markers``, ``writes`` or ``read``. Prints its backend's pid, then
waits.
"""

from __future__ import annotations

import sys

from app.broker import Broker
from app.log.markers import lock_for_markers
from app.storage.driver import WriteBehind


def main() -> None:
    broker = Broker.connect(sys.argv[1])
    with broker.engine.begin() as conn:
        driver = conn.connection.driver_connection
        assert driver is not None
        print(driver.info.backend_pid, flush=True)
        if sys.argv[2] == "markers":
            lock_for_markers(conn, [("t", 0)], producer_id=1)
        else:
            writes = WriteBehind()
            writes.add("SELECT 1 FROM partitions WHERE topic = 't' FOR UPDATE", {})
            writes.add("SELECT 1", {})
            read = ("SELECT %(n)s", {"n": 7}) if sys.argv[2] == "read" else None
            assert writes.send(conn, read) == ((7,) if read else None)
        print("done", flush=True)


if __name__ == "__main__":
    main()
