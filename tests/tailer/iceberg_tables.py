"""Iceberg tables for the tests: written by pyiceberg (SQL catalog on SQLite), plus delete files built from the spec.

pyiceberg 0.12 writes copy-on-write only (appends, overwrites, deletes, upserts, schema and partition
evolution); it writes no position or equality delete files. :func:`commit_deletes` builds them as the
Iceberg spec describes ("Delete Formats": a position delete file holds ``file_path`` (field id
2147483546) and ``pos`` (2147483545); an equality delete file holds the equality columns under their
field ids) and commits them in a new snapshot with pyiceberg's own manifest and manifest-list writers
(a manifest of content ``deletes``) and its metadata updates, so the table stays one pyiceberg reads.
"""

from __future__ import annotations

import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.manifest import (
    DataFile,
    DataFileContent,
    FileFormat,
    ManifestContent,
    ManifestEntry,
    ManifestEntryStatus,
    ManifestWriterV2,
    write_manifest_list,
)
from pyiceberg.partitioning import PartitionSpec
from pyiceberg.schema import Schema
from pyiceberg.table import Table
from pyiceberg.table.refs import SnapshotRefType
from pyiceberg.table.snapshots import Operation, Snapshot, Summary
from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate
from pyiceberg.typedef import Record
from pyiceberg.types import LongType, NestedField, StringType

SCHEMA = Schema(
    NestedField(1, "id", LongType(), required=True),
    NestedField(2, "name", StringType()),
    NestedField(3, "grp", LongType()),
    identifier_field_ids=[1],
)


def rows(ids: list[int], tag: str = "n") -> pa.Table:
    return pa.table(
        {
            "id": pa.array(ids, pa.int64()),
            "name": pa.array([f"{tag}{i}" for i in ids]),
            "grp": pa.array([i % 3 for i in ids], pa.int64()),
        },
        schema=SCHEMA.as_arrow(),
    )


def new_table(tmp_path: Path, version: int = 2, spec: PartitionSpec | None = None, **props: str) -> Table:
    cat = catalog(tmp_path)
    kwargs: dict[str, Any] = {"properties": {"format-version": str(version), **props}}
    if spec is not None:
        kwargs["partition_spec"] = spec
    return cat.create_table("db.t", SCHEMA, **kwargs)


FILE_PATH_ID = 2147483546
POS_ID = 2147483545


def catalog(root: Path) -> SqlCatalog:
    """A SQL catalog on SQLite with its warehouse under ``root``, and a namespace ``db``."""
    root.mkdir(parents=True, exist_ok=True)
    cat = SqlCatalog("test", uri=f"sqlite:///{root}/catalog.db", warehouse=f"file://{root}/warehouse")
    cat.create_namespace("db")
    return cat


def in_filter(ids: list[int], column: str = "id") -> str:
    """A pyiceberg row filter string: ``column`` is one of ``ids``."""
    return f"{column} in ({', '.join(map(str, ids))})"


def table_dir(table: Table) -> str:
    """The table's directory (the one holding ``metadata/``), as a local path."""
    return table.metadata_location.split("://", 1)[-1].rsplit("/metadata/", 1)[0]


def multiset(rows: list[dict[str, Any]], columns: list[str]) -> Counter[tuple[Any, ...]]:
    return Counter(tuple(r[c] for c in columns) for r in rows)


class _DeleteManifestWriter(ManifestWriterV2):
    def content(self) -> ManifestContent:
        return ManifestContent.DELETES

    @property
    def _meta(self) -> dict[str, str]:
        return {**super()._meta, "content": "deletes"}


def _write_parquet(table: Table, rows: pa.Table) -> tuple[str, int]:
    location = f"{table.location()}/data/deletes-{uuid.uuid4()}.parquet"
    local = location.split("://", 1)[-1]
    Path(local).parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(rows, local)
    return location, Path(local).stat().st_size


def position_delete_rows(deletes: list[tuple[str, int]]) -> pa.Table:
    """A position delete file's rows (sorted by path, then position, as the spec requires)."""
    deletes = sorted(deletes)
    schema = pa.schema(
        [
            pa.field("file_path", pa.string(), False, {b"PARQUET:field_id": str(FILE_PATH_ID).encode()}),
            pa.field("pos", pa.int64(), False, {b"PARQUET:field_id": str(POS_ID).encode()}),
        ]
    )
    return pa.table([pa.array([p for p, _ in deletes]), pa.array([i for _, i in deletes], pa.int64())], schema=schema)


def equality_delete_rows(table: Table, values: dict[str, list[Any]]) -> tuple[pa.Table, list[int]]:
    """An equality delete file's rows over the named columns, each under its field id; and the ids."""
    schema = table.schema()
    arrow = schema.as_arrow()
    fields, ids = [], []
    for name in values:
        fid = schema.find_field(name).field_id
        ids.append(fid)
        fields.append(pa.field(name, arrow.field(name).type, True, {b"PARQUET:field_id": str(fid).encode()}))
    return pa.table(
        [pa.array(v, f.type) for v, f in zip(values.values(), fields, strict=True)], schema=pa.schema(fields)
    ), ids


def commit_deletes(
    table: Table,
    *,
    positions: list[tuple[str, int]] | None = None,
    equality: dict[str, list[Any]] | None = None,
    partition: Record | None = None,
    spec_id: int | None = None,
) -> Table:
    """Commit one snapshot adding one delete file (position deletes or equality deletes) to ``table``."""
    md = table.metadata
    if positions is not None:
        rows, content, eq_ids = position_delete_rows(positions), DataFileContent.POSITION_DELETES, None
    else:
        rows, eq_ids = equality_delete_rows(table, equality or {})
        content = DataFileContent.EQUALITY_DELETES
    location, size = _write_parquet(table, rows)
    spec = md.spec() if spec_id is None else md.specs()[spec_id]
    data_file = DataFile.from_args(
        content=content,
        file_path=location,
        file_format=FileFormat.PARQUET,
        partition=partition if partition is not None else Record(),
        record_count=rows.num_rows,
        file_size_in_bytes=size,
        equality_ids=eq_ids,
    )
    data_file.spec_id = spec.spec_id
    snapshot_id = md.new_snapshot_id()
    sequence = md.next_sequence_number()
    parent = md.current_snapshot()
    manifest_path = f"{table.location()}/metadata/{uuid.uuid4()}-m0.avro"
    with _DeleteManifestWriter(spec, table.schema(), table.io.new_output(manifest_path), snapshot_id, "null") as w:
        w.add_entry(
            ManifestEntry.from_args(
                status=ManifestEntryStatus.ADDED,
                snapshot_id=snapshot_id,
                sequence_number=None,
                file_sequence_number=None,
                data_file=data_file,
            )
        )
    new_manifest = w.to_manifest_file()
    existing = parent.manifests(table.io) if parent is not None else []
    list_path = f"{table.location()}/metadata/snap-{snapshot_id}-{uuid.uuid4()}.avro"
    parent_id = parent.snapshot_id if parent is not None else None
    with write_manifest_list(2, table.io.new_output(list_path), snapshot_id, parent_id, sequence, "null") as lw:
        lw.add_manifests([*existing, new_manifest])
    summary = Summary(
        Operation.DELETE,
        **{
            "added-delete-files": "1",
            ("added-position-deletes" if positions is not None else "added-equality-deletes"): str(rows.num_rows),
        },
    )
    snapshot = Snapshot.model_validate(  # pydantic models: fields by their spec names
        {
            "snapshot-id": snapshot_id,
            "parent-snapshot-id": parent_id,
            "sequence-number": sequence,
            "timestamp-ms": max(int(time.time() * 1000), md.last_updated_ms + 1),
            "manifest-list": list_path,
            "summary": summary,
            "schema-id": md.current_schema_id,
        }
    )
    ref = SetSnapshotRefUpdate.model_validate(
        {"snapshot-id": snapshot_id, "ref-name": "main", "type": SnapshotRefType.BRANCH}
    )
    tx = table.transaction()
    tx._apply(
        (AddSnapshotUpdate(snapshot=snapshot), ref),
        (AssertRefSnapshotId.model_validate({"snapshot-id": parent_id, "ref": "main"}),),
    )
    return tx.commit_transaction()


def data_files(table: Table) -> list[str]:
    """The current snapshot's data file paths, as the manifests name them (sorted)."""
    return sorted(str(p) for p in table.inspect.files().column("file_path").to_pylist())


def rewrite(table: Table, remove: list[str], add: pa.Table) -> Table:
    """One ``overwrite`` snapshot that removes the data files ``remove`` and writes ``add`` (as pyiceberg's
    own copy-on-write delete does, with its snapshot producer): a delete and an insert in one snapshot."""
    from pyiceberg.io.pyarrow import _dataframe_to_data_files

    snapshot = table.current_snapshot()
    assert snapshot is not None
    by_path = {
        e.data_file.file_path: e.data_file
        for m in snapshot.manifests(table.io)
        for e in m.fetch_manifest_entry(table.io)
    }
    with table.transaction() as tx, tx.update_snapshot().overwrite() as ow:
        for path in remove:
            ow.delete_data_file(by_path[path])
        for df in _dataframe_to_data_files(table_metadata=tx.table_metadata, df=add, io=table.io):
            ow.append_data_file(df)
    return table.refresh()
