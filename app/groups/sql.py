"""Every SQL statement of the group family (offset_commit_log, group_offsets,
pending_txn_offsets), in one place."""

from __future__ import annotations

from sqlalchemy import text

# The COMMIT marker's effect on a producer's pending offsets: log it, then make them
# the group's committed offsets.
LOG_PENDING_OUTCOME = text(
    """
    INSERT INTO offset_commit_log (group_id, topic, partition, kind, committed_offset, metadata,
                                   producer_id, producer_epoch, commit_ms, committed_leader_epoch)
    SELECT group_id, topic, partition, :kind, committed_offset, metadata, producer_id,
           producer_epoch, :now, committed_leader_epoch
    FROM pending_txn_offsets WHERE producer_id = :producer_id
    ORDER BY group_id, topic, partition
    """
)
APPLY_PENDING = text(
    """
    INSERT INTO group_offsets (group_id, topic, partition, committed_offset, metadata, commit_ms,
                               committed_leader_epoch)
    SELECT group_id, topic, partition, committed_offset, metadata, :now, committed_leader_epoch
    FROM pending_txn_offsets WHERE producer_id = :producer_id
    ORDER BY group_id, topic, partition
    ON CONFLICT (group_id, topic, partition) DO UPDATE SET
        committed_offset = EXCLUDED.committed_offset, metadata = EXCLUDED.metadata,
        commit_ms = EXCLUDED.commit_ms, committed_leader_epoch = EXCLUDED.committed_leader_epoch
    """
)
DROP_PENDING = text("DELETE FROM pending_txn_offsets WHERE producer_id = :producer_id")

# A deleted topic's offsets, committed and pending (Kafka writes their tombstones to
# __consumer_offsets): one 'delete' event per group and partition, then the rows go.
LOG_TOPIC_OFFSETS_DELETED = text(
    """
    INSERT INTO offset_commit_log (group_id, topic, partition, kind, commit_ms)
    SELECT group_id, topic, partition, 'delete', :now
    FROM (SELECT group_id, topic, partition FROM group_offsets WHERE topic = :t
          UNION SELECT group_id, topic, partition FROM pending_txn_offsets WHERE topic = :t) o
    ORDER BY group_id, partition
    """
)
DELETE_TOPIC_OFFSETS = (
    text("DELETE FROM group_offsets WHERE topic = :t"),
    text("DELETE FROM pending_txn_offsets WHERE topic = :t"),
)

# ---------------------------------------------------------------- deletion (``app.groups.deletion``)

# A group's row locked, if it has one (a group known only by its offsets has none).
LOCK_EXISTING_GROUP = text(
    "SELECT group_id, generation_id, state, protocol, protocol_type, leader_id, "
    "rebalance_started_ms, join_deadline_ms, group_type FROM consumer_groups "
    "WHERE group_id = :group_id FOR UPDATE"
)
GROUP_OFFSETS_HELD = text(
    """
    SELECT EXISTS (SELECT 1 FROM group_offsets WHERE group_id = :group_id) AS committed,
           EXISTS (SELECT 1 FROM pending_txn_offsets WHERE group_id = :group_id) AS pending
    """
)
# Groups known only by their offsets (committed, or pending in a transaction) and no
# membership row: Kafka describes and lists them, Empty (``membership.offsets_only``).
GROUPS_HOLDING_OFFSETS = text(
    "SELECT group_id FROM group_offsets UNION SELECT group_id FROM pending_txn_offsets"
)
# Committed offsets forgotten by an admin (OffsetDelete, DeleteGroups): one
# 'offset_delete' event each, then the rows. Pending transactional ones are not touched.
LOG_OFFSETS_DELETED = text(
    """
    INSERT INTO offset_commit_log (group_id, topic, partition, kind, commit_ms)
    SELECT group_id, topic, partition, 'offset_delete', :now FROM group_offsets
    WHERE group_id = :group_id
      AND (CAST(:topics AS text[]) IS NULL OR (topic, partition) IN
           (SELECT * FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]))))
    ORDER BY topic, partition
    """
)
DELETE_OFFSETS = text(
    """
    DELETE FROM group_offsets
    WHERE group_id = :group_id
      AND (CAST(:topics AS text[]) IS NULL OR (topic, partition) IN
           (SELECT * FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]))))
    """
)
DELETE_GROUP = text("DELETE FROM consumer_groups WHERE group_id = :group_id")

# ---------------------------------------------------------------- offsets

# The partitions an offset commit names that exist, held FOR KEY SHARE until it commits:
# a DeleteTopics (which locks them FOR UPDATE first) then waits for the commit and
# deletes its offsets too, or the commit waits for the deletion and finds them gone (rule
# 31). An append's FOR UPDATE on a partition also holds a commit of its offsets back for
# the append's DB transaction, and the other way round; both are short.
EXISTING_PARTITIONS = text(
    "SELECT topic, partition FROM partitions WHERE (topic, partition) IN "
    "(SELECT * FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]))) "
    'ORDER BY topic COLLATE "C", partition FOR KEY SHARE'
)
LOG_COMMITS = text(
    """
    INSERT INTO offset_commit_log (group_id, topic, partition, kind, committed_offset, metadata,
                                   producer_id, producer_epoch, commit_ms, committed_leader_epoch)
    SELECT :group_id, t, p, :kind, o, m, :producer_id, :producer_epoch, :now, e
    FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]), CAST(:offsets AS bigint[]),
                CAST(:metadata AS bytea[]), CAST(:leader_epochs AS int[])) AS u(t, p, o, m, e)
    """
)
UPSERT_COMMITTED = text(
    """
    INSERT INTO group_offsets (group_id, topic, partition, committed_offset, metadata, commit_ms,
                               committed_leader_epoch)
    SELECT :group_id, t, p, o, m, :now, e
    FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]), CAST(:offsets AS bigint[]),
                CAST(:metadata AS bytea[]), CAST(:leader_epochs AS int[])) AS u(t, p, o, m, e)
    ORDER BY t, p
    ON CONFLICT (group_id, topic, partition) DO UPDATE SET
        committed_offset = EXCLUDED.committed_offset, metadata = EXCLUDED.metadata,
        commit_ms = EXCLUDED.commit_ms, committed_leader_epoch = EXCLUDED.committed_leader_epoch
    """
)
UPSERT_PENDING = text(
    """
    INSERT INTO pending_txn_offsets (group_id, topic, partition, producer_id, producer_epoch,
                                     committed_offset, metadata, commit_ms, committed_leader_epoch)
    SELECT :group_id, t, p, :producer_id, :producer_epoch, o, m, :now, e
    FROM unnest(CAST(:topics AS text[]), CAST(:partitions AS int[]), CAST(:offsets AS bigint[]),
                CAST(:metadata AS bytea[]), CAST(:leader_epochs AS int[])) AS u(t, p, o, m, e)
    ORDER BY t, p
    ON CONFLICT (group_id, topic, partition, producer_id) DO UPDATE SET
        producer_epoch = EXCLUDED.producer_epoch, committed_offset = EXCLUDED.committed_offset,
        metadata = EXCLUDED.metadata, commit_ms = EXCLUDED.commit_ms,
        committed_leader_epoch = EXCLUDED.committed_leader_epoch
    """
)
FETCH_COMMITTED = text(
    "SELECT topic, partition, committed_offset, metadata, committed_leader_epoch "
    "FROM group_offsets WHERE group_id = :group_id"
)
PENDING_FOR_GROUP = text(
    "SELECT DISTINCT topic, partition FROM pending_txn_offsets WHERE group_id = :group_id"
)

# ---------------------------------------------------------------- membership

ENSURE_GROUP = text(
    "INSERT INTO consumer_groups (group_id) VALUES (:group_id) ON CONFLICT DO NOTHING"
)
_GROUP_COLUMNS = (
    "group_id, generation_id, state, protocol, protocol_type, leader_id, rebalance_started_ms, "
    "join_deadline_ms, group_type"
)
LOCK_GROUP = text(
    f"SELECT {_GROUP_COLUMNS} FROM consumer_groups WHERE group_id = :group_id FOR UPDATE"
)
SHARE_GROUP = text(
    f"SELECT {_GROUP_COLUMNS} FROM consumer_groups WHERE group_id = :group_id FOR SHARE"
)
GROUPS = text(
    f"SELECT {_GROUP_COLUMNS} FROM consumer_groups WHERE group_id = ANY(:group_ids)"
    " ORDER BY group_id"
)
ALL_GROUPS = text(f"SELECT {_GROUP_COLUMNS} FROM consumer_groups ORDER BY group_id")
MEMBERS = text(
    "SELECT member_id, group_instance_id, client_id, client_host, generation_id, topics, "
    "assignment, "
    "protocol_names, protocol_metadata, member_assignment, session_timeout_ms, "
    "rebalance_timeout_ms, last_heartbeat_ms, joined_ms "
    "FROM group_members WHERE group_id = :group_id ORDER BY member_id"
)
# Past their session timeout; or, while a rebalance runs, past their rebalance timeout
# without having rejoined it.
EXPIRE_MEMBERS = text(
    """
    DELETE FROM group_members m USING consumer_groups g
    WHERE m.group_id = :group_id AND g.group_id = m.group_id
      AND (m.last_heartbeat_ms + m.session_timeout_ms < :now
           OR (g.state = 'PreparingRebalance' AND m.generation_id < g.generation_id
               AND g.rebalance_started_ms + m.rebalance_timeout_ms < :now))
    RETURNING m.member_id
    """
)
UPSERT_MEMBER = text(
    """
    INSERT INTO group_members (group_id, member_id, group_instance_id, client_id, client_host,
                               generation_id, topics, protocol_names, protocol_metadata,
                               session_timeout_ms, rebalance_timeout_ms, last_heartbeat_ms,
                               joined_ms)
    VALUES (:group_id, :member_id, :group_instance_id, :client_id, :client_host, :generation_id,
            CAST(:topics AS jsonb), :protocol_names, :protocol_metadata, :session_timeout_ms,
            :rebalance_timeout_ms, :now, :now)
    ON CONFLICT (group_id, member_id) DO UPDATE SET
        generation_id = EXCLUDED.generation_id, topics = EXCLUDED.topics,
        protocol_names = EXCLUDED.protocol_names, protocol_metadata = EXCLUDED.protocol_metadata,
        session_timeout_ms = EXCLUDED.session_timeout_ms,
        rebalance_timeout_ms = EXCLUDED.rebalance_timeout_ms,
        last_heartbeat_ms = EXCLUDED.last_heartbeat_ms
    """
)
# A group's new coordinator gives each of its members a full session from now, as Kafka's
# does when it loads the group: a member cannot heartbeat while its coordinator is gone.
FRESH_SESSIONS = text(
    "UPDATE group_members SET last_heartbeat_ms = GREATEST(last_heartbeat_ms, :now) "
    "WHERE group_id = ANY(:group_ids)"
)
GROUP_IDS = text("SELECT group_id FROM consumer_groups ORDER BY group_id")
HEARTBEAT = text(
    "UPDATE group_members SET last_heartbeat_ms = :now WHERE group_id = :group_id AND member_id = :member_id"
)
# KIP-394's pending members: handed an id, not joined with it yet.
ADD_PENDING_MEMBER = text(
    "INSERT INTO group_pending_members (group_id, member_id, expires_ms) "
    "VALUES (:group_id, :member_id, :expires_ms) ON CONFLICT DO NOTHING"
)
DROP_PENDING_MEMBER = text(
    "DELETE FROM group_pending_members WHERE group_id = :group_id AND member_id = :member_id"
)
EXPIRE_PENDING_MEMBERS = text(
    "DELETE FROM group_pending_members WHERE group_id = :group_id AND expires_ms < :now "
    "RETURNING member_id"
)
PENDING_MEMBERS_LEFT = text(
    "SELECT EXISTS (SELECT 1 FROM group_pending_members WHERE group_id = :group_id "
    "AND expires_ms >= :now)"
)
# KIP-345: a static member restarted into a Stable group takes its old member's place
# under its new id, with the old member's generation and assignment.
REKEY_STATIC_MEMBER = text(
    """
    UPDATE group_members SET member_id = :member_id, topics = CAST(:topics AS jsonb),
        protocol_names = :protocol_names, protocol_metadata = :protocol_metadata,
        session_timeout_ms = :session_timeout_ms, rebalance_timeout_ms = :rebalance_timeout_ms,
        last_heartbeat_ms = :now
    WHERE group_id = :group_id AND member_id = :old_member_id
    """
)
SET_LEADER_ID = text("UPDATE consumer_groups SET leader_id = :leader_id WHERE group_id = :group_id")
REPLACE_STATIC_MEMBER = text(
    "DELETE FROM group_members WHERE group_id = :group_id AND group_instance_id = :group_instance_id "
    "AND member_id <> :member_id RETURNING member_id"
)
DELETE_MEMBER = text(
    "DELETE FROM group_members WHERE group_id = :group_id AND member_id = :member_id"
)
SET_GROUP = text(
    "UPDATE consumer_groups SET generation_id = :generation_id, state = :state, "
    "rebalance_started_ms = :now, join_deadline_ms = :join_deadline_ms WHERE group_id = :group_id"
)
# The first rebalance of an empty group held longer for a member that just came
# (group.initial.rebalance.delay.ms).
SET_JOIN_DEADLINE = text(
    "UPDATE consumer_groups SET join_deadline_ms = :join_deadline_ms WHERE group_id = :group_id"
)
# The native (coordinator-assigned) groups with a member subscribed to a topic: a topic
# that grows rebalances them.
NATIVE_GROUPS_OF_TOPIC = text(
    """
    SELECT DISTINCT g.group_id FROM consumer_groups g
    JOIN group_members m ON m.group_id = g.group_id
    WHERE g.protocol_type IS NULL AND m.topics @> jsonb_build_array(CAST(:topic AS text))
    ORDER BY g.group_id
    """
)
# Who the group is for (its protocol type, fixed while it has members) and, per
# generation, the protocol chosen and the leader that assigns.
SET_PROTOCOL_TYPE = text(
    "UPDATE consumer_groups SET protocol_type = :protocol_type, leader_id = NULL "
    "WHERE group_id = :group_id"
)
SET_LEADER = text(
    "UPDATE consumer_groups SET protocol = :protocol, leader_id = :leader_id "
    "WHERE group_id = :group_id"
)
SET_ASSIGNMENT = text(
    "UPDATE group_members SET assignment = CAST(:assignment AS jsonb) "
    "WHERE group_id = :group_id AND member_id = :member_id"
)
# The leader's plan: every member's bytes (empty for one it left out), replaced at once.
SET_MEMBER_ASSIGNMENTS = text(
    """
    UPDATE group_members m SET member_assignment = u.bytes, assignment = CAST(u.tps AS jsonb)
    FROM unnest(CAST(:member_ids AS text[]), CAST(:assignments AS bytea[]),
                CAST(:partitions AS text[])) AS u(member_id, bytes, tps)
    WHERE m.group_id = :group_id AND m.member_id = u.member_id
    """
)
CLEAR_MEMBER_ASSIGNMENTS = text(
    "UPDATE group_members SET member_assignment = NULL, assignment = '[]'::jsonb "
    "WHERE group_id = :group_id"
)
TOPIC_PARTITIONS = text("SELECT topic, num_partitions FROM topics WHERE topic = ANY(:topics)")


# ---------------------------------------------------------------- rebuild (``app.groups.rebuild``)

OFFSET_EVENTS = text(
    "SELECT group_id, topic, partition, kind, committed_offset, metadata, producer_id, "
    "producer_epoch, commit_ms, committed_leader_epoch FROM offset_commit_log ORDER BY event_id"
)
LIVE_GROUP_OFFSETS = text(
    "SELECT group_id, topic, partition, committed_offset, metadata, commit_ms, "
    "committed_leader_epoch FROM group_offsets"
)
LIVE_PENDING_TXN_OFFSETS = text(
    "SELECT group_id, topic, partition, producer_id, producer_epoch, committed_offset, metadata, "
    "commit_ms, committed_leader_epoch FROM pending_txn_offsets"
)
LOCK_OFFSET_PROJECTIONS = text("LOCK TABLE group_offsets, pending_txn_offsets IN EXCLUSIVE MODE")
CLEAR_GROUP_OFFSETS = text("DELETE FROM group_offsets")
CLEAR_PENDING_TXN_OFFSETS = text("DELETE FROM pending_txn_offsets")
INSERT_GROUP_OFFSET = text(
    "INSERT INTO group_offsets (group_id, topic, partition, committed_offset, metadata, "
    "commit_ms, committed_leader_epoch) VALUES (:g, :t, :p, :o, :m, :ts, :e)"
)
INSERT_PENDING_TXN_OFFSET = text(
    "INSERT INTO pending_txn_offsets (group_id, topic, partition, producer_id, producer_epoch, "
    "committed_offset, metadata, commit_ms, committed_leader_epoch) "
    "VALUES (:g, :t, :p, :pid, :ep, :o, :m, :ts, :e)"
)


# ---------------------------------------------------------------- consumer groups (KIP-848, ``app.groups.consumer``)

# A consumer group's row: its group epoch is generation_id.
_CONSUMER_GROUP_COLUMNS = (
    "group_id, group_type, generation_id AS group_epoch, assignment_epoch, state, "
    "subscription_metadata"
)
LOCK_CONSUMER_GROUP = text(
    f"SELECT {_CONSUMER_GROUP_COLUMNS} FROM consumer_groups WHERE group_id = :group_id FOR UPDATE"
)
CONSUMER_GROUPS = text(
    f"SELECT {_CONSUMER_GROUP_COLUMNS} FROM consumer_groups "
    "WHERE group_id = ANY(:group_ids) AND group_type = 'consumer' ORDER BY group_id"
)
CREATE_CONSUMER_GROUP = text(
    "INSERT INTO consumer_groups (group_id, group_type, generation_id, state) "
    "VALUES (:group_id, 'consumer', 0, 'Empty') ON CONFLICT DO NOTHING"
)
# An empty classic group taken over by a consumer-protocol member, or the other way.
SET_GROUP_TYPE = text(
    "UPDATE consumer_groups SET group_type = :group_type, generation_id = 0, "
    "assignment_epoch = 0, state = 'Empty', protocol_type = NULL, leader_id = NULL, "
    "subscription_metadata = NULL WHERE group_id = :group_id"
)
SET_CONSUMER_GROUP = text(
    "UPDATE consumer_groups SET generation_id = :group_epoch, "
    "assignment_epoch = :assignment_epoch, state = :state, "
    "subscription_metadata = CAST(:subscription_metadata AS jsonb) WHERE group_id = :group_id"
)
# KIP-848's online conversion: a classic group becomes a consumer group at its
# generation (its members kept, as classic members of the consumer group), and back.
CLASSIC_TO_CONSUMER = text(
    "UPDATE consumer_groups SET group_type = 'consumer', generation_id = :group_epoch, "
    "assignment_epoch = :group_epoch, state = 'Stable', protocol_type = NULL, "
    "leader_id = NULL, join_deadline_ms = NULL, subscription_metadata = NULL "
    "WHERE group_id = :group_id"
)
DELETE_CLASSIC_MEMBERS = text("DELETE FROM group_members WHERE group_id = :group_id")
DELETE_PENDING_MEMBERS = text("DELETE FROM group_pending_members WHERE group_id = :group_id")
CONSUMER_TO_CLASSIC = text(
    "UPDATE consumer_groups SET group_type = 'classic', generation_id = :generation_id, "
    "assignment_epoch = 0, state = 'Stable', protocol = :protocol, protocol_type = 'consumer', "
    "leader_id = :leader_id, join_deadline_ms = NULL, subscription_metadata = NULL "
    "WHERE group_id = :group_id"
)
DELETE_CONSUMER_MEMBERS = text("DELETE FROM consumer_group_members WHERE group_id = :group_id")
CLASSIC_MEMBERS_LEFT = text(
    "SELECT EXISTS (SELECT 1 FROM group_members WHERE group_id = :group_id)"
)
_CONSUMER_MEMBER_COLUMNS = (
    "member_id, instance_id, rack_id, client_id, client_host, subscribed_topic_names, "
    "subscribed_topic_regex, server_assignor, rebalance_timeout_ms, member_epoch, "
    "previous_member_epoch, state, assigned, pending_revocation, target, last_heartbeat_ms, "
    "revocation_deadline_ms, joined_ms, assignment_epochs, classic_member"
)
# A member's session: a classic member's own (its JoinGroup's), else the group's.
_SESSION_MS = "COALESCE(CAST(classic_member ->> 'session_timeout_ms' AS bigint), :session_ms)"
CONSUMER_MEMBERS_IDLE = text(
    "SELECT EXISTS (SELECT 1 FROM consumer_group_members WHERE group_id = :group_id "
    f"AND last_heartbeat_ms + {_SESSION_MS} < :now)"
)
CONSUMER_GROUPS_IDLE = text(
    "SELECT DISTINCT group_id FROM consumer_group_members "
    f"WHERE last_heartbeat_ms + {_SESSION_MS} < :now ORDER BY group_id"
)
# The consumer groups with a member past its session or its revocation deadline: the
# coordinator's timers remove them (consumer.expire_sessions).
CONSUMER_GROUPS_TIMED_OUT = text(
    "SELECT DISTINCT group_id FROM consumer_group_members "
    f"WHERE last_heartbeat_ms + {_SESSION_MS} < :now OR revocation_deadline_ms < :now "
    "ORDER BY group_id"
)
CONSUMER_MEMBER_TOPICS = text(
    "SELECT member_id, subscribed_topic_names AS topics FROM consumer_group_members "
    "WHERE group_id = :group_id ORDER BY member_id"
)
CONSUMER_MEMBERS = text(
    f"SELECT {_CONSUMER_MEMBER_COLUMNS} FROM consumer_group_members "
    "WHERE group_id = :group_id ORDER BY member_id"
)
UPSERT_CONSUMER_MEMBER = text(
    f"""
    INSERT INTO consumer_group_members (group_id, {_CONSUMER_MEMBER_COLUMNS})
    VALUES (:group_id, :member_id, :instance_id, :rack_id, :client_id, :client_host,
            CAST(:subscribed_topic_names AS jsonb), :subscribed_topic_regex, :server_assignor,
            :rebalance_timeout_ms, :member_epoch, :previous_member_epoch, :state,
            CAST(:assigned AS jsonb), CAST(:pending_revocation AS jsonb), CAST(:target AS jsonb),
            :last_heartbeat_ms, :revocation_deadline_ms, :joined_ms,
            CAST(:assignment_epochs AS jsonb), CAST(:classic_member AS jsonb))
    ON CONFLICT (group_id, member_id) DO UPDATE SET
        instance_id = EXCLUDED.instance_id, rack_id = EXCLUDED.rack_id,
        client_id = EXCLUDED.client_id, client_host = EXCLUDED.client_host,
        subscribed_topic_names = EXCLUDED.subscribed_topic_names,
        subscribed_topic_regex = EXCLUDED.subscribed_topic_regex,
        server_assignor = EXCLUDED.server_assignor,
        rebalance_timeout_ms = EXCLUDED.rebalance_timeout_ms,
        member_epoch = EXCLUDED.member_epoch,
        previous_member_epoch = EXCLUDED.previous_member_epoch, state = EXCLUDED.state,
        assigned = EXCLUDED.assigned, pending_revocation = EXCLUDED.pending_revocation,
        target = EXCLUDED.target, last_heartbeat_ms = EXCLUDED.last_heartbeat_ms,
        revocation_deadline_ms = EXCLUDED.revocation_deadline_ms,
        assignment_epochs = EXCLUDED.assignment_epochs
    """
)
DELETE_CONSUMER_MEMBER = text(
    "DELETE FROM consumer_group_members WHERE group_id = :group_id AND member_id = :member_id"
)
LOG_CONSUMER_GROUP_EVENT = text(
    "INSERT INTO consumer_group_events (group_id, kind, member_id, group_epoch, member_epoch, "
    "detail, event_ms) VALUES (:group_id, :kind, :member_id, :group_epoch, :member_epoch, "
    "CAST(:detail AS jsonb), :now)"
)
CONSUMER_GROUP_EVENTS = text(
    "SELECT event_id, kind, member_id, group_epoch, member_epoch, detail, event_ms "
    "FROM consumer_group_events WHERE group_id = :group_id ORDER BY event_id"
)
ALL_TOPIC_PARTITIONS = text("SELECT topic, num_partitions FROM topics ORDER BY topic")
# The consumer groups' rebuild (groups/consumer_rebuild): every group's events in order,
# the projection as it is, and the writes that replace it.
ALL_CONSUMER_GROUP_EVENTS = text(
    "SELECT group_id, kind, member_id, group_epoch, detail FROM consumer_group_events "
    "ORDER BY event_id"
)
LIVE_CONSUMER_GROUPS = text(
    "SELECT group_id, generation_id, assignment_epoch, state, subscription_metadata "
    "FROM consumer_groups WHERE group_type = 'consumer' ORDER BY group_id"
)
LIVE_CONSUMER_GROUP_MEMBERS = text(
    "SELECT group_id, member_id, instance_id, rack_id, client_id, client_host, "
    "subscribed_topic_names, subscribed_topic_regex, server_assignor, rebalance_timeout_ms, "
    "member_epoch, previous_member_epoch, state, assigned, pending_revocation, target, "
    "revocation_deadline_ms, joined_ms, assignment_epochs, classic_member "
    "FROM consumer_group_members ORDER BY group_id, member_id"
)
LOCK_CONSUMER_PROJECTIONS = text(
    "LOCK TABLE consumer_groups, consumer_group_members IN EXCLUSIVE MODE"
)
CLEAR_CONSUMER_GROUP_MEMBERS = text(
    "DELETE FROM consumer_group_members m USING consumer_groups g "
    "WHERE g.group_id = m.group_id AND g.group_type = 'consumer'"
)
