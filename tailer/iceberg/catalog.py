"""Iceberg tables found through a catalog: pyiceberg's catalog layer gives the current metadata file.

A catalog table is named ``iceberg://catalog:NAME/NAMESPACE.TABLE``. ``NAME`` is a catalog as
pyiceberg configures it (``~/.pyiceberg.yaml``, or ``PYICEBERG_CATALOG__NAME__URI`` and friends in
the environment), so any catalog pyiceberg loads works: the SQL catalog (``uri:
sqlite:///...`` or ``postgresql+psycopg2://...``), the REST catalog (``uri: https://...``,
``credential``, ``token``), and the others. Credentials stay in pyiceberg's configuration: never in
the table name, so never in logs, errors or state.

Following asks the catalog for the table's ``metadata_location`` at every look (one query, or one
``GET`` for REST): the catalog's pointer is the newest metadata by definition.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from state.errors import ConfigError, StorageError, TableNotFoundError

#: The location prefix (after ``iceberg://``) of a catalog table.
CATALOG_PREFIX = "catalog:"


def parse_catalog_name(location: str) -> tuple[str, str] | None:
    """``(catalog name, table identifier)`` of ``catalog:NAME/NAMESPACE.TABLE``, ``None`` for another location.

    Raises:
        ConfigError: if it starts with ``catalog:`` but names no catalog or no ``namespace.table``.
    """
    if not location.startswith(CATALOG_PREFIX):
        return None
    name, _, ident = location[len(CATALOG_PREFIX) :].partition("/")
    if not name or "." not in ident.strip(".") or "/" in ident:
        raise ConfigError(
            f"an Iceberg catalog table is written iceberg://catalog:NAME/NAMESPACE.TABLE, not {location!r}"
        )
    return name, ident


def catalog_pointer(name: str, identifier: str, *, load: Callable[[str], Any] | None = None) -> Callable[[], str]:
    """A function giving the table's current metadata location from catalog ``name`` (loaded once, lazily).

    Raises (when called):
        ConfigError: if pyiceberg is not installed or the catalog is not configured.
        TableNotFoundError: if the catalog has no such table.
        StorageError: if the catalog cannot be reached (transient).
    """
    found: list[Any] = []

    def pointer() -> str:
        if not found:
            found.append(_load_catalog(name, load))
        try:
            return str(found[0].load_table(identifier).metadata_location)
        except Exception as e:
            kind = type(e).__name__
            if kind in ("NoSuchTableError", "NoSuchNamespaceError"):
                raise TableNotFoundError(f"catalog {name} has no table {identifier}", table=identifier) from None
            raise StorageError(
                f"catalog {name} did not give table {identifier}: {kind}", transient=True, table=identifier
            ) from e

    return pointer


def _load_catalog(name: str, load: Callable[[str], Any] | None) -> Any:
    try:
        if load is None:
            from pyiceberg.catalog import load_catalog

            load = load_catalog
        return load(name)
    except ImportError as e:
        raise ConfigError("reading Iceberg tables needs pyiceberg: pip install 'deltatail[iceberg]'") from e
    except Exception as e:  # pyiceberg: no such catalog configured, a bad URI
        raise ConfigError(
            f"Iceberg catalog {name} cannot be loaded ({type(e).__name__}): configure it in ~/.pyiceberg.yaml or "
            f"PYICEBERG_CATALOG__{name.upper()}__* environment variables"
        ) from e
