"""Atomic, durable file writes: what every state directory, status file and embedded sink writes with."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path


def atomic_write(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically and durably (temp file, fsync, rename, fsync directory).

    On failure ``path`` is as it was and the temporary file is removed.

    Raises:
        OSError: as the file system raises it (disk full, file too large, read-only, ...).
    """
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        remove_quietly(tmp)
        raise
    fsync_dir(path.parent)


def remove_quietly(path: Path) -> None:
    """Remove a temporary file if it is there (a failed write's; errors are the write's to report)."""
    with contextlib.suppress(OSError):
        path.unlink(missing_ok=True)


def fsync_dir(directory: Path) -> None:
    """Make a rename in ``directory`` durable."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
