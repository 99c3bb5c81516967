"""A run: the chosen cases, in the sections' order, each case's lines derived from what it
measured as soon as it has run."""

from __future__ import annotations

import argparse
import os
import platform
from typing import Any

from app.storage.replica_set import database_url
from bench.data import KEY_BYTES, VALUE_BYTES
from bench.section import Line, Run, Section
from bench.table import add_figures


def case_names(sections: tuple[Section, ...]) -> tuple[str, ...]:
    """Every case ``--only`` can name, in the order they run."""
    return tuple(name for section in sections for name in section.cases)


def groups(sections: tuple[Section, ...]) -> dict[str, tuple[str, ...]]:
    """The names ``--only`` takes for several cases at once: ``core``, every case of the
    sections that run in process (not the wire's, the cleaner's or Spark's)."""
    return {"core": tuple(n for s in sections if s.core for n in s.cases)}


def chosen(sections: tuple[Section, ...], only: str | None, spark: bool) -> set[str]:
    """The cases ``--only`` (and ``--spark``) select; exits on an unknown name. Without
    ``--only``, every section's cases that run by default."""
    names: set[str] = set()
    if not only:
        names = {n for s in sections if s.default for n in s.cases}
    else:
        known = case_names(sections)
        for name in filter(None, (n.strip() for n in only.split(","))):
            if name in groups(sections):
                names.update(groups(sections)[name])
            elif name in known:
                names.add(name)
            else:
                choices = ", ".join((*groups(sections), *known))
                raise SystemExit(f"unknown --only section {name!r} (choose from {choices})")
    if spark:
        names.update(n for s in sections if s.name.startswith("spark") for n in s.cases)
    return names


def lines_of(sections: tuple[Section, ...], case: str) -> list[Line]:
    """The lines derived from ``case``'s measurements, in the sections' order (a section
    may show figures from another's case: the reads of the Producer's rows)."""
    return [line for section in sections for line in section.lines if line.case == case]


def run(sections: tuple[Section, ...], settings: argparse.Namespace) -> dict[str, Any]:
    """One run of the chosen cases: the JSON's results, figures and all."""
    server = os.environ.get("KIP98_DATABASE_URL") or database_url()
    results: dict[str, Any] = {
        "records": settings.records,
        "key_bytes": KEY_BYTES,
        "value_bytes": VALUE_BYTES,
    }
    results["figures"], results["formats"] = [], {}
    context = Run(server, settings, results)
    wanted = chosen(sections, settings.only, settings.spark)
    for section in sections:
        for name, case in section.cases.items():
            if name in wanted:
                add_figures(results, lines_of(sections, name), case(context))
    results["machine"] = {"cpus": os.cpu_count(), "python": platform.python_version()}
    return results
