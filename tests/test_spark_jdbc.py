"""Spark reads kip98's PostgreSQL over JDBC with the URL derived from the SQLAlchemy one."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest
from sqlalchemy import create_engine, pool, text

from app.spark.jdbc import DRIVER, jdbc_url

if TYPE_CHECKING:
    from pyspark.sql import SparkSession


def test_jdbc_url_moves_credentials_into_properties() -> None:
    url, props = jdbc_url(
        "postgresql+psycopg://alice:s3cr%40t@db.example:6543/kip98?sslmode=require"
    )
    assert url == "jdbc:postgresql://db.example:6543/kip98?sslmode=require"
    assert props == {"driver": DRIVER, "user": "alice", "password": "s3cr@t"}


def test_jdbc_url_defaults() -> None:
    url, props = jdbc_url("postgresql://localhost/kip98")
    assert url == "jdbc:postgresql://localhost:5432/kip98"
    assert props == {"driver": DRIVER}


def test_jdbc_url_brackets_ipv6_hosts() -> None:
    url, _ = jdbc_url("postgresql+psycopg://u@[::1]:5433/d")
    assert url == "jdbc:postgresql://[::1]:5433/d"


def test_jdbc_url_rejects_other_databases() -> None:
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        jdbc_url("sqlite:///x.db")


@pytest.mark.spark
def test_spark_reads_a_table_over_jdbc(spark: SparkSession, db_url: str) -> None:
    rows = [(i, f"value-{i}", bytes([i % 256]) * 3) for i in range(250)]
    engine = create_engine(db_url, poolclass=pool.NullPool)
    try:
        with engine.begin() as conn:
            conn.execute(
                text("CREATE TABLE spark_probe (id bigint PRIMARY KEY, name text, blob bytea)")
            )
            conn.execute(
                text("INSERT INTO spark_probe VALUES (:id, :name, :blob)"),
                [{"id": i, "name": n, "blob": b} for i, n, b in rows],
            )
    finally:
        engine.dispose()

    url, props = jdbc_url(db_url)
    frame = (
        spark.read.format("jdbc")
        .option("url", url)
        .option("dbtable", "spark_probe")
        .options(**props)
        .load()
    )
    got = sorted((r["id"], r["name"], bytes(r["blob"])) for r in frame.collect())
    assert got == rows
    assert frame.filter("id >= 200").count() == 50
