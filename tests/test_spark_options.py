"""The kip98 data source's options and offsets, without Spark: Kafka's names and defaults,
each bad value an error naming its option, Spark's Kafka JSON, and the arithmetic of
maxOffsetsPerTrigger and minPartitions."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.errors import KafkaError, KafkaException
from app.spark.offsets import (
    OffsetRange,
    from_json,
    pack_ranges,
    rate_limit,
    split_ranges,
    to_json,
)
from app.spark.options import sink_options, source_options


def test_defaults_are_spark_kafka_sources() -> None:
    batch = source_options({"subscribe": "a, b"}, streaming=False)
    assert batch.subscription.topics == ("a", "b")
    assert (batch.starting, batch.ending) == ("earliest", "latest")
    assert batch.read_committed and batch.fail_on_data_loss
    stream = source_options({"subscribePattern": "or.*"}, streaming=True)
    assert stream.starting == "latest"
    assert stream.subscription.wants("orders", 0) and not stream.subscription.wants("xorders", 0)


def test_options_are_case_insensitive_and_parsed() -> None:
    o = source_options(
        {
            "ASSIGN": '{"a": [0, 2], "b": [1]}',
            "startingoffsets": '{"a": {"0": 5, "2": -2}, "b": {"1": -1}}',
            "MaxOffsetsPerTrigger": "100",
            "minPartitions": "8",
            "failOnDataLoss": "False",
            "isolation.level": "read_uncommitted",
        },
        streaming=True,
    )
    assert o.subscription.assigned == (("a", 0), ("a", 2), ("b", 1))
    assert o.starting == {("a", 0): 5, ("a", 2): -2, ("b", 1): -1}
    assert (o.max_offsets_per_trigger, o.min_partitions) == (100, 8)
    assert not o.fail_on_data_loss and not o.read_committed


@pytest.mark.parametrize(
    ("options", "streaming", "named"),
    [
        ({"subscribe": "a", "kafka.bootstrap.servers": "x"}, False, "kafka.bootstrap.servers"),
        ({}, False, "subscribe"),
        ({"subscribe": "a", "assign": '{"a": [0]}'}, False, "subscribe"),
        ({"subscribe": "a", "subscribePattern": "a"}, True, "subscribe"),
        ({"subscribe": " , "}, False, "subscribe"),
        ({"subscribePattern": "(("}, True, "subscribePattern"),
        ({"assign": "[1, 2]"}, False, "assign"),
        ({"assign": '{"a": [0'}, False, "assign"),
        ({"assign": '{"a": ["x"]}'}, False, "assign"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"0": "x"}}'}, False, "startingOffsets"),
        ({"subscribe": "a", "startingOffsets": "{nope"}, False, "startingOffsets"),
        ({"subscribe": "a", "startingOffsets": "latest"}, False, "startingOffsets"),
        ({"subscribe": "a", "startingOffsets": '{"a": {"0": -1}}'}, False, "startingOffsets"),
        ({"subscribe": "a", "endingOffsets": "earliest"}, False, "endingOffsets"),
        ({"subscribe": "a", "endingOffsets": '{"a": {"0": -2}}'}, False, "endingOffsets"),
        ({"subscribe": "a", "endingOffsets": "latest"}, True, "endingOffsets"),
        ({"subscribe": "a", "startingTimestamp": "yesterday"}, True, "startingTimestamp"),
        ({"subscribe": "a", "isolation.level": "read_dirty"}, False, "isolation.level"),
        ({"subscribe": "a", "minPartitions": "0"}, False, "minPartitions"),
        ({"subscribe": "a", "maxOffsetsPerTrigger": "-5"}, True, "maxOffsetsPerTrigger"),
        ({"subscribe": "a", "failOnDataLoss": "maybe"}, True, "failOnDataLoss"),
    ],
)
def test_bad_source_options_name_the_option(
    options: dict[str, str], streaming: bool, named: str
) -> None:
    with pytest.raises(KafkaException) as info:
        source_options(options, streaming)
    assert info.value.args[0].code() == KafkaError._INVALID_ARG
    assert f"'{named.lower()}'" in str(info.value).lower()


def test_sink_options() -> None:
    o = sink_options(
        {"topic": "out", "transaction.timeout.ms": "60000", "checkpointLocation": "/x"}
    )
    assert (o.topic, o.transaction_timeout_ms) == ("out", 60_000)
    assert sink_options({}).transaction_timeout_ms == 900_000
    for bad, named in (({"topics": "x"}, "topics"), ({"topic": " "}, "topic")):
        with pytest.raises(KafkaException, match=named):
            sink_options(bad)
    # No longer than the coordinator allows: every task's InitProducerId would be refused.
    assert sink_options({}, 60_000).transaction_timeout_ms == 60_000
    with pytest.raises(KafkaException, match=r"transaction\.timeout\.ms"):
        sink_options({"transaction.timeout.ms": "900001"}, 900_000)


def test_offsets_json_is_spark_kafka_sources() -> None:
    positions = {("orders", 0): 23, ("orders", 10): 5, ("b", 1): 0}
    assert to_json(positions) == {"b": {"1": 0}, "orders": {"0": 23, "10": 5}}
    assert from_json(to_json(positions)) == positions


def test_rate_limit_shares_in_proportion_and_never_starves() -> None:
    start = {("t", 0): 0, ("t", 1): 100}
    end = {("t", 0): 1000, ("t", 1): 101, ("t", 2): 10}  # t-2 is new: starts at 0
    capped = rate_limit(100, start, end)
    assert capped == {("t", 0): 98, ("t", 1): 101, ("t", 2): 1}


@given(
    st.integers(1, 1000),
    st.dictionaries(
        st.integers(0, 5), st.tuples(st.integers(0, 500), st.integers(0, 500)), max_size=6
    ),
)
def test_rate_limit_stays_within_limit_and_range(
    limit: int, spans: dict[int, tuple[int, int]]
) -> None:
    start = {("t", p): a for p, (a, _) in spans.items()}
    end = {("t", p): a + b for p, (a, b) in spans.items()}
    capped = rate_limit(limit, start, end)
    assert set(capped) == set(end)
    for tp, e in capped.items():
        assert start[tp] <= e <= end[tp]
    moved = sum(capped[tp] - start[tp] for tp in end)
    # Rounding a share below 1 up to 1 may exceed the limit by under one per partition.
    assert moved <= limit + len(end)
    if sum(end[tp] - start[tp] for tp in end) <= limit:
        assert capped == end


@given(
    st.lists(st.tuples(st.integers(0, 100), st.integers(0, 300)), min_size=1, max_size=5),
    st.integers(1, 20),
)
def test_split_ranges_covers_each_range_exactly(spans: list[tuple[int, int]], n: int) -> None:
    ranges = [OffsetRange("t", p, a, a + size) for p, (a, size) in enumerate(spans)]
    parts = split_ranges(ranges, n)
    for r in ranges:
        mine = sorted((x.start, x.end) for x in parts if x.partition == r.partition)
        covered = [o for a, b in mine for o in range(a, b)]
        assert covered == list(range(r.start, r.end))
    if n > len([r for r in ranges if r.size]):
        assert len(parts) >= min(n // 2, sum(r.size for r in ranges)) or not parts


@given(
    st.lists(st.integers(0, 300), min_size=0, max_size=12),
    st.integers(1, 500),
    st.one_of(st.none(), st.integers(1, 20)),
)
def test_pack_ranges_reads_each_range_once_in_order_within_the_task_size(
    sizes: list[int], task_rows: int, min_partitions: int | None
) -> None:
    ranges = [OffsetRange("t", p, 10, 10 + size) for p, size in enumerate(sizes)]
    tasks = pack_ranges(ranges, min_partitions, task_rows)
    assert [r for task in tasks for r in task] == ranges
    for task in tasks:
        # A task holds one range, or ranges that together fit the task size.
        assert len(task) == 1 or sum(r.size for r in task) <= task_rows
    if min_partitions:
        assert all(len(task) == 1 for task in tasks)
    # Greedy: a task and the next range together are past the task size.
    for task, after in itertools.pairwise(tasks):
        assert sum(r.size for r in task) + after[0].size > task_rows or min_partitions
