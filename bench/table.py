"""The table of figures, rendered from the lines: a run's figures, the console table, the
Markdown table, and several runs combined into one."""

from __future__ import annotations

import statistics
from collections.abc import Iterable
from typing import Any

from rich.table import Table

from bench.data import KEY_BYTES, VALUE_BYTES
from bench.section import Line, Measured, Value, console

# A figure as the JSON lists it: its name, its value as shown, its target, the verdict.
Figure = tuple[str, str, str, str]


def verdict(value: Value, target: str) -> str:
    """``ok``, or ``below`` a ``>= x`` target (a spread is never judged)."""
    if target == "report" or isinstance(value, tuple):
        return "ok"
    return "ok" if value >= float(target.split()[-1]) else "below"


def add_figures(results: dict[str, Any], lines: Iterable[Line], measured: Measured) -> None:
    """Each of ``lines``' figure from ``measured`` into ``results``: under its name, with
    its format under ``formats`` and its row under ``figures``."""
    figures = results.setdefault("figures", [])
    formats = results.setdefault("formats", {})
    for line in lines:
        name, value = line.name(measured), line.figure(measured)
        results[name] = value
        formats[name] = line.fmt
        figures.append((name, line.fmt.format(value), line.target, verdict(value, line.target)))


def combine(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """Several runs of the same figures as one: each figure's median over the runs, with
    the lowest and highest run beside it (a figure that is itself a spread keeps the first
    run's), judged against its target by the median."""
    first = runs[0]
    combined = {**first, "runs": [{n: r[n] for n, *_ in r["figures"]} for r in runs]}
    figures: list[Figure] = []
    for name, shown, target, _ in first["figures"]:
        values = [r[name] for r in runs if name in r]
        if any(isinstance(v, tuple) for v in values):
            figures.append((name, shown, target, "ok"))
            continue
        fmt = first["formats"][name]
        middle = statistics.median(values)
        combined[name] = middle
        spread = f"{fmt.format(min(values))} to {fmt.format(max(values))}"
        figures.append((name, f"{fmt.format(middle)} ({spread})", target, verdict(middle, target)))
    combined["figures"] = figures
    return combined


def render(results: dict[str, Any]) -> None:
    """The figures as a table on the console."""
    table = Table(
        title=f"kip98 bench — {results['records']:,} records of {KEY_BYTES}+{VALUE_BYTES} bytes"
    )
    for col in ("figure", "value", "target", ""):
        table.add_column(col)
    for name, value, target, judged in results["figures"]:
        table.add_row(name, value, target, judged)
    console.print(table)


def markdown(results: dict[str, Any]) -> str:
    """The figures as a Markdown table."""
    runs = len(results.get("runs", ()))
    value = f"median of {runs} runs (lowest to highest)" if runs > 1 else "value"
    lines = [
        f"| figure | {value} | target |",
        "|---|---|---|",
        *(f"| {name} | {value} | {target} |" for name, value, target, _ in results["figures"]),
    ]
    return "\n".join(lines)
