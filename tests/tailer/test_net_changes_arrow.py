"""Net changes computed in Arrow give exactly the rows the former Python implementation gave.

The reference below is the implementation ``tailer/read/net_changes.py`` had before it moved to Arrow
(every row a JSON byte key, Counters and lists of Python ints), kept here verbatim in substance: the
new code must match it row for row, in order, on tables with duplicates, nulls, NaN, infinities,
``-0.0``, strings, several key columns and a nested column.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import Any

import orjson
import pyarrow as pa
from hypothesis import given, settings
from hypothesis import strategies as st

from deltatail.tailer.read.net_changes import group_ids, in_pass, key_hash, net_batches, net_changes

_CHANGE = ("_change_type", "_commit_version", "_commit_timestamp")


def reference_keys(table: pa.Table, columns: list[str]) -> list[bytes]:
    values = [table.column(c).to_pylist() for c in columns]
    return [
        orjson.dumps(row, default=repr, option=orjson.OPT_PASSTHROUGH_DATETIME) for row in zip(*values, strict=True)
    ]


def reference_net_changes(table: pa.Table, key_columns: tuple[str, ...] = ()) -> pa.Table:
    data_columns = [c for c in table.column_names if c not in _CHANGE]
    kinds = table.column("_change_type").to_pylist()
    full = reference_keys(table, data_columns)
    deletes = Counter(full[i] for i, k in enumerate(kinds) if k == "delete")
    inserts = Counter(full[i] for i, k in enumerate(kinds) if k == "insert")
    cancel = deletes & inserts
    keep: list[int] = []
    budget_d, budget_i = Counter(cancel), Counter(cancel)
    for i, kind in enumerate(kinds):
        budget = budget_d if kind == "delete" else budget_i if kind == "insert" else None
        if budget is not None and budget[full[i]] > 0:
            budget[full[i]] -= 1
            continue
        keep.append(i)
    if not key_columns:
        return table.take(pa.array(keep, pa.int64()))
    keys = reference_keys(table, list(key_columns))
    by_key: dict[bytes, dict[str, list[int]]] = defaultdict(lambda: {"delete": [], "insert": []})
    for i in keep:
        if kinds[i] in ("delete", "insert"):
            by_key[keys[i]][kinds[i]].append(i)
    pairs = sorted(
        (g["delete"][0], g["insert"][0]) for g in by_key.values() if len(g["delete"]) == 1 and len(g["insert"]) == 1
    )
    paired = {i for pair in pairs for i in pair}
    order = [i for pair in pairs for i in pair]
    order += [i for i in keep if i not in paired and kinds[i] != "insert"]
    order += [i for i in keep if i not in paired and kinds[i] == "insert"]
    result = table.take(pa.array(order, pa.int64()))
    types = ["update_preimage", "update_postimage"] * len(pairs) + [kinds[i] for i in order[2 * len(pairs) :]]
    index = result.column_names.index("_change_type")
    return result.set_column(index, "_change_type", pa.array(types, pa.string()))


FLOATS = [math.nan, math.inf, -math.inf, -0.0, 0.0, 1.5, None]
NESTED = pa.struct([("x", pa.float64()), ("tags", pa.list_(pa.string()))])
SCHEMA = pa.schema(
    [
        ("id", pa.int64()),
        ("name", pa.string()),
        ("f", pa.float64()),
        ("g", pa.float32()),
        ("raw", pa.binary()),
        ("nested", NESTED),
        ("_change_type", pa.string()),
        ("_commit_version", pa.int64()),
    ]
)
KEYS = [(), ("id",), ("id", "name"), ("f",), ("nested",), ("name", "raw", "g")]

rows = st.fixed_dictionaries(
    {
        "id": st.one_of(st.none(), st.integers(0, 4)),
        "name": st.sampled_from([None, "a", "b", "é"]),
        "f": st.sampled_from(FLOATS),
        "g": st.sampled_from(FLOATS),
        "raw": st.sampled_from([None, b"", b"\x00", b"a"]),
        "nested": st.one_of(
            st.none(),
            st.fixed_dictionaries(
                {
                    "x": st.sampled_from(FLOATS),
                    "tags": st.one_of(st.none(), st.lists(st.sampled_from(["p", "q"]), max_size=2)),
                }
            ),
        ),
        "_change_type": st.sampled_from(["delete", "insert"]),
        "_commit_version": st.just(7),
    }
)


def as_table(listed: list[dict[str, Any]], chunks: int) -> pa.Table:
    """``listed`` as a table of up to ``chunks`` record batches (a pass is many batches)."""
    size = max(1, -(-len(listed) // max(chunks, 1)))
    parts = [listed[i : i + size] for i in range(0, len(listed), size)] or [[]]
    return pa.Table.from_batches([pa.RecordBatch.from_pylist(p, schema=SCHEMA) for p in parts], schema=SCHEMA)


def same(a: pa.Table, b: pa.Table) -> bool:
    """Row-for-row equality in order, NaN equal to NaN (as the JSON of both sides shows them)."""
    return a.schema == b.schema and reference_keys(a, a.column_names) == reference_keys(b, b.column_names)


@settings(max_examples=50, deadline=None)
@given(listed=st.lists(rows, max_size=40), chunks=st.integers(1, 3), key=st.sampled_from(KEYS))
def test_net_changes_equal_the_python_reference(
    listed: list[dict[str, Any]], chunks: int, key: tuple[str, ...]
) -> None:
    table = as_table(listed, chunks)
    assert same(net_changes(table, key), reference_net_changes(table, key))


@settings(max_examples=50, deadline=None)
@given(listed=st.lists(rows, max_size=40), chunks=st.integers(1, 3), key=st.sampled_from(KEYS), size=st.integers(1, 7))
def test_net_changes_taken_batch_by_batch_equal_the_python_reference(
    listed: list[dict[str, Any]], chunks: int, key: tuple[str, ...], size: int
) -> None:
    """Batches of ``size`` rows, cut anywhere (inside the leading update pairs too), give the reference's rows."""
    table = as_table(listed, chunks)
    batches = list(net_batches(table, key, size))
    assert all(0 < b.num_rows <= size for b in batches)
    assert all(b.num_rows == size for b in batches[:-1])
    expected = reference_net_changes(table, key)
    assert same(pa.Table.from_batches(batches, schema=table.schema) if batches else table.slice(0, 0), expected)


@settings(max_examples=25, deadline=None)
@given(listed=st.lists(rows, min_size=1, max_size=30), key=st.sampled_from(KEYS))
def test_group_ids_equal_exactly_when_json_keys_are_equal(listed: list[dict[str, Any]], key: tuple[str, ...]) -> None:
    table = as_table(listed, 2)
    columns = list(key) or [c for c in table.column_names if c not in _CHANGE]
    ids = group_ids(table, columns).to_pylist()
    keys = reference_keys(table, columns)
    assert all((ids[i] == ids[j]) == (keys[i] == keys[j]) for i in range(len(ids)) for j in range(len(ids)))


@settings(max_examples=25, deadline=None)
@given(listed=st.lists(rows, min_size=1, max_size=30), key=st.sampled_from(KEYS), passes=st.integers(2, 5))
def test_passes_split_a_batch_by_a_hash_of_the_values_alone(
    listed: list[dict[str, Any]], key: tuple[str, ...], passes: int
) -> None:
    table = as_table(listed, 1)
    batch = table.to_batches()[0]
    columns = list(key) or [c for c in table.column_names if c not in _CHANGE]
    hashes = key_hash(table, columns).to_pylist()
    keys = reference_keys(table, columns)
    # equal keys hash alike, and a row hashes as it does alone (the hash is a function of its values)
    assert all(hashes[i] == hashes[j] for i in range(len(keys)) for j in range(len(keys)) if keys[i] == keys[j])
    assert hashes == [key_hash(table.slice(i, 1), columns).to_pylist()[0] for i in range(table.num_rows)]
    parts = [in_pass(batch, key, passes, which) for which in range(passes)]
    assert sorted(r for p in parts for r in reference_keys(pa.Table.from_batches([p]), table.column_names)) == sorted(
        reference_keys(table, table.column_names)
    )


def test_a_float_key_keeps_minus_zero_apart_and_nan_with_null() -> None:
    table = pa.table(
        {
            "f": pa.array([-0.0, 0.0, math.nan, None, math.inf], pa.float64()),
            "_change_type": ["delete", "insert", "delete", "insert", "insert"],
        }
    )
    out = net_changes(table, ("f",))
    # NaN, null and inf are one value (JSON writes all null): the NaN delete cancels the null insert;
    # -0.0 and 0.0 are two keys, so they stay a delete and an insert, not an update pair
    assert out.column("_change_type").to_pylist() == ["delete", "insert", "insert"]
    assert [str(v) for v in out.column("f").to_pylist()] == ["-0.0", "0.0", "inf"]


def test_change_types_read_as_a_dictionary_come_out_as_strings() -> None:
    """A ``_change_type`` read dictionary-encoded (as a cdc file's is) nets like strings, with or without a key."""
    table = pa.table(
        {
            "id": [1, 1, 2, 3],
            "v": [1, 2, 3, 3],
            "_change_type": pa.array(["delete", "insert", "insert", "delete"]).dictionary_encode(),
        }
    )
    keyed = net_changes(table, ("id",))
    assert keyed.schema.field("_change_type").type == pa.string()
    assert keyed.column("_change_type").to_pylist() == ["update_preimage", "update_postimage", "delete", "insert"]
    plain = net_changes(table, ())
    assert plain.schema.field("_change_type").type == pa.string()
    assert plain.column("_change_type").to_pylist() == ["delete", "insert", "insert", "delete"]
