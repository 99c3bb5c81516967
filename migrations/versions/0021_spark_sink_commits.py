"""The Spark sink's committed micro-batches: one row per (query, batch), written with the
batch's transactions, so a replayed batch is not written again

Revision ID: 0021
Revises: 0016
Create Date: 2026-11-27 04:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "spark_sink_commits",
        sa.Column("query_id", sa.Text(), nullable=False),
        sa.Column("batch_id", sa.BigInteger(), nullable=False),
        sa.Column("row_count", sa.BigInteger(), nullable=False),
        sa.Column(
            "committed_ms",
            sa.BigInteger(),
            server_default=sa.text("(extract(epoch FROM now()) * 1000)::bigint"),
            nullable=False,
        ),
        sa.PrimaryKeyConstraint("query_id", "batch_id", name=op.f("pk_spark_sink_commits")),
    )


def downgrade() -> None:
    op.drop_table("spark_sink_commits")
