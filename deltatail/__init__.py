"""deltatail's front door: the public Python API, and ``python -m deltatail`` for the command line.

The API, each documented where it lives:

- :class:`ChangeFeed` (``ChangeFeed(table).batches(starting_version, ending_version)``): the change
  rows of a range of versions, as :class:`ChangeBatch` values of Arrow record batches.
- :class:`DeltaLog` (``DeltaLog(table).snapshot(version)``): the log, its versions and snapshots.
- :class:`Tailer` and :class:`TailerConfig`: follow a table into a :class:`Sink`, checkpointing a
  :class:`Position` so a restart loses and repeats nothing.
- :class:`Sink`, :class:`TableInfo`: the sink contract, to write a sink of one's own.
- :class:`DeltaTailError` and its subclasses: every error deltatail raises; each names the table,
  version and file involved.

The code lives in three sub-packages, ``deltatail.state`` (pure), ``deltatail.tailer`` (IO and
orchestration) and ``deltatail.sinks`` (the repository's folders ``state/``, ``tailer/`` and ``sinks/``);
this module re-exports what a user needs, so ``import deltatail`` is the one name to know.

The names load on first use (a module ``__getattr__``, PEP 562): ``import deltatail`` and
``deltatail --version`` import neither the command line nor pyarrow, so a command starts in the time
its own work needs (tests/test_front_door.py checks ``sys.modules`` in a child process).
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from deltatail._version import __version__

if TYPE_CHECKING:  # what mypy and editors see; at run time __getattr__ below imports each on first use
    from deltatail.state.cursor import Position
    from deltatail.state.errors import (
        ConfigError,
        DeltaTailError,
        InvalidLogError,
        MissingFileError,
        SinkError,
        SinkUnavailableError,
        StateError,
        StorageError,
        UnsafePathError,
        UnsupportedFeatureError,
        VersionGapError,
    )
    from deltatail.state.feed import ChangeBatch, TableInfo
    from deltatail.tailer.follow.config import TailerConfig
    from deltatail.tailer.follow.tailer import Tailer
    from deltatail.tailer.log.delta_log import DeltaLog
    from deltatail.tailer.read.feed import ChangeFeed
    from deltatail.tailer.sink import Sink

_ERRORS = "deltatail.state.errors"
#: Each public name, and the module it lives in (imported when the name is first used).
_HOMES = {
    "ChangeBatch": "deltatail.state.feed",
    "ChangeFeed": "deltatail.tailer.read.feed",
    "ConfigError": _ERRORS,
    "DeltaLog": "deltatail.tailer.log.delta_log",
    "DeltaTailError": _ERRORS,
    "InvalidLogError": _ERRORS,
    "MissingFileError": _ERRORS,
    "Position": "deltatail.state.cursor",
    "Sink": "deltatail.tailer.sink",
    "SinkError": _ERRORS,
    "SinkUnavailableError": _ERRORS,
    "StateError": _ERRORS,
    "StorageError": _ERRORS,
    "TableInfo": "deltatail.state.feed",
    "Tailer": "deltatail.tailer.follow.tailer",
    "TailerConfig": "deltatail.tailer.follow.config",
    "UnsafePathError": _ERRORS,
    "UnsupportedFeatureError": _ERRORS,
    "VersionGapError": _ERRORS,
}


def __getattr__(name: str) -> Any:
    """A public name of :data:`__all__`, imported from its module on first use and kept here after it."""
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_HOMES})


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line (the ``deltatail`` command); returns the exit code.

    ``deltatail --version`` alone is answered here, without importing the command line; every other
    command line goes to :func:`deltatail.tailer.cli.main.main`, which parses it in full.
    """
    args = list(sys.argv[1:] if argv is None else argv)
    if args == ["--version"]:
        print(f"deltatail {__version__}")
        return 0
    importlib.import_module("deltatail.tailer.cli.process").name_arrow_pool()  # before Arrow loads
    cli = importlib.import_module("deltatail.tailer.cli.main")
    code: int = cli.main(args)
    return code


__all__ = [
    "ChangeBatch",
    "ChangeFeed",
    "ConfigError",
    "DeltaLog",
    "DeltaTailError",
    "InvalidLogError",
    "MissingFileError",
    "Position",
    "Sink",
    "SinkError",
    "SinkUnavailableError",
    "StateError",
    "StorageError",
    "TableInfo",
    "Tailer",
    "TailerConfig",
    "UnsafePathError",
    "UnsupportedFeatureError",
    "VersionGapError",
    "__version__",
    "main",
]
