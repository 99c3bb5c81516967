"""Rows that may not exist yet, created by two requests at once: the first InitProducerId
of a transactional id, and the first commit of a group's offset. Each race is played
deterministically, one request paused on its own connection while the other runs to
COMMIT, then resumed; the loser must go through the rules as if it had come second (a
fencing InitProducerId, a later offset), and each projection must stay the fold of its
events."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import pytest
from sqlalchemy import event, text

from app.broker import Broker
from app.broker.offsets import txn_offset_commit
from app.coordinator import handlers
from app.coordinator import machines as m
from app.coordinator.producer_id import init_producer_id
from app.coordinator.rebuild import compute_transactions, live_transactions
from app.errors import KafkaError
from app.groups import txn_offsets
from app.groups.offsets import offset_commit
from app.groups.rebuild import compute_group_offsets, live_group_offsets
from app.protocol import (
    InitProducerIdRequest,
    InitProducerIdResponse,
    OffsetAndMetadata,
    OffsetCommitRequest,
    TxnOffsetCommitRequest,
)
from tests.helpers.backends import idle_unbounded
from tests.helpers.projections import assert_partition_log_rebuilds
from tests.helpers.txn_driver import TxnDriver, partition_offsets, read_values, state_of

WAIT_S = 30


# A paused request's transaction idles while the other runs, for as long as the test
# takes: no idle bound may end it.
pytestmark = pytest.mark.broker(topics={"a": 1}, settings=idle_unbounded)


class Paused:
    """Runs ``fn`` on its own thread and holds it at a point of its choosing (``pause``,
    called from that thread) until ``resume``."""

    def __init__(self, fn: Callable[[], Any]) -> None:
        self.reached, self.released = threading.Event(), threading.Event()
        self.result: Any = None
        self.error: BaseException | None = None
        self.paused_once = False

        def run() -> None:
            try:
                self.result = fn()
            except BaseException as exc:  # surfaced by ``resume``
                self.error = exc
            finally:
                self.reached.set()

        self.thread = threading.Thread(target=run)

    def on_own_thread(self) -> bool:
        return threading.current_thread() is self.thread

    def pause(self) -> None:
        self.paused_once = True
        self.reached.set()
        assert self.released.wait(WAIT_S), "never resumed"

    def start(self) -> None:
        self.thread.start()
        assert self.reached.wait(WAIT_S), "never reached its pause"
        assert self.paused_once and self.error is None, self.error

    def resume(self) -> Any:
        self.released.set()
        self.thread.join(WAIT_S)
        assert not self.thread.is_alive(), "did not finish"
        if self.error is not None:
            raise self.error
        return self.result


def events(broker: Broker, tid: str) -> list[str]:
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text("SELECT state FROM transaction_log WHERE transactional_id = :t ORDER BY event_id"),
            {"t": tid},
        )
        return [r[0] for r in rows]


def test_racing_first_init_producer_id_fences_the_winner(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """B reads no row for "tx" and is held there; A's InitProducerId commits, A begins and
    writes to "a" 0. B must then fence A: A's open transaction aborted (its marker written,
    the LSO past it), not forgotten under a new identity with the LSO pinned for ever."""
    real_load = handlers.load_for_update

    def load(conn: Any, transactional_id: str) -> Any:
        meta = real_load(conn, transactional_id)
        if meta is None and late.on_own_thread() and not late.paused_once:
            late.pause()
        return meta

    monkeypatch.setattr(handlers, "load_for_update", load)
    late = Paused(lambda: init_producer_id(broker, InitProducerIdRequest("tx", 60_000)))
    late.start()

    first = TxnDriver(broker, "tx")
    assert first.init() == 0
    assert first.send("a", 0, "open").error_code == 0
    assert partition_offsets(broker, "a", 0) == (1, 0), "A's transaction pins the LSO"

    answer: InitProducerIdResponse = late.resume()
    assert answer.error_code == 0
    assert partition_offsets(broker, "a", 0) == (2, 2), "A's transaction was left open"
    assert read_values(broker, "a", 0) == []
    assert (answer.producer_id, answer.producer_epoch) == (
        first.producer_id,
        first.producer_epoch + 2,  # fenced (PREPARE_ABORT), then the new instance's epoch
    )
    assert state_of(broker, "tx") == m.EMPTY
    assert events(broker, "tx") == [
        m.EMPTY, m.BEGIN, m.PREPARE_ABORT, m.COMPLETE_ABORT, m.EMPTY,
    ]  # fmt: skip
    with broker.engine.connect() as conn:
        assert compute_transactions(conn, broker.settings) == live_transactions(conn)
    assert_partition_log_rebuilds(broker, broker.clock.now_ms())
    # The winner is fenced everywhere; the new instance works.
    stale = first.send("a", 0, "late", register=False)
    assert stale.error_code == KafkaError.INVALID_PRODUCER_EPOCH
    assert first.end(commit=True) == KafkaError.PRODUCER_FENCED
    second = TxnDriver(
        broker, "tx", producer_id=answer.producer_id, producer_epoch=answer.producer_epoch
    )
    assert second.send("a", 0, "real").error_code == 0
    assert second.end(commit=True) == 0
    assert read_values(broker, "a", 0) == ["real"]


def test_racing_first_init_producer_id_without_a_transaction(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same race with nothing begun: the loser bumps the winner's identity (one more
    event) instead of replacing it with a producer id of its own."""
    real_load = handlers.load_for_update

    def load(conn: Any, transactional_id: str) -> Any:
        meta = real_load(conn, transactional_id)
        if meta is None and late.on_own_thread() and not late.paused_once:
            late.pause()
        return meta

    monkeypatch.setattr(handlers, "load_for_update", load)
    late = Paused(lambda: init_producer_id(broker, InitProducerIdRequest("tx", 60_000)))
    late.start()
    first = TxnDriver(broker, "tx")
    assert first.init() == 0
    answer: InitProducerIdResponse = late.resume()
    assert (answer.error_code, answer.producer_id, answer.producer_epoch) == (
        0,
        first.producer_id,
        first.producer_epoch + 1,
    )
    assert events(broker, "tx") == [m.EMPTY, m.EMPTY]
    assert first.add(("a", 0)) == KafkaError.PRODUCER_FENCED
    with broker.engine.connect() as conn:
        assert compute_transactions(conn, broker.settings) == live_transactions(conn)


def pause_before(broker: Broker, paused: Paused, statement: str) -> None:
    """Hold ``paused`` just before it runs a statement starting with ``statement``."""

    def before(_conn: Any, _cursor: Any, sql: str, *_: Any) -> None:
        if paused.on_own_thread() and not paused.paused_once and sql.lstrip().startswith(statement):
            paused.pause()

    event.listen(broker.engine, "before_cursor_execute", before)


def assert_group_offsets_rebuild(broker: Broker) -> None:
    with broker.engine.connect() as conn:
        assert compute_group_offsets(conn) == live_group_offsets(conn)


def commit(broker: Broker, offset: int) -> int:
    req = OffsetCommitRequest("g", {("a", 0): OffsetAndMetadata(offset)})
    return offset_commit(broker, req).error_code


@pytest.mark.parametrize("existing", [False, True])
def test_racing_offset_commits_keep_the_projection_the_fold(broker: Broker, existing: bool) -> None:
    """Two commits of one group's offset at once, the first held just before it writes the
    projection: whichever value the projection ends with must be the later event's, whether
    or not the row existed."""
    if existing:
        assert commit(broker, 5) == 0
    late = Paused(lambda: commit(broker, 10))
    pause_before(broker, late, "INSERT INTO group_offsets")
    late.start()
    assert commit(broker, 20) == 0
    assert late.resume() == 0
    assert_group_offsets_rebuild(broker)


def test_a_transactional_commit_racing_a_plain_one_keeps_the_fold(
    broker: Broker, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The COMMIT marker's offsets land while a plain commit of the same partition runs:
    the commit is held, its markers written, just before it writes the projection
    (``group_offsets``), whatever of its completion runs before that."""
    d = TxnDriver(broker, "tx")
    assert d.init() == 0
    assert d.add_offsets("g") == 0
    req = TxnOffsetCommitRequest(
        "tx", "g", d.producer_id, d.producer_epoch, {("a", 0): OffsetAndMetadata(10)}
    )
    assert txn_offset_commit(broker, req).error_code == 0
    real_write = txn_offsets.execute_or_queue

    def write(conn: Any, writes: Any, statement: str, *args: Any) -> None:
        starts = statement.lstrip().startswith("INSERT INTO group_offsets")
        if starts and late.on_own_thread() and not late.paused_once:
            late.pause()
        real_write(conn, writes, statement, *args)

    monkeypatch.setattr(txn_offsets, "execute_or_queue", write)
    late = Paused(lambda: d.end(commit=True))
    late.start()
    assert commit(broker, 20) == 0
    assert late.resume() == 0
    assert_group_offsets_rebuild(broker)
