"""``deltatail serve --config FILE``: follow every table a TOML file names or discovers, in one process.

The file::

    [service]
    state_root = "/var/lib/deltatail"    # required: one state directory per table, by table id
    listen = "127.0.0.1:9108"            # /metrics, /healthz, /readyz ("off": none)
    ready_lag_seconds = 300              # /readyz: a catching-up table within this lag counts as ready
    workers = 2                          # threads stepping tables
    step_versions = 50                   # versions a table delivers before the others get their turn
    safety_poll_seconds = 10             # watched local tables are looked at this often without a signal
    discover_seconds = 30                # how often discovery roots are scanned again

    [defaults]                           # settings of every table (those of `deltatail run`)
    sink = "kafka://broker:9092/cdc.{table_name}?format=debezium&key=id&exactly_once=true"
    skip_operations = ["OPTIMIZE"]

    [storage]                            # object-store options of every table
    aws_region = "eu-west-1"

    [[tables]]                           # a table by path or URI
    path = "s3://lake/sales/orders"
    name = "orders"                      # default: the path's last part; unique
    format = "delta"                     # or "lance" (default: lance:// paths and _versions/ layouts are Lance)
    where = "region = 'emea'"            # any setting of [defaults], for this table
    [tables.storage]                     # object-store options of this table

    [[discover]]                         # every Delta table (_delta_log) and Lance dataset under a local root
    root = "/data/lake"
    include = ["sales/*"]                # globs on the path relative to the root (default: all)
    exclude = ["sales/tmp_*"]
    max_depth = 8

Lance datasets are followed alongside Delta tables (by a
:class:`~tailer.lance.follow.LanceTailer`); the settings that only apply to
Delta tables (``net_changes``, ``key``) are refused for them. Sink URIs may
hold ``{table_name}`` and ``{table_id}`` (for a Lance dataset, its
:func:`~tailer.lance.follow.lance_state_id`). A discovered table is
named by its path relative to the root, ``/`` written ``.``. Everything is
checked before anything starts: an unknown key, a table path that does not
exist, two tables that are one, a filter naming a missing column, an address
in use — each is an error naming the key or table.
"""

from __future__ import annotations

import logging
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from state.errors import ConfigError, DeltaTailError
from tailer.cli.configure import DEFAULT_SINK, tailer_config
from tailer.cli.lance import PREFIX as LANCE_PREFIX
from tailer.cli.lance import run_start as lance_run_start
from tailer.cli.process import stop_on_signals, tune_for_latency
from tailer.cli.progress import ServiceProgress
from tailer.cli.settings import RUN_SETTINGS, STORAGE, coerce, option_text
from tailer.cli.sink_uri import open_sink
from tailer.follow.sink import Sink
from tailer.follow.tailer import table_name
from tailer.lance.dataset import looks_like_lance
from tailer.lance.feed import LanceFeed, LanceOptions
from tailer.lance.follow import lance_state_id
from tailer.log.delta_log import DeltaLog
from tailer.log.starts import table_id
from tailer.read.feed import ChangeFeed
from tailer.serve.discovery import find_tables, is_lance_dataset
from tailer.serve.http import HealthServer
from tailer.serve.service import Service, ServiceOptions, TableSource
from tailer.serve.state_root import StateRoot
from tailer.storage.factory import storage_for

log = logging.getLogger("deltatail")

#: Settings of ``run`` that make no sense per table in a service.
_NOT_PER_TABLE = frozenset({"state_dir", "until_caught_up", "sink_retries"})
TABLE_SETTINGS = frozenset(RUN_SETTINGS) - _NOT_PER_TABLE
SERVICE_KEYS = {
    "state_root": str,
    "listen": str,
    "ready_lag_seconds": float,
    "workers": int,
    "step_versions": int,
    "safety_poll_seconds": float,
    "discover_seconds": float,
    "status_seconds": float,
}
DISCOVER_KEYS = frozenset({"root", "include", "exclude", "max_depth"})
#: A ``[[tables]]`` entry's ``format``: its table format, when its path or layout should not decide.
FORMATS = ("delta", "lance")
#: Settings of ``run`` that apply to Delta tables only.
DELTA_ONLY = ("net_changes", "key")


@dataclass
class ServeConfig:
    """A parsed service configuration (see the module docstring)."""

    state_root: str
    listen: str | None
    ready_lag_seconds: float
    options: ServiceOptions
    defaults: dict[str, Any]
    tables: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # (name, settings incl. path)
    discover: list[dict[str, Any]] = field(default_factory=list)


def load_serve_config(path: str) -> ServeConfig:
    """Read and check a service configuration file (the tables themselves are checked by :func:`check_tables`).

    Raises:
        ConfigError: naming the file and the key or table at fault.
    """
    try:
        with open(path, "rb") as fh:
            data = tomllib.load(fh)
    except (OSError, tomllib.TOMLDecodeError) as e:
        raise ConfigError(f"cannot read config file: {e}", file=path) from e
    unknown = set(data) - {"service", "defaults", STORAGE, "tables", "discover"}
    if unknown:
        raise ConfigError(
            f"unknown section {sorted(unknown)[0]!r} (known: service, defaults, storage, tables, discover)", file=path
        )
    service = _table(data, "service", path)
    for key in service:
        if key not in SERVICE_KEYS:
            raise ConfigError(f"unknown key {key!r} in [service] (known: {', '.join(SERVICE_KEYS)})", file=path)
    values = {k: _typed(SERVICE_KEYS[k], v, f"[service] {k}", path) for k, v in service.items()}
    if "state_root" not in values:
        raise ConfigError("[service] needs state_root (where each table's state lives)", file=path)
    listen = values.get("listen", "127.0.0.1:9108")
    d = ServiceOptions()
    options = ServiceOptions(
        workers=values.get("workers", d.workers),
        step_versions=values.get("step_versions", d.step_versions),
        safety_poll_seconds=values.get("safety_poll_seconds", d.safety_poll_seconds),
        discover_seconds=values.get("discover_seconds", d.discover_seconds),
        status_seconds=values.get("status_seconds", d.status_seconds),
    )
    if options.workers < 1 or options.step_versions < 1:
        raise ConfigError("[service] workers and step_versions must be at least 1", file=path)
    defaults = _settings(_table(data, "defaults", path), "[defaults]", path)
    storage = _storage(data.get(STORAGE, {}), "[storage]", path)
    if storage:
        defaults[STORAGE] = storage
    config = ServeConfig(
        state_root=values["state_root"],
        listen=None if listen in ("", "off") else listen,
        ready_lag_seconds=values.get("ready_lag_seconds", 300.0),
        options=options,
        defaults=defaults,
    )
    tables = data.get("tables", [])
    if not isinstance(tables, list):
        raise ConfigError("tables must be an array of tables ([[tables]])", file=path)
    seen: dict[str, str] = {}
    for i, raw in enumerate(tables):
        where = f"[[tables]] #{i + 1}"
        if not isinstance(raw, dict) or not isinstance(raw.get("path"), str):
            raise ConfigError(f"{where} needs a path", file=path)
        raw = dict(raw)
        table_path = raw.pop("path")
        name = str(raw.pop("name", table_name(table_path.removeprefix(LANCE_PREFIX))))
        where = f"table {name!r}"
        fmt = raw.pop("format", None)
        if fmt is not None and fmt not in FORMATS:
            raise ConfigError(f"{where}: format must be one of {', '.join(FORMATS)}, got {fmt!r}", file=path)
        own_storage = _storage(raw.pop(STORAGE, {}), f"{where} storage", path)
        settings = {**defaults, **_settings(raw, where, path), "path": table_path}
        if fmt is not None:
            settings["format"] = fmt
        if own_storage:
            settings[STORAGE] = {**defaults.get(STORAGE, {}), **own_storage}
        if name in seen:
            raise ConfigError(
                f"two tables are named {name!r} ({seen[name]} and {table_path}): give one a name", file=path
            )
        seen[name] = table_path
        config.tables.append((name, settings))
    discover = data.get("discover", [])
    if not isinstance(discover, list):
        raise ConfigError("discover must be an array of tables ([[discover]])", file=path)
    for i, raw in enumerate(discover):
        where = f"[[discover]] #{i + 1}"
        if not isinstance(raw, dict) or not isinstance(raw.get("root"), str):
            raise ConfigError(f"{where} needs a root", file=path)
        for key in raw:
            if key not in DISCOVER_KEYS:
                raise ConfigError(
                    f"unknown key {key!r} in {where} (known: {', '.join(sorted(DISCOVER_KEYS))})", file=path
                )
        config.discover.append(raw)
    if not config.tables and not config.discover:
        raise ConfigError("the file names no tables ([[tables]]) and no discovery roots ([[discover]])", file=path)
    return config


def _table(data: Mapping[str, Any], key: str, path: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"[{key}] must be a table", file=path)
    return dict(value)


def _typed(kind: type, value: Any, where: str, path: str) -> Any:
    if kind is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if not isinstance(value, kind) or isinstance(value, bool):
        raise ConfigError(f"{where} must be a {kind.__name__}, got {value!r}", file=path)
    return value


def _settings(raw: Mapping[str, Any], where: str, path: str) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in raw.items():
        name = key.replace("-", "_")
        if name not in TABLE_SETTINGS:
            raise ConfigError(f"unknown setting {key!r} in {where}", file=path)
        try:
            out[name] = coerce(name, value, where)
        except ConfigError as e:
            raise e.at(file=path) from None
    return out


def _storage(raw: Any, where: str, path: str) -> dict[str, str]:
    if not isinstance(raw, dict) or not all(isinstance(v, str | int | float | bool) for v in raw.values()):
        raise ConfigError(f"{where} must be a table of KEY = value pairs (storage options)", file=path)
    return {str(k).lower(): option_text(v) for k, v in raw.items()}


# ---------------------------------------------------------------- tables --


def _sink_factory(uri: str, name: str) -> Any:
    def make(tid: str) -> Sink:
        filled = uri.replace("{table_name}", name)
        if not filled.startswith("kafka://"):  # the Kafka sink fills its topic's {table_id} itself
            filled = filled.replace("{table_id}", tid)
        return open_sink(filled)

    return make


def source(name: str, settings: Mapping[str, Any]) -> TableSource:
    """The service's table of ``name``, with its settings (``format``: ``delta`` or ``lance``, else detected).

    Raises:
        ConfigError: for invalid settings, a ``lance://`` path with ``format = "delta"``, or Delta-only
            settings for a Lance dataset.
    """
    table = str(settings["path"])
    fmt = settings.get("format")
    if table.startswith(LANCE_PREFIX):
        if fmt == "delta":
            raise ConfigError(f"table {name!r}: {table} is a lance:// path, but format is delta")
        table, fmt = table[len(LANCE_PREFIX) :], "lance"
    if fmt is None:
        fmt = "lance" if looks_like_lance(table, storage_for(table, settings.get(STORAGE) or None)) else "delta"
    sink = _sink_factory(str(settings.get("sink", DEFAULT_SINK)), name)
    if fmt == "lance":
        refused = [k for k in DELTA_ONLY if settings.get(k)]
        if refused:
            raise ConfigError(f"table {name!r} is a Lance dataset: {', '.join(refused)} apply to Delta tables only")
        return TableSource(name, tailer_config(table, "", settings, start_of=lance_run_start), sink, "lance")
    return TableSource(name, tailer_config(table, "", settings), sink)


def check_tables(sources: list[TableSource]) -> None:
    """Check every configured table before anything starts.

    Raises:
        DeltaTailError: naming the table: a path with no Delta table, a filter naming a column the
            table does not have, or two entries that are one table.
    """
    ids: dict[str, str] = {}
    for s in sources:
        c = s.config
        try:
            if s.table_format == "lance":
                o = c.options
                lance = LanceFeed(
                    c.table,
                    options=LanceOptions(o.allow_non_additive, o.batch_size, o.filter, o.external_roots),
                    storage_options=c.storage_options or None,
                )
                lance.dataset.latest_version()
                lance.check_filter()
                tid = lance_state_id(lance.table)
            else:
                feed = ChangeFeed(c.table, storage_for(c.table, c.storage_options or None), c.options)
                feed.log.latest_version()
                feed.check_filter()
                tid = table_id(feed.log)
        except DeltaTailError as e:
            raise type(e)(f"table {s.name!r}: {e.message}", table=e.table, version=e.version, file=e.file) from e
        if tid in ids:
            raise ConfigError(f"tables {ids[tid]!r} and {s.name!r} are the same table (id {tid}): follow it once")
        ids[tid] = s.name


def _discovered(config: ServeConfig, known_paths: set[str]) -> list[TableSource]:
    out: list[TableSource] = []
    for spec in config.discover:
        root = str(spec["root"])
        include = tuple(spec.get("include", ["*"]))
        exclude = tuple(spec.get("exclude", []))
        for path in find_tables(root, include=include, exclude=exclude, max_depth=int(spec.get("max_depth", 8))):
            if path in known_paths:
                continue
            name = Path(path).relative_to(Path(root).resolve()).as_posix().replace("/", ".")
            fmt = "lance" if is_lance_dataset(path) else "delta"
            try:
                out.append(source(name, {**config.defaults, "path": path, "format": fmt}))
            except DeltaTailError as e:
                log.error("discovered table %s cannot be followed: %s", path, e)
    return out


def _normalized(source: TableSource) -> str:
    """A configured table's path as discovery writes it (to leave it to its own entry)."""
    if source.table_format == "lance":
        table = source.config.table
        return table.rstrip("/") if "://" in table else str(Path(table).resolve())
    return DeltaLog(source.config.table).table


def serve(config_path: str) -> int:
    """Run the service of ``config_path`` until SIGINT/SIGTERM.

    Raises:
        ConfigError: for a bad configuration (before anything starts).
        DeltaTailError: a table that cannot be followed at start (named).
    """
    config = load_serve_config(config_path)
    sources = [source(name, settings) for name, settings in config.tables]
    check_tables(sources)
    for spec in config.discover:
        find_tables(str(spec["root"]), max_depth=0)  # the root exists and is local
    explicit = {_normalized(s) for s in sources}
    service = Service(
        StateRoot(config.state_root),
        sources,
        config.options,
        discover=(lambda: _discovered(config, explicit)) if config.discover else None,
    )
    server = None
    if config.listen is not None:
        host, _, port = config.listen.rpartition(":")
        if not host or not port.isdigit():
            raise ConfigError(f"[service] listen must be HOST:PORT, got {config.listen!r}", file=config_path)
        server = HealthServer(host, int(port), lambda: service.stats, config.ready_lag_seconds)
        server.start()
        log.info("metrics and health on http://%s:%d/ (/metrics, /healthz, /readyz)", host, server.port)
    tune_for_latency()
    stop_on_signals(service.stop)
    progress = ServiceProgress(lambda: service.stats)
    try:
        with progress:
            service.run()
    finally:
        if server is not None:
            server.close()
    return 0
