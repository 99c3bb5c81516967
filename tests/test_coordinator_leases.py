"""The coordinator loops share the transaction-log partitions' leases (docs/design.md rule
57): each takes a fair share, a loop that joins gets leases from those already running,
one that leaves or lapses gives its share back, and every move bumps the partition's
coordinator epoch."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.broker import Broker
from app.broker.loop import CoordinatorLoop, fair_share
from app.clock import ManualClock

PARTITIONS = 16


pytestmark = pytest.mark.broker(manual_clock=True, transaction_log_partitions=PARTITIONS)


def _holders(broker: Broker) -> dict[int, str | None]:
    """Each lease's live owner (None: free or lapsed)."""
    now = broker.clock.now_ms()
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT txn_partition, owner, expires_ms FROM coordinator_leases")
        ).all()
    return {r.txn_partition: r.owner if r.expires_ms >= now else None for r in rows}


def _epochs(broker: Broker) -> dict[int, int]:
    with broker.engine.connect() as conn:
        rows = conn.execute(text("SELECT txn_partition, coordinator_epoch FROM coordinator_leases"))
        return {r.txn_partition: r.coordinator_epoch for r in rows}


def test_a_joining_loop_gets_its_share_from_the_one_running(broker: Broker) -> None:
    first, second = CoordinatorLoop(broker, "first"), CoordinatorLoop(broker, "second")
    assert len(first.acquire_leases()) == PARTITIONS  # alone: every lease
    # The second joins: none is free yet, and the first gives up half at its next pass.
    assert second.acquire_leases() == {}
    before = _epochs(broker)
    kept = first.acquire_leases()
    assert len(kept) == PARTITIONS // 2
    taken = second.acquire_leases()
    assert len(taken) == PARTITIONS // 2 and not set(taken) & set(kept)
    # A lease that moved was taken over: its coordinator epoch is bumped, fencing the
    # first loop's work on it; those kept are renewed at the same epoch.
    assert all(taken[p] == before[p] + 1 for p in taken)
    assert all(kept[p] == before[p] for p in kept)
    assert set(_holders(broker).values()) == {"first", "second"}


def test_three_loops_hold_every_lease_evenly(broker: Broker) -> None:
    loops = [CoordinatorLoop(broker, f"loop{i}") for i in range(3)]
    for _ in range(3):  # a few passes each, in turn, as their timers would run them
        for loop in loops:
            loop.acquire_leases()
    holders = _holders(broker)
    assert None not in holders.values(), "every lease is held"
    counts = sorted(list(holders.values()).count(f"loop{i}") for i in range(3))
    assert counts[-1] <= fair_share(PARTITIONS, 3) and sum(counts) == PARTITIONS


def test_a_leaving_loop_gives_its_share_back(broker: Broker) -> None:
    first, second = CoordinatorLoop(broker, "first"), CoordinatorLoop(broker, "second")
    first.acquire_leases()
    second.acquire_leases()
    first.acquire_leases()
    assert len(second.acquire_leases()) == PARTITIONS // 2
    second.release_leases()  # a clean stop: its leases and its place are free at once
    assert len(first.acquire_leases()) == PARTITIONS


def test_a_lapsed_loop_no_longer_counts(broker: Broker, clock: ManualClock) -> None:
    first, second = CoordinatorLoop(broker, "first"), CoordinatorLoop(broker, "second")
    first.acquire_leases()
    second.acquire_leases()
    first.acquire_leases()
    second.acquire_leases()
    # The second is killed: nothing renews its leases or its place, and both lapse.
    clock.advance(broker.settings.coordinator_lease_ms + 1)
    assert len(first.acquire_leases()) == PARTITIONS
    with broker.engine.connect() as conn:
        live = conn.execute(text("SELECT owner FROM coordinator_loops")).scalars().all()
    assert live == ["first"]


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 64), st.integers(1, 64))
def test_fair_shares_cover_every_partition(partitions: int, loops: int) -> None:
    share = fair_share(partitions, loops)
    assert share * loops >= partitions > (share - 1) * loops
