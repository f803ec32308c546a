"""Reading an Iceberg plan's rows: Parquet data files through deltatail's storage, delete files applied.

A :class:`~state.iceberg.planning.RowTask` names a data file and two sets of delete files: rows are
taken when one of ``within`` deletes them (every row when ``within`` is ``None``) and none of ``minus``
does. Delete files are applied as the spec says:

- position deletes: "``file_path``: Full URI of a data file with FS scheme. This must match the
  ``file_path`` of the target data file in a manifest entry"; "``pos``: Ordinal position of a deleted
  row in the target data file identified by ``file_path``, starting at 0";
- equality deletes: "A data row is deleted if its values are equal to all the equality columns for
  any row in an equality delete file"; a null matches a null ("equality deletes use ``IS NULL``");
- deletion vectors (format v3): the positions of one ``deletion-vector-v1`` blob
  (:mod:`tailer.iceberg.vectors`), of the data file its ``referenced_data_file`` names.

Columns are matched by field id (``PARQUET:field_id``), never by name, so renamed columns read
right; a column the file does not have (added later) is null; values are cast to the snapshot's
schema (type promotions). A data file without field ids (a migrated table that needs a name
mapping) is refused.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from deltatail.state.errors import DataFileError, DeletionVectorError, DeltaTailError, UnsupportedFeatureError
from deltatail.state.feed import COMMIT_TIMESTAMP_TYPE
from deltatail.state.iceberg.model import EQUALITY_DELETES, ContentFile
from deltatail.state.iceberg.planning import IcebergPlan, RowTask
from deltatail.tailer.iceberg.metadata import IcebergTable
from deltatail.tailer.iceberg.vectors import read_vector, vector_positions
from deltatail.tailer.read.parquet_file import open_parquet

FIELD_ID = b"PARQUET:field_id"
#: The reserved field ids of a position delete file's columns.
DELETE_FILE_PATH_ID = 2147483546
DELETE_POS_ID = 2147483545
#: The column holding the snapshot id of every change row (after the three change columns).
SNAPSHOT_ID_COLUMN = "_snapshot_id"
#: The most delete files whose contents are kept between tasks.
DELETE_CACHE = 256


def field_id(field: pa.Field) -> int | None:
    """A field's Iceberg field id, ``None`` if it has none."""
    meta = field.metadata or {}
    raw = meta.get(FIELD_ID)
    return int(raw) if raw is not None else None


def output_schema(schema: pa.Schema) -> pa.Schema:
    """The change rows' schema: the table's columns (no field-id metadata) and the four change columns."""
    fields = [pa.field(f.name, _plain(f.type), True) for f in schema]
    return pa.schema(
        [
            *fields,
            pa.field("_change_type", pa.string()),
            pa.field("_commit_version", pa.int64()),
            pa.field("_commit_timestamp", COMMIT_TIMESTAMP_TYPE),
            pa.field(SNAPSHOT_ID_COLUMN, pa.int64()),
        ]
    )


def _plain(t: pa.DataType) -> pa.DataType:
    if pa.types.is_list(t):
        return pa.list_(pa.field(t.value_field.name, _plain(t.value_type), t.value_field.nullable))
    if pa.types.is_map(t):
        return pa.map_(
            pa.field(t.key_field.name, _plain(t.key_type), False),
            pa.field(t.item_field.name, _plain(t.item_type), t.item_field.nullable),
        )
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type), f.nullable) for f in t])
    return t


def _row_keys(columns: list[pa.ChunkedArray | pa.Array]) -> list[bytes]:
    """A canonical byte key per row over ``columns`` (nulls compare equal, as equality deletes need)."""
    values = [c.to_pylist() for c in columns]
    return [
        orjson.dumps(row, default=repr, option=orjson.OPT_PASSTHROUGH_DATETIME) for row in zip(*values, strict=True)
    ]


class IcebergRows:
    """Reads the rows of planned snapshots.

    Args:
        table: the table (its storage and path rule).
    """

    def __init__(self, table: IcebergTable) -> None:
        self.table = table
        self._positions: OrderedDict[str, dict[str, pa.Array]] = OrderedDict()
        self._equality: OrderedDict[str, set[bytes]] = OrderedDict()
        self._vectors: OrderedDict[tuple[str, int | None], pa.Array] = OrderedDict()

    # -- files ---------------------------------------------------------------------------------

    def _read(self, path: str, size: int | None) -> pa.Table:
        where = self.table.resolve(path)
        opened = open_parquet(self.table.storage, where, size=size)
        try:
            return opened.parquet.read()
        except (pa.ArrowException, OSError) as e:
            raise DataFileError(f"cannot read Parquet data: {e}", file=path) from e
        finally:
            opened.parquet.close()
            opened.source.close()

    def _by_id(self, table: pa.Table, path: str) -> dict[int, int]:
        ids = {fid: i for i, f in enumerate(table.schema) if (fid := field_id(f)) is not None}
        if table.num_columns and not ids:
            raise UnsupportedFeatureError(
                "the file's columns carry no Iceberg field ids (a migrated table needing a name mapping): "
                "not supported",
                features=frozenset({"name mapping"}),
                file=path,
            )
        return ids

    def _position_deletes(self, delete: ContentFile) -> dict[str, pa.Array]:
        found = self._positions.get(delete.path)
        if found is None:
            rows = self._read(delete.path, delete.size)
            ids = self._by_id(rows, delete.path)
            if DELETE_FILE_PATH_ID not in ids or DELETE_POS_ID not in ids:
                raise DataFileError("position delete file has no file_path and pos columns", file=delete.path)
            paths = rows.column(ids[DELETE_FILE_PATH_ID])
            positions = rows.column(ids[DELETE_POS_ID]).cast(pa.int64())
            found = {}
            for p in pc.unique(paths).to_pylist():
                found[str(p)] = pc.filter(positions, pc.equal(paths, p)).combine_chunks()
            self._positions[delete.path] = found
            while len(self._positions) > DELETE_CACHE:
                self._positions.popitem(last=False)
        else:
            self._positions.move_to_end(delete.path)
        return found

    def _equality_keys(self, delete: ContentFile) -> set[bytes]:
        found = self._equality.get(delete.path)
        if found is None:
            rows = self._read(delete.path, delete.size)
            ids = self._by_id(rows, delete.path)
            missing = [i for i in delete.equality_ids if i not in ids]
            if missing:
                raise DataFileError(f"equality delete file lacks its equality field ids {missing}", file=delete.path)
            found = set(_row_keys([rows.column(ids[i]) for i in delete.equality_ids]))
            self._equality[delete.path] = found
            while len(self._equality) > DELETE_CACHE:
                self._equality.popitem(last=False)
        else:
            self._equality.move_to_end(delete.path)
        return found

    def _vector_positions(self, delete: ContentFile) -> pa.Array:
        key = (delete.path, delete.content_offset)
        found = self._vectors.get(key)
        if found is None:
            found = vector_positions(read_vector(self.table.storage, self.table.resolve(delete.path), delete))
            self._vectors[key] = found
            while len(self._vectors) > DELETE_CACHE:
                self._vectors.popitem(last=False)
        else:
            self._vectors.move_to_end(key)
        return found

    def _positions_in(self, delete: ContentFile, data: ContentFile) -> pa.Array | None:
        """The positions ``delete`` (a position delete file or a deletion vector) deletes in ``data``."""
        if delete.is_deletion_vector:
            return self._vector_positions(delete) if delete.referenced_data_file == data.path else None
        return self._position_deletes(delete).get(data.path)

    def _deleted(
        self, deletes: Iterable[ContentFile], data: ContentFile, rows: pa.Table, ids: dict[int, int]
    ) -> pa.Array:
        """A boolean per row of ``data``: deleted by any of ``deletes``."""
        n = rows.num_rows
        mask = pa.array([False] * n, pa.bool_()) if n else pa.array([], pa.bool_())
        for d in deletes:
            if d.content == EQUALITY_DELETES:
                keys = self._equality_keys(d)
                missing = [i for i in d.equality_ids if i not in ids]
                if missing:  # a column the data file does not have: all its values are null
                    columns = [rows.column(ids[i]) if i in ids else pa.nulls(n) for i in d.equality_ids]
                else:
                    columns = [rows.column(ids[i]) for i in d.equality_ids]
                hit = pa.array([k in keys for k in _row_keys(columns)], pa.bool_())
            else:
                positions = self._positions_in(d, data)
                if positions is None or not len(positions):
                    continue
                top = pc.max(positions).as_py()
                if top >= n or pc.min(positions).as_py() < 0:
                    kind, error = (
                        ("deletion vector", DeletionVectorError)
                        if d.is_deletion_vector
                        else ("position delete file", DataFileError)
                    )
                    raise error(f"{kind} names row {top} of a {n}-row data file {data.path}", file=d.path)
                hit = pc.is_in(pa.array(range(n), positions.type), value_set=positions)
            mask = pc.or_(mask, hit)
        return mask

    # -- tasks ---------------------------------------------------------------------------------

    def task_rows(self, task: RowTask, schema: pa.Schema) -> pa.Table:
        """The rows ``task`` takes, in the columns of ``schema`` (an :func:`arrow_schema`, with field ids).

        Raises:
            MissingFileError: if the data or a delete file is gone.
            DataFileError: if one cannot be read, or a delete file disagrees with its data file.
            DeletionVectorError: if a deletion vector does not decode or disagrees with its data file
                (:func:`tailer.iceberg.vectors.read_vector`).
            InvalidLogError: if a deletion vector's manifest entry lacks its place in its Puffin file
                (:func:`tailer.iceberg.vectors.check_vector_entry`).
            UnsafePathError: if a delete file is outside the table root.
            UnsupportedFeatureError: for a data file without field ids.
        """
        f = task.file
        try:
            rows = self._read(f.path, f.size)
            if rows.num_rows != f.record_count:
                raise DataFileError(f"data file holds {rows.num_rows} rows; its manifest entry says {f.record_count}")
            ids = self._by_id(rows, f.path)
            keep = pc.invert(self._deleted(task.minus, f, rows, ids))
            if task.within is not None:
                keep = pc.and_(keep, self._deleted(task.within, f, rows, ids))
            return _project(rows.filter(keep), ids, schema)
        except DeltaTailError as e:
            raise e.at(file=f.path) from None

    def plan_table(self, plan: IcebergPlan, schema: pa.Schema) -> pa.Table:
        """Every row of ``plan`` in task order, with the change columns (before cancellation).

        Raises:
            As :meth:`task_rows`; a deletion vector's error names the snapshot id.
        """
        out = output_schema(schema)
        parts = []
        for task in plan.tasks:
            try:
                rows = self.task_rows(task, schema)
            except DeletionVectorError as e:
                raise DeletionVectorError(
                    f"snapshot {plan.snapshot.snapshot_id}: {e.message}", table=e.table, version=e.version, file=e.file
                ) from None
            n = rows.num_rows
            if not n:
                continue
            parts.append(
                pa.Table.from_arrays(
                    [
                        *rows.columns,
                        pa.repeat(pa.scalar(task.change_type), n),
                        pa.repeat(pa.scalar(plan.version, pa.int64()), n),
                        pa.repeat(pa.scalar(plan.timestamp_ms * 1000, COMMIT_TIMESTAMP_TYPE), n),
                        pa.repeat(pa.scalar(plan.snapshot.snapshot_id, pa.int64()), n),
                    ],
                    schema=out,
                )
            )
        return pa.concat_tables(parts) if parts else out.empty_table()


def _project(rows: pa.Table, ids: dict[int, int], schema: pa.Schema) -> pa.Table:
    """``rows`` (a data file's columns) as ``schema``'s columns, matched by field id."""
    n = rows.num_rows
    columns = []
    for f in schema:
        fid = field_id(f)
        target = _plain(f.type)
        i = ids.get(fid) if fid is not None else None
        if i is None:
            columns.append(pa.nulls(n, target))
            continue
        column = rows.column(i)
        if column.type != target:
            try:
                column = column.cast(target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as e:
                raise DataFileError(f"column {f.name} (field id {fid}) cannot be read as {target}: {e}") from e
        columns.append(column)
    return pa.Table.from_arrays(columns, schema=pa.schema([pa.field(f.name, _plain(f.type), True) for f in schema]))
