"""The embedded sinks: JSON lines (stdout or a file) and a directory of Parquet files.

``jsonl:-``
    JSON lines on stdout. It cannot read back what it wrote, so delivery is
    at-least-once across crashes (the tailer's cursor bounds the repeats).
``jsonl:PATH``
    JSON lines appended to ``PATH``; ``flush`` fsyncs. Each line carries its
    position as ``"_position": [version, index, snapshot]``. On ``open`` the
    sink drops a torn last line (a crash mid-write; it was never flushed, so
    never acknowledged) and reports the position after the last complete line,
    so a restart repeats nothing. Which table the rows belong to is recorded
    beside the file, in ``.<name>.deltatail.json`` (written atomically when the
    sink is opened for a new table; the rows themselves are unchanged).
``parquet:DIR``
    One Parquet file per flush, named by the positions it holds
    (``<first>_<end>.parquet``, positions as ``v<version>-<s|c><index>``),
    written to a temporary name, fsynced and renamed. On ``open`` leftover
    temporary files are removed and the sink reports the largest end position,
    so a restart leaves no duplicates and no half files. Each file records its
    table in its Parquet key-value metadata (``deltatail.table_id``,
    ``deltatail.table``).

Holdings are per table: a sink whose rows belong to another table id is refused
(:class:`SinkError` naming both tables and the file) instead of reporting their
positions, which would make the tailer skip that many rows of its own table. A
file or directory written by a deltatail without these records holds rows of no
known table: the first table to open it adopts it, with a warning.

Rows are written with the table's columns and the three change columns; JSON
values follow :func:`sinks.json_text.json_values` (decimals as strings,
timestamps as ISO-8601 UTC, binary as base64).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from pathlib import Path
from typing import BinaryIO

import orjson
import pyarrow as pa
import pyarrow.parquet as pq

from deltatail.sinks.json_text import (
    ENCODE_ROWS,
    VECTOR_ROWS,
    column_texts,
    concatenated,
    counting_texts,
    joined_objects,
    json_values,
    text_scalar,
)
from deltatail.state.cursor import Position
from deltatail.state.errors import SinkError
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.tailer.runtime.files import atomic_write
from deltatail.tailer.sink import Sink

log = logging.getLogger("deltatail")

_POSITION = "_position"
#: Parquet key-value metadata (and marker file keys) naming the table the rows belong to.
TABLE_ID_KEY = "deltatail.table_id"
TABLE_KEY = "deltatail.table"


def _not_ours(sink_file: str, table: TableInfo, other_id: str, other_table: str) -> SinkError:
    return SinkError(
        f"{sink_file} holds rows of table {other_table} (id {other_id}), not of {table.path} (id {table.table_id}); "
        "its positions are not this table's, so it cannot be resumed: give each table its own sink",
        table=table.path,
        file=sink_file,
    )


def _adopting(sink_file: str, table: TableInfo) -> None:
    log.warning(
        "%s holds rows but does not record their table (written by an older deltatail); "
        "assuming they are rows of %s (id %s)",
        sink_file,
        table.path,
        table.table_id,
    )


def encode_jsonl(batch: ChangeBatch) -> bytes:
    """The batch as JSON lines, each with its ``_position``.

    Long batches are encoded column by column (:func:`sinks.json_text.column_texts`);
    the bytes are the same either way.
    """
    names = batch.rows.schema.names
    if len(batch) >= VECTOR_ROWS and _POSITION not in names:
        texts = column_texts(batch.rows)
        if texts is not None:
            start = batch.start
            index = counting_texts(start.index, batch.end.index)
            snapshot = "true" if start.snapshot else "false"
            tail = [text_scalar(f',"{_POSITION}":[{start.version},'), index, text_scalar(f",{snapshot}]}}\n")]
            return concatenated(joined_objects(len(batch), list(texts), list(texts.values()), tail))
    columns = [json_values(batch.rows.column(i)) for i in range(len(names))]
    start = batch.start
    out = bytearray()
    for i, values in enumerate(zip(*columns, strict=True)):
        row = dict(zip(names, values, strict=True))
        row[_POSITION] = [start.version, start.index + i, start.snapshot]
        out += orjson.dumps(row)
        out += b"\n"
    return bytes(out)


class JsonLinesSink(Sink):
    """JSON lines to stdout (``path=None``) or appended to a file."""

    def __init__(self, path: str | None) -> None:
        self.path = path
        self._fh: BinaryIO | None = None

    @property
    def location(self) -> str | None:
        """The file (``None`` for stdout)."""
        return self.path

    @property
    def reports_holdings(self) -> bool:
        """A file tells what it holds; stdout cannot."""
        return self.path is not None

    @property
    def marker(self) -> Path | None:
        """The file recording which table the rows belong to (``.<name>.deltatail.json`` beside the output)."""
        if self.path is None:
            return None
        out = Path(self.path)
        return out.with_name(f".{out.name}.deltatail.json")

    def open(self, table: TableInfo) -> Position | None:
        """Open the output; for a file, repair a torn tail and report the position after its last line.

        Raises:
            SinkError: if the file cannot be opened, its last line is not a deltatail row, or it
                holds rows of another table (recorded beside it, see the module docstring).
        """
        if self.path is None:
            self._fh = sys.stdout.buffer
            return None
        try:
            fh = open(self.path, "a+b")  # noqa: SIM115 - held open until close()
        except OSError as e:
            raise SinkError(f"cannot open JSON lines output: {e}", table=table.path, file=self.path) from e
        try:
            resume = _repair_tail(fh, self.path)
            self._claim(table, holds_rows=resume is not None)
        except OSError as e:
            fh.close()
            raise SinkError(f"cannot open JSON lines output: {e}", table=table.path, file=self.path) from e
        except BaseException:
            fh.close()
            raise
        self._fh = fh
        return resume

    def _claim(self, table: TableInfo, *, holds_rows: bool) -> None:
        """Check that the rows held are ``table``'s; record ``table`` as the file's table if it is new to it."""
        marker, path = self.marker, self.path
        if marker is None or path is None:
            return
        recorded: dict[str, str] | None = None
        if marker.exists():
            try:
                raw = orjson.loads(marker.read_bytes())
                recorded = {"id": str(raw[TABLE_ID_KEY]), "table": str(raw[TABLE_KEY])}
            except (orjson.JSONDecodeError, KeyError, TypeError) as e:
                raise SinkError(
                    f"cannot read which table {path} holds rows of ({e})", table=table.path, file=str(marker)
                ) from e
        if holds_rows and recorded is not None and recorded["id"] != table.table_id:
            raise _not_ours(path, table, recorded["id"], recorded["table"])
        if holds_rows and recorded is None:
            _adopting(path, table)
        if recorded is None or recorded["id"] != table.table_id:  # new, or empty and now this table's
            atomic_write(marker, orjson.dumps({TABLE_ID_KEY: table.table_id, TABLE_KEY: table.path}))

    def write(self, batch: ChangeBatch) -> None:
        """Append the batch's lines (buffered until :meth:`flush`), encoded :data:`ENCODE_ROWS` rows at a time.

        Raises:
            SinkError: if the sink is not open, or the output refuses the bytes (disk full, file too large).
        """
        if self._fh is None:
            raise SinkError("sink is not open", file=self.path)
        if len(batch):
            try:
                for part in batch.slices(ENCODE_ROWS):
                    self._fh.write(encode_jsonl(part))
            except OSError as e:
                raise SinkError(f"cannot write JSON lines output: {e}", file=self.path or "-") from e

    def flush(self) -> None:
        """Flush, and for a file fsync, so every written line is durable.

        Raises:
            SinkError: if the output cannot be flushed.
        """
        if self._fh is None:
            return
        try:
            self._fh.flush()
            if self.path is not None:
                os.fsync(self._fh.fileno())
        except OSError as e:
            raise SinkError(f"cannot flush JSON lines output: {e}", file=self.path) from e

    def close(self) -> None:
        """Close the file (stdout is left open).

        Raises:
            SinkError: if lines still buffered cannot be written (disk full...); the file is closed.
        """
        fh, self._fh = self._fh, None
        if fh is not None and self.path is not None:
            try:
                fh.close()
            except OSError as e:
                raise SinkError(f"cannot write JSON lines output: {e.strerror or e}", file=self.path) from None


def _repair_tail(fh: BinaryIO, path: str) -> Position | None:
    """Truncate a torn last line; return the position after the last complete line."""
    size = fh.seek(0, os.SEEK_END)
    if size == 0:
        return None
    chunk = min(size, 1 << 20)
    fh.seek(size - chunk)
    tail = fh.read(chunk)
    end = tail.rfind(b"\n")
    if end != len(tail) - 1:
        fh.truncate(size - chunk + end + 1)  # the torn line was never flushed, so never acknowledged
        fh.seek(0, os.SEEK_END)
    if end < 0:
        return None
    start = tail.rfind(b"\n", 0, end) + 1
    try:
        version, index, snap = orjson.loads(tail[start:end])[_POSITION]
        last = Position(version, 0 if snap else 1, index)
    except (orjson.JSONDecodeError, KeyError, TypeError, ValueError) as e:
        raise SinkError(f"the last line is not a deltatail change row ({e})", file=path) from e
    return Position(last.version, last.snapshot_rank, last.index + 1)


_NAME = re.compile(r"^v(\d{20})-([sc])(\d{12})_v(\d{20})-([sc])(\d{12})\.parquet$")


def _pos_name(p: Position) -> str:
    return f"v{p.version:020d}-{'s' if p.snapshot else 'c'}{p.index:012d}"


#: Rows a Parquet output file's row groups hold (at most): rows arriving in smaller batches are
#: gathered up to this before they are encoded, larger runs are encoded as they come.
ROW_GROUP_ROWS = 65_536

#: The largest dictionary page a column chunk builds before its values are written plainly (pyarrow's
#: ``dictionary_pagesize_limit``; its default is 1 MiB). Parquet keeps one dictionary per column chunk
#: and lets a writer fall back to plain encoding when it grows (parquet-format, Encodings.md,
#: "Dictionary Encoding": "If the dictionary grows too big, whether in size or number of distinct
#: values, the encoding will fall back to the plain encoding"). With the default, a row group of
#: 65,536 distinct keys (8-byte ids, short names, floats) hardly outgrows it: such columns are
#: dictionary-encoded almost in full, 3.4 times the CPU of plain pages for a larger file (2,000,000
#: change rows of ``id, name, value``: 1.42 s and 35 MiB against 0.42 s and 25 MiB). At 64 KiB a
#: high-cardinality column falls back after its first few thousand values, while a low-cardinality one
#: (``_change_type``, ``_commit_version``, an enum-like string) keeps its dictionary.
DICTIONARY_PAGE_BYTES = 64 * 1024


class _OpenFile:
    """A Parquet output file being written under its temporary name: its writer and its positions."""

    def __init__(self, directory: Path, first: ChangeBatch, metadata: dict[bytes, bytes]) -> None:
        self.start, self.end = first.start, first.end
        self.schema = first.rows.schema
        self.tmp = directory / f".{_pos_name(first.start)}.tmp"
        with_table = self.schema.with_metadata({**(self.schema.metadata or {}), **metadata})
        self.writer = pq.ParquetWriter(self.tmp, with_table, dictionary_pagesize_limit=DICTIONARY_PAGE_BYTES)
        self.held: list[pa.RecordBatch] = []
        self.held_rows = 0

    def add(self, batch: ChangeBatch) -> None:
        """Take ``batch`` (same schema); encode a row group once :data:`ROW_GROUP_ROWS` rows are held."""
        self.held.append(batch.rows)
        self.held_rows += len(batch)
        self.end = batch.end
        if self.held_rows >= ROW_GROUP_ROWS:
            self.encode()

    def encode(self) -> None:
        """Write the rows held as row groups of at most :data:`ROW_GROUP_ROWS` rows."""
        if self.held:
            self.writer.write_table(pa.Table.from_batches(self.held, self.schema), row_group_size=ROW_GROUP_ROWS)
            self.held, self.held_rows = [], 0

    def finish(self) -> Path:
        """Encode what is held, close and fsync the file; its final name."""
        self.encode()
        self.writer.close()
        with open(self.tmp, "rb") as fh:
            os.fsync(fh.fileno())
        return self.tmp.with_name(f"{_pos_name(self.start)}_{_pos_name(self.end)}.parquet")

    def discard(self) -> None:
        """Close and remove the temporary file (its rows were never acknowledged)."""
        try:
            self.writer.close()
        finally:
            self.tmp.unlink(missing_ok=True)


class ParquetDirSink(Sink):
    """One Parquet file per flush in a directory, named by position, written atomically.

    Rows are encoded into the file as they arrive (row groups of at most :data:`ROW_GROUP_ROWS`
    rows), under a temporary name that :meth:`flush` renames: what the sink holds in memory is a
    row group, however many rows a flush covers. A change of schema between batches starts a new
    file (the rows after it carry the new columns).
    """

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self._open: _OpenFile | None = None
        self._done: list[tuple[Path, Path]] = []  # finished files of this flush: temporary and final name
        self._metadata: dict[bytes, bytes] = {}

    @property
    def location(self) -> str:
        """The directory."""
        return str(self.dir)

    @property
    def reports_holdings(self) -> bool:
        """A directory tells what it holds (its files' names)."""
        return True

    def open(self, table: TableInfo) -> Position | None:
        """Create the directory, remove temporary leftovers, report the largest end position held.

        The newest file (the one the position comes from) must be ``table``'s (its key-value
        metadata, see the module docstring).

        Raises:
            SinkError: if the directory cannot be created or read, or its newest file holds rows
                of another table or cannot be read.
        """
        self._metadata = {TABLE_ID_KEY.encode(): table.table_id.encode(), TABLE_KEY.encode(): table.path.encode()}
        newest: Path | None = None
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            resume: Position | None = None
            for entry in self.dir.iterdir():
                if entry.name.startswith(".") and entry.name.endswith(".tmp"):
                    entry.unlink()
                    continue
                m = _NAME.match(entry.name)
                if m:
                    end = Position(int(m.group(4)), 0 if m.group(5) == "s" else 1, int(m.group(6)))
                    if resume is None or end > resume:
                        resume, newest = end, entry
        except OSError as e:
            raise SinkError(f"cannot use Parquet output directory: {e}", table=table.path, file=str(self.dir)) from e
        if newest is not None:
            self._check_owner(newest, table)
        return resume

    def _check_owner(self, newest: Path, table: TableInfo) -> None:
        try:
            recorded = pq.read_metadata(newest).metadata or {}
        except (OSError, pa.ArrowException) as e:
            raise SinkError(
                f"cannot read the newest Parquet output file ({e})", table=table.path, file=str(newest)
            ) from e
        other = recorded.get(TABLE_ID_KEY.encode())
        if other is None:
            _adopting(str(newest), table)
        elif other.decode(errors="replace") != table.table_id:
            where = recorded.get(TABLE_KEY.encode(), b"?").decode(errors="replace")
            raise _not_ours(str(newest), table, other.decode(errors="replace"), where)

    def write(self, batch: ChangeBatch) -> None:
        """Encode the batch into the file being written (a new one when the schema changed).

        Raises:
            SinkError: if the file cannot be written.
        """
        if not len(batch):
            return
        try:
            if self._open is not None and self._open.schema != batch.rows.schema:
                self._finish_open()
            if self._open is None:
                self._open = _OpenFile(self.dir, batch, self._metadata)
            self._open.add(batch)
        except (OSError, pa.ArrowException) as e:
            raise SinkError(f"cannot write Parquet output: {e}", file=str(self.dir)) from e

    def _finish_open(self) -> None:
        if self._open is not None:
            done = self._open
            self._open = None
            self._done.append((done.tmp, done.finish()))

    def flush(self) -> None:
        """Finish the files written since the last flush and rename them to their names, in position order.

        Raises:
            SinkError: if a file cannot be written.
        """
        try:
            self._finish_open()
            if not self._done:
                return
            while self._done:
                tmp, name = self._done[0]
                os.replace(tmp, name)
                self._done.pop(0)
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except (OSError, pa.ArrowException) as e:
            raise SinkError(f"cannot write Parquet output: {e}", file=str(self.dir)) from e

    def close(self) -> None:
        """Drop anything not flushed (it was never acknowledged): the temporary files are removed."""
        if self._open is not None:
            self._open.discard()
            self._open = None
        for tmp, _ in self._done:
            tmp.unlink(missing_ok=True)
        self._done.clear()
