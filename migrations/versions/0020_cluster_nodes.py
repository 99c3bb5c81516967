"""the kip98 serve nodes sharing the database: broker_registrations and the cluster_nodes view

Revision ID: 0020
Revises: 0018
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from app.storage.views import create_views, drop_views

revision: str = "0020"
down_revision: str | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "broker_registrations",
        sa.Column("node_id", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("incarnation", postgresql.UUID(as_uuid=True), nullable=False),
        sa.Column("rack", sa.Text(), nullable=True),
        sa.Column("listeners", postgresql.JSONB(astext_type=sa.Text()), nullable=False),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("registered_ms", sa.BigInteger(), nullable=False),
        sa.Column("heartbeat_ms", sa.BigInteger(), nullable=False),
        sa.Column("expires_ms", sa.BigInteger(), nullable=False),
        sa.Column("requests", sa.BigInteger(), server_default=sa.text("0"), nullable=False),
        sa.CheckConstraint(
            "node_id >= 0", name=op.f("ck_broker_registrations_node_id_not_negative")
        ),
        sa.PrimaryKeyConstraint("node_id", name=op.f("pk_broker_registrations")),
    )
    create_views(op.get_bind(), ["cluster_nodes"])


def downgrade() -> None:
    drop_views(op.get_bind(), ["cluster_nodes"])
    op.drop_table("broker_registrations")
