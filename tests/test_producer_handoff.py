"""``produce()`` gives the GIL to the Producer's sender threads while one of its requests is
out (app/client/handoff.py): only then, at most every ``HANDOFF_INTERVAL_S``; and the count
of requests out, which decides it, comes back to zero however a request ends (answered,
failed and retried, or sent by a commit on the application's own thread)."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest

import app.client.producer as producer_module
from app.broker import Broker
from app.client.handoff import HANDOFF_INTERVAL_S
from app.client.producer import Producer
from app.protocol import ProduceBatchesRequest, ProduceBatchesResponse
from tests.helpers.backends import lost_connection

Transport = Callable[[ProduceBatchesRequest], ProduceBatchesResponse]


pytestmark = pytest.mark.broker(topics={"t": 2})


@pytest.fixture
def hand_offs(monkeypatch: pytest.MonkeyPatch) -> list[float]:
    """The arguments of every hand-off ``produce()`` makes (each still made)."""
    calls: list[float] = []

    def record(seconds: float) -> None:
        calls.append(seconds)
        time.sleep(seconds)

    monkeypatch.setattr(producer_module, "hand_off", record)
    return calls


class HeldTransport:
    """Lets each request through only once ``release`` is set; records how many requests
    the accumulator counted out while each one was being sent."""

    def __init__(self, producer: Producer) -> None:
        self.real: Transport = producer.sender.transport
        self.accumulator = producer._accumulator
        self.entered = threading.Event()
        self.release = threading.Event()
        self.out_seen: list[int] = []

    def __call__(self, request: ProduceBatchesRequest) -> ProduceBatchesResponse:
        self.out_seen.append(self.accumulator.requests_out)
        self.entered.set()
        assert self.release.wait(30)
        return self.real(request)


def test_hands_off_only_while_a_request_is_out_and_not_more_often_than_the_interval(
    db_url: str, broker: Broker, hand_offs: list[float]
) -> None:
    producer = Producer({"database.url": db_url, "linger.ms": 60_000, "batch.num.messages": 10})
    held = HeldTransport(producer)
    producer.sender.transport = held
    try:
        # Nine records wait for their batch to fill: no request is out, no hand-off.
        for i in range(9):
            producer.produce("t", value=f"{i}", partition=0)
        assert producer._accumulator.requests_out == 0
        assert hand_offs == []

        producer.produce("t", value="9", partition=0)  # a full batch: the lane sends it
        assert held.entered.wait(60)
        before = len(hand_offs)  # the full batch's own produce() may have handed off
        start = time.monotonic()
        produced = 0
        # Records while the request is out, for at least twenty intervals (however many
        # records that takes on this machine).
        while produced < 100 or time.monotonic() - start < 20 * HANDOFF_INTERVAL_S:
            producer.produce("t", value=f"more-{produced}", partition=1)
            produced += 1
        elapsed = time.monotonic() - start
        during = hand_offs[before:]
        assert during and set(hand_offs) == {0}
        # Each hand-off is at least the interval after the one before: however fast or
        # slow produce() ran, no more than the interval allows in the time it took.
        assert len(during) <= elapsed / HANDOFF_INTERVAL_S + 1

        held.release.set()
        assert producer.flush(30) == 0
        assert producer._accumulator.requests_out == 0
        assert held.out_seen and all(n >= 1 for n in held.out_seen)

        # Nothing out again: records that wait for their batch hand nothing off.
        hand_offs.clear()
        for i in range(5):
            producer.produce("t", value=f"after-{i}", partition=0)
        assert hand_offs == []
    finally:
        held.release.set()
        producer.close()


@pytest.mark.parametrize("in_flight", [1, 5])
def test_requests_out_returns_to_zero_after_failed_and_retried_requests(
    db_url: str, broker: Broker, in_flight: int
) -> None:
    producer = Producer(
        {
            "database.url": db_url,
            "linger.ms": 1,
            "batch.num.messages": 7,
            "retry.backoff.ms": 1,
            "max.in.flight": in_flight,
        }
    )
    real = producer.sender.transport
    calls = [0]
    out_seen: list[int] = []
    lock = threading.Lock()

    def every_third_lost(request: ProduceBatchesRequest) -> ProduceBatchesResponse:
        with lock:
            calls[0] += 1
            lose = calls[0] % 3 == 0
            out_seen.append(producer._accumulator.requests_out)
        if lose:
            raise lost_connection()
        return real(request)

    producer.sender.transport = every_third_lost
    try:
        for i in range(200):
            producer.produce("t", value=f"{i}", partition=i % 2)
        assert producer.flush(30) == 0
        assert calls[0] >= 3  # some requests failed and were sent again
        assert producer._accumulator.requests_out == 0
        assert min(out_seen) >= 1 and max(out_seen) <= min(in_flight, 2)
    finally:
        producer.close()


def test_requests_out_returns_to_zero_after_commits_sent_on_the_callers_thread(
    db_url: str, broker: Broker
) -> None:
    """A commit whose last batches go with its EndTxn from the application's thread
    counts as a request out while it is sent, as a lane's does."""
    producer = Producer({"database.url": db_url, "transactional.id": "handoff"})
    real = producer.sender.transport
    out_seen: list[tuple[str, int]] = []

    def watched(request: ProduceBatchesRequest) -> ProduceBatchesResponse:
        out_seen.append((threading.current_thread().name, producer._accumulator.requests_out))
        return real(request)

    producer.sender.transport = watched
    try:
        producer.init_transactions()
        for txn in range(3):
            producer.begin_transaction()
            for i in range(10):
                producer.produce("t", value=f"{txn}:{i}", partition=i % 2)
            producer.commit_transaction()
        assert producer._accumulator.requests_out == 0
        here = threading.current_thread().name
        assert [name for name, _ in out_seen] == [here] * 3
        assert all(n == 1 for _, n in out_seen)
    finally:
        producer.close()
