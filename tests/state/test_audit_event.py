"""Audit events built from hand-written commits: each figure checked against what the test wrote.

Commits are JSON actions as the protocol describes them; the expected values are the numbers the
test put into those actions (sizes, ``numRecords``, DV cardinalities, metrics), never computed by
the code under test.
"""

from __future__ import annotations

import json
from typing import Any

import pytest

from deltatail.state.actions import parse_json_actions
from deltatail.state.audit import AUDIT_FORMAT, AuditEvent, build_audit_event, iso_utc
from deltatail.state.commit import Commit
from deltatail.state.errors import InvalidLogError, VersionGapError
from deltatail.state.snapshot import Snapshot

TABLE = "/data/t"
SCHEMA = json.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": "v", "type": "string", "nullable": True, "metadata": {}},
        ],
    }
)


def commit(version: int, *actions: dict[str, Any]) -> Commit:
    data = "\n".join(json.dumps(a) for a in actions).encode()
    return Commit.from_actions(version, parse_json_actions(data))


def metadata(configuration: dict[str, str] | None = None, schema: str = SCHEMA, **extra: Any) -> dict[str, Any]:
    body = {
        "id": "table-1",
        "format": {"provider": "parquet", "options": {}},
        "schemaString": schema,
        "partitionColumns": [],
        "configuration": configuration or {},
        **extra,
    }
    return {"metaData": body}


def protocol(reader: int = 1, writer: int = 2, **features: list[str]) -> dict[str, Any]:
    return {"protocol": {"minReaderVersion": reader, "minWriterVersion": writer, **features}}


def add(path: str, size: int, rows: int | None = None, *, data_change: bool = True, dv: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"path": path, "partitionValues": {}, "size": size, "modificationTime": 1,
                            "dataChange": data_change}  # fmt: skip
    if rows is not None:
        body["stats"] = json.dumps({"numRecords": rows})
    if dv is not None:
        body["deletionVector"] = dv
    return {"add": body}


def remove(path: str, size: int | None = None, rows: int | None = None, *, dv: Any = None) -> dict[str, Any]:
    body: dict[str, Any] = {"path": path, "deletionTimestamp": 5, "dataChange": True}
    if size is not None:
        body["size"] = size
    if rows is not None:
        body["stats"] = json.dumps({"numRecords": rows})
    if dv is not None:
        body["deletionVector"] = dv
    return {"remove": body}


def info(**fields: Any) -> dict[str, Any]:
    return {"commitInfo": {"timestamp": 1_700_000_000_000, **fields}}


def dv(cardinality: int, offset: int = 1) -> dict[str, Any]:
    return {"storageType": "u", "pathOrInlineDv": "ab^-aqEH.-t@S}K{vb[*k^", "offset": offset,
            "sizeInBytes": 40, "cardinality": cardinality}  # fmt: skip


def table_at_v0(*extra: dict[str, Any]) -> tuple[Snapshot, Commit]:
    c0 = commit(0, info(operation="CREATE TABLE"), protocol(), metadata(), *extra)
    after, _ = Snapshot.empty(TABLE).apply(c0)
    return after, c0


def event(c: Commit, before: Snapshot, **kwargs: Any) -> AuditEvent:
    kwargs.setdefault("file_mtime_ms", 1_700_000_000_500)
    kwargs.setdefault("previous_timestamp_ms", None)
    return build_audit_event(c, before, **kwargs)


# -- who, what, when ------------------------------------------------------------------------------


def test_commit_info_fields_as_written() -> None:
    before, _ = table_at_v0()
    c = commit(
        1,
        info(
            operation="DELETE",
            operationParameters={"predicate": '["(id#1 > 5)", "(v#2 = \'x\')"]'},
            userId="42",
            userName="alice@example.com",
            engineInfo="Databricks-Runtime/15.4.x",
            clientVersion="client-1",
            job={"jobId": "j1", "jobName": "nightly", "runId": "r9", "jobOwnerId": "o1", "triggerType": "cron"},
            notebook={"notebookId": "nb-7", "notebookPath": "/Users/alice/clean"},
            clusterId="c-1",
            userMetadata="ticket-12",
            isolationLevel="WriteSerializable",
            isBlindAppend=False,
            readVersion=0,
            txnId="t-1",
            operationMetrics={"numDeletedRows": "3", "numCopiedRows": "7"},
            tags={"restoresDeletedRows": "false"},
            engineCommitInfo={"x": 1},
        ),
        remove("a.parquet", 100, 10),
        add("b.parquet", 80, 7),
        {"txn": {"appId": "app-1", "version": 3, "lastUpdated": 99}},
    )
    e = event(c, before)
    assert e.version == 1 and e.table_path == TABLE and e.table_id == "table-1"
    assert e.operation == "DELETE"
    assert e.predicate == "(id#1 > 5) AND (v#2 = 'x')"
    a = e.actor
    assert (a.user_id, a.user_name, a.engine_info, a.client_version) == (
        "42", "alice@example.com", "Databricks-Runtime/15.4.x", "client-1")  # fmt: skip
    assert (a.job_id, a.job_name, a.job_run_id, a.job_owner_id, a.job_trigger_type) == (
        "j1",
        "nightly",
        "r9",
        "o1",
        "cron",
    )
    assert (a.notebook_id, a.notebook_path, a.cluster_id, a.user_metadata) == (
        "nb-7", "/Users/alice/clean", "c-1", "ticket-12")  # fmt: skip
    assert e.user == "alice@example.com"
    t = e.transaction
    assert (t.isolation_level, t.is_blind_append, t.read_version, t.txn_id) == ("WriteSerializable", False, 0, "t-1")
    assert [(x.app_id, x.version, x.last_updated) for x in t.app_transactions] == [("app-1", 3, 99)]
    assert e.operation_metrics == {"numDeletedRows": "3", "numCopiedRows": "7"}
    assert e.commit_info_extra == {"tags": {"restoresDeletedRows": "false"}, "engineCommitInfo": {"x": 1}}
    c_ = e.counts
    assert (c_.files_added, c_.files_removed, c_.bytes_added, c_.bytes_removed) == (1, 1, 80, 100)
    assert (c_.rows_inserted, c_.rows_deleted, c_.rows_updated, c_.rows_copied) == (0, 3, 0, 7)
    assert c_.row_sources == {
        "inserted": "operation",
        "deleted": "metrics",
        "updated": "operation",
        "copied": "metrics",
    }
    assert e.data_change and not e.no_op and not e.table_created
    assert e.schema_change is None and e.protocol_change is None
    assert e.property_changes == () and e.metadata_changes == () and e.domain_changes == ()


def test_user_id_stands_in_for_an_absent_user_name() -> None:
    before, _ = table_at_v0()
    e = event(commit(1, info(operation="WRITE", userId="7")), before)
    assert e.user == "7"
    assert event(commit(1, info(operation="WRITE")), before).user is None


def test_user_ids_of_other_json_types_are_shown_as_written_and_never_mixed_up() -> None:
    # 1, true and "1" hash alike in Python; each commit's actor must still show what it wrote.
    before, _ = table_at_v0()
    for _ in range(2):  # the second pass meets whatever the first one left behind
        users = [event(commit(1, info(operation="WRITE", userId=u)), before).actor.user_id for u in ("1", 1, True)]
        assert users == ["1", "1", "True"]
    structured = event(commit(1, info(operation="WRITE", userId={"id": 1}, userName=["a"])), before).actor
    assert (structured.user_id, structured.user_name) == ('{"id":1}', '["a"]')


def test_merge_predicate_of_delta_rs_and_absent_commit_info() -> None:
    before, _ = table_at_v0()
    e = event(commit(1, info(operation="MERGE", operationParameters={"mergePredicate": "t.id = s.id"})), before)
    assert e.predicate == "t.id = s.id"
    bare = event(commit(1, add("x.parquet", 10, 1)), before)
    assert bare.operation is None and bare.commit_info_timestamp_ms is None and bare.actor.user is None
    assert bare.counts.rows_inserted == 1 and bare.counts.row_sources["inserted"] == "files"


def test_timestamp_follows_the_change_row_rule() -> None:
    before, _ = table_at_v0()
    c = commit(1, info(operation="WRITE"))
    assert event(c, before, file_mtime_ms=5_000, previous_timestamp_ms=4_000).timestamp_ms == 5_000
    # Not after the previous commit's time: the previous plus one millisecond (Delta Spark's rule).
    assert event(c, before, file_mtime_ms=3_000, previous_timestamp_ms=4_000).timestamp_ms == 4_001
    ict_before, _ = Snapshot.empty(TABLE).apply(
        commit(0, info(), protocol(), metadata({"delta.enableInCommitTimestamps": "true"}))
    )
    with_ict = commit(1, {"commitInfo": {"inCommitTimestamp": 1_000, "timestamp": 9_000, "operation": "WRITE"}})
    e = event(with_ict, ict_before, file_mtime_ms=5_000, previous_timestamp_ms=4_000)
    assert e.timestamp_ms == 1_000 and e.in_commit_timestamp_ms == 1_000 and e.commit_info_timestamp_ms == 9_000
    assert e.timestamp_iso == "1970-01-01T00:00:01.000Z"
    assert iso_utc(1_700_000_000_123) == "2023-11-14T22:13:20.123Z"


# -- state changes --------------------------------------------------------------------------------


def test_creation_commit() -> None:
    c0 = commit(0, info(operation="CREATE TABLE"), protocol(), metadata({"delta.appendOnly": "false"}))
    e = event(c0, Snapshot.empty(TABLE))
    assert e.table_created and not e.no_op and not e.data_change
    assert e.schema_change is not None and e.schema_change.added == ("id", "v")
    assert e.protocol_change is not None
    assert (e.protocol_change.old_min_reader_version, e.protocol_change.new_min_writer_version) == (None, 2)
    assert [(p.key, p.old, p.new, p.change) for p in e.property_changes] == [
        ("delta.appendOnly", None, "false", "added")
    ]
    assert {m.key: m.new for m in e.metadata_changes} == {
        "id": "table-1",
        "partition_columns": "[]",
        "format": "parquet",
    }


def test_property_protocol_and_metadata_changes_against_the_state_before() -> None:
    before, _ = Snapshot.empty(TABLE).apply(
        commit(0, info(), protocol(3, 7, readerFeatures=["deletionVectors"], writerFeatures=["deletionVectors"]),
               metadata({"a": "1", "b": "2"}))
    )  # fmt: skip
    c = commit(
        1,
        info(operation="SET TBLPROPERTIES"),
        protocol(3, 7, readerFeatures=["columnMapping"], writerFeatures=["columnMapping", "deletionVectors"]),
        metadata({"a": "1", "b": "3", "c": "4"}, description="orders"),
    )
    e = event(c, before)
    assert [(p.key, p.old, p.new, p.change) for p in e.property_changes] == [
        ("b", "2", "3", "changed"),
        ("c", None, "4", "added"),
    ]
    assert [(m.key, m.old, m.new) for m in e.metadata_changes] == [("description", None, "orders")]
    p = e.protocol_change
    assert p is not None
    assert p.reader_features_added == ("columnMapping",) and p.reader_features_removed == ("deletionVectors",)
    assert p.writer_features_added == ("columnMapping",) and p.writer_features_removed == ()
    assert e.schema_change is None and not e.no_op
    dropped = event(commit(1, info(), metadata({"a": "1"})), before)
    assert [(v.key, v.change) for v in dropped.property_changes] == [("b", "removed")]


def test_repeating_the_old_protocol_and_metadata_is_no_change() -> None:
    before, _ = table_at_v0()
    e = event(commit(1, info(operation="UPGRADE?"), protocol(), metadata()), before)
    assert e.protocol_change is None and e.schema_change is None
    assert e.property_changes == () and e.metadata_changes == ()
    assert e.no_op


def test_only_txn_is_a_no_op_and_domains_change() -> None:
    before, _ = table_at_v0({"domainMetadata": {"domain": "d1", "configuration": '{"x":1}', "removed": False}})
    txn_only = event(commit(1, info(operation="STREAMING UPDATE"), {"txn": {"appId": "q", "version": 4}}), before)
    assert txn_only.no_op and not txn_only.data_change
    assert txn_only.counts.row_sources["inserted"] == "no_data_change" and txn_only.counts.rows_inserted == 0
    c = commit(
        1,
        info(),
        {"domainMetadata": {"domain": "d1", "configuration": '{"x":2}', "removed": False}},
        {"domainMetadata": {"domain": "d2", "configuration": "{}", "removed": False}},
    )
    e = event(c, before)
    assert [(d.key, d.old, d.new, d.change) for d in e.domain_changes] == [
        ("d1", '{"x":1}', '{"x":2}', "changed"),
        ("d2", None, "{}", "added"),
    ]
    gone = event(commit(1, info(), {"domainMetadata": {"domain": "d1", "configuration": "", "removed": True}}), before)
    assert [(d.key, d.change) for d in gone.domain_changes] == [("d1", "removed")]
    same_domain = {"domainMetadata": {"domain": "d1", "configuration": '{"x":1}', "removed": False}}
    same = event(commit(1, info(), same_domain), before)
    assert same.domain_changes == () and same.no_op


# -- counts ---------------------------------------------------------------------------------------


def test_removed_size_omitted_by_the_log_comes_from_the_snapshot_before() -> None:
    before, _ = table_at_v0(add("a.parquet", 123, 4))
    c = commit(1, info(operation="DELETE"), remove("a.parquet"))
    assert event(c, before).counts.bytes_removed == 123
    before.apply(c)  # the files moved on: the size is unknown now
    assert event(c, before).counts.bytes_removed is None


def test_delete_without_metrics_counts_rows_from_files_including_deletion_vectors() -> None:
    before, _ = table_at_v0(add("a.parquet", 100, 10), add("b.parquet", 100, 10))
    # a.parquet: rows 3 of 10 now hidden by a DV (a DV update); b.parquet rewritten without 4 rows.
    c = commit(
        1,
        info(operation="DELETE"),
        remove("a.parquet", 100, 10),
        add("a.parquet", 100, 10, dv=dv(3)),
        remove("b.parquet", 100, 10),
        add("b2.parquet", 60, 6),
    )
    e = event(c, before, table_rows_before=20)
    assert (e.counts.rows_deleted, e.counts.row_sources["deleted"]) == (7, "files")
    assert (e.counts.rows_inserted, e.counts.row_sources["inserted"]) == (0, "operation")
    assert (e.counts.table_rows_before, e.counts.table_rows_after) == (20, 13)
    assert e.rows_deleted_pct == pytest.approx(35.0)


def test_restore_and_overwrite_count_from_files_and_the_callers_row_count() -> None:
    before, _ = table_at_v0(add("a.parquet", 100, 10), add("b.parquet", 50, None))
    restore = commit(
        1,
        info(operation="RESTORE", operationMetrics={"numRestoredFiles": "1"}),
        remove("a.parquet", 100, 10, dv=dv(4)),
        add("a.parquet", 100, 10, dv=dv(1, offset=9)),  # 3 rows come back
        remove("b.parquet", 50),  # no stats: the caller's row_count says 5
        add("old.parquet", 70, 8),
    )
    asked: list[str] = []

    def rows_of(path: str) -> int | None:
        asked.append(path)
        return {"b.parquet": 5}.get(path)

    e = event(restore, before, row_count=rows_of, table_rows_before=11)
    assert (e.counts.rows_inserted, e.counts.rows_deleted, e.counts.rows_updated) == (11, 5, 0)
    assert e.counts.row_sources == {"inserted": "files", "deleted": "files", "updated": "files", "copied": "unknown"}
    assert e.counts.table_rows_after == 17
    assert asked == ["b.parquet"]
    unknown = event(restore, before)
    assert unknown.counts.rows_deleted is None and unknown.counts.row_sources["deleted"] == "unknown"
    assert unknown.counts.rows_inserted == 11


def test_writes_by_delta_spark_and_delta_rs_metrics() -> None:
    before, _ = table_at_v0(add("a.parquet", 100, 10))
    spark = commit(1, info(operation="WRITE", operationMetrics={"numOutputRows": "4", "numFiles": "1"}),
                   add("n.parquet", 40, 4))  # fmt: skip
    e = event(spark, before, table_rows_before=10)
    assert (e.counts.rows_inserted, e.counts.row_sources["inserted"]) == (4, "metrics")
    assert (e.counts.rows_deleted, e.counts.row_sources["deleted"]) == (0, "files")
    assert e.counts.table_rows_after == 14
    rs = commit(1, info(operation="WRITE", operationParameters={"mode": "Overwrite"},
                        operationMetrics={"num_added_rows": 2, "num_removed_files": 1}),
                remove("a.parquet", 100), add("n.parquet", 20, 2))  # fmt: skip
    o = event(rs, before, table_rows_before=10, row_count={"a.parquet": 10}.get)
    assert (o.counts.rows_inserted, o.counts.rows_deleted) == (2, 10)
    assert o.counts.row_sources["deleted"] == "files"
    assert o.counts.table_rows_after == 2
    assert o.rows_deleted_pct == pytest.approx(100.0)


def test_update_and_merge_metrics_of_both_writers() -> None:
    before, _ = table_at_v0(add("a.parquet", 100, 10))
    rewrite = (remove("a.parquet", 100, 10), add("b.parquet", 100, 10))
    for metrics in ({"numUpdatedRows": "2", "numCopiedRows": "8"}, {"num_updated_rows": 2, "num_copied_rows": 8}):
        e = event(commit(1, info(operation="UPDATE", operationMetrics=metrics), *rewrite), before)
        assert (e.counts.rows_inserted, e.counts.rows_deleted, e.counts.rows_updated, e.counts.rows_copied) == (
            0,
            0,
            2,
            8,
        )
    spark = {"numTargetRowsInserted": "1", "numTargetRowsUpdated": "2", "numTargetRowsDeleted": "3",
             "numTargetRowsCopied": "4", "numOutputRows": "7"}  # fmt: skip
    rs = {"num_target_rows_inserted": 1, "num_target_rows_updated": 2, "num_target_rows_deleted": 3,
          "num_target_rows_copied": 4}  # fmt: skip
    for metrics in (spark, rs):
        e = event(commit(1, info(operation="MERGE", operationMetrics=metrics), *rewrite), before,
                  table_rows_before=10)  # fmt: skip
        assert (e.counts.rows_inserted, e.counts.rows_updated, e.counts.rows_deleted, e.counts.rows_copied) == (
            1,
            2,
            3,
            4,
        )
        assert e.counts.table_rows_after == 8
    no_metrics = event(commit(1, info(operation="MERGE"), *rewrite), before)
    assert no_metrics.counts.rows_updated is None and no_metrics.counts.row_sources["updated"] == "unknown"


def test_a_merge_that_changed_nothing_is_no_data_change() -> None:
    before, _ = table_at_v0(add("a.parquet", 100, 10))
    zero = {"num_target_rows_inserted": 0, "num_target_rows_updated": 0, "num_target_rows_deleted": 0}
    e = event(commit(1, info(operation="MERGE", operationMetrics=zero), remove("a.parquet", 100, 10),
                     add("b.parquet", 100, 10)), before)  # fmt: skip
    assert not e.data_change and not e.no_op
    assert (e.counts.rows_inserted, e.counts.rows_updated, e.counts.rows_deleted) == (0, 0, 0)
    assert e.counts.rows_copied == 0 and e.counts.row_sources["copied"] == "no_data_change"


def test_optimize_moves_files_but_no_rows() -> None:
    before, _ = table_at_v0(add("a.parquet", 100, 10), add("b.parquet", 100, 10))
    c = commit(
        1,
        info(operation="OPTIMIZE"),
        {"remove": {"path": "a.parquet", "deletionTimestamp": 5, "dataChange": False, "size": 100}},
        {"remove": {"path": "b.parquet", "deletionTimestamp": 5, "dataChange": False, "size": 100}},
        add("c.parquet", 150, 20, data_change=False),
    )
    e = event(c, before, table_rows_before=20)
    assert (e.counts.files_added, e.counts.files_removed, e.counts.data_files_added, e.counts.data_files_removed) == (
        1, 2, 0, 0)  # fmt: skip
    assert (e.counts.bytes_added, e.counts.bytes_removed) == (150, 200)
    assert (e.counts.rows_inserted, e.counts.rows_deleted) == (0, 0)
    assert not e.data_change and not e.no_op
    assert e.counts.table_rows_after == 20


def test_cdc_files_without_metrics_leave_rows_unknown_until_counted() -> None:
    before, _ = table_at_v0(add("a.parquet", 100, 10))
    cdc = {"cdc": {"path": "_change_data/c.parquet", "partitionValues": {}, "size": 10, "dataChange": False}}
    c = commit(1, info(operation="Manual Update"), cdc)
    e = event(c, before)
    assert e.data_change and e.counts.cdc_files == 1
    assert e.counts.rows_inserted is None and e.counts.rows_deleted is None
    counted = e.with_counted({"insert": 2, "update_preimage": 3, "update_postimage": 3})
    assert (counted.counts.rows_inserted, counted.counts.rows_deleted, counted.counts.rows_updated) == (2, 0, 3)
    assert counted.counts.rows_copied is None
    assert counted.counts.row_sources == {"inserted": "counted", "deleted": "counted", "updated": "counted",
                                          "copied": "unknown"}  # fmt: skip


# -- errors and the dict form ---------------------------------------------------------------------


def test_a_commit_that_does_not_follow_the_snapshot_is_refused() -> None:
    before, _ = table_at_v0()
    with pytest.raises(VersionGapError, match="commit 3 does not follow version 0") as e:
        event(commit(3, info()), before)
    assert e.value.table == TABLE and e.value.version == 3


def test_no_metadata_is_an_invalid_log() -> None:
    with pytest.raises(InvalidLogError, match="no metaData") as e:
        event(commit(0, info(), protocol()), Snapshot.empty(TABLE))
    assert e.value.version == 0


def test_an_unparsable_schema_is_an_invalid_log_naming_the_version() -> None:
    before, _ = table_at_v0()
    with pytest.raises(InvalidLogError, match="unknown schema type") as e:
        event(commit(1, info(), metadata(schema='{"type":"struct","fields":[{"name":"x","type":"nope"}]}')), before)
    assert (e.value.table, e.value.version) == (TABLE, 1)


def test_dict_form_round_trips_and_has_the_documented_keys() -> None:
    before, _ = table_at_v0(add("a.parquet", 100, 10))
    c = commit(1, info(operation="MERGE", userName="bob", operationMetrics={"num_target_rows_inserted": 1}),
               protocol(1, 4), metadata({"k": "v"}), remove("a.parquet", 100, 10), add("b.parquet", 90, 9),
               {"txn": {"appId": "app", "version": 2}})  # fmt: skip
    e = event(c, before, table_rows_before=10)
    doc = json.loads(json.dumps(e.to_json()))
    assert doc["format"] == AUDIT_FORMAT
    assert list(doc) == [
        "format", "table", "version", "timestamp_ms", "timestamp", "commit_info_timestamp_ms",
        "in_commit_timestamp_ms", "operation", "operation_parameters", "predicate", "actor", "transaction",
        "operation_metrics", "counts", "schema_change", "protocol_change", "property_changes",
        "metadata_changes", "domain_changes", "table_created", "data_change", "no_op", "commit_info_extra",
    ]  # fmt: skip
    assert doc["table"] == {"path": TABLE, "id": "table-1"}
    assert doc["property_changes"] == [{"key": "k", "old": None, "new": "v", "change": "added"}]
    assert doc["transaction"]["app_transactions"] == [{"app_id": "app", "version": 2, "last_updated": None}]
    assert AuditEvent.from_json(doc) == e


def test_from_json_refuses_other_documents() -> None:
    with pytest.raises(InvalidLogError, match="not an audit event"):
        AuditEvent.from_json({"format": "something/1"})
    before, _ = table_at_v0()
    doc = event(commit(1, info()), before).to_json()
    del doc["counts"]
    with pytest.raises(InvalidLogError, match="malformed audit event: KeyError"):
        AuditEvent.from_json(doc)
