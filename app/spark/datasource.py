"""The ``kip98`` format of PySpark's Python data source API: ``register(spark)``.

Spark builds the data source in its Python workers from the class and the options; every
option is checked when a reader or writer is made, on the driver, so a bad one fails the
query before any task runs (``app.spark.options``). ``database.url`` defaults to what the
CLI would use where the workers run: ``KIP98_DATABASE_URL``, else the embedded server.

A bad option (or sink schema, or sink topic) reaches the user as one line of Spark's own
AnalysisException (PYTHON_DATA_SOURCE_ERROR) naming it, not under a Python traceback of
the worker: see ``one_line_errors``.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
    ReadLimit,
)
from pyspark.sql.types import StructType

from app.errors import KafkaException
from app.settings import BrokerSettings
from app.spark.options import SinkOptions, sink_options, source_options
from app.spark.sink import BatchWriter, StreamWriter, check_schema, check_topic
from app.spark.source import SCHEMA, BatchReader, StreamReader
from app.storage.engine import resolve_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = "kip98"


@contextmanager
def one_line_errors() -> Iterator[None]:
    """Raise a refused option as ``ValueError: option 'x': why``, without the traceback.

    PySpark's worker sends the JVM the formatted exception, traceback included, unless
    ``SPARK_HIDE_TRACEBACK`` is set (pyspark.util.handle_worker_exception); the JVM puts
    that text into its AnalysisException. A worker that fails exits right after sending
    it (pyspark.sql.worker.utils.worker_run), so setting the variable in it hides the
    traceback of this one error and of nothing else. Outside a Spark worker (a test calling
    the source directly) the environment is left alone."""
    try:
        yield
    except KafkaException as exc:
        raise _refusal(exc) from None


def _refusal(exc: KafkaException) -> ValueError:
    """The one-line error for ``exc``, its worker's traceback hidden (``one_line_errors``)."""
    if "PYTHON_WORKER_FACTORY_SECRET" in os.environ:  # set by Spark for its workers
        os.environ["SPARK_HIDE_TRACEBACK"] = "1"
    return ValueError(exc.error.str())


class RefusedStreamReader(DataSourceStreamReader):
    """The stream reader of a streaming query whose options were refused: it refuses at
    its first call. PySpark 4's streaming source runner loses an error raised while the
    reader is made (its ``finally: reader.stop()`` meets no reader, and that error is
    what it reports), so the refusal waits for the first call, whose error it reports."""

    def __init__(self, refused: KafkaException) -> None:
        self.refused = refused

    def _refuse(self) -> NoReturn:
        raise _refusal(self.refused) from None

    def initialOffset(self) -> dict[str, Any]:
        self._refuse()

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        self._refuse()

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[Any]:
        self._refuse()

    def read(self, partition: Any) -> Iterator[tuple[Any, ...]]:
        self._refuse()

    def commit(self, end: dict[str, Any]) -> None:
        return None

    def stop(self) -> None:
        return None


class Kip98DataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        with one_line_errors():
            options = source_options(self.options, streaming=False)
            return BatchReader(options, resolve_url(options.database_url))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        try:
            options = source_options(self.options, streaming=True)
            return StreamReader(options, resolve_url(options.database_url))
        except KafkaException as exc:
            return RefusedStreamReader(exc)

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        with one_line_errors():
            options, url = self._sink(schema)
            return BatchWriter(options, url)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        with one_line_errors():
            options, url = self._sink(schema)
            return StreamWriter(options, url)

    def _sink(self, schema: StructType) -> tuple[SinkOptions, str]:
        options = sink_options(self.options, BrokerSettings.from_env().max_transaction_timeout_ms)
        check_schema(schema, options)
        url = resolve_url(options.database_url)
        check_topic(url, options.topic)
        return options, url


class WorkerPythonError(RuntimeError):
    """The session's Python workers cannot run the kip98 data source."""


def worker_python(spark: SparkSession) -> str:
    """The interpreter Spark starts its Python workers with: ``spark.pyspark.python``,
    else ``PYSPARK_PYTHON`` as it was when the session started, else ``python3``."""
    configured = spark.sparkContext.getConf().get("spark.pyspark.python")
    return configured or spark.sparkContext.pythonExec


def _last_error_line(exc: Exception) -> str:
    """The worker's own error line out of Spark's message around it."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    errors = [line for line in lines if "Error:" in line or "Exception:" in line]
    return (errors or lines or [type(exc).__name__])[-1][:300]


def check_workers(spark: SparkSession) -> None:
    """Fail now, in one line naming the setting, if the session's Python workers cannot
    import what the data source needs; otherwise every query would fail in them, under
    a worker traceback ("No module named psycopg"). Workers running this very
    interpreter can; any other is asked by one task of one partition."""
    python = worker_python(spark)
    found = shutil.which(python) or python
    if os.path.abspath(found) == os.path.abspath(sys.executable):
        return

    def import_in_a_worker(_: object) -> str | None:
        # A nested function, so Spark sends it by value: the worker needs nothing of
        # kip98 to run it.
        import importlib

        try:
            importlib.import_module("app.spark.datasource")
        except ImportError as exc:
            return str(exc)
        return None

    try:
        [why] = spark.sparkContext.parallelize([0], 1).map(import_in_a_worker).collect()
    except Exception as exc:  # the interpreter does not even start
        why = _last_error_line(exc)
    if why is not None:
        raise WorkerPythonError(
            f"the kip98 data source cannot run in this session's Python workers ({python}: "
            f"{why}); set spark.pyspark.python (or PYSPARK_PYTHON, before the session "
            f"starts) to kip98's interpreter, {sys.executable}"
        )


def register(spark: SparkSession) -> None:
    """Add the ``kip98`` format to ``spark`` (the product's own session has it already),
    after checking that the session's Python workers can run it (``check_workers``)."""
    check_workers(spark)
    spark.dataSource.register(Kip98DataSource)
