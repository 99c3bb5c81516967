"""A producer process the session-bounds tests pause with SIGSTOP inside its first append,
holding the partition lock (``KIP98_STOP_AT=append.after_copy``), then resume.

argv: database URL, ``idempotent`` or a transactional id. Prints what became of its five
records: ``delivered N`` / ``committed`` / ``failed <error name>``.
"""

from __future__ import annotations

import sys

from app.client import KafkaException, Producer


def main() -> None:
    url, mode = sys.argv[1], sys.argv[2]
    config = {"database.url": url, "client.id": "paused-child", "linger.ms": 0}
    if mode != "idempotent":
        config["transactional.id"] = mode
    producer = Producer(config)
    try:
        if mode != "idempotent":
            producer.init_transactions(60)
            producer.begin_transaction()
        failures: list[str] = []

        def report(err: object, _msg: object) -> None:
            if err is not None:
                failures.append(err.name())  # type: ignore[attr-defined]

        for i in range(5):
            producer.produce("t", value=f"child-{i}".encode(), partition=0, on_delivery=report)
        if mode == "idempotent":
            left = producer.flush(120)
            print(f"failed {failures[0]}" if failures else f"delivered {5 - left}", flush=True)
        else:
            producer.commit_transaction(120)
            print("committed", flush=True)
    except KafkaException as exc:
        print(f"failed {exc.args[0].name()}", flush=True)
    finally:
        producer.close()


if __name__ == "__main__":
    main()
