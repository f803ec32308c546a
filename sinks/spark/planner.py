"""The driver's planning state of one streaming query."""

from __future__ import annotations

import logging
import math
import time
from collections import deque

import pyarrow as pa

from deltatail.sinks.spark.offsets import Offset, plan_key
from deltatail.sinks.spark.options import SourceOptions
from deltatail.sinks.spark.plan_cache import PlanCache
from deltatail.sinks.spark.schema import check_fits
from deltatail.state.errors import StateError, VersionGapError, VersionNotFoundError
from deltatail.state.planning import VersionPlan, plan_snapshot
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.log.follower import Hints, LogFollower
from deltatail.tailer.log.starts import snapshot_time, table_id, version_at_or_after
from deltatail.tailer.read.feed import ChangeFeed
from deltatail.tailer.storage import Storage

log = logging.getLogger("deltatail")

#: What the stream's errors tell a user to do.
SPARK_HINTS = Hints(
    gap="",  # a gap goes through failOnDataLoss, which says what to do
    recreated="start a new query (a new checkpointLocation) to read the new table",
)


class StreamPlanner(PlanCache[VersionPlan]):
    """The driver's planning state of one query on a Delta table: a log follower and the plans not yet committed.

    The plans are cached as :class:`~sinks.spark.plan_cache.PlanCache` says; the head is the
    follower's.

    Planning a new version raises ``SchemaChangeError`` when a version's schema does not fit the
    stream's, ``VersionGapError``/``VersionNotFoundError`` when the log no longer holds a needed
    version (``failOnDataLoss``), and what :meth:`LogFollower.plan` raises.

    Args:
        options: the source's options.
        stream_schema: the query's fixed schema (Arrow).
        storage: where the table is (by default the storage its path and ``storage.*`` options name).
    """

    def __init__(self, options: SourceOptions, stream_schema: pa.Schema, storage: Storage | None = None) -> None:
        super().__init__(options, stream_schema)
        self.feed = ChangeFeed(options.path, storage or options.storage(), options=options.change_options())
        self.log: DeltaLog = self.feed.log
        self.table_id: str | None = None
        self._follower: LogFollower | None = None
        self._pending: deque[int] = deque()

    @property
    def head_version(self) -> int:
        """The follower's head (the newest planned version)."""
        return self._following().head.version

    @property
    def built(self) -> bool:
        """Whether the follower exists."""
        return self._follower is not None

    def _owner(self) -> str | None:
        return self.table_id

    def latest_version(self) -> int:
        """The table's newest version now (one listing of the log).

        Raises:
            TableNotFoundError: if the table is gone.
        """
        return self.log.latest_version()

    # -- starting ------------------------------------------------------------------------------

    def start_offset(self) -> Offset:
        """The offset a new query starts at, with the state for it built.

        Raises:
            VersionNotFoundError: if ``startingVersion`` is after the latest version, or (with
                ``failOnDataLoss``) older than the log still holds.
            TableNotFoundError: if the path holds no Delta table.
        """
        o, latest = self.options, self.log.latest_version()
        snapshot_first = o.initial_snapshot if o.initial_snapshot is not None else not o.has_start
        if o.starting_latest:
            version = latest if snapshot_first else latest + 1
        elif o.starting_timestamp_ms is not None:
            version = self._version_at(o.starting_timestamp_ms, latest)
        elif o.starting_version is not None:
            if o.starting_version > latest:
                raise VersionNotFoundError(
                    f"startingVersion {o.starting_version} is after the latest version {latest}", table=self.log.table
                )
            version = o.starting_version
        else:
            version = latest if snapshot_first else 0
        start = Offset("", version, 0, snapshot_first and version <= latest)
        self.build(start)
        if self.table_id is None:
            self.table_id = table_id(self.log)
        return Offset(self.table_id, start.version, 0, start.snapshot)

    def _version_at(self, timestamp_ms: int, latest: int) -> int:
        try:
            return version_at_or_after(self.log, timestamp_ms)
        except VersionNotFoundError:
            return latest + 1

    # -- (re)building --------------------------------------------------------------------------

    def _following(self) -> LogFollower:
        if self._follower is None:
            raise RuntimeError("the stream's state is not built")  # a program error: ensure() builds it
        return self._follower

    def _rebuild(self, start: Offset) -> None:
        self._pending.clear()
        self.table_id = start.table_id or None
        self._follower = None
        base = start.base_version
        snap = self._load(base)
        self._set_snapshot(snap)
        tid = self.table_id or ""
        resnapshot = snap.version != base and self.options.on_data_loss == "resnapshot"
        if snap.version == base:
            self.jump = (start.position, start)
        else:  # data loss skipped ahead
            to = (
                Offset(tid, snap.version, 0, True) if start.snapshot or resnapshot else Offset(tid, snap.version + 1, 0)
            )
            self.jump = (start.position, to)
        if (start.snapshot or resnapshot) and snap.version >= 0:
            plan = plan_snapshot(snap, self._following().previous_ms or 0, self.feed.options.external_roots)
            self._plans[plan_key(plan)] = plan

    def _set_snapshot(self, snap: Snapshot) -> None:
        """Follow the log from ``snap`` on.

        Raises:
            StateError: if ``snap`` belongs to another table than the stream's.
        """
        previous = None if snap.version < 0 else snapshot_time(self.log, snap)
        if self._follower is None:
            self._follower = LogFollower(
                self.log,
                snap,
                previous_ms=previous,
                table_id=self.table_id,
                allow_non_additive=self.feed.options.allow_non_additive,
                external_roots=self.feed.options.external_roots,
                hints=SPARK_HINTS,
                gap_check_seconds=math.inf,  # the planner decides when to list (check_seconds)
            )
        else:
            self._follower.reset(snap, previous)
        self.table_id = self._follower.table_id

    def _load(self, version: int) -> Snapshot:
        if version < 0:
            return Snapshot.empty(self.log.table)
        try:
            return self.log.snapshot(version)
        except (VersionNotFoundError, VersionGapError) as e:
            self._check_not_truncated(version)
            return self._data_loss(e, version)

    def _data_loss(self, error: VersionNotFoundError | VersionGapError, position: int) -> Snapshot:
        """The log no longer holds the versions after ``position``: what ``onDataLoss`` says.

        ``fail`` (``failOnDataLoss``): the error, with a hint. ``skip`` (``failOnDataLoss=false``):
        the earliest snapshot the log still holds, the stream going on after it. ``resnapshot``: the
        latest snapshot, whose rows the stream reads as an initial snapshot's (``snapshot`` offsets),
        then on after it. Either way with a warning, counted in :attr:`data_losses`.

        Raises:
            VersionNotFoundError, VersionGapError: with ``fail``, or when the log still holds
                versions before the missing one (a hole, not a cleanup).
        """
        mode = self.options.on_data_loss
        if mode == "fail":
            hint = (
                "the log no longer holds the versions the stream needs; set onDataLoss=resnapshot to read the "
                "table's current rows as a snapshot, or failOnDataLoss=false (onDataLoss=skip) to skip them"
            )
            raise type(error)(
                f"{error.message}; {hint}", table=error.table, version=error.version, file=error.file
            ) from error
        earliest = self.log.earliest_version()
        if earliest <= position:
            raise error
        target = self.log.latest_version() if mode == "resnapshot" else earliest
        self.data_losses += 1
        log.warning(
            "%s: versions after %d up to %d are gone from the log (%s): their changes are skipped; "
            "the stream goes on %s",
            self.log.table,
            position,
            earliest,
            "failOnDataLoss=false" if mode == "skip" else "onDataLoss=resnapshot",
            f"with the table's rows at version {target} as a snapshot"
            if mode == "resnapshot"
            else f"with version {target + 1}",
        )
        return self.log.snapshot(target)

    def _recreated(self, expected: str, found: str) -> StateError:
        return StateError(
            f"the stream's offsets belong to table id {expected}, but the table now has id {found}: it was "
            f"deleted and recreated; {SPARK_HINTS.recreated}",
            table=self.log.table,
        )

    # -- planning ------------------------------------------------------------------------------

    def _plan_new(self) -> VersionPlan | None:
        if not self._pending:
            self._pending.extend(self._discover())
        if not self._pending:
            return None
        plan = self._following().plan(self._pending.popleft()).plan
        check_fits(plan, self.stream_schema)
        return plan

    def _discover(self) -> list[int]:
        """New commits after the head (a request per commit); the log is listed at most every ``check_seconds``.

        Listing tells "nothing new" from a gap (log cleaned up past us) and a truncated log
        (table recreated); Spark polls an idle source every few milliseconds.
        """
        follower = self._following()
        version = follower.head.version
        now = time.monotonic()
        check = now - self._last_check >= self.check_seconds
        try:
            versions = follower.discover(check_gaps=check)
        except VersionGapError as e:
            snap = self._data_loss(e, version)
            self._set_snapshot(snap)
            tid = self.table_id or ""
            if self.options.on_data_loss == "resnapshot":
                plan = plan_snapshot(snap, self._following().previous_ms or 0, self.feed.options.external_roots)
                self._plans[plan_key(plan)] = plan
                self.jump = ((version + 1, 1, 0), Offset(tid, snap.version, 0, True))
            else:
                self.jump = ((version + 1, 1, 0), Offset(tid, snap.version + 1, 0))
            return self._following().discover()
        if check and not versions:
            self._last_check = now
        return versions

    def _check_not_truncated(self, version: int) -> None:
        latest = self.log.latest_version()
        if latest < version:
            raise StateError(
                f"the stream has read up to version {version}, but the table's latest version is {latest}: "
                f"the table was deleted and recreated, or its log truncated; {SPARK_HINTS.recreated}",
                table=self.log.table,
            )
