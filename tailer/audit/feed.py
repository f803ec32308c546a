"""Audit events for a range of versions: the IO around :func:`state.audit.build_audit_event`.

:class:`AuditFeed` lists and reads the commits of a range, keeps the snapshot
moving one commit at a time, and yields one :class:`~state.audit.AuditEvent`
per version. It reads only the log, except where asked for more:

- ``counted=True``: each commit's change rows are read (as ``deltatail
  changes`` would) and the event's row figures are the counts of
  ``_change_type`` (:meth:`AuditEvent.with_counted`).
- ``track_table_rows=True``: the table's live row count is carried from
  version to version (``table_rows_before``/``after``, which rules on the
  share of the table deleted need). At the start it is the sum over the live
  files of their Parquet footers' row counts less their deletion vectors'
  cardinalities (0 when the range starts at version 0); then each commit moves
  it on by the rows of its data-changing file actions.

A file action without ``numRecords`` statistics (delta-rs writes none on
``remove``) has its rows read from the data file's Parquet footer, when a
figure needs them: a few KiB read per such file. A file that is gone (vacuumed)
leaves the figure unknown (``None``).

:class:`AuditTracker` is the same step for a follower that already moves its
own snapshot: call :meth:`AuditTracker.event` with each commit and the snapshot
before it, or hand :meth:`AuditTracker.build` to a
:class:`~tailer.log.follower.LogFollower` as its ``audit`` builder.
"""

from __future__ import annotations

import contextlib
import logging
import struct
from collections.abc import Generator, Iterator
from typing import Protocol

import pyarrow as pa
import pyarrow.parquet as pq

from deltatail.state.audit import AuditEvent, build_audit_event
from deltatail.state.commit import Commit
from deltatail.state.cursor import version_range
from deltatail.state.errors import (
    DeltaTailError,
    MissingFileError,
    VersionGapError,
)
from deltatail.state.planning import plan_commit
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.audit.commit_files import CommitFiles, open_commit_files
from deltatail.tailer.collector import collector_paused
from deltatail.tailer.log.delta_log import DeltaLog, LogListing
from deltatail.tailer.log.starts import snapshot_time, table_id, version_at_or_after
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.read.rows import resolve_data_path
from deltatail.tailer.storage import FileInfo, Storage

log = logging.getLogger("deltatail.audit")

_MAGIC = b"PAR1"

#: Events built per pause of the cyclic garbage collector.
EVENT_RUN = 64


def parquet_row_count(storage: Storage, location: str) -> int:
    """The number of rows a Parquet file holds, from its footer alone (two small reads).

    Raises:
        MissingFileError: if the file does not exist.
        DeltaTailError: if the file is not Parquet or its footer does not parse.
    """
    size = storage.stat(location).size
    if size < 12:
        raise DeltaTailError("file is too short to be Parquet", file=location)
    tail = storage.read(location, size - 8, 8)
    if tail[4:] != _MAGIC:
        raise DeltaTailError("file does not end with the Parquet magic bytes", file=location)
    (footer_length,) = struct.unpack("<I", tail[:4])
    if footer_length + 12 > size:
        raise DeltaTailError(f"Parquet footer length {footer_length} exceeds the file", file=location)
    footer = storage.read(location, size - 8 - footer_length, footer_length)
    try:
        metadata = pq.read_metadata(pa.BufferReader(_MAGIC + footer + tail))
    except (pa.ArrowInvalid, OSError) as e:
        raise DeltaTailError(f"Parquet footer does not parse: {e}", file=location) from e
    return int(metadata.num_rows)


class _FooterRows:
    """``row_count`` for :func:`build_audit_event`: a data file's rows from its footer, or ``None``."""

    def __init__(self, table: str, storage: Storage, external_roots: tuple[str, ...] = ()) -> None:
        self.table = table
        self.storage = storage
        self.external_roots = external_roots
        self.reads = 0

    def __call__(self, path: str) -> int | None:
        """The file's rows; ``None`` if it is gone or unreadable.

        Raises:
            UnsafePathError: if the path is outside the table root and every external root (never opened).
        """
        location = resolve_data_path(self.table, path, self.external_roots)
        self.reads += 1
        try:
            return parquet_row_count(self.storage, location)
        except MissingFileError:
            log.debug("data file %s is gone (vacuumed?): its rows are unknown", location)
            return None
        except DeltaTailError as e:
            log.warning("cannot count the rows of a data file: %s", e)
            return None


def table_row_count(snapshot: Snapshot, storage: Storage, external_roots: tuple[str, ...] = ()) -> int | None:
    """The live rows of ``snapshot``: footer row counts of its live files less their DV cardinalities.

    ``None`` if a live file cannot be read (its rows are then unknown).

    Raises:
        UnsafePathError: if a live file is outside the table root and every external root (never opened).
    """
    rows = _FooterRows(snapshot.table, storage, external_roots)
    total = 0
    for f in snapshot.live_files():
        n = rows(f.path)
        if n is None:
            return None
        total += n - (0 if f.deletion_vector is None else f.deletion_vector.cardinality)
    return total


class AuditTracker:
    """Builds the audit event of each commit a follower applies, carrying the table's row count along.

    Args:
        table: the table root.
        storage: how to read data-file footers when a figure needs a file's rows.
        table_rows: the table's live rows before the first commit given, or ``None`` not to track them.
        external_roots: roots outside the table whose files footers may be read from (:mod:`state.paths`).
    """

    def __init__(
        self,
        table: str,
        storage: Storage,
        *,
        table_rows: int | None = None,
        external_roots: tuple[str, ...] = (),
    ) -> None:
        self.table_rows = table_rows
        self._rows = _FooterRows(table, storage, external_roots)

    @property
    def footer_reads(self) -> int:
        """How many data-file footers were read so far."""
        return self._rows.reads

    def event(
        self, commit: Commit, before: Snapshot, *, file_mtime_ms: int, previous_timestamp_ms: int | None
    ) -> AuditEvent:
        """The event of ``commit`` (call before ``before.apply(commit)``, so removed files' sizes resolve).

        Raises:
            VersionGapError: if ``commit`` does not follow ``before``.
            InvalidLogError: if there is no metadata, or the new schema does not parse.
        """
        event = build_audit_event(
            commit,
            before,
            file_mtime_ms=file_mtime_ms,
            previous_timestamp_ms=previous_timestamp_ms,
            table_rows_before=self.table_rows,
            row_count=self._rows,
        )
        if self.table_rows is not None:
            self.table_rows = event.counts.table_rows_after
        return event

    def build(self, commit: Commit, before: Snapshot, file: FileInfo, previous_ms: int | None) -> AuditEvent:
        """:meth:`event`, in the shape of a follower's ``audit`` builder (:data:`tailer.log.follower.AuditBuilder`).

        Raises:
            VersionGapError: if ``commit`` does not follow ``before``.
            InvalidLogError: if there is no metadata, or the new schema does not parse.
        """
        return self.event(commit, before, file_mtime_ms=file.modification_time, previous_timestamp_ms=previous_ms)


class AuditSource(Protocol):
    """What ``deltatail audit`` asks of a table format's audit events (:class:`AuditFeed` for Delta)."""

    def latest_version(self) -> int:
        """The table's newest version."""
        ...

    def table_id(self) -> str:
        """The table's id, as events carry it."""
        ...

    def events(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        *,
        starting_timestamp_ms: int | None = None,
        counted: bool = False,
        track_table_rows: bool = False,
    ) -> Iterator[AuditEvent]:
        """One event per version of the range, in order."""
        ...


class AuditFeed:
    """Audit events of a Delta table for a range of versions.

    Example:
        >>> for event in AuditFeed("/data/events").events(starting_version=3):  # doctest: +SKIP
        ...     print(event.version, event.operation, event.user, event.counts.rows_deleted)
    """

    def __init__(
        self, table_root: str, storage: Storage | None = None, *, external_roots: tuple[str, ...] = ()
    ) -> None:
        # The change feed reads change rows for counted figures; it never refuses a schema change here.
        self._changes = ChangeFeed(
            table_root,
            storage,
            ChangeOptions(allow_non_additive=True, read_ahead=0, reader_processes=0, external_roots=external_roots),
        )
        self.external_roots = external_roots
        self.log: DeltaLog = self._changes.log
        self.storage = self.log.storage
        self.table = self.log.table

    def latest_version(self) -> int:
        """The log's latest version."""
        return self.log.latest_version()

    def table_id(self) -> str:
        """The table's id (:func:`~tailer.log.starts.table_id`)."""
        return table_id(self.log)

    def events(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        *,
        starting_timestamp_ms: int | None = None,
        counted: bool = False,
        track_table_rows: bool = False,
    ) -> Generator[AuditEvent, None, None]:
        """One event per version of the range, in order; ``close()`` the generator to stop early.

        Locally the log is not listed (the latest version comes from ``_last_checkpoint`` and the
        files after it; each commit's time from its open file); on an object store one listing
        from the start serves the range. Events are built a run of commits at a time with Python's
        cyclic garbage collector paused (see :func:`collector_paused`).

        Args:
            starting_version: first version (inclusive); default the oldest the log can
                audit (0, or the version after the oldest checkpoint when older commits are gone).
            ending_version: last version (inclusive); default the latest now.
            starting_timestamp_ms: start at the first commit at or after this time instead.
            counted: count row figures from each commit's change rows (reads data files).
            track_table_rows: carry the table's live row count (see the module docstring).

        Raises:
            TableNotFoundError: if the path holds no Delta table.
            VersionNotFoundError: if the range starts after the latest commit or before what the log holds.
            ConfigError: if ``ending_version`` is before the starting version.
            VersionGapError: if a commit inside the range is missing.
            InvalidLogError: if a commit is malformed.
            DeltaTailError: if a commit file cannot be read (a directory, no permission); it names the file.
            MissingFileError: with ``counted``, if a data file the change rows need is gone (vacuumed).
        """
        if starting_timestamp_ms is not None:
            starting_version = version_at_or_after(self.log, starting_timestamp_ms)
        local = self.storage.local_files
        listing: LogListing | None = None
        if local:
            latest = self.log.latest_version()
        else:  # one listing serves the range: the commits from the one before the start on, with their times
            listing = self.log.list_log(max((starting_version or 0) - 1, 0))
            # (without commits, latest_version() tells the checkpoint-only log from no table at all)
            latest = max(listing.commits) if listing.commits else self.log.latest_version()
        if starting_version is None:
            has_zero = 0 in listing.commits if listing is not None else self.storage.exists(self.log.commit_path(0))
            earliest = 0 if has_zero else self.log.earliest_version()
            starting_version = 0 if earliest == 0 else earliest + 1
            if starting_version > latest:
                log.info("%s: the log holds no commit after its checkpoint at version %d", self.table, earliest)
                return
        end = version_range(self.table, starting_version, ending_version, latest)
        if starting_version == 0:
            before = Snapshot.empty(self.table)
            previous: int | None = None
        else:
            before = self.log.snapshot(starting_version - 1)
            previous = snapshot_time(self.log, before, listing if listing is not None else self._one(before.version))
        rows = None
        if track_table_rows:
            rows = 0 if starting_version == 0 else table_row_count(before, self.storage, self.external_roots)
        tracker = AuditTracker(self.table, self.storage, table_rows=rows, external_roots=self.external_roots)
        last_read = end
        times: list[int | None] | None = None
        if listing is not None:
            commits = listing.commits
            missing = next((v for v in range(starting_version, end + 1) if v not in commits), None)
            if missing is not None:
                last_read = missing  # the reads stop at a gap (read as missing), raised in its turn
            infos = [commits.get(v) for v in range(starting_version, last_read + 1)]
            times = [None if info is None else info.modification_time for info in infos]
        files = open_commit_files(self.storage, self.log.commit_path, starting_version, last_read, times)
        step = _Step(self, tracker, files, counted)
        try:
            v = starting_version
            while v <= end:
                run_end = min(v + EVENT_RUN, end + 1)
                done: list[AuditEvent] = []
                failure: DeltaTailError | None = None
                with collector_paused():
                    try:
                        for version in range(v, run_end):
                            before, previous = step.event(version, before, previous, done)
                    except DeltaTailError as e:
                        failure = e
                yield from done
                if failure is not None:
                    raise failure
                v = run_end
        finally:
            files.close()  # also when the caller stops early

    def _one(self, version: int) -> LogListing:
        """A listing of the one commit ``version`` (empty if it is gone)."""
        listing = LogListing()
        with contextlib.suppress(MissingFileError):
            listing.commits[version] = self.storage.stat(self.log.commit_path(version))
        return listing


class _Step:
    """One version of :meth:`AuditFeed.events`: read, parse, build the event, move the snapshot on."""

    def __init__(self, feed: AuditFeed, tracker: AuditTracker, files: CommitFiles, counted: bool) -> None:
        self.feed = feed
        self.tracker = tracker
        self.files = files
        self.counted = counted

    def event(
        self, v: int, before: Snapshot, previous: int | None, out: list[AuditEvent]
    ) -> tuple[Snapshot, int | None]:
        """Append version ``v``'s event to ``out``; the snapshot after it and its timestamp.

        Raises:
            VersionGapError: if the commit is missing.
            DeltaTailError: what reading, parsing, building and applying raise (naming the version and file).
        """
        log = self.feed.log
        try:
            data, mtime = self.files.next()
        except MissingFileError:
            raise VersionGapError(
                f"commit {v} is missing from the log (cleaned up, or a gap); the range cannot be audited",
                table=log.table,
                version=v,
                file=log.commit_path(v),
            ) from None
        except DeltaTailError as e:
            raise e.at(table=log.table, version=v, file=log.commit_path(v)) from None
        try:
            commit = Commit.from_json(v, data)
            event = self.tracker.event(commit, before, file_mtime_ms=mtime, previous_timestamp_ms=previous)
        except DeltaTailError as e:
            raise e.at(table=log.table, version=v, file=log.commit_path(v)) from None
        if self.counted:
            before, plan = plan_commit(before, commit, mtime, previous, allow_non_additive=True)
            counts: dict[str, int] = {}
            for batch in self.feed._changes.plan_batches(plan):
                for value in batch.rows.column("_change_type").value_counts().to_pylist():
                    counts[value["values"]] = counts.get(value["values"], 0) + int(value["counts"])
            event = event.with_counted(counts)
        else:
            try:
                before, _ = before.apply(commit)
            except DeltaTailError as e:
                raise e.at(table=log.table, file=log.commit_path(v)) from None
        out.append(event)
        return before, event.timestamp_ms
