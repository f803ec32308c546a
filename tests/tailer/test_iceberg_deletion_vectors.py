"""Iceberg format v3 deletion vectors: applied exactly (by hand and against pyiceberg's scans), refused clearly.

The tables are written by pyiceberg (v2) and given deletion vectors built from the spec
(:mod:`iceberg_dv`), their newest metadata marked format version 3; pyiceberg 0.12 reads such a
table and applies its deletion vectors when it scans, so its scans are the peer.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import orjson
import pyarrow.parquet as pq
import pytest
from iceberg_dv import as_v3, commit_vectors, dv_blob, vector_file
from iceberg_tables import SCHEMA, commit_deletes, data_files, multiset, new_table, rows, table_dir
from pyiceberg.catalog.sql import SqlCatalog
from pyiceberg.table import StaticTable, Table

from deltatail.state.errors import DeletionVectorError, InvalidLogError, UnsafePathError, UnsupportedFeatureError
from deltatail.tailer.cli.main import main
from deltatail.tailer.formats.registry import open_table
from deltatail.tailer.iceberg.feed import IcebergFeed, IcebergOptions
from deltatail.tailer.iceberg.vectors import MAX_VECTOR_BYTES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: objectstores.py (not a package)
from objectstores import Server, create_s3_bucket

pytest_plugins = ("objectstore_fixtures",)


def first_ids(table: Table) -> dict[int, str]:
    """The table's data files by the id of their first row (read by pyiceberg's file IO: local or S3)."""
    found = {}
    for p in data_files(table):
        with table.io.new_input(p).open() as f:
            found[pq.read_table(f).column("id")[0].as_py()] = p
    return found


def brief(found: list[dict[str, Any]]) -> list[tuple[Any, ...]]:
    return [(r["_commit_version"], r["_change_type"], r["id"], r["name"]) for r in found]


def two_files(tmp_path: Path) -> tuple[Table, str, str]:
    t = new_table(tmp_path)
    t.append(rows([10, 11, 12, 13, 14]))
    t.append(rows([20, 21, 22]))
    files = first_ids(t)
    return t, files[10], files[20]


def test_deletion_vectors_delete_exactly_the_rows_they_name_as_pyiceberg_scans_say(tmp_path: Path) -> None:
    t, a, b = two_files(tmp_path)
    t = commit_vectors(t, {a: [1, 3]})
    t.append(rows([30]))
    # a new vector of a file replaces its old one and holds its positions too
    t = commit_vectors(t, {a: [1, 3, 4], b: [0]})
    metadata = as_v3(t)
    feed = IcebergFeed(table_dir(t))
    state, ancestry, _ = feed.current()
    assert state.format_version == 3
    v = ancestry.versions
    assert sorted(brief(feed.read_table(v[2]).to_pylist())) == [
        (v[2], "delete", 11, "n11"),
        (v[2], "delete", 13, "n13"),
        (v[3], "insert", 30, "n30"),
        (v[4], "delete", 14, "n14"),
        (v[4], "delete", 20, "n20"),
    ]
    assert sorted(r["id"] for r in feed.read_table(initial_snapshot=True).to_pylist()) == [10, 12, 21, 22, 30]
    # the peer: pyiceberg reads the v3 table, applies the vectors, and its scans differ as our rows say
    peer = StaticTable.from_metadata(f"file://{metadata}")
    assert peer.format_version == 3
    columns = ["id", "name", "grp"]
    previous: Counter[tuple[Any, ...]] = Counter()
    for snapshot, version in zip(peer.snapshots(), v, strict=True):
        now = multiset(peer.scan(snapshot_id=snapshot.snapshot_id).to_arrow().to_pylist(), columns)
        mine = feed.read_table(version, version).to_pylist()
        assert multiset([r for r in mine if r["_change_type"] == "delete"], columns) == previous - now
        assert multiset([r for r in mine if r["_change_type"] == "insert"], columns) == now - previous
        previous = now
    # the audit's figures from the summaries (a replaced vector's rows less the old one's) are the rows counted
    ref = open_table(table_dir(t))
    found = list(ref.format.audit_feed(ref).events())
    counted = list(ref.format.audit_feed(ref).events(counted=True))
    figures = [(e.counts.rows_inserted, e.counts.rows_deleted) for e in found]
    assert figures == [(e.counts.rows_inserted, e.counts.rows_deleted) for e in counted]
    assert figures == [(5, 0), (3, 0), (0, 2), (1, 0), (0, 2)]
    assert found[4].counts.row_sources["deleted"] == "metrics"


def test_a_deletion_vector_takes_over_from_a_position_delete_file(tmp_path: Path) -> None:
    t, _, b = two_files(tmp_path)
    t = commit_deletes(t, positions=[(b, 0)])
    # the vector holds the position delete file's row and one more: only that one is newly deleted
    t = commit_vectors(t, {b: [0, 2]})
    as_v3(t)
    feed = IcebergFeed(table_dir(t))
    last = feed.current()[1].latest
    assert brief(feed.read_table(last, last).to_pylist()) == [(last, "delete", 22, "n22")]
    live = feed.read_table(initial_snapshot=True).to_pylist()
    assert sorted(r["id"] for r in live) == [10, 11, 12, 13, 14, 21]


def _refused(tmp_path: Path, **damage: Any) -> tuple[pytest.ExceptionInfo[Exception], Table, str]:
    t, a, _ = two_files(tmp_path)
    built = vector_file(t, a, [1, 3], **damage)
    t = commit_vectors(t, {a: built})
    as_v3(t)
    feed = IcebergFeed(table_dir(t))
    last = feed.current()[1].latest
    with pytest.raises(Exception) as e:
        feed.read_table(last, last)
    return e, t, built.file_path


@pytest.mark.parametrize(
    ("damage", "error", "message"),
    [
        ({"blob": dv_blob([1, 3], magic=b"XXXX")}, DeletionVectorError, "magic number"),
        ({"blob": dv_blob([1, 3], crc_delta=1)}, DeletionVectorError, "fails its CRC-32 check"),
        ({"content_size": MAX_VECTOR_BYTES + 1}, DeletionVectorError, "over the bound"),
        ({"content_size": 4096}, InvalidLogError, "does not fit its"),
        ({"cardinality": 3}, DeletionVectorError, "holds 2 rows, its manifest entry's record_count says 3"),
        ({"blob": dv_blob([1, 7])}, DeletionVectorError, "names row 7 of a 5-row data file"),
    ],
)
def test_a_damaged_deletion_vector_is_refused_naming_table_snapshot_and_file(
    tmp_path: Path, damage: dict[str, Any], error: type[Exception], message: str
) -> None:
    e, t, puffin = _refused(tmp_path, **damage)
    assert isinstance(e.value, error)
    assert message in str(e.value)
    snapshot = t.current_snapshot()
    assert snapshot is not None
    assert e.value.table == table_dir(t)  # type: ignore[attr-defined]
    assert e.value.version == snapshot.sequence_number  # type: ignore[attr-defined]
    assert e.value.file == puffin  # type: ignore[attr-defined]
    if isinstance(e.value, DeletionVectorError):
        assert f"snapshot {snapshot.snapshot_id}" in str(e.value)


def test_a_deletion_vector_outside_the_table_is_refused_before_it_is_read(tmp_path: Path) -> None:
    outside = tmp_path / "elsewhere" / "dv.puffin"
    e, _, _ = _refused(tmp_path / "t", location=f"file://{outside}")
    assert isinstance(e.value, UnsafePathError)
    assert "outside the table root" in str(e.value)
    assert e.value.file is not None and "elsewhere" in e.value.file


def test_format_v3_initial_defaults_and_format_v4_are_refused(tmp_path: Path) -> None:
    t = new_table(tmp_path)
    t.append(rows([1]))
    metadata = Path(as_v3(t))
    doc = json.loads(metadata.read_text())
    IcebergFeed(table_dir(t)).read_table()  # v3 as it is: read
    doc["schemas"][-1]["fields"][2]["initial-default"] = 7
    metadata.write_text(json.dumps(doc))
    with pytest.raises(UnsupportedFeatureError, match=r"grp .* initial-default") as e:
        IcebergFeed(table_dir(t)).read_table()
    assert (e.value.table, e.value.file) == (table_dir(t), str(metadata))
    doc.update({"format-version": 4})
    Path(table_dir(t), "metadata", f"100000-{uuid.uuid4()}.metadata.json").write_text(json.dumps(doc))
    with pytest.raises(UnsupportedFeatureError, match="format version 4") as v4:
        IcebergFeed(table_dir(t), options=IcebergOptions()).read_table()
    assert v4.value.table == table_dir(t)


@pytest.mark.slow
def test_deletion_vectors_on_s3_are_applied(moto: Server, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    create_s3_bucket(moto.endpoint, "iceberg-dv")
    keys = {
        "s3.endpoint": moto.endpoint,
        "s3.access-key-id": "k",
        "s3.secret-access-key": "s",
        "s3.region": "us-east-1",
    }
    cat = SqlCatalog("s3dv", uri=f"sqlite:///{tmp_path}/catalog.db", warehouse="s3://iceberg-dv/wh", **keys)
    cat.create_namespace("db")
    t = cat.create_table("db.t", SCHEMA, properties={"format-version": "2"})
    t.append(rows([10, 11, 12, 13, 14]))
    t.append(rows([20, 21, 22]))
    files = first_ids(t)
    t = commit_vectors(t, {files[10]: [0, 4], files[20]: [1]})
    as_v3(t)
    options = {
        "aws_endpoint_url": moto.endpoint,
        "aws_access_key_id": "k",
        "aws_secret_access_key": "s",
        "aws_region": "us-east-1",
        "allow_http": "true",
    }
    args = [a for k, v in options.items() for a in ("--storage-option", f"{k}={v}")]
    location = t.metadata_location.rsplit("/metadata/", 1)[0]
    assert main(["changes", location, "--starting-version", "3", *args]) == 0
    found = [orjson.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert sorted((r["_commit_version"], r["_change_type"], r["id"]) for r in found) == [
        (3, "delete", 10),
        (3, "delete", 14),
        (3, "delete", 21),
    ]


def test_snapshot_names_deletion_vectors_apart_from_position_delete_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    t, a, b = two_files(tmp_path)
    t = commit_deletes(t, positions=[(b, 0)])  # a position delete file (Parquet), written while the table was v2
    t = commit_vectors(t, {a: [1]})
    as_v3(t)
    root = Path(table_dir(t))
    [vector] = [str(p) for p in root.rglob("*.puffin")]
    [positions] = [str(p) for p in root.rglob("*.parquet") if f"file://{p}" not in (a, b) and str(p) not in (a, b)]
    assert main(["snapshot", str(root), "--json"]) == 0
    doc = orjson.loads(capsys.readouterr().out)
    assert doc["formatVersion"] == 3
    kinds = {f["path"].removeprefix("file://"): f["content"] for f in doc["files"]}
    assert kinds == {
        a.removeprefix("file://"): "data",
        b.removeprefix("file://"): "data",
        positions: "position deletes",
        vector: "deletion vector",
    }
    assert main(["snapshot", str(root)]) == 0
    text = capsys.readouterr().out
    assert f"deletion vector: {vector}" in text or f"deletion vector: file://{vector}" in text
