"""Net changes: cancel rewrite noise in commits without change data files.

Without cdc files, a copy-on-write rewrite emits every row of the removed file
as ``delete`` and every row of the rewritten file as ``insert``, even rows that
did not change. Net changes removes that noise within one commit:

1. A ``delete`` row and an ``insert`` row with identical values in every table
   column cancel out (as multisets: two identical deletes and one identical
   insert leave one delete).
2. With key columns, a remaining ``delete`` and ``insert`` of the same key
   become ``update_preimage`` and ``update_postimage``, provided the key occurs
   once among the deletes and once among the inserts (otherwise the pairing
   would be a guess, and the rows stay as they are).

Output order: with key columns, update pairs (pre-image then post-image, in
the order of their deletes), then remaining deletes, then remaining inserts,
each in input order; without, the remaining rows in input order.

Equality is that of each value's JSON (:func:`row_keys`): values equal, except
that NaN, the infinities and null are one value and ``-0.0`` is not ``0.0``.
It is computed column-wise in Arrow (:func:`group_ids`: an integer code per
row), not with a Python object per row; only types Arrow cannot hash (struct,
list, map) are encoded per value in Python.

Memory: rule 1 needs every row of a commit with the same values side by side,
and rule 2 every row of a key, so a commit is netted in key-hash partitioned
passes (:func:`net_passes`): each pass holds the rows whose key (with no key
columns, whose whole row) hashes to it, so rows that cancel or pair always meet
in one pass. The commit's files are read once, each row written to its pass's
spill file (:mod:`tailer.read.spill`), and the passes read back one by one. A commit of at most
:data:`NET_PASS_BYTES` of files is one pass (the order above); a larger one is
netted pass by pass, each pass in that order. The number of passes depends
only on the commit's file sizes, so the positions of the netted rows are the
same on every read (a restart inside the commit resumes at the same row). The
pass size is part of the row order a cursor records (:data:`ROW_ORDER`): a cursor
saved inside a commit under an earlier pass size reads that commit with it
(:data:`PASS_BYTES_OF_ORDER`).
"""

from __future__ import annotations

import math
import zlib
from collections.abc import Iterator, Sequence
from typing import Any, TypeAlias

import numpy as np
import numpy.typing as npt
import orjson
import pyarrow as pa

from deltatail.state.changes import FileTask
from deltatail.state.errors import ConfigError

_CHANGE = ("_change_type", "_commit_version", "_commit_timestamp")
_OPTIONS = orjson.OPT_PASSTHROUGH_DATETIME


def row_keys(table: pa.Table, columns: list[str]) -> list[bytes]:
    """A canonical byte key per row over ``columns`` (values of any type, nested included).

    Each key is copied to a ``bytes`` of its own size: the object ``orjson.dumps`` returns keeps
    its whole output buffer (about 4 KiB for a short row), which for a commit's million keys is gigabytes.
    """
    values = [table.column(c).to_pylist() for c in columns]
    return [bytes(memoryview(orjson.dumps(row, default=_encode, option=_OPTIONS))) for row in zip(*values, strict=True)]


def _encode(value: Any) -> Any:
    return repr(value)


# -- equality classes in Arrow ------------------------------------------------------------------------
#
# Two rows are "identical" (rule 1) or "of the same key" (rule 2) when :func:`row_keys` gives them the
# same bytes: JSON per value, with ``repr`` for what JSON has no type for. Per column that is equality
# of values, except for floats, where JSON writes NaN and the infinities as ``null`` (all four equal)
# and keeps ``-0.0`` apart from ``0.0``. The functions below give each row an integer code per column
# with exactly that equality, computed in Arrow; a type Arrow cannot hash (struct, list, map, ...)
# keeps the JSON of each value as its code's source.

_Column: TypeAlias = pa.ChunkedArray | pa.Array


def _plain(column: _Column) -> _Column:
    """``column`` with values equal exactly when their JSON is: floats as their bits, non-finite as null."""
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    if pa.types.is_dictionary(column.type):
        column = pc.cast(column, column.type.value_type)
    if pa.types.is_float32(column.type) or pa.types.is_float64(column.type):
        finite = pc.if_else(pc.is_finite(column), column, pa.scalar(None, column.type))
        bits = pa.int32() if pa.types.is_float32(column.type) else pa.int64()
        chunks = finite.chunks if isinstance(finite, pa.ChunkedArray) else [finite]
        return pa.chunked_array([c.view(bits) for c in chunks], bits)
    return column


def _json_values(column: _Column) -> pa.Array:
    """Each value of ``column`` as :func:`row_keys` writes it (for types Arrow cannot hash)."""
    return pa.array(
        [bytes(memoryview(orjson.dumps(v, default=_encode, option=_OPTIONS))) for v in column.to_pylist()],
        pa.binary(),
    )


def _codes(column: _Column) -> tuple[pa.ChunkedArray, int]:
    """Integer codes of ``column``'s values (null one code of its own), and how many codes there are."""
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    plain = _plain(column)
    if pa.types.is_integer(plain.type):  # floats too: _plain gives their bits
        return _sorted_codes(plain)
    try:
        encoded = pc.dictionary_encode(plain, null_encoding="encode")
    except pa.ArrowNotImplementedError:
        encoded = pc.dictionary_encode(_json_values(plain), null_encoding="encode")
    chunks = encoded.chunks if isinstance(encoded, pa.ChunkedArray) else [encoded]
    size = len(chunks[0].dictionary) if chunks else 0
    return pa.chunked_array([pc.cast(c.indices, pa.int64()) for c in chunks], pa.int64()), size


def _sorted_codes(column: _Column) -> tuple[pa.ChunkedArray, int]:
    """:func:`_codes` of an integer column: each value's rank among the distinct values, null the last code.

    By sorting, not hashing: Arrow's hash table for a column of distinct 64-bit values holds several
    times the column while it grows; the sort holds a few arrays of the column's length.
    """
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    whole = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if not whole.null_count:
        distinct, codes = np.unique(np.asarray(whole.to_numpy(zero_copy_only=False)), return_inverse=True)
        return pa.chunked_array([pa.array(codes.astype(np.int64, copy=False))], pa.int64()), len(distinct)
    values = np.asarray(pc.fill_null(whole, 0).to_numpy(zero_copy_only=False))
    valid = np.asarray(whole.is_valid().to_numpy(zero_copy_only=False), dtype=np.bool_)
    distinct, ranks = np.unique(values[valid], return_inverse=True)
    codes = np.full(len(values), len(distinct), dtype=np.int64)
    codes[valid] = ranks
    return pa.chunked_array([pa.array(codes)], pa.int64()), len(distinct) + 1


def _offsets(column: _Column, rows: int) -> tuple[pa.ChunkedArray, int] | None:
    """An integer column without nulls whose values span at most ``4 * rows``: its values less the least."""
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    if not pa.types.is_integer(column.type) or pa.types.is_uint64(column.type) or column.null_count or not len(column):
        return None
    bounds = pc.min_max(column)
    low, high = int(bounds["min"].as_py()), int(bounds["max"].as_py())
    if high - low + 1 > 4 * max(rows, 1):
        return None
    span = high - low + 1
    codes = pc.subtract(pc.cast(column, pa.int64()), pa.scalar(low, pa.int64()))
    return pa.chunked_array([codes], pa.int64()) if isinstance(codes, pa.Array) else codes, span


#: The most codes a combination of columns may have before it is re-encoded densely.
_SPAN = 1 << 40


def group_ids(table: pa.Table, columns: Sequence[str]) -> pa.ChunkedArray:
    """A code per row of ``table``, equal for two rows exactly when :func:`row_keys` over ``columns`` is.

    Codes are below ``4 * rows`` (dense after a re-encoding). An integer column of a narrow range is
    its own code (its values less the least: no hashing); columns are combined as mixed-radix numbers,
    re-encoded densely whenever the combination would pass :data:`_SPAN` codes.
    """
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    ids: pa.ChunkedArray | None = None
    span = 1
    rows = table.num_rows
    for name in columns:
        codes, size = _offsets(table.column(name), rows) or _codes(table.column(name))
        if ids is None:
            ids, span = codes, size
            continue
        if span * max(size, 1) > _SPAN:
            ids, span = _codes(ids)
        ids, span = pc.add(pc.multiply(ids, pa.scalar(max(size, 1), pa.int64())), codes), span * max(size, 1)
    if ids is None:
        return pa.chunked_array([pa.repeat(pa.scalar(0, pa.int64()), rows)], pa.int64())
    if span > 4 * max(rows, 1):
        ids, span = _codes(ids)
    return ids


def _ints(column: _Column) -> npt.NDArray[np.int64]:
    """An int64 column without nulls as a numpy array."""
    return np.asarray(column.to_numpy(), dtype=np.int64)


def flags(column: _Column) -> npt.NDArray[np.bool_]:
    """A boolean column without nulls as a numpy array."""
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype=np.bool_)


def _occurrence(ids: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """For each row, how many rows before it have the same id (0 for the first of an id)."""
    order = np.argsort(ids, kind="stable")
    ranked = ids[order]
    position = np.arange(len(ids), dtype=np.int64)
    starts = np.ones(len(ids), dtype=np.bool_)
    starts[1:] = ranked[1:] != ranked[:-1]
    first = np.maximum.accumulate(np.where(starts, position, 0))
    out = np.empty(len(ids), dtype=np.int64)
    out[order] = position - first
    return out


#: The order a commit's rows come in when it is netted, or its update images paired, in several passes
#: (part of a cursor saved inside such a commit, ``row_order`` in ``cursor.json``): 1, a CRC-32 of
#: each row's JSON key picked its pass, one pass per 8 MiB of files (deltatail before 2026-11-28);
#: 2, :func:`key_hash`, one pass per 8 MiB; 3, :func:`key_hash`, one pass per 4 MiB; 4,
#: :func:`key_hash`, one pass per :data:`NET_PASS_BYTES`. A cursor of order 2 or 3 inside a commit
#: reads that commit in its order's passes; one of order 1 inside a commit whose rows its hash placed
#: differently is refused (:meth:`tailer.read.feed.ChangeFeed.adopt_row_order`).
ROW_ORDER = 4

#: Bytes of a commit's files (as the log gives their sizes) netted or paired in one pass (row order
#: :data:`ROW_ORDER`). A pass holds its share of the commit decoded: this bounds a netted or paired
#: read's memory; smaller passes cost time (more of them, spilled in smaller pieces). The trade
#: against 4 MiB is measured in ``docs/experiments.md``.
NET_PASS_BYTES = 2 << 20
#: The pass size of each earlier row order (:data:`ROW_ORDER`).
PASS_BYTES_OF_ORDER: dict[int, int] = {1: 8 << 20, 2: 8 << 20, 3: 4 << 20}
#: The earlier row orders whose passes hash keys as :func:`key_hash` does.
KEY_HASH_ORDERS = (2, 3)
#: The most passes over one commit (a bound on the file sizes a log may claim).
MAX_NET_PASSES = 1024


def net_passes(tasks: Sequence[FileTask], pass_bytes: int | None = None) -> int:
    """How many key-hash partitioned passes net (or pair) a commit of ``tasks``: one per ``pass_bytes`` of files.

    ``pass_bytes`` defaults to :data:`NET_PASS_BYTES`. Files whose size the log omits count as
    nothing; the result is between 1 and :data:`MAX_NET_PASSES`.
    """
    size = NET_PASS_BYTES if pass_bytes is None else pass_bytes
    total = sum(t.size for t in tasks if t.size is not None and t.size > 0)
    return max(1, min(math.ceil(total / size), MAX_NET_PASSES))


def pass_ids(batch: pa.RecordBatch, key_columns: tuple[str, ...], passes: int) -> pa.Array:
    """The key-hash pass (``0 .. passes - 1``, ``uint64``) of each row of ``batch`` under net changes.

    The pass is a hash of the key columns (with none, of the whole row; :func:`key_hash`), a pure
    function of the key's values, so a row's pass, and with it its netted position, is the same on
    every read.

    Raises:
        ConfigError: if a key column is not a column of the batch.
    """
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    table = pa.Table.from_batches([batch])
    _check_keys(table, key_columns)
    columns = list(key_columns) or [c for c in table.column_names if c not in _CHANGE]
    h = key_hash(table, columns)
    divisor = pa.scalar(passes, pa.uint64())
    return pc.subtract(h, pc.multiply(pc.divide(h, divisor), divisor)).combine_chunks()


def in_pass(batch: pa.RecordBatch, key_columns: tuple[str, ...], passes: int, which: int) -> pa.RecordBatch:
    """The rows of ``batch`` that pass ``which`` of ``passes`` nets (:func:`pass_ids`).

    Raises:
        ConfigError: if a key column is not a column of the batch.
    """
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    return batch.filter(pc.equal(pass_ids(batch, key_columns, passes), pa.scalar(which, pa.uint64())))


_GOLDEN = pa.scalar(0x9E3779B97F4A7C15, pa.uint64())
_SHIFT = pa.scalar(29, pa.uint64())


def key_hash(table: pa.Table, columns: Sequence[str]) -> pa.ChunkedArray:
    """A 64-bit hash per row of ``columns``, equal for rows :func:`row_keys` makes equal.

    Each column contributes 64 bits of its value (:func:`value_bits`), mixed multiplicatively
    (a Fibonacci hash with a xor-shift), so the result depends on the values alone, not on the batch.
    """
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    h = pa.chunked_array([pa.repeat(pa.scalar(0, pa.uint64()), table.num_rows)], pa.uint64())
    for name in columns:
        h = pc.multiply(pc.bit_wise_xor(h, value_bits(table.column(name))), _GOLDEN)
        h = pc.bit_wise_xor(h, pc.shift_right(h, _SHIFT))
    return h


def value_bits(column: pa.ChunkedArray) -> pa.ChunkedArray:
    """64 bits per value, the same for values :func:`row_keys` makes equal.

    Integers, booleans, dates, times, timestamps and durations are their integer value, floats their
    bits (NaN and the infinities as null, as JSON has them); nulls are 0. Other values (strings,
    binaries, decimals, nested values) are a CRC-32 of their JSON, computed once per distinct value.
    """
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    plain = _plain(column)
    if pa.types.is_temporal(plain.type) and plain.type.bit_width in (32, 64):
        width = pa.int32() if plain.type.bit_width == 32 else pa.int64()
        chunks = plain.chunks if isinstance(plain, pa.ChunkedArray) else [plain]
        plain = pa.chunked_array([c.view(width) for c in chunks], width)
    kind = plain.type
    if pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        wide = plain if pa.types.is_uint64(kind) else pc.cast(plain, pa.int64())
        return pc.cast(wide, pa.uint64(), safe=False).fill_null(0)
    try:
        encoded = pc.dictionary_encode(plain, null_encoding="encode")
    except pa.ArrowNotImplementedError:
        encoded = pc.dictionary_encode(_json_values(plain), null_encoding="encode")
    chunks = encoded.chunks if isinstance(encoded, pa.ChunkedArray) else [encoded]
    if not chunks:
        return pa.chunked_array([], pa.uint64())
    crcs = pa.array(
        [zlib.crc32(orjson.dumps(v, default=_encode, option=_OPTIONS)) for v in chunks[0].dictionary.to_pylist()],
        pa.uint64(),
    )
    return pa.chunked_array([crcs.take(c.indices) for c in chunks], pa.uint64())


def _check_keys(table: pa.Table, key_columns: tuple[str, ...]) -> None:
    missing = [k for k in key_columns if k not in table.column_names]
    if missing:
        raise ConfigError(f"net-changes key columns not in the table: {', '.join(missing)}")


def net_changes(table: pa.Table, key_columns: tuple[str, ...] = ()) -> pa.Table:
    """Apply the net-change rules of the module docstring to one commit's change rows.

    Computed per column, not per row: rows get a group code over the table columns (:func:`group_ids`);
    a ``delete`` cancels when fewer deletes of its group come before it than the group has inserts,
    and an ``insert`` likewise (the first ``min(deletes, inserts)`` of each side, in input order).

    Raises:
        ConfigError: if a key column is not a column of the table.
    """
    batches = list(net_batches(table, key_columns, max(table.num_rows, 1)))
    return pa.Table.from_batches(batches) if batches else table.slice(0, 0)


def net_batches(table: pa.Table, key_columns: tuple[str, ...], batch_size: int) -> Iterator[pa.RecordBatch]:
    """The rows :func:`net_changes` gives, in batches of ``batch_size`` rows, each taken from ``table`` when asked for.

    Only a batch's rows are copied at a time (not the whole result): a batch held by a consumer does
    not keep a pass's result alive. ``table`` is combined into one chunk per column first if it has
    more (a take across many chunks concatenates them on every call).

    Raises:
        ConfigError: if a key column is not a column of the table.
    """
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    order, pairs = _net_order(table, key_columns)
    if not len(order):
        return
    if any(column.num_chunks > 1 for column in table.columns):
        table = table.combine_chunks()
    at = table.column_names.index("_change_type")
    field = table.schema.field(at).with_type(pa.string())
    for start in range(0, len(order), batch_size):
        rows = order[start : start + batch_size]
        taken = table.take(pa.array(rows))
        kinds = pc.cast(taken.column(at), pa.string())
        if start < 2 * pairs:  # the first 2 * pairs rows of the order are update pairs, pre-image first
            images = np.arange(start, start + len(rows))
            imaged = pa.array(np.where(images % 2 == 0, "update_preimage", "update_postimage")[images < 2 * pairs])
            kinds = pa.chunked_array([imaged, *kinds.slice(len(imaged)).chunks], pa.string())
        batch = taken.set_column(at, field, kinds).combine_chunks().to_batches()
        yield batch[0] if len(batch) == 1 else pa.concat_batches(batch)


def _net_order(table: pa.Table, key_columns: tuple[str, ...]) -> tuple[npt.NDArray[np.int64], int]:
    """The rows :func:`net_changes` keeps, in its output order, and how many update pairs lead them.

    Raises:
        ConfigError: if a key column is not a column of the table.
    """
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    _check_keys(table, key_columns)
    if table.num_rows == 0:
        return np.empty(0, dtype=np.int64), 0
    kinds = table.column("_change_type")
    is_del = flags(pc.fill_null(pc.equal(kinds, "delete"), False))
    is_ins = flags(pc.fill_null(pc.equal(kinds, "insert"), False))
    groups = _ints(group_ids(table, [c for c in table.column_names if c not in _CHANGE]))
    keep = ~_cancelled(groups, is_del, is_ins)
    del groups
    if not key_columns:
        return np.flatnonzero(keep).astype(np.int64), 0
    return _pair_updates(keep, is_del, is_ins, _ints(group_ids(table, key_columns)))


def _cancelled(
    groups: npt.NDArray[np.int64], is_del: npt.NDArray[np.bool_], is_ins: npt.NDArray[np.bool_]
) -> npt.NDArray[np.bool_]:
    """Rule 1: whether each row is a delete or insert that an identical row of the other kind cancels."""
    deletes = np.bincount(groups, weights=is_del).astype(np.int64)[groups]
    inserts = np.bincount(groups, weights=is_ins).astype(np.int64)[groups]
    rank = _occurrence(groups * 2 + is_ins)
    cancelled: npt.NDArray[np.bool_] = (is_del & (rank < inserts)) | (is_ins & (rank < deletes))
    return cancelled


def _pair_updates(
    keep: npt.NDArray[np.bool_],
    is_del: npt.NDArray[np.bool_],
    is_ins: npt.NDArray[np.bool_],
    keys: npt.NDArray[np.int64],
) -> tuple[npt.NDArray[np.int64], int]:
    """Rule 2 on the rows ``keep`` marks: the output order of the module docstring, and the number of pairs."""
    kept_del, kept_ins = keep & is_del, keep & is_ins
    once = (np.bincount(keys, weights=kept_del)[keys] == 1) & (np.bincount(keys, weights=kept_ins)[keys] == 1)
    index = np.arange(len(keys), dtype=np.int64)
    insert_of_key = np.zeros(int(keys.max()) + 1, dtype=np.int64)
    insert_of_key[keys[once & kept_ins]] = index[once & kept_ins]
    deletes = index[once & kept_del]  # in input order: the pairs' order
    order = np.empty(2 * len(deletes), dtype=np.int64)
    order[0::2], order[1::2] = deletes, insert_of_key[keys[deletes]]
    alone = keep & ~(once & (kept_del | kept_ins))
    return np.concatenate([order, index[alone & ~is_ins], index[alone & is_ins]]), len(deletes)
