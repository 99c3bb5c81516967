"""Spark: the product's session, the read_committed materialisation over JDBC, and the
``kip98`` data source (a batch and streaming source, and an exactly-once sink)."""

from app.spark.datasource import register
from app.spark.materialize import materialize

__all__ = ["materialize", "register"]
