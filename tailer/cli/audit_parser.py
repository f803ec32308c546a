"""The argument parser of ``deltatail audit``, apart from the command (:mod:`tailer.cli.audit`).

Every command's parser is built on every start; this module keeps the audit one light: the
command's module, and the audit code behind it, is imported only when ``audit`` runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

from deltatail.tailer.cli.lazy import EXIT_ALERTS, deferred
from deltatail.tailer.cli.settings import external_root_option, flag_type


def add_parser(sub: Any) -> None:
    """Register ``deltatail audit`` on the subcommands ``sub`` (an argparse subparsers action)."""
    p: argparse.ArgumentParser = sub.add_parser(
        "audit",
        help="who changed the table, what, when and how much: per commit, for a range or as commits land",
        description="Audit events of a table's commits, with alert rules from the settings file's [audit] table.",
    )
    p.add_argument("table", help="table root")
    start = p.add_mutually_exclusive_group()
    start.add_argument(
        "--starting-version",
        type=flag_type("starting_version"),
        default=None,
        help="first version (default: the oldest the log can audit), or latest (--follow: only new commits)",
    )
    start.add_argument("--starting-timestamp", default=None, help="first commit at or after this time (ISO-8601)")
    p.add_argument("--ending-version", type=int, default=None, help="last version (default: the latest now)")
    p.add_argument(
        "--format", choices=("table", "jsonl"), default=None, help="stdout: table (on a terminal) or JSON lines"
    )
    p.add_argument("--counted", action="store_true", help="row figures counted from change rows (reads data)")
    p.add_argument("--html", default=None, metavar="FILE", help="write the HTML report of the range")
    p.add_argument(
        "--output",
        default=None,
        metavar="FILE",
        help="the audit log, FILE.jsonl or FILE.parquet, instead of stdout (--follow appends exactly once)",
    )
    p.add_argument("--alert-output", default=None, metavar="FILE.jsonl", help="append the alerts raised, as JSON lines")
    p.add_argument(
        "--fail-on",
        choices=("warning", "critical"),
        default=None,
        help=f"exit with {EXIT_ALERTS} if an alert of at least this severity was raised (a range, or until stopped)",
    )
    p.add_argument("--config", default=None, help="TOML settings file: [[audit.alerts]], [audit.webhook], [storage]")
    p.add_argument("--follow", action="store_true", help="keep going as commits land (needs --state-dir)")
    p.add_argument("--state-dir", default=None, help="--follow: where the cursor and snapshot are kept")
    p.add_argument(
        "--poll-interval", type=flag_type("poll_interval"), default=None, help="--follow: seconds between looks"
    )
    p.add_argument(
        "--max-poll-interval",
        type=flag_type("max_poll_interval"),
        default=None,
        help="--follow: longest idle wait (object stores)",
    )
    p.add_argument("--no-watch", action="store_const", const=True, default=None, help="--follow: poll only")
    p.add_argument(
        "--checkpoint-commits",
        type=flag_type("checkpoint_commits"),
        default=None,
        help="--follow: save the cursor every N commits",
    )
    p.add_argument(
        "--checkpoint-seconds", type=flag_type("checkpoint_seconds"), default=None, help="--follow: or every S seconds"
    )
    p.add_argument(
        "--snapshot-commits",
        type=flag_type("snapshot_commits"),
        default=None,
        help="--follow: save the snapshot every N commits",
    )
    p.add_argument(
        "--until-caught-up", action="store_const", const=True, default=None, help="--follow: exit when caught up"
    )
    p.add_argument(
        "--storage-option",
        action="append",
        metavar="KEY=VALUE",
        help="an object-store option as delta-rs spells it (AWS_REGION=..., AZURE_STORAGE_ACCOUNT_NAME=...)",
    )
    external_root_option(p)
    p.set_defaults(handler=_run_audit)


def _run_audit(args: argparse.Namespace) -> int:
    """:func:`tailer.cli.audit.run_audit`, imported now."""
    run_audit: Callable[[argparse.Namespace], int] = deferred("deltatail.tailer.cli.audit", "run_audit")
    return run_audit(args)
