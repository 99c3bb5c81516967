"""``python -m app.torture [run] [--duration S] [--workers N] [--seed N] [--out DIR]``; the
roles (``worker``, ``copier``, ``racer``, ``coordinator``) are the run's child processes;
``check DIR`` judges a kept run again."""

from __future__ import annotations

import argparse
import logging
import random
import signal
import sys
from pathlib import Path


def _role_parser(name: str, sub: argparse._SubParsersAction) -> argparse.ArgumentParser:
    p = sub.add_parser(name)
    p.add_argument("--index", type=int, required=True)
    p.add_argument("--incarnation", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--url", required=True)
    p.add_argument("--out", type=Path, required=True)
    return p


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="torture", description="Verification under faults.")
    sub = ap.add_subparsers(dest="command")
    run = sub.add_parser("run", help="run a torture test (the default)")
    run.add_argument("--duration", type=float, default=150.0, help="seconds of faults")
    run.add_argument("--workers", type=int, default=3)
    run.add_argument("--copiers", type=int, default=2)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--out", type=Path, default=None, help="default: KIP98_HOME/torture/SEED")
    run.add_argument("--database-url", default=None, help="an empty database (no server restarts)")
    run.add_argument(
        "--standbys", type=int, default=0, help="hot standbys of the private server (failovers)"
    )
    check = sub.add_parser("check", help="judge a kept run directory again")
    check.add_argument("dir", type=Path)
    for role in ("worker", "copier", "racer", "coordinator"):
        _role_parser(role, sub)
    return ap


def _coordinator(url: str) -> None:
    from app.broker import Broker
    from app.broker.loop import CoordinatorLoop

    loop = CoordinatorLoop(Broker.connect(url))
    signal.signal(signal.SIGTERM, lambda *_: loop._stop.set())
    loop.run_forever()
    try:
        loop.release_leases()
    except Exception:
        logging.getLogger(__name__).exception("could not release the leases")


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0].startswith("-"):
        argv = ["run", *argv]
    args = parser().parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    if args.command == "run":
        from app.torture.controller import NotEmpty, RunConfig, run

        seed = args.seed if args.seed is not None else random.SystemRandom().randrange(10**6)
        from app.storage.embedded import kip98_home

        out = args.out or kip98_home() / "torture" / str(seed)
        cfg = RunConfig(
            args.duration, args.workers, args.copiers, seed, out.resolve(), args.database_url,
            standbys=args.standbys,
        )  # fmt: skip
        from app.storage.replica_set import ReplicaSetError

        try:
            return 0 if run(cfg).ok else 1
        except (NotEmpty, ReplicaSetError) as exc:
            print(f"torture: {exc}", file=sys.stderr)
            return 2
    if args.command == "check":
        from app.torture.controller import judge

        return 0 if judge(args.dir).ok else 1
    if args.command == "coordinator":
        _coordinator(args.url)
        return 0
    if args.command in ("worker", "racer", "copier"):
        from app.torture.copier import TortureCopier
        from app.torture.racer import Racer
        from app.torture.workload import ProcessArgs, Worker

        started = ProcessArgs(
            args.index, args.incarnation, getattr(args, "seed", 0), args.url, args.out
        )
        if args.command == "worker":
            Worker(started).run()
        elif args.command == "racer":
            Racer(started).run()
        else:
            TortureCopier(started).run()
        return 0
    return 2


if __name__ == "__main__":
    sys.exit(main())
