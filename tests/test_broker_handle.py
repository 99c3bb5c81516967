"""The request boundary: ``Broker.handle`` answers every RPC of app.protocol through one
table, and a request of no RPC is refused as Kafka refuses an unknown API key."""

from __future__ import annotations

import inspect

import pytest

from app import protocol
from app.broker import Broker
from app.broker.apis import HANDLERS
from app.errors import KafkaError, KafkaException
from app.log.topics import create_topic
from app.protocol import (
    COORDINATOR_GROUP,
    COORDINATOR_TRANSACTION,
    FetchRequest,
    FindCoordinatorRequest,
    InitProducerIdRequest,
    ListOffsetsRequest,
    ProduceRequest,
    RecordIn,
    Request,
)


def test_every_request_of_the_protocol_has_a_handler() -> None:
    assert set(Request.__subclasses__()) == set(HANDLERS)
    # ... and every request of the protocol module is one.
    named = {c for n, c in inspect.getmembers(protocol, inspect.isclass) if n.endswith("Request")}
    assert named - {Request} == set(HANDLERS)


def test_requests_travel_through_handle(broker: Broker) -> None:
    create_topic(broker, "t", 1)
    init = broker.handle(InitProducerIdRequest(None, 60_000))
    assert init.error_code == 0 and init.producer_id >= 0
    produced = broker.handle(
        ProduceRequest(
            "t",
            0,
            [RecordIn(b"k", b"v", 0)],
            producer_id=init.producer_id,
            producer_epoch=init.producer_epoch,
            base_sequence=0,
        )
    )
    assert produced.error_code == 0 and produced.base_offset == 0
    fetched = broker.handle(FetchRequest("t", 0, 0))
    assert fetched.error_code == 0 and [r[3] for r in fetched.records] == [b"v"]
    assert broker.handle(ListOffsetsRequest("t", 0, -1)).offset == 1


def test_refusals_are_error_codes_in_the_response(broker: Broker) -> None:
    missing = broker.handle(FetchRequest("no-such-topic", 0, 0))
    assert missing.error_code == KafkaError.UNKNOWN_TOPIC_OR_PARTITION
    for key_type in (COORDINATOR_GROUP, COORDINATOR_TRANSACTION):
        assert broker.handle(FindCoordinatorRequest("k", key_type)).error_code == 0
    unknown = broker.handle(FindCoordinatorRequest("k", 7))
    assert unknown.error_code == KafkaError.INVALID_REQUEST


def test_a_request_of_no_rpc_is_refused(broker: Broker) -> None:
    with pytest.raises(KafkaException) as info:
        broker.handle(object())  # type: ignore[arg-type]
    assert info.value.error.code() == KafkaError.INVALID_REQUEST
