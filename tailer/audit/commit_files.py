"""The bytes and modification times of a range of commit files, read ahead of the code that parses them.

Auditing a whole history parses and folds one commit after another on one thread; reading the
files must not be on that thread's path. Two readers hand the files over in order, each as
``(bytes, modification time in epoch ms)``, through :meth:`CommitFiles.next`:

- :class:`PipedCommitFiles`, for a long range of a local table: a helper process (the same
  Python running :mod:`tailer.audit.commit_reader` with ``-I -S``: standard library only) opens,
  stats and reads each file and writes it down a pipe; the parent takes them from the pipe, tens of files
  per read. The reading runs on another core and costs the parent about a microsecond a file,
  where reading it itself costs four system calls (open, fstat, read, close). The parent reads
  the first :data:`PIPE_HEAD` files itself while the helper starts (about 10 ms).
- :class:`ThreadedCommitFiles`, for object stores and short ranges: a thread reads runs of
  :data:`READ_RUN` files (``storage.read``, which releases the GIL while it waits on the network).

Either way a file that cannot be read is handed over as its error, raised by ``next`` in its turn
(a gap in the log is a :class:`~state.errors.MissingFileError`, which the audit reports as a
:class:`~state.errors.VersionGapError`).
"""

from __future__ import annotations

import logging
import os
import queue
import subprocess
import sys
import threading
from collections.abc import Callable
from typing import Protocol

from deltatail.state.errors import DeltaTailError, MissingFileError
from deltatail.tailer.audit import commit_reader
from deltatail.tailer.storage import Storage
from deltatail.tailer.storage.local import to_local_path

log = logging.getLogger("deltatail.audit")

#: Commit files the reading thread reads per run, and runs it reads ahead of the consumer.
READ_RUN = 64
READ_AHEAD_RUNS = 4

#: A local range this long or longer is read by a helper process (shorter: by a thread).
PIPE_MIN_FILES = 1024
#: Files the parent reads itself at the start of a piped range, while the helper starts.
PIPE_HEAD = 256

_HEADER, _MISSING = commit_reader.HEADER, commit_reader.MISSING
_HEADER_SIZE = _HEADER.size


class CommitFiles(Protocol):
    """Commit files handed over in order."""

    def next(self) -> tuple[bytes, int]:
        """The next file's bytes and modification time (epoch ms).

        Raises:
            MissingFileError: if the file does not exist.
            DeltaTailError: if it cannot be read.
        """
        ...

    def close(self) -> None:
        """Stop reading ahead; idempotent."""
        ...


def read_local_commit(path: str) -> tuple[bytes, int]:
    """A local commit file's bytes and modification time (epoch ms), from one open: no listing, no stat by name.

    Raises:
        MissingFileError: if the file does not exist.
        DeltaTailError: if it cannot be read (a directory, no permission); the message says why.
    """
    try:
        return commit_reader.read_file(path)
    except (FileNotFoundError, NotADirectoryError) as e:
        raise MissingFileError("file does not exist", file=path) from e
    except OSError as e:
        raise DeltaTailError(f"cannot read the commit file: {e.strerror or e}", file=path) from e


def open_commit_files(
    storage: Storage, commit_path: Callable[[int], str], first: int, last: int, times: list[int | None] | None
) -> CommitFiles:
    """The reader of the commit files of versions ``first`` to ``last`` (inclusive).

    Args:
        storage: the table's storage.
        commit_path: the path of a version's commit file (:meth:`~tailer.log.delta_log.DeltaLog.commit_path`).
        first: the first version.
        last: the last version.
        times: the files' modification times from a listing (object stores), ``times[0]`` for
            ``first``; or ``None`` for a local table (each file's time is taken from the open file).

    A local range of at least :data:`PIPE_MIN_FILES` files is read by a helper process; if it
    cannot be started, by a thread (logged at debug level).
    """
    if times is None and last - first + 1 >= PIPE_MIN_FILES:
        ends = [to_local_path(commit_path(first)), to_local_path(commit_path(last))]
        log_dir = os.path.dirname(ends[0])
        if ends == [commit_reader.commit_file(log_dir, v) for v in (first, last)]:  # the helper's names
            try:
                return PipedCommitFiles(log_dir, first, last)
            except OSError as e:
                log.debug("cannot start the commit reader process (%s): reading on a thread", e)
    return ThreadedCommitFiles(storage, commit_path, first, last, times)


#: A commit file's bytes and modification time, or the error reading it raised.
_Read = tuple[bytes, int] | Exception


class ThreadedCommitFiles:
    """Commit files read ahead on a thread in runs of :data:`READ_RUN` files.

    Locally each file is opened once (:func:`read_local_commit`); on an object store the times
    come from a listing (``times``) and ``storage.read`` releases the GIL while it waits. At most
    :data:`READ_AHEAD_RUNS` runs wait. A time of ``None`` (the listing does not hold the file) is
    handed over as a :class:`~state.errors.MissingFileError`.
    """

    def __init__(
        self,
        storage: Storage,
        commit_path: Callable[[int], str],
        first: int,
        last: int,
        times: list[int | None] | None,
    ) -> None:
        self._storage = storage
        self._commit_path = commit_path
        self._first, self._last = first, last
        self._times = times
        self._runs: queue.Queue[list[_Read]] = queue.Queue(maxsize=READ_AHEAD_RUNS)
        self._stop = threading.Event()
        self._current: list[_Read] = []
        self._index = 0
        self._thread = threading.Thread(target=self._read, name="deltatail-audit-read", daemon=True)
        self._thread.start()

    def _read(self) -> None:
        storage, commit_path, times = self._storage, self._commit_path, self._times
        first, last = self._first, self._last
        for start in range(first, last + 1, READ_RUN):
            run: list[_Read] = []
            for version in range(start, min(start + READ_RUN, last + 1)):
                path = commit_path(version)
                try:
                    if times is None:
                        run.append(read_local_commit(to_local_path(path)))
                    elif (mtime := times[version - first]) is None:
                        run.append(MissingFileError("the listing does not hold this commit", file=path))
                    else:
                        run.append((storage.read(path), mtime))
                except Exception as e:  # handed over: the consumer raises it in its turn
                    run.append(e)
            while not self._stop.is_set():
                try:
                    self._runs.put(run, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set():
                return

    def next(self) -> tuple[bytes, int]:
        """The next file's bytes and modification time (epoch ms).

        Raises:
            MissingFileError: if the file is gone; any other error reading it raised, likewise.
        """
        if self._index >= len(self._current):
            self._current = self._runs.get()
            self._index = 0
        item = self._current[self._index]
        self._index += 1
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        """Stop reading ahead (the thread ends at its next run)."""
        self._stop.set()


class PipedCommitFiles:
    """The commit files of versions ``first``..``last`` of a local log, read by a helper process.

    The parent reads the first ``head`` files (default :data:`PIPE_HEAD`) itself while the helper
    starts; the helper reads the rest and writes each down its standard output as a frame (a
    16-byte header, then the bytes). :meth:`close` ends the helper; a consumer that stops early
    leaves no process behind (:class:`~tailer.audit.feed.AuditFeed` closes its reader when its
    events stop, early or not).

    Raises:
        OSError: if the helper process cannot be started.
    """

    def __init__(self, log_dir: str, first: int, last: int, *, head: int | None = None) -> None:
        self._log_dir = log_dir
        self._next_version = first
        self._head_end = min(first + (PIPE_HEAD if head is None else head), last + 1)
        self._proc: subprocess.Popen[bytes] | None = None
        if self._head_end <= last:
            self._proc = subprocess.Popen(
                [sys.executable, "-I", "-S", commit_reader.__file__, log_dir, str(self._head_end), str(last)],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
            )
        self._buffer = b""
        self._pos = 0

    @property
    def pid(self) -> int | None:
        """The helper process's id (``None`` when the range is short enough to need none)."""
        return None if self._proc is None else self._proc.pid

    def next(self) -> tuple[bytes, int]:
        """The next file's bytes and modification time (epoch ms).

        Raises:
            MissingFileError: if the file does not exist.
            DeltaTailError: if it cannot be read, or the helper process ended before handing it over.
        """
        version = self._next_version
        self._next_version += 1
        if version < self._head_end:
            return read_local_commit(self._path(version))
        if len(self._buffer) - self._pos < _HEADER_SIZE:
            self._fill(_HEADER_SIZE, version)
        pos = self._pos
        length, mtime = _HEADER.unpack_from(self._buffer, pos)
        pos += _HEADER_SIZE
        if length >= 0:
            if len(self._buffer) - pos < length:
                self._pos = pos
                self._fill(length, version)
                pos = self._pos
            self._pos = pos + length
            return self._buffer[pos : pos + length], mtime
        self._pos = pos
        if length == _MISSING:
            raise MissingFileError("file does not exist", file=self._path(version))
        self._fill(mtime, version)
        message = self._buffer[self._pos : self._pos + mtime].decode("utf-8", "replace")
        self._pos += mtime
        raise DeltaTailError(f"cannot read the commit file: {message}", version=version, file=self._path(version))

    def _path(self, version: int) -> str:
        return commit_reader.commit_file(self._log_dir, version)

    def _fill(self, n: int, version: int) -> None:
        """Have at least ``n`` unread bytes in the buffer, reading the pipe as needed."""
        if len(self._buffer) - self._pos >= n:
            return
        proc = self._proc
        if proc is None or proc.stdout is None:
            raise DeltaTailError("the commit reader process is closed", version=version, file=self._path(version))
        fd = proc.stdout.fileno()
        parts = [self._buffer[self._pos :]]
        have = len(parts[0])
        while have < n:
            chunk = os.read(fd, max(1 << 20, n - have))
            if not chunk:
                raise DeltaTailError(
                    f"the commit reader process ended before handing this file over ({self._ended(proc)})",
                    version=version,
                    file=self._path(version),
                )
            parts.append(chunk)
            have += len(chunk)
        self._buffer = b"".join(parts)
        self._pos = 0

    @staticmethod
    def _ended(proc: subprocess.Popen[bytes]) -> str:
        try:
            code = proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            return "it closed its output"
        detail = b"" if proc.stderr is None else proc.stderr.read()[-500:]
        text = detail.decode("utf-8", "replace").strip().splitlines()
        return f"exit code {code}" + (f": {text[-1]}" if text else "")

    def close(self) -> None:
        """End the helper process (if it still runs) and release the pipe; idempotent."""
        proc, self._proc = self._proc, None
        self._buffer, self._pos = b"", 0
        if proc is None:
            return
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        for stream in (proc.stdout, proc.stderr):
            if stream is not None:
                stream.close()
