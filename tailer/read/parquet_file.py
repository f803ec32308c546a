"""Opening a Parquet data or cdc file through the storage seam, with the writer's stored Arrow schema set aside.

What this buys (measured by ``python -m benchmarks.changes``, see
``benchmarks/README.md``):

- Small files (at most :attr:`ParquetOpening.whole_file_bytes`) are read into
  memory in one request instead of one per column chunk.
- The Arrow schema a writer stored in the footer (``ARROW:schema``) is set
  aside, so columns take the types their Parquet logical types give. delta-rs
  stores its strings as ``string_view``, whose cast to ``string`` was ~8% of
  reading large cdc files. pyarrow cannot be told to ignore the stored schema,
  so its key is renamed in the bytes read (never in the file), to a key of the
  same length so that the footer's layout is unchanged, and only where the
  footer holds the key exactly once and the renamed footer reads back with the
  renamed key; otherwise the file is read as written.
- Large cdc files read ``_change_type`` as a dictionary (its pages are
  dictionary-encoded): decoding the indices skips building a string per row.
- Local files' column chunks are read page by page through a small buffer
  (:attr:`ParquetOpening.stream_bytes`) instead of whole: a row group's column
  chunks are no longer held while it decodes (``benchmarks.giant_commit``).
"""

from __future__ import annotations

from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from deltatail.state.errors import DeltaTailError, InvalidLogError
from deltatail.state.feed import CHANGE_TYPE_COLUMN
from deltatail.tailer.storage import Storage


@dataclass(frozen=True, slots=True)
class ParquetOpening:
    """How files are opened (the defaults are what the benchmarks chose; tests vary them).

    Attributes:
        dictionary_min_bytes: change data files at least this large read ``_change_type`` as a
            dictionary. A dictionary read and its cast cost ~45 µs more per file and save ~14 ns
            per row, so small files (thousands of rows at most) skip it.
        whole_file_bytes: files up to this size are read into memory whole, in one request
            (instead of one per column chunk).
        footer_read_bytes: how much of a larger file's end is read at once to find its footer
            (a larger footer takes a second read).
        pre_buffer: let Arrow coalesce the column chunks it reads into few large reads (for object
            stores, where each read is a request: 7 instead of 13 on a file of six row groups);
            locally it only adds work.
        stream_bytes: without ``pre_buffer``, read a column chunk's pages through a buffer of this
            many bytes instead of reading the chunk whole (0: whole). A row group's column chunks
            are the file's largest reads (13 MiB for a row group of 1,000,000 rows of three columns,
            held while its batches are decoded); streamed, a read holds a buffer per column, at
            the same speed locally.
    """

    dictionary_min_bytes: int = 256 << 10
    whole_file_bytes: int = 256 << 10
    footer_read_bytes: int = 64 << 10
    pre_buffer: bool = False
    stream_bytes: int = 64 << 10


DEFAULT_OPENING = ParquetOpening()
#: How files on object stores are opened.
REMOTE_OPENING = ParquetOpening(pre_buffer=True, stream_bytes=0)
#: How a file read whole into memory is opened: its column chunks are slices of that memory, not copies.
_IN_MEMORY = ParquetOpening(stream_bytes=0)

_MAGIC = b"PAR1"
#: The stored Arrow schema's key as the footer holds it: Thrift's compact protocol writes a string as its
#: length (12, one byte) and its bytes. Renamed to a key of the same length, the footer's layout is unchanged.
_ARROW_SCHEMA_KEY = b"\x0cARROW:schema"
_SET_ASIDE_KEY = b"\x0cARROW:schem_"


@dataclass(frozen=True, slots=True)
class OpenFile:
    """An open Parquet file (close ``parquet``, then ``source``) and how its Arrow schema came about.

    ``derived``: the Arrow schema follows from the Parquet schema and the read options alone (no
    stored Arrow schema is in effect). ``dictionary``: ``_change_type`` is read as a dictionary.
    """

    source: pa.NativeFile
    parquet: pq.ParquetFile
    derived: bool
    dictionary: bool


def open_parquet(
    storage: Storage,
    location: str,
    *,
    size: int | None = None,
    change_types: bool = False,
    opening: ParquetOpening = DEFAULT_OPENING,
) -> OpenFile:
    """Open a Parquet file through ``storage``; the caller closes ``parquet``, then ``source``.

    A file of at most ``opening.whole_file_bytes`` is read whole, in one request;
    a larger one by its footer, then only the column chunks read. The file is read
    without pre-buffering, INT96 timestamps at microsecond precision (Delta's),
    and the writer's stored Arrow schema is set aside as the module docstring
    says. With ``change_types`` (a change data file) of at least
    ``opening.dictionary_min_bytes``, ``_change_type`` is read as a dictionary
    array (``OpenFile.dictionary``).

    Args:
        storage: where the file is.
        location: its path or URI.
        size: its size in bytes, if the log says (saves a request on an object store).
        change_types: the file is a change data file.
        opening: the thresholds above.

    Raises:
        MissingFileError: if the file does not exist.
        InvalidLogError: if ``change_types`` and the file has no ``_change_type`` column.
        DeltaTailError: if the file is not readable Parquet.
    """
    try:
        file = storage.open_input(location, size)
    except (pa.ArrowException, OSError) as e:
        raise DeltaTailError(f"cannot read Parquet data: {e}", file=location) from e
    source: pa.NativeFile = file
    try:
        size = file.size()
        dictionaries = [CHANGE_TYPE_COLUMN] if change_types and size >= opening.dictionary_min_bytes else None
        if size <= opening.whole_file_bytes:
            data = bytearray(size)
            file.readinto(data)
            file.close()
            source = pa.BufferReader(pa.py_buffer(data))
            parquet, derived = _open_whole(source, data, dictionaries)
        else:
            metadata, derived = _footer_without_arrow_schema(file, size, opening.footer_read_bytes)
            parquet = _parquet_file(source, metadata, dictionaries, opening)
        return OpenFile(source, parquet, derived, dictionaries is not None)
    except KeyError:  # pyarrow: a dictionary column the file does not have
        source.close()
        raise InvalidLogError(f"change data file has no {CHANGE_TYPE_COLUMN} column", file=location) from None
    except (pa.ArrowException, OSError) as e:
        source.close()
        raise DeltaTailError(f"cannot read Parquet data: {e}", file=location) from e


def _parquet_file(
    source: pa.NativeFile, metadata: pq.FileMetaData | None, dictionaries: list[str] | None, opening: ParquetOpening
) -> pq.ParquetFile:
    return pq.ParquetFile(
        source,
        metadata=metadata,
        pre_buffer=opening.pre_buffer,
        buffer_size=0 if opening.pre_buffer else opening.stream_bytes,
        coerce_int96_timestamp_unit="us",
        read_dictionary=dictionaries,
    )


def _footer_length(tail: bytes | bytearray, size: int) -> int | None:
    """The footer's length from a file's last bytes (``tail``), or ``None`` where they do not end a Parquet file."""
    if len(tail) < 8 or tail[-4:] != _MAGIC:
        return None
    length = int.from_bytes(tail[-8:-4], "little")
    return length if length + 12 <= size else None


def _key_once(data: bytes | bytearray, begin: int, end: int) -> int | None:
    """Where the stored Arrow schema's key is in ``data[begin:end]``.

    Its offset if it is there exactly once, -1 if it is not there, ``None`` if it is there more than once.
    """
    at = data.find(_ARROW_SCHEMA_KEY, begin, end)
    if at >= 0 and data.find(_ARROW_SCHEMA_KEY, at + 1, end) >= 0:
        return None
    return at


def _sets_aside(metadata: pq.FileMetaData) -> bool:
    """Whether ``metadata`` (read from a renamed footer) holds the renamed key, i.e. the rename hit the key."""
    keys = metadata.metadata
    return keys is not None and _SET_ASIDE_KEY[1:] in keys


def _open_whole(source: pa.NativeFile, data: bytearray, dictionaries: list[str] | None) -> tuple[pq.ParquetFile, bool]:
    """Open a file read whole into ``data`` (which ``source`` reads), setting its Arrow schema aside in place.

    In memory there is nothing to pre-buffer.

    Returns the file and whether its Arrow schema is derived (no stored one in effect).
    """
    length = _footer_length(data, len(data))
    if length is not None:
        at = _key_once(data, len(data) - 8 - length, len(data) - 8)
        if at == -1:
            return _parquet_file(source, None, dictionaries, _IN_MEMORY), True
        if at is not None:
            key = slice(at, at + len(_SET_ASIDE_KEY))
            data[key] = _SET_ASIDE_KEY
            try:
                parquet = _parquet_file(source, None, dictionaries, _IN_MEMORY)
            except (pa.ArrowException, OSError, KeyError):
                parquet = None  # read as written below, for the genuine error
            if parquet is not None and _sets_aside(parquet.metadata):
                return parquet, True
            if parquet is not None:
                parquet.close()
            data[key] = _ARROW_SCHEMA_KEY  # the bytes renamed were not the key: read the file as written
    return _parquet_file(source, None, dictionaries, _IN_MEMORY), False


def _footer_without_arrow_schema(
    file: pa.NativeFile, size: int, read_bytes: int
) -> tuple[pq.FileMetaData | None, bool]:
    """A large file's footer with its Arrow schema set aside (``None``: read the footer as written).

    Returns the footer and whether the file's Arrow schema is then derived (no stored one in effect).
    """
    tail = file.read_at(min(size, read_bytes), max(size - read_bytes, 0))
    length = _footer_length(tail, size)
    if length is None:
        return None, False
    footer = tail[-8 - length : -8] if length + 8 <= len(tail) else file.read_at(length, size - 8 - length)
    at = _key_once(footer, 0, len(footer))
    if at is None or at == -1:
        return None, at == -1
    renamed = footer[:at] + _SET_ASIDE_KEY + footer[at + len(_SET_ASIDE_KEY) :]
    try:
        metadata = pq.read_metadata(pa.BufferReader(renamed + tail[-8:]))
    except (pa.ArrowException, OSError):
        return None, False  # read as written, for the genuine error
    return (metadata, True) if _sets_aside(metadata) else (None, False)
