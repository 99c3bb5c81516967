"""The rows every write case is given: 16-byte keys and 100-byte values."""

from __future__ import annotations

import os

KEY_BYTES, VALUE_BYTES = 16, 100


def rows(n: int) -> list[tuple[bytes, bytes]]:
    """``n`` (key, value) pairs: keys in order, values random (compression gains nothing)."""
    return [
        (f"{i:016d}".encode()[:KEY_BYTES], os.urandom(VALUE_BYTES // 2).hex().encode())
        for i in range(n)
    ]
