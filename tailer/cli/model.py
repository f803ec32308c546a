"""The settings model: one frozen, typed value per command, parsed and checked once.

Each command's settings are built by one function, from its flags, the ``DELTATAIL_*``
environment and the TOML file (:mod:`tailer.cli.settings` merges them, every value through its spec:
its type and bounds, a bad value a :class:`~state.errors.ConfigError` naming the key, where it came
from and the range): :func:`run_settings`, :func:`changes_settings`, :func:`snapshot_settings`,
:func:`audit_command_settings`, and :func:`tailer.cli.serve_config.load_serve_config` for ``serve``
(its ``[service]``, ``[defaults]``, ``[[tables]]`` and ``[[discover]]``). Past that step no command
reads a settings dictionary: each config (:class:`~tailer.follow.config.TailerConfig`,
:class:`~tailer.follow.audit.AuditFollowConfig`, :class:`~tailer.serve.service.ServiceOptions`) is
built from the model (:mod:`tailer.cli.configure`, :mod:`tailer.cli.audit`). The model's defaults
are the config types' own, so that each default is written once; the options page shows them
(``docs/gen_options.py``).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any

from deltatail.state.errors import ConfigError
from deltatail.state.filters import ChangeFilter
from deltatail.tailer.cli.settings import audit_config, merge, names
from deltatail.tailer.follow.tailer import TailerConfig
from deltatail.tailer.parse import parse_timestamp_ms
from deltatail.tailer.read.feed import ChangeOptions
from deltatail.tailer.storage.options import parse_option_pairs

if TYPE_CHECKING:  # loaded by audit_command_settings (settings.audit_config), for `deltatail audit` only
    from deltatail.tailer.audit.alerts import AuditSettings

#: The sink of ``deltatail run`` when none is given: JSON lines on stdout.
DEFAULT_SINK = "jsonl:-"
#: The defaults of the follow loop and of the change reader: the config types' own.
FOLLOW_DEFAULTS = TailerConfig(table="", state_dir="")
READ_DEFAULTS = ChangeOptions()
#: What ``run`` and ``serve`` do at a non-additive schema change when nothing is set.
DEFAULT_ON_SCHEMA_CHANGE = "evolve"


@dataclass(frozen=True)
class TableArg:
    """The table a command reads: its path or URI, object-store options, outside roots and format name."""

    uri: str
    storage: Mapping[str, str] = field(default_factory=dict, repr=False, hash=False)
    external_roots: tuple[str, ...] = ()
    format: str | None = None


@dataclass(frozen=True)
class TableSettings:
    """How one table is followed: the ``run`` settings a ``serve`` table has too (``RUN_SETTINGS``).

    Field names are the settings' names; ``storage`` is the merged ``[storage]`` table and
    ``--storage-option`` flags, ``format`` a format's name (``None``: detected).
    """

    sink: str = DEFAULT_SINK
    starting_version: int | str | None = None
    starting_timestamp: str | None = None
    initial_snapshot: bool = FOLLOW_DEFAULTS.initial_snapshot
    poll_interval: float = FOLLOW_DEFAULTS.poll_interval
    max_poll_interval: float = FOLLOW_DEFAULTS.max_poll_interval
    no_watch: bool = not FOLLOW_DEFAULTS.watch
    notifications: str | None = FOLLOW_DEFAULTS.notifications
    checkpoint_commits: int = FOLLOW_DEFAULTS.checkpoint_commits
    checkpoint_seconds: float = FOLLOW_DEFAULTS.checkpoint_seconds
    snapshot_commits: int = FOLLOW_DEFAULTS.snapshot_commits
    flush_rows: int = FOLLOW_DEFAULTS.flush_rows
    until_caught_up: bool = FOLLOW_DEFAULTS.until_caught_up
    net_changes: bool = READ_DEFAULTS.net_changes
    key: str | None = None
    on_schema_change: str = DEFAULT_ON_SCHEMA_CHANGE
    allow_non_additive: bool = False
    columns: tuple[str, ...] | None = None
    where: str | None = None
    change_types: tuple[str, ...] | None = None
    skip_operations: tuple[str, ...] = ()
    on_sink_gap: str = FOLLOW_DEFAULTS.on_sink_gap
    on_data_loss: str = FOLLOW_DEFAULTS.on_data_loss
    reader_processes: int = READ_DEFAULTS.reader_processes
    external_roots: tuple[str, ...] = ()
    storage: Mapping[str, str] = field(default_factory=dict, repr=False, hash=False)
    format: str | None = None

    def table_arg(self, uri: str) -> TableArg:
        """The table at ``uri`` read with these settings' storage options, outside roots and format."""
        return TableArg(uri, self.storage, self.external_roots, self.format)


@dataclass(frozen=True)
class RunSettings(TableSettings):
    """``deltatail run``: the table, its state directory, how it is followed, and the sink's retries."""

    table: str = ""
    state_dir: str = ""
    #: Restarts while the sink is unavailable (``None``: keep retrying).
    sink_retries: int | None = None


@dataclass(frozen=True)
class ServeTableSettings(TableSettings):
    """One table of ``deltatail serve`` (``[defaults]`` is one with no ``path``): its path and settings."""

    path: str = ""


@dataclass(frozen=True)
class ChangesSettings:
    """``deltatail changes``: a range of versions of a table, read once."""

    table: TableArg
    starting_version: int | str | None = None
    starting_timestamp_ms: int | None = None
    ending_version: int | None = None
    initial_snapshot: bool = False
    net_changes: bool = READ_DEFAULTS.net_changes
    key: tuple[str, ...] = ()
    output: str | None = None
    reader_processes: int = READ_DEFAULTS.reader_processes
    filter: ChangeFilter = field(default_factory=ChangeFilter)


@dataclass(frozen=True)
class SnapshotSettings:
    """``deltatail snapshot``: a table's state at a version (``None``: the latest), as text or JSON."""

    table: TableArg
    version: int | None = None
    json: bool = False


@dataclass(frozen=True)
class AuditCommandSettings:
    """``deltatail audit``: a range (the ``--starting-*`` flags) or ``--follow`` (``following``: run's settings)."""

    table: TableArg
    following: RunSettings
    alerts: AuditSettings
    output_format: str
    follow: bool = False
    starting_version: int | str | None = None
    starting_timestamp_ms: int | None = None
    ending_version: int | None = None
    counted: bool = False
    html: str | None = None
    output: str | None = None
    alert_output: str | None = None
    fail_on: str | None = None


def keys(text: str | None) -> tuple[str, ...]:
    """``a,b`` as a tuple of names."""
    return tuple(k.strip() for k in text.split(",") if k.strip()) if text else ()


def change_filter(
    columns: tuple[str, ...] | None,
    where: str | None,
    change_types: tuple[str, ...] | None,
    skip_operations: tuple[str, ...],
) -> ChangeFilter:
    """The filter the ``columns``, ``where``, ``change_types`` and ``skip_operations`` settings ask for."""
    return ChangeFilter(
        columns=columns,
        where=where,
        change_types=None if change_types is None else frozenset(change_types),
        skip_operations=frozenset(op.upper() for op in skip_operations),
    )


def table_filter(s: TableSettings) -> ChangeFilter:
    """The filter of a followed table's settings."""
    return change_filter(s.columns, s.where, s.change_types, s.skip_operations)


def model_fields(cls: type[Any]) -> frozenset[str]:
    """The names of a settings model's fields."""
    return frozenset(f.name for f in fields(cls))


def run_settings(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> RunSettings:
    """``deltatail run``'s settings: flags over ``DELTATAIL_*`` over the TOML file, each checked.

    Raises:
        ConfigError: for a value out of its type or bounds (naming the key and where it came from),
            an unknown key in the file, or no state directory.
    """
    given = merge(vars(args), env)
    if not given.get("state_dir"):
        raise ConfigError("--state-dir is required (or DELTATAIL_STATE_DIR, or state_dir in the config file)")
    return RunSettings(table=args.table, format=args.format, **given)


def _flag_table(args: argparse.Namespace) -> TableArg:
    """The table argument of a command that reads no settings file: its flags only."""
    return TableArg(
        args.table,
        parse_option_pairs(args.storage_option or []),
        tuple(args.external_roots or ()),
        args.format,
    )


def snapshot_settings(args: argparse.Namespace) -> SnapshotSettings:
    """``deltatail snapshot``'s settings (its flags).

    Raises:
        ConfigError: for a malformed ``--storage-option`` or one whose reference cannot be resolved.
    """
    return SnapshotSettings(_flag_table(args), args.version, args.json)


def _listed(value: str | None) -> tuple[str, ...] | None:
    return None if value is None else names(value)


def changes_settings(args: argparse.Namespace) -> ChangesSettings:
    """``deltatail changes``'s settings (its flags).

    Raises:
        ConfigError: for ``--key`` without ``--net-changes``, a starting timestamp that is not
            ISO-8601, or a malformed ``--storage-option``.
    """
    if args.key and not args.net_changes:
        raise ConfigError("--key needs --net-changes")
    start_ts = args.starting_timestamp
    return ChangesSettings(
        table=_flag_table(args),
        starting_version=args.starting_version,
        starting_timestamp_ms=None if start_ts is None else parse_timestamp_ms(start_ts, name="--starting-timestamp"),
        ending_version=args.ending_version,
        initial_snapshot=args.initial_snapshot,
        net_changes=args.net_changes,
        key=keys(args.key),
        output=args.output,
        reader_processes=READ_DEFAULTS.reader_processes if args.reader_processes is None else args.reader_processes,
        filter=change_filter(
            _listed(args.columns), args.where, _listed(args.change_types), _listed(args.skip_operations) or ()
        ),
    )


#: Flags of ``deltatail audit`` that only ``--follow`` uses (refused without it rather than ignored).
AUDIT_FOLLOW_ONLY = (
    "state_dir",
    "poll_interval",
    "max_poll_interval",
    "no_watch",
    "checkpoint_commits",
    "checkpoint_seconds",
    "snapshot_commits",
    "until_caught_up",
)


def audit_command_settings(args: argparse.Namespace, env: Mapping[str, str] | None = None) -> AuditCommandSettings:
    """``deltatail audit``'s settings: its flags, and for ``--follow`` those of ``run`` (flags, environment, file).

    Raises:
        ConfigError: for a value out of bounds, an unusable ``[audit]`` table, a file name with the
            wrong extension, a ``--follow`` flag without ``--follow``, or ``--follow`` without a
            state directory or with ``--ending-version`` or ``--html``.
    """
    flags = vars(args)
    env = os.environ if env is None else env
    given = merge(flags, env)
    alerts = audit_config(flags, env)
    if args.output is not None and not args.output.endswith((".jsonl", ".parquet")):
        raise ConfigError(f"--output must end in .jsonl or .parquet, got {args.output!r}")
    if args.alert_output is not None and not args.alert_output.endswith(".jsonl"):
        raise ConfigError(f"--alert-output must end in .jsonl, got {args.alert_output!r}")
    if args.follow:
        _check_audit_follow(args, given)
    else:
        for name in AUDIT_FOLLOW_ONLY:
            if flags[name] is not None:
                raise ConfigError(f"--{name.replace('_', '-')} is a setting of --follow")
    following = RunSettings(table=args.table, **given)
    start_ts = args.starting_timestamp
    return AuditCommandSettings(
        table=following.table_arg(args.table),
        following=following,
        alerts=alerts,
        output_format=args.format or ("table" if sys.stdout.isatty() else "jsonl"),
        follow=args.follow,
        starting_version=args.starting_version,
        starting_timestamp_ms=None if start_ts is None else parse_timestamp_ms(start_ts, name="--starting-timestamp"),
        ending_version=args.ending_version,
        counted=args.counted,
        html=args.html,
        output=args.output,
        alert_output=args.alert_output,
        fail_on=args.fail_on,
    )


def _check_audit_follow(args: argparse.Namespace, given: Mapping[str, Any]) -> None:
    if not given.get("state_dir"):
        raise ConfigError("--follow needs --state-dir (or DELTATAIL_STATE_DIR, or state_dir in the config file)")
    if args.ending_version is not None:
        raise ConfigError("--ending-version ends a range; --follow has no end (use --until-caught-up)")
    if args.html is not None:
        raise ConfigError("--html writes the report of a range; it cannot be used with --follow")
