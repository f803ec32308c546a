"""The local file system as a :class:`~tailer.storage.base.Storage`."""

from __future__ import annotations

import os
from collections.abc import Sequence

import pyarrow as pa

from deltatail.state.errors import MissingFileError
from deltatail.tailer.storage.base import FileInfo


def to_local_path(path: str) -> str:
    """Strip a ``file:`` scheme (``file:///x``, ``file:/x``) to a local path; percent-decoding is the caller's."""
    if path.startswith("file://"):
        return path[len("file://") :]
    if path.startswith("file:"):
        return path[len("file:") :]
    return path


class LocalStorage:
    """:class:`Storage` over the local file system."""

    remote = False
    local_files = True

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
        except NotADirectoryError as e:  # a path under a regular file: /etc/passwd/_delta_log
            raise MissingFileError(f"not a directory: {e.filename}", file=directory) from e
        out.sort(key=lambda f: f.name)
        return out

    def read(self, path: str, offset: int = 0, length: int | None = None) -> bytes:
        """See :meth:`Storage.read`.

        ``length`` is clamped to what the file holds before anything is allocated: lengths often come
        from a table (a deletion vector's ``sizeInBytes``, a Lance row-id file's size), and Python's
        ``read(n)`` allocates ``n`` bytes up front.
        """
        try:
            with open(to_local_path(path), "rb") as fh:
                if offset:
                    fh.seek(offset)
                if length is None:
                    return fh.read()
                return fh.read(min(length, max(os.fstat(fh.fileno()).st_size - offset, 0)))
        except (FileNotFoundError, NotADirectoryError) as e:
            raise MissingFileError("file does not exist", file=path) from e

    def open_input(self, path: str, size: int | None = None) -> pa.NativeFile:
        """See :meth:`Storage.open_input` (a memory-unmapped OS file; ``size`` is not needed locally)."""
        try:
            return pa.OSFile(to_local_path(path))
        except (FileNotFoundError, NotADirectoryError) as e:
            raise MissingFileError("file does not exist", file=path) from e

    def prefetch(self, files: Sequence[tuple[str, int | None]]) -> None:
        """See :meth:`Storage.prefetch`: nothing to do locally (the page cache is the prefetch)."""

    def stat(self, path: str) -> FileInfo:
        """See :meth:`Storage.stat`."""
        local = to_local_path(path)
        try:
            st = os.stat(local)
        except (FileNotFoundError, NotADirectoryError) as e:
            raise MissingFileError("file does not exist", file=path) from e
        return FileInfo(os.path.basename(local), st.st_size, st.st_mtime_ns // 1_000_000)

    def stat_keeping(self, path: str) -> FileInfo:
        """See :meth:`Storage.stat_keeping`: a stat (a local read costs nothing to repeat)."""
        return self.stat(path)

    def exists(self, path: str) -> bool:
        """See :meth:`Storage.exists`."""
        return os.path.exists(to_local_path(path))
