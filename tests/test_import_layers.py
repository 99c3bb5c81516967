"""The layer contracts of docs/architecture.md are checked, and the check has teeth.

``scripts/test`` runs ``lint-imports`` over the package; these tests run it over a copy of
the package with one import added the wrong way, so a contract loosened until it passes
anything (a layer dropped, an exception added) fails here.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LINT_IMPORTS = Path(sys.executable).parent / "lint-imports"


def lint(tree: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONPATH": str(tree)}
    return subprocess.run(
        [str(LINT_IMPORTS), "--no-cache"],
        cwd=tree,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A copy of the package, its benchmarks and its contracts, for one wrong import to be
    added to."""
    for package in ("app", "bench"):
        shutil.copytree(
            ROOT / package, tmp_path / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    return tmp_path


def add_import(tree: Path, module: str, line: str) -> None:
    path = tree / (module.replace(".", "/") + ".py")
    with path.open("a") as f:
        f.write(f"\n\ndef _wrong_way() -> None:\n    {line}  # noqa\n")


def test_the_package_keeps_its_layers(tree: Path) -> None:
    result = lint(tree)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "0 broken" in result.stdout


@pytest.mark.parametrize(
    ("module", "line", "broken"),
    [
        # A library reaching up into one above it, inside a function.
        ("app.log.fetch", "from app.coordinator import handlers", "app.coordinator"),
        ("app.groups.offsets", "from app.coordinator import sql", "app.coordinator"),
        ("app.cleaner.cleaner", "from app.coordinator import txn_log", "app.coordinator"),
        ("app.coordinator.inspect", "from app.cleaner import plan", "app.cleaner"),
        ("app.coordinator.completion", "from app.broker import apis", "app.broker"),
        ("app.storage.engine", "import app.log.append", "app.log"),
        # A client reaching a library other than through the broker.
        ("app.client.sender", "from app.log import append", "app.log"),
        ("app.client.connection", "from app.storage import engine", "app.storage"),
        ("app.server.apis", "from app.groups import membership", "app.groups"),
        # The product reaching into its benchmarks.
        ("app.server.process", "from bench import floors", "bench.floors"),
    ],
)
def test_an_import_the_wrong_way_breaks_a_contract(
    tree: Path, module: str, line: str, broken: str
) -> None:
    add_import(tree, module, line)
    result = lint(tree)
    assert result.returncode != 0, result.stdout
    assert f"{module} -> {broken}" in result.stdout
