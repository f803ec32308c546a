"""Delta tables in object stores read exactly as locally: conformance and differential tests.

Two kinds of tables:

- **Corpus tables uploaded** to S3 (moto), Azure (Azurite) and GCS (fake-gcs-server), a subset that
  covers checkpoints of every kind (classic, multi-part, V2 with JSON and Parquet sidecars, a V2
  checkpoint named classically, a corrupt ``_last_checkpoint``, a log that starts at a checkpoint),
  deletion vectors (in files with packed offsets, and inline), column mapping (name and id), cdc
  files, percent-encoded paths, log compaction and in-commit timestamps. The oracle is the local
  copy read by deltatail: ``deltatail snapshot --json`` (the real command line, with
  ``--storage-option``) must print the same document at every version checked, and the change rows
  and live rows must be the same multisets (``_commit_timestamp`` aside: it comes from commit file
  modification times, which an upload changes; the tables with in-commit timestamps compare it too).
  The local copy itself is checked against deltalake and the corpus's expectations elsewhere
  (``test_conformance.py``, ``test_changes_corpus.py``).
- **Tables written by deltalake** into moto and Azurite: change rows equal deltalake's ``load_cdf``
  over the same store, snapshots equal deltalake's, and ``_commit_timestamp`` is each commit
  object's modification time as the store reports it.
"""

from __future__ import annotations

import functools
import io
import json
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import redirect_stdout
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pytest
from deltalake import DeltaTable, write_deltalake

from deltatail.state.errors import DeltaTailError
from deltatail.tailer.cli.main import main as deltatail
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.storage.objectstore import ObjectStoreStorage

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/tailer: cdf_helpers (tests/ is not a package)
sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # tests/: objectstores.py
from cdf_helpers import assert_same_rows, corpus_table, manifest_entries, multiset
from objectstores import Cloud, CountingProxy, Server, kind, listing_start

pytest_plugins = ("objectstore_fixtures",)

NO_PROCESSES = ChangeOptions(reader_processes=0)

#: The corpus subset, and what each one covers.
CORPUS_SUBSET = {
    "kernel-rs/app-txn-checkpoint": "classic single-part checkpoint, app transactions",
    "kernel-rs/v1-multi-part-struct-stats-only": "multi-part checkpoint",
    "kernel-rs/v2-checkpoints-parquet-with-sidecars": "V2 checkpoints (UUID-named Parquet) with sidecars",
    "kernel-rs/v2-checkpoints-json-with-sidecars": "V2 checkpoints (UUID-named JSON) with sidecars",
    "kernel-rs/v2-classic-checkpoint-json": "a V2 checkpoint named classically",
    "delta-golden/corrupted-last-checkpoint-kernel/delta": "corrupt _last_checkpoint: found by listing",
    "delta-rs/checkpoint-cdf-table": "log starting at a checkpoint, cdc files",
    "delta-golden/dv-partitioned-with-checkpoint/delta": "deletion vectors in files, checkpoint, partitions",
    "kernel-rs/cdf-table-with-dv": "inline deletion vectors",
    "kernel-rs/cdf-table-with-cdc-and-dvs": "deletion vector files with packed offsets, cdc files",
    "kernel-rs/compacted-log-files-table": "log compaction files",
    "kernel-rs/cdf-column-mapping-name-mode": "column mapping (name), cdc files",
    "kernel-rs/cdf-column-mapping-id-mode": "column mapping (id), cdc files",
    "kernel-rs/cdf-table-partitioned": "percent-encoded partition paths, cdc files",
    "delta-golden/data-reader-escaped-chars/delta": "keys with '%' and '+' (percent-encoded in the log)",
    "delta-golden/hive-deltatbl-special-chars-in-partition-column": "keys with spaces and '%3D'",
    "delta-rs/cdc_ict_table": "in-commit timestamps, cdc files",
}

#: Tables whose ``_commit_timestamp`` does not depend on file times (in-commit timestamps throughout).
ICT_TABLES = frozenset({"delta-rs/cdc_ict_table"})


def run_cli(*args: str) -> tuple[int, str]:
    """``deltatail ARGS`` in this process (the real argument parsing and commands): exit code and stdout."""
    raw = io.BytesIO()
    out = io.TextIOWrapper(raw, encoding="utf-8")
    with redirect_stdout(out):
        code = deltatail(list(args))
    out.flush()
    return code, raw.getvalue().decode()


def storage_flags(options: dict[str, str]) -> list[str]:
    return [a for k, v in options.items() for a in ("--storage-option", f"{k}={v}")]


def snapshot_doc(table: str, version: int | None, flags: list[str]) -> dict[str, Any] | str:
    """``deltatail snapshot TABLE --json`` as a document, or the error's first words if it fails."""
    args = ["snapshot", table, "--json", *flags, *([] if version is None else ["--version", str(version)])]
    try:
        code, out = run_cli(*args)
    except SystemExit as e:  # argparse
        return f"exit {e.code}"
    if code != 0:
        return f"exit {code}"
    doc: dict[str, Any] = json.loads(out)
    return doc


def read_rows(table: str, storage: ObjectStoreStorage | None, first: int, last: int) -> dict[str, Any]:
    """What deltatail reads of a table: all change rows from ``first``, and the live rows at ``last``."""
    out: dict[str, Any] = {}
    feed = ChangeFeed(table, storage, NO_PROCESSES)
    reads: tuple[tuple[str, Callable[[], pa.Table]], ...] = (
        ("changes", lambda: feed.read_table(first)),
        ("live", lambda: feed.read_table(initial_snapshot=True, ending_version=last)),
    )
    for name, read in reads:
        try:
            out[name] = read()
        except DeltaTailError as e:
            out[name] = f"{type(e).__name__}: {e.message}"
    return out


@dataclass(frozen=True)
class LocalReading:
    """What deltatail reads of a corpus table's local copy: the oracle of its three stores' tests."""

    first: int
    last: int
    versions: tuple[int | None, ...]  # None: the latest
    snapshots: tuple[dict[str, Any] | str, ...]  # at each of ``versions``
    rows: dict[str, Any]  # read_rows(first, last)


@functools.cache
def local_reading(table: str) -> LocalReading:
    """The local copy read once for the three stores (the corpus is read-only: an equal reading each time)."""
    local = str(corpus_table(table))
    entry = manifest_entries()[table]
    first, last = int(entry["min_version"]), int(entry["max_version"])
    versions = (None, *sorted({first, *[v for v in entry["checkpoint_versions"] if v >= first], last}))
    snapshots = tuple(snapshot_doc(local, version, []) for version in versions)
    return LocalReading(first, last, versions, snapshots, read_rows(local, None, first, last))


@pytest.mark.slow
@pytest.mark.parametrize("table", sorted(CORPUS_SUBSET))
def test_corpus_table_reads_the_same_from_the_store(cloud: Cloud, table: str) -> None:
    here = local_reading(table)
    first, last = here.first, here.last
    uri = cloud.upload_dir(corpus_table(table), table)
    storage = ObjectStoreStorage(cloud.options)

    for version, local_doc in zip(here.versions, here.snapshots, strict=True):
        there = snapshot_doc(uri, version, storage_flags(cloud.options))
        assert isinstance(local_doc, dict), f"the local copy fails at version {version}: {local_doc}"
        assert there == local_doc, f"snapshot at version {version} differs"

    remote, local_rows = read_rows(uri, storage, first, last), here.rows
    for part in ("changes", "live"):
        assert isinstance(local_rows[part], pa.Table), f"the local copy fails: {local_rows[part]}"
        assert isinstance(remote[part], pa.Table), f"{part} from the store fail: {remote[part]}"
        drop = () if table in ICT_TABLES else ("_commit_timestamp",)
        assert_same_rows(remote[part], local_rows[part], drop=drop)
    assert remote["changes"].num_rows > 0 or local_rows["changes"].num_rows == 0
    assert storage.counter.snapshot().get("get", 0) > 0  # read through the store, not by accident from disk


# ---------------------------------------------------------------- tables written by deltalake into the store


def write_history(uri: str, options: dict[str, str]) -> None:
    """Six versions: create (partitioned, CDF on), append, delete, update, merge, overwrite (no cdc files)."""
    df = pa.table(
        {"id": pa.array(range(20), pa.int64()), "v": [f"v{i}" for i in range(20)], "p": [i % 3 for i in range(20)]}
    )
    cdf = {"delta.enableChangeDataFeed": "true"}
    write_deltalake(uri, df, storage_options=options, partition_by=["p"], configuration=cdf)
    more = df.slice(0, 5).set_column(0, "id", pa.array(range(100, 105), pa.int64()))
    write_deltalake(uri, more, storage_options=options, mode="append")
    DeltaTable(uri, storage_options=options).delete("id < 3")
    DeltaTable(uri, storage_options=options).update(predicate="id = 5", updates={"v": "'five'"})
    src = pa.table({"id": pa.array([6, 7, 500], pa.int64()), "v": ["m6", "m7", "m500"], "p": [0, 1, 2]})
    (
        DeltaTable(uri, storage_options=options)
        .merge(src, "t.id = s.id", source_alias="s", target_alias="t")
        .when_matched_update_all()
        .when_not_matched_insert_all()
        .execute()
    )
    write_deltalake(uri, df.slice(0, 2), storage_options=options, mode="overwrite")


@pytest.fixture(scope="module", params=["s3", "azure"])
def history(request: pytest.FixtureRequest) -> tuple[Cloud, str]:
    """The six-version table in S3 and in Azure (as ``writable_cloud``), written once for the tests that
    only read it (each writing its own took most of their time)."""
    server = request.getfixturevalue({"s3": "moto", "azure": "azurite"}[request.param])  # objectstore_fixtures
    cloud = Cloud.fresh(request.param, server)
    uri = cloud.uri("hist")
    write_history(uri, cloud.writer_options)
    return cloud, uri


@pytest.mark.slow
def test_change_rows_equal_load_cdf_on_the_same_store(history: tuple[Cloud, str]) -> None:
    cloud, uri = history
    dt = DeltaTable(uri, storage_options=cloud.writer_options)
    assert dt.version() == 5
    expected = pa.table(dt.load_cdf(starting_version=0, ending_version=5).read_all())
    feed = ChangeFeed(uri, ObjectStoreStorage(cloud.options), NO_PROCESSES)
    got = feed.read_table(0, 5)
    assert got.num_rows == expected.num_rows > 0
    assert_same_rows(got, expected)
    # the overwrite (v5, no cdc files) deletes every row live at v4, as deltalake's own snapshot counts them
    live_at_4 = DeltaTable(uri, storage_options=cloud.writer_options, version=4).to_pyarrow_table().num_rows
    v5 = feed.read_table(5, 5)
    assert Counter(v5.column("_change_type").to_pylist()) == {"insert": 2, "delete": live_at_4}


@pytest.mark.slow
def test_snapshots_equal_deltalake_on_the_same_store(history: tuple[Cloud, str]) -> None:
    cloud, uri = history
    for version in range(6):
        doc = snapshot_doc(uri, version, storage_flags(cloud.options))
        assert isinstance(doc, dict)
        dt = DeltaTable(uri, storage_options=cloud.writer_options, version=version)
        assert doc["version"] == version and doc["metadata"]["id"] == dt.metadata().id
        actions = pa.table(dt.get_add_actions(flatten=True))
        assert sorted(f["path"] for f in doc["files"]) == sorted(actions.column("path").to_pylist())
        sizes = dict(zip(actions.column("path").to_pylist(), actions.column("size_bytes").to_pylist(), strict=True))
        assert {f["path"]: f["size"] for f in doc["files"]} == sizes


@pytest.mark.slow
def test_commit_timestamps_are_the_commit_objects_modification_times(history: tuple[Cloud, str]) -> None:
    cloud, uri = history
    storage = ObjectStoreStorage(cloud.options)
    rows = ChangeFeed(uri, storage, NO_PROCESSES).read_table(0)
    previous = -1
    for version in range(6):
        mtime = storage.stat(f"{uri}/_delta_log/{version:020d}.json").modification_time
        of_version = rows.filter(pc.equal(rows["_commit_version"], version))
        stamps = {int(ts.timestamp() * 1000) for ts in of_version.column("_commit_timestamp").to_pylist()}
        assert len(stamps) == 1
        stamp = stamps.pop()
        # Delta's monotonic rule: a time not after its predecessor's becomes the predecessor's plus 1 ms
        assert stamp == (mtime if mtime > previous else previous + 1)
        previous = stamp


@pytest.mark.slow
def test_deltatail_changes_command_on_the_store(history: tuple[Cloud, str], tmp_path: Path) -> None:
    """``deltatail changes s3://... --storage-option ...`` writes the same rows as ``load_cdf``."""
    cloud, uri = history
    out = tmp_path / "changes.jsonl"
    code, _ = run_cli("changes", uri, "--output", str(out), "--starting-version", "1", *storage_flags(cloud.options))
    assert code == 0
    keep = ["id", "v", "p", "_change_type", "_commit_version"]
    lines = [{k: v for k, v in json.loads(line).items() if k in keep} for line in out.read_text().splitlines()]
    expected = pa.table(DeltaTable(uri, storage_options=cloud.writer_options).load_cdf(starting_version=1).read_all())
    assert multiset(pa.Table.from_pylist(lines)) == multiset(expected.select(keep))


# ---------------------------------------------------------------- never the whole log


@pytest.fixture
def proxy_for() -> Iterator[Callable[[Server], CountingProxy]]:
    started: list[CountingProxy] = []

    def start(server: Server) -> CountingProxy:
        started.append(CountingProxy(server.endpoint).start())
        return started[-1]

    yield start
    for p in started:
        p.stop()


@pytest.fixture(scope="module")
def long_table(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """28 versions of one row each written by deltalake, a checkpoint at 24 (for both stores)."""
    root = tmp_path_factory.mktemp("long-table") / "long"
    df = pa.table({"id": pa.array([1], pa.int64())})
    write_deltalake(root, df)
    for _ in range(24):
        write_deltalake(root, df, mode="append")
    DeltaTable(root).create_checkpoint()
    for _ in range(3):
        write_deltalake(root, df, mode="append")
    return root


@pytest.mark.slow
def test_loading_the_latest_snapshot_lists_from_the_checkpoint(
    writable_cloud: Cloud, long_table: Path, proxy_for: Callable[[Server], CountingProxy]
) -> None:
    """28 versions, a checkpoint at 24: one listing, from version 24 on (6 objects), never the whole log.

    The table is written by deltalake once, locally, and uploaded (the objects deltalake writes into a
    store, without its 28 rounds of conditional puts to the server)."""
    cloud = writable_cloud
    uri = cloud.upload_dir(long_table, "long")
    proxy = proxy_for(cloud.server)
    storage = ObjectStoreStorage(cloud.via(proxy.endpoint).options)
    snap = DeltaLog(uri, storage).snapshot()
    assert snap.version == 27 and len(snap.files) == 28
    counts = storage.counter.take()
    assert counts["list"] == 1
    # after version 23: 24.checkpoint.parquet, 24.json, 25..27.json, _last_checkpoint (delta-rs writes .crc-less logs)
    assert counts["listed"] == 6
    lists = [r for r in proxy.take() if kind(r) == "LIST"]
    assert len(lists) == 1 and (listing_start(lists[0]) or "") > cloud.key("long/_delta_log/00000000000000000023")
