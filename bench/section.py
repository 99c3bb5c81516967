"""What a section module declares: its cases (the units ``--only`` runs) and its lines.

A case measures; a line derives one figure of the table from its case's measurements.
Keeping the two apart is what lets the console table, the JSON and docs/benchmarks.md
come from one declaration, rendered by the same few functions (``bench.table``,
``bench.docs``), and lets a section be added without touching the rendering.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import Any

from rich.console import Console

from bench.data import rows

console = Console()

# A figure: one ratio or rate, or a (lowest, highest) pair of them.
Value = float | tuple[float, ...]
# What a case measured: seconds, rounds, counts, by names its lines know.
Measured = dict[str, Any]

# The format of a (lowest, highest) pair, as a line's ``fmt``.
SPREAD = "{0[0]:.2f} to {0[1]:.2f}"


@dataclass
class Run:
    """What a case is given: the server to make its fresh databases on, the command's
    settings (``--records``, ``--repeats``, the rounds), and the JSON's own entries
    besides the figures (``results``: raw timings a reader of the JSON may want)."""

    server: str
    settings: argparse.Namespace
    results: dict[str, Any]

    @cached_property
    def data(self) -> list[tuple[bytes, bytes]]:
        """``--records`` rows, made once per run and shared by the cases that want them."""
        return rows(self.settings.records)


Case = Callable[[Run], Measured]


@dataclass(frozen=True)
class Line:
    """One line of the table.

    ``key`` names the line in code (unique over the table; ``floor`` refers to one);
    ``label`` is what the table, the docs and the JSON call the figure (the JSON's key for
    it, so it is not to be reworded lightly), formatted with its case's measurements when
    it holds ``{fields}``; ``figure`` derives the value from them; ``target`` is ``">= x"``
    or ``"report"``; ``floor`` is the key of the line measuring the most this one could
    reach, if any; ``note`` is its paragraph under "Where the gaps are" in the docs."""

    key: str
    label: str
    case: str
    figure: Callable[[Measured], Value]
    fmt: str = "{:.2f}"
    target: str = "report"
    floor: str | None = None
    note: str = ""

    def name(self, measured: Measured) -> str:
        return self.label.format_map(measured) if "{" in self.label else self.label


@dataclass(frozen=True)
class Section:
    """A section of the table: the cases it runs, in order (``--only`` names them), the
    lines it shows, in order, and the notes on how to read them.

    ``core``: its cases belong to ``--only core``; ``default``: they run without
    ``--only`` (Spark's run only with ``--spark``); ``options`` adds the section's own
    flags to the command's parser, if it has any (its cases read them from
    ``Run.settings``)."""

    name: str
    cases: Mapping[str, Case]
    lines: tuple[Line, ...]
    reading: tuple[str, ...] = ()
    core: bool = True
    default: bool = True
    options: Callable[[argparse.ArgumentParser], None] | None = None
