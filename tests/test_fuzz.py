"""Bad input everywhere: random calls with random arguments at Producer, Consumer and
AdminClient must fail only with typed errors, and leave the log consistent.

Typed means what confluent-kafka users catch: KafkaException (preferred), BufferError for
a full queue, and TypeError/ValueError where confluent-kafka raises them for arguments of
the wrong Python type. Anything else escaping (AttributeError, a psycopg or SQLAlchemy
error, an assertion) is a bug. Afterwards the projections must equal the fold of the
event tables, and every partition's offsets must be gapless.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from functools import partial
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import text

from app.admin import AclBinding, AclBindingFilter, AdminClient, NewTopic
from app.broker import Broker
from app.client.consumer import Consumer
from app.client.message import TopicPartition
from app.client.producer import Producer
from app.config import SETTINGS
from app.errors import KafkaException
from app.log.expiry import expire_producer_states
from app.log.rebuild import compute_partition_log, live_rows, projection_rows

TYPED = (KafkaException, BufferError, TypeError, ValueError)
INJECTION = "'; DROP TABLE records; --"
TOPICS = ("t", "u")

FUZZ = settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)

# ---------------------------------------------------------------- strategies

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_infinity=False),
    st.text(max_size=12),
    st.binary(max_size=12),
    st.sampled_from([INJECTION, "", " ", "\x00", "a" * 300, "t\n", "*", "..", "é"]),
)
junk = st.one_of(
    scalars,
    st.lists(scalars, max_size=3),
    st.dictionaries(st.text(max_size=5), scalars, max_size=3),
    st.tuples(scalars, scalars),
)
topic_names = st.one_of(st.sampled_from([*TOPICS, INJECTION, "missing"]), junk)
partitions = st.one_of(st.integers(min_value=-3, max_value=3), junk)
offsets = st.one_of(st.integers(min_value=-1002, max_value=5), junk)
# Bounded: poll(None) or poll(-1) waits for ever, as in confluent-kafka.
short_timeouts = st.one_of(st.floats(min_value=0, max_value=0.02), st.just(0), st.text(max_size=3))
nonblocking_timeouts = st.one_of(st.floats(min_value=0, max_value=0.02), st.just(0))


@st.composite
def topic_partitions(draw: st.DrawFn) -> Any:
    """Mostly real TopicPartitions (some pointing nowhere), sometimes not one at all."""
    if draw(st.booleans()):
        return draw(junk)
    try:
        return TopicPartition(draw(topic_names), draw(partitions), draw(offsets))
    except TYPED:
        return TopicPartition(draw(st.sampled_from(TOPICS)), 0, draw(st.integers(-2, 3)))


tp_lists = st.one_of(st.lists(topic_partitions(), max_size=3), junk)
headers = st.one_of(
    st.none(),
    st.lists(st.tuples(st.text(max_size=4), st.one_of(st.binary(max_size=4), junk)), max_size=2),
    st.dictionaries(st.text(max_size=4), st.one_of(st.binary(max_size=4), junk), max_size=2),
    junk,
)
config_keys = st.one_of(st.sampled_from(sorted(SETTINGS)), st.text(max_size=12), scalars)
configs = st.dictionaries(config_keys, junk, max_size=3)

# ---------------------------------------------------------------- calls


def _call(fn: Callable[[], Any]) -> None:
    """Run one call; anything but a typed error fails the test with its traceback."""
    try:
        fn()
    except TYPED:
        pass


def _produce(p: Producer, d: st.DataObject) -> None:
    kwargs: dict[str, Any] = {}
    for name, strategy in (
        ("value", st.one_of(st.binary(max_size=8), junk)),
        ("key", st.one_of(st.binary(max_size=8), junk)),
        ("partition", partitions),
        ("timestamp", st.one_of(st.integers(-5, 2**40), junk)),
        ("headers", headers),
    ):
        if d.draw(st.booleans()):
            kwargs[name] = d.draw(strategy)
    _call(lambda: p.produce(d.draw(topic_names), **kwargs))


PRODUCER_CALLS: list[Callable[[Producer, st.DataObject], None]] = [
    _produce,
    _produce,
    lambda p, d: _call(lambda: p.poll(d.draw(short_timeouts))),  # type: ignore[arg-type]
    lambda p, d: _call(lambda: p.flush(d.draw(st.one_of(st.just(2.0), junk)))),
    lambda p, d: _call(lambda: len(p)),
    lambda p, d: _call(lambda: p.init_transactions(d.draw(st.one_of(st.just(5.0), junk)))),
    lambda p, d: _call(p.begin_transaction),
    lambda p, d: _call(lambda: p.commit_transaction(d.draw(st.one_of(st.just(5.0), junk)))),
    lambda p, d: _call(lambda: p.abort_transaction(d.draw(st.one_of(st.just(5.0), junk)))),
    lambda p, d: _call(lambda: p.send_offsets_to_transaction(d.draw(tp_lists), d.draw(junk), 1.0)),
]

CONSUMER_CALLS: list[Callable[[Consumer, st.DataObject], None]] = [
    lambda c, d: _call(lambda: c.subscribe(d.draw(st.one_of(st.lists(topic_names), junk)))),
    lambda c, d: _call(c.unsubscribe),
    lambda c, d: _call(lambda: c.assign(d.draw(tp_lists))),
    lambda c, d: _call(c.unassign),
    lambda c, d: _call(c.assignment),
    lambda c, d: _call(lambda: c.poll(d.draw(nonblocking_timeouts))),
    lambda c, d: _call(
        lambda: c.consume(d.draw(st.one_of(st.integers(-2, 5), junk)), d.draw(nonblocking_timeouts))
    ),
    lambda c, d: _call(
        lambda: c.commit(
            offsets=d.draw(st.one_of(st.none(), tp_lists)),
            asynchronous=d.draw(st.one_of(st.just(False), junk)),
        )
    ),
    lambda c, d: _call(lambda: c.commit(message=d.draw(junk), asynchronous=False)),
    lambda c, d: _call(
        lambda: c.committed(d.draw(tp_lists), d.draw(st.one_of(st.just(1.0), junk)))
    ),
    lambda c, d: _call(lambda: c.position(d.draw(tp_lists))),
    lambda c, d: _call(lambda: c.seek(d.draw(topic_partitions()))),
    lambda c, d: _call(
        lambda: c.get_watermark_offsets(
            d.draw(topic_partitions()), d.draw(st.one_of(st.just(1.0), junk)), d.draw(junk)
        )
    ),
    lambda c, d: _call(c.consumer_group_metadata),
]


def _new_topic(d: st.DataObject) -> Any:
    try:
        return NewTopic(d.draw(topic_names), d.draw(partitions), config=d.draw(junk))
    except TYPED:
        return d.draw(junk)


def _acl(d: st.DataObject) -> Any:
    fields = [
        d.draw(st.one_of(st.sampled_from(["User:x", "topic", "t", "read"]), junk)) for _ in range(6)
    ]
    return AclBinding(*fields) if d.draw(st.booleans()) else fields


ADMIN_CALLS: list[Callable[[AdminClient, st.DataObject], None]] = [
    lambda a, d: _call(lambda: [f.exception() for f in a.create_topics([_new_topic(d)]).values()]),
    lambda a, d: _call(
        lambda: [
            f.exception() for f in a.delete_topics(d.draw(st.lists(junk, max_size=2))).values()
        ]
    ),
    lambda a, d: _call(lambda: a.list_topics(d.draw(topic_names))),
    lambda a, d: _call(lambda: a.list_transactions(d.draw(junk))),
    lambda a, d: _call(lambda: a.describe_transactions(d.draw(st.one_of(st.lists(junk), junk)))),
    lambda a, d: _call(lambda: a.describe_producers(d.draw(tp_lists))),
    lambda a, d: _call(lambda: a.find_hanging_transactions(d.draw(junk))),
    lambda a, d: _call(
        lambda: a.abort_transaction(d.draw(topic_names), d.draw(partitions), d.draw(offsets))
    ),
    lambda a, d: _call(lambda: a.list_consumer_group_offsets(d.draw(topic_names))),
    lambda a, d: _call(lambda: [f.exception() for f in a.create_acls([_acl(d)]).values()]),
    lambda a, d: _call(
        lambda: a.describe_acls(AclBindingFilter(*d.draw(st.lists(junk, max_size=6)))).exception()
    ),
    lambda a, d: _call(
        lambda: a.delete_acls([AclBindingFilter(resource_name=d.draw(topic_names))])
    ),
]

# ---------------------------------------------------------------- fixtures and checks


pytestmark = pytest.mark.broker(topics=dict.fromkeys(TOPICS, 2))


@pytest.fixture(autouse=True)
def no_coordinator_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """Transactions left open are timed out by nobody in a test; no loop thread needed."""
    monkeypatch.setenv("KIP98_CLIENT_COORDINATOR_LOOP", "0")


def assert_log_consistent(broker: Broker) -> None:
    # Records may carry any timestamp, so some producer states are already past expiry;
    # the fold drops them at once, the live table when expiry runs. Run it first.
    now = broker.clock.now_ms()
    expire_producer_states(broker, now)
    with broker.engine.connect() as conn:
        computed = projection_rows(compute_partition_log(conn, now, broker.settings).values())
        assert computed == live_rows(conn)
        gaps = conn.execute(
            text(
                "SELECT p.topic, p.partition, p.next_offset - p.log_start_offset AS expected, "
                "(SELECT count(*) FROM records r WHERE r.topic = p.topic "
                "AND r.partition = p.partition) AS actual FROM partitions p"
            )
        ).all()
    assert [g for g in gaps if g.expected != g.actual] == []


@pytest.fixture
def producers(db_url: str, broker: Broker) -> Iterator[list[Producer]]:
    base = {"database.url": db_url, "linger.ms": 0, "message.timeout.ms": 5000}
    made = [Producer(base), Producer({**base, "transactional.id": "fuzz"})]
    yield made
    for p in made:
        _call(partial(p.close, 2))


def test_producer_calls(producers: list[Producer], broker: Broker) -> None:
    @FUZZ
    @given(st.data())
    def run(data: st.DataObject) -> None:
        for _ in range(data.draw(st.integers(1, 6))):
            producer = data.draw(st.sampled_from(producers))
            data.draw(st.sampled_from(PRODUCER_CALLS))(producer, data)

    run()
    for p in producers:
        _call(partial(p.flush, 5))
    assert_log_consistent(broker)


def test_consumer_calls(db_url: str, broker: Broker) -> None:
    with Producer({"database.url": db_url}) as p:
        for i in range(6):
            p.produce(TOPICS[i % 2], f"v{i}".encode(), partition=i % 2)
        assert p.flush(60) == 0
    consumers = [
        Consumer({"database.url": db_url, "group.id": "fuzz", "session.timeout.ms": 6000}),
        Consumer({"database.url": db_url, "group.id": "fuzz-2", "enable.auto.commit": False}),
    ]

    @FUZZ
    @given(st.data())
    def run(data: st.DataObject) -> None:
        for _ in range(data.draw(st.integers(1, 6))):
            consumer = data.draw(st.sampled_from(consumers))
            data.draw(st.sampled_from(CONSUMER_CALLS))(consumer, data)

    try:
        run()
    finally:
        for c in consumers:
            _call(c.close)
    assert_log_consistent(broker)


def test_admin_calls(db_url: str, broker: Broker) -> None:
    admin = AdminClient({"database.url": db_url})

    @FUZZ
    @given(st.data())
    def run(data: st.DataObject) -> None:
        for _ in range(data.draw(st.integers(1, 4))):
            data.draw(st.sampled_from(ADMIN_CALLS))(admin, data)

    try:
        run()
    finally:
        admin.close()
    assert_log_consistent(broker)


@FUZZ
@given(kind=st.sampled_from([Producer, Consumer, AdminClient]), config=st.one_of(configs, junk))
def test_malformed_configs_are_refused_with_kafka_exceptions(
    db_url: str, kind: type, config: Any
) -> None:
    if isinstance(config, dict):
        config = {"database.url": db_url, **config}
    try:
        client = kind(config)
    except KafkaException:
        return
    client.close()
