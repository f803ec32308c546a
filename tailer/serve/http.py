"""Metrics and health over HTTP: ``/metrics`` (Prometheus), ``/healthz`` and ``/readyz``.

Per table (label ``table``): ``deltatail_versions_behind``,
``deltatail_seconds_behind``, ``deltatail_delivered_version``,
``deltatail_rows_delivered_total`` and ``deltatail_bytes_delivered_total``
(label ``change_type``), ``deltatail_commits_total``,
``deltatail_checkpoint_age_seconds``, ``deltatail_errors_total`` (label
``kind``), ``deltatail_retries_total`` (sink or store unavailable) and
``deltatail_table_state`` (1 for the table's state, label ``state``). Process
wide: the reader processes' ``deltatail_reader_files_total`` and
``deltatail_reader_runs_total``, and prometheus-client's process figures
(``process_resident_memory_bytes``, CPU seconds, open files).

``/healthz`` answers 200 while the process serves, 503 with the reason when it
cannot (``health``). ``/readyz`` answers 200 when every table is following, or catching up with its newest delivered
commit at most ``ready_lag_seconds`` old; 503 otherwise, with the tables that
are not, and why, in the body.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, PlatformCollector, ProcessCollector
from prometheus_client.exposition import generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from state.errors import ConfigError
from tailer.follow.stats import TableState, TableStats
from tailer.read.reader_pool import shared_pools


class TableCollector(Collector):
    """Reads every table's :class:`TableStats` when scraped (the tailers only update counters)."""

    def __init__(self, tables: Callable[[], list[TableStats]], clock: Callable[[], float] = time.time) -> None:
        self._tables = tables
        self._clock = clock

    def collect(self) -> Iterator[Metric]:
        """The metric families of every table and of the reader processes."""
        now = self._clock()
        behind = GaugeMetricFamily(
            "deltatail_versions_behind", "Versions in the log not yet delivered", labels=["table"]
        )
        seconds = GaugeMetricFamily(
            "deltatail_seconds_behind", "Seconds since the newest delivered commit", labels=["table"]
        )
        delivered = GaugeMetricFamily("deltatail_delivered_version", "The last version delivered", labels=["table"])
        rows = CounterMetricFamily("deltatail_rows_delivered", "Change rows delivered", labels=["table", "change_type"])
        size = CounterMetricFamily(
            "deltatail_bytes_delivered", "Bytes of change rows delivered (Arrow)", labels=["table", "change_type"]
        )
        commits = CounterMetricFamily("deltatail_commits", "Versions delivered", labels=["table"])
        age = GaugeMetricFamily(
            "deltatail_checkpoint_age_seconds", "Seconds since the last checkpoint", labels=["table"]
        )
        errors = CounterMetricFamily("deltatail_errors", "Errors that stopped the table", labels=["table", "kind"])
        retries = CounterMetricFamily("deltatail_retries", "Restarts on an unavailable sink or store", labels=["table"])
        state = GaugeMetricFamily("deltatail_table_state", "1 for the table's state", labels=["table", "state"])
        for s in self._tables():
            t = s.name
            behind.add_metric([t], s.versions_behind)
            seconds.add_metric([t], s.seconds_behind(now))
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
            for st in TableState:
                state.add_metric([t, st.value], 1.0 if s.state is st else 0.0)
        yield from (behind, seconds, delivered, rows, size, commits, age, errors, retries, state)
        files = CounterMetricFamily("deltatail_reader_files", "Small files read by the reader processes")
        runs = CounterMetricFamily("deltatail_reader_runs", "Runs sent to the reader processes")
        pools = shared_pools()
        files.add_metric([], sum(p.files_sent for p in pools))
        runs.add_metric([], sum(p.runs_sent for p in pools))
        yield files
        yield runs


def readiness(tables: list[TableStats], ready_lag_seconds: float, now: float) -> list[str]:
    """Why the service is not ready: one line per table that is not following (empty: ready)."""
    problems = []
    for s in tables:
        if s.state is TableState.FOLLOWING:
            continue
        lag = s.seconds_behind(now)
        if s.state is TableState.CATCHING_UP and lag <= ready_lag_seconds:
            continue
        why = s.state.value if s.error is None else f"{s.state.value}: {s.error}"
        problems.append(f"{s.name}: {why} ({lag:.0f}s behind)")
    return problems


class HealthServer:
    """The HTTP server of ``/metrics``, ``/healthz`` and ``/readyz`` on one address.

    Args:
        host: the address to listen on (loopback by default, in the CLI).
        port: the port (0: any free one; see :attr:`port`).
        tables: the tables' figures, read on every request.
        ready_lag_seconds: how far behind a catching-up table may be and still count as ready.
        health: why the process cannot serve, or ``None`` when it can (``/healthz``).

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
    ) -> None:
        registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=registry)
        PlatformCollector(registry=registry)
        registry.register(TableCollector(tables))
        server = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                server.handle(self)

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.registry = registry
        self.tables = tables
        self.ready_lag_seconds = ready_lag_seconds
        self.health = health
        try:
            self._http = ThreadingHTTPServer((host, port), Handler)
        except OSError as e:
            raise ConfigError(f"cannot listen on {host}:{port} for metrics and health: {e.strerror or e}") from None
        self._http.daemon_threads = True
        self.port = int(self._http.server_address[1])
        self._thread = threading.Thread(target=self._http.serve_forever, name="deltatail-http", daemon=True)

    def start(self) -> None:
        """Serve on a thread of its own."""
        self._thread.start()

    def handle(self, request: BaseHTTPRequestHandler) -> None:
        """Answer one GET."""
        path = request.path.split("?", 1)[0]
        if path == "/metrics":
            self._send(request, 200, generate_latest(self.registry), CONTENT_TYPE_LATEST)
        elif path == "/healthz":
            problem = self.health()
            body = b"ok\n" if problem is None else f"unhealthy: {problem}\n".encode()
            self._send(request, 200 if problem is None else 503, body, "text/plain")
        elif path == "/readyz":
            problems = readiness(self.tables(), self.ready_lag_seconds, time.time())
            body = json.dumps({"ready": not problems, "not_ready": problems}).encode() + b"\n"
            self._send(request, 503 if problems else 200, body, "application/json")
        else:
            self._send(request, 404, b"not found\n", "text/plain")

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
