"""What a cleaning pass may remove, decided from figures the database gave: pure rules.

The one rule above all: nothing at or beyond the last stable offset is ever removed, so an
open transaction pins the log (its first offset is the LSO) and an undecided record can
never be compacted as if it were committed.
"""

from __future__ import annotations

from app.log.topic_config import CleanupConfig


def retention_target(
    cfg: CleanupConfig,
    log_start: int,
    last_stable_offset: int,
    first_young: int | None,
    last_over_size: int | None,
) -> int:
    """The new log start: past every record older than retention.ms (up to the first young
    one) and past every record that keeps the log over retention.bytes, whichever goes
    further (Kafka deletes a segment that breaches either), never beyond the LSO."""
    candidates = [log_start]
    if cfg.delete and cfg.retention_ms >= 0:
        candidates.append(last_stable_offset if first_young is None else first_young)
    if cfg.delete and cfg.retention_bytes >= 0 and last_over_size is not None:
        candidates.append(last_over_size + 1)
    return max(log_start, min(max(candidates), last_stable_offset))


def compaction_limit(last_stable_offset: int, first_too_young: int | None) -> int:
    """Compaction works below the LSO and below the first record younger than
    min.compaction.lag.ms (Kafka's first uncleanable offset)."""
    if first_too_young is None:
        return last_stable_offset
    return min(last_stable_offset, first_too_young)


def batch_boundary(offset: int, base_of_next_record: int | None) -> int:
    """Round down to the start of the batch holding ``offset``, so a snapshot never splits
    a batch (producer state folds whole batches)."""
    if base_of_next_record is None:
        return offset
    return min(offset, base_of_next_record)
