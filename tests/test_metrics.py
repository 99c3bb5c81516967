"""Metrics: the snapshot read from SQL agrees with the transactions that made it, and both
renderings (the Prometheus exposition and the text tables) carry it."""

from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import text

from app.admin import AdminClient, NewTopic
from app.broker import Broker
from app.broker.loop import CoordinatorLoop
from app.broker.produce import produce
from app.cleaner.cleaner import clean_partition, partitions_to_clean
from app.clock import ManualClock
from app.log.topics import create_topic
from app.metrics import Kip98Collector, Snapshot, gather, prometheus_text
from app.protocol import ProduceRequest, RecordIn
from tests.helpers.cli_runner import run_kip98
from tests.helpers.identities import hand_out
from tests.helpers.txn_driver import TxnDriver


def samples(exposition: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    found = {}
    for family in text_string_to_metric_families(exposition):
        for s in family.samples:
            found[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return found


def lso_lag(snap: Snapshot, topic: str, partition: int) -> int:
    (p,) = [p for p in snap.partitions if (p.topic, p.partition) == (topic, partition)]
    return p.lso_lag


def setup_transactions(broker: Broker, db_url: str) -> None:
    """One committed (over two partitions), one aborted, one late, one open transaction."""
    with AdminClient({"database.url": db_url}) as admin:
        admin.create_topics([NewTopic("t", 2)])["t"].result()
    committed = TxnDriver(broker, "committed")
    assert committed.init() == 0
    committed.send("t", 0, "c1")
    committed.send("t", 1, "c2")  # a second AddPartitionsToTxn: still one transaction started
    assert committed.end(commit=True) == 0
    aborted = TxnDriver(broker, "aborted")
    assert aborted.init() == 0
    aborted.send("t", 0, "a1")
    assert aborted.end(commit=False) == 0
    late = TxnDriver(broker, "late", timeout_ms=1_000)
    assert late.init() == 0
    late.send("t", 1, "l1", "l2")
    with broker.engine.begin() as conn:
        conn.execute(
            text(
                "UPDATE transactions SET txn_start_ms = txn_start_ms - 10000 "
                "WHERE transactional_id = 'late'"
            )
        )
    still_open = TxnDriver(broker, "open", timeout_ms=900_000)  # open however long the test
    assert still_open.init() == 0
    still_open.send("t", 0, "o1")


def test_snapshot_counts_follow_the_transaction_log(db_url: str) -> None:
    broker = Broker.connect(db_url)
    assert gather(broker.engine).transactions == dict.fromkeys(
        ["started", "committed", "aborted", "timed_out"], 0
    )
    setup_transactions(broker, db_url)

    snap = gather(broker.engine)
    assert snap.producer_ids_live == 4
    assert snap.transactional_ids["BEGIN"] == 2
    assert snap.transactional_ids["COMPLETE_COMMIT"] == 1
    assert snap.transactional_ids["COMPLETE_ABORT"] == 1
    assert snap.transactions == {"started": 4, "committed": 1, "aborted": 1, "timed_out": 0}
    assert snap.partitions_with_late_transactions == 1
    assert (lso_lag(snap, "t", 0), lso_lag(snap, "t", 1)) == (1, 2)

    loop = CoordinatorLoop(broker)
    try:
        assert loop.run_once().timed_out == 1
    finally:
        loop.stop()
    snap = gather(broker.engine)
    assert snap.transactions == {"started": 4, "committed": 1, "aborted": 2, "timed_out": 1}
    assert snap.partitions_with_late_transactions == 0
    assert snap.transactional_ids["BEGIN"] == 1
    assert (lso_lag(snap, "t", 0), lso_lag(snap, "t", 1)) == (1, 0)

    exposed = samples(prometheus_text(snap).decode())
    assert exposed[("kip98_transactions_total", (("outcome", "timed_out"),))] == 1
    assert exposed[("kip98_transactions_total", (("outcome", "started"),))] == 4
    assert exposed[("kip98_transactional_ids", (("state", "BEGIN"),))] == 1
    assert exposed[("kip98_producer_ids_live", ())] == 4
    assert exposed[("kip98_partition_lso_lag", (("partition", "0"), ("topic", "t")))] == 1
    assert exposed[("kip98_partitions_with_late_transactions", ())] == 0
    # The collector reads its source at every scrape.
    assert list(Kip98Collector(lambda: snap).collect())


def test_metrics_command_in_both_formats(db_url: str) -> None:
    setup_transactions(Broker.connect(db_url), db_url)

    result = run_kip98("metrics", "--format", "prometheus")
    assert result.returncode == 0, result.stderr
    exposed = samples(result.stdout)
    assert exposed[("kip98_producer_ids_live", ())] == 4
    assert (
        exposed[("kip98_partition_last_stable_offset", (("partition", "1"), ("topic", "t")))] == 2
    )
    assert exposed[("kip98_partition_lso_lag", (("partition", "1"), ("topic", "t")))] == 2
    assert exposed[("kip98_transactions_total", (("outcome", "committed"),))] == 1
    assert exposed[("kip98_partitions_with_late_transactions", ())] == 1

    result = run_kip98("metrics")
    assert result.returncode == 0, result.stderr
    lines = [line.split() for line in result.stdout.splitlines()]
    assert ["producer", "ids", "live", "4"] in lines
    assert ["partitions", "with", "late", "transactions", "1"] in lines
    # TOPIC PARTITION LOG-START HW LSO LSO-LAG OPEN-TXNS CLEANER-LAG REMOVED
    assert ["t", "1", "0", "4", "2", "2", "1", "0", "0"] in lines

    bad = run_kip98("metrics", "--format", "xml")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr


def test_cleaner_figures(db_url: str) -> None:
    """Removed records and bytes per partition, and the compacted part not cleaned yet."""
    clock = ManualClock()
    broker = Broker.connect(db_url, clock=clock)
    create_topic(broker, "kv", 1, {"cleanup.policy": "compact"})
    hand_out(broker, 5000)
    for seq, value in enumerate([b"1", b"2", b"3"]):
        r = produce(
            broker,
            ProduceRequest("kv", 0, [RecordIn(b"k", value, 0)], producer_id=5000,
                           producer_epoch=0, base_sequence=seq),
        )  # fmt: skip
        assert r.error_code == 0
    before = {p.topic: p for p in gather(broker.engine).partitions}["kv"]
    assert (before.cleaner_lag, before.records_removed) == (3, 0)
    [target] = partitions_to_clean(broker, "kv")
    clean_partition(broker, "kv", 0, target.config)
    after = {p.topic: p for p in gather(broker.engine).partitions}["kv"]
    assert (after.cleaner_lag, after.records_removed) == (0, 2)
    assert after.bytes_removed == 2 * (24 + 1 + 1)
    exposed = samples(prometheus_text(gather(broker.engine)).decode())
    labels = (("partition", "0"), ("topic", "kv"))
    assert exposed[("kip98_cleaner_records_removed_total", labels)] == 2
    assert exposed[("kip98_cleaner_bytes_removed_total", labels)] == 52
    assert exposed[("kip98_cleaner_lag", labels)] == 0
