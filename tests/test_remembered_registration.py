"""A transaction's first request (its batches registering their partitions, KIP-890) and
its commit over partitions where its own transaction is open, decided on the rows the
id's last request in this process left and sent as one query string (docs/design.md
§3.11).

The registration moves the id's row as a commit does, so it is checked the same way:
the row and the partitions locked and read with their versions before any COPY data is
sent. A commit over partitions holding the producer's own open transaction cannot tell
from a row's LSO whether another producer's transaction opened behind it; its query
string reads the other producers' open transactions once it holds the partitions, and a
commit decided on the wrong ones is refused with nothing written and taken the lock's
way, which leaves the partition's LSO at the other transaction.
"""

from __future__ import annotations

import logging

import pytest

from app.broker import Broker, strategy
from app.coordinator.handlers import end_txn
from app.errors import KafkaError
from app.protocol import AddPartitionsToTxnRequest, EndTxnRequest
from app.storage.context import BrokerContext
from tests.helpers.txn_driver import (
    TxnDriver,
    partition_offsets,
    produce_many,
    produce_registering,
    read_values,
)
from tests.helpers.write_strategy import Ways

pytestmark = pytest.mark.broker(topics={"t": 2})


class Taken:
    """The registrations and commits sent each way (``broker.strategy``'s counter) from
    ``since()`` on; and why one-query writes were refused, as the strategy logs it."""

    def __init__(self, caplog: pytest.LogCaptureFixture) -> None:
        self._caplog = caplog
        self.since()

    def since(self) -> None:
        self.register, self.commit = Ways("register"), Ways("commit")

    @property
    def refusals(self) -> list[str]:
        return [
            str(r.args[1])
            for r in self._caplog.records
            if r.name == strategy.__name__ and isinstance(r.args, tuple) and len(r.args) == 2
        ]


@pytest.fixture
def taken(caplog: pytest.LogCaptureFixture) -> Taken:
    caplog.set_level(logging.DEBUG, logger=strategy.__name__)
    return Taken(caplog)


def register_and_send(d: TxnDriver, broker: Broker, *batches: tuple[str, int, str]) -> None:
    """One request carrying ``batches`` that registers their partitions, all accepted."""
    partitions = sorted({(t, p) for t, p, _ in batches})
    add = AddPartitionsToTxnRequest(d.transactional_id, d.producer_id, d.producer_epoch, partitions)
    registered, answers = produce_registering(broker, d.requests(*batches), add)
    assert registered is not None and registered.error_code == 0, registered
    assert [a.error_code for a in answers] == [0] * len(batches), answers
    for t, p, _ in batches:
        d.sequences[(t, p)] = d.sequences.get((t, p), 0) + 1


def committed_twice(d: TxnDriver) -> None:
    """Two transactions committed whole: the second leaves the rows remembered."""
    assert d.init() == 0
    for values in (("a", "b"), ("c", "d")):
        r = d.commit_with(
            d.requests(("t", 0, values[0]), ("t", 1, values[1])), [("t", 0), ("t", 1)]
        )
        assert r.end is not None and r.end.error_code == 0


def test_a_transactions_first_request_and_its_commit_go_in_one_query(
    broker: Broker, taken: Taken
) -> None:
    """After a commit, the next transaction's first batches register their partitions in
    one query string; its later batches go on the id's row that request left (§3.12);
    and its commit, whose partitions hold its own open transaction and no other, goes in
    one query string too, after its read of the other producers' transactions."""
    d = TxnDriver(broker, "tx")
    committed_twice(d)
    register_and_send(d, broker, ("t", 0, "e"))
    assert [a.error_code for a in produce_many(broker, d.requests(("t", 0, "f")))] == [0]
    d.sequences[("t", 0)] += 1
    r = d.commit_with(d.requests(("t", 1, "g")), [("t", 1)])
    assert r.end is not None and r.end.error_code == 0
    assert taken.commit.sent == (2, 1)
    assert taken.register.sent == (1, 0)
    assert taken.refusals == []
    assert read_values(broker, "t", 0) == ["a", "c", "e", "f"]
    assert read_values(broker, "t", 1) == ["b", "d", "g"]
    for p in (0, 1):
        high_watermark, lso = partition_offsets(broker, "t", p)
        assert lso == high_watermark  # nothing open


@pytest.mark.parametrize("as_produce", [True, False], ids=["as_a_produce", "as_a_registration"])
def test_a_registration_that_adds_nothing_leaves_its_rows_at_their_own_version(
    broker: Broker, taken: Taken, monkeypatch: pytest.MonkeyPatch, as_produce: bool
) -> None:
    """Kafka 4's producers (transaction version 2) register with every batch: a request
    whose partitions are all in the transaction already leaves the id's row as it was,
    while its appends write the partition rows. Sent as a transactional produce
    (``strategy.registered_already``) or, where that is not chosen, as a registration,
    its rows are remembered at the version that wrote them, so the id's next requests go
    in one query string too, none refused."""
    if not as_produce:
        monkeypatch.setattr(strategy, "registered_already", lambda conn, req: None)
    d = TxnDriver(broker, "tx")
    committed_twice(d)
    for value in ("e", "f", "g", "h"):
        register_and_send(d, broker, ("t", 0, value), ("t", 1, value.upper()))
    assert taken.register.sent == (4, 0)
    assert taken.refusals == []
    assert d.end(commit=True) == 0
    assert read_values(broker, "t", 0) == ["a", "c", "e", "f", "g", "h"]
    assert read_values(broker, "t", 1) == ["b", "d", "E", "F", "G", "H"]


def test_a_registration_remembered_as_done_is_proved_by_the_ids_row(
    broker: Broker, db_url: str, taken: Taken
) -> None:
    """A request whose partitions the remembered row holds goes without its registration,
    behind the check that the id's row is still that version. Here another process ended
    the transaction meanwhile: the check refuses (nothing written), and under the locks
    the request registers its partition in a new transaction, so its batch is in one."""
    d = TxnDriver(broker, "tx")
    committed_twice(d)
    register_and_send(d, broker, ("t", 0, "e"))
    # Another process: an engine of its own, so a memory of its own.
    sep = "&" if "?" in db_url else "?"
    other = Broker.connect(f"{db_url}{sep}application_name=other")
    ended = end_txn(other, EndTxnRequest("tx", d.producer_id, d.producer_epoch, True, False))
    assert ended.error_code == 0
    register_and_send(d, broker, ("t", 0, "f"))
    assert taken.refusals == ["the transactional id's row moved"]
    assert d.end(commit=True) == 0
    assert read_values(broker, "t", 0) == ["a", "c", "e", "f"]
    for p in (0, 1):
        high_watermark, lso = partition_offsets(broker, "t", p)
        assert lso == high_watermark  # nothing open


def test_a_commit_sees_a_transaction_opened_behind_its_own(
    broker: Broker, elsewhere: BrokerContext, taken: Taken
) -> None:
    """Another process's producer opens a transaction on a partition after this one's
    (its first offset above ours), then this producer writes the partition again, so the
    row it remembers is current and its LSO still ours. The commit's query string finds
    the other transaction once it holds the partition and is refused, nothing written;
    the lock's way commits, and the LSO stops at the other transaction's first record
    until that one ends."""
    d = TxnDriver(broker, "tx")
    committed_twice(d)
    register_and_send(d, broker, ("t", 0, "e"))
    other = TxnDriver(elsewhere, "other")  # type: ignore[arg-type]
    assert other.init() == 0
    assert other.send("t", 0, "x").error_code == 0
    others_first = partition_offsets(broker, "t", 0)[0] - 1
    assert [a.error_code for a in produce_many(broker, d.requests(("t", 0, "f")))] == [0]
    d.sequences[("t", 0)] += 1
    taken.since()
    r = d.commit_with(d.requests(("t", 0, "g")))
    assert r.end is not None and r.end.error_code == 0
    assert (taken.commit.sent, taken.commit.refused) == ((0, 1), 1)
    assert taken.refusals == [
        "a partition row moved",  # "f", on the row as "e" left it: "x" came since
        "another producer's transaction opened behind this one",
    ]
    high_watermark, lso = partition_offsets(broker, "t", 0)
    assert lso == others_first < high_watermark
    assert read_values(broker, "t", 0) == ["a", "c", "e"]  # stops at the open "x"
    assert other.end(commit=True) == 0
    assert read_values(broker, "t", 0) == ["a", "c", "e", "x", "f", "g"]
    high_watermark, lso = partition_offsets(broker, "t", 0)
    assert lso == high_watermark


def test_a_commit_decided_on_anothers_open_transaction_below_its_own(
    broker: Broker, elsewhere: BrokerContext, taken: Taken
) -> None:
    """Another producer's transaction opened before this one's on the partition: the row
    shows it (the LSO below our first offset), the commit is decided on it and goes in
    one query string, and the LSO stays at the other's first record."""
    d = TxnDriver(broker, "tx")
    committed_twice(d)
    other = TxnDriver(elsewhere, "other")  # type: ignore[arg-type]
    assert other.init() == 0
    assert other.send("t", 0, "x").error_code == 0
    others_first = partition_offsets(broker, "t", 0)[0] - 1
    assert d.add(("t", 0)) == 0  # the lock's way: the partition row moved
    assert d.send("t", 0, "e", register=False).error_code == 0
    taken.since()
    r = d.commit_with(d.requests(("t", 0, "f")))
    assert r.end is not None and r.end.error_code == 0
    assert taken.commit.sent == (1, 0)
    assert taken.refusals == []
    high_watermark, lso = partition_offsets(broker, "t", 0)
    assert lso == others_first < high_watermark
    assert other.end(commit=False) == 0
    assert read_values(broker, "t", 0) == ["a", "c", "e", "f"]


def test_a_registration_the_lock_would_refuse_takes_the_lock_way(
    broker: Broker, elsewhere: BrokerContext, taken: Taken
) -> None:
    """Another instance of the id fenced this producer: its remembered row still shows the
    old epoch, so the registration is decided on it, refused on the row's version with
    nothing written, and refused by the lock's way as a fenced producer is."""
    d = TxnDriver(broker, "tx")
    committed_twice(d)
    assert TxnDriver(elsewhere, "tx").init() == 0  # type: ignore[arg-type]
    add = AddPartitionsToTxnRequest("tx", d.producer_id, d.producer_epoch, [("t", 0)])
    taken.since()
    registered, answers = produce_registering(broker, d.requests(("t", 0, "zombie")), add)
    assert registered is not None and registered.error_code == KafkaError.PRODUCER_FENCED
    assert answers[0].error_code != 0
    assert (taken.register.sent, taken.register.refused) == ((0, 1), 1)
    assert taken.refusals == ["a row moved since this process wrote it"]
    assert "zombie" not in read_values(broker, "t", 0, committed=False)
