"""Which errors pass by waiting: the one rule by which ``deltatail run`` and ``deltatail serve`` retry a table.

A fault is *transient* when the same step may work later without anyone changing the table:

- the sink's destination is unavailable (:class:`~state.errors.SinkUnavailableError`);
- the store cannot be reached, throttles or fails (a transient :class:`~state.errors.StorageError`);
- the machine refuses a resource: any :class:`OSError` (too many open files, disk full, a file too
  large, an I/O error, a read-only file system, a path replaced by a file or a directory), raw or
  wrapped by the sink or the state directory (a :class:`~state.errors.SinkError` or
  :class:`~state.errors.StateError` caused by one, unless it is marked permanent: a damaged cursor).

Everything else is *permanent* for the table: the table itself is wrong (a gap, a schema change, a
broken file, a table removed), the configuration is, or deltatail has a bug (an exception that is
no :class:`~state.errors.DeltaTailError`). A transient fault is retried from the saved cursor; a
permanent one stops the table.
"""

from __future__ import annotations

from deltatail.state.errors import DeltaTailError, SinkError, SinkUnavailableError, StateError, StorageError


def is_transient(error: BaseException) -> bool:
    """Whether trying the step again later may work (see the module docstring)."""
    if isinstance(error, SinkUnavailableError):
        return True
    if isinstance(error, StorageError):
        return error.transient
    if isinstance(error, OSError):
        return True
    if isinstance(error, StateError) and error.permanent:
        return False
    if isinstance(error, SinkError | StateError):
        return _caused_by_os_error(error)
    return False


def _caused_by_os_error(error: BaseException) -> bool:
    seen: set[int] = set()
    cause = error.__cause__ or error.__context__
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError):
            return True
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return False


def fault_of(error: BaseException) -> str:
    """What failed, for status lines: ``sink``, ``store``, ``state`` or ``file system`` (else ``table``)."""
    if isinstance(error, SinkError):
        return "sink"
    if isinstance(error, StorageError):
        return "store"
    if isinstance(error, StateError):
        return "state"
    if isinstance(error, OSError):
        return "file system"
    return "table"


def describe(error: BaseException) -> str:
    """The error in one line: a deltatail error's own text; an OS error's errno, text and file; else its type."""
    if isinstance(error, DeltaTailError):
        return str(error)
    if isinstance(error, OSError):
        return f"file system error: {error}"
    return f"unexpected error ({type(error).__name__}: {error})"


def as_deltatail_error(error: BaseException) -> DeltaTailError:
    """``error`` itself if it is a :class:`DeltaTailError`, else one with its :func:`describe` text."""
    if isinstance(error, DeltaTailError):
        return error
    filename = getattr(error, "filename", None)
    text = describe(error)
    if isinstance(error, OSError) and error.strerror:
        text = f"file system error: [Errno {error.errno}] {error.strerror}"
    return DeltaTailError(text, file=None if filename is None else str(filename))
