"""Run the installed ``kip98`` entry point as users do: a real process, a real exit code."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

KIP98_BIN = Path(sys.executable).with_name("kip98")


def run_kip98(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(KIP98_BIN), *args],
        capture_output=True,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=timeout,
    )
