"""A stand-in for an Iceberg REST catalog: the calls pyiceberg's ``RestCatalog`` makes to find a table.

No Iceberg REST catalog server can be installed on these machines (the reference one, Polaris,
Gravitino, Nessie and Lakekeeper are JVM or Rust services, none published as a Python package), so
the tests start this one: a threaded HTTP server on 127.0.0.1 in front of a pyiceberg SQL catalog
on SQLite (the real catalog the tables are written through), implementing the part of the Iceberg
REST catalog OpenAPI spec (``rest-catalog-open-api.yaml``) that loading a table uses:

- ``GET /v1/config``: ``{"defaults": {}, "overrides": {}}`` (a ``CatalogConfig``; no ``endpoints``,
  so the client takes the spec's default set);
- ``GET /v1/namespaces``: ``{"namespaces": [[NS], ...]}``;
- ``GET /v1/namespaces/{namespace}/tables``: ``{"identifiers": [{"namespace": [NS], "name": T}]}``;
- ``GET /v1/namespaces/{namespace}/tables/{table}``: a ``LoadTableResult``, ``{"metadata-location",
  "metadata", "config": {}}``, the metadata being the current metadata file's JSON as written;
- errors as the spec's ``ErrorModel``: ``{"error": {"message", "type", "code"}}``, ``404``
  ``NoSuchTableException``/``NoSuchNamespaceException``, ``401`` ``NotAuthorizedException`` when a
  ``token`` is set and a request lacks ``Authorization: Bearer TOKEN``.

``requests`` records ``(method, path, Authorization header)`` of every request; ``stop``/``start``
simulate an outage on the same port; ``failing`` makes every table load a ``500``
``ServiceFailureException``.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError


class RestCatalogStandIn:
    """The stand-in catalog (see the module docstring) serving ``catalog``'s tables; ``uri`` once started."""

    def __init__(self, catalog: SqlCatalog, token: str | None = None) -> None:
        self.catalog = catalog
        self.token = token
        self.requests: list[tuple[str, str, str | None]] = []
        self.port = 0
        self.failing = False
        self._server: ThreadingHTTPServer | None = None
        self._lock = threading.Lock()

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> RestCatalogStandIn:
        server = ThreadingHTTPServer(("127.0.0.1", self.port), _handler(self))
        server.daemon_threads = True
        self.port = server.server_address[1]
        self._server = server
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def answer(self, method: str, path: str, auth: str | None) -> tuple[int, dict[str, Any]]:
        """The status and JSON body of one request."""
        with self._lock:
            self.requests.append((method, path, auth))
        if self.token is not None and auth != f"Bearer {self.token}":
            return _error(401, "NotAuthorizedException", "not authorized")
        parts = [unquote(p) for p in path.strip("/").split("/")]
        if parts == ["v1", "config"]:
            return 200, {"defaults": {}, "overrides": {}}
        if parts == ["v1", "namespaces"]:
            return 200, {"namespaces": [list(ns) for ns in self.catalog.list_namespaces()]}
        if len(parts) == 4 and parts[:2] == ["v1", "namespaces"] and parts[3] == "tables":
            return self._list(parts[2])
        if len(parts) == 5 and parts[:2] == ["v1", "namespaces"] and parts[3] == "tables":
            return self._load(parts[2], parts[4])
        return _error(404, "NotFoundException", f"no route {path}")

    def _list(self, namespace: str) -> tuple[int, dict[str, Any]]:
        try:
            found = self.catalog.list_tables(namespace)
        except NoSuchNamespaceError:
            return _error(404, "NoSuchNamespaceException", f"no namespace {namespace}")
        return 200, {"identifiers": [{"namespace": list(t[:-1]), "name": t[-1]} for t in found]}

    def _load(self, namespace: str, name: str) -> tuple[int, dict[str, Any]]:
        if self.failing:
            return _error(500, "ServiceFailureException", "the catalog's store is down")
        try:
            table = self.catalog.load_table(f"{namespace}.{name}")
        except (NoSuchTableError, NoSuchNamespaceError):
            return _error(404, "NoSuchTableException", f"no table {namespace}.{name}")
        location = table.metadata_location
        metadata = json.loads(Path(location.split("://", 1)[-1]).read_text())
        return 200, {"metadata-location": location, "metadata": metadata, "config": {}}


def _error(code: int, kind: str, message: str) -> tuple[int, dict[str, Any]]:
    return code, {"error": {"message": message, "type": kind, "code": code}}


def _handler(catalog: RestCatalogStandIn) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            code, body = catalog.answer("GET", urlsplit(self.path).path, self.headers.get("Authorization"))
            data = json.dumps(body).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

        def log_message(self, format: str, *args: Any) -> None:  # quiet
            return

    return Handler
