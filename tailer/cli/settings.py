"""Settings for ``deltatail run``: flags win over environment variables, which win over a TOML file.

Environment variables are ``DELTATAIL_<NAME>`` with the flag's name in upper
case and ``_`` for ``-`` (``DELTATAIL_SINK``, ``DELTATAIL_POLL_INTERVAL``,
``DELTATAIL_STATE_DIR`` ...). The TOML file (``--config FILE`` or
``DELTATAIL_CONFIG``) holds the same names as keys, with ``-`` or ``_``, at the
top level or under a ``[run]`` table; storage options (credentials, endpoints:
:mod:`tailer.storage.options`) in a ``[storage]`` table. Each value goes through its spec here
(:data:`RUN_SETTINGS` ...: its type and bounds) before it reaches a command's model
(:mod:`tailer.cli.model`); a bad one names the key, where it came from and, in a file, its line.
``deltatail audit`` reads the same settings, and its alert rules and webhooks from an ``[audit]``
table (:func:`audit_config`, :mod:`tailer.audit.alerts`), which ``deltatail run`` leaves alone.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import tomllib
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from deltatail.state.errors import ConfigError
from deltatail.state.paths import check_external_root
from deltatail.tailer.parse import parse_bool
from deltatail.tailer.storage.options import parse_option_pairs, resolve_references

if TYPE_CHECKING:  # the audit model and its webhooks load with `deltatail audit` only (audit_config below)
    from deltatail.tailer.audit.alerts import AuditSettings


class Number:
    """A numeric setting's type and bounds: the one place each bound lives.

    Accepts a number of the kind (an ``int`` for a float setting too) or its text (flags,
    environment); refuses booleans (``true`` is not ``1``), a fraction for a whole-number
    setting, ``nan`` and infinities, and values outside ``[at_least, at_most]``.

    Args:
        kind: ``int`` or ``float``.
        at_least: the smallest value accepted.
        at_most: the largest value accepted (``None``: any finite value).
        why: why there is an upper bound, for the error message.
    """

    def __init__(
        self, kind: type[int] | type[float], at_least: float, at_most: float | None = None, why: str = ""
    ) -> None:
        self.kind = kind
        self.at_least = at_least
        self.at_most = at_most
        self.why = why

    def __call__(self, value: Any) -> int | float:
        """``value`` in the setting's type.

        Raises:
            ValueError: for anything but a finite number of the kind within the bounds.
        """
        if isinstance(value, bool) or not isinstance(value, int | float | str):
            raise ValueError(f"expected a number, got {value!r}")
        number: int | float
        if self.kind is int:
            if isinstance(value, float):
                raise ValueError(f"expected a whole number, got {value!r}")
            try:
                number = value if isinstance(value, int) else int(value.strip())
            except ValueError:
                raise ValueError(f"expected a whole number, got {value!r}") from None
        else:
            try:
                number = float(value)
            except (ValueError, OverflowError):
                raise ValueError(f"expected a number, got {value!r}") from None
            if not math.isfinite(number):
                raise ValueError(f"expected a finite number, got {value!r}")
        if number < self.at_least:
            raise ValueError(f"must be at least {self.at_least:g}, got {value!r}")
        if self.at_most is not None and number > self.at_most:
            why = f" ({self.why})" if self.why else ""
            raise ValueError(f"must be at most {self.at_most:g}{why}, got {value!r}")
        return number


def version_value(value: Any) -> int | str:
    """A version setting: a number (0 or more), or ``latest``.

    Raises:
        ValueError: for anything else.
    """
    if value == "latest":
        return "latest"
    try:
        return int(Number(int, 0)(value))
    except ValueError:
        raise ValueError(f"expected a version number (0 or more) or 'latest', got {value!r}") from None


def text(value: Any) -> str:
    """A text setting (a path, a URI, a predicate).

    Raises:
        ValueError: for anything but a string.
    """
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {value!r}")
    return value


def flag(value: Any) -> bool:
    """A boolean setting: a boolean, or its text (:func:`tailer.parse.parse_bool`).

    Raises:
        ValueError: for anything else.
    """
    if isinstance(value, bool):
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected true or false, got {value!r}")
    try:
        return parse_bool(value, name="value")
    except ConfigError:
        raise ValueError(f"expected true or false, got {value!r}") from None


#: The values of ``on_sink_gap`` (see :meth:`tailer.follow.change_loop.ChangeLoop._open_sink`).
SINK_GAP_CHOICES = ("fail", "accept")


def sink_gap_value(value: Any) -> str:
    """An ``on_sink_gap`` setting: ``fail`` or ``accept``."""
    if value not in SINK_GAP_CHOICES:
        raise ValueError(f"expected one of {', '.join(SINK_GAP_CHOICES)}, got {value!r}")
    return str(value)


#: The values of ``on_schema_change`` (see :func:`tailer.cli.configure.crosses_schema_changes`).
SCHEMA_CHANGE_CHOICES = ("evolve", "stop")


def schema_change_value(value: Any) -> str:
    """An ``on_schema_change`` setting: ``evolve`` or ``stop``."""
    if value not in SCHEMA_CHANGE_CHOICES:
        raise ValueError(f"expected one of {', '.join(SCHEMA_CHANGE_CHOICES)}, got {value!r}")
    return str(value)


#: The values of ``on_data_loss`` (see :meth:`tailer.follow.tailer.Tailer._data_lost`).
DATA_LOSS_CHOICES = ("fail", "resnapshot", "skip")


def data_loss_value(value: Any) -> str:
    """An ``on_data_loss`` setting: ``fail``, ``resnapshot`` or ``skip``."""
    if value not in DATA_LOSS_CHOICES:
        raise ValueError(f"expected one of {', '.join(DATA_LOSS_CHOICES)}, got {value!r}")
    return str(value)


def names(value: Any) -> tuple[str, ...]:
    """A list setting: ``a,b`` (flags, environment) or a TOML list of strings.

    Raises:
        ValueError: for anything else.
    """
    if isinstance(value, str):
        return tuple(v.strip() for v in value.split(",") if v.strip())
    if isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise ValueError(f"expected a list of names or a comma-separated string, got {value!r}")


def roots(value: Any) -> tuple[str, ...]:
    """``external_roots``: a TOML list of strings (or ``a,b`` text), each an absolute path or a URI.

    Raises:
        ConfigError: for a root that is relative, the file system root, or holds ``..``.
        ValueError: for a value that is neither a list of strings nor text.
    """
    return tuple(check_external_root(r) for r in names(value))


#: The TOML table (and merged setting) of storage options (:mod:`tailer.storage.options`).
STORAGE = "storage"
#: The TOML table of ``deltatail audit``'s alert rules and webhooks.
AUDIT = "audit"

#: The longest interval of any timer setting: a day. Longer is surely a typo (and ``inf`` or
#: ``1e300`` would overflow the waits), and a tailer that looks less than daily is not following.
DAY = 86400.0
#: The most reader processes: each is a Python process of its own (tens of MB before it reads
#: anything) and reading is CPU-bound, so more than the cores gives nothing; 64 is well above
#: the cores of the machines this runs on, and keeps a typo (100000) from forking the host to death.
MAX_READER_PROCESSES = 64
#: The most ``serve`` worker threads: steps are CPU-bound under one interpreter lock, so more
#: threads add contention, not throughput.
MAX_WORKERS = 64
#: The deepest ``[[discover]]`` walk: deep enough for any lake layout, shallow enough that a
#: mistaken root (``/``) ends.
MAX_DISCOVER_DEPTH = 64

#: Every setting of ``run`` (and ``audit --follow``, and a ``serve`` table): its type and bounds.
#: Flags, environment variables and TOML files all go through these (:func:`coerce`, :func:`flag_type`).
RUN_SETTINGS: dict[str, Callable[[Any], Any]] = {
    "state_dir": text,
    "sink": text,
    "starting_version": version_value,
    "starting_timestamp": text,
    "initial_snapshot": flag,
    "poll_interval": Number(float, 0.01, DAY),
    "max_poll_interval": Number(float, 0.01, DAY),
    "no_watch": flag,
    "notifications": text,
    "checkpoint_commits": Number(int, 1),
    "checkpoint_seconds": Number(float, 0.01, DAY),
    "snapshot_commits": Number(int, 1),
    "flush_rows": Number(int, 1),
    "until_caught_up": flag,
    "net_changes": flag,
    "key": text,
    "on_schema_change": schema_change_value,
    "allow_non_additive": flag,  # deprecated: on_schema_change = "evolve" (the default now)
    "columns": names,
    "where": text,
    "change_types": names,
    "skip_operations": names,
    "sink_retries": Number(int, 0),
    "on_sink_gap": sink_gap_value,
    "on_data_loss": data_loss_value,
    "reader_processes": Number(int, 0, MAX_READER_PROCESSES, "each is a process of its own"),
    "external_roots": roots,
}

#: The ``[service]`` settings of ``deltatail serve``, with their types and bounds.
SERVICE_SETTINGS: dict[str, Callable[[Any], Any]] = {
    "state_root": text,
    "listen": text,
    "ready_lag_seconds": Number(float, 0),
    "min_readable_seconds": Number(float, 0),
    "workers": Number(int, 1, MAX_WORKERS, "steps share one interpreter lock"),
    "step_versions": Number(int, 1),
    "safety_poll_seconds": Number(float, 0.1, DAY),
    "discover_seconds": Number(float, 0.1, DAY),
    "status_seconds": Number(float, 0.1, DAY),
    "auth_token_file": text,
    "auth_token_env": text,
    "fatal_seconds": Number(float, 1, DAY),
    "stall_seconds": Number(float, 1, DAY),
    "signal_kafka_topic": text,
    "signal_kafka_key": text,
}

#: The settings of a ``[[discover]]`` entry of ``deltatail serve``.
DISCOVER_SETTINGS: dict[str, Callable[[Any], Any]] = {
    "root": text,
    "include": names,
    "exclude": names,
    "max_depth": Number(int, 0, MAX_DISCOVER_DEPTH, "a deeper walk is a mistaken root"),
}

#: The flags of ``deltatail demo``: a writer making ``commits`` commits ``interval`` seconds apart.
DEMO_SETTINGS: dict[str, Callable[[Any], Any]] = {
    "demo_commits": Number(int, 1, 10_000, "a demo, not a load test"),
    "demo_interval": Number(float, 0, 3600),
}

#: Every setting by name (the names of the tables do not overlap).
SETTINGS: dict[str, Callable[[Any], Any]] = {**RUN_SETTINGS, **SERVICE_SETTINGS, **DISCOVER_SETTINGS, **DEMO_SETTINGS}


def coerce(name: str, value: Any, source: str, line: int | None = None) -> Any:
    """Setting ``name``'s value in its type, within its bounds.

    ``source`` names where it came from (the flag, the variable, the file or its table), ``line``
    its line in a file (:func:`key_lines`), if known.

    Raises:
        ConfigError: if the value does not convert or is out of bounds.
    """
    try:
        return SETTINGS[name](value)
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid value for {name} in {source}: {e}{at_line(line)}") from e


def at_line(line: int | None) -> str:
    """`` (line N)`` for an error about a file's line ``N``; nothing when the line is not known."""
    return "" if line is None else f" (line {line})"


#: A TOML line that starts a table (``[name]``, ``[[name]]``) or a key (``name =``, ``"name" =``).
_HEADER_LINE = re.compile(r"\s*(\[\[?)\s*([A-Za-z0-9_.-]+)\s*\]\]?\s*(#.*)?$")
_KEY_LINE = re.compile(r"\s*[\"']?([A-Za-z0-9_-]+)[\"']?\s*=")


def key_lines(text: str) -> dict[tuple[str, int], dict[str, int]]:
    """The line (from 1) where each key of the TOML document ``text`` is set, by the table it is in.

    Tables are ``("", 0)`` for the top level, ``(name, 0)`` for ``[name]`` and ``(name, i)`` for the
    ``i``-th ``[[name]]`` entry (from 0). A plain reading, for error messages only: a line inside a
    multi-line string that looks like a key counts as one (the first line of a key wins).
    """
    found: dict[tuple[str, int], dict[str, int]] = {}
    entries: dict[str, int] = {}
    table = ("", 0)
    for number, line in enumerate(text.splitlines(), 1):
        header = _HEADER_LINE.match(line)
        if header is not None:
            entries[header[2]] = entries.get(header[2], -1) + 1
            table = (header[2], entries[header[2]] if header[1] == "[[" else 0)
            continue
        key = _KEY_LINE.match(line)
        if key is not None:
            found.setdefault(table, {}).setdefault(key[1], number)
    return found


def read_toml(path: str) -> tuple[dict[str, Any], dict[tuple[str, int], dict[str, int]]]:
    """The TOML document at ``path``, and where its keys are (:func:`key_lines`).

    Raises:
        ConfigError: if the file cannot be read, is not UTF-8 or is not TOML, naming the file.
    """
    try:
        with open(path, "rb") as fh:
            text = fh.read().decode("utf-8")
        return tomllib.loads(text), key_lines(text)
    except (OSError, tomllib.TOMLDecodeError, UnicodeDecodeError) as e:
        raise ConfigError(f"cannot read config file: {e}", file=path) from e


def flag_type(name: str) -> Callable[[str], Any]:
    """An argparse ``type=`` for setting ``name``'s flag: its bounds refused as usage errors (exit 2)."""

    def convert(value: str) -> Any:
        try:
            return SETTINGS[name](value)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None

    convert.__name__ = name
    return convert


def load_toml(path: str) -> dict[str, Any]:
    """The run settings in a TOML file.

    Raises:
        ConfigError: if the file cannot be read, is not TOML, or holds an unknown key.
    """
    data, lines = read_toml(path)
    at = lines.get(("run", 0) if "run" in data else ("", 0), {})
    section = dict(data.get("run", data))
    section.pop(AUDIT, None)  # read by `deltatail audit` (audit_config), with its own checks
    storage = section.pop(STORAGE, data.get(STORAGE, {}))
    out: dict[str, Any] = {}
    for key, value in section.items():
        name = key.replace("-", "_")
        if name not in RUN_SETTINGS:
            raise ConfigError(f"unknown setting {key!r} in config file{at_line(at.get(key))}", file=path)
        out[name] = coerce(name, value, path, at.get(key))
    storage_options = storage_table(storage, "[storage]", path)
    if storage_options:
        out[STORAGE] = storage_options
    return out


def storage_table(raw: Any, where: str, path: str) -> dict[str, str]:
    """A TOML table of storage options as text, ``env:NAME`` and ``@FILE`` values resolved.

    Raises:
        ConfigError: if it is not a table of scalar values, or a reference cannot be resolved
            (:func:`~tailer.storage.options.resolve_references`), naming the file.
    """
    if not isinstance(raw, dict) or not all(isinstance(v, str | int | float | bool) for v in raw.values()):
        raise ConfigError(f"{where} must be a table of KEY = value pairs (storage options)", file=path)
    return resolve_references({str(k).lower(): option_text(v) for k, v in raw.items()}, where=path)


def option_text(value: str | int | float | bool) -> str:
    """A TOML storage option's value as the text object stores take (booleans lower-case)."""
    return str(value).lower() if isinstance(value, bool) else str(value)


def from_environment(env: Mapping[str, str]) -> dict[str, Any]:
    """The run settings given as ``DELTATAIL_*`` environment variables."""
    out: dict[str, Any] = {}
    for name in RUN_SETTINGS:
        value = env.get(f"DELTATAIL_{name.upper()}")
        if value is not None:
            out[name] = coerce(name, value, f"DELTATAIL_{name.upper()}")
    return out


def merge(flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> dict[str, Any]:
    """Flags (``None`` = not given) over environment over TOML file, each checked against its bounds.

    Storage options (``storage``: the TOML ``[storage]`` table, under ``--storage-option`` flags
    given as ``storage_option``) are merged key by key, the flags winning.

    Raises:
        ConfigError: if a value is invalid or the config file is unusable.
    """
    env = os.environ if env is None else env
    config_path = flags.get("config") or env.get("DELTATAIL_CONFIG")
    merged: dict[str, Any] = load_toml(config_path) if config_path else {}
    merged.update(from_environment(env))
    merged.update(
        {k: coerce(k, v, f"--{k.replace('_', '-')}") for k, v in flags.items() if k in RUN_SETTINGS and v is not None}
    )
    storage = {**merged.get(STORAGE, {}), **parse_option_pairs(flags.get("storage_option") or [])}
    if storage:
        merged[STORAGE] = storage
    return merged


def audit_config(flags: Mapping[str, Any], env: Mapping[str, str] | None = None) -> AuditSettings:
    """The ``[audit]`` table of the config file (``--config`` or ``DELTATAIL_CONFIG``); none without a file.

    Raises:
        ConfigError: if the file is unusable, or ``[audit]`` holds an unknown key or an invalid
            rule or webhook (the message names the rule and the key).
    """
    from deltatail.tailer.audit.alerts import AuditSettings, load_audit_settings

    env = os.environ if env is None else env
    config_path = flags.get("config") or env.get("DELTATAIL_CONFIG")
    return load_audit_settings(config_path, env=env) if config_path else AuditSettings()


def _external_root_type(text: str) -> str:
    try:
        return check_external_root(text)
    except ConfigError as e:
        raise argparse.ArgumentTypeError(e.message) from None


def external_root_option(parser: argparse.ArgumentParser) -> None:
    """``--external-root URI`` (repeatable): a root outside the table its log may name (:mod:`state.paths`)."""
    parser.add_argument(
        "--external-root",
        dest="external_roots",
        action="append",
        type=_external_root_type,
        default=None,
        metavar="URI",
        help="a root outside the table (absolute path or URI) whose files the log may name, e.g. a shallow "
        "clone's source; read with the table's storage options. Repeatable; other outside paths are refused",
    )
