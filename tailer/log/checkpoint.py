"""Reading checkpoints: classic, multi-part and V2 (JSON or Parquet, with sidecars).

Protocol, "Checkpoints": a checkpoint holds "the complete replay of all
actions up until this version, with invalid actions removed" — protocol,
metadata, txns, live ``add`` files and unexpired ``remove`` tombstones. The
newer revision's V2 checkpoints hold the non-file actions plus ``sidecar``
actions naming files in ``_delta_log/_sidecars`` that hold the file actions;
"readers MUST read all sidecar files" for a complete state.

Parquet is read with pyarrow, projecting only the action fields a snapshot
keeps (``stats`` and ``tags`` are never read), and ``add``/``remove`` rows go
straight from Arrow columns into the snapshot's columnar file tables.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import pyarrow as pa
import pyarrow.parquet as pq

from deltatail.state.actions import (
    Action,
    Add,
    DeletionVector,
    DomainMetadata,
    Metadata,
    Protocol,
    Remove,
    Sidecar,
    Txn,
    decode_path,
    parse_action,
    parse_json_actions,
)
from deltatail.state.errors import (
    DeltaTailError,
    IncompleteCheckpointError,
    InvalidLogError,
    MissingFileError,
    UnsafePathError,
)
from deltatail.state.files import FileTable, PartitionValuesPool
from deltatail.state.paths import resolve_logged_path
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.storage import Storage, to_local_path

_ADD_FIELDS = (
    "path",
    "partitionValues",
    "size",
    "modificationTime",
    "deletionVector",
    "baseRowId",
    "defaultRowCommitVersion",
)
_REMOVE_FIELDS = (
    "path",
    "deletionTimestamp",
    "partitionValues",
    "size",
    "deletionVector",
    "baseRowId",
    "defaultRowCommitVersion",
)
_OTHER_ACTIONS = ("protocol", "metaData", "txn", "domainMetadata", "sidecar", "checkpointMetadata")


@dataclass
class CheckpointState:
    """What a checkpoint (and its sidecars) held, accumulated part by part."""

    protocol: Protocol | None = None
    metadata: Metadata | None = None
    txns: dict[str, int] = field(default_factory=dict)
    domains: dict[str, DomainMetadata] = field(default_factory=dict)
    sidecars: list[Sidecar] = field(default_factory=list)
    pool: PartitionValuesPool = field(default_factory=PartitionValuesPool)
    files: FileTable = field(init=False)
    tombstones: FileTable = field(init=False)

    def __post_init__(self) -> None:
        self.files = FileTable(self.pool)
        self.tombstones = FileTable(self.pool)

    def add_actions(self, actions: Iterable[Action]) -> None:
        """Fold parsed actions in (JSON checkpoints, sidecars, non-file Parquet rows)."""
        for action in actions:
            match action:
                case Add():
                    self.files.put_add(action)
                case Remove():
                    self.tombstones.put_remove(action)
                case Protocol():
                    self.protocol = action
                case Metadata():
                    self.metadata = action
                case Txn():
                    self.txns[action.app_id] = action.version
                case DomainMetadata():
                    if not action.removed:
                        self.domains[action.domain] = action
                case Sidecar():
                    self.sidecars.append(action)
                case _:
                    pass

    def to_snapshot(self, table: str, version: int) -> Snapshot:
        """The snapshot at ``version``. Raises as :meth:`Snapshot.from_checkpoint`."""
        return Snapshot.from_checkpoint(
            table, version, self.protocol, self.metadata, self.txns, self.domains, self.files, self.tombstones
        )


def read_json_checkpoint_file(storage: Storage, path: str, into: CheckpointState) -> None:
    """Read a JSON checkpoint or sidecar (newline-delimited actions) into ``into``.

    Raises:
        MissingFileError: if the file is absent.
        InvalidLogError: if a line is not valid JSON or not a valid action.
    """
    into.add_actions(parse_json_actions(storage.read(path)))


def read_parquet_checkpoint_file(storage: Storage, path: str, into: CheckpointState) -> None:
    """Read a Parquet checkpoint part or sidecar into ``into``, projecting only needed fields.

    Raises:
        IncompleteCheckpointError: if the file is missing, is not readable Parquet, or an add or remove
            field does not have the protocol's type.
        InvalidLogError: if an action in it is malformed; the error names the file.
    """
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    try:
        source = storage.open_input(path)
    except MissingFileError as e:
        raise IncompleteCheckpointError("checkpoint file is missing", file=path) from e
    except (OSError, pa.ArrowException) as e:
        raise IncompleteCheckpointError(f"checkpoint file is unreadable: {e}", file=path) from e
    try:
        with pq.ParquetFile(source) as pf:
            columns = _projection(pf.schema_arrow)
            table = pf.read(columns=columns) if columns else None
    except (OSError, pa.ArrowException) as e:
        raise IncompleteCheckpointError(f"checkpoint file is missing or unreadable: {e}", file=path) from e
    except DeltaTailError as e:
        raise e.at(file=path) from None
    finally:
        source.close()
    if table is None:
        return
    names = set(table.column_names)
    try:
        for action, is_add in (("add", True), ("remove", False)):
            if action in names:
                struct = table.column(action).combine_chunks()
                _load_file_rows(struct, into.files if is_add else into.tombstones, is_add=is_add)
        for name in _OTHER_ACTIONS:
            if name not in names:
                continue
            column = table.column(name)
            present = column.filter(pc.is_valid(column))
            for value in present.to_pylist(maps_as_pydicts="lossy"):
                parsed = parse_action({name: value})
                if parsed is not None:
                    into.add_actions([parsed])
    except pa.ArrowException as e:  # a value a checked column type still cannot hold (an overflowing cast)
        raise IncompleteCheckpointError(f"checkpoint file is unreadable: {e}", file=path) from e
    except DeltaTailError as e:
        raise e.at(file=path) from None


def _is_text(t: pa.DataType) -> bool:
    return bool(pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t))


def _is_text_map(t: pa.DataType) -> bool:
    return bool(
        pa.types.is_map(t) and _is_text(t.key_type) and (_is_text(t.item_type) or pa.types.is_null(t.item_type))
    )


#: The Arrow types a checkpoint's add/remove fields may have (a null-typed column is read as all absent).
_FILE_FIELD_TYPES: dict[str, tuple[str, Callable[[pa.DataType], bool]]] = {
    "path": ("a string", _is_text),
    "partitionValues": ("a map of strings", _is_text_map),
    "size": ("an integer", pa.types.is_integer),
    "modificationTime": ("an integer", pa.types.is_integer),
    "deletionTimestamp": ("an integer", pa.types.is_integer),
    "baseRowId": ("an integer", pa.types.is_integer),
    "defaultRowCommitVersion": ("an integer", pa.types.is_integer),
    "deletionVector": ("a struct", pa.types.is_struct),
}


def _check_file_columns(dtype: pa.DataType, action: str) -> None:
    """Refuse an ``add``/``remove`` column whose fields do not have the protocol's types.

    Raises:
        IncompleteCheckpointError: naming the field and the type found (the checkpoint is unreadable: a
            snapshot may still be built from an older checkpoint or the commits).
    """
    if not pa.types.is_struct(dtype):
        raise IncompleteCheckpointError(f"checkpoint file is unreadable: column {action!r} is {dtype}, not a struct")
    for f in dtype:
        expected = _FILE_FIELD_TYPES.get(f.name)
        if expected is not None and not pa.types.is_null(f.type) and not expected[1](f.type):
            raise IncompleteCheckpointError(
                f"checkpoint file is unreadable: {action}.{f.name} is {f.type}, the protocol says {expected[0]}"
            )


def _projection(schema: pa.Schema) -> list[str]:
    columns: list[str] = []
    for action, wanted in (("add", _ADD_FIELDS), ("remove", _REMOVE_FIELDS)):
        if action in schema.names:
            _check_file_columns(schema.field(action).type, action)
            present = {f.name for f in schema.field(action).type}
            columns += [f"{action}.{name}" for name in wanted if name in present]
    columns += [name for name in _OTHER_ACTIONS if name in schema.names]
    return columns


def _field(struct: pa.StructArray, name: str) -> pa.Array | None:
    index = struct.type.get_field_index(name)
    return None if index < 0 else struct.field(index)


def _ints(struct: pa.StructArray, name: str) -> list[int]:
    """An integer field as a list, absent values as ``-1`` (the file tables' marker)."""
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    child = _field(struct, name)
    if child is None:
        return [-1] * len(struct)
    return list(pc.fill_null(child.cast(pa.int64()), -1).to_pylist())


def _optional_ints(struct: pa.StructArray, name: str) -> list[int | None] | None:
    child = _field(struct, name)
    if child is None or child.null_count == len(child):
        return None
    return list(child.to_pylist())


def _partition_ids(struct: pa.StructArray, pool: PartitionValuesPool, *, is_add: bool) -> list[int]:
    """Intern each row's ``partitionValues`` map, decoding each distinct map only once."""
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    child = _field(struct, "partitionValues")
    n = len(struct)
    if child is None:
        return [pool.intern({} if is_add else None)] * n
    if not is_add and child.null_count == n:
        return [0] * n
    # One string per row that identifies its map; distinct strings are decoded once.
    keys = pc.fill_null(child.keys, "")
    items = pc.fill_null(pc.binary_join_element_wise(pc.cast(child.items, pa.string()), "\x02", "\x03"), "\x03")
    pairs = pc.binary_join_element_wise(keys, items, "\x01")
    rows = pa.ListArray.from_arrays(child.offsets, pairs)
    encoded = pc.dictionary_encode(pc.binary_join(rows, "\x00"))
    indices = encoded.indices.to_pylist()
    first_row: dict[int, int] = {}
    for row, idx in enumerate(indices):
        first_row.setdefault(idx, row)
    ids_by_index: dict[int, int] = {}
    for idx, row in first_row.items():
        value = child[row].as_py(maps_as_pydicts="lossy") if child[row].is_valid else None
        ids_by_index[idx] = pool.intern(dict(value) if value is not None else ({} if is_add else None))
    return [ids_by_index[i] for i in indices]


def _load_file_rows(struct: pa.StructArray, table: FileTable, *, is_add: bool) -> None:
    """Move the non-null rows of an ``add`` or ``remove`` struct column into ``table``."""
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    path_index = struct.type.get_field_index("path")
    if path_index < 0:
        return
    # A child of a struct array ignores the parent's nulls: filter on both.
    struct = struct.filter(pc.and_(pc.is_valid(struct), pc.is_valid(struct.field(path_index))))
    if len(struct) == 0:
        return
    path_array = struct.field(path_index)
    paths: list[str] = path_array.to_pylist()
    encoded = pc.or_(pc.match_substring(path_array, "%"), pc.starts_with(path_array, "file:"))
    if encoded.true_count:
        for i in pc.indices_nonzero(encoded).to_pylist():
            paths[i] = decode_path(paths[i])
    dvs: list[DeletionVector | None] | None = None
    dv_col = _field(struct, "deletionVector")
    if dv_col is not None and dv_col.null_count < len(dv_col):
        dvs = [DeletionVector.parse(raw) for raw in dv_col.to_pylist()]
    table.extend(
        paths,
        _ints(struct, "size"),
        _ints(struct, "modificationTime" if is_add else "deletionTimestamp"),
        _partition_ids(struct, table.pool, is_add=is_add),
        dvs,
        _optional_ints(struct, "baseRowId"),
        _optional_ints(struct, "defaultRowCommitVersion"),
    )


def load_checkpoint(
    storage: Storage,
    log_dir: str,
    names: list[str],
    fmt: str,
    *,
    table: str,
    version: int,
) -> Snapshot:
    """Build the snapshot at ``version`` from a checkpoint's files (all parts, then any sidecars).

    Args:
        storage: where the files are.
        log_dir: the ``_delta_log`` directory.
        names: the checkpoint's file names (every part of a multi-part checkpoint).
        fmt: ``parquet`` or ``json``.
        table: the table root, for messages.
        version: the checkpoint's version.

    Raises:
        IncompleteCheckpointError: if a part or a sidecar is missing or unreadable.
        UnsafePathError: if a sidecar's path is outside ``_delta_log/_sidecars`` (never opened).
        InvalidLogError: if the checkpoint holds malformed actions or lacks protocol or metadata.
        UnsupportedFeatureError: if the checkpoint's protocol needs unsupported reader features.
    """
    state = CheckpointState()
    for name in names:
        path = f"{log_dir}/{name}"
        try:
            if fmt == "json":
                read_json_checkpoint_file(storage, path, state)
            else:
                read_parquet_checkpoint_file(storage, path, state)
        except DeltaTailError as e:
            if not isinstance(e, InvalidLogError):
                e = IncompleteCheckpointError(f"checkpoint part is missing or unreadable: {e.message}")
            raise e.at(table=table, version=version, file=path) from None
    sidecars = f"{log_dir}/_sidecars"
    for sidecar in state.sidecars:
        try:  # "sidecar files must always reside in the table's own _delta_log/_sidecars directory"
            path = to_local_path(resolve_logged_path(sidecars, sidecar.path))
        except UnsafePathError as e:
            raise UnsafePathError(
                f"checkpoint sidecar {sidecar.path!r} is not in {sidecars}: refused before reading",
                table=table,
                version=version,
                file=e.file,
            ) from None
        if not storage.exists(path):
            raise IncompleteCheckpointError("checkpoint sidecar is missing", table=table, version=version, file=path)
        try:
            if path.endswith(".json"):
                read_json_checkpoint_file(storage, path, state)
            else:
                read_parquet_checkpoint_file(storage, path, state)
        except DeltaTailError as e:
            raise e.at(table=table, version=version, file=path) from None
    try:
        return state.to_snapshot(table, version)
    except DeltaTailError as e:
        raise e.at(file=f"{log_dir}/{names[0]}") from None
