"""Transactional batches admitted on the transactional id's row as this process last wrote or
read it (docs/design.md §3.12, rule 53).

After a transactional produce (or a registration) of an id commits, the process remembers
the id's row with its version; the id's next batches are admitted on it and sent in one
query string whose first statement takes the row FOR SHARE and checks that version. These
tests move the row in each way another process can between two requests (an instance
fencing the producer, a bare EndTxn, the coordinator's timeout abort) and check that the
batch is then refused as under the lock, nothing of it in the log; and that the request
that does go this way writes what the lock's way writes.
"""

from __future__ import annotations

import itertools
import threading

import pytest
from sqlalchemy import create_engine, text

from app.broker import Broker
from app.broker.loop import CoordinatorLoop
from app.clock import ManualClock
from app.coordinator.handlers import prepare_end_txn, roll_forward
from app.errors import KafkaError
from app.protocol import AddPartitionsToTxnRequest, EndTxnRequest
from app.storage.context import BrokerContext
from tests.helpers.txn_driver import (
    TxnDriver,
    produce_many,
    produce_registering,
    read_values,
    state_of,
)
from tests.helpers.write_strategy import Ways

HANG_GUARD_S = 120  # only against a hang; nothing is asserted about how long things take


pytestmark = pytest.mark.broker(topics={"t": 2})


@pytest.fixture
def ways() -> Ways:
    """The produce requests sent each way from here on (``broker.strategy``'s counter)."""
    return Ways("produce")


def records_of(broker: Broker, partition: int) -> list[tuple[int, int, bool, str | None]]:
    """(offset, producer epoch, is control, value) of every row of ("t", partition)."""
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT \"offset\", producer_epoch, is_control, convert_from(value, 'UTF8') "
                "FROM records WHERE topic = 't' AND partition = :p ORDER BY \"offset\""
            ),
            {"p": partition},
        ).all()
    return [(r[0], r[1], r[2], r[3]) for r in rows]


def test_a_transactions_later_batches_go_in_one_query(broker: Broker, ways: Ways) -> None:
    """The first batch after AddPartitionsToTxn reads the row under its lock (the
    registration moved it); the process remembers what it read, and the next batches go
    on it, in one query string each; the transaction commits them all."""
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    assert d.send("t", 0, "a").error_code == 0
    assert d.send("t", 0, "b", register=False).error_code == 0
    assert d.send("t", 0, "c", register=False).error_code == 0
    assert ways.sent == (2, 1)
    assert ways.refused == 0
    assert d.end(commit=True) == 0
    assert read_values(broker, "t", 0) == ["a", "b", "c"]


def test_a_commit_with_no_batches_left_ends_the_transaction(broker: Broker, ways: Ways) -> None:
    """A commit request whose batches all went before it (none left to carry) ends the
    transaction as a bare EndTxn would; the remembered row is not in its way."""
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    assert d.send("t", 0, "a").error_code == 0
    assert d.send("t", 0, "b", register=False).error_code == 0
    r = d.commit_with([])
    assert r.end is not None and r.end.error_code == 0
    assert r.batches == []
    assert ways.sent == (1, 1)  # a commit's batches are the commit's
    assert ways.refused == 0
    assert read_values(broker, "t", 0) == ["a", "b"]


def test_a_registration_in_the_produce_request_is_remembered(broker: Broker, ways: Ways) -> None:
    """KIP-890's registration inside the produce request moves the row; the request reads
    the version it leaves, and the transaction's next request goes in one query."""
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    add = AddPartitionsToTxnRequest("tx", d.producer_id, d.producer_epoch, [("t", 0), ("t", 1)])
    registered, answers = produce_registering(broker, d.requests(("t", 0, "a"), ("t", 1, "b")), add)
    assert registered is not None and registered.error_code == 0
    assert [a.error_code for a in answers] == [0, 0]
    d.sequences.update({("t", 0): 1, ("t", 1): 1})
    later = produce_many(broker, d.requests(("t", 0, "c"), ("t", 1, "d")))
    assert [a.error_code for a in later] == [0, 0]
    assert ways.sent == (1, 0)
    assert d.end(commit=True) == 0
    assert read_values(broker, "t", 0) == ["a", "c"]
    assert read_values(broker, "t", 1) == ["b", "d"]


def test_a_producer_fenced_elsewhere_is_refused_on_its_read(
    broker: Broker, elsewhere: BrokerContext, ways: Ways
) -> None:
    """Another process's instance of the id fences the producer between two of its
    batches: the batch, admitted on the remembered row (which still shows it ongoing,
    with this epoch), is refused on the row's version with nothing written, and the
    lock's way answers it as a partition leader answers a stale epoch."""
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    assert d.send("t", 0, "a").error_code == 0
    assert d.send("t", 0, "b", register=False).error_code == 0
    second = TxnDriver(elsewhere, "tx")
    assert second.init() == 0
    zombie = d.send("t", 0, "zombie", register=False)
    assert zombie.error_code == KafkaError.INVALID_PRODUCER_EPOCH
    assert ways.sent == (1, 2)
    assert ways.refused == 1
    assert "zombie" not in [value for *_, value in records_of(broker, 0)]
    assert read_values(broker, "t", 0, committed=False) == ["a", "b"]


def test_a_bare_end_txn_elsewhere_is_seen(
    broker: Broker, elsewhere: BrokerContext, ways: Ways
) -> None:
    """Another process ends the transaction (an EndTxn of the same identity, as a client
    that failed over to another node sends it): the next batch is refused (the EndTxn
    bumped the epoch, KIP-890), and nothing lands after the abort marker."""
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    assert d.send("t", 0, "a").error_code == 0
    assert d.send("t", 0, "b", register=False).error_code == 0
    other = TxnDriver(elsewhere, "tx", producer_id=d.producer_id, producer_epoch=d.producer_epoch)
    assert other.end(commit=False) == 0
    late = d.send("t", 0, "late", register=False)
    assert late.error_code == KafkaError.INVALID_PRODUCER_EPOCH
    assert ways.sent == (1, 2)
    assert ways.refused == 1
    rows = records_of(broker, 0)
    assert [control for _, _, control, _ in rows] == [False, False, True]


def test_a_commit_prepared_elsewhere_is_seen(
    broker: Broker, elsewhere: BrokerContext, ways: Ways
) -> None:
    """Another node's EndTxn has committed PREPARE_COMMIT (the bare EndTxn's first DB
    transaction) and not yet its markers: the partitions' rows are as the producer left
    them, only the id's row moved. The late batch is refused (the transaction is ending),
    and the commit, rolled forward, holds only what was acknowledged before it."""
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    assert d.send("t", 0, "a").error_code == 0
    assert d.send("t", 0, "b", register=False).error_code == 0
    prepared = prepare_end_txn(
        elsewhere, EndTxnRequest("tx", d.producer_id, d.producer_epoch, True)
    )
    assert prepared.state == "PREPARE_COMMIT"
    late = d.send("t", 0, "late", register=False)
    assert late.error_code == KafkaError.INVALID_PRODUCER_EPOCH  # PREPARE bumped it (KIP-890)
    assert ways.sent == (1, 2)
    assert ways.refused == 1
    roll_forward(elsewhere, "tx")
    assert read_values(broker, "t", 0) == ["a", "b"]


def test_the_coordinators_timeout_abort_elsewhere_is_seen(
    db_url: str, broker: Broker, ways: Ways
) -> None:
    """Another process's coordinator loop aborts the transaction on its timeout (its
    clock moved past it): the producer's next batch is refused, as under the lock."""
    clock = ManualClock(broker.clock.now_ms())
    engine = create_engine(db_url)
    try:
        loop = CoordinatorLoop(BrokerContext(engine=engine, clock=clock))
        d = TxnDriver(broker, "tx", timeout_ms=1_000)
        assert d.init() == 0
        assert d.send("t", 0, "a").error_code == 0
        assert d.send("t", 0, "b", register=False).error_code == 0
        clock.advance(60_000)
        loop.run_once()
        assert state_of(broker, "tx") == "COMPLETE_ABORT"
    finally:
        engine.dispose()
    late = d.send("t", 0, "late", register=False)
    assert late.error_code in (KafkaError.INVALID_PRODUCER_EPOCH, KafkaError.INVALID_TXN_STATE)
    assert ways.sent == (1, 2)
    assert "late" not in [value for *_, value in records_of(broker, 0)]


def test_statements_gone_from_the_session_are_prepared_again(broker: Broker, ways: Ways) -> None:
    """A ``DEALLOCATE ALL`` on the session (psycopg sends one after a ROLLBACK when it
    had statements of its own prepared) drops the guard's statement and the advance's: the
    request goes the lock's way once, and the next in one query again, each statement
    prepared anew (none refused as existing already)."""
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    assert d.send("t", 0, "a").error_code == 0
    assert d.send("t", 0, "b", register=False).error_code == 0
    with broker.engine.connect() as conn:
        conn.exec_driver_sql("DEALLOCATE ALL")
    assert d.send("t", 0, "c", register=False).error_code == 0
    assert d.send("t", 0, "d", register=False).error_code == 0
    assert ways.sent == (2, 2)
    assert d.end(commit=True) == 0
    assert read_values(broker, "t", 0) == ["a", "b", "c", "d"]


def test_a_fence_racing_the_batches_leaves_none_after_the_abort(
    broker: Broker, elsewhere: BrokerContext
) -> None:
    """A producer sends batch after batch, most in one query on the remembered row, while
    another process's instance fences it once it has sent some (counted, not timed): a
    batch sent after the fence committed is refused, every batch of the old epoch in the
    log is below the abort marker, and each batch was either written and acknowledged or
    refused and absent. The sender stops at its first refusal, however many batches that
    takes."""
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    assert d.send("t", 0, "first").error_code == 0
    epoch = d.producer_epoch
    sent = threading.Semaphore(0)
    fenced = threading.Event()
    acknowledged: list[str] = []
    refused: list[str] = []
    accepted_after_the_fence: list[str] = []

    def keep_sending() -> None:
        for i in itertools.count():
            value = f"v{i}"
            after_the_fence = fenced.is_set()
            r = d.send("t", 0, value, register=False)
            (acknowledged if r.error_code == 0 else refused).append(value)
            sent.release()
            if r.error_code:
                return
            if after_the_fence:
                accepted_after_the_fence.append(value)
                return

    sender = threading.Thread(target=keep_sending)
    sender.start()
    for _ in range(20):
        assert sent.acquire(timeout=HANG_GUARD_S), "the sender stopped"
    assert TxnDriver(elsewhere, "tx").init() == 0
    fenced.set()
    sender.join(HANG_GUARD_S)
    assert not sender.is_alive()
    assert accepted_after_the_fence == []
    assert len(refused) == 1
    rows = records_of(broker, 0)
    marker = next(offset for offset, _, control, _ in rows if control)
    assert all(offset < marker for offset, e, control, _ in rows if e == epoch and not control)
    assert [value for *_, control, value in rows if not control] == ["first", *acknowledged]
