"""Every action of the Delta protocol as an immutable, slotted value; parsed here and only here.

The values never change once built. Most are frozen dataclasses; the three built once per action
of a log (``Add``, ``Remove``, ``CommitInfo``), like ``Commit`` and the audit event's records,
declare every field ``Final`` instead: strict mypy refuses an assignment, and construction costs
a plain dataclass's (``frozen=True`` sets each field through ``object.__setattr__``, several times
dearer on the path every action of a log takes).

Protocol, "Actions": a commit file is newline-delimited JSON, one action per
line, each an object with a single key naming the action. The newer revision
adds: "readers MUST ignore unknown actions and unknown fields" — both are
ignored here. Paths in ``add``, ``remove`` and ``cdc`` "are URIs as specified
by RFC 2396 ... which need to be decoded to get the data file path": they are
percent-decoded once, here, and every other module sees decoded paths.

Parsing is strict about what the protocol types: a required field that is
missing or null, or a field of the wrong JSON type (``"dataChange": 1``,
``"size": "10"``, ``"size": 1.0``), is an :class:`~state.errors.InvalidLogError`
naming the action and the field; the readers of log files add the table,
version and file. Nothing is coerced: a wrong value would otherwise change
change rows silently.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, TypeAlias
from urllib.parse import unquote

import orjson

from state.errors import DeletionVectorError, InvalidLogError
from state.paths import resolve_logged_path
from state.schema import StructType, parse_schema
from state.z85 import z85_decode


def decode_path(raw: str) -> str:
    """Decode a file action's path: percent-decoding, and ``file:`` URIs of local files made plain paths.

    Protocol: the path "is a URI as specified by RFC 2396 URI Generic Syntax,
    which needs to be decoded to get the data file path". Delta Spark qualifies
    paths before reconciling, so ``file:/x``, ``file:///x`` and ``/x`` name one
    file; deltatail canonicalizes the ``file:`` forms to ``/x`` here.
    """
    if "%" not in raw and not raw.startswith("file:"):
        return raw  # most paths: nothing to decode
    path = unquote(raw)
    if path.startswith("file:///"):
        return path[len("file://") :]
    if path.startswith("file://localhost/"):
        return path[len("file://localhost") :]
    if path.startswith("file:/") and not path.startswith("file://"):
        return path[len("file:") :]
    return path  # another host's file: URI stays a URI (absolute), never a relative path


# -- field validation -----------------------------------------------------------------------------
#
# Every field the protocol types is checked here for its JSON type (JSON ``true``/``false`` for a
# Boolean, an integer inside the 64-bit range for a Long, 32-bit for an Int, a string, an object of
# strings for a Map[String, String], an array of strings) and every required field for presence.
# ``null`` counts as absent: writers put ``null`` where a field has no value (delta-rs writes
# ``"baseRowId": null``), and Parquet checkpoints hold a null for every absent field. Unknown
# fields are never looked at ("readers MUST ignore unknown fields").
#
# Each action's fields are declared once as a schema (the ``_*_SCHEMA`` tables below). The parsers of
# ``add``, ``remove`` and the DV descriptor, which run once per file of a table, test their fields
# inline and consult the schema only to word the error; the other actions are validated against
# their schema directly.

_MIN_LONG, _MAX_LONG = -(2**63), 2**63 - 1
_MIN_INT, _MAX_INT = -(2**31), 2**31 - 1
_STORAGE_TYPES = ("u", "i", "p")

_Check: TypeAlias = Callable[[Any], "str | None"]
"""A field check: ``None`` when the (non-null) value is of the field's type, else what is wrong."""


def _shown(value: Any) -> str:
    """A value as a message shows it: its JSON kind and, for scalars, a short rendering."""
    if value is None:
        return "null"
    if type(value) is bool:
        return f"the boolean {'true' if value else 'false'}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {text!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _long(value: Any) -> str | None:
    if type(value) is not int:
        return f"must be a long (a JSON integer), got {_shown(value)}"
    if not _MIN_LONG <= value <= _MAX_LONG:
        return f"must be a long, got {value}, outside the 64-bit range"
    return None


def _int(value: Any) -> str | None:
    if type(value) is not int:
        return f"must be an int (a JSON integer), got {_shown(value)}"
    if not _MIN_INT <= value <= _MAX_INT:
        return f"must be an int, got {value}, outside the 32-bit range"
    return None


def _boolean(value: Any) -> str | None:
    return None if type(value) is bool else f"must be a boolean (true or false), got {_shown(value)}"


def _string(value: Any) -> str | None:
    return None if type(value) is str else f"must be a string, got {_shown(value)}"


def _string_map(value: Any) -> str | None:
    if type(value) is not dict:
        return f"must be a map (a JSON object of strings), got {_shown(value)}"
    for key, item in value.items():
        if type(key) is not str:
            return f"must be a map with string keys, got the key {key!r}"
        if item is not None and type(item) is not str:
            return f"must map strings to strings or null, but maps {key!r} to {_shown(item)}"
    return None


def _strict_string_map(value: Any) -> str | None:
    problem = _string_map(value)
    if problem is None:
        for key, item in value.items():
            if item is None:
                return f"must map strings to strings, but maps {key!r} to null"
    return problem


def _strings(value: Any) -> str | None:
    if type(value) is not list:
        return f"must be an array of strings, got {_shown(value)}"
    for i, item in enumerate(value):
        if type(item) is not str:
            return f"must be an array of strings, but element {i} is {_shown(item)}"
    return None


def _storage_type(value: Any) -> str | None:
    if type(value) is not str or value not in _STORAGE_TYPES:
        return f"must be 'u', 'i' or 'p', got {_shown(value)}"
    return None


_Schema: TypeAlias = dict[str, tuple["_Check | _Schema", bool]]
"""Field name -> (its check, or the schema of a nested struct; whether it is required)."""


def _first_problem(body: dict[str, Any], schema: _Schema, prefix: str = "") -> tuple[str, str] | None:
    """The first field of ``body`` that breaks ``schema``, as ``(dotted field name, what is wrong)``."""
    for name, (check, required) in schema.items():
        value = body.get(name)
        where = prefix + name
        if value is None:
            if required:
                return where, "is required but missing" if name not in body else "is required but null"
            continue
        if isinstance(check, dict):
            if type(value) is not dict:
                return where, f"must be an object, got {_shown(value)}"
            found = _first_problem(value, check, where + ".")
        else:
            problem = check(value)
            found = None if problem is None else (where, problem)
        if found is not None:
            return found
    return None


def _invalid(action: str, body: Any, schema: _Schema) -> InvalidLogError:
    """The error for an ``action`` whose ``body`` breaks ``schema``, naming the action and the field."""
    if type(body) is not dict:
        return InvalidLogError(f"{action} action must be a JSON object, got {_shown(body)}")
    found = _first_problem(body, schema)
    if found is None:  # an inline check refused what the schema allows: say so rather than guess a field
        return InvalidLogError(f"{action} action is malformed")
    field_name, problem = found
    return InvalidLogError(f"{action} action: field {field_name!r} {problem}")


def _validate(action: str, body: Any, schema: _Schema) -> dict[str, Any]:
    """``body`` itself when it is an object that satisfies ``schema``.

    Raises:
        InvalidLogError: naming the action and the first offending field.
    """
    if type(body) is not dict or _first_problem(body, schema) is not None:
        raise _invalid(action, body, schema)
    return body


def _nullable_strings(values: dict[str, Any]) -> bool:
    """Whether every value of a (JSON object) map is a string or null."""
    for value in values.values():  # noqa: SIM110 - a loop is twice as fast as all() over a generator here
        if value is not None and type(value) is not str:
            return False
    return True


_DV_SCHEMA: _Schema = {
    "storageType": (_storage_type, True),
    "pathOrInlineDv": (_string, True),
    "offset": (_int, False),
    "sizeInBytes": (_int, True),
    "cardinality": (_long, True),
}
_ADD_SCHEMA: _Schema = {
    "path": (_string, True),
    "partitionValues": (_string_map, True),
    "size": (_long, True),
    "modificationTime": (_long, True),
    "dataChange": (_boolean, True),
    "stats": (_string, False),
    "tags": (_string_map, False),
    "deletionVector": (_DV_SCHEMA, False),
    "baseRowId": (_long, False),
    "defaultRowCommitVersion": (_long, False),
    "clusteringProvider": (_string, False),
}
_REMOVE_SCHEMA: _Schema = {
    "path": (_string, True),
    "deletionTimestamp": (_long, False),
    "dataChange": (_boolean, True),
    "extendedFileMetadata": (_boolean, False),
    "partitionValues": (_string_map, False),
    "size": (_long, False),
    "stats": (_string, False),
    "tags": (_string_map, False),
    "deletionVector": (_DV_SCHEMA, False),
    "baseRowId": (_long, False),
    "defaultRowCommitVersion": (_long, False),
}
_CDC_SCHEMA: _Schema = {
    "path": (_string, True),
    "partitionValues": (_string_map, True),
    "size": (_long, True),
    "dataChange": (_boolean, True),
    "tags": (_string_map, False),
}
# configuration and format options are Map[String, String] with no null values: a null would reach
# code that reads a setting as a string (delta.enableChangeDataFeed ...).
_FORMAT_SCHEMA: _Schema = {"provider": (_string, True), "options": (_strict_string_map, False)}
# schemaString is required by the protocol, but real tables of the corpus (delta-rs/delta-live-table,
# delta-golden/deltalog-commit-info ...) omit it; its absence is reported when the schema is needed
# (Metadata.schema), so that such a log can still be followed for its file actions.
_METADATA_SCHEMA: _Schema = {
    "id": (_string, True),
    "name": (_string, False),
    "description": (_string, False),
    "format": (_FORMAT_SCHEMA, True),
    "schemaString": (_string, False),
    "partitionColumns": (_strings, True),
    "createdTime": (_long, False),
    "configuration": (_strict_string_map, True),
}
_PROTOCOL_SCHEMA: _Schema = {
    "minReaderVersion": (_int, True),
    "minWriterVersion": (_int, True),
    "readerFeatures": (_strings, False),
    "writerFeatures": (_strings, False),
}
_TXN_SCHEMA: _Schema = {"appId": (_string, True), "version": (_long, True), "lastUpdated": (_long, False)}
_DOMAIN_SCHEMA: _Schema = {"domain": (_string, True), "configuration": (_string, True), "removed": (_boolean, True)}
_SIDECAR_SCHEMA: _Schema = {
    "path": (_string, True),
    "sizeInBytes": (_long, True),
    "modificationTime": (_long, True),
    "tags": (_string_map, False),
}
_CHECKPOINT_METADATA_SCHEMA: _Schema = {"version": (_long, True), "tags": (_string_map, False)}
# commitInfo is free-form ("implementations are free to store any valid JSON"); only the in-commit
# timestamp, which the In-Commit Timestamps feature defines as a Long, is typed.
_COMMIT_INFO_SCHEMA: _Schema = {"inCommitTimestamp": (_long, False)}


@dataclass(frozen=True, slots=True)
class DeletionVector:
    """A ``DeletionVectorDescriptor``.

    Protocol: ``uniqueId`` is ``<storageType><pathOrInlineDv>`` when ``offset``
    is absent, otherwise ``<storageType><pathOrInlineDv>@<offset>``. For
    ``storageType='u'`` the file is ``<table>/<random prefix>/deletion_vector_<uuid>.bin``
    where ``pathOrInlineDv`` is the prefix followed by the 20-character Z85 UUID;
    for ``'p'`` it is the absolute path itself; ``'i'`` has no file.
    """

    storage_type: str
    path_or_inline_dv: str
    size_in_bytes: int
    cardinality: int
    offset: int | None = None

    @property
    def unique_id(self) -> str:
        """``<storageType><pathOrInlineDv>[@<offset>]``, the DV half of a logical file's key."""
        base = self.storage_type + self.path_or_inline_dv
        return base if self.offset is None else f"{base}@{self.offset}"

    def relative_path(self) -> str:
        """For ``u`` storage: ``<prefix>/deletion_vector_<uuid>.bin`` (no leading slash).

        Raises:
            InvalidLogError: if the storage type is not ``u`` or the UUID does not decode.
        """
        if self.storage_type != "u":
            raise InvalidLogError(f"deletion vector of storage type {self.storage_type!r} has no relative path")
        encoded = self.path_or_inline_dv
        if len(encoded) < 20:
            raise InvalidLogError(f"relative deletion vector path {encoded!r} is shorter than a Z85 UUID")
        prefix, uuid_z85 = encoded[:-20], encoded[-20:]
        try:
            raw = z85_decode(uuid_z85)
        except DeletionVectorError as e:
            raise InvalidLogError(f"relative deletion vector path {encoded!r} does not hold a Z85 UUID: {e}") from e
        if len(raw) != 16:
            raise InvalidLogError(f"relative deletion vector path {encoded!r} does not decode to a 16-byte UUID")
        hexs = raw.hex()
        uuid = f"{hexs[:8]}-{hexs[8:12]}-{hexs[12:16]}-{hexs[16:20]}-{hexs[20:]}"
        name = f"deletion_vector_{uuid}.bin"
        return f"{prefix}/{name}" if prefix else name

    def absolute_path(self, table_root: str, external_roots: Sequence[str] = ()) -> str:
        """The DV file's location: ``<table_root>/<relative path>`` for ``u``, the percent-decoded URI for ``p``.

        Both go through :func:`state.paths.resolve_logged_path`: a ``u`` prefix must not climb out
        of the table root, a ``p`` path must fall under the table root or an external root.

        Raises:
            UnsafePathError: if the location is outside the table root and every external root.
            InvalidLogError: for inline (``i``) DVs, which have no file, or a ``u`` path whose UUID does not decode.
        """
        if self.storage_type == "p":
            return resolve_logged_path(table_root, unquote(self.path_or_inline_dv), external_roots)
        if self.storage_type == "u":
            return resolve_logged_path(table_root, self.relative_path(), external_roots)
        raise InvalidLogError(f"deletion vector of storage type {self.storage_type!r} has no file")

    @staticmethod
    def parse(raw: Any) -> DeletionVector | None:
        """Parse a ``DeletionVectorDescriptor`` object; ``None`` (JSON null, or absent) means no DV.

        Raises:
            InvalidLogError: if ``raw`` is not an object, lacks a required field, has a field of the
                wrong type (``offset`` and ``sizeInBytes`` are Ints, ``cardinality`` a Long), or an
                unknown ``storageType``; the message names the field.
        """
        if raw is None:
            return None
        dv = _deletion_vector(raw)
        if dv is None:
            if type(raw) is not dict:
                raise InvalidLogError(f"deletionVector must be a JSON object, got {_shown(raw)}")
            found = _first_problem(raw, _DV_SCHEMA, "deletionVector.")
            where, problem = found if found is not None else ("deletionVector", "is malformed")
            raise InvalidLogError(f"deletion vector descriptor: field {where!r} {problem}")
        return dv


@dataclass(frozen=True, slots=True)
class Protocol:
    """``protocol``: the reader and writer versions and, from reader 3 / writer 7, feature lists."""

    min_reader_version: int
    min_writer_version: int
    reader_features: frozenset[str] | None = None
    writer_features: frozenset[str] | None = None

    def to_json(self) -> dict[str, Any]:
        """The action's body as the log writes it (feature lists sorted)."""
        return {
            "minReaderVersion": self.min_reader_version,
            "minWriterVersion": self.min_writer_version,
            "readerFeatures": None if self.reader_features is None else sorted(self.reader_features),
            "writerFeatures": None if self.writer_features is None else sorted(self.writer_features),
        }


@dataclass(frozen=True, slots=True)
class Format:
    """``metaData.format``."""

    provider: str = "parquet"
    options: dict[str, str] = field(default_factory=dict, hash=False)


@dataclass(frozen=True, slots=True)
class Metadata:
    """``metaData``: table id, schema, partition columns and configuration.

    ``schema_string`` is kept raw; :meth:`schema` parses it (the snapshot parses
    it once per metadata change, after the reader-feature gate has passed).
    """

    id: str
    schema_string: str | None
    partition_columns: tuple[str, ...]
    configuration: dict[str, str] = field(default_factory=dict, hash=False)
    name: str | None = None
    description: str | None = None
    format: Format = field(default_factory=Format)
    created_time: int | None = None

    def schema(self) -> StructType:
        """The parsed schema.

        Raises:
            InvalidLogError: if ``schemaString`` is absent or does not parse.
        """
        if self.schema_string is None:
            raise InvalidLogError("metaData has no schemaString")
        return parse_schema(self.schema_string)

    @property
    def column_mapping_mode(self) -> str:
        """``none``, ``name`` or ``id`` from ``delta.columnMapping.mode``."""
        return self.configuration.get("delta.columnMapping.mode", "none") or "none"


@dataclass(slots=True, unsafe_hash=True)
class Add:
    """``add``: a logical file enters the table. ``stats`` is kept raw (a JSON string)."""

    path: Final[str]
    partition_values: Final[dict[str, str | None]]
    size: Final[int]
    modification_time: Final[int]
    data_change: Final[bool]
    stats: Final[str | None] = None
    tags: Final[dict[str, str | None] | None] = None
    deletion_vector: Final[DeletionVector | None] = None
    base_row_id: Final[int | None] = None
    default_row_commit_version: Final[int | None] = None
    clustering_provider: Final[str | None] = None

    @property
    def dv_id(self) -> str | None:
        """The DV's unique id, or ``None``: the second half of the file key."""
        return None if self.deletion_vector is None else self.deletion_vector.unique_id


@dataclass(slots=True, unsafe_hash=True)
class Remove:
    """``remove``: a logical file leaves the table and becomes a tombstone."""

    path: Final[str]
    deletion_timestamp: Final[int | None]
    data_change: Final[bool]
    extended_file_metadata: Final[bool | None] = None
    partition_values: Final[dict[str, str | None] | None] = None
    size: Final[int | None] = None
    stats: Final[str | None] = None
    tags: Final[dict[str, str | None] | None] = None
    deletion_vector: Final[DeletionVector | None] = None
    base_row_id: Final[int | None] = None
    default_row_commit_version: Final[int | None] = None

    @property
    def dv_id(self) -> str | None:
        """The DV's unique id, or ``None``."""
        return None if self.deletion_vector is None else self.deletion_vector.unique_id


@dataclass(frozen=True, slots=True)
class AddCDCFile:
    """``cdc``: a change data file; when a commit has any, its changes are exactly these files' rows."""

    path: str
    partition_values: dict[str, str | None]
    size: int
    data_change: bool = False
    tags: dict[str, str | None] | None = None


@dataclass(frozen=True, slots=True)
class Txn:
    """``txn``: the latest version an application committed, keyed by ``appId``."""

    app_id: str
    version: int
    last_updated: int | None = None


@dataclass(slots=True, unsafe_hash=True)
class CommitInfo:
    """``commitInfo``: free-form provenance; a few fields are read, the rest kept in ``raw``.

    The protocol lets writers store "any valid JSON" here, so only ``inCommitTimestamp`` (a Long
    where the In-Commit Timestamps feature is on) is validated when parsing; a ``timestamp`` that is
    not an integer is treated as absent.
    """

    raw: Final[dict[str, Any]] = field(hash=False)

    @property
    def timestamp(self) -> int | None:
        """``timestamp`` in epoch milliseconds, if the writer recorded one."""
        value = self.raw.get("timestamp")
        return value if type(value) is int else None  # not a boolean, which Python counts as an int

    @property
    def in_commit_timestamp(self) -> int | None:
        """``inCommitTimestamp`` (epoch ms), present when in-commit timestamps are enabled."""
        value = self.raw.get("inCommitTimestamp")
        return value if type(value) is int else None

    @property
    def operation(self) -> str | None:
        """The operation name, e.g. ``WRITE``, ``MERGE``, ``DELETE``."""
        value = self.raw.get("operation")
        return value if isinstance(value, str) else None

    @property
    def operation_metrics(self) -> dict[str, Any]:
        """``operationMetrics`` (values are strings in Delta Spark, numbers elsewhere)."""
        value = self.raw.get("operationMetrics")
        return value if isinstance(value, dict) else {}


@dataclass(frozen=True, slots=True)
class DomainMetadata:
    """``domainMetadata``: a named configuration; ``removed`` makes it a tombstone."""

    domain: str
    configuration: str
    removed: bool


@dataclass(frozen=True, slots=True)
class Sidecar:
    """``sidecar``: a file in ``_delta_log/_sidecars`` holding part of a V2 checkpoint's file actions."""

    path: str
    size_in_bytes: int
    modification_time: int
    tags: dict[str, str | None] | None = None


@dataclass(frozen=True, slots=True)
class CheckpointMetadata:
    """``checkpointMetadata``: marks a V2 checkpoint; ``version`` is the checkpoint's version."""

    version: int
    tags: dict[str, str | None] | None = None


Action = (
    Protocol | Metadata | Add | Remove | AddCDCFile | Txn | CommitInfo | DomainMetadata | Sidecar | CheckpointMetadata
)


def _deletion_vector(raw: Any) -> DeletionVector | None:
    """The descriptor ``raw`` (not null) holds, or ``None`` if it breaks :data:`_DV_SCHEMA` (the fast path)."""
    if type(raw) is not dict:
        return None
    get = raw.get
    storage_type = get("storageType")
    path = get("pathOrInlineDv")
    offset = get("offset")
    size = get("sizeInBytes")
    cardinality = get("cardinality")
    if (
        type(storage_type) is str
        and storage_type in _STORAGE_TYPES
        and type(path) is str
        and type(size) is int
        and _MIN_INT <= size <= _MAX_INT
        and type(cardinality) is int
        and _MIN_LONG <= cardinality <= _MAX_LONG
        and (offset is None or (type(offset) is int and _MIN_INT <= offset <= _MAX_INT))
    ):
        return DeletionVector(storage_type, path, size, cardinality, offset)
    return None


def parse_add(a: dict[str, Any]) -> Add:
    """Parse the body of an ``add`` action.

    Raises:
        InvalidLogError: if a required field (``path``, ``partitionValues``, ``size``,
            ``modificationTime``, ``dataChange``) is missing or null, or any typed field has the
            wrong JSON type; the message names the field.
    """
    if type(a) is not dict:
        raise _invalid("add", a, _ADD_SCHEMA)
    get = a.get
    path = get("path")
    partition_values = get("partitionValues")
    size = get("size")
    modification_time = get("modificationTime")
    data_change = get("dataChange")
    stats = get("stats")
    tags = get("tags")
    raw_dv = get("deletionVector")
    base_row_id = get("baseRowId")
    row_commit_version = get("defaultRowCommitVersion")
    clustering_provider = get("clusteringProvider")
    dv = None if raw_dv is None else _deletion_vector(raw_dv)
    if not (
        type(path) is str
        and type(partition_values) is dict
        and _nullable_strings(partition_values)
        and type(size) is int
        and _MIN_LONG <= size <= _MAX_LONG
        and type(modification_time) is int
        and _MIN_LONG <= modification_time <= _MAX_LONG
        and type(data_change) is bool
        and (stats is None or type(stats) is str)
        and (tags is None or (type(tags) is dict and _nullable_strings(tags)))
        and (dv is not None or raw_dv is None)
        and (base_row_id is None or (type(base_row_id) is int and _MIN_LONG <= base_row_id <= _MAX_LONG))
        and (
            row_commit_version is None
            or (type(row_commit_version) is int and _MIN_LONG <= row_commit_version <= _MAX_LONG)
        )
        and (clustering_provider is None or type(clustering_provider) is str)
    ):
        raise _invalid("add", a, _ADD_SCHEMA)
    return Add(  # positional, in field order: this runs once per add of a log
        decode_path(path),
        partition_values,
        size,
        modification_time,
        data_change,
        stats,
        tags,
        dv,
        base_row_id,
        row_commit_version,
        clustering_provider,
    )


def parse_remove(r: dict[str, Any]) -> Remove:
    """Parse the body of a ``remove`` action.

    Raises:
        InvalidLogError: if ``path`` or ``dataChange`` is missing or null, or any typed field has the
            wrong JSON type; the message names the field.
    """
    if type(r) is not dict:
        raise _invalid("remove", r, _REMOVE_SCHEMA)
    get = r.get
    path = get("path")
    deletion_timestamp = get("deletionTimestamp")
    data_change = get("dataChange")
    extended = get("extendedFileMetadata")
    partition_values = get("partitionValues")
    size = get("size")
    stats = get("stats")
    tags = get("tags")
    raw_dv = get("deletionVector")
    base_row_id = get("baseRowId")
    row_commit_version = get("defaultRowCommitVersion")
    dv = None if raw_dv is None else _deletion_vector(raw_dv)
    if not (
        type(path) is str
        and (
            deletion_timestamp is None
            or (type(deletion_timestamp) is int and _MIN_LONG <= deletion_timestamp <= _MAX_LONG)
        )
        and type(data_change) is bool
        and (extended is None or type(extended) is bool)
        and (partition_values is None or (type(partition_values) is dict and _nullable_strings(partition_values)))
        and (size is None or (type(size) is int and _MIN_LONG <= size <= _MAX_LONG))
        and (stats is None or type(stats) is str)
        and (tags is None or (type(tags) is dict and _nullable_strings(tags)))
        and (dv is not None or raw_dv is None)
        and (base_row_id is None or (type(base_row_id) is int and _MIN_LONG <= base_row_id <= _MAX_LONG))
        and (
            row_commit_version is None
            or (type(row_commit_version) is int and _MIN_LONG <= row_commit_version <= _MAX_LONG)
        )
    ):
        raise _invalid("remove", r, _REMOVE_SCHEMA)
    return Remove(  # positional, in field order: this runs once per remove of a log
        decode_path(path),
        deletion_timestamp,
        data_change,
        extended,
        partition_values,
        size,
        stats,
        tags,
        dv,
        base_row_id,
        row_commit_version,
    )


def parse_metadata(m: dict[str, Any]) -> Metadata:
    """Parse the body of a ``metaData`` action.

    Raises:
        InvalidLogError: if ``id``, ``format`` (with its ``provider``), ``partitionColumns`` or
            ``configuration`` is missing or null, or any typed field has the wrong JSON type.
    """
    _validate("metaData", m, _METADATA_SCHEMA)
    fmt = m["format"]
    return Metadata(
        id=m["id"],
        schema_string=m.get("schemaString"),
        partition_columns=tuple(m["partitionColumns"]),
        configuration=dict(m["configuration"]),
        name=m.get("name"),
        description=m.get("description"),
        format=Format(fmt["provider"], dict(fmt.get("options") or {})),
        created_time=m.get("createdTime"),
    )


def parse_protocol(p: dict[str, Any]) -> Protocol:
    """Parse the body of a ``protocol`` action.

    Raises:
        InvalidLogError: if a version is missing, null or not an Int, or a feature list is not an
            array of strings.
    """
    _validate("protocol", p, _PROTOCOL_SCHEMA)
    readers = p.get("readerFeatures")
    writers = p.get("writerFeatures")
    return Protocol(
        min_reader_version=p["minReaderVersion"],
        min_writer_version=p["minWriterVersion"],
        reader_features=None if readers is None else frozenset(readers),
        writer_features=None if writers is None else frozenset(writers),
    )


def _parse_cdc(c: dict[str, Any]) -> AddCDCFile:
    _validate("cdc", c, _CDC_SCHEMA)
    return AddCDCFile(
        path=decode_path(c["path"]),
        partition_values=c["partitionValues"],
        size=c["size"],
        data_change=c["dataChange"],
        tags=c.get("tags"),
    )


def _parse_txn(t: dict[str, Any]) -> Txn:
    _validate("txn", t, _TXN_SCHEMA)
    return Txn(app_id=t["appId"], version=t["version"], last_updated=t.get("lastUpdated"))


def _parse_domain(d: dict[str, Any]) -> DomainMetadata:
    _validate("domainMetadata", d, _DOMAIN_SCHEMA)
    return DomainMetadata(domain=d["domain"], configuration=d["configuration"], removed=d["removed"])


def _parse_sidecar(s: dict[str, Any]) -> Sidecar:
    _validate("sidecar", s, _SIDECAR_SCHEMA)
    return Sidecar(
        path=decode_path(s["path"]),
        size_in_bytes=s["sizeInBytes"],
        modification_time=s["modificationTime"],
        tags=s.get("tags"),
    )


def _parse_checkpoint_metadata(c: dict[str, Any]) -> CheckpointMetadata:
    _validate("checkpointMetadata", c, _CHECKPOINT_METADATA_SCHEMA)
    return CheckpointMetadata(version=c["version"], tags=c.get("tags"))


def _parse_commit_info(c: dict[str, Any]) -> CommitInfo:
    if type(c) is dict:
        ict = c.get("inCommitTimestamp")  # the one typed field (the schema's check, inline: once per commit)
        if ict is None or (type(ict) is int and _MIN_LONG <= ict <= _MAX_LONG):
            return CommitInfo(raw=c)
    raise _invalid("commitInfo", c, _COMMIT_INFO_SCHEMA)


_PARSERS: dict[str, Callable[[Any], Action]] = {
    "add": parse_add,
    "remove": parse_remove,
    "metaData": parse_metadata,
    "protocol": parse_protocol,
    "cdc": _parse_cdc,
    "txn": _parse_txn,
    "commitInfo": _parse_commit_info,
    "domainMetadata": _parse_domain,
    "sidecar": _parse_sidecar,
    "checkpointMetadata": _parse_checkpoint_metadata,
}


def parse_action(obj: dict[str, Any]) -> Action | None:
    """Parse one action object (``{"add": {...}}``); unknown actions, and known ones that are null, give ``None``.

    ``obj`` is a decoded JSON object (or a Parquet checkpoint row as Python values, where absent
    fields are null). Unknown fields of known actions are ignored.

    Raises:
        InvalidLogError: if a known action is not an object, lacks a required field, or has a field of
            the wrong JSON type; the message names the action and the field (nested fields dotted,
            e.g. ``deletionVector.sizeInBytes``).
    """
    for key, body in obj.items():
        parser = _PARSERS.get(key)
        if parser is None or body is None:
            continue
        return parser(body)
    return None


def parse_json_actions(data: bytes) -> list[Action]:
    """Parse newline-delimited JSON actions (a commit, a JSON checkpoint, a sidecar, a compaction file).

    Blank lines are ignored. Unknown actions and fields are ignored.

    Raises:
        InvalidLogError: if a line is not a JSON object (e.g. a truncated file) or an action is malformed;
            the message gives the 1-based line number.
    """
    actions: list[Action] = []
    for number, line in enumerate(data.splitlines(), start=1):
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            if line.isspace() or not line:
                continue
            raise InvalidLogError(f"line {number} is not valid JSON ({e})") from e
        if type(obj) is not dict:
            raise InvalidLogError(f"line {number} is not a JSON object")
        try:
            action = parse_action(obj)
        except InvalidLogError as e:
            raise InvalidLogError(f"line {number}: {e.message}") from e
        if action is not None:
            actions.append(action)
    return actions
