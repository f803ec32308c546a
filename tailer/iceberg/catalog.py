"""Iceberg tables found through a catalog: pyiceberg's catalog layer gives the current metadata file.

A catalog table is named ``iceberg://catalog:NAME/NAMESPACE.TABLE``. ``NAME`` is a catalog as
pyiceberg configures it (``~/.pyiceberg.yaml``, or ``PYICEBERG_CATALOG__NAME__URI`` and friends in
the environment), so any catalog pyiceberg loads works: the SQL catalog (``uri:
sqlite:///...`` or ``postgresql+psycopg2://...``), the REST catalog (``uri: https://...``,
``credential``, ``token``), and the others. Credentials stay in pyiceberg's configuration: never in
the table name, so never in logs, errors or state.

Following asks the catalog for the table's ``metadata_location`` at every look (one query, or one
``GET`` for REST): the catalog's pointer is the newest metadata by definition.

A catalog's failures are named by pyiceberg's error type alone, never its text (a server's answer
or a request may echo what it was sent), and not chained: ``-v`` shows no more. A catalog that
cannot be reached (a connection refused, a timeout: an ``OSError``, as ``requests``' errors are) is
a transient :class:`StorageError`; one that refuses the credentials a non-transient one.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from deltatail.state.errors import ConfigError, StorageError, TableNotFoundError

#: The location prefix (after ``iceberg://``) of a catalog table.
CATALOG_PREFIX = "catalog:"
#: pyiceberg's errors for credentials a catalog refuses.
_REFUSED = frozenset({"UnauthorizedError", "ForbiddenError", "OAuthError", "AuthorizationExpiredError"})


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
        StorageError: if the catalog cannot be reached or fails (transient), or refuses the
            credentials (not transient).
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
            raise _catalog_error(name, e, f"did not give table {identifier}", table=identifier) from None

    return pointer


def _catalog_error(name: str, e: Exception, what: str, table: str | None = None) -> StorageError:
    """The error of a catalog that failed: refused credentials, unreachable, or failed otherwise."""
    kind = type(e).__name__
    if kind in _REFUSED:
        return StorageError(f"Iceberg catalog {name} refused the credentials configured for it ({kind})", table=table)
    if isinstance(e, OSError):
        return StorageError(f"Iceberg catalog {name} cannot be reached ({kind})", transient=True, table=table)
    return StorageError(f"Iceberg catalog {name} {what} ({kind})", transient=True, table=table)


def _load_catalog(name: str, load: Callable[[str], Any] | None) -> Any:
    try:
        if load is None:
            from pyiceberg.catalog import load_catalog

            load = load_catalog
        return load(name)
    except ImportError as e:
        raise ConfigError("reading Iceberg tables needs pyiceberg: pip install 'deltatail[iceberg]'") from e
    except Exception as e:  # pyiceberg: no such catalog configured, a bad URI; a REST catalog's first request
        if isinstance(e, OSError) or type(e).__name__ in _REFUSED:
            raise _catalog_error(name, e, "failed") from None
        raise ConfigError(
            f"Iceberg catalog {name} cannot be loaded ({type(e).__name__}): configure it in ~/.pyiceberg.yaml or "
            f"PYICEBERG_CATALOG__{name.upper()}__* environment variables"
        ) from None
