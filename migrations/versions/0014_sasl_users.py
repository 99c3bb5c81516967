"""SASL users of kip98 serve: SCRAM-style credentials (salt, iterations, StoredKey,
ServerKey)

Revision ID: 0014
Revises: 0013
Create Date: 2026-11-25 13:50:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0014"
down_revision: str | None = "0013"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "sasl_users",
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("mechanism", sa.Text(), nullable=False),
        sa.Column("salt", sa.LargeBinary(), nullable=False),
        sa.Column("iterations", sa.Integer(), nullable=False),
        sa.Column("stored_key", sa.LargeBinary(), nullable=False),
        sa.Column("server_key", sa.LargeBinary(), nullable=False),
        sa.Column("created_ms", sa.BigInteger(), nullable=False),
        sa.CheckConstraint("mechanism IN ('PLAIN')", name=op.f("ck_sasl_users_mechanism")),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_sasl_users")),
    )


def downgrade() -> None:
    op.drop_table("sasl_users")
