"""A Spark driver for the sink's crash tests: a streaming query reading ``orders`` from
kip98 (read_committed), appending ``!`` to each value, writing ``enriched`` through the
kip98 sink. Arguments: database URL, checkpoint directory, master, and ``run`` (a
trigger every 0 s until killed) or ``drain`` (Trigger.AvailableNow, then exit 0)."""

from __future__ import annotations

import sys

from app.spark.session import build_spark_session

MAX_OFFSETS_PER_TRIGGER = "15"


def main() -> None:
    db_url, checkpoint, master, mode = sys.argv[1:5]
    spark = build_spark_session("kip98-stream-child", master=master)
    source = (
        spark.readStream.format("kip98")
        .option("database.url", db_url)
        .option("subscribe", "orders")
        .option("startingOffsets", "earliest")
        .option("maxOffsetsPerTrigger", MAX_OFFSETS_PER_TRIGGER)
        .load()
    )
    out = source.selectExpr("key", "concat(value, cast('!' AS binary)) AS value", "partition")
    writer = (
        out.writeStream.format("kip98")
        .option("database.url", db_url)
        .option("topic", "enriched")
        .option("checkpointLocation", checkpoint)
    )
    if mode == "drain":
        writer.trigger(availableNow=True).start().awaitTermination()
    else:
        writer.trigger(processingTime="0 seconds").start().awaitTermination()
    spark.stop()


if __name__ == "__main__":
    main()
