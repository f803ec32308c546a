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
before it.
"""

from __future__ import annotations

import logging
import queue
import struct
import threading
from collections.abc import Iterator

import pyarrow as pa
import pyarrow.parquet as pq

from state.audit import AuditEvent, build_audit_event
from state.commit import Commit
from state.errors import (
    ConfigError,
    DeltaTailError,
    MissingFileError,
    VersionGapError,
    VersionNotFoundError,
)
from state.planning import plan_commit
from state.snapshot import Snapshot
from tailer.log.delta_log import DeltaLog
from tailer.log.starts import snapshot_time, version_at_or_after
from tailer.read.feed import ChangeFeed, ChangeOptions
from tailer.read.rows import resolve_data_path
from tailer.storage import Storage

log = logging.getLogger("deltatail.audit")

_MAGIC = b"PAR1"

#: Commit files the range reader reads per run, and runs it reads ahead of the events.
READ_RUN = 64
READ_AHEAD_RUNS = 4


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

    def __init__(self, table: str, storage: Storage) -> None:
        self.table = table
        self.storage = storage
        self.reads = 0

    def __call__(self, path: str) -> int | None:
        location = resolve_data_path(self.table, path)
        self.reads += 1
        try:
            return parquet_row_count(self.storage, location)
        except MissingFileError:
            log.debug("data file %s is gone (vacuumed?): its rows are unknown", location)
            return None
        except DeltaTailError as e:
            log.warning("cannot count the rows of a data file: %s", e)
            return None


def table_row_count(snapshot: Snapshot, storage: Storage) -> int | None:
    """The live rows of ``snapshot``: footer row counts of its live files less their DV cardinalities.

    ``None`` if a live file cannot be read (its rows are then unknown).
    """
    rows = _FooterRows(snapshot.table, storage)
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
    """

    def __init__(self, table: str, storage: Storage, *, table_rows: int | None = None) -> None:
        self.table_rows = table_rows
        self._rows = _FooterRows(table, storage)

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


class _CommitBytes:
    """The bytes of commit files ``paths``, read ahead on a thread in runs of :data:`READ_RUN` files.

    Reading a file releases the GIL, so on a second core the reads overlap the parsing and event
    building of the commits before them; handing over a run at a time keeps the thread's cost per
    file small. At most :data:`READ_AHEAD_RUNS` runs wait. A file that cannot be read is handed
    over as its error, raised by :meth:`next` in its turn.
    """

    def __init__(self, storage: Storage, paths: list[str]) -> None:
        self._runs: queue.Queue[list[bytes | Exception]] = queue.Queue(maxsize=READ_AHEAD_RUNS)
        self._stop = threading.Event()
        self._current: list[bytes | Exception] = []
        self._index = 0
        self._thread = threading.Thread(
            target=self._read, args=(storage, paths), name="deltatail-audit-read", daemon=True
        )
        self._thread.start()

    def _read(self, storage: Storage, paths: list[str]) -> None:
        for start in range(0, len(paths), READ_RUN):
            run: list[bytes | Exception] = []
            for path in paths[start : start + READ_RUN]:
                try:
                    run.append(storage.read(path))
                except Exception as e:  # handed over: the consumer raises it in its turn
                    run.append(e)
            while not self._stop.is_set():
                try:
                    self._runs.put(run, timeout=0.1)
                    break
                except queue.Full:
                    continue
            if self._stop.is_set():
                return

    def next(self) -> bytes:
        """The next file's bytes.

        Raises:
            MissingFileError: if the file is gone; any other error reading it raised, likewise.
        """
        if self._index >= len(self._current):
            self._current = self._runs.get()
            self._index = 0
        item = self._current[self._index]
        self._index += 1
        if isinstance(item, Exception):
            raise item
        return item

    def close(self) -> None:
        """Stop reading ahead (the thread ends at its next run)."""
        self._stop.set()


class AuditFeed:
    """Audit events of a table for a range of versions.

    Example:
        >>> for event in AuditFeed("/data/events").events(starting_version=3):  # doctest: +SKIP
        ...     print(event.version, event.operation, event.user, event.counts.rows_deleted)
    """

    def __init__(self, table_root: str, storage: Storage | None = None) -> None:
        # The change feed reads change rows for counted figures; it never refuses a schema change here.
        self._changes = ChangeFeed(
            table_root, storage, ChangeOptions(allow_non_additive=True, read_ahead=0, reader_processes=0)
        )
        self.log: DeltaLog = self._changes.log
        self.storage = self.log.storage
        self.table = self.log.table

    def events(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        *,
        starting_timestamp_ms: int | None = None,
        counted: bool = False,
        track_table_rows: bool = False,
    ) -> Iterator[AuditEvent]:
        """One event per version of the range, in order.

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
            MissingFileError: with ``counted``, if a data file the change rows need is gone (vacuumed).
        """
        if starting_timestamp_ms is not None:
            starting_version = version_at_or_after(self.log, starting_timestamp_ms)
        # One listing serves the range: the commits from the one before the start on, with their times.
        listing = self.log.list_log(max((starting_version or 0) - 1, 0))
        # (without commits, latest_version() tells the checkpoint-only log from no table at all)
        latest = max(listing.commits) if listing.commits else self.log.latest_version()
        if starting_version is None:
            earliest = 0 if 0 in listing.commits else self.log.earliest_version()
            starting_version = 0 if earliest == 0 else earliest + 1
            if starting_version > latest:
                log.info("%s: the log holds no commit after its checkpoint at version %d", self.table, earliest)
                return
        end = latest if ending_version is None else ending_version
        if starting_version > latest:
            raise VersionNotFoundError(
                f"starting version {starting_version} is after the latest version {latest}", table=self.table
            )
        if end < starting_version:
            raise ConfigError(f"ending version {end} is before starting version {starting_version}", table=self.table)
        if end > latest:
            raise VersionNotFoundError(f"ending version {end} is after the latest version {latest}", table=self.table)
        if starting_version == 0:
            before = Snapshot.empty(self.table)
            previous: int | None = None
        else:
            before = self.log.snapshot(starting_version - 1)
            previous = snapshot_time(self.log, before, listing)
        rows = None
        if track_table_rows:
            rows = 0 if starting_version == 0 else table_row_count(before, self.storage)
        tracker = AuditTracker(self.table, self.storage, table_rows=rows)
        files = _CommitBytes(self.storage, [self.log.commit_path(v) for v in range(starting_version, end + 1)])
        try:
            for v in range(starting_version, end + 1):
                info = listing.commits.get(v)
                if info is None:
                    raise VersionGapError(
                        f"commit {v} is missing from the log (cleaned up, or a gap); the range cannot be audited",
                        table=self.table,
                        version=v,
                        file=self.log.commit_path(v),
                    )
                try:
                    commit = Commit.from_json(v, files.next())
                except DeltaTailError as e:
                    raise e.at(table=self.table, version=v, file=self.log.commit_path(v)) from None
                try:
                    event = tracker.event(
                        commit, before, file_mtime_ms=info.modification_time, previous_timestamp_ms=previous
                    )
                except DeltaTailError as e:
                    raise e.at(table=self.table, version=v, file=self.log.commit_path(v)) from None
                if counted:
                    before, plan = plan_commit(before, commit, info.modification_time, previous)
                    counts: dict[str, int] = {}
                    for batch in self._changes.plan_batches(plan):
                        for value in batch.rows.column("_change_type").value_counts().to_pylist():
                            counts[value["values"]] = counts.get(value["values"], 0) + int(value["counts"])
                    event = event.with_counted(counts)
                else:
                    try:
                        before, _ = before.apply(commit)
                    except DeltaTailError as e:
                        raise e.at(table=self.table, file=self.log.commit_path(v)) from None
                previous = event.timestamp_ms
                yield event
        finally:
            files.close()  # also when the caller stops early
