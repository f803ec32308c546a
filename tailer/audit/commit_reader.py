"""Reading a commit file by its open descriptor, and the helper process that streams a range of them.

Only modules the interpreter loads anyway (not even ``typing``):
:class:`~tailer.audit.commit_files.PipedCommitFiles` runs this file as a script
(``python -I -S commit_reader.py LOG_DIR FIRST LAST``), which must start in milliseconds, so it
cannot import the rest of deltatail. The helper writes one frame per version to its standard
output: a :data:`HEADER` (the length of the bytes, and the file's modification time in epoch ms),
then the bytes. A missing file is the length :data:`MISSING`; a file that cannot be read is the
length :data:`FAILED` with the length of a UTF-8 reason in the time's place, the reason following.
"""

from __future__ import annotations

import io
import os
import struct
import sys

HEADER = struct.Struct("<qq")
MISSING = -1
FAILED = -2

#: Bytes the helper gathers before each write down the pipe.
WRITE_SIZE = 1 << 16


def commit_file(log_dir: str, version: int) -> str:
    """The local path of commit ``version`` in ``log_dir`` (protocol: ``<version:020>.json``)."""
    return os.path.join(log_dir, f"{version:020d}.json")


def read_file(path: str) -> tuple[bytes, int]:
    """A file's bytes and modification time (epoch ms), from one open: no stat by name.

    Raises:
        OSError: as ``os.open``, ``os.fstat`` and ``os.read`` raise it (``FileNotFoundError`` if absent).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        st = os.fstat(fd)
        data = os.read(fd, st.st_size + 1)
        if len(data) > st.st_size:  # grew since (never for a published commit): read to the end
            rest = [data]
            while chunk := os.read(fd, 1 << 16):
                rest.append(chunk)
            data = b"".join(rest)
    finally:
        os.close(fd)
    return data, st.st_mtime_ns // 1_000_000


def write_frames(log_dir: str, first: int, last: int, out: io.BufferedIOBase) -> None:
    """Write the frame of every version from ``first`` to ``last`` (inclusive) to ``out``, in order."""
    frames: list[bytes] = []
    size = 0
    for version in range(first, last + 1):
        try:
            data, mtime = read_file(commit_file(log_dir, version))
        except (FileNotFoundError, NotADirectoryError):
            frames.append(HEADER.pack(MISSING, 0))
            continue
        except OSError as e:
            reason = (e.strerror or str(e)).encode("utf-8", "replace")
            frames.append(HEADER.pack(FAILED, len(reason)) + reason)
            continue
        frames.append(HEADER.pack(len(data), mtime))
        frames.append(data)
        size += len(data) + HEADER.size
        if size >= WRITE_SIZE:
            out.write(b"".join(frames))
            frames, size = [], 0
    out.write(b"".join(frames))
    out.flush()


if __name__ == "__main__":
    try:
        out = sys.stdout.buffer
        if not isinstance(out, io.BufferedIOBase):
            raise SystemExit("commit_reader: standard output is not a binary stream")
        write_frames(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), out)
    except BrokenPipeError:  # the reader stopped early: nothing is owed to anyone
        os._exit(0)
