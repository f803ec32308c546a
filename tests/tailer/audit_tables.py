"""Tables written by deltalake 1.6.6 with one commit per operation, for the audit tests.

:func:`write_ops_table` writes, version by version (users recorded with ``CommitProperties``):

====  ===================  ==============================================================
v     operation            what
====  ===================  ==============================================================
0     WRITE                5 rows, id 1..5 (alice@corp)
1     WRITE                append id 6..8, app transaction ``ingest`` version 7 (alice@corp)
2     DELETE               ``id > 6``: 2 rows (bob@corp)
3     UPDATE               ``id = 1``: 1 row (bob@corp)
4     MERGE                update id 1, delete id 2, insert id 9 (bob@corp)
5     WRITE                append id 10, 11 (alice@corp)
6     OPTIMIZE             compaction (svc-optimizer)
7     SET TBLPROPERTIES    change data feed on, deleted-file retention 1 day (admin@corp)
8     WRITE                append id 12 with a new column ``w`` (schema merge) (mallory@corp)
9     RESTORE              back to version 7 (admin@corp)
====  ===================  ==============================================================

:func:`continue_with_vacuum` then adds VACUUM START / END (10, 11) and an overwrite with one row
(12, mallory@corp). :func:`write_cdf_table` writes a table with the change data feed on from the
start (delete, update, merge write cdc files). :func:`write_column_mapping_table` writes a
column-mapping table and appends, by hand (deltalake cannot rename), a RENAME COLUMN commit and a
DROP COLUMNS commit that follow the protocol: the fields keep the ids and physical names deltalake
gave them, only the logical names change (or the field goes).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
from deltalake import CommitProperties, DeltaTable, Transaction, write_deltalake

from deltatail.tailer.audit.feed import AuditFeed

SCHEMA = pa.schema([pa.field("id", pa.int64()), pa.field("v", pa.string())])


def by(user: str, **extra: Any) -> CommitProperties:
    """Commit properties that record ``user`` as commitInfo ``userName`` (and ``userId``)."""
    return CommitProperties(custom_metadata={"userName": user, "userId": f"id-{user}"}, **extra)


def rows(ids: list[int], values: list[str]) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": values}, schema=SCHEMA)


def write_ops_table(root: Path) -> Path:
    """Versions 0..9 of the table above."""
    path = str(root)
    write_deltalake(path, rows([1, 2, 3, 4, 5], list("abcde")), commit_properties=by("alice@corp"))
    write_deltalake(
        path,
        rows([6, 7, 8], list("fgh")),
        mode="append",
        commit_properties=by("alice@corp", app_transactions=[Transaction(app_id="ingest", version=7)]),
    )
    dt = DeltaTable(path)
    dt.delete("id > 6", commit_properties=by("bob@corp"))
    dt.update(updates={"v": "'z'"}, predicate="id = 1", commit_properties=by("bob@corp"))
    source = pa.table({"id": pa.array([1, 2, 9], pa.int64()), "v": ["m", "x", "n"], "op": ["u", "d", "i"]})
    (
        dt.merge(source, "t.id = s.id", source_alias="s", target_alias="t", commit_properties=by("bob@corp"))
        .when_matched_update(updates={"v": "s.v"}, predicate="s.op = 'u'")
        .when_matched_delete(predicate="s.op = 'd'")
        .when_not_matched_insert(updates={"id": "s.id", "v": "s.v"})
        .execute()
    )
    write_deltalake(path, rows([10, 11], ["j", "k"]), mode="append", commit_properties=by("alice@corp"))
    DeltaTable(path).optimize.compact(commit_properties=by("svc-optimizer"))
    DeltaTable(path).alter.set_table_properties(
        {"delta.enableChangeDataFeed": "true", "delta.deletedFileRetentionDuration": "interval 1 days"},
        commit_properties=by("admin@corp"),
    )
    wide = pa.table({"id": pa.array([12], pa.int64()), "v": ["l"], "w": pa.array([1.5])})
    write_deltalake(path, wide, mode="append", schema_mode="merge", commit_properties=by("mallory@corp"))
    DeltaTable(path).restore(7, commit_properties=by("admin@corp"))
    return root


def continue_with_vacuum(ops: Path, root: Path) -> Path:
    """A copy of the ops table at ``root`` with VACUUM (10, 11) and an overwrite (12)."""
    shutil.copytree(ops, root)
    path = str(root)
    DeltaTable(path).vacuum(
        retention_hours=0, enforce_retention_duration=False, dry_run=False, commit_properties=by("admin@corp")
    )
    write_deltalake(path, rows([100], ["q"]), mode="overwrite", commit_properties=by("mallory@corp"))
    return root


def write_cdf_table(root: Path) -> Path:
    """A table with the change data feed on: 0 WRITE 6 rows, 1 DELETE id = 2, 2 UPDATE id >= 5, 3 MERGE."""
    path = str(root)
    write_deltalake(
        path,
        rows([1, 2, 3, 4, 5, 6], list("abcdef")),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    dt = DeltaTable(path)
    dt.delete("id = 2")
    dt.update(updates={"v": "'z'"}, predicate="id >= 5")
    source = pa.table({"id": pa.array([1, 3, 7], pa.int64()), "v": ["m", "x", "n"], "op": ["u", "d", "i"]})
    (
        dt.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update(updates={"v": "s.v"}, predicate="s.op = 'u'")
        .when_matched_delete(predicate="s.op = 'd'")
        .when_not_matched_insert(updates={"id": "s.id", "v": "s.v"})
        .execute()
    )
    return root


def _field(name: str, dtype: Any, fid: int, physical: str, nullable: bool = True) -> dict[str, Any]:
    return {
        "name": name,
        "type": dtype,
        "nullable": nullable,
        "metadata": {"delta.columnMapping.id": fid, "delta.columnMapping.physicalName": physical},
    }


def write_column_mapping_table(root: Path) -> Path:
    """Column mapping (name mode): 0 CREATE, 1 WRITE, 2 id becomes nullable (deltalake), then by hand
    (deltalake 1.6.6 cannot rename, nor add columns to a column-mapping table of writer version 5):
    3 RENAME COLUMN v -> value and s.a -> s.alpha, 4 DROP COLUMNS s.b."""
    path = str(root)
    s_type = pa.struct([pa.field("a", pa.int32()), pa.field("b", pa.string())])
    schema = pa.schema([pa.field("id", pa.int64(), nullable=False), pa.field("v", pa.string()), pa.field("s", s_type)])
    DeltaTable.create(path, schema=schema, configuration={"delta.columnMapping.mode": "name"})
    nested = pa.array([{"a": 1, "b": "x"}, {"a": 2, "b": "y"}], s_type)
    data = pa.table({"id": pa.array([1, 2], pa.int64()), "v": ["a", "b"], "s": nested}, schema=schema)
    write_deltalake(path, data, mode="append")
    dt = DeltaTable(path)
    dt.alter.drop_column_not_null("id")
    log = root / "_delta_log"
    metadata = _last_metadata(log)
    old = json.loads(metadata["schemaString"])
    by_name = {f["name"]: f for f in old["fields"]}
    # The physical names and ids deltalake chose are kept: a rename changes only the logical name.
    v, s, ident = by_name["v"], by_name["s"], by_name["id"]
    a, b = s["type"]["fields"]
    renamed = {
        "type": "struct",
        "fields": [
            ident,
            {**v, "name": "value"},
            {**s, "type": {"type": "struct", "fields": [{**a, "name": "alpha"}, b]}},
        ],
    }
    _commit(log, 3, "RENAME COLUMN", {"oldColumnPath": "v", "newColumnPath": "value"}, metadata, renamed)
    s_dropped = {**s, "type": {"type": "struct", "fields": [{**a, "name": "alpha"}]}}
    dropped = {**renamed, "fields": [ident, {**v, "name": "value"}, s_dropped]}
    _commit(log, 4, "DROP COLUMNS", {"columns": '["s.b"]'}, metadata, dropped)
    return root


def _last_metadata(log: Path) -> dict[str, Any]:
    found: dict[str, Any] | None = None
    for path in sorted(log.glob("*.json")):
        for line in path.read_text().splitlines():
            action = json.loads(line)
            if "metaData" in action:
                found = action["metaData"]
    assert found is not None
    return found


def _commit(log: Path, version: int, operation: str, parameters: dict[str, Any], metadata: dict[str, Any],
            schema: dict[str, Any]) -> None:  # fmt: skip
    actions = [
        {"commitInfo": {"timestamp": 1_800_000_000_000 + version, "operation": operation,
                        "operationParameters": parameters, "userName": "dba@corp"}},
        {"metaData": {**metadata, "schemaString": json.dumps(schema)}},
    ]  # fmt: skip
    path = log / f"{version:020d}.json"
    assert not path.exists()
    path.write_text("".join(json.dumps(a) + "\n" for a in actions))


class AuditTables:
    """The four tables under one directory, and the events of the ops table followed as it grew.

    ``followed`` are the events of versions 0..12 as a follower sees them: versions 0..9 read from the
    ops table, 10..12 from its vacuumed continuation, each range tracking the table's rows (the second
    starts from the live files' footers at version 9, which are still there).
    """

    def __init__(self, root: Path) -> None:
        self.ops = write_ops_table(root / "ops")
        self.vacuumed = continue_with_vacuum(self.ops, root / "vacuumed")
        self.cdf = write_cdf_table(root / "cdf")
        self.column_mapping = write_column_mapping_table(root / "column-mapping")
        first = list(AuditFeed(str(self.ops)).events(track_table_rows=True))
        rest = list(AuditFeed(str(self.vacuumed)).events(10, track_table_rows=True))
        self.followed = first + rest
