"""Change rows of the shared corpus's CDF tables, against expectations that deltatail did not compute.

:data:`EXPECTATION_SOURCES` says, per table, how the expected rows were established. Three kinds:

- ``reference``: ``_reference-outputs/deltalake-1.6.6/<table>/cdf_from_vA_to_vB.parquet`` whose
  manifest entry says it was checked row for row against a peer's own assertions (kernel-rs
  ``kernel/tests/integration/features/cdf.rs``, delta-rs ``load_cdf.rs``), or by equality with one
  that was. Compared as multisets over every column but ``_commit_timestamp`` (mtimes are not
  preserved in the corpus, MANIFEST.md caveat), for the whole range and for every single version.
- ``kernel-rs cdf.rs``: rows copied from the peer's assertion (tables without a reference output).
- ``log``: rows read off the JSON log by hand (a reference marked UNVERIFIED or PARTIAL); the
  reference output is compared too, since the hand reading found it right.

The four delta-spark DV tables written in Delta Spark's test mode store their DV files as
``test%dv%prefix-deletion_vector_<uuid>.bin`` without recording the prefix in the descriptor. deltatail
follows the protocol ("the file is ``<random prefix>/deletion_vector_<uuid>.bin``" for ``u``; the stored
path for ``p``) and raises :class:`MissingFileError` naming the DV file it looked for, as deltalake does
(MANIFEST.md). Copies with the prefix stripped (and the ``p`` template filled in) read normally; their
expectation is deltalake's scan of each version minus the one before.
"""

from __future__ import annotations

import datetime as dt
import json
import shutil
from collections import Counter
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
from cdf_helpers import (
    CHANGE_COLUMNS,
    Row,
    assert_same_rows,
    canonical,
    change_rows,
    commit_actions,
    corpus_table,
    load_cdf,
    manifest_entries,
    multiset,
    peer_copy,
    relative_dv_path,
    snapshot_table,
)
from deltalake import DeltaTable

from deltatail.state.errors import MissingFileError, UnsafePathError, VersionNotFoundError
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions

REFERENCE_DIR = "_reference-outputs/deltalake-1.6.6"

#: How the expected change rows of each table were established (read this before trusting a test).
EXPECTATION_SOURCES: dict[str, str] = {
    "kernel-rs/cdf-table": "reference v0..v3, verified against kernel-rs cdf.rs::basic_cdf",
    "kernel-rs/cdf-table-backtick-column-names": "reference v0..v1, verified against cdf.rs::backtick_column_names",
    "kernel-rs/cdf-table-data-change": "reference v0..v1, verified against cdf.rs::false_data_change_is_ignored",
    "kernel-rs/cdf-table-delete-conditional-all-rows": "reference v0..v1, verified against "
    "cdf.rs::conditional_delete_all_rows",
    "kernel-rs/cdf-table-delete-conditional-two-rows": "reference v0..v1, verified against "
    "cdf.rs::conditional_delete_two_rows",
    "kernel-rs/cdf-table-delete-unconditional": "reference v0..v1, verified against cdf.rs::unconditional_delete",
    "kernel-rs/cdf-table-non-partitioned": "reference v0..v4, verified against cdf.rs::cdf_non_partitioned",
    "kernel-rs/cdf-table-partitioned": "reference v0..v2, verified against cdf.rs::partition_table",
    "kernel-rs/cdf-table-simple": "reference v0..v2, verified against cdf.rs::simple_cdf_version_ranges "
    "(which also asserts the single-version ranges 0..0, 1..1, 2..2 checked here)",
    "kernel-rs/cdf-table-update-ops": "reference v0..v2, verified against cdf.rs::update_operations (cdc rows carry "
    "the literal change types update_pre / update_post, passed through as written)",
    "kernel-rs/cdf-table-with-cdc-and-dvs": "reference v0..v25, verified against cdf.rs::cdf_with_cdc_and_dvs "
    "(packed DV files, offsets > 1)",
    "kernel-rs/cdf-table-with-dv": "reference v0..v6, verified against cdf.rs::cdf_with_deletion_vector (inline and "
    "file DVs); test_changes.py checks each commit against that test's per-commit comment",
    "kernel-rs/compacted-log-files-table": "reference v0..v25, verified by equality with cdf-table-with-cdc-and-dvs's; "
    "additionally deltatail's rows must equal deltatail's rows of cdf-table-with-cdc-and-dvs",
    "delta-rs/cdc_ict_table": "reference v0..v3 is PARTIAL (delta-rs load_cdf.rs::test_respect_ict asserts v2..v3, "
    "_commit_timestamp included); the v1 rows were read off the log by hand (the four adds of commit 1 and their "
    "numRecords=1 min/max stats: Steve 1986 40, Kate 1995 36, Dave 1995 22, Dan 1995 14) and agree with the "
    "reference; _commit_timestamp = inCommitTimestamp is checked against the reference for every version",
    "delta-rs/checkpoint-cdf-table": "reference v3..v5, verified against delta-rs "
    "load_cdf.rs::test_load_vacuumed_table (the log starts at checkpoint 3: "
    "the range starts at the first commit the log holds)",
    "delta-rs/simple_table_with_cdc": "reference v0..v2 is UNVERIFIED; read off the log by hand: v0 creates the table "
    "(no file actions), v1 adds one file with the row (0, Mario), v2 is an UPDATE with one cdc file holding "
    "(0, Mario, update_preimage) and (0, Mino, update_postimage). The reference agrees, so it is compared too",
    "kernel-rs/cdf-column-mapping-name-mode": "kernel-rs cdf.rs::cdf_with_column_mapping_name_mode rows, read from v1 "
    "as kernel-rs does (CDF is enabled at v1); deltalake cannot read CDF with column mapping",
    "kernel-rs/cdf-column-mapping-name-mode-3-7": "kernel-rs cdf.rs::cdf_with_column_mapping_name_mode (second half) "
    "rows, from v1",
    "kernel-rs/cdf-column-mapping-id-mode": "kernel-rs cdf.rs::cdf_with_column_mapping_id_mode rows, from v1",
    "delta-golden/commit-info-containing-arbitrary-operationParams-types": "no reference output: deltalake 1.6.6 "
    "load_cdf on the table as it is (it reads it), v0..latest",
    "kernel-rs/table-with-cdf": "log-only (fake paths): reading rows must raise MissingFileError naming "
    "fake/path/1; with require_cdf the plans stop at v2 (enableChangeDataFeed=false), as deltalake refuses",
    "delta-golden/deltalog-getChanges/delta": "log-only (fake paths): MissingFileError naming fake/path/1",
    "dat/multi_partitioned/delta": "deltalake 1.6.6 load_cdf v0..v2 on a copy with CDF enabled whose v2 removes "
    "spell out the null partition values they leave out (deltalake cannot build a column for a missing key; "
    "Delta Spark reads a missing key as null: TahoeFileIndex.getPartitionValuesRow, "
    "partitionValues.get(col).orNull); cross-checked with DAT's Spark-written expected/v1 and v2 contents "
    "(v2 overwrites: its deletes are v1's rows, its inserts v2's)",
    "delta-spark/table-with-dv-small": "test-prefix DV trap: MissingFileError naming the DV file; a stripped copy "
    "matches deltalake's scans version by version",
    "delta-spark/table-with-dv-large": "as table-with-dv-small (packed DVs, offset > 1)",
    "delta-spark/partitioned-table-with-dv-large": "as table-with-dv-small (partitioned, packed DVs)",
    "delta-spark/table-with-dv-special-char": "as table-with-dv-small; the p (absolute) DV path is a template: the "
    "error names it, the copy fills in the URL-encoded folder",
}

#: Tables with a reference CDF output: (first, last) version of the output.
REFERENCE_RANGES: dict[str, tuple[int, int]] = {
    "kernel-rs/cdf-table": (0, 3),
    "kernel-rs/cdf-table-backtick-column-names": (0, 1),
    "kernel-rs/cdf-table-data-change": (0, 1),
    "kernel-rs/cdf-table-delete-conditional-all-rows": (0, 1),
    "kernel-rs/cdf-table-delete-conditional-two-rows": (0, 1),
    "kernel-rs/cdf-table-delete-unconditional": (0, 1),
    "kernel-rs/cdf-table-non-partitioned": (0, 4),
    "kernel-rs/cdf-table-partitioned": (0, 2),
    "kernel-rs/cdf-table-simple": (0, 2),
    "kernel-rs/cdf-table-update-ops": (0, 2),
    "kernel-rs/cdf-table-with-cdc-and-dvs": (0, 25),
    "kernel-rs/cdf-table-with-dv": (0, 6),
    "kernel-rs/compacted-log-files-table": (0, 25),
    "delta-rs/cdc_ict_table": (0, 3),
    "delta-rs/checkpoint-cdf-table": (3, 5),
    "delta-rs/simple_table_with_cdc": (0, 2),
}

TEST_PREFIX_DV_TABLES = [
    "delta-spark/table-with-dv-small",
    "delta-spark/table-with-dv-large",
    "delta-spark/partitioned-table-with-dv-large",
    "delta-spark/table-with-dv-special-char",
]


def changes(root: Path, start: int | None = None, end: int | None = None, **options: Any) -> pa.Table:
    return ChangeFeed(str(root), options=ChangeOptions(**options)).read_table(start, end)


def reference(table: str) -> pa.Table:
    first, last = REFERENCE_RANGES[table]
    path = corpus_table(REFERENCE_DIR) / table / f"cdf_from_v{first}_to_v{last}.parquet"
    return pq.read_table(path)


def at_version(table: pa.Table, version: int) -> pa.Table:
    return table.filter(pc.equal(table["_commit_version"].cast(pa.int64()), version))


def data_rows(table: pa.Table) -> Counter[Row]:
    return multiset(table.drop_columns([c for c in CHANGE_COLUMNS if c in table.column_names]), drop=())


# ---------------------------------------------------------------- the bookkeeping itself


def test_every_reference_cdf_output_is_covered() -> None:
    """Every CDF reference output in the corpus is in :data:`REFERENCE_RANGES`, with a written-down source."""
    root = corpus_table(REFERENCE_DIR)
    found = {str(p.parent.relative_to(root)): p.name for p in root.rglob("cdf_from_v*_to_v*.parquet")}
    assert found == {t: f"cdf_from_v{a}_to_v{b}.parquet" for t, (a, b) in REFERENCE_RANGES.items()}
    assert set(REFERENCE_RANGES) <= set(EXPECTATION_SOURCES)
    manifest = manifest_entries()
    for table in REFERENCE_RANGES:
        verified = manifest[table]["reference_outputs"]["cdf"]["verified"]
        if verified.startswith(("UNVERIFIED", "PARTIAL")):
            assert "by hand" in EXPECTATION_SOURCES[table], f"{table}: {verified}"


# ---------------------------------------------------------------- reference outputs


@pytest.mark.parametrize("table", sorted(REFERENCE_RANGES))
def test_reference_cdf_output(table: str) -> None:
    first, last = REFERENCE_RANGES[table]
    assert_same_rows(changes(corpus_table(table), first, last), reference(table))


@pytest.mark.parametrize("table", sorted(REFERENCE_RANGES))
def test_reference_cdf_output_one_version_at_a_time(table: str) -> None:
    first, last = REFERENCE_RANGES[table]
    expected = reference(table)
    for v in range(first, last + 1):
        assert_same_rows(changes(corpus_table(table), v, v), at_version(expected, v))


def test_compacted_log_files_table_equals_the_table_it_compacts() -> None:
    compacted = changes(corpus_table("kernel-rs/compacted-log-files-table"), 0, 25)
    assert_same_rows(compacted, changes(corpus_table("kernel-rs/cdf-table-with-cdc-and-dvs"), 0, 25))
    # ranges whose snapshot before them is built across the overlapping compaction files 0.5, 6.10, 6.15
    for first, last in ((6, 10), (11, 16), (16, 25)):
        assert_same_rows(
            changes(corpus_table("kernel-rs/compacted-log-files-table"), first, last),
            changes(corpus_table("kernel-rs/cdf-table-with-cdc-and-dvs"), first, last),
        )


def test_simple_table_with_cdc_rows_read_off_the_log() -> None:
    expected = pa.concat_tables(
        [
            change_rows({"id": pa.array([0], pa.int32()), "name": ["Mario"]}, "insert", 1),
            change_rows({"id": pa.array([0], pa.int32()), "name": ["Mario"]}, "update_preimage", 2),
            change_rows({"id": pa.array([0], pa.int32()), "name": ["Mino"]}, "update_postimage", 2),
        ]
    )
    got = changes(corpus_table("delta-rs/simple_table_with_cdc"), 0, 2)
    assert_same_rows(got, expected)
    # the v2 data file carries a stray all-null _change_type column: it is not a table column
    assert got.column_names == ["id", "name", *CHANGE_COLUMNS]


def test_cdc_ict_table_rows_and_timestamps() -> None:
    root = corpus_table("delta-rs/cdc_ict_table")
    got = changes(root, 0, 3)
    people = [("Steve", 1986, 40), ("Kate", 1995, 36), ("Dave", 1995, 22), ("Dan", 1995, 14)]
    names, years, ages = (list(c) for c in zip(*people, strict=True))
    v1 = change_rows({"name": names, "birthyear": years, "age": ages}, "insert", 1)
    assert_same_rows(at_version(got, 1), v1)
    # _commit_timestamp is the inCommitTimestamp; the reference's (naive, UTC) timestamps carry it
    ref = reference("delta-rs/cdc_ict_table")
    ref_times = Counter(zip(ref["_commit_version"].to_pylist(), ref["_commit_timestamp"].to_pylist(), strict=True))
    got_times = Counter(
        zip(
            got["_commit_version"].to_pylist(),
            (t.astimezone(dt.UTC).replace(tzinfo=None) for t in got["_commit_timestamp"].to_pylist()),
            strict=True,
        )
    )
    assert got_times == ref_times
    assert at_version(got, 1)["_commit_timestamp"][0].as_py() == dt.datetime(2023, 5, 12, 6, 50, 6, 883000, dt.UTC)


# ---------------------------------------------------------------- kernel-rs assertions (no reference output)

CM_NAME_ROWS = [
    (1, "Alice", 100.0, "delete", 4),
    (2, "Bob", 200.0, "update_preimage", 2),
    (2, "Bob", 250.0, "update_postimage", 2),
    (4, "David", 400.0, "insert", 3),
]
CM_ID_ROWS = [
    (2, "Frank", 250.0, "update_preimage", 2),
    (2, "Frank", 275.0, "update_postimage", 2),
    (3, "Grace", 350.0, "delete", 4),
    (4, "Henry", 450.0, "insert", 3),
]


@pytest.mark.parametrize(
    ("table", "rows"),
    [
        pytest.param("kernel-rs/cdf-column-mapping-name-mode", CM_NAME_ROWS, id="name-mode"),
        pytest.param("kernel-rs/cdf-column-mapping-name-mode-3-7", CM_NAME_ROWS, id="name-mode-3-7"),
        pytest.param("kernel-rs/cdf-column-mapping-id-mode", CM_ID_ROWS, id="id-mode"),
    ],
)
def test_column_mapping_cdf_tables_match_kernel_rs(table: str, rows: list[tuple[int, str, float, str, int]]) -> None:
    got = changes(corpus_table(table), 1)
    ids, names, amounts, kinds, versions = (list(c) for c in zip(*rows, strict=True))
    expected = pa.table(
        {"id": ids, "name": names, "value": amounts, "_change_type": kinds, "_commit_version": versions}
    )
    assert_same_rows(got, expected)
    assert got.column_names == ["id", "name", "value", *CHANGE_COLUMNS]  # logical names, not col-<uuid>


def test_range_starting_after_the_latest_version_is_not_found() -> None:
    """kernel-rs cdf.rs::invalid_range_start_after_last_version_of_table reads cdf-table-simple from 3 to 4."""
    with pytest.raises(VersionNotFoundError, match="after the latest version 2"):
        changes(corpus_table("kernel-rs/cdf-table-simple"), 3, 4)


def test_arbitrary_operation_parameters_table_matches_deltalake() -> None:
    root = corpus_table("delta-golden/commit-info-containing-arbitrary-operationParams-types")
    assert_same_rows(changes(root), load_cdf(root, 0))


@pytest.mark.parametrize(
    ("table", "version"),
    [
        ("kernel-rs/cdf-table-with-dv", 3),
        ("kernel-rs/cdf-table-with-dv", 5),
        ("kernel-rs/cdf-table-with-cdc-and-dvs", 12),
        ("kernel-rs/cdf-table-with-cdc-and-dvs", 25),
        ("kernel-rs/compacted-log-files-table", 12),
    ],
)
def test_initial_snapshot_of_dv_tables_matches_deltalake_scan(table: str, version: int) -> None:
    root = corpus_table(table)
    got = ChangeFeed(str(root)).read_table(version, version, initial_snapshot=True)
    assert set(got["_change_type"].to_pylist()) <= {"insert"}
    assert set(got["_commit_version"].to_pylist()) <= {version}
    assert data_rows(got) == multiset(snapshot_table(root, version), drop=())


def _multi_partitioned_peer_copy(root: Path, scratch: Path) -> Path:
    """A copy deltalake's ``load_cdf`` reads: CDF on, null partition values spelled out, files under encoded names."""
    copy = peer_copy(root, scratch)
    for data in list(copy.rglob("*.parquet")):
        relative = str(data.relative_to(copy))
        encoded = quote(relative, safe="/=%")  # deltalake percent-encodes the non-ASCII partition value it reads
        if encoded != relative and not (copy / encoded).exists():
            (copy / encoded).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(data, copy / encoded)
    columns = ("letter", "date", "data")
    for version in (0, 2):
        log = copy / "_delta_log" / f"{version:020d}.json"
        actions = [json.loads(line) for line in log.read_text(encoding="utf-8").splitlines() if line.strip()]
        for action in actions:
            if "metaData" in action:
                action["metaData"]["configuration"]["delta.enableChangeDataFeed"] = "true"
            if "remove" in action:
                for column in columns:
                    action["remove"]["partitionValues"].setdefault(column, None)
        log.write_text("".join(json.dumps(a) + "\n" for a in actions), encoding="utf-8")
    return copy


def test_a_partition_value_missing_from_a_remove_reads_as_null(tmp_path: Path) -> None:
    """dat/multi_partitioned v2 removes files whose null partition values its ``partitionValues`` leave out."""
    root = corpus_table("dat/multi_partitioned/delta")
    v2 = commit_actions(root, 2)
    assert {"letter": "a", "data": "x"} in [a["remove"]["partitionValues"] for a in v2 if "remove" in a]
    got = changes(root, 0, 2)
    assert_same_rows(got, load_cdf(_multi_partitioned_peer_copy(root, tmp_path), 0, 2))
    for version in (0, 1, 2):
        assert_same_rows(at_version(got, version), at_version(changes(root), version))
    expected = corpus_table("dat/multi_partitioned/expected")
    v2_rows = at_version(got, 2)
    deleted = v2_rows.filter(pc.equal(v2_rows["_change_type"], "delete"))
    inserted = v2_rows.filter(pc.equal(v2_rows["_change_type"], "insert"))
    assert data_rows(deleted) == multiset(pq.read_table(expected / "v1" / "table_content.parquet"), drop=())
    assert data_rows(inserted) == multiset(pq.read_table(expected / "v2" / "table_content.parquet"), drop=())


# ---------------------------------------------------------------- tables that must not read


@pytest.mark.parametrize("table", ["kernel-rs/table-with-cdf", "delta-golden/deltalog-getChanges/delta"])
def test_log_only_cdf_tables_name_the_missing_data_file(table: str) -> None:
    root = corpus_table(table)
    with pytest.raises(MissingFileError) as info:
        changes(root)
    assert info.value.version == 0 and info.value.file == str(root / "fake/path/1")


def _dv_descriptors(root: Path) -> list[tuple[int, str, dict[str, Any]]]:
    """(version, data file path, DV descriptor) of every action with a DV, in log order."""
    out = []
    for log in sorted((root / "_delta_log").glob("*.json")):
        v = int(log.name[:20])
        for action in commit_actions(root, v):
            for kind in ("add", "remove"):
                file = action.get(kind)
                if file and file.get("deletionVector"):
                    out.append((v, unquote(file["path"]), file["deletionVector"]))
    return out


@pytest.mark.parametrize("table", TEST_PREFIX_DV_TABLES)
def test_test_prefix_dv_tables_name_the_dv_file(table: str) -> None:
    root = corpus_table(table)
    version, data_file, dv = _dv_descriptors(root)[0]
    if dv["storageType"] == "u":
        wanted = str(root / relative_dv_path(dv["pathOrInlineDv"]))
    else:
        wanted = unquote(dv["pathOrInlineDv"])  # the unfilled template itself
    assert not Path(wanted).exists()
    on_disk = list(root.rglob("test%dv%prefix-deletion_vector_*.bin"))
    assert on_disk, "the DV files exist, under the unrecorded test prefix"
    # a "u" path names a file under the table that is not there; a "p" template ("file:{{FOLDER...}}/...")
    # names no place under the table root: refused by the containment rule before anything is opened
    expected = MissingFileError if dv["storageType"] == "u" else UnsafePathError
    with pytest.raises(expected) as info:
        changes(root)
    assert info.value.file == wanted and info.value.version == version
    assert wanted in str(info.value) and data_file in str(info.value)


def _usable_copy(table: str, scratch: Path) -> Path:
    """The table with ``test%dv%prefix-`` stripped from DV file names (or, for ``p``, the template filled in)."""
    copy = scratch / Path(table).name
    shutil.copytree(corpus_table(table), copy)
    log0 = copy / "_delta_log" / f"{0:020d}.json"
    if "{{FOLDER_WITH_SPECIAL_CHAR}}" in log0.read_text("utf-8"):
        folder = copy / "folder&with%special char"
        text = log0.read_text("utf-8").replace("file:{{FOLDER_WITH_SPECIAL_CHAR}}", "file:" + quote(str(folder)))
        log0.write_text(text, "utf-8")
    else:
        for dv_file in copy.rglob("test%dv%prefix-deletion_vector_*.bin"):
            dv_file.rename(dv_file.with_name(dv_file.name.removeprefix("test%dv%prefix-")))
    return copy


@pytest.mark.parametrize("table", TEST_PREFIX_DV_TABLES)
def test_test_prefix_dv_tables_read_once_usable(table: str, tmp_path: Path) -> None:
    copy = _usable_copy(table, tmp_path)
    last = DeltaTable(str(copy)).version()
    assert any(v > 0 for v, _, _ in _dv_descriptors(copy)) or table.endswith("special-char")
    for v in range(last + 1):
        got = canonical(changes(copy, v, v))
        before = multiset(snapshot_table(copy, v - 1), drop=()) if v else Counter()
        after = multiset(snapshot_table(copy, v), drop=())
        inserted = data_rows(got.filter(pc.equal(got["_change_type"], "insert")))
        deleted = data_rows(got.filter(pc.equal(got["_change_type"], "delete")))
        assert set(got["_change_type"].to_pylist()) <= {"insert", "delete"}
        # DV deletes and appends rewrite nothing: the change rows are exactly the snapshot difference
        assert (inserted, deleted) == (after - before, before - after), f"version {v}"
