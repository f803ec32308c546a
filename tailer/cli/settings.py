"""Settings for ``deltatail run``: flags win over environment variables, which win over a TOML file.

Environment variables are ``DELTATAIL_<NAME>`` with the flag's name in upper
case and ``_`` for ``-`` (``DELTATAIL_SINK``, ``DELTATAIL_POLL_INTERVAL``,
``DELTATAIL_STATE_DIR`` ...). The TOML file (``--config FILE`` or
``DELTATAIL_CONFIG``) holds the same names as keys, with ``-`` or ``_``, at the
top level or under a ``[run]`` table; storage options (credentials, endpoints:
:mod:`tailer.storage.options`) in a ``[storage]`` table. ``deltatail audit`` reads the same
settings, and its alert rules and webhooks from an ``[audit]`` table (:func:`audit_config`,
:mod:`tailer.audit.alerts`), which ``deltatail run`` leaves alone.
"""

from __future__ import annotations

import argparse
import os
import tomllib
from collections.abc import Callable, Mapping
from typing import Any

from state.errors import ConfigError
from state.paths import check_external_root
from tailer.audit.alerts import AuditSettings, load_audit_settings
from tailer.parse import parse_bool
from tailer.storage.options import parse_option_pairs


def version_value(value: Any) -> int | str:
    """A version setting: a number, or ``latest``."""
    if value == "latest":
        return "latest"
    if isinstance(value, bool):
        raise ValueError(f"not a version: {value!r}")
    return int(value)


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

#: Settings of ``deltatail run`` and their types (or converters).
RUN_SETTINGS: dict[str, Callable[[Any], Any]] = {
    "state_dir": str,
    "sink": str,
    "starting_version": version_value,
    "starting_timestamp": str,
    "initial_snapshot": bool,
    "poll_interval": float,
    "max_poll_interval": float,
    "no_watch": bool,
    "checkpoint_commits": int,
    "checkpoint_seconds": float,
    "snapshot_commits": int,
    "until_caught_up": bool,
    "net_changes": bool,
    "key": str,
    "allow_non_additive": bool,
    "columns": names,
    "where": str,
    "change_types": names,
    "skip_operations": names,
    "sink_retries": int,
    "reader_processes": int,
    "external_roots": roots,
}


def coerce(name: str, value: Any, source: str) -> Any:
    """Setting ``name``'s value in its type (``source`` names where it came from, for errors).

    Raises:
        ConfigError: if the value does not convert.
    """
    kind = RUN_SETTINGS[name]
    try:
        if kind is bool:
            return value if isinstance(value, bool) else parse_bool(str(value), name=name)
        return kind(value)
    except ConfigError as e:
        raise ConfigError(f"invalid value for {name} in {source}: {e.message}") from e
    except (TypeError, ValueError) as e:
        raise ConfigError(f"invalid value for {name} in {source}: {e}") from e


def load_toml(path: str) -> dict[str, Any]:
    """The run settings in a TOML file.

    Raises:
        ConfigError: if the file cannot be read, is not TOML, or holds an unknown key.
    """
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file: {e}", file=path) from e
    section = dict(data.get("run", data))
    section.pop(AUDIT, None)  # read by `deltatail audit` (audit_config), with its own checks
    storage = section.pop(STORAGE, data.get(STORAGE, {}))
    out: dict[str, Any] = {}
    for key, value in section.items():
        name = key.replace("-", "_")
        if name not in RUN_SETTINGS:
            raise ConfigError(f"unknown setting {key!r} in config file", file=path)
        out[name] = coerce(name, value, path)
    if not isinstance(storage, dict) or not all(isinstance(v, str | int | float | bool) for v in storage.values()):
        raise ConfigError("[storage] must be a table of KEY = value pairs (storage options)", file=path)
    if storage:
        out[STORAGE] = {str(k).lower(): option_text(v) for k, v in storage.items()}
    return out


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
    """Flags (``None`` = not given) over environment over TOML file.

    Storage options (``storage``: the TOML ``[storage]`` table, under ``--storage-option`` flags
    given as ``storage_option``) are merged key by key, the flags winning.

    Raises:
        ConfigError: if a value is invalid or the config file is unusable.
    """
    env = os.environ if env is None else env
    config_path = flags.get("config") or env.get("DELTATAIL_CONFIG")
    merged: dict[str, Any] = load_toml(config_path) if config_path else {}
    merged.update(from_environment(env))
    merged.update({k: v for k, v in flags.items() if k in RUN_SETTINGS and v is not None})
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
