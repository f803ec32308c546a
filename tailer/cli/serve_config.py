"""``deltatail serve``'s settings: its TOML file parsed and checked once into typed values.

:func:`load_serve_config` reads ``[service]`` (:class:`ServiceSettings`), ``[defaults]`` and
``[storage]`` (a :class:`~tailer.cli.model.ServeTableSettings` with no path), every ``[[tables]]``
entry (the defaults with the entry's own settings over them) and every ``[[discover]]`` entry
(:class:`DiscoverSettings`). Every value goes through its spec (:mod:`tailer.cli.settings`); a bad
one is a :class:`~state.errors.ConfigError` naming the file, the key, the section or table and the
range. The file's layout is told in :mod:`tailer.cli.serve`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from deltatail.state.errors import ConfigError
from deltatail.tailer.cli.model import ServeTableSettings
from deltatail.tailer.cli.settings import (
    DISCOVER_SETTINGS,
    RUN_SETTINGS,
    SERVICE_SETTINGS,
    STORAGE,
    at_line,
    coerce,
    read_toml,
    storage_table,
)
from deltatail.tailer.follow.tailer import table_name
from deltatail.tailer.formats.registry import format_names, split_prefix
from deltatail.tailer.serve.http import load_auth_token
from deltatail.tailer.serve.service import ServiceOptions
from deltatail.tailer.serve.signal_topic import signal_topic

#: Settings of ``run`` that make no sense per table in a service.
_NOT_PER_TABLE = frozenset({"state_dir", "until_caught_up", "sink_retries"})
TABLE_SETTINGS = frozenset(RUN_SETTINGS) - _NOT_PER_TABLE
SERVICE_KEYS = SERVICE_SETTINGS
DISCOVER_KEYS = frozenset(DISCOVER_SETTINGS)
_SERVICE_DEFAULTS = ServiceOptions()


@dataclass(frozen=True)
class ServiceSettings:
    """The ``[service]`` table (``SERVICE_SETTINGS``); the scheduling defaults are :class:`ServiceOptions`'."""

    state_root: str
    listen: str = "127.0.0.1:9108"
    ready_lag_seconds: float = 300.0
    min_readable_seconds: float = 86400.0
    workers: int = _SERVICE_DEFAULTS.workers
    step_versions: int = _SERVICE_DEFAULTS.step_versions
    safety_poll_seconds: float = _SERVICE_DEFAULTS.safety_poll_seconds
    discover_seconds: float = _SERVICE_DEFAULTS.discover_seconds
    status_seconds: float = _SERVICE_DEFAULTS.status_seconds
    auth_token_file: str | None = None
    auth_token_env: str | None = None
    fatal_seconds: float = _SERVICE_DEFAULTS.fatal_seconds
    stall_seconds: float = _SERVICE_DEFAULTS.stall_seconds
    signal_kafka_topic: str | None = None
    signal_kafka_key: str = "deltatail"

    def options(self) -> ServiceOptions:
        """How the service runs its tables."""
        return ServiceOptions(
            workers=self.workers,
            step_versions=self.step_versions,
            safety_poll_seconds=self.safety_poll_seconds,
            discover_seconds=self.discover_seconds,
            status_seconds=self.status_seconds,
            fatal_seconds=self.fatal_seconds,
            stall_seconds=self.stall_seconds,
        )


@dataclass(frozen=True)
class DiscoverSettings:
    """A ``[[discover]]`` entry (``DISCOVER_SETTINGS``): a local root, globs on relative paths, a depth."""

    root: str
    include: tuple[str, ...] = ("*",)
    exclude: tuple[str, ...] = ()
    max_depth: int = 8


@dataclass
class ServeConfig:
    """A parsed service configuration (see :mod:`tailer.cli.serve`)."""

    state_root: str
    listen: str | None
    ready_lag_seconds: float
    options: ServiceOptions
    defaults: ServeTableSettings
    tables: list[tuple[str, ServeTableSettings]] = field(default_factory=list)  # (name, settings incl. path)
    discover: list[DiscoverSettings] = field(default_factory=list)
    auth_token: str | None = field(default=None, repr=False)  # the secret: never in a repr or a log
    min_readable_seconds: float = 86400.0
    signal_kafka_topic: str | None = None  # kafka://HOST:PORT/TOPIC: Debezium signals (tailer/serve/signal_topic.py)
    signal_kafka_key: str = "deltatail"


def load_serve_config(path: str) -> ServeConfig:
    """Read and check a service configuration file (the tables themselves are checked by ``check_tables``).

    Raises:
        ConfigError: naming the file and the key or table at fault.
    """
    data, lines = read_toml(path)
    unknown = set(data) - {"service", "defaults", STORAGE, "tables", "discover"}
    if unknown:
        raise ConfigError(
            f"unknown section {sorted(unknown)[0]!r} (known: service, defaults, storage, tables, discover)", file=path
        )
    service = _service(_table(data, "service", path), path, lines.get(("service", 0), {}))
    defaults = ServeTableSettings(
        **_settings(_table(data, "defaults", path), "[defaults]", path, lines.get(("defaults", 0), {}))
    )
    storage = storage_table(data.get(STORAGE, {}), "[storage]", path)
    if storage:
        defaults = replace(defaults, storage=storage)
    config = ServeConfig(
        state_root=service.state_root,
        listen=None if service.listen in ("", "off") else service.listen,
        ready_lag_seconds=service.ready_lag_seconds,
        min_readable_seconds=service.min_readable_seconds,
        options=service.options(),
        defaults=defaults,
        auth_token=load_auth_token(service.auth_token_file, service.auth_token_env, file=path),
        signal_kafka_topic=service.signal_kafka_topic,
        signal_kafka_key=service.signal_kafka_key,
    )
    if config.signal_kafka_topic is not None:
        try:
            signal_topic(config.signal_kafka_topic)
        except ConfigError as e:
            raise e.at(file=path) from None
    config.tables.extend(_tables(_array(data, "tables", path), defaults, path, lines))
    config.discover.extend(
        _discover(raw, i, path, lines.get(("discover", i), {})) for i, raw in enumerate(_array(data, "discover", path))
    )
    if not config.tables and not config.discover:
        raise ConfigError("the file names no tables ([[tables]]) and no discovery roots ([[discover]])", file=path)
    return config


def _service(raw: Mapping[str, Any], path: str, lines: Mapping[str, int]) -> ServiceSettings:
    """The ``[service]`` table, each key checked against :data:`SERVICE_SETTINGS` (``lines``: where each key is)."""
    for key in raw:
        if key not in SERVICE_KEYS:
            known = ", ".join(SERVICE_KEYS)
            raise ConfigError(f"unknown key {key!r} in [service] (known: {known}){at_line(lines.get(key))}", file=path)
    values = {k: _typed(k, v, "[service]", path, lines.get(k)) for k, v in raw.items()}
    if "state_root" not in values:
        raise ConfigError("[service] needs state_root (where each table's state lives)", file=path)
    return ServiceSettings(**values)


def _tables(
    raw_tables: list[Any], defaults: ServeTableSettings, path: str, lines: Mapping[tuple[str, int], Mapping[str, int]]
) -> list[tuple[str, ServeTableSettings]]:
    """The ``[[tables]]`` entries by name, each the defaults with its own settings over them."""
    out: list[tuple[str, ServeTableSettings]] = []
    seen: dict[str, str] = {}
    for i, raw in enumerate(raw_tables):
        if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
            raise ConfigError(f"[[tables]] #{i + 1} needs a path", file=path)
        raw = dict(raw)
        table_path = raw.pop("path")
        name = str(raw.pop("name", table_name(split_prefix(table_path)[0])))
        where = f"table {name!r}"
        fmt = raw.pop("format", None)
        if fmt is not None and fmt not in format_names():
            raise ConfigError(f"{where}: format must be one of {', '.join(format_names())}, got {fmt!r}", file=path)
        own_storage = storage_table(raw.pop(STORAGE, {}), f"{where} storage", path)
        settings = replace(defaults, **_settings(raw, where, path, lines.get(("tables", i), {})), path=table_path)
        if fmt is not None:
            settings = replace(settings, format=fmt)
        if own_storage:
            settings = replace(settings, storage={**defaults.storage, **own_storage})
        if name in seen:
            raise ConfigError(
                f"two tables are named {name!r} ({seen[name]} and {table_path}): give one a name", file=path
            )
        seen[name] = table_path
        out.append((name, settings))
    return out


def _discover(raw: Any, i: int, path: str, lines: Mapping[str, int]) -> DiscoverSettings:
    """The ``[[discover]]`` entry ``raw`` (the ``i``-th), each key checked against :data:`DISCOVER_SETTINGS`."""
    where = f"[[discover]] #{i + 1}"
    if not isinstance(raw, dict) or not isinstance(raw.get("root"), str):
        raise ConfigError(f"{where} needs a root", file=path)
    for key in raw:
        if key not in DISCOVER_KEYS:
            known = ", ".join(sorted(DISCOVER_KEYS))
            raise ConfigError(f"unknown key {key!r} in {where} (known: {known}){at_line(lines.get(key))}", file=path)
    return DiscoverSettings(**{k: _typed(k, v, where, path, lines.get(k)) for k, v in raw.items()})


def _table(data: Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{key}] must be a table", file=path)
    return dict(value)


def _array(data: Mapping[str, Any], key: str, path: str) -> list[Any]:
    value = data.get(key, [])
    if not isinstance(value, list):
        raise ConfigError(f"{key} must be an array of tables ([[{key}]])", file=path)
    return value


def _typed(name: str, value: Any, where: str, path: str, line: int | None) -> Any:
    """A ``[service]`` or ``[[discover]]`` setting in its type and bounds (:mod:`tailer.cli.settings`)."""
    try:
        return coerce(name, value, where, line)
    except ConfigError as e:
        raise e.at(file=path) from None


def _settings(raw: Mapping[str, Any], where: str, path: str, lines: Mapping[str, int]) -> dict[str, Any]:
    """A table's settings (``[defaults]``, a ``[[tables]]`` entry) in their types and bounds, by name."""
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in TABLE_SETTINGS:
            raise ConfigError(f"unknown setting {key!r} in {where}{at_line(lines.get(key))}", file=path)
        try:
            out[name] = coerce(name, value, where, lines.get(key))
        except ConfigError as e:
            raise e.at(file=path) from None
    return out
