"""Stable row ids of a Lance fragment, decoded from their ``RowIdSequence`` protobuf bytes. Pure.

With the stable-row-ids feature (reader flag 2) a fragment names the row ids of its rows, in
order, as a ``RowIdSequence`` (``rowids.proto`` in the specification): segments, each a range,
a range with holes or with a bitmap, a sorted array or an array (``EncodedU64Array``: a base and
u16/u32 offsets, or plain u64 values). :func:`decode_row_ids` turns one into an Arrow array.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from deltatail.state.errors import InvalidLogError
from deltatail.state.lance.manifest import MAX_FRAGMENT_ROWS
from deltatail.state.lance.protobuf import as_bytes, as_int, fields


def _encoded_u64(buf: bytes) -> pa.Array:
    for number, _, value in fields(buf):
        body = as_bytes(value, "EncodedU64Array")
        base = 0
        raw = b""
        for n, _, v in fields(body):
            if n == 1:
                base = as_int(v, "EncodedU64Array.base")
            elif n == 2:
                raw = as_bytes(v, "EncodedU64Array.values")
        width = {1: 2, 2: 4, 3: 8}.get(number)
        if width is None or len(raw) % width:
            raise InvalidLogError("malformed EncodedU64Array in a row-id sequence")
        kind = {2: pa.uint16(), 4: pa.uint32(), 8: pa.uint64()}[width]
        values = pa.Array.from_buffers(kind, len(raw) // width, [None, pa.py_buffer(raw)]).cast(pa.uint64())
        return values if number == 3 else pc.add(values, pa.scalar(base, pa.uint64()))
    return pa.array([], pa.uint64())


def _range(start: int, end: int) -> pa.Array:
    n = end - start
    if n <= 0:
        return pa.array([], pa.uint64())
    if n > MAX_FRAGMENT_ROWS:
        raise InvalidLogError(f"row-id range of {n} ids, more than deltatail's limit of {MAX_FRAGMENT_ROWS}")
    ones = pa.repeat(pa.scalar(1, pa.uint64()), n)
    return (
        pc.add(pc.cumulative_sum(ones), pa.scalar(start - 1, pa.uint64()))
        if start
        else pc.subtract(pc.cumulative_sum(ones), pa.scalar(1, pa.uint64()))
    )


def _bitmap_range(start: int, end: int, bitmap: bytes) -> pa.Array:
    """The values of a ``RangeWithBitmap``: bit ``i`` set means ``start + i`` is in.

    The bitmap is least-significant bit first within each byte (as Lance writes it, and as Arrow
    lays out booleans), whatever the proto's comment says.
    """
    flags = pa.Array.from_buffers(pa.bool_(), end - start, [None, pa.py_buffer(bitmap)])
    return pc.add(pc.indices_nonzero(flags).cast(pa.uint64()), pa.scalar(start, pa.uint64()))


def decode_row_ids(sequence: bytes) -> pa.UInt64Array:
    """The row ids of a serialized ``RowIdSequence``, one per physical row in order.

    Raises:
        InvalidLogError: if the bytes are malformed.
    """
    parts: list[pa.Array] = []
    for number, _, value in fields(sequence):
        if number != 1:
            continue
        for kind, _, body in fields(as_bytes(value, "RowIdSequence.segments")):
            seg = as_bytes(body, "U64Segment")
            if kind in (4, 5):
                parts.append(_encoded_u64(seg))
                continue
            start = end = 0
            extra = b""
            for n, _, v in fields(seg):
                if n == 1:
                    start = as_int(v, "U64Segment.start")
                elif n == 2:
                    end = as_int(v, "U64Segment.end")
                elif n == 3:
                    extra = as_bytes(v, "U64Segment.holes/bitmap")
            if kind == 1:
                parts.append(_range(start, end))
            elif kind == 2:
                holes = _encoded_u64(extra)
                values = _range(start, end)
                parts.append(values.filter(pc.invert(pc.is_in(values, value_set=holes))))
            elif kind == 3:
                if len(extra) * 8 < end - start:
                    raise InvalidLogError("row-id bitmap shorter than its range")
                parts.append(_bitmap_range(start, end, extra))
            else:
                raise InvalidLogError(f"unknown row-id segment kind {kind}")
    if not parts:
        return pa.array([], pa.uint64())
    out = pa.concat_arrays([p.cast(pa.uint64()) for p in parts])
    assert isinstance(out, pa.UInt64Array)
    return out
