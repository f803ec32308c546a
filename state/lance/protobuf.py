"""A minimal protobuf wire-format reader, for the few Lance messages deltatail decodes. Pure.

Only what the wire format itself says is decoded here: field numbers, wire types, varints,
fixed-width values and length-delimited bytes. The meaning of each field is the caller's (see
:mod:`state.lance.manifest`). Groups (wire types 3 and 4) are not used by Lance and are refused.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator

from deltatail.state.errors import InvalidLogError

#: Wire types.
VARINT, FIXED64, LENGTH, FIXED32 = 0, 1, 2, 5

Value = int | bytes


def _varint(buf: bytes, pos: int) -> tuple[int, int]:
    result = 0
    shift = 0
    while True:
        if pos >= len(buf):
            raise InvalidLogError("truncated protobuf varint")
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return result, pos
        shift += 7
        if shift >= 70:
            raise InvalidLogError("protobuf varint longer than 10 bytes")


def fields(buf: bytes) -> Iterator[tuple[int, int, Value]]:
    """The ``(field number, wire type, value)`` triples of one message, in wire order.

    Varints and fixed-width values are unsigned integers; length-delimited values are bytes.

    Raises:
        InvalidLogError: if the bytes are not a well-formed message.
    """
    pos = 0
    end = len(buf)
    while pos < end:
        key, pos = _varint(buf, pos)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise InvalidLogError("protobuf field number 0")
        value: Value
        if wire == VARINT:
            value, pos = _varint(buf, pos)
        elif wire == FIXED64:
            if pos + 8 > end:
                raise InvalidLogError("truncated protobuf fixed64")
            value = struct.unpack_from("<Q", buf, pos)[0]
            pos += 8
        elif wire == FIXED32:
            if pos + 4 > end:
                raise InvalidLogError("truncated protobuf fixed32")
            value = struct.unpack_from("<I", buf, pos)[0]
            pos += 4
        elif wire == LENGTH:
            length, pos = _varint(buf, pos)
            if pos + length > end:
                raise InvalidLogError("truncated protobuf length-delimited field")
            value = bytes(buf[pos : pos + length])
            pos += length
        else:
            raise InvalidLogError(f"unsupported protobuf wire type {wire} (field {number})")
        yield number, wire, value


def as_bytes(value: Value, name: str) -> bytes:
    """A length-delimited value, or an error naming the field.

    Raises:
        InvalidLogError: if ``value`` is an integer.
    """
    if not isinstance(value, bytes):
        raise InvalidLogError(f"protobuf field {name} should be length-delimited")
    return value


def as_int(value: Value, name: str) -> int:
    """A varint or fixed-width value, or an error naming the field.

    Raises:
        InvalidLogError: if ``value`` is bytes.
    """
    if not isinstance(value, int):
        raise InvalidLogError(f"protobuf field {name} should be a number")
    return value


def signed32(value: int) -> int:
    """An ``int32`` field's value (negative numbers travel as 10-byte varints)."""
    value &= 0xFFFFFFFF
    return value - (1 << 32) if value >= 1 << 31 else value


def packed_varints(value: Value, name: str) -> list[int]:
    """A repeated scalar field: packed bytes of varints, or one unpacked varint.

    Raises:
        InvalidLogError: if the bytes are not varints.
    """
    if isinstance(value, int):
        return [value]
    out: list[int] = []
    pos = 0
    while pos < len(value):
        v, pos = _varint(value, pos)
        out.append(v)
    return out


def text(value: Value, name: str) -> str:
    """A ``string`` field.

    Raises:
        InvalidLogError: if it is not UTF-8 bytes.
    """
    try:
        return as_bytes(value, name).decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidLogError(f"protobuf field {name} is not UTF-8") from e
