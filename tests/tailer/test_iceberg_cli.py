"""``deltatail snapshot|changes|run`` and ``serve``'s discovery on Iceberg tables, through the format registry.

Oracles: what pyiceberg reads of the same table (snapshots, files, scans), and what the test wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import orjson
import pyarrow.parquet as pq
import pytest
from iceberg_tables import SCHEMA, catalog, new_table, rows, table_dir
from pyiceberg.table import Table

from deltatail.tailer.cli.main import main
from deltatail.tailer.formats.registry import claimed, open_table

ROOT = Path(__file__).resolve().parents[2]


def small(tmp_path: Path) -> Table:
    t = new_table(tmp_path / "cat")
    t.append(rows([1, 2, 3]))
    t.delete("id == 2")
    t.append(rows([4]))
    return t.refresh()


def test_snapshot_json_is_what_pyiceberg_sees(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = small(tmp_path)
    assert main(["snapshot", table_dir(t), "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    head = t.current_snapshot()
    assert head is not None
    assert doc["format"] == "iceberg" and doc["version"] == head.sequence_number
    assert doc["snapshotId"] == head.snapshot_id and doc["tableUuid"] == str(t.metadata.table_uuid)
    assert [f["name"] for f in doc["schema"]] == t.schema().column_names
    assert doc["identifierFields"] == ["id"]
    assert sorted(f["path"] for f in doc["files"]) == sorted(t.inspect.files().column("file_path").to_pylist())
    assert sum(f["records"] for f in doc["files"]) == len(t.scan().to_arrow())
    first = t.snapshots()[0].sequence_number
    assert main(["snapshot", f"iceberg://{table_dir(t)}", "--version", str(first)]) == 0
    text = capsys.readouterr().out
    assert f"version  {first}" in text and "files 1" in text


def test_changes_to_jsonl_and_parquet(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = small(tmp_path)
    assert main(["changes", table_dir(t)]) == 0
    lines = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["_change_type"], r["id"]) for r in lines] == [
        ("insert", 1),
        ("insert", 2),
        ("insert", 3),
        ("delete", 2),
        ("insert", 4),
    ]
    assert {r["_snapshot_id"] for r in lines} == {s.snapshot_id for s in t.snapshots()}
    out = tmp_path / "c.parquet"
    last = t.current_snapshot().sequence_number  # type: ignore[union-attr]
    assert main(["changes", table_dir(t), "--starting-version", "latest", "--output", str(out)]) == 0
    assert pq.read_table(out).column("id").to_pylist() == [4]
    assert pq.read_table(out).column("_commit_version").to_pylist() == [last]


@pytest.mark.slow
def test_a_catalog_table_by_name(tmp_path: Path) -> None:
    cat = catalog(tmp_path / "cat")
    t = cat.create_table("db.orders", SCHEMA)
    t.append(rows([1, 2]))
    # pyiceberg reads its catalog configuration once, at import: a process of its own (the SQL catalog keeps
    # its tables under the catalog's name, "test" as the fixture named it)
    env = {**os.environ, "PYICEBERG_CATALOG__TEST__TYPE": "sql"}
    env["PYICEBERG_CATALOG__TEST__URI"] = f"sqlite:///{tmp_path}/cat/catalog.db"

    def cli(*args: str) -> subprocess.CompletedProcess[bytes]:
        return subprocess.run([sys.executable, "-m", "deltatail", *args], cwd=ROOT, env=env, capture_output=True)

    done = cli("changes", "iceberg://catalog:test/db.orders")
    assert done.returncode == 0, done.stderr
    assert [orjson.loads(line)["id"] for line in done.stdout.splitlines()] == [1, 2]
    missing = cli("changes", "iceberg://catalog:test/db.nothing")
    assert missing.returncode == 1 and b"catalog test has no table db.nothing" in missing.stderr
    unnamed = cli("changes", "iceberg://catalog:test")
    assert unnamed.returncode == 2 and b"NAMESPACE.TABLE" in unnamed.stderr
    unknown = cli("changes", "iceberg://catalog:nope/db.orders")
    assert unknown.returncode == 2 and b"PYICEBERG_CATALOG__NOPE__" in unknown.stderr


def test_run_until_caught_up_into_a_file(tmp_path: Path) -> None:
    t = small(tmp_path)
    out, state = tmp_path / "out.jsonl", tmp_path / "state"
    args = ["run", table_dir(t), "--state-dir", str(state), "--sink", f"jsonl:{out}", "--until-caught-up", "--no-watch"]
    assert main(args) == 0
    t.append(rows([9]))
    assert main(args) == 0
    ids = [orjson.loads(line)["id"] for line in out.read_bytes().splitlines()]
    assert ids == [1, 2, 3, 2, 4, 9]


def test_detection_and_discovery(tmp_path: Path) -> None:
    t = small(tmp_path)
    assert open_table(table_dir(t)).format.name == "iceberg"
    assert open_table(t.metadata_location.split("://", 1)[-1]).format.name == "iceberg"
    found = claimed(table_dir(t))
    assert found is not None and found.name == "iceberg"
    # a Delta table with Iceberg metadata beside its log (UniForm) stays Delta unless Iceberg is asked for
    (Path(table_dir(t)) / "_delta_log").mkdir()
    assert open_table(table_dir(t)).format.name == "delta"
    assert claimed(table_dir(t)) is None or claimed(table_dir(t)).name == "delta"  # type: ignore[union-attr]
    assert open_table(f"iceberg://{table_dir(t)}").format.name == "iceberg"
    assert claimed(str(tmp_path)) is None


def test_audit_prints_one_event_per_snapshot_and_follows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = small(tmp_path)
    assert main(["audit", table_dir(t), "--format", "jsonl", "--counted"]) == 0
    events = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [e["version"] for e in events] == [s.sequence_number for s in t.metadata.snapshots] == [1, 2, 3]
    assert [e["operation"] for e in events] == ["append", "overwrite", "append"]
    assert [e["counts"]["rows_deleted"] for e in events] == [0, 1, 0]  # counted: id 2 in the rewrite
    follow = ["audit", table_dir(t), "--follow", "--state-dir", str(tmp_path / "st"), "--until-caught-up"]
    assert main([*follow, "--format", "jsonl", "--counted", "--no-watch"]) == 0
    assert [orjson.loads(line) for line in capsys.readouterr().out.splitlines()] == events


def test_on_data_loss_other_than_fail_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    t = small(tmp_path)
    args = ["run", table_dir(t), "--state-dir", str(tmp_path / "state"), "--sink", f"jsonl:{tmp_path / 'o.jsonl'}"]
    assert main([*args, "--on-data-loss", "skip", "--until-caught-up", "--no-watch"]) == 2
    err = capsys.readouterr().err
    assert "on_data_loss applies to Delta tables only: the stream of this Iceberg table fails" in err
    assert not (tmp_path / "o.jsonl").exists()
