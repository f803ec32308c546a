"""The table formats deltatail reads, and the one place a table handle is built: :func:`open_table`.

:data:`FORMATS` lists one :class:`FormatEntry` per format, in the order they are asked to
:meth:`~tailer.formats.base.TableFormat.detect` a table; Delta, the fallback, is last. An entry
keeps the format's name, URI prefix and module path: the module (pyiceberg, pylance and their
readers behind it) is imported on the format's first use, so a process following a Delta table
never loads the Iceberg or Lance code. Detection first looks with one listing of the directory a
format needs (:attr:`FormatEntry.marker`); a format whose directory is missing does not claim the
table, and only then is its module loaded to decide. Adding a format is one module in
:mod:`tailer.formats` and one entry here (see :mod:`tailer.formats.base`).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field

from deltatail.state.errors import ConfigError, MissingFileError, StorageError
from deltatail.tailer.formats.base import TableFormat
from deltatail.tailer.formats.delta import DELTA
from deltatail.tailer.storage import Storage
from deltatail.tailer.table import TableRef, table_storage


@dataclass(frozen=True)
class FormatEntry:
    """One format of :data:`FORMATS`: what is known without importing it, and where it lives.

    Attributes:
        name: the format's name (:attr:`TableFormat.name`).
        uri_prefix: its URI prefix (:attr:`TableFormat.uri_prefix`), or ``None``.
        module: the module defining it; ``attribute`` names the format there.
        marker: the directory under a table root its layout needs (``_versions``), or ``None`` when
            the format claims what no other does; ``suffix`` a file name ending that names the
            format alone (``.metadata.json``).
        loaded: the format itself, when it is imported eagerly (the fallback).
    """

    name: str
    uri_prefix: str | None
    module: str
    attribute: str
    marker: str | None = None
    suffix: str | None = None
    loaded: TableFormat | None = field(default=None, compare=False)

    def load(self) -> TableFormat:
        """The format, importing its module on first use (Python caches the import)."""
        if self.loaded is not None:
            return self.loaded
        found: TableFormat = getattr(importlib.import_module(self.module), self.attribute)
        return found

    def detect(self, storage: Storage, uri: str) -> bool:
        """The format's :meth:`~tailer.formats.base.TableFormat.detect`, skipped when its :attr:`marker` is missing.

        The look is one listing of ``uri/marker``: a missing directory means no (the format's own
        detection lists it first and says no then too); any other answer, a store error included,
        goes to the format's own detection, which words and raises its errors.
        """
        if self.marker is not None and not (self.suffix is not None and uri.endswith(self.suffix)):
            try:
                storage.list_from("/".join([uri.rstrip("/"), self.marker]))
            except MissingFileError:
                return False
            except StorageError:
                pass  # the format's own detection looks again, and words or raises it as it always did
        return self.load().detect(storage, uri)

    def claims(self, directory: str) -> bool:
        """The format's :meth:`~tailer.formats.base.TableFormat.claims` (discovery)."""
        return self.load().claims(directory)


#: The format of a table no other format claims, and of a service's table made without a handle.
FALLBACK: TableFormat = DELTA
#: Every format, in detection order; the last one (Delta) claims what no other does.
FORMATS: tuple[FormatEntry, ...] = (
    FormatEntry("lance", "lance://", "deltatail.tailer.formats.lance", "LANCE", marker="_versions"),
    FormatEntry(
        "iceberg",
        "iceberg://",
        "deltatail.tailer.formats.iceberg",
        "ICEBERG",
        marker="metadata",
        suffix=".metadata.json",
    ),
    FormatEntry(DELTA.name, DELTA.uri_prefix, "deltatail.tailer.formats.delta", "DELTA", loaded=DELTA),
)


def format_names() -> tuple[str, ...]:
    """The formats' names, sorted (the choices of ``--format``, ``format =`` and the Spark option)."""
    return tuple(sorted(f.name for f in FORMATS))


def format_named(name: str, *, setting: str = "format") -> TableFormat:
    """The format called ``name`` (as given: case and spaces are the caller's to normalize).

    Raises:
        ConfigError: naming ``setting`` if no format has that name.
    """
    for f in FORMATS:
        if f.name == name:
            return f.load()
    raise ConfigError(f"{setting}={name!r} is neither {' nor '.join(format_names())}")


def prefix_conflict(uri: str, prefix: str, given: str) -> str:
    """The default wording of a URI prefix naming one format while another was given (:data:`Conflict`)."""
    return f"{uri} is a {prefix} URI, but format {given} was given"


#: Words the error of a URI whose prefix names one format while another is given: (uri, prefix, given name).
Conflict = Callable[[str, str, str], str]


def split_prefix(
    uri: str, format_name: str | None = None, *, conflict: Conflict = prefix_conflict
) -> tuple[str, TableFormat | None]:
    """``uri`` without a format's prefix (``lance://``), and the format its prefix or ``format_name`` names.

    Raises:
        ConfigError: if the prefix names one format and ``format_name`` another (worded by
            ``conflict``), or the name is unknown.
    """
    given = None if format_name is None else format_named(format_name)
    for f in FORMATS:
        if f.uri_prefix is not None and uri.startswith(f.uri_prefix):
            if given is not None and given.name != f.name:
                raise ConfigError(conflict(uri, f.uri_prefix, given.name))
            return uri[len(f.uri_prefix) :], f.load()
    return uri, given


def detect(uri: str, storage: Storage) -> TableFormat:
    """The first format of :data:`FORMATS` that claims ``uri`` (Delta when no other does).

    Raises:
        StorageError: if the store cannot be reached (transient: the caller may look again later).
    """
    for f in FORMATS:
        if f.detect(storage, uri):
            return f.load()
    return FALLBACK


def claimed(directory: str) -> TableFormat | None:
    """The first format of :data:`FORMATS` that claims the local ``directory`` as its table, if any (discovery)."""
    for f in FORMATS:
        if f.claims(directory):
            return f.load()
    return None


def open_table(
    uri: str,
    storage_options: Mapping[str, str] | None = None,
    *,
    external_roots: tuple[str, ...] = (),
    format_name: str | None = None,
    conflict: Conflict = prefix_conflict,
) -> TableRef:
    """The handle of the table at ``uri``: its prefix removed, its storage resolved once, its format given or detected.

    Args:
        uri: a path or URI as the user wrote it (``lance://PATH`` included).
        storage_options: object-store options (flags, ``[storage]``, ``storage.*`` Spark options).
        external_roots: roots outside the table its metadata may name.
        format_name: the format given (``--format``, ``format =``), else ``None``: the prefix or the
            layout tells.
        conflict: words the error of a prefix contradicting ``format_name`` (each front end names
            its format setting its own way).

    Raises:
        ConfigError: for a prefix contradicting ``format_name``, an unknown format, or storage
            options for a local path.
        StorageError: if the format has to be detected and the store cannot be reached.
    """
    location, chosen = split_prefix(uri, format_name, conflict=conflict)
    options = dict(storage_options or {})
    storage = table_storage(location, options)
    found = chosen if chosen is not None else detect(location, storage)
    return TableRef(location, options, storage, tuple(external_roots), found)
