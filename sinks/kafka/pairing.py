"""Which messages a batch of change rows becomes in the ``debezium`` and ``flat`` formats: updates paired or not.

With key columns (``key=``) and without ``transactions=true``, the ``update_preimage`` and
``update_postimage`` of one key are one ``u`` event (Debezium's update: ``before`` and ``after``);
otherwise a pre-image is a ``d`` of the old row and a post-image a ``c`` of the new one (with
``transactions=true`` every event is one change row, as its ``transaction`` block counts rows,
:mod:`sinks.kafka.transactions`).

Pairing is exact at any commit size: the encoder pairs the images of a key within one batch, and
the sink asks the tailer (:attr:`tailer.sink.Sink.update_pair_key`, :func:`pair_key`) to deliver a
commit with cdc files with both images of every key side by side in one batch
(:mod:`tailer.read.update_pairs`: key-hash passes, memory bounded by a pass, not the commit). The
alternative, carrying unpaired images from batch to batch, was refused: delta-rs writes an
UPDATE's pre-images first and its post-images after them, so the carry-over would grow to half the
commit, and a cursor or a Kafka partition's last message saved while an image waited would mark as
delivered a row that was not sent.

The rule within a batch, in row order: an image of a key pairs with the waiting image of the other
kind of that key; an image of a kind already waiting for the key replaces it, which stays unpaired.
A pair's message carries the position of its later image (``source.index``), so a partition's last
message never stands between the two images.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from deltatail.sinks.json_text import DELETE, INSERT, POSTIMAGE, PREIMAGE, UPDATE
from deltatail.sinks.json_text import text_scalar as _scalar
from deltatail.state.feed import ChangeBatch
from deltatail.tailer.read.update_pairs import match_images, pair_cuts

#: Rows of a batch encoded and sent at once by the Kafka sink, fewer than the text sinks'
#: :data:`~sinks.json_text.ENCODE_ROWS`: a slice's messages are Python objects (keys, values,
#: headers, the producer's records) until the producer has taken them, and the producer, not the
#: encoding, sets the rate: a smaller slice holds less at no cost in time
#: (``docs/experiments.md``).
ENCODE_ROWS = 2048

#: The formats whose events pair update images.
PAIRING_FORMATS = ("debezium", "flat")


def pair_key(format: str, key_columns: Sequence[str], *, transactions: bool) -> tuple[str, ...]:
    """The key columns by which ``format`` pairs update images; ``()`` when it does not (see the module docstring)."""
    if format not in PAIRING_FORMATS or transactions:
        return ()
    return tuple(key_columns)


@dataclass(slots=True)
class Events:
    """The messages of one batch before assembly: which row each carries, and its images."""

    rows: list[int]
    change_types: list[str]
    op: pa.Array | str  # per message, or one for all
    old: pa.Array | bool  # per message: the event is a delete (its image is the before image)
    before: pa.Array | None  # row index of the before image per message (None: no pairing, see ``old``)
    after: pa.Array | None


def events(batch: ChangeBatch, change_types: list[str], keys: pa.Array | None) -> Events:
    """The events of ``batch``: pre- and post-images of one key paired when ``keys`` (their key texts) are given."""
    kinds = set(change_types)
    created = "r" if batch.start.snapshot else "c"
    n = len(batch)
    if keys is None or not kinds & {PREIMAGE, POSTIMAGE}:
        if kinds <= {INSERT, POSTIMAGE}:
            return Events(list(range(n)), change_types, created, False, None, None)
        if kinds <= {DELETE, PREIMAGE}:
            return Events(list(range(n)), change_types, "d", True, None, None)
        old = pc.is_in(batch.rows.column("_change_type"), value_set=pa.array([DELETE, PREIMAGE]))
        op = pc.if_else(old, _scalar("d"), _scalar(created))
        return Events(list(range(n)), change_types, op, old, None, None)
    return _matched(batch, change_types, keys, created) or _paired(change_types, keys.to_pylist(), created)


def _matched(batch: ChangeBatch, change_types: list[str], keys: pa.Array, created: str) -> Events | None:
    """:func:`_paired`'s events built column-wise, when no key has two images of one kind; else ``None``.

    With at most one pre- and one post-image per key the rule pairs exactly the images of equal keys
    (equal key texts), whatever their order, so the pairs are found by sorting the keys' codes.
    """
    codes = np.asarray(pc.dictionary_encode(keys).indices.to_numpy(zero_copy_only=False), dtype=np.int64)
    kinds = batch.rows.column("_change_type")
    matched = match_images(codes, kinds)
    if matched is None:
        return None
    pre_rows, post_rows = matched
    n = len(batch)
    partner = np.full(n, -1, dtype=np.int64)
    partner[pre_rows], partner[post_rows] = post_rows, pre_rows
    rows = np.flatnonzero(partner < np.arange(n, dtype=np.int64))  # every row but the earlier image of a pair
    is_pair = partner[rows] >= 0
    old_rows = np.asarray(
        pc.is_in(kinds, value_set=pa.array([DELETE, PREIMAGE])).to_numpy(zero_copy_only=False), dtype=np.bool_
    )[rows]
    op_codes = np.where(is_pair, 0, np.where(old_rows, 1, 2))
    op = pa.array(["u", "d", created], pa.string()).take(pa.array(op_codes, pa.int64()))
    old = pa.array(~is_pair & old_rows, pa.bool_())
    pre_mask = np.zeros(n, dtype=np.bool_)
    pre_mask[pre_rows] = True
    is_pre = pre_mask[rows]
    before = np.where(is_pair, np.where(is_pre, rows, partner[rows]), rows)
    after = np.where(is_pair, np.where(is_pre, partner[rows], rows), rows)
    before_array = pa.array(before, pa.int64(), mask=~is_pair & ~old_rows)
    after_array = pa.array(after, pa.int64(), mask=~is_pair & old_rows)
    texts = np.where(is_pair, UPDATE, np.asarray(change_types, dtype=object)[rows]).tolist()
    return Events(rows.tolist(), texts, op, old, before_array, after_array)


def _partners(change_types: list[str], keys: list[str]) -> dict[int, int]:
    """Each paired image's row and its partner's (both ways), by the rule of the module docstring."""
    partner: dict[int, int] = {}
    waiting: dict[tuple[str, str], int] = {}
    for i, ct in enumerate(change_types):
        if ct in (PREIMAGE, POSTIMAGE):
            other = POSTIMAGE if ct == PREIMAGE else PREIMAGE
            j = waiting.pop((other, keys[i]), None)
            if j is None:
                waiting[(ct, keys[i])] = i
            else:
                partner[i], partner[j] = j, i
    return partner


def _paired(change_types: list[str], keys: list[str], created: str) -> Events:
    """Events with the pre- and post-image of one key (both in this batch) paired into one ``u``."""
    partner = _partners(change_types, keys)
    rows: list[int] = []
    cts: list[str] = []
    ops: list[str] = []
    before: list[int | None] = []
    after: list[int | None] = []
    for i, ct in enumerate(change_types):
        j = partner.get(i)
        if j is not None:
            if j > i:
                continue  # the earlier image travels with the later one
            pre, post = (j, i) if ct == POSTIMAGE else (i, j)
            rows.append(i)
            cts.append(UPDATE)
            ops.append("u")
            before.append(pre)
            after.append(post)
        elif ct in (DELETE, PREIMAGE):
            rows.append(i)
            cts.append(ct)
            ops.append("d")
            before.append(i)
            after.append(None)
        else:
            rows.append(i)
            cts.append(ct)
            ops.append(created)
            before.append(None)
            after.append(i)
    old = pa.array([op == "d" for op in ops], pa.bool_())
    return Events(rows, cts, pa.array(ops, pa.string()), old, pa.array(before, pa.int64()), pa.array(after, pa.int64()))


def encoding_slices(batch: ChangeBatch, pair_key: Sequence[str]) -> Iterator[ChangeBatch]:
    """``batch`` in slices of about :data:`ENCODE_ROWS` rows, to be encoded and sent one after the other.

    A slice never separates two update images that the rule pairs within ``batch``
    (:func:`~tailer.read.update_pairs.pair_cuts` by ``pair_key``; where it cannot tell, the batch is
    one slice), so the slices' events are the batch's. Without a pair key any row may end a slice.
    """
    count, size = len(batch), ENCODE_ROWS
    if count <= size or not pair_key:
        yield from batch.slices(size)
        return
    cuts = pair_cuts(pa.Table.from_batches([batch.rows]), tuple(pair_key), size)
    for start, end in itertools.pairwise([0, *cuts, count]):
        yield ChangeBatch(batch.position(start), batch.rows.slice(start, end - start))
