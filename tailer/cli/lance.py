"""``deltatail snapshot|changes|run`` on a Lance dataset: detection and the Lance side of each command.

A table argument is a Lance dataset when it is written ``lance://PATH`` (``lance:///data/ds``,
``lance://s3://bucket/ds``), when ``--format lance`` is given, or, without either, when its layout
says so: a ``_versions/`` directory holding manifests. ``--format delta`` skips the look.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

import orjson

from state.errors import ConfigError
from state.feed import TableInfo
from state.lance.manifest import Manifest
from tailer.cli.configure import change_filter
from tailer.cli.outputs import write_changes
from tailer.follow.service import Runner
from tailer.follow.stats import TableStats
from tailer.follow.tailer import Tailer, TailerConfig, table_name
from tailer.lance.dataset import LanceDataset, looks_like_lance
from tailer.lance.feed import LanceFeed, LanceOptions
from tailer.lance.follow import LanceTailer, lance_table_id
from tailer.parse import parse_timestamp_ms
from tailer.sink import Sink
from tailer.storage import Storage
from tailer.storage.factory import storage_for
from tailer.storage.options import parse_option_pairs

PREFIX = "lance://"


def add_format_option(parser: argparse.ArgumentParser) -> None:
    """The ``--format`` flag of a subcommand that takes a table."""
    parser.add_argument(
        "--format",
        choices=("delta", "lance"),
        default=None,
        help="the table's format (default: lance:// URIs and directories with _versions/ are Lance, else Delta)",
    )


def is_lance(args: argparse.Namespace, storage_options: dict[str, str] | None) -> bool:
    """Whether the command's table is a Lance dataset; strips a ``lance://`` prefix from ``args.table``.

    Raises:
        ConfigError: for ``lance://`` with ``--format delta``.
    """
    fmt = getattr(args, "format", None)
    if args.table.startswith(PREFIX):
        if fmt == "delta":
            raise ConfigError(f"{args.table} is a lance:// URI, but --format delta was given")
        args.table = args.table[len(PREFIX) :]
        return True
    if fmt is not None:
        return bool(fmt == "lance")
    return looks_like_lance(args.table, storage_for(args.table, storage_options or None))


# -- snapshot ----------------------------------------------------------------------------------


def snapshot_document(manifest: Manifest, table: str) -> dict[str, Any]:
    """A Lance version as the JSON document ``deltatail snapshot --json`` prints.

    Fields: ``format`` (``lance``), ``table``, ``version``, ``timestamp`` (ISO-8601 UTC),
    ``readerFeatureFlags``, ``stableRowIds``, ``schema`` (each field's ``id``, ``parentId``, ``name``,
    ``type`` and ``nullable``), ``config``, ``liveRows`` and ``fragments`` (``id``, ``physicalRows``,
    ``deletedRows``, ``deletionFile``, ``dataFiles``), in fragment-id order.
    """
    stamp = datetime.fromtimestamp(manifest.timestamp_us / 1e6, UTC).isoformat().replace("+00:00", "Z")
    return {
        "format": "lance",
        "table": table,
        "version": manifest.version,
        "timestamp": stamp,
        "readerFeatureFlags": manifest.reader_flags,
        "stableRowIds": manifest.stable_row_ids,
        "schema": [
            {"id": f.id, "parentId": f.parent_id, "name": f.name, "type": f.logical_type, "nullable": f.nullable}
            for f in manifest.fields
        ],
        "config": dict(sorted(manifest.config.items())),
        "liveRows": manifest.live_rows,
        "fragments": [
            {
                "id": f.id,
                "physicalRows": f.physical_rows,
                "deletedRows": 0 if f.deletion is None else f.deletion.num_deleted_rows,
                "deletionFile": None if f.deletion is None else f.deletion.path,
                "dataFiles": [{"path": d.path, "fields": list(d.fields)} for d in f.files],
            }
            for f in sorted(manifest.fragments, key=lambda f: f.id)
        ],
    }


def snapshot_text(doc: dict[str, Any]) -> str:
    """A human-readable rendering of :func:`snapshot_document`."""
    lines = [
        f"table    {doc['table']} (Lance)",
        f"version  {doc['version']}  ({doc['timestamp']})",
        f"features reader flags {doc['readerFeatureFlags']}  stable row ids {'yes' if doc['stableRowIds'] else 'no'}",
        "schema",
    ]
    for f in doc["schema"]:
        null = "" if f["nullable"] else " not null"
        parent = "" if f["parentId"] < 0 else f"  (in field {f['parentId']})"
        lines.append(f"  {f['name']}: {f['type']}{null}  [field {f['id']}]{parent}")
    for key, value in doc["config"].items():
        lines.append(f"  {key} = {value}")
    lines.append(f"fragments {len(doc['fragments'])} ({doc['liveRows']} live rows)")
    for f in doc["fragments"]:
        deleted = "" if f["deletionFile"] is None else f"  {f['deletedRows']} deleted ({f['deletionFile']})"
        files = ", ".join(d["path"] for d in f["dataFiles"])
        lines.append(f"  fragment {f['id']}: {f['physicalRows']} rows{deleted}  data {files}")
    return "\n".join(lines)


def snapshot(args: argparse.Namespace) -> int:
    """``deltatail snapshot`` on a Lance dataset."""
    options = parse_option_pairs(args.storage_option or [])
    roots = tuple(args.external_roots or ())
    dataset = LanceDataset(args.table, storage_for(args.table, options or None), external_roots=roots)
    version = dataset.latest_version() if args.version is None else args.version
    doc = snapshot_document(dataset.manifest(version), dataset.root)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(snapshot_text(doc))
    return 0


# -- changes -----------------------------------------------------------------------------------


def changes(args: argparse.Namespace) -> int:
    """``deltatail changes`` on a Lance dataset (``--net-changes`` and ``--key`` do not apply).

    Raises:
        ConfigError: for ``--net-changes``/``--key``, or an output that is neither .jsonl nor .parquet.
    """
    if args.net_changes or args.key:
        raise ConfigError("--net-changes and --key apply to Delta tables, not to Lance datasets")
    options = parse_option_pairs(args.storage_option or [])
    feed = LanceFeed(
        args.table,
        options=LanceOptions(filter=change_filter(vars(args)), external_roots=tuple(args.external_roots or ())),
        storage_options=options or None,
    )
    start_ms = None
    if args.starting_timestamp is not None:
        start_ms = parse_timestamp_ms(args.starting_timestamp, name="--starting-timestamp")
    starting = feed.dataset.latest_version() if args.starting_version == "latest" else args.starting_version
    batches = feed.batches(
        starting, args.ending_version, starting_timestamp_ms=start_ms, initial_snapshot=args.initial_snapshot
    )
    return write_changes(
        batches,
        args.output,
        lambda: TableInfo(feed.table, lance_table_id(feed.table), table_name(feed.table)),
        lambda: feed.options.filter.output_schema(feed.rows.schema(feed.dataset.latest_version())),
    )


# -- run ---------------------------------------------------------------------------------------


def run_start(table: str, storage: Storage, value: object) -> int | None:
    """``--starting-version`` for ``run``: a number, or ``latest`` (the versions after the current latest).

    Raises:
        ConfigError: if it is neither.
    """
    if value is None:
        return None
    if value == "latest":
        return LanceDataset(table, storage).latest_version() + 1
    try:
        return int(str(value))
    except ValueError:
        raise ConfigError(f"starting version must be a number or 'latest', got {value!r}") from None


def make_tailer(config: TailerConfig, sink: Sink, stats: TableStats | None = None) -> LanceTailer:
    """The tailer of one ``deltatail run`` attempt on a Lance dataset (reporting to ``stats``)."""
    return LanceTailer(config, sink, stats=stats)


def tailer_maker(is_lance: bool | None, stats: TableStats) -> Callable[[TailerConfig, Sink], Runner]:
    """What makes the tailer of each ``deltatail run`` attempt.

    Lance's, Delta's (with ``stats``), or, when the format could not be told yet (``None``: the
    store was unavailable), whichever the table turns out to be at that attempt (a transient store
    error then makes the attempt wait and retry).
    """

    def delta(config: TailerConfig, sink: Sink) -> Runner:
        return Tailer(config, sink, stats=stats)

    def lance(config: TailerConfig, sink: Sink) -> Runner:
        return make_tailer(config, sink, stats)

    def detect(config: TailerConfig, sink: Sink) -> Runner:
        storage = storage_for(config.table, config.storage_options or None)
        return lance(config, sink) if looks_like_lance(config.table, storage) else delta(config, sink)

    if is_lance is None:
        return detect
    return lance if is_lance else delta
