"""A TCP proxy on 127.0.0.1 that adds a store's first-byte latency to every request, and fails some at random.

Run as its own process (:class:`LatencyProxy` starts it), so that every client is served however it
waits: deltalake holds the GIL while it waits for its requests, which an in-process proxy could
never serve. It works on bytes, not HTTP: on each connection, the first bytes the server sends after
the client sent a request are held until ``delay_ms`` after that request's first byte arrived (the
latency of a distant store; moto itself answers in a few ms here). Bytes stream through unchanged
otherwise, and connections are kept alive as the client keeps them: many requests may be in flight
at once, each on its own connection, as against a real store.

With ``fail_rate`` a request's answer is, with that probability (drawn from ``seed``), replaced by
``HTTP/1.1 503 Slow Down`` and the connection closed: a throttled or failing store, which a client
retries (or reports). Nothing here talks to any address but 127.0.0.1.

With ``trace`` (a file) each answered request adds a line ``REQUEST_AT SERVER_AT`` (monotonic
seconds): when its first byte came from the client, and when the server's first byte came back. The
client waited ``max(SERVER_AT, REQUEST_AT + delay) - REQUEST_AT`` for it (:func:`read_trace`).

``python tests/latency_proxy.py UPSTREAM_PORT --delay-ms 50 [--fail-rate 0.1 --seed 1] [--trace FILE]``
prints its port on the first line of stdout, then serves until killed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import ctypes
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import TextIO

FAILURE = b"HTTP/1.1 503 Slow Down\r\nContent-Type: application/xml\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"


class _Exchange:
    """One client connection's state: when the request being answered started, and whether it fails."""

    def __init__(self) -> None:
        self.request_at: float | None = None  # monotonic time of the unanswered request's first byte
        self.fail = False
        self.failed = asyncio.Event()


async def _client_to_server(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    state: _Exchange,
    rng: random.Random,
    fail_rate: float,
) -> None:
    while data := await reader.read(65536):
        if state.request_at is None:
            state.request_at = time.monotonic()
            state.fail = rng.random() < fail_rate
            if state.fail:
                state.failed.set()
        if not state.fail:
            writer.write(data)
            await writer.drain()
    with contextlib.suppress(OSError):
        writer.write_eof()


async def _server_to_client(
    reader: asyncio.StreamReader,
    writer: asyncio.StreamWriter,
    state: _Exchange,
    delay: float,
    trace: TextIO | None,
) -> None:
    while data := await reader.read(65536):
        if state.request_at is not None:
            now = time.monotonic()
            if trace is not None:
                trace.write(f"{state.request_at:.6f} {now:.6f}\n")
            wait = state.request_at + delay - now
            state.request_at = None
            if wait > 0:
                await asyncio.sleep(wait)
        writer.write(data)
        await writer.drain()


async def _failing(state: _Exchange, writer: asyncio.StreamWriter, delay: float) -> None:
    """Answer a request chosen to fail with a 503 (after the delay) and close the connection."""
    await state.failed.wait()
    print("failed", flush=True)  # counted by LatencyProxy.failures
    await asyncio.sleep(delay)
    writer.write(FAILURE)
    with contextlib.suppress(OSError):
        await writer.drain()


async def _serve_one(
    client_r: asyncio.StreamReader,
    client_w: asyncio.StreamWriter,
    upstream_port: int,
    delay: float,
    rng: random.Random,
    fail_rate: float,
    trace: TextIO | None = None,
) -> None:
    try:
        server_r, server_w = await asyncio.open_connection("127.0.0.1", upstream_port)
    except OSError:
        client_w.close()
        return
    state = _Exchange()
    up = asyncio.ensure_future(_client_to_server(client_r, server_w, state, rng, fail_rate))
    down = asyncio.ensure_future(_server_to_client(server_r, client_w, state, delay, trace))
    fail = asyncio.ensure_future(_failing(state, client_w, delay))
    try:
        await asyncio.wait([down, fail], return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in (up, down, fail):
            task.cancel()
        for w in (client_w, server_w):
            with contextlib.suppress(OSError):
                w.close()


async def serve(
    upstream_port: int, delay_ms: float, fail_rate: float, seed: int, port: int, trace: TextIO | None = None
) -> None:
    """Serve on 127.0.0.1 (``port``, 0 for a free one) until cancelled; prints the port first."""
    rng = random.Random(seed)
    delay = delay_ms / 1000

    async def handle(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        await _serve_one(r, w, upstream_port, delay, rng, fail_rate, trace)

    server = await asyncio.start_server(handle, "127.0.0.1", port, backlog=1024)
    print(server.sockets[0].getsockname()[1], flush=True)
    async with server:
        await server.serve_forever()


def _die_with_parent() -> None:
    """In the child: a session of its own, and SIGKILL when the process that started it dies."""
    os.setsid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


class LatencyProxy:
    """The proxy in its own process, in front of ``upstream`` (``http://127.0.0.1:PORT``).

    Use as a context manager, or :meth:`start` and :meth:`stop`; point clients at :attr:`endpoint`;
    :attr:`failures` counts the requests it failed once it is stopped.
    """

    def __init__(
        self, upstream: str, *, delay_ms: float, fail_rate: float = 0.0, seed: int = 0, trace: Path | None = None
    ) -> None:
        self.upstream_port = int(upstream.rsplit(":", 1)[1].rstrip("/"))
        self.trace = trace
        self.delay_ms = delay_ms
        self.fail_rate = fail_rate
        self.seed = seed
        self.port = 0
        #: Requests answered with a 503 (known once stopped).
        self.failures = 0
        self._proc: subprocess.Popen[str] | None = None

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> LatencyProxy:
        argv = [sys.executable, str(Path(__file__).resolve()), str(self.upstream_port)]
        argv += ["--delay-ms", str(self.delay_ms), "--fail-rate", str(self.fail_rate), "--seed", str(self.seed)]
        if self.trace is not None:
            argv += ["--trace", str(self.trace)]
        self._proc = subprocess.Popen(
            argv,
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            text=True,
            preexec_fn=_die_with_parent,
        )
        assert self._proc.stdout is not None
        line = self._proc.stdout.readline()
        if not line.strip().isdigit():
            self.stop()
            raise RuntimeError(f"the latency proxy did not start (it printed {line!r})")
        self.port = int(line)
        return self

    def stop(self) -> None:
        if self._proc is not None:
            self._proc.kill()
            self._proc.wait()
            if self._proc.stdout is not None:
                self.failures += self._proc.stdout.read().count("failed")
                self._proc.stdout.close()
            self._proc = None

    def __enter__(self) -> LatencyProxy:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


def main() -> None:
    p = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    p.add_argument("upstream_port", type=int)
    p.add_argument("--delay-ms", type=float, default=0.0)
    p.add_argument("--fail-rate", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--port", type=int, default=0)
    p.add_argument("--trace", type=Path, default=None)
    a = p.parse_args()
    with contextlib.ExitStack() as stack, contextlib.suppress(KeyboardInterrupt):
        trace = stack.enter_context(a.trace.open("a", buffering=1)) if a.trace is not None else None
        asyncio.run(serve(a.upstream_port, a.delay_ms, a.fail_rate, a.seed, a.port, trace))


def read_trace(path: Path, delay_ms: float) -> list[tuple[float, float, float]]:
    """``(request_at, server_at, answered_at)`` of every request a proxy with ``trace=path`` answered, in order."""
    delay = delay_ms / 1000
    out = []
    for line in path.read_text().splitlines():
        parts = line.split()
        if len(parts) == 2:
            start, server = float(parts[0]), float(parts[1])
            out.append((start, server, max(server, start + delay)))
    return sorted(out)


if __name__ == "__main__":
    main()
