"""KIP-430's authorized operations, as Kafka's broker works them out: each operation the
resource type supports, checked against the ACLs for the request's principal (every one
without an authorizer); given in Metadata, DescribeCluster and DescribeGroups only when
the client asks. Against a real ``kip98 serve`` and the database's ACLs."""

from __future__ import annotations

import confluent_kafka as ck
from confluent_kafka import TopicCollection
from confluent_kafka.admin import AclOperation, AdminClient
from kio.schema.describe_groups.v5.request import DescribeGroupsRequest as DescribeGroupsV5
from kio.schema.metadata.v10.request import MetadataRequest as MetadataV10
from kio.schema.metadata.v10.request import MetadataRequestTopic

from app.broker import Broker
from app.log.topics import create_topic
from app.protocol import CLUSTER, CLUSTER_NAME, GROUP, TOPIC, AuthorizedOperationsRequest
from app.security import acls
from app.security.operations import bit_field
from app.security.rules import AclBinding
from app.settings import BrokerSettings
from tests.helpers.wire_client import exchange, serving

NOT_GIVEN = -(2**31)
TOPIC_OPS = {AclOperation.READ, AclOperation.WRITE, AclOperation.CREATE, AclOperation.DESCRIBE,
             AclOperation.DELETE, AclOperation.ALTER, AclOperation.DESCRIBE_CONFIGS,
             AclOperation.ALTER_CONFIGS}  # fmt: skip
CLUSTER_OPS = {AclOperation.CREATE, AclOperation.CLUSTER_ACTION, AclOperation.DESCRIBE_CONFIGS,
               AclOperation.ALTER_CONFIGS, AclOperation.IDEMPOTENT_WRITE, AclOperation.ALTER,
               AclOperation.DESCRIBE}  # fmt: skip


def _field(ops: set[AclOperation]) -> int:
    return sum(1 << op.value for op in ops)


def test_without_an_authorizer_every_supported_operation_is_given_when_asked(
    db_url: str,
) -> None:
    broker = Broker.connect(db_url)
    create_topic(broker, "t", 1)
    with serving(db_url) as server:
        admin = AdminClient({"bootstrap.servers": server})
        cluster = admin.describe_cluster(include_authorized_operations=True).result(30)
        assert set(cluster.authorized_operations) == CLUSTER_OPS
        assert admin.describe_cluster().result(30).authorized_operations is None
        topics = admin.describe_topics(TopicCollection(["t"]), include_authorized_operations=True)
        assert set(topics["t"].result(30).authorized_operations) == TOPIC_OPS

        # Raw: Metadata v10 gives each only when asked, else Kafka's "not given".
        for asked in (True, False):
            answer = exchange(server, 3, 10, MetadataV10(
                topics=(MetadataRequestTopic(topic_id=None, name="t"),),
                allow_auto_topic_creation=False,
                include_cluster_authorized_operations=asked,
                include_topic_authorized_operations=asked,
            ))  # fmt: skip
            want_topic = _field(TOPIC_OPS) if asked else NOT_GIVEN
            want_cluster = _field(CLUSTER_OPS) if asked else NOT_GIVEN
            assert answer.topics[0].topic_authorized_operations == want_topic
            assert answer.cluster_authorized_operations == want_cluster

        consumer = ck.Consumer({"bootstrap.servers": server, "group.id": "g",
                                "session.timeout.ms": 6000})  # fmt: skip
        try:
            consumer.subscribe(["t"])
            while not consumer.assignment():
                consumer.poll(0.2)
            described = exchange(server, 15, 5, DescribeGroupsV5(
                groups=("g",), include_authorized_operations=True))  # fmt: skip
            group_ops = {"read", "describe", "delete", "describe_configs", "alter_configs"}
            assert described.groups[0].authorized_operations == bit_field(group_ops)
        finally:
            consumer.close()


def test_with_an_authorizer_the_principals_acls_decide(db_url: str) -> None:
    settings = BrokerSettings(authorization=1)
    admin = Broker.connect(db_url, settings=settings, principal="User:admin")
    alice = Broker.connect(db_url, settings=settings, principal="User:alice")
    create_topic(admin, "t", 1)
    acls.create_acls(admin, [
        AclBinding("User:alice", TOPIC, "t", "read"),
        AclBinding("User:alice", TOPIC, "t", "write"),
        AclBinding("User:alice", TOPIC, "t", "delete", "deny"),
        AclBinding("User:alice", GROUP, "g", "all"),
        AclBinding("User:alice", CLUSTER, CLUSTER_NAME, "alter"),
    ])  # fmt: skip

    def ops(broker: Broker, resource_type: str, name: str) -> int:
        asked = AuthorizedOperationsRequest(resource_type, (name,))
        return broker.handle(asked).operations[name]

    # read and write, and describe, which either implies; never the denied delete.
    assert ops(alice, TOPIC, "t") == bit_field({"read", "write", "describe"})
    assert ops(alice, TOPIC, "u") == 0
    assert ops(alice, GROUP, "g") == bit_field(
        {"read", "describe", "delete", "describe_configs", "alter_configs"}
    )
    assert ops(alice, CLUSTER, CLUSTER_NAME) == bit_field({"alter", "describe"})
    # A super user may do everything.
    assert ops(admin, TOPIC, "t") == _field(TOPIC_OPS)
