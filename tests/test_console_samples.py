"""The web console's overview series (app/console/samples.py): a sample reads the offsets
and the coordinator's events since the last one; rates are per second between samples,
a commit's latency its COMPLETE_COMMIT's time less its PREPARE_COMMIT's."""

from __future__ import annotations

from dataclasses import replace

from app.admin import AdminClient, NewTopic
from app.broker import Broker
from app.clock import ManualClock
from app.console.samples import Sample, Sampler, rates
from tests.helpers.txn_driver import TxnDriver


def test_rates_between_samples() -> None:
    samples = [
        Sample(0, 100, 0, 0, None),
        Sample(2000, 300, 5, 4, 12.5),
        Sample(4000, 250, 0, 0, None),
    ]
    r = rates(samples)
    assert r["produce_rate"] == [(2000, 100.0), (4000, 0.0)]  # a log truncated is no negative rate
    assert r["commit_rate"] == [(2000, 2.0), (4000, 0.0)]
    assert r["commit_latency_ms"] == [(2000, 12.5)]
    assert r["lso_lag"] == [(0, 0.0), (2000, 5.0), (4000, 0.0)]
    assert rates([]) == {
        "produce_rate": [],
        "commit_rate": [],
        "commit_latency_ms": [],
        "lso_lag": [],
    }


def test_a_sample_counts_the_commits_since_the_last(db_url: str) -> None:
    broker = Broker.connect(db_url)
    with AdminClient({"database.url": db_url}) as admin:
        admin.create_topics([NewTopic("t", 1)])["t"].result()
    before = TxnDriver(broker, "before")
    before.init()
    before.send("t", 0, "x")
    before.end(commit=True)  # before the first sample: not counted
    clock = ManualClock(1_000_000)
    sampler = Sampler(replace(broker, clock=clock))
    sampler.sample()
    d = TxnDriver(broker, "tx")
    d.init()
    for commit in (True, True, False):
        d.send("t", 0, "a", "b")
        d.end(commit=commit)
    open_ = TxnDriver(broker, "open")
    open_.init()
    open_.send("t", 0, "o")
    clock.advance(2000)
    sampler.sample()
    first, second = sampler.samples()
    assert (first.records, first.commits) == (2, 0)
    assert second.records == 2 + 3 * 3 + 1  # records and markers: the high watermark
    assert (second.commits, second.lso_lag) == (2, 1)
    assert second.commit_latency_ms is not None and second.commit_latency_ms >= 0
    assert rates(sampler.samples())["commit_rate"] == [(1_002_000, 1.0)]
