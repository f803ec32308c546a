"""The settings model made into a tailer's configuration: shared by ``run`` and ``serve`` (and ``audit --follow``)."""

from __future__ import annotations

from typing import TypedDict

from deltatail.state.errors import ConfigError
from deltatail.tailer.cli.model import (
    DEFAULT_ON_SCHEMA_CHANGE,
    DEFAULT_SINK,
    FOLLOW_DEFAULTS,
    READ_DEFAULTS,
    TableSettings,
    keys,
    table_filter,
)
from deltatail.tailer.follow.tailer import TailerConfig
from deltatail.tailer.formats.base import starting_version
from deltatail.tailer.formats.registry import open_table
from deltatail.tailer.parse import parse_timestamp_ms
from deltatail.tailer.read.feed import ChangeOptions
from deltatail.tailer.table import TableRef

__all__ = ["DEFAULT_SINK", "READ_DEFAULTS", "RUN_DEFAULTS", "crosses_schema_changes", "tailer_config"]

#: The defaults of every setting, from the config types themselves.
RUN_DEFAULTS = FOLLOW_DEFAULTS


def crosses_schema_changes(s: TableSettings) -> bool:
    """Whether the settings ``s`` follow a table across non-additive schema changes (``on_schema_change``).

    ``evolve`` (the default) goes on, every row in the schema of its version; ``stop`` stops before
    the version, as before. The deprecated ``allow_non_additive = true`` means ``evolve``; ``false``
    no longer means ``stop`` by itself (it was the default, so it says nothing).

    Raises:
        ConfigError: if ``allow_non_additive = true`` contradicts ``on_schema_change = "stop"``.
    """
    if s.allow_non_additive and s.on_schema_change == "stop":
        raise ConfigError('allow_non_additive contradicts on_schema_change = "stop"; give only on_schema_change')
    return s.on_schema_change == DEFAULT_ON_SCHEMA_CHANGE


class FollowFields(TypedDict):
    """The :class:`~tailer.follow.config.FollowConfig` fields every follow loop takes from its settings."""

    starting_timestamp_ms: int | None
    poll_interval: float
    max_poll_interval: float
    watch: bool
    checkpoint_commits: int
    checkpoint_seconds: float
    snapshot_commits: int
    until_caught_up: bool
    storage_options: dict[str, str]


def follow_fields(s: TableSettings) -> FollowFields:
    """The :class:`~tailer.follow.config.FollowConfig` fields every follow loop takes from the settings ``s``.

    Raises:
        ConfigError: if both ``starting_version`` and ``starting_timestamp`` are given, or the
            timestamp is not ISO-8601.
    """
    if s.starting_version is not None and s.starting_timestamp is not None:
        raise ConfigError("give at most one of starting_version and starting_timestamp")
    start_ts = s.starting_timestamp
    return FollowFields(
        starting_timestamp_ms=parse_timestamp_ms(start_ts, name="starting_timestamp") if start_ts else None,
        poll_interval=s.poll_interval,
        max_poll_interval=s.max_poll_interval,
        watch=not s.no_watch,
        checkpoint_commits=s.checkpoint_commits,
        checkpoint_seconds=s.checkpoint_seconds,
        snapshot_commits=s.snapshot_commits,
        until_caught_up=s.until_caught_up,
        storage_options=dict(s.storage),
    )


def tailer_config(table: TableRef | str, state_dir: str, s: TableSettings) -> TailerConfig:
    """The configuration of a tailer of ``table`` from its settings ``s``.

    ``table`` is the table's handle (its format turns ``starting_version`` into a version:
    :meth:`~tailer.formats.base.TableFormat.start_of`), or its path, opened only if
    ``starting_version`` is ``latest`` (in the format ``s`` gives, else the one detected).

    Raises:
        ConfigError: for contradicting or invalid settings.
    """
    common = follow_fields(s)
    if s.key and not s.net_changes:
        raise ConfigError("key needs net_changes")
    return TailerConfig(
        table=table.uri if isinstance(table, TableRef) else table,
        state_dir=state_dir,
        starting_version=_start(table, s),
        **common,
        initial_snapshot=s.initial_snapshot,
        notifications=s.notifications,
        on_sink_gap=s.on_sink_gap,
        on_data_loss=s.on_data_loss,
        flush_rows=s.flush_rows,
        options=ChangeOptions(
            net_changes=s.net_changes,
            key_columns=keys(s.key),
            allow_non_additive=crosses_schema_changes(s),
            reader_processes=s.reader_processes,
            filter=table_filter(s),
            external_roots=s.external_roots,
        ),
    )


def _start(table: TableRef | str, s: TableSettings) -> int | None:
    """``starting_version`` as a version, by the table's format (a path is opened only for ``latest``)."""
    if isinstance(table, str) and s.starting_version == "latest":
        table = open_table(table, s.storage, external_roots=s.external_roots, format_name=s.format)
    if isinstance(table, TableRef):
        return table.format.start_of(table, s.starting_version)
    return starting_version(s.starting_version, latest=lambda: 0)  # a number or None: the table is not read
