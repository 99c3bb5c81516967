"""Every test file the docs point at exists. docs/*.md and README.md name tests by path
(``tests/java/test_admin.py``) or by file name (``test_coordinator.py``, as docs/design.md
§6 lists each rule's tests): a pointer left behind by a moved or renamed file would send a
reader nowhere."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md"]
# A path from the repository's root, and a bare name (not the tail of a path).
PATH = re.compile(r"(?<![\w/.])tests/[\w/]+\.py\b")
NAME = re.compile(r"(?<![\w/.])test_\w+\.py\b")


def dangling(text: str, test_files: set[str]) -> list[str]:
    """The pointers of ``text`` that name no test file: paths that do not resolve from the
    repository's root, and names that no file under tests/ has."""
    paths = [p for p in PATH.findall(text) if not (ROOT / p).is_file()]
    names = [n for n in NAME.findall(text) if n not in test_files]
    return paths + names


def test_every_test_file_the_docs_name_exists() -> None:
    test_files = {p.name for p in (ROOT / "tests").rglob("test_*.py")}
    missing = [
        f"{doc.relative_to(ROOT)}: {pointer}"
        for doc in DOCS
        for pointer in dangling(doc.read_text(), test_files)
    ]
    assert missing == []


def test_a_pointer_to_no_file_is_caught() -> None:
    text = "Tests: `test_no_such_rule.py`, `tests/helpers/no_such_module.py`, `test_docs_links.py`."
    assert dangling(text, {"test_docs_links.py"}) == [
        "tests/helpers/no_such_module.py",
        "test_no_such_rule.py",
    ]
