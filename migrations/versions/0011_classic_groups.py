"""classic group protocol: member protocols, leader and leader-made assignments

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-25 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("consumer_groups", sa.Column("protocol_type", sa.Text(), nullable=True))
    op.add_column("consumer_groups", sa.Column("leader_id", sa.Text(), nullable=True))
    op.add_column(
        "group_members", sa.Column("protocol_names", postgresql.ARRAY(sa.Text()), nullable=True)
    )
    op.add_column(
        "group_members",
        sa.Column("protocol_metadata", postgresql.ARRAY(sa.LargeBinary()), nullable=True),
    )
    op.add_column("group_members", sa.Column("member_assignment", sa.LargeBinary(), nullable=True))
    op.add_column("group_members", sa.Column("rebalance_timeout_ms", sa.Integer(), nullable=True))


def downgrade() -> None:
    op.drop_column("group_members", "rebalance_timeout_ms")
    op.drop_column("group_members", "member_assignment")
    op.drop_column("group_members", "protocol_metadata")
    op.drop_column("group_members", "protocol_names")
    op.drop_column("consumer_groups", "leader_id")
    op.drop_column("consumer_groups", "protocol_type")
