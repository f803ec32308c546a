"""A commit's rows spilled to disk by key-hash pass, so a commit of many passes is read once.

Net changes and paired update images need every row of a key side by side, and a
large commit is processed in key-hash passes (:func:`~tailer.read.net_changes.net_passes`),
each holding the rows whose key hashes to it. Reading the commit's files again
for every pass would cost ``passes`` times the commit's reading, which grows
with the square of the commit's size. Instead the files are read once: each
batch is split by pass (:meth:`PassSpill.add`), the pieces gathered in memory up
to :func:`buffer_bytes` and then appended to one file per pass (Arrow IPC
streams, LZ4-compressed), and each pass is read back from its file
(:meth:`PassSpill.rows`). Within a pass, rows keep the order they were read in,
so the passes hold exactly the rows, in the order, that filtering each read of
the files by pass gave.

Memory is the buffer (at least :data:`SPILL_BUFFER_BYTES` of decoded rows) and
one pass read back; disk is the commit's decoded rows, compressed, in a
temporary directory (``TMPDIR``, else the system's; :func:`tempfile.mkdtemp`),
removed when the pass reading ends, is closed or fails. The directory's name
carries the process id (``deltatail-spill-<pid>-*``): a process killed mid-commit
leaves its directory behind, and the next spill in that temporary directory
removes it once no process of that id is running (:func:`remove_orphans`).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from types import TracebackType

import numpy as np
import pyarrow as pa

from deltatail.state.errors import DeltaTailError

#: Decoded bytes of rows gathered in memory before they are appended to the passes' files.
SPILL_BUFFER_BYTES = 8 << 20
#: With many passes, at least this many bytes per pass are gathered before an append (fewer, larger writes).
SPILL_BYTES_PER_PASS = 64 << 10
_WRITE_OPTIONS = pa.ipc.IpcWriteOptions(compression="lz4")


_PREFIX = "deltatail-spill-"


def remove_orphans(directory: Path) -> list[Path]:
    """Remove the spill directories in ``directory`` of processes that are no longer running; returns them.

    Only ``deltatail-spill-<pid>-*`` directories whose process id names no running process are removed.
    """
    removed = []
    for entry in directory.glob(f"{_PREFIX}*-*"):
        pid = entry.name[len(_PREFIX) :].partition("-")[0]
        if not pid.isdigit() or int(pid) == os.getpid() or _running(int(pid)) or not entry.is_dir():
            continue
        shutil.rmtree(entry, ignore_errors=True)
        removed.append(entry)
    return removed


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # another user's process: running
        return True
    return True


def buffer_bytes(passes: int) -> int:
    """Bytes gathered before an append: :data:`SPILL_BUFFER_BYTES`, or :data:`SPILL_BYTES_PER_PASS` a pass if more."""
    return max(SPILL_BUFFER_BYTES, passes * SPILL_BYTES_PER_PASS)


class PassSpill:
    """The rows of one commit, split into ``passes`` key-hash passes on disk (see the module docstring).

    Used as a context manager: entering removes orphaned spill directories (:func:`remove_orphans`)
    and makes this one; leaving removes it. Entering raises :class:`DeltaTailError` if the
    directory cannot be made.

    Args:
        schema: the rows' schema (every batch added has it).
        passes: the number of passes (at least 1).
        table: the table, for errors.
        version: the commit's version, for errors.
    """

    def __init__(self, schema: pa.Schema, passes: int, *, table: str, version: int) -> None:
        self.schema = schema
        self.passes = passes
        self.table = table
        self.version = version
        self._dir: Path | None = None
        self._pieces: list[list[pa.RecordBatch]] = [[] for _ in range(passes)]
        self._held = 0
        self._reader: ThreadPoolExecutor | None = None
        self.spilled_bytes = 0  # bytes appended to the passes' files (for tests and benchmarks)

    def __enter__(self) -> PassSpill:
        try:
            remove_orphans(Path(tempfile.gettempdir()))
            self._dir = Path(tempfile.mkdtemp(prefix=f"{_PREFIX}{os.getpid()}-"))
        except OSError as e:
            raise self._error("cannot make a directory to spill to", e) from e
        return self

    def __exit__(
        self, kind: type[BaseException] | None, value: BaseException | None, traceback: TracebackType | None
    ) -> None:
        if self._reader is not None:
            self._reader.shutdown()
            self._reader = None
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
            self._dir = None
        self._pieces = [[] for _ in range(self.passes)]
        self._held = 0

    def add(self, batch: pa.RecordBatch, ids: pa.Array) -> None:
        """Add ``batch``'s rows, row ``i`` to pass ``ids[i]`` (``0 .. passes - 1``), after the rows added before.

        Raises:
            DeltaTailError: if the passes' files cannot be written (the disk is full, say).
        """
        if batch.num_rows == 0:
            return
        passes = np.asarray(ids.to_numpy(zero_copy_only=False), dtype=np.int64)
        order = np.argsort(passes, kind="stable")  # stable: each pass keeps the rows' order
        counts = np.bincount(passes, minlength=self.passes)
        grouped = batch.take(pa.array(order))
        start = 0
        for which in np.flatnonzero(counts):
            n = int(counts[which])
            self._pieces[which].append(grouped.slice(start, n))
            start += n
        self._held += grouped.nbytes
        if self._held >= buffer_bytes(self.passes):
            self._append()

    def rows(self, which: int) -> pa.Table:
        """Every row of pass ``which``, in the order added (the buffer is appended to the files first).

        Each column is one chunk (a pass is reordered by taking rows from it, which is slow across
        many chunks), combined a column at a time, so memory is the pass and one column's copy.
        The pass is read back on a thread of the spill's own (:meth:`_read_back`), not the caller's.

        Raises:
            DeltaTailError: if the passes' files cannot be written or read back.
        """
        self._append()
        if self._reader is None:
            self._reader = ThreadPoolExecutor(1, thread_name_prefix="deltatail-spill")
        return self._reader.submit(self._read_back, which).result()

    def _read_back(self, which: int) -> pa.Table:
        """:meth:`rows`'s reading, on the spill's thread: there the pass's memory is returned when freed.

        With jemalloc (``deltatail run`` and ``serve``, :func:`tailer.cli.process.return_memory_promptly`),
        arenas made after the process started return the pages freed in them at once, while the
        thread that started the process keeps jemalloc's one-second delay. Read back on that
        thread, each pass's pages were still held, freed, while the next pass was read
        (``docs/experiments.md``). A thread made for the spill is given an arena made after the
        setting (while the process has fewer threads than jemalloc has arenas, see that function).
        """
        path = self._path(which)
        batches: list[pa.RecordBatch] = []
        if path.exists():
            try:
                with pa.OSFile(str(path)) as source:
                    while source.tell() < source.size():
                        batches += list(pa.ipc.open_stream(source))
            except (OSError, pa.ArrowException) as e:
                raise self._error(f"cannot read back the spilled rows of pass {which}", e, path) from e
        columns = pa.Table.from_batches(batches, schema=self.schema).columns
        del batches
        for i, column in enumerate(columns):  # a column at a time: the pass and one column's copy in memory
            columns[i] = pa.chunked_array([column.combine_chunks()], column.type)
            del column
        return pa.Table.from_arrays(columns, schema=self.schema)

    def _append(self) -> None:
        try:
            for which, pieces in enumerate(self._pieces):
                if not pieces:
                    continue
                with open(self._path(which), "ab") as f, pa.ipc.new_stream(f, self.schema, options=_WRITE_OPTIONS) as w:
                    w.write_batch(pa.concat_batches(pieces))
                self._pieces[which] = []
            self.spilled_bytes = sum(p.stat().st_size for p in self._require_dir().iterdir())
        except (OSError, pa.ArrowException) as e:
            raise self._error("cannot spill rows to disk", e, self._dir) from e
        self._held = 0

    def _path(self, which: int) -> Path:
        return self._require_dir() / f"pass-{which}.arrows"

    def _require_dir(self) -> Path:
        if self._dir is None:
            raise DeltaTailError("a spill is used outside its with block", table=self.table, version=self.version)
        return self._dir

    def _error(self, what: str, cause: BaseException, where: Path | None = None) -> DeltaTailError:
        return DeltaTailError(
            f"{what}: {cause} (a commit read in {self.passes} key-hash passes spills its rows to TMPDIR; "
            "point TMPDIR at a disk with room for the commit's rows)",
            table=self.table,
            version=self.version,
            file=None if where is None else str(where),
        )
