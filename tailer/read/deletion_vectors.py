"""Reading deletion vectors: inline (``i``), relative (``u``) and absolute (``p``).

Protocol, "Deletion Vector Format": a DV is "a serialized 64-bit bitmap in the
portable standard format" preceded by the 4-byte little-endian magic number
``1681511377``. Protocol, "Deletion Vector File Storage Format": a DV file
starts with a one-byte format ``version``; then, for each DV, its ``dataSize``
(4 bytes), the ``bitmapData`` and a "CRC-32 checksum of bitmapData" (4 bytes).
Real files store ``dataSize`` and the checksum big-endian, and a descriptor's
``offset`` points at the ``dataSize`` field (see ``shared/spec/README.md``).
Inline DVs are the same ``magic + bitmap`` bytes, Z85-encoded, without framing.
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

from pyroaring import BitMap64

from deltatail.state.actions import DeletionVector
from deltatail.state.errors import DeletionVectorError, InvalidLogError, MissingFileError, UnsafePathError
from deltatail.state.z85 import z85_decode
from deltatail.tailer.storage import Storage

MAGIC = 1681511377
"""The magic number that starts every serialized DV (little-endian on disk)."""

DEFAULT_OFFSET = 1
"""Where the first DV of a file starts when a descriptor has no ``offset``: after the version byte."""

_SIZE_FIELD = 4
_CHECKSUM_FIELD = 4


def decode_bitmap(data: bytes) -> BitMap64:
    """Decode ``magic + portable 64-bit roaring bitmap`` bytes into a bitmap of row indexes.

    Args:
        data: the DV's data, starting with the 4-byte little-endian magic ``1681511377``.

    Returns:
        The set of row indexes.

    Raises:
        DeletionVectorError: if the magic number is wrong or the bitmap does not deserialize.
    """
    if len(data) < 4 or int.from_bytes(data[:4], "little") != MAGIC:
        raise DeletionVectorError(f"deletion vector does not start with the magic number {MAGIC}")
    try:
        return BitMap64.deserialize(data[4:])
    except (ValueError, IndexError) as e:
        raise DeletionVectorError(f"deletion vector bitmap does not deserialize: {e}") from e


def read_deletion_vector(
    storage: Storage,
    table_root: str,
    dv: DeletionVector,
    *,
    data_file: str,
    version: int | None = None,
    external_roots: Sequence[str] = (),
) -> BitMap64:
    """Read the rows a deletion vector marks as deleted in ``data_file``.

    ``i`` DVs are decoded from the descriptor; ``u`` and ``p`` DVs are read from
    their file at ``offset`` (default 1, after the version byte): size field,
    data, CRC-32. The decoded bitmap must hold exactly ``cardinality`` rows.

    Args:
        storage: where the DV file lives.
        table_root: the table root (relative ``u`` DVs resolve against it); also named in errors.
        dv: the descriptor from the ``add`` or ``remove`` action.
        data_file: the data file the DV belongs to; named in errors.
        version: the table version whose action holds the descriptor; named in errors.
        external_roots: roots outside the table a ``p`` DV may be read from (:mod:`state.paths`).

    Returns:
        The deleted row indexes (0-based positions in the data file).

    Raises:
        UnsafePathError: if the DV file is outside the table root and every external root (never opened).
        MissingFileError: if the DV file does not exist (the message names the data file, ``file`` the DV file).
        DeletionVectorError: if the data is truncated, its size field or CRC-32 does not match, it does
            not decode, or its cardinality differs from the descriptor's.
    """
    try:
        data = (
            _inline_data(dv)
            if dv.storage_type == "i"
            else _file_data(storage, table_root, dv, data_file, external_roots)
        )
        bitmap = decode_bitmap(data)
        if len(bitmap) != dv.cardinality:
            raise DeletionVectorError(
                f"deletion vector of {data_file} holds {len(bitmap)} rows, its descriptor says {dv.cardinality}"
            )
    except (DeletionVectorError, MissingFileError) as e:
        e.at(table=table_root, version=version, file=data_file)
        raise
    except UnsafePathError as e:
        raise UnsafePathError(
            f"deletion vector of data file {data_file}: {e.message}", table=table_root, version=version, file=e.file
        ) from None
    except InvalidLogError as e:
        raise DeletionVectorError(e.message, table=table_root, version=version, file=data_file) from e
    return bitmap


def _inline_data(dv: DeletionVector) -> bytes:
    """Decode an inline DV; Z85 padding (zeros or ``#`` short group) beyond ``sizeInBytes`` is dropped."""
    raw = z85_decode(dv.path_or_inline_dv)
    if len(raw) < dv.size_in_bytes:
        raise DeletionVectorError(f"inline deletion vector decodes to {len(raw)} bytes, expected {dv.size_in_bytes}")
    return raw[: dv.size_in_bytes]


def dv_file_location(table_root: str, dv: DeletionVector, external_roots: Sequence[str] = ()) -> str:
    """The location of a ``u`` or ``p`` DV's file (a ``p`` URI is percent-decoded), checked by the containment rule.

    Raises:
        UnsafePathError: if the file is outside the table root and every external root (:mod:`state.paths`).
        InvalidLogError: for an inline DV or a ``u`` path whose UUID does not decode.
    """
    return dv.absolute_path(table_root, external_roots)


def _file_data(
    storage: Storage, table_root: str, dv: DeletionVector, data_file: str, external_roots: Sequence[str]
) -> bytes:
    """Read one framed DV from its file and check its size field and CRC-32."""
    location = dv_file_location(table_root, dv, external_roots)
    offset = DEFAULT_OFFSET if dv.offset is None else dv.offset
    size = dv.size_in_bytes
    where = f"deletion vector of data file {data_file} in {location} at offset {offset}"
    try:
        frame = storage.read(location, offset, _SIZE_FIELD + size + _CHECKSUM_FIELD)
    except MissingFileError as e:
        raise MissingFileError(
            f"deletion vector file {location} of data file {data_file} does not exist", file=location
        ) from e
    if len(frame) < _SIZE_FIELD + size + _CHECKSUM_FIELD:
        raise DeletionVectorError(f"{where} is truncated", file=location)
    stored_size = int.from_bytes(frame[:_SIZE_FIELD], "big")
    if stored_size != size:
        raise DeletionVectorError(
            f"{where} has size {stored_size}, its descriptor says {size}",
            file=location,
        )
    data = frame[_SIZE_FIELD : _SIZE_FIELD + size]
    stored_crc = int.from_bytes(frame[_SIZE_FIELD + size :], "big")
    if zlib.crc32(data) != stored_crc:
        raise DeletionVectorError(
            f"{where} fails its CRC-32 check",
            file=location,
        )
    return data
