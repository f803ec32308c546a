"""The audit event of one commit: who changed what, when, and how much. Pure: no IO.

:func:`build_audit_event` turns a :class:`~state.commit.Commit` and the
snapshot *before* it into an :class:`AuditEvent`. The state after the commit
(protocol, metadata, domains) is derived from the two exactly as
:meth:`Snapshot.apply <state.snapshot.Snapshot.apply>` derives it, so the
caller may build the event before or after applying the commit; only sizes of
removed files the log omits are looked up in the snapshot's files, which
``apply`` hands on (after it they are unknown).

Where the facts come from
-------------------------

- ``timestamp_ms``: the ``_commit_timestamp`` rule of change rows
  (:func:`state.changes.commit_timestamp`): the in-commit timestamp where
  enabled, else the commit file's modification time made monotonic.
- ``commitInfo`` (free-form, written by the writer): operation, parameters,
  metrics, user, engine, job/notebook/cluster, isolation level, blind append,
  read version, transaction id. What each writer records differs: Delta Spark
  writes ``engineInfo``, ``txnId``, ``isolationLevel``, ``isBlindAppend``,
  ``readVersion`` and string-valued metrics (``numOutputRows``...);
  Databricks adds ``userId``, ``userName``, ``clusterId``, ``notebook``,
  ``job`` and ``tags``; delta-rs writes ``clientVersion`` (and from 1.x
  ``engineInfo``) and number-valued snake_case metrics (``num_added_rows``...);
  Delta Kernel (Java) writes ``engineInfo``, ``txnId``, ``isBlindAppend``. A
  field the writer did not record is ``None``. Keys not mapped to a field are
  kept in ``commit_info_extra``.
- File and byte counts: from the commit's ``add``/``remove``/``cdc`` actions.
- Row counts (``rows_inserted``, ``rows_deleted``, ``rows_updated``,
  ``rows_copied``), each with its source in ``row_sources``:

  ``counted``
      from the commit's change rows (:meth:`AuditEvent.with_counted`).
  ``metrics``
      from ``operationMetrics``: Delta Spark ``numOutputRows`` (writes),
      ``numDeletedRows``, ``numUpdatedRows``, ``numCopiedRows``,
      ``numTargetRowsInserted/Updated/Deleted/Copied`` (MERGE); delta-rs
      ``num_added_rows``, ``num_deleted_rows``, ``num_updated_rows``,
      ``num_copied_rows``, ``num_target_rows_inserted/updated/deleted/copied``.
  ``files``
      from the data-changing file actions, when the metrics lack a figure and
      the commit has no cdc files: rows of added files are inserted, rows of
      removed files deleted (a DELETE's deleted rows are the removed files'
      rows minus the added files' rows, which is exact for copy-on-write and
      for deletion vectors). A file's rows are ``numRecords`` of its
      statistics, or what the caller's ``row_count`` gives, minus its
      deletion vector's cardinality.
  ``operation``
      implied by the operation: a DELETE inserts and updates nothing, an UPDATE
      inserts and deletes nothing.
  ``no_data_change``
      the commit changes no rows (no ``dataChange`` file action, no cdc file).

  A figure none of these gives is ``None`` (source ``unknown``).
- ``table_rows_before``/``table_rows_after``: the caller's row count of the
  table before the commit, moved on by ``rows_inserted - rows_deleted`` (or,
  where one of those is unknown, by the rows of the data-changing file
  actions); ``None`` when not given or neither way tells.
- Schema, protocol, property, metadata and domain changes: the effective
  difference between the state before and after (an action that repeats the
  old value is no change). The schema difference resolves column mapping (see
  :mod:`state.schema_diff`).
- ``no_op``: the commit has no file actions and changes no protocol, metadata
  or domain (a commit of only ``commitInfo`` and ``txn``, for example).
  ``data_change``: the commit changes rows (a ``dataChange`` file action or a
  cdc file, and not a MERGE whose metrics report no changed rows).

The dict form (:meth:`AuditEvent.to_json`) is documented there; it is what an
audit log line and the Kafka commit topic carry.

Modules: the event, its parts and its dict form (:mod:`state.audit.event`); the builder
(:mod:`state.audit.builder`); the commit's counts and row figures with their sources
(:mod:`state.audit.row_figures`). Import the names below from this package.
"""

from deltatail.state.audit.builder import build_audit_event
from deltatail.state.audit.event import (
    AUDIT_FORMAT,
    ROW_FIGURES,
    ROW_SOURCES,
    Actor,
    AppTransaction,
    AuditEvent,
    Counts,
    ProtocolChange,
    TransactionInfo,
    ValueChange,
    iso_utc,
)
from deltatail.state.audit.row_figures import RowCount

__all__ = [
    "AUDIT_FORMAT",
    "ROW_FIGURES",
    "ROW_SOURCES",
    "Actor",
    "AppTransaction",
    "AuditEvent",
    "Counts",
    "ProtocolChange",
    "RowCount",
    "TransactionInfo",
    "ValueChange",
    "build_audit_event",
    "iso_utc",
]
