"""topic ids

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-25 10:30:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # A volatile default: every existing topic gets an id of its own.
    op.add_column(
        "topics",
        sa.Column(
            "topic_id",
            postgresql.UUID(as_uuid=True),
            server_default=sa.text("gen_random_uuid()"),
            nullable=False,
        ),
    )
    op.create_unique_constraint(op.f("uq_topics_topic_id"), "topics", ["topic_id"])


def downgrade() -> None:
    op.drop_constraint(op.f("uq_topics_topic_id"), "topics", type_="unique")
    op.drop_column("topics", "topic_id")
