"""The benchmarks' table is declared whole, and a short run renders it.

The figures themselves are not judged here (they depend on the machine); what is checked
is that every line can be derived from what its case measures, against a real server, and
that the JSON, the Markdown and docs/benchmarks.md are rendered from the declaration.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bench.cli import main
from bench.docs import document
from bench.runner import case_names, chosen, lines_of
from bench.sections import SECTIONS
from bench.table import combine

LINES = [line for section in SECTIONS for line in section.lines]


def test_each_line_is_declared_once_and_refers_to_what_exists() -> None:
    cases = case_names(SECTIONS)
    assert len(cases) == len(set(cases)), "a case name in two sections"
    keys = [line.key for line in LINES]
    assert len(keys) == len(set(keys))
    labels = [line.label for line in LINES]
    assert len(labels) == len(set(labels)), "two lines would share a JSON key"
    for line in LINES:
        assert line.case in cases, line.key
        assert line.floor is None or line.floor in keys, line.key
        assert line.target == "report" or line.target.startswith(">= "), line.key


def test_only_names_cases_and_groups() -> None:
    assert chosen(SECTIONS, "core", spark=False) == {
        name for section in SECTIONS if section.core for name in section.cases
    }
    assert "spark" not in chosen(SECTIONS, None, spark=False)
    assert "spark" in chosen(SECTIONS, None, spark=True)
    with pytest.raises(SystemExit, match="unknown --only section 'nope'"):
        chosen(SECTIONS, "handler,nope", spark=False)


def test_runs_combine_into_medians_with_their_spread() -> None:
    def one(value: float, spread: tuple[float, float]) -> dict[str, object]:
        return {
            "records": 10,
            "x": value,
            "s": spread,
            "formats": {"x": "{:.2f}", "s": "{0[0]:.2f} to {0[1]:.2f}"},
            "figures": [("x", f"{value:.2f}", ">= 0.8", ""), ("s", "", "report", "ok")],
        }

    combined = combine([one(0.7, (1, 2)), one(0.9, (3, 4)), one(0.85, (5, 6))])
    assert combined["x"] == 0.85
    assert combined["figures"][0] == ("x", "0.85 (0.70 to 0.90)", ">= 0.8", "ok")
    assert combined["figures"][1][1] == "", "a spread keeps the first run's"
    assert [r["x"] for r in combined["runs"]] == [0.7, 0.9, 0.85]


def test_a_short_run_renders_every_line_of_its_cases(
    server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("KIP98_DATABASE_URL", server_url)
    out = tmp_path / "bench.json"
    only = ["handler", "client1000", "small-txns", "aborts"]
    flags = ["--records", "2000", "--repeats", "1", "--small-txns", "5", "--json", str(out)]
    main([*flags, "--only", ",".join(only)])
    results = json.loads(out.read_text())
    wanted = [line for case in only for line in lines_of(SECTIONS, case)]
    assert [f[0] for f in results["figures"]] == [line.label for line in wanted]
    for line in wanted:
        assert isinstance(results[line.label], float)
        assert results["formats"][line.label] == line.fmt
    assert results["raw_copy_rows_per_s"] > 0 and results["idempotent_rows_per_s"] > 0

    doc = document(results, SECTIONS)
    for name, shown, target, _ in results["figures"]:
        assert f"| {name} | {shown} | {target} |" in doc
    for line in LINES:
        if line.note:
            assert "- " + line.note.replace("\n", "\n  ") in doc
    for section in SECTIONS:
        for text in section.reading:
            assert "- " + text.replace("\n", "\n  ") in doc


@pytest.mark.timeout(1800)
def test_the_kafka_section_sets_kip98_against_kafka_by_kafkas_own_tools(
    server_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every line of the Kafka section comes out of one short run against both brokers
    (a kip98 serve and a Kafka broker, driven by Kafka's load tools), each ratio being
    kip98's figure over Kafka's; the profile of serve names its top costs."""
    monkeypatch.setenv("KIP98_DATABASE_URL", server_url)
    out, profile = tmp_path / "bench.json", tmp_path / "serve.txt"
    flags = ["--kafka-records", "300", "--kafka-scale", "1", "--kafka-latency-records", "3"]
    flags += ["--kafka-txns", "3", "--kafka-profile", str(profile), "--json", str(out)]
    main([*flags, "--only", "kafka"])
    results = json.loads(out.read_text())

    lines = lines_of(SECTIONS, "kafka")
    names = {line.key: line.name(results["kafka_durability"]) for line in lines}
    assert [f[0] for f in results["figures"]] == list(names.values())
    for line in lines:
        assert results[names[line.key]] > 0, line.key
    rates = results["kafka_rates"]
    for workload in ("p100_acks1", "p100_idem", "p1k_acks1", "p1k_idem", "txn_100ms", "txn_1"):
        ratio = rates[workload]["kip98"] / rates[workload]["kafka"]
        assert results[names[f"vs_{workload}"]] == pytest.approx(ratio)
    within = rates["txn_100ms"]["kafka"] / rates["p1k_idem"]["kafka"]
    assert results[names["kafka_txn_100ms"]] == pytest.approx(within)
    pair = rates["p100_idem"]["kip98"] / rates["p100_idem_flushed"]["kafka"]
    assert results[names["vs_p100_flushed"]] == pytest.approx(pair)
    assert names["vs_p100_relaxed"].startswith("equal durability: kip98 (")
    assert "synchronous_commit=off" in results["kafka_durability"]["kip98_relaxed"]

    assert profile.exists(), "py-spy wrote no profile of kip98 serve"
    assert set(results["kafka_serve_profile"]) == {"gil_held", "own", "inclusive"}
