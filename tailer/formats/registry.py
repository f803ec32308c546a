"""The table formats deltatail reads, and the one place a table handle is built: :func:`open_table`.

:data:`FORMATS` lists one :class:`~tailer.formats.base.TableFormat` per format, in the order
they are asked to :meth:`~tailer.formats.base.TableFormat.detect` a table; Delta, the fallback,
is last. Adding a format is one module in :mod:`tailer.formats` and one entry here (see
:mod:`tailer.formats.base`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

from deltatail.state.errors import ConfigError
from deltatail.tailer.formats.base import TableFormat
from deltatail.tailer.formats.delta import DELTA
from deltatail.tailer.formats.iceberg import ICEBERG
from deltatail.tailer.formats.lance import LANCE
from deltatail.tailer.storage import Storage
from deltatail.tailer.table import TableRef, table_storage

#: Every format, in detection order; the last one (Delta) claims what no other does.
FORMATS: tuple[TableFormat, ...] = (LANCE, ICEBERG, DELTA)
#: The format of a table no other format claims, and of a service's table made without a handle.
FALLBACK: TableFormat = DELTA


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
            return f
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
            if given is not None and given is not f:
                raise ConfigError(conflict(uri, f.uri_prefix, given.name))
            return uri[len(f.uri_prefix) :], f
    return uri, given


def detect(uri: str, storage: Storage) -> TableFormat:
    """The first format of :data:`FORMATS` that claims ``uri`` (Delta when no other does).

    Raises:
        StorageError: if the store cannot be reached (transient: the caller may look again later).
    """
    for f in FORMATS:
        if f.detect(storage, uri):
            return f
    return FALLBACK


def claimed(directory: str) -> TableFormat | None:
    """The first format of :data:`FORMATS` that claims the local ``directory`` as its table, if any (discovery)."""
    for f in FORMATS:
        if f.claims(directory):
            return f
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
