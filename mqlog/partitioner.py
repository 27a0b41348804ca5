"""Which partition a record goes to: Kafka's default partitioner, so that keys land where
a Kafka user expects them, and round-robin for records without a key.

With a key, the partition is ``toPositive(murmur2(key bytes)) % partitions``, exactly as
Kafka's ``BuiltInPartitioner.partitionForKey``: MurmurHash2 (32 bits, seed 0x9747b28c,
Kafka's variant, signed Java ints), with the sign bit masked off (``& 0x7fffffff``, not
``abs``: Kafka's ``Utils.toPositive``). A ``str`` key is hashed as its UTF-8 bytes, which
is what Kafka's ``StringSerializer`` produces. The test vectors of Kafka's own UtilsTest
are in tests/test_controller_partitioner.py.

Without a key, ``RoundRobin`` hands out partitions in turn, per topic (Kafka's
``RoundRobinPartitioner``; Kafka's default since 2.4 is "sticky", which only batches
better, and balances the same in the long run).

Pure: no asyncio, no I/O, no module-level state, so a client (or Spark) imports it freely.
"""

from __future__ import annotations

from mqlog.errors import InvalidArgument

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


def murmur2(data: bytes) -> int:
    """Kafka's ``Utils.murmur2``: the 32-bit hash as a signed (Java) int."""
    length = len(data)
    h = (_SEED ^ length) & _MASK
    whole = length - length % 4
    for index in range(0, whole, 4):
        k = int.from_bytes(data[index:index + 4], "little")
        k = (k * _M) & _MASK
        k ^= k >> 24
        k = (k * _M) & _MASK
        h = ((h * _M) & _MASK) ^ k
    tail = data[whole:]
    if len(tail) == 3:
        h ^= tail[2] << 16
    if len(tail) >= 2:
        h ^= tail[1] << 8
    if tail:
        h ^= tail[0]
        h = (h * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    h ^= h >> 15
    return h - (1 << 32) if h & 0x80000000 else h


def _key_bytes(key: bytes | str) -> bytes:
    if isinstance(key, str):
        try:
            return key.encode("utf-8")
        except UnicodeEncodeError:
            raise InvalidArgument(f"key {key!r} is not valid text (a lone surrogate?): pass "
                                  "the key as bytes") from None
    if isinstance(key, bytes | bytearray | memoryview):
        return bytes(key)
    raise InvalidArgument(f"a key must be str or bytes, got {type(key).__name__}")


def _check_count(partitions: int) -> None:
    if not isinstance(partitions, int) or isinstance(partitions, bool) or partitions < 1:
        raise InvalidArgument(f"partitions must be an int of at least 1, got {partitions!r}")


def partition_for_key(key: bytes | str, partitions: int) -> int:
    """The partition Kafka's default partitioner picks for ``key`` among ``partitions``."""
    _check_count(partitions)
    return (murmur2(_key_bytes(key)) & 0x7FFFFFFF) % partitions


class RoundRobin:
    """Partitions in turn, per topic, for records without a key (one per producer)."""

    def __init__(self) -> None:
        self._next: dict[str, int] = {}

    def partition(self, topic: str, partitions: int) -> int:
        _check_count(partitions)
        turn = self._next.get(topic, 0)
        self._next[topic] = turn + 1
        return turn % partitions


def choose_partition(key: bytes | str | None, topic: str, partitions: int,
                     round_robin: RoundRobin) -> int:
    """Kafka's rule: by the key's hash if there is a key, else the next in turn."""
    if key is None:
        return round_robin.partition(topic, partitions)
    return partition_for_key(key, partitions)
