"""Kafka's RangeAssignor, as a pure function: per topic, members sorted by id take
contiguous ranges of partitions, the first ``n % m`` members one extra."""

from __future__ import annotations

from collections.abc import Mapping

from app.protocol import TopicPartitionKey


def range_assign(
    subscriptions: Mapping[str, list[str]], partition_counts: Mapping[str, int]
) -> dict[str, list[TopicPartitionKey]]:
    """``subscriptions``: member_id -> topics. Unknown topics get nothing."""
    out: dict[str, list[TopicPartitionKey]] = {member: [] for member in subscriptions}
    topics = sorted({t for ts in subscriptions.values() for t in ts})
    for topic in topics:
        n = partition_counts.get(topic, 0)
        members = sorted(mem for mem, ts in subscriptions.items() if topic in ts)
        if not members or n == 0:
            continue
        per, extra = divmod(n, len(members))
        start = 0
        for i, member in enumerate(members):
            count = per + (1 if i < extra else 0)
            out[member].extend((topic, p) for p in range(start, start + count))
            start += count
    return {member: sorted(tps) for member, tps in out.items()}
