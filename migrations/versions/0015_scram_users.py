"""SASL users may be SCRAM-SHA-256 or SCRAM-SHA-512 users as well as PLAIN ones

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-25 15:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# The name as the naming convention made it (op.f: taken as given, not prefixed again).
_NAME = "ck_sasl_users_mechanism"


def upgrade() -> None:
    op.drop_constraint(op.f(_NAME), "sasl_users", type_="check")
    op.create_check_constraint(
        op.f(_NAME), "sasl_users", "mechanism IN ('PLAIN', 'SCRAM-SHA-256', 'SCRAM-SHA-512')"
    )


def downgrade() -> None:
    # A SCRAM user cannot be kept as a PLAIN one (its password is not known), and
    # dropping users silently would lock their applications out without a word.
    scram = op.get_bind().execute(
        sa.text("SELECT name FROM sasl_users WHERE mechanism <> 'PLAIN' ORDER BY name")
    )
    names = [r.name for r in scram]
    if names:
        raise RuntimeError(
            f"SCRAM users {', '.join(names)} exist; delete them (kip98 users delete) first"
        )
    op.drop_constraint(op.f(_NAME), "sasl_users", type_="check")
    op.create_check_constraint(op.f(_NAME), "sasl_users", "mechanism IN ('PLAIN')")
