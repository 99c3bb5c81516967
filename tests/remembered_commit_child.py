"""A transactional producer for the one-query commit's crash test (docs/design.md §3.11).
argv: the database URL. Commits "a"/"b" (the lock's way) and "c"/"d" (one query) to
partitions 0 and 1 of topic "t", then "x"/"y", inside whose query string the process
kills itself (``commit.in_one_query``, set once the second commit is in)."""

from __future__ import annotations

import os
import sys

from app.client import Producer
from app.faults import ENV


def main(url: str) -> None:
    with Producer({"database.url": url, "transactional.id": "tx", "linger.ms": 5_000}) as p:
        p.init_transactions()
        for first, second in (("a", "b"), ("c", "d"), ("x", "y")):
            if first == "x":
                os.environ[ENV] = "commit.in_one_query"
            p.begin_transaction()
            p.produce("t", value=first.encode(), partition=0)
            p.produce("t", value=second.encode(), partition=1)
            p.commit_transaction()


if __name__ == "__main__":
    main(sys.argv[1])
