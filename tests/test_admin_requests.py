"""The admin RPCs through ``Broker.handle``: every item answered with its own error code,
in request order; a refused item writes nothing, and the others go through."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest
from sqlalchemy import text

from app.broker import Broker
from app.clock import ManualClock
from app.errors import KafkaError
from app.protocol import (
    OP_APPEND,
    OP_DELETE,
    OP_SET,
    OP_SUBTRACT,
    RESOURCE_TOPIC,
    AbortTransactionRequest,
    AclBinding,
    AclBindingFilter,
    AlterableConfig,
    AlterConfigsRequest,
    AlterConfigsResource,
    CreatableTopic,
    CreateAclsRequest,
    CreateTopicsRequest,
    DeleteAclsRequest,
    DeleteTopicsRequest,
    DescribeAclsRequest,
    DescribeConfigsRequest,
    DescribeConfigsResource,
    DescribeProducersRequest,
    DescribeTransactionsRequest,
    IncrementalAlterConfigsRequest,
    IncrementalAlterConfigsResource,
    ListTopicsRequest,
    ListTransactionsRequest,
)
from app.settings import BrokerSettings
from tests.helpers.txn_driver import TxnDriver

OK = KafkaError.NO_ERROR


pytestmark = pytest.mark.broker(topics={"t": 2}, manual_clock=True)


def _topics(broker: Broker) -> dict[str, Any]:
    return {i.topic: i for i in broker.handle(ListTopicsRequest()).topics}


def _overrides(broker: Broker, topic: str = "t") -> dict[str, Any]:
    config: dict[str, Any] = _topics(broker)[topic].config
    return config


def _row_counts(broker: Broker) -> tuple[int, int, int]:
    with broker.engine.connect() as conn:
        return tuple(  # type: ignore[return-value]
            conn.execute(text(f"SELECT count(*) FROM {t}")).scalar_one()
            for t in ("topics", "partitions", "acls")
        )


# ---------------------------------------------------------------- topics


def test_create_topics_answers_each_topic_and_creates_only_the_good_ones(broker: Broker) -> None:
    answer = broker.handle(
        CreateTopicsRequest(
            [
                CreatableTopic("u", 3, {"cleanup.policy": "compact"}),
                CreatableTopic("t", 1),
                CreatableTopic("bad name", 1),
                CreatableTopic("v", 0),
                CreatableTopic("w", 1, {"retention.ms": "soon"}),
                CreatableTopic("x", 1, {"no.such.config": "1"}),
            ]
        )
    )
    assert [(r.name, r.error_code) for r in answer.topics] == [
        ("u", OK),
        ("t", KafkaError.TOPIC_ALREADY_EXISTS),
        ("bad name", KafkaError.INVALID_TOPIC_EXCEPTION),
        ("v", KafkaError.INVALID_PARTITIONS),
        ("w", KafkaError.INVALID_CONFIG),
        ("x", KafkaError.INVALID_CONFIG),
    ]
    assert answer.topics[0].num_partitions == 3
    assert all(r.error_message for r in answer.topics[1:])
    topics = _topics(broker)
    assert sorted(topics) == ["t", "u"]
    assert topics["t"].num_partitions == 2  # the existing topic is untouched
    assert topics["u"].config == {"cleanup.policy": "compact"}


def test_colliding_names_are_refused_even_when_created_at_once(broker: Broker) -> None:
    """Names that differ only in '.' against '_' collide (Kafka's rule): of two created at
    the same moment, exactly one is created, the other INVALID_TOPIC_EXCEPTION."""
    from concurrent.futures import ThreadPoolExecutor

    def create(name: str) -> int:
        return broker.handle(CreateTopicsRequest([CreatableTopic(name, 1)])).topics[0].error_code

    with ThreadPoolExecutor(2) as pool:
        for i in range(5):
            codes = sorted(pool.map(create, [f"c{i}.a", f"c{i}_a"]))
            assert codes == sorted([OK, KafkaError.INVALID_TOPIC_EXCEPTION]), i
    names = sorted(_topics(broker))
    assert [n.replace(".", "_") for n in names if n.startswith("c")] == [
        f"c{i}_a" for i in range(5)
    ]
    answer = broker.handle(CreateTopicsRequest([CreatableTopic("c0.a"), CreatableTopic("c0_a")]))
    assert {r.error_code for r in answer.topics} == {
        KafkaError.TOPIC_ALREADY_EXISTS,
        KafkaError.INVALID_TOPIC_EXCEPTION,
    }


def test_create_topics_validate_only_checks_everything_and_writes_nothing(broker: Broker) -> None:
    before = _row_counts(broker)
    answer = broker.handle(
        CreateTopicsRequest(
            [CreatableTopic("u", 3), CreatableTopic("t", 1), CreatableTopic("v", -5)],
            validate_only=True,
        )
    )
    assert [r.error_code for r in answer.topics] == [
        OK,
        KafkaError.TOPIC_ALREADY_EXISTS,
        KafkaError.INVALID_PARTITIONS,
    ]
    assert _row_counts(broker) == before


def test_delete_topics_answers_each_topic(broker: Broker) -> None:
    answer = broker.handle(DeleteTopicsRequest(["missing", "t"]))
    assert [(r.name, r.error_code) for r in answer.responses] == [
        ("missing", KafkaError.UNKNOWN_TOPIC_OR_PARTITION),
        ("t", OK),
    ]
    assert _topics(broker) == {}


def test_admin_topic_requests_respect_acls(db_url: str, broker: Broker) -> None:
    alice = replace(broker, settings=BrokerSettings(authorization=1), principal="User:alice")
    before = _row_counts(broker)
    created = alice.handle(CreateTopicsRequest([CreatableTopic("u", 1)])).topics
    assert [r.error_code for r in created] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    deleted = alice.handle(DeleteTopicsRequest(["t"])).responses
    assert [r.error_code for r in deleted] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    resource = IncrementalAlterConfigsResource(
        RESOURCE_TOPIC, "t", [AlterableConfig("retention.ms", OP_SET, "1")]
    )
    altered = alice.handle(IncrementalAlterConfigsRequest([resource])).responses
    assert [r.error_code for r in altered] == [KafkaError.TOPIC_AUTHORIZATION_FAILED]
    acls = alice.handle(CreateAclsRequest([AclBinding("User:alice", "topic", "t", "all")]))
    assert [r.error_code for r in acls.results] == [KafkaError.CLUSTER_AUTHORIZATION_FAILED]
    assert _row_counts(broker) == before and _overrides(broker) == {}


# ---------------------------------------------------------------- configs


def test_describe_configs_answers_each_resource(broker: Broker) -> None:
    broker.handle(
        AlterConfigsRequest([AlterConfigsResource(RESOURCE_TOPIC, "t", {"retention.ms": "5"})])
    )
    answer = broker.handle(
        DescribeConfigsRequest(
            [
                DescribeConfigsResource(RESOURCE_TOPIC, "t"),
                DescribeConfigsResource(RESOURCE_TOPIC, "missing"),
                DescribeConfigsResource(4, "zero"),  # a broker id that is no integer
                DescribeConfigsResource(RESOURCE_TOPIC, "t", ["retention.ms", "nope"]),
            ]
        )
    ).results
    assert [r.error_code for r in answer] == [
        OK,
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
        KafkaError.INVALID_REQUEST,
        OK,
    ]
    entries = {c.name: (c.value, c.config_source) for c in answer[0].configs}
    assert entries["retention.ms"] == ("5", 1)  # DYNAMIC_TOPIC_CONFIG
    assert entries["cleanup.policy"] == ("delete", 5)  # DEFAULT_CONFIG
    assert [(c.name, c.value) for c in answer[3].configs] == [("retention.ms", "5")]


def test_alter_configs_replaces_the_overrides_or_leaves_them(broker: Broker) -> None:
    def alter(configs: dict[str, Any], validate_only: bool = False) -> int:
        resource = AlterConfigsResource(RESOURCE_TOPIC, "t", configs)
        [r] = broker.handle(AlterConfigsRequest([resource], validate_only)).responses
        return r.error_code

    assert alter({"retention.ms": "5", "cleanup.policy": "compact"}) == OK
    assert alter({"retention.ms": "7"}) == OK
    assert _overrides(broker) == {"retention.ms": 7}  # replaced, not merged
    assert alter({"retention.ms": "8", "cleanup.policy": "shred"}) == KafkaError.INVALID_CONFIG
    assert alter({"retention.ms": "9", "unknown.key": None}) == KafkaError.INVALID_CONFIG
    assert alter({"retention.ms": "10"}, validate_only=True) == OK
    assert _overrides(broker) == {"retention.ms": 7}
    [missing] = broker.handle(
        AlterConfigsRequest([AlterConfigsResource(RESOURCE_TOPIC, "nope", {})])
    ).responses
    assert missing.error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION


def test_incremental_alter_configs_applies_each_operation_on_top(broker: Broker) -> None:
    def alter(*ops: tuple[str, int, Any], topic: str = "t") -> int:
        configs = [AlterableConfig(name, op, value) for name, op, value in ops]
        resource = IncrementalAlterConfigsResource(RESOURCE_TOPIC, topic, configs)
        [r] = broker.handle(IncrementalAlterConfigsRequest([resource])).responses
        return r.error_code

    assert alter(("retention.ms", OP_SET, "5"), ("retention.bytes", OP_SET, 100)) == OK
    assert (
        alter(("retention.bytes", OP_DELETE, None), ("cleanup.policy", OP_APPEND, "compact")) == OK
    )
    assert _overrides(broker) == {"retention.ms": 5, "cleanup.policy": "compact,delete"}
    assert alter(("cleanup.policy", OP_SUBTRACT, "delete")) == OK
    assert _overrides(broker) == {"retention.ms": 5, "cleanup.policy": "compact"}
    refused = [
        alter(("cleanup.policy", OP_SUBTRACT, "compact")),  # would leave no policy
        alter(("retention.ms", OP_APPEND, "1")),  # not a list
        alter(("retention.ms", OP_SET, "6"), ("retention.ms", OP_DELETE, None)),  # twice
        alter(("retention.ms", 7, "6")),  # no such operation
        alter(("retention.ms", OP_SET, None)),  # no value
        alter(("retention.ms", OP_SET, "6"), ("cleanup.policy", OP_SET, "shred")),
        alter(("retention.ms", OP_SET, "6"), topic="missing"),
    ]
    assert refused == [
        KafkaError.INVALID_CONFIG,
        KafkaError.INVALID_CONFIG,
        KafkaError.INVALID_REQUEST,
        KafkaError.INVALID_REQUEST,
        KafkaError.INVALID_REQUEST,
        KafkaError.INVALID_CONFIG,
        KafkaError.UNKNOWN_TOPIC_OR_PARTITION,
    ]
    assert _overrides(broker) == {"retention.ms": 5, "cleanup.policy": "compact"}


def test_one_refused_resource_leaves_the_others_altered(broker: Broker) -> None:
    broker.handle(CreateTopicsRequest([CreatableTopic("u", 1)]))
    resources = [
        IncrementalAlterConfigsResource(
            RESOURCE_TOPIC, name, [AlterableConfig("retention.ms", OP_SET, value)]
        )
        for name, value in (("t", "bad"), ("u", "5"))
    ]
    answer = broker.handle(IncrementalAlterConfigsRequest(resources)).responses
    assert [(r.resource_name, r.error_code) for r in answer] == [
        ("t", KafkaError.INVALID_CONFIG),
        ("u", OK),
    ]
    assert _overrides(broker, "t") == {} and _overrides(broker, "u") == {"retention.ms": 5}


# ---------------------------------------------------------------- ACLs


def test_create_acls_stores_all_or_none(broker: Broker) -> None:
    good = AclBinding("User:alice", "topic", "t", "read")
    bad = AclBinding("User:alice", "topic", "t", "idempotent_write")
    refused = broker.handle(CreateAclsRequest([good, bad])).results
    assert [r.error_code for r in refused] == [KafkaError.INVALID_REQUEST] * 2
    assert broker.handle(DescribeAclsRequest(AclBindingFilter())).acls == []
    created = broker.handle(CreateAclsRequest([good])).results
    assert [r.error_code for r in created] == [OK]
    assert broker.handle(DescribeAclsRequest(AclBindingFilter())).acls == [good]


def test_describe_and_delete_acls_answer_each_filter(broker: Broker) -> None:
    acls = [
        AclBinding("User:alice", "topic", "t", "read"),
        AclBinding("User:bob", "group", "g", "read"),
    ]
    broker.handle(CreateAclsRequest(acls))
    refused = broker.handle(DescribeAclsRequest(AclBindingFilter(operation="fly")))
    assert refused.error_code == KafkaError.INVALID_REQUEST and refused.acls == []
    answer = broker.handle(
        DeleteAclsRequest(
            [AclBindingFilter(operation="fly"), AclBindingFilter(principal="User:alice")]
        )
    ).filter_results
    assert [r.error_code for r in answer] == [KafkaError.INVALID_REQUEST, OK]
    assert answer[1].matching_acls == acls[:1]
    assert broker.handle(DescribeAclsRequest(AclBindingFilter())).acls == acls[1:]


# ---------------------------------------------------------------- transactions


def test_list_transactions_filters(broker: Broker) -> None:
    open_ = TxnDriver(broker, "open")
    open_.init()
    open_.send("t", 0, "v")
    idle = TxnDriver(broker, "idle")
    idle.init()
    assert isinstance(broker.clock, ManualClock)
    broker.clock.advance(10_000)

    def listed(**filters: Any) -> list[str]:
        answer = broker.handle(ListTransactionsRequest(**filters))
        assert answer.error_code == OK
        return [t.transactional_id for t in answer.transaction_states]

    assert listed() == ["idle", "open"]
    assert listed(state_filters=["BEGIN"]) == ["open"]
    assert listed(state_filters=[]) == []
    assert listed(producer_id_filters=[idle.producer_id]) == ["idle"]
    assert listed(duration_filter_ms=5_000) == ["open"]  # open, for 10 s
    assert listed(duration_filter_ms=20_000) == []
    unknown = broker.handle(ListTransactionsRequest(["BEGIN", "Ongoing"]))
    assert unknown.unknown_state_filters == ["Ongoing"]


def test_describe_transactions_and_producers_answer_each_item(broker: Broker) -> None:
    d = TxnDriver(broker, "x")
    d.init()
    d.send("t", 1, "v")
    states = broker.handle(DescribeTransactionsRequest(["nope", "x"])).transaction_states
    assert [(s.transactional_id, s.error_code) for s in states] == [
        ("nope", KafkaError.TRANSACTIONAL_ID_NOT_FOUND),
        ("x", OK),
    ]
    assert states[1].description is not None
    assert states[1].description.partitions == (("t", 1),)
    producers = broker.handle(DescribeProducersRequest([("t", 1), ("t", 9), ("t", 0)]))
    assert [(p.partition, p.error_code) for p in producers.partitions] == [
        (1, OK),
        (9, KafkaError.UNKNOWN_TOPIC_OR_PARTITION),
        (0, OK),
    ]
    [producer] = producers.partitions[0].active_producers
    assert producer.producer_id == d.producer_id
    assert producer.current_transaction_start_offset == 0
    assert producers.partitions[2].active_producers == []


def test_abort_transaction_of_no_open_transaction_is_refused(broker: Broker) -> None:
    answer = broker.handle(AbortTransactionRequest("t", 0, 0))
    assert answer.error_code == KafkaError.INVALID_TXN_STATE and not answer.written
