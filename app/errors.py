"""Kafka error codes and the exception clients raise.

The numeric codes are Kafka's (broker errors, positive) and librdkafka's (local errors,
negative), so code written against confluent-kafka can compare ``err.code()`` with the
same constants. The flags (fatal, retriable, txn_requires_abort) drive the client-side
transaction manager exactly as librdkafka's do.
"""

from __future__ import annotations

import builtins
from typing import Any

# name -> (code, retriable, description)
_BROKER_ERRORS: dict[str, tuple[int, bool, str]] = {
    "NO_ERROR": (0, False, "Success"),
    "UNKNOWN_SERVER_ERROR": (-1, False, "Unknown broker error"),
    "OFFSET_OUT_OF_RANGE": (1, False, "Offset out of range"),
    "CORRUPT_MESSAGE": (2, True, "Invalid message"),
    "UNKNOWN_TOPIC_OR_PARTITION": (3, True, "Unknown topic or partition"),
    "INVALID_FETCH_SIZE": (4, False, "Invalid fetch size"),
    "NOT_COORDINATOR": (16, True, "Not coordinator"),
    "COORDINATOR_NOT_AVAILABLE": (15, True, "Coordinator not available"),
    "COORDINATOR_LOAD_IN_PROGRESS": (14, True, "Coordinator load in progress"),
    "REQUEST_TIMED_OUT": (7, True, "Request timed out"),
    "MSG_SIZE_TOO_LARGE": (10, False, "Message size too large"),
    "INVALID_TOPIC_EXCEPTION": (17, False, "Invalid topic"),
    "RECORD_LIST_TOO_LARGE": (18, False, "Record list too large"),
    "NOT_ENOUGH_REPLICAS": (19, True, "Broker: Not enough in-sync replicas"),
    "NOT_ENOUGH_REPLICAS_AFTER_APPEND": (
        20,
        True,
        "Broker: Message(s) written to insufficient number of in-sync replicas",
    ),
    "OFFSET_METADATA_TOO_LARGE": (12, False, "Offset metadata string too large"),
    "INVALID_REQUIRED_ACKS": (21, False, "Invalid required acks value"),
    "ILLEGAL_GENERATION": (22, False, "Specified group generation id is not valid"),
    "INCONSISTENT_GROUP_PROTOCOL": (
        23,
        False,
        "The provided member's protocol type is incompatible with the other members",
    ),
    "INVALID_GROUP_ID": (24, False, "Invalid group.id"),
    "UNKNOWN_MEMBER_ID": (25, False, "Unknown member"),
    "INVALID_SESSION_TIMEOUT": (26, False, "Invalid session timeout"),
    "REBALANCE_IN_PROGRESS": (27, False, "Group rebalance in progress"),
    "INVALID_COMMIT_OFFSET_SIZE": (28, False, "Commit offset data size is not valid"),
    "TOPIC_AUTHORIZATION_FAILED": (29, False, "Topic authorization failed"),
    "GROUP_AUTHORIZATION_FAILED": (30, False, "Group authorization failed"),
    "CLUSTER_AUTHORIZATION_FAILED": (31, False, "Cluster authorization failed"),
    "INVALID_TIMESTAMP": (32, False, "Invalid timestamp"),
    "UNSUPPORTED_SASL_MECHANISM": (33, False, "Unsupported SASL mechanism"),
    "ILLEGAL_SASL_STATE": (34, False, "Illegal SASL state"),
    "UNSUPPORTED_VERSION": (35, False, "Unsupported version"),
    "SASL_AUTHENTICATION_FAILED": (58, False, "SASL authentication failed"),
    "RESOURCE_NOT_FOUND": (91, False, "A request referred to a resource that does not exist"),
    "TOPIC_ALREADY_EXISTS": (36, False, "Topic already exists"),
    "INVALID_PARTITIONS": (37, False, "Invalid number of partitions"),
    "INVALID_REPLICATION_FACTOR": (38, False, "Invalid replication factor"),
    "INVALID_REPLICA_ASSIGNMENT": (39, False, "Replica assignment is invalid"),
    "INVALID_REQUEST": (42, False, "Invalid request"),
    "UNSUPPORTED_FOR_MESSAGE_FORMAT": (
        43,
        False,
        "The message format version does not support the request",
    ),
    "UNSUPPORTED_COMPRESSION_TYPE": (76, False, "Unsupported compression type"),
    "STALE_BROKER_EPOCH": (77, False, "Broker epoch has changed"),
    "INVALID_CONFIG": (40, False, "Configuration is invalid"),
    "OUT_OF_ORDER_SEQUENCE_NUMBER": (45, False, "Broker received an out of order sequence number"),
    "DUPLICATE_SEQUENCE_NUMBER": (46, False, "Broker received a duplicate sequence number"),
    "INVALID_PRODUCER_EPOCH": (47, False, "Producer attempted an operation with an old epoch"),
    "INVALID_TXN_STATE": (
        48,
        False,
        "Producer attempted a transactional operation in an invalid state",
    ),
    "INVALID_PRODUCER_ID_MAPPING": (
        49,
        False,
        "Producer attempted to use a producer id which is not currently assigned to its transactional id",
    ),
    "INVALID_TRANSACTION_TIMEOUT": (
        50,
        False,
        "Transaction timeout is larger than the maximum value allowed by the broker",
    ),
    "CONCURRENT_TRANSACTIONS": (
        51,
        True,
        "Producer attempted to update a transaction while another concurrent operation on the same transaction was ongoing",
    ),
    "TRANSACTION_COORDINATOR_FENCED": (
        52,
        False,
        "Indicates that the transaction coordinator sending a WriteTxnMarker is no longer the current coordinator for a given producer",
    ),
    "TRANSACTIONAL_ID_AUTHORIZATION_FAILED": (53, False, "Transactional Id authorization failed"),
    "SECURITY_DISABLED": (54, False, "Security features are disabled"),
    "OPERATION_NOT_ATTEMPTED": (55, False, "Operation not attempted"),
    "UNKNOWN_PRODUCER_ID": (59, False, "Unknown producer id"),
    "GROUP_ID_NOT_FOUND": (69, False, "Group id not found"),
    "MEMBER_ID_REQUIRED": (79, False, "Member id required to join the group"),
    "FENCED_INSTANCE_ID": (
        82,
        False,
        "Static consumer fenced by other consumer with same group.instance.id",
    ),
    "INVALID_RECORD": (87, False, "Broker failed to validate record"),
    "UNSTABLE_OFFSET_COMMIT": (88, True, "There are unstable offsets that need to be cleared"),
    "PRODUCER_FENCED": (
        90,
        False,
        "There is a newer producer with the same transactionalId which fences the current one",
    ),
    "UNKNOWN_TOPIC_ID": (100, True, "Unknown topic id"),
    "DUPLICATE_BROKER_REGISTRATION": (101, False, "This broker ID is already in use"),
    "TRANSACTIONAL_ID_NOT_FOUND": (105, False, "The transactionalId could not be found"),
    # KIP-1050: the transaction must be aborted, the producer may go on after.
    "TRANSACTION_ABORTABLE": (120, False, "The server encountered an error with the transaction"),
    "LEADER_NOT_AVAILABLE": (5, True, "Leader not available"),
    "POLICY_VIOLATION": (44, False, "Policy violation"),
    "NON_EMPTY_GROUP": (68, False, "Group is not empty"),
    "FENCED_LEADER_EPOCH": (74, True, "Broker: Leader epoch is older than broker epoch"),
    "UNKNOWN_LEADER_EPOCH": (75, True, "Broker: Leader epoch is newer than broker epoch"),
    "GROUP_SUBSCRIBED_TO_TOPIC": (86, False, "Broker: Consumer group is subscribed to the topic"),
    "DUPLICATE_RESOURCE": (
        92,
        False,
        "Broker: Request illegally referred to the same resource twice",
    ),
    "UNACCEPTABLE_CREDENTIAL": (
        93,
        False,
        "Broker: Requested credential would not meet criteria for acceptability",
    ),
    # KIP-848's consumer group protocol.
    "FENCED_MEMBER_EPOCH": (110, False, "Broker: The member epoch is fenced by the coordinator"),
    "UNRELEASED_INSTANCE_ID": (
        111,
        False,
        "Broker: The instance ID is still used by another member in the consumer group",
    ),
    "UNSUPPORTED_ASSIGNOR": (
        112,
        False,
        "Broker: The assignor or its version range is not supported",
    ),
    "STALE_MEMBER_EPOCH": (113, False, "Broker: The member epoch is stale"),
    "INVALID_REGULAR_EXPRESSION": (128, False, "Broker: The regular expression is not valid"),
}

# librdkafka's local (client-side) errors.
_LOCAL_ERRORS: dict[str, tuple[int, bool, str]] = {
    "_BAD_MSG": (-199, False, "Local: Bad message format"),
    "_FAIL": (-196, False, "Local: Communication failure"),
    "_TRANSPORT": (-195, True, "Local: Broker transport failure"),
    "_DESTROY": (-197, False, "Local: Broker handle destroyed"),
    "_MSG_TIMED_OUT": (-192, True, "Local: Message timed out"),
    "_PARTITION_EOF": (-191, False, "Broker: No more messages"),
    "_UNKNOWN_PARTITION": (-190, False, "Local: Unknown partition"),
    "_INVALID_ARG": (-186, False, "Local: Invalid argument or configuration"),
    "_TIMED_OUT": (-185, True, "Local: Timed out"),
    "_QUEUE_FULL": (-184, True, "Local: Queue full"),
    "_UNKNOWN_GROUP": (-179, False, "Local: Unknown group"),
    "_UNKNOWN_TOPIC": (-188, False, "Local: Unknown topic"),
    "_STATE": (-172, False, "Local: Erroneous state"),
    "_NOT_IMPLEMENTED": (-170, False, "Local: Not implemented"),
    "_NOT_CONFIGURED": (-145, False, "Local: Functionality not configured"),
    "_AUTHENTICATION": (-169, False, "Local: Authentication failure"),
    "_ASSIGN_PARTITIONS": (-175, False, "Local: Assign partitions"),
    "_REVOKE_PARTITIONS": (-174, False, "Local: Revoke partitions"),
    "_NO_OFFSET": (-168, False, "Local: No offset stored"),
    "_FATAL": (-150, False, "Local: Fatal error"),
    "_FENCED": (-144, False, "Local: This instance has been fenced by a newer instance"),
    "_PURGE_QUEUE": (-152, False, "Local: Purged in queue"),
}

_ALL = {**_BROKER_ERRORS, **_LOCAL_ERRORS}
_BY_CODE: dict[int, str] = {code: name for name, (code, _, _) in _ALL.items()}


class KafkaError:
    """An error as confluent-kafka reports it: a code, a name, a message and three flags."""

    # Class constants are filled in below from the tables, e.g. KafkaError.PRODUCER_FENCED.
    NO_ERROR: int
    UNKNOWN_SERVER_ERROR: int
    OFFSET_OUT_OF_RANGE: int
    CORRUPT_MESSAGE: int
    UNSUPPORTED_FOR_MESSAGE_FORMAT: int
    UNSUPPORTED_COMPRESSION_TYPE: int
    UNKNOWN_TOPIC_OR_PARTITION: int
    INVALID_FETCH_SIZE: int
    NOT_COORDINATOR: int
    COORDINATOR_NOT_AVAILABLE: int
    COORDINATOR_LOAD_IN_PROGRESS: int
    REQUEST_TIMED_OUT: int
    MSG_SIZE_TOO_LARGE: int
    INVALID_TOPIC_EXCEPTION: int
    RECORD_LIST_TOO_LARGE: int
    NOT_ENOUGH_REPLICAS: int
    NOT_ENOUGH_REPLICAS_AFTER_APPEND: int
    OFFSET_METADATA_TOO_LARGE: int
    INVALID_REQUIRED_ACKS: int
    ILLEGAL_GENERATION: int
    INCONSISTENT_GROUP_PROTOCOL: int
    INVALID_GROUP_ID: int
    UNKNOWN_MEMBER_ID: int
    INVALID_SESSION_TIMEOUT: int
    REBALANCE_IN_PROGRESS: int
    INVALID_COMMIT_OFFSET_SIZE: int
    TOPIC_AUTHORIZATION_FAILED: int
    GROUP_AUTHORIZATION_FAILED: int
    CLUSTER_AUTHORIZATION_FAILED: int
    INVALID_TIMESTAMP: int
    UNSUPPORTED_SASL_MECHANISM: int
    UNSUPPORTED_VERSION: int
    ILLEGAL_SASL_STATE: int
    SASL_AUTHENTICATION_FAILED: int
    RESOURCE_NOT_FOUND: int
    TOPIC_ALREADY_EXISTS: int
    INVALID_PARTITIONS: int
    INVALID_REPLICATION_FACTOR: int
    INVALID_REPLICA_ASSIGNMENT: int
    INVALID_REQUEST: int
    INVALID_CONFIG: int
    OUT_OF_ORDER_SEQUENCE_NUMBER: int
    DUPLICATE_SEQUENCE_NUMBER: int
    INVALID_PRODUCER_EPOCH: int
    INVALID_TXN_STATE: int
    INVALID_PRODUCER_ID_MAPPING: int
    INVALID_TRANSACTION_TIMEOUT: int
    CONCURRENT_TRANSACTIONS: int
    TRANSACTION_COORDINATOR_FENCED: int
    TRANSACTIONAL_ID_AUTHORIZATION_FAILED: int
    SECURITY_DISABLED: int
    OPERATION_NOT_ATTEMPTED: int
    UNKNOWN_PRODUCER_ID: int
    GROUP_ID_NOT_FOUND: int
    MEMBER_ID_REQUIRED: int
    FENCED_INSTANCE_ID: int
    INVALID_RECORD: int
    UNSTABLE_OFFSET_COMMIT: int
    PRODUCER_FENCED: int
    UNKNOWN_TOPIC_ID: int
    TRANSACTIONAL_ID_NOT_FOUND: int
    TRANSACTION_ABORTABLE: int
    LEADER_NOT_AVAILABLE: int
    POLICY_VIOLATION: int
    NON_EMPTY_GROUP: int
    FENCED_LEADER_EPOCH: int
    UNKNOWN_LEADER_EPOCH: int
    GROUP_SUBSCRIBED_TO_TOPIC: int
    DUPLICATE_RESOURCE: int
    UNACCEPTABLE_CREDENTIAL: int
    FENCED_MEMBER_EPOCH: int
    UNRELEASED_INSTANCE_ID: int
    UNSUPPORTED_ASSIGNOR: int
    STALE_MEMBER_EPOCH: int
    INVALID_REGULAR_EXPRESSION: int
    DUPLICATE_BROKER_REGISTRATION: int
    STALE_BROKER_EPOCH: int
    _BAD_MSG: int
    _FAIL: int
    _TRANSPORT: int
    _DESTROY: int
    _MSG_TIMED_OUT: int
    _PARTITION_EOF: int
    _UNKNOWN_PARTITION: int
    _INVALID_ARG: int
    _TIMED_OUT: int
    _QUEUE_FULL: int
    _UNKNOWN_GROUP: int
    _UNKNOWN_TOPIC: int
    _STATE: int
    _NOT_IMPLEMENTED: int
    _NOT_CONFIGURED: int
    _AUTHENTICATION: int
    _ASSIGN_PARTITIONS: int
    _REVOKE_PARTITIONS: int
    _NO_OFFSET: int
    _FATAL: int
    _FENCED: int
    _PURGE_QUEUE: int

    __slots__ = ("_code", "_fatal", "_reason", "_retriable", "_txn_requires_abort")

    def __init__(
        self,
        code: int,
        reason: str | None = None,
        fatal: bool = False,
        retriable: bool | None = None,
        txn_requires_abort: bool = False,
    ) -> None:
        self._code = int(code)
        name = _BY_CODE.get(self._code)
        default_reason = _ALL[name][2] if name else f"Error code {self._code}"
        self._reason = reason or default_reason
        self._fatal = fatal
        self._retriable = _ALL[name][1] if (retriable is None and name) else bool(retriable)
        self._txn_requires_abort = txn_requires_abort

    def code(self) -> int:
        return self._code

    def name(self) -> str:
        return _BY_CODE.get(self._code, f"ERR_{self._code}")

    def str(self) -> str:
        return self._reason

    def fatal(self) -> bool:
        return self._fatal

    def retriable(self) -> bool:
        return self._retriable

    def txn_requires_abort(self) -> bool:
        return self._txn_requires_abort

    def __eq__(self, other: object) -> bool:
        if isinstance(other, KafkaError):
            return self._code == other._code
        if isinstance(other, int):
            return self._code == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self._code)

    def __str__(self) -> builtins.str:
        return f'KafkaError{{code={self.name()},val={self._code},str="{self._reason}"}}'

    __repr__ = __str__


for _name, _entry in _ALL.items():
    setattr(KafkaError, _name, _entry[0])


class KafkaException(Exception):
    """Raised by every client call that fails; the KafkaError is ``args[0]``."""

    def __init__(self, error: KafkaError | int, reason: str | None = None, **flags: Any) -> None:
        if not isinstance(error, KafkaError):
            error = KafkaError(error, reason, **flags)
        super().__init__(error)

    @property
    def error(self) -> KafkaError:
        err = self.args[0]
        assert isinstance(err, KafkaError)
        return err

    def __str__(self) -> str:
        return str(self.args[0])


def fail(code: int, reason: str | None = None, **flags: Any) -> KafkaException:
    """Build the exception for a handler's error answer; ``raise fail(KafkaError.X, "why")``."""
    return KafkaException(KafkaError(code, reason, **flags))
