"""Ending a batch's prepared transactions together (``app.broker.prepared``), without
Spark: all of them commit in one DB transaction through the coordinator's own steps, or
none does; a batch claimed before aborts them instead; a transaction fenced since it was
handed over fails the whole batch; what is open under the prefix and was not handed over
is aborted."""

from __future__ import annotations

import pytest

from app.broker import Broker
from app.broker.prepared import PreparedTxn, end_prepared
from app.client import Producer
from app.errors import KafkaError, KafkaException
from tests.helpers.spark_data import committed, sql_rows

PREFIX = "batch-q-"


pytestmark = pytest.mark.broker(topics={"out": 3})


def prepared(db_url: str, tid: str, values: list[bytes]) -> PreparedTxn:
    """A task's transaction: its records in, left open, the producer closed."""
    p = Producer({"database.url": db_url, "transactional.id": tid})
    try:
        p.init_transactions()
        p.begin_transaction()
        for i, v in enumerate(values):
            p.produce("out", v, partition=i % 3)
        state = p.prepare_transaction()
    finally:
        p.close()
    return PreparedTxn(tid, state.producer_id, state.producer_epoch)


def states(db_url: str) -> dict[str, str]:
    return dict(sql_rows(db_url, "SELECT transactional_id, state FROM transactions"))


def test_a_batch_commits_every_transaction_through_the_coordinators_steps(
    db_url: str, broker: Broker
) -> None:
    a = prepared(db_url, PREFIX + "0", [b"a0", b"a1", b"a2"])
    b = prepared(db_url, PREFIX + "1", [b"b0", b"b1"])
    assert committed(db_url, ["out"]) == []  # prepared: nothing visible yet
    ended = end_prepared(broker, [a, b], lambda conn: True, strays=PREFIX)
    assert ended.committed and sorted(ended.commits) == [a.transactional_id, b.transactional_id]
    assert sorted(bytes(r[4]) for r in committed(db_url, ["out"])) == [
        b"a0", b"a1", b"a2", b"b0", b"b1"
    ]  # fmt: skip
    for tid in (a.transactional_id, b.transactional_id):
        events = sql_rows(
            db_url,
            "SELECT state FROM transaction_log WHERE transactional_id = %(t)s ORDER BY event_id",
            {"t": tid},
        )
        assert [e for (e,) in events][-3:] == ["BEGIN", "PREPARE_COMMIT", "COMPLETE_COMMIT"]


def test_a_fenced_transaction_fails_the_whole_batch(db_url: str, broker: Broker) -> None:
    a = prepared(db_url, PREFIX + "0", [b"a0", b"a1"])
    b = prepared(db_url, PREFIX + "1", [b"b0"])
    # A retried attempt of b's task re-initialises its id: b's transaction is fenced.
    retry = prepared(db_url, PREFIX + "1", [b"b0-again"])
    with pytest.raises(KafkaException) as info:
        end_prepared(broker, [a, b], lambda conn: True, strays=PREFIX)
    assert info.value.args[0].code() == KafkaError.PRODUCER_FENCED
    assert committed(db_url, ["out"]) == []  # a was not committed either
    assert sql_rows(db_url, "SELECT count(*) FROM spark_sink_commits")[0][0] == 0
    ended = end_prepared(broker, [a, retry], lambda conn: True, strays=PREFIX)
    assert ended.committed
    assert sorted(bytes(r[4]) for r in committed(db_url, ["out"])) == [b"a0", b"a1", b"b0-again"]


def test_a_batch_claimed_before_is_aborted_not_committed_again(db_url: str, broker: Broker) -> None:
    first = [prepared(db_url, PREFIX + "0", [b"once"])]
    assert end_prepared(broker, first, lambda conn: True, strays=PREFIX).committed
    replay = [prepared(db_url, PREFIX + "0", [b"once"])]
    ended = end_prepared(broker, replay, lambda conn: False, strays=PREFIX)
    assert not ended.committed and ended.aborts == [PREFIX + "0"]
    assert [bytes(r[4]) for r in committed(db_url, ["out"])] == [b"once"]
    assert states(db_url)[PREFIX + "0"] == "COMPLETE_ABORT"


def test_strays_under_the_prefix_are_aborted_and_others_left_alone(
    db_url: str, broker: Broker
) -> None:
    handed = prepared(db_url, PREFIX + "0", [b"kept"])
    prepared(db_url, PREFIX + "1", [b"dead-attempt"])
    prepared(db_url, "another-query-0", [b"not-ours"])
    ended = end_prepared(broker, [handed], lambda conn: True, strays=PREFIX)
    assert ended.aborts == [PREFIX + "1"]
    s = states(db_url)
    assert (s[PREFIX + "0"], s[PREFIX + "1"], s["another-query-0"]) == (
        "COMPLETE_COMMIT", "COMPLETE_ABORT", "BEGIN"
    )  # fmt: skip
    # The driver's abort: what it was handed and what is open under the prefix.
    again = prepared(db_url, PREFIX + "0", [b"aborted"])
    ended = end_prepared(broker, [again], None, strays=PREFIX)
    assert not ended.committed and ended.aborts == [PREFIX + "0"]
    assert [bytes(r[4]) for r in committed(db_url, ["out"])] == [b"kept"]


def test_the_same_id_handed_twice_is_refused(db_url: str, broker: Broker) -> None:
    a = prepared(db_url, PREFIX + "0", [b"x"])
    with pytest.raises(KafkaException):
        end_prepared(broker, [a, a], lambda conn: True)
