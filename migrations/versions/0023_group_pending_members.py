"""the classic groups' pending members (KIP-394): ids handed out with MEMBER_ID_REQUIRED

Revision ID: 0023
Revises: 0022
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0023"
down_revision: str | None = "0022"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "group_pending_members",
        sa.Column("group_id", sa.Text(), nullable=False),
        sa.Column("member_id", sa.Text(), nullable=False),
        sa.Column("expires_ms", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["group_id"],
            ["consumer_groups.group_id"],
            name=op.f("fk_group_pending_members_group_id_consumer_groups"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("group_id", "member_id", name=op.f("pk_group_pending_members")),
    )


def downgrade() -> None:
    op.drop_table("group_pending_members")
