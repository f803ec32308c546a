"""``deltatail audit`` on an Iceberg table: one event per snapshot of ``main`` (:mod:`state.iceberg.audit`).

:class:`IcebergAuditFeed` reads the newest metadata file, walks the ``main`` ancestry of the range,
and builds each snapshot's event from its summary, its parent's, the two schemas, and the settings
(properties, default partition spec) of the metadata files that made the parent and the snapshot
current. Those come from the metadata log (``metadata-log``: at most :data:`MAX_METADATA_FILES` of
its newest entries are read, each once); an entry whose file is gone leaves the settings of the
snapshots it made current unknown (no property or spec change is reported for them).

``counted=True`` counts each snapshot's change rows (as ``deltatail changes`` reads them) instead of
the summary's figures. Following (``audit --follow``): :mod:`tailer.iceberg.audit_follow`.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Iterator
from typing import Any

from deltatail.state.audit import AuditEvent
from deltatail.state.errors import DeltaTailError, MissingFileError, VersionGapError
from deltatail.state.iceberg.ancestry import Ancestry
from deltatail.state.iceberg.audit import Column, Settings, SnapshotFacts, build_iceberg_event, schema_diff
from deltatail.state.iceberg.model import SnapshotInfo, TableState
from deltatail.state.schema_diff import SchemaDiff
from deltatail.tailer.iceberg.feed import IcebergFeed
from deltatail.tailer.iceberg.follow import iceberg_table_id

log = logging.getLogger("deltatail.audit")

#: The most metadata-log entries read for property and partition-spec changes (the newest ones).
MAX_METADATA_FILES = 1000


def columns(schema: Any) -> dict[int, Column]:
    """A pyiceberg schema's fields (nested ones too) by field id."""
    from pyiceberg.schema import index_name_by_id

    out = {}
    for field_id, path in index_name_by_id(schema).items():
        f = schema.find_field(field_id)
        out[field_id] = Column(path, str(f.field_type), bool(f.required))
    return out


def settings(md: Any) -> Settings:
    """The properties and default partition spec a pyiceberg metadata object holds."""
    spec = md.spec()
    fields = ", ".join(f"{f.name}={f.transform}(field {f.source_id})" for f in spec.fields)
    return Settings(dict(md.properties), f"[{fields}]")


def _head(md: Any) -> int | None:
    main = md.refs.get("main")
    head = main.snapshot_id if main is not None else md.current_snapshot_id
    return None if head is None else int(head)


class IcebergAuditFeed:
    """Audit events of an Iceberg table for a range of versions (the interface of :class:`tailer.audit.feed.AuditFeed`).

    Args:
        feed: the table's change feed (its metadata reader, and the rows ``counted`` counts).
    """

    def __init__(self, feed: IcebergFeed) -> None:
        self.feed = feed
        self.table = feed.table
        self._settings: dict[str, tuple[int | None, Settings] | None] = {}
        self._made: tuple[str, dict[int | None, Settings]] | None = None

    def latest_version(self) -> int:
        """The newest version of ``main`` (0 before the first snapshot)."""
        return self.feed.current()[1].latest

    def table_id(self) -> str:
        """:func:`~tailer.iceberg.follow.iceberg_table_id` of the table's uuid."""
        return iceberg_table_id(self.feed.current()[0].table_uuid)

    def events(
        self,
        starting_version: int | None = None,
        ending_version: int | None = None,
        *,
        starting_timestamp_ms: int | None = None,
        counted: bool = False,
        track_table_rows: bool = False,
    ) -> Iterator[AuditEvent]:
        """One event per snapshot of ``main`` in the range, in order (``track_table_rows``: always from the summaries).

        Raises:
            TableNotFoundError: if there is no Iceberg table.
            VersionNotFoundError: if the range starts after the newest version.
            ConfigError: if ``ending_version`` is before the starting version.
            InvalidLogError: if a summary count is not a number, or metadata does not parse.
            MissingFileError, VersionGapError: with ``counted``, as :meth:`IcebergFeed.plan_table`.
        """
        state, ancestry, where = self.feed.current()
        first, last = self.feed.range_indexes(
            ancestry, starting_version, ending_version, starting_timestamp_ms=starting_timestamp_ms
        )
        for index in range(first, last):
            yield self.event(state, ancestry, index, where, counted=counted)

    def event(self, state: TableState, ancestry: Ancestry, index: int, where: str, *, counted: bool) -> AuditEvent:
        """The event of the snapshot at ``index`` of ``ancestry``, as the metadata file at ``where`` tells it.

        Raises:
            InvalidLogError: if a summary count is not a number, or metadata does not parse.
            MissingFileError, VersionGapError: with ``counted``, as :meth:`IcebergFeed.plan_table`.
        """
        snap, version = ancestry.snapshots[index], ancestry.versions[index]
        parent = ancestry.snapshots[index - 1] if index else None
        is_first = index == 0 and ancestry.complete
        made_current = self._made_current(where)
        facts = SnapshotFacts(
            table=self.table,
            table_id=iceberg_table_id(state.table_uuid),
            version=version,
            parent=parent,
            first=is_first,
            schema_change=self._schema_change(parent, snap, where),
            before=made_current.get(None if is_first else (parent.snapshot_id if parent else -1)),
            after=made_current.get(snap.snapshot_id),
        )
        try:
            event = build_iceberg_event(snap, facts)
            if counted:
                event = event.with_counted(self._count(state, ancestry, index, where))
        except DeltaTailError as e:
            raise e.at(table=self.table, version=version) from None
        return event

    def _schema_change(self, parent: SnapshotInfo | None, snap: SnapshotInfo, where: str) -> SchemaDiff | None:
        if parent is None or parent.schema_id == snap.schema_id:
            return None
        old = self.feed.iceberg.schema(parent, where)
        new = self.feed.iceberg.schema(snap, where)
        return schema_diff(columns(old), columns(new))

    def _count(self, state: Any, ancestry: Ancestry, index: int, where: str) -> Counter[str]:
        if index == 0 and not ancestry.complete:
            raise VersionGapError(
                f"snapshot {ancestry.snapshots[0].snapshot_id}'s parent was expired: its rows cannot be counted",
                version=ancestry.versions[0],
            )
        plan = self.feed.plan(state, ancestry, index, where)
        rows = self.feed.plan_table(plan)
        return Counter(str(v) for v in rows.column("_change_type").to_pylist())

    def _made_current(self, where: str) -> dict[int | None, Settings]:
        """The settings of the metadata file that first made each snapshot ``main``'s head (``None``: no head yet).

        Kept per newest metadata file; each metadata file of the log is read once while it stays in the window.
        """
        if self._made is not None and self._made[0] == where:
            return self._made[1]
        newest = self.feed.iceberg.document(where)
        entries = [e.metadata_file for e in newest.metadata_log][-MAX_METADATA_FILES:]
        read: dict[str, tuple[int | None, Settings] | None] = {}
        out: dict[int | None, Settings] = {}
        for location in [*entries, where]:
            found = self._read_settings(location, newest if location == where else None)
            read[location] = found
            if found is not None:
                out.setdefault(found[0], found[1])
        self._settings = read  # only the window's files are kept
        self._made = (where, out)
        return out

    def _read_settings(self, location: str, md: Any) -> tuple[int | None, Settings] | None:
        """``main``'s head and the settings of the metadata file at ``location`` (``None``: the file is gone)."""
        if location in self._settings:
            return self._settings[location]
        if md is None:
            try:
                md = self.feed.iceberg.document(self.feed.iceberg.resolve(location))
            except MissingFileError:
                log.info("%s: metadata file %s is gone: the settings it made are unknown", self.table, location)
                return None
        return _head(md), settings(md)
