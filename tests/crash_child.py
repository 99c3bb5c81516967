"""A transactional producer process for the crash tests: it writes one record to three
partitions and commits, and dies wherever KIP98_CRASH_AT says."""

from __future__ import annotations

import sys

from app.broker import Broker
from tests.txn_driver import TxnDriver


def main() -> None:
    transactional_id = sys.argv[1]
    timeout_ms = int(sys.argv[2]) if len(sys.argv) > 2 else 60_000
    driver = TxnDriver(Broker.connect(), transactional_id, timeout_ms)
    assert driver.init() == 0
    for topic, partition in (("a", 0), ("b", 1), ("c", 2)):
        assert driver.send(topic, partition, f"{transactional_id}-{topic}").error_code == 0
    assert driver.end(commit=True) == 0
    print("committed", flush=True)


if __name__ == "__main__":
    main()
