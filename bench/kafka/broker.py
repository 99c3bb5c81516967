"""A single-node Apache Kafka (combined KRaft broker and controller) on loopback, and
Kafka's tool classes, both run from the classpath ``bench.kafka.fetch`` assembles.

Kafka 4 has no ZooKeeper: storage is formatted first (``kafka.tools.StorageTool format``
with a fresh cluster id, the node its own single voter), then ``kafka.Kafka`` runs on a
properties file. ``start()`` returns only once a Metadata request on the client listener
answers with this broker in it, the point from which clients are served; if the broker
dies or never answers, the error carries its log's last lines.
"""

from __future__ import annotations

import base64
import io
import os
import shutil
import signal
import socket
import struct
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping
from pathlib import Path
from types import TracebackType
from typing import Any

from bench.kafka.fetch import KAFKA_VERSION, cache_dir, kafka_classpath

HOST = "127.0.0.1"
# The machine is small and shared: one broker wants little memory.
HEAP = ["-Xms128m", "-Xmx768m"]
JVM = ["-XX:+UseSerialGC", "-Djava.awt.headless=true"]

# Mirrors kip98's test settings: one node, so every replication factor is 1; few internal
# partitions, so the broker starts and creates them quickly; groups form at once; topics
# are created on first use with one partition. A test's settings override these.
DEFAULT_SETTINGS: dict[str, str] = {
    "offsets.topic.replication.factor": "1",
    "offsets.topic.num.partitions": "1",
    "transaction.state.log.replication.factor": "1",
    "transaction.state.log.min.isr": "1",
    "transaction.state.log.num.partitions": "1",
    "share.coordinator.state.topic.replication.factor": "1",
    "share.coordinator.state.topic.min.isr": "1",
    "default.replication.factor": "1",
    "min.insync.replicas": "1",
    "group.initial.rebalance.delay.ms": "0",
    "auto.create.topics.enable": "true",
    "num.partitions": "1",
    # kip98's coordinator looks for timed-out transactions every second
    # (KIP98_COORDINATOR_INTERVAL_MS); Kafka's default is every 10 s.
    "transaction.abort.timed.out.transaction.cleanup.interval.ms": "1000",
}

LOG4J2 = """\
status = error
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = {level}
rootLogger.appenderRef.file.ref = file
"""

TOOLS_LOG4J2 = """\
status = error
appender.err.type = Console
appender.err.name = err
appender.err.target = SYSTEM_ERR
appender.err.layout.type = PatternLayout
appender.err.layout.pattern = [%d] %p %m (%c)%n
rootLogger.level = warn
rootLogger.appenderRef.err.ref = err
"""


class KafkaStartError(RuntimeError):
    """The broker did not come up; the message ends with its log's last lines."""


def free_port(host: str = HOST) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        port: int = s.getsockname()[1]
        return port


def cluster_id() -> str:
    """A fresh KRaft cluster id: 16 random bytes in URL-safe base64 without padding, as
    Kafka's ``Uuid`` prints them (never starting with '-', which Kafka avoids too)."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
        if not text.startswith("-"):
            return text


def java() -> str:
    home = os.environ.get("JAVA_HOME")
    if home and Path(home, "bin", "java").is_file():
        return str(Path(home, "bin", "java"))
    found = shutil.which("java")
    if found is None:
        raise KafkaStartError("java is not installed: scripts/setup installs it")
    return found


def tail(path: Path, lines: int = 40) -> str:
    """A log's ERROR and FATAL lines (the first 20: the cause comes before the shutdown's
    noise), then its last ``lines`` lines."""
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return f"({path} not written)"
    errors = [line for line in text if "] ERROR " in line or "] FATAL " in line][:20]
    head = ["errors:", *errors, "last lines:"] if errors else []
    return "\n".join([*head, *text[-lines:]])


def metadata_brokers(host: str, port: int, timeout: float = 2.0) -> int:
    """How many brokers a Metadata request (v12, no topics) names; raises OSError when
    the listener does not answer."""
    from kio.schema.metadata.v12.request import MetadataRequest
    from kio.schema.metadata.v12.response import MetadataResponse
    from kio.serial import entity_reader, entity_writer

    request: Any = MetadataRequest
    header = request.__header_schema__(
        request_api_key=3, request_api_version=12, correlation_id=1, client_id="kip98-bench"
    )
    body = MetadataRequest(
        topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False
    )
    buffer = io.BytesIO()
    entity_writer(request.__header_schema__)(buffer, header)
    entity_writer(MetadataRequest)(buffer, body)
    frame = buffer.getvalue()
    with socket.create_connection((host, port), timeout) as s:
        s.settimeout(timeout)
        s.sendall(struct.pack(">i", len(frame)) + frame)
        size = struct.unpack(">i", _read(s, 4))[0]
        answer = _read(s, size)
    response: Any = MetadataResponse
    _, offset = entity_reader(response.__header_schema__)(answer, 0)
    decoded: MetadataResponse = entity_reader(MetadataResponse)(answer, offset)[0]
    return len(decoded.brokers)


def _read(sock: socket.socket, n: int) -> bytes:
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            raise ConnectionError("connection closed before the answer")
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


class KafkaBroker:
    """One Kafka broker+controller. ``settings`` override or add broker configs to
    ``DEFAULT_SETTINGS``; ``workdir`` holds its properties, data and ``broker.log``
    (a temporary directory, removed at ``stop()``, when none is given)."""

    def __init__(
        self,
        settings: Mapping[str, str] | None = None,
        workdir: Path | None = None,
        start_timeout: float = 180,
        log_level: str = "INFO",
    ) -> None:
        self.settings = {**DEFAULT_SETTINGS, **(settings or {})}
        self._owns_workdir = workdir is None
        self.workdir = Path(workdir) if workdir else Path(tempfile.mkdtemp(prefix="kip98-kafka-"))
        self.start_timeout = start_timeout
        self.log_level = log_level
        self.port = 0
        self.controller_port = 0
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def bootstrap(self) -> str:
        """The clients' ``bootstrap.servers``."""
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "the broker is not running"
        return self.proc.pid

    @property
    def log_path(self) -> Path:
        return self.workdir / "broker.log"

    def properties(self) -> dict[str, str]:
        """The broker's whole configuration: its node and listeners, then the settings."""
        return {
            "process.roles": "broker,controller",
            "node.id": "1",
            "controller.quorum.voters": f"1@{HOST}:{self.controller_port}",
            "listeners": f"PLAINTEXT://{HOST}:{self.port},CONTROLLER://{HOST}:{self.controller_port}",
            "advertised.listeners": f"PLAINTEXT://{HOST}:{self.port}",
            "controller.listener.names": "CONTROLLER",
            "inter.broker.listener.name": "PLAINTEXT",
            "listener.security.protocol.map": "CONTROLLER:PLAINTEXT,PLAINTEXT:PLAINTEXT",
            "log.dirs": str(self.workdir / "data"),
            **self.settings,
        }

    def _write_config(self) -> Path:
        config = self.workdir / "server.properties"
        config.write_text("".join(f"{k}={v}\n" for k, v in self.properties().items()))
        (self.workdir / "log4j2.properties").write_text(
            LOG4J2.format(path=self.log_path, level=self.log_level)
        )
        return config

    def _java(self, main_class: str, *args: str) -> list[str]:
        return [
            java(),
            *HEAP,
            *JVM,
            f"-Dlog4j2.configurationFile={self.workdir / 'log4j2.properties'}",
            f"-Dkafka.logs.dir={self.workdir}",
            "-cp",
            kafka_classpath(),
            main_class,
            *args,
        ]

    def start(self, attempts: int = 3) -> None:
        """Format storage, start the broker and return once it answers Metadata. A port
        taken by someone else between its pick and the broker's bind costs another try
        on fresh ports, not the run."""
        for attempt in range(attempts):
            try:
                self._start_once()
                return
            except KafkaStartError:
                if attempt + 1 == attempts or not self._bind_failed():
                    raise

    def _bind_failed(self) -> bool:
        try:
            return "Address already in use" in self.log_path.read_text(errors="replace")
        except OSError:
            return False

    def _start_once(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        shutil.rmtree(self.workdir / "data", ignore_errors=True)
        self.log_path.unlink(missing_ok=True)
        self.port = free_port()
        self.controller_port = free_port()
        while self.controller_port == self.port:
            self.controller_port = free_port()
        config = self._write_config()
        formatted = subprocess.run(
            self._java("kafka.tools.StorageTool", "format", "-t", cluster_id(), "-c", str(config)),
            capture_output=True,
            text=True,
            timeout=self.start_timeout,
        )
        if formatted.returncode != 0:
            raise KafkaStartError(
                f"formatting Kafka {KAFKA_VERSION}'s storage failed (exit {formatted.returncode}):\n"
                + (formatted.stdout + formatted.stderr)[-4000:]
            )
        with open(self.workdir / "console.log", "wb") as console:
            self.proc = subprocess.Popen(
                self._java("kafka.Kafka", str(config)),
                stdout=console,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        self._wait_ready()

    def _wait_ready(self) -> None:
        assert self.proc is not None
        deadline = time.monotonic() + self.start_timeout
        while True:
            if self.proc.poll() is not None:
                raise KafkaStartError(
                    f"Kafka exited with {self.proc.returncode} while starting; "
                    f"{self.log_path}:\n{tail(self.log_path)}\n"
                    f"console:\n{tail(self.workdir / 'console.log')}"
                )
            try:
                if metadata_brokers(HOST, self.port) > 0:
                    return
            except (OSError, ValueError, struct.error):
                pass
            if time.monotonic() >= deadline:
                self.kill()
                raise KafkaStartError(
                    f"Kafka did not answer Metadata on {self.bootstrap} within "
                    f"{self.start_timeout} s; {self.log_path}:\n{tail(self.log_path)}"
                )
            time.sleep(0.2)

    def stop(self, timeout: float = 60) -> None:
        """SIGTERM (a controlled shutdown), killed if it takes longer than ``timeout``;
        the working directory goes too when it was a temporary one."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None
        if self._owns_workdir:
            shutil.rmtree(self.workdir, ignore_errors=True)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> KafkaBroker:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def run_tool(main_class: str, args: list[str], timeout: float) -> subprocess.CompletedProcess[str]:
    """Run one of Kafka's tool classes (``org.apache.kafka.tools.ProducerPerformance``,
    ``kafka.tools.StorageTool``, …) on Kafka's classpath; its output captured as text,
    its logging at WARN on stderr."""
    config = cache_dir() / "tools-log4j2.properties"
    classpath = kafka_classpath()
    if not config.is_file() or config.read_text() != TOOLS_LOG4J2:
        config.write_text(TOOLS_LOG4J2)
    return subprocess.run(
        [
            java(),
            "-Xmx512m",
            *JVM,
            f"-Dlog4j2.configurationFile={config}",
            "-cp",
            classpath,
            main_class,
            *args,
        ],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
