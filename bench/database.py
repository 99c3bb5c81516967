"""A fresh database per case, and a server settled before each timed phase."""

from __future__ import annotations

import gc
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg

from app.storage import urls
from app.storage.driver import libpq_conninfo
from app.storage.engine import dispose_engines
from app.storage.migrate import upgrade_to_head


@contextmanager
def fresh_database(server_url: str) -> Iterator[str]:
    """A new database on ``server_url``'s server, migrated to the head, dropped after:
    no case writes into rows, indexes or statistics another left."""
    name = f"kip98_bench_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(libpq_conninfo(server_url, dbname="postgres"), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = urls.parse(server_url).with_database(name).sqlalchemy()
    upgrade_to_head(url)
    try:
        yield url
    finally:
        dispose_engines()
        with psycopg.connect(
            libpq_conninfo(server_url, dbname="postgres"), autocommit=True
        ) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def settle(url: str) -> None:
    """Finish the background work the previous phase left the server (autovacuum of the
    rows it wrote, a checkpoint of its WAL) and Python (a full collection of the objects
    it and the next phase's set-up made: the input records, ~400,000 of them, would
    otherwise be scanned by a collection of the oldest generation inside whichever timed
    phase allocates next) before the next phase is timed, so on this small machine that
    work lands in neither phase: a ratio compares the two phases' own work."""
    with psycopg.connect(libpq_conninfo(url), autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE")
        conn.execute("CHECKPOINT")
    gc.collect()
