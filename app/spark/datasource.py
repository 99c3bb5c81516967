"""The ``kip98`` format of PySpark's Python data source API: ``register(spark)``.

Spark builds the data source in its Python workers from the class and the options; every
option is checked when a reader or writer is made, on the driver, so a bad one fails the
query before any task runs (``app.spark.options``). ``database.url`` defaults to what the
CLI would use where the workers run: ``KIP98_DATABASE_URL``, else the embedded server.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from app.settings import BrokerSettings
from app.spark.options import sink_options, source_options
from app.spark.sink import BatchWriter, StreamWriter, check_schema, check_topic
from app.spark.source import SCHEMA, BatchReader, StreamReader
from app.storage.engine import resolve_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

FORMAT = "kip98"


class Kip98DataSource(DataSource):
    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        return SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        options = source_options(self.options, streaming=False)
        return BatchReader(options, resolve_url(options.database_url))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = source_options(self.options, streaming=True)
        return StreamReader(options, resolve_url(options.database_url))

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        options = sink_options(self.options, BrokerSettings.from_env().max_transaction_timeout_ms)
        check_schema(schema, options)
        url = resolve_url(options.database_url)
        check_topic(url, options.topic)
        return BatchWriter(options, url)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = sink_options(self.options, BrokerSettings.from_env().max_transaction_timeout_ms)
        check_schema(schema, options)
        url = resolve_url(options.database_url)
        check_topic(url, options.topic)
        return StreamWriter(options, url)


def register(spark: SparkSession) -> None:
    """Add the ``kip98`` format to ``spark`` (the product's own session has it already)."""
    spark.dataSource.register(Kip98DataSource)
