"""Kafka's jars, fetched once by Maven into a cache outside the repository.

The cache holds ``libs/`` (every runtime dependency of the pom, as Maven's
``dependency:copy-dependencies`` lays them out) and a stamp with the pom's hash: a cache
whose stamp matches is used as it is, without running Maven, so the fetch costs its
minute once per machine and nothing afterwards.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
from pathlib import Path

KAFKA_VERSION = "4.4.0"
POM = Path(__file__).with_name("pom.xml")


class KafkaFetchError(RuntimeError):
    """Maven could not fetch Kafka's jars (its output is in the message)."""


def cache_dir() -> Path:
    """``KIP98_KAFKA_HOME``, or ``~/.cache/kip98/kafka-<version>``."""
    explicit = os.environ.get("KIP98_KAFKA_HOME")
    if explicit:
        return Path(explicit).expanduser()
    return Path.home() / ".cache" / "kip98" / f"kafka-{KAFKA_VERSION}"


def _pom_hash() -> str:
    return hashlib.sha256(POM.read_bytes()).hexdigest()


def fetched(cache: Path | None = None) -> bool:
    """Whether the cache holds the jars of this very pom."""
    cache = cache or cache_dir()
    stamp = cache / "stamp"
    return stamp.is_file() and stamp.read_text().strip() == _pom_hash()


def fetch(cache: Path | None = None, timeout: float = 1200) -> Path:
    """Fill the cache unless its stamp matches the pom; the ``libs`` directory."""
    cache = cache or cache_dir()
    libs = cache / "libs"
    if fetched(cache):
        return libs
    mvn = shutil.which("mvn")
    if mvn is None:
        raise KafkaFetchError(
            "mvn is not installed: scripts/setup installs it (apt: maven), or install Maven by hand"
        )
    cache.mkdir(parents=True, exist_ok=True)
    staging = cache / "libs.partial"
    shutil.rmtree(staging, ignore_errors=True)
    command = [
        mvn,
        "-q",
        "-B",
        "-f",
        str(POM),
        "dependency:copy-dependencies",
        "-DincludeScope=runtime",
        f"-DoutputDirectory={staging}",
    ]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise KafkaFetchError(f"mvn did not fetch Kafka {KAFKA_VERSION} within {timeout} s") from e
    if done.returncode != 0:
        output = (done.stdout + done.stderr).strip().splitlines()
        raise KafkaFetchError(
            f"mvn could not fetch Kafka {KAFKA_VERSION} ({' '.join(command)}), "
            f"exit {done.returncode}:\n" + "\n".join(output[-40:])
        )
    shutil.rmtree(libs, ignore_errors=True)
    staging.rename(libs)
    # Maven writes a target/ directory beside the pom for some goals; the repository
    # keeps nothing of the fetch.
    shutil.rmtree(POM.parent / "target", ignore_errors=True)
    (cache / "stamp").write_text(_pom_hash() + "\n")
    return libs


def kafka_classpath() -> str:
    """The ``java -cp`` string of Kafka's broker and tools, fetching them first if needed."""
    libs = fetch()
    jars = sorted(str(p) for p in libs.glob("*.jar"))
    if not jars:
        raise KafkaFetchError(f"no jars in {libs}: remove {cache_dir()} and fetch again")
    return os.pathsep.join(jars)
