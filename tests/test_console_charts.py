"""The overview's charts (app/console/charts.py), drawn by pygal as inline SVG: a line per
series with its axes' units, a title and a description; the fewer-than-two-points message;
the LSO lag bars busiest on top; no script and nothing fetched from anywhere."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from app.console import charts

NS = "{http://www.w3.org/2000/svg}"
T0 = 1_795_000_000_000  # epoch ms


def _svg(markup: str) -> ET.Element:
    assert "<script" not in markup and "kozea.github.io" not in markup  # no CDN, no JS
    root = ET.fromstring(markup)
    assert root.tag == f"{NS}svg" and root.get("role") == "img"
    return root


def _texts(root: ET.Element) -> list[str]:
    return [t.text or "" for t in root.iter(f"{NS}text")]


def test_a_series_is_drawn_as_a_line_with_its_units_title_and_description() -> None:
    points = [(T0 + i * 30_000, float(i)) for i in range(20)]
    root = _svg(charts.line("Commit rate", "commits/s", points))
    assert root.findtext(f"{NS}title") == "Commit rate"
    desc = root.findtext(f"{NS}desc") or ""
    assert "commits/s" in desc and "20 points" in desc and "last 19" in desc
    lines = [p for p in root.iter(f"{NS}path") if "line" in (p.get("class") or "").split()]
    drawn = [p for p in lines if "reactive" in (p.get("class") or "")]
    assert len(drawn) == 1  # the series, not the axes' guides
    assert len(re.findall(r"\d+\.\d+ \d+\.\d+", drawn[0].get("d") or "")) == 20
    texts = _texts(root)
    assert "commits/s" in texts and "time (UTC)" in texts  # both axes' titles
    assert any(re.fullmatch(r"\d\d:\d\d", t) for t in texts)  # times along x


def test_fewer_than_two_points_draw_no_line_but_say_so() -> None:
    for points, word in (([], "none in the window"), ([(T0, 3.0)], "one point")):
        root = _svg(charts.line("Produce rate", "records/s", points))
        assert word in _texts(root)
        assert "fewer than two points" in (root.findtext(f"{NS}desc") or "")
        assert not [p for p in root.iter(f"{NS}path") if "reactive" in (p.get("class") or "")]


def test_the_lso_lag_bars_put_the_busiest_partition_on_top() -> None:
    root = _svg(charts.bars("LSO lag now", "records", [("t-0", 120), ("t-1", 4), ("u-2", 0)]))
    assert root.findtext(f"{NS}title") == "LSO lag now"
    assert root.findtext(f"{NS}desc") == "t-0: 120; t-1: 4; u-2: 0"
    bars = [r for r in root.iter(f"{NS}rect") if r.get("class") == "rect reactive tooltip-trigger"]
    assert len(bars) == 3
    ys = {float(r.get("y") or 0): float(r.get("width") or 0) for r in bars}
    assert [w > 0 for _y, w in sorted(ys.items())] == [True, True, False]  # t-0 above t-1
    assert max(ys.items())[1] == 0 and min(ys.items())[1] == max(ys.values())
    assert "no partitions" in _texts(_svg(charts.bars("LSO lag now", "records", [])))


def test_the_overview_draws_the_rates_then_each_busiest_partitions_lag() -> None:
    points = [(T0, 1.0), (T0 + 30_000, 2.5)]
    drawn = charts.overview(
        {"produce_rate": points, "commit_rate": [], "lso_lag": {"t-0": points, "t-1": []}}
    )
    assert [c["id"] for c in drawn] == [
        "produce-rate", "commit-rate", "commit-latency-ms", "lso-lag-0", "lso-lag-1",
    ]  # fmt: skip
    assert [c["title"] for c in drawn][::3] == [
        "Produce rate (records/s)",
        "LSO lag of t-0 (records)",
    ]
    assert [c["last"] for c in drawn] == ["2.5", "-", "-", "2.5", "-"]
    for c in drawn:
        _svg(str(c["svg"]))
