"""The embedded sinks: JSON lines (stdout or a file) and a directory of Parquet files.

``jsonl:-``
    JSON lines on stdout. It cannot read back what it wrote, so delivery is
    at-least-once across crashes (the tailer's cursor bounds the repeats).
``jsonl:PATH``
    JSON lines appended to ``PATH``; ``flush`` fsyncs. Each line carries its
    position as ``"_position": [version, index, snapshot]``. On ``open`` the
    sink drops a torn last line (a crash mid-write; it was never flushed, so
    never acknowledged) and reports the position after the last complete line,
    so a restart repeats nothing.
``parquet:DIR``
    One Parquet file per flush, named by the positions it holds
    (``<first>_<end>.parquet``, positions as ``v<version>-<s|c><index>``),
    written to a temporary name, fsynced and renamed. On ``open`` leftover
    temporary files are removed and the sink reports the largest end position,
    so a restart leaves no duplicates and no half files.

Rows are written with the table's columns and the three change columns; JSON
values follow :func:`sinks.encoding.json_values` (decimals as strings,
timestamps as ISO-8601 UTC, binary as base64).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import BinaryIO

import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from sinks.json_text import VECTOR_ROWS, column_texts, concatenated, joined_objects, json_values, text_scalar
from state.cursor import Position
from state.errors import SinkError
from state.feed import ChangeBatch, TableInfo
from tailer.follow.sink import Sink

_POSITION = "_position"


def encode_jsonl(batch: ChangeBatch) -> bytes:
    """The batch as JSON lines, each with its ``_position``.

    Long batches are encoded column by column (:func:`sinks.encoding.column_texts`);
    the bytes are the same either way.
    """
    names = batch.rows.schema.names
    if len(batch) >= VECTOR_ROWS and _POSITION not in names:
        texts = column_texts(batch.rows)
        if texts is not None:
            start = batch.start
            index = pc.cast(pa.array(range(start.index, batch.end.index), pa.int64()), pa.string())
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

    def open(self, table: TableInfo) -> Position | None:
        """Open the output; for a file, repair a torn tail and report the position after its last line.

        Raises:
            SinkError: if the file cannot be opened or its last line is not a deltatail row.
        """
        if self.path is None:
            self._fh = sys.stdout.buffer
            return None
        try:
            fh = open(self.path, "a+b")  # noqa: SIM115 - held open until close()
            resume = _repair_tail(fh, self.path)
        except OSError as e:
            raise SinkError(f"cannot open JSON lines output: {e}", table=table.path, file=self.path) from e
        self._fh = fh
        return resume

    def write(self, batch: ChangeBatch) -> None:
        """Append the batch's lines (buffered until :meth:`flush`)."""
        if self._fh is None:
            raise SinkError("sink is not open", file=self.path)
        if len(batch):
            self._fh.write(encode_jsonl(batch))

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


class ParquetDirSink(Sink):
    """One Parquet file per flush in a directory, named by position, written atomically."""

    def __init__(self, directory: str) -> None:
        self.dir = Path(directory)
        self._pending: list[ChangeBatch] = []

    def open(self, table: TableInfo) -> Position | None:
        """Create the directory, remove temporary leftovers, report the largest end position held.

        Raises:
            SinkError: if the directory cannot be created or read.
        """
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
                    resume = end if resume is None else max(resume, end)
        except OSError as e:
            raise SinkError(f"cannot use Parquet output directory: {e}", table=table.path, file=str(self.dir)) from e
        return resume

    def write(self, batch: ChangeBatch) -> None:
        """Hold the batch until :meth:`flush`."""
        if len(batch):
            self._pending.append(batch)

    def flush(self) -> None:
        """Write held batches as Parquet files (one per run of same-schema batches), atomically.

        Raises:
            SinkError: if a file cannot be written.
        """
        while self._pending:
            group = [self._pending.pop(0)]
            while self._pending and self._pending[0].rows.schema == group[0].rows.schema:
                group.append(self._pending.pop(0))
            self._write_file(group)

    def _write_file(self, group: list[ChangeBatch]) -> None:
        name = f"{_pos_name(group[0].start)}_{_pos_name(group[-1].end)}.parquet"
        tmp = self.dir / f".{name}.tmp"
        try:
            pq.write_table(pa.Table.from_batches([b.rows for b in group]), tmp)
            with open(tmp, "rb") as fh:
                os.fsync(fh.fileno())
            os.replace(tmp, self.dir / name)
            fd = os.open(self.dir, os.O_RDONLY)
            try:
                os.fsync(fd)
            finally:
                os.close(fd)
        except OSError as e:
            raise SinkError(f"cannot write Parquet output: {e}", file=str(self.dir / name)) from e

    def close(self) -> None:
        """Drop anything not flushed (it was never acknowledged)."""
        self._pending.clear()
