"""The table handle: one table's location, options, storage and format, resolved once per process.

A :class:`TableRef` is made by :func:`tailer.formats.registry.open_table` from what a user wrote
(a URI or path, ``lance://`` and other format prefixes included, its storage options from flags,
config file or Spark options, and its external roots), once per table per process. Everything
downstream (snapshot, changes, run, serve, audit, the Spark source, the feeds and tailers) takes
the handle or its :attr:`~TableRef.storage` instead of resolving the storage again.

:func:`table_storage` is the one place a table's :class:`~tailer.storage.Storage` is resolved from
its location and options; the classes below the handle (``DeltaLog``, ``LanceDataset``, the
feeds) call it only when they are built without a storage (a test, a Python caller).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from deltatail.tailer.storage import Storage
from deltatail.tailer.storage.factory import storage_for

if TYPE_CHECKING:
    from deltatail.tailer.formats.base import TableFormat


def table_storage(location: str, options: Mapping[str, str] | None = None) -> Storage:
    """The storage that serves ``location`` with ``options`` (none: ``None`` or empty).

    Raises:
        ConfigError: if options are given for a local path, or are malformed.
    """
    return storage_for(location, dict(options) if options else None)


@dataclass(frozen=True, slots=True)
class TableRef:
    """One table, resolved: made once per table per process, then handed to everything that reads it.

    Attributes:
        uri: the table's root as its storage names it (a path or an object-store URI), with a format
            prefix such as ``lance://`` removed.
        storage_options: the object-store options it was opened with (never shown: secrets).
        storage: the storage serving the table (built once from ``uri`` and ``storage_options``).
        external_roots: absolute paths or URIs outside the table its metadata may name
            (:mod:`state.paths`).
        format: the table's format (:class:`~tailer.formats.base.TableFormat`), given or detected.
    """

    uri: str
    storage_options: Mapping[str, str] = field(repr=False, compare=False)
    storage: Storage = field(repr=False, compare=False)
    external_roots: tuple[str, ...]
    format: TableFormat

    @property
    def format_name(self) -> str:
        """The format's name (``delta``, ``lance``...)."""
        return self.format.name
