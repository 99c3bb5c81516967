"""Fixtures: one real PostgreSQL per session, a fresh migrated database per test.

Each test gets ``CREATE DATABASE … TEMPLATE`` of a database migrated once per session,
which is far cheaper than running the migrations again. ``KIP98_DATABASE_URL`` points the
suite at an existing server instead of the embedded one.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psycopg
import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from app.storage import urls
from app.storage.context import BrokerContext
from app.storage.driver import libpq_conninfo
from app.storage.embedded import EmbeddedPostgres
from app.storage.engine import dispose_engines
from app.storage.migrate import upgrade_to_head
from app.storage.one_query import QueryCopies
from app.storage.replica_set import EmbeddedReplicaSet

# Apache Kafka 4.4 beside kip98 serve, one Kafka for the whole session: the conformance
# suite's fixtures, here so tests/conformance and tests/java share them.
from tests.conformance.fixtures import kafka, kafka_target, kip98_target, targets  # noqa: F401

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

    from app.broker import Broker
    from app.clock import Clock, ManualClock
    from tests.helpers.replication import ReplicatedDatabase

# Groups form at once in tests (Kafka's own test brokers set it to 0 too); the tests of
# group.initial.rebalance.delay.ms set it themselves. Subprocesses inherit it.
os.environ.setdefault("KIP98_GROUP_INITIAL_REBALANCE_DELAY_MS", "0")
os.environ.setdefault("KIP98_GROUP_MIN_SESSION_TIMEOUT_MS", "1000")  # tests' short sessions


def admin_conninfo(url: str) -> str:
    """The server's maintenance database, for creating and dropping test databases."""
    return libpq_conninfo(url, dbname="postgres")


def with_database(url: str, name: str) -> str:
    return make_url(url).set(database=name).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def server_url() -> str:
    explicit = os.environ.get("KIP98_DATABASE_URL")
    if explicit:
        return explicit
    status = EmbeddedPostgres().start()
    assert status.url is not None
    return status.url


@pytest.fixture(scope="session")
def template_db(server_url: str) -> Iterator[str]:
    name = f"kip98_tmpl_{os.getpid()}"
    with psycopg.connect(admin_conninfo(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        conn.execute(f'CREATE DATABASE "{name}"')
    upgrade_to_head(with_database(server_url, name))
    yield name
    dispose_engines()
    with psycopg.connect(admin_conninfo(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def db_url(server_url: str, template_db: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A fresh, migrated, empty database; also exported as KIP98_DATABASE_URL for subprocesses."""
    name = f"kip98_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(admin_conninfo(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template_db}"')
    url = with_database(server_url, name)
    monkeypatch.setenv("KIP98_DATABASE_URL", url)
    yield url
    dispose_engines()
    with psycopg.connect(admin_conninfo(server_url), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def elsewhere(db_url: str) -> Iterator[BrokerContext]:
    """A broker with an engine of its own: another process, as far as what a process
    remembers of its rows goes (docs/design.md rules 32, 33, 53)."""
    engine = create_engine(db_url)
    yield BrokerContext(engine=engine)
    engine.dispose()


@pytest.fixture
def server(db_url: str) -> Iterator[str]:
    """A ``kip98 serve`` process over the test's database; its bootstrap.servers."""
    from tests.helpers.wire_client import serving

    with serving(db_url) as address:
        yield address


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    """One local SparkSession for the whole run: starting a JVM costs seconds."""
    from app.spark.session import build_spark_session

    session = build_spark_session(app_name="kip98-tests")
    yield session
    session.stop()


@pytest.fixture
def clients() -> Iterator[list[Any]]:
    """Clients a test made, closed at its end whatever happened (closing a transactional
    producer also releases the process's coordinator loop)."""
    made: list[Any] = []
    yield made
    for client in reversed(made):
        try:
            client.close()
        except Exception:
            pass


@pytest.fixture
def copies_written(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many COPY statements each write of rows took (``QueryCopies.write``)."""
    seen: list[int] = []
    write = QueryCopies.write

    def counted(self: QueryCopies, payloads: Sequence[bytes]) -> None:
        seen.append(len(payloads))
        write(self, payloads)

    monkeypatch.setattr(QueryCopies, "write", counted)
    return seen


@pytest.fixture(scope="session")
def replicated() -> Iterator[tuple[EmbeddedReplicaSet, str]]:
    """A primary and two hot standbys under a private KIP98_HOME for the whole session,
    with a migrated template database; stopped and deleted at the end."""
    from tests.helpers.replication import STANDBYS, admin, wait_streaming

    home = Path(tempfile.mkdtemp(prefix="kip98-replicated-", dir="/var/tmp"))
    home.chmod(0o755)
    cluster = EmbeddedReplicaSet(home)
    try:
        cluster.start(standbys=STANDBYS)
        wait_streaming(cluster, STANDBYS)
        template = f"kip98_tmpl_{os.getpid()}"
        port = cluster.primary().status().port
        assert port is not None
        with admin(port) as conn:
            conn.execute(f'CREATE DATABASE "{template}"')
        upgrade_to_head(with_database(urls.parse(cluster.url()).sqlalchemy(), template))
        dispose_engines()
        yield cluster, template
    finally:
        dispose_engines()
        cluster.stop()
        for name in cluster.layout().nodes:
            node = cluster.node(name)
            shutil.rmtree(node.data_dir.resolve(), ignore_errors=True)
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def replica_db(
    replicated: tuple[EmbeddedReplicaSet, str], monkeypatch: pytest.MonkeyPatch
) -> Iterator[ReplicatedDatabase]:
    """A fresh migrated database on the replicated nodes, every node back in its place
    first; its URL (every node, reaching the primary) exported as KIP98_DATABASE_URL."""
    from tests.helpers.replication import ReplicatedDatabase, admin, restore

    cluster, template = replicated
    restore(cluster)
    name = f"kip98_test_{uuid.uuid4().hex[:12]}"
    port = cluster.primary().status().port
    assert port is not None
    with admin(port) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
    database = ReplicatedDatabase(cluster, name)
    monkeypatch.setenv("KIP98_DATABASE_URL", database.url)
    yield database
    dispose_engines()
    restore(cluster)
    port = cluster.primary().status().port
    assert port is not None
    with admin(port) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


TopicSpec = int | tuple[int, dict[str, Any]]
"""A topic as ``make_broker`` takes it: its partition count, or (partitions, config)."""


@pytest.fixture
def clock() -> ManualClock:
    """The test's own clock, which it moves by hand (``advance``); the ``broker`` of
    ``@pytest.mark.broker(manual_clock=True)`` reads this one."""
    from app.clock import ManualClock

    return ManualClock()


@pytest.fixture
def make_broker(db_url: str) -> Callable[..., Broker]:
    """Brokers over the test's database, shaped as the test needs:
    ``make_broker(topics={"t": 3, "c": (1, {"cleanup.policy": "compact"})}, clock=clock,
    transaction_log_partitions=1)``. Settings are the environment's
    (``BrokerSettings.from_env()``, as ``Broker.connect`` reads them), or ``settings=``
    (settings, or a function of the environment's, such as ``backends.idle_unbounded``),
    with any keyword overrides on top."""
    from app.broker import Broker
    from app.log.topics import create_topic
    from app.settings import BrokerSettings

    def make(
        topics: Mapping[str, TopicSpec] | None = None,
        *,
        clock: Clock | None = None,
        settings: BrokerSettings | Callable[[BrokerSettings], BrokerSettings] | None = None,
        **overrides: Any,
    ) -> Broker:
        if callable(settings):
            settings = settings(BrokerSettings.from_env())
        if overrides:
            settings = replace(settings or BrokerSettings.from_env(), **overrides)
        broker = Broker.connect(db_url, clock=clock, settings=settings)
        for name, spec in (topics or {}).items():
            partitions, config = spec if isinstance(spec, tuple) else (spec, None)
            create_topic(broker, name, partitions, config)
        return broker

    return make


@pytest.fixture
def broker(request: pytest.FixtureRequest, make_broker: Callable[..., Broker]) -> Broker:
    """A broker over the test's database: no topic, the system clock, the environment's
    settings, unless the test or its module (``pytestmark``) says otherwise with
    ``@pytest.mark.broker(topics={"t": 3}, manual_clock=True, **settings)``, which takes
    ``make_broker``'s arguments; ``manual_clock=True`` gives it the ``clock`` fixture."""
    marker = request.node.get_closest_marker("broker")
    kwargs = dict(marker.kwargs) if marker is not None else {}
    if kwargs.pop("manual_clock", False):
        kwargs["clock"] = request.getfixturevalue("clock")
    return make_broker(*(marker.args if marker is not None else ()), **kwargs)
