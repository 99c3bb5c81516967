"""A transactional producer that gets paused (SIGSTOP) mid-transaction by the test, then
resumed: it reports what the broker answers to its late writes."""

from __future__ import annotations

import sys

from app.broker import Broker
from tests.helpers.txn_driver import TxnDriver


def main() -> None:
    driver = TxnDriver(Broker.connect(), sys.argv[1])
    assert driver.init() == 0
    assert driver.send("a", 0, "before-pause").error_code == 0
    print("paused-here", flush=True)
    sys.stdin.readline()  # the test stops us around here and resumes us later
    late = driver.send("a", 0, "after-pause", register=False).error_code
    add = driver.add(("a", 1))
    end = driver.end(commit=True)
    print(f"{late} {add} {end}", flush=True)


if __name__ == "__main__":
    main()
