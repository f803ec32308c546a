"""The storage seam: the only way deltatail touches a table's bytes.

Every byte of a table goes through a :class:`Storage`: commits, checkpoints
(classic, multi-part, V2 with sidecars), compaction files, Parquet data and
cdc files, deletion-vector files. Seven operations are enough for a Delta reader:

- list a directory in name order starting after a given name (object stores
  list that way; ``start_after`` means a tailer never lists the whole
  ``_delta_log``),
- read a file, whole or a byte range,
- open a file for random access, as an Arrow file that ``pyarrow.parquet``
  reads (footer first, then only the column chunks it needs),
- hint that whole files will be read soon (a remote store fetches them ahead),
- stat a file (size, modification time), or stat one about to be read (a
  store that pays a request either way keeps its bytes),
- and tell whether a file exists.

Two attributes say what the store is: :attr:`Storage.remote` (requests cross a
network: read ahead, poll instead of watching) and :attr:`Storage.local_files`
(its paths are this machine's files, which a helper process may open itself).

Paths are absolute local paths or URIs. Another implementation of this
protocol is all an object store needs.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

import pyarrow as pa


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One listed file: its name within the directory, size in bytes, mtime in epoch ms."""

    name: str
    size: int
    modification_time: int


class Storage(Protocol):
    """What deltatail needs from a file system or object store.

    Attributes:
        remote: every request crosses a network: readers coalesce ranged reads and fetch files
            concurrently ahead of their turn, and the log cannot be watched, only polled.
        local_files: every path is a file of this machine's file system, read as it is on disk,
            so another process may open it by path (the audit reads a long range of commits in a
            helper process). ``False`` for a store whose reads are not the disk's own (an object
            store, or a wrapper that observes or changes what is read).
    """

    remote: bool
    local_files: bool

    def list_from(self, directory: str, start_after: str | None = None) -> list[FileInfo]:
        """Files (not directories) directly in ``directory`` whose names sort after ``start_after``, in name order.

        Raises:
            MissingFileError: if the directory does not exist.
        """
        ...

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """The bytes of ``path`` from ``offset`` (``length`` bytes, or to the end).

        Raises:
            MissingFileError: if the file does not exist.
        """
        ...

    def open_input(self, path: str, size: int | None = None) -> pa.NativeFile:
        """``path`` opened for random access (``size``: its size if the caller knows it, saving a request).

        The caller closes the file.

        Raises:
            MissingFileError: if the file does not exist.
        """
        ...

    def prefetch(self, files: Sequence[tuple[str, int | None]]) -> None:
        """A hint: these whole ``(path, size)`` files will be read soon (a remote store fetches them ahead).

        Never raises: a file that cannot be fetched ahead is read, and its error raised, when it is read.
        """
        ...

    def stat(self, path: str) -> FileInfo:
        """Size and modification time of ``path``.

        Raises:
            MissingFileError: if the file does not exist.
        """
        ...

    def stat_keeping(self, path: str) -> FileInfo:
        """What :meth:`stat` returns, for a file about to be read.

        A store where reading a small file costs what a stat costs (one request) reads it
        and keeps the bytes for the next :meth:`read` of the whole file.

        Raises:
            MissingFileError: if the file does not exist.
        """
        ...

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        ...
