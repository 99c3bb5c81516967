"""Spark over JDBC: the session the product uses and the read_committed materialisation."""

from app.spark.materialize import materialize

__all__ = ["materialize"]
