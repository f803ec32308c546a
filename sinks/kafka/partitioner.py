"""Kafka's default partitioner, computed here: a message's partition from its key.

Kafka's clients (the Java client, librdkafka's ``murmur2_random``) put a keyed
message on partition ``(murmur2(key) & 0x7fffffff) % partitions``. The sink
chooses partitions itself where it must know them (exactly-once's start-up
scan reads each partition's tail); the result is the clients' own, tested
against kafka-python's murmur2 for every key length from 0 to 40.

What the Arrow version buys (``python -m benchmarks.kafka_sink``, see
``benchmarks/README.md``): choosing the partitions of a batch's 200,000 keys
with kernels instead of a Python loop.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Sequence

import pyarrow as pa
import pyarrow.compute as pc


def choose_partition(key: bytes, partitions: int) -> int:
    """The partition of a key: positive murmur2 modulo the count, as Kafka's Java client does."""
    return (murmur2(key) & 0x7FFFFFFF) % partitions


_MURMUR_M, _MASK32 = 0x5BD1E995, 0xFFFFFFFF
_WORDS = struct.Struct("<I").iter_unpack


def murmur2(data: bytes) -> int:
    """32-bit MurmurHash2 with Kafka's seed, as an unsigned int (Java's ``Utils.murmur2`` reads it signed)."""
    n = len(data)
    h = 0x9747B28C ^ n
    end = n & ~3
    for (k,) in _WORDS(data[:end]):
        k = (k * _MURMUR_M) & _MASK32
        k = ((k ^ (k >> 24)) * _MURMUR_M) & _MASK32
        h = ((h * _MURMUR_M) & _MASK32) ^ k
    if end != n:  # the last 1-3 bytes, little-endian
        h = ((h ^ int.from_bytes(data[end:], "little")) * _MURMUR_M) & _MASK32
    h = ((h ^ (h >> 13)) * _MURMUR_M) & _MASK32
    return h ^ (h >> 15)


#: Below this many keys :func:`choose_partitions` hashes in Python: the kernels' set-up costs more.
_VECTOR_KEYS = 64
_U32 = pa.uint32()
#: murmur2's multiplier and shifts as ``uint32`` scalars (operands of one type: no widening).
_MURMUR_OPERANDS = tuple(pa.scalar(v, _U32) for v in (_MURMUR_M, 13, 15, 24))


def choose_partitions(keys: Sequence[bytes], partitions: int) -> list[int]:
    """:func:`choose_partition` of every key, the same numbers, computed with Arrow kernels.

    MurmurHash2 reads each key as little-endian 32-bit words and then its last 1-3 bytes. Keys
    are grouped by length, so that every key of a group has the same words and tail; a group's
    words are sliced out as 4-byte values and read as ``uint32`` (on a little-endian machine;
    elsewhere, and for few keys, each key is hashed in Python). Unchecked ``uint32`` arithmetic
    wraps around as the hash's ``& 0xFFFFFFFF`` does.
    """
    if len(keys) < _VECTOR_KEYS or sys.byteorder != "little":
        return [choose_partition(key, partitions) for key in keys]
    column = pa.array(keys, pa.binary())
    lengths = pc.binary_length(column)
    order: list[pa.Array] = []
    hashes: list[pa.Array] = []
    for length in pc.unique(lengths).to_pylist():
        rows = pc.indices_nonzero(pc.equal(lengths, pa.scalar(length, lengths.type)))
        order.append(rows)
        hashes.append(_murmur2_of_length(column.take(rows), length))
    positive = pc.bit_wise_and(pa.concat_arrays(hashes), pa.scalar(0x7FFFFFFF, _U32))
    # Operands are typed scalars: a Python value makes pyarrow infer its type, which tries to import
    # dateutil each time (~30 µs when it is not installed).
    count = pa.scalar(partitions, _U32)
    remainder = pc.subtract(positive, pc.multiply(pc.divide(positive, count), count))
    back = pc.sort_indices(pa.concat_arrays(order))  # where each key's result went
    partitions_of_keys: list[int] = remainder.take(back).to_pylist()
    return partitions_of_keys


def _words(column: pa.Array, start: int, size: int) -> pa.Array:
    """Bytes ``start:start+size`` (``size`` 1-4) of every value, zero-padded, read as little-endian ``uint32``."""
    part = pc.binary_slice(column, start, start + size)
    if size < 4:
        zeros = pa.scalar(b"\0" * (4 - size), pa.binary())
        part = pc.binary_join_element_wise(part, zeros, pa.scalar(b"", pa.binary()))
    fixed = pc.cast(part, pa.binary(4))
    return pa.Array.from_buffers(_U32, len(fixed), [None, fixed.buffers()[1]], offset=fixed.offset)


def _murmur2_of_length(column: pa.Array, length: int) -> pa.Array:
    """:func:`murmur2` of values that are all ``length`` bytes long, as a ``uint32`` array."""
    m, s13, s15, s24 = _MURMUR_OPERANDS
    h: pa.Array = pa.repeat(pa.scalar(0x9747B28C ^ length, _U32), len(column))  # no Python list: 10x faster
    end = length & ~3
    for start in range(0, end, 4):
        k = pc.multiply(_words(column, start, 4), m)
        k = pc.multiply(pc.bit_wise_xor(k, pc.shift_right(k, s24)), m)
        h = pc.bit_wise_xor(pc.multiply(h, m), k)
    if end != length:
        h = pc.multiply(pc.bit_wise_xor(h, _words(column, end, length - end)), m)
    h = pc.multiply(pc.bit_wise_xor(h, pc.shift_right(h, s13)), m)
    return pc.bit_wise_xor(h, pc.shift_right(h, s15))
