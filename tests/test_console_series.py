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
from app.console.series import Probes
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
    step = series.WINDOW_MS // series.POINTS
    ends = series.bucket_ends(now)
    # 600 records over the window, one a second: a rate of 1/s in every bucket.
    p = Probes.of("t", 0, 600, [(o, o * 1000) for o in (0, 150, 300, 450, 599)])
    rates = [v for _t, v in series.produce_rate([p], ends, step)]
    assert len(rates) == series.POINTS and all(abs(v - 1.0) < 0.05 for v in rates)
    # Two commits in one bucket (latencies 10 and 30 ms), one whose PREPARE_COMMIT was
    # older than the events read (no latency).
    done = [(now - 99_990, 10), (now - 99_940, 30), (now - 10, None)]
    rate, latency = series.commits(done, ends, step, horizon_ms=now - series.WINDOW_MS)
    assert sum(v for _t, v in rate) * step / 1000 == 3 and len(rate) == series.POINTS
    assert [v for _t, v in latency] == [20.0]
    # Events read only back to 100 s ago: the buckets before are left out.
    capped, _ = series.commits(done, ends, step, horizon_ms=now - 100_000)
    assert min(t for t, _v in capped) - step >= now - 100_000


def test_lso_lag_follows_the_oldest_open_transaction() -> None:
    probed = [(o, o * 1000) for o in (0, 100, 200, 300, 400, 500, 599)]
    p = Probes.of("t", 0, 600, probed, lso=500)  # open from offset 500 now
    # open since 100 s at 130 s; nothing open at 90 s and 420 s; since 500 s at 600 s
    oldest = {130_000: 100_000, 600_000: 500_000}
    lag = dict(series.lso_lag(p, oldest, [90_000, 130_000, 420_000, 600_000]))
    assert lag[90_000] == 0 and lag[420_000] == 0
    assert abs(lag[130_000] - 30) < 1  # 30 records since
    assert lag[600_000] == 100  # the point at now: the partition's own lag
    r = Probes.of("t", 0, 600, [(o, o * 1000) for o in (0, 599)], lso=590)
    assert series.lso_lag(r, {}, [600_000]) == [(600_000, 10.0)]


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
    # KIP-664's abort closes the open transaction on t-1 with a marker the coordinator did
    # not write (it still holds the transaction open): the lag ends with that marker.
    with AdminClient({"database.url": db_url}) as admin:
        assert admin.abort_transaction("t", 1, 0)
    # Read 45 s on, so the point before the last (15 s on) is after the marker.
    with broker.engine.connect() as conn:
        after = series.read(conn, int(time.time() * 1000) + 45_000)
    assert [v for _t, v in after["lso_lag"]["t-1"][-2:]] == [0, 0]
