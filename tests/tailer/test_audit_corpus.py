"""Audit events of the shared corpus's real tables, field by field.

Writers record different commitInfo fields, so the tables are chosen by writer: Databricks
(user, notebook, cluster, tags, a column-mapping RENAME COLUMN), Delta Spark (string metrics,
transaction facts, cdc files), Delta Spark with in-commit timestamps, delta-rs (clientVersion,
snake_case metrics, app transactions), Delta Kernel (Java) and a Delta golden table with a job.

Expected values are read off the JSON log by hand (quoted below), taken from deltalake 1.6.6
(``DeltaTable.history()`` for commitInfo, its scans for row counts: an independent reader), from
the metrics the writer recorded, or from ``os.stat`` of the commit files. None is computed with the
code under test.
"""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from cdf_helpers import corpus_table, manifest_entries
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from deltatail.state.actions import parse_json_actions
from deltatail.state.audit import AuditEvent, build_audit_event
from deltatail.state.commit import Commit
from deltatail.state.errors import DeltaTailError, InvalidLogError
from deltatail.state.files import FileTable
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.audit.feed import AuditFeed
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions


def events(table: str, **kwargs: Any) -> dict[int, AuditEvent]:
    return {e.version: e for e in AuditFeed(str(corpus_table(table))).events(**kwargs)}


def rows_figures(e: AuditEvent) -> tuple[int | None, int | None, int | None]:
    return (e.counts.rows_inserted, e.counts.rows_deleted, e.counts.rows_updated)


def mtime_timestamps(root: Path) -> dict[int, int]:
    """``_commit_timestamp`` by the file-time rule, from ``os.stat`` (no in-commit timestamps)."""
    out: dict[int, int] = {}
    previous: int | None = None
    for path in sorted((root / "_delta_log").glob("[0-9]" * 20 + ".json")):
        ms = os.stat(path).st_mtime_ns // 1_000_000
        if previous is not None and ms <= previous:
            ms = previous + 1
        out[int(path.name[:20])] = previous = ms
    return out


def test_databricks_commits_with_user_notebook_cluster_and_a_column_mapping_rename() -> None:
    table = "delta-rs/table_with_partitioning_mapping"
    got = events(table)
    assert sorted(got) == [0, 1, 2, 3, 4]
    for v, e in got.items():
        # {"userId":"6880774470201434","userName":"zeevm@microsoft.com", "notebook":{"notebookId":"3977978532629367"},
        #  "clusterId":"0217-172734-k0p0n45t", "isolationLevel":"WriteSerializable", "isBlindAppend":true,
        #  "engineInfo":"Databricks-Runtime/15.4.x-photon-scala2.12"} in every commit
        a = e.actor
        assert (a.user_id, a.user_name, a.notebook_id, a.cluster_id) == (
            "6880774470201434", "zeevm@microsoft.com", "3977978532629367", "0217-172734-k0p0n45t")  # fmt: skip
        assert a.engine_info == "Databricks-Runtime/15.4.x-photon-scala2.12"
        assert a.client_version is None and a.job_id is None
        assert (e.transaction.isolation_level, e.transaction.is_blind_append) == ("WriteSerializable", True)
        assert e.transaction.read_version == (None if v == 0 else v - 1)
        assert e.table_id == "a637547f-55b4-43c3-9ae5-d3e1fb5db183"
    assert mtime_timestamps(corpus_table(table)) == {v: e.timestamp_ms for v, e in got.items()}

    v0 = got[0]  # CREATE TABLE ... "tags":{"restoresDeletedRows":"false"}, "statsOnLoad":false
    assert v0.table_created and v0.operation == "CREATE TABLE"
    assert v0.commit_info_extra == {"tags": {"restoresDeletedRows": "false"}}
    assert v0.operation_parameters["statsOnLoad"] is False
    assert v0.transaction.txn_id == "b831ecf3-c660-47e1-a63b-fe9cc7562ea4"
    assert v0.commit_info_timestamp_ms == 1742865148817
    assert v0.schema_change is not None and v0.schema_change.added == ("id", "description")
    p0 = v0.protocol_change
    assert p0 is not None and (p0.new_min_reader_version, p0.new_min_writer_version) == (3, 7)
    assert p0.reader_features_added == ("deletionVectors",) and p0.writer_features_added == ("deletionVectors",)
    assert [(c.key, c.new) for c in v0.property_changes] == [("delta.enableDeletionVectors", "true")]

    v1 = got[1]  # WRITE, "operationMetrics":{"numFiles":"1","numOutputRows":"1","numOutputBytes":"673"}
    assert rows_figures(v1) == (1, 0, 0) and v1.counts.row_sources["inserted"] == "metrics"
    assert (v1.counts.files_added, v1.counts.bytes_added) == (1, 673)

    v2 = got[2]  # SET TBLPROPERTIES: column mapping on; the protocol gains columnMapping and writer features
    assert v2.schema_change is None  # enabling column mapping renames nothing
    assert [(c.key, c.old, c.new) for c in v2.property_changes] == [
        ("delta.columnMapping.maxColumnId", None, "2"),
        ("delta.columnMapping.mode", None, "name"),
    ]
    p2 = v2.protocol_change
    assert p2 is not None and p2.reader_features_added == ("columnMapping",)
    features = ("appendOnly", "changeDataFeed", "checkConstraints", "columnMapping", "generatedColumns", "invariants")
    assert p2.writer_features_added == features
    assert not v2.no_op and not v2.data_change and rows_figures(v2) == (0, 0, 0)

    v3 = got[3]  # RENAME COLUMN {"oldColumnPath":"id","newColumnPath":"newid"}: same field id 1, physical name "id"
    assert v3.operation == "RENAME COLUMN"
    assert v3.operation_parameters == {"oldColumnPath": "id", "newColumnPath": "newid"}
    assert v3.schema_change is not None
    assert [(r.old_path, r.new_path) for r in v3.schema_change.renamed] == [("id", "newid")]
    assert v3.schema_change.kinds == ("renamed",)
    assert [(c.key, c.old, c.new) for c in v3.metadata_changes] == [("partition_columns", '["id"]', '["newid"]')]
    assert v3.protocol_change is None and v3.property_changes == ()


def test_delta_spark_delete_with_cdc_files() -> None:
    got = events("kernel-rs/cdf-table-delete-conditional-two-rows", counted=False)
    e = got[1]
    # "operation":"DELETE","operationParameters":{"predicate":"[\"((id#105854L = 2) OR (id#105854L = 8))\"]"},
    # "readVersion":0,"isolationLevel":"Serializable","isBlindAppend":false,
    # "operationMetrics":{"numRemovedFiles":"2","numRemovedBytes":"986","numCopiedRows":"5","numAddedChangeFiles":"2",
    #                     "numDeletedRows":"2","numAddedFiles":"2","numAddedBytes":"1413",...}
    assert e.predicate == "((id#105854L = 2) OR (id#105854L = 8))"
    assert e.actor.engine_info == "Apache-Spark/3.5.3 Delta-Lake/3.3.0-SNAPSHOT" and e.actor.user is None
    t = e.transaction
    assert (t.isolation_level, t.is_blind_append, t.read_version) == ("Serializable", False, 0)
    assert t.txn_id == "325e5f93-226a-4a97-a02e-35e46f2f3597"
    m = e.operation_metrics
    assert (e.counts.files_added, e.counts.files_removed, e.counts.cdc_files) == (
        int(m["numAddedFiles"]), int(m["numRemovedFiles"]), int(m["numAddedChangeFiles"]))  # fmt: skip
    assert (e.counts.bytes_added, e.counts.bytes_removed) == (int(m["numAddedBytes"]), int(m["numRemovedBytes"]))
    assert (rows_figures(e), e.counts.rows_copied) == ((0, 2, 0), 5)
    assert e.data_change and not e.no_op
    assert got[0].counts.rows_inserted == 10  # "numOutputRows":"10"


def test_in_commit_timestamps_are_the_event_time() -> None:
    got = events("delta-rs/cdc_ict_table")
    # inCommitTimestamp of versions 0..3 as written; version 1 is far from its commitInfo.timestamp on purpose
    assert {v: e.timestamp_ms for v, e in got.items()} == {
        0: 1783874203271, 1: 1683874206883, 2: 1783874212175, 3: 1783874213881}  # fmt: skip
    assert got[1].commit_info_timestamp_ms == 1783874206883 and got[1].in_commit_timestamp_ms == 1683874206883
    assert got[0].operation == "CREATE OR REPLACE TABLE"
    assert {c.key: c.new for c in got[0].property_changes} == {
        "delta.enableChangeDataFeed": "true", "delta.enableInCommitTimestamps": "true"}  # fmt: skip


def test_delta_rs_writer_client_version_and_app_transactions() -> None:
    got = events("kernel-rs/app-txn-with-last-updated")
    # {"clientVersion":"delta-rs.py-0.25.5", "operationMetrics":{"num_added_rows":2,...}} and a txn per commit
    txns = {v: [(t.app_id, t.version, t.last_updated) for t in e.transaction.app_transactions] for v, e in got.items()}
    assert txns == {
        0: [("new_app_0", 1, None)],
        1: [("new_app_1", 1, 1000)],
        2: [("new_app_2", 1, 1002)],
        3: [("old_app", 1, 1747935650)],
    }
    for e in got.values():
        assert e.actor.client_version == "delta-rs.py-0.25.5" and e.actor.engine_info is None
        assert (e.transaction.isolation_level, e.transaction.read_version, e.transaction.txn_id) == (None, None, None)
        assert rows_figures(e) == (2, 0, 0) and e.counts.row_sources["inserted"] == "metrics"
        assert e.operation_metrics["num_added_files"] == 1


def test_domain_metadata_of_a_clustered_table() -> None:
    e = events("delta-rs/table_with_liquid_clustering")[0]
    assert [(d.key, d.old, d.change) for d in e.domain_changes] == [
        ("delta.liquid", None, "added"),
        ("delta.rowTracking", None, "added"),
    ]
    assert e.domain_changes[1].new == '{"rowIdHighWaterMark":9,"domainName":"delta.rowTracking"}'
    assert e.actor.engine_info == "Databricks-Runtime/13.2.x-photon-scala2.12"
    assert e.counts.rows_inserted == 10  # "numOutputRows":"10"


def test_delta_spark_restore_counts_rows_from_file_statistics() -> None:
    table = "delta-golden/basic-with-inserts-overwrite-restore/delta"
    got = events(table, track_table_rows=True)
    e = got[3]
    # RESTORE {"version":1}: 4 files of numRecords 50 come back, 2 of numRecords 250 go
    assert e.operation == "RESTORE" and e.operation_parameters == {"version": 1, "timestamp": None}
    assert rows_figures(e) == (200, 500, 0)
    assert e.counts.row_sources == {"inserted": "files", "deleted": "files", "updated": "files", "copied": "unknown"}
    assert e.operation_metrics["restoredFilesSize"] == "2834" and e.counts.bytes_added == 2834
    assert e.counts.bytes_removed == int(e.operation_metrics["removedFilesSize"])
    root = str(corpus_table(table))
    for v, ev in got.items():  # deltalake scans each version: the table's row count after each commit
        assert ev.counts.table_rows_after == DeltaTable(root, version=v).to_pyarrow_dataset().count_rows()


def test_delta_kernel_java_commit() -> None:
    # The only Kernel-written commit here is of a catalog-owned table deltatail does not follow (its
    # reader feature is refused); the audit event needs no reader support, so it is built directly.
    root = corpus_table("delta-rs/data_err_logs/table_h")
    data = (root / "_delta_log" / f"{9999:020d}.json").read_bytes()
    commit = Commit.from_actions(9999, parse_json_actions(data))
    before = Snapshot(str(root), 9998, None, None, None, {}, {}, FileTable(), FileTable())
    e = build_audit_event(commit, before, file_mtime_ms=1, previous_timestamp_ms=None)
    # {"engineInfo":"Kernel-3.4.0-SNAPSHOT/test-engine","operation":"CREATE TABLE","isBlindAppend":true,
    #  "txnId":"138db460-c7d3-4d13-972e-0f4e35b58b43","operationMetrics":{}}
    assert e.actor.engine_info == "Kernel-3.4.0-SNAPSHOT/test-engine"
    assert (e.transaction.is_blind_append, e.transaction.txn_id) == (True, "138db460-c7d3-4d13-972e-0f4e35b58b43")
    assert (e.transaction.isolation_level, e.transaction.read_version) == (None, None)
    assert e.operation == "CREATE TABLE" and e.operation_metrics == {}
    assert e.protocol_change is not None and e.protocol_change.reader_features_added == ("catalogOwned",)
    assert [(c.key, c.new) for c in e.property_changes] == [("delta.feature.catalogowned", "supported")]


def test_job_fields_of_the_commit_info_golden_table(tmp_path: Path) -> None:
    root = corpus_table("delta-golden/deltalog-commit-info/delta")
    with pytest.raises(InvalidLogError, match="metaData has no schemaString") as raised:
        list(AuditFeed(str(root)).events())
    assert raised.value.version == 0 and raised.value.file is not None
    # The same commit with a schema (the golden table omits one, which the protocol requires).
    copy = tmp_path / "commit-info"
    (copy / "_delta_log").mkdir(parents=True)
    lines = []
    for line in (root / "_delta_log" / f"{0:020d}.json").read_text().splitlines():
        action = json.loads(line)
        if "metaData" in action:
            action["metaData"]["schemaString"] = '{"type":"struct","fields":[]}'
        lines.append(json.dumps(action))
    (copy / "_delta_log" / f"{0:020d}.json").write_text("\n".join(lines) + "\n")
    e = next(iter(AuditFeed(str(copy)).events()))
    # "job":{"jobId":"job_id_0","jobName":"job_name_0","runId":"run_id_0","jobOwnerId":"job_owner_0",
    #        "triggerType":"trigger_type_0"},"notebook":{"notebookId":"notebook_id_0"},"clusterId":"cluster_id_0",
    #  "readVersion":-1,"isolationLevel":"default","isBlindAppend":true,"userMetadata":"foo"
    a = e.actor
    assert (a.user_id, a.user_name) == ("user_0", "username_0")
    assert (a.job_id, a.job_name, a.job_run_id, a.job_owner_id, a.job_trigger_type) == (
        "job_id_0", "job_name_0", "run_id_0", "job_owner_0", "trigger_type_0")  # fmt: skip
    assert (a.notebook_id, a.cluster_id, a.user_metadata) == ("notebook_id_0", "cluster_id_0", "foo")
    assert (e.transaction.read_version, e.transaction.isolation_level, e.transaction.is_blind_append) == (
        -1, "default", True)  # fmt: skip
    assert e.operation_metrics == {"test": "test"} and e.operation_parameters == {"test": "test"}
    assert e.counts.files_added == 1 and e.counts.bytes_added == 1


# -- every table: what deltalake's history() says, and the dict form -------------------------------

_HISTORY_FIELDS: dict[str, Callable[[AuditEvent], Any]] = {
    "operation": lambda e: e.operation,
    "operationParameters": lambda e: dict(e.operation_parameters),
    "operationMetrics": lambda e: dict(e.operation_metrics),
    "userId": lambda e: e.actor.user_id,
    "userName": lambda e: e.actor.user_name,
    "engineInfo": lambda e: e.actor.engine_info,
    "clientVersion": lambda e: e.actor.client_version,
    "clusterId": lambda e: e.actor.cluster_id,
    "isolationLevel": lambda e: e.transaction.isolation_level,
    "isBlindAppend": lambda e: e.transaction.is_blind_append,
    "readVersion": lambda e: e.transaction.read_version,
    "txnId": lambda e: e.transaction.txn_id,
    "timestamp": lambda e: e.commit_info_timestamp_ms,
    "userMetadata": lambda e: e.actor.user_metadata,
}


def _readable_by_both() -> list[str]:
    out = []
    for path, entry in manifest_entries().items():
        peer = entry.get("peer_readers", {}).get("deltalake==1.6.6 (delta-rs, python)", {})
        if peer.get("open") == "ok" and entry.get("json_commit_range") and entry["json_commit_range"][0] == 0:
            out.append(path)
    return out


@pytest.mark.slow
def test_commit_info_fields_agree_with_deltalake_history_on_every_table() -> None:
    compared = Counter[str]()
    tables = 0
    for path in _readable_by_both():
        root = str(corpus_table(path))
        try:
            got = {e.version: e for e in AuditFeed(root).events()}
        except DeltaTailError:
            continue  # a table deltatail refuses (an unsupported feature): covered by its own tests
        try:
            history = DeltaTable(root).history()
        except DeltaError:
            continue  # the peer cannot read this log's history (e.g. stats it rejects)
        tables += 1
        for h in history:
            e = got[h["version"]]
            for key, value in h.items():
                if key in _HISTORY_FIELDS:
                    assert _HISTORY_FIELDS[key](e) == value, (path, h["version"], key)
                    compared[key] += 1
            if isinstance(h.get("notebook"), dict):
                assert e.actor.notebook_id == h["notebook"].get("notebookId")
                compared["notebook"] += 1
            doc = json.loads(json.dumps(e.to_json()))
            assert AuditEvent.from_json(doc) == e
    assert tables >= 100, tables
    for key in ("operation", "operationParameters", "operationMetrics", "userName", "engineInfo", "clientVersion",
                "isolationLevel", "readVersion", "txnId", "notebook"):  # fmt: skip
        assert compared[key] > 0, key


# -- counts against the change rows of the same commit ----------------------------------------------

#: (table, version, key) of commits whose writer recorded row metrics. With cdc files or deletion
#: vectors the change rows are exact; copy-on-write rewrites without cdc files emit the copied rows
#: as deletes and inserts, so they are compared with net changes over the table's key.
_CROSS_CHECKS = [
    ("kernel-rs/cdf-table-delete-conditional-two-rows", 1, None),
    ("delta-rs/cdc_ict_table", 2, None),
    ("delta-rs/cdc_ict_table", 3, None),
    ("delta-rs/checkpoint-cdf-table", 5, None),
    ("delta-rs/simple_table_with_cdc", 2, None),
    ("delta-rs/table_with_deletion_logs", 3, None),
    ("delta-rs/table_with_deletion_logs", 4, None),
    ("delta-kernel-java/basic-dv-with-checkpoint", 14, None),
    ("delta-golden/basic-with-inserts-deletes-checkpoint/delta", 5, "id"),
    ("delta-golden/basic-with-inserts-deletes-checkpoint/delta", 13, "id"),
    ("delta-golden/basic-with-inserts-merge/delta", 1, "id"),
    ("delta-golden/basic-with-inserts-updates/delta", 1, "id"),
    ("delta-rs/delta-0.8.0", 1, "value"),
]


@pytest.mark.parametrize(("table", "version", "key"), _CROSS_CHECKS)
def test_metric_row_counts_equal_the_change_rows(table: str, version: int, key: str | None) -> None:
    root = str(corpus_table(table))
    e = events(table, starting_version=version, ending_version=version)[version]
    assert {e.counts.row_sources[f] for f in ("inserted", "deleted", "updated")} <= {"metrics", "operation"}
    options = ChangeOptions() if key is None else ChangeOptions(net_changes=True, key_columns=(key,))
    rows = ChangeFeed(root, options=options).read_table(version, version)
    kinds = Counter(rows.column("_change_type").to_pylist())
    assert kinds["update_preimage"] == kinds["update_postimage"]
    assert rows_figures(e) == (kinds["insert"], kinds["delete"], kinds["update_postimage"])
    counted = next(iter(AuditFeed(root).events(version, version, counted=True)))
    if key is None:
        assert rows_figures(counted) == rows_figures(e)
    assert counted.counts.row_sources["inserted"] == "counted"


def test_a_log_of_only_a_checkpoint_has_no_commit_to_audit(tmp_path: Path) -> None:
    copy = tmp_path / "only-checkpoint"
    shutil.copytree(corpus_table("delta-rs/checkpoint_with_partitions"), copy)
    assert list(AuditFeed(str(copy)).events()) == []
