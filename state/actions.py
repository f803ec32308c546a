"""Every action of the Delta protocol as a frozen, slotted value; parsed here and only here.

Protocol, "Actions": a commit file is newline-delimited JSON, one action per
line, each an object with a single key naming the action. The newer revision
adds: "readers MUST ignore unknown actions and unknown fields" — both are
ignored here. Paths in ``add``, ``remove`` and ``cdc`` "are URIs as specified
by RFC 2396 ... which need to be decoded to get the data file path": they are
percent-decoded once, here, and every other module sees decoded paths.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any
from urllib.parse import unquote

import orjson

from state.errors import DeletionVectorError, InvalidLogError
from state.schema import StructType, parse_schema
from state.z85 import z85_decode


def decode_path(raw: str) -> str:
    """Decode a file action's path: percent-decoding, and ``file:`` URIs of local files made plain paths.

    Protocol: the path "is a URI as specified by RFC 2396 URI Generic Syntax,
    which needs to be decoded to get the data file path". Delta Spark qualifies
    paths before reconciling, so ``file:/x``, ``file:///x`` and ``/x`` name one
    file; deltatail canonicalizes the ``file:`` forms to ``/x`` here.
    """
    path = unquote(raw)
    if path.startswith("file:///"):
        return path[len("file://") :]
    if path.startswith("file://localhost/"):
        return path[len("file://localhost") :]
    if path.startswith("file:/") and not path.startswith("file://"):
        return path[len("file:") :]
    return path  # another host's file: URI stays a URI (absolute), never a relative path


def _required_map(body: dict[str, Any], key: str) -> dict[str, str | None]:
    value = body[key]
    if not isinstance(value, dict):
        raise TypeError(f"{key} must be a map")
    return dict(value)


def _str_map(raw: Any) -> dict[str, str | None]:
    return dict(raw) if isinstance(raw, dict) else {}


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

    def absolute_path(self, table_root: str) -> str:
        """The DV file's location: ``<table_root>/<relative path>`` for ``u``, the stored URI for ``p``.

        Raises:
            InvalidLogError: for inline (``i``) DVs, which have no file.
        """
        if self.storage_type == "p":
            return self.path_or_inline_dv
        if self.storage_type == "u":
            return f"{table_root.rstrip('/')}/{self.relative_path()}"
        raise InvalidLogError(f"deletion vector of storage type {self.storage_type!r} has no file")

    @staticmethod
    def parse(raw: Any) -> DeletionVector | None:
        """Parse a descriptor object; ``None`` or absent means no DV."""
        if not raw:
            return None
        try:
            storage_type = raw["storageType"]
            if storage_type not in ("u", "i", "p"):
                raise InvalidLogError(f"unknown deletion vector storageType {storage_type!r}")
            offset = raw.get("offset")
            return DeletionVector(
                storage_type=storage_type,
                path_or_inline_dv=raw["pathOrInlineDv"],
                size_in_bytes=int(raw["sizeInBytes"]),
                cardinality=int(raw["cardinality"]),
                offset=None if offset is None else int(offset),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise InvalidLogError(f"invalid deletionVector descriptor {raw!r}: {e}") from e


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


@dataclass(frozen=True, slots=True)
class Add:
    """``add``: a logical file enters the table. ``stats`` is kept raw (a JSON string)."""

    path: str
    partition_values: dict[str, str | None]
    size: int
    modification_time: int
    data_change: bool
    stats: str | None = None
    tags: dict[str, str | None] | None = None
    deletion_vector: DeletionVector | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None
    clustering_provider: str | None = None

    @property
    def dv_id(self) -> str | None:
        """The DV's unique id, or ``None``: the second half of the file key."""
        return None if self.deletion_vector is None else self.deletion_vector.unique_id


@dataclass(frozen=True, slots=True)
class Remove:
    """``remove``: a logical file leaves the table and becomes a tombstone."""

    path: str
    deletion_timestamp: int | None
    data_change: bool
    extended_file_metadata: bool | None = None
    partition_values: dict[str, str | None] | None = None
    size: int | None = None
    stats: str | None = None
    tags: dict[str, str | None] | None = None
    deletion_vector: DeletionVector | None = None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None

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


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """``commitInfo``: free-form provenance; a few fields are typed, the rest kept in ``raw``."""

    raw: dict[str, Any] = field(hash=False)

    @property
    def timestamp(self) -> int | None:
        """``timestamp`` in epoch milliseconds, if the writer recorded one."""
        value = self.raw.get("timestamp")
        return value if isinstance(value, int) else None

    @property
    def in_commit_timestamp(self) -> int | None:
        """``inCommitTimestamp`` (epoch ms), present when in-commit timestamps are enabled."""
        value = self.raw.get("inCommitTimestamp")
        return value if isinstance(value, int) else None

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


def _features(raw: Any) -> frozenset[str] | None:
    return None if raw is None else frozenset(raw)


def _opt_int(raw: Any) -> int | None:
    return None if raw is None else int(raw)


def parse_add(a: dict[str, Any]) -> Add:
    """Parse the body of an ``add`` action."""
    return Add(
        path=decode_path(a["path"]),
        partition_values=_required_map(a, "partitionValues"),
        size=int(a["size"]),
        modification_time=int(a["modificationTime"]),
        data_change=bool(a["dataChange"]),
        stats=a.get("stats"),
        tags=a.get("tags"),
        deletion_vector=DeletionVector.parse(a.get("deletionVector")),
        base_row_id=_opt_int(a.get("baseRowId")),
        default_row_commit_version=_opt_int(a.get("defaultRowCommitVersion")),
        clustering_provider=a.get("clusteringProvider"),
    )


def parse_remove(r: dict[str, Any]) -> Remove:
    """Parse the body of a ``remove`` action."""
    pv = r.get("partitionValues")
    return Remove(
        path=decode_path(r["path"]),
        deletion_timestamp=_opt_int(r.get("deletionTimestamp")),
        data_change=bool(r["dataChange"]),
        extended_file_metadata=r.get("extendedFileMetadata"),
        partition_values=None if pv is None else _str_map(pv),
        size=_opt_int(r.get("size")),
        stats=r.get("stats"),
        tags=r.get("tags"),
        deletion_vector=DeletionVector.parse(r.get("deletionVector")),
        base_row_id=_opt_int(r.get("baseRowId")),
        default_row_commit_version=_opt_int(r.get("defaultRowCommitVersion")),
    )


def parse_metadata(m: dict[str, Any]) -> Metadata:
    """Parse the body of a ``metaData`` action."""
    fmt = m.get("format") or {}
    return Metadata(
        id=m["id"],
        schema_string=m.get("schemaString"),
        partition_columns=tuple(m.get("partitionColumns") or ()),
        configuration=dict(m.get("configuration") or {}),
        name=m.get("name"),
        description=m.get("description"),
        format=Format(fmt.get("provider", "parquet"), dict(fmt.get("options") or {})),
        created_time=_opt_int(m.get("createdTime")),
    )


def parse_protocol(p: dict[str, Any]) -> Protocol:
    """Parse the body of a ``protocol`` action."""
    return Protocol(
        min_reader_version=int(p["minReaderVersion"]),
        min_writer_version=int(p["minWriterVersion"]),
        reader_features=_features(p.get("readerFeatures")),
        writer_features=_features(p.get("writerFeatures")),
    )


def _parse_cdc(c: dict[str, Any]) -> AddCDCFile:
    return AddCDCFile(
        path=decode_path(c["path"]),
        partition_values=_required_map(c, "partitionValues"),
        size=int(c["size"]),
        data_change=bool(c.get("dataChange", False)),
        tags=c.get("tags"),
    )


def _parse_txn(t: dict[str, Any]) -> Txn:
    return Txn(app_id=t["appId"], version=int(t["version"]), last_updated=_opt_int(t.get("lastUpdated")))


def _parse_domain(d: dict[str, Any]) -> DomainMetadata:
    return DomainMetadata(
        domain=d["domain"], configuration=d.get("configuration") or "", removed=bool(d.get("removed", False))
    )


def _parse_sidecar(s: dict[str, Any]) -> Sidecar:
    return Sidecar(
        path=decode_path(s["path"]),
        size_in_bytes=int(s.get("sizeInBytes") or 0),
        modification_time=int(s.get("modificationTime") or 0),
        tags=s.get("tags"),
    )


def _parse_checkpoint_metadata(c: dict[str, Any]) -> CheckpointMetadata:
    return CheckpointMetadata(version=int(c["version"]), tags=c.get("tags"))


def _parse_commit_info(c: dict[str, Any]) -> CommitInfo:
    return CommitInfo(raw=c)


_PARSERS: dict[str, Any] = {
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
    """Parse one action object (``{"add": {...}}``); unknown actions give ``None``.

    Raises:
        InvalidLogError: if a known action lacks a required field or has a field of the wrong type.
    """
    for key, body in obj.items():
        parser = _PARSERS.get(key)
        if parser is None or body is None:
            continue
        try:
            action: Action = parser(body)
        except InvalidLogError:
            raise
        except (KeyError, TypeError, ValueError, AttributeError) as e:
            raise InvalidLogError(f"invalid {key} action: {type(e).__name__}: {e}") from e
        return action
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
        if not line.strip():
            continue
        try:
            obj = orjson.loads(line)
        except orjson.JSONDecodeError as e:
            raise InvalidLogError(f"line {number} is not valid JSON ({e})") from e
        if not isinstance(obj, dict):
            raise InvalidLogError(f"line {number} is not a JSON object")
        try:
            action = parse_action(obj)
        except InvalidLogError as e:
            raise InvalidLogError(f"line {number}: {e.message}") from e
        if action is not None:
            actions.append(action)
    return actions
