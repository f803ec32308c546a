"""The incremental snapshot state machine.

Protocol, "Action Reconciliation" — a snapshot is: a single ``protocol``
("the latest protocol action seen wins"), a single ``metaData`` ("the latest
metaData action seen wins"), a map from ``appId`` to transaction version ("the
latest version seen for a given appId wins"), the live ``add`` files and the
``remove`` tombstones, keyed by ``(path, deletionVector.uniqueId)`` ("keep only
the newest reference for each logical file"). The newer revision adds domain
metadata: the latest ``domainMetadata`` per domain wins, and ``removed: true``
makes it a tombstone that hides the domain.

How :meth:`Snapshot.apply` moves from version ``v`` to ``v + 1``:

=====================  ============================================================
commit holds           effect on the new snapshot
=====================  ============================================================
``protocol``           replaces the protocol, after the reader-feature gate passes
``metaData``           replaces the metadata; the schema is parsed again on next use
``txn``                sets ``txns[appId]`` to its version
``domainMetadata``     sets the domain, or drops it when ``removed``
``remove``             drops the live file with the same key; records the tombstone
``add``                drops the tombstone with the same key; records the live file
=====================  ============================================================

Within one commit, removes are applied before adds, so a commit that removes
``(p, dv1)`` and adds ``(p, dv2)`` (a DV update) leaves ``(p, dv2)`` live.

The cost of ``apply`` is proportional to the commit, not the table: the file
tables are *moved* into the new snapshot, not copied. The old snapshot keeps
its version, protocol, metadata, txns and domains, but its file views raise
:class:`~state.errors.StateError` afterwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from typing import Final

from deltatail.state.actions import Add, DomainMetadata, Metadata, Protocol, Remove
from deltatail.state.commit import Commit
from deltatail.state.errors import InvalidLogError, StateError, VersionGapError
from deltatail.state.features import check_reader_support
from deltatail.state.files import FileEntry, FileKey, FileTable, PartitionValuesPool
from deltatail.state.schema import StructType


@dataclass(slots=True, unsafe_hash=True)
class AppliedCommit:
    """What :meth:`Snapshot.apply` did: the commit and the file actions it applied."""

    commit: Final[Commit]
    removes: Final[tuple[Remove, ...]]
    adds: Final[tuple[Add, ...]]
    protocol_changed: Final[bool]
    metadata_changed: Final[bool]


class Snapshot:
    """The reconciled state of a table at one version.

    Build one with :meth:`empty` and :meth:`apply` (replay from version 0), or
    with :meth:`from_checkpoint` and then :meth:`apply` for later commits.
    """

    __slots__ = (
        "table",
        "version",
        "protocol",
        "metadata",
        "_schema",
        "txns",
        "domains",
        "last_commit_timestamp",
        "_files",
        "_tombstones",
    )

    def __init__(
        self,
        table: str,
        version: int,
        protocol: Protocol | None,
        metadata: Metadata | None,
        schema: StructType | None,
        txns: dict[str, int],
        domains: dict[str, DomainMetadata],
        files: FileTable | None,
        tombstones: FileTable | None,
        last_commit_timestamp: int | None = None,
    ) -> None:
        self.table = table
        self.version = version
        self.protocol = protocol
        self.metadata = metadata
        self._schema = schema
        self.txns = txns
        self.domains = domains
        self.last_commit_timestamp = last_commit_timestamp
        self._files = files
        self._tombstones = tombstones

    @staticmethod
    def empty(table: str) -> Snapshot:
        """The state before version 0 (version ``-1``)."""
        pool = PartitionValuesPool()
        return Snapshot(table, -1, None, None, None, {}, {}, FileTable(pool), FileTable(pool))

    @staticmethod
    def from_checkpoint(
        table: str,
        version: int,
        protocol: Protocol | None,
        metadata: Metadata | None,
        txns: dict[str, int],
        domains: dict[str, DomainMetadata],
        files: FileTable,
        tombstones: FileTable,
    ) -> Snapshot:
        """A snapshot from a checkpoint's reconciled contents.

        Raises:
            InvalidLogError: if the checkpoint lacks the protocol or the metadata.
            UnsupportedFeatureError: if the protocol needs unsupported reader features.
        """
        if protocol is None:
            raise InvalidLogError("checkpoint holds no protocol action", table=table, version=version)
        if metadata is None:
            raise InvalidLogError("checkpoint holds no metaData action", table=table, version=version)
        check_reader_support(protocol, table=table, version=version)
        return Snapshot(table, version, protocol, metadata, None, txns, domains, files, tombstones)

    # -- views ---------------------------------------------------------------------------------

    @property
    def schema(self) -> StructType:
        """The table schema, parsed once per metadata change (on first use).

        Raises:
            InvalidLogError: if there is no metadata, or its ``schemaString`` is absent or invalid.
        """
        if self._schema is None:
            if self.metadata is None:
                raise InvalidLogError("no metaData action found in the log", table=self.table, version=self.version)
            self._schema = _parse_schema(self.metadata, self.table, self.version)
        return self._schema

    @property
    def files(self) -> FileTable:
        """The live logical files.

        Raises:
            StateError: if this snapshot's files were moved on by :meth:`apply`.
        """
        if self._files is None:
            raise StateError(
                "snapshot files were handed on to the next version by apply()",
                table=self.table,
                version=self.version,
            )
        return self._files

    @property
    def handed_on(self) -> bool:
        """Whether :meth:`apply` moved this snapshot's file tables on to the next version.

        Such a snapshot still tells its version, protocol and metadata, but not its files.
        """
        return self._files is None

    @property
    def tombstones(self) -> FileTable:
        """The ``remove`` tombstones. Raises ``StateError`` like :attr:`files`."""
        if self._tombstones is None:
            raise StateError(
                "snapshot tombstones were handed on to the next version by apply()",
                table=self.table,
                version=self.version,
            )
        return self._tombstones

    def live_files(self) -> Iterator[FileEntry]:
        """Every live file, in no particular order."""
        return iter(self.files)

    def live_keys(self) -> set[FileKey]:
        """The set of live ``(path, dv_id)`` keys."""
        return set(self.files.keys())

    def require_valid(self) -> tuple[Protocol, Metadata]:
        """Check that the snapshot has a protocol and metadata; returns them.

        Raises:
            InvalidLogError: if either is missing (no commit has provided it yet).
        """
        if self.protocol is None:
            raise InvalidLogError("no protocol action found in the log", table=self.table, version=self.version)
        if self.metadata is None:
            raise InvalidLogError("no metaData action found in the log", table=self.table, version=self.version)
        return self.protocol, self.metadata

    # -- transitions ---------------------------------------------------------------------------

    def apply(self, commit: Commit, *, first_version: int | None = None) -> tuple[Snapshot, AppliedCommit]:
        """Apply commit ``self.version + 1`` and return the new snapshot.

        Args:
            commit: the next commit (or a compacted range whose last version is
                ``commit.version``; pass its first version as ``first_version``).
            first_version: the first version the commit covers; defaults to ``commit.version``.

        Returns:
            The snapshot at ``commit.version`` and the file actions applied.

        Raises:
            VersionGapError: if the commit does not follow this snapshot's version.
            InvalidLogError: if the new snapshot would have no protocol or no metaData (neither this
                commit nor an earlier one held it); this snapshot stays usable.
            UnsupportedFeatureError: if the commit's protocol needs unsupported reader features.
            StateError: if this snapshot was already applied (its files moved on).
        """
        start = commit.version if first_version is None else first_version
        if start != self.version + 1:
            raise VersionGapError(
                f"commit {start} does not follow version {self.version}", table=self.table, version=start
            )
        files, tombstones = self.files, self.tombstones
        protocol, metadata, schema = self.protocol, self.metadata, self._schema
        if commit.protocol is not None:
            check_reader_support(commit.protocol, table=self.table, version=commit.version)
            protocol = commit.protocol
        if commit.metadata is not None:
            metadata = commit.metadata
            schema = None
        if protocol is None or metadata is None:
            # Protocol: "The first version of a table must contain a metaData action" (and a protocol).
            missing = "protocol" if protocol is None else "metaData"
            raise InvalidLogError(
                f"no {missing} action found in the log up to this version (the table's first version must hold one)",
                table=self.table,
                version=commit.version,
            )
        txns = self.txns
        if commit.txns:
            txns = dict(txns)
            for txn in commit.txns:
                txns[txn.app_id] = txn.version
        domains = self.domains
        if commit.domain_metadata:
            domains = dict(domains)
            for d in commit.domain_metadata:
                if d.removed:
                    domains.pop(d.domain, None)
                else:
                    domains[d.domain] = d
        for remove in commit.removes:
            files.discard(remove.path, remove.dv_id)
            tombstones.put_remove(remove)
        for add in commit.adds:
            tombstones.discard(add.path, add.dv_id)
            files.put_add(add)
        timestamp = self.last_commit_timestamp
        if commit.commit_info is not None:
            timestamp = commit.in_commit_timestamp or commit.commit_info.timestamp or timestamp
        nxt = Snapshot(
            self.table, commit.version, protocol, metadata, schema, txns, domains, files, tombstones, timestamp
        )
        self._files = None
        self._tombstones = None
        applied = AppliedCommit(
            commit=commit,
            removes=commit.removes,
            adds=commit.adds,
            protocol_changed=commit.protocol is not None,
            metadata_changed=commit.metadata is not None,
        )
        return nxt, applied

    def expire_tombstones(self, now_ms: int) -> int:
        """Drop tombstones older than the table's ``delta.deletedFileRetentionDuration`` (default one week).

        Protocol, "Add File and Remove File": "A tombstone expires when current time
        (according to the node performing the cleanup) exceeds the expiration threshold
        added to the remove action timestamp." ``now_ms`` is the caller's notion of now
        (the tailer passes the newest commit's timestamp, so this stays pure).

        Returns:
            The number of tombstones dropped.

        Raises:
            InvalidLogError: if the retention setting cannot be parsed.
        """
        config = {} if self.metadata is None else self.metadata.configuration
        retention = parse_interval_ms(config.get("delta.deletedFileRetentionDuration", "interval 1 week"))
        return self.tombstones.drop_older_than(now_ms - retention)

    def apply_all(self, commits: Iterable[Commit]) -> Snapshot:
        """Apply commits in order; returns the last snapshot (``self`` if there are none)."""
        snap = self
        for commit in commits:
            snap, _ = snap.apply(commit)
        return snap


def _parse_schema(metadata: Metadata, table: str, version: int) -> StructType:
    try:
        return metadata.schema()
    except InvalidLogError as e:
        raise e.at(table=table, version=version) from None


_UNITS_MS = {
    "millisecond": 1,
    "second": 1000,
    "minute": 60_000,
    "hour": 3_600_000,
    "day": 86_400_000,
    "week": 604_800_000,
}


def parse_interval_ms(text: str) -> int:
    """Parse a Delta interval setting such as ``interval 1 week`` or ``interval 168 hours`` into milliseconds.

    Raises:
        InvalidLogError: if the text is not ``[interval] <number> <unit>``.
    """
    words = text.strip().lower().split()
    if words and words[0] == "interval":
        words = words[1:]
    try:
        count = float(words[0])
        unit = words[1].rstrip("s")
        return int(count * _UNITS_MS[unit])
    except (IndexError, ValueError, KeyError, OverflowError) as e:
        raise InvalidLogError(f"cannot parse interval {text!r}") from e
