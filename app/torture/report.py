"""The summary a person reads after a run: what was done, what was injected, what broke."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table

from app.torture.checker import Result


def summary_tables(result: Result, meta: dict[str, Any]) -> list[Table]:
    s = result.stats
    run = Table(title="torture run", show_header=False)
    for key in ("seed", "duration_s", "workers", "copiers", "database", "out"):
        run.add_row(key, str(meta.get(key)))
    ops = Table(title="operations")
    ops.add_column("operation")
    for col in ("invoke", "ok", "fail", "info"):
        ops.add_column(col, justify="right")
    names = sorted({k.split(":")[0] for k in s["operations"]})
    for name in names:
        ops.add_row(
            name,
            *(str(s["operations"].get(f"{name}:{t}", 0)) for t in ("invoke", "ok", "fail", "info")),
        )
    txns = Table(title="transactions")
    txns.add_column("by")
    for col in ("committed (ok)", "aborted (fail)", "unknown (info)"):
        txns.add_column(col, justify="right")
    for group in ("worker", "copier"):
        t = s[f"{group}_transactions"]
        txns.add_row(group, str(t["ok"]), str(t["fail"]), str(t["info"]))
    resolved = s.get("info_resolved", {})
    txns.caption = (
        f"worker info with sends resolved from the log: {resolved.get('committed', 0)} committed, "
        f"{resolved.get('aborted', 0)} aborted; {s['reads']} records polled; "
        f"committed records {s['committed_records']}"
    )
    faults = Table(title="faults injected")
    faults.add_column("kind")
    faults.add_column("count", justify="right")
    for kind, n in sorted(s["faults"].items()):
        faults.add_row(kind, str(n))
    waited = s.get("longest_wait_beside_a_stop")
    if waited:
        faults.caption = (
            f"longest wait of a client while another process was stopped: {waited['seconds']} s"
            f" ({waited['process']}'s {waited['step']}, {waited['while_stopped']} stopped)"
        )
    anomalies = Table(title="anomalies")
    anomalies.add_column("check")
    anomalies.add_column("count", justify="right")
    for kind, n in result.counts().items():
        anomalies.add_row(kind, f"[red]{n}[/red]" if n else "0")
    anomalies.caption = "PASS: no anomaly" if result.ok else "FAIL: see anomalies.json"
    return [run, ops, txns, faults, anomalies]


def print_summary(result: Result, meta: dict[str, Any], console: Console | None = None) -> None:
    console = console or Console()
    for table in summary_tables(result, meta):
        console.print(table)
