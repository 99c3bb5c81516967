"""KIP-848 consumer groups: a group's type and assignment epoch, its members' epochs and
assignments (the projection), and every epoch change as an event

Revision ID: 0025
Revises: 0024
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0025"
down_revision: str | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A consumer group's group epoch is its generation_id; the target assignment's epoch
    # is assignment_epoch.
    op.add_column(
        "consumer_groups",
        sa.Column("group_type", sa.Text(), server_default="classic", nullable=False),
    )
    op.add_column(
        "consumer_groups",
        sa.Column("assignment_epoch", sa.Integer(), server_default="0", nullable=False),
    )
    # The subscribed topics' partition counts the target was computed for: a change (a
    # topic created, grown, deleted) bumps the group epoch.
    op.add_column(
        "consumer_groups",
        sa.Column("subscription_metadata", postgresql.JSONB(), nullable=True),
    )
    op.create_table(
        "consumer_group_members",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("member_id", sa.Text(), nullable=False),
        sa.Column("instance_id", sa.Text(), nullable=True),
        sa.Column("rack_id", sa.Text(), nullable=True),
        sa.Column("client_id", sa.Text(), nullable=False, server_default=""),
        sa.Column("client_host", sa.Text(), nullable=False, server_default=""),
        sa.Column("subscribed_topic_names", postgresql.JSONB(), nullable=False),
        sa.Column("subscribed_topic_regex", sa.Text(), nullable=True),
        sa.Column("server_assignor", sa.Text(), nullable=True),
        sa.Column("rebalance_timeout_ms", sa.Integer(), nullable=False),
        sa.Column("member_epoch", sa.Integer(), nullable=False),
        sa.Column("previous_member_epoch", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False),
        sa.Column("assigned", postgresql.JSONB(), nullable=False),
        sa.Column("pending_revocation", postgresql.JSONB(), nullable=False),
        sa.Column("target", postgresql.JSONB(), nullable=False),
        sa.Column("last_heartbeat_ms", sa.BigInteger(), nullable=False),
        sa.Column("revocation_deadline_ms", sa.BigInteger(), nullable=True),
        sa.Column("joined_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["group_id"],
            ["consumer_groups.group_id"],
            name=op.f("fk_consumer_group_members_group_id_consumer_groups"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("group_id", "member_id", name=op.f("pk_consumer_group_members")),
    )
    op.create_table(
        "consumer_group_events",
        sa.Column("event_id", sa.BigInteger(), sa.Identity(), nullable=False),
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("kind", sa.Text(), nullable=False),
        sa.Column("member_id", sa.Text(), nullable=True),
        sa.Column("group_epoch", sa.Integer(), nullable=False),
        sa.Column("member_epoch", sa.Integer(), nullable=True),
        sa.Column("detail", postgresql.JSONB(), nullable=True),
        sa.Column("event_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("event_id", name=op.f("pk_consumer_group_events")),
    )
    op.create_index(
        op.f("ix_consumer_group_events_group_id"), "consumer_group_events", ["group_id"]
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_consumer_group_events_group_id"), "consumer_group_events")
    op.drop_table("consumer_group_events")
    op.drop_table("consumer_group_members")
    op.drop_column("consumer_groups", "subscription_metadata")
    op.drop_column("consumer_groups", "assignment_epoch")
    op.drop_column("consumer_groups", "group_type")
