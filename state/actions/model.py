"""Every action of the Delta protocol as an immutable, slotted value (see :mod:`state.actions`). Pure.

Built by :mod:`state.actions.parsing` (and :meth:`DeletionVector.parse`), never elsewhere.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Final
from urllib.parse import unquote

from deltatail.state.actions.fields import (
    _DV_SCHEMA,
    _MAX_INT,
    _MAX_LONG,
    _MIN_INT,
    _MIN_LONG,
    _STORAGE_TYPES,
    _first_problem,
    _shown,
)
from deltatail.state.errors import DeletionVectorError, InvalidLogError
from deltatail.state.paths import resolve_logged_path
from deltatail.state.schema import StructType, parse_schema
from deltatail.state.z85 import z85_decode


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
