"""The ``deltatail`` command line.

Exit codes (:data:`EXIT_CODES`, the README's "Exit codes"): 0 success, 1 a deltatail error (the
message names the table, version and file involved), 2 a usage or configuration error (argparse's
own, and every :class:`~state.errors.ConfigError`), 3 ``deltatail audit --fail-on``: an alert of at
least that severity fired.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
from collections.abc import Callable, Sequence

import orjson

from deltatail._version import __version__
from deltatail.state.errors import ConfigError, DeltaTailError, StorageError
from deltatail.tailer.cli import audit_parser, logs
from deltatail.tailer.cli.configure import DEFAULT_SINK, READ_DEFAULTS, RUN_DEFAULTS, tailer_config
from deltatail.tailer.cli.cursor import add_parsers as add_cursor_parsers
from deltatail.tailer.cli.lazy import EXIT_ALERTS, deferred
from deltatail.tailer.cli.model import changes_settings, run_settings, snapshot_settings
from deltatail.tailer.cli.outputs import write_changes
from deltatail.tailer.cli.process import return_memory_promptly, stop_on_signals, tune_for_latency
from deltatail.tailer.cli.progress import ServiceProgress
from deltatail.tailer.cli.settings import (
    DATA_LOSS_CHOICES,
    SCHEMA_CHANGE_CHOICES,
    SINK_GAP_CHOICES,
    external_root_option,
    flag_type,
)
from deltatail.tailer.cli.signal import add_parser as add_signal_parser
from deltatail.tailer.cli.sink_uri import open_sink
from deltatail.tailer.cli.tables import add_format_option, open_arg, tailer_maker
from deltatail.tailer.follow.service import TailerService
from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.follow.tailer import table_name
from deltatail.tailer.formats.base import DATA_LOSS, KEY, NET_CHANGES, ChangeRequest
from deltatail.tailer.read.feed import ChangeOptions
from deltatail.tailer.table import TableRef

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_CODES = {
    EXIT_OK: "success",
    EXIT_ERROR: "a deltatail error: bad or unreadable table, store, sink or state",
    EXIT_USAGE: "a usage or configuration error: flags, environment, config file, URIs",
    EXIT_ALERTS: "deltatail audit --fail-on: an alert of at least that severity fired",
}
"""Every exit code of the command line, and what it means."""


def _snapshot(args: argparse.Namespace) -> int:
    s = snapshot_settings(args)
    table = open_arg(s.table)
    if s.json:
        doc = table.format.snapshot_document(table, s.version)
        sys.stdout.buffer.write(orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(table.format.snapshot_text(table, s.version))
    return 0


READER_PROCESSES_HELP = (
    f"child processes reading small files while catching up (default {READ_DEFAULTS.reader_processes}; 0: none)"
)


def _changes(args: argparse.Namespace) -> int:
    s = changes_settings(args)
    table = open_arg(s.table)
    asked = {NET_CHANGES: ("--net-changes", s.net_changes), KEY: ("--key", bool(s.key))}
    refused = table.format.refused([k for k, (_, on) in asked.items() if on])
    if refused:
        flags = " and ".join(asked[k][0] for k in refused)
        verb = "applies" if len(refused) == 1 else "apply"
        raise ConfigError(f"{flags} {verb} to Delta tables, not to {table.format.noun}s")
    options = ChangeOptions(
        net_changes=s.net_changes,
        key_columns=s.key,
        reader_processes=s.reader_processes,
        filter=s.filter,
        external_roots=table.external_roots,
    )
    latest = s.starting_version == "latest"
    request = ChangeRequest(
        starting_version=None if latest or s.starting_version is None else int(s.starting_version),
        latest=latest,
        ending_version=s.ending_version,
        starting_timestamp_ms=s.starting_timestamp_ms,
        initial_snapshot=s.initial_snapshot,
        options=options,
    )
    run = table.format.change_batches(table, request)
    return write_changes(run.batches, s.output, run.info, run.schema)


def _run(args: argparse.Namespace) -> int:
    s = run_settings(args)
    arg = s.table_arg(s.table)
    try:
        table: TableRef | None = open_arg(arg)
    except StorageError as e:
        if not e.transient:
            raise
        table = None  # the store is unavailable now: each attempt of the service looks again
    config = tailer_config(s.table if table is None else table, s.state_dir, s)
    if table is not None and config.on_data_loss != "fail" and table.format.refused([DATA_LOSS]):
        raise ConfigError(
            f"on_data_loss applies to Delta tables only: the stream of this {table.format.noun} fails on a lost version"
        )
    tune_for_latency()
    return_memory_promptly()
    stats = TableStats(config.table, table_name(config.table))
    service = TailerService(
        config,
        lambda: open_sink(s.sink),
        retries=s.sink_retries,
        make_tailer=tailer_maker(arg, table, stats),
        stats=stats,
    )
    stop_on_signals(service.stop)
    with ServiceProgress(lambda: [service.stats]):
        progress = service.run()
    logging.getLogger("deltatail").info(
        "stopped: %d versions, %d rows delivered, %d already held by the sink",
        progress.versions,
        progress.rows,
        progress.held,
    )
    return 0


def _serve(args: argparse.Namespace) -> int:
    serve: Callable[[str], int] = deferred("deltatail.tailer.cli.serve", "serve")
    return serve(args.config)


def _demo(args: argparse.Namespace) -> int:
    run_demo: Callable[..., int] = deferred("deltatail.tailer.cli.demo", "run_demo")
    rows = run_demo(commits=args.commits, interval=args.interval)
    logging.getLogger("deltatail").info("demo done: %d change rows delivered", rows)
    return 0


def _filter_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--columns", default=None, help="table columns to deliver (COL,...); the change columns go too")
    parser.add_argument("--where", default=None, help="a SQL predicate rows must meet (amount > 10)")
    parser.add_argument(
        "--change-types", default=None, help="deliver only these (insert,delete,update_preimage,update_postimage)"
    )
    parser.add_argument("--skip-operations", default=None, help="operations whose commits deliver nothing")


def _storage_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="an object-store option as delta-rs spells it (AWS_REGION=..., AZURE_STORAGE_ACCOUNT_NAME=...)",
    )


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser: argparse.ArgumentParser = logs.JsonErrorParser(
        prog="deltatail", description="Follow a Delta table's log as a change feed."
    )
    parser.add_argument("--version", action="version", version=f"deltatail {__version__}")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details to stderr")
    parser.add_argument(
        "--log-format", choices=("text", "json"), default=None, help="stderr logs as text (default) or JSON lines"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot", help="show the reconciled state of a table at a version")
    snap.add_argument("table", help="table root: the directory (or s3://, az://, gs:// URI) that holds _delta_log")
    snap.add_argument("--version", type=int, default=None, help="version to show (default: latest)")
    snap.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    _storage_option(snap)
    external_root_option(snap)  # Lance manifests are checked when read; Delta snapshots read no data file
    add_format_option(snap)
    snap.set_defaults(handler=_snapshot)

    ch = sub.add_parser("changes", help="print the change rows of a range of versions")
    ch.add_argument("table", help="table root")
    start = ch.add_mutually_exclusive_group()
    start.add_argument(
        "--starting-version",
        type=flag_type("starting_version"),
        default=None,
        help="first version, or latest (default 0)",
    )
    start.add_argument("--starting-timestamp", default=None, help="first commit at or after this time (ISO-8601)")
    ch.add_argument("--ending-version", type=int, default=None, help="last version (default: latest)")
    ch.add_argument("--initial-snapshot", action="store_true", help="emit the live rows at the start first")
    ch.add_argument("--net-changes", action="store_true", help="cancel rewrite noise in commits without cdc files")
    ch.add_argument("--key", default=None, help="key columns (COL,...) pairing net changes into updates")
    ch.add_argument("--output", default=None, help="FILE.jsonl or FILE.parquet (default: JSON lines on stdout)")
    ch.add_argument("--reader-processes", type=flag_type("reader_processes"), default=None, help=READER_PROCESSES_HELP)
    _storage_option(ch)
    external_root_option(ch)
    _filter_options(ch)
    add_format_option(ch)
    ch.set_defaults(handler=_changes)

    run = sub.add_parser("run", help="follow a table and deliver its changes to a sink")
    run.add_argument("table", help="table root")
    run.add_argument("--config", default=None, help="TOML file with settings (flags win, then DELTATAIL_* env)")
    run.add_argument("--state-dir", default=None, help="where the tailer keeps its cursor and snapshot")
    run.add_argument(
        "--sink", default=None, help=f"{DEFAULT_SINK} (default), jsonl:PATH, parquet:DIR, kafka://HOST:PORT/TOPIC"
    )
    run_start = run.add_mutually_exclusive_group()
    run_start.add_argument(
        "--starting-version",
        type=flag_type("starting_version"),
        default=None,
        help="first version on a new state dir, or latest (only commits after the current latest)",
    )
    run_start.add_argument("--starting-timestamp", default=None, help="first commit at or after this time")
    run.add_argument("--initial-snapshot", action="store_const", const=True, default=None, help="emit live rows first")
    d = RUN_DEFAULTS
    run.add_argument(
        "--poll-interval",
        type=flag_type("poll_interval"),
        default=None,
        help=f"seconds between looks (default {RUN_DEFAULTS.poll_interval:g})",
    )
    run.add_argument(
        "--max-poll-interval",
        type=flag_type("max_poll_interval"),
        default=None,
        help=f"object stores: the longest idle wait; the interval doubles up to it (default {d.max_poll_interval:g})",
    )
    run.add_argument("--no-watch", action="store_const", const=True, default=None, help="poll only, no inotify")
    run.add_argument(
        "--notifications",
        default=None,
        metavar="QUEUE_URL",
        help="object stores: an SQS queue of the bucket's S3 event notifications; look when one names the log, "
        "else every --max-poll-interval",
    )
    run.add_argument(
        "--checkpoint-commits",
        type=flag_type("checkpoint_commits"),
        default=None,
        help=f"checkpoint every N commits ({d.checkpoint_commits})",
    )
    run.add_argument(
        "--checkpoint-seconds",
        type=flag_type("checkpoint_seconds"),
        default=None,
        help=f"or every S seconds ({d.checkpoint_seconds:g})",
    )
    run.add_argument(
        "--snapshot-commits",
        type=flag_type("snapshot_commits"),
        default=None,
        help=f"save the snapshot every N commits ({d.snapshot_commits})",
    )
    run.add_argument(
        "--flush-rows",
        type=flag_type("flush_rows"),
        default=None,
        help=f"flush the sink and save the cursor every N rows, inside a commit too: bounds memory ({d.flush_rows})",
    )
    run.add_argument("--until-caught-up", action="store_const", const=True, default=None, help="exit when caught up")
    run.add_argument("--net-changes", action="store_const", const=True, default=None, help="cancel rewrite noise")
    run.add_argument("--key", default=None, help="key columns for --net-changes update pairing")
    run.add_argument(
        "--on-schema-change",
        choices=SCHEMA_CHANGE_CHOICES,
        default=None,
        help="at a dropped, renamed or retyped column: evolve (default: go on, every row in the schema of its "
        "version) or stop (stop before the version, everything before it delivered)",
    )
    run.add_argument(
        "--allow-non-additive",
        action="store_const",
        const=True,
        default=None,
        help="deprecated alias of --on-schema-change evolve (the default)",
    )
    run.add_argument(
        "--sink-retries",
        type=flag_type("sink_retries"),
        default=None,
        help="restarts from the saved cursor while the sink is unavailable (default: keep retrying; 0: fail at once)",
    )
    run.add_argument(
        "--on-sink-gap",
        choices=SINK_GAP_CHOICES,
        default=None,
        help="the sink holds fewer rows than were delivered to it (file truncated, deleted, rotated): "
        "fail (default) or accept (warn and go on)",
    )
    run.add_argument(
        "--on-data-loss",
        choices=DATA_LOSS_CHOICES,
        default=None,
        help="data the tailer still needs is gone (log cleaned up past the cursor, files vacuumed): fail "
        "(default), resnapshot (deliver the table's current rows as a snapshot, go on from there) or skip "
        "(jump to the oldest readable state); a loss is logged and counted",
    )
    run.add_argument("--reader-processes", type=flag_type("reader_processes"), default=None, help=READER_PROCESSES_HELP)
    _storage_option(run)
    external_root_option(run)
    _filter_options(run)
    add_format_option(run)
    run.set_defaults(handler=_run)

    add_cursor_parsers(sub, _storage_option)
    add_signal_parser(sub, _storage_option)

    srv = sub.add_parser("serve", help="follow every table a TOML file names or discovers, in one process")
    srv.add_argument("--config", required=True, help="the service's TOML file (see the README's Service section)")
    srv.set_defaults(handler=_serve)

    audit_parser.add_parser(sub)

    demo = sub.add_parser("demo", help="tail a copy of the bundled sample table while a writer changes it")
    demo.add_argument(
        "--commits", type=flag_type("demo_commits"), default=8, help="how many commits the writer makes (default 8)"
    )
    demo.add_argument(
        "--interval",
        type=flag_type("demo_interval"),
        default=1.0,
        help="seconds between the writer's commits (default 1)",
    )
    demo.set_defaults(handler=_demo)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code (:data:`EXIT_CODES`)."""
    args_list = list(sys.argv[1:] if argv is None else argv)
    log_format = _log_format(args_list)
    if log_format not in ("text", "json"):
        logs.fatal_line(f"log format must be text or json, got {log_format!r}", json_lines=False)
        return EXIT_USAGE
    logs.JsonErrorParser.json_lines = log_format == "json"
    args = build_parser().parse_args(args_list)
    logs.configure(verbose=args.verbose, json_lines=log_format == "json")
    try:
        code: int = args.handler(args)
        return code
    except ConfigError as e:
        logs.fatal(e, verbose=args.verbose, json_lines=log_format == "json", exit_code=EXIT_USAGE)
        return EXIT_USAGE
    except DeltaTailError as e:
        logs.fatal(e, verbose=args.verbose, json_lines=log_format == "json", exit_code=EXIT_ERROR)
        return EXIT_ERROR
    except BrokenPipeError:
        return EXIT_OK
    except OSError as e:  # a fault no layer below named: still one line (each layer names table and file first)
        error = DeltaTailError(
            f"file system error: {e.strerror or e}", file=None if e.filename is None else str(e.filename)
        )
        logs.fatal(error, verbose=args.verbose, json_lines=log_format == "json", exit_code=EXIT_ERROR)
        return EXIT_ERROR


def _log_format(argv: Sequence[str]) -> str:
    """``--log-format`` as given before the subcommand (the last one wins, as argparse does), else the environment.

    Read before parsing, so that usage errors come out in the chosen format too.
    """
    chosen = os.environ.get("DELTATAIL_LOG_FORMAT", "text")
    i = 0
    while i < len(argv):
        a = argv[i]
        if a == "--":
            break
        if a == "--log-format" and i + 1 < len(argv):
            chosen = argv[i + 1]
            i += 1
        elif a.startswith("--log-format="):
            chosen = a.split("=", 1)[1]
        elif not a.startswith("-"):
            break  # the subcommand: its own arguments follow
        i += 1
    return chosen
