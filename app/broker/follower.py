"""Fetches answered by a standby: Kafka's fetch from follower (KIP-392), on PostgreSQL's
hot standbys (docs/design.md rule 44).

A broker context with a ``replica_engine`` (a consumer configured with
``database.replica.url``, ``kip98 serve --replica-url``) reads records there, sparing the
primary the reads; positions, offsets, groups and every write stay with the primary. A
standby replays the primary's WAL in commit order, each commit at once, so a snapshot of
it is one the primary had: a partition row's LSO and the records and aborted index below
it agree there as on the primary, and a read_committed fetch on the standby returns
exactly what it would have on the primary at that earlier moment.

A standby lags. A position beyond what it has replayed (a committed offset, or one a
reader of the primary reached) is not out of range: the primary is asked for its end (one
ListOffsets), and if the position is within it, the fetch answers no records yet and the
reader waits, as a long poll does, never resetting or going back. Only a position the
primary does not have either is OFFSET_OUT_OF_RANGE.
"""

from __future__ import annotations

from dataclasses import replace

from app.broker import apis
from app.errors import KafkaError
from app.protocol import (
    LATEST_TIMESTAMP,
    READ_UNCOMMITTED,
    FetchRequest,
    FetchResponse,
    ListOffsetsRequest,
    ListOffsetsResponse,
)
from app.storage.context import BrokerContext


def fetch_from_follower(context: BrokerContext, request: FetchRequest) -> FetchResponse:
    """``request`` read on ``context``'s standby (its ``replica_engine``); the primary
    (``engine``) asked only when the standby has not replayed the position yet."""
    assert context.replica_engine is not None
    follower = replace(context, engine=context.replica_engine, replica_engine=None)
    answer: FetchResponse = apis.handle(follower, request)
    if not beyond_replayed(request, answer):
        return answer
    end: ListOffsetsResponse = apis.handle(
        replace(context, replica_engine=None),
        ListOffsetsRequest(request.topic, request.partition, LATEST_TIMESTAMP, READ_UNCOMMITTED),
    )
    if end.error_code != KafkaError.NO_ERROR or request.fetch_offset > end.offset:
        return answer  # beyond the log itself: out of range, as the primary says too
    # Nothing here yet: as far as this reader can tell, the log ends where it stands.
    at = request.fetch_offset
    return replace(
        answer,
        error_code=KafkaError.NO_ERROR,
        error_message=None,
        high_watermark=max(answer.high_watermark, at),
        last_stable_offset=max(answer.last_stable_offset, at),
        records=[],
        log_records=[],
        aborted_transactions=[],
        next_offset=at,
    )


def beyond_replayed(request: FetchRequest, answer: FetchResponse) -> bool:
    """Whether ``answer`` refused ``request``'s position only for being past the end the
    standby has replayed (not below its log start)."""
    return (
        answer.error_code == KafkaError.OFFSET_OUT_OF_RANGE
        and answer.high_watermark >= 0
        and request.fetch_offset > answer.high_watermark
    )
