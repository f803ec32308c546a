"""The command line's table argument: ``--format`` and the table's handle (:func:`open_cli_table`).

A table argument is a path or URI; a format's URI prefix (``lance://PATH``) or ``--format`` names
its format, else its layout does (:func:`tailer.formats.registry.open_table`).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from deltatail.tailer.cli.model import TableArg
from deltatail.tailer.follow.service import Runner
from deltatail.tailer.follow.stats import TableStats
from deltatail.tailer.follow.tailer import TailerConfig
from deltatail.tailer.formats.registry import format_names, open_table
from deltatail.tailer.sink import Sink
from deltatail.tailer.storage.options import parse_option_pairs
from deltatail.tailer.table import TableRef


def add_format_option(parser: argparse.ArgumentParser) -> None:
    """The ``--format`` flag of a subcommand that takes a table."""
    parser.add_argument(
        "--format",
        choices=format_names(),
        default=None,
        help="the table's format (default: lance:// URIs and directories with _versions/ are Lance, else Delta)",
    )


def flag_storage_options(args: argparse.Namespace) -> dict[str, str]:
    """The ``--storage-option KEY=VALUE`` flags of a command (``env:NAME`` and ``@FILE`` values resolved).

    Raises:
        ConfigError: for a malformed pair or a reference that cannot be resolved.
    """
    return parse_option_pairs(getattr(args, "storage_option", None) or [])


def open_cli_table(args: argparse.Namespace) -> TableRef:
    """The handle of the command's table (``args.table``, ``--storage-option``, ``--format``, ``--external-root``).

    Raises:
        ConfigError: for a format prefix contradicting ``--format``, or storage options for a local path.
        StorageError: if the format has to be detected and the store cannot be reached.
    """
    return open_arg(
        TableArg(
            args.table,
            flag_storage_options(args),
            tuple(getattr(args, "external_roots", None) or ()),
            getattr(args, "format", None),
        )
    )


def open_arg(table: TableArg) -> TableRef:
    """The handle of a command's table, from its settings (:class:`~tailer.cli.model.TableArg`).

    Raises:
        ConfigError: for a format prefix contradicting ``--format``, or storage options for a local path.
        StorageError: if the format has to be detected and the store cannot be reached.
    """
    return open_table(
        table.uri,
        table.storage,
        external_roots=table.external_roots,
        format_name=table.format,
        conflict=lambda uri, prefix, given: f"{uri} is a {prefix} URI, but --format {given} was given",
    )


def tailer_maker(arg: TableArg, table: TableRef | None, stats: TableStats) -> Callable[[TailerConfig, Sink], Runner]:
    """What makes the tailer of each ``deltatail run`` attempt (reporting to ``stats``).

    The table's format's tailer, or, when the format could not be told yet (``table`` is ``None``:
    the store was unavailable), the tailer of whatever the table turns out to be at that attempt
    (a transient store error then makes the attempt wait and retry).
    """

    def make(config: TailerConfig, sink: Sink) -> Runner:
        opened = table if table is not None else open_arg(arg)
        return opened.format.follow(opened, config.options).tailer(config, sink, stats)

    return make
