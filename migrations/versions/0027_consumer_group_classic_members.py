"""a consumer group's classic members (KIP-848's online upgrade): the session timeout and
protocols a member of the classic protocol joined with

Revision ID: 0027
Revises: 0026
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0027"
down_revision: str | None = "0026"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # NULL: a member of the consumer protocol; else {"session_timeout_ms", "protocols":
    # [{"name", "metadata" (base64)}]}, what its JoinGroup carried.
    op.add_column(
        "consumer_group_members",
        sa.Column("classic_member", postgresql.JSONB(astext_type=sa.Text()), nullable=True),
    )


def downgrade() -> None:
    op.drop_column("consumer_group_members", "classic_member")
