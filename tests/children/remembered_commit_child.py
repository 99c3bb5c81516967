"""A transactional producer for the one-query commit's crash test (docs/design.md §3.11).
argv: the database URL, then "offsets" or nothing. Commits "a"/"b" (the lock's way) and
"c"/"d" (one query) to partitions 0 and 1 of topic "t", then "x"/"y", inside whose query
string the process kills itself (``commit.in_one_query``, set once the second commit is
in). With "offsets", each transaction also sends group "g" the position 1, 2, 3 of
partition 0 of "t" (send_offsets_to_transaction)."""

from __future__ import annotations

import os
import sys

from app.client import ConsumerGroupMetadata, Producer, TopicPartition
from app.faults import ENV


def main(url: str, offsets: bool) -> None:
    with Producer({"database.url": url, "transactional.id": "tx", "linger.ms": 5_000}) as p:
        p.init_transactions()
        for n, (first, second) in enumerate((("a", "b"), ("c", "d"), ("x", "y")), start=1):
            if first == "x":
                os.environ[ENV] = "commit.in_one_query"
            p.begin_transaction()
            p.produce("t", value=first.encode(), partition=0)
            p.produce("t", value=second.encode(), partition=1)
            if offsets:
                position = [TopicPartition("t", 0, n)]
                p.send_offsets_to_transaction(position, ConsumerGroupMetadata("g"))
            p.commit_transaction()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2:] == ["offsets"])
