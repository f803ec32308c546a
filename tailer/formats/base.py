"""The table-format seam: what the command line, ``serve``, ``audit`` and the Spark source ask of a format.

A table format (Delta, Lance...) is one object implementing :class:`TableFormat`. The front
ends never branch on a format: they open a :class:`~tailer.table.TableRef` with
:func:`tailer.formats.registry.open_table` (which strips the format's URI prefix, resolves the
storage once and detects the format) and then ask ``table.format`` for what they need:

- :meth:`TableFormat.snapshot_document` / :meth:`TableFormat.snapshot_text`: ``deltatail snapshot``;
- :meth:`TableFormat.change_batches`: ``deltatail changes`` (a :class:`ChangeRequest` in, a
  :class:`ChangeRun` out);
- :meth:`TableFormat.start_of`: ``--starting-version`` (``latest``) for following;
- :meth:`TableFormat.follow`: a :class:`FollowedTable` for ``run`` and ``serve``: its state id
  (:attr:`FollowedTable.table_id`), the directory to watch, the check before it starts, and its
  tailer (a :class:`~tailer.follow.change_loop.ChangeLoop`);
- :meth:`TableFormat.claims`: ``serve``'s discovery (a local directory holding one of its tables);
- :meth:`TableFormat.refused`: the settings it does not support (the front end raises a
  ``ConfigError`` in its own words: ``--net-changes``, ``net_changes``, ``netChanges``);
- :meth:`TableFormat.audit_feed`: ``deltatail audit``'s events, or a ``ConfigError`` for a format
  without them; :meth:`TableFormat.audit_follower`: ``deltatail audit --follow``'s loop.

How a format registers (adding a format = one sub-package + one registry entry):

1. Write the format's IO in its own sub-package (``tailer/iceberg/``, its pure planning in
   ``state/iceberg/``), and one module ``tailer/formats/<name>.py`` holding a class that
   implements :class:`TableFormat` (structural typing: no base class to inherit; see
   ``tailer/formats/lance.py`` for a complete, small example) and one instance of it, e.g.
   ``ICEBERG = IcebergFormat()``.
2. Add that instance to :data:`tailer.formats.registry.FORMATS`, before ``DELTA``: formats are
   asked in that order, and the first whose :meth:`~TableFormat.detect` says yes is the table's
   format; ``DELTA`` is last and always says yes (a location no other format claims is read as
   a Delta table, whose reader names what is missing). Its :attr:`~TableFormat.name` becomes a
   choice of ``--format``, of ``format =`` in ``serve``'s TOML and of the Spark source's
   ``format`` option, and its :attr:`~TableFormat.uri_prefix` (if any) a URI prefix that selects
   it without looking (``lance://PATH``).
3. For the Spark source, one entry in ``sinks.spark.formats.SPARK_FORMATS`` (its schema, stream
   planner and batch partitions: ``tailer`` cannot import the Spark front end). Nothing else
   changes: the command line, ``serve``, ``audit`` and the Spark source only ask the registry and
   the handle.

Formats import the layers below them (``tailer.storage``, ``tailer.log``, ``tailer.read``,
``tailer.follow``, their own sub-package); nothing below imports ``tailer.formats``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

import pyarrow as pa

from deltatail.state.errors import ConfigError
from deltatail.state.feed import ChangeBatch, TableInfo
from deltatail.tailer.follow.change_loop import ChangeLoop
from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.follow.tailer import TailerConfig
from deltatail.tailer.read.feed import ChangeOptions
from deltatail.tailer.sink import Sink
from deltatail.tailer.storage import Storage
from deltatail.tailer.table import TableRef

if TYPE_CHECKING:  # the audit command's types: its modules load with `deltatail audit` only
    from deltatail.tailer.audit.alerts import AlertNotifier
    from deltatail.tailer.audit.feed import AuditSource
    from deltatail.tailer.audit.log import AuditOutput
    from deltatail.tailer.follow.audit import AuditFollowConfig, AuditLoop

#: Settings a format may refuse (:meth:`TableFormat.refused`), by their canonical names.
NET_CHANGES = "net_changes"
KEY = "key"
MAX_BYTES = "max_bytes"
#: A setting a format may refuse: ``on_data_loss`` other than ``fail`` (resnapshot or skip past a lost version).
DATA_LOSS = "on_data_loss"
#: On-demand snapshots asked for by ``deltatail signal`` (:mod:`state.signals`).
SIGNALS = "signals"
#: Micro-batches of the Spark source that end inside a version with updates (``splitCommits=always``).
SPLIT = "split_commits"


def starting_version(value: object, latest: Callable[[], int]) -> int | None:
    """``starting_version`` for following: ``None``, a number, or ``latest`` (``latest()`` + 1: the versions after it).

    Raises:
        ConfigError: if it is none of these.
    """
    if value is None:
        return None
    if value == "latest":
        return latest() + 1
    try:
        return int(str(value))
    except ValueError:
        raise ConfigError(f"starting version must be a number or 'latest', got {value!r}") from None


@dataclass(frozen=True, slots=True)
class ChangeRequest:
    """What ``deltatail changes`` asks for.

    Attributes:
        starting_version: the first version (``None``: the format's default start).
        latest: start at the table's latest version instead (``--starting-version latest``).
        ending_version: the last version, inclusive (``None``: the latest now).
        starting_timestamp_ms: start at the first version at or after this time instead.
        initial_snapshot: deliver the starting version's rows as inserts first.
        options: how rows are produced (filters, external roots; net changes where supported).
    """

    starting_version: int | None = None
    latest: bool = False
    ending_version: int | None = None
    starting_timestamp_ms: int | None = None
    initial_snapshot: bool = False
    options: ChangeOptions = field(default_factory=ChangeOptions)


@dataclass(frozen=True, slots=True)
class ChangeRun:
    """The answer to a :class:`ChangeRequest`: the batches, and what a writer asks for when it needs it.

    Attributes:
        batches: the change rows, in order (a generator: reading happens as it is consumed).
        info: names the table to a sink (its id, name and path).
        schema: the output schema (asked only when there are no rows).
    """

    batches: Iterator[ChangeBatch]
    info: Callable[[], TableInfo]
    schema: Callable[[], pa.Schema]


class FollowedTable(Protocol):
    """One table opened for following (``run``, ``serve``) by its format."""

    @property
    def table_id(self) -> str:
        """The table's id: its state directory in ``serve``'s state root, ``{table_id}`` in sink URIs.

        Raises:
            DeltaTailError: if the table cannot be read (named).
        """
        ...

    @property
    def root(self) -> str:
        """The table's root as the format names it (an absolute path or a URI)."""
        ...

    @property
    def watch_dir(self) -> str:
        """The directory whose changes mean a new version (watched on local storage)."""
        ...

    @property
    def remote(self) -> bool:
        """Whether its storage is remote (polled, never watched)."""
        ...

    def check(self) -> None:
        """Check the table before following starts: its latest version is readable, the filter's columns exist.

        Raises:
            DeltaTailError: naming the table, what is missing or unreadable.
            ConfigError: a filter naming a column the table does not have.
        """
        ...

    def tailer(
        self, config: TailerConfig, sink: Sink, stats: TableStats | None = None, *, status_file: bool = True
    ) -> ChangeLoop:
        """A new, unopened tailer of the table into ``sink`` (reporting to ``stats``).

        ``status_file``: whether it keeps ``status.json`` in its state directory (``deltatail serve``
        writes its tables' status itself).
        """
        ...


class TableFormat(Protocol):
    """A table format: one instance per format, listed in :data:`tailer.formats.registry.FORMATS`.

    Attributes:
        name: the format's name (``delta``, ``lance``): ``--format``, ``format =``, the Spark option.
        uri_prefix: a URI prefix that names the format without looking (``lance://``), or ``None``.
        noun: how messages name one of its tables (``Delta table``, ``Lance dataset``).
    """

    name: str
    uri_prefix: str | None
    noun: str

    def detect(self, storage: Storage, uri: str) -> bool:
        """Whether ``uri`` holds a table of this format (a listing or two at most).

        Raises:
            StorageError: if the store cannot be reached (a transient error: the caller looks again later).
        """
        ...

    def claims(self, directory: str) -> bool:
        """Whether the local ``directory`` holds a table of this format (``serve``'s discovery: a look, no store).

        Unlike :meth:`detect`, the fallback format answers for itself here: a directory no format
        claims is not a table.
        """
        ...

    def refused(self, asked: Sequence[str]) -> tuple[str, ...]:
        """Which settings of ``asked`` it refuses.

        The settings: :data:`NET_CHANGES`, :data:`KEY`, :data:`MAX_BYTES`, :data:`DATA_LOSS`, :data:`SIGNALS`,
        :data:`SPLIT`.
        """
        ...

    def start_of(self, table: TableRef, value: object) -> int | None:
        """``starting_version`` for following: ``None``, a number, or ``latest`` (the versions after the latest now).

        Raises:
            ConfigError: if it is none of these.
        """
        ...

    def snapshot_document(self, table: TableRef, version: int | None) -> dict[str, Any]:
        """The table at ``version`` (default: the latest) as ``deltatail snapshot --json`` prints it."""
        ...

    def snapshot_text(self, table: TableRef, version: int | None) -> str:
        """The table at ``version`` (default: the latest) as ``deltatail snapshot`` prints it."""
        ...

    def change_batches(self, table: TableRef, request: ChangeRequest) -> ChangeRun:
        """The change rows ``deltatail changes`` asks for.

        Raises:
            ConfigError: for options the format refuses or a filter naming a missing column.
            DeltaTailError: what reading the table raises (named).
        """
        ...

    def follow(self, table: TableRef, options: ChangeOptions) -> FollowedTable:
        """The table opened for following with ``options`` (nothing is read until asked)."""
        ...

    def audit_feed(self, table: TableRef) -> AuditSource:
        """The table's audit events (``deltatail audit``).

        Raises:
            ConfigError: if the format has no audit events.
        """
        ...

    def audit_follower(
        self,
        table: TableRef,
        config: AuditFollowConfig,
        outputs: Sequence[AuditOutput],
        notifier: AlertNotifier | None,
    ) -> AuditLoop:
        """The loop of ``deltatail audit --follow``: events of new versions into ``outputs`` (nothing read yet).

        Raises:
            ConfigError: if the format has no audit events.
        """
        ...
