"""Rebuild KIP-848's projection, ``consumer_group_members`` and the consumer groups' epochs,
state and subscription metadata in ``consumer_groups``, from ``consumer_group_events``.

Each event naming a member carries the member as the projection then held it
(``consumer.member_record``: all but its last heartbeat); the fold replays them in order:
a group's creation or conversion from a classic group starts it over, a removal drops the
member, a target assignment sets the members' targets. A rebuilt member's session starts at
the rebuild, as Kafka's coordinator starts a loaded group's timers afresh. Only groups that
are consumer groups now are rebuilt: a deleted group's events stay but it has no row.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from app.groups import sql
from app.groups.consumer_assignment import MemberAssignmentState, group_state
from app.settings import BrokerSettings

# The events after which their member is gone, and those that start a group over.
REMOVALS = frozenset({
    "member_left", "member_expired", "member_revocation_timed_out",
    "classic_member_rebalance_timed_out", "static_member_replaced",
})  # fmt: skip
STARTS = frozenset({"group_created", "converted_from_classic", "converted_to_classic"})
MEMBER_COLUMNS = (
    "instance_id", "rack_id", "client_id", "client_host", "subscribed_topic_names",
    "subscribed_topic_regex", "server_assignor", "rebalance_timeout_ms", "member_epoch",
    "previous_member_epoch", "state", "assigned", "pending_revocation", "target",
    "revocation_deadline_ms", "joined_ms", "assignment_epochs", "classic_member",
)  # fmt: skip
JSON_COLUMNS = frozenset({
    "subscribed_topic_names", "assigned", "pending_revocation", "target", "assignment_epochs",
    "classic_member",
})  # fmt: skip


@dataclass
class FoldedGroup:
    group_epoch: int = 0
    assignment_epoch: int = 0
    subscription_metadata: Any = None
    members: dict[str, dict[str, Any]] = field(default_factory=dict)

    def state(self) -> str:
        return group_state(
            (MemberAssignmentState(m["member_epoch"], m["previous_member_epoch"], m["state"],
                                   {}, {}) for m in self.members.values()),
            self.group_epoch, self.assignment_epoch,
        )  # fmt: skip


def fold(events: Any) -> dict[str, FoldedGroup]:
    """Every group's projection after ``events`` (in order): a pure function of them."""
    groups: dict[str, FoldedGroup] = {}
    for e in events:
        detail = e.detail or {}
        g = groups.setdefault(e.group_id, FoldedGroup())
        if e.kind in STARTS:
            g = groups[e.group_id] = FoldedGroup()
        g.group_epoch = e.group_epoch
        if e.kind == "converted_from_classic":
            g.assignment_epoch = e.group_epoch
            for member_id, m in detail.get("members", {}).items():
                if "record" in m:
                    g.members[member_id] = dict(m["record"])
        elif e.kind == "group_epoch":
            g.subscription_metadata = detail.get("subscription_metadata")
        elif e.kind == "target_assignment":
            g.assignment_epoch = e.group_epoch
            for member_id, target in detail.get("targets", {}).items():
                if member_id in g.members:
                    g.members[member_id]["target"] = target
        if e.member_id is None or e.kind in STARTS:
            continue
        if e.kind in REMOVALS:
            g.members.pop(e.member_id, None)
        elif "member" in detail:
            g.members[e.member_id] = dict(detail["member"])
    return groups


def compute_consumer_groups(conn: Connection) -> dict[str, list[tuple[Any, ...]]]:
    """The projection the events give, for the groups that are consumer groups now, in
    the shape of ``live_consumer_groups``."""
    folded = fold(conn.execute(sql.ALL_CONSUMER_GROUP_EVENTS))
    live = {r.group_id for r in conn.execute(sql.LIVE_CONSUMER_GROUPS)}
    groups, members = [], []
    for group_id in sorted(live):
        g = folded.get(group_id, FoldedGroup())
        groups.append(
            (group_id, g.group_epoch, g.assignment_epoch, g.state(), g.subscription_metadata)
        )
        for member_id, m in sorted(g.members.items()):
            members.append((group_id, member_id, *(m.get(c) for c in MEMBER_COLUMNS)))
    return {"consumer_groups": groups, "consumer_group_members": members}


def live_consumer_groups(conn: Connection) -> dict[str, list[tuple[Any, ...]]]:
    """The consumer groups' projection as it is (members but their last heartbeat)."""
    return {
        "consumer_groups": [tuple(r) for r in conn.execute(sql.LIVE_CONSUMER_GROUPS)],
        "consumer_group_members": [tuple(r) for r in conn.execute(sql.LIVE_CONSUMER_GROUP_MEMBERS)],
    }


def rebuild_consumer_groups(
    conn: Connection, now_ms: int, settings: BrokerSettings
) -> dict[str, int]:
    """Replace the consumer groups' projection with the events' fold."""
    conn.execute(sql.LOCK_CONSUMER_PROJECTIONS)
    rows = compute_consumer_groups(conn)
    conn.execute(sql.CLEAR_CONSUMER_GROUP_MEMBERS)
    for group_id, epoch, assignment_epoch, state, metadata in rows["consumer_groups"]:
        conn.execute(
            sql.SET_CONSUMER_GROUP,
            {"group_id": group_id, "group_epoch": epoch, "assignment_epoch": assignment_epoch,
             "state": state, "subscription_metadata": None if metadata is None
             else json.dumps(metadata)},
        )  # fmt: skip
    for group_id, member_id, *values in rows["consumer_group_members"]:
        row = dict(zip(MEMBER_COLUMNS, values, strict=True))
        params = {c: json.dumps(v) if c in JSON_COLUMNS and v is not None else v
                  for c, v in row.items()}  # fmt: skip
        params["subscribed_topic_names"] = json.dumps(row["subscribed_topic_names"] or [])
        conn.execute(
            sql.UPSERT_CONSUMER_MEMBER,
            {**params, "group_id": group_id, "member_id": member_id, "last_heartbeat_ms": now_ms},
        )
    return {name: len(v) for name, v in rows.items()}
