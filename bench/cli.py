"""``scripts/bench``'s flags, and what they run: a table of ratios against raw PostgreSQL,
bench-results.json, and with ``--write-docs`` docs/benchmarks.md."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from bench.docs import DOCS, document
from bench.runner import case_names, groups, run
from bench.section import Section, console
from bench.sections import SECTIONS
from bench.table import combine, markdown, render

ROOT = Path(__file__).resolve().parents[1]

DESCRIPTION = """kip98 benchmarks: every figure as a ratio against raw PostgreSQL measured in
the same run.

Absolute times on shared machines mean little; a ratio of two measurements taken minutes
apart on the same server means more. Each case runs on a fresh database; results are
printed as a table and written as JSON (and, with --markdown, as docs/benchmarks.md).
"""


def parser(sections: tuple[Section, ...]) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="scripts/bench", description=DESCRIPTION)
    p.add_argument("--records", type=int, default=200_000)
    p.add_argument("--repeats", type=int, default=2)
    p.add_argument("--small-txns", type=int, default=300)
    p.add_argument(
        "--txn-rounds",
        type=int,
        default=6,
        help="idempotent/transactional rounds, each side leading every other round; each "
        "side's best is compared",
    )
    p.add_argument(
        "--inflight-rounds",
        type=int,
        default=3,
        help="in-flight 5 / in-flight 1 rounds, each side leading every other round",
    )
    p.add_argument(
        "--wire-rounds",
        type=int,
        default=5,
        help="rounds of the Kafka-client figures, each side leading every other round",
    )
    p.add_argument("--latency-samples", type=int, default=100)
    p.add_argument(
        "--spark",
        action="store_true",
        help="include the Spark figures (materialisation, the kip98 data source)",
    )
    p.add_argument("--spark-records", type=int, default=1_000_000)
    p.add_argument(
        "--only",
        metavar="SECTIONS",
        help="comma-separated sections to run ("
        + ", ".join((*groups(sections), *case_names(sections)))
        + "); default: all but spark",
    )
    p.add_argument(
        "--runs",
        type=int,
        default=1,
        help="run the chosen sections this many times; each figure is then the median of "
        "the runs, with the lowest and highest beside it",
    )
    p.add_argument("--json", type=Path, default=ROOT / "bench-results.json")
    p.add_argument("--markdown", action="store_true", help="print the table as Markdown too")
    p.add_argument(
        "--write-docs", action="store_true", help="regenerate docs/benchmarks.md from this run"
    )
    p.add_argument(
        "--docs-from",
        type=Path,
        metavar="JSON",
        help="regenerate docs/benchmarks.md from a saved run's JSON (its table, today's notes)",
    )
    for section in sections:
        if section.options is not None:
            section.options(p)
    return p


def main(argv: list[str] | None = None, sections: tuple[Section, ...] = SECTIONS) -> None:
    args = parser(sections).parse_args(argv)
    if args.docs_from is not None:
        write_docs(json.loads(args.docs_from.read_text()), sections)
        return
    runs = []
    for i in range(args.runs):
        if args.runs > 1:
            console.print(f"run {i + 1} of {args.runs}")
        runs.append(run(sections, args))
    results = combine(runs) if args.runs > 1 else runs[0]
    results["command"] = " ".join(sys.argv[1:] if argv is None else argv)
    results["date"] = time.strftime("%Y-%m-%d")
    render(results)
    args.json.write_text(json.dumps(results, indent=2, default=str))
    console.print(f"wrote {args.json}")
    if args.markdown:
        print(markdown(results))
    if args.write_docs:
        write_docs(results, sections)


def write_docs(results: dict[str, Any], sections: tuple[Section, ...]) -> None:
    DOCS.write_text(document(results, sections))
    console.print("wrote docs/benchmarks.md")
