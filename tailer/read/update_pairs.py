"""Update pairs kept whole: a commit's update images delivered so both images of a key are side by side.

A sink that makes one event of an update's two images (Debezium's ``u``, asked for by
:attr:`tailer.sink.Sink.update_pair_key`) needs the ``update_preimage`` and the
``update_postimage`` of a key in one batch. Writers do not put them together: delta-rs writes
every pre-image of an UPDATE and then every post-image, so in a commit of N updated rows the two
images of a row are N rows apart, and a sink carrying unpaired images over from batch to batch
would hold half the commit, and a cursor saved between two images would point at a row whose
partner was never sent. Instead a commit with cdc files is read for such a sink as
``--net-changes`` reads a rewrite (:mod:`tailer.read.net_changes`): in key-hash partitioned
passes (one per :data:`~tailer.read.net_changes.NET_PASS_BYTES` of cdc files), each pass holding
the rows whose key hashes to it (the files read once, the rows spilled by pass to disk,
:mod:`tailer.read.spill`), so both images of a key are always in one pass; a pass's rows
are reordered by :func:`paired_order` (a pair's pre-image, then its post-image, where the earlier
of them was) and cut into batches by :func:`pair_batches`, which never
ends a batch between the two images of a pair. Memory is one pass, bounded by the pass's share
of the commit's files, whatever the commit's size.

Positions count the reordered rows. They are the same on every read of the commit (the number of
passes depends only on the files' sizes, the order only on the rows), so a cursor or a sink's
holdings inside the commit resume at the same row; and as no batch ends inside a pair, the cursor
never stands between two images.

The pairing rule is the encoder's (:mod:`sinks.kafka.pairing`): in row order, an image of a key
pairs with the waiting image of the other kind of the same key; an image of a kind already
waiting for that key replaces it, which then stays unpaired.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt
import pyarrow as pa

from deltatail.state.errors import ConfigError
from deltatail.tailer.read.net_changes import flags, group_ids, row_keys, value_bits

PREIMAGE = "update_preimage"
POSTIMAGE = "update_postimage"


def paired_order(change_types: list[str], keys: list[bytes]) -> tuple[list[int], set[int]]:
    """The row order that puts both images of each pair where its earlier image was, pre-image first.

    Rows keep their order otherwise. Returns the order (row numbers) and the positions in that
    order of every pair's pre-image.
    """
    partner: dict[int, int] = {}
    waiting: dict[tuple[str, bytes], int] = {}
    for i, kind in enumerate(change_types):
        if kind not in (PREIMAGE, POSTIMAGE):
            continue
        other = POSTIMAGE if kind == PREIMAGE else PREIMAGE
        j = waiting.pop((other, keys[i]), None)
        if j is None:
            waiting[(kind, keys[i])] = i
        else:
            partner[j] = i
    later = set(partner.values())
    order: list[int] = []
    firsts: set[int] = set()
    for i in range(len(change_types)):
        if i in later:
            continue
        j = partner.get(i)
        if j is None:
            order.append(i)
            continue
        firsts.add(len(order))
        order += [i, j] if change_types[i] == PREIMAGE else [j, i]
    return order, firsts


def check_key(schema: pa.Schema, key_columns: tuple[str, ...], *, where: str, version: int) -> None:
    """Check that rows of ``schema`` have every key column.

    Raises:
        ConfigError: naming the missing columns, the table and the version.
    """
    missing = [k for k in key_columns if k not in schema.names]
    if missing:
        raise ConfigError(
            f"the sink pairs update images by the key columns {', '.join(key_columns)}, "
            f"and the rows of this version have no column {', '.join(missing)}",
            table=where,
            version=version,
        )


def pair_batches(rows: pa.Table, key_columns: tuple[str, ...], batch_size: int) -> Iterator[pa.RecordBatch]:
    """``rows`` (one pass of a commit) in :func:`paired_order`, in batches of about ``batch_size`` rows.

    Rows that fit in one batch keep their order (nothing to split). A batch ends after
    ``batch_size`` rows, or one row later when that would separate a pair. Each batch is taken from
    ``rows`` when it is asked for: memory is ``rows`` and one batch, not a reordered copy of the pass.
    """
    if rows.num_rows <= batch_size:
        yield from rows.combine_chunks().to_batches()
        return
    order, firsts = _joined_order(rows, key_columns) if _joinable(rows, key_columns) else (None, None)
    if order is None or firsts is None:
        listed, at = paired_order(rows.column("_change_type").to_pylist(), row_keys(rows, list(key_columns)))
        order = np.asarray(listed, dtype=np.int64)
        firsts = np.zeros(len(listed), dtype=np.bool_)
        firsts[list(at)] = True
    start = 0
    while start < len(order):
        end = min(start + max(batch_size, 1), len(order))
        if firsts[end - 1]:
            end += 1
        yield from rows.take(pa.array(order[start:end])).combine_chunks().to_batches()
        start = end


_JOINABLE = (
    pa.types.is_integer,
    pa.types.is_string,
    pa.types.is_large_string,
    pa.types.is_binary,
    pa.types.is_date,
    pa.types.is_timestamp,
)


def _joinable(rows: pa.Table, key_columns: tuple[str, ...]) -> bool:
    """Whether the keys can be matched by their codes: plain types (equal exactly when their JSON is), no nulls."""
    fields = [rows.schema.field(k) for k in key_columns]
    return all(any(t(f.type) for t in _JOINABLE) and rows.column(f.name).null_count == 0 for f in fields)


def _joined_order(
    rows: pa.Table, key_columns: tuple[str, ...]
) -> tuple[npt.NDArray[np.int64] | None, npt.NDArray[np.bool_] | None]:
    """:func:`paired_order` by matching key codes, when no key has two images of one kind; else ``(None, None)``.

    With at most one pre- and one post-image per key, the rule of the module docstring pairs exactly
    the images of equal keys (equal :func:`_key_codes`): each post-image's key is looked up among the
    pre-images' sorted keys. Each row gets a slot: ``2 * row`` for a row outside a pair, ``2 * earlier``
    and ``2 * earlier + 1`` for a pair's pre- and post-image (``earlier`` being the place of the first
    of the two, whose own slot it takes); the slots are distinct, so the order is the rows by slot.
    Returns the order (row numbers) and, per position in it, whether a pair starts there.
    """
    pairs = _matched_pairs(rows, key_columns)
    if pairs is None:
        return None, None  # a key with two images of one kind: the rule decides
    pre, post = pairs
    count = rows.num_rows
    # 32-bit slots and rows where they fit: these arrays, not the pass's rows, are its largest transient
    index = np.int32 if 2 * count <= np.iinfo(np.int32).max else np.int64
    slot = np.arange(0, 2 * count, 2, dtype=index)
    earlier = np.minimum(pre, post).astype(index)
    slot[pre], slot[post] = 2 * earlier, 2 * earlier + 1
    del earlier
    by_slot = np.full(2 * count, -1, dtype=index)
    by_slot[slot] = np.arange(count, dtype=index)
    del slot
    order = by_slot[by_slot >= 0].astype(np.int64, copy=False)
    del by_slot
    starts = np.zeros(count, dtype=np.bool_)
    starts[pre] = True
    return order, starts[order]


def _matched_pairs(
    rows: pa.Table, key_columns: tuple[str, ...]
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """The rows of each pair's pre- and post-image, keys matched by :func:`_key_codes` (:func:`match_images`)."""
    return match_images(_key_codes(rows, key_columns), rows.column("_change_type"))


def match_images(
    codes: npt.NDArray[np.int64], kinds: pa.Array | pa.ChunkedArray
) -> tuple[npt.NDArray[np.int64], npt.NDArray[np.int64]] | None:
    """The rows of each pair's pre- and post-image: the images whose key ``codes`` are equal.

    ``codes`` holds a number per row, equal exactly for equal keys; ``kinds`` the rows' change types.
    ``None`` if a key has two images of one kind (then only the rule in row order decides).
    """
    import pyarrow.compute as pc  # not at the top: ~0.1 s of start-up (tests/test_front_door.py)

    # 32-bit row numbers where they fit, and each array dropped once used: for a pass, these
    # arrays, not its rows, are the largest transient
    index = np.int32 if len(codes) <= np.iinfo(np.int32).max else np.int64
    pre = np.flatnonzero(flags(pc.fill_null(pc.equal(kinds, PREIMAGE), False))).astype(index)
    post = np.flatnonzero(flags(pc.fill_null(pc.equal(kinds, POSTIMAGE), False))).astype(index)
    pre_keys = codes[pre]
    by_key = np.argsort(pre_keys, kind="stable").astype(index)
    pre_keys = pre_keys[by_key]
    if _repeats(pre_keys):
        return None
    post_keys = codes[post]
    found: npt.NDArray[np.bool_] = np.zeros(len(post), dtype=np.bool_)
    partner: npt.NDArray[np.int64] = np.empty(0, dtype=np.int64)
    if len(pre_keys):
        at = np.searchsorted(pre_keys, post_keys)
        np.minimum(at, len(pre_keys) - 1, out=at)
        found = pre_keys[at] == post_keys
        partner = pre[by_key[at[found]]].astype(np.int64)
    del pre_keys, by_key
    post_keys.sort()
    if _repeats(post_keys):
        return None
    return partner, post[found].astype(np.int64)


def pair_cuts(rows: pa.Table, key_columns: tuple[str, ...], size: int) -> list[int]:
    """Where ``rows`` may be cut into slices of ``size`` rows or more, never between two images paired in it.

    Returns the first row of each slice after the first (``rows`` is a batch as delivered). The rule
    pairs the same images within each slice as within ``rows`` when no pair spans a cut and no key has
    two images of one kind. Returns ``[]`` (do not cut) for ``rows`` of at most ``size`` rows, keys not
    matched by code (nulls, other types) or a key with two images of one kind.
    """
    count = rows.num_rows
    if count <= size or size < 1 or not _joinable(rows, key_columns):
        return []
    pairs = _matched_pairs(rows, key_columns)
    if pairs is None:
        return []
    lo, hi = np.minimum(*pairs), np.maximum(*pairs)
    # spanning[c]: the pairs with an image before row c and one at or after it
    spanning = np.cumsum(np.bincount(lo + 1, minlength=count + 1) - np.bincount(hi + 1, minlength=count + 1))
    safe = np.flatnonzero(spanning[:count] == 0)
    cuts: list[int] = []
    start = 0
    while (i := int(np.searchsorted(safe, start + size))) < len(safe):
        start = int(safe[i])
        cuts.append(start)
    return cuts


def _repeats(ordered: npt.NDArray[np.int64]) -> bool:
    """Whether a value occurs twice in ``ordered`` (sorted)."""
    return bool(np.any(ordered[1:] == ordered[:-1]))


def _key_codes(rows: pa.Table, key_columns: tuple[str, ...]) -> npt.NDArray[np.int64]:
    """A number per row, equal for two rows exactly when their keys are (the keys have no nulls).

    One integer, date or timestamp column is its own number (its 64 bits,
    :func:`~tailer.read.net_changes.value_bits`); other keys are
    :func:`~tailer.read.net_changes.group_ids` codes, which hash them.
    """
    kind = rows.schema.field(key_columns[0]).type
    if len(key_columns) == 1 and (pa.types.is_integer(kind) or pa.types.is_temporal(kind)):
        bits = value_bits(rows.column(key_columns[0])).combine_chunks().to_numpy()
        return np.asarray(bits, dtype=np.uint64).view(np.int64)
    return np.asarray(group_ids(rows, key_columns).to_numpy(), dtype=np.int64)
