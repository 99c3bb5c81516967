"""The one place that decides how kip98 runs Spark.

Local mode, bound to loopback (no surprise network exposure, works in sandboxes without a
resolvable hostname), no UI, and the PostgreSQL JDBC driver on the classpath. Tests and
the product share these settings so what is tested is what runs.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

DEFAULT_JDBC_JAR = "/usr/share/java/postgresql.jar"


def jdbc_jar() -> str:
    """The PostgreSQL JDBC driver jar (``KIP98_JDBC_JAR`` overrides Debian's location)."""
    jar = os.environ.get("KIP98_JDBC_JAR", DEFAULT_JDBC_JAR)
    if not Path(jar).is_file():
        raise FileNotFoundError(
            f"PostgreSQL JDBC driver not found at {jar}; run scripts/setup or set KIP98_JDBC_JAR"
        )
    return jar


def build_spark_session(app_name: str = "kip98", master: str = "local[2]") -> SparkSession:
    """Get (or create) the process's SparkSession with kip98's settings, the ``kip98``
    data source registered."""
    from pyspark.sql import SparkSession

    # The Python workers (the kip98 data source runs in them) use this interpreter, so
    # they import the same kip98 and libraries as the driver. PySpark reads the variable
    # when the context starts; the configuration keys say the same to Spark itself.
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    spark = (
        SparkSession.builder.appName(app_name)
        .master(master)
        .config("spark.ui.enabled", "false")
        .config("spark.driver.host", "127.0.0.1")
        .config("spark.driver.bindAddress", "127.0.0.1")
        .config("spark.jars", jdbc_jar())
        .config("spark.driver.memory", os.environ.get("KIP98_SPARK_DRIVER_MEMORY", "1g"))
        .config("spark.sql.shuffle.partitions", "4")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.pyspark.python", os.environ["PYSPARK_PYTHON"])
        .config("spark.pyspark.driver.python", sys.executable)
        .getOrCreate()
    )
    spark.sparkContext.setLogLevel("WARN")
    from app.spark.datasource import register

    register(spark)
    return spark
