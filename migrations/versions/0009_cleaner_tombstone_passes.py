"""cleaner tombstone passes

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-25 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Starts empty: tombstones already in the log begin their delete.retention.ms at the
    # first pass after the upgrade, which keeps them longer, never shorter.
    op.create_table(
        "cleaner_tombstone_passes",
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("up_to_offset", sa.BigInteger(), nullable=False),
        sa.Column("passed_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["topic", "partition"],
            ["partitions.topic", "partitions.partition"],
            name=op.f("fk_cleaner_tombstone_passes_topic_partitions"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "topic", "partition", "up_to_offset", name=op.f("pk_cleaner_tombstone_passes")
        ),
    )


def downgrade() -> None:
    op.drop_table("cleaner_tombstone_passes")
