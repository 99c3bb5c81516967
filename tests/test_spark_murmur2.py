"""The sink's column-wise murmur2 puts every key on the partition Kafka's producers (and
``app.client.partitioner``) choose for it, for keys of every length, many of one length
(the kernels' path) or few (the key-by-key path), and nulls."""

from __future__ import annotations

import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from app.client.partitioner import murmur2_partition
from app.spark.murmur2 import partitions_of_keys

keys = st.one_of(st.none(), st.binary(max_size=13))


@settings(max_examples=200, deadline=None)
@given(
    st.lists(keys, max_size=60),
    st.lists(st.binary(min_size=0, max_size=9), min_size=0, max_size=3),
    st.integers(1, 1000),
)
def test_every_key_lands_where_kafkas_partitioner_puts_it(
    scattered: list[bytes | None], repeated_lengths: list[bytes], count: int
) -> None:
    # Many keys of one length take the kernels' path: 40 variants of each given key.
    many = [bytes([i]) + k for k in repeated_lengths for i in range(40)]
    all_keys = scattered + many
    got = partitions_of_keys(pa.array(all_keys, pa.binary()), count).to_pylist()
    want = [None if k is None else murmur2_partition(k, count) for k in all_keys]
    assert got == want


def test_kafkas_own_examples_and_an_empty_column() -> None:
    # Partitions of Kafka's DefaultPartitioner for these keys among 3 partitions, as the
    # scalar function (itself checked against Kafka's Utils.murmur2 vectors) gives them.
    sample = [b"", b"a", b"kafka", b"0123456789abcdef"] * 10
    got = partitions_of_keys(pa.array(sample, pa.binary()), 3).to_pylist()
    assert got == [murmur2_partition(k, 3) for k in sample]
    assert partitions_of_keys(pa.array([], pa.binary()), 3).to_pylist() == []
    assert partitions_of_keys(pa.array([None, None], pa.binary()), 3).to_pylist() == [None, None]
