"""Shared helpers for the change-row tests: multiset comparison, the deltalake peer, hand-built tables.

Nothing here computes change rows the way deltatail does. The expectations the tests use come from:

- deltalake 1.6.6 (``DeltaTable.load_cdf`` and snapshot scans), an independent reader;
- facts written down by hand (row values a test wrote itself, DV row sets it chose);
- log files read with the ``json`` module.

Hand-built tables (:class:`HandTable`) are written the way the protocol describes: JSON commits in
``_delta_log``, Parquet data files written by pyarrow, deletion vectors serialized as "a serialized
64-bit bitmap in the portable standard format" behind the little-endian magic ``1681511377``, either
inline (Z85) or in a DV file (version byte ``1``, then big-endian size, data, big-endian CRC-32).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import shutil
import sys
import uuid
import zlib
from collections import Counter
from collections.abc import Hashable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from pyroaring import BitMap64

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py (tests/ is not a package)
from corpus import corpus_root, corpus_table, read_manifest

__all__ = [
    "CHANGE_COLUMNS",
    "HandTable",
    "Row",
    "append_commit",
    "assert_same_rows",
    "canonical",
    "change_rows",
    "commit_actions",
    "corpus_table",
    "load_cdf",
    "manifest_entries",
    "multiset",
    "peer_copy",
    "relative_dv_path",
    "snapshot_table",
]

#: The three columns deltatail (and Delta CDF) add to the table's columns.
CHANGE_COLUMNS = ("_change_type", "_commit_version", "_commit_timestamp")

Row = tuple[tuple[str, Hashable], ...]

DV_MAGIC = 1681511377
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"


# ---------------------------------------------------------------- comparing rows


def _canonical_type(t: pa.DataType) -> pa.DataType:
    """One Arrow type per logical type: deltalake returns string_view, uint64 versions and so on."""
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()
    if pa.types.is_unsigned_integer(t):
        return pa.int64()
    if pa.types.is_dictionary(t):
        return _canonical_type(t.value_type)
    if pa.types.is_timestamp(t):
        return pa.timestamp("us", tz="UTC" if t.tz is not None else None)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t):
        return pa.list_(_canonical_type(t.value_type))
    if pa.types.is_map(t):
        return pa.map_(_canonical_type(t.key_type), _canonical_type(t.item_type))
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _canonical_type(f.type)) for f in t])
    return t


def _freeze(value: Any) -> Hashable:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, list | tuple):
        return tuple(_freeze(v) for v in value)
    if isinstance(value, dt.datetime) and value.tzinfo is not None:
        return value.astimezone(dt.UTC)
    assert isinstance(value, Hashable)
    return value


def canonical(table: pa.Table) -> pa.Table:
    """``table`` with every column cast to one Arrow type per logical type (string, int64, µs timestamps...)."""
    columns = []
    for name in table.column_names:
        col = table.column(name)
        target = _canonical_type(col.type)
        columns.append(col.cast(target) if target != col.type else col)
    return pa.table(columns, names=table.column_names)


def multiset(table: pa.Table, *, drop: Sequence[str] = ("_commit_timestamp",)) -> Counter[Row]:
    """The rows of ``table`` as a multiset of ``((column, value), ...)`` tuples, types made comparable."""
    table = canonical(table.drop_columns([c for c in drop if c in table.column_names]))
    names = sorted(table.column_names)
    return Counter(tuple((n, _freeze(row[n])) for n in names) for row in table.to_pylist())


def assert_same_rows(actual: pa.Table, expected: pa.Table, *, drop: Sequence[str] = ("_commit_timestamp",)) -> None:
    """``actual`` and ``expected`` hold the same rows as multisets over all columns but ``drop``."""
    got_cols = sorted(set(actual.column_names) - set(drop))
    want_cols = sorted(set(expected.column_names) - set(drop))
    assert got_cols == want_cols, f"columns differ: {got_cols} != {want_cols}"
    got, want = multiset(actual, drop=drop), multiset(expected, drop=drop)
    assert got == want, f"missing rows: {dict(want - got)}; unexpected rows: {dict(got - want)}"


def change_rows(data: pa.Table | Mapping[str, Sequence[Any]], change_type: str, version: int) -> pa.Table:
    """Expected change rows: ``data`` plus ``_change_type`` and ``_commit_version`` constants."""
    table = data if isinstance(data, pa.Table) else pa.table(dict(data))
    n = table.num_rows
    return table.append_column("_change_type", pa.array([change_type] * n, pa.string())).append_column(
        "_commit_version", pa.array([version] * n, pa.int64())
    )


# ---------------------------------------------------------------- the deltalake peer


def snapshot_table(root: Path, version: int) -> pa.Table:
    """The live rows of ``root`` at ``version`` according to deltalake's scan (DVs and column mapping applied)."""
    return pa.RecordBatchReader.from_stream(DeltaTable(str(root), version=version).scan()).read_all()


def commit_actions(root: Path, version: int) -> list[dict[str, Any]]:
    """The actions of one JSON commit, parsed with the ``json`` module."""
    text = (root / "_delta_log" / f"{version:020d}.json").read_text(encoding="utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def peer_copy(root: Path, scratch: Path) -> Path:
    """A copy of ``root`` that deltalake 1.6.6's ``load_cdf`` can read.

    ``load_cdf`` does not percent-decode ``add``/``cdc`` paths (MANIFEST.md, "Known deltalake gaps"):
    it opens the still-encoded log path literally. The copy also holds every such file under its
    encoded name, which is what MANIFEST.md did for the reference outputs. Nothing else changes.
    """
    copy = scratch / f"peer-copy-{root.name}"
    if copy.exists():
        shutil.rmtree(copy)
    shutil.copytree(root, copy)
    for log in sorted((copy / "_delta_log").glob("*.json")):
        for line in log.read_text(encoding="utf-8").splitlines():
            if not line.strip():
                continue
            action = json.loads(line)
            for kind in ("add", "remove", "cdc"):
                raw = (action.get(kind) or {}).get("path")
                if not raw or raw == unquote(raw) or "://" in raw:
                    continue
                source, target = copy / unquote(raw), copy / raw
                if source.is_file() and not target.exists():
                    target.parent.mkdir(parents=True, exist_ok=True)
                    shutil.copyfile(source, target)
    return copy


def load_cdf(root: Path, start: int, end: int | None = None) -> pa.Table:
    """deltalake's change data feed of ``root`` for versions ``start..end``."""
    reader = DeltaTable(str(root)).load_cdf(starting_version=start, ending_version=end)
    return pa.table(reader.read_all())


def append_commit(root: Path, actions: Sequence[Mapping[str, Any]]) -> int:
    """Write the next JSON commit of an existing table (e.g. one deltalake made); returns its version."""
    log = root / "_delta_log"
    version = 1 + max(int(p.name[:20]) for p in log.glob("*.json") if p.name[:20].isdigit())
    (log / f"{version:020d}.json").write_text("".join(json.dumps(a) + "\n" for a in actions), encoding="utf-8")
    return version


def manifest_entries() -> dict[str, dict[str, Any]]:
    """The corpus's ``manifest.json`` entries by table path (skips like :func:`corpus_table`)."""
    return {e["path"]: e for e in read_manifest(corpus_root())}


# ---------------------------------------------------------------- deletion vectors and Z85


def z85_encode(data: bytes) -> str:
    """Z85 (ZeroMQ Base85) of ``data``, whose length must be a multiple of 4."""
    assert len(data) % 4 == 0
    out = []
    for i in range(0, len(data), 4):
        value = int.from_bytes(data[i : i + 4], "big")
        group = []
        for _ in range(5):
            value, digit = divmod(value, 85)
            group.append(_Z85[digit])
        out.append("".join(reversed(group)))
    return "".join(out)


def dv_data(rows: Iterable[int]) -> bytes:
    """A DV's data: the little-endian magic, then the portable serialization of a 64-bit roaring bitmap."""
    return DV_MAGIC.to_bytes(4, "little") + BitMap64(list(rows)).serialize()


def inline_dv(rows: Iterable[int]) -> dict[str, Any]:
    """An inline (``i``) descriptor: Z85 of the data padded with zero bytes (Delta Spark's convention)."""
    chosen = sorted(set(rows))
    data = dv_data(chosen)
    padded = data + b"\0" * (-len(data) % 4)
    return {
        "storageType": "i",
        "pathOrInlineDv": z85_encode(padded),
        "sizeInBytes": len(data),
        "cardinality": len(chosen),
    }


def z85_decode(text: str) -> bytes:
    """Decode whole Z85 groups (no padding conventions: for UUIDs)."""
    assert len(text) % 5 == 0
    out = bytearray()
    for i in range(0, len(text), 5):
        value = 0
        for char in text[i : i + 5]:
            value = value * 85 + _Z85.index(char)
        out += value.to_bytes(4, "big")
    return bytes(out)


def relative_dv_path(path_or_inline_dv: str) -> str:
    """Protocol: a ``u`` DV lives at ``<random prefix>/deletion_vector_<uuid>.bin``, the UUID Z85-encoded last."""
    prefix, encoded = path_or_inline_dv[:-20], path_or_inline_dv[-20:]
    name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
    return f"{prefix}/{name}" if prefix else name


def write_dv_file(root: Path, row_sets: Sequence[Iterable[int]], *, prefix: str = "") -> list[dict[str, Any]]:
    """Write one DV file under ``root`` (in ``prefix``) holding a DV per row set; returns their ``u`` descriptors.

    Protocol, "Deletion Vector File Storage Format": a version byte, then per DV its size, data and
    CRC-32 of the data (size and checksum big-endian, as Delta Spark writes them); the offsets are > 1
    after the first.
    """
    file_id = uuid.uuid4()
    blob = bytearray(b"\x01")
    descriptors = []
    for rows in row_sets:
        chosen = sorted(set(rows))
        data = dv_data(chosen)
        descriptors.append(
            {
                "storageType": "u",
                "pathOrInlineDv": prefix + z85_encode(file_id.bytes),
                "offset": len(blob),
                "sizeInBytes": len(data),
                "cardinality": len(chosen),
            }
        )
        blob += len(data).to_bytes(4, "big") + data + zlib.crc32(data).to_bytes(4, "big")
    directory = root / prefix if prefix else root
    directory.mkdir(parents=True, exist_ok=True)
    (directory / f"deletion_vector_{file_id}.bin").write_bytes(bytes(blob))
    return descriptors


# ---------------------------------------------------------------- hand-built tables


class HandTable:
    """A Delta table written commit by commit in JSON, with Parquet data written by pyarrow.

    Args:
        root: the table directory (created).
        schema: the Delta ``schemaString`` fields (list of field dicts).
        partition_columns: logical partition column names.
        configuration: ``metaData.configuration``.
        reader_features: with a non-empty tuple the protocol is reader 3 / writer 7 with these features.
    """

    def __init__(
        self,
        root: Path,
        fields: list[dict[str, Any]],
        *,
        partition_columns: Sequence[str] = (),
        configuration: Mapping[str, str] | None = None,
        reader_features: Sequence[str] = ("deletionVectors",),
    ) -> None:
        self.root = root
        (root / "_delta_log").mkdir(parents=True)
        self.version = -1
        self.fields = fields
        self.partition_columns = list(partition_columns)
        self.configuration = dict(configuration or {})
        self.reader_features = list(reader_features)
        self.clock = 1_700_000_000_000

    def protocol(self) -> dict[str, Any]:
        """The protocol action."""
        if not self.reader_features:
            return {"protocol": {"minReaderVersion": 1, "minWriterVersion": 4}}
        writer = sorted({*self.reader_features, "changeDataFeed"})
        return {
            "protocol": {
                "minReaderVersion": 3,
                "minWriterVersion": 7,
                "readerFeatures": self.reader_features,
                "writerFeatures": writer,
            }
        }

    def metadata(self) -> dict[str, Any]:
        """The metaData action."""
        return {
            "metaData": {
                "id": "hand-built",
                "format": {"provider": "parquet", "options": {}},
                "schemaString": json.dumps({"type": "struct", "fields": self.fields}),
                "partitionColumns": self.partition_columns,
                "configuration": self.configuration,
                "createdTime": self.clock,
            }
        }

    def write_parquet(self, relative: str, table: pa.Table) -> int:
        """Write a Parquet file under the root; returns its size."""
        path = self.root / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path)
        return path.stat().st_size

    def add(
        self,
        relative: str,
        table: pa.Table | None = None,
        *,
        partition_values: Mapping[str, str | None] | None = None,
        dv: Mapping[str, Any] | None = None,
        data_change: bool = True,
    ) -> dict[str, Any]:
        """An add action for ``relative`` (written first when ``table`` is given)."""
        size = self.write_parquet(relative, table) if table is not None else (self.root / relative).stat().st_size
        add: dict[str, Any] = {
            "path": quote(relative),
            "partitionValues": dict(partition_values or {}),
            "size": size,
            "modificationTime": self.clock,
            "dataChange": data_change,
        }
        if dv is not None:
            add["deletionVector"] = dict(dv)
        return {"add": add}

    def remove(
        self,
        relative: str,
        *,
        partition_values: Mapping[str, str | None] | None = None,
        dv: Mapping[str, Any] | None = None,
        data_change: bool = True,
        with_partition_values: bool = True,
    ) -> dict[str, Any]:
        """A remove action for ``relative``."""
        remove: dict[str, Any] = {
            "path": quote(relative),
            "deletionTimestamp": self.clock,
            "dataChange": data_change,
        }
        if with_partition_values:
            remove["extendedFileMetadata"] = True
            remove["partitionValues"] = dict(partition_values or {})
            remove["size"] = (self.root / relative).stat().st_size
        if dv is not None:
            remove["deletionVector"] = dict(dv)
        return {"remove": remove}

    def cdc(
        self, relative: str, table: pa.Table, *, partition_values: Mapping[str, str | None] | None = None
    ) -> dict[str, Any]:
        """A cdc action for a change data file (``table`` must carry ``_change_type``)."""
        size = self.write_parquet(relative, table)
        return {
            "cdc": {
                "path": quote(relative),
                "partitionValues": dict(partition_values or {}),
                "size": size,
                "dataChange": False,
            }
        }

    def file_dvs(self, row_sets: Sequence[Iterable[int]], *, prefix: str = "") -> list[dict[str, Any]]:
        """Write one DV file holding a DV per row set; returns their ``u`` descriptors (offsets > 1 after the first)."""
        return write_dv_file(self.root, row_sets, prefix=prefix)

    def dv_file(self, descriptor: Mapping[str, Any]) -> Path:
        """The file of a ``u`` descriptor made by :meth:`file_dvs`."""
        return self.root / relative_dv_path(str(descriptor["pathOrInlineDv"]))

    def commit(
        self,
        actions: Sequence[Mapping[str, Any]],
        *,
        operation: str = "WRITE",
        metrics: Mapping[str, Any] | None = None,
        mtime_ms: int | None = None,
        extra_info: Mapping[str, Any] | None = None,
    ) -> int:
        """Write the next commit (version 0 gets protocol and metaData first); returns its version."""
        self.version += 1
        self.clock += 1000
        info: dict[str, Any] = {"timestamp": self.clock, "operation": operation}
        if metrics is not None:
            info["operationMetrics"] = dict(metrics)
        info.update(extra_info or {})
        lines: list[Mapping[str, Any]] = [{"commitInfo": info}]
        if self.version == 0:
            lines += [self.protocol(), self.metadata()]
        lines += list(actions)
        path = self.root / "_delta_log" / f"{self.version:020d}.json"
        path.write_text("".join(json.dumps(a) + "\n" for a in lines), encoding="utf-8")
        stamp = (mtime_ms if mtime_ms is not None else self.clock) * 1_000_000
        os.utime(path, ns=(stamp, stamp))
        return self.version
