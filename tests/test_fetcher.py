"""The consumer's hand-out order without a database: buffered records leave in strict
round robin across partitions whatever slices ``take`` builds them in, events take their
turn, and positions follow what was handed out."""

from __future__ import annotations

from typing import cast

from hypothesis import given
from hypothesis import strategies as st

from app.broker import Broker
from app.client.fetcher import Fetcher, FetchSettings
from app.client.message import FetchedMessage, Message
from app.errors import KafkaError
from app.protocol import READ_COMMITTED, RecordOut


def fetcher_with(buffers: list[int], turn: int = 0) -> Fetcher:
    """A fetcher whose partition p holds ``buffers[p]`` records at offsets 0, 1, ..."""
    settings = FetchSettings(READ_COMMITTED, 1 << 20, "earliest", partition_eof=False)
    f = Fetcher(cast(Broker, None), settings)  # take() never talks to the broker
    f.assign([("t", p, 0) for p in range(len(buffers))])
    for p, size in enumerate(buffers):
        cursor = f.cursors[("t", p)]
        records: list[RecordOut] = [
            (o, 0, None, f"{p}-{o}".encode(), None, -1) for o in range(size)
        ]
        cursor.buffer, cursor.fetch_offset = records, size
    f._turn = turn % max(1, len(buffers))
    return f


def round_robin(buffers: list[int], turn: int, counts: list[int]) -> list[list[tuple[int, int]]]:
    """The reference: one record per partition in turn, as poll() hands them out."""
    queues = [[(p, o) for o in range(size)] for p, size in enumerate(buffers)]
    n = len(buffers)
    turn = turn % max(1, n)
    batches = []
    for count in counts:
        batch: list[tuple[int, int]] = []
        while len(batch) < count:
            for i in range(n):
                index = (turn + i) % n
                if queues[index]:
                    batch.append(queues[index].pop(0))
                    turn = (index + 1) % n
                    break
            else:
                break
        batches.append(batch)
    return batches


def pairs(messages: list[Message]) -> list[tuple[int, int]]:
    return [(m.partition() or 0, m.offset() or 0) for m in messages]


@given(
    st.lists(st.integers(0, 12), min_size=1, max_size=4),
    st.integers(0, 3),
    st.lists(st.integers(1, 30), min_size=1, max_size=6),
)
def test_take_hands_out_in_strict_round_robin(
    buffers: list[int], turn: int, counts: list[int]
) -> None:
    f = fetcher_with(buffers, turn)
    assert [pairs(f.take(count)) for count in counts] == round_robin(buffers, turn, counts)


def test_take_builds_messages_from_the_buffered_rows_and_moves_positions() -> None:
    f = fetcher_with([3, 0])
    first = f.take(2)
    assert all(isinstance(m, FetchedMessage) for m in first)
    assert [m.value() for m in first] == [b"0-0", b"0-1"]
    assert f.cursors[("t", 0)].position == 2
    assert pairs(f.take(5)) == [(0, 2)]
    assert f.cursors[("t", 0)].position == 3 and f.cursors[("t", 0)].buffer == []
    assert f.take(5) == []


def test_an_error_event_takes_its_turn_after_the_buffer() -> None:
    f = fetcher_with([2, 1])
    f.cursors[("t", 0)].error_event(KafkaError(KafkaError.UNKNOWN_TOPIC_OR_PARTITION))
    got = f.take(10)
    assert [(m.partition(), m.offset(), m.error() is not None) for m in got] == [
        (0, 0, False),
        (1, 0, False),
        (0, 1, False),
        (0, 0, True),  # the event carries the position it was raised at
    ]
