"""Columnar stores of logical files: the live ``add`` set and the ``remove`` tombstones.

Protocol, "Action Reconciliation": "Logical files in a table are identified by
their ``(path, deletionVector.uniqueId)`` primary key ... To replay the log,
scan all file actions and keep only the newest reference for each logical
file." A :class:`FileTable` holds one side of that reconciliation.

Memory is the design constraint: a table may have millions of files, and one
Python object per file costs several times the budget (under 400 bytes per
live file). So a file is a *slot* across parallel columns (``array``s of
machine integers, a list of path strings, interned partition-value maps) and
the index maps a key to its slot. The key is the path string itself when the
file has no DV (the common case, and no extra object), or a ``(path, dv_id)``
tuple when it has one; a string never equals a tuple, so the two cannot clash.
Fields most files lack (DV descriptors, row-tracking ids) live in sparse
dicts keyed by slot. Statistics and tags are not kept: nothing deltatail does reads
them, and Delta Spark writes tags on every file.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator
from dataclasses import dataclass

from deltatail.state.actions import Add, DeletionVector, Remove

IndexKey = str | tuple[str, str]

_NONE = -1


@dataclass(frozen=True, slots=True)
class FileKey:
    """A logical file's identity: its decoded path and its DV's unique id (``None`` without a DV)."""

    path: str
    dv_id: str | None = None

    def index_key(self) -> IndexKey:
        """The compact key used inside :class:`FileTable`."""
        return self.path if self.dv_id is None else (self.path, self.dv_id)


@dataclass(frozen=True, slots=True)
class FileEntry:
    """A materialised view of one stored file (live add, or tombstone).

    For tombstones ``timestamp`` is the ``deletionTimestamp`` and ``size``/
    ``partition_values`` may be ``None`` (remove actions may omit them); for
    live files ``timestamp`` is the ``modificationTime``.
    """

    path: str
    deletion_vector: DeletionVector | None
    size: int | None
    timestamp: int | None
    partition_values: dict[str, str | None] | None
    base_row_id: int | None = None
    default_row_commit_version: int | None = None

    @property
    def key(self) -> FileKey:
        """The logical file key."""
        dv = self.deletion_vector
        return FileKey(self.path, None if dv is None else dv.unique_id)


@dataclass(frozen=True, slots=True)
class _Extras:
    base_row_id: int | None
    default_row_commit_version: int | None


@dataclass(frozen=True, slots=True)
class FileColumns:
    """The files of a :class:`FileTable` as parallel columns, for bulk export (``-1`` marks an absent number).

    ``partition_ids`` index ``partition_maps``; ``dvs`` and ``row_tracking`` are
    sparse, keyed by row.
    """

    paths: list[str]
    sizes: list[int]
    timestamps: list[int]
    partition_ids: list[int]
    partition_maps: list[dict[str, str | None] | None]
    dvs: dict[int, DeletionVector]
    row_tracking: dict[int, tuple[int | None, int | None]]


class PartitionValuesPool:
    """Interns partition-value maps: files of one partition share one dict.

    Id 0 is reserved for "absent" (a remove without ``partitionValues``).
    """

    __slots__ = ("_ids", "_values")

    def __init__(self) -> None:
        self._ids: dict[tuple[tuple[str, str | None], ...], int] = {}
        self._values: list[dict[str, str | None] | None] = [None]

    def intern(self, values: dict[str, str | None] | None) -> int:
        """The id of ``values`` (0 for ``None``)."""
        if values is None:
            return 0
        if not values:  # an unpartitioned table: every file
            key: tuple[tuple[str, str | None], ...] = ()
        else:
            key = tuple(values.items()) if len(values) == 1 else tuple(sorted(values.items()))
        found = self._ids.get(key)
        if found is None:
            found = len(self._values)
            self._ids[key] = found
            self._values.append(dict(values))
        return found

    def get(self, pid: int) -> dict[str, str | None] | None:
        """The map interned as ``pid``."""
        return self._values[pid]

    def maps(self) -> list[dict[str, str | None] | None]:
        """Every interned map, indexed by id (index 0 is ``None``)."""
        return list(self._values)


class FileTable:
    """A mutable set of logical files keyed by ``(path, dv_id)``, stored in columns.

    Not thread-safe. Snapshots hand their tables on when they apply a commit
    (see :meth:`state.snapshot.Snapshot.apply`) rather than copying them.
    """

    __slots__ = ("_index", "_paths", "_sizes", "_times", "_pids", "_dvs", "_extras", "_free", "pool")

    def __init__(self, pool: PartitionValuesPool | None = None) -> None:
        self._index: dict[IndexKey, int] = {}
        self._paths: list[str | None] = []
        self._sizes = array("q")
        self._times = array("q")
        self._pids = array("l")
        self._dvs: dict[int, DeletionVector] = {}
        self._extras: dict[int, _Extras] = {}
        self._free: list[int] = []
        self.pool = pool if pool is not None else PartitionValuesPool()

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, key: FileKey) -> bool:
        return key.index_key() in self._index

    def put(
        self,
        path: str,
        dv: DeletionVector | None,
        size: int | None,
        timestamp: int | None,
        partition_values: dict[str, str | None] | None,
        base_row_id: int | None = None,
        default_row_commit_version: int | None = None,
    ) -> None:
        """Insert or replace the logical file ``(path, dv)``."""
        key: IndexKey = path if dv is None else (path, dv.unique_id)
        slot = self._index.get(key)
        if slot is None:
            if self._free:
                slot = self._free.pop()
                self._paths[slot] = path
            else:
                slot = len(self._paths)
                self._paths.append(path)
                self._sizes.append(0)
                self._times.append(0)
                self._pids.append(0)
            self._index[key] = slot
        self._sizes[slot] = _NONE if size is None else size
        self._times[slot] = _NONE if timestamp is None else timestamp
        self._pids[slot] = self.pool.intern(partition_values)
        if dv is None:
            self._dvs.pop(slot, None)
        else:
            self._dvs[slot] = dv
        if base_row_id is not None or default_row_commit_version is not None:
            self._extras[slot] = _Extras(base_row_id, default_row_commit_version)
        else:
            self._extras.pop(slot, None)

    def extend(
        self,
        paths: list[str],
        sizes: list[int],
        timestamps: list[int],
        partition_ids: list[int],
        dvs: list[DeletionVector | None] | None = None,
        row_ids: list[int | None] | None = None,
        row_versions: list[int | None] | None = None,
    ) -> None:
        """Insert many files at once (checkpoint loading); ``-1`` in ``sizes``/``timestamps`` means absent.

        ``partition_ids`` are ids from this table's :attr:`pool`. Equivalent to
        calling :meth:`put` for each row in order, but builds the columns in bulk
        when the rows are new keys.
        """
        n = len(paths)
        keys: list[IndexKey] = list(paths)
        if dvs is not None:
            for i, dv in enumerate(dvs):
                if dv is not None:
                    keys[i] = (paths[i], dv.unique_id)
        fresh = not self._free and self._index.keys().isdisjoint(keys) and len(set(keys)) == n
        if not fresh:
            for i in range(n):
                self._put_row(i, paths, sizes, timestamps, partition_ids, dvs, row_ids, row_versions)
            return
        start = len(self._paths)
        self._paths.extend(paths)
        self._sizes.extend(sizes)
        self._times.extend(timestamps)
        self._pids.extend(partition_ids)
        self._index.update(zip(keys, range(start, start + n), strict=True))
        if dvs is not None:
            self._dvs.update((start + i, dv) for i, dv in enumerate(dvs) if dv is not None)
        for i in range(n):
            rid = None if row_ids is None else row_ids[i]
            rver = None if row_versions is None else row_versions[i]
            if rid is not None or rver is not None:
                self._extras[start + i] = _Extras(rid, rver)

    def _put_row(
        self,
        i: int,
        paths: list[str],
        sizes: list[int],
        timestamps: list[int],
        partition_ids: list[int],
        dvs: list[DeletionVector | None] | None,
        row_ids: list[int | None] | None,
        row_versions: list[int | None] | None,
    ) -> None:
        self.put(
            paths[i],
            None if dvs is None else dvs[i],
            None if sizes[i] == _NONE else sizes[i],
            None if timestamps[i] == _NONE else timestamps[i],
            self.pool.get(partition_ids[i]),
            None if row_ids is None else row_ids[i],
            None if row_versions is None else row_versions[i],
        )

    def put_add(self, add: Add) -> None:
        """Store an ``add`` action as a live file."""
        self.put(
            add.path,
            add.deletion_vector,
            add.size,
            add.modification_time,
            add.partition_values,
            add.base_row_id,
            add.default_row_commit_version,
        )

    def put_remove(self, remove: Remove) -> None:
        """Store a ``remove`` action as a tombstone."""
        self.put(
            remove.path,
            remove.deletion_vector,
            remove.size,
            remove.deletion_timestamp,
            remove.partition_values,
            remove.base_row_id,
            remove.default_row_commit_version,
        )

    def discard(self, path: str, dv_id: str | None) -> bool:
        """Drop the logical file ``(path, dv_id)``; returns whether it was present."""
        key: IndexKey = path if dv_id is None else (path, dv_id)
        slot = self._index.pop(key, None)
        if slot is None:
            return False
        self._paths[slot] = None
        self._dvs.pop(slot, None)
        self._extras.pop(slot, None)
        self._free.append(slot)
        return True

    def drop_older_than(self, timestamp_ms: int) -> int:
        """Drop every file whose timestamp is absent or before ``timestamp_ms``; returns how many were dropped."""
        old = [k for k, slot in self._index.items() if self._times[slot] < timestamp_ms]
        for key in old:
            path, dv_id = (key, None) if isinstance(key, str) else key
            self.discard(path, dv_id)
        return len(old)

    def get(self, key: FileKey) -> FileEntry | None:
        """The stored file for ``key``, or ``None``."""
        slot = self._index.get(key.index_key())
        return None if slot is None else self._entry(slot)

    def _entry(self, slot: int) -> FileEntry:
        path = self._paths[slot]
        assert path is not None
        size = self._sizes[slot]
        ts = self._times[slot]
        extras = self._extras.get(slot)
        return FileEntry(
            path=path,
            deletion_vector=self._dvs.get(slot),
            size=None if size == _NONE else size,
            timestamp=None if ts == _NONE else ts,
            partition_values=self.pool.get(self._pids[slot]),
            base_row_id=None if extras is None else extras.base_row_id,
            default_row_commit_version=None if extras is None else extras.default_row_commit_version,
        )

    def columns(self) -> FileColumns:
        """Every file as parallel columns (no per-file objects), in slot order."""
        slots = sorted(self._index.values())
        row_of = {slot: row for row, slot in enumerate(slots)}
        return FileColumns(
            paths=[p for p in (self._paths[s] for s in slots) if p is not None],
            sizes=[self._sizes[s] for s in slots],
            timestamps=[self._times[s] for s in slots],
            partition_ids=[self._pids[s] for s in slots],
            partition_maps=self.pool.maps(),
            dvs={row_of[slot]: dv for slot, dv in self._dvs.items()},
            row_tracking={
                row_of[slot]: (e.base_row_id, e.default_row_commit_version) for slot, e in self._extras.items()
            },
        )

    def keys(self) -> Iterator[FileKey]:
        """Every logical file key, in no particular order."""
        for key in self._index:
            yield FileKey(key) if isinstance(key, str) else FileKey(key[0], key[1])

    def __iter__(self) -> Iterator[FileEntry]:
        for slot in self._index.values():
            yield self._entry(slot)
