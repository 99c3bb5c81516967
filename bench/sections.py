"""The sections of the table, in the order they run and are shown."""

from __future__ import annotations

from bench import (
    against_kafka,
    cleaner,
    cluster,
    console,
    consume,
    produce,
    replicas,
    spark,
    spark_datasource,
    transactional,
    wire,
)
from bench.section import Section

SECTIONS: tuple[Section, ...] = (
    produce.SECTION,
    transactional.SECTION,
    consume.SECTION,
    wire.SECTION,
    against_kafka.SECTION,
    cluster.SECTION,
    cleaner.SECTION,
    console.SECTION,
    replicas.SECTION,
    spark.SECTION,
    spark_datasource.SECTION,
)
