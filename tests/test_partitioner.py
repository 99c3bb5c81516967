"""Keyed records must land where Kafka's own clients would put them."""

from __future__ import annotations

import random
import threading

import pytest
from hypothesis import given
from hypothesis import strategies as st

from app.client.partitioner import (
    KeylessPartitioner,
    choose_partition,
    consistent_partition,
    murmur2,
    murmur2_partition,
    to_positive,
)
from app.errors import KafkaError, KafkaException

# Kafka's UtilsTest, plus further values published for the Java client and librdkafka's
# rdmurmur2.c self-test (which covers every tail length and the empty key).
KNOWN_HASHES = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
    (b"1", -1993445489),
    (b"12", 126087238),
    (b"123", -267702483),
    (b"1234", -1614185708),
    (b"12345", -1188365604),
    (b"string-f-24-chars-length", 124730809),
    (b"string-fo-25-chars-length", 1269511650),
    (b"string-foo-26-chars-length", 119165628),
    (b"string-last-27-chars-length", 1089971754),
    (b"kafka", -798503068),
    (b"giberish123456789", -1890243828),
    (b"234", -406844982),
    (b"34", -2026295078),
    (b"4", 1514888353),
    (b"PreAmbleWillBeRemoved,ThePrePartThatIs", 2017611548),
    (b"reAmbleWillBeRemoved,ThePrePartThatIs", 1247982455),
    (b"eAmbleWillBeRemoved,ThePrePartThatIs", -521871202),
    (b"AmbleWillBeRemoved,ThePrePartThatIs", 1656271935),
    (b"", 275646681),
]


@pytest.mark.parametrize(("data", "expected"), KNOWN_HASHES)
def test_murmur2_matches_kafka(data: bytes, expected: int) -> None:
    assert murmur2(data) == expected


def test_murmur2_partition_is_masked_hash_modulo() -> None:
    # -973932308 & 0x7fffffff = 1173551340; with 3 partitions Kafka picks 0, with 10 it picks 0.
    assert murmur2_partition(b"21", 3) == 1173551340 % 3
    assert murmur2_partition(b"abc", 12) == 479470107 % 12
    # A negative hash is masked, not negated (abs would give a different partition).
    assert murmur2_partition(b"foobar", 7) == (-790332482 & 0x7FFFFFFF) % 7
    assert murmur2_partition(b"foobar", 7) != abs(-790332482) % 7


def test_to_positive_of_min_int_is_zero() -> None:
    assert to_positive(-(2**31)) == 0
    assert to_positive(-1) == 2**31 - 1


@given(st.binary(max_size=64))
def test_murmur2_is_signed_32_bit(data: bytes) -> None:
    assert -(2**31) <= murmur2(data) < 2**31


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=10_000))
def test_partition_in_range_and_stable(data: bytes, n: int) -> None:
    p = murmur2_partition(data, n)
    assert 0 <= p < n
    assert murmur2_partition(bytes(data), n) == p


@given(st.binary(max_size=32), st.integers(min_value=1, max_value=1000))
def test_consistent_partition_in_range(data: bytes, n: int) -> None:
    assert 0 <= consistent_partition(data, n) < n


@pytest.mark.parametrize("n", [0, -1])
def test_partition_count_must_be_positive(n: int) -> None:
    with pytest.raises(KafkaException) as info:
        murmur2_partition(b"k", n)
    assert info.value.args[0].code() == KafkaError._INVALID_ARG


def test_keyless_sticks_until_batch_sent() -> None:
    parts = KeylessPartitioner(random.Random(7))
    first = parts.partition("t", 6)
    assert all(parts.partition("t", 6) == first for _ in range(50))
    second = parts.batch_sent("t", first, 6)
    assert second != first
    assert parts.partition("t", 6) == second


def test_keyless_stale_report_does_not_switch_twice() -> None:
    parts = KeylessPartitioner(random.Random(1))
    first = parts.partition("t", 4)
    second = parts.batch_sent("t", first, 4)
    # A second thread reporting the same finished batch must not move the topic again.
    assert parts.batch_sent("t", first, 4) == second


def test_keyless_topics_are_independent_and_single_partition_works() -> None:
    parts = KeylessPartitioner(random.Random(3))
    assert parts.partition("one", 1) == 0
    assert parts.batch_sent("one", 0, 1) == 0
    other = parts.partition("other", 5)
    assert 0 <= other < 5


def test_keyless_repicks_when_partition_count_shrinks() -> None:
    parts = KeylessPartitioner(random.Random(0))
    while parts.partition("t", 10) < 3:
        parts.batch_sent("t", parts.partition("t", 10), 10)
    assert parts.partition("t", 3) < 3


@given(st.integers(min_value=1, max_value=50), st.integers(min_value=0, max_value=2**32))
def test_keyless_always_in_range(n: int, seed: int) -> None:
    parts = KeylessPartitioner(random.Random(seed))
    p = parts.partition("t", n)
    for _ in range(5):
        assert 0 <= p < n
        p = parts.batch_sent("t", p, n)
    assert 0 <= p < n


def test_keyless_spreads_over_batches() -> None:
    parts = KeylessPartitioner(random.Random(11))
    seen = set()
    p = parts.partition("t", 4)
    for _ in range(200):
        seen.add(p)
        p = parts.batch_sent("t", p, 4)
    assert seen == {0, 1, 2, 3}


def test_keyless_is_thread_safe() -> None:
    parts = KeylessPartitioner()
    errors: list[BaseException] = []

    def work() -> None:
        try:
            for _ in range(2000):
                p = parts.partition("t", 8)
                assert 0 <= p < 8
                parts.batch_sent("t", p, 8)
        except BaseException as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors


def test_choose_partition_strategies() -> None:
    keyless = KeylessPartitioner(random.Random(5))
    assert choose_partition("murmur2_random", b"abc", "t", 12, keyless) == 479470107 % 12
    assert choose_partition("murmur2", b"abc", "t", 12, keyless) == 479470107 % 12
    sticky = keyless.partition("t", 12)
    assert choose_partition("murmur2_random", None, "t", 12, keyless) == sticky
    assert choose_partition("consistent_random", None, "t", 12, keyless) == sticky
    assert choose_partition("random", b"abc", "t", 12, keyless) == sticky
    # The plain hash strategies hash a missing key as the empty key.
    assert choose_partition("murmur2", None, "t", 12, keyless) == 275646681 % 12
    assert choose_partition("consistent", None, "t", 12, keyless) == 0
    assert choose_partition("consistent", b"abc", "t", 12, keyless) == consistent_partition(
        b"abc", 12
    )
