"""the leader epoch committed with a group's offset (KIP-320), kept as OffsetFetch answers it

Revision ID: 0022
Revises: 0020
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | None = "0020"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The projections hold -1 where no epoch was committed (Kafka's "none"); the log's
# 'delete' events carry none at all.
PROJECTIONS = ("group_offsets", "pending_txn_offsets")


def upgrade() -> None:
    for table in PROJECTIONS:
        op.add_column(
            table,
            sa.Column(
                "committed_leader_epoch", sa.Integer(), server_default=sa.text("-1"), nullable=False
            ),
        )
    op.add_column("offset_commit_log", sa.Column("committed_leader_epoch", sa.Integer()))


def downgrade() -> None:
    op.drop_column("offset_commit_log", "committed_leader_epoch")
    for table in reversed(PROJECTIONS):
        op.drop_column(table, "committed_leader_epoch")
