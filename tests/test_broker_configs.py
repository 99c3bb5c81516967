"""A broker's configs over the wire, as Kafka answers for the resource type BROKER: the
node's id describes the Kafka broker configs kip98 has a meaning for, from its settings
(with their source), each read-only; the empty name (cluster-wide dynamic defaults) has
none; another id is a bad request. Altering any is refused as Kafka refuses a config it
cannot update dynamically; deleting one passes. Against a real ``kip98 serve``."""

from __future__ import annotations

import confluent_kafka as ck
import pytest
from confluent_kafka.admin import (
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    ConfigSource,
)
from kio.schema.describe_configs.v4.request import (
    DescribeConfigsRequest,
    DescribeConfigsResource,
)

from tests.helpers.wire_client import exchange, serving


def test_broker_configs_are_described_and_read_only(db_url: str) -> None:
    with serving(db_url, env={"KIP98_NUM_PARTITIONS": "3"}) as server:
        admin = AdminClient({"bootstrap.servers": server})
        node = str(admin.describe_cluster().result(30).nodes[0].id)

        mine = ConfigResource("broker", node)
        entries = admin.describe_configs([mine])[mine].result(30)
        assert entries["num.partitions"].value == "3"
        assert entries["num.partitions"].source == ConfigSource.STATIC_BROKER_CONFIG.value
        timeout = entries["transaction.max.timeout.ms"]
        assert (timeout.value, timeout.source) == ("900000", ConfigSource.DEFAULT_CONFIG.value)
        assert entries["auto.create.topics.enable"].value == "true"
        assert all(e.is_read_only for e in entries.values())

        # The cluster-wide defaults (librdkafka sends no empty name: raw).
        asked = DescribeConfigsRequest(
            resources=(DescribeConfigsResource(resource_type=4, resource_name="",
                                               configuration_keys=None),),
            include_synonyms=False, include_documentation=False,
        )  # fmt: skip
        [described] = exchange(server, 32, 4, asked).results
        assert (described.error_code, described.configs) == (0, ())
        # Another node's id (which librdkafka would send to that node): a bad request.
        other = str(int(node) + 1)
        asked = DescribeConfigsRequest(
            resources=(DescribeConfigsResource(resource_type=4, resource_name=other,
                                               configuration_keys=None),),
            include_synonyms=False, include_documentation=False,
        )  # fmt: skip
        [described] = exchange(server, 32, 4, asked).results
        assert described.error_code == ck.KafkaError.INVALID_REQUEST
        assert described.error_message == (
            f"Unexpected broker id, expected {node} or empty string, but received {other}"
        )

        altered = ConfigResource("broker", node, incremental_configs=[
            ConfigEntry("sasl.kerberos.min.time.before.relogin", "58000",
                        incremental_operation=AlterConfigOpType.SET)])  # fmt: skip
        with pytest.raises(ck.KafkaException) as refused:
            admin.incremental_alter_configs([altered])[altered].result(30)
        error = refused.value.args[0]
        assert error.code() == ck.KafkaError.INVALID_REQUEST
        assert "Cannot update these configs dynamically" in error.str()
        deleted = ConfigResource("broker", node, incremental_configs=[
            ConfigEntry("num.partitions", None, incremental_operation=AlterConfigOpType.DELETE)
        ])  # fmt: skip
        admin.incremental_alter_configs([deleted])[deleted].result(30)
        legacy = ConfigResource("broker", node, set_config={"num.partitions": "5"})
        with pytest.raises(ck.KafkaException) as refused:
            admin.alter_configs([legacy])[legacy].result(30)
        assert refused.value.args[0].code() == ck.KafkaError.INVALID_REQUEST
