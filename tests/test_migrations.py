"""Migrations: the real alembic CLI runs them both ways, and they match the metadata."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from sqlalchemy import create_engine, inspect, pool, text
from sqlalchemy.engine import make_url

from app.storage.schema import metadata
from app.storage.views import VIEW_NAMES

ROOT = Path(__file__).resolve().parents[1]
ALEMBIC = Path(sys.executable).with_name("alembic")


@pytest.fixture
def empty_db(server_url: str) -> Iterator[str]:
    """A database with nothing in it, not even the migrated template's tables."""
    name = f"kip98_empty_{uuid.uuid4().hex[:12]}"
    admin_url = make_url(server_url).set(database="postgres")
    admin = create_engine(admin_url, poolclass=pool.NullPool, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
        yield make_url(server_url).set(database=name).render_as_string(hide_password=False)
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


def _alembic(url: str, *args: str) -> subprocess.CompletedProcess[str]:
    result = subprocess.run(
        [str(ALEMBIC), "-c", str(ROOT / "alembic.ini"), *args],
        cwd=ROOT,
        env={**os.environ, "KIP98_DATABASE_URL": url},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return result


def _tables(url: str) -> set[str]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        return set(inspect(engine).get_table_names())
    finally:
        engine.dispose()


def _user_types(url: str) -> list[str]:
    """Enums, domains and composite types a downgrade must also remove."""
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                text(
                    "SELECT t.typname FROM pg_type t "
                    "JOIN pg_namespace n ON n.oid = t.typnamespace "
                    "WHERE n.nspname = 'public' AND t.typtype IN ('e', 'd', 'c') "
                    "AND NOT EXISTS (SELECT 1 FROM pg_class c WHERE c.reltype = t.oid)"
                )
            ).all()
    finally:
        engine.dispose()
    return [row[0] for row in rows]


def test_upgrade_downgrade_upgrade(empty_db: str) -> None:
    _alembic(empty_db, "upgrade", "head")
    migrated = _tables(empty_db)
    assert set(metadata.tables) <= migrated

    _alembic(empty_db, "downgrade", "base")
    assert _tables(empty_db) <= {"alembic_version"}
    assert _user_types(empty_db) == []

    _alembic(empty_db, "upgrade", "head")
    assert _tables(empty_db) == migrated
    current = _alembic(empty_db, "current").stdout
    assert "(head)" in current


def _include(
    obj: object, name: str | None, type_: str, reflected: bool, compare_to: object
) -> bool:
    return not (type_ == "table" and name in VIEW_NAMES)


def test_metadata_matches_migrations(db_url: str) -> None:
    engine = create_engine(db_url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            context = MigrationContext.configure(
                conn,
                opts={
                    "include_object": _include,
                    "compare_type": True,
                    "compare_server_default": True,
                },
            )
            diff = compare_metadata(context, metadata)
    finally:
        engine.dispose()
    assert diff == [], f"schema.py and migrations/ disagree: {diff}"
