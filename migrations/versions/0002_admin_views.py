"""admin SQL views: partition_status, committed_records, open_transactions,
hanging_transactions, consumer_group_lag

Revision ID: 0002
Revises: 0001
"""

from collections.abc import Sequence

from alembic import op

from app.storage.views import create_views, drop_views

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

NAMES = [
    "partition_status",
    "committed_records",
    "open_transactions",
    "hanging_transactions",
    "consumer_group_lag",
]


def upgrade() -> None:
    create_views(op.get_bind(), NAMES)


def downgrade() -> None:
    drop_views(op.get_bind(), NAMES)
