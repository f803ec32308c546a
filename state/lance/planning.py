"""Planning a Lance version's change rows from the manifests on either side of it. Pure: no IO.

A version is compared with the one before it, fragment by fragment (a fragment is the same across
the two when :meth:`~state.lance.manifest.Fragment.same_rows` says so):

1. Rows of a fragment that is gone, and were live, are ``delete`` rows (read at the version before).
2. Rows newly in a fragment's deletion file are ``delete`` rows (read at the version before).
3. Rows in the old deletion file but not in the new one are ``insert`` rows (a ``Restore``).
4. Rows of a new fragment are ``insert`` rows (read at the version itself).
5. Where the dataset has stable row ids, a deleted row and an inserted row with the same row id are
   one row updated: an ``update_preimage`` (the deleted row) and an ``update_postimage`` (the
   inserted one). Without stable row ids an update is its deletes and inserts.
6. A compaction (``Rewrite``) rearranges rows without changing them and gives nothing (its live row
   count is checked); versions that change no fragment (an index, a config change, a reserved
   fragment id, a column addition) give nothing. A column addition's new values are not change
   rows: the rows themselves did not change (as with Delta's ``ADD COLUMNS``).
7. A version that rewrites the data of existing columns in place (an update in
   ``REWRITE_COLUMNS`` mode, a ``DataReplacement``) is refused: its rows cannot be told apart
   without comparing every row, which deltatail does not do yet.

Emit order inside a version is fixed, so a row's position names the same row on every read: plain
deletes (gone fragments, then newly deleted rows, each in fragment-id and offset order), update
preimages, the matching postimages in the same order, then plain inserts (restored rows, then new
fragments).

Planning is two steps: :func:`diff_versions` tells which deletion files and row-id sequences are
needed; the caller reads them and :func:`plan_version` makes the tasks.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

import pyarrow as pa
import pyarrow.compute as pc
from pyroaring import BitMap

from deltatail.state.errors import InvalidLogError, UnsupportedFeatureError
from deltatail.state.lance.manifest import DeletionFile, Fragment, Manifest, Transaction

ChangeType = Literal["insert", "delete", "update_preimage", "update_postimage"]

#: Operations that move rows between fragments without changing them.
REARRANGING = frozenset({"Rewrite"})


@dataclass(frozen=True, slots=True)
class RowTask:
    """Rows of one fragment to read at one version, as one change type.

    Attributes:
        fragment: the fragment as that version's manifest has it.
        version: the dataset version to read it at (the version before, for deleted rows).
        change_type: what the rows are.
        offsets: physical row offsets in output order, all live at ``version``; ``None`` for every
            live row of the fragment in physical order.
        deleted: the fragment's deleted offsets at ``version``, sorted (readers that take rows by
            their logical index, counted without deleted rows, need them).
    """

    fragment: Fragment
    version: int
    change_type: ChangeType
    offsets: pa.Array | None = None
    deleted: pa.Array | None = field(default=None, compare=False)

    @property
    def rows(self) -> int:
        """How many rows the task gives."""
        return self.fragment.live_rows if self.offsets is None else len(self.offsets)


@dataclass(frozen=True, slots=True)
class LancePlan:
    """The planned change rows of one version (or of an initial snapshot at a version)."""

    version: int
    timestamp_us: int
    operation: str | None
    tasks: tuple[RowTask, ...]
    snapshot: bool = False

    @property
    def rows(self) -> int:
        """How many change rows the plan gives."""
        return sum(t.rows for t in self.tasks)


@dataclass(frozen=True, slots=True)
class VersionDiff:
    """Step one: how two consecutive versions differ, fragment by fragment."""

    before: Manifest | None
    after: Manifest
    operation: str | None
    removed: tuple[Fragment, ...]
    added: tuple[Fragment, ...]
    changed: tuple[tuple[Fragment, Fragment], ...]
    rearranged: bool

    def deletion_files(self) -> list[DeletionFile]:
        """The deletion files :func:`plan_version` needs, each once."""
        if self.rearranged:
            return []
        out: dict[str, DeletionFile] = {}
        frags = [*self.removed, *self.added, *(f for pair in self.changed for f in pair)]
        for f in frags:
            if f.deletion is not None:
                out[f.deletion.path] = f.deletion
        return list(out.values())

    def pairs_updates(self) -> bool:
        """Whether deleted and inserted rows are paired by stable row id (and row ids are needed)."""
        if self.rearranged or self.before is None or not self.after.stable_row_ids:
            return False
        deletes = bool(self.removed) or bool(self.changed)
        inserts = bool(self.added) or bool(self.changed)
        return deletes and inserts

    def row_id_fragments(self) -> list[tuple[int, Fragment]]:
        """``(version, fragment)`` pairs whose row ids :func:`plan_version` needs."""
        if not self.pairs_updates() or self.before is None:
            return []
        old = [(self.before.version, f) for f in self.removed] + [(self.before.version, o) for o, _ in self.changed]
        new = [(self.after.version, f) for f in self.added] + [(self.after.version, n) for _, n in self.changed]
        return old + new


def _rebacked(old: Fragment, new: Fragment, kept_fields: set[int]) -> list[int]:
    """Field ids (of columns on both sides) whose data moved to another file: data rewritten in place."""
    before, after = old.field_files(), new.field_files()
    return sorted(fid for fid in kept_fields if fid in before and after.get(fid) != before[fid])


def diff_versions(
    before: Manifest | None, after: Manifest, transaction: Transaction | None, *, table: str | None = None
) -> VersionDiff:
    """Step one: compare ``after`` with the version just before it (``None`` before the first version).

    Raises:
        UnsupportedFeatureError: if ``after`` needs a feature deltatail does not read, or rewrites the
            data of existing columns in place.
        InvalidLogError: if a compaction changes the number of live rows, or a version that removes
            and adds fragments has no transaction to tell a compaction from a rewrite.
    """
    after.require_supported(table)
    operation = None if transaction is None else transaction.operation
    if before is None:
        return VersionDiff(None, after, operation, (), after.fragments, (), False)
    old_by_id = {f.id: f for f in before.fragments}
    kept_fields = {f.id for f in before.fields} & {f.id for f in after.fields}
    removed: list[Fragment] = []
    added: list[Fragment] = []
    changed: list[tuple[Fragment, Fragment]] = []
    matched: set[int] = set()
    for new in after.fragments:
        old = old_by_id.get(new.id)
        if old is None or not old.same_rows(new):
            added.append(new)
            continue
        matched.add(old.id)
        moved = _rebacked(old, new, kept_fields)
        if moved and operation not in REARRANGING:
            raise UnsupportedFeatureError(
                f"version rewrites the data of existing columns in place (fragment {new.id}, field ids "
                f"{', '.join(map(str, moved))}; operation {operation}): not supported yet",
                features=frozenset({"in-place column rewrite"}),
                table=table,
                version=after.version,
            )
        if old.deletion != new.deletion:
            changed.append((old, new))
    removed = [f for f in before.fragments if f.id not in matched]
    rearranged = operation in REARRANGING
    if rearranged and before.live_rows != after.live_rows:
        raise InvalidLogError(
            f"a compaction changed the number of live rows from {before.live_rows} to {after.live_rows}",
            table=table,
            version=after.version,
        )
    if transaction is None and removed and added:
        raise InvalidLogError(
            "the version removes and adds fragments but has no transaction to tell a compaction from a rewrite",
            table=table,
            version=after.version,
        )
    return VersionDiff(before, after, operation, tuple(removed), tuple(added), tuple(changed), rearranged)


# -- step two ------------------------------------------------------------------------------------


def _sorted(bitmap: BitMap | None) -> pa.Array:
    """A bitmap's values as a sorted ``uint32`` array (its buffer taken as it is: no per-value conversion)."""
    if bitmap is None or not len(bitmap):
        return pa.array([], pa.uint32())
    values = bitmap.to_array()  # array.array of unsigned 32-bit ints
    if values.itemsize != 4:  # pragma: no cover - a platform whose C unsigned int is not 32 bits
        return pa.array(values, pa.uint32())
    return pa.Array.from_buffers(pa.uint32(), len(values), [None, pa.py_buffer(values)])


def _deleted(f: Fragment, deletions: Mapping[str, BitMap], table: str | None, version: int) -> BitMap:
    if f.deletion is None:
        return BitMap()
    bitmap = deletions.get(f.deletion.path)
    if bitmap is None:
        raise InvalidLogError(f"deletion file {f.deletion.path} was not read", table=table, version=version)
    if len(bitmap) != f.deletion.num_deleted_rows or (len(bitmap) and bitmap.max() >= f.physical_rows):
        raise InvalidLogError(
            f"deletion file of fragment {f.id} holds {len(bitmap)} offsets (largest "
            f"{bitmap.max() if len(bitmap) else '-'}); the manifest says {f.deletion.num_deleted_rows} of "
            f"{f.physical_rows} rows",
            table=table,
            version=version,
            file=f.deletion.path,
        )
    return bitmap


@dataclass
class _Rows:
    """Rows in output order: which fragment (index into ``frags``), which offset, and (paired) which row id."""

    frags: list[tuple[Fragment, int, BitMap]] = field(default_factory=list)
    which: list[pa.Array] = field(default_factory=list)
    offsets: list[pa.Array] = field(default_factory=list)

    def add(self, f: Fragment, version: int, deleted: BitMap, offsets: pa.Array) -> None:
        if len(offsets) == 0:
            return
        self.which.append(pa.repeat(pa.scalar(len(self.frags), pa.int32()), len(offsets)))
        self.frags.append((f, version, deleted))
        self.offsets.append(offsets.cast(pa.uint32()))

    def table(self) -> tuple[pa.Array, pa.Array]:
        if not self.which:
            return pa.array([], pa.int32()), pa.array([], pa.uint32())
        return pa.concat_arrays(self.which), pa.concat_arrays(self.offsets)


def _live(f: Fragment, deleted: BitMap) -> pa.Array:
    if not len(deleted):
        return _range32(f.physical_rows)
    live = BitMap(range(f.physical_rows)) if f.physical_rows else BitMap()
    live -= deleted
    return _sorted(live)


def _range32(n: int) -> pa.Array:
    if n == 0:
        return pa.array([], pa.uint32())
    return pc.subtract(pc.cumulative_sum(pa.repeat(pa.scalar(1, pa.uint32()), n)), pa.scalar(1, pa.uint32()))


def _runs(which: pa.Array) -> list[tuple[int, int]]:
    """``(start, end)`` of each run of equal values in ``which``."""
    n = len(which)
    if n == 0:
        return []
    if n == 1:
        return [(0, 1)]
    breaks = pc.indices_nonzero(pc.not_equal(which.slice(1), which.slice(0, n - 1))).to_pylist()
    starts = [0, *(b + 1 for b in breaks)]
    return list(zip(starts, [*starts[1:], n], strict=True))


def _ascending(run: pa.Array) -> bool:
    if len(run) < 2:
        return True
    return bool(pc.all(pc.greater(run.slice(1), run.slice(0, len(run) - 1))).as_py())


def _tasks(rows: _Rows, which: pa.Array, offsets: pa.Array, change_type: ChangeType) -> list[RowTask]:
    """Tasks reading ``offsets`` (rows of ``rows.frags[which]``) in this order: one per run of one fragment.

    A run of every live row of a fragment in physical order reads the whole fragment (``offsets=None``).
    """
    out: list[RowTask] = []
    for start, end in _runs(which):
        f, version, deleted = rows.frags[which[start].as_py()]
        run = offsets.slice(start, end - start)
        whole = len(run) == f.live_rows and _ascending(run)  # live offsets, unique: all of them, in order
        out.append(RowTask(f, version, change_type, None if whole else run, None if whole else _sorted(deleted)))
    return out


def plan_version(
    diff: VersionDiff,
    deletions: Mapping[str, BitMap],
    row_ids: Mapping[tuple[int, int], pa.Array] | None = None,
    *,
    table: str | None = None,
) -> LancePlan:
    """Step two: the change rows of ``diff.after``'s version.

    Args:
        diff: step one's result.
        deletions: the deleted offsets of every deletion file :meth:`VersionDiff.deletion_files` names, by path.
        row_ids: the stable row ids of every fragment :meth:`VersionDiff.row_id_fragments` names, by
            ``(version, fragment id)``, one per physical row.
        table: the dataset, for errors.

    Raises:
        InvalidLogError: if a deletion file or row-id sequence is missing or disagrees with the manifest.
    """
    after = diff.after
    version = after.version
    if diff.rearranged:
        return LancePlan(version, after.timestamp_us, diff.operation, ())
    before_version = version - 1 if diff.before is None else diff.before.version
    deletes = _Rows()
    inserts = _Rows()
    for f in diff.removed:
        dels = _deleted(f, deletions, table, version)
        deletes.add(f, before_version, dels, _live(f, dels))
    restores: list[tuple[Fragment, BitMap, pa.Array]] = []
    for old, new in diff.changed:
        old_dels = _deleted(old, deletions, table, version)
        new_dels = _deleted(new, deletions, table, version)
        deletes.add(old, before_version, old_dels, _sorted(new_dels - old_dels))
        restored = old_dels - new_dels
        if restored:
            restores.append((new, new_dels, _sorted(restored)))
    for new, new_dels, restored_offsets in restores:
        inserts.add(new, version, new_dels, restored_offsets)
    for f in diff.added:
        dels = _deleted(f, deletions, table, version)
        inserts.add(f, version, dels, _live(f, dels))

    del_which, del_offsets = deletes.table()
    ins_which, ins_offsets = inserts.table()
    tasks: list[RowTask] = []
    if diff.pairs_updates() and len(del_which) and len(ins_which):
        del_ids = _ids(deletes, del_which, del_offsets, row_ids or {}, table, version)
        ins_ids = _ids(inserts, ins_which, ins_offsets, row_ids or {}, table, version)
        match = pc.index_in(del_ids, value_set=ins_ids)
        paired = pc.is_valid(match)
        post = pc.drop_null(match)
        unpaired_ins = pc.invert(pc.is_in(_range32(len(ins_ids)).cast(pa.int32()), value_set=post.cast(pa.int32())))
        tasks += _tasks(deletes, del_which.filter(pc.invert(paired)), del_offsets.filter(pc.invert(paired)), "delete")
        tasks += _tasks(deletes, del_which.filter(paired), del_offsets.filter(paired), "update_preimage")
        tasks += _tasks(inserts, ins_which.take(post), ins_offsets.take(post), "update_postimage")
        tasks += _tasks(inserts, ins_which.filter(unpaired_ins), ins_offsets.filter(unpaired_ins), "insert")
    else:
        tasks += _tasks(deletes, del_which, del_offsets, "delete")
        tasks += _tasks(inserts, ins_which, ins_offsets, "insert")
    return LancePlan(version, after.timestamp_us, diff.operation, tuple(tasks))


def _ids(
    rows: _Rows,
    which: pa.Array,
    offsets: pa.Array,
    row_ids: Mapping[tuple[int, int], pa.Array],
    table: str | None,
    version: int,
) -> pa.Array:
    """The stable row id of every row of ``rows``, in order."""
    parts: list[pa.Array] = []
    for start, end in _runs(which):
        f, at, _ = rows.frags[which[start].as_py()]
        ids = row_ids.get((at, f.id))
        if ids is None or len(ids) != f.physical_rows:
            raise InvalidLogError(
                f"the row ids of fragment {f.id} at version {at} are missing or do not cover its "
                f"{f.physical_rows} rows",
                table=table,
                version=version,
            )
        parts.append(ids.take(offsets.slice(start, end - start)))
    return pa.concat_arrays(parts) if parts else pa.array([], pa.uint64())


def plan_snapshot(manifest: Manifest, *, table: str | None = None) -> LancePlan:
    """Every live row of ``manifest``'s version as an ``insert``, fragment by fragment (initial snapshot).

    Raises:
        UnsupportedFeatureError: as :meth:`~state.lance.manifest.Manifest.require_supported`.
    """
    manifest.require_supported(table)
    tasks = tuple(RowTask(f, manifest.version, "insert") for f in manifest.fragments if f.live_rows)
    return LancePlan(manifest.version, manifest.timestamp_us, None, tasks, snapshot=True)
