"""CreateTopics, DeleteTopics, ListTopics: each topic in its own DB transaction. A deleted
topic takes the groups' offsets of it along, in the same DB transaction, as Kafka's group
coordinator drops the offsets of deleted partitions."""

from __future__ import annotations

from app.errors import KafkaError, KafkaException
from app.groups.offsets import delete_topic_offsets
from app.log.topics import create_topic, delete_topic_in
from app.log.topics import list_topics as topics_of
from app.protocol import (
    CreatableTopicResult,
    CreateTopicsRequest,
    CreateTopicsResponse,
    DeletableTopicResult,
    DeleteTopicsRequest,
    DeleteTopicsResponse,
    ListTopicsRequest,
    ListTopicsResponse,
)
from app.storage.context import BrokerContext


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
