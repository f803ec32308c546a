"""Storage: the seam between deltatail and the bytes of a table (see :mod:`tailer.storage.base`)."""

from tailer.storage.base import FileInfo, Storage
from tailer.storage.local import LocalStorage, to_local_path

__all__ = ["FileInfo", "LocalStorage", "Storage", "to_local_path"]
