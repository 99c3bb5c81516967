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
from sqlalchemy.exc import IntegrityError

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


def _rows(url: str, query: str) -> list[tuple[object, ...]]:
    engine = create_engine(url, poolclass=pool.NullPool)
    try:
        with engine.connect() as conn:
            return [tuple(r) for r in conn.execute(text(query))]
    finally:
        engine.dispose()


def test_0012_partitions_materialised_rows_and_back(empty_db: str) -> None:
    """An install at 0011 with materialised rows: 0012 moves them into one partition per
    topic partition, bounded by the offsets they span and registered; the downgrade puts
    them back into the plain table."""
    _alembic(empty_db, "upgrade", "0011")
    rows = [
        (topic, partition, offset, f"k{offset}".encode(), b"v", '[{"key": "h", "value": null}]'
         if offset % 2 else None, 1_000 + offset, 7)
        for topic, partition, offsets in (("a", 0, range(3, 40)), ("a", 1, range(5)),
                                          ("o'b", 0, range(100, 110)))
        for offset in offsets
    ]  # fmt: skip
    engine = create_engine(empty_db, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(
                text(
                    "INSERT INTO read_committed_records VALUES "
                    "(:t, :p, :o, :k, :v, CAST(:h AS jsonb), :ts, :pid)"
                ),
                [
                    dict(zip(("t", "p", "o", "k", "v", "h", "ts", "pid"), r, strict=True))
                    for r in rows
                ],
            )
    finally:
        engine.dispose()
    everything = 'SELECT * FROM read_committed_records ORDER BY topic, partition, "offset"'
    before = _rows(empty_db, everything)
    assert len(before) == len(rows)

    _alembic(empty_db, "upgrade", "0012")
    assert _rows(empty_db, everything) == before
    assert _rows(
        empty_db,
        "SELECT topic, partition, from_offset, to_offset, row_count "
        "FROM read_committed_partitions ORDER BY topic, partition",
    ) == [("a", 0, 3, 40, 37), ("a", 1, 0, 5, 5), ("o'b", 0, 100, 110, 10)]
    assert _rows(
        empty_db,
        "SELECT count(*) FROM pg_inherits "
        "WHERE inhparent = CAST('read_committed_records' AS regclass)",
    ) == [(3,)]
    # The primary key holds across partitions, as it did on the plain table.
    with pytest.raises(IntegrityError, match="duplicate key"):
        _rows(empty_db, "INSERT INTO read_committed_records SELECT * FROM read_committed_records")

    _alembic(empty_db, "downgrade", "0011")
    assert _rows(empty_db, everything) == before
    assert "read_committed_partitions" not in _tables(empty_db)
    assert _rows(
        empty_db, "SELECT relkind FROM pg_class WHERE relname = 'read_committed_records'"
    ) == [("r",)]
    assert _rows(
        empty_db, "SELECT count(*) FROM pg_class WHERE relname LIKE 'rc\\_migrated\\_%'"
    ) == [(0,)]

    _alembic(empty_db, "upgrade", "head")
    assert _rows(empty_db, everything) == before


def test_0015_downgrade_refuses_while_scram_users_exist(empty_db: str) -> None:
    """SCRAM users cannot go back to 0014 (its users are PLAIN only, and a SCRAM user's
    password is not known): the downgrade refuses, naming them, and changes nothing; once
    they are deleted it goes back."""
    _alembic(empty_db, "upgrade", "head")
    insert = "INSERT INTO sasl_users VALUES (:name, :mechanism, '\\x00', 4096, '\\x00', '\\x00', 0)"
    engine = create_engine(empty_db, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            for name, mechanism in (("alice", "PLAIN"), ("carol", "SCRAM-SHA-512")):
                conn.execute(text(insert), {"name": name, "mechanism": mechanism})
    finally:
        engine.dispose()
    refused = subprocess.run(
        [str(ALEMBIC), "-c", str(ROOT / "alembic.ini"), "downgrade", "0014"],
        cwd=ROOT, env={**os.environ, "KIP98_DATABASE_URL": empty_db},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0 and "SCRAM users carol exist" in refused.stderr
    assert _rows(empty_db, "SELECT name FROM sasl_users ORDER BY name") == [("alice",), ("carol",)]
    engine = create_engine(empty_db, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM sasl_users WHERE name = 'carol'"))
    finally:
        engine.dispose()
    _alembic(empty_db, "downgrade", "0014")
    assert _rows(empty_db, "SELECT name, mechanism FROM sasl_users") == [("alice", "PLAIN")]
    with pytest.raises(IntegrityError, match="ck_sasl_users_mechanism"):
        _rows(empty_db, insert.replace(":name", "'x'").replace(":mechanism", "'SCRAM-SHA-256'"))


def test_0017_offset_metadata_becomes_its_utf8_bytes_and_back(empty_db: str) -> None:
    """Metadata stored as text before 0017 is its UTF-8 after it, in every table that
    carries it; the downgrade turns it back into the same text, and refuses (changing
    nothing) while some metadata holds NUL, which text cannot."""
    _alembic(empty_db, "upgrade", "0021")
    metadata_of = {"group_offsets": "héllo", "pending_txn_offsets": "", "offset_commit_log": "✓"}
    engine = create_engine(empty_db, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("INSERT INTO group_offsets VALUES ('g', 't', 0, 5, :m, 0)"),
                         {"m": metadata_of["group_offsets"]})  # fmt: skip
            conn.execute(
                text("INSERT INTO pending_txn_offsets VALUES ('g', 't', 0, 7, 0, 5, :m, 0)"),
                {"m": metadata_of["pending_txn_offsets"]},
            )
            conn.execute(
                text(
                    "INSERT INTO offset_commit_log (group_id, topic, partition, kind, "
                    "committed_offset, metadata, commit_ms) VALUES ('g', 't', 0, 'commit', 5, :m, 0)"
                ),
                {"m": metadata_of["offset_commit_log"]},
            )
    finally:
        engine.dispose()

    _alembic(empty_db, "upgrade", "0017")
    for table, value in metadata_of.items():
        assert _rows(empty_db, f"SELECT metadata FROM {table}") == [(value.encode(),)]
    assert _rows(empty_db, "SELECT metadata FROM consumer_group_lag") == []  # no partition 't'

    engine = create_engine(empty_db, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE group_offsets SET metadata = '\\x6100'::bytea"))
    finally:
        engine.dispose()
    refused = subprocess.run(
        [str(ALEMBIC), "-c", str(ROOT / "alembic.ini"), "downgrade", "0021"],
        cwd=ROOT, env={**os.environ, "KIP98_DATABASE_URL": empty_db},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0 and "groups g holds NUL" in refused.stderr
    assert _rows(empty_db, "SELECT metadata FROM group_offsets") == [(b"a\x00",)]

    engine = create_engine(empty_db, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("UPDATE group_offsets SET metadata = :m"), {"m": "héllo".encode()})
    finally:
        engine.dispose()
    _alembic(empty_db, "downgrade", "0021")
    for table, value in metadata_of.items():
        assert _rows(empty_db, f"SELECT metadata FROM {table}") == [(value,)]
    _alembic(empty_db, "upgrade", "head")


def test_0018_downgrade_refuses_while_a_user_has_several_mechanisms(empty_db: str) -> None:
    """Before 0018 a user had one credential: the downgrade refuses, naming the users with
    more, and changes nothing; once each has one it goes back. Every partition there is
    leads in epoch 0 from offset 0 after the upgrade."""
    _alembic(empty_db, "upgrade", "0017")
    insert = "INSERT INTO sasl_users VALUES (:name, :mechanism, '\\x00', 4096, '\\x00', '\\x00', 0)"
    engine = create_engine(empty_db, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("INSERT INTO topics (topic, num_partitions, created_ms) VALUES ('t', 2, 0)")
            )
            conn.execute(
                text("INSERT INTO partitions (topic, partition) VALUES ('t', 0), ('t', 1)")
            )
    finally:
        engine.dispose()
    _alembic(empty_db, "upgrade", "0018")
    assert _rows(
        empty_db, "SELECT partition, leader_epoch, start_offset FROM partition_leader_epochs"
    ) == [(0, 0, 0), (1, 0, 0)]
    engine = create_engine(empty_db, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            for name, mechanism in (("carol", "SCRAM-SHA-256"), ("carol", "SCRAM-SHA-512"),
                                    ("dave", "PLAIN")):  # fmt: skip
                conn.execute(text(insert), {"name": name, "mechanism": mechanism})
    finally:
        engine.dispose()
    refused = subprocess.run(
        [str(ALEMBIC), "-c", str(ROOT / "alembic.ini"), "downgrade", "0017"],
        cwd=ROOT, env={**os.environ, "KIP98_DATABASE_URL": empty_db},
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert refused.returncode != 0 and "users carol have credentials" in refused.stderr
    assert len(_rows(empty_db, "SELECT name FROM sasl_users")) == 3
    engine = create_engine(empty_db, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("DELETE FROM sasl_users WHERE mechanism = 'SCRAM-SHA-512'"))
    finally:
        engine.dispose()
    _alembic(empty_db, "downgrade", "0017")
    assert sorted(_rows(empty_db, "SELECT name FROM sasl_users")) == [("carol",), ("dave",)]
    _alembic(empty_db, "upgrade", "head")
