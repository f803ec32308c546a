"""A commit's rows are held slim in its key-hash passes and made whole as delivered (tailer/read/pass_rows.py).

Slim rows leave out ``_commit_version`` and ``_commit_timestamp`` and hold ``_change_type``
dictionary-encoded; restored, a batch has exactly the values and the schema it was read with,
whatever happened to the slim rows in between (taken, combined, spilled to IPC and read back,
``_change_type`` cast to strings by net changes). The commits read in passes end to end
(update pairs, net changes) are checked against ``load_cdf`` and the snapshots in
``test_update_pairs.py``, ``test_net_changes_arrow.py`` and ``test_giant_commit.py``.
"""

from __future__ import annotations

import datetime as dt

import pyarrow as pa
import pyarrow.compute as pc
import pytest

from deltatail.state.feed import COMMIT_TIMESTAMP_TYPE
from deltatail.tailer.read.pass_rows import CODED, SlimRows

SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("_change_type", pa.string()),
        ("_commit_version", pa.int64()),
        ("_commit_timestamp", COMMIT_TIMESTAMP_TYPE),
    ]
)
VERSION, MILLIS = 41, 1_764_000_000_123
KINDS = ["update_preimage", "update_postimage", "insert", "delete", None]


def read_batch(rows: int, kinds: list[str | None]) -> pa.RecordBatch:
    """Rows as the reader gives them: the commit's version and timestamp in every row."""
    when = dt.datetime.fromtimestamp(MILLIS / 1000, dt.UTC)
    return pa.record_batch(
        [
            pa.array(range(rows), pa.int64()),
            pa.array([None if i % 7 == 3 else f"row-{i}" for i in range(rows)]),
            pa.array([kinds[i % len(kinds)] for i in range(rows)], pa.string()),
            pa.array([VERSION] * rows, pa.int64()),
            pa.array([when] * rows, COMMIT_TIMESTAMP_TYPE),
        ],
        schema=SCHEMA,
    )


SLIM = SlimRows(SCHEMA, VERSION, MILLIS)


def test_slim_rows_leave_out_the_commit_columns_and_code_the_change_type() -> None:
    batch = read_batch(10_000, KINDS)
    slim = SLIM.slim(batch)
    assert slim.schema.names == ["id", "name", "_change_type"]
    assert slim.schema.field("_change_type").type == CODED == SLIM.slim_schema.field("_change_type").type
    assert slim.column("_change_type").dictionary.to_pylist() == KINDS[:4]
    # the commit columns' 16 bytes a row gone, the change types' text and offsets held as 4-byte codes
    text = batch.column(2).nbytes
    assert text > 10_000 * 12
    assert batch.nbytes - slim.nbytes >= 10_000 * 16 + text - 10_000 * 4 - 2_000  # less the codes' bitmap, dictionary


@pytest.mark.parametrize("kinds", [KINDS, ["insert"], ["update_postimage", None]], ids=["mixed", "one", "nulls"])
def test_a_restored_batch_is_the_batch_as_read(kinds: list[str | None]) -> None:
    batch = read_batch(5_000, kinds)
    restored = SLIM.restore(SLIM.slim(batch))
    assert restored.schema == SCHEMA
    assert restored.equals(batch)


def test_rows_taken_combined_and_spilled_through_ipc_restore_to_the_rows_taken_from_the_batches() -> None:
    """Slim batches of different dictionaries, written to an IPC stream and read back, combined and
    taken from in a new order (what a pass does), restore to the same rows taken from the originals."""
    first, second = read_batch(300, ["insert", "delete"]), read_batch(300, ["update_postimage", None, "insert"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, SLIM.slim_schema, options=pa.ipc.IpcWriteOptions(compression="lz4")) as writer:
        writer.write_batch(pa.concat_batches([SLIM.slim(first), SLIM.slim(second)]))
    held = pa.ipc.open_stream(sink.getvalue()).read_all().combine_chunks()
    order = pa.array([599, 0, 300, 17, 450, 299], pa.int64())
    (taken,) = held.take(order).to_batches()
    expected = pa.Table.from_batches([first, second]).take(order)
    assert pa.Table.from_batches([SLIM.restore(taken)]).equals(expected)


def test_a_batch_whose_change_types_are_already_strings_is_restored() -> None:
    """Net changes cast ``_change_type`` to strings as they label update pairs: restored as they are."""
    batch = read_batch(100, ["delete", "insert"])
    slim = SLIM.slim(batch)
    as_strings = slim.set_column(2, slim.schema.field(2).with_type(pa.string()), pc.cast(slim.column(2), pa.string()))
    assert SLIM.restore(as_strings).equals(batch)
