"""What a user of the ``kip98`` Spark format sees when something is set wrong: a bad option
as one line of Spark's AnalysisException naming it, no worker traceback; a session of their
own whose Python workers cannot run the source, refused by ``register`` in one line naming
the setting."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from typing import TYPE_CHECKING

import pytest
from pyspark.errors import AnalysisException, StreamingQueryException

from tests.helpers.client_helpers import create_topics

if TYPE_CHECKING:
    from pyspark.sql import DataFrameReader, SparkSession

pytestmark = pytest.mark.spark

WRONG_PYTHON = "/usr/bin/python3"


def _one_line(exc: AnalysisException, named: str) -> None:
    text = str(exc)
    assert "Traceback" not in text and 'File "' not in text, text
    first = text.splitlines()[0]
    assert first.startswith("[PYTHON_DATA_SOURCE_ERROR]"), text
    assert f"ValueError: option '{named}'" in first, text
    # All that follows is Spark's own SQLSTATE.
    assert [line.strip() for line in text.splitlines()[1:]] in ([], ["SQLSTATE: 38000"]), text


def test_a_bad_option_is_one_analysis_exception_line(spark: SparkSession, db_url: str) -> None:
    create_topics(db_url, {"out": 1})

    def reader() -> DataFrameReader:  # a reader keeps the options it is given
        return spark.read.format("kip98").option("database.url", db_url)

    with pytest.raises(AnalysisException) as batch:
        reader().option("subscribe", "out").option("bogus", "1").load().collect()
    _one_line(batch.value, "bogus")
    with pytest.raises(AnalysisException) as latest:
        reader().option("subscribe", "out").option("startingOffsets", "latest").load().collect()
    _one_line(latest.value, "startingOffsets")

    # A streaming query fails at its first batch, with the same line as its cause.
    query = (
        spark.readStream.format("kip98").option("database.url", db_url)
        .option("subscribe", "out").option("maxOffsetsPerTrigger", "-5")
        .load().writeStream.format("memory").queryName("refused").start()
    )  # fmt: skip
    try:
        with pytest.raises(StreamingQueryException) as stream:
            query.processAllAvailable()
    finally:
        query.stop()
    text = str(stream.value)
    assert "ValueError: option 'maxOffsetsPerTrigger'" in text, text
    assert "Traceback" not in text and 'File "' not in text, text

    df = spark.createDataFrame([(b"v",)], "value binary")
    with pytest.raises(AnalysisException) as sink:
        df.write.format("kip98").option("database.url", db_url).option("topic", "out").option(
            "transaction.timeout.ms", "soon"
        ).mode("append").save()
    _one_line(sink.value, "transaction.timeout.ms")


def test_register_refuses_workers_that_cannot_import_the_source(db_url: str) -> None:
    lacks = subprocess.run([WRONG_PYTHON, "-c", "import psycopg"], capture_output=True)
    if lacks.returncode == 0:
        pytest.skip(f"{WRONG_PYTHON} has psycopg: not a wrong interpreter here")
    # A user's own session (not app.spark.session), its workers set to another Python.
    script = textwrap.dedent(
        f"""
        from pyspark.sql import DataFrameReader, SparkSession
        spark = (SparkSession.builder.master("local[1]").appName("own")
                 .config("spark.ui.enabled", "false")
                 .config("spark.driver.host", "127.0.0.1")
                 .config("spark.driver.bindAddress", "127.0.0.1")
                 .config("spark.pyspark.python", {WRONG_PYTHON!r})
                 .getOrCreate())
        spark.sparkContext.setLogLevel("OFF")
        from app.spark import register
        from app.spark.datasource import WorkerPythonError
        try:
            register(spark)
        except WorkerPythonError as exc:
            print("refused:", exc)
        else:
            print("registered")
        spark.stop()
        """
    )
    env = {k: v for k, v in os.environ.items() if k != "PYSPARK_PYTHON"}
    run = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=300, env=env
    )
    [line] = [x for x in run.stdout.splitlines() if x.startswith(("refused:", "registered"))]
    assert line.startswith("refused:"), (run.stdout, run.stderr[-2000:])
    assert "No module named 'psycopg'" in line and WRONG_PYTHON in line
    assert "spark.pyspark.python" in line and sys.executable in line


def test_register_accepts_the_projects_interpreter(spark: SparkSession) -> None:
    from app.spark.datasource import check_workers

    check_workers(spark)  # the product's session: this interpreter, nothing to ask
