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
"""

from __future__ import annotations

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
from deltatail.tailer.cli.main import installed_version, main
from deltatail.tailer.follow.config import TailerConfig
from deltatail.tailer.follow.tailer import Tailer
from deltatail.tailer.log.delta_log import DeltaLog
from deltatail.tailer.read.feed import ChangeFeed
from deltatail.tailer.sink import Sink

__version__ = installed_version()

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
