"""The Java programs beside this file, built once by Maven and run as subprocesses.

``mvn -q package`` compiles ``src/`` and writes the runtime classpath (kafka-clients,
kafka-streams and a quiet SLF4J binding, all in Maven's repository ``~/.m2``) to
``target/classpath.txt``. A stamp with the hash of the pom and the sources skips Maven
when nothing changed, so scripts/setup and the tests' session fixture cost nothing the
second time. ``run`` starts one program and reads the one JSON line it prints.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
TARGET = HERE / "target"
STAMP = TARGET / "kip98-build.sha256"
CLASSPATH_FILE = TARGET / "classpath.txt"


class JavaBuildError(RuntimeError):
    """Maven could not build the Java programs (its output is in the message)."""


class JavaProgramError(AssertionError):
    """A program failed or printed no JSON line (its stderr is in the message)."""


def _sources_hash() -> str:
    digest = hashlib.sha256()
    files = [HERE / "pom.xml", *sorted((HERE / "src").rglob("*"))]
    for path in files:
        if path.is_file():
            digest.update(str(path.relative_to(HERE)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def built() -> bool:
    return (
        STAMP.is_file()
        and CLASSPATH_FILE.is_file()
        and STAMP.read_text().strip() == _sources_hash()
    )


def build(timeout: float = 1200) -> str:
    """The ``java -cp`` string of the programs, building them first unless the stamp matches."""
    if not built():
        mvn = shutil.which("mvn")
        if mvn is None:
            raise JavaBuildError("mvn is not installed: scripts/setup installs it (apt: maven)")
        command = [mvn, "-q", "-B", "-f", str(HERE / "pom.xml"), "package"]
        try:
            done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
        except subprocess.TimeoutExpired as e:
            raise JavaBuildError(f"mvn did not build tests/java within {timeout} s") from e
        if done.returncode != 0:
            output = (done.stdout + done.stderr).strip().splitlines()
            raise JavaBuildError(
                f"{' '.join(command)} failed, exit {done.returncode}:\n" + "\n".join(output[-40:])
            )
        STAMP.write_text(_sources_hash() + "\n")
    return os.pathsep.join([str(TARGET / "classes"), CLASSPATH_FILE.read_text().strip()])


def run(classpath: str, program: str, *args: str, timeout: float = 180) -> dict[str, Any]:
    """Run ``kip98.clients.<program>`` with ``args``; the JSON object of its last stdout line."""
    command = ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", "-cp", classpath]
    command += [f"kip98.clients.{program}", *args]
    done = subprocess.run(command, capture_output=True, text=True, timeout=timeout)
    lines = done.stdout.strip().splitlines()
    if done.returncode != 0 or not lines:
        raise JavaProgramError(
            f"{program} {' '.join(args)}: exit {done.returncode}\n{done.stderr[-4000:]}"
        )
    result: dict[str, Any] = json.loads(lines[-1])
    return result


if __name__ == "__main__":
    try:
        build()
    except JavaBuildError as e:
        print(e, file=sys.stderr)
        sys.exit(1)
