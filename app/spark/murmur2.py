"""Kafka's default partition of every key of an Arrow array at once.

The sink must put a keyed row on the partition Kafka's producers would
(``app.client.partitioner.murmur2_partition``: murmur2, ``toPositive``, modulo), but that
function runs ~4 µs of Python per key, more than all the rest of a row's write. Here the
same arithmetic runs column-wise in Arrow's kernels: keys are grouped by length (murmur2's
rounds depend only on it), and for each length every round is a handful of kernel calls
over all the keys of that length: each 4-byte word taken by ``binary_slice`` and read as a
little-endian uint32 (as Kafka reads it), multiplications that wrap at 2^32 (Arrow's
unchecked ``multiply`` on uint32, Java's int arithmetic), shifts that are unsigned (Java's
``>>>``). A length shared by few keys is hashed key by key instead, where the kernels'
fixed cost would outweigh them.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

from app.client.partitioner import murmur2_partition

if TYPE_CHECKING:
    import pyarrow as pa

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
# Below this many keys of one length, hashing them one by one costs less.
_FEW = 32


def partitions_of_keys(keys: pa.Array, count: int) -> pa.Array:
    """Each key's partition among ``count`` (int32), null where the key is null."""
    import pyarrow as pa
    import pyarrow.compute as pc

    assert sys.byteorder == "little"  # Arrow's buffers are read as Kafka's little-endian words
    n = len(keys)
    if n == 0 or keys.null_count == n:
        return pa.nulls(n, pa.int32())
    lengths = pc.binary_length(keys)
    order = pc.sort_indices(lengths)  # nulls last
    by_length = keys.take(order)
    sorted_lengths = lengths.take(order)
    pieces: list[pa.Array] = []
    start = 0
    for entry in pc.value_counts(sorted_lengths.drop_null()).to_pylist():
        length, run = entry["values"], entry["counts"]
        group = by_length.slice(start, run)
        if run < _FEW:
            found = [murmur2_partition(k, count) for k in group.to_pylist()]
            pieces.append(pa.array(found, pa.int32()))
        else:
            pieces.append(_group_partitions(group, length, count))
        start += run
    pieces.append(pa.nulls(n - start, pa.int32()))
    in_length_order = pa.concat_arrays(pieces)
    # Back to the rows' order: the row at ``order[i]`` got ``in_length_order[i]``.
    return in_length_order.take(pc.sort_indices(order))


def _group_partitions(group: pa.Array, length: int, count: int) -> pa.Array:
    """murmur2's partitions of keys that all have ``length`` bytes."""
    import pyarrow as pa
    import pyarrow.compute as pc

    u32 = pa.uint32()
    m = pa.scalar(_M, u32)

    def word(start: int, width: int) -> pa.Array:
        """Bytes ``[start, start + width)`` of every key, as uint32 (little-endian)."""
        sliced = pc.binary_slice(group, start, start + width).cast(pa.binary(width))
        data = sliced.buffers()[1]
        if width == 4:
            return pa.Array.from_buffers(u32, len(group), [None, data], offset=sliced.offset)
        octets = pa.Array.from_buffers(pa.uint8(), len(group), [None, data], offset=sliced.offset)
        return octets.cast(u32)

    h: pa.Array | pa.Scalar = pa.scalar((_SEED ^ length) & 0xFFFFFFFF, u32)
    body = length - length % 4
    for i in range(0, body, 4):
        k = pc.multiply(word(i, 4), m)
        k = pc.bit_wise_xor(k, pc.shift_right(k, pa.scalar(_R, u32)))
        k = pc.multiply(k, m)
        h = pc.bit_wise_xor(pc.multiply(h, m), k)
    if length % 4:
        # Kafka's switch falls through: the last 1-3 bytes folded in little-endian.
        for b in range(length % 4):
            h = pc.bit_wise_xor(h, pc.shift_left(word(body + b, 1), pa.scalar(8 * b, u32)))
        h = pc.multiply(h, m)
    h = pc.bit_wise_xor(h, pc.shift_right(h, pa.scalar(13, u32)))
    h = pc.multiply(h, m)
    h = pc.bit_wise_xor(h, pc.shift_right(h, pa.scalar(15, u32)))
    if isinstance(h, pa.Scalar):  # an empty key: no round ran over the group
        h = pa.array([h.as_py()] * len(group), u32)
    positive = pc.bit_wise_and(h, pa.scalar(0x7FFFFFFF, u32)).cast(pa.int64())
    # Arrow's integer division truncates: for a non-negative hash, the floor.
    remainder = pc.subtract(positive, pc.multiply(pc.divide(positive, count), count))
    return remainder.cast(pa.int32())
