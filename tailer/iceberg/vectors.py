"""Iceberg format v3 deletion vectors: one ``deletion-vector-v1`` blob of a Puffin file, read by its manifest entry.

The table spec: a deletion vector is a position delete file with ``file_format`` ``PUFFIN`` whose
``referenced_data_file`` names the one data file it deletes rows of; "``content_offset``: the offset
in the file where the content starts" and "``content_size_in_bytes``: the length of a referenced
content stored in the file"; its ``record_count`` is the number of deleted rows. So one ranged read
of ``content_size_in_bytes`` bytes at ``content_offset`` gives the blob; the Puffin footer is not
needed.

The Puffin spec, ``deletion-vector-v1``: "The blob's serialized form is: combined length of the
vector and magic bytes stored as 4 bytes, big-endian; a 4-byte magic sequence, ``D1 D3 39 64``; the
vector, serialized as described below; a CRC-32 checksum of the magic bytes and serialized vector as
4 bytes, big-endian", the vector "serialized using the Roaring bitmap 'portable' format for 64-bit"
positions. The magic is Delta's deletion vector magic number read little-endian, and the vector is
Delta's bitmap encoding, so :func:`tailer.read.deletion_vectors.decode_bitmap` decodes both.
"""

from __future__ import annotations

import zlib

import pyarrow as pa
from pyroaring import BitMap64

from deltatail.state.errors import DeletionVectorError, InvalidLogError
from deltatail.state.iceberg.model import ContentFile
from deltatail.tailer.read.deletion_vectors import decode_bitmap
from deltatail.tailer.storage import Storage

#: The length field and the CRC-32 around a blob's magic and vector.
_FRAME = 4 + 4
#: The largest deletion vector blob read (bytes): a vector of every row of a 2^31-row file as bitmap
#: containers takes 256 MiB; a larger blob is refused before it is read.
MAX_VECTOR_BYTES = 1 << 28


def check_vector_entry(f: ContentFile) -> tuple[int, int]:
    """The ``(content_offset, content_size_in_bytes)`` of deletion vector ``f``, or a refusal.

    Raises:
        InvalidLogError: if ``referenced_data_file``, ``content_offset`` or ``content_size_in_bytes`` is
            missing or negative, the blob is too small to hold its frame, or it ends past the file's size.
        DeletionVectorError: if ``content_size_in_bytes`` is over :data:`MAX_VECTOR_BYTES`.
    """
    if f.referenced_data_file is None or f.content_offset is None or f.content_size is None:
        raise InvalidLogError(
            "a deletion vector's manifest entry needs referenced_data_file, content_offset and content_size_in_bytes",
            file=f.path,
        )
    if f.content_size > MAX_VECTOR_BYTES:
        raise DeletionVectorError(
            f"deletion vector of {f.referenced_data_file} is {f.content_size} bytes, over the bound of "
            f"{MAX_VECTOR_BYTES} bytes",
            file=f.path,
        )
    if f.content_offset < 0 or f.content_size < _FRAME + 4 or f.content_offset + f.content_size > f.size:
        raise InvalidLogError(
            f"deletion vector of {f.referenced_data_file} at offset {f.content_offset} of {f.content_size} bytes "
            f"does not fit its {f.size}-byte Puffin file",
            file=f.path,
        )
    return f.content_offset, f.content_size


def read_vector(storage: Storage, location: str, f: ContentFile) -> BitMap64:
    """The row positions the deletion vector ``f`` (read from ``location``, its resolved path) deletes.

    Raises:
        InvalidLogError, DeletionVectorError: as :func:`check_vector_entry`.
        MissingFileError: if the Puffin file is gone.
        DeletionVectorError: if the blob is truncated, its length field, magic or CRC-32 is wrong, the
            bitmap does not decode, or it holds another number of rows than the entry's ``record_count``.
    """
    offset, size = check_vector_entry(f)
    blob = storage.read(location, offset, size)
    where = f"deletion vector of {f.referenced_data_file} at offset {offset}"
    if len(blob) != size:
        raise DeletionVectorError(f"{where} is truncated: {len(blob)} of {size} bytes", file=f.path)
    stored = int.from_bytes(blob[:4], "big")
    if stored != size - _FRAME:
        raise DeletionVectorError(f"{where} has length {stored}, its manifest entry gives {size - _FRAME}", file=f.path)
    body = blob[4:-4]
    if zlib.crc32(body) != int.from_bytes(blob[-4:], "big"):
        raise DeletionVectorError(f"{where} fails its CRC-32 check", file=f.path)
    try:
        bitmap = decode_bitmap(body)
    except DeletionVectorError as e:
        raise e.at(file=f.path) from None
    if len(bitmap) != f.record_count:
        raise DeletionVectorError(
            f"{where} holds {len(bitmap)} rows, its manifest entry's record_count says {f.record_count}", file=f.path
        )
    return bitmap


def vector_positions(bitmap: BitMap64) -> pa.Array:
    """The positions of ``bitmap`` as an Arrow ``uint64`` array (no copy through Python integers)."""
    values = bitmap.to_array()
    return pa.Array.from_buffers(pa.uint64(), len(values), [None, pa.py_buffer(values)])
