"""A batch of change rows: its positions and its slices (``state/feed.py``)."""

from __future__ import annotations

import pyarrow as pa

from deltatail.state.cursor import Position
from deltatail.state.feed import ChangeBatch


def _batch(version: int, start: int, ids: list[int]) -> ChangeBatch:
    return ChangeBatch(Position.change(version, start), pa.record_batch({"id": pa.array(ids, pa.int64())}))


def test_a_batch_in_slices_covers_its_rows_once_at_their_positions() -> None:
    batch = _batch(5, 100, list(range(10)))
    parts = list(batch.slices(4))
    assert [len(p) for p in parts] == [4, 4, 2]
    assert [p.start for p in parts] == [Position.change(5, 100), Position.change(5, 104), Position.change(5, 108)]
    assert [v for p in parts for v in p.rows.column("id").to_pylist()] == list(range(10))
    assert parts[-1].end == batch.end


def test_a_batch_no_longer_than_a_slice_is_its_own_slice() -> None:
    batch = _batch(5, 0, [1, 2, 3])
    assert list(batch.slices(3)) == [batch]
    assert list(batch.slices(8)) == [batch]
