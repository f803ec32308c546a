"""The log follower: the one way deltatail moves along a table's log, version after version.

The tailer, the Spark source and range reads (``deltatail changes``) all follow
the log through a :class:`LogFollower`. It holds the *planning head*: the
snapshot after the newest planned version, and that version's
``_commit_timestamp`` (the next one's rule needs it). Around it:

- **Discovery** (:meth:`LogFollower.discover`): the next commits are found by
  name (``<v+1>.json``, ``<v+2>.json``... one request each, however large
  ``_delta_log`` grows). Only when nothing new is there, and at most every
  ``gap_check_seconds``, is the log listed, starting after the head (never the
  whole directory), to tell "nothing new" from a gap or a log cleaned up past
  the head: a :class:`~state.errors.VersionGapError`.
- **Recreated tables** (:meth:`LogFollower.check_not_recreated`): the head's
  commit file must keep the size and modification time it had when read; if
  it is gone, the log must go on past it (cleaned up by log retention),
  otherwise the table was deleted and recreated, or its log truncated: a
  :class:`~state.errors.StateError`. A ``metaData`` action with another table
  id is refused the same way.
- **Commit reads** (:meth:`LogFollower.read_commit`): the newest known commit,
  if it does not parse, is retried with backoff (on a store without atomic
  writes a writer may still be writing it), then reported; a commit that a
  later one is known to follow is complete (writers commit in order), so it is
  reported at once; a missing one is a gap.
- **Planning** (:meth:`LogFollower.plan`): :func:`state.planning.plan_commit`
  from the head, which then moves on. An auditor that needs no change plan
  moves on with :meth:`LogFollower.step` (the commit applied, nothing planned).
- **Audit events** (optional): given an ``audit`` builder, the follower builds
  each commit's :class:`~state.audit.AuditEvent` from the head *before* moving
  it on (applying a commit hands the head's file tables on, and the event needs
  them for sizes a ``remove`` omits). Without one nothing is built: no cost.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING

from deltatail.state.changes import commit_timestamp
from deltatail.state.commit import Commit
from deltatail.state.errors import DeltaTailError, InvalidLogError, MissingFileError, StateError, VersionGapError
from deltatail.state.planning import VersionPlan, plan_commit
from deltatail.state.snapshot import Snapshot
from deltatail.tailer.log.delta_log import DeltaLog, LogListing
from deltatail.tailer.storage import FileInfo

if TYPE_CHECKING:  # the audit model is imported by those who build audit events (tailer/audit/), not here
    from deltatail.state.audit import AuditEvent

#: Seconds between listings of the log that look for a gap when no next commit exists.
GAP_CHECK_SECONDS = 10.0
#: Commit files fetched ahead of planning on a remote store (see :meth:`LogFollower.prefetch`).
PREFETCH_COMMITS = 256
#: Threads making the deferred recreated-table checks of every follower in the process (one HEAD each).
CHECK_THREADS = 4

_checks: ThreadPoolExecutor | None = None
_checks_lock = threading.Lock()


def _checker() -> ThreadPoolExecutor:
    """The process's threads for deferred checks (started on first use)."""
    global _checks
    with _checks_lock:
        if _checks is None:
            _checks = ThreadPoolExecutor(CHECK_THREADS, thread_name_prefix="deltatail-recreated")
        return _checks


@dataclass(frozen=True, slots=True)
class Hints:
    """What the follower's errors tell a user to do (appended after ``; ``); each caller knows its own recovery."""

    gap: str = "the range cannot be read exactly"
    recreated: str = "read the new table from its start"


def _with_hint(message: str, hint: str) -> str:
    return f"{message}; {hint}" if hint else message


#: Builds a commit's audit event from the commit, the snapshot just before it, its commit file and the
#: previous version's ``_commit_timestamp`` (see :class:`tailer.audit.feed.AuditTracker`).
AuditBuilder = Callable[[Commit, Snapshot, FileInfo, "int | None"], "AuditEvent"]


@dataclass(frozen=True, slots=True)
class FollowedVersion:
    """One planned version: the plan, the snapshot after it, its commit file as it was read, and its audit event.

    ``audit`` is ``None`` unless the follower has an ``audit`` builder.
    """

    plan: VersionPlan
    snapshot: Snapshot
    file: FileInfo
    audit: AuditEvent | None = None


@dataclass(frozen=True, slots=True)
class SteppedVersion:
    """One version applied without planning (:meth:`LogFollower.step`)."""

    commit: Commit
    snapshot: Snapshot
    file: FileInfo
    timestamp_ms: int
    audit: AuditEvent | None = None


class LogFollower:
    """Follows one table's log from a snapshot (see the module docstring).

    Args:
        log: the table's log.
        head: the snapshot to start from (the state just before the first version to plan).
        previous_ms: the ``_commit_timestamp`` of ``head``'s version, if known.
        table_id: the table id the follower holds to; ``None`` takes the first one seen.
        allow_non_additive: plan across non-additive schema changes.
        require_cdf: refuse versions where the change data feed is off.
        external_roots: roots outside the table its files may be read from (:mod:`state.paths`).
        hints: recovery advice for the errors.
        gap_check_seconds: the least time between two listings of the log by :meth:`discover`.
        parse_retries: how often a commit that does not parse is read again before it is reported.
        retry_delay: the first wait between those reads (doubling after each).
        clock: monotonic seconds (tests pass their own).
        sleep: waits between retries (tests pass their own).
        audit: builds each planned or stepped commit's audit event before the head moves on
            (``None``: no event is built).
    """

    def __init__(
        self,
        log: DeltaLog,
        head: Snapshot,
        *,
        previous_ms: int | None = None,
        table_id: str | None = None,
        allow_non_additive: bool = False,
        require_cdf: bool = False,
        external_roots: tuple[str, ...] = (),
        hints: Hints | None = None,
        gap_check_seconds: float = GAP_CHECK_SECONDS,
        parse_retries: int = 5,
        retry_delay: float = 0.05,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] = time.sleep,
        audit: AuditBuilder | None = None,
    ) -> None:
        self.log = log
        self.audit = audit
        self.hints = hints or Hints()
        self.allow_non_additive = allow_non_additive
        self.require_cdf = require_cdf
        self.external_roots = external_roots
        self.gap_check_seconds = gap_check_seconds
        self.parse_retries = parse_retries
        self.retry_delay = retry_delay
        self._clock = clock
        self._sleep = sleep
        self.table_id = table_id
        self._last_gap_check = -float("inf")
        self._hot = False  # the last discovery found commits (on a store, the next one lists)
        self._head_file: tuple[int, int] | None = None
        self._discovered: dict[int, FileInfo] = {}
        self._found_ms: dict[int, int] = {}  # the last discovery's commits' modification times (kept when planned)
        self._newest_known = -1
        #: Whether :meth:`discover` checks the head's commit on a thread, awaited by :meth:`confirm_not_recreated`.
        self.defer_checks = False
        self._pending_check: Future[None] | None = None
        self.head = head
        self.previous_ms = previous_ms
        self.reset(head, previous_ms)

    def reset(self, head: Snapshot, previous_ms: int | None) -> None:
        """Start again from ``head`` (a jump: a restart, or a skip over versions the log lost).

        Raises:
            StateError: if ``head`` belongs to another table than the one followed.
        """
        self.head = head
        self.previous_ms = previous_ms
        self._head_file = None
        self._check_table(head)

    # -- discovery -----------------------------------------------------------------------------

    def discover(self, *, check_gaps: bool = False, limit: int | None = None) -> list[int]:
        """The versions of the contiguous commits after the head that exist now.

        Found by name; when there are none, the log is listed (from the head on) if
        ``check_gaps`` or if ``gap_check_seconds`` passed since the last listing; at most ``limit``
        versions are probed and returned (a table catching up, shared fairly with others). On an
        object store one commit is probed by name (a GET whose bytes the read takes), and the call
        after one that found commits lists the log instead: following costs a request per poll,
        and a backlog a request per 1,000 commits.

        The head's commit is checked (:meth:`check_not_recreated`) on every call locally. On a
        remote store a listing starts at the head's own commit, whose size and modification time
        it returns: the check costs no request there. When a commit is found by name, the head's
        commit is checked with one HEAD request, before this returns, or with :attr:`defer_checks`
        concurrently with what follows (the data's reads), the caller awaiting it with
        :meth:`confirm_not_recreated` before it delivers a row. An idle table there costs one
        request per call, plus a listing per gap-check interval.

        Raises:
            VersionGapError: if a listing finds later commits while the next one is missing.
            StateError: if the table was deleted and recreated (see :meth:`check_not_recreated`).
        """
        self.confirm_not_recreated()  # a check still pending from the last call
        remote = self.log.storage.remote
        if not remote:
            self.check_not_recreated()  # locally a stat is cheap: a recreated table is refused at once
        now = self._clock()
        gap_due = check_gaps or now - self._last_gap_check >= self.gap_check_seconds
        if remote and self._hot:
            # Commits were just found: one listing tells whether more came (a backlog: all of them
            # in one request) or none, and is a gap check too.
            self._last_gap_check = now
            found = self._listed(limit)
        else:
            # On a store, one commit by name (its bytes kept for the read) and back to deliver it: the
            # next call lists, rather than probing the commit after it first.
            found = self.log.discover_commits(self.head.version, check_gaps=False, limit=1 if remote else limit)
            if not found and gap_due:
                self._last_gap_check = now
                found = self._listed(limit) if remote else self._discover_checked()
                if not remote:
                    self.check_not_recreated()
            elif remote and found:
                self._check_found()  # the new commits continue the commit read last, not a new table
        self._hot = bool(found)
        self._discovered = dict(found)
        self._found_ms = {v: info.modification_time for v, info in found}
        if found:
            self.know_commits_up_to(found[-1][0])
        return [v for v, _ in found]

    def _listed(self, limit: int | None) -> list[tuple[int, FileInfo]]:
        """The commits after the head from one listing that starts at the head's own commit (checked from it).

        Raises:
            VersionGapError: if later commits exist while the next one is missing.
            StateError: if the head's commit was rewritten, or the log now ends before it.
        """
        v = self.head.version
        listing = self.log.list_log(max(v, 0))
        if v >= 0:
            head = listing.commits.get(v)
            self._check_head(v, self._head_file, head, listing)
            if head is not None and self._head_file is None:
                self._head_file = (head.size, head.modification_time)
        found: list[tuple[int, FileInfo]] = []
        n = v + 1
        while (limit is None or len(found) < limit) and n in listing.commits:
            found.append((n, listing.commits[n]))
            n += 1
        later = [c for c in listing.commits if c > v]
        if not found and later:
            e = self.log.gap_error(v, min(later))
            raise VersionGapError(_with_hint(e.message, self.hints.gap), table=e.table, version=e.version, file=e.file)
        return found

    def _check_found(self) -> None:
        """Check the head's commit with a HEAD request: now, or (with :attr:`defer_checks`) on a thread."""
        v, expected = self.head.version, self._head_file
        if v < 0:
            return
        if not self.defer_checks:
            self._check_head(v, expected, self._stat_or_none(v))
            return
        self._pending_check = _checker().submit(lambda: self._check_head(v, expected, self._stat_or_none(v)))

    def confirm_not_recreated(self) -> None:
        """Wait for a deferred check of :meth:`discover` (nothing to wait for without one) and raise what it found.

        A store that failed the check's request raises here what :meth:`discover` would have raised.

        Raises:
            StateError: if the table was deleted and recreated.
        """
        pending, self._pending_check = self._pending_check, None
        if pending is not None:
            pending.result()

    def _discover_checked(self, *, limit: int | None = None, by_listing: bool = False) -> list[tuple[int, FileInfo]]:
        """New commits, the log listed to tell "nothing new" from a gap (the error with the follower's hint)."""
        try:
            return self.log.discover_commits(self.head.version, check_gaps=True, limit=limit, by_listing=by_listing)
        except VersionGapError as e:
            raise VersionGapError(
                _with_hint(e.message, self.hints.gap), table=e.table, version=e.version, file=e.file
            ) from e

    def discovered_ms(self, version: int) -> int | None:
        """The modification time (epoch ms) of commit ``version``'s file if the last :meth:`discover` found it."""
        return self._found_ms.get(version)

    def know_commits_up_to(self, version: int) -> None:
        """Note that commit ``version`` exists (a listing found it): the commits before it are complete."""
        self._newest_known = max(self._newest_known, version)

    def check_not_recreated(self) -> None:
        """Make sure the head's commit is still the one read (a deleted and recreated table is refused).

        Raises:
            StateError: if the head's commit file was rewritten, or is gone while the log now ends before it.
        """
        v = self.head.version
        if v < 0:
            return
        info = self._stat_or_none(v)
        self._check_head(v, self._head_file, info)
        if info is not None and self._head_file is None:
            self._head_file = (info.size, info.modification_time)

    def _stat_or_none(self, version: int) -> FileInfo | None:
        try:
            return self.log.storage.stat(self.log.commit_path(version))
        except MissingFileError:
            return None

    def _check_head(
        self, v: int, expected: tuple[int, int] | None, info: FileInfo | None, listing: LogListing | None = None
    ) -> None:
        """Whether commit ``v`` (the head's) is as read: ``info`` is its file now, ``listing`` a listing from ``v`` on.

        Raises:
            StateError: if it was rewritten, or is gone while the log now ends before it.
        """
        if info is not None:
            if expected is None or expected == (info.size, info.modification_time):
                return
            reason = f"commit {v} was rewritten since it was read"
        else:
            if listing is not None:
                if any(c > v for c in listing.commits) or any(c >= v for c in listing.checkpoints):
                    return  # cleaned up by log retention: the log goes on
                reason = f"the table's log now ends before version {v} already read"
            else:
                try:
                    latest = self.log.latest_version()
                except DeltaTailError:
                    latest = -1
                if latest >= v:
                    return  # cleaned up by log retention: the log goes on
                reason = f"the table's log now ends at version {latest}, before version {v} already read"
        raise StateError(
            f"{reason}: the table was deleted and recreated, or its log truncated; {self.hints.recreated}",
            table=self.log.table,
            version=v,
        )

    def _check_table(self, snap: Snapshot) -> None:
        if snap.metadata is None:
            return
        if self.table_id is None:
            self.table_id = snap.metadata.id
        elif snap.metadata.id != self.table_id:
            raise StateError(
                f"the table id was {self.table_id}, but the table now has id {snap.metadata.id}: it was deleted "
                f"and recreated; {self.hints.recreated}",
                table=self.log.table,
                version=snap.version,
            )

    # -- reading and planning ------------------------------------------------------------------

    def read_commit(self, version: int) -> Commit:
        """Read commit ``version``, retrying briefly while it does not parse (unless a later commit is known).

        Raises:
            VersionGapError: if the commit file is missing.
            InvalidLogError: if it still does not parse after the retries.
        """
        return self._read_commit(version)[0]

    def _read_commit(self, version: int) -> tuple[Commit, int]:
        """:meth:`read_commit`, and how many retries it took (the file changed in between if any)."""
        # A commit with a later one after it was complete before that one was written: no retry.
        retries = 0 if version < self._newest_known else self.parse_retries
        for attempt in range(retries + 1):
            try:
                return self.log.read_commit(version), attempt
            except InvalidLogError:
                if attempt == retries:
                    raise
                self._sleep(self.retry_delay * (2**attempt))
            except MissingFileError as e:
                raise VersionGapError(
                    _with_hint(
                        f"commit {version} is missing: the log was cleaned up past this position (or has a gap)",
                        self.hints.gap,
                    ),
                    table=self.log.table,
                    version=version,
                    file=e.file,
                ) from e
        raise AssertionError("unreachable: the last attempt returns or raises")

    def prefetch(self, versions: Iterable[int], files: Mapping[int, FileInfo] | None = None) -> None:
        """On a remote store, start fetching the commit files of ``versions`` (those known to exist) ahead.

        ``files`` are listing entries of the commits (by default those :meth:`discover` found).
        Planning then reads them from memory, instead of one request after another.
        """
        if not self.log.storage.remote:
            return
        known = self._discovered if files is None else files
        self.log.storage.prefetch([(self.log.commit_path(v), known[v].size) for v in versions if v in known])

    def plan(self, version: int, file: FileInfo | None = None) -> FollowedVersion:
        """Plan ``version`` (the head's next) and move the head on to it.

        Args:
            version: the version after the head.
            file: its commit file's listing entry, if the caller has it (saves a request; one
                :meth:`discover` found is used otherwise).

        Raises:
            VersionGapError: if the commit is missing.
            InvalidLogError: if it does not parse, or is invalid for planning.
            SchemaChangeError: if it changes the schema non-additively (unless allowed).
            UnsupportedFeatureError: if it needs unsupported reader features.
            StateError: if it carries another table id.
        """
        try:
            return self._plan(version, file)
        except DeltaTailError:
            self.confirm_not_recreated()  # a recreated table explains a commit that does not follow: said first
            raise

    def _plan(self, version: int, file: FileInfo | None) -> FollowedVersion:
        commit, file, path = self._next(version, file)
        event = None if self.audit is None else self._audit_event(commit, file, path)
        try:
            after, plan = plan_commit(
                self.head,
                commit,
                file.modification_time,
                self.previous_ms,
                allow_non_additive=self.allow_non_additive,
                require_cdf=self.require_cdf,
                external_roots=self.external_roots,
            )
        except DeltaTailError as e:
            raise e.at(table=self.log.table, version=version, file=path) from None
        self._moved_on(commit, after, plan.context.timestamp_ms, file)
        return FollowedVersion(plan, after, file, event)

    def step(self, version: int, file: FileInfo | None = None) -> SteppedVersion:
        """Apply ``version`` (the head's next) without planning its changes, and move the head on to it.

        For followers of the log itself (an auditor): nothing about the commit's data files is
        checked beyond what :meth:`Snapshot.apply <state.snapshot.Snapshot.apply>` checks, and a
        schema change of any kind is followed.

        Raises:
            VersionGapError: if the commit is missing.
            InvalidLogError: if it does not parse, or leaves the table without metadata.
            UnsupportedFeatureError: if it needs unsupported reader features.
            StateError: if it carries another table id.
        """
        commit, file, path = self._next(version, file)
        event = None if self.audit is None else self._audit_event(commit, file, path)
        try:
            after, _ = self.head.apply(commit)
            if after.metadata is None:
                raise InvalidLogError("no metaData action found in the log")
        except DeltaTailError as e:
            raise e.at(table=self.log.table, version=version, file=path) from None
        ts = (
            event.timestamp_ms
            if event is not None
            else commit_timestamp(commit, after.metadata, file.modification_time, self.previous_ms)
        )
        self._moved_on(commit, after, ts, file)
        return SteppedVersion(commit, after, file, ts, event)

    def _next(self, version: int, file: FileInfo | None) -> tuple[Commit, FileInfo, str]:
        """The head's next commit, its file's listing entry and its path."""
        commit, retries = self._read_commit(version)
        path = self.log.commit_path(version)
        discovered = self._discovered.pop(version, None)
        if file is None and not retries:  # a commit read again was still being written when discovered
            file = discovered
        if file is None:
            try:
                file = self.log.storage.stat(path)
            except MissingFileError as e:
                raise VersionGapError(
                    _with_hint(f"commit {version} disappeared while being read", self.hints.gap),
                    table=self.log.table,
                    version=version,
                    file=path,
                ) from e
        return commit, file, path

    def _audit_event(self, commit: Commit, file: FileInfo, path: str) -> AuditEvent:
        if self.audit is None:
            raise RuntimeError("no audit builder")  # a program error: callers check first
        try:
            return self.audit(commit, self.head, file, self.previous_ms)
        except DeltaTailError as e:
            raise e.at(table=self.log.table, version=commit.version, file=path) from None

    def _moved_on(self, commit: Commit, after: Snapshot, timestamp_ms: int, file: FileInfo) -> None:
        if commit.metadata is not None:
            self._check_table(after)
        self.head = after
        self.previous_ms = timestamp_ms
        self._head_file = (file.size, file.modification_time)
