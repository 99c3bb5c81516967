"""consumer_group_lag, version 2: each partition's member (classic or consumer protocol),
the group's type, and the partitions assigned but not yet committed

Revision ID: 0028
Revises: 0027
"""

from collections.abc import Sequence

from alembic import op

from app.storage.views import create_views

revision: str = "0028"
down_revision: str | None = "0027"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

VIEW = ["consumer_group_lag"]


def upgrade() -> None:
    create_views(op.get_bind(), VIEW, version=2)


def downgrade() -> None:
    op.execute("DROP VIEW IF EXISTS consumer_group_lag")
    create_views(op.get_bind(), VIEW)
