"""The log reader: list ``_delta_log``, pick a checkpoint, replay commits, build snapshots.

Protocol, "Delta Log Entries" and "Checkpoints": a snapshot at version ``v``
is the newest checkpoint at or below ``v`` plus every commit after it up to
``v``; commit versions are contiguous. The newer revision adds UUID-named V2
checkpoints with sidecars, and log compaction files ``<x>.<y>.compacted.json``
that "may replace" the commits ``x..y`` they cover.

Rules deltatail holds to here:

- ``_last_checkpoint`` is a hint: it is validated (checksum included) and
  checked against the listing; a missing, corrupt or lying pointer falls back
  to listing with a warning.
- Only *complete* checkpoints are used: every part of a multi-part
  checkpoint, and every sidecar of a V2 checkpoint. An incomplete newer
  checkpoint is passed over with a warning for an older route; if no route
  remains, that is an :class:`~state.errors.IncompleteCheckpointError`.
- A missing commit version between the checkpoint and the target is a
  :class:`~state.errors.VersionGapError` naming the version — never skipped.
  A compaction file covering the missing versions is used instead where one exists.
- Listing always starts after a known version (``start_after``): following a
  table never lists the whole directory.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field

from deltatail.state.commit import Commit
from deltatail.state.errors import (
    DeltaTailError,
    IncompleteCheckpointError,
    MissingFileError,
    StorageError,
    TableNotFoundError,
    VersionGapError,
    VersionNotFoundError,
)
from deltatail.state.snapshot import AppliedCommit, Snapshot
from deltatail.tailer.log.checkpoint import load_checkpoint
from deltatail.tailer.log.files import LogFile, LogFileKind, classify, start_after_for
from deltatail.tailer.log.last_checkpoint import LastCheckpoint, parse_last_checkpoint
from deltatail.tailer.storage import FileInfo, Storage, to_local_path
from deltatail.tailer.table import table_storage

log = logging.getLogger("deltatail")


@dataclass(frozen=True, slots=True)
class CheckpointRef:
    """A complete checkpoint: its version, format and every file name (parts in order)."""

    version: int
    fmt: str
    names: tuple[str, ...]


@dataclass
class LogListing:
    """A classified listing of ``_delta_log`` from some version on."""

    commits: dict[int, FileInfo] = field(default_factory=dict)
    compactions: list[LogFile] = field(default_factory=list)
    checkpoints: dict[int, list[LogFile]] = field(default_factory=dict)

    def complete_checkpoints(self, at_most: int) -> list[CheckpointRef]:
        """Complete checkpoints at or below ``at_most``, newest first (sidecars not yet checked)."""
        refs: list[CheckpointRef] = []
        for version in sorted(self.checkpoints, reverse=True):
            if version > at_most:
                continue
            refs.extend(_complete_refs(version, self.checkpoints[version]))
        return refs


def _complete_refs(version: int, files: list[LogFile]) -> list[CheckpointRef]:
    """Every complete checkpoint among the files of one version; UUID-named first (they are the newest kind)."""
    refs: list[CheckpointRef] = []
    for f in files:
        if f.kind is LogFileKind.CHECKPOINT_UUID:
            refs.append(CheckpointRef(version, f.fmt, (f.name,)))
    for f in files:
        if f.kind is LogFileKind.CHECKPOINT_CLASSIC:
            refs.append(CheckpointRef(version, "parquet", (f.name,)))
    by_total: dict[int, dict[int, str]] = {}
    for f in files:
        if f.kind is LogFileKind.CHECKPOINT_MULTI_PART:
            by_total.setdefault(f.parts, {})[f.part] = f.name
    for total, parts in sorted(by_total.items()):
        # The total comes from a file name: never allocate by it (a name claiming 10^9 parts is 4 bytes).
        present = sum(1 for p in parts if 1 <= p <= total)
        if present == total:
            refs.append(CheckpointRef(version, "parquet", tuple(parts[i] for i in range(1, total + 1))))
        elif total - present <= _MISSING_PARTS_LISTED:
            missing = [i for i in range(1, total + 1) if i not in parts]
            log.warning("multi-part checkpoint %d of %d parts lacks parts %s; not used", version, total, missing)
        else:
            log.warning(
                "multi-part checkpoint %d of %d parts lacks %d of them; not used", version, total, total - present
            )
    return refs


#: A warning about an incomplete multi-part checkpoint lists its missing parts up to this many.
_MISSING_PARTS_LISTED = 20


#: On an object store, commits found by name before the rest of a backlog is listed.
BACKLOG_BY_NAME = 2


class DeltaLog:
    """A Delta table's log, read through a :class:`~tailer.storage.Storage`.

    Example:
        >>> log = DeltaLog("/data/events")                  # doctest: +SKIP
        >>> snap = log.snapshot()                           # doctest: +SKIP
        >>> snap, applied = log.update(snap)                # doctest: +SKIP
    """

    def __init__(self, table_root: str, storage: Storage | None = None) -> None:
        self.table = to_local_path(table_root).rstrip("/") or "/"
        self.log_dir = f"{self.table}/_delta_log"
        self.storage: Storage = storage if storage is not None else table_storage(self.table)

    # -- listing -------------------------------------------------------------------------------

    def last_checkpoint(self) -> LastCheckpoint | None:
        """The validated ``_last_checkpoint`` hint, or ``None`` (absent or untrustworthy, with a warning)."""
        path = f"{self.log_dir}/_last_checkpoint"
        try:
            data = self.storage.read(path)
        except MissingFileError:
            return None
        return parse_last_checkpoint(data, where=path)

    def list_log(self, from_version: int = 0) -> LogListing:
        """Classify the log files of versions ``from_version`` and later (listing starts after the one before).

        Raises:
            TableNotFoundError: if there is no ``_delta_log`` directory.
            StorageError: if the store cannot be reached or refuses access (naming the table).
        """
        try:
            infos = self.storage.list_from(self.log_dir, start_after_for(from_version))
        except MissingFileError as e:
            raise TableNotFoundError("no _delta_log directory: not a Delta table", table=self.table) from e
        except StorageError as e:
            raise e.at(table=self.table) from None
        listing = LogListing()
        for info in infos:
            f = classify(info.name)
            if f.kind is LogFileKind.COMMIT:
                listing.commits[f.version] = info
            elif f.kind is LogFileKind.COMPACTION:
                listing.compactions.append(f)
            elif f.is_checkpoint:
                listing.checkpoints.setdefault(f.version, []).append(f)
        return listing

    def latest_version(self) -> int:
        """The newest version of the table.

        Raises:
            TableNotFoundError: if the table has no log or no commits and no checkpoints.
        """
        listing = self._listing_from_hint(None)
        latest = _latest(listing)
        if latest is None:
            raise TableNotFoundError("_delta_log holds no commits or checkpoints", table=self.table)
        return latest

    def earliest_version(self) -> int:
        """The oldest version whose snapshot can be built (0, or the oldest complete checkpoint).

        Raises:
            TableNotFoundError: if the table has no log, or no commits and no checkpoints.
        """
        listing = self.list_log(0)
        if 0 in listing.commits:
            return 0
        refs = listing.complete_checkpoints(at_most=_latest(listing) or -1)
        if not refs:
            raise TableNotFoundError("_delta_log holds no commit 0 and no complete checkpoint", table=self.table)
        return min(r.version for r in refs)

    def _listing_from_hint(self, target: int | None) -> LogListing:
        hint = self.last_checkpoint()
        if hint is not None and (target is None or hint.version <= target):
            listing = self.list_log(hint.version)
            if hint.version in listing.checkpoints or (listing.commits and min(listing.commits) <= hint.version + 1):
                return listing
            log.warning(
                "_last_checkpoint of %s points at version %d, which the log does not hold; listing the log instead",
                self.table,
                hint.version,
            )
        return self.list_log(0)

    # -- commits -------------------------------------------------------------------------------

    def commit_path(self, version: int) -> str:
        """The path of commit ``version``'s file."""
        return f"{self.log_dir}/{version:020d}.json"

    def read_commit(self, version: int) -> Commit:
        """Read and parse commit ``version``.

        An empty commit file is refused: a commit holds at least one action, and on a store
        without atomic writes an empty file is one still being written (the follower retries it).

        Raises:
            MissingFileError: if the commit file does not exist.
            InvalidLogError: if it is empty, not valid newline-delimited JSON, or breaks an action rule.
        """
        path = self.commit_path(version)
        try:
            return Commit.from_json(version, self.storage.read(path))
        except DeltaTailError as e:
            raise e.at(table=self.table, version=version, file=path) from None

    def _read_compaction(self, f: LogFile) -> Commit:
        path = f"{self.log_dir}/{f.name}"
        try:
            return Commit.from_json(f.version, self.storage.read(path), check_duplicates=False)
        except DeltaTailError as e:
            raise e.at(table=self.table, version=f.first_version, file=path) from None

    def _replay_plan(self, listing: LogListing, first: int, last: int) -> list[LogFile]:
        """Files that bring a snapshot from ``first - 1`` to ``last``: commits, or compactions over holes."""
        plan: list[LogFile] = []
        version = first
        while version <= last:
            if version in listing.commits:
                plan.append(classify(listing.commits[version].name))
                version += 1
                continue
            covering = [c for c in listing.compactions if c.first_version == version and c.version <= last]
            if not covering:
                raise VersionGapError(
                    f"commit {version} is missing from the log (needed to reach version {last}); "
                    "versions must be contiguous",
                    table=self.table,
                    version=version,
                    file=self.commit_path(version),
                )
            best = max(covering, key=lambda c: c.version)
            plan.append(best)
            version = best.version + 1
        return plan

    # -- snapshots -----------------------------------------------------------------------------

    def snapshot(self, version: int | None = None) -> Snapshot:
        """The snapshot at ``version`` (default: the latest).

        Raises:
            TableNotFoundError: if the path holds no Delta table.
            VersionNotFoundError: if ``version`` is newer than the latest, or older than the log still holds.
            VersionGapError: if a commit between the checkpoint used and ``version`` is missing.
            IncompleteCheckpointError: if the only usable checkpoint lacks a part or a sidecar.
            InvalidLogError: if a commit or checkpoint is malformed, or protocol or metadata are missing.
            UnsupportedFeatureError: if the table needs reader features deltatail does not support.
        """
        listing = self._listing_from_hint(version)
        latest = _latest(listing)
        if latest is None:
            raise TableNotFoundError("_delta_log holds no commits or checkpoints", table=self.table)
        target = latest if version is None else version
        if target > latest:
            raise VersionNotFoundError(f"version {target} does not exist; the latest is {latest}", table=self.table)
        if target < 0:
            raise VersionNotFoundError(f"version {target} is not a valid version", table=self.table)
        if listing.commits and min(listing.commits) > 0 and not listing.complete_checkpoints(target):
            listing = self.list_log(0)  # the hint's region has no route to the target: look at the whole log
        unusable: dict[CheckpointRef, DeltaTailError] = {}
        try:
            return self._build(listing, target, unusable)
        except (IncompleteCheckpointError, VersionGapError):
            # The listing began at the hint's checkpoint: when no route from there works (the checkpoint is
            # damaged), an older checkpoint or commit 0 may still reach the target.
            full = self.list_log(0)
            if _files_of(full) == _files_of(listing):
                raise
            return self._build(full, target, unusable)

    def _build(self, listing: LogListing, target: int, unusable: dict[CheckpointRef, DeltaTailError]) -> Snapshot:
        """The snapshot at ``target`` from the newest usable route; checkpoints found unreadable join ``unusable``."""
        errors: list[DeltaTailError] = []
        for ref in listing.complete_checkpoints(at_most=target):
            if ref in unusable:
                continue
            try:
                plan = self._replay_plan(listing, ref.version + 1, target)
            except VersionGapError as e:
                errors.append(e)
                continue
            try:
                base = load_checkpoint(
                    self.storage, self.log_dir, list(ref.names), ref.fmt, table=self.table, version=ref.version
                )
            except IncompleteCheckpointError as e:
                log.warning("%s; trying an older checkpoint", e)
                errors.append(e)
                unusable[ref] = e
                continue
            return self._replay(base, plan)
        if 0 in listing.commits or any(c.first_version == 0 for c in listing.compactions):
            plan = self._replay_plan(listing, 0, target)
            return self._replay(Snapshot.empty(self.table), plan)
        errors += [e for e in unusable.values() if e not in errors]
        if errors:
            raise errors[0]
        earliest = min(listing.commits) if listing.commits else None
        raise VersionNotFoundError(
            f"cannot build version {target}: the log starts at version {earliest} and holds no usable "
            "checkpoint at or below it (the log was cleaned up)",
            table=self.table,
            version=target,
        )

    def _replay(self, base: Snapshot, plan: list[LogFile]) -> Snapshot:
        snap = base
        for f in plan:
            if f.kind is LogFileKind.COMPACTION:
                snap, _ = self._apply(snap, self._read_compaction(f), f.first_version)
            else:
                snap, _ = self._apply(snap, self.read_commit(f.version), None)
        snap.require_valid()
        return snap

    def _apply(self, snap: Snapshot, commit: Commit, first: int | None) -> tuple[Snapshot, AppliedCommit]:
        try:
            return snap.apply(commit, first_version=first)
        except DeltaTailError as e:
            raise e.at(table=self.table, file=self.commit_path(commit.version)) from None

    # -- following -----------------------------------------------------------------------------

    def probe(self, version: int) -> FileInfo | None:
        """Commit ``version``'s file (size, modification time) if it exists now: one request.

        On an object store the request is a GET whose bytes the commit's read takes
        (:meth:`~tailer.storage.base.Storage.stat_keeping`): a found commit costs no second request.

        Raises:
            StorageError: if the store cannot be reached.
        """
        try:
            return self.storage.stat_keeping(self.commit_path(version))
        except MissingFileError:
            return None

    def new_commits(self, after: int, *, check_gaps: bool = True) -> list[int]:
        """Versions of the contiguous commits after ``after`` that exist now.

        See :meth:`discover_commits`, which also returns each commit file's listing entry.

        Raises:
            VersionGapError: if ``check_gaps`` and a later commit exists while ``after + 1`` does not
                (a gap, or the log was cleaned up past ``after``).
        """
        return [v for v, _ in self.discover_commits(after, check_gaps=check_gaps)]

    def discover_commits(
        self, after: int, *, check_gaps: bool = True, limit: int | None = None, by_listing: bool = False
    ) -> list[tuple[int, FileInfo]]:
        """The contiguous commits after ``after`` that exist now, with their files' size and modification time.

        The next commits are found by name (``<after+1>.json``, ``<after+2>.json``,
        ...), which costs one request per new commit however large ``_delta_log`` is.
        On an object store, once :data:`BACKLOG_BY_NAME` commits are found that way
        the rest of a backlog is listed instead (from the next version on, never the
        whole log): a page of up to 1,000 commits per request.
        Only when there is no next commit, and ``check_gaps`` is set, is the log
        listed (starting after ``after``) to tell "nothing new" from a gap. At most
        ``limit`` commits are returned. With ``by_listing`` the log is listed from
        ``after + 1`` at once, instead of probing: one request for any number of new
        commits, or for none (what a follower does on a store right after it found some).

        Raises:
            VersionGapError: if ``check_gaps`` and a later commit exists while ``after + 1`` does not
                (a gap, or the log was cleaned up past ``after``).
        """
        found: list[tuple[int, FileInfo]] = []
        v = after + 1
        if by_listing:
            listing = self.list_log(v)
            while (limit is None or len(found) < limit) and v in listing.commits:
                found.append((v, listing.commits[v]))
                v += 1
            if not found and check_gaps and listing.commits and min(listing.commits) > after + 1:
                raise self.gap_error(after, min(listing.commits))
            return found
        while (limit is None or len(found) < limit) and (info := self.probe(v)) is not None:
            found.append((v, info))
            v += 1
            if self.storage.remote and len(found) == BACKLOG_BY_NAME and (limit is None or limit > len(found)):
                # A backlog on an object store: one listing request returns a page of commits,
                # where probing costs a request per commit.
                listing = self.list_log(v)
                while (limit is None or len(found) < limit) and v in listing.commits:
                    found.append((v, listing.commits[v]))
                    v += 1
                return found
        if found or not check_gaps:
            return found
        listing = self.list_log(after + 1)
        if listing.commits and min(listing.commits) > after + 1:
            raise self.gap_error(after, min(listing.commits))
        return found

    def gap_error(self, after: int, later: int) -> VersionGapError:
        """The error of a log where commit ``after + 1`` is missing while commit ``later`` exists."""
        return VersionGapError(
            f"commit {after + 1} is missing while commit {later} exists: "
            "the log has a gap or was cleaned up past this position",
            table=self.table,
            version=after + 1,
            file=self.commit_path(after + 1),
        )

    def update(self, snap: Snapshot) -> tuple[Snapshot, list[AppliedCommit]]:
        """Apply every new contiguous commit after ``snap.version``; cost is proportional to the new commits.

        Raises:
            VersionGapError: as :meth:`new_commits`.
            InvalidLogError: if a new commit is malformed.
            UnsupportedFeatureError: if a new commit needs unsupported reader features.
        """
        applied: list[AppliedCommit] = []
        for v in self.new_commits(snap.version):
            snap, a = self._apply(snap, self.read_commit(v), None)
            applied.append(a)
        return snap, applied

    def commits(self, first: int, last: int) -> Iterator[Commit]:
        """Read commits ``first..last`` in order.

        Raises:
            VersionGapError: if one of them is missing.
            InvalidLogError: if one is malformed.
        """
        for v in range(first, last + 1):
            try:
                yield self.read_commit(v)
            except MissingFileError as e:
                raise VersionGapError(
                    f"commit {v} is missing from the log", table=self.table, version=v, file=e.file
                ) from e


def _files_of(listing: LogListing) -> tuple[frozenset[int], frozenset[str], frozenset[str]]:
    """What a listing holds: commit versions, compaction and checkpoint file names."""
    return (
        frozenset(listing.commits),
        frozenset(c.name for c in listing.compactions),
        frozenset(f.name for files in listing.checkpoints.values() for f in files),
    )


def _latest(listing: LogListing) -> int | None:
    candidates = list(listing.commits) + list(listing.checkpoints) + [c.version for c in listing.compactions]
    return max(candidates) if candidates else None


__all__ = ["CheckpointRef", "DeltaLog", "LogListing"]
