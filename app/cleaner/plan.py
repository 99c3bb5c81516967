"""What a cleaning pass may remove, decided from figures the database gave: pure rules.

The one rule above all: nothing at or beyond the last stable offset is ever removed, so an
open transaction pins the log (its first offset is the LSO) and an undecided record can
never be compacted as if it were committed.
"""

from __future__ import annotations

from app.errors import KafkaError, fail
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


def worth_compacting(
    log_start: int, cleaned_up_to: int, limit: int, min_dirty_ratio: float
) -> bool:
    """Kafka's min.cleanable.dirty.ratio: compact again only once the part written since the
    last compaction (the dirty part) is at least that share of the cleanable log, so a big
    compacted partition with a trickle of writes is not re-read on every pass."""
    total = limit - log_start
    dirty = limit - max(log_start, cleaned_up_to)
    return total > 0 and dirty > 0 and dirty >= min_dirty_ratio * total


# DeleteRecords' offset meaning "up to the high watermark" (Kafka's HIGH_WATERMARK).
HIGH_WATERMARK = -1


def delete_records_target(
    offset: int, log_start: int, high_watermark: int, last_stable_offset: int, delete: bool
) -> int:
    """The log start a DeleteRecords asks for (Kafka's deleteRecords): ``offset``, or the
    high watermark for -1; never below the log start (nothing moves back). Refused: a
    topic whose cleanup.policy has no delete (POLICY_VIOLATION, as Kafka), an offset
    outside [0, high watermark] (OFFSET_OUT_OF_RANGE), and one past the LSO: an open
    transaction's records are not removed, as the cleaner never removes them (rule 20;
    Kafka would, and move its first unstable offset up with them)."""
    if not delete:
        raise fail(
            KafkaError.POLICY_VIOLATION,
            "records of a topic whose cleanup.policy has no delete cannot be deleted",
        )
    target = high_watermark if offset == HIGH_WATERMARK else offset
    if not 0 <= target <= high_watermark:
        raise fail(
            KafkaError.OFFSET_OUT_OF_RANGE,
            f"offset {offset} is outside [0, {high_watermark}] (the high watermark)",
        )
    if target > last_stable_offset:
        raise fail(
            KafkaError.OFFSET_OUT_OF_RANGE,
            f"offset {target} is past the last stable offset {last_stable_offset}: "
            "an open transaction's records are not deleted",
        )
    return max(target, log_start)
