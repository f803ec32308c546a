"""Settings (flags, environment, TOML) made into a tailer's configuration: shared by ``run`` and ``serve``."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from state.errors import ConfigError
from state.filters import ChangeFilter
from tailer.cli.settings import STORAGE, names
from tailer.follow.tailer import TailerConfig
from tailer.formats.base import starting_version
from tailer.formats.registry import open_table
from tailer.parse import parse_timestamp_ms
from tailer.read.feed import ChangeOptions
from tailer.table import TableRef

#: The sink of ``deltatail run`` when none is given: JSON lines on stdout.
DEFAULT_SINK = "jsonl:-"
#: The defaults of every setting, from the config types themselves.
RUN_DEFAULTS = TailerConfig(table="", state_dir="")
READ_DEFAULTS = ChangeOptions()


def keys(text: str | None) -> tuple[str, ...]:
    """``a,b`` as a tuple of names."""
    return tuple(k.strip() for k in text.split(",") if k.strip()) if text else ()


def reader_processes(value: int | None) -> int:
    """``--reader-processes``, defaulted.

    Raises:
        ConfigError: if it is negative.
    """
    if value is None:
        return READ_DEFAULTS.reader_processes
    if value < 0:
        raise ConfigError(f"--reader-processes must be 0 or more, got {value}")
    return value


def change_filter(settings: Mapping[str, Any]) -> ChangeFilter:
    """The filter the ``columns``, ``where``, ``change_types`` and ``skip_operations`` settings ask for."""

    def listed(name: str) -> tuple[str, ...] | None:
        value = settings.get(name)
        return None if value is None else names(value)

    types = listed("change_types")
    return ChangeFilter(
        columns=listed("columns"),
        where=settings.get("where"),
        change_types=None if types is None else frozenset(types),
        skip_operations=frozenset(op.upper() for op in listed("skip_operations") or ()),
    )


#: What ``run`` and ``serve`` do at a non-additive schema change when nothing is set.
DEFAULT_ON_SCHEMA_CHANGE = "evolve"


def crosses_schema_changes(s: Mapping[str, Any]) -> bool:
    """Whether the settings ``s`` follow a table across non-additive schema changes (``on_schema_change``).

    ``evolve`` (the default) goes on, every row in the schema of its version; ``stop`` stops before
    the version, as before. The deprecated ``allow_non_additive = true`` means ``evolve``; ``false``
    no longer means ``stop`` by itself (it was the default, so it says nothing).

    Raises:
        ConfigError: if ``allow_non_additive = true`` contradicts ``on_schema_change = "stop"``.
    """
    mode = s.get("on_schema_change")
    if s.get("allow_non_additive") and mode == "stop":
        raise ConfigError('allow_non_additive contradicts on_schema_change = "stop"; give only on_schema_change')
    return (mode or DEFAULT_ON_SCHEMA_CHANGE) == "evolve"


def tailer_config(table: TableRef | str, state_dir: str, s: Mapping[str, Any]) -> TailerConfig:
    """The configuration of a tailer of ``table`` from merged settings ``s`` (defaults from the config types).

    ``table`` is the table's handle (its format turns ``starting_version`` into a version:
    :meth:`~tailer.formats.base.TableFormat.start_of`), or its path, opened only if
    ``starting_version`` is ``latest`` (in the format ``s`` gives, else the one detected).

    Raises:
        ConfigError: for contradicting or invalid settings.
    """
    starts = [k for k in ("starting_version", "starting_timestamp") if s.get(k) is not None]
    if len(starts) > 1:
        raise ConfigError("give at most one of starting_version and starting_timestamp")
    if s.get("key") and not s.get("net_changes"):
        raise ConfigError("key needs net_changes")
    d = RUN_DEFAULTS
    start_ts = s.get("starting_timestamp")
    storage_options = dict(s.get(STORAGE, {}))
    external_roots = tuple(s.get("external_roots", ()))
    return TailerConfig(
        table=table.uri if isinstance(table, TableRef) else table,
        state_dir=state_dir,
        starting_version=_start(table, storage_options, external_roots, s),
        starting_timestamp_ms=parse_timestamp_ms(start_ts, name="starting_timestamp") if start_ts else None,
        initial_snapshot=bool(s.get("initial_snapshot", d.initial_snapshot)),
        poll_interval=s.get("poll_interval", d.poll_interval),
        max_poll_interval=s.get("max_poll_interval", d.max_poll_interval),
        watch=not s.get("no_watch", not d.watch),
        notifications=s.get("notifications"),
        checkpoint_commits=s.get("checkpoint_commits", d.checkpoint_commits),
        checkpoint_seconds=s.get("checkpoint_seconds", d.checkpoint_seconds),
        snapshot_commits=s.get("snapshot_commits", d.snapshot_commits),
        flush_rows=s.get("flush_rows", d.flush_rows),
        until_caught_up=bool(s.get("until_caught_up", d.until_caught_up)),
        on_sink_gap=s.get("on_sink_gap", d.on_sink_gap),
        on_data_loss=s.get("on_data_loss", d.on_data_loss),
        options=ChangeOptions(
            net_changes=bool(s.get("net_changes", READ_DEFAULTS.net_changes)),
            key_columns=keys(s.get("key")),
            allow_non_additive=crosses_schema_changes(s),
            reader_processes=reader_processes(s.get("reader_processes")),
            filter=change_filter(s),
            external_roots=external_roots,
        ),
        storage_options=storage_options,
    )


def _start(
    table: TableRef | str, storage_options: dict[str, str], external_roots: tuple[str, ...], s: Mapping[str, Any]
) -> int | None:
    """``starting_version`` as a version, by the table's format (a path is opened only for ``latest``)."""
    value = s.get("starting_version")
    if isinstance(table, str) and value == "latest":
        table = open_table(table, storage_options, external_roots=external_roots, format_name=s.get("format"))
    if isinstance(table, TableRef):
        return table.format.start_of(table, value)
    return starting_version(value, latest=lambda: 0)  # a number or None: the table is not read
