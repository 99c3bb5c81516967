"""An idempotent producer process that writes "a", then "b": its second batch goes on the
partition row it remembers, in one query string (docs/design.md §3.9), where the tests
kill it (``KIP98_CRASH_AT=append.in_one_query``). argv: database URL."""

from __future__ import annotations

import sys

from app.client import Producer


def main() -> None:
    producer = Producer({"database.url": sys.argv[1], "linger.ms": 0})
    for value in ("a", "b"):
        producer.produce("t", value=value.encode(), partition=0)
        assert producer.flush(60) == 0
    producer.close()


if __name__ == "__main__":
    main()
