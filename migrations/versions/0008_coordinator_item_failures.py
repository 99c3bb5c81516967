"""coordinator item failures

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-25 01:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "coordinator_item_failures",
        sa.Column("work", sa.Text(), nullable=False),
        sa.Column("failures", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.Column("last_failed_ms", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.PrimaryKeyConstraint("work", name=op.f("pk_coordinator_item_failures")),
    )


def downgrade() -> None:
    op.drop_table("coordinator_item_failures")
