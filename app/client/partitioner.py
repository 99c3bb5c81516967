"""Choosing a partition for a record, the way Kafka's clients do.

Keyed records must land on the partition the Java client (and librdkafka's ``murmur2``
partitioners) would choose, so that data produced through this library and through a
real Kafka client stays co-partitioned by key. That pins the hash down to the bit:
Kafka's variant of MurmurHash2 with its fixed seed, Java's signed 32-bit arithmetic, and
``toPositive`` (masking the sign bit rather than ``abs``) before the modulo.
"""

from __future__ import annotations

import random
import threading
import zlib

from app.errors import KafkaError, fail

_SEED = 0x9747B28C
_M = 0x5BD1E995
_R = 24
_MASK32 = 0xFFFFFFFF


def _to_signed32(value: int) -> int:
    value &= _MASK32
    return value - 0x1_0000_0000 if value & 0x8000_0000 else value


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: a signed 32-bit hash, identical to the Java client's.

    Python integers are unbounded, so every multiplication is truncated to 32 bits and
    Java's unsigned shift (``>>>``) becomes a plain shift of the unsigned value.
    """
    length = len(data)
    h = (_SEED ^ length) & _MASK32
    body = length - (length % 4)
    for i in range(0, body, 4):
        k = int.from_bytes(data[i : i + 4], "little")
        k = (k * _M) & _MASK32
        k ^= k >> _R
        k = (k * _M) & _MASK32
        h = ((h * _M) & _MASK32) ^ k
    tail = length % 4
    if tail:
        # Kafka's switch falls through: the remaining 1-3 bytes are folded in little-endian.
        h ^= int.from_bytes(data[body:], "little")
        h = (h * _M) & _MASK32
    h ^= h >> 13
    h = (h * _M) & _MASK32
    h ^= h >> 15
    return _to_signed32(h)


def to_positive(value: int) -> int:
    """Kafka's ``Utils.toPositive``: clear the sign bit, so ``-2**31`` maps to 0, not overflow."""
    return value & 0x7FFFFFFF


def _check_partitions(num_partitions: int) -> None:
    if num_partitions < 1:
        raise fail(KafkaError._INVALID_ARG, f"num_partitions must be >= 1, got {num_partitions}")


def murmur2_partition(key: bytes, num_partitions: int) -> int:
    """The partition Kafka's default partitioner assigns to a record with this key."""
    _check_partitions(num_partitions)
    return to_positive(murmur2(key)) % num_partitions


def consistent_partition(key: bytes, num_partitions: int) -> int:
    """librdkafka's ``consistent`` partitioner (CRC32 of the key), for configs that ask for it."""
    _check_partitions(num_partitions)
    return (zlib.crc32(key) & _MASK32) % num_partitions


class KeylessPartitioner:
    """Sticky choice for records without a key, like Kafka's sticky partitioner (KIP-480).

    Spreading keyless records one by one would make every batch tiny; sticking to one
    partition until its batch fills or is sent keeps batches full while still spreading
    load over time. Switching only when the caller reports the partition it just filled or
    sent from means two threads finishing the same batch move the topic on once, not twice.
    """

    def __init__(self, rng: random.Random | None = None) -> None:
        self._rng = rng or random.Random()
        self._lock = threading.Lock()
        self._sticky: dict[str, int] = {}

    def partition(self, topic: str, num_partitions: int) -> int:
        """The partition the current batch of keyless records for ``topic`` goes to."""
        _check_partitions(num_partitions)
        with self._lock:
            current = self._sticky.get(topic)
            if current is None or current >= num_partitions:
                current = self._rng.randrange(num_partitions)
                self._sticky[topic] = current
            return current

    def batch_sent(self, topic: str, partition: int, num_partitions: int) -> int:
        """Move ``topic`` to another partition if it is still stuck to ``partition``.

        Returns the partition now in use.
        """
        _check_partitions(num_partitions)
        with self._lock:
            current = self._sticky.get(topic)
            if current is not None and current != partition and current < num_partitions:
                return current
            if num_partitions == 1:
                chosen = 0
            else:
                # Pick uniformly among the other partitions so a switch always moves.
                chosen = self._rng.randrange(num_partitions - 1)
                if chosen >= partition >= 0:
                    chosen += 1
            self._sticky[topic] = chosen
            return chosen


def choose_partition(
    strategy: str,
    key: bytes | None,
    topic: str,
    num_partitions: int,
    keyless: KeylessPartitioner,
) -> int:
    """Apply a ``partitioner`` config value to one record.

    The ``*_random`` strategies (and Kafka's default) send keyless records to the sticky
    partition; the plain hash strategies hash an absent key as empty, as librdkafka does.
    """
    if strategy == "random" or (key is None and strategy.endswith("_random")):
        return keyless.partition(topic, num_partitions)
    data = key if key is not None else b""
    if strategy.startswith("consistent"):
        return consistent_partition(data, num_partitions)
    return murmur2_partition(data, num_partitions)
