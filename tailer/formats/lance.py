"""Lance datasets as a :class:`~tailer.formats.base.TableFormat` (:mod:`tailer.lance`, :mod:`state.lance`).

A location is a Lance dataset when it is written ``lance://PATH`` (``lance:///data/ds``,
``lance://s3://bucket/ds``), when the format is given as ``lance``, or, without either, when its
layout says so: a ``_versions/`` directory holding manifests
(:func:`~tailer.lance.dataset.looks_like_lance`). Net changes and their key, and a byte limit per
Spark micro-batch, apply to Delta tables, not to Lance datasets.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from deltatail.state.errors import ConfigError
from deltatail.state.feed import TableInfo
from deltatail.state.lance.manifest import Manifest
from deltatail.tailer.audit.alerts import AlertNotifier
from deltatail.tailer.audit.feed import AuditSource
from deltatail.tailer.audit.log import AuditOutput
from deltatail.tailer.follow.audit import AuditFollowConfig, AuditLoop
from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.follow.tailer import TailerConfig, table_name
from deltatail.tailer.formats.base import (
    DATA_LOSS,
    KEY,
    MAX_BYTES,
    NET_CHANGES,
    SIGNALS,
    SPLIT,
    ChangeRequest,
    ChangeRun,
    starting_version,
)
from deltatail.tailer.lance.dataset import LanceDataset, is_lance_dataset, looks_like_lance
from deltatail.tailer.lance.feed import LanceFeed, LanceOptions
from deltatail.tailer.lance.follow import LanceTailer, lance_state_id, lance_table_id
from deltatail.tailer.read.feed import ChangeOptions
from deltatail.tailer.sink import Sink
from deltatail.tailer.storage import Storage
from deltatail.tailer.table import TableRef

#: The settings Lance datasets refuse.
REFUSED = (NET_CHANGES, KEY, MAX_BYTES, DATA_LOSS, SIGNALS, SPLIT)


def lance_options(options: ChangeOptions) -> LanceOptions:
    """The Lance feed's options from the neutral change options (net changes and reader settings do not apply)."""
    return LanceOptions(options.allow_non_additive, options.batch_size, options.filter, options.external_roots)


def snapshot_document(manifest: Manifest, table: str) -> dict[str, Any]:
    """A Lance version as the JSON document ``deltatail snapshot --json`` prints.

    Fields: ``format`` (``lance``), ``table``, ``version``, ``timestamp`` (ISO-8601 UTC),
    ``readerFeatureFlags``, ``stableRowIds``, ``schema`` (each field's ``id``, ``parentId``, ``name``,
    ``type`` and ``nullable``), ``config``, ``liveRows`` and ``fragments`` (``id``, ``physicalRows``,
    ``deletedRows``, ``deletionFile``, ``dataFiles``), in fragment-id order.
    """
    stamp = datetime.fromtimestamp(manifest.timestamp_us / 1e6, UTC).isoformat().replace("+00:00", "Z")
    return {
        "format": "lance",
        "table": table,
        "version": manifest.version,
        "timestamp": stamp,
        "readerFeatureFlags": manifest.reader_flags,
        "stableRowIds": manifest.stable_row_ids,
        "schema": [
            {"id": f.id, "parentId": f.parent_id, "name": f.name, "type": f.logical_type, "nullable": f.nullable}
            for f in manifest.fields
        ],
        "config": dict(sorted(manifest.config.items())),
        "liveRows": manifest.live_rows,
        "fragments": [
            {
                "id": f.id,
                "physicalRows": f.physical_rows,
                "deletedRows": 0 if f.deletion is None else f.deletion.num_deleted_rows,
                "deletionFile": None if f.deletion is None else f.deletion.path,
                "dataFiles": [{"path": d.path, "fields": list(d.fields)} for d in f.files],
            }
            for f in sorted(manifest.fragments, key=lambda f: f.id)
        ],
    }


def snapshot_text(doc: dict[str, Any]) -> str:
    """A human-readable rendering of :func:`snapshot_document`."""
    lines = [
        f"table    {doc['table']} (Lance)",
        f"version  {doc['version']}  ({doc['timestamp']})",
        f"features reader flags {doc['readerFeatureFlags']}  stable row ids {'yes' if doc['stableRowIds'] else 'no'}",
        "schema",
    ]
    for f in doc["schema"]:
        null = "" if f["nullable"] else " not null"
        parent = "" if f["parentId"] < 0 else f"  (in field {f['parentId']})"
        lines.append(f"  {f['name']}: {f['type']}{null}  [field {f['id']}]{parent}")
    for key, value in doc["config"].items():
        lines.append(f"  {key} = {value}")
    lines.append(f"fragments {len(doc['fragments'])} ({doc['liveRows']} live rows)")
    for f in doc["fragments"]:
        deleted = "" if f["deletionFile"] is None else f"  {f['deletedRows']} deleted ({f['deletionFile']})"
        files = ", ".join(d["path"] for d in f["dataFiles"])
        lines.append(f"  fragment {f['id']}: {f['physicalRows']} rows{deleted}  data {files}")
    return "\n".join(lines)


@dataclass(frozen=True, slots=True)
class FollowedLance:
    """A Lance dataset opened for following (:class:`~tailer.formats.base.FollowedTable`)."""

    feed: LanceFeed

    @property
    def table_id(self) -> str:
        """:func:`~tailer.lance.follow.lance_state_id` of the dataset."""
        return lance_state_id(self.feed.table)

    @property
    def root(self) -> str:
        """The dataset root."""
        return self.feed.table

    @property
    def watch_dir(self) -> str:
        """``_versions/``."""
        return self.feed.dataset.versions_dir

    @property
    def remote(self) -> bool:
        """Whether the dataset is on an object store."""
        return self.feed.storage.remote

    def check(self) -> None:
        """The latest manifest is found and the filter's columns are in its schema."""
        self.feed.dataset.latest_version()
        self.feed.check_filter()

    def tailer(
        self, config: TailerConfig, sink: Sink, stats: TableStats | None = None, *, status_file: bool = True
    ) -> LanceTailer:
        """A new :class:`~tailer.lance.follow.LanceTailer` on this feed (``stats`` learns the table id now)."""
        if stats is not None:
            stats.table_id = self.table_id
        return LanceTailer(config, sink, feed=self.feed, stats=stats, status_file=status_file)


class LanceFormat:
    """Lance datasets (``_versions/`` manifests)."""

    name = "lance"
    uri_prefix: str | None = "lance://"
    noun = "Lance dataset"

    def detect(self, storage: Storage, uri: str) -> bool:
        """:func:`~tailer.lance.dataset.looks_like_lance` (one listing of ``_versions/``)."""
        return looks_like_lance(uri, storage)

    def claims(self, directory: str) -> bool:
        """:func:`~tailer.lance.dataset.is_lance_dataset` (a manifest in ``_versions/``, and no ``_delta_log``)."""
        return is_lance_dataset(directory)

    def refused(self, asked: Sequence[str]) -> tuple[str, ...]:
        """Net changes, their key, a byte limit per micro-batch, going on past lost data, signals (:data:`REFUSED`)."""
        return tuple(a for a in asked if a in REFUSED)

    def start_of(self, table: TableRef, value: object) -> int | None:
        """:func:`~tailer.formats.base.starting_version`, ``latest`` being the dataset's latest version."""
        return starting_version(value, self._dataset(table).latest_version)

    def snapshot_document(self, table: TableRef, version: int | None) -> dict[str, Any]:
        """:func:`snapshot_document` of the manifest of ``version``."""
        dataset = self._dataset(table)
        chosen = dataset.latest_version() if version is None else version
        return snapshot_document(dataset.manifest(chosen), dataset.root)

    def snapshot_text(self, table: TableRef, version: int | None) -> str:
        """:func:`snapshot_text` of :meth:`snapshot_document`."""
        return snapshot_text(self.snapshot_document(table, version))

    def change_batches(self, table: TableRef, request: ChangeRequest) -> ChangeRun:
        """The rows of :meth:`~tailer.lance.feed.LanceFeed.batches` for the request."""
        feed = self._feed(table, request.options)
        starting = feed.dataset.latest_version() if request.latest else request.starting_version
        batches = feed.batches(
            starting,
            request.ending_version,
            starting_timestamp_ms=request.starting_timestamp_ms,
            initial_snapshot=request.initial_snapshot,
        )
        return ChangeRun(
            batches,
            lambda: TableInfo(feed.table, lance_table_id(feed.table), table_name(feed.table)),
            lambda: feed.options.filter.output_schema(feed.rows.schema(feed.dataset.latest_version())),
        )

    def follow(self, table: TableRef, options: ChangeOptions) -> FollowedLance:
        """A :class:`FollowedLance` on a new Lance feed."""
        return FollowedLance(self._feed(table, options))

    def audit_feed(self, table: TableRef) -> AuditSource:
        """Lance datasets have no audit events.

        Raises:
            ConfigError: always.
        """
        raise ConfigError("deltatail audit reads Delta tables' logs, not Lance datasets", table=table.uri)

    def audit_follower(
        self,
        table: TableRef,
        config: AuditFollowConfig,
        outputs: Sequence[AuditOutput],
        notifier: AlertNotifier | None,
    ) -> AuditLoop:
        """Lance datasets have no audit events.

        Raises:
            ConfigError: always.
        """
        raise ConfigError("deltatail audit reads Delta tables' logs, not Lance datasets", table=table.uri)

    @staticmethod
    def _dataset(table: TableRef) -> LanceDataset:
        return LanceDataset(table.uri, table.storage, external_roots=table.external_roots)

    @staticmethod
    def _feed(table: TableRef, options: ChangeOptions) -> LanceFeed:
        return LanceFeed(table.uri, table.storage, lance_options(options), storage_options=table.storage_options)


#: The Lance format.
LANCE = LanceFormat()
