"""The check every projection test ends with: the projections folded from the event tables
equal the live ones, and a rebuild that replaces them leaves them as they were."""

from __future__ import annotations

from app.broker import Broker
from app.broker.rebuild import rebuild_all
from app.log.rebuild import compute_partition_log, live_rows, projection_rows


def assert_partition_log_rebuilds(broker: Broker, now_ms: int) -> None:
    with broker.engine.connect() as conn:
        computed = projection_rows(compute_partition_log(conn, now_ms, broker.settings).values())
        live = live_rows(conn)
    assert computed == live
    rebuild_all(broker.engine, now_ms=now_ms, settings=broker.settings)
    with broker.engine.connect() as conn:
        assert live_rows(conn) == live
