"""the coordinator loops sharing the transaction-log partitions' leases

Revision ID: 0024
Revises: 0023
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0024"
down_revision: str | None = "0023"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "coordinator_loops",
        sa.Column("owner", sa.Text(), nullable=False),
        sa.Column("expires_ms", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("owner", name=op.f("pk_coordinator_loops")),
    )


def downgrade() -> None:
    op.drop_table("coordinator_loops")
