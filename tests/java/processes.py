"""A Java program a test starts, SIGKILLs and starts again, as an operator's process
manager would: each life's output in a file of its own."""

from __future__ import annotations

import signal
import subprocess
from pathlib import Path


class JavaProcess:
    """``main`` run on ``classpath`` with ``args``; its lives' output beside ``log``
    (``out_file``)."""

    main = ""

    def __init__(self, classpath: str, args: list[str], log: Path, grace: float = 60) -> None:
        self.classpath, self.args, self.log, self.grace = classpath, args, log, grace
        self.process: subprocess.Popen[bytes] | None = None
        self.starts = 0

    def out_file(self, start: int | None = None) -> Path:
        """What one life printed (the current one by default)."""
        return self.log.with_name(f"{self.log.name}-start{start or self.starts}.out")

    def jvm_options(self) -> list[str]:
        return []

    def logs(self) -> list[Path]:
        """The files whose tails say why a life ended."""
        return [self.out_file()]

    def start(self) -> None:
        self.starts += 1
        command = ["java", "-Xmx256m", "-XX:TieredStopAtLevel=1", *self.jvm_options(),
                   "-cp", self.classpath, self.main, *self.args]  # fmt: skip
        self.log.parent.mkdir(parents=True, exist_ok=True)
        with self.out_file().open("wb") as out:
            self.process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)

    def kill(self) -> None:
        assert self.process is not None
        self.process.send_signal(signal.SIGKILL)
        self.process.wait(60)

    def stop(self) -> None:
        """SIGTERM, and SIGKILL after ``grace`` seconds."""
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(self.grace)
            except subprocess.TimeoutExpired:
                self.kill()

    def check_alive(self) -> None:
        assert self.process is not None
        code = self.process.poll()
        if code is not None:
            tail = "".join(
                path.read_text(errors="replace")[-6000:] for path in self.logs() if path.exists()
            )
            raise AssertionError(f"{self.main} {' '.join(self.args)} exited {code}:\n{tail}")
