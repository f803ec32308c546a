"""Tables whose schema changes, and the change rows each version must give, computed without deltatail.

The five corpus tables that change their schema non-additively (``CORPUS``), and a generated table
(:func:`write_evolving_table`) with every kind deltalake can write: an added column
(``schema_mode="merge"``), a delete with cdc files after it, and an overwrite that drops a column
(``schema_mode="overwrite"``) in the same commit as it deletes every row.

The reference (:func:`reference_rows`) reads the table with deltalake at each version and takes
the multiset difference of consecutive versions: rows only in ``v`` are its inserts (in ``v``'s
schema), rows only in ``v - 1`` its deletes (in ``v - 1``'s schema: a removed row as it was).
Versions without data actions (a rename, ``SET TBLPROPERTIES``) change no row. deltalake cannot
read the type-widening tables (reader feature ``typeWidening-preview``); they are append-only, so
their reference is each added file read by pyarrow (the file holds the rows in the types of their
version). Values are compared in JSON form (:func:`norm`).
"""

from __future__ import annotations

import base64
import datetime as dt
import json
from collections import Counter
from decimal import Decimal
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, QueryBuilder, write_deltalake

#: Corpus table -> (its Delta table directory under the corpus, the kind of schema change, its version).
CORPUS = {
    "dat/with_schema_change": ("dat/with_schema_change/delta", "dropped", 1),
    "delta-golden/time-travel-partition-changes-b": (
        "delta-golden/time-travel-partition-changes-b/delta",
        "dropped",
        1,
    ),
    "delta-rs/table_with_partitioning_mapping": ("delta-rs/table_with_partitioning_mapping", "renamed", 3),
    "kernel-rs/type-widening": ("kernel-rs/type-widening", "type_changed", 2),
    "delta-golden/type-widening-nested": ("delta-golden/type-widening-nested", "type_changed", 2),
}

CHANGE = ("_change_type", "_commit_version", "_commit_timestamp")

Row = tuple[int, str, str]  # (version, change type, the row's columns as sorted JSON)


def norm(value: Any) -> Any:
    """A value in the form JSON lines carry it (decimals as text, dates ISO, maps as objects)."""
    if isinstance(value, Decimal):
        return str(value)
    if isinstance(value, dt.datetime | dt.date):
        return value.isoformat()
    if isinstance(value, bytes):
        return base64.b64encode(value).decode()
    if isinstance(value, dict):
        return {str(k): norm(v) for k, v in value.items()}
    if isinstance(value, list) and value and all(isinstance(v, tuple) and len(v) == 2 for v in value):
        return {str(k): norm(v) for k, v in value}
    if isinstance(value, list):
        return [norm(v) for v in value]
    return value


def row_key(version: int, change_type: str, row: dict[str, Any]) -> Row:
    """A delivered or expected row, comparable: its version, change type and columns."""
    columns = {k: norm(v) for k, v in row.items() if k not in CHANGE and k != "_position"}
    return version, change_type, json.dumps(columns, sort_keys=True)


def log_actions(table: Path, version: int) -> list[dict[str, Any]]:
    """The actions of commit ``version`` as the test reads them from the JSON log."""
    text = (table / "_delta_log" / f"{version:020d}.json").read_text()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _data_change(actions: list[dict[str, Any]]) -> bool:
    return any(
        ("add" in a and a["add"].get("dataChange", True)) or ("remove" in a and a["remove"].get("dataChange", True))
        for a in actions
    )


def reference_rows(table: Path, last: int) -> Counter[Row]:
    """The change rows of versions ``0..last``, from deltalake reads of each version (see module docstring).

    Rows of ``v - 1`` are matched with those of ``v`` in ``v``'s columns (a column ``v`` added reads
    as null in the rows before it); a row of ``v - 1`` left unmatched is a delete, as it was.
    """
    expected: Counter[Row] = Counter()
    before: list[dict[str, Any]] = []
    readable = _readable(table, last)
    for v in range(last + 1):
        actions = log_actions(table, v)
        now = _read_version(table, v) if readable else before + _appended(table, actions)
        if _data_change(actions):
            columns = list(now[0]) if now else _columns(table, v)
            unmatched = Counter(_text({c: r.get(c) for c in columns}) for r in now)
            for r in before:
                projected = _text({c: r.get(c) for c in columns})
                if unmatched[projected] > 0:
                    unmatched[projected] -= 1
                else:
                    expected[(v, "delete", _text(r))] += 1
            expected.update({(v, "insert", r): n for r, n in unmatched.items() if n > 0})
        before = now
    return expected


def _text(row: dict[str, Any]) -> str:
    return row_key(0, "", row)[2]


def _read_version(table: Path, version: int) -> list[dict[str, Any]]:
    """The rows of ``table`` at ``version``, read by deltalake (its DataFusion reader applies deletion vectors)."""
    found = QueryBuilder().register("t", DeltaTable(str(table), version=version)).execute("select * from t")
    rows: list[dict[str, Any]] = pa.table(found.read_all()).to_pylist()
    return rows


def _columns(table: Path, version: int) -> list[str]:
    return [f.name for f in DeltaTable(str(table), version=version).schema().fields]


def _readable(table: Path, last: int) -> bool:
    """Whether deltalake reads the table (it refuses the ``typeWidening`` reader features)."""
    protocols = [a["protocol"] for v in range(last + 1) for a in log_actions(table, v) if "protocol" in a]
    return not any(f.startswith("typeWidening") for p in protocols for f in p.get("readerFeatures", ()))


def _appended(table: Path, actions: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows of the files a commit of an append-only table adds, read by pyarrow."""
    if any("remove" in a or "cdc" in a for a in actions):
        raise AssertionError(f"{table}: the pyarrow reference covers append-only tables only")
    return [r for a in actions if "add" in a for r in pq.read_table(table / a["add"]["path"]).to_pylist()]


def write_evolving_table(root: Path) -> Path:
    """A CDF table: v0 create {id, v}; v1 append with a new column ``w`` (merge); v2 delete id=1 (cdc
    files); v3 overwrite in a new schema {id, z}, dropping ``v`` and ``w`` and every row."""
    ids = pa.array([1, 2], pa.int64())
    write_deltalake(
        str(root),
        pa.table({"id": ids, "v": ["a", "b"]}),
        configuration={"delta.enableChangeDataFeed": "true"},
    )
    more = pa.table({"id": pa.array([3], pa.int64()), "v": ["c"], "w": pa.array([30], pa.int32())})
    write_deltalake(str(root), more, mode="append", schema_mode="merge")
    DeltaTable(str(root)).delete("id = 1")
    new = pa.table({"id": pa.array([7, 8], pa.int64()), "z": [True, False]})
    write_deltalake(str(root), new, mode="overwrite", schema_mode="overwrite")
    return root
