"""The pure producer-state rules (docs/design.md rules 4 to 6), without a database."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from app.errors import KafkaError
from app.log.lso import lso_after_append, lso_after_marker
from app.log.producer_state import (
    AppendedBatch,
    BatchMeta,
    Marker,
    apply_append,
    apply_marker,
    in_sequence,
    is_expired,
    validate_append,
    validate_marker,
)
from app.protocol import CONTROL_ABORT, CONTROL_COMMIT, INT32_MAX, increment_sequence


def _entry(epoch: int = 0, last_seq: int = 9, txn: int | None = None):  # type: ignore[no-untyped-def]
    e = apply_append(
        None, AppendedBatch(7, epoch, BatchMeta(0, last_seq, 0, last_seq), 1000, txn is not None)
    )
    return e


def test_new_producer_accepts_any_sequence() -> None:
    assert validate_append(None, 0, 0, 9, False).ok
    assert validate_append(None, 3, 12345, 12350, False).ok


def test_next_sequence_accepted_gap_rejected() -> None:
    e = _entry()
    assert validate_append(e, 0, 10, 19, False).ok
    v = validate_append(e, 0, 11, 20, False)
    assert v.error_code == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_duplicate_of_kept_batch_returns_original() -> None:
    e = _entry()
    e = apply_append(e, AppendedBatch(7, 0, BatchMeta(10, 19, 10, 19), 1000, False))
    v = validate_append(e, 0, 0, 9, False)
    assert v.duplicate_of == BatchMeta(0, 9, 0, 9)


def test_only_five_batches_are_remembered() -> None:
    e = _entry()
    for i in range(1, 6):
        e = apply_append(
            e, AppendedBatch(7, 0, BatchMeta(i * 10, i * 10 + 9, i * 10, i * 10 + 9), 1000, False)
        )
    assert len(e.batches) == 5
    assert validate_append(e, 0, 10, 19, False).duplicate_of is not None
    # The oldest one fell out: a re-send of it is now out of order, not silently re-appended.
    assert validate_append(e, 0, 0, 9, False).error_code == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER


def test_older_epoch_is_fenced() -> None:
    e = _entry(epoch=2)
    assert validate_append(e, 1, 10, 19, False).error_code == KafkaError.INVALID_PRODUCER_EPOCH


def test_new_epoch_must_start_at_zero() -> None:
    e = _entry(epoch=0)
    assert validate_append(e, 1, 0, 4, False).ok
    assert (
        validate_append(e, 1, 10, 14, False).error_code == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    )


def test_new_epoch_resets_remembered_batches() -> None:
    e = apply_append(_entry(), AppendedBatch(7, 1, BatchMeta(0, 4, 10, 14), 1000, False))
    assert e.batches == (BatchMeta(0, 4, 10, 14),)
    assert e.producer_epoch == 1


def test_non_transactional_write_with_open_transaction_rejected() -> None:
    e = apply_append(None, AppendedBatch(7, 0, BatchMeta(0, 0, 5, 5), 1000, True))
    assert e.txn_first_offset == 5
    assert validate_append(e, 0, 1, 1, False).error_code == KafkaError.INVALID_TXN_STATE
    assert validate_append(e, 0, 1, 1, True).ok


def test_sequence_wraps_at_int32_max() -> None:
    assert increment_sequence(INT32_MAX, 1) == 0
    assert increment_sequence(INT32_MAX - 1, 3) == 1
    assert in_sequence(INT32_MAX, 0)
    e = apply_append(
        None, AppendedBatch(7, 0, BatchMeta(INT32_MAX - 4, INT32_MAX, 0, 4), 1000, False)
    )
    last = increment_sequence(0, 9)
    assert validate_append(e, 0, 0, last, False).ok
    assert validate_append(e, 0, 1, 10, False).error_code == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER


@given(st.integers(0, INT32_MAX), st.integers(0, 10_000))
def test_increment_stays_in_range(seq: int, inc: int) -> None:
    out = increment_sequence(seq, inc)
    assert 0 <= out <= INT32_MAX
    assert out == (seq + inc) % (INT32_MAX + 1)


def test_expiry_never_while_transaction_open() -> None:
    idle = _entry()
    assert is_expired(idle, 1000 + 100, 100)
    assert not is_expired(idle, 1000 + 99, 100)
    open_txn = apply_append(None, AppendedBatch(7, 0, BatchMeta(0, 0, 0, 0), 1000, True))
    assert not is_expired(open_txn, 10**12, 100)


def test_marker_closes_transaction_and_checks_epochs() -> None:
    e = apply_append(None, AppendedBatch(7, 3, BatchMeta(0, 0, 5, 5), 1000, True))
    e = apply_marker(e, Marker(7, 3, 2, CONTROL_COMMIT, 1001), 6)
    assert e.txn_first_offset is None and e.coordinator_epoch == 2
    assert (
        validate_marker(e, Marker(7, 2, 2, CONTROL_COMMIT, 1003)).error_code
        == KafkaError.INVALID_PRODUCER_EPOCH
    )
    assert (
        validate_marker(e, Marker(7, 3, 1, CONTROL_COMMIT, 1003)).error_code
        == KafkaError.TRANSACTION_COORDINATOR_FENCED
    )
    assert validate_marker(e, Marker(7, 4, 2, CONTROL_COMMIT, 1003)).ok
    bumped = apply_marker(e, Marker(7, 4, 2, CONTROL_ABORT, 1002), 7)
    assert bumped.producer_epoch == 4 and bumped.last_sequence == -1
    assert validate_append(bumped, 4, 0, 0, True).ok
    assert (
        validate_append(bumped, 4, 1, 1, True).error_code == KafkaError.OUT_OF_ORDER_SEQUENCE_NUMBER
    )


def test_lso_rules() -> None:
    # No open transaction: the LSO follows the end of the log, or pins at a new one.
    assert lso_after_append(10, 10, 15, opens_txn=False) == 15
    assert lso_after_append(10, 10, 15, opens_txn=True) == 10
    # An open transaction pins it whatever is appended after.
    assert lso_after_append(4, 10, 15, opens_txn=True) == 4
    assert lso_after_marker(None, 16) == 16
    assert lso_after_marker(7, 16) == 7
