"""tailer.iceberg.vectors: one ``deletion-vector-v1`` blob read by its manifest entry, every refusal of its Raises.

The blobs are built here from the Puffin spec (:func:`iceberg_dv.dv_blob`); the expected positions are
the ones the test put in.
"""

from __future__ import annotations

import zlib
from pathlib import Path

import pytest
from iceberg_dv import DV_MAGIC, dv_blob

from deltatail.state.errors import DeletionVectorError, InvalidLogError, MissingFileError
from deltatail.state.iceberg.model import POSITION_DELETES, ContentFile
from deltatail.tailer.iceberg.vectors import MAX_VECTOR_BYTES, check_vector_entry, read_vector, vector_positions
from deltatail.tailer.storage import LocalStorage


def entry(path: Path, offset: int | None, size: int | None, cardinality: int, file_size: int) -> ContentFile:
    return ContentFile(
        str(path), POSITION_DELETES, 0, (), cardinality, file_size, 1, "PUFFIN", (), "d.parquet", offset, size
    )


def placed(tmp_path: Path, blob: bytes, *, tail: bytes = b"footer") -> tuple[Path, int]:
    """A file holding ``blob`` after 4 bytes of magic (where Puffin's first blob starts); and its offset."""
    path = tmp_path / "v.puffin"
    path.write_bytes(b"PFA1" + blob + tail)
    return path, 4


def test_a_blob_is_read_at_its_offset_and_gives_its_positions(tmp_path: Path) -> None:
    blob = dv_blob([0, 7, 70_000, 2**32 + 5])
    path, offset = placed(tmp_path, blob)
    f = entry(path, offset, len(blob), 4, path.stat().st_size)
    assert check_vector_entry(f) == (offset, len(blob))
    bitmap = read_vector(LocalStorage(), str(path), f)
    assert vector_positions(bitmap).to_pylist() == [0, 7, 70_000, 2**32 + 5]


def test_entries_that_cannot_be_read_are_refused_before_reading(tmp_path: Path) -> None:
    gone = tmp_path / "gone.puffin"
    with pytest.raises(InvalidLogError, match="needs referenced_data_file, content_offset") as e:
        read_vector(LocalStorage(), str(gone), entry(gone, None, 20, 1, 100))
    assert e.value.file == str(gone)
    with pytest.raises(DeletionVectorError, match="over the bound"):
        read_vector(LocalStorage(), str(gone), entry(gone, 4, MAX_VECTOR_BYTES + 1, 1, MAX_VECTOR_BYTES * 2))
    with pytest.raises(InvalidLogError, match="does not fit its 30-byte Puffin file"):
        read_vector(LocalStorage(), str(gone), entry(gone, 4, 40, 1, 30))
    with pytest.raises(InvalidLogError, match="does not fit"):  # smaller than its own frame
        read_vector(LocalStorage(), str(gone), entry(gone, 4, 8, 1, 30))
    with pytest.raises(MissingFileError):
        read_vector(LocalStorage(), str(gone), entry(gone, 4, 20, 1, 30))


def test_damaged_blobs_are_refused(tmp_path: Path) -> None:
    blob = dv_blob([1, 2])
    # the file is shorter than the manifest entry says
    path, offset = placed(tmp_path, blob[:-6], tail=b"")
    with pytest.raises(DeletionVectorError, match="truncated"):
        read_vector(LocalStorage(), str(path), entry(path, offset, len(blob), 2, len(blob) + 4))
    # the length field disagrees with the entry's size
    path, offset = placed(tmp_path, (999).to_bytes(4, "big") + blob[4:])
    with pytest.raises(DeletionVectorError, match="has length 999"):
        read_vector(LocalStorage(), str(path), entry(path, offset, len(blob), 2, path.stat().st_size))
    # magic and CRC right, the bitmap not a bitmap
    body = DV_MAGIC + b"\xff" * 12
    junk = len(body).to_bytes(4, "big") + body + zlib.crc32(body).to_bytes(4, "big")
    path, offset = placed(tmp_path, junk)
    with pytest.raises(DeletionVectorError, match="does not deserialize") as e:
        read_vector(LocalStorage(), str(path), entry(path, offset, len(junk), 2, path.stat().st_size))
    assert e.value.file == str(path)
