"""The client API, importable the way confluent-kafka's is: ``from app.client import ...``."""

from app.client.consumer import Consumer
from app.client.message import (
    OFFSET_BEGINNING,
    OFFSET_END,
    OFFSET_INVALID,
    OFFSET_STORED,
    TIMESTAMP_CREATE_TIME,
    TIMESTAMP_LOG_APPEND_TIME,
    TIMESTAMP_NOT_AVAILABLE,
    Message,
    TopicPartition,
)
from app.client.partitioner import KeylessPartitioner, murmur2, murmur2_partition
from app.client.producer import Producer
from app.client.transactions import ConsumerGroupMetadata
from app.errors import KafkaError, KafkaException

__all__ = [
    "OFFSET_BEGINNING",
    "OFFSET_END",
    "OFFSET_INVALID",
    "OFFSET_STORED",
    "TIMESTAMP_CREATE_TIME",
    "TIMESTAMP_LOG_APPEND_TIME",
    "TIMESTAMP_NOT_AVAILABLE",
    "Consumer",
    "ConsumerGroupMetadata",
    "KafkaError",
    "KafkaException",
    "KeylessPartitioner",
    "Message",
    "Producer",
    "TopicPartition",
    "murmur2",
    "murmur2_partition",
]
