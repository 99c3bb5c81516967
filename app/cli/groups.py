"""``kip98 groups``: kafka-consumer-groups.sh's list and describe.

Lag is measured against the high watermark, as Kafka's tool does; the LSO is shown too,
because a read_committed group cannot get past it and lag up to the high
watermark may be an open transaction rather than a slow consumer.
"""

from __future__ import annotations

from typing import Any

import click
from sqlalchemy import text

from app.broker import Broker
from app.cli.errors import CliError
from app.cli.output import emit, output_option

# The consumer_group_lag view: each partition committed or assigned to a live member,
# with the member holding it and the group's type, classic or consumer (docs/sql.md).
_DESCRIBE = text("SELECT * FROM consumer_group_lag WHERE group_id = :g ORDER BY topic, partition")
_EXISTS = text(
    "SELECT EXISTS (SELECT 1 FROM consumer_groups WHERE group_id = :g) "
    "OR EXISTS (SELECT 1 FROM group_offsets WHERE group_id = :g)"
)
_LIST = text(
    """
    SELECT g.group_id, coalesce(cg.group_type, 'classic') AS type,
           coalesce(cg.state, 'Empty') AS state,
           (SELECT count(*) FROM group_members m WHERE m.group_id = g.group_id)
           + (SELECT count(*) FROM consumer_group_members c WHERE c.group_id = g.group_id)
               AS members,
           (SELECT count(*) FROM group_offsets o WHERE o.group_id = g.group_id) AS partitions
    FROM (SELECT group_id FROM consumer_groups UNION SELECT group_id FROM group_offsets) g
    LEFT JOIN consumer_groups cg ON cg.group_id = g.group_id
    ORDER BY g.group_id
    """
)

DESCRIBE_COLUMNS = [
    "group",
    "topic",
    "partition",
    "current_offset",
    "log_end_offset",
    "last_stable_offset",
    "lag",
    "consumer_id",
    "client_id",
    "type",
    "member_epoch",
]


@click.group("groups")
def groups_group() -> None:
    """Consumer groups: committed offsets, lag, members."""


@groups_group.command("list")
@output_option
def list_(output: str) -> None:
    """Every group with members or committed offsets, with its type (classic|consumer)."""
    with Broker.connect().engine.connect() as conn:
        rows = [dict(r._mapping) for r in conn.execute(_LIST)]
    emit(
        rows,
        output,
        columns=["group_id", "type", "state", "members", "partitions"],
        headers={"group_id": "GROUP"},
    )


@groups_group.command()
@click.argument("group")
@output_option
def describe(group: str, output: str) -> None:
    """Committed offset, log end and lag per partition of GROUP; the member holding it, the
    group's type (classic, or consumer: KIP-848) and a consumer group member's epoch."""
    with Broker.connect().engine.connect() as conn:
        found = conn.execute(_DESCRIBE, {"g": group}).all()
        if not found and not conn.execute(_EXISTS, {"g": group}).scalar():
            raise CliError(f"consumer group {group!r} does not exist")
    rows: list[dict[str, Any]] = [
        {
            "group": group,
            "topic": r.topic,
            "partition": r.partition,
            "current_offset": r.committed_offset,
            "log_end_offset": r.high_watermark,
            "last_stable_offset": r.last_stable_offset,
            "lag": r.lag,
            "consumer_id": r.member_id,
            "client_id": r.client_id,
            "type": r.group_type,
            "member_epoch": r.member_epoch,
        }
        for r in found
    ]
    if output == "table":
        rows = [{k: "-" if v is None else v for k, v in row.items()} for row in rows]
    emit(rows, output, columns=DESCRIBE_COLUMNS, headers={"last_stable_offset": "LSO"})
