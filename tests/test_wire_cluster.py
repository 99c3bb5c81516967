"""Several ``kip98 serve`` nodes over one database, as Kafka clients see them
(docs/design.md rules 46-49): every node lists the live nodes and the same leaders,
spreads coordinators, answers any request whatever node a client meant; a stopped node is
gone from the next answer and a killed one once its lease lapses; a node id held by a live
node, and other bad input, are refused in one line with the other nodes untouched;
``--processes 2`` answers on both processes; ``kip98 cluster describe`` and the
``cluster_nodes`` view show the nodes."""

from __future__ import annotations

import datetime
import json
import math
import os
import socket
import subprocess
import sys
import urllib.request
from typing import Any

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import AdminClient
from sqlalchemy import text

from app import placement
from app.broker import Broker
from app.log.topics import create_topic
from app.server.process import ServeProcess, free_port
from tests.helpers.batches import record_batch
from tests.helpers.cli_runner import run_kip98
from tests.helpers.cluster_nodes import bootstrap, live_nodes, node_at, nodes, wait_until
from tests.helpers.txn_driver import read_values
from tests.helpers.wire_client import delivered, exchange


def _metadata(address: str) -> Any:
    from kio.schema.metadata.v12 import request as metadata_v12

    body = metadata_v12.MetadataRequest(
        topics=None, allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    return exchange(address, 3, 12, body)


def _coordinator(address: str, key: str, key_type: int) -> tuple[int, int]:
    """FindCoordinator v3's answer: (node id, port)."""
    from kio.schema.find_coordinator.v3 import request as find_v3

    answer = exchange(address, 10, 3, find_v3.FindCoordinatorRequest(key=key, key_type=key_type))
    assert answer.error_code.value == 0
    return answer.node_id, answer.port


def _rows(broker: Broker) -> list[tuple[int, str]]:
    with broker.engine.connect() as conn:
        found = conn.execute(text("SELECT node_id, incarnation FROM broker_registrations"))
        return sorted((r.node_id, str(r.incarnation)) for r in found)


def test_every_node_lists_the_live_nodes_and_the_same_leaders(db_url: str) -> None:
    broker = Broker.connect(db_url)
    create_topic(broker, "t", 12)
    create_topic(broker, "one", 1)
    with nodes(db_url, 3) as serves:
        answers = [_metadata(s.address) for s in serves]
        expected = {(i, "127.0.0.1", s.port) for i, s in enumerate(serves)}
        for answer in answers:
            assert {(b.node_id, b.host, b.port) for b in answer.brokers} == expected
            assert (answer.controller_id, answer.cluster_id) == (0, "kip98")
        leaders = [
            {t.name: [p.leader_id for p in sorted(t.partitions, key=lambda p: p.partition_index)]
             for t in answer.topics}
            for answer in answers
        ]  # fmt: skip
        assert leaders[0] == leaders[1] == leaders[2]
        assert leaders[0]["t"] == placement.leaders("t", 12, [0, 1, 2])
        assert max(leaders[0]["t"].count(n) for n in range(3)) <= math.ceil(2 * 12 / 3)
        for t in answers[0].topics:
            for p in t.partitions:
                assert p.replica_nodes[0] == p.leader_id
                assert sorted(p.replica_nodes) == sorted(p.isr_nodes) == [0, 1, 2]

        # librdkafka sees the same, bootstrapped with every node, and describes the cluster.
        admin = AdminClient({"bootstrap.servers": bootstrap(serves)})
        seen = admin.list_topics(timeout=30)
        assert {b.id: (b.host, b.port) for b in seen.brokers.values()} == {
            i: ("127.0.0.1", s.port) for i, s in enumerate(serves)
        }
        assert [seen.topics["t"].partitions[p].leader for p in range(12)] == leaders[0]["t"]
        described = admin.describe_cluster(request_timeout=30).result(30)
        assert sorted(n.id for n in described.nodes) == [0, 1, 2]
        assert (described.controller.id, described.cluster_id) == (0, "kip98")


def test_coordinators_spread_over_the_nodes_and_each_node_names_the_same(db_url: str) -> None:
    with nodes(db_url, 3) as serves:
        ports = {i: s.port for i, s in enumerate(serves)}
        for key_type, prefix in ((0, "group"), (1, "txn")):
            chosen = set()
            for i in range(24):
                key = f"{prefix}-{i}"
                answers = {_coordinator(s.address, key, key_type) for s in serves}
                assert len(answers) == 1
                [(node_id, port)] = answers
                assert node_id == placement.coordinator(key_type, key, [0, 1, 2])
                assert port == ports[node_id]
                chosen.add(node_id)
            assert chosen == {0, 1, 2}


def test_any_node_answers_a_request_meant_for_another(db_url: str) -> None:
    """A client whose metadata is stale sends to a node that no longer leads: it is served,
    never told NOT_LEADER_OR_FOLLOWER. Raw frames to every node, for every partition."""
    from kio.schema.list_offsets.v1 import request as list_offsets_v1
    from kio.schema.produce.v9 import request as produce_v9

    broker = Broker.connect(db_url)
    create_topic(broker, "t", 3)
    with nodes(db_url, 3) as serves:
        for n, serve in enumerate(serves):
            for partition in range(3):
                body = produce_v9.ProduceRequest(
                    acks=-1, timeout=datetime.timedelta(seconds=10), topic_data=(
                        produce_v9.TopicProduceData(name="t", partition_data=(
                            produce_v9.PartitionProduceData(
                                index=partition, records=record_batch([f"n{n}"])),)),))  # fmt: skip
                answer = exchange(serve.address, 0, 9, body)
                assert answer.responses[0].partition_responses[0].error_code.value == 0
                offsets = exchange(
                    serve.address, 2, 1,
                    list_offsets_v1.ListOffsetsRequest(replica_id=-1, topics=(
                        list_offsets_v1.ListOffsetsTopic(name="t", partitions=(
                            list_offsets_v1.ListOffsetsPartition(
                                partition_index=partition, timestamp=-1),)),)),
                )  # fmt: skip
                part = offsets.topics[0].partitions[0]
                assert (part.error_code.value, part.offset) == (0, n + 1)
    for partition in range(3):
        assert read_values(broker, "t", partition) == ["n0", "n1", "n2"]


def test_a_stopped_node_is_gone_at_once_and_a_killed_one_once_its_lease_lapses(
    db_url: str,
) -> None:
    """Also: every Metadata answer, from any node, gives one leader per partition and leader
    epoch, and a partition's epoch never goes back (docs/design.md rule 40)."""
    broker = Broker.connect(db_url)
    create_topic(broker, "t", 6)
    led: dict[tuple[int, int], int] = {}  # (partition, epoch) -> its leader
    newest: dict[int, int] = {}

    def metadata(address: str) -> Any:
        answer = _metadata(address)
        for t in answer.topics:
            for p in t.partitions:
                key = (p.partition_index, p.leader_epoch)
                assert led.setdefault(key, p.leader_id) == p.leader_id, f"two leaders in {key}"
                assert p.leader_epoch >= newest.get(p.partition_index, 0)
                newest[p.partition_index] = p.leader_epoch
        return answer

    with nodes(db_url, 3) as serves:
        metadata(serves[0].address)
        assert serves[1].stop() == 0
        # SIGTERM removed the registration before the process ended: nothing to wait for.
        assert {b.node_id for b in metadata(serves[0].address).brokers} == {0, 2}
        assert {b.node_id for b in metadata(serves[2].address).brokers} == {0, 2}
        assert [n for n, _ in _rows(broker)] == [0, 2]
        leaders = {p.leader_id for t in metadata(serves[0].address).topics for p in t.partitions}
        assert leaders <= {0, 2}

        serves[2].kill()
        wait_until(
            lambda: {b.node_id for b in metadata(serves[0].address).brokers} == {0},
            "the killed node stayed in Metadata past its lease",
        )
        # Its row was removed by the live node's next heartbeat, or by the first reader.
        assert [n for n, _ in _rows(broker)] == [0]
        # A node started again takes the smallest free id.
        serves[1].start()
        wait_until(lambda: node_at(db_url, serves[1]), "the restarted node never registered")
        assert node_at(db_url, serves[1]).node_id == 1  # type: ignore[union-attr]
        metadata(serves[1].address)
    # Each node leaving and joining was a new leadership of the partitions it moved.
    assert set(led.values()) == {0, 1, 2}
    assert all(epoch >= 1 for epoch in newest.values()) and len(led) > len(newest)


def test_a_live_nodes_id_is_refused_in_one_line_and_the_others_go_on(db_url: str) -> None:
    broker = Broker.connect(db_url)
    with nodes(db_url, 2) as serves:
        before = _rows(broker)
        result = _serve_once(db_url, "--listen", f"127.0.0.1:{free_port()}", "--node-id", "1")
        assert result.returncode == 1
        errors = [line for line in result.stderr.splitlines() if "node id 1" in line]
        assert len(errors) == 1 and "is held by a live node" in errors[0], result.stderr
        assert f"PLAINTEXT://127.0.0.1:{serves[1].port}" in errors[0]
        assert "Traceback" not in result.stderr
        assert _rows(broker) == before
        assert {b.node_id for b in _metadata(serves[0].address).brokers} == {0, 1}
        # An id nobody holds is taken as asked.
        serve = ServeProcess(db_url, args=("--node-id", "7", "--rack", "rack-b.1"))
        serve.start()
        try:
            node = wait_until(lambda: node_at(db_url, serve), "node 7 never registered")
            assert (node.node_id, node.rack) == (7, "rack-b.1")
            racks = {b.node_id: b.rack for b in _metadata(serves[0].address).brokers}
            assert racks == {0: None, 1: None, 7: "rack-b.1"}
        finally:
            assert serve.stop() == 0


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--processes", "0"], "'0' is not a positive number of processes, nor auto"),
        (["--processes", "two"], "'two' is not a positive number of processes, nor auto"),
        (["--rack", "rack a"], "rack 'rack a': use 1 to 249 letters, digits"),
        (["--rack", "r/1"], "rack 'r/1': use 1 to 249 letters, digits"),
        (["--node-id", "-1"], "-1 is not in the range"),
        (["--node-id", "x"], "'x' is not a valid integer"),
        (["--node-id", str(2**31 - 1), "--processes", "2"], "go past 2147483647"),
    ],
)  # fmt: skip
def test_bad_input_is_refused_in_one_line_and_registers_nothing(
    db_url: str, args: list[str], message: str
) -> None:
    result = _serve_once(db_url, "--listen", f"127.0.0.1:{free_port()}", *args)
    assert result.returncode == 2
    assert message in result.stderr
    assert "Traceback" not in result.stderr
    assert _rows(Broker.connect(db_url)) == []


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"KIP98_NODE_SESSION_TIMEOUT_MS": "0"},
         "KIP98_NODE_SESSION_TIMEOUT_MS must be at least 1000, not 0"),
        ({"KIP98_NODE_SESSION_TIMEOUT_MS": "six"},
         "KIP98_NODE_SESSION_TIMEOUT_MS must be a non-negative integer, got 'six'"),
        ({"KIP98_DATABASE_URL": "postgresql+psycopg://kip98@127.0.0.1:1/none"},
         "cannot register this node: (psycopg.OperationalError) connection failed"),
    ],
)  # fmt: skip
def test_a_bad_setting_or_no_database_is_refused_in_one_line(
    db_url: str, env: dict[str, str], message: str
) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "app.server", "--listen", f"127.0.0.1:{free_port()}"],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "KIP98_DATABASE_URL": db_url, **env},
    )  # fmt: skip
    assert result.returncode == 1
    errors = [line for line in result.stderr.splitlines() if line.startswith("Error:")]
    assert len(errors) == 1 and message in errors[0], result.stderr
    assert "Traceback" not in result.stderr
    assert _rows(Broker.connect(db_url)) == []


@pytest.mark.parametrize("processes", ["1", "2"])
def test_a_listener_that_cannot_bind_is_refused_in_one_line(db_url: str, processes: str) -> None:
    with nodes(db_url, 1) as [serve]:
        before = _rows(Broker.connect(db_url))
        with socket.create_server(("127.0.0.1", 0)) as taken:
            port = taken.getsockname()[1]
            result = _serve_once(
                db_url, "--listen", f"127.0.0.1:{free_port()}",
                "--listen", f"SASL_PLAINTEXT://127.0.0.1:{port}", "--processes", processes,
            )  # fmt: skip
        assert result.returncode == 1
        errors = [line for line in result.stderr.splitlines() if "cannot listen" in line]
        assert errors == [f"Error: cannot listen on SASL_PLAINTEXT://127.0.0.1:{port}: "
                          "Address already in use"], result.stderr  # fmt: skip
        assert "Traceback" not in result.stderr
        assert _rows(Broker.connect(db_url)) == before
        assert {b.node_id for b in _metadata(serve.address).brokers} == {0}


def test_two_processes_on_one_listener_are_two_nodes_and_both_answer(db_url: str) -> None:
    broker = Broker.connect(db_url)
    create_topic(broker, "t", 4)
    metrics = _port_pair()
    serve = ServeProcess(
        db_url, args=("--processes", "2", "--metrics-listen", f"127.0.0.1:{metrics}")
    )
    serve.start()
    try:
        pair = wait_until(
            lambda: (found := live_nodes(db_url)) and len(found) == 2 and found,
            "two nodes never registered",
        )
        assert [n.node_id for n in pair] == [0, 1]
        assert {n.endpoint("PLAINTEXT") for n in pair} == {pair[0].endpoint("PLAINTEXT")}
        assert pair[0].endpoint("PLAINTEXT").port == serve.port  # type: ignore[union-attr]
        pids = {n.pid for n in pair}
        assert len(pids) == 2 and serve.proc is not None and serve.proc.pid not in pids

        # Connections are spread by the kernel: open new ones until each process has
        # answered some (the count each reports with its heartbeat).
        def both_answered() -> bool:
            for _ in range(8):
                _metadata(serve.address)
            return all(n.requests > 0 for n in live_nodes(db_url))

        wait_until(both_answered, "one process answered every connection")
        # Each process counts its own requests for Prometheus, the i-th at PORT+i.
        for port in (metrics, metrics + 1):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as page:
                assert 'kip98_server_requests_total{api="metadata"}' in page.read().decode()
        producer = ck.Producer({"bootstrap.servers": serve.address, "enable.idempotence": True})
        for partition in range(4):
            assert [e for e, _ in delivered(producer, 5, topic="t", partition=partition)] == [
                None
            ] * 5
            assert read_values(broker, "t", partition) == [f"v{i}" for i in range(5)]
        with broker.engine.connect() as conn:
            viewed = conn.execute(text("SELECT node_id, pid FROM cluster_nodes ORDER BY 1")).all()
        assert [(r.node_id, r.pid) for r in viewed] == [(n.node_id, n.pid) for n in pair]
    finally:
        assert serve.stop() == 0
        serve.kill()
    # Both left the cluster before the parent exited.
    assert live_nodes(db_url) == [] and _rows(broker) == []


def test_the_processes_do_not_outlive_a_killed_parent(db_url: str) -> None:
    serve = ServeProcess(db_url, args=("--processes", "2"))
    serve.start()
    try:
        pids = wait_until(
            lambda: len(found := live_nodes(db_url)) == 2 and [n.pid for n in found],
            "two nodes never registered",
        )
    finally:
        serve.kill()
    wait_until(lambda: not any(_alive(pid) for pid in pids), "a process outlived its parent")
    # Each was stopped by SIGTERM, so each left the cluster.
    assert live_nodes(db_url) == []


def test_kip98_cluster_describe_and_the_cluster_nodes_view(db_url: str) -> None:
    broker = Broker.connect(db_url)
    create_topic(broker, "t", 9)
    with nodes(db_url, 2, "--rack", "zone-a") as serves:
        result = run_kip98("cluster", "describe", "--output", "json")
        assert result.returncode == 0, result.stderr
        described = json.loads(result.stdout)
        led = placement.leaders("t", 9, [0, 1])
        assert [
            (
                d["node_id"],
                d["listeners"],
                d["rack"],
                d["pid"],
                d["partitions_led"],
                d["controller"],
            )
            for d in described
        ] == [
            (i, {"PLAINTEXT": s.address}, "zone-a", s.proc.pid, led.count(i), i == 0)  # type: ignore[union-attr]
            for i, s in enumerate(serves)
        ]
        for d in described:
            since = datetime.datetime.fromisoformat(d["since"])
            assert since <= datetime.datetime.fromisoformat(d["last_heartbeat"])
        table = run_kip98("cluster", "describe")
        assert table.returncode == 0, table.stderr
        lines = table.stdout.splitlines()
        assert lines[0].split() == [
            "NODE-ID", "LISTENERS", "RACK", "HOST", "PID", "SINCE", "LAST-HEARTBEAT",
            "PARTITIONS-LED", "CONTROLLER",
        ]  # fmt: skip
        assert lines[1].split()[:3] == ["0", f"PLAINTEXT://{serves[0].address}", "zone-a"]
        with broker.engine.connect() as conn:
            rows = conn.execute(text("SELECT * FROM cluster_nodes ORDER BY node_id")).all()
        assert [(r.node_id, r.rack, r.listeners, r.pid) for r in rows] == [
            (i, "zone-a", {"PLAINTEXT": {"host": "127.0.0.1", "port": s.port}}, s.proc.pid)  # type: ignore[union-attr]
            for i, s in enumerate(serves)
        ]
        assert all(r.registered_at <= r.last_heartbeat_at < r.lease_expires_at for r in rows)
    empty = run_kip98("cluster", "describe", "--output", "json")
    assert empty.returncode == 0 and json.loads(empty.stdout) == []


def _serve_once(db_url: str, *args: str) -> subprocess.CompletedProcess[str]:
    """``python -m app.server`` run to its end (it is expected to refuse to start)."""
    return subprocess.run(
        [sys.executable, "-m", "app.server", *args],
        capture_output=True, text=True, timeout=120,
        env={**os.environ, "KIP98_DATABASE_URL": db_url},
    )  # fmt: skip


def _port_pair() -> int:
    """A free port whose next one is free too."""
    while True:
        port = free_port()
        try:
            with socket.create_server(("127.0.0.1", port + 1)):
                return port
        except OSError:
            continue


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    # A zombie (not yet reaped by its new parent) has stopped serving all the same.
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().split(") ")[1][0] != "Z"


def test_a_listener_on_port_0_registers_the_port_it_was_given(db_url: str) -> None:
    proc = subprocess.Popen(
        [sys.executable, "-m", "app.server", "--listen", "127.0.0.1:0"],
        env={**os.environ, "KIP98_DATABASE_URL": db_url},
    )
    try:
        [node] = wait_until(lambda: live_nodes(db_url), "the node never registered")
        endpoint = node.endpoint("PLAINTEXT")
        assert endpoint is not None and endpoint.port != 0
        answer = _metadata(f"127.0.0.1:{endpoint.port}")
        assert [(b.node_id, b.port) for b in answer.brokers] == [(0, endpoint.port)]
    finally:
        proc.terminate()
        assert proc.wait(60) == 0
