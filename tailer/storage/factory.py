"""Which storage serves a table: :func:`storage_for`.

The local file system for paths and ``file:`` URIs, an object store
(:mod:`tailer.storage.objectstore`) for ``s3://``, ``s3a://``, ``az://``, ``azure://``,
``abfs[s]://`` and ``gs://`` URIs. Kept apart from :mod:`tailer.storage` so that a process
that only reads local files (a reader process) does not load the object-store client; and the
object-store module (obstore, asyncio: ~0.1 s) is imported only when an object-store URI is opened,
so a command or a Python caller on a local table never loads it (tests/test_front_door.py).
"""

from __future__ import annotations

from collections.abc import Mapping

from deltatail.state.errors import ConfigError
from deltatail.tailer.storage.base import Storage
from deltatail.tailer.storage.local import LocalStorage
from deltatail.tailer.storage.uris import is_object_uri


def storage_for(location: str, options: Mapping[str, str] | None = None) -> Storage:
    """The storage that serves ``location`` (a table root or any file of it).

    Args:
        location: a local path, a ``file:`` URI or an object-store URI.
        options: storage options (:mod:`tailer.storage.options`); only object stores take any.

    Raises:
        ConfigError: if options are given for a local path, or a retry option is malformed.
    """
    if is_object_uri(location):
        from deltatail.tailer.storage.objectstore import ObjectStoreStorage  # on first use: see the module docstring

        return ObjectStoreStorage(options)
    if options:
        raise ConfigError(f"storage options apply to object stores (s3://, az://, gs://...), not to {location}")
    return LocalStorage()
