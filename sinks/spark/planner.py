"""The driver's planning state of one streaming query."""

from __future__ import annotations

import logging
import math
import time
from collections import deque
from collections.abc import Iterator

import pyarrow as pa

from sinks.spark.offsets import Key, Offset, plan_key
from sinks.spark.options import SourceOptions
from sinks.spark.schema import check_fits
from state.errors import DeltaTailError, StateError, VersionGapError, VersionNotFoundError
from state.planning import VersionPlan, plan_snapshot
from state.snapshot import Snapshot
from tailer.log.delta_log import DeltaLog
from tailer.log.follower import Hints, LogFollower
from tailer.log.starts import snapshot_time, table_id, version_at_or_after
from tailer.read.feed import ChangeFeed
from tailer.storage import Storage

log = logging.getLogger("deltatail")

#: How often an idle stream lists the log to detect gaps and truncation (seconds).
CHECK_SECONDS = 5.0

#: What the stream's errors tell a user to do.
SPARK_HINTS = Hints(
    gap="",  # a gap goes through failOnDataLoss, which says what to do
    recreated="start a new query (a new checkpointLocation) to read the new table",
)


class StreamPlanner:
    """The driver's planning state of one query: a log follower and the plans not yet committed.

    Plans are cached in order of their keys; the newest is always that of the
    follower's head. Any planning error is sticky (the head may be half moved
    on): it is raised again whenever planning reaches that version. ``jump`` is
    ``(position, offset)``: the state serves any start offset from ``position``
    to ``offset`` (the start it was built for, and everything a data-loss skip
    jumped over).

    Args:
        options: the source's options.
        stream_schema: the query's fixed schema (Arrow).
        storage: where the table is (by default the storage its path and ``storage.*`` options name).
    """

    def __init__(self, options: SourceOptions, stream_schema: pa.Schema, storage: Storage | None = None) -> None:
        self.options = options
        self.stream_schema = stream_schema
        self.feed = ChangeFeed(options.path, storage or options.storage(), options=options.change_options())
        self.log: DeltaLog = self.feed.log
        self.table_id: str | None = None
        self.target: int | None = None
        self.rebuilds = 0
        self._follower: LogFollower | None = None
        self.jump: tuple[tuple[int, int, int], Offset] | None = None
        self._plans: dict[Key, VersionPlan] = {}
        self._pending: deque[int] = deque()
        self._failure: DeltaTailError | None = None
        #: The least time between two listings of the log (gap and truncation checks) while idle.
        self.check_seconds = CHECK_SECONDS
        self._last_check = -math.inf

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
        self._rebuild(start)
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

    def _covers(self, start: Offset) -> bool:
        if self._follower is None:
            return False
        if start.key in self._plans:
            return True
        if self.jump is not None and self.jump[0] <= start.position <= self.jump[1].position:
            return True
        return not start.snapshot and start.version == self._follower.head.version + 1

    def ensure(self, start: Offset) -> None:
        """Make the state serve ``start``: reuse it, or rebuild it from the log (a restart).

        Raises:
            StateError: if the offset belongs to another table (deleted and recreated).
        """
        if start.table_id and self.table_id and start.table_id != self.table_id:
            raise self._recreated(start.table_id, self.table_id)
        if not self._covers(start):
            self._rebuild(start)

    def _rebuild(self, start: Offset) -> None:
        log.info("%s: building the stream's state for offset %s", self.log.table, start.to_json())
        self.rebuilds += 1
        self._plans.clear()
        self._pending.clear()
        self._failure = None
        self.table_id = start.table_id or None
        self._follower = None
        base = start.version if start.snapshot else start.version - 1
        snap = self._load(base)
        self._set_snapshot(snap)
        tid = self.table_id or ""
        if snap.version == base:
            self.jump = (start.position, start)
        else:  # data loss skipped ahead
            to = Offset(tid, snap.version, 0, True) if start.snapshot else Offset(tid, snap.version + 1, 0)
            self.jump = (start.position, to)
        if start.snapshot and snap.version >= 0:
            plan = plan_snapshot(snap, self._following().previous_ms or 0)
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
        """Fail (``failOnDataLoss``), or skip to the earliest snapshot the log still holds, with a warning."""
        if self.options.fail_on_data_loss:
            hint = "the log no longer holds the versions the stream needs; set failOnDataLoss=false to skip them"
            raise type(error)(
                f"{error.message}; {hint}", table=error.table, version=error.version, file=error.file
            ) from error
        earliest = self.log.earliest_version()
        if earliest <= position:
            raise error
        log.warning(
            "%s: versions after %d up to %d are gone from the log (failOnDataLoss=false): their changes are "
            "skipped; the stream goes on with version %d",
            self.log.table,
            position,
            earliest,
            earliest + 1,
        )
        return self.log.snapshot(earliest)

    def _recreated(self, expected: str, found: str) -> StateError:
        return StateError(
            f"the stream's offsets belong to table id {expected}, but the table now has id {found}: it was "
            f"deleted and recreated; {SPARK_HINTS.recreated}",
            table=self.log.table,
        )

    # -- planning ------------------------------------------------------------------------------

    def plans_from(self, start: Offset, stop: Key | None = None) -> Iterator[VersionPlan]:
        """Plans from ``start``'s on, in order, planning new commits lazily; none at or after ``stop``.

        Raises:
            SchemaChangeError: when planning reaches a version whose schema does not fit the stream's.
            VersionGapError, VersionNotFoundError: when the log no longer holds a needed version
                (``failOnDataLoss``).
            StateError: if the table was deleted and recreated.
            InvalidLogError, UnsupportedFeatureError: as :meth:`LogFollower.plan`.
        """
        self.ensure(start)
        for key, plan in list(self._plans.items()):
            if key < start.key:
                continue
            if stop is not None and key >= stop:
                return
            yield plan
        while True:
            if stop is not None and (self._following().head.version + 1, 1) >= stop:
                return
            planned = self._plan_next()
            if planned is None:
                return
            yield planned

    def _plan_next(self) -> VersionPlan | None:
        if self._failure is not None:
            raise self._failure
        follower = self._following()
        if self.target is not None and follower.head.version >= self.target:
            return None
        try:
            if not self._pending:
                self._pending.extend(self._discover())
            if not self._pending:
                return None
            plan = self._following().plan(self._pending.popleft()).plan
            check_fits(plan, self.stream_schema)
        except DeltaTailError as e:
            self._failure = e
            raise
        self._plans[plan_key(plan)] = plan
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
            self.jump = ((version + 1, 1, 0), Offset(self.table_id or "", snap.version + 1, 0))
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

    def forget_before(self, end: Offset) -> None:
        """Drop the cached plans wholly before ``end`` (Spark committed them; it never asks for them again)."""
        for key in [k for k in self._plans if k < end.key]:
            del self._plans[key]
        if self.jump is not None and end.position >= self.jump[1].position:
            self.jump = None

    @property
    def cached(self) -> int:
        """How many plans are cached."""
        return len(self._plans)
