"""Delta Lake as a :class:`~tailer.formats.base.TableFormat`.

The log (:mod:`tailer.log`), the change feed (:mod:`tailer.read`), the tailer
(:mod:`tailer.follow`) and the audit feed (:mod:`tailer.audit`) behind the format interface.

Delta is the registry's last entry: a location no other format claims is read as a Delta table,
whose reader then names what is missing (no ``_delta_log``, no commit).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from deltatail.state.feed import TableInfo, change_schema
from deltatail.tailer.follow.signalled import SignalledTailer
from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.follow.tailer import Tailer, TailerConfig, table_name
from deltatail.tailer.formats.base import ChangeRequest, ChangeRun, starting_version
from deltatail.tailer.formats.delta_report import snapshot_document, snapshot_text
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.log.starts import table_id
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.sink import Sink
from deltatail.tailer.storage import Storage
from deltatail.tailer.table import TableRef

if TYPE_CHECKING:  # the audit command's types: its modules load with `deltatail audit` only
    from deltatail.tailer.audit.alerts import AlertNotifier
    from deltatail.tailer.audit.feed import AuditSource
    from deltatail.tailer.audit.log import AuditOutput
    from deltatail.tailer.follow.audit import AuditFollowConfig, AuditFollower


@dataclass(frozen=True, slots=True)
class FollowedDelta:
    """A Delta table opened for following (:class:`~tailer.formats.base.FollowedTable`)."""

    feed: ChangeFeed

    @property
    def table_id(self) -> str:
        """The table's id (``metaData.id``)."""
        return table_id(self.feed.log)

    @property
    def root(self) -> str:
        """The table root as the log names it."""
        return self.feed.log.table

    @property
    def watch_dir(self) -> str:
        """``_delta_log``."""
        return self.feed.log.log_dir

    @property
    def remote(self) -> bool:
        """Whether the log is on an object store."""
        return self.feed.storage.remote

    def check(self) -> None:
        """The latest commit is found and the filter's columns are in the latest schema."""
        self.feed.log.latest_version()
        self.feed.check_filter()

    def tailer(
        self, config: TailerConfig, sink: Sink, stats: TableStats | None = None, *, status_file: bool = True
    ) -> Tailer:
        """A new :class:`~tailer.follow.signalled.SignalledTailer` (on-demand snapshots too) on this feed."""
        return SignalledTailer(config, sink, feed=self.feed, stats=stats, status_file=status_file)


class DeltaFormat:
    """Delta Lake tables (``_delta_log/``)."""

    name = "delta"
    uri_prefix: str | None = None
    noun = "Delta table"

    def detect(self, storage: Storage, uri: str) -> bool:
        """Always: the fallback format (its reader names what is missing)."""
        return True

    def claims(self, directory: str) -> bool:
        """Whether ``directory`` has a ``_delta_log`` subdirectory."""
        return os.path.isdir(os.path.join(directory, "_delta_log"))

    def refused(self, asked: Sequence[str]) -> tuple[str, ...]:
        """Nothing: every setting applies to Delta tables."""
        return ()

    def start_of(self, table: TableRef, value: object) -> int | None:
        """:func:`~tailer.formats.base.starting_version`, ``latest`` being the log's latest commit."""
        return starting_version(value, DeltaLog(table.uri, table.storage).latest_version)

    def snapshot_document(self, table: TableRef, version: int | None) -> dict[str, Any]:
        """:func:`~tailer.formats.delta_report.snapshot_document` of the snapshot at ``version``."""
        return snapshot_document(DeltaLog(table.uri, table.storage).snapshot(version))

    def snapshot_text(self, table: TableRef, version: int | None) -> str:
        """:func:`~tailer.formats.delta_report.snapshot_text` of the snapshot at ``version``."""
        return snapshot_text(DeltaLog(table.uri, table.storage).snapshot(version))

    def change_batches(self, table: TableRef, request: ChangeRequest) -> ChangeRun:
        """The rows of :meth:`~tailer.read.feed.ChangeFeed.batches` for the request (the filter checked first)."""
        feed = ChangeFeed(table.uri, table.storage, request.options)
        feed.check_filter()
        starting = feed.log.latest_version() if request.latest else request.starting_version
        batches = feed.batches(
            starting,
            request.ending_version,
            starting_timestamp_ms=request.starting_timestamp_ms,
            initial_snapshot=request.initial_snapshot,
        )

        def info() -> TableInfo:
            return TableInfo(feed.table, table_id(feed.log, feed.log.snapshot()), table_name(feed.table))

        return ChangeRun(
            batches, info, lambda: feed.options.filter.output_schema(change_schema(feed.log.snapshot().schema))
        )

    def follow(self, table: TableRef, options: ChangeOptions) -> FollowedDelta:
        """A :class:`FollowedDelta` on a new change feed."""
        return FollowedDelta(ChangeFeed(table.uri, table.storage, options))

    def audit_feed(self, table: TableRef) -> AuditSource:
        """The :class:`~tailer.audit.feed.AuditFeed` of the table's log."""
        from deltatail.tailer.audit.feed import AuditFeed

        return AuditFeed(table.uri, table.storage, external_roots=table.external_roots)

    def audit_follower(
        self,
        table: TableRef,
        config: AuditFollowConfig,
        outputs: Sequence[AuditOutput],
        notifier: AlertNotifier | None,
    ) -> AuditFollower:
        """An :class:`~tailer.follow.audit.AuditFollower` of the table's log."""
        from deltatail.tailer.follow.audit import AuditFollower

        return AuditFollower(config, outputs, notifier, storage=table.storage)


#: The Delta format (the registry's fallback entry).
DELTA = DeltaFormat()
