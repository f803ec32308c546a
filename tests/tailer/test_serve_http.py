"""The metrics and health server of ``deltatail serve`` against real sockets on 127.0.0.1.

Slow and half-sent requests are dropped after the socket timeout, a flood of
them holds a bounded number of threads and descriptors while a scrape still
answers, a client hanging up writes nothing to stderr, and with a token the
detailed endpoints are closed to whoever does not have it.
"""

from __future__ import annotations

import json
import os
import socket
import struct
import subprocess
import sys
import textwrap
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from deltatail.state.errors import ConfigError
from deltatail.tailer.cli.serve import load_serve_config
from deltatail.tailer.follow.stats import TableState, TableStats
from deltatail.tailer.serve.http import HealthServer, load_auth_token

ROOT = Path(__file__).resolve().parents[2]
HALF_REQUEST = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\n"  # no blank line: the request never ends
TOKEN = "t0ken-Zq81"


def _tables() -> list[TableStats]:
    return [
        TableStats("/lake/secret-path/orders", "orders", state=TableState.FOLLOWING),
        TableStats("/lake/secret-path/refunds", "refunds", state=TableState.FAILED, error="boom in refunds"),
    ]


@pytest.fixture
def serve() -> Iterator[Callable[..., HealthServer]]:
    servers: list[HealthServer] = []

    def make(**kwargs: object) -> HealthServer:
        server = HealthServer("127.0.0.1", 0, _tables, 60.0, **kwargs)  # type: ignore[arg-type]
        server.start()
        servers.append(server)
        return server

    yield make
    for s in servers:
        s.close()


def get(port: int, path: str, token: str | None = None) -> tuple[int, bytes]:
    headers = {} if token is None else {"Authorization": f"Bearer {token}"}
    request = urllib.request.Request(f"http://127.0.0.1:{port}{path}", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return int(r.status), bytes(r.read())
    except urllib.error.HTTPError as e:
        return int(e.code), bytes(e.read())


def half_requests(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=20)
        s.sendall(HALF_REQUEST)
        out.append(s)
    return out


def new_request_threads(before: set[threading.Thread]) -> list[threading.Thread]:
    """The server's connection threads started since ``before`` (the worker's other threads not counted)."""
    return [t for t in threading.enumerate() if t not in before and t.name.endswith("(process_request_thread)")]


def open_fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def poll(condition: Callable[[], bool], seconds: float = 20.0) -> bool:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_half_requests_are_dropped_after_the_socket_timeout(serve: Callable[..., HealthServer]) -> None:
    server = serve(request_timeout=0.5, max_connections=32)
    threads, fds = set(threading.enumerate()), open_fds()
    clients = half_requests(server.port, 10)
    for c in clients:  # the server closes each one: a read ends with nothing (blocks 20 s if it never does)
        assert c.recv(100) == b""
        c.close()
    assert poll(lambda: not new_request_threads(threads)), threading.enumerate()
    assert poll(lambda: open_fds() == fds)
    assert get(server.port, "/healthz") == (200, b"ok\n")


def test_a_flood_of_slow_clients_holds_bounded_threads_and_a_scrape_still_answers(
    serve: Callable[..., HealthServer],
) -> None:
    server = serve(request_timeout=60.0, max_connections=8)  # nothing times out during the test
    threads, fds = set(threading.enumerate()), open_fds()
    clients = half_requests(server.port, 200)
    code, body = get(server.port, "/metrics")
    assert code == 200 and b'deltatail_versions_behind{table="orders"} 0.0' in body
    assert get(server.port, "/readyz")[0] == 503  # the failed table
    # Each held connection is one thread and one descriptor on the server's side, at most 8 of them.
    assert poll(lambda: len(new_request_threads(threads)) <= 8), new_request_threads(threads)
    assert poll(lambda: open_fds() <= fds + len(clients) + 8), open_fds()
    for c in clients[:150]:  # the oldest were closed by the server to make room (a read blocks if not)
        c.settimeout(5)
        assert c.recv(100) == b""
    for c in clients:
        c.close()
    assert poll(lambda: not new_request_threads(threads)), new_request_threads(threads)
    assert poll(lambda: open_fds() == fds)


CHILD = textwrap.dedent(
    """
    import sys
    from deltatail.tailer.follow.stats import TableState, TableStats
    from deltatail.tailer.serve.http import HealthServer
    tables = [TableStats(f"/lake/t{i}", f"t{i}", state=TableState.FOLLOWING) for i in range(1500)]
    for t in tables:
        t.rows.update({"insert": 1, "delete": 2, "update_preimage": 3, "update_postimage": 4})
    server = HealthServer("127.0.0.1", 0, lambda: tables, request_timeout=0.3)
    server.start()
    print(server.port, flush=True)
    sys.stdin.read()
    server.close()
    """
)


def _reset(sock: socket.socket) -> None:
    """Close with a reset (RST), as a client killed or timing out does."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


@pytest.mark.slow
def test_clients_that_hang_up_write_nothing_to_stderr() -> None:
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD], cwd=ROOT, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        for _ in range(5):
            s = socket.create_connection(("127.0.0.1", port), timeout=10)  # mid-response: /metrics is megabytes
            s.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
            assert s.recv(64).startswith(b"HTTP/1.0 200")
            _reset(s)
            s = socket.create_connection(("127.0.0.1", port), timeout=10)  # mid-request
            s.sendall(b"GET /metr")
            _reset(s)
            s = socket.create_connection(("127.0.0.1", port), timeout=10)  # a request that never ends
            s.sendall(HALF_REQUEST)
            assert s.recv(10) == b""
            s.close()
        assert get(port, "/healthz") == (200, b"ok\n")
        proc.stdin.close()
        assert proc.wait(30) == 0
        assert proc.stderr is not None and proc.stderr.read() == b""
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_the_detailed_endpoints_need_the_token(serve: Callable[..., HealthServer]) -> None:
    port = serve(auth_token=TOKEN).port
    for token in (None, "wrong", TOKEN + "x", TOKEN[:-1]):
        code, body = get(port, "/metrics", token)
        assert code == 401 and b"deltatail" not in body
        code, body = get(port, "/readyz", token)
        assert code == 503 and json.loads(body) == {"ready": False}  # the probe's answer, no names nor errors
    code, body = get(port, "/metrics", TOKEN)
    assert code == 200 and b'deltatail_versions_behind{table="orders"}' in body
    code, body = get(port, "/readyz", TOKEN)
    assert code == 503 and json.loads(body)["not_ready"] == ["refunds: failed: boom in refunds (0s behind)"]
    assert get(port, "/healthz") == (200, b"ok\n")


def test_without_a_token_everything_is_open(serve: Callable[..., HealthServer]) -> None:
    port = serve().port
    assert get(port, "/metrics")[0] == 200
    assert b"boom in refunds" in get(port, "/readyz")[1]


def test_the_token_comes_from_a_file_or_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    secret = tmp_path / "token"
    secret.write_text(TOKEN + "\n")
    assert load_auth_token(str(secret), None) == TOKEN
    monkeypatch.setenv("DT_TOKEN", TOKEN)
    assert load_auth_token(None, "DT_TOKEN") == TOKEN
    assert load_auth_token(None, None) is None
    config = tmp_path / "serve.toml"
    config.write_text(
        f'[service]\nstate_root = "{tmp_path}"\nauth_token_file = "{secret}"\n[[discover]]\nroot = "{tmp_path}"\n'
    )
    loaded = load_serve_config(str(config))
    assert loaded.auth_token == TOKEN and TOKEN not in repr(loaded)


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("both", "not both"),
        ("missing-env", "environment variable DT_UNSET_TOKEN is not set"),
        ("directory", "cannot read it"),
        ("empty", "is empty"),
    ],
)
def test_bad_token_settings_are_refused(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, message: str
) -> None:
    monkeypatch.delenv("DT_UNSET_TOKEN", raising=False)
    secret = tmp_path / "token"
    secret.write_text(TOKEN)
    (tmp_path / "empty").write_text("\n")
    args = {
        "both": (str(secret), "DT_TOKEN"),
        "missing-env": (None, "DT_UNSET_TOKEN"),
        "directory": (str(tmp_path), None),
        "empty": (str(tmp_path / "empty"), None),
    }[where]
    with pytest.raises(ConfigError, match=message) as e:
        load_auth_token(*args)
    assert TOKEN not in str(e.value)


def test_a_port_out_of_range_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match=r"cannot listen on 127\.0\.0\.1:99999"):
        HealthServer("127.0.0.1", 99999, list)


def test_rows_already_held_and_accepted_sink_gaps_are_exported() -> None:
    held = TableStats("/lake/orders", "orders", state=TableState.FOLLOWING, rows_held=22, sink_gaps=1)
    server = HealthServer("127.0.0.1", 0, lambda: [held], 60.0)
    server.start()
    try:
        code, body = get(server.port, "/metrics")
    finally:
        server.close()
    assert code == 200
    lines = body.decode().splitlines()
    assert 'deltatail_rows_already_held_total{table="orders"} 22.0' in lines
    assert 'deltatail_sink_gaps_total{table="orders"} 1.0' in lines


SHORT_OF_DESCRIPTORS = textwrap.dedent(
    """
    import os, resource, sys, time
    from deltatail.tailer.serve.http import HealthServer
    server = HealthServer("127.0.0.1", 0, list)
    server.start()
    held = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    try:
        while True:
            held.append(os.open(os.devnull, os.O_RDONLY))  # every descriptor taken: accept() fails with EMFILE
    except OSError:
        pass
    print(server.port, flush=True)
    sys.stdin.readline()  # a client is connecting now
    start = time.process_time()
    time.sleep(3)
    print(time.process_time() - start, flush=True)
    """
)


@pytest.mark.slow  # a fixed window of seconds watched in a child process: CI runs it, not the quick loop
def test_a_server_out_of_descriptors_does_not_spin() -> None:
    """Before: the listening socket stayed readable while accept() failed, and the loop spun a core."""
    proc = subprocess.Popen(
        [sys.executable, "-c", SHORT_OF_DESCRIPTORS],
        cwd=ROOT,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdin is not None
        port = int(proc.stdout.readline())
        client = socket.create_connection(("127.0.0.1", port), timeout=10)  # queued by the kernel, not accepted
        proc.stdin.write("go\n")
        proc.stdin.flush()
        cpu_seconds = float(proc.stdout.readline())
        client.close()
        assert cpu_seconds < 0.5, f"{cpu_seconds:.2f} s of CPU in 3 s with a connection that cannot be accepted"
    finally:
        proc.kill()
        proc.wait()
