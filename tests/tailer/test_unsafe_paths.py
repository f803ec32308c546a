"""Paths outside the table are refused before anything is opened, unless under a listed external root.

Each table is written by ``deltalake``; the hostile commit is appended to ``_delta_log`` by hand.
Where a hostile path names a FIFO or a special file, the command line runs in a child process with
a time limit (:func:`in_child`): a FIFO outside the table blocks whoever opens it for reading, from
any thread, so a refusal that returns proves the FIFO was never opened. The other commands run
through the entry point in this process (``damage.run_inline``, as the console script calls
it): the child would only import the command line again.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import quote

import lance
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cdf_helpers import append_commit, corpus_table
from damage import run_inline as deltatail
from deltalake import write_deltalake
from lance.fragment import DataFile, FragmentMetadata

from deltatail.sinks.spark.options import SourceOptions
from deltatail.state.errors import ConfigError, UnsafePathError
from deltatail.tailer.cli.serve import load_serve_config, source
from deltatail.tailer.lance.dataset import LanceDataset
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.read.feed import ChangeFeed

MARKER = "MARKER-outside-the-table"
#: Seconds a command may take; far above a refusal, so only an opened FIFO (a hang) reaches it.
LIMIT = 120


def in_child(*args: str) -> subprocess.CompletedProcess[str]:
    """``deltatail ARGS`` in a child process, killed after :data:`LIMIT` seconds (a test failure)."""
    code = "import sys; from deltatail.tailer.cli.main import main; sys.exit(main(sys.argv[1:]))"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=LIMIT, check=False
    )


def _rows(ids: list[int], name: str) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "name": pa.array([name] * len(ids), pa.string())})


def _add(path: str, size: int, **extra: Any) -> dict[str, Any]:
    return {
        "add": {
            "path": path,
            "partitionValues": {},
            "size": size,
            "modificationTime": 1_700_000_000_000,
            "dataChange": True,
            **extra,
        }
    }


@pytest.fixture
def lake(tmp_path: Path) -> tuple[Path, Path]:
    """A table at ``tmp/lake/t`` (one commit, two rows) and ``tmp/outside`` with a marker Parquet file."""
    table = tmp_path / "lake" / "t"
    write_deltalake(str(table), _rows([1, 2], "inside"))
    outside = tmp_path / "outside"
    outside.mkdir()
    pq.write_table(_rows([666], MARKER), outside / "secret.parquet")
    os.mkfifo(outside / "fifo.parquet")
    return table, outside


def _hostile_forms(outside: Path) -> dict[str, str]:
    secret = outside / "secret.parquet"
    return {
        "dotdot": "../../outside/secret.parquet",
        "percent": "%2E%2E/%2E%2E/outside/secret.parquet",
        "absolute": str(secret),
        "file-uri": "file://" + quote(str(secret)),
    }


@pytest.mark.parametrize("form", ["dotdot", "percent", "absolute", "file-uri"])
def test_changes_refuses_a_path_outside_the_table(lake: tuple[Path, Path], form: str) -> None:
    table, outside = lake
    path = _hostile_forms(outside)[form]
    version = append_commit(table, [_add(path, (outside / "secret.parquet").stat().st_size)])
    out = deltatail("changes", str(table))
    assert out.returncode == 1, out.stderr
    assert MARKER not in out.stdout
    assert out.stderr.startswith("deltatail: error: logged path")
    assert f"version {version}" in out.stderr and "refused before reading" in out.stderr
    assert "Traceback" not in out.stderr


@pytest.mark.parametrize("form", ["absolute", "file-uri"])
def test_a_listed_external_root_is_read(lake: tuple[Path, Path], form: str) -> None:
    table, outside = lake
    path = _hostile_forms(outside)[form]
    append_commit(table, [_add(path, (outside / "secret.parquet").stat().st_size)])
    out = deltatail("changes", str(table), "--external-root", str(outside))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in out.stdout.splitlines()]
    assert sorted((r["id"], r["name"]) for r in rows) == [(1, "inside"), (2, "inside"), (666, MARKER)]


def test_a_listed_root_does_not_admit_relative_paths_climbing_into_it(lake: tuple[Path, Path]) -> None:
    table, outside = lake
    append_commit(table, [_add("../../outside/secret.parquet", 10)])
    out = deltatail("changes", str(table), "--external-root", str(outside))
    assert out.returncode == 1 and MARKER not in out.stdout
    assert "climbs out of the table root" in out.stderr


@pytest.mark.parametrize("target", ["fifo", "/etc/passwd", "/proc/self/environ", "/dev/zero"])
def test_special_files_are_never_opened(lake: tuple[Path, Path], target: str) -> None:
    table, outside = lake
    path = str(outside / "fifo.parquet") if target == "fifo" else target
    append_commit(table, [_add(path, 100)])
    out = in_child("changes", str(table))  # would block on the FIFO if it were opened
    assert out.returncode == 1
    assert "refused before reading" in out.stderr and path in out.stderr


def test_a_relative_path_to_a_fifo_is_never_opened(lake: tuple[Path, Path]) -> None:
    table, _ = lake
    append_commit(table, [_add("../../outside/fifo.parquet", 100)])
    out = in_child("changes", str(table))
    assert out.returncode == 1 and "climbs out of the table root" in out.stderr


def test_a_deletion_vector_outside_the_table_is_never_opened(lake: tuple[Path, Path]) -> None:
    table, outside = lake
    data_file = next(p for p in table.iterdir() if p.suffix == ".parquet")
    dv = {"storageType": "p", "pathOrInlineDv": str(outside / "fifo.parquet"), "sizeInBytes": 34, "cardinality": 1}
    protocol = {
        "protocol": {
            "minReaderVersion": 3,
            "minWriterVersion": 7,
            "readerFeatures": ["deletionVectors"],
            "writerFeatures": ["deletionVectors"],
        }
    }
    size = data_file.stat().st_size
    remove = {"remove": {"path": data_file.name, "deletionTimestamp": 1_700_000_000_000, "dataChange": True}}
    version = append_commit(table, [protocol, remove, _add(data_file.name, size, deletionVector=dv)])
    out = in_child("changes", str(table), "--starting-version", str(version))
    assert out.returncode == 1, out.stderr
    assert "refused before reading" in out.stderr and str(outside / "fifo.parquet") in out.stderr
    assert f"version {version}" in out.stderr


def test_run_refuses_and_delivers_nothing_of_the_outside(lake: tuple[Path, Path], tmp_path: Path) -> None:
    table, outside = lake
    append_commit(table, [_add(str(outside / "secret.parquet"), (outside / "secret.parquet").stat().st_size)])
    sink = tmp_path / "sink.jsonl"
    args = ["run", str(table), "--state-dir", str(tmp_path / "state"), "--sink", f"jsonl:{sink}"]
    out = deltatail(*args, "--until-caught-up", "--no-watch", "--sink-retries", "0")
    assert out.returncode == 1, out.stderr
    assert "refused before reading" in out.stderr
    assert MARKER not in (sink.read_text() if sink.exists() else "")


def test_run_reads_external_roots_from_the_config_file(lake: tuple[Path, Path], tmp_path: Path) -> None:
    table, outside = lake
    append_commit(table, [_add(str(outside / "secret.parquet"), (outside / "secret.parquet").stat().st_size)])
    sink = tmp_path / "sink.jsonl"
    config = tmp_path / "run.toml"
    config.write_text(f"external_roots = [{json.dumps(str(outside))}]\n", encoding="utf-8")
    args = ["run", str(table), "--config", str(config), "--state-dir", str(tmp_path / "state")]
    out = deltatail(*args, "--sink", f"jsonl:{sink}", "--until-caught-up", "--no-watch")
    assert out.returncode == 0, out.stderr
    names = sorted(json.loads(line)["name"] for line in sink.read_text().splitlines())
    assert names == sorted(["inside", "inside", MARKER])


def test_a_relative_external_root_is_a_usage_error(lake: tuple[Path, Path]) -> None:
    table, _ = lake
    out = deltatail("changes", str(table), "--external-root", "outside")
    assert out.returncode == 2
    assert "must be an absolute path or a URI" in out.stderr


@pytest.mark.parametrize(
    "hostile", ["../../../outside/secret.parquet", "/etc/passwd", "s3://otherbucket/sidecar.parquet"]
)
def test_a_sidecar_outside_the_sidecars_directory_is_refused(tmp_path: Path, hostile: str) -> None:
    src = corpus_table("kernel-rs/v2-checkpoints-parquet-with-sidecars")
    shutil.copytree(src, tmp_path / "t")
    log_dir = tmp_path / "t" / "_delta_log"
    for commit in log_dir.glob("0000000000000000000[0-5].json"):
        commit.unlink()
    for older in log_dir.glob("0000000000000000000[0-5].checkpoint.*.parquet"):
        older.unlink()  # only the checkpoint at 6 can build the table now
    [checkpoint] = log_dir.glob("00000000000000000006.checkpoint.*.parquet")
    checkpoint.chmod(0o644)
    table = pq.read_table(checkpoint)
    sidecars = table.column("sidecar").to_pylist()
    first = next(i for i, s in enumerate(sidecars) if s is not None)
    sidecars[first] = {**sidecars[first], "path": hostile}
    index = table.schema.get_field_index("sidecar")
    table = table.set_column(index, "sidecar", pa.array(sidecars, table.schema.field("sidecar").type))
    pq.write_table(table, checkpoint)
    with pytest.raises(UnsafePathError) as info:
        DeltaLog(str(tmp_path / "t")).snapshot()
    assert info.value.version == 6 and hostile in str(info.value) and "_sidecars" in str(info.value)


def test_audit_refuses_to_read_a_footer_outside_the_table(lake: tuple[Path, Path]) -> None:
    table, outside = lake
    os.utime(outside / "secret.parquet", (1_000_000_000, 1_000_000_000))
    version = append_commit(table, [_add(str(outside / "secret.parquet"), (outside / "secret.parquet").stat().st_size)])
    out = deltatail("audit", str(table), "--format", "jsonl")
    assert out.returncode == 1, out.stderr
    assert "refused before reading" in out.stderr and f"version {version}" in out.stderr
    assert (outside / "secret.parquet").stat().st_atime == 1_000_000_000  # never read
    listed = deltatail("audit", str(table), "--format", "jsonl", "--external-root", str(outside))
    assert listed.returncode == 0, listed.stderr
    assert json.loads(listed.stdout.splitlines()[-1])["version"] == version


@pytest.mark.parametrize("form", ["dotdot", "absolute"])
def test_a_lance_data_file_outside_the_dataset_is_refused(tmp_path: Path, form: str) -> None:
    """The hostile manifest is written by pylance itself (an Append of a fragment naming the outside file)."""
    uri = tmp_path / "lake" / "ds"
    lance.write_dataset(pa.table({"id": [1, 2]}), str(uri))
    outside = tmp_path / "outside" / "src"
    lance.write_dataset(pa.table({"id": [666]}), str(outside))
    source = lance.dataset(str(outside)).get_fragments()[0].metadata
    d = source.files[0]
    path = f"../../../outside/src/data/{d.path}" if form == "dotdot" else f"{outside}/data/{d.path}"
    hostile = DataFile(path, d.fields, d.column_indices, d.file_major_version, d.file_minor_version, d.file_size_bytes)
    fragment = FragmentMetadata(id=1, files=[hostile], physical_rows=source.physical_rows)
    version = lance.LanceDataset.commit(str(uri), lance.LanceOperation.Append([fragment]), read_version=1).version
    out = deltatail("changes", str(uri))
    assert out.returncode == 1, out.stderr
    assert "refused before reading" in out.stderr and f"version {version}" in out.stderr and "fragment 1" in out.stderr
    assert "666" not in out.stdout


def test_serve_takes_external_roots_from_defaults_and_per_table(lake: tuple[Path, Path], tmp_path: Path) -> None:
    table, outside = lake
    config = tmp_path / "serve.toml"
    config.write_text(
        f'[service]\nstate_root = "{tmp_path / "state"}"\n'
        f'[defaults]\nexternal_roots = ["{outside}"]\n'
        f'[[tables]]\npath = "{table}"\n'
        f'[[tables]]\nname = "other"\npath = "{table}"\nexternal_roots = ["s3://src/clones"]\n'
    )
    loaded = load_serve_config(str(config))
    roots = [source(name, settings).config.options.external_roots for name, settings in loaded.tables]
    assert roots == [(str(outside),), ("s3://src/clones",)]
    config.write_text(f'[service]\nstate_root = "{tmp_path}"\n[[tables]]\npath = "{table}"\nexternal_roots = ["rel"]\n')
    with pytest.raises(ConfigError, match="must be an absolute path or a URI"):
        load_serve_config(str(config))


def test_the_spark_source_options_carry_external_roots_to_the_feed(lake: tuple[Path, Path]) -> None:
    """What the Spark source's readers do with its options (``ChangeFeed(o.path, o.storage(), o.change_options())``)."""
    table, outside = lake
    secret = outside / "secret.parquet"
    version = append_commit(table, [_add(str(secret), secret.stat().st_size)])
    plain = SourceOptions.parse({"path": str(table), "format": "delta"})
    with pytest.raises(UnsafePathError) as info:
        ChangeFeed(plain.path, plain.storage(), plain.change_options()).read_table()
    assert info.value.version == version and info.value.file == str(secret)
    listed = SourceOptions.parse({"path": str(table), "format": "delta", "externalRoots": f" {outside} ,s3://b/x"})
    assert listed.external_roots == (str(outside), "s3://b/x")
    rows = ChangeFeed(listed.path, listed.storage(), listed.change_options()).read_table()
    assert sorted(rows.column("name").to_pylist()) == sorted(["inside", "inside", MARKER])
    with pytest.raises(ConfigError, match="must be an absolute path or a URI"):
        SourceOptions.parse({"path": str(table), "externalRoots": "relative"})


def test_lance_snapshot_refuses_an_outside_data_file_unless_listed(tmp_path: Path) -> None:
    uri = tmp_path / "lake" / "ds"
    lance.write_dataset(pa.table({"id": [1, 2]}), str(uri))
    outside = tmp_path / "outside" / "src"
    lance.write_dataset(pa.table({"id": [666]}), str(outside))
    d = lance.dataset(str(outside)).get_fragments()[0].metadata.files[0]
    path = f"{outside}/data/{d.path}"
    hostile = DataFile(path, d.fields, d.column_indices, d.file_major_version, d.file_minor_version, d.file_size_bytes)
    fragment = FragmentMetadata(id=1, files=[hostile], physical_rows=1)
    lance.LanceDataset.commit(str(uri), lance.LanceOperation.Append([fragment]), read_version=1)
    refused = deltatail("snapshot", str(uri), "--json")
    assert refused.returncode == 1 and "refused before reading" in refused.stderr
    listed = deltatail("snapshot", str(uri), "--json", "--external-root", str(outside))
    assert listed.returncode == 0, listed.stderr
    assert path in listed.stdout


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


def _num(field: int, value: int) -> bytes:
    return _varint(field << 3) + _varint(value)


def _msg(field: int, body: bytes) -> bytes:
    return _varint(field << 3 | 2) + _varint(len(body)) + body


def _lance_manifest(root: Path, data_file: bytes, row_ids: bytes, transaction: bytes) -> None:
    fragment = _num(1, 0) + _msg(2, _msg(1, data_file)) + _num(4, 2) + _msg(6, _msg(1, row_ids) + _num(3, 4))
    body = _num(3, 1) + _msg(2, fragment) + _msg(12, transaction) + _num(9, 2)
    (root / "_versions").mkdir(parents=True, exist_ok=True)
    data = struct.pack("<I", len(body)) + body + struct.pack("<qHH", 0, 0, 2) + b"LANC"
    (root / "_versions" / f"{(1 << 64) - 1 - 1:020d}.manifest").write_bytes(data)


@pytest.mark.parametrize(
    ("data_file", "row_ids", "transaction"),
    [
        (b"../../x.lance", b"ids.bin", b"0-x.txn"),
        (b"f.lance", b"../ids.bin", b"0-x.txn"),
        (b"f.lance", b"/etc/passwd", b"0-x.txn"),
        (b"f.lance", b"ids.bin", b"../../secret.txn"),
    ],
)
def test_every_file_a_lance_manifest_names_is_contained(
    tmp_path: Path, data_file: bytes, row_ids: bytes, transaction: bytes
) -> None:
    """Hand-written manifests (as test_lance_cli.py's): data, external row-id and transaction files."""
    root = tmp_path / "ds"
    _lance_manifest(root, data_file, row_ids, transaction)
    (tmp_path / "secret.txn").write_bytes(b"\x08\x01")
    ds = LanceDataset(str(root))
    with pytest.raises(UnsafePathError) as info:
        ds.manifest(1)
        ds.transaction(1)
    assert info.value.version == 1 and info.value.table == str(root)
