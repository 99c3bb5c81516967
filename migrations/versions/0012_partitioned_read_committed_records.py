"""read_committed_records partitioned by (topic, partition, offset) range, with a registry

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 09:00:00.000000
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

COLUMNS = """
    topic text NOT NULL, partition integer NOT NULL, "offset" bigint NOT NULL,
    key bytea, value bytea, headers jsonb, "timestamp" bigint NOT NULL,
    producer_id bigint NOT NULL
"""
OLD = "read_committed_records_0011"


def _literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def upgrade() -> None:
    op.execute(f"ALTER TABLE read_committed_records RENAME TO {OLD}")
    op.execute(f"ALTER TABLE {OLD} RENAME CONSTRAINT pk_read_committed_records TO pk_{OLD}")
    op.execute(
        f"""
        CREATE TABLE read_committed_records ({COLUMNS},
            CONSTRAINT pk_read_committed_records PRIMARY KEY (topic, partition, "offset")
        ) PARTITION BY RANGE (topic, partition, "offset")
        """
    )
    op.create_table(
        "read_committed_partitions",
        sa.Column("table_name", sa.Text(), nullable=False),
        sa.Column("topic", sa.Text(), nullable=False),
        sa.Column("partition", sa.Integer(), nullable=False),
        sa.Column("from_offset", sa.BigInteger(), nullable=False),
        sa.Column("to_offset", sa.BigInteger(), nullable=False),
        sa.Column("row_count", sa.BigInteger(), nullable=False),
        sa.PrimaryKeyConstraint("table_name", name=op.f("pk_read_committed_partitions")),
    )
    # Each topic partition's rows into a partition of their own, bounded by the offsets
    # they span: below the partition's progress, so the next run's range starts past it.
    conn = op.get_bind()
    spans = conn.execute(
        sa.text(
            f'SELECT topic, partition, min("offset"), max("offset") + 1, count(*) '
            f"FROM {OLD} GROUP BY topic, partition ORDER BY topic, partition"
        )
    ).all()
    for i, (topic, partition, start, end, rows) in enumerate(spans):
        name = f"rc_migrated_{i}"
        t, p = _literal(topic), int(partition)
        op.execute(
            f"""
            CREATE TABLE {name} ({COLUMNS}, PRIMARY KEY (topic, partition, "offset"),
                CONSTRAINT {name}_bound CHECK (topic = {t} AND partition = {p}
                    AND "offset" >= {int(start)} AND "offset" < {int(end)}))
            """
        )
        op.execute(
            f"INSERT INTO {name} SELECT * FROM {OLD} "
            f'WHERE topic = {t} AND partition = {p} ORDER BY "offset"'
        )
        op.execute(
            f"ALTER TABLE read_committed_records ATTACH PARTITION {name} "
            f"FOR VALUES FROM ({t}, {p}, {int(start)}) TO ({t}, {p}, {int(end)})"
        )
        conn.execute(
            sa.text("INSERT INTO read_committed_partitions VALUES (:n, :t, :p, :s, :e, :r)"),
            {"n": name, "t": topic, "p": partition, "s": start, "e": end, "r": rows},
        )
    op.drop_table(OLD)


def downgrade() -> None:
    op.execute(
        f"""
        CREATE TABLE {OLD} ({COLUMNS},
            CONSTRAINT pk_{OLD} PRIMARY KEY (topic, partition, "offset"))
        """
    )
    op.execute(f"INSERT INTO {OLD} SELECT * FROM read_committed_records")
    # The partitions go with their parent; tables of runs and compactions that never
    # attached theirs are dropped too.
    op.execute("DROP TABLE read_committed_records")
    conn = op.get_bind()
    leftovers = conn.execute(
        sa.text(
            "SELECT relname FROM pg_class "
            "WHERE relnamespace = CAST(current_schema() AS regnamespace) "
            "AND relkind IN ('r', 'p') AND NOT relispartition "
            "AND relname ~ '^rc_(run|compact)_[0-9a-f]{32}$'"
        )
    ).scalars()
    for name in list(leftovers):
        op.execute(f"DROP TABLE {name}")
    op.drop_table("read_committed_partitions")
    op.execute(f"ALTER TABLE {OLD} RENAME TO read_committed_records")
    op.execute(
        f"ALTER TABLE read_committed_records RENAME CONSTRAINT pk_{OLD} "
        "TO pk_read_committed_records"
    )
