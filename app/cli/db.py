"""``kip98 db``: the embedded PostgreSQL's life cycle, migrations and projection rebuilds.

``start``/``stop``/``status``/``failover`` manage the embedded server under ``KIP98_HOME``
(with ``--standbys N``, the primary and its N hot standbys: ``storage.replica_set``); ``url``,
``psql``, ``migrate`` and ``rebuild`` act on whatever database kip98 would use (``KIP98_DATABASE_URL``
when set, else the embedded server, started on demand).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Mapping
from typing import Any

import click

from app.cli.errors import CliError
from app.cli.output import emit, output_option, stderr_console
from app.storage import urls
from app.storage.engine import get_engine, resolve_url
from app.storage.replica_set import EmbeddedReplicaSet, Layout, NodeStatus, ReplicaSetError
from app.storage.urls import with_target


def safe_url(url: str) -> str:
    """The URL with any password masked, for printing."""
    return urls.safe(url)


def _status_record(nodes: list[NodeStatus], set_url: str | None) -> dict[str, Any]:
    """The primary's keys (as before standbys existed), then every node."""
    primary = nodes[0]
    explicit = os.environ.get("KIP98_DATABASE_URL")
    return {
        "running": primary.running,
        "pid": primary.pid,
        "port": primary.port if primary.running else None,
        "data_dir": primary.data_dir,
        "url": primary.url,
        "database_url": safe_url(explicit) if explicit else set_url,
        "nodes": [n.record() for n in nodes],
    }


def _progress(message: str) -> None:
    stderr_console().log(message)


def _started(replica_set: EmbeddedReplicaSet, layout: Layout) -> None:
    for node in replica_set.nodes():
        if node.role == "primary":
            click.echo(f"PostgreSQL running (pid {node.pid}, port {node.port}): {node.url}")
        else:
            state = node.sync_state or "not streaming"
            click.echo(f"standby {node.name} running (pid {node.pid}, port {node.port}): {state}")
    if layout.standbys:
        click.echo(f"primary and {layout.standbys} standbys, {layout.min_insync} synchronous: "
                   f"{replica_set.url(layout)}")  # fmt: skip


@click.group()
def db() -> None:
    """The database: the embedded PostgreSQL (the primary and its standbys), migrations,
    rebuilds."""


@db.command()
@click.option(
    "--standbys",
    type=int,
    default=None,
    help="Hot standbys streaming from the primary (default: those it had, else 0); remembered.",
)
@click.option(
    "--min-insync-standbys",
    type=int,
    default=None,
    help="Standbys that must confirm an acks=all commit (default 1 with any standby).",
)
def start(standbys: int | None, min_insync_standbys: int | None) -> None:
    """Start the embedded PostgreSQL: the primary and its standbys (nothing happens for
    what runs)."""
    replica_set = EmbeddedReplicaSet()
    with stderr_console().status("starting PostgreSQL"):
        layout = replica_set.start(standbys, min_insync_standbys, progress=_progress)
    _started(replica_set, layout)


@db.command()
def stop() -> None:
    """Stop the embedded PostgreSQL: the primary, then its standbys."""
    if EmbeddedReplicaSet().stop():
        click.echo("PostgreSQL stopped")
    else:
        click.echo("PostgreSQL was not running")


@db.command()
@output_option
def status(output: str) -> None:
    """Show whether the embedded PostgreSQL runs, and where: the primary, then each of its
    standbys (role, port, pid, data directory, WAL position, replay lag, sync state)."""
    replica_set = EmbeddedReplicaSet()
    nodes = replica_set.nodes()
    try:
        set_url: str | None = replica_set.url()
    except ReplicaSetError:
        set_url = None
    record = _status_record(nodes, set_url)
    if output == "json":
        emit(record, output)
        return
    emit({k: v for k, v in record.items() if k != "nodes"}, output)
    if len(nodes) > 1:
        emit([n.record() for n in nodes], output,
             columns=["name", "role", "running", "port", "pid", "lsn", "replay_lag_bytes",
                      "sync_state", "data_dir"])  # fmt: skip


def _url(standby: bool) -> str:
    """The URL kip98 uses, or one reaching a standby, as users write it."""
    if not standby:
        return urls.parse(resolve_url()).render()
    explicit = os.environ.get("KIP98_DATABASE_URL")
    if explicit:
        return with_target(explicit, "standby")
    replica_set = EmbeddedReplicaSet()
    layout = replica_set.start()
    if layout.standbys == 0:
        raise CliError("the embedded PostgreSQL has no standbys (kip98 db start --standbys N)")
    return replica_set.url(layout, standby=True)


@db.command()
@click.option("--standby", is_flag=True, help="A URL that reaches a standby instead.")
@click.option("--libpq", is_flag=True,
              help="As psql and libpq take it: postgresql://, no +psycopg, every host.")  # fmt: skip
def url(standby: bool, libpq: bool) -> None:
    """Print the SQLAlchemy URL kip98 uses (starting the embedded server if needed): with
    standbys, the address of the primary and of each standby, reaching whichever is the
    primary."""
    found = _url(standby)
    click.echo(urls.parse(found).libpq() if libpq else found)


@db.command(context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False})
@click.option("--standby", is_flag=True, help="On a standby instead of the primary.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def psql(standby: bool, args: tuple[str, ...]) -> None:
    """Open psql on the database kip98 uses (kip98 db url --libpq); ARGS go to psql, as in
    kip98 db psql -c 'select * from partition_status'."""
    program = shutil.which("psql")
    if program is None:
        raise CliError("psql is not installed (Debian: apt-get install postgresql-client)")
    target = urls.parse(_url(standby))
    env = dict(os.environ)
    if target.password is not None:  # not on the command line, where ps shows it
        env["PGPASSWORD"] = target.password
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(program, [program, "--dbname", target.libpq(with_password=False), *args], env)


@db.command()
def failover() -> None:
    """Promote the most advanced live standby to primary; the other standbys follow it,
    and the old primary rejoins as a standby when started again."""
    replica_set = EmbeddedReplicaSet()
    with stderr_console().status("failing over"):
        chosen = replica_set.failover(progress=_progress)
    layout = replica_set.layout()
    click.echo(f"{chosen} is the primary (port {layout.ports[chosen]}): {replica_set.url(layout)}")


@db.command()
def migrate() -> None:
    """Upgrade the schema to the newest revision."""
    from alembic.script import ScriptDirectory

    from app.storage.migrate import alembic_config, upgrade_to_head

    target = resolve_url()
    with stderr_console().status(f"migrating {safe_url(target)}"):
        upgrade_to_head(target)
    head = ScriptDirectory.from_config(alembic_config(target)).get_current_head()
    click.echo(f"schema at revision {head}: {safe_url(target)}")


@db.command()
def rebuild() -> None:
    """Recompute every projection from its event log."""
    try:
        from app.broker.rebuild import rebuild_all  # type: ignore[import-not-found, unused-ignore]
    except ImportError as exc:
        raise CliError(f"rebuild is not available: {exc}") from exc
    result = rebuild_all(get_engine())
    if isinstance(result, Mapping):
        for name, count in result.items():
            click.echo(f"{name}: {count}")
    click.echo("projections rebuilt")
