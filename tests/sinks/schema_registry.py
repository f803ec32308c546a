"""A stand-in for Confluent's Schema Registry: the REST calls deltatail and confluent-kafka's client make.

No Schema Registry server can be installed on these machines (Confluent's and Apicurio's are JVM
services, Karapace is not published as a package), so the Avro tests start this one: a threaded
HTTP server on 127.0.0.1, memory only, implementing the parts of Confluent's REST API used
("Schema Registry API Reference"):

- ``POST /subjects/{subject}/versions`` ``{"schema": TEXT[, "schemaType": "AVRO"]}``: register; the
  same schema again answers its existing id; a schema the subject's compatibility rule refuses is
  ``409`` (``error_code`` 409), an unparsable one ``422`` (42201);
- ``GET /schemas/ids/{id}``: ``{"schema": TEXT}`` (40403 when unknown);
- ``GET /subjects/{subject}/versions``: the version numbers; ``.../versions/latest`` and
  ``.../versions/{n}``: ``{"subject", "version", "id", "schema"}``;
- ``GET``/``PUT /config`` and ``/config/{subject}``: ``{"compatibilityLevel": ...}`` (``PUT`` takes
  ``{"compatibility": ...}``; a subject without its own level answers 40408 unless
  ``defaultToGlobal=true``);
- ``POST /compatibility/subjects/{subject}/versions/latest``: ``{"is_compatible": bool}``.

Compatibility levels ``NONE``, ``BACKWARD`` (the default, as Confluent's), ``FORWARD``, ``FULL`` and
their ``_TRANSITIVE`` forms, checked with Avro's schema resolution rules (the Avro specification,
"Schema Resolution"): a reader can read a writer's data when records match by full name and every
reader field is in the writer's record (with a type it can read) or has a default, enums keep
the writer's symbols, unions and promotions (int to long, float, double; long to float, double;
float to double; string and bytes) resolve. Optional HTTP basic auth (``user``, ``password``):
any other request is ``401``. ``requests`` counts the requests served, ``stop``/``start`` simulate
an outage on the same port.
"""

from __future__ import annotations

import base64
import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import fastavro

_PROMOTIONS = {
    ("int", "long"), ("int", "float"), ("int", "double"), ("long", "float"), ("long", "double"),
    ("float", "double"), ("string", "bytes"), ("bytes", "string"),
}  # fmt: skip
_PRIMITIVE = {"null", "boolean", "int", "long", "float", "double", "bytes", "string"}


class SchemaRegistry:
    """The stand-in registry (see the module docstring); ``url`` once started."""

    def __init__(self, user: str | None = None, password: str | None = None) -> None:
        self.user, self.password = user, password
        self.schemas: list[str] = []  # id - 1 -> schema text
        self.subjects: dict[str, list[int]] = {}  # subject -> schema id per version
        self.config: dict[str, str] = {}
        self.global_level = "BACKWARD"
        self.requests: list[tuple[str, str, str | None]] = []  # method, path, Authorization header
        self.lock = threading.Lock()
        self.port = 0
        self._server: ThreadingHTTPServer | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        registry = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_GET(self) -> None:
                self._answer("GET")

            def do_POST(self) -> None:
                self._answer("POST")

            def do_PUT(self) -> None:
                self._answer("PUT")

            def _answer(self, method: str) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                status, answer = registry.handle(method, self.path, body, self.headers.get("Authorization"))
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/vnd.schemaregistry.v1+json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self._server = ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        self._server.daemon_threads = True
        self.port = self._server.server_address[1]
        threading.Thread(target=self._server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    # -- the API ------------------------------------------------------------------

    def handle(self, method: str, path: str, body: Any, auth: str | None) -> tuple[int, Any]:
        with self.lock:
            parts = urlsplit(path)
            self.requests.append((method, parts.path, auth))
            if self.user is not None and auth != _basic(self.user, self.password or ""):
                return 401, {"error_code": 401, "message": "Unauthorized"}
            query = parse_qs(parts.query)
            route = [unquote(p) for p in parts.path.strip("/").split("/")]
            return self._route(method, route, body, query)

    def _route(self, method: str, route: list[str], body: Any, query: dict[str, list[str]]) -> tuple[int, Any]:
        match (method, route):
            case ("POST", ["subjects", subject, "versions"]):
                return self._register(subject, body)
            case ("GET", ["schemas", "ids", number]) if number.isdigit():
                if not 0 < int(number) <= len(self.schemas):
                    return 404, {"error_code": 40403, "message": "Schema not found"}
                return 200, {"schema": self.schemas[int(number) - 1]}
            case ("GET", ["subjects", subject, "versions"]):
                if subject not in self.subjects:
                    return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
                return 200, list(range(1, len(self.subjects[subject]) + 1))
            case ("GET", ["subjects", subject, "versions", version]):
                return self._version(subject, version)
            case ("GET", ["config"]):
                return 200, {"compatibilityLevel": self.global_level}
            case ("PUT", ["config"]):
                self.global_level = body["compatibility"]
                return 200, {"compatibility": self.global_level}
            case ("GET", ["config", subject]):
                if subject in self.config or query.get("defaultToGlobal") == ["true"]:
                    return 200, {"compatibilityLevel": self.config.get(subject, self.global_level)}
                message = f"Subject '{subject}' does not have subject-level compatibility configured"
                return 404, {"error_code": 40408, "message": message}
            case ("PUT", ["config", subject]):
                self.config[subject] = body["compatibility"]
                return 200, {"compatibility": body["compatibility"]}
            case ("POST", ["compatibility", "subjects", subject, "versions", "latest"]):
                problems = self._problems(subject, json.loads(body["schema"]))
                return 200, {"is_compatible": not problems, "messages": problems}
        return 404, {"error_code": 404, "message": f"no route {method} /{'/'.join(route)}"}

    def _register(self, subject: str, body: Any) -> tuple[int, Any]:
        text = body["schema"]
        try:
            schema = json.loads(text)
            fastavro.parse_schema(schema)
        except Exception as e:
            return 422, {"error_code": 42201, "message": f"Invalid schema: {e}"}
        canonical = json.dumps(schema, sort_keys=True)
        for version_id in self.subjects.get(subject, []):
            if json.dumps(json.loads(self.schemas[version_id - 1]), sort_keys=True) == canonical:
                return 200, {"id": version_id}
        problems = self._problems(subject, schema)
        if problems:
            message = (
                f'Schema being registered is incompatible with an earlier schema for subject "{subject}", '
                f"details: {problems}"
            )
            return 409, {"error_code": 409, "message": message}
        existing = [i for i, s in enumerate(self.schemas, 1) if json.dumps(json.loads(s), sort_keys=True) == canonical]
        if existing:
            schema_id = existing[0]
        else:
            self.schemas.append(text)
            schema_id = len(self.schemas)
        self.subjects.setdefault(subject, []).append(schema_id)
        return 200, {"id": schema_id}

    def _version(self, subject: str, version: str) -> tuple[int, Any]:
        versions = self.subjects.get(subject)
        if not versions:
            return 404, {"error_code": 40401, "message": f"Subject '{subject}' not found."}
        number = len(versions) if version == "latest" else int(version)
        if not 0 < number <= len(versions):
            return 404, {"error_code": 40402, "message": f"Version {version} not found."}
        schema_id = versions[number - 1]
        return 200, {"subject": subject, "version": number, "id": schema_id, "schema": self.schemas[schema_id - 1]}

    def _problems(self, subject: str, new: Any) -> list[str]:
        level = self.config.get(subject, self.global_level)
        versions = self.subjects.get(subject, [])
        if level == "NONE" or not versions:
            return []
        olds = [json.loads(self.schemas[i - 1]) for i in (versions if level.endswith("_TRANSITIVE") else versions[-1:])]
        problems: list[str] = []
        for old in olds:
            if level.startswith(("BACKWARD", "FULL")):
                problems += [f"BACKWARD: {p}" for p in can_read(new, old)]
            if level.startswith(("FORWARD", "FULL")):
                problems += [f"FORWARD: {p}" for p in can_read(old, new)]
        return problems


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()


# -- Avro schema resolution ----------------------------------------------------------


def _names(schema: Any, namespace: str, out: dict[str, Any]) -> dict[str, Any]:
    """Every named type of ``schema`` by full name."""
    if isinstance(schema, list):
        for branch in schema:
            _names(branch, namespace, out)
    elif isinstance(schema, dict):
        kind = schema["type"]
        if kind in ("record", "enum", "fixed"):
            full = _full(schema, namespace)
            out[full] = schema
            namespace = full.rpartition(".")[0]
        if kind == "record":
            for f in schema["fields"]:
                _names(f["type"], namespace, out)
        elif kind == "array":
            _names(schema["items"], namespace, out)
        elif kind == "map":
            _names(schema["values"], namespace, out)
        elif isinstance(kind, dict | list):
            _names(kind, namespace, out)
    return out


def _full(schema: dict[str, Any], namespace: str) -> str:
    name = schema["name"]
    if "." in name:
        return str(name)
    space = schema.get("namespace", namespace)
    return f"{space}.{name}" if space else str(name)


def can_read(reader: Any, writer: Any) -> list[str]:
    """Why data written with ``writer`` cannot be read with ``reader`` (empty: it can)."""
    return _Resolver(_names(reader, "", {}), _names(writer, "", {})).check(reader, writer, "")


class _Resolver:
    def __init__(self, reader_names: dict[str, Any], writer_names: dict[str, Any]) -> None:
        self.r, self.w = reader_names, writer_names
        self.seen: set[tuple[str, str]] = set()

    def _deref(self, schema: Any, names: dict[str, Any]) -> Any:
        if isinstance(schema, str) and schema not in _PRIMITIVE:
            found = names.get(schema) or next((v for k, v in names.items() if k.rpartition(".")[2] == schema), None)
            return found if found is not None else schema
        if isinstance(schema, dict) and isinstance(schema["type"], str | list) and schema["type"] in _PRIMITIVE:
            return schema["type"]
        return schema

    def check(self, reader: Any, writer: Any, where: str) -> list[str]:
        reader, writer = self._deref(reader, self.r), self._deref(writer, self.w)
        if isinstance(writer, list):
            return [p for branch in writer for p in self.check(reader, branch, where)]
        if isinstance(reader, list):
            if any(not self.check(branch, writer, where) for branch in reader):
                return []
            return [f"{where or 'the root'}: no branch of the reader's union reads the writer's {_kind(writer)}"]
        rk, wk = _kind(reader), _kind(writer)
        if rk != wk:
            if (wk, rk) in _PROMOTIONS:
                return []
            return [f"{where or 'the root'}: the reader's {rk} cannot read the writer's {wk}"]
        if rk == "record":
            return self._records(reader, writer, where)
        if rk == "array":
            return self.check(reader["items"], writer["items"], where + "[]")
        if rk == "map":
            return self.check(reader["values"], writer["values"], where + "{}")
        if rk == "enum":
            missing = set(writer["symbols"]) - set(reader["symbols"])
            if missing and "default" not in reader:
                return [f"{where}: the reader's enum lacks {sorted(missing)}"]
            return []
        return []

    def _records(self, reader: dict[str, Any], writer: dict[str, Any], where: str) -> list[str]:
        key = (reader["name"], writer["name"])
        if key in self.seen:
            return []
        self.seen.add(key)
        problems = []
        if reader["name"].rpartition(".")[2] != writer["name"].rpartition(".")[2]:
            problems.append(f"{where or 'the root'}: record {reader['name']} is not record {writer['name']}")
        written = {f["name"]: f for f in writer["fields"]}
        for field in reader["fields"]:
            path = f"{where}.{field['name']}" if where else field["name"]
            if field["name"] in written:
                problems += self.check(field["type"], written[field["name"]]["type"], path)
            elif "default" not in field:
                problems.append(f"{path}: the reader's field has no default and the writer has no such field")
        return problems


def _kind(schema: Any) -> str:
    if isinstance(schema, str):
        return schema
    if isinstance(schema, dict):
        kind = schema["type"]
        return kind if isinstance(kind, str) else _kind(kind)
    return "union"
