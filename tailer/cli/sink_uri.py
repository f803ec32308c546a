"""Sinks by URI: ``jsonl:-`` (default), ``jsonl:PATH``, ``parquet:DIR``, ``kafka://...``.

The command line imports no sink. A URI's scheme (the text before its first ``:``; ``-`` and
``jsonl`` alone are ``jsonl``) names an entry point of the group ``deltatail.sinks`` among the
installed distributions: a function of the URI that returns an unopened
:class:`~tailer.sink.Sink` (called with the keyword ``shared=True`` as well in ``deltatail serve``,
where sinks may share process-wide resources). deltatail registers its own sinks there (``pyproject.toml``, functions
in :mod:`sinks.uris`), and another package may register more. So the dependency runs one way:
``sinks`` implements the contract ``tailer`` defines, and only the installed distribution
composes the two.
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from deltatail.state.errors import ConfigError
from deltatail.tailer.sink import Sink

if TYPE_CHECKING:  # imported when the first sink is opened: a command without a sink (status...) skips it
    import importlib.metadata

#: The entry-point group sinks register under, by URI scheme.
ENTRY_POINTS = "deltatail.sinks"


def open_sink(uri: str, *, shared: bool = False) -> Sink:
    """The sink a URI names (not yet opened).

    With ``shared`` (``deltatail serve``) the maker is called with ``shared=True``: the sink may share
    process-wide resources with the process's other sinks (a Kafka producer per cluster and settings).

    Raises:
        ConfigError: if the URI's scheme is unknown, its path is empty, or no sink is installed
            (deltatail run from a source tree that was never installed).
    """
    openers = _openers()
    entry = openers.get(_scheme(uri))
    if entry is None:
        if not openers:
            raise ConfigError(
                f"no sink is installed for {uri!r}: sinks register under the {ENTRY_POINTS!r} entry points "
                "of the installed distribution; install deltatail (pip install -e . in a source tree)"
            )
        raise ConfigError(
            f"unknown sink URI {uri!r}; expected jsonl:-, jsonl:PATH, parquet:DIR or kafka://HOST:PORT/TOPIC"
        )
    maker = entry.load()
    sink = maker(uri, shared=True) if shared else maker(uri)
    if not isinstance(sink, Sink):
        raise ConfigError(f"the {ENTRY_POINTS!r} entry point {entry.value!r} made no sink for {uri!r}")
    return sink


def _scheme(uri: str) -> str:
    if uri in ("-", "jsonl"):
        return "jsonl"
    scheme, colon, _ = uri.partition(":")
    return scheme if colon else ""


@functools.cache
def _openers() -> dict[str, importlib.metadata.EntryPoint]:
    """The registered sink makers by scheme (read once per process)."""
    import importlib.metadata  # with the email package: ~50 ms of start-up

    return {entry.name: entry for entry in importlib.metadata.entry_points(group=ENTRY_POINTS)}
