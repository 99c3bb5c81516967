"""The web console's overview series (app/console/series.py), read from the tables for
the window shown: nothing is sampled in memory, so a console that has just started (or
any of several) draws the same charts. Commits come from the coordinator's events, the
records from their timestamps probed by offset, the LSO lag from the transactions' spans."""

from __future__ import annotations

import time

from app.admin import AdminClient, NewTopic
from app.broker import Broker
from app.broker.produce import produce
from app.console import series
from app.console.series import Probes, Span
from app.protocol import ProduceRequest, RecordIn
from tests.helpers.txn_driver import TxnDriver

MIN = 60_000


def test_offsets_are_interpolated_between_probes() -> None:
    # hw 100; records 0..99 at 1 ms each from t=1000 (offset o at 1000 + o), probed at 4 offsets
    p = Probes.of("t", 0, 100, [(99, 1099), (49, 1049), (0, 1000), (98, 1098)])
    assert p.appended_before(2000) == 100  # after the last record: the high watermark
    assert p.appended_before(1049) == 50  # offsets 0..49 were there by then
    assert p.appended_before(1074) == 75
    assert p.appended_before(500) == 0
    # A later record stamped earlier (a producer's clock) does not make time run back.
    q = Probes.of("t", 0, 3, [(0, 10), (1, 5), (2, 20)])
    assert q.times == [10, 10, 20]


def test_produce_rate_commits_and_latency_per_bucket() -> None:
    now = 10 * MIN
    # 600 records over the window, one a second: 10 a 30 s bucket... as a rate, 1/s.
    p = Probes.of("t", 0, 600, [(o, o * 1000) for o in (0, 150, 300, 450, 599)])
    events = [
        {"transactional_id": tid, "state": state, "updated_ms": now - ago,
         "txn_start_ms": 0, "partitions": []}
        for tid, state, ago in (
            ("a", "PREPARE_COMMIT", 100_000), ("a", "COMPLETE_COMMIT", 99_990),
            ("b", "PREPARE_COMMIT", 99_970), ("b", "COMPLETE_COMMIT", 99_940),
            ("c", "COMPLETE_COMMIT", 10),
        )
    ]  # fmt: skip
    d = series.derive(now, [p], events, [], capped=False)
    rates = [v for _t, v in d["produce_rate"]]
    assert len(rates) == series.POINTS and all(abs(v - 1.0) < 0.05 for v in rates)
    commit = dict(d["commit_rate"])
    assert sum(commit.values()) * (series.WINDOW_MS // series.POINTS) / 1000 == 3
    # a and b in one bucket: latencies 10 and 30 ms; c's PREPARE was before the events read
    assert [v for _t, v in d["commit_latency_ms"]] == [20.0]
    # Capped: buckets older than the oldest event read are left out.
    capped = series.derive(now, [p], events, [], capped=True)
    assert capped["horizon_ms"] == now - 100_000
    assert min(t for t, _v in capped["commit_rate"]) - 30_000 >= now - 100_000


def test_lso_lag_follows_the_oldest_open_transaction() -> None:
    probed = [(o, o * 1000) for o in (0, 100, 200, 300, 400, 500, 599)]
    p = Probes.of("t", 0, 600, probed, lso=500)  # open from offset 500 now
    spans = [Span("t", 0, 100_000, 400_000), Span("t", 0, 500_000, None)]
    lag = dict(series.lso_lag(p, spans, [90_000, 130_000, 420_000, 600_000]))
    assert lag[90_000] == 0  # nothing open
    assert abs(lag[130_000] - 30) < 1  # open since 100 s: 30 records since
    assert lag[420_000] == 0  # its markers at 400 s
    assert abs(lag[600_000] - 100) < 1.5  # the open one since 500 s
    # The point at now is the partition's own lag; a span the coordinator holds open on a
    # partition with nothing open now (closed by KIP-664's abort) ends at its last record.
    q = Probes.of("t", 0, 600, [(o, o * 1000) for o in (0, 100, 500, 599)], lso=600)
    closed = dict(series.lso_lag(q, spans, [550_000, 599_500, 600_000]))
    assert abs(closed[550_000] - 50) < 1.5 and closed[599_500] == closed[600_000] == 0
    r = Probes.of("t", 0, 600, [(o, o * 1000) for o in (0, 599)], lso=590)
    assert series.lso_lag(r, [], [600_000]) == [(600_000, 10.0)]
    # Spans from the events: added at the first event naming the partition, ended at COMPLETE_*
    events = [
        {"transactional_id": "x", "txn_start_ms": 5, "state": "BEGIN", "partitions": [["t", 0]], "updated_ms": 5},
        {"transactional_id": "x", "txn_start_ms": 5, "state": "BEGIN", "partitions": [["t", 0], ["t", 1]], "updated_ms": 7},
        {"transactional_id": "x", "txn_start_ms": 5, "state": "COMPLETE_ABORT", "partitions": [], "updated_ms": 9},
        {"transactional_id": "y", "txn_start_ms": 8, "state": "BEGIN", "partitions": [["t", 0]], "updated_ms": 8},
    ]  # fmt: skip
    still_open = [{"transactional_id": "y", "txn_start_ms": 8, "partitions": [["t", 0]]},
                  {"transactional_id": "z", "txn_start_ms": 1, "partitions": [["u", 0]]}]  # fmt: skip
    assert sorted(series.spans(events, still_open), key=lambda s: (s.start_ms, s.topic)) == [
        Span("u", 0, 1, None), Span("t", 0, 5, 9), Span("t", 1, 7, 9), Span("t", 0, 8, None),
    ]  # fmt: skip


def test_the_series_are_read_from_the_tables(db_url: str) -> None:
    """What a console started after the traffic draws: the commits, the records and an
    open transaction's LSO lag, read from the tables (nothing sampled before)."""
    broker = Broker.connect(db_url)
    with AdminClient({"database.url": db_url}) as admin:
        admin.create_topics([NewTopic("t", 2)])["t"].result()

    def records(*values: str) -> list[RecordIn]:  # stamped now, as a producer does
        return [RecordIn(None, v.encode(), int(time.time() * 1000)) for v in values]

    d = TxnDriver(broker, "tx")
    d.init()
    for _ in range(3):
        d.send_records("t", 0, records("a", "b"))
        d.end(commit=True)
    open_ = TxnDriver(broker, "open")
    open_.init()
    open_.send_records("t", 1, records("o"))
    plain = records("p", "p", "p", "p")
    assert produce(broker, ProduceRequest("t", 1, plain)).error_code == 0
    now = int(time.time() * 1000) + 1000
    with broker.engine.connect() as conn:
        s = series.read(conn, now)
    step_s = series.WINDOW_MS // series.POINTS / 1000
    assert round(sum(v for _t, v in s["commit_rate"]) * step_s) == 3
    assert len(s["commit_latency_ms"]) >= 1 and all(v >= 0 for _t, v in s["commit_latency_ms"])
    # 3 x (2 records + a marker) on t-0, 1 + 4 on t-1
    assert round(sum(v for _t, v in s["produce_rate"]) * step_s) == 9 + 5
    assert set(s["lso_lag"]) == {"t-0", "t-1"}
    # The open transaction's record and the 4 plain ones behind it (about: the span starts
    # when the partition was added, interpolated between the records' timestamps).
    assert 3 <= s["lso_lag"]["t-1"][-1][1] <= 5
    assert s["lso_lag"]["t-0"][-1][1] == 0
    # Another connection, as another console process (or this one restarted), reads the same.
    with Broker.connect(db_url).engine.connect() as conn:
        assert series.read(conn, now) == s
