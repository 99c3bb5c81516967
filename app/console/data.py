"""What each page shows, read in one connection per page and filtered by the ACLs.

Pure reads (the one action, KIP-664's abort, is the admin's: ``web``). ``broker`` carries
the logged-in user's principal, so ``app.security``'s authorizer decides as it does for
``kip98 serve``'s requests: Describe on a topic, a transactional id or a group to see it.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from typing import Any

from kio.schema.consumer_protocol_assignment.v0.data import ConsumerProtocolAssignment
from kio.serial import entity_reader
from sqlalchemy import Connection

from app.console import series as console_series
from app.console import sql
from app.coordinator.inspect import list_transactions
from app.groups import sql as groups_sql
from app.groups.membership import offsets_only
from app.log import sql as log_sql
from app.log.inspect import find_hanging
from app.security import needs
from app.security.authorizer import denied_checks
from app.security.rules import DESCRIBE, GROUP, TOPIC, TRANSACTIONAL_ID, Check, cluster_check
from app.storage.context import BrokerContext

# The record browser's page size: its default and the most one page shows.
DEFAULT_LIMIT = 100
MAX_LIMIT = 1000
ISOLATIONS = ("read_committed", "read_uncommitted")
# A classic consumer's assignment: a 2-byte version, then the v0 body (later versions
# only add fields at the end).
_ASSIGNMENT_READER = entity_reader(ConsumerProtocolAssignment)
# Kafka's control record types (ControlRecordType): 0 ABORT, 1 COMMIT.
_CONTROL = {0: "ABORT", 1: "COMMIT"}


class NotFound(Exception):
    """The page names something that does not exist (or the user may not see)."""


class Forbidden(Exception):
    """The user's ACLs do not allow this."""


def visible(
    conn: Connection, broker: BrokerContext, resource_type: str, names: Iterable[str]
) -> list[str]:
    """The names the user may Describe, in the order given (one ACL query)."""
    names = list(names)
    refused = denied_checks(conn, broker, [Check(DESCRIBE, resource_type, n) for n in names])
    out = {c.name for c in refused}
    return [n for n in names if n not in out]


def may_abort(conn: Connection, broker: BrokerContext, topic: str) -> bool:
    """Whether the user may abort a hanging transaction on ``topic``: what the abort
    itself asks of the ACLs (``needs.abort_hanging``), so the button shows only then."""
    return not denied_checks(conn, broker, needs.abort_hanging(topic))


def may_delete_records(conn: Connection, broker: BrokerContext, topic: str) -> bool:
    """Whether the user may delete a partition's records below an offset: Delete on the
    topic, as Kafka's DeleteRecords asks (``needs.delete_records``)."""
    return not denied_checks(conn, broker, needs.delete_records(topic))


def _topic_or_not_found(conn: Connection, broker: BrokerContext, topic: str) -> None:
    """Unknown and not-allowed look alike to a user without Describe (as Kafka's Metadata
    answers UNKNOWN_TOPIC_OR_PARTITION... it answers TOPIC_AUTHORIZATION_FAILED: so 403)."""
    if conn.execute(log_sql.TOPIC_EXISTS, {"topic": topic}).first() is None:
        raise NotFound(f"no topic {topic!r}")
    if not visible(conn, broker, TOPIC, [topic]):
        raise Forbidden(f"not authorized to Describe topic {topic!r}")


def _jsonable(v: Any) -> Any:
    return v.isoformat() if hasattr(v, "isoformat") else v


def _rows(result: Any) -> list[dict[str, Any]]:
    return [{k: _jsonable(v) for k, v in r._mapping.items()} for r in result]


def overview(broker: BrokerContext) -> dict[str, Any]:
    now_ms = broker.clock.now_ms()
    with broker.engine.connect() as conn:
        topics = visible(conn, broker, TOPIC, [r.topic for r in conn.execute(sql.TOPICS)])
        partitions = _rows(conn.execute(sql.PARTITION_STATUS, {"topics": topics}))
        groups = visible(
            conn, broker, GROUP, [r.group_id for r in conn.execute(groups_sql.GROUP_IDS)]
        )
        open_txns = _rows(conn.execute(sql.OPEN_TRANSACTIONS))
        ids = [t["transactional_id"] for t in open_txns]
        shown = set(visible(conn, broker, TRANSACTIONAL_ID, ids))
        open_txns = [t for t in open_txns if t["transactional_id"] in shown]
        # The nodes, the database and the cluster-wide charts: for those who may Describe
        # the cluster (everyone with authorization off).
        cluster = not denied_checks(conn, broker, [cluster_check(DESCRIBE)])
        nodes = _rows(conn.execute(sql.CLUSTER_NODES)) if cluster else []
        leases = _rows(conn.execute(sql.COORDINATOR_LEASES)) if cluster else []
        standby = bool(conn.execute(sql.IN_RECOVERY).scalar())
        standbys = [] if standby or not cluster else _rows(conn.execute(sql.STANDBYS))
        series = console_series.read(conn, now_ms) if cluster else {}
    oldest = open_txns[0]["started_at"] if open_txns else None
    oldest_ms = open_txns[0]["started_ms"] if open_txns else None
    busiest = sorted(
        partitions, key=lambda p: p["high_watermark"] - p["last_stable_offset"], reverse=True
    )[:5]
    return {
        "now_ms": now_ms,
        "cluster": cluster,
        "series": series,
        "nodes": nodes,
        "leases": [x for x in leases if x["expires_ms"] > now_ms],
        "database": {"role": "standby" if standby else "primary", "standbys": standbys},
        "topics": len(topics),
        "partitions": len(partitions),
        "groups": len(groups),
        "open_transactions": len(open_txns),
        "oldest_open_transaction": oldest,
        "oldest_open_transaction_age_ms": None if oldest_ms is None else max(now_ms - oldest_ms, 0),
        "lso_lag": [
            {
                "topic": p["topic"],
                "partition": p["partition"],
                "lag": p["high_watermark"] - p["last_stable_offset"],
            }
            for p in busiest
        ],
    }


def estimated_bytes(log_bytes: int, log_offsets: int, offsets: int) -> int:
    """A topic's or a partition's size, estimated: the log's size on disk shared out by
    the offsets each spans (high watermark less log start). Exact for records of one size;
    compacted or deleted records still count in the span until the log start moves."""
    if log_offsets <= 0 or offsets <= 0:
        return 0
    return log_bytes * offsets // log_offsets


def log_size(conn: Connection, broker: BrokerContext) -> tuple[int | None, int, int]:
    """The log's size on disk, the offsets all partitions span (which share it out), and
    the size for this user: None unless they may Describe the cluster, since it sums
    topics they may not see (a topic's estimate is for those who may Describe it)."""
    row = conn.execute(sql.LOG_SIZE).one()
    total, offsets = int(row.bytes or 0), int(row.offsets or 0)
    shown = None if denied_checks(conn, broker, [cluster_check(DESCRIBE)]) else total
    return shown, total, offsets


def _with_sizes(partitions: list[dict[str, Any]], total: int, offsets: int) -> None:
    for p in partitions:
        p["estimated_bytes"] = estimated_bytes(
            total, offsets, p["high_watermark"] - p["log_start_offset"]
        )


def topics(broker: BrokerContext) -> dict[str, Any]:
    with broker.engine.connect() as conn:
        names = visible(conn, broker, TOPIC, [r.topic for r in conn.execute(sql.TOPICS)])
        partitions = _rows(conn.execute(sql.PARTITION_STATUS, {"topics": names}))
        size, total, offsets = log_size(conn, broker)
    _with_sizes(partitions, total, offsets)
    by_topic: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    for p in partitions:
        by_topic[p["topic"]].append(p)
    return {
        "topics": [
            {
                "topic": n,
                "partitions": len(ps),
                "high_watermark": sum(p["high_watermark"] for p in ps),
                "open_transactions": sum(p["open_transactions"] for p in ps),
                "estimated_bytes": sum(p["estimated_bytes"] for p in ps),
            }
            for n, ps in by_topic.items()
        ],
        "log_bytes": size,
    }


def topic(
    broker: BrokerContext,
    name: str,
    partition: int,
    offset: int | None,
    limit: int,
    isolation: str,
    timestamp: int | None = None,
) -> dict[str, Any]:
    """A topic's partitions and configs, and one page of a partition's records as stored:
    markers shown, records of aborted transactions and of still-open ones marked; under
    read_committed only what a read_committed consumer gets (below the LSO, no aborted
    record), markers still shown."""
    committed = isolation == "read_committed"
    with broker.engine.connect() as conn:
        _topic_or_not_found(conn, broker, name)
        config = conn.execute(sql.TOPIC_CONFIG, {"topic": name}).scalar() or {}
        size, total, offsets = log_size(conn, broker)
        partitions = _rows(conn.execute(sql.PARTITION_STATUS, {"topics": [name]}))
        _with_sizes(partitions, total, offsets)
        look = conn.execute(
            log_sql.PARTITION_FOR_FETCH,
            {
                "topic": name,
                "partition": partition,
                "read_committed": True,
                "from_offset": max(offset or 0, 0),
                "max_records": limit,
                "record_overhead": 0,
            },
        ).first()
        if look is None:
            raise NotFound(f"no partition {partition} in topic {name!r}")
        hw, log_start, lso = look.next_offset, look.log_start_offset, look.last_stable_offset
        if timestamp is not None:
            found = conn.execute(
                log_sql.OFFSET_FOR_TIMESTAMP,
                {
                    "topic": name,
                    "partition": partition,
                    "timestamp": timestamp,
                    "log_start": log_start,
                    "upper": hw,
                },
            ).first()
            offset = hw if found is None else found.offset
        upper = lso if committed else hw
        start = max(log_start, upper - limit) if offset is None else max(log_start, offset)
        if offset is None or timestamp is not None:
            look = conn.execute(
                log_sql.PARTITION_FOR_FETCH,
                {
                    "topic": name,
                    "partition": partition,
                    "read_committed": True,
                    "from_offset": start,
                    "max_records": limit,
                    "record_overhead": 0,
                },
            ).first()
        end = max(start, min(start + limit, upper))
        if look is None:  # the topic was deleted meanwhile
            raise NotFound(f"no partition {partition} in topic {name!r}")
        rows = conn.exec_driver_sql(
            log_sql.FETCH_LOG_EVERY_BATCH,
            {"topic": name, "partition": partition, "from_offset": start, "to_offset": end},
        ).all()
    aborted = list(
        zip(look.producer_ids or [], look.first_offsets or [], look.last_offsets or [], strict=True)
    )
    records = []
    for r in rows:
        pid, epoch, _seq, is_txn, is_control, control_type, _ce = r[6]
        if is_control:
            status = f"marker {_CONTROL.get(control_type, control_type)}"
        elif not is_txn:
            status = ""
        elif any(a[0] == pid and a[1] <= r[0] <= a[2] for a in aborted):
            status = "aborted"
        elif r[0] >= lso:
            status = "open"
        else:
            status = "committed"
        if committed and status == "aborted":
            continue
        records.append(
            {
                "offset": r[0],
                "timestamp": r[1],
                "key": _text(r[2]),
                "value": _text(r[3]),
                "producer_id": pid,
                "producer_epoch": epoch,
                "status": status,
            }
        )
    return {
        "topic": name,
        "config": config,
        "partitions": partitions,
        "estimated_bytes": sum(p["estimated_bytes"] for p in partitions),
        "partition": partition,
        "isolation": isolation,
        "log_start_offset": log_start,
        "high_watermark": hw,
        "last_stable_offset": lso,
        "from_offset": start,
        "next_offset": end,
        "limit": limit,
        "records": records,
        "log_bytes": size,
    }


def _text(b: bytes | None) -> str | None:
    if b is None:
        return None
    s = bytes(b)[:512].decode("utf-8", errors="replace")
    return s if len(b) <= 512 else s + "…"


def transactions(broker: BrokerContext) -> dict[str, Any]:
    described = list_transactions(broker)
    hanging = find_hanging(broker)
    with broker.engine.connect() as conn:
        ids = set(visible(conn, broker, TRANSACTIONAL_ID, [d.transactional_id for d in described]))
        topics_seen = set(visible(conn, broker, TOPIC, sorted({h.topic for h in hanging})))
    return {
        "transactions": [
            {
                "transactional_id": d.transactional_id,
                "producer_id": d.producer_id,
                "producer_epoch": d.producer_epoch,
                "state": d.state,
                "partitions": [list(p) for p in d.partitions],
                "txn_start_ms": d.txn_start_ms,
                "updated_ms": d.updated_ms,
            }
            for d in described
            if d.transactional_id in ids
        ],
        "hanging": [
            {
                "topic": h.topic,
                "partition": h.partition,
                "producer_id": h.producer_id,
                "producer_epoch": h.producer_epoch,
                "start_offset": h.start_offset,
                "started_at": _jsonable(h.started_at),
            }
            for h in hanging
            if h.topic in topics_seen
        ],
    }


def transaction(broker: BrokerContext, tid: str) -> dict[str, Any]:
    """A transactional id's timeline: every event of the coordinator's log (state,
    epoch, partitions) and the markers its producer ids wrote on those partitions."""
    with broker.engine.connect() as conn:
        events = _rows(conn.execute(sql.TXN_EVENTS, {"tid": tid, "limit": 10_000}))
        if not events:
            raise NotFound(f"no transactional id {tid!r}")
        if not visible(conn, broker, TRANSACTIONAL_ID, [tid]):
            raise Forbidden(f"not authorized to Describe transactional id {tid!r}")
        pids = sorted({e["producer_id"] for e in events})
        topics_all = sorted({t for e in events for t, _p in e["partitions"]})
        shown = visible(conn, broker, TOPIC, topics_all)
        markers = _rows(
            conn.execute(sql.MARKERS_OF, {"pids": pids, "topics": shown, "limit": 10_000})
        )
    added: set[tuple[str, int]] = set()
    for e in events:
        now = {(t, p) for t, p in e["partitions"]}
        e["added_partitions"] = sorted(now - added)
        e["partitions"] = [[t, p] for t, p in e["partitions"] if t in shown]
        e["added_partitions"] = [[t, p] for t, p in e["added_partitions"] if t in shown]
        added = now if e["state"] == "BEGIN" else set()
    for m in markers:
        m["control_type"] = _CONTROL.get(m["control_type"], m["control_type"])
    state = events[-1]["state"]
    epochs = epoch_changes(events)
    kinds = {c["event_id"]: c["kind"] for c in epochs}
    for e in events:
        e["epoch_change"] = kinds.get(e["event_id"])
    return {
        "transactional_id": tid,
        "state": state,
        "events": events,
        "markers": markers,
        "epochs": epochs,
    }


def epoch_changes(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The producer-id/epoch transitions in a transactional id's events (oldest first):
    its first producer id, then every event whose (producer id, epoch) differs from the
    one before. A change that aborts an open (``BEGIN``) transaction is a ``fence`` (a
    second instance's InitProducerId, a timeout: the holder of the old epoch is cut off
    mid-transaction); any other is an ``epoch bump`` (a new producer id when the epoch
    ran out), which fences an idle holder of the old epoch all the same."""
    out: list[dict[str, Any]] = []
    prev: dict[str, Any] | None = None
    for e in events:
        ident = (e["producer_id"], e["producer_epoch"])
        if prev is None:
            kind = "new producer id"
        elif ident == (prev["producer_id"], prev["producer_epoch"]):
            prev = e
            continue
        elif prev["state"] == "BEGIN":
            kind = "fence"
        elif e["producer_id"] != prev["producer_id"]:
            kind = "new producer id"
        else:
            kind = "epoch bump"
        out.append(
            {
                "event_id": e["event_id"],
                "updated_ms": e["updated_ms"],
                "kind": kind,
                "producer_id": e["producer_id"],
                "producer_epoch": e["producer_epoch"],
                "previous": None if prev is None else [prev["producer_id"], prev["producer_epoch"]],
                "state": e["state"],
                "reason": e.get("reason"),
            }
        )
        prev = e
    return out


def producers(broker: BrokerContext) -> dict[str, Any]:
    """Per partition, the producers the log keeps state for (as DescribeProducers)."""
    with broker.engine.connect() as conn:
        names = visible(conn, broker, TOPIC, [r.topic for r in conn.execute(sql.TOPICS)])
        out = []
        for p in _rows(conn.execute(sql.PARTITION_STATUS, {"topics": names})):
            for s in conn.execute(
                log_sql.DESCRIBE_PRODUCERS, {"topic": p["topic"], "partition": p["partition"]}
            ):
                out.append(
                    {
                        "topic": p["topic"],
                        "partition": p["partition"],
                        "producer_id": s.producer_id,
                        "producer_epoch": s.producer_epoch,
                        "last_sequence": s.last_sequence,
                        "last_timestamp": s.last_timestamp,
                        "coordinator_epoch": s.coordinator_epoch,
                        "current_txn_start_offset": s.txn_first_offset,
                    }
                )
        # Each producer id's transactional id (its epochs and fences are on that id's
        # page), for the ids the user may Describe.
        pids = sorted({p["producer_id"] for p in out})
        owners = {
            r.producer_id: r.transactional_id
            for r in conn.execute(sql.TRANSACTIONAL_IDS_OF, {"pids": pids})
        }
        shown = set(visible(conn, broker, TRANSACTIONAL_ID, sorted(set(owners.values()))))
    for p in out:
        tid = owners.get(p["producer_id"])
        p["transactional_id"] = tid if tid in shown else None
    return {"producers": out}


def groups(broker: BrokerContext) -> dict[str, Any]:
    with broker.engine.connect() as conn:
        rows = {r["group_id"]: r for r in _rows(conn.execute(groups_sql.ALL_GROUPS))}
        # A group that only holds offsets has no membership row; Kafka lists it, Empty
        # (the rule ListGroups follows: app.groups.membership.offsets_only).
        for group_id in conn.execute(groups_sql.GROUPS_HOLDING_OFFSETS).scalars():
            rows.setdefault(
                group_id,
                {"group_id": group_id, "state": "Empty", "generation_id": 0, "protocol": None},
            )
        ids = sorted(rows)
        seen = set(visible(conn, broker, GROUP, ids))
    return {"groups": [rows[g] for g in ids if g in seen]}


def group(broker: BrokerContext, group_id: str) -> dict[str, Any]:
    with broker.engine.connect() as conn:
        row = conn.execute(groups_sql.GROUPS, {"group_ids": [group_id]}).first()
        if row is None and not offsets_only(conn, group_id):
            raise NotFound(f"no group {group_id!r}")
        if not visible(conn, broker, GROUP, [group_id]):
            raise Forbidden(f"not authorized to Describe group {group_id!r}")
        members = [
            {
                "member_id": m.member_id,
                "group_instance_id": m.group_instance_id,
                "client_id": m.client_id,
                "client_host": m.client_host,
                "generation_id": m.generation_id,
                "assignment": assigned(m.assignment, m.member_assignment),
            }
            for m in conn.execute(groups_sql.MEMBERS, {"group_id": group_id})
        ]
        lag = _rows(conn.execute(sql.GROUP_LAG, {"group_id": group_id}))
        topics_named = {r["topic"] for r in lag} | {t for m in members for t, _p in m["assignment"]}
        shown = set(visible(conn, broker, TOPIC, sorted(topics_named)))
        pending = _rows(conn.execute(groups_sql.PENDING_FOR_GROUP, {"group_id": group_id}))
    for m in members:  # a partition of a topic the user may not see is left out
        m["assignment"] = [[t, p] for t, p in m["assignment"] if t in shown]
    return {
        "group": {k: _jsonable(v) for k, v in row._mapping.items()}
        if row is not None
        else {"group_id": group_id, "state": "Empty", "generation_id": 0},
        "members": members,
        "offsets": [
            {**r, "lag_to_lso": max(r["last_stable_offset"] - r["committed_offset"], 0)}
            for r in lag
            if r["topic"] in shown
        ],
        "pending_transactional_offsets": [p for p in pending if p["topic"] in shown],
    }


def assigned(native: Any, classic: bytes | None) -> list[tuple[str, int]]:
    """A member's partitions: a native (KIP-848 or in-process) member's as stored, a
    classic consumer's decoded from the leader's ConsumerProtocolAssignment (empty for
    another protocol type's bytes or bytes that do not decode)."""
    if native:
        return sorted((str(t), int(p)) for t, p in native)
    if not classic:
        return []
    try:
        decoded, _ = _ASSIGNMENT_READER(bytes(classic), 2)
    except Exception:  # kio raises several kinds on bytes of another protocol
        return []
    return sorted((tp.topic, int(p)) for tp in decoded.assigned_partitions for p in tp.partitions)


def now_ms() -> int:
    return int(time.time() * 1000)
