"""The log-access layer's own contracts: storage, file names, _last_checkpoint, checkpoints, snapshots, commits."""

from __future__ import annotations

import json
import logging
import shutil
import sys
from pathlib import Path
from typing import Any

import orjson
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable, write_deltalake

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py (tests/ is not a package)
from corpus import corpus_table

from deltatail.state.errors import (
    IncompleteCheckpointError,
    InvalidLogError,
    MissingFileError,
    TableNotFoundError,
    VersionGapError,
    VersionNotFoundError,
)
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.log.files import LogFileKind, classify, start_after_for
from deltatail.tailer.log.last_checkpoint import canonicalize, checksum, parse_last_checkpoint
from deltatail.tailer.storage import LocalStorage

PROTOCOL_VECTOR = (
    '{"k0":"\'v 0\'", "checksum": "adsaskfljadfkjadfkj", "k1":{"k2": 2, "k3": ["v3", [1, 2], '
    '{"k4": "v4", "k5": ["v5", "v6", "v7"]}]}}'
)


def _table(root: Path, commits: int, *, checkpoint_at: int | None = None) -> None:
    for i in range(commits):
        write_deltalake(root, pa.table({"id": [i]}), mode="append")
        if checkpoint_at == i:
            DeltaTable(root).create_checkpoint()


# -- storage -----------------------------------------------------------------------------------


def test_storage_lists_after_a_name_in_order(tmp_path: Path) -> None:
    for name in ("b", "a", "c", "d"):
        (tmp_path / name).write_text(name)
    (tmp_path / "sub").mkdir()
    listed = LocalStorage().list_from(str(tmp_path), start_after="b")
    assert [f.name for f in listed] == ["c", "d"]
    assert all(f.size == 1 for f in listed)


def test_storage_missing_paths_are_missing_file_errors(tmp_path: Path) -> None:
    storage = LocalStorage()
    with pytest.raises(MissingFileError, match="directory does not exist"):
        storage.list_from(str(tmp_path / "nope"))
    with pytest.raises(MissingFileError) as info:
        storage.read(str(tmp_path / "nope.json"))
    assert info.value.file == str(tmp_path / "nope.json")
    with pytest.raises(MissingFileError):
        storage.stat(str(tmp_path / "nope.json"))
    (tmp_path / "x").write_bytes(b"0123456789")
    assert storage.read(f"file://{tmp_path}/x", 2, 3) == b"234"


# -- file names --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "kind", "version"),
    [
        ("00000000000000000007.json", LogFileKind.COMMIT, 7),
        ("00000000000000000010.checkpoint.parquet", LogFileKind.CHECKPOINT_CLASSIC, 10),
        ("00000000000000000010.checkpoint.0000000002.0000000003.parquet", LogFileKind.CHECKPOINT_MULTI_PART, 10),
        (
            "00000000000000000002.checkpoint.80a083e8-7026-4e79-81be-64bd76c43a11.json",
            LogFileKind.CHECKPOINT_UUID,
            2,
        ),
        ("00000000000000000004.00000000000000000009.compacted.json", LogFileKind.COMPACTION, 9),
        ("00000000000000000003.crc", LogFileKind.CRC, 3),
        ("_last_checkpoint", LogFileKind.LAST_CHECKPOINT, -1),
        (".00000000000000000003.json.crc", LogFileKind.TEMPORARY, -1),
        ("00000000000000000003.json.tmp", LogFileKind.TEMPORARY, -1),
        (".gitignore", LogFileKind.TEMPORARY, -1),
        ("README", LogFileKind.UNKNOWN, -1),
        ("3.json", LogFileKind.UNKNOWN, -1),
    ],
)
def test_log_file_names_are_classified(name: str, kind: LogFileKind, version: int) -> None:
    f = classify(name)
    assert f.kind is kind
    assert f.version == version


def test_start_after_lists_exactly_the_files_of_a_version_and_later() -> None:
    names = sorted(
        [f"{v:020d}.json" for v in range(3)]
        + [f"{v:020d}.checkpoint.parquet" for v in range(3)]
        + ["00000000000000000001.00000000000000000002.compacted.json", "00000000000000000001.crc"]
    )
    after = start_after_for(1)
    assert after is not None
    assert {classify(n).first_version for n in names if n > after} == {1, 2}
    assert start_after_for(0) is None


# -- _last_checkpoint --------------------------------------------------------------------------


def test_last_checkpoint_checksum_matches_the_protocol_vector() -> None:
    document = json.loads(PROTOCOL_VECTOR)
    assert canonicalize(document) == (
        '"k0"="%27v%200%27","k1"+"k2"=2,"k1"+"k3"+0="v3","k1"+"k3"+1+0=1,"k1"+"k3"+1+1=2,'
        '"k1"+"k3"+2+"k4"="v4","k1"+"k3"+2+"k5"+0="v5","k1"+"k3"+2+"k5"+1="v6","k1"+"k3"+2+"k5"+2="v7"'
    )
    assert checksum(document) == "6a92d155a59bf2eecbd4b4ec7fd1f875"


def test_real_last_checkpoint_files_validate() -> None:
    root = corpus_table("kernel-rs/v2-checkpoints-json-with-last-checkpoint")
    data = (root / "_delta_log" / "_last_checkpoint").read_bytes()
    assert "checksum" in json.loads(data)
    parsed = parse_last_checkpoint(data, where="test")
    assert parsed is not None
    assert parsed.version == json.loads(data)["version"]


@pytest.mark.parametrize(
    "data",
    [b"", b"{not json", b'{"version": 3, "version": 4}', b'{"size": 3}', b'{"version": 3, "checksum": "00"}'],
)
def test_untrustworthy_last_checkpoint_is_ignored_with_a_warning(data: bytes, caplog: pytest.LogCaptureFixture) -> None:
    assert parse_last_checkpoint(data, where="the-file") is None
    assert "the-file" in caplog.text


def test_a_lying_last_checkpoint_falls_back_to_listing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _table(tmp_path, 4, checkpoint_at=2)
    (tmp_path / "_delta_log" / "_last_checkpoint").write_text('{"version": 40, "size": 3}')
    snap = DeltaLog(str(tmp_path)).snapshot()
    assert snap.version == 3
    assert len(snap.files) == 4
    assert "points at version 40" in caplog.text


# -- checkpoints -------------------------------------------------------------------------------


def test_a_missing_multi_part_checkpoint_part_falls_back_to_commits(tmp_path: Path) -> None:
    src = corpus_table("delta-golden/multi-part-checkpoint/delta")
    shutil.copytree(src, tmp_path / "t")
    log_dir = tmp_path / "t" / "_delta_log"
    expected = DeltaLog(str(tmp_path / "t")).snapshot().live_keys()
    (log_dir / "00000000000000000001.checkpoint.0000000002.0000000002.parquet").unlink()
    assert DeltaLog(str(tmp_path / "t")).snapshot().live_keys() == expected  # commits 0 and 1 are still there


def test_an_incomplete_checkpoint_without_another_route_is_an_error(tmp_path: Path) -> None:
    _table(tmp_path, 3, checkpoint_at=1)
    log_dir = tmp_path / "_delta_log"
    (log_dir / "00000000000000000000.json").unlink()
    checkpoint = log_dir / "00000000000000000001.checkpoint.parquet"
    checkpoint.write_bytes(checkpoint.read_bytes()[:100])  # truncated
    with pytest.raises(IncompleteCheckpointError) as info:
        DeltaLog(str(tmp_path)).snapshot()
    assert str(checkpoint) in str(info.value)
    assert str(tmp_path) in str(info.value)


def test_a_missing_sidecar_makes_a_v2_checkpoint_incomplete(tmp_path: Path) -> None:
    src = corpus_table("kernel-rs/v2-checkpoints-parquet-with-sidecars")
    shutil.copytree(src, tmp_path / "t")
    log_dir = tmp_path / "t" / "_delta_log"
    for commit in log_dir.glob("0000000000000000000[0-5].json"):
        commit.unlink()
    for older in log_dir.glob("0000000000000000000[0-5].checkpoint.*.parquet"):
        older.unlink()  # only the checkpoint at 6 can build the table now
    [checkpoint] = log_dir.glob("00000000000000000006.checkpoint.*.parquet")
    sidecars = pq.read_table(checkpoint, columns=["sidecar"]).column("sidecar").drop_null().to_pylist()
    (log_dir / "_sidecars" / sidecars[-1]["path"]).unlink()
    with pytest.raises(IncompleteCheckpointError) as info:
        DeltaLog(str(tmp_path / "t")).snapshot()
    assert "sidecar" in str(info.value) and sidecars[-1]["path"] in str(info.value)


def test_a_damaged_checkpoint_the_hint_points_at_falls_back_to_an_older_route(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``_last_checkpoint`` names checkpoint 20; it is unreadable: checkpoint 10 and commits 11-20 build it."""
    src = corpus_table("delta-rs/table_with_deletion_logs")
    expected = DeltaLog(str(src)).snapshot()
    shutil.copytree(src, tmp_path / "t")
    log_dir = tmp_path / "t" / "_delta_log"
    assert orjson.loads((log_dir / "_last_checkpoint").read_bytes())["version"] == 20
    (log_dir / "00000000000000000020.checkpoint.parquet").write_bytes(b"PAR1 not a checkpoint PAR1")
    with caplog.at_level(logging.WARNING, logger="deltatail"):
        got = DeltaLog(str(tmp_path / "t")).snapshot()
    assert got.version == expected.version == 20
    assert {f.key for f in got.live_files()} == {f.key for f in expected.live_files()}
    assert "00000000000000000020.checkpoint.parquet" in caplog.text and "trying an older checkpoint" in caplog.text


# -- snapshots and commits ---------------------------------------------------------------------


def test_versions_beyond_the_log_are_version_not_found(tmp_path: Path) -> None:
    _table(tmp_path, 2)
    log = DeltaLog(str(tmp_path))
    with pytest.raises(VersionNotFoundError, match="latest is 1"):
        log.snapshot(5)
    with pytest.raises(VersionNotFoundError):
        log.snapshot(-1)


def test_a_cleaned_up_log_cannot_build_old_versions(tmp_path: Path) -> None:
    _table(tmp_path, 4, checkpoint_at=2)
    for v in (0, 1):
        (tmp_path / "_delta_log" / f"{v:020d}.json").unlink()
    log = DeltaLog(str(tmp_path))
    assert log.earliest_version() == 2
    with pytest.raises(VersionNotFoundError, match="cleaned up"):
        log.snapshot(1)


def test_not_a_table(tmp_path: Path) -> None:
    with pytest.raises(TableNotFoundError):
        DeltaLog(str(tmp_path)).latest_version()
    (tmp_path / "_delta_log").mkdir()
    with pytest.raises(TableNotFoundError):
        DeltaLog(str(tmp_path)).latest_version()
    with pytest.raises(TableNotFoundError):
        DeltaLog(str(tmp_path)).earliest_version()
    with pytest.raises(TableNotFoundError):
        DeltaLog(str(tmp_path)).snapshot()


def test_read_commit_errors_name_the_file(tmp_path: Path) -> None:
    _table(tmp_path, 2)
    log = DeltaLog(str(tmp_path))
    with pytest.raises(MissingFileError):
        log.read_commit(7)
    path = tmp_path / "_delta_log" / f"{1:020d}.json"
    path.write_bytes(path.read_bytes()[:-20])  # truncated mid-line
    with pytest.raises(InvalidLogError) as info:
        log.read_commit(1)
    assert str(path) in str(info.value)
    assert "version 1" in str(info.value)


def test_commits_in_a_range_with_a_hole_are_a_gap(tmp_path: Path) -> None:
    _table(tmp_path, 4)
    (tmp_path / "_delta_log" / f"{2:020d}.json").unlink()
    log = DeltaLog(str(tmp_path))
    assert [c.version for c in log.commits(0, 1)] == [0, 1]
    with pytest.raises(VersionGapError) as info:
        list(log.commits(0, 3))
    assert info.value.version == 2


def test_new_commits_and_update_follow_the_log(tmp_path: Path) -> None:
    _table(tmp_path, 2)
    log = DeltaLog(str(tmp_path))
    snap = log.snapshot()
    assert log.new_commits(snap.version) == []
    _table(tmp_path, 2)
    assert log.new_commits(snap.version) == [2, 3]
    snap, applied = log.update(snap)
    assert snap.version == 3 and [a.commit.version for a in applied] == [2, 3]
    assert len(snap.files) == 4
    (tmp_path / "_delta_log" / f"{4 + 1:020d}.json").write_bytes(
        (tmp_path / "_delta_log" / f"{3:020d}.json").read_bytes()
    )
    with pytest.raises(VersionGapError):
        log.new_commits(snap.version)  # 5 exists, 4 does not
    assert log.new_commits(snap.version, check_gaps=False) == []


def _retyped_checkpoint(path: Path, field: str, values: pa.Array | None) -> None:
    """Rewrite checkpoint ``path`` with ``add.<field>`` replaced by ``values`` (``None``: ``add`` becomes a string)."""
    table = pq.read_table(path)
    add = table.column("add").combine_chunks()
    if values is None:
        replaced = pa.array(["not an action"] * len(add), pa.string())
    else:
        children = [values if f.name == field else add.field(f.name) for f in add.type]
        names = [f.name for f in add.type]
        replaced = pa.StructArray.from_arrays(children, names=names, mask=add.is_null())
    pq.write_table(table.set_column(table.schema.get_field_index("add"), "add", replaced), path)


@pytest.mark.parametrize(
    ("field", "make", "named"),
    [
        ("size", lambda n: pa.array(["abc"] * n), "add.size is string"),
        ("path", lambda n: pa.array(range(n), pa.int64()), "add.path is int64"),
        ("partitionValues", lambda n: pa.array(["{}"] * n), "add.partitionValues is string"),
        ("modificationTime", lambda n: pa.array([1.5] * n), "add.modificationTime is double"),
        ("size", lambda n: pa.array([2**64 - 1] * n, pa.uint64()), "not in range"),
        ("add", None, "column 'add' is string, not a struct"),
    ],
)
def test_a_checkpoint_column_of_the_wrong_type_is_an_unreadable_checkpoint(
    tmp_path: Path, field: str, make: Any, named: str
) -> None:
    src = corpus_table("delta-golden/checkpoint/delta")
    expected = DeltaLog(str(src)).snapshot()
    shutil.copytree(src, tmp_path / "t")
    log_dir = tmp_path / "t" / "_delta_log"
    checkpoint = log_dir / "00000000000000000010.checkpoint.parquet"
    rows = pq.read_metadata(checkpoint).num_rows
    _retyped_checkpoint(checkpoint, field, None if make is None else make(rows))
    # the commits still build every version: the unreadable checkpoint is passed over
    got = DeltaLog(str(tmp_path / "t")).snapshot()
    assert {f.key for f in got.live_files()} == {f.key for f in expected.live_files()}
    for commit in log_dir.glob("0000000000000000000[0-9].json"):
        commit.unlink()  # now only the checkpoint can
    with pytest.raises(IncompleteCheckpointError, match=named) as info:
        DeltaLog(str(tmp_path / "t")).snapshot()
    assert info.value.file == str(checkpoint) and info.value.version == 10
