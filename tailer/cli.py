"""The ``deltatail`` command line.

Exit codes: 0 success, 2 usage error, 1 a deltatail error (the message names
the table, version and file involved).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

import orjson

from state.errors import DeltaTailError
from tailer.log import DeltaLog
from tailer.report import snapshot_document, snapshot_text


def _snapshot(args: argparse.Namespace) -> int:
    snap = DeltaLog(args.table).snapshot(args.version)
    if args.json:
        sys.stdout.buffer.write(orjson.dumps(snapshot_document(snap), option=orjson.OPT_INDENT_2) + b"\n")
    else:
        print(snapshot_text(snap))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of every subcommand."""
    parser = argparse.ArgumentParser(prog="deltatail", description="Follow a Delta table's log as a change feed.")
    parser.add_argument("-v", "--verbose", action="store_true", help="log debug details to stderr")
    sub = parser.add_subparsers(dest="command", required=True)
    snap = sub.add_parser("snapshot", help="show the reconciled state of a table at a version")
    snap.add_argument("table", help="table root: the directory that holds _delta_log")
    snap.add_argument("--version", type=int, default=None, help="version to show (default: latest)")
    snap.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    snap.set_defaults(handler=_snapshot)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s %(message)s",
        stream=sys.stderr,
    )
    try:
        code: int = args.handler(args)
        return code
    except DeltaTailError as e:
        print(f"deltatail: error: {e}", file=sys.stderr)
        return 1
    except BrokenPipeError:
        return 0


if __name__ == "__main__":
    sys.exit(main())
