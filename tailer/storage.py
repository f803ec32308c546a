"""The storage seam: the only way deltatail touches table files.

Four operations are enough for a Delta reader: list a directory in name order
starting after a given name (object stores list that way; ``start_after``
means a tailer never lists the whole ``_delta_log``), read a file (whole or a
byte range), and stat it (size, modification time). :class:`LocalStorage` is
the local-filesystem implementation; object stores would plug in here.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Protocol

from state.errors import MissingFileError


@dataclass(frozen=True, slots=True)
class FileInfo:
    """One listed file: its name within the directory, size in bytes, mtime in epoch ms."""

    name: str
    size: int
    modification_time: int


class Storage(Protocol):
    """What deltatail needs from a file system or object store. Paths are absolute local paths or URIs."""

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

    def stat(self, path: str) -> FileInfo:
        """Size and modification time of ``path``.

        Raises:
            MissingFileError: if the file does not exist.
        """
        ...

    def exists(self, path: str) -> bool:
        """Whether ``path`` exists."""
        ...


def to_local_path(path: str) -> str:
    """Strip a ``file:`` scheme (``file:///x``, ``file:/x``) to a local path; percent-decoding is the caller's."""
    if path.startswith("file://"):
        return path[len("file://") :]
    if path.startswith("file:"):
        return path[len("file:") :]
    return path


class LocalStorage:
    """:class:`Storage` over the local file system."""

    def list_from(self, directory: str, start_after: str | None = None) -> list[FileInfo]:
        """See :meth:`Storage.list_from`."""
        local = to_local_path(directory)
        out: list[FileInfo] = []
        try:
            with os.scandir(local) as entries:
                for entry in entries:
                    if start_after is not None and entry.name <= start_after:
                        continue
                    try:
                        if not entry.is_file():
                            continue
                        st = entry.stat()
                    except FileNotFoundError:
                        continue  # removed between listing and stat: it is no longer there
                    out.append(FileInfo(entry.name, st.st_size, st.st_mtime_ns // 1_000_000))
        except FileNotFoundError as e:
            raise MissingFileError("directory does not exist", file=directory) from e
        out.sort(key=lambda f: f.name)
        return out

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """See :meth:`Storage.read`."""
        try:
            with open(to_local_path(path), "rb") as fh:
                if offset:
                    fh.seek(offset)
                return fh.read() if length is None else fh.read(length)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise MissingFileError("file does not exist", file=path) from e

    def stat(self, path: str) -> FileInfo:
        """See :meth:`Storage.stat`."""
        local = to_local_path(path)
        try:
            st = os.stat(local)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise MissingFileError("file does not exist", file=path) from e
        return FileInfo(os.path.basename(local), st.st_size, st.st_mtime_ns // 1_000_000)

    def exists(self, path: str) -> bool:
        """See :meth:`Storage.exists`."""
        return os.path.exists(to_local_path(path))
