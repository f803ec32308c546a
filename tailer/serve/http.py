"""Metrics and health over HTTP: ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

Per table (label ``table``): ``deltatail_versions_behind``,
``deltatail_seconds_behind`` (the lag: the age of the oldest version not yet
delivered, 0 when caught up), ``deltatail_delivered_commit_timestamp_seconds``,
``deltatail_delivered_version``,
``deltatail_rows_delivered_total`` and ``deltatail_bytes_delivered_total``
(label ``change_type``), ``deltatail_commits_total``,
``deltatail_checkpoint_age_seconds``, ``deltatail_errors_total`` (label
``kind``), ``deltatail_retries_total`` (sink or store unavailable) and
``deltatail_table_state`` (1 for the table's state, label ``state``), and for a table in an
object store ``deltatail_store_requests_total`` (the requests sent to it); each
family's help text says exactly what it counts. Process
wide: the reader processes' ``deltatail_reader_files_total`` and
``deltatail_reader_runs_total``, ``deltatail_watch_overflows_total`` (the kernel
dropped file events; every watched table was then looked at), and prometheus-client's process figures
(``process_resident_memory_bytes``, CPU seconds, open files).

``/healthz`` answers 200 while the process serves, 503 with the reason when it
cannot (``health``). ``/readyz`` answers 200
when every table is following, or catching up with a lag
(``deltatail_seconds_behind``) of at most ``ready_lag_seconds``; 503
otherwise, with the tables that are not, and why, in the body.

Bounded, quiet and optionally authenticated (one server configuration for all
three endpoints):

- Every socket has a timeout (``request_timeout``, 5 s by default): a client
  that sends half a request, or stops reading the answer, is dropped once it
  has been silent that long. One that trickles bytes to stay alive holds its
  connection only until newer ones push it out (next point).
- At most ``max_connections`` (32) connections are handled at once, each on a
  thread of its own; a connection beyond that closes the oldest one held, so a
  flood of slow clients holds at most that many threads and descriptors and a
  scrape still gets through.
- A client that hangs up early (broken pipe, reset, timeout) is logged
  nowhere; any other failure of a request is one warning line.
- With an ``auth_token``, ``/metrics`` and ``/readyz``'s body (table names,
  paths, errors) need ``Authorization: Bearer <token>`` (compared in constant
  time): without it ``/metrics`` answers 401 and ``/readyz`` only its status
  code (200 or 503) with ``{"ready": ...}``, so orchestrator probes need no
  secret. ``/healthz`` is always open. The token itself is never logged.
"""

from __future__ import annotations

import contextlib
import errno
import hmac
import json
import logging
import os
import socket
import sys
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from deltatail.state.errors import ConfigError
from deltatail.tailer.follow.stats import TableState, TableStats
from deltatail.tailer.read.reader_pool import shared_pools

log = logging.getLogger("deltatail")

#: Errors of a client that went away or stalled: nothing to report.
_HUNG_UP = (BrokenPipeError, ConnectionResetError, ConnectionAbortedError, TimeoutError)


class TableCollector(Collector):
    """Reads every table's :class:`TableStats` when scraped (the tailers only update counters)."""

    def __init__(
        self,
        tables: Callable[[], list[TableStats]],
        clock: Callable[[], float] = time.time,
        watch_overflows: Callable[[], int] = lambda: 0,
    ) -> None:
        self._tables = tables
        self._clock = clock
        self._watch_overflows = watch_overflows

    def collect(self) -> Iterator[Metric]:
        """The metric families of every table, of the reader processes and of the log watcher."""
        now = self._clock()
        behind = GaugeMetricFamily(
            "deltatail_versions_behind",
            "Versions in the table's log (as of the last look) not yet delivered to the sink",
            labels=["table"],
        )
        seconds = GaugeMetricFamily(
            "deltatail_seconds_behind",
            "Lag: seconds since the oldest version not yet delivered was committed (its file's modification "
            "time); 0 when caught up, however long the table has been idle",
            labels=["table"],
        )
        delivered_at = GaugeMetricFamily(
            "deltatail_delivered_commit_timestamp_seconds",
            "Commit time (Unix seconds) of the newest delivered version; time() minus it grows on an idle table",
            labels=["table"],
        )
        delivered = GaugeMetricFamily(
            "deltatail_delivered_version", "The newest version delivered to the sink (-1: none yet)", labels=["table"]
        )
        rows = CounterMetricFamily(
            "deltatail_rows_delivered",
            "Change rows written to the sink by this process, by change type",
            labels=["table", "change_type"],
        )
        size = CounterMetricFamily(
            "deltatail_bytes_delivered",
            "Bytes (Arrow, in memory) of the change rows written to the sink by this process, by change type",
            labels=["table", "change_type"],
        )
        commits = CounterMetricFamily(
            "deltatail_commits", "Versions delivered to the sink by this process", labels=["table"]
        )
        age = GaugeMetricFamily(
            "deltatail_checkpoint_age_seconds",
            "Seconds since this process last saved the table's cursor (absent before the first save)",
            labels=["table"],
        )
        errors = CounterMetricFamily(
            "deltatail_errors",
            "Errors raised while following the table, by error class: those that failed it and those that "
            "made it unavailable",
            labels=["table", "kind"],
        )
        retries = CounterMetricFamily(
            "deltatail_retries",
            "Times the table was started again after its sink or store was unavailable",
            labels=["table"],
        )
        held = CounterMetricFamily(
            "deltatail_rows_already_held",
            "Change rows not written because the sink already held them (an exactly-once sink read back "
            "after a restart), by this process",
            labels=["table"],
        )
        gaps = CounterMetricFamily(
            "deltatail_sink_gaps",
            "Times the sink was found holding fewer rows than the cursor says were delivered and the gap "
            "was accepted (on_sink_gap = accept); with the default (fail) the table fails instead",
            labels=["table"],
        )
        readable = GaugeMetricFamily(
            "deltatail_readable_seconds",
            "Seconds the oldest version not yet delivered stays readable at least: its commit time plus the "
            "shorter of delta.logRetentionDuration and delta.deletedFileRetentionDuration, minus now (negative: "
            "it may be cleaned up already); absent when caught up",
            labels=["table"],
        )
        losses = CounterMetricFamily(
            "deltatail_data_losses",
            "Times data the table still needed was gone (log cleaned past the cursor, files vacuumed) and "
            "on_data_loss (resnapshot or skip) went on past it",
            labels=["table"],
        )
        lost = CounterMetricFamily(
            "deltatail_versions_lost",
            "Versions whose changes were passed over by those data losses",
            labels=["table"],
        )
        store = CounterMetricFamily(
            "deltatail_store_requests",
            "Requests sent to the table's object store by this process (its cost: rate() per minute)",
            labels=["table"],
        )
        state = GaugeMetricFamily(
            "deltatail_table_state", "1 for the table's current state, 0 for the others", labels=["table", "state"]
        )
        for s in self._tables():
            t = s.name
            behind.add_metric([t], s.versions_behind)
            seconds.add_metric([t], s.seconds_behind(now))
            if s.delivered_commit_ms is not None:
                delivered_at.add_metric([t], s.delivered_commit_ms / 1000)
            delivered.add_metric([t], s.delivered_version)
            for kind, n in s.rows.items():
                rows.add_metric([t, kind], n)
            for kind, n in s.bytes.items():
                size.add_metric([t, kind], n)
            commits.add_metric([t], s.commits)
            if s.last_checkpoint is not None:
                age.add_metric([t], max(now - s.last_checkpoint, 0.0))
            for kind, n in s.errors.items():
                errors.add_metric([t, kind], n)
            retries.add_metric([t], s.retries)
            held.add_metric([t], s.rows_held)
            gaps.add_metric([t], s.sink_gaps)
            left = s.readable_seconds(now)
            if left is not None:
                readable.add_metric([t], left)
            losses.add_metric([t], s.data_losses)
            lost.add_metric([t], s.versions_lost)
            if s.store_requests is not None:
                store.add_metric([t], s.store_requests)
            for st in TableState:
                state.add_metric([t, st.value], 1.0 if s.state is st else 0.0)
        yield from (
            behind,
            seconds,
            delivered_at,
            delivered,
            rows,
            size,
            commits,
            age,
            errors,
            retries,
            held,
            gaps,
            readable,
            losses,
            lost,
            store,
            state,
        )
        files = CounterMetricFamily(
            "deltatail_reader_files", "Small data files sent to the reader processes to read, all tables"
        )
        runs = CounterMetricFamily(
            "deltatail_reader_runs", "Batches of small files (runs) sent to the reader processes, all tables"
        )
        pools = shared_pools()
        files.add_metric([], sum(p.files_sent for p in pools))
        runs.add_metric([], sum(p.runs_sent for p in pools))
        yield files
        yield runs
        overflows = CounterMetricFamily(
            "deltatail_watch_overflows",
            "Times the kernel dropped file events of the watched logs (inotify queue overflow); each time every "
            "watched table was looked at at once",
        )
        overflows.add_metric([], self._watch_overflows())
        yield overflows


def readiness(
    tables: list[TableStats], ready_lag_seconds: float, now: float, min_readable_seconds: float = 0.0
) -> list[str]:
    """Why the service is not ready: one line per table that is not following (empty: ready).

    A table catching up counts as ready while its lag (:meth:`TableStats.seconds_behind`) is at most
    ``ready_lag_seconds``. Whatever its state, a table whose oldest undelivered version stays readable
    for less than ``min_readable_seconds`` (:meth:`TableStats.readable_seconds`) is not ready: the
    table's retention will soon clean up what it still has to deliver.
    """
    problems = []
    for s in tables:
        left = s.readable_seconds(now)
        if left is not None and left < min_readable_seconds:
            problems.append(
                f"{s.name}: the oldest undelivered version (after {s.delivered_version}) stays readable "
                f"{left:.0f}s more, under min_readable_seconds ({min_readable_seconds:.0f}s)"
            )
            continue
        if s.state is TableState.FOLLOWING:
            continue
        lag = s.seconds_behind(now)
        if s.state is TableState.CATCHING_UP and lag <= ready_lag_seconds:
            continue
        why = s.state.value if s.error is None else f"{s.state.value}: {s.error}"
        problems.append(f"{s.name}: {why} ({lag:.0f}s behind)")
    return problems


class _BoundedServer(ThreadingHTTPServer):
    """A thread per connection, at most ``max_connections`` of them: a new one beyond that closes the oldest."""

    daemon_threads = True
    request_queue_size = 128  # the listen backlog: a burst of connections waits here, not in SYN retries

    def __init__(self, address: tuple[str, int], handler: Any, max_connections: int) -> None:
        super().__init__(address, handler)
        self._max = max_connections
        self._open: OrderedDict[socket.socket, None] = OrderedDict()  # oldest first
        self._open_lock = threading.Lock()

    def process_request(self, request: Any, client_address: Any) -> None:
        with self._open_lock:
            while len(self._open) >= self._max:
                oldest, _ = self._open.popitem(last=False)
                _hang_up(oldest)  # its thread's read or write ends now, and the thread closes it
            self._open[request] = None
        super().process_request(request, client_address)

    def get_request(self) -> tuple[socket.socket, Any]:
        """Accept a connection; out of descriptors or memory, wait a moment first.

        The listening socket stays readable while ``accept`` fails for want of a descriptor
        (EMFILE, ENFILE) or of memory: without the pause the server's loop would retry at once and
        spin a core for as long as the shortage lasts. The pending client is accepted when it ends.
        """
        try:
            return self.socket.accept()
        except OSError as e:
            if e.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                time.sleep(_SHORTAGE_PAUSE)
            raise

    def shutdown_request(self, request: Any) -> None:
        with self._open_lock:
            self._open.pop(request, None)
        super().shutdown_request(request)

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that hung up is no news; anything else is one line (not a traceback on stderr)."""
        error = sys.exc_info()[1]
        if isinstance(error, _HUNG_UP) or (isinstance(error, OSError) and error.errno is not None and _gone(error)):
            return
        log.warning("metrics and health: a request failed: %s: %s", type(error).__name__, error)


#: Seconds the server waits after ``accept`` failed for want of descriptors or memory.
_SHORTAGE_PAUSE = 0.2


def _gone(error: OSError) -> bool:
    return error.errno in (errno.EPIPE, errno.ECONNRESET, errno.ECONNABORTED, errno.ENOTCONN, errno.EBADF)


def _hang_up(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):  # already gone
        sock.shutdown(socket.SHUT_RDWR)


def load_auth_token(token_file: str | None, token_env: str | None, *, file: str | None = None) -> str | None:
    """The bearer token of the detailed endpoints, from a file or an environment variable (``None``: none).

    The file's content (or the variable's value) without surrounding whitespace is the token.

    Args:
        token_file: a file holding the token (e.g. a mounted secret).
        token_env: the name of an environment variable holding it.
        file: the configuration file, for errors.

    Raises:
        ConfigError: if both are given, the file cannot be read, the variable is not set, or the token
            is empty (the token never appears in the message).
    """
    if token_file is not None and token_env is not None:
        raise ConfigError("give one of [service] auth_token_file and auth_token_env, not both", file=file)
    if token_file is not None:
        try:
            with open(token_file, "rb") as fh:
                raw = fh.read(4097)
            token = raw.decode().strip()
        except (OSError, UnicodeDecodeError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else type(e).__name__
            raise ConfigError(f"[service] auth_token_file {token_file}: cannot read it: {reason}", file=file) from None
        if len(raw) > 4096:
            raise ConfigError(f"[service] auth_token_file {token_file}: longer than 4096 bytes", file=file)
        if not token:
            raise ConfigError(f"[service] auth_token_file {token_file} is empty", file=file)
        return token
    if token_env is not None:
        token = os.environ.get(token_env, "").strip()
        if not token:
            raise ConfigError(f"[service] auth_token_env: the environment variable {token_env} is not set", file=file)
        return token
    return None


class HealthServer:
    """The HTTP server of ``/metrics``, ``/healthz`` and ``/readyz`` on one address (see the module docstring).

    Args:
        host: the address to listen on (loopback by default, in the CLI).
        port: the port (0: any free one; see :attr:`port`).
        tables: the tables' figures, read on every request.
        ready_lag_seconds: how far behind a catching-up table may be and still count as ready.
        health: why the process cannot serve, or ``None`` when it can (``/healthz``).
        auth_token: the bearer token ``/metrics`` and ``/readyz``'s details need (``None``: open).
        min_readable_seconds: a table whose oldest undelivered version stays readable for less is not ready.
        request_timeout: seconds a socket may wait for the client (to send, or to take the answer).
        max_connections: connections handled at once; a new one beyond closes the oldest.

    Raises:
        ConfigError: if the address cannot be bound (in use, not local), before anything starts.
    """

    def __init__(
        self,
        host: str,
        port: int,
        tables: Callable[[], list[TableStats]],
        ready_lag_seconds: float = 300.0,
        health: Callable[[], str | None] = lambda: None,
        *,
        auth_token: str | None = None,
        min_readable_seconds: float = 0.0,
        request_timeout: float = 5.0,
        max_connections: int = 32,
        watch_overflows: Callable[[], int] = lambda: 0,
    ) -> None:
        registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        registry.register(TableCollector(tables, watch_overflows=watch_overflows))
        server = self

        class Handler(BaseHTTPRequestHandler):
            timeout = request_timeout

            def do_GET(self) -> None:
                server.handle(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.registry = registry
        self.tables = tables
        self.ready_lag_seconds = ready_lag_seconds
        self.min_readable_seconds = min_readable_seconds
        self._token = None if auth_token is None else auth_token.encode()
        self.health = health
        try:
            self._http = _BoundedServer((host, port), Handler, max_connections)
        except (OSError, OverflowError) as e:
            reason = e.strerror if isinstance(e, OSError) and e.strerror else str(e)
            raise ConfigError(f"cannot listen on {host}:{port} for metrics and health: {reason}") from None
        self.port = int(self._http.server_address[1])
        self._thread = threading.Thread(target=self._http.serve_forever, name="deltatail-http", daemon=True)

    def start(self) -> None:
        """Serve on a thread of its own."""
        self._thread.start()

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        """Answer one GET."""
        path = request.path.split("?", 1)[0]
        if path == "/metrics":
            if not self._authorized(request):
                self._unauthorized(request)
                return
            self._send(request, 200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            problem = self.health()
            body = b"ok\n" if problem is None else f"unhealthy: {problem}\n".encode()
            self._send(request, 200 if problem is None else 503, body, "text/plain")
        elif path == "/readyz":
            problems = readiness(self.tables(), self.ready_lag_seconds, time.time(), self.min_readable_seconds)
            doc: dict[str, object] = {"ready": not problems}
            if self._authorized(request):
                doc["not_ready"] = problems
            body = json.dumps(doc).encode() + b"\n"
            self._send(request, 503 if problems else 200, body, "application/json")
        else:
            self._send(request, 404, b"not found\n", "text/plain")

    def _authorized(self, request: BaseHTTPRequestHandler) -> bool:
        """No token configured, or the request carries it (compared in constant time)."""
        if self._token is None:
            return True
        scheme, _, given = (request.headers.get("Authorization") or "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), self._token)

    def _unauthorized(self, request: BaseHTTPRequestHandler) -> None:
        request.send_response(401)
        request.send_header("WWW-Authenticate", 'Bearer realm="deltatail"')
        request.send_header("Content-Type", "text/plain")
        request.send_header("Content-Length", "13")
        request.end_headers()
        request.wfile.write(b"unauthorized\n")

    @staticmethod
    def _send(request: BaseHTTPRequestHandler, code: int, body: bytes, content_type: str) -> None:
        request.send_response(code)
        request.send_header("Content-Type", content_type)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    def close(self) -> None:
        """Stop serving."""
        self._http.shutdown()
        self._http.server_close()
