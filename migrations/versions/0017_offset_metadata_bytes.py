"""offset metadata kept as the UTF-8 bytes of the string sent (NUL included)

Revision ID: 0017
Revises: 0021
Create Date: 2026-12-02 10:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from app.storage.views import create_views, drop_views

revision: str = "0017"
down_revision: str | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# Every table that carries an offset's metadata; consumer_group_lag shows it.
TABLES = ("group_offsets", "pending_txn_offsets", "offset_commit_log")
VIEW = ["consumer_group_lag"]


def upgrade() -> None:
    drop_views(op.get_bind(), VIEW)
    for table in TABLES:
        op.alter_column(
            table,
            "metadata",
            type_=sa.LargeBinary(),
            postgresql_using="convert_to(metadata, 'UTF8')",
        )
    create_views(op.get_bind(), VIEW)


def downgrade() -> None:
    # Text cannot hold NUL: metadata holding one has no text form, and dropping it
    # silently would hand its consumers something else than they committed.
    conn = op.get_bind()
    held = [
        row.group_id
        for table in TABLES
        for row in conn.execute(
            sa.text(
                f"SELECT DISTINCT group_id FROM {table} "
                "WHERE position('\\x00'::bytea IN metadata) > 0 ORDER BY group_id"
            )
        )
    ]
    if held:
        raise RuntimeError(
            "offset metadata of groups "
            f"{', '.join(sorted(set(held)))} holds NUL, which text cannot; "
            "commit those offsets again without it first"
        )
    drop_views(conn, VIEW)
    for table in TABLES:
        op.alter_column(
            table,
            "metadata",
            type_=sa.Text(),
            postgresql_using="convert_from(metadata, 'UTF8')",
        )
    create_views(conn, VIEW)
