"""An Iceberg table's metadata, manifest lists and manifests, read through deltatail's storage.

pyiceberg (an optional dependency: ``pip install 'deltatail[iceberg]'``) parses the metadata JSON, the
manifest lists and the manifests; every byte comes through :class:`~tailer.storage.Storage` (a small
adapter gives pyiceberg the file interface it reads Avro through), so object stores, retries and
their options work as for Delta tables. The parsed objects become :mod:`state.iceberg.model` values
here, at this one edge.

A table is named in one of three ways (:class:`IcebergTable`):

- a metadata file (``.../metadata/00003-<uuid>.metadata.json`` or ``v3.metadata.json``): that
  version of the table, and no newer one;
- the table's directory (the one holding ``metadata/``): its newest metadata file, found by
  ``metadata/version-hint.text`` (one small read, as Hadoop tables write it) or else by listing
  ``metadata/`` and taking the highest numbered ``*.metadata.json``;
- a catalog (:mod:`tailer.iceberg.catalog`): the catalog's pointer to the current metadata file.

The table root is the directory holding ``metadata/``; every manifest, data and delete file the
metadata names must be under it (or under an external root the user allowed): :mod:`state.paths`.
"""

from __future__ import annotations

import functools
import io
import re
from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import pyarrow as pa

from deltatail.state.errors import (
    ConfigError,
    DeltaTailError,
    InvalidLogError,
    MissingFileError,
    TableNotFoundError,
    UnsupportedFeatureError,
)
from deltatail.state.iceberg.model import SUPPORTED_FORMAT_VERSIONS, ContentFile, SnapshotInfo, TableState
from deltatail.state.iceberg.planning import live_files
from deltatail.state.paths import resolve_logged_path
from deltatail.tailer.storage import Storage, to_local_path

METADATA_DIR = "metadata"
VERSION_HINT = "version-hint.text"
#: ``v12.metadata.json`` (Hadoop tables) or ``00012-<uuid>.metadata.json`` (catalogs).
_METADATA_NAME = re.compile(r"^(?:v(\d{1,18})|(\d{1,18})-[0-9a-fA-F-]{36})\.metadata\.json$")
#: The most manifests whose parsed entries are kept (they never change once written).
MANIFEST_CACHE = 4096
#: The manifest schema manifests are read with: the newest, whose extra fields read as null from older ones.
V3 = 3
#: The largest metadata file, manifest list or manifest read (bytes): a bound on what a table can make us hold.
MAX_METADATA_BYTES = 512 << 20


def pyiceberg_modules() -> Any:
    """The metadata parser and manifest reader of pyiceberg, as a namespace. and manifest reader, as a namespace.

    Raises:
        ConfigError: if pyiceberg is not installed.
    """
    try:
        from pyiceberg import manifest
        from pyiceberg.table import metadata
    except ImportError as e:
        raise ConfigError("reading Iceberg tables needs pyiceberg: pip install 'deltatail[iceberg]'") from e

    class Modules:
        parse_metadata = staticmethod(metadata.TableMetadataUtil.parse_raw)
        read_manifest_list = staticmethod(manifest.read_manifest_list)
        ManifestEntryStatus = manifest.ManifestEntryStatus

    return Modules


def join(root: str, *parts: str) -> str:
    """``root/part/...`` for a local path or a URI."""
    return "/".join([root.rstrip("/"), *parts])


def metadata_number(name: str) -> int | None:
    """The number in a metadata file's name (``v3.metadata.json``: 3), ``None`` if it is not one."""
    m = _METADATA_NAME.match(name)
    if m is None:
        return None
    return int(m.group(1) or m.group(2))


def looks_like_iceberg(root: str, storage: Storage) -> bool:
    """Whether ``root`` is an Iceberg metadata file or a directory with ``metadata/*.metadata.json`` (one listing)."""
    if root.endswith(".metadata.json"):
        return True
    try:
        return any(metadata_number(f.name) is not None for f in storage.list_from(join(root, METADATA_DIR)))
    except MissingFileError:
        return False


class _Input:
    """One file as pyiceberg's ``InputFile`` reads it (``open`` gives its bytes), read through storage."""

    def __init__(self, storage: Storage, location: str) -> None:
        self.location = location
        self._storage = storage
        self._data: bytes | None = None

    def _bytes(self) -> bytes:
        if self._data is None:
            info = self._storage.stat_keeping(self.location)
            if info.size > MAX_METADATA_BYTES:
                raise InvalidLogError(f"metadata file of {info.size} bytes is over the bound", file=self.location)
            self._data = self._storage.read(self.location)
        return self._data

    def __len__(self) -> int:
        return len(self._bytes())

    def exists(self) -> bool:
        return self._storage.exists(self.location)

    def open(self, seekable: bool = True) -> io.BytesIO:
        return io.BytesIO(self._bytes())


class IcebergTable:
    """One Iceberg table: its newest metadata, its snapshots' files and schemas.

    Args:
        location: a metadata file, or the table's directory (see the module docstring).
        storage: where the table is.
        pointer: gives the current metadata file's location (a catalog's pointer); replaces the look
            at ``metadata/``.
        external_roots: roots outside the table whose files its metadata may name.

    Raises:
        ConfigError: if pyiceberg is not installed.
    """

    def __init__(
        self,
        location: str,
        storage: Storage,
        *,
        pointer: Callable[[], str] | None = None,
        external_roots: Sequence[str] = (),
    ) -> None:
        self._modules = pyiceberg_modules()
        self.storage = storage
        self.external_roots = tuple(external_roots)
        self._pointer = pointer
        self._fixed: str | None = None
        location = location.rstrip("/")
        if location.endswith(".metadata.json"):
            self._fixed = location
            location = location.rsplit("/", 1)[0]
            if location.endswith("/" + METADATA_DIR):
                location = location[: -len(METADATA_DIR) - 1]
        self.root = to_local_path(location) if location.startswith("file:") else location
        self.metadata_dir = join(self.root, METADATA_DIR)
        self._states: OrderedDict[str, tuple[TableState, Any]] = OrderedDict()
        self._last: str | None = None  # the metadata file read last: what schemas are taken from
        self._manifests: OrderedDict[str, tuple[ContentFile, ...]] = OrderedDict()

    # -- metadata ------------------------------------------------------------------------------

    def metadata_location(self) -> str:
        """The newest metadata file's location (see the module docstring).

        Raises:
            TableNotFoundError: if there is no metadata file.
        """
        if self._fixed is not None:
            return self._fixed
        if self._pointer is not None:
            return self._pointer()
        hint = join(self.metadata_dir, VERSION_HINT)
        try:
            text = self.storage.read(hint).decode("utf-8", "replace").strip()
        except MissingFileError:
            text = ""
        if text.isdigit() and len(text) <= 18:
            found = join(self.metadata_dir, f"v{int(text)}.metadata.json")
            if self.storage.exists(found):
                return found
        try:
            listed = self.storage.list_from(self.metadata_dir)
        except MissingFileError:
            raise TableNotFoundError("no Iceberg table here: no metadata/ directory", table=self.root) from None
        numbered = [(n, f.name) for f in listed if (n := metadata_number(f.name)) is not None]
        if not numbered:
            raise TableNotFoundError("no Iceberg table here: no metadata/*.metadata.json", table=self.root)
        return join(self.metadata_dir, max(numbered)[1])

    def resolve(self, path: str) -> str:
        """``path`` as the metadata names it, made a location to read, or refused (:mod:`state.paths`).

        Raises:
            UnsafePathError: if it is outside the table root and every external root.
        """
        return resolve_logged_path(self.root, path, self.external_roots)

    def state(self, location: str | None = None) -> TableState:
        """The table as the metadata file at ``location`` (default: the newest) says.

        Raises:
            TableNotFoundError: if there is no metadata file.
            InvalidLogError: if the metadata does not parse.
            UnsupportedFeatureError: for a format version deltatail does not read.
        """
        where = location or self.metadata_location()
        self._last = where
        return self._load(where)[0]

    def _load(self, location: str) -> tuple[TableState, Any]:
        found = self._states.get(location)
        if found is not None:
            self._states.move_to_end(location)
            return found
        try:
            raw = _Input(self.storage, location)._bytes()
        except DeltaTailError as e:
            raise e.at(table=self.root, file=location) from None
        _require_complete_json(raw, self.root, location)
        try:
            md = self._modules.parse_metadata(raw.decode("utf-8"))
        except Exception as e:  # pyiceberg's ValidationError, pydantic's, a bad encoding
            _require_known_version(raw, self.root, location)
            raise InvalidLogError(f"Iceberg metadata does not parse: {e}", table=self.root, file=location) from e
        state = _table_state(md)
        state.require_supported(self.root)
        if state.format_version >= V3:
            _require_no_initial_defaults(md, self.root, location)
        self._states[location] = (state, md)
        while len(self._states) > 8:
            self._states.popitem(last=False)
        return state, md

    def document(self, location: str) -> Any:
        """The pyiceberg metadata object of the metadata file at ``location`` (parsed once, then kept a while).

        Raises:
            MissingFileError: if the file is gone.
            InvalidLogError, UnsupportedFeatureError: as :meth:`state`.
        """
        return self._load(location)[1]

    def schema(self, snapshot: SnapshotInfo | None, location: str | None = None) -> Any:
        """The pyiceberg schema ``snapshot`` was written with (the current one when it records none).

        Taken from the metadata file at ``location``, else from the one :meth:`state` read last (else the newest).
        """
        md = self._load(location or self._last or self.metadata_location())[1]
        if snapshot is not None and snapshot.schema_id is not None:
            for s in md.schemas:
                if s.schema_id == snapshot.schema_id:
                    return s
        return md.schema()

    # -- manifests -----------------------------------------------------------------------------

    def live_files(self, snapshot: SnapshotInfo, version: int) -> list[ContentFile]:
        """The live data and delete files of ``snapshot`` (manifests parsed once, then kept).

        Raises:
            MissingFileError: if the manifest list or a manifest is gone.
            InvalidLogError: if one does not parse.
            UnsafePathError: if one is outside the table root.
        """
        try:
            manifests = self._manifest_list(snapshot.manifest_list)
            return live_files({path: self._entries(path, seq, spec) for path, seq, spec in manifests})
        except DeltaTailError as e:
            raise e.at(table=self.root, version=version) from None

    def _manifest_list(self, location: str) -> list[tuple[str, int, int]]:
        """``(path, sequence number, partition spec id)`` of each manifest the list names."""
        where = self.resolve(location)
        try:
            listed = self._modules.read_manifest_list(_Input(self.storage, where))
            return [(m.manifest_path, int(m.sequence_number or 0), int(m.partition_spec_id)) for m in listed]
        except MissingFileError as e:
            raise MissingFileError(
                "the snapshot's manifest list is missing (not written yet, or deleted)", file=e.file or where
            ) from None
        except DeltaTailError:
            raise
        except Exception as e:
            raise InvalidLogError(f"Iceberg manifest list does not parse: {e}", file=location) from e

    def _entries(self, location: str, sequence_number: int, spec_id: int) -> tuple[ContentFile, ...]:
        found = self._manifests.get(location)
        if found is not None:
            self._manifests.move_to_end(location)
            return found
        where = self.resolve(location)
        entries = _manifest_entries(self._modules, _Input(self.storage, where), location, sequence_number, spec_id)
        self._manifests[location] = entries
        while len(self._manifests) > MANIFEST_CACHE:
            self._manifests.popitem(last=False)
        return entries


def _manifest_entries(
    modules: Any, source: _Input, location: str, sequence_number: int, spec_id: int
) -> tuple[ContentFile, ...]:
    """The live entries of one manifest as :class:`ContentFile` values.

    The spec's inheritance: "When reading v1 manifests with no sequence number column, sequence
    numbers for all files must default to 0"; an ``ADDED`` entry with a null sequence number takes
    the manifest's (the snapshot that added it); the spec id is the manifest's. Entries are read
    with the v3 ``data_file`` fields (``referenced_data_file``, ``content_offset``,
    ``content_size_in_bytes``: null where an older manifest has none).
    """
    from pyiceberg.avro.file import AvroFile
    from pyiceberg.manifest import (
        MANIFEST_ENTRY_SCHEMAS,
        DataFile,
        DataFileContent,
        FileFormat,
        ManifestEntry,
    )

    deleted = modules.ManifestEntryStatus.DELETED
    out: list[ContentFile] = []
    try:
        with AvroFile[ManifestEntry](
            source,  # type: ignore[arg-type]  # duck-typed InputFile over deltatail's storage
            MANIFEST_ENTRY_SCHEMAS[V3],
            read_types={-1: ManifestEntry, 2: DataFile},
            read_enums={0: modules.ManifestEntryStatus, 101: FileFormat, 134: DataFileContent},
        ) as reader:
            for entry in reader:
                if entry.status == deleted:
                    continue
                out.append(_content_file(entry, spec_id, sequence_number))
    except DeltaTailError:
        raise
    except Exception as e:
        raise InvalidLogError(f"Iceberg manifest does not parse: {e}", file=location) from e
    return tuple(out)


@functools.cache
def _v3_names() -> tuple[str, ...]:
    from pyiceberg.manifest import DATA_FILE_TYPE

    return tuple(f.name for f in DATA_FILE_TYPE[V3].fields)


def _v3_field(df: Any, name: str) -> Any:
    """A field of a ``data_file`` record read with the v3 schema, by name (pyiceberg's records are positional)."""
    names = _v3_names()
    return df[names.index(name)] if len(df) == len(names) else None


def _optional_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _content_file(entry: Any, spec_id: int, manifest_sequence: int) -> ContentFile:
    df = entry.data_file
    sequence = entry.sequence_number if entry.sequence_number is not None else manifest_sequence
    referenced = _v3_field(df, "referenced_data_file")
    return ContentFile(
        path=str(df.file_path),
        content=int(df.content or 0),
        spec_id=spec_id,
        partition=tuple(df.partition) if df.partition is not None else (),
        record_count=int(df.record_count),
        size=int(df.file_size_in_bytes),
        data_sequence=int(sequence),
        file_format=str(df.file_format.value).upper(),
        equality_ids=tuple(df.equality_ids or ()),
        referenced_data_file=None if referenced is None else str(referenced),
        content_offset=_optional_int(_v3_field(df, "content_offset")),
        content_size=_optional_int(_v3_field(df, "content_size_in_bytes")),
    )


def _require_complete_json(raw: bytes, table: str, location: str) -> None:
    """Refuse a metadata file that is not one whole JSON document: cut short, or still being written.

    The spec: "Table metadata is stored as JSON"; a writer that has not finished (or died) leaves a
    prefix of it, which a follower reads again later (:mod:`tailer.iceberg.follow`).

    Raises:
        InvalidLogError: saying so, naming the table and the file.
    """
    try:
        orjson.loads(raw)
    except orjson.JSONDecodeError as e:
        raise InvalidLogError(
            f"Iceberg metadata does not parse: not complete JSON ({len(raw)} bytes; cut short or still "
            f"being written?): {e}",
            table=table,
            file=location,
        ) from None


def _require_known_version(raw: bytes, table: str, location: str) -> None:
    """Refuse metadata that pyiceberg could not parse because of its ``format-version`` (a newer format).

    Raises:
        UnsupportedFeatureError: if the document's ``format-version`` is not one deltatail reads.
    """
    try:
        version = orjson.loads(raw).get("format-version")
    except (orjson.JSONDecodeError, AttributeError):
        return
    if isinstance(version, int) and version not in SUPPORTED_FORMAT_VERSIONS:
        raise UnsupportedFeatureError(
            f"Iceberg format version {version} is not supported (deltatail reads v1 to v3)",
            features=frozenset({f"format-version {version}"}),
            table=table,
            file=location,
        )


def _require_no_initial_defaults(md: Any, table: str, location: str) -> None:
    """Refuse a v3 schema field with an ``initial-default``.

    The spec: "``initial-default``: default value for the field for all records that were written
    before the field was added to the schema": rows of older files would need it, not nulls.

    Raises:
        UnsupportedFeatureError: naming the field, the table and the metadata file.
    """
    from pyiceberg.schema import index_by_id

    for schema in md.schemas:
        for field in index_by_id(schema).values():
            if field.initial_default is not None:
                raise UnsupportedFeatureError(
                    f"column {field.name} (field id {field.field_id}) has an initial-default value: "
                    "default values (format v3) are not read yet",
                    features=frozenset({"initial-default"}),
                    table=table,
                    file=location,
                )


def _table_state(md: Any) -> TableState:
    snapshots = {}
    for s in md.snapshots:
        summary = s.summary
        operation = None if summary is None else str(summary.operation.value)
        props = {} if summary is None else dict(summary.additional_properties)
        snapshots[s.snapshot_id] = SnapshotInfo(
            snapshot_id=s.snapshot_id,
            parent_id=s.parent_snapshot_id,
            sequence_number=int(s.sequence_number or 0),
            timestamp_ms=int(s.timestamp_ms),
            operation=operation,
            summary=tuple(sorted((str(k), str(v)) for k, v in props.items())),
            schema_id=s.schema_id,
            manifest_list=s.manifest_list,
        )
    main = md.refs.get("main")
    head = main.snapshot_id if main is not None else md.current_snapshot_id
    unpartitioned = frozenset(spec.spec_id for spec in md.partition_specs if not spec.fields)
    return TableState(
        table_uuid=str(md.table_uuid),
        format_version=int(md.format_version),
        location=str(md.location),
        snapshots=snapshots,
        main_head=head,
        unpartitioned_specs=unpartitioned,
        last_updated_ms=int(md.last_updated_ms),
    )


def arrow_schema(schema: Any) -> pa.Schema:
    """The Arrow schema of an Iceberg schema: field ids in each field's metadata, every field nullable."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    return pa.schema([_nullable(f) for f in schema_to_pyarrow(schema, include_field_ids=True)])


def _nullable(field: pa.Field) -> pa.Field:
    return pa.field(field.name, _small(field.type), True, field.metadata)


def _small(t: pa.DataType) -> pa.DataType:
    """Large string, binary and list types as their regular kinds (what the sinks and Delta tables use)."""
    if pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_large_binary(t):
        return pa.binary()
    if pa.types.is_large_list(t) or pa.types.is_list(t):
        return pa.list_(
            pa.field(t.value_field.name, _small(t.value_type), t.value_field.nullable, t.value_field.metadata)
        )
    if pa.types.is_map(t):
        return pa.map_(
            pa.field(t.key_field.name, _small(t.key_type), False, t.key_field.metadata),
            pa.field(t.item_field.name, _small(t.item_type), t.item_field.nullable, t.item_field.metadata),
        )
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _small(f.type), f.nullable, f.metadata) for f in t])
    return t
