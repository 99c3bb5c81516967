"""``kip98 serve`` runs the coordinator's timers itself, as Kafka's brokers do
(docs/design.md rule 54): a librdkafka transaction left open past its
transaction.timeout.ms is aborted and its producer fenced with nothing else running the
coordinator loop (``KIP98_CLIENT_COORDINATOR_LOOP=0`` here, no ``kip98 coordinator run``);
with several nodes, they share the leases (rule 59), and another takes a lease's work
over once the leases of a node killed outright lapse."""

from __future__ import annotations

from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka import IsolationLevel, TopicPartition
from confluent_kafka.admin import AdminClient, OffsetSpec
from sqlalchemy import text

from app.broker import Broker
from app.coordinator.metadata import txn_partition_for
from app.log.topics import create_topic
from app.server.process import ServeProcess
from app.settings import BrokerSettings
from tests.helpers.cluster_nodes import live_nodes, node_at, nodes, wait_until
from tests.helpers.txn_driver import state_of
from tests.helpers.wire_client import serving

# A short pass interval and lease, so the test waits little; the waits are on conditions.
ENV = {"KIP98_COORDINATOR_INTERVAL_MS": "100", "KIP98_COORDINATOR_LEASE_MS": "2000"}
PARTITIONS = BrokerSettings().transaction_log_partitions
# Long enough that the record is written before it lapses, even on a loaded machine.
TIMEOUT_MS = 4000
# What librdkafka reports for a commit whose producer the coordinator has fenced: the
# fatal fence, or the state error of a transaction already aborted under it.
FENCED = {
    ck.KafkaError._FENCED,
    ck.KafkaError.PRODUCER_FENCED,
    ck.KafkaError.INVALID_PRODUCER_EPOCH,
    ck.KafkaError.INVALID_TXN_STATE,
    ck.KafkaError._STATE,
}


@pytest.fixture(autouse=True)
def no_client_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Nothing in this process runs the coordinator loop: only the servers may."""
    monkeypatch.setenv("KIP98_CLIENT_COORDINATOR_LOOP", "0")


def _offsets(admin: AdminClient) -> tuple[int, int]:
    """(last stable offset, high watermark) of t-0, by ListOffsets under each isolation."""
    tp = TopicPartition("t", 0)
    found = []
    for level in (IsolationLevel.READ_COMMITTED, IsolationLevel.READ_UNCOMMITTED):
        answer = admin.list_offsets({tp: OffsetSpec.latest()}, isolation_level=level)
        found.append(int(answer[tp].result().offset))
    return found[0], found[1]


def _read_committed(bootstrap: str, want: int) -> list[bytes]:
    consumer = ck.Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": "reader",
            "isolation.level": "read_committed",
            "auto.offset.reset": "earliest",
            "enable.auto.commit": False,
        }
    )
    consumer.assign([TopicPartition("t", 0, 0)])
    got: list[bytes] = []
    try:
        wait_until(lambda: _polled(consumer, got) >= want, "the later record was never read")
    finally:
        consumer.close()
    return got


def _polled(consumer: ck.Consumer, got: list[bytes]) -> int:
    msg = consumer.poll(0.5)
    if msg is not None and msg.error() is None:
        got.append(msg.value())
    return len(got)


def _left_open_is_aborted(db_url: str, bootstrap: str) -> None:
    """A transaction left open past its timeout is aborted by a server's loop: its
    producer's commit fails fenced, the partition's LSO moves past it, and a read_committed
    consumer reads what was committed after it (and not its record)."""
    broker = Broker.connect(db_url)
    admin = AdminClient({"bootstrap.servers": bootstrap})
    producer = ck.Producer(
        {
            "bootstrap.servers": bootstrap,
            "transactional.id": "stalled",
            "transaction.timeout.ms": TIMEOUT_MS,
            "message.timeout.ms": TIMEOUT_MS,
        }
    )
    producer.init_transactions(60)
    producer.begin_transaction()
    producer.produce("t", value=b"stalled")
    assert producer.flush(30) == 0

    wait_until(
        lambda: state_of(broker, "stalled") == "COMPLETE_ABORT",
        "the transaction left open was never timed out",
    )
    with pytest.raises(ck.KafkaException) as failed:
        producer.commit_transaction(30)
    error: Any = failed.value.args[0]
    assert error.code() in FENCED, error
    # The abort marker is written and nothing is open: the LSO is the high watermark.
    wait_until(lambda: (o := _offsets(admin))[0] == o[1] >= 1, "the LSO stayed pinned")

    later = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    later.produce("t", value=b"later")
    assert later.flush(30) == 0
    assert _read_committed(bootstrap, 1) == [b"later"]


def test_a_lone_server_times_out_a_transaction_left_open(db_url: str) -> None:
    create_topic(Broker.connect(db_url), "t", 1)
    with serving(db_url, env=ENV) as address:
        _left_open_is_aborted(db_url, address)
    # Stopped by SIGTERM, the server released its leases before it exited.
    assert _live_leases(db_url) == 0


def _holders(db_url: str) -> dict[int, str]:
    """The live owner of each held coordinator lease, by transaction-log partition."""
    broker = Broker.connect(db_url)
    with broker.engine.connect() as conn:
        rows = conn.execute(
            text(
                "SELECT txn_partition, owner FROM coordinator_leases"
                " WHERE expires_ms > :now AND owner IS NOT NULL"
            ),
            {"now": broker.clock.now_ms()},
        ).all()
    return {int(r.txn_partition): str(r.owner) for r in rows}


def _held_by(db_url: str, pids: set[int]) -> dict[int, str] | None:
    """Every lease, each held by a loop of one of ``pids`` and all of them by some: the
    leases shared among those nodes alone (rule 59); else None."""
    holders = _holders(db_url)
    owners = {_pid_of(o) for o in holders.values()}
    if len(holders) != PARTITIONS or owners != pids:
        return None
    return holders


def _holder(db_url: str) -> str | None:
    """The one owner of every live coordinator lease, if one owner holds them all."""
    owners = set(_holders(db_url).values())
    return owners.pop() if len(owners) == 1 and len(_holders(db_url)) == PARTITIONS else None


def _live_leases(db_url: str, owner: str | None = None) -> int:
    """How many leases are held now (by ``owner``, if given)."""
    broker = Broker.connect(db_url)
    with broker.engine.connect() as conn:
        return int(
            conn.execute(
                text(
                    "SELECT count(*) FROM coordinator_leases WHERE expires_ms > :now"
                    " AND (CAST(:owner AS text) IS NULL OR owner = :owner)"
                ),
                {"now": broker.clock.now_ms(), "owner": owner},
            ).scalar_one()
        )


def _pid_of(owner: str) -> int:
    """The process id in a loop's owner name (host:pid:nonce)."""
    return int(owner.split(":")[1])


def test_another_node_takes_over_from_a_killed_lease_holder(db_url: str) -> None:
    create_topic(Broker.connect(db_url), "t", 1)
    with nodes(db_url, 3, env=ENV) as serves:
        pids = {s.proc.pid for s in serves if s.proc is not None}
        # The three loops share the leases: each node holds some (rule 59).
        shared = wait_until(lambda: _held_by(db_url, pids), "the nodes never shared the leases")
        mine = txn_partition_for("stalled", PARTITIONS)
        holder = shared[mine]
        [doomed] = [s for s in serves if s.proc is not None and s.proc.pid == _pid_of(holder)]
        doomed.kill()
        others = [s for s in serves if s is not doomed]
        alive = {s.proc.pid for s in others if s.proc is not None}
        taken = wait_until(
            lambda: _held_by(db_url, alive), "the other nodes never took the lapsed leases over"
        )
        successor = taken[mine]
        assert successor != holder
        # The killed node out of Metadata, so no client is sent to it.
        wait_until(
            lambda: doomed.port not in {n.endpoint("PLAINTEXT").port for n in live_nodes(db_url)},  # type: ignore[union-attr]
            "the killed node stayed registered",
        )
        _left_open_is_aborted(db_url, ",".join(s.address for s in others))

        # The successor stopped by SIGTERM releases its leases at once; the last node
        # takes every one on its next passes.
        [stopping] = [s for s in others if s.proc is not None and s.proc.pid == _pid_of(successor)]
        assert stopping.stop() == 0
        assert _live_leases(db_url, successor) == 0
        [last] = [s for s in others if s is not stopping]
        assert last.proc is not None
        wait_until(
            lambda: _held_by(db_url, {last.proc.pid}) if last.proc else None,
            "the last node never took the released leases",
        )


def test_with_the_setting_off_a_server_takes_no_lease(db_url: str) -> None:
    """KIP98_SERVE_COORDINATOR_LOOP=0: the server leaves the work to others (here a second
    server; the clients' loops or kip98 coordinator run otherwise), however long it runs
    first."""
    with ServeProcess(db_url, env={**ENV, "KIP98_SERVE_COORDINATOR_LOOP": "0"}) as off:
        wait_until(lambda: node_at(db_url, off), "the server never registered")
        with ServeProcess(db_url, env=ENV) as on:
            holder = wait_until(lambda: _holder(db_url), "no node took the coordinator leases")
            assert on.proc is not None and _pid_of(holder) == on.proc.pid
