"""The overview's charts, drawn by pygal as inline SVG on the server.

pygal is a maintained charting library installed from PyPI with the rest; its JavaScript
(tooltips fetched from a CDN) is turned off (``js=()``), so a page needs no script and no
asset from anywhere: the consoles' machines have no internet. Each chart carries its
title (the SVG's ``<title>``) and a ``<desc>`` saying what it shows, for screen readers.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import pygal
from markupsafe import Markup
from pygal.etree import etree
from pygal.style import Style

Point = tuple[int, float]

_STYLE = Style(
    background="#f4f7fa",
    plot_background="#ffffff",
    foreground="#333",
    foreground_strong="#222",
    foreground_subtle="#ccc",
    colors=("#4a7bb0",),
    font_family="system-ui, sans-serif",
    title_font_size=12,
    label_font_size=10,
    major_label_font_size=10,
    no_data_font_size=12,
    value_font_size=10,
)

# What every chart shares: no script (the CDN's tooltips), no legend (one series each, named
# by the title), no XML declaration (the SVG sits inside the page).
_COMMON = {
    "style": _STYLE,
    "js": (),
    "disable_xml_declaration": True,
    "explicit_size": True,
    "show_legend": False,
    "margin": 4,
    "spacing": 4,
}


# An empty chart draws its message alone: no axes whose labels would mean nothing.
_EMPTY = {"show_x_labels": False, "show_y_labels": False, "show_y_guides": False}


# The cluster-wide series (app/console/series.py): their key → (title, unit).
SERIES = {
    "produce_rate": ("Produce rate", "records/s"),
    "commit_rate": ("Commit rate", "commits/s"),
    "commit_latency_ms": ("Commit latency", "ms"),
}


def overview(series: dict[str, Any]) -> list[dict[str, Any]]:
    """The overview's line charts: the three rates, then each busiest partition's LSO lag,
    each with an id, its title and its last value for the caption."""
    shown: list[tuple[str, str, str, list[Point]]] = [
        (key.replace("_", "-"), title, unit, series.get(key, []))
        for key, (title, unit) in SERIES.items()
    ]
    for i, (name, points) in enumerate(series.get("lso_lag", {}).items()):
        shown.append((f"lso-lag-{i}", f"LSO lag of {name}", "records", points))
    return [
        {
            "id": chart_id,
            "title": f"{title} ({unit})",
            "last": f"{points[-1][1]:.3g}" if points else "-",
            "svg": line(title, unit, points),
        }
        for chart_id, title, unit, points in shown
    ]


def overview_page(d: dict[str, Any]) -> dict[str, Any]:
    """The overview page's charts from its data (``data.overview``): the time series (for
    those who may see the cluster) and the busiest partitions' LSO lag now. The one place
    the page's charts are made, for the console and for the bench that times the page."""
    lags = [(f"{p['topic']}-{p['partition']}", p["lag"]) for p in d["lso_lag"]]
    return {
        "lag_chart": bars("LSO lag now", "records", lags),
        "charts": overview(d["series"]) if d["cluster"] else [],
    }


def _hhmm(moment: datetime) -> str:
    return moment.strftime("%H:%M")


def _accessible(desc: str) -> Callable[[Any], Any]:
    """An XML filter (pygal's hook on the SVG tree before it is written): ``role="img"``,
    a ``<desc>`` after the chart-wide ``<title>``, and no ``<script>`` (pygal writes its
    tooltips' configuration inline even when no script is loaded: nothing would read it)."""

    def apply(root: Any) -> Any:
        root.set("role", "img")
        for i, child in enumerate(list(root)):
            tag = str(child.tag).rsplit("}", 1)[-1]
            if tag == "defs":
                for script in [c for c in child if str(c.tag).endswith("script")]:
                    child.remove(script)
            elif tag == "title":
                node = etree.Element("desc")
                node.text = desc
                root.insert(i + 1, node)
        return root

    return apply


def _svg(chart: Any) -> Markup:
    return Markup(chart.render(is_unicode=True))


def line(title: str, unit: str, points: list[Point], width: int = 320, height: int = 190) -> Markup:
    """A time series over the window (epoch ms → value): time in UTC along x, ``unit`` up
    y, from 0. Fewer than two points draw no line: the chart says so instead."""
    if len(points) >= 2:
        start, end = _hhmm(_utc(points[0][0])), _hhmm(_utc(points[-1][0]))
        desc = f"{unit} from {start} to {end} UTC, {len(points)} points, last {points[-1][1]:.3g}"
        look: dict[str, Any] = {"include_x_axis": True}
    else:
        desc = f"{unit}: fewer than two points in the window, no line drawn"
        look = _EMPTY
    chart = pygal.DateTimeLine(
        **_COMMON,
        **look,
        width=width,
        height=height,
        title=title,
        y_title=unit,
        x_title="time (UTC)",
        x_value_formatter=_hhmm,
        show_dots=False,
        min_scale=2,
        max_scale=4,
        no_data_text="one point" if points else "none in the window",
    )
    if len(points) >= 2:
        chart.add(unit, [(_utc(t), v) for t, v in points])
    chart.add_xml_filter(_accessible(desc))
    return _svg(chart)


def bars(title: str, unit: str, values: list[tuple[str, int]], width: int = 480) -> Markup:
    """One horizontal bar per label (the busiest partitions' LSO lag now), busiest on top."""
    desc = "; ".join(f"{label}: {v}" for label, v in values) or "no partitions"
    chart = pygal.HorizontalBar(
        **_COMMON,
        **({"show_x_guides": False} if values else _EMPTY),
        width=width,
        height=60 + 24 * max(len(values), 1),
        title=title,
        x_title=unit,
        no_data_text="no partitions",
        print_values=True,
    )
    if values:  # pygal puts the first label at the bottom
        chart.x_labels = [label for label, _ in reversed(values)]
        chart.add(unit, [v for _, v in reversed(values)])
    chart.add_xml_filter(_accessible(desc))
    return _svg(chart)


def _utc(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, UTC)
