"""CreateTopics, DeleteTopics, ListTopics, CreatePartitions, DeleteRecords: each topic
(or partition) in its own DB transaction. A deleted topic takes the groups' offsets of it
along, in the same DB transaction, as Kafka's group coordinator drops the offsets of
deleted partitions; a topic that grows rebalances the native groups subscribed to it in
the DB transaction that adds its partitions."""

from __future__ import annotations

from app.cleaner.cleaner import delete_records as delete_partition_records
from app.cluster.registrations import partitions_added
from app.errors import KafkaError, KafkaException
from app.groups.membership import topic_grew
from app.groups.offsets import delete_topic_offsets
from app.log.topics import create_partitions_in, create_topic, delete_topic_in
from app.log.topics import list_topics as topics_of
from app.protocol import (
    CreatableTopicResult,
    CreatePartitionsRequest,
    CreatePartitionsResponse,
    CreatePartitionsResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeletableTopicResult,
    DeletedRecords,
    DeleteRecordsRequest,
    DeleteRecordsResponse,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    ListTopicsRequest,
    ListTopicsResponse,
)
from app.storage.context import BrokerContext
from app.storage.engine import retry_conflicts


def create_topics(broker: BrokerContext, req: CreateTopicsRequest) -> CreateTopicsResponse:
    results = []
    for t in req.topics:
        try:
            info = create_topic(broker, t.name, t.num_partitions, t.configs, req.validate_only)
        except KafkaException as exc:
            results.append(CreatableTopicResult(t.name, exc.error.code(), exc.error.str()))
        else:
            results.append(
                CreatableTopicResult(t.name, KafkaError.NO_ERROR, None, info.num_partitions)
            )
    return CreateTopicsResponse(results)


def delete_topics(broker: BrokerContext, req: DeleteTopicsRequest) -> DeleteTopicsResponse:
    results = []
    for name in req.topic_names:
        try:
            with broker.engine.begin() as conn:
                delete_topic_in(conn, broker, name)
                delete_topic_offsets(conn, name, broker.clock.now_ms())
        except KafkaException as exc:
            results.append(DeletableTopicResult(name, exc.error.code(), exc.error.str()))
        else:
            results.append(DeletableTopicResult(name, KafkaError.NO_ERROR))
    return DeleteTopicsResponse(results)


def list_topics(broker: BrokerContext, req: ListTopicsRequest) -> ListTopicsResponse:
    return ListTopicsResponse(topics_of(broker))


def create_partitions(
    broker: BrokerContext, req: CreatePartitionsRequest
) -> CreatePartitionsResponse:
    results = []
    for t in req.topics:
        try:
            _grow(broker, t.name, t.count, req.validate_only)
        except KafkaException as exc:
            results.append(CreatePartitionsResult(t.name, exc.error.code(), exc.error.str()))
        else:
            results.append(CreatePartitionsResult(t.name, KafkaError.NO_ERROR))
    return CreatePartitionsResponse(results)


@retry_conflicts
def _grow(broker: BrokerContext, name: str, count: int, validate_only: bool) -> None:
    with broker.engine.begin() as conn:
        had = create_partitions_in(conn, broker, name, count, validate_only)
        if not validate_only:
            partitions_added(conn, name, had, count)
            topic_grew(conn, name, broker.clock.now_ms())


def delete_records(broker: BrokerContext, req: DeleteRecordsRequest) -> DeleteRecordsResponse:
    results = []
    for topic, partition, offset in req.partitions:
        try:
            low = delete_partition_records(broker, topic, partition, offset)
        except KafkaException as exc:
            results.append(
                DeletedRecords(topic, partition, exc.error.code(), error_message=exc.error.str())
            )
        else:
            results.append(DeletedRecords(topic, partition, KafkaError.NO_ERROR, low))
    return DeleteRecordsResponse(results)
