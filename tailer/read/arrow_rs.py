"""Large local Parquet files decoded by arrow-rs (through ``arro3-io``) where it gives pyarrow's batches.

What it buys (``benchmarks.giant_commit``; ``docs/experiments.md``): arrow-rs's Parquet decoder
spends about half of pyarrow's CPU on the same files (1.0 against 1.8 CPU-seconds for the 40,000,000
rows of the giant rewrite, one thread each), and decodes a row group on the reading thread without
pyarrow's column threads, so a file being read holds less at once.

Used only where the batches are pyarrow's by construction, column for column:

- the file is on this machine's file system (``arro3-io`` opens it by path; the pyarrow file opened
  first has already read its footer, so a file that is not Parquet never gets here);
- the read takes every top-level column of the file, in the file's order (``arro3-io`` cannot select
  columns);
- every column's type is the type pyarrow gives it, or one that differs only in layout, which is cast
  to pyarrow's: ``string_view`` and ``large_string`` to ``string`` (and the binary ones alike; a stored
  Arrow schema asks arrow-rs for those, while pyarrow reads the file's logical types, see
  :mod:`~tailer.read.parquet_file`), a dictionary to its values, and a UTC timestamp named
  ``+00:00`` to ``UTC``.

Anything else (a column left out, an INT96 timestamp, a nested type arrow-rs names differently) is
read by pyarrow, as before. Rows come out in file order, all of them, so a deletion vector's row
indexes ("the position (index) of a row in a parquet file starting from zero", the protocol's
Deletion Vectors) apply to them as to pyarrow's.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
from arro3.io import read_parquet

#: Time zones that name UTC: arrow-rs names a UTC-adjusted Parquet timestamp ``+00:00``, pyarrow ``UTC``.
_UTC_NAMES = frozenset({"UTC", "+00:00", "Z"})


def arrow_rs_batches(path: str, want: pa.Schema, batch_size: int) -> Iterator[pa.RecordBatch] | None:
    """The file's batches of at most ``batch_size`` rows, decoded by arrow-rs, with schema ``want``.

    ``want`` is the schema pyarrow gives the file's columns (all of them, in order). ``None`` when
    arrow-rs would not give those columns (see the module docstring), or cannot open the file (it
    panics on a footer it rejects, after printing so to stderr; the caller has read the footer with
    pyarrow first): the caller reads it with pyarrow, which reports what is wrong with it.

    The returned iterator raises what the decoder raises (``pyarrow.ArrowException`` or ``OSError``)
    for a file damaged past its footer; closing it closes the file.
    """
    try:
        reader = pa.RecordBatchReader.from_stream(read_parquet(path, batch_size=batch_size))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException:  # arro3-io panics (pyo3's PanicException, not an Exception) on a footer it rejects
        return None
    same = _same_layout(reader.schema, want)
    if same is None:
        reader.close()
        return None
    return _batches(reader, want, cast=not same)


def _same_layout(got: pa.Schema, want: pa.Schema) -> bool | None:
    """``True`` if ``got`` is ``want``; ``False`` if a cast gives ``want`` (types, fields' metadata); else ``None``."""
    if got.names != want.names:
        return None
    if got.equals(want, check_metadata=True):
        return True
    for have, need in zip(got, want, strict=True):
        if have.nullable != need.nullable or not _castable(have.type, need.type):
            return None
    return False


def _castable(have: pa.DataType, need: pa.DataType) -> bool:
    """Whether ``have`` holds ``need``'s values in another layout (see the module docstring)."""
    if have == need:
        return True
    if pa.types.is_dictionary(have):
        return _castable(have.value_type, need)
    if need == pa.string():
        return have in (pa.string_view(), pa.large_string())
    if need == pa.binary():
        return have in (pa.binary_view(), pa.large_binary())
    if pa.types.is_timestamp(have) and pa.types.is_timestamp(need):
        return have.unit == need.unit and have.tz in _UTC_NAMES and need.tz in _UTC_NAMES
    return False


def _batches(reader: pa.RecordBatchReader, want: pa.Schema, *, cast: bool) -> Iterator[pa.RecordBatch]:
    try:
        for batch in reader:
            yield batch.cast(want) if cast else batch
    finally:
        reader.close()
