"""Where reading or following starts: a version found by time, the snapshot before a version, the table id.

Used alike by ``deltatail changes`` (:class:`~tailer.read.feed.ChangeFeed`), the
tailer and the Spark source, so that a start means the same everywhere.
"""

from __future__ import annotations

import bisect

from deltatail.state.changes import commit_timestamp
from deltatail.state.errors import InvalidLogError, MissingFileError, VersionNotFoundError
from deltatail.state.files import FileTable
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.log.delta_log import DeltaLog, LogListing


def version_at_or_after(log: DeltaLog, timestamp_ms: int) -> int:
    """The first version whose commit timestamp is at or after ``timestamp_ms`` (binary search).

    A commit's time here is its ``inCommitTimestamp`` when present, else its file's
    modification time.

    Raises:
        VersionNotFoundError: if every commit is older than ``timestamp_ms`` (or there is none).
    """
    listing = log.list_log(0)
    versions = sorted(listing.commits)
    if not versions:
        raise VersionNotFoundError(
            f"no commit at or after timestamp {timestamp_ms} ms: the log holds none", table=log.table
        )

    def time_of(i: int) -> int:
        v = versions[i]
        ict = log.read_commit(v).in_commit_timestamp
        return ict if ict is not None else listing.commits[v].modification_time

    index = bisect.bisect_left(range(len(versions)), timestamp_ms, key=time_of)
    if index >= len(versions):
        raise VersionNotFoundError(
            f"no commit at or after timestamp {timestamp_ms} ms; the newest is version {versions[-1]}",
            table=log.table,
        )
    return versions[index]


def snapshot_before(log: DeltaLog, version: int) -> Snapshot:
    """The snapshot just before ``version`` (the empty snapshot before version 0).

    When the log starts at a checkpoint at ``version`` (older commits cleaned
    up), the state before it is rebuilt from the snapshot at ``version`` by
    undoing that commit's file actions: its adds leave, its removes return.

    Raises:
        VersionNotFoundError: if the log no longer holds what is needed to build it.
        DeltaTailError: what :meth:`DeltaLog.snapshot` raises.
    """
    if version == 0:
        return Snapshot.empty(log.table)
    try:
        return log.snapshot(version - 1)
    except VersionNotFoundError:
        if log.earliest_version() != version:
            raise
    after = log.snapshot(version)
    commit = log.read_commit(version)
    files = FileTable(after.files.pool)
    added = {(a.path, a.dv_id) for a in commit.adds}
    for f in after.live_files():
        if (f.path, f.key.dv_id) not in added:
            files.put(f.path, f.deletion_vector, f.size, f.timestamp, f.partition_values)
    for r in commit.removes:
        files.put(r.path, r.deletion_vector, r.size, r.deletion_timestamp, r.partition_values)
    return Snapshot(
        log.table, version - 1, after.protocol, after.metadata, None, dict(after.txns),
        dict(after.domains), files, FileTable(after.files.pool),
    )  # fmt: skip


def snapshot_time(log: DeltaLog, snap: Snapshot, listing: LogListing | None = None) -> int:
    """The ``_commit_timestamp`` of the version ``snap`` is at (epoch ms), for an initial snapshot's rows.

    The commit's in-commit timestamp where enabled, else its file's modification
    time; a version whose commit was cleaned up falls back to the last commit
    timestamp the snapshot recorded.

    Raises:
        InvalidLogError: if the snapshot has no metadata.
    """
    if listing is None:
        listing = log.list_log(snap.version)
    info = listing.commits.get(snap.version)
    if info is not None:
        try:
            commit = log.read_commit(snap.version)
        except MissingFileError:
            return int(info.modification_time)
        if snap.metadata is None:
            raise InvalidLogError("no metaData action found in the log", table=log.table, version=snap.version)
        return commit_timestamp(commit, snap.metadata, info.modification_time, None)
    try:
        return log.storage.stat(log.commit_path(snap.version)).modification_time
    except MissingFileError:
        return snap.last_commit_timestamp or 0


def table_id(log: DeltaLog, snap: Snapshot | None = None) -> str:
    """The table's id: from ``snap`` if it has metadata, else from commit 0, else from the latest snapshot.

    Raises:
        InvalidLogError: if the metadata found holds no id (no ``metaData`` action).
        DeltaTailError: what reading the log raises.
    """
    metadata = snap.metadata if snap is not None else None
    if metadata is None:
        try:
            metadata = log.read_commit(0).metadata
        except MissingFileError:
            metadata = log.snapshot().metadata
    if metadata is None:
        raise InvalidLogError("commit 0 holds no metaData action", table=log.table, version=0)
    return metadata.id
