"""Broker-side settings (Kafka's broker configs that apply to this library-broker).

Read once from ``KIP98_*`` environment variables so every process sharing a database can be
configured alike; tests construct them directly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, fields

from app.errors import KafkaError, fail


@dataclass(frozen=True)
class BrokerSettings:
    # Idle producer state is forgotten after this long (Kafka: producer.id.expiration.ms).
    producer_id_expiration_ms: int = 86_400_000
    # Upper bound for a client's transaction.timeout.ms (Kafka: transaction.max.timeout.ms).
    max_transaction_timeout_ms: int = 900_000
    # Idle transactional ids expire after this long (Kafka: transactional.id.expiration.ms).
    transactional_id_expiration_ms: int = 604_800_000
    # Transaction-log partitions: the unit of coordinator leases (Kafka: 50).
    transaction_log_partitions: int = 16
    # How long a coordinator lease lasts without renewal.
    coordinator_lease_ms: int = 10_000
    # How often a coordinator loop looks for timed-out transactions and expired ids.
    coordinator_interval_ms: int = 1_000
    # How often coordinator loops run the log cleaner (retention and compaction) over the
    # partitions their leases cover; 0 turns background cleaning off (``kip98 topics clean``
    # still works). Kafka: log.retention.check.interval.ms / log.cleaner.backoff.ms.
    log_cleaner_interval_ms: int = 30_000
    # Records below a new log start are deleted this many offsets per transaction, so a
    # large retention pass never holds one long transaction.
    log_cleaner_delete_slice: int = 20_000
    # Largest record batch a partition accepts (Kafka: message.max.bytes, broker side).
    message_max_bytes: int = 1_048_588
    # Whether transactional clients run a coordinator loop thread (1) or leave the work to
    # a dedicated ``kip98 coordinator run`` (0).
    client_coordinator_loop: int = 1
    # Whether ``kip98 serve`` runs the coordinator loop (transaction timeouts, roll-forward,
    # id and producer expiry, the log cleaner) as Kafka's brokers run their coordinators'
    # timers (1), or leaves it to the clients' loops or ``kip98 coordinator run`` (0).
    serve_coordinator_loop: bool = True
    # Whether a database named by KIP98_DATABASE_URL is migrated to the newest schema by
    # whatever uses it (1), as the embedded one always is, or only by ``kip98 db migrate``.
    auto_migrate: bool = False
    # Rows one fetch reads at most per partition (bounds memory; fetch.max.bytes bounds bytes).
    fetch_max_records: int = 2_000
    # Whether requests are checked against the ACLs in ``acls`` (1) or not (0, Kafka's
    # default without an authorizer). See docs/security.md.
    authorization: int = 0
    # Principals allowed everything, comma-separated (Kafka: super.users, ';'-separated).
    super_users: str = "User:admin"
    # Bounds on every database session of this process (docs/design.md rule 24). A lock
    # wait gives up before Kafka's default request.timeout.ms (30 s) would; a session left
    # idle inside a transaction (its process paused or gone) is ended by PostgreSQL well
    # before that, releasing the partition locks it held; no statement runs longer than a
    # request may take. 0 lifts a bound. ``kip98 db rebuild`` and the cleaner's compaction
    # lift the statement bound for their own transaction; migrations and the Spark
    # materialisation open engines of their own, without these bounds.
    db_lock_timeout_ms: int = 20_000
    db_statement_timeout_ms: int = 30_000
    db_idle_in_transaction_timeout_ms: int = 10_000
    # A peer that vanished without closing the socket (host down, network cut) is noticed
    # by TCP keepalives and an unacknowledged write after this long.
    db_tcp_user_timeout_ms: int = 30_000
    # Whether a Metadata request that allows it creates the unknown topics it names, with
    # ``num_partitions`` partitions (Kafka: auto.create.topics.enable, num.partitions); the
    # native Producer asks for it, and a Consumer with allow.auto.create.topics.
    auto_create_topics: bool = True
    num_partitions: int = 1
    # How long the first rebalance of an empty group waits for more members, each new one
    # extending the wait up to the rebalance timeout (Kafka:
    # group.initial.rebalance.delay.ms, KIP-134).
    group_initial_rebalance_delay_ms: int = 3_000
    # The session timeouts a JoinGroup may ask for; outside them it is
    # INVALID_SESSION_TIMEOUT (Kafka: group.min.session.timeout.ms,
    # group.max.session.timeout.ms, with Kafka's defaults).
    group_min_session_timeout_ms: int = 6_000
    group_max_session_timeout_ms: int = 1_800_000
    # The longest metadata an offset commit may carry (Kafka: offset.metadata.max.bytes,
    # counted as Kafka counts it, in UTF-16 code units); longer is OFFSET_METADATA_TOO_LARGE.
    offset_metadata_max_bytes: int = 4_096
    # KIP-848 consumer groups (Kafka: group.consumer.session.timeout.ms,
    # group.consumer.heartbeat.interval.ms, group.consumer.assignors, the first the default).
    group_consumer_session_timeout_ms: int = 45_000
    group_consumer_heartbeat_interval_ms: int = 5_000
    group_consumer_assignors: str = "uniform,range"
    # KIP-848's online conversion between the classic and the consumer protocol (Kafka:
    # group.consumer.migration.policy): bidirectional, upgrade, downgrade or disabled.
    group_consumer_migration_policy: str = "bidirectional"
    # Feature levels advertised below the highest served, as Kafka's ``kafka-features``
    # downgrade sets them: ``name=level`` pairs, comma-separated (``group.version=0``).
    features: str = ""

    # How long a ``kip98 serve`` node stays in the cluster without a heartbeat: a node
    # killed outright drops out of Metadata (and its partitions' leadership moves) once
    # this has passed since its last one. It heartbeats at most a second apart.
    node_session_timeout_ms: int = 6_000

    @classmethod
    def from_env(cls) -> BrokerSettings:
        values: dict[str, int | str | bool] = {}
        for field in fields(cls):
            raw = os.environ.get(f"KIP98_{field.name.upper()}")
            if raw is None:
                continue
            if field.type in (str, "str"):
                values[field.name] = raw
            elif field.type in (bool, "bool"):
                values[field.name] = _boolean(field.name, raw)
            else:
                values[field.name] = _integer(field.name, raw)
        return cls(**values)  # type: ignore[arg-type]

    @property
    def initial_rebalance_delay_s(self) -> float:
        return self.group_initial_rebalance_delay_ms / 1000.0

    @property
    def super_user_set(self) -> frozenset[str]:
        return frozenset(p.strip() for p in self.super_users.split(",") if p.strip())


def _integer(name: str, raw: str) -> int:
    """A setting's integer value; a typo names the variable instead of a bare int() error."""
    try:
        value = int(raw)
    except ValueError:
        value = -1
    if value < 0:
        raise fail(
            KafkaError._INVALID_ARG,
            f"KIP98_{name.upper()} must be a non-negative integer, got {raw!r}",
        )
    return value


def _boolean(name: str, raw: str) -> bool:
    """A switch: true/false (Kafka's spelling), or 1/0."""
    value = {"true": True, "1": True, "false": False, "0": False}.get(raw.strip().lower())
    if value is None:
        raise fail(
            KafkaError._INVALID_ARG, f"KIP98_{name.upper()} must be true or false, got {raw!r}"
        )
    return value
