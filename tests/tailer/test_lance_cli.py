"""``deltatail snapshot|changes|run`` on Lance datasets, in-process through ``tailer.cli.main.main``.

Oracles: what pylance reads of the same dataset (versions, fragments, rows), and what the test wrote.
"""

from __future__ import annotations

import struct
import sys
from collections import Counter
from pathlib import Path

import lance
import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from lance_datasets import rows

from deltatail.state.errors import (
    ConfigError,
    DataFileError,
    InvalidLogError,
    MissingFileError,
    SchemaChangeError,
    VersionNotFoundError,
)
from deltatail.state.lance.manifest import Fragment
from deltatail.state.lance.planning import LancePlan, RowTask
from deltatail.tailer.cli.main import main
from deltatail.tailer.formats.registry import open_table
from deltatail.tailer.lance.dataset import LanceDataset, looks_like_lance
from deltatail.tailer.lance.feed import LanceFeed
from deltatail.tailer.lance.rows import LanceRows, _conform, change_schema_of, lance_module
from deltatail.tailer.storage import LocalStorage


def dataset(root: Path) -> Path:
    lance.write_dataset(rows(range(20)), str(root), max_rows_per_file=10)
    lance.dataset(str(root)).delete("id < 3")
    lance.write_dataset(rows(range(20, 25)), str(root), mode="append")
    return root


def test_snapshot_json_is_what_pylance_sees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = dataset(tmp_path / "ds")
    assert main(["snapshot", str(root), "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    ds = lance.dataset(str(root))
    assert doc["format"] == "lance" and doc["version"] == ds.version == 3
    assert [f["name"] for f in doc["schema"]] == ds.schema.names
    assert [f["id"] for f in doc["fragments"]] == [f.fragment_id for f in ds.get_fragments()]
    assert [f["deletedRows"] for f in doc["fragments"]] == [f.metadata.num_deletions for f in ds.get_fragments()]
    assert doc["liveRows"] == ds.count_rows()
    assert main(["snapshot", f"lance://{root}", "--version", "1"]) == 0
    text = capsys.readouterr().out
    assert "version  1" in text and "fragments 2 (20 live rows)" in text


def test_changes_to_jsonl_and_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = dataset(tmp_path / "ds")
    assert main(["changes", str(root), "--starting-version", "2"]) == 0
    lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert Counter((r["_change_type"], r["_commit_version"]) for r in lines) == {("delete", 2): 3, ("insert", 3): 5}
    assert sorted(r["id"] for r in lines if r["_change_type"] == "delete") == [0, 1, 2]
    out = tmp_path / "out.parquet"
    assert main(["changes", str(root), "--format", "lance", "--initial-snapshot", "--output", str(out)]) == 0
    table = pq.read_table(out)
    assert sorted(table.column("id").to_pylist()) == sorted(lance.dataset(str(root)).to_table()["id"].to_pylist())
    out2 = tmp_path / "out.jsonl"
    assert main(["changes", str(root), "--starting-version", "latest", "--output", str(out2)]) == 0
    assert len(out2.read_text().splitlines()) == 5


def test_filters_on_a_lance_dataset_keep_unfiltered_positions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = dataset(tmp_path / "ds")
    assert main(["changes", str(root), "--output", str(tmp_path / "all.jsonl")]) == 0
    everything = [orjson.loads(line) for line in (tmp_path / "all.jsonl").read_text().splitlines()]
    flags = ["--columns", "id", "--where", "id >= 2", "--change-types", "delete,insert"]
    flags += ["--skip-operations", "append,overwrite"]
    assert main(["changes", str(root), *flags, "--output", str(tmp_path / "some.jsonl")]) == 0
    some = [orjson.loads(line) for line in (tmp_path / "some.jsonl").read_text().splitlines()]
    appends = {r["_commit_version"] for r in everything if r["_change_type"] == "insert"}  # 1 (Overwrite), 3 (Append)
    expected = [
        {"id": r["id"], **{k: r[k] for k in ("_change_type", "_commit_version", "_commit_timestamp", "_position")}}
        for r in everything
        if r["id"] >= 2 and r["_commit_version"] not in appends
    ]
    assert some == expected and [r["id"] for r in some] == [2]  # the delete of id 2, at its own position
    assert main(["changes", str(root), "--where", "colour = 'red'"]) == 2
    assert "unknown column 'colour'" in capsys.readouterr().err


def test_detection_and_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = dataset(tmp_path / "ds")
    assert looks_like_lance(str(root), LocalStorage())
    assert not looks_like_lance(str(tmp_path), LocalStorage())
    assert main(["changes", f"lance://{root}", "--format", "delta"]) == 2
    assert "lance:// URI" in capsys.readouterr().err
    assert main(["changes", str(root), "--net-changes"]) == 2
    assert "not to Lance" in capsys.readouterr().err
    assert main(["changes", str(root), "--output", "x.csv"]) == 2
    assert main(["changes", str(root), "--format", "delta"]) == 1  # not a Delta table: a named error
    assert main(["changes", str(root), "--starting-version", "9"]) == 1
    assert "after the latest version" in capsys.readouterr().err
    table = open_table(str(root), format_name="lance")
    with pytest.raises(ConfigError):
        table.format.start_of(table, "soon")
    assert table.format.start_of(table, "latest") == 4
    assert table.format.start_of(table, None) is None


def test_run_until_caught_up(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    root = dataset(tmp_path / "ds")
    out = tmp_path / "out.jsonl"
    args = ["run", str(root), "--state-dir", str(tmp_path / "st"), "--sink", f"jsonl:{out}", "--until-caught-up"]
    assert main([*args, "--starting-version", "2"]) == 0
    assert orjson.loads(out.read_text().splitlines()[0])["_position"] == [2, 0, False]
    lance.dataset(str(root)).delete("id = 10")
    assert main(args) == 0
    last = orjson.loads(out.read_text().splitlines()[-1])
    assert last["id"] == 10 and last["_position"] == [4, 0, False]


def test_missing_pylance_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    root = dataset(tmp_path / "ds")
    monkeypatch.setitem(sys.modules, "lance", None)  # as if pylance were not installed
    with pytest.raises(ConfigError, match="deltatail\\[lance\\]"):
        lance_module()
    with pytest.raises(ConfigError):
        LanceFeed(str(root)).rows  # noqa: B018 - the property loads pylance


def test_reader_and_dataset_errors(tmp_path: Path) -> None:
    root = dataset(tmp_path / "ds")
    reader = LanceRows(str(root), LocalStorage())
    with pytest.raises(DataFileError):
        reader.dataset(99)
    with pytest.raises(DataFileError):
        reader.schema(99)
    ds = LanceDataset(str(root))
    stamps = [ds.manifest(v).timestamp_us for v in (1, 2, 3)]
    assert ds.timestamp_version(stamps[1]) == 2 and ds.timestamp_version(0) == 1
    with pytest.raises(VersionNotFoundError):
        ds.timestamp_version(stamps[2] + 1)
    assert ds.oldest_version() == 1
    transaction = ds.transaction(2)  # pylance 14.0.2 writes it into the manifest file too
    assert transaction is not None and transaction.operation == "Delete"
    with pytest.raises(VersionNotFoundError, match="does not exist yet"):
        ds.manifest(7)
    with pytest.raises(VersionNotFoundError):
        LanceFeed(str(root)).before(9)


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        out.append((n & 0x7F) | (0x80 if n >> 7 else 0))
        n >>= 7
        if not n:
            return bytes(out)


def _num(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _msg(field: int, body: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(body)) + body


def _write_manifest(root: Path, version: int, body: bytes) -> None:
    (root / "_versions").mkdir(parents=True, exist_ok=True)
    data = struct.pack("<I", len(body)) + body + struct.pack("<qHH", 0, 0, 2) + b"LANC"
    (root / "_versions" / f"{(1 << 64) - 1 - version:020d}.manifest").write_bytes(data)


def test_files_a_manifest_names_must_be_there(tmp_path: Path) -> None:
    """A transaction file and an external row-id file named by a hand-written manifest, and missing."""
    root = tmp_path / "ds"
    fragment = _num(1, 0) + _msg(2, _msg(1, b"f.lance")) + _num(4, 2) + _msg(6, _msg(1, b"ids.bin") + _num(3, 4))
    _write_manifest(root, 1, _num(3, 1) + _msg(2, fragment) + _msg(12, b"0-x.txn") + _num(9, 2))
    ds = LanceDataset(str(root))
    with pytest.raises(MissingFileError) as e:
        ds.transaction(1)
    assert e.value.file == f"{root}/_transactions/0-x.txn"
    frag = ds.manifest(1).fragments[0]
    with pytest.raises(MissingFileError):
        ds.row_ids(frag, 1)
    with pytest.raises(InvalidLogError, match="no row ids"):
        ds.row_ids(Fragment(0, (), 1, None), 1)
    _write_manifest(root, 2, _num(3, 7))
    with pytest.raises(InvalidLogError, match="says it is version 7"):
        ds.manifest(2)
    (root / "_versions" / f"{(1 << 64) - 1 - 3:020d}.manifest").write_bytes(b"garbage")
    with pytest.raises(InvalidLogError, match="LANC") as bad:
        ds.manifest(3)
    assert bad.value.version == 3 and bad.value.file is not None


def test_an_unreadable_data_file_is_a_data_file_error(tmp_path: Path) -> None:
    root = dataset(tmp_path / "ds")
    new = next(f for f in LanceDataset(str(root)).manifest(3).fragments if f.id == 2)
    path = root / "data" / new.files[0].path
    path.write_bytes(path.read_bytes()[:40])
    with pytest.raises(DataFileError, match="cannot read fragment 2") as e:
        list(LanceFeed(str(root)).batches(3, 3))
    assert e.value.version == 3 and e.value.table == str(root)


def test_a_column_that_cannot_be_cast_is_a_schema_change_error() -> None:
    schema = change_schema_of(pa.schema([("x", pa.int8())]))
    batch = pa.record_batch({"x": pa.array(["not a number"])})
    task = RowTask(Fragment(0, (), 1, None), 1, "delete")
    with pytest.raises(SchemaChangeError, match="cannot be read as int8"):
        _conform(batch, schema, task, LancePlan(2, 0, "Delete", (task,)), "t")
