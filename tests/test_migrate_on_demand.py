"""The embedded database is migrated by whatever starts it (``kip98 serve``, the native
clients, the CLI); one's own (``KIP98_DATABASE_URL``) only when asked: ``kip98 db
migrate`` or ``KIP98_AUTO_MIGRATE=1``, ``kip98 serve`` refusing it in one line otherwise;
migrations run at once take turns (docs/design.md rule 55).

One fresh ``KIP98_HOME`` serves the whole file (an initdb is the costly part): the first
test finds it empty, the later ones drop its database to begin from nothing again."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import confluent_kafka as ck
import psycopg
import pytest

from app.server.process import ServeProcess, free_port
from app.storage.embedded import DATABASE, SUPERUSER, EmbeddedPostgres
from app.storage.migrate import current_revisions, head_revisions
from app.storage.urls import libpq_conninfo
from tests.conftest import admin_conninfo, with_database
from tests.helpers.cli_runner import KIP98_BIN, run_kip98
from tests.helpers.cluster_nodes import wait_until

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def fresh_home() -> Iterator[Path]:
    """A KIP98_HOME with nothing in it yet; its server stopped and the home removed after."""
    path = Path(tempfile.mkdtemp(prefix="kip98-fresh-", dir="/var/tmp"))
    path.chmod(0o755)
    try:
        yield path
    finally:
        EmbeddedPostgres(path).stop()
        shutil.rmtree(path, ignore_errors=True)


def _embedded_env(home: Path) -> dict[str, str]:
    """This process's environment with the embedded database of ``home`` and no other."""
    env = {k: v for k, v in os.environ.items() if k != "KIP98_DATABASE_URL"}
    env.update(KIP98_HOME=str(home), KIP98_EMBEDDED_DURABILITY="off", PYTHONPATH=str(ROOT))
    return env


def _without_database(home: Path) -> None:
    """The home's kip98 database gone, its server stopped (as after its initdb)."""
    server = EmbeddedPostgres(home)
    status = server.start()
    with psycopg.connect(
        host="127.0.0.1", port=status.port, user=SUPERUSER, dbname="postgres", autocommit=True
    ) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{DATABASE}" WITH (FORCE)')
    server.stop()


def _produced(bootstrap: str) -> None:
    producer = ck.Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    reports: list[ck.KafkaError | None] = []
    producer.produce("t", value=b"v", on_delivery=lambda err, msg: reports.append(err))
    assert producer.flush(60) == 0
    assert reports == [None]


def test_serve_on_a_fresh_home_starts_and_answers_a_producer(
    fresh_home: Path, tmp_path: Path
) -> None:
    assert not (fresh_home / "pgdata").exists()
    port = free_port()
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "app.server", "--listen", f"127.0.0.1:{port}"],
            env=_embedded_env(fresh_home), stdout=out, stderr=out,
        )  # fmt: skip
    try:
        wait_until(lambda: _listening(proc, port), "kip98 serve never listened", timeout=180)
        _produced(f"127.0.0.1:{port}")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
    assert "Traceback" not in log.read_text()


def _listening(proc: subprocess.Popen[bytes], port: int) -> bool:
    assert proc.poll() is None, "kip98 serve exited"
    try:
        socket.create_connection(("127.0.0.1", port), 0.2).close()
    except OSError:
        return False
    return True


CHILD = """
from app.client import Consumer, Producer
producer = Producer({})
producer.produce("t", b"v")
assert producer.flush(60) == 0
consumer = Consumer({"group.id": "g", "auto.offset.reset": "earliest"})
consumer.subscribe(["t"])
msgs = []
for _ in range(60):
    msgs += [m for m in consumer.consume(1, timeout=1) if m.error() is None]
    if msgs:
        break
print(len(msgs), msgs[0].value().decode())
consumer.close()
"""


def test_the_native_clients_and_the_cli_migrate_a_fresh_database(fresh_home: Path) -> None:
    _without_database(fresh_home)
    env = _embedded_env(fresh_home)
    result = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=180
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["1", "v"]

    _without_database(fresh_home)
    created = run_kip98("topics", "create", "fresh", env=env)
    assert created.returncode == 0, created.stderr


@pytest.fixture
def unmigrated(server_url: str) -> Iterator[str]:
    """An empty database on the suite's server: no kip98 schema."""
    name = f"kip98_unmigrated_{uuid.uuid4().hex[:10]}"
    with psycopg.connect(admin_conninfo(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    try:
        yield with_database(server_url, name)
    finally:
        with psycopg.connect(admin_conninfo(server_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def test_serve_refuses_an_unmigrated_database_of_ones_own_unless_auto_migrate(
    unmigrated: str,
) -> None:
    env = {**os.environ, "KIP98_DATABASE_URL": unmigrated}
    refused = subprocess.run(
        [sys.executable, "-m", "app.server", "--listen", f"127.0.0.1:{free_port()}"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), refused.stderr
    assert "has no kip98 schema" in lines[0] and "run kip98 db migrate" in lines[0]
    assert current_revisions(unmigrated) == frozenset()  # nothing written

    with ServeProcess(unmigrated, env={"KIP98_AUTO_MIGRATE": "1"}) as serve:
        _produced(serve.address)
    assert current_revisions(unmigrated) == head_revisions()


def test_migrations_run_at_once_all_succeed(unmigrated: str) -> None:
    env = {**os.environ, "KIP98_DATABASE_URL": unmigrated}
    procs = [
        subprocess.Popen(
            [str(KIP98_BIN), "db", "migrate"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    results = [(p.wait(180), *p.communicate()) for p in procs]
    for code, _out, err in results:
        assert code == 0, err
    assert current_revisions(unmigrated) == head_revisions()


def test_a_schema_newer_than_this_kip98_is_refused_even_with_auto_migrate(
    unmigrated: str,
) -> None:
    with psycopg.connect(libpq_conninfo(unmigrated), autocommit=True) as conn:
        conn.execute("CREATE TABLE alembic_version (version_num varchar(32) PRIMARY KEY)")
        conn.execute("INSERT INTO alembic_version VALUES ('9999')")
    env = {**os.environ, "KIP98_DATABASE_URL": unmigrated, "KIP98_AUTO_MIGRATE": "1"}
    refused = subprocess.run(
        [sys.executable, "-m", "app.server", "--listen", f"127.0.0.1:{free_port()}"],
        env=env, capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode == 1
    lines = refused.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), refused.stderr
    assert "revision 9999, which this kip98 does not know" in lines[0]
    assert current_revisions(unmigrated) == frozenset({"9999"})
