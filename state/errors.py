"""The one exception hierarchy of deltatail.

Every error deltatail raises on purpose is a :class:`DeltaTailError`. Messages
name the table, the version and the file involved wherever they are known, so
that a user can find the offending object without a debugger.

Third-party errors (JSON parsers, pyarrow, the file system) are wrapped with
``raise ... from e`` at the edge where they happen. A rendered error is one line
(line breaks in a wrapped library's text become spaces), so that the command line
reports it as one ``deltatail: error:`` line and log lines stay whole.
"""

from __future__ import annotations

import re

_LINE_BREAKS = re.compile(r"\s*[\r\n]+\s*")


class DeltaTailError(Exception):
    """Root of every deltatail error.

    Args:
        message: what went wrong, in words a user can act on.
        table: the table root (path or URI) involved, if known.
        version: the table version involved, if known.
        file: the file (log file, data file, DV file, state file) involved, if known.
    """

    def __init__(
        self,
        message: str,
        *,
        table: str | None = None,
        version: int | None = None,
        file: str | None = None,
    ) -> None:
        self.message = message
        self.table = table
        self.version = version
        self.file = file
        super().__init__(self._render())

    def _render(self) -> str:
        where = []
        if self.table is not None:
            where.append(f"table {self.table}")
        if self.version is not None:
            where.append(f"version {self.version}")
        if self.file is not None:
            where.append(f"file {self.file}")
        message = _LINE_BREAKS.sub(" ", self.message).strip()
        return f"{message} [{', '.join(where)}]" if where else message

    def at(self, *, table: str | None = None, version: int | None = None, file: str | None = None) -> DeltaTailError:
        """Fill in context that the raiser did not know; returns ``self`` for ``raise e.at(...)``."""
        if table is not None and self.table is None:
            self.table = table
        if version is not None and self.version is None:
            self.version = version
        if file is not None and self.file is None:
            self.file = file
        self.args = (self._render(),)
        return self


class InvalidLogError(DeltaTailError):
    """The log breaks a rule of the protocol (bad JSON, duplicate actions, missing fields)."""


class DuplicateActionError(InvalidLogError):
    """A commit holds two actions that reconcile with each other."""


class VersionGapError(InvalidLogError):
    """Commit versions are not contiguous, or the log was cleaned up past a needed version."""


class IncompleteCheckpointError(InvalidLogError):
    """A checkpoint part or sidecar is missing or unreadable."""


class UnsafePathError(InvalidLogError):
    """A path the log names is outside the table root and every listed external root (see :mod:`state.paths`)."""


class MissingFileError(DeltaTailError):
    """A file the log refers to (data, DV, cdc, checkpoint part) does not exist."""


class VersionNotFoundError(DeltaTailError):
    """The requested version (or timestamp) is not in the table's log: in the future, or cleaned up."""


class TableNotFoundError(DeltaTailError):
    """The path holds no Delta table (no ``_delta_log`` or no commits)."""


class UnsupportedFeatureError(DeltaTailError):
    """The table needs a reader feature or protocol version deltatail does not support."""

    def __init__(
        self,
        message: str,
        *,
        features: frozenset[str] = frozenset(),
        table: str | None = None,
        version: int | None = None,
        file: str | None = None,
    ) -> None:
        self.features = features
        super().__init__(message, table=table, version=version, file=file)


class StorageError(DeltaTailError):
    """A store could not be reached, throttled or failed, or refused access (never a missing file).

    Args:
        message: what failed, in words; never a credential.
        transient: trying again later may work (connection refused, timeouts, throttling, 5xx);
            ``False`` for access denied and bad configuration.
        table, version, file: as :class:`DeltaTailError`.
        detail: the underlying failure for ``-v`` (the request's method and URL without its query, the
            HTTP status, the store's error code and message, or the connection failure); never a
            credential, and not part of the one-line message.
    """

    def __init__(
        self,
        message: str,
        *,
        transient: bool = False,
        table: str | None = None,
        version: int | None = None,
        file: str | None = None,
        detail: str | None = None,
    ) -> None:
        self.transient = transient
        self.detail = detail
        super().__init__(message, table=table, version=version, file=file)


class DeletionVectorError(DeltaTailError):
    """A deletion vector cannot be decoded: bad magic, bad checksum, truncated data."""


class DataFileError(DeltaTailError):
    """A value in a data or change-data file breaks its encoding (e.g. malformed Parquet variant bytes)."""


class SchemaChangeError(DeltaTailError):
    """A non-additive schema change appeared inside a range being read."""


class StateError(DeltaTailError):
    """deltatail's own state (cursor, saved snapshot, lock) is unusable.

    Args:
        message: what is wrong, in words.
        permanent: waiting cannot mend it (a damaged cursor file): ``run`` and ``serve`` do not
            retry it, whatever caused it (see :mod:`tailer.runtime.transient`).
        table, version, file: as :class:`DeltaTailError`.
    """

    def __init__(
        self,
        message: str,
        *,
        permanent: bool = False,
        table: str | None = None,
        version: int | None = None,
        file: str | None = None,
    ) -> None:
        self.permanent = permanent
        super().__init__(message, table=table, version=version, file=file)


class SinkError(DeltaTailError):
    """A sink could not accept, flush or recover change rows."""


class SinkUnavailableError(SinkError):
    """The sink's destination cannot be reached, or did not acknowledge in time: trying again later may work."""


class ConfigError(DeltaTailError):
    """A command-line flag, environment variable, URI or config file is invalid."""
