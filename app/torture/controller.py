"""One torture run: set up, start the fleet, let the nemesis loose, quiesce, dump, judge.

By default the run owns a private embedded PostgreSQL under ``OUT/pg`` (so it may crash
and restart it without disturbing anyone), with ``--standbys N`` hot standbys if asked
(the failover fault then joins the others: ``app.torture.failover``); ``--database-url``
points it at an existing, empty database instead, and the server-restart fault is then
left out. The private server
keeps synchronous commits: with them off, a crash loses acknowledged commits by design,
which would show up here as lost writes that are no fault of the code under test.
"""

from __future__ import annotations

import json
import os
import random
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import create_engine

from app.admin import AdminClient, NewTopic
from app.errors import KafkaError, KafkaException
from app.storage.embedded import EmbeddedPostgres
from app.storage.migrate import upgrade_to_head
from app.storage.replica_set import EmbeddedReplicaSet
from app.storage.urls import sqlalchemy_url
from app.torture import checker, dump
from app.torture.copier import GROUP, transform
from app.torture.faults import Nemesis
from app.torture.history import load_histories
from app.torture.processes import Fleet
from app.torture.racer import RACERS
from app.torture.report import print_summary
from app.torture.workload import COPY_TOPIC, PARTITIONS, TOPIC

COORDINATORS = 2
TOPICS = [TOPIC, COPY_TOPIC]


class NotEmpty(Exception):
    """The database given for a run holds another run's topics."""


@dataclass
class RunConfig:
    duration_s: float
    workers: int
    copiers: int
    seed: int
    out: Path
    database_url: str | None = None
    quiesce_s: float = 90.0
    # Counts the histories must show before the faults stop (``checker.progress``), and
    # every kind of fault injected: the run goes on past duration_s until they are, up to
    # max_duration_s (default: duration_s), so what a run covers is not a matter of the
    # machine's speed.
    goals: dict[str, int] = field(default_factory=dict)
    max_duration_s: float | None = None
    standbys: int = 0


def _start_private_server(out: Path, standbys: int) -> tuple[EmbeddedReplicaSet, str]:
    """The run's own nodes: a primary and ``standbys`` synchronous standbys (ANY 1), and
    the URL naming every one of them."""
    cluster = EmbeddedReplicaSet(out / "pg")
    previous = os.environ.get("KIP98_EMBEDDED_DURABILITY")
    os.environ["KIP98_EMBEDDED_DURABILITY"] = "on"
    try:
        layout = cluster.start(standbys=standbys)
    finally:
        if previous is None:
            os.environ.pop("KIP98_EMBEDDED_DURABILITY", None)
        else:
            os.environ["KIP98_EMBEDDED_DURABILITY"] = previous
    return cluster, cluster.url(layout)


def _wait_until(predicate: Any, deadline_s: float, step: float = 0.5) -> bool:
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        try:
            if predicate():
                return True
        except Exception:
            pass  # the database may still be coming back
        time.sleep(step)
    return False


def run(cfg: RunConfig) -> checker.Result:
    out = cfg.out
    out.mkdir(parents=True, exist_ok=True)
    cluster: EmbeddedReplicaSet | None = None
    server: EmbeddedPostgres | None = None
    if cfg.database_url:
        url = cfg.database_url
    else:
        cluster, url = _start_private_server(out, cfg.standbys)
        server = cluster.primary()
    meta: dict[str, Any] = {
        "seed": cfg.seed,
        "duration_s": cfg.duration_s,
        "workers": cfg.workers,
        "copiers": cfg.copiers,
        "database": "private embedded" if server else "given url",
        "standbys": cfg.standbys,
        "out": str(out),
    }
    (out / "run.json").write_text(json.dumps(meta, indent=2))
    upgrade_to_head(url)
    admin = AdminClient({"database.url": url})
    for name, future in admin.create_topics([NewTopic(t, PARTITIONS) for t in TOPICS]).items():
        try:
            future.result()
        except KafkaException as exc:
            if exc.error.code() != KafkaError.TOPIC_ALREADY_EXISTS:
                raise
            raise NotEmpty(
                f"the database already has topic {name!r}: a run is judged on everything in "
                "its database, so --database-url must name an empty one (or leave it out for "
                "a private server)"
            ) from exc
    engine = create_engine(sqlalchemy_url(url), pool_pre_ping=True)
    rng = random.Random(cfg.seed)
    fleet = Fleet(url, out, cfg.seed)
    fleet.add("coordinator", COORDINATORS)
    fleet.add("worker", cfg.workers)
    fleet.add("copier", cfg.copiers)
    fleet.add("racer", RACERS)
    nemesis = Nemesis(fleet, url, out, rng, server, cluster if cfg.standbys else None)
    try:
        for role in fleet.roles:
            fleet.start(role)
        started = time.monotonic()
        end = started + cfg.duration_s
        give_up = started + max(cfg.duration_s, cfg.max_duration_s or 0.0)

        def going_on() -> bool:
            now = time.monotonic()
            return now < end or (now < give_up and not reached(cfg.goals, nemesis, out))

        while going_on():
            nemesis.sleep(rng.uniform(1.0, 3.0))
            if going_on():
                nemesis.inject(nemesis.next_kind())
        meta["faults_s"] = round(time.monotonic() - started, 1)
        meta["faults_missing"] = list(nemesis.pending)
        meta["goals_missing"] = missing(cfg.goals, out)
        quiesce(fleet, nemesis, engine, cfg.quiesce_s)
        final = dump.final_read(url, engine, TOPICS, PARTITIONS, deadline_s=cfg.quiesce_s)
        copy = {"group": GROUP, "input": TOPIC, "output": COPY_TOPIC, "partitions": PARTITIONS}
        log_dump = dump.dump_log(engine, TOPICS, copy)
        log_dump["final_read"] = final
    finally:
        fleet.close()
        engine.dispose()
        if cluster is not None:
            cluster.stop()
            # The dump is what a replay needs; the nodes themselves are only disk space.
            for name in cluster.layout().nodes:
                node_data = cluster.node(name).data_dir.resolve().parent
                shutil.rmtree(node_data, ignore_errors=True)
    (out / "dump.json").write_text(json.dumps(log_dump))
    return judge(out, meta)


def missing(goals: dict[str, int], out: Path) -> dict[str, int]:
    """The goals the run's histories do not show yet, with the counts they show."""
    if not goals:
        return {}
    counts = checker.progress(load_histories(out / "history"))
    return {
        name: counts.get(name, 0) for name, least in goals.items() if counts.get(name, 0) < least
    }


def reached(goals: dict[str, int], nemesis: Nemesis, out: Path) -> bool:
    return not nemesis.pending and not missing(goals, out)


def quiesce(fleet: Fleet, nemesis: Nemesis, engine: Any, deadline_s: float) -> None:
    """Stop the writers (workers and racers), let the copiers catch up and the
    coordinators settle every transaction, then stop the rest."""
    for role in fleet.roles:
        if role.paused:
            fleet.signal(role, signal.SIGCONT)
            role.paused = False
    fleet.stop(fleet.of("worker") + fleet.of("racer"), grace_s=20)

    def copied() -> bool:
        nemesis.supervise()
        bounds = dump.partition_bounds(engine, [TOPIC])
        offsets = {(t, p): o for t, p, o in dump.group_offsets(engine).get(GROUP, [])}
        return all(
            b["last_stable_offset"] == b["next_offset"]
            and offsets.get((TOPIC, b["partition"]), 0) == b["next_offset"]
            for b in bounds
        )

    _wait_until(copied, deadline_s)
    fleet.stop(fleet.of("copier"), grace_s=20)

    def settled() -> bool:
        return all(
            b["last_stable_offset"] == b["next_offset"]
            for b in dump.partition_bounds(engine, TOPICS)
        )

    _wait_until(settled, deadline_s / 2)
    fleet.stop(fleet.of("coordinator"), grace_s=10)


def judge(out: Path, meta: dict[str, Any] | None = None) -> checker.Result:
    """Check a kept run directory (also used to re-judge an old run)."""
    meta = meta or json.loads((out / "run.json").read_text())
    events = load_histories(out / "history")
    log_dump = json.loads((out / "dump.json").read_text())
    result = checker.check(events, log_dump, transform=transform)
    (out / "anomalies.json").write_text(json.dumps(result.anomalies, indent=1, default=str))
    (out / "summary.json").write_text(
        json.dumps({"meta": meta, "stats": result.stats, "anomalies": result.counts()}, indent=1)
    )
    print_summary(result, meta)
    return result
