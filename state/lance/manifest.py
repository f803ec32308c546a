"""Lance manifests and transactions, decoded from their protobuf bytes. Pure.

A manifest file (``_versions/<name>.manifest``) ends with a 16-byte footer: the position of the
manifest message (``i64``), the format's major and minor version (``u16`` each) and the magic
``LANC``. At that position a ``u32`` length precedes the ``lance.table.Manifest`` message (see
``lance-table.proto`` in the specification). Recent writers put the version's ``Transaction`` in
the same file (``transaction_section``, also length-prefixed); older ones write it to
``_transactions/<transaction_file>``.

Manifest names (Lance's two naming schemes; :func:`parse_manifest_name`):

- V2: ``<20 digits>.manifest`` holding ``u64::MAX - version`` (so names sort newest first);
- V1: ``<version>.manifest``, unpadded.

Anything else in ``_versions/`` is not a version: detached versions (``d<n>.manifest``), staging
files (``….manifest#1``), ``….manifest-<uuid>``, temporary files and ``latest_version_hint.json``
(a hint only).

Reader feature flags (``reader_feature_flags``): 1 deletion files, 2 stable row ids, 4 the
(deprecated) v2 file-format flag, 8 table config. A manifest with any other flag, with data in
other base paths (``base_paths``, ``DataFile.base_id``), or with a fragment field this module does
not know (for example data overlays) is refused with an
:class:`~state.errors.UnsupportedFeatureError`: its rows could not be read exactly.
"""

from __future__ import annotations

import re
import struct
from dataclasses import dataclass, field

from deltatail.state.errors import InvalidLogError, UnsupportedFeatureError
from deltatail.state.lance.protobuf import as_bytes, as_int, fields, packed_varints, signed32, text
from deltatail.state.schema import PHYSICAL_NAME_KEY, ArrayType, DataType, PrimitiveType, StructField, StructType

#: ``u64::MAX``: a V2 manifest name holds this minus the version.
U64_MAX = (1 << 64) - 1
MAGIC = b"LANC"
FOOTER_SIZE = 16

FLAG_DELETION_FILES = 1
FLAG_STABLE_ROW_IDS = 2
FLAG_V2_FORMAT = 4
FLAG_TABLE_CONFIG = 8
#: The reader feature flags deltatail understands.
KNOWN_READER_FLAGS = FLAG_DELETION_FILES | FLAG_STABLE_ROW_IDS | FLAG_V2_FORMAT | FLAG_TABLE_CONFIG

_V2_NAME = re.compile(r"^(\d{20})\.manifest$")
_V1_NAME = re.compile(r"^(\d{1,19})\.manifest$")

#: Transaction operations by their field number in ``Transaction.operation``.
OPERATIONS = {
    100: "Append",
    101: "Delete",
    102: "Overwrite",
    103: "CreateIndex",
    104: "Rewrite",
    105: "Merge",
    106: "Restore",
    107: "ReserveFragments",
    108: "Update",
    109: "Project",
    110: "UpdateConfig",
    111: "DataReplacement",
    112: "UpdateMemWalState",
    113: "Clone",
    114: "UpdateBases",
    115: "DataOverlay",
    116: "UserOperation",
}

#: The most physical rows a fragment (and a row-id range) may claim: row offsets within a fragment
#: are 32-bit in Lance, and deltatail allocates per row when it plans a fragment, so a manifest
#: claiming more is refused (an :class:`InvalidLogError` naming the dataset, version and manifest)
#: instead of allocating by an untrusted number.
MAX_FRAGMENT_ROWS = 1 << 30
#: The ``DataFragment`` fields deltatail reads or may ignore (row version sequences, 7-10, do not
#: change a row's values). Any other field is a feature it does not know.
_FRAGMENT_FIELDS = frozenset(range(1, 11))


def manifest_name(version: int, *, v2: bool = True) -> str:
    """The file name of ``version``'s manifest under the V2 (default) or V1 naming scheme."""
    return f"{U64_MAX - version:020d}.manifest" if v2 else f"{version}.manifest"


def parse_manifest_name(name: str) -> tuple[int, bool] | None:
    """``(version, v2)`` for a manifest name of either scheme; ``None`` for anything else in ``_versions/``."""
    m = _V2_NAME.match(name)
    if m:
        return U64_MAX - int(m.group(1)), True
    m = _V1_NAME.match(name)
    if m:
        return int(m.group(1)), False
    return None


@dataclass(frozen=True, slots=True)
class LanceField:
    """One field of a Lance schema (``lance.file.Field``); nested fields point at their parent's id."""

    id: int
    parent_id: int
    name: str
    logical_type: str
    kind: int  # 0 parent (struct), 1 repeated (list), 2 leaf
    nullable: bool


@dataclass(frozen=True, slots=True)
class DataFile:
    """One data file of a fragment: its path below ``data/`` and the field ids it holds (-2: tombstoned)."""

    path: str
    fields: tuple[int, ...]


@dataclass(frozen=True, slots=True)
class DeletionFile:
    """A fragment's deletion file: the physical row offsets deleted so far.

    Attributes:
        bitmap: ``.bin`` (a Roaring bitmap) when true, else ``.arrow`` (an Arrow IPC file of offsets).
    """

    fragment_id: int
    bitmap: bool
    read_version: int
    id: int
    num_deleted_rows: int

    @property
    def path(self) -> str:
        """The file's path below the dataset root: ``_deletions/<fragment>-<read_version>-<id>.<arrow|bin>``."""
        ext = "bin" if self.bitmap else "arrow"
        return f"_deletions/{self.fragment_id}-{self.read_version}-{self.id}.{ext}"


@dataclass(frozen=True, slots=True)
class ExternalRowIds:
    """A fragment's row-id sequence stored in a file: ``size`` bytes at ``offset`` of ``path``."""

    path: str
    offset: int
    size: int


@dataclass(frozen=True, slots=True)
class Fragment:
    """One fragment of a version: data files holding the same rows, and the rows deleted from them.

    Attributes:
        row_ids: the stable row ids of the fragment's physical rows: inline ``RowIdSequence`` bytes,
            a reference to them, or ``None`` (a dataset without stable row ids).
        unknown_fields: ``DataFragment`` field numbers deltatail does not know (refused when planning).
    """

    id: int
    files: tuple[DataFile, ...]
    physical_rows: int
    deletion: DeletionFile | None
    row_ids: bytes | ExternalRowIds | None = field(default=None, compare=False)
    unknown_fields: tuple[int, ...] = ()

    @property
    def live_rows(self) -> int:
        """Rows not deleted."""
        return self.physical_rows - (self.deletion.num_deleted_rows if self.deletion else 0)

    def same_rows(self, other: Fragment) -> bool:
        """Whether ``other`` holds the same physical rows: the same id and at least one data file in common.

        Fragment ids are reused after a ``Restore`` (the id counter goes back with it), so the id
        alone does not name a fragment across versions; data files are never rewritten in place.
        """
        if self.id != other.id or self.physical_rows != other.physical_rows:
            return False
        mine = {f.path for f in self.files}
        return any(f.path in mine for f in other.files)

    def field_files(self) -> dict[int, str]:
        """Which data file holds each (non-tombstoned) field id."""
        return {fid: f.path for f in self.files for fid in f.fields if fid >= 0}


@dataclass(frozen=True, slots=True)
class Manifest:
    """One version of a Lance dataset: its schema and fragments (the Lance counterpart of a snapshot).

    Attributes:
        timestamp_us: the version's creation time (UTC, microseconds since the epoch).
        transaction_section: where in the manifest file the transaction is, if it is there.
        transaction_file: the transaction's file below ``_transactions/``, if one was written.
    """

    version: int
    timestamp_us: int
    fields: tuple[LanceField, ...]
    fragments: tuple[Fragment, ...]
    reader_flags: int
    writer_flags: int
    transaction_file: str
    transaction_section: int | None
    config: dict[str, str]
    base_paths: int = 0

    @property
    def stable_row_ids(self) -> bool:
        """Whether rows keep their ids across updates and compaction (the ``move_stable_row_ids`` flag)."""
        return bool(self.reader_flags & FLAG_STABLE_ROW_IDS)

    @property
    def live_rows(self) -> int:
        """Rows not deleted, over all fragments."""
        return sum(f.live_rows for f in self.fragments)

    def fragment(self, fragment_id: int) -> Fragment | None:
        """The fragment with this id, if the version has it."""
        for f in self.fragments:
            if f.id == fragment_id:
                return f
        return None

    def schema(self) -> StructType:
        """The schema as a :class:`~state.schema.StructType`, for the additive-change rules.

        Leaf types keep Lance's logical type names (``int64``, ``string``, ...); each field carries
        its Lance field id as its physical name, so a column dropped and added again under the same
        name is a change, as a rename is.
        """
        return lance_struct(self.fields)

    def require_supported(self, table: str | None = None) -> None:
        """Refuse what deltatail cannot read exactly.

        Raises:
            UnsupportedFeatureError: unknown reader feature flags, data in other base paths, or a
                fragment field deltatail does not know; naming the version.
        """
        unknown = self.reader_flags & ~KNOWN_READER_FLAGS
        if unknown:
            flags = frozenset(f"reader flag {1 << b}" for b in range(64) if unknown >> b & 1)
            raise UnsupportedFeatureError(
                f"the manifest needs Lance reader features deltatail does not know: {', '.join(sorted(flags))}",
                features=flags,
                table=table,
                version=self.version,
            )
        if self.base_paths:
            raise UnsupportedFeatureError(
                "the dataset keeps files in other base paths (a shallow clone or imported files)",
                features=frozenset({"base_paths"}),
                table=table,
                version=self.version,
            )
        for f in self.fragments:
            if f.unknown_fields:
                raise UnsupportedFeatureError(
                    f"fragment {f.id} has fields deltatail does not know ({', '.join(map(str, f.unknown_fields))}; "
                    "data overlays?)",
                    features=frozenset(f"DataFragment field {n}" for n in f.unknown_fields),
                    table=table,
                    version=self.version,
                )


@dataclass(frozen=True, slots=True)
class Transaction:
    """What made a version: its operation (``Append``, ``Delete``, ``Update``, ``Rewrite``...).

    Attributes:
        operation: the operation's name (:data:`OPERATIONS`), ``"Unknown"`` for a number not listed there.
        rewrite_columns: an ``Update`` that rewrote columns in place (``REWRITE_COLUMNS``) instead of rows.
        restore_version: for a ``Restore``, the version restored.
    """

    read_version: int
    uuid: str
    operation: str
    rewrite_columns: bool = False
    restore_version: int | None = None


# -- decoding ------------------------------------------------------------------------------------


def _message_at(data: bytes, position: int, what: str) -> bytes:
    if position < 0 or position + 4 > len(data):
        raise InvalidLogError(f"{what} position {position} is outside the file ({len(data)} bytes)")
    (length,) = struct.unpack_from("<I", data, position)
    start = position + 4
    if start + length > len(data):
        raise InvalidLogError(f"{what} of {length} bytes at {position} runs past the end of the file")
    return data[start : start + length]


def _footer(data: bytes) -> int:
    if len(data) < FOOTER_SIZE or data[-4:] != MAGIC:
        raise InvalidLogError("not a Lance manifest (no LANC magic at the end)")
    (position,) = struct.unpack_from("<q", data, len(data) - FOOTER_SIZE)
    return int(position)


def _lance_field(buf: bytes) -> LanceField:
    kind, name, fid, parent, logical, nullable = 0, "", 0, -1, "", False
    for number, _, value in fields(buf):
        if number == 1:
            kind = as_int(value, "Field.type")
        elif number == 2:
            name = text(value, "Field.name")
        elif number == 3:
            fid = signed32(as_int(value, "Field.id"))
        elif number == 4:
            parent = signed32(as_int(value, "Field.parent_id"))
        elif number == 5:
            logical = text(value, "Field.logical_type")
        elif number == 6:
            nullable = bool(as_int(value, "Field.nullable"))
    return LanceField(fid, parent, name, logical, kind, nullable)


def _data_file(buf: bytes) -> tuple[DataFile, bool]:
    path, ids, base = "", [], False
    for number, _, value in fields(buf):
        if number == 1:
            path = text(value, "DataFile.path")
        elif number == 2:
            ids += [signed32(v) for v in packed_varints(value, "DataFile.fields")]
        elif number == 7:
            base = True
    if not path:
        raise InvalidLogError("a data file has no path")
    return DataFile(path, tuple(ids)), base


def _deletion_file(buf: bytes, fragment_id: int) -> tuple[DeletionFile | None, bool]:
    kind = read_version = fid = count = 0
    base = False
    for number, _, value in fields(buf):
        if number == 1:
            kind = as_int(value, "DeletionFile.file_type")
        elif number == 2:
            read_version = as_int(value, "DeletionFile.read_version")
        elif number == 3:
            fid = as_int(value, "DeletionFile.id")
        elif number == 4:
            count = as_int(value, "DeletionFile.num_deleted_rows")
        elif number == 7:
            base = True
    if kind not in (0, 1):
        raise InvalidLogError(f"deletion file of fragment {fragment_id} has unknown type {kind}")
    if count == 0 and fid == 0:
        return None, base
    return DeletionFile(fragment_id, kind == 1, read_version, fid, count), base


def _external(buf: bytes) -> ExternalRowIds:
    path, offset, size = "", 0, 0
    for number, _, value in fields(buf):
        if number == 1:
            path = text(value, "ExternalFile.path")
        elif number == 2:
            offset = as_int(value, "ExternalFile.offset")
        elif number == 3:
            size = as_int(value, "ExternalFile.size")
    return ExternalRowIds(path, offset, size)


def _fragment(buf: bytes) -> tuple[Fragment, bool]:
    fid, rows = 0, 0
    files: list[DataFile] = []
    deletion_bytes: bytes | None = None
    row_ids: bytes | ExternalRowIds | None = None
    unknown: list[int] = []
    base = False
    for number, _, value in fields(buf):
        if number == 1:
            fid = as_int(value, "DataFragment.id")
        elif number == 2:
            data_file, in_base = _data_file(as_bytes(value, "DataFragment.files"))
            files.append(data_file)
            base = base or in_base
        elif number == 3:
            deletion_bytes = as_bytes(value, "DataFragment.deletion_file")
        elif number == 4:
            rows = as_int(value, "DataFragment.physical_rows")
            if rows > MAX_FRAGMENT_ROWS:
                raise InvalidLogError(
                    f"fragment claims {rows} physical rows, more than deltatail's limit of {MAX_FRAGMENT_ROWS}"
                )
        elif number == 5:
            row_ids = as_bytes(value, "DataFragment.inline_row_ids")
        elif number == 6:
            row_ids = _external(as_bytes(value, "DataFragment.external_row_ids"))
        elif number not in _FRAGMENT_FIELDS:
            unknown.append(number)
    deletion = None
    if deletion_bytes is not None:
        deletion, in_base = _deletion_file(deletion_bytes, fid)
        base = base or in_base
    return Fragment(fid, tuple(files), rows, deletion, row_ids, tuple(sorted(set(unknown)))), base


def _map_entry(buf: bytes, name: str) -> tuple[str, str]:
    key, val = "", ""
    for number, _, value in fields(buf):
        if number == 1:
            key = text(value, f"{name}.key")
        elif number == 2:
            val = text(value, f"{name}.value")
    return key, val


def _timestamp_us(buf: bytes) -> int:
    seconds = nanos = 0
    for number, _, value in fields(buf):
        if number == 1:
            seconds = as_int(value, "Timestamp.seconds")
            if seconds >= 1 << 63:
                seconds -= 1 << 64
        elif number == 2:
            nanos = signed32(as_int(value, "Timestamp.nanos"))
    return seconds * 1_000_000 + nanos // 1000


def decode_manifest(data: bytes) -> Manifest:
    """The manifest in a ``.manifest`` file's bytes.

    Raises:
        InvalidLogError: if the bytes are not a Lance manifest (no magic, positions outside the
            file, malformed protobuf).
    """
    message = _message_at(data, _footer(data), "manifest")
    lance_fields: list[LanceField] = []
    fragments: list[Fragment] = []
    version = timestamp = reader = writer = 0
    txn_file = ""
    txn_section: int | None = None
    config: dict[str, str] = {}
    base_paths = 0
    for number, _, value in fields(message):
        if number == 1:
            lance_fields.append(_lance_field(as_bytes(value, "Manifest.fields")))
        elif number == 2:
            fragment, in_base = _fragment(as_bytes(value, "Manifest.fragments"))
            fragments.append(fragment)
            base_paths += in_base
        elif number == 3:
            version = as_int(value, "Manifest.version")
        elif number == 7:
            timestamp = _timestamp_us(as_bytes(value, "Manifest.timestamp"))
        elif number == 9:
            reader = as_int(value, "Manifest.reader_feature_flags")
        elif number == 10:
            writer = as_int(value, "Manifest.writer_feature_flags")
        elif number == 12:
            txn_file = text(value, "Manifest.transaction_file")
        elif number == 16:
            key, val = _map_entry(as_bytes(value, "Manifest.config"), "Manifest.config")
            config[key] = val
        elif number == 18:
            base_paths += 1
        elif number in (21, 23):  # transaction_section (23), and its deprecated predecessor (21)
            txn_section = as_int(value, "Manifest.transaction_section")
    return Manifest(
        version=version,
        timestamp_us=timestamp,
        fields=tuple(lance_fields),
        fragments=tuple(fragments),
        reader_flags=reader,
        writer_flags=writer,
        transaction_file=txn_file,
        transaction_section=txn_section,
        config=config,
        base_paths=base_paths,
    )


def transaction_bytes(data: bytes, manifest: Manifest) -> bytes | None:
    """The transaction message inside a manifest file, if the manifest says it is there.

    Raises:
        InvalidLogError: if the section lies outside the file.
    """
    if manifest.transaction_section is None:
        return None
    return _message_at(data, manifest.transaction_section, "transaction section")


def transaction_file_message(data: bytes) -> bytes:
    """The transaction message of a ``_transactions/*.txn`` file (the whole file is the message)."""
    return data


def decode_transaction(message: bytes) -> Transaction:
    """A ``lance.table.Transaction`` message.

    Raises:
        InvalidLogError: if the bytes are malformed or hold no operation.
    """
    read_version = 0
    uuid = ""
    operation: str | None = None
    rewrite_columns = False
    restore: int | None = None
    for number, _, value in fields(message):
        if number == 1:
            read_version = as_int(value, "Transaction.read_version")
        elif number == 2:
            uuid = text(value, "Transaction.uuid")
        elif number >= 100:
            operation = OPERATIONS.get(number, "Unknown")
            body = as_bytes(value, operation)
            if number == 108:
                for n, _, v in fields(body):
                    if n == 7:
                        rewrite_columns = as_int(v, "Update.update_mode") == 1
            elif number == 106:
                for n, _, v in fields(body):
                    if n == 1:
                        restore = as_int(v, "Restore.version")
    if operation is None:
        raise InvalidLogError("the transaction holds no operation")
    return Transaction(read_version, uuid, operation, rewrite_columns, restore)


# -- schema --------------------------------------------------------------------------------------


def lance_struct(lance_fields: tuple[LanceField, ...]) -> StructType:
    """Lance's flat field list as a nested :class:`~state.schema.StructType` (see :meth:`Manifest.schema`)."""
    ids = {f.id for f in lance_fields}
    children: dict[int, list[LanceField]] = {}
    for f in lance_fields:
        children.setdefault(f.parent_id if f.parent_id in ids else -1, []).append(f)

    def build(f: LanceField) -> StructField:
        return StructField(f.name, type_of(f), f.nullable, {PHYSICAL_NAME_KEY: f"lance-field-{f.id}"})

    def type_of(f: LanceField) -> DataType:
        kids = children.get(f.id, [])
        if f.logical_type.startswith(("list", "large_list")):
            if f.logical_type.endswith(".struct"):
                return ArrayType(StructType(tuple(build(k) for k in kids)), True)
            if len(kids) == 1:
                return ArrayType(type_of(kids[0]), kids[0].nullable)
            return ArrayType(PrimitiveType(f.logical_type), True)
        if kids:
            return StructType(tuple(build(k) for k in kids))
        return PrimitiveType(f.logical_type)

    return StructType(tuple(build(f) for f in children.get(-1, [])))
