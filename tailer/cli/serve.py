"""``deltatail serve --config FILE``: follow every table a TOML file names or discovers, in one process.

The file::

    [service]
    state_root = "/var/lib/deltatail"    # required: one state directory per table, by table id
    listen = "127.0.0.1:9108"            # /metrics, /healthz, /readyz ("off": none)
    auth_token_file = "/run/secrets/t"   # optional: /metrics and /readyz details need this bearer token
                                         # (or auth_token_env = "NAME": the token in that variable)
    ready_lag_seconds = 300              # /readyz: a catching-up table within this lag counts as ready
    min_readable_seconds = 86400         # /readyz: not ready once a table's oldest undelivered version
                                         # stays readable (retention) for less than this
    workers = 2                          # threads stepping tables
    step_versions = 50                   # versions a table delivers before the others get their turn
    safety_poll_seconds = 10             # watched local tables are looked at this often without a signal
    discover_seconds = 30                # how often discovery roots are scanned again
    fatal_seconds = 60                   # the state root unusable this long: exit non-zero (restart me)
    stall_seconds = 30                   # a table's step running this long: reported unavailable
    signal_kafka_topic = "kafka://b:9092/s" # Debezium signals: snapshot requests (tailer/serve/signal_topic.py)
    signal_kafka_key = "deltatail"       # the key of this service's signal messages

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
Delta tables (``net_changes``, ``key``, an ``on_data_loss`` other than ``fail``) are refused for them. Sink URIs may
hold ``{table_name}`` and ``{table_id}`` (for a Lance dataset, its
:func:`~tailer.lance.follow.lance_state_id`). A discovered table is
named by its path relative to the root, ``/`` written ``.``. Everything is
checked before anything starts: an unknown key, a table path that does not
exist, two tables that are one, a filter naming a missing column, a bad sink
URI (scheme, options, Kafka options; nothing is connected to), a state root
that cannot be written, an address in use — each is an error naming the key or
table. A table whose store is unavailable at start-up (it fails, throttles,
times out) is not an error of the configuration: that table starts
``unavailable`` and is retried while the others run. A discovered table whose
sink URI is bad is not followed, and said so once in the log.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from dataclasses import dataclass, replace
from pathlib import Path

from deltatail.state.errors import ConfigError, DeltaTailError, StorageError
from deltatail.tailer.cli.configure import tailer_config
from deltatail.tailer.cli.model import ServeTableSettings, TableSettings
from deltatail.tailer.cli.process import return_memory_promptly, stop_on_signals, tune_for_latency
from deltatail.tailer.cli.progress import ServiceProgress
from deltatail.tailer.cli.serve_config import ServeConfig, load_serve_config
from deltatail.tailer.cli.sink_uri import open_sink
from deltatail.tailer.formats.base import DATA_LOSS, KEY, NET_CHANGES
from deltatail.tailer.formats.registry import FALLBACK, claimed, open_table
from deltatail.tailer.runtime.transient import is_transient
from deltatail.tailer.serve.discovery import find_tables
from deltatail.tailer.serve.http import HealthServer
from deltatail.tailer.serve.service import Service, TableSource
from deltatail.tailer.serve.signal_topic import SignalTopic
from deltatail.tailer.serve.state_root import StateRoot, probe_state_root
from deltatail.tailer.sink import Sink
from deltatail.tailer.storage.local import to_local_path

__all__ = ["ServeConfig", "check_tables", "load_serve_config", "serve", "source"]

log = logging.getLogger("deltatail")

#: Settings of ``run`` a format may refuse (:meth:`~tailer.formats.base.TableFormat.refused`), by their keys here.
REFUSABLE = {NET_CHANGES: "net_changes", KEY: "key", DATA_LOSS: "on_data_loss"}


# ---------------------------------------------------------------- tables --


@dataclass(frozen=True)
class SinkFactory:
    """Makes a table's sink from the service's sink URI, filled for the table (a :attr:`TableSource.make_sink`)."""

    uri: str
    name: str

    def filled(self, tid: str) -> str:
        """The URI for the table of id ``tid`` (Kafka fills its topic's ``{table_id}`` itself)."""
        filled = self.uri.replace("{table_name}", self.name)
        if not filled.startswith("kafka://"):
            filled = filled.replace("{table_id}", tid)
        return filled

    def __call__(self, tid: str) -> Sink:
        """A new, unopened sink for the table of id ``tid``."""
        return open_sink(self.filled(tid), shared=True)


def _sink_file(uri: str) -> Path | None:
    """The file or directory a ``jsonl:PATH`` or ``parquet:DIR`` URI writes to (resolved); ``None`` for others."""
    for prefix in ("jsonl:", "parquet:"):
        if uri.startswith(prefix) and uri not in ("jsonl:-", "jsonl:"):
            return Path(uri[len(prefix) :]).resolve()
    return None


def check_distinct_sinks(sources: list[TableSource], ids: Mapping[str, str]) -> None:
    """Refuse two tables whose filled sink URIs write to the same file or directory.

    A sink's file records one table's rows (:mod:`sinks.embedded`), so a second table there is
    refused at start-up instead of when its tailer opens the sink (``jsonl:-`` and Kafka are
    not files: several tables may share them).

    Args:
        sources: the configured tables.
        ids: each table's id, by name (:func:`check_tables`); a table missing here (its store was
            unavailable at start) is checked only if its sink URI does not depend on its id.

    Raises:
        ConfigError: naming both tables and the file, or the default sink shared by discovered tables.
    """
    seen: dict[Path, str] = {}
    for s in sources:
        make = s.make_sink
        if not isinstance(make, SinkFactory) or (s.name not in ids and "{table_id}" in make.uri):
            continue
        target = _sink_file(make.filled(ids.get(s.name, "")))
        if target is None:
            continue
        if target in seen:
            raise ConfigError(
                f"tables {seen[target]!r} and {s.name!r} have the same sink {target}: a sink file holds the rows of "
                "one table; give each its own (e.g. with {table_name} in the sink URI)"
            )
        seen[target] = s.name


def check_discovered_sink(defaults: TableSettings) -> None:
    """Refuse a default file sink that would be shared by every discovered table (see :func:`check_distinct_sinks`).

    Raises:
        ConfigError: if the ``[defaults]`` sink is a ``jsonl:PATH`` or ``parquet:DIR`` without ``{table_name}``
            or ``{table_id}``.
    """
    uri = defaults.sink
    if _sink_file(uri) is not None and "{table_name}" not in uri and "{table_id}" not in uri:
        raise ConfigError(
            f"[defaults] sink {uri!r} would be the sink of every discovered table: a sink file holds the rows of "
            "one table; put {table_name} or {table_id} in it"
        )


def source(name: str, settings: ServeTableSettings) -> TableSource:
    """The service's table of ``name``, with its settings (``format``: a format's name, else detected).

    Raises:
        ConfigError: for invalid settings, a ``lance://`` path with another ``format``, or settings
            the table's format refuses (``net_changes``, ``key`` for a Lance dataset).
    """
    try:
        table = open_table(
            settings.path,
            settings.storage,
            external_roots=settings.external_roots,
            format_name=settings.format,
            conflict=lambda uri, prefix, given: f"table {name!r}: {uri} is a {prefix} path, but format is {given}",
        )
    except StorageError as e:
        if not e.transient:
            raise
        log.warning("table %r: its format cannot be told now (%s); it is looked at again when it opens", name, e)
        placeholder = source(name, replace(settings, format=FALLBACK.name))
        return replace(placeholder, resolve=lambda: source(name, settings))
    asked = [k for k, key in REFUSABLE.items() if getattr(settings, key) not in (None, False, "", "fail")]
    refused = [REFUSABLE[k] for k in table.format.refused(asked)]
    if refused:
        raise ConfigError(f"table {name!r} is a {table.format.noun}: {', '.join(refused)} apply to Delta tables only")
    sink = SinkFactory(settings.sink, name)
    return TableSource(name, tailer_config(table, "", settings), sink, table=table)


def check_tables(sources: list[TableSource]) -> tuple[dict[str, str], dict[str, str]]:
    """Check every configured table before anything starts.

    Returns:
        The id of every table it could check (by name), and the tables whose store is unavailable
        now (by name, with why).

    A table whose store fails transiently (:func:`~tailer.runtime.transient.is_transient`: HTTP 5xx,
    throttling, a timeout, a refused connection) cannot be checked now: it is logged and returned,
    and the service starts it ``unavailable`` and retries it (its filter and identity are then
    checked when it opens: a table that turns out to be another entry's is failed then).

    Raises:
        DeltaTailError: naming the table: a path with no Delta table, a filter naming a column the
            table does not have, or two entries that are one table.
    """
    ids: dict[str, str] = {}
    unavailable: dict[str, str] = {}
    for s in sources:
        try:
            if s.resolve is not None:  # its format could not be told a moment ago; the service looks again itself
                s = s.resolve()
            table = s.handle()
            followed = table.format.follow(table, s.config.options)
            followed.check()
            tid = followed.table_id
        except DeltaTailError as e:
            if is_transient(e):
                log.warning("table %r cannot be checked now (%s): it starts unavailable and is retried", s.name, e)
                unavailable[s.name] = str(e)
                continue
            raise type(e)(f"table {s.name!r}: {e.message}", table=e.table, version=e.version, file=e.file) from e
        if tid in ids:
            raise ConfigError(f"tables {ids[tid]!r} and {s.name!r} are the same table (id {tid}): follow it once")
        ids[tid] = s.name
    return {name: tid for tid, name in ids.items()}, unavailable


#: What a sink URI's ``{table_id}`` is filled with when it is checked before any table id is known.
_SAMPLE_TABLE_ID = "00000000-0000-0000-0000-000000000000"


def check_sink_uris(sources: list[TableSource]) -> None:
    """Check every table's sink URI (scheme, path, options, Kafka options) without opening or connecting it.

    Raises:
        ConfigError: naming the table whose sink URI is bad.
    """
    for s in sources:
        try:
            s.make_sink(_SAMPLE_TABLE_ID)  # builds the sink (parses its URI); opening it is the tailer's
        except DeltaTailError as e:
            raise ConfigError(f"table {s.name!r}: {e.message}", table=s.config.table) from e


def _discovered(config: ServeConfig, known_paths: set[str], refused: set[str]) -> list[TableSource]:
    """The discovered tables to follow; one that cannot be followed is logged once (its path goes to ``refused``)."""
    out: list[TableSource] = []
    for spec in config.discover:
        root = spec.root
        for path in find_tables(root, include=spec.include, exclude=spec.exclude, max_depth=spec.max_depth):
            if path in known_paths:
                continue
            name = Path(path).relative_to(Path(root).resolve()).as_posix().replace("/", ".")
            fmt = claimed(path)
            if fmt is None:  # no longer a table since it was found
                continue
            try:
                found = source(name, replace(config.defaults, path=path, format=fmt.name))
                check_sink_uris([found])
            except DeltaTailError as e:
                if path not in refused:
                    refused.add(path)
                    log.error("discovered table %s cannot be followed: %s", path, e)
                continue
            refused.discard(path)
            out.append(found)
    return out


def _normalized(source: TableSource) -> str:
    """A configured table's path as discovery writes it (to leave it to its own entry)."""
    table = to_local_path(source.config.table)
    return table.rstrip("/") if "://" in table else str(Path(table).resolve())


def serve(config_path: str) -> int:
    """Run the service of ``config_path`` until SIGINT/SIGTERM.

    Raises:
        ConfigError: for a bad configuration (before anything starts).
        DeltaTailError: a table that cannot be followed at start (named).
    """
    config = load_serve_config(config_path)
    sources = [source(name, settings) for name, settings in config.tables]
    check_sink_uris(sources)
    if config.discover:  # every discovered table's sink is [defaults]'s, {table_name} filled
        try:
            SinkFactory(config.defaults.sink, "table")(_SAMPLE_TABLE_ID)
        except DeltaTailError as e:
            raise ConfigError(f"[defaults] sink: {e.message}", file=config_path) from e
        check_discovered_sink(config.defaults)
    ids, unavailable = check_tables(sources)
    check_distinct_sinks(sources, ids)
    for spec in config.discover:
        find_tables(spec.root, max_depth=0)  # the root exists and is local
    probe_state_root(Path(config.state_root))
    explicit = {_normalized(s) for s in sources}
    refused: set[str] = set()
    state_root = StateRoot(config.state_root)
    state_root.create()
    service = Service(
        state_root,
        sources,
        config.options,
        discover=(lambda: _discovered(config, explicit, refused)) if config.discover else None,
        unavailable=unavailable,
    )
    server = None
    if config.listen is not None:
        host, _, port = config.listen.rpartition(":")
        if not host or not (port.isascii() and port.isdigit()) or int(port) > 65535:
            raise ConfigError(
                f"[service] listen must be HOST:PORT with a port of 0 to 65535, got {config.listen!r}", file=config_path
            )
        server = HealthServer(
            host,
            int(port),
            lambda: service.stats,
            config.ready_lag_seconds,
            service.health,
            auth_token=config.auth_token,
            min_readable_seconds=config.min_readable_seconds,
            watch_overflows=lambda: service.watch_overflows,
        )
        server.start()
        log.info("metrics and health on http://%s:%d/ (/metrics, /healthz, /readyz)", host, server.port)
        if config.auth_token is None and host not in ("127.0.0.1", "localhost", "::1"):
            log.warning(
                "metrics and health listen on %s with no auth_token_file or auth_token_env: anyone who can "
                "reach it reads /metrics and /readyz's table names, paths and errors",
                host,
            )
    signal_reader = None
    if config.signal_kafka_topic is not None:
        signal_reader = SignalTopic(config.signal_kafka_topic, config.signal_kafka_key, state_root)
        signal_reader.start()
    tune_for_latency()
    return_memory_promptly()
    stop_on_signals(service.stop)
    progress = ServiceProgress(lambda: service.stats)
    try:
        with progress:
            service.run()
    finally:
        if signal_reader is not None:
            signal_reader.close()
        if server is not None:
            server.close()
    return 0
