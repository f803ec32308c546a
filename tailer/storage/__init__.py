"""Storage: the seam between deltatail and the bytes of a table (see :mod:`tailer.storage.base`).

:func:`tailer.storage.factory.storage_for` picks the implementation a table's location needs:
:class:`LocalStorage` here, or :class:`tailer.storage.objectstore.ObjectStoreStorage` for
object-store URIs (imported only where it is needed: it loads the store client).
"""

from deltatail.tailer.storage.base import FileInfo, Storage
from deltatail.tailer.storage.local import LocalStorage, to_local_path

__all__ = ["FileInfo", "LocalStorage", "Storage", "to_local_path"]
