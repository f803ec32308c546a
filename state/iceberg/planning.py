"""Planning a snapshot's change rows from the live files of its parent and its own. Pure: no IO.

A snapshot is compared with its parent file by file (a file is the same on both sides when its
path is; manifests moving entries around change nothing):

1. Rows of a data file that is gone, and were live in the parent, are ``delete`` rows.
2. Rows of a new data file that are live in the snapshot are ``insert`` rows.
3. Rows of a data file on both sides that the snapshot's delete files delete and the parent's did
   not are ``delete`` rows; the reverse (a delete file removed without its data file) are ``insert``.
4. A ``replace`` snapshot ("data and delete files were added and removed without changing table
   data; i.e., compaction") gives nothing.

Which delete files apply to which data file is the spec's rule ("Scan Planning"):

- position deletes: "The data file's data sequence number is *less than or equal to* the delete
  file's data sequence number" and "The data file's partition (both spec id and partition values)
  is equal [to the delete file's partition] or the delete file's partition spec is unpartitioned";
  the delete file's ``file_path`` column then names the data file (checked when reading);
- equality deletes: "The data file's data sequence number is *strictly less than* the delete's data
  sequence number" and the same partition rule;
- deletion vectors (format v3, position deletes in a Puffin file): the position delete rules, and
  "The data file's ``file_path`` is equal to the delete file's ``referenced_data_file``"; and a
  position delete file applies only when "There is no deletion vector that must be applied to the
  data file (when added, such a vector must contain all deletes from existing position delete
  files)". "At most one deletion vector is allowed per data file in a snapshot": two are refused.

The reader then cancels rows that are in the snapshot's deletes and its inserts alike (copy-on-write
rewrites carry unchanged rows over) and pairs updates by key (:func:`tailer.read.net_changes.net_changes`).

Tasks are in a fixed order, so that a row's position names the same row on every read: data files
by path, deletes before inserts.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from deltatail.state.errors import InvalidLogError, UnsupportedFeatureError
from deltatail.state.iceberg.model import DATA, EQUALITY_DELETES, POSITION_DELETES, ContentFile, SnapshotInfo

ChangeType = Literal["insert", "delete"]

#: The operation of a snapshot that rearranges files without changing the table's rows.
REPLACE = "replace"


@dataclass(frozen=True, slots=True)
class RowTask:
    """Rows of one data file: those ``within`` deletes (every row if ``None``) and not deleted by ``minus``.

    Attributes:
        file: the data file.
        change_type: what the rows are.
        minus: delete files whose deleted rows are left out.
        within: delete files whose deleted rows are the ones taken; ``None`` for every row.
    """

    file: ContentFile
    change_type: ChangeType
    minus: tuple[ContentFile, ...] = ()
    within: tuple[ContentFile, ...] | None = None

    def delete_files(self) -> tuple[ContentFile, ...]:
        """Every delete file the task reads."""
        return self.minus + (self.within or ())


@dataclass(frozen=True, slots=True)
class IcebergPlan:
    """The planned change rows of one snapshot (or of an initial snapshot at one).

    Attributes:
        version: the snapshot's version (:mod:`state.iceberg.ancestry`).
        snapshot: the snapshot.
        tasks: what to read, in output order before cancellation.
        initial: whether it is an initial snapshot (every live row as an insert).
        net: whether rows deleted and inserted alike cancel (a snapshot that both deletes and inserts).
    """

    version: int
    snapshot: SnapshotInfo
    tasks: tuple[RowTask, ...]
    initial: bool = False
    net: bool = False

    @property
    def operation(self) -> str | None:
        """The snapshot's operation."""
        return self.snapshot.operation

    @property
    def timestamp_ms(self) -> int:
        """When the snapshot was committed (epoch ms)."""
        return self.snapshot.timestamp_ms


class DeleteIndex:
    """The delete files of one snapshot, found by the data files they apply to."""

    def __init__(self, files: Iterable[ContentFile], unpartitioned_specs: frozenset[int]) -> None:
        self._by_partition: dict[tuple[int, tuple[object, ...]], list[ContentFile]] = defaultdict(list)
        self._global: list[ContentFile] = []
        self.files: frozenset[ContentFile] = frozenset(files)
        for f in sorted(self.files, key=lambda f: f.path):
            if f.spec_id in unpartitioned_specs:
                self._global.append(f)
            else:
                self._by_partition[(f.spec_id, f.partition)].append(f)

    def for_data(self, data: ContentFile) -> tuple[ContentFile, ...]:
        """The delete files that apply to ``data`` (the spec's rule; see the module docstring).

        Raises:
            InvalidLogError: if two deletion vectors apply to ``data``.
        """
        found: list[ContentFile] = []
        vectors: list[ContentFile] = []
        for d in (*self._global, *self._by_partition.get((data.spec_id, data.partition), ())):
            if d.content == POSITION_DELETES:
                if d.data_sequence >= data.data_sequence and d.referenced_data_file in (None, data.path):
                    (vectors if d.is_deletion_vector else found).append(d)
            elif d.data_sequence > data.data_sequence:
                found.append(d)
        if len(vectors) > 1:
            raise InvalidLogError(
                f"data file {data.path} has {len(vectors)} deletion vectors (at most one is allowed): "
                + ", ".join(f"{v.path} at {v.content_offset}" for v in vectors),
                file=data.path,
            )
        if vectors:
            return (*(d for d in found if d.content != POSITION_DELETES), vectors[0])
        return tuple(found)


def check_files(files: Iterable[ContentFile], *, table: str | None, version: int) -> None:
    """Refuse delete files deltatail cannot apply exactly.

    Raises:
        UnsupportedFeatureError: for data files and delete files not in Parquet (deletion vectors
            excepted: position deletes in a Puffin file).
        InvalidLogError: for equality deletes without equality field ids, and a deletion vector
            without ``referenced_data_file``, ``content_offset`` or ``content_size_in_bytes``.
    """
    for f in files:
        if f.is_deletion_vector:
            if f.referenced_data_file is None or f.content_offset is None or f.content_size is None:
                raise InvalidLogError(
                    "a deletion vector's manifest entry lacks referenced_data_file, content_offset or "
                    "content_size_in_bytes",
                    table=table,
                    version=version,
                    file=f.path,
                )
            continue
        if f.file_format != "PARQUET":
            kind = "data" if f.is_data else "delete"
            raise UnsupportedFeatureError(
                f"{f.file_format} {kind} files are not read yet (deltatail reads Parquet data and delete files, "
                "and deletion vectors in Puffin files)",
                features=frozenset({f.file_format.lower()}),
                table=table,
                version=version,
                file=f.path,
            )
        if f.content == EQUALITY_DELETES and not f.equality_ids:
            raise InvalidLogError(
                "an equality delete file names no equality field ids", table=table, version=version, file=f.path
            )


def _split(files: Iterable[ContentFile]) -> tuple[dict[str, ContentFile], list[ContentFile]]:
    data: dict[str, ContentFile] = {}
    deletes: list[ContentFile] = []
    for f in files:
        if f.content == DATA:
            data[f.path] = f
        else:
            deletes.append(f)
    return data, deletes


def plan_snapshot(
    before: Sequence[ContentFile] | None,
    after: Sequence[ContentFile],
    snapshot: SnapshotInfo,
    version: int,
    unpartitioned_specs: frozenset[int],
    *,
    table: str | None = None,
) -> IcebergPlan:
    """The change rows of ``snapshot`` given its parent's live files (``None``: no parent) and its own.

    Raises:
        UnsupportedFeatureError: as :func:`check_files`, for files the plan would read.
        InvalidLogError: as :func:`check_files`.
    """
    if snapshot.operation == REPLACE:
        return IcebergPlan(version, snapshot, ())
    old_data, old_deletes = _split(before or ())
    new_data, new_deletes = _split(after)
    old_index = DeleteIndex(old_deletes, unpartitioned_specs)
    new_index = DeleteIndex(new_deletes, unpartitioned_specs)
    deletes: list[RowTask] = []
    inserts: list[RowTask] = []
    for path in sorted(old_data.keys() - new_data.keys()):
        f = old_data[path]
        deletes.append(RowTask(f, "delete", minus=old_index.for_data(f)))
    if old_index.files != new_index.files:
        for path in sorted(old_data.keys() & new_data.keys()):
            f = new_data[path]
            was, now = old_index.for_data(old_data[path]), new_index.for_data(f)
            if not set(now) <= set(was):  # new deletes: rows may be newly deleted
                deletes.append(RowTask(old_data[path], "delete", minus=was, within=now))
            if not set(was) <= set(now):  # deletes gone: rows may be live again
                inserts.append(RowTask(f, "insert", minus=now, within=was))
    for path in sorted(new_data.keys() - old_data.keys()):
        f = new_data[path]
        inserts.append(RowTask(f, "insert", minus=new_index.for_data(f)))
    tasks = (*deletes, *inserts)
    _check_tasks(tasks, table=table, version=version)
    return IcebergPlan(version, snapshot, tasks, net=bool(deletes) and bool(inserts))


def plan_initial(
    files: Sequence[ContentFile],
    snapshot: SnapshotInfo,
    version: int,
    unpartitioned_specs: frozenset[int],
    *,
    table: str | None = None,
) -> IcebergPlan:
    """Every live row at ``snapshot`` as an ``insert`` (an initial snapshot), data files by path.

    Raises:
        UnsupportedFeatureError, InvalidLogError: as :func:`check_files`.
    """
    data, deletes = _split(files)
    index = DeleteIndex(deletes, unpartitioned_specs)
    tasks = tuple(RowTask(data[p], "insert", minus=index.for_data(data[p])) for p in sorted(data))
    _check_tasks(tasks, table=table, version=version)
    return IcebergPlan(version, snapshot, tasks, initial=True)


def _check_tasks(tasks: Sequence[RowTask], *, table: str | None, version: int) -> None:
    seen: dict[str, ContentFile] = {}
    for t in tasks:
        seen.setdefault(t.file.path, t.file)
        for d in t.delete_files():
            seen.setdefault(d.path, d)
    check_files(seen.values(), table=table, version=version)


def live_files(manifests: Mapping[str, Sequence[ContentFile]]) -> list[ContentFile]:
    """The live files of a snapshot from its manifests' live entries, each path once.

    Raises:
        InvalidLogError: if two live entries name the same path with different contents.
    """
    out: dict[str, ContentFile] = {}
    for path in sorted(manifests):
        for f in manifests[path]:
            other = out.setdefault(f.path, f)
            if other is not f and other.content != f.content:
                raise InvalidLogError(f"file {f.path} is live twice, as content {other.content} and {f.content}")
    return list(out.values())
