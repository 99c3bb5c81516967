"""The racer processes: two of them call init_transactions() on the same fresh
transactional id at the same moment, then each tries one transaction with it.

Every ``RACE_PERIOD_S`` both racers take the id of that period (``torture-race-<slot>``,
never used before) and call init_transactions() when the period begins, each a few
milliseconds apart at random, so either may come first or both be in flight at once.
Whichever InitProducerId comes second fences the first; whatever the interleaving, each
transaction's told outcome must be the log's, none may be left open (once the run is quiet
every partition's last stable offset is its high watermark), and an instance whose
init_transactions() another one's followed must not commit afterwards (``zombie-commit``).
"""

from __future__ import annotations

import random
import time

from app.client import Producer
from app.torture.history import INFO, INVOKE, OK, HistoryWriter
from app.torture.workload import (
    PARTITIONS,
    TOPIC,
    ProcessArgs,
    StopFlag,
    describe,
    producer_config,
)

RACERS = 2
RACE_PERIOD_S = 1.5
# How far apart the two init_transactions() calls may start.
JITTER_S = 0.03


class Racer:
    def __init__(self, args: ProcessArgs) -> None:
        self.args = args
        self.name = f"r{args.index}"
        self.hist = HistoryWriter.of_incarnation(args.out, self.name, args.incarnation)
        self.rng = random.Random(args.seed * 6151 + args.index * 97 + args.incarnation)
        self.flags = StopFlag()

    def run(self) -> None:
        self.hist.record(OK, "start", incarnation=self.args.incarnation)
        # The period under way may have been raced by a previous incarnation.
        slot = int(time.time() // RACE_PERIOD_S) + 1
        while not self.flags.stop:
            if self._sleep_until(slot * RACE_PERIOD_S + self.rng.uniform(0, JITTER_S)):
                self._race(slot)
            slot = max(slot + 1, int(time.time() // RACE_PERIOD_S) + 1)
        self.hist.record(OK, "stop")
        self.hist.close()

    def _sleep_until(self, wall: float) -> bool:
        """False if asked to stop first."""
        while (left := wall - time.time()) > 0:
            if self.flags.stop:
                return False
            time.sleep(min(0.05, left))
        return not self.flags.stop

    def _race(self, slot: int) -> None:
        tid = f"torture-race-{slot}"
        txn = f"{self.name}-{self.args.incarnation}-{slot}"
        try:
            producer = Producer(producer_config(self.args.url, tid, f"torture-{self.name}"))
        except Exception as exc:
            self.hist.record(INFO, "race-init", tid=tid, error=describe(exc))
            return
        try:
            self.hist.record(INVOKE, "race-init", tid=tid)
            try:
                producer.init_transactions(30)
            except Exception as exc:
                self.hist.record(INFO, "race-init", tid=tid, error=describe(exc))
                return
            self.hist.record(OK, "race-init", tid=tid)
            self._transaction(producer, tid, txn, f"{self.name}-{slot}")
        finally:
            try:
                producer.close()
            except Exception:
                pass

    def _transaction(self, producer: Producer, tid: str, txn: str, value: str) -> None:
        self.hist.record(INVOKE, "txn", txn=txn, tid=tid)
        try:
            producer.begin_transaction()
            partition = self.rng.randrange(PARTITIONS)
            producer.produce(TOPIC, value.encode(), partition=partition)
            self.hist.record(INVOKE, "send", txn=txn, sends=[[TOPIC, partition, value]])
            time.sleep(self.rng.uniform(0, JITTER_S))  # the other racer may init meanwhile
            self.hist.record(INVOKE, "commit", txn=txn)
            producer.commit_transaction(10)
            self.hist.record(OK, "txn", txn=txn)
        except Exception as exc:
            # Fenced by the other racer, most often: the outcome is the log's to tell.
            self.hist.record(INFO, "txn", txn=txn, error=describe(exc))
