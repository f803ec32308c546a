"""A fork server for the crash campaigns: ``deltatail`` started dozens of times without paying its imports each time.

A campaign starts ``deltatail run`` again and again; a fresh interpreter spends most of a second
importing the command line, pyarrow and the Kafka clients before it does any work. The launcher is one
helper process per pytest worker (``python tests/launcher.py FD``, started on first use) that imports
those modules once and then, per request, forks a child that runs the command line's real entry point,
``deltatail.main(argv)`` (what the ``deltatail`` script and ``python -m deltatail`` call), with the
request's environment, working directory and stdin/stdout/stderr (passed as file descriptors), and
exits with ``main``'s exit code after the interpreter's exit steps a program can see (:func:`_exit`).

What keeps the children honest (they must behave as ``subprocess.Popen([deltatail, ...])`` would):

- the helper is single-threaded when it forks (it checks ``/proc/self/task``) and has run no command:
  everything ``main`` sets up for a process (signal handlers, Arrow's memory pool, the GIL switch
  interval, logging) is set up in the child; the product reads its environment when a command runs,
  not at import (``tailer/runtime/faults.py`` reads ``DELTATAIL_CRASH_AT`` at its first crash point);
- the child gets the default disposition for every signal the helper changed (and keeps ignoring
  SIGPIPE and SIGXFSZ, as every interpreter does from its start: a write past ``RLIMIT_FSIZE`` fails
  with EFBIG instead of killing it), fresh ``sys.stdin``/
  ``sys.stdout``/``sys.stderr`` over its descriptors (buffered as a new interpreter's would be),
  ``sys.argv`` and ``sys.path[0]`` as the ``deltatail`` script sees them, and stays in the process
  group of pytest (as ``Popen`` leaves it: a Ctrl-C reaches it); the helper SIGKILLs its children still
  running when the test side goes away;
- the helper reaps its children and reports each one's true exit status (``-9`` for SIGKILL, as
  ``Popen.returncode``); the test side's :class:`Launched` has ``pid``, ``poll``, ``wait``,
  ``returncode``, ``communicate``, ``send_signal``, ``kill``, ``terminate`` and ``stdout``/``stderr`` pipes.

Tests that check how the command starts (its imports, ``--version``, the script) keep ``subprocess``;
each campaign file keeps a test that starts ``deltatail`` the ordinary way. The protocol: JSON over a
``SOCK_SEQPACKET`` socket pair; a request ``{"argv", "env", "cwd"}`` carries three file descriptors,
the helper answers ``{"pid"}`` (or ``{"error"}``) and later ``{"exit": pid, "status": code}``.
"""

from __future__ import annotations

import atexit
import contextlib
import importlib
import io
import json
import os
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import IO, Any, NoReturn

#: Modules the helper imports before it forks (an absent optional one is skipped).
PRELOAD = (
    "deltatail",
    "deltatail.tailer.cli.main",
    "deltatail.sinks.uris",
    "deltatail.sinks.kafka.uri",
    "deltatail.sinks.kafka.sink",
    "deltatail.sinks.kafka.producers",
    "deltatail.tailer.formats.lance",
    "deltatail.tailer.formats.iceberg",
    "pyiceberg.manifest",  # what tailer/iceberg/metadata.py imports when it first reads a table
    "pyiceberg.table.metadata",
    "pyiceberg.avro.file",
    "pyiceberg.schema",
    "pyiceberg.io.pyarrow",
    "pyarrow.parquet",
    # Loaded on first use by the product (start-up): the children of a campaign all use them.
    "pyarrow.compute",
    "importlib.metadata",  # the sink entry points
    "deltatail.state.variant",
    "deltatail.state.audit",
    "deltatail.tailer.storage.objectstore",
    "kafka",
    "confluent_kafka",
    "lance",
)

#: The helper's own environment on top of the test's: the native threads that importing pyarrow starts
#: (jemalloc's background purge thread, numpy's OpenBLAS thread server) are not started, so the helper
#: forks with one thread. Their children differ from a fresh process only there (dirty pages are purged
#: on allocation instead of in the background; BLAS, which the command never calls, runs on one thread).
SINGLE_THREADED = {"JE_ARROW_MALLOC_CONF": "background_thread:false", "OPENBLAS_NUM_THREADS": "1"}

PIPE = subprocess.PIPE
DEVNULL = subprocess.DEVNULL
_MESSAGE = 1 << 20


class LauncherError(RuntimeError):
    """The helper is gone or refused a request."""


# ---------------------------------------------------------------- the helper process


def _threads() -> int:
    return len(os.listdir("/proc/self/task"))


def _preload(names: Sequence[str]) -> None:
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError:
            continue


def serve(fd: int) -> int:
    """The helper's loop: fork a child per request, report exits; returns 0 at the socket's end (after
    SIGKILLing the children still running). A child never returns from here."""
    sock = socket.socket(fileno=fd)
    _preload(PRELOAD)
    wake_r, wake_w = os.pipe()
    os.set_blocking(wake_w, False)
    signal.signal(signal.SIGCHLD, lambda signum, frame: None)
    signal.set_wakeup_fd(wake_w)
    children: set[int] = set()
    with selectors.DefaultSelector() as sel:
        sel.register(sock, selectors.EVENT_READ)
        sel.register(wake_r, selectors.EVENT_READ)
        while True:
            ready = {key.fileobj for key, _ in sel.select()}
            if wake_r in ready:
                os.read(wake_r, 4096)
            _reap(sock, children)
            if sock not in ready:
                continue
            msg, fds, _, _ = socket.recv_fds(sock, _MESSAGE, 3)
            if not msg:
                for pid in children:
                    os.kill(pid, signal.SIGKILL)
                return 0
            request = json.loads(msg)
            if _threads() != 1:
                _send(sock, {"error": f"the launcher has {_threads()} threads: it must not fork"})
                for f in fds:
                    os.close(f)
                continue
            pid = os.fork()
            if pid == 0:
                sel.close()
                sock.close()
                _child(request, fds, closing=(wake_r, wake_w))
            children.add(pid)
            for f in fds:
                os.close(f)
            _send(sock, {"pid": pid})


def _reap(sock: socket.socket, children: set[int]) -> None:
    for pid in list(children):
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            children.discard(pid)
            _send(sock, {"exit": pid, "status": os.waitstatus_to_exitcode(status)})


def _send(sock: socket.socket, message: Mapping[str, Any]) -> None:
    sock.sendall(json.dumps(message).encode())


def _child(request: Mapping[str, Any], fds: Sequence[int], *, closing: Sequence[int]) -> NoReturn:
    """In the forked child: become the request's process, run ``deltatail.main`` and exit with its code."""
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in closing:
        os.close(fd)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    _fresh_stdio()
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    sys.argv = list(request["argv"])
    import deltatail

    interrupted = False
    try:
        code = deltatail.main(request["argv"][1:])
    except SystemExit as e:  # argparse's usage errors, as in the script
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except KeyboardInterrupt:
        sys.excepthook(*sys.exc_info())
        code, interrupted = 1, True
    except BaseException:
        sys.excepthook(*sys.exc_info())
        code = 1
    _exit(code, interrupted=interrupted)


def _exit(code: int, *, interrupted: bool) -> NoReturn:
    """What the interpreter does at exit that a program can see: wait for non-daemon threads, run the
    ``atexit`` functions (``logging.shutdown`` among them), flush the standard streams; then end without
    tearing down the modules (the helper's ~800 modules take most of a second; nothing of them is the
    child's to clean up). A ``KeyboardInterrupt`` ends the process by SIGINT, as Python does."""
    getattr(threading, "_shutdown")()  # noqa: B009 - the interpreter's own exit step, not public API
    getattr(atexit, "_run_exitfuncs")()  # noqa: B009
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # a closed pipe
            stream.flush()
    if interrupted:
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    os._exit(code)


def _fresh_stdio() -> None:
    """New ``sys.stdin``/``stdout``/``stderr`` over descriptors 0-2, made as the interpreter makes them at start:
    stdout line-buffered only on a terminal, stderr always line-buffered with backslash escapes."""
    encoding = sys.stdout.encoding
    sys.stdin = open(0, encoding=encoding, closefd=False)  # noqa: SIM115
    sys.stdout = open(1, "w", encoding=encoding, closefd=False)  # noqa: SIM115
    raw_err = open(2, "wb", closefd=False)  # noqa: SIM115
    sys.stderr = io.TextIOWrapper(raw_err, encoding=encoding, errors="backslashreplace", line_buffering=True)
    for name in ("stdin", "stdout", "stderr"):  # sys.__stdout__ is sys.stdout at start (typeshed marks it final)
        setattr(sys, f"__{name}__", getattr(sys, name))


# ---------------------------------------------------------------- the test side


class Launched:
    """A child of the helper, used like ``subprocess.Popen``."""

    def __init__(self, launcher: Launcher, pid: int, args: list[str]) -> None:
        self.launcher, self.pid, self.args = launcher, pid, args
        self.returncode: int | None = None
        self.stdout: IO[bytes] | None = None
        self.stderr: IO[bytes] | None = None
        self._readers: list[threading.Thread] = []
        self._read: list[bytes | None] = [None, None]

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.launcher.status(self.pid, 0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.launcher.status(self.pid, timeout)
        if self.returncode is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[bytes | None, bytes | None]:
        """Read the ``stdout``/``stderr`` pipes to their end and wait for the child, as ``Popen.communicate``
        (no input: the child's stdin is not a pipe of this side). Returns ``(out, err)``, ``None`` for a
        stream that is not a pipe; raises ``subprocess.TimeoutExpired`` if the child runs past ``timeout``
        (a later call goes on reading where the first left off)."""
        if not self._readers:
            for i, stream in enumerate((self.stdout, self.stderr)):
                if stream is not None:
                    reader = threading.Thread(target=self._drain, args=(i, stream), daemon=True)
                    reader.start()
                    self._readers.append(reader)
        deadline = None if timeout is None else time.monotonic() + timeout
        self.wait(timeout)
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():  # a grandchild holds the pipe open
                raise subprocess.TimeoutExpired(self.args, timeout or 0)
        return self._read[0], self._read[1]

    def _drain(self, i: int, stream: IO[bytes]) -> None:
        with stream:
            self._read[i] = stream.read()

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:  # the helper reaps it: until it reported, the pid is still this child's
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)


class Launcher:
    """The test side of one helper process: :meth:`popen` starts ``deltatail`` children."""

    def __init__(self) -> None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock = mine
        self.helper = subprocess.Popen(
            [sys.executable, str(Path(__file__).resolve()), str(theirs.fileno())],
            pass_fds=[theirs.fileno()],
            stdin=subprocess.DEVNULL,
            env={**os.environ, **SINGLE_THREADED},
        )
        theirs.close()
        self.lock = threading.Lock()  # one request at a time
        self.changed = threading.Condition()
        self.statuses: dict[int, int] = {}
        self.replies: list[dict[str, Any]] = []
        self.closed = False
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        while msg := self.sock.recv(_MESSAGE):
            message = json.loads(msg)
            with self.changed:
                if "exit" in message:
                    self.statuses[int(message["exit"])] = int(message["status"])
                else:
                    if "pid" in message:
                        # A new child may have the pid of one reported long ago (pids wrap at pid_max,
                        # 32768 here): its status is the old child's, not this one's. Dropped here, in the
                        # helper's order: the new child's own exit is reported after this reply.
                        self.statuses.pop(int(message["pid"]), None)
                    self.replies.append(message)
                self.changed.notify_all()
        with self.changed:
            self.closed = True
            self.changed.notify_all()

    def popen(
        self,
        args: Sequence[str],
        *,
        env: Mapping[str, str],
        cwd: str | Path,
        stdin: int | IO[Any] | None = DEVNULL,
        stdout: int | IO[Any] | None = None,
        stderr: int | IO[Any] | None = None,
    ) -> Launched:
        """Start the command line ``args`` as :func:`cli_args` reads it; the child runs ``deltatail.main``.

        ``stdin``/``stdout``/``stderr``: ``PIPE``, ``DEVNULL``, ``None`` (this process's) or an open file.
        Raises ``LauncherError`` for a command that is not ``deltatail``.
        """
        argv = cli_args(args)
        ends: list[int] = []  # the child's ends, closed here once sent
        mine: list[IO[bytes] | None] = [None, None, None]
        for i, how in enumerate((stdin, stdout, stderr)):
            if how == PIPE:
                r, w = os.pipe()
                ends.append(r if i == 0 else w)
                mine[i] = os.fdopen(w if i == 0 else r, "wb" if i == 0 else "rb")  # buffered, as Popen's (bufsize -1)
            elif how == DEVNULL:
                ends.append(os.open(os.devnull, os.O_RDWR))
            elif how is None:
                ends.append(os.dup(i))
            elif isinstance(how, int):
                ends.append(os.dup(how))
            else:
                ends.append(os.dup(how.fileno()))
        request = {"argv": argv, "env": dict(env), "cwd": str(cwd)}
        try:
            with self.lock:
                socket.send_fds(self.sock, [json.dumps(request).encode()], ends)
                reply = self._reply()
        finally:
            for fd in ends:
                os.close(fd)
        if "error" in reply:
            raise LauncherError(reply["error"])
        proc = Launched(self, int(reply["pid"]), list(args))
        proc.stdout, proc.stderr = mine[1], mine[2]
        return proc

    def _reply(self) -> dict[str, Any]:
        with self.changed:
            self.changed.wait_for(lambda: self.replies or self.closed)
            if not self.replies:
                raise LauncherError(f"the launcher exited ({self.helper.poll()})")
            return self.replies.pop(0)

    def status(self, pid: int, timeout: float | None) -> int | None:
        """The child's exit status once the helper reported it (waiting up to ``timeout`` seconds)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self.changed:
            while pid not in self.statuses:
                if self.closed:
                    raise LauncherError(f"the launcher exited ({self.helper.poll()}) before child {pid}")
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                self.changed.wait(left)
            return self.statuses[pid]

    def close(self) -> None:
        """End the helper (it SIGKILLs any child still running)."""
        self.sock.shutdown(socket.SHUT_RDWR)
        self.helper.wait(60)
        self.sock.close()


#: The command lines that start ``deltatail``: its script, ``python -m deltatail`` and ``python -m
#: deltatail.tailer.cli`` (which differ only in ``--version``, answered by the first two without the CLI).
SCRIPT = str(Path(sys.executable).parent / "deltatail")
MODULES = ("deltatail", "deltatail.tailer.cli")


def cli_args(args: Sequence[str]) -> list[str]:
    """``args`` as ``sys.argv`` of the ``deltatail`` script: the script's path, then the arguments."""
    if args and args[0] == SCRIPT:
        return [SCRIPT, *args[1:]]
    if len(args) >= 3 and args[0] == sys.executable and args[1] == "-m" and args[2] in MODULES:
        return [SCRIPT, *args[3:]]
    raise LauncherError(f"not a deltatail command line: {list(args)[:3]}")


_shared: list[Launcher] = []


def launcher() -> Launcher:
    """This process's launcher, started on first use and ended at exit."""
    if not _shared or _shared[0].closed:
        _shared[:] = [Launcher()]
        atexit.register(_shared[0].close)
    return _shared[0]


def popen(args: Sequence[str], **kwargs: Any) -> Launched:
    """``launcher().popen``: ``deltatail`` started by this process's launcher."""
    return launcher().popen(args, **kwargs)


def run(
    args: Sequence[str], *, env: Mapping[str, str], cwd: str | Path, timeout: float, text: bool = False
) -> subprocess.CompletedProcess[Any]:
    """``subprocess.run(args, capture_output=True, ...)`` for a ``deltatail`` command line, forked by this
    process's launcher: the child's exit code and its whole stdout and stderr (decoded if ``text``)."""
    proc = popen(args, env=env, cwd=cwd, stdout=PIPE, stderr=PIPE)
    try:
        out, err = proc.communicate(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise
    assert out is not None and err is not None and proc.returncode is not None
    if text:
        return subprocess.CompletedProcess(list(args), proc.returncode, out.decode(), err.decode())
    return subprocess.CompletedProcess(list(args), proc.returncode, out, err)


if __name__ == "__main__":
    sys.path[0] = str(Path(sys.executable).parent)  # where the ``deltatail`` script lives, not tests/
    sys.exit(serve(int(sys.argv[1])))
