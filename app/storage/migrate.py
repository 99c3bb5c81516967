"""Run Alembic programmatically (``kip98 db migrate``, the test fixtures, the demo), and
bring a database to the newest schema on demand.

Whatever starts the embedded database migrates it (``engine.resolve_url``): a fresh
``KIP98_HOME`` works at once, for ``kip98 serve``, the clients and the CLI alike. A
database of one's own (``KIP98_DATABASE_URL``) stays explicit: its schema changes when its
operator runs ``kip98 db migrate``, or on demand with ``KIP98_AUTO_MIGRATE=1``.

An upgrade holds a transaction-scoped advisory lock on the database for its whole run, so
processes migrating at once take turns: the first upgrades, the others then find the
schema at head and do nothing. Alembic alone would have two processes run the same
revision's DDL side by side, and the second fail on what the first created.
"""

from __future__ import annotations

import threading
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
from sqlalchemy import create_engine, pool, text

from app.storage.urls import libpq_conninfo, safe, sqlalchemy_url

if TYPE_CHECKING:
    from alembic.config import Config

_ROOT = Path(__file__).resolve().parents[2]

# The advisory lock key every upgrade of a database holds ('kip98mig' as an int64): any
# key would do, as long as every kip98 uses this one.
MIGRATION_LOCK_KEY = int.from_bytes(b"kip98mig", "big") & (2**63 - 1)

# The databases this process has found at head (or brought there): each is checked once.
_ready: set[str] = set()
_ready_lock = threading.Lock()


class SchemaError(Exception):
    """The database lacks kip98's schema, or has an older one, and is not migrated on
    demand: one line for the operator, naming what to run."""


def alembic_config(url: str) -> Config:
    """Config pointing at the repository's migrations, for ``url``; logging left alone."""
    from alembic.config import Config

    cfg = Config(str(_ROOT / "alembic.ini"))
    cfg.set_main_option("script_location", str(_ROOT / "migrations"))
    cfg.set_main_option("sqlalchemy.url", sqlalchemy_url(url).replace("%", "%%"))
    cfg.attributes["configure_logging"] = False
    return cfg


@cache
def head_revisions() -> frozenset[str]:
    """The newest revision(s) of the migrations this kip98 carries."""
    from alembic.script import ScriptDirectory

    return frozenset(ScriptDirectory.from_config(alembic_config("postgresql://")).get_heads())


@cache
def known_revisions() -> frozenset[str]:
    """Every revision of the migrations this kip98 carries."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory.from_config(alembic_config("postgresql://"))
    return frozenset(r.revision for r in script.walk_revisions())


def upgrade_to_head(url: str) -> None:
    """Upgrade ``url``'s schema to head, one process at a time (``MIGRATION_LOCK_KEY``):
    the migrations run inside the transaction that holds the lock, and commit with it."""
    from alembic import command

    engine = create_engine(sqlalchemy_url(url), poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": MIGRATION_LOCK_KEY})
            cfg = alembic_config(url)
            cfg.attributes["connection"] = conn
            command.upgrade(cfg, "head")
    finally:
        engine.dispose()
    with _ready_lock:
        _ready.add(url)


def current_revisions(url: str) -> frozenset[str]:
    """The revision(s) ``url``'s schema is at; empty when it has none. Connection failures
    are the driver's (``psycopg.OperationalError``)."""
    with psycopg.connect(libpq_conninfo(url), connect_timeout=10, autocommit=True) as conn:
        found = conn.execute("SELECT to_regclass('alembic_version') IS NOT NULL").fetchone()
        if not found or not found[0]:
            return frozenset()
        return frozenset(str(r[0]) for r in conn.execute("SELECT version_num FROM alembic_version"))


def ensure_schema(url: str, migrate: bool) -> None:
    """Return once ``url``'s schema is at head: upgraded here if ``migrate``, else
    SchemaError. Checked once per process and database; a database that cannot be reached
    raises the driver's error."""
    url = sqlalchemy_url(url)
    if url in _ready:
        return
    current = current_revisions(url)
    if current != head_revisions():
        unknown = current - known_revisions()
        if unknown:
            raise SchemaError(
                f"the database {safe(url)} is at schema revision {min(unknown)}, which this "
                "kip98 does not know (a newer kip98 migrated it): upgrade kip98"
            )
        if not migrate:
            raise SchemaError(_unmigrated(url, current))
        try:
            upgrade_to_head(url)
        except psycopg.OperationalError:
            raise
        except Exception as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SchemaError(f"could not migrate the database {safe(url)}: {first}") from exc
    with _ready_lock:
        _ready.add(url)


def _unmigrated(url: str, current: frozenset[str]) -> str:
    had = "has no kip98 schema" if not current else f"is at schema revision {min(current)}"
    head = max(head_revisions())
    return (
        f"the database {safe(url)} {had}, not {head}: run kip98 db migrate "
        "(or set KIP98_AUTO_MIGRATE=1 to migrate it on demand)"
    )
