"""The last stable offset (KIP-98 "Last Stable Offset Tracking"), as pure functions.

Invariant kept by every writer: LSO == high watermark exactly when no transaction is open
on the partition; otherwise LSO == the first offset of the earliest open transaction.
"""

from __future__ import annotations


def lso_after_append(current_lso: int, base_offset: int, next_offset: int, opens_txn: bool) -> int:
    """After appending [base_offset, next_offset): only a first open transaction pins it."""
    no_open_txn = current_lso == base_offset
    if not no_open_txn:
        return current_lso
    return base_offset if opens_txn else next_offset


def lso_after_marker(first_other_open_txn: int | None, next_offset: int) -> int:
    """After a marker closes one producer's transaction: the earliest other open one, or the end."""
    return next_offset if first_other_open_txn is None else first_other_open_txn
