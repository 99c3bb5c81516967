"""A transactional producer process for the crash tests: it writes one record to three
partitions and commits, and dies wherever KIP98_CRASH_AT says. With a third argument
``combined``, the three records go with the EndTxn in one request (the Producer's commit)."""

from __future__ import annotations

import sys

from app.broker import Broker
from tests.helpers.txn_driver import TxnDriver


def main() -> None:
    transactional_id = sys.argv[1]
    timeout_ms = int(sys.argv[2]) if len(sys.argv) > 2 else 60_000
    combined = len(sys.argv) > 3 and sys.argv[3] == "combined"
    driver = TxnDriver(Broker.connect(), transactional_id, timeout_ms)
    assert driver.init() == 0
    partitions = [("a", 0), ("b", 1), ("c", 2)]
    if combined:
        batches = driver.requests(*((t, p, f"{transactional_id}-{t}") for t, p in partitions))
        assert driver.commit_with(batches, register=partitions).end.error_code == 0
    else:
        for topic, partition in partitions:
            assert driver.send(topic, partition, f"{transactional_id}-{topic}").error_code == 0
        assert driver.end(commit=True) == 0
    print("committed", flush=True)


if __name__ == "__main__":
    main()
