"""Apache Iceberg tables as a :class:`~tailer.formats.base.TableFormat` (:mod:`tailer.iceberg`, :mod:`state.iceberg`).

A location is an Iceberg table when it is written ``iceberg://LOCATION`` (a metadata file, a table
directory, or ``catalog:NAME/NAMESPACE.TABLE``: :mod:`tailer.iceberg.catalog`), when the format is
given as ``iceberg``, or, without either, when it is a ``*.metadata.json`` file or a directory whose
``metadata/`` holds one and that has no ``_delta_log`` (a Delta table with UniForm's Iceberg metadata
stays a Delta table unless ``iceberg`` is asked for).

Rows always net copy-on-write rewrites (``--net-changes`` is how Iceberg snapshots are read; ``--key``
pairs updates where the table has no identifier fields). A byte limit per Spark micro-batch does not apply.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from deltatail.state.errors import ConfigError, MissingFileError, VersionNotFoundError
from deltatail.state.feed import TableInfo
from deltatail.state.iceberg.model import ContentFile
from deltatail.tailer.audit.alerts import AlertNotifier
from deltatail.tailer.audit.feed import AuditSource
from deltatail.tailer.audit.log import AuditOutput
from deltatail.tailer.follow.audit import AuditFollowConfig
from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.follow.tailer import TailerConfig, table_name
from deltatail.tailer.formats.base import DATA_LOSS, MAX_BYTES, SIGNALS, SPLIT, ChangeRequest, ChangeRun
from deltatail.tailer.iceberg.audit import IcebergAuditFeed
from deltatail.tailer.iceberg.audit_follow import IcebergAuditFollower
from deltatail.tailer.iceberg.catalog import catalog_pointer, parse_catalog_name
from deltatail.tailer.iceberg.feed import IcebergFeed, IcebergOptions
from deltatail.tailer.iceberg.follow import IcebergTailer, iceberg_table_id
from deltatail.tailer.iceberg.metadata import METADATA_DIR, join, looks_like_iceberg, metadata_number
from deltatail.tailer.read.feed import ChangeOptions
from deltatail.tailer.sink import Sink
from deltatail.tailer.storage import Storage
from deltatail.tailer.table import TableRef, table_storage

#: The settings Iceberg tables refuse.
REFUSED = (MAX_BYTES, DATA_LOSS, SIGNALS, SPLIT)
#: ``snapshot``'s names of a file's content (the spec's ``content`` field: 0, 1, 2).
_KINDS = {0: "data", 1: "position deletes", 2: "equality deletes"}


def iceberg_options(options: ChangeOptions) -> IcebergOptions:
    """The Iceberg feed's options from the neutral change options (``key_columns`` pairs updates)."""
    return IcebergOptions(
        options.allow_non_additive, options.batch_size, options.filter, options.external_roots, options.key_columns
    )


def open_feed(table: TableRef, options: ChangeOptions) -> IcebergFeed:
    """The feed of ``table``: through its catalog for ``catalog:`` locations, else by its metadata."""
    named = parse_catalog_name(table.uri)
    if named is None:
        return IcebergFeed(table.uri, table.storage, iceberg_options(options))
    pointer = catalog_pointer(*named)
    location = pointer()
    storage = table_storage(location, dict(table.storage_options) or None)
    return IcebergFeed(location.rsplit("/", 2)[0], storage, iceberg_options(options), pointer=pointer)


def _stamp(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).isoformat().replace("+00:00", "Z")


def snapshot_document(feed: IcebergFeed, version: int | None) -> dict[str, Any]:
    """The table at ``version`` (default the newest) as ``deltatail snapshot --json`` prints it.

    Fields: ``format`` (``iceberg``), ``table``, ``tableUuid``, ``formatVersion``, ``metadataFile``,
    ``version``, ``snapshotId``, ``timestamp`` (ISO-8601 UTC), ``operation``, ``summary``, ``schema``
    (each field's ``id``, ``name``, ``type`` and ``required``), ``identifierFields`` and ``files`` (``path``,
    ``content`` (``data``, ``position deletes``, ``deletion vector``, ``equality deletes``), ``records``, ``size``,
    ``sequenceNumber``, ``specId``), by path. A table with no snapshot has ``version`` 0 and no files.

    Raises:
        VersionNotFoundError: if no snapshot of ``main`` has that version.
    """
    state, ancestry, where = feed.current()
    doc: dict[str, Any] = {
        "format": "iceberg",
        "table": feed.table,
        "tableUuid": state.table_uuid,
        "formatVersion": state.format_version,
        "metadataFile": where,
    }
    if version is None and not ancestry.versions:
        return {**doc, "version": 0, "snapshotId": None, "files": [], "schema": _schema(feed, None)}
    index = len(ancestry.versions) - 1 if version is None else ancestry.index_of_version(version)
    if index >= len(ancestry.versions) or (ancestry.versions[index] != version and version is not None):
        raise VersionNotFoundError(
            f"no snapshot of the main branch has version {version} (the newest is {ancestry.latest})",
            table=feed.table,
            version=version,
        )
    snap, v = ancestry.snapshots[index], ancestry.versions[index]
    files = sorted(feed.iceberg.live_files(snap, v), key=lambda f: f.path)
    schema = feed.iceberg.schema(snap)
    return {
        **doc,
        "version": v,
        "snapshotId": snap.snapshot_id,
        "timestamp": _stamp(snap.timestamp_ms),
        "operation": snap.operation,
        "summary": dict(snap.summary),
        "schema": _schema(feed, snap),
        "identifierFields": [schema.find_column_name(i) for i in schema.identifier_field_ids],
        "files": [
            {
                "path": f.path,
                "content": content_label(f),
                "records": f.record_count,
                "size": f.size,
                "sequenceNumber": f.data_sequence,
                "specId": f.spec_id,
            }
            for f in files
        ],
    }


def content_label(f: ContentFile) -> str:
    """What a live file holds, as ``snapshot`` shows it: a v3 deletion vector is named as one, not as position deletes.

    The spec: "Deletion vectors [...] are stored in Puffin files" as ``position delete`` content (1).
    """
    if f.is_deletion_vector:
        return "deletion vector"
    return _KINDS.get(f.content, str(f.content))


def _schema(feed: IcebergFeed, snap: Any) -> list[dict[str, Any]]:
    return [
        {"id": f.field_id, "name": f.name, "type": str(f.field_type), "required": f.required}
        for f in feed.iceberg.schema(snap).fields
    ]


def snapshot_text(doc: dict[str, Any]) -> str:
    """A human-readable rendering of :func:`snapshot_document`."""
    lines = [
        f"table    {doc['table']} (Iceberg v{doc['formatVersion']}, uuid {doc['tableUuid']})",
        f"metadata {doc['metadataFile']}",
        f"version  {doc['version']}  snapshot {doc['snapshotId']}  "
        f"({doc.get('timestamp', '-')}, {doc.get('operation')})",
        "schema",
    ]
    for f in doc["schema"]:
        lines.append(f"  {f['name']}: {f['type']}{' not null' if f['required'] else ''}  [field {f['id']}]")
    lines.append(f"files {len(doc['files'])}")
    for f in doc["files"]:
        lines.append(
            f"  {f['content']}: {f['path']}  {f['records']} records, {f['size']} bytes, seq {f['sequenceNumber']}"
        )
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class FollowedIceberg:
    """An Iceberg table opened for following (:class:`~tailer.formats.base.FollowedTable`)."""

    feed: IcebergFeed

    @property
    def table_id(self) -> str:
        """:func:`~tailer.iceberg.follow.iceberg_table_id` of the table's uuid (reads the newest metadata)."""
        return iceberg_table_id(self.feed.current()[0].table_uuid)

    @property
    def root(self) -> str:
        """The table's directory."""
        return self.feed.table

    @property
    def watch_dir(self) -> str:
        """``metadata/``."""
        return self.feed.iceberg.metadata_dir

    @property
    def remote(self) -> bool:
        """Whether the table is on an object store."""
        return self.feed.storage.remote

    def check(self) -> None:
        """The newest metadata is read, and the filter's columns are in its schema."""
        self.feed.current()
        self.feed.check_filter()

    def tailer(
        self, config: TailerConfig, sink: Sink, stats: TableStats | None = None, *, status_file: bool = True
    ) -> IcebergTailer:
        """A new :class:`~tailer.iceberg.follow.IcebergTailer` on this feed (``stats`` learns the table id now)."""
        tailer = IcebergTailer(config, sink, feed=self.feed, stats=stats, status_file=status_file)
        tailer.stats.table_id = tailer.table_id
        return tailer


def is_iceberg_table(directory: str) -> bool:
    """Whether the local ``directory`` holds an Iceberg table: ``metadata/*.metadata.json`` and no ``_delta_log``."""
    meta = os.path.join(directory, METADATA_DIR)
    if not os.path.isdir(meta) or os.path.isdir(os.path.join(directory, "_delta_log")):
        return False
    try:
        return any(metadata_number(name) is not None for name in os.listdir(meta))
    except OSError:
        return False


class IcebergFormat:
    """Apache Iceberg tables (metadata JSON, manifest lists and manifests)."""

    name = "iceberg"
    uri_prefix: str | None = "iceberg://"
    noun = "Iceberg table"

    def detect(self, storage: Storage, uri: str) -> bool:
        """A metadata file, or ``metadata/*.metadata.json`` without ``_delta_log`` (one or two listings)."""
        if not looks_like_iceberg(uri, storage):
            return False
        if uri.endswith(".metadata.json"):
            return True
        try:
            storage.list_from(join(uri, "_delta_log"))
        except MissingFileError:
            return True
        return False

    def claims(self, directory: str) -> bool:
        """:func:`is_iceberg_table`."""
        return is_iceberg_table(directory)

    def refused(self, asked: Sequence[str]) -> tuple[str, ...]:
        """A byte limit per batch, going on past lost data (an expired snapshot stops), signals (:data:`REFUSED`)."""
        return tuple(a for a in asked if a in REFUSED)

    def start_of(self, table: TableRef, value: object) -> int | None:
        """``None``, a number, or ``latest`` (the versions after the newest now).

        Raises:
            ConfigError: if it is none of these.
        """
        if value is None:
            return None
        if value == "latest":
            return open_feed(table, ChangeOptions()).current()[1].latest + 1
        try:
            return int(str(value))
        except ValueError:
            raise ConfigError(f"starting version must be a number or 'latest', got {value!r}") from None

    def snapshot_document(self, table: TableRef, version: int | None) -> dict[str, Any]:
        """:func:`snapshot_document` of the snapshot at ``version``."""
        return snapshot_document(open_feed(table, ChangeOptions()), version)

    def snapshot_text(self, table: TableRef, version: int | None) -> str:
        """:func:`snapshot_text` of :meth:`snapshot_document`."""
        return snapshot_text(self.snapshot_document(table, version))

    def change_batches(self, table: TableRef, request: ChangeRequest) -> ChangeRun:
        """The rows of :meth:`~tailer.iceberg.feed.IcebergFeed.batches` for the request."""
        feed = open_feed(table, request.options)
        feed.check_filter()
        starting = feed.current()[1].latest if request.latest else request.starting_version
        batches = feed.batches(
            starting,
            request.ending_version,
            starting_timestamp_ms=request.starting_timestamp_ms,
            initial_snapshot=request.initial_snapshot,
        )
        return ChangeRun(
            batches,
            lambda: TableInfo(feed.table, iceberg_table_id(feed.current()[0].table_uuid), table_name(feed.table)),
            lambda: feed.options.filter.output_schema(feed.change_schema(None)),
        )

    def follow(self, table: TableRef, options: ChangeOptions) -> FollowedIceberg:
        """A :class:`FollowedIceberg` on a new feed."""
        return FollowedIceberg(open_feed(table, options))

    def audit_feed(self, table: TableRef) -> AuditSource:
        """An :class:`~tailer.iceberg.audit.IcebergAuditFeed`: one event per snapshot of ``main``."""
        return IcebergAuditFeed(open_feed(table, ChangeOptions(allow_non_additive=True)))

    def audit_follower(
        self,
        table: TableRef,
        config: AuditFollowConfig,
        outputs: Sequence[AuditOutput],
        notifier: AlertNotifier | None,
    ) -> IcebergAuditFollower:
        """An :class:`~tailer.iceberg.audit_follow.IcebergAuditFollower`: one event per new snapshot of ``main``."""
        feed = open_feed(table, ChangeOptions(allow_non_additive=True, external_roots=config.external_roots))
        return IcebergAuditFollower(config, outputs, feed=feed, notifier=notifier)


#: The Iceberg format.
ICEBERG = IcebergFormat()
