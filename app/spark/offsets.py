"""Offsets as Spark's Kafka source writes them, and the arithmetic on them: pure functions.

A position is the next offset to read, per topic partition, serialised as Spark's Kafka
source does (``{"orders": {"0": 23, "1": 5}}``), so a checkpoint reads the same to anyone
who knows that source. ``-2`` means the earliest offset and ``-1`` the latest in the
per-partition JSON a user gives, as in Spark.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from app.errors import KafkaError, fail
from app.protocol import TopicPartitionKey

Positions = dict[TopicPartitionKey, int]

EARLIEST = -2
LATEST = -1


def bad_option(name: str, why: str) -> Exception:
    """The error of an option Spark's way: raised before anything runs, naming it."""
    return fail(KafkaError._INVALID_ARG, f"option '{name}': {why}")


def _json(name: str, text: str) -> Any:
    try:
        return json.loads(text)
    except (TypeError, ValueError) as exc:
        raise bad_option(name, f"malformed JSON ({exc}): {text!r}") from exc


def _partition_number(name: str, topic: str, key: object) -> int:
    try:
        partition = int(str(key))
    except ValueError:
        partition = -1
    if partition < 0 or isinstance(key, bool):
        raise bad_option(name, f"partition {key!r} of topic {topic!r} is not a partition number")
    return partition


def parse_positions(name: str, text: str) -> Positions:
    """``{"topicA": {"0": 23, "1": -1}, "topicB": {"0": -2}}``: offsets per partition."""
    data = _json(name, text)
    if not isinstance(data, dict) or not data:
        raise bad_option(name, f'expected {{"topic": {{"partition": offset}}}}, got {text!r}')
    out: Positions = {}
    for topic, partitions in data.items():
        if not isinstance(partitions, dict) or not partitions:
            raise bad_option(name, f"topic {topic!r}: expected {{partition: offset}}")
        for key, offset in partitions.items():
            partition = _partition_number(name, topic, key)
            if isinstance(offset, bool) or not isinstance(offset, int) or offset < EARLIEST:
                raise bad_option(name, f"{topic}-{partition}: {offset!r} is not an offset")
            out[(topic, partition)] = offset
    return out


def parse_assign(text: str) -> list[TopicPartitionKey]:
    """``{"topicA": [0, 1], "topicB": [2, 4]}``: the partitions to read."""
    data = _json("assign", text)
    if not isinstance(data, dict) or not data:
        raise bad_option("assign", f'expected {{"topic": [partitions]}}, got {text!r}')
    out: list[TopicPartitionKey] = []
    for topic, partitions in data.items():
        if not isinstance(partitions, list) or not partitions:
            raise bad_option("assign", f"topic {topic!r}: expected a list of partitions")
        out.extend((topic, _partition_number("assign", topic, p)) for p in partitions)
    return sorted(set(out))


def to_json(positions: Mapping[TopicPartitionKey, int]) -> dict[str, dict[str, int]]:
    """Spark's Kafka source offset: topic, then partition number as a string."""
    out: dict[str, dict[str, int]] = {}
    for (topic, partition), offset in sorted(positions.items()):
        out.setdefault(topic, {})[str(partition)] = int(offset)
    return out


def from_json(data: Mapping[str, Any]) -> Positions:
    """The inverse of ``to_json`` (what Spark hands back from its checkpoint)."""
    return {
        (str(topic), int(partition)): int(offset)
        for topic, partitions in data.items()
        for partition, offset in partitions.items()
    }


def rate_limit(limit: int, start: Mapping[TopicPartitionKey, int], end: Positions) -> Positions:
    """At most ``limit`` offsets past ``start`` in all, shared among the partitions in
    proportion to what each has to read (Spark's Kafka source's ``maxOffsetsPerTrigger``):
    a partition's share is rounded down, but up to 1 where it would be below 1, so a small
    partition is never starved. A partition not in ``start`` starts at 0."""
    sizes = {tp: e - start.get(tp, 0) for tp, e in end.items() if e - start.get(tp, 0) > 0}
    total = sum(sizes.values())
    if total < 1:
        return dict(end)
    capped: Positions = {}
    for tp, e in end.items():
        size = sizes.get(tp)
        if size is None:
            capped[tp] = e
            continue
        share = limit * (size / total)
        step = math.ceil(share) if share < 1 else math.floor(share)
        capped[tp] = min(e, start.get(tp, 0) + step)
    return capped


@dataclass(frozen=True)
class OffsetRange:
    """Offsets ``[start, end)`` of one topic partition: one Spark task's read."""

    topic: str
    partition: int
    start: int
    end: int

    @property
    def size(self) -> int:
        return self.end - self.start


# Rows a task reads before another range joins it. A task of Spark's Python data source
# costs ~0.1 s of its own (measured: the worker's round trip, the reader's unpickling, a
# connection), as long as reading ~25,000 rows takes; ranges smaller than this are read
# several to a task, as Spark's file sources pack small files into one partition
# (``spark.sql.files.openCostInBytes``).
TASK_ROWS = 100_000


def pack_ranges(
    ranges: Iterable[OffsetRange], min_partitions: int | None, task_rows: int = TASK_ROWS
) -> list[tuple[OffsetRange, ...]]:
    """Each task's ranges, in order: consecutive ranges joined while the task holds fewer
    than ``task_rows`` rows. With ``minPartitions`` every range is a task of its own, the
    parallelism asked for (and Spark's Kafka source's)."""
    tasks: list[list[OffsetRange]] = []
    rows = 0
    for r in ranges:
        if min_partitions or not tasks or rows + r.size > task_rows:
            tasks.append([])
            rows = 0
        tasks[-1].append(r)
        rows += r.size
    return [tuple(t) for t in tasks]


def split_ranges(ranges: Iterable[OffsetRange], min_partitions: int | None) -> list[OffsetRange]:
    """One range per topic partition; with ``minPartitions`` above their number, each
    range cut into parts in proportion to its share of all offsets (at least one part),
    as Spark's Kafka source divides them."""
    ranges = [r for r in ranges if r.size > 0]
    if not min_partitions or min_partitions <= len(ranges):
        return ranges
    total = sum(r.size for r in ranges)
    out: list[OffsetRange] = []
    for r in ranges:
        parts = max(1, round(r.size / total * min_partitions))
        bounds = [r.start + (r.size * i) // parts for i in range(parts + 1)]
        out.extend(
            OffsetRange(r.topic, r.partition, a, b) for a, b in itertools.pairwise(bounds) if b > a
        )
    return out
