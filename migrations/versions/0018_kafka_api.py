"""the topic configs an append and a fetch obey, and the leader epoch, on the partition row;
the leader-epoch history; the initial rebalance delay of a group; a credential per
mechanism for SASL users

Revision ID: 0018
Revises: 0017
Create Date: 2026-12-02 10:00:01.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("partitions", sa.Column("max_message_bytes", sa.Integer(), nullable=True))
    op.add_column(
        "partitions",
        sa.Column("log_append_time", sa.Boolean(), nullable=False, server_default=sa.text("false")),
    )
    op.add_column(
        "partitions",
        sa.Column(
            "compression_type", sa.Text(), nullable=False, server_default=sa.text("'producer'")
        ),
    )
    op.add_column(
        "partitions",
        sa.Column("leader_epoch", sa.Integer(), nullable=False, server_default=sa.text("0")),
    )
    op.create_table(
        "partition_leader_epochs",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("leader_epoch", sa.Integer(), nullable=False),
        sa.Column("start_offset", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["topic", "partition"],
            ["partitions.topic", "partitions.partition"],
            name=op.f("fk_partition_leader_epochs_topic_partitions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "topic", "partition", "leader_epoch", name=op.f("pk_partition_leader_epochs")
        ),
    )
    # Every partition there is has led in epoch 0 from its first offset.
    op.execute(
        "INSERT INTO partition_leader_epochs (topic, partition, leader_epoch, start_offset) "
        "SELECT topic, partition, 0, 0 FROM partitions"
    )
    op.add_column("consumer_groups", sa.Column("join_deadline_ms", sa.BigInteger(), nullable=True))
    op.drop_constraint(op.f("pk_sasl_users"), "sasl_users", type_="primary")
    op.create_primary_key(op.f("pk_sasl_users"), "sasl_users", ["name", "mechanism"])


def downgrade() -> None:
    # A user with credentials for several mechanisms cannot be kept with one: dropping
    # some silently would lock its applications out without a word.
    several = op.get_bind().execute(
        sa.text("SELECT name FROM sasl_users GROUP BY name HAVING count(*) > 1 ORDER BY name")
    )
    names = [r.name for r in several]
    if names:
        raise RuntimeError(
            f"users {', '.join(names)} have credentials for several mechanisms; "
            "keep one each (kip98 users delete, then add) first"
        )
    op.drop_constraint(op.f("pk_sasl_users"), "sasl_users", type_="primary")
    op.create_primary_key(op.f("pk_sasl_users"), "sasl_users", ["name"])
    op.drop_column("consumer_groups", "join_deadline_ms")
    op.drop_table("partition_leader_epochs")
    op.drop_column("partitions", "leader_epoch")
    op.drop_column("partitions", "compression_type")
    op.drop_column("partitions", "log_append_time")
    op.drop_column("partitions", "max_message_bytes")
