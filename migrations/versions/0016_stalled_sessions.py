"""functions that find and end sessions stalled by their client while they block others

Revision ID: 0016
Revises: 0015
"""

from collections.abc import Sequence

from alembic import op

from app.storage.stall_sql import create_functions, drop_functions

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    create_functions(op.get_bind())


def downgrade() -> None:
    drop_functions(op.get_bind())
