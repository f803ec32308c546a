"""Filters: the predicate language, column and change-type selection, and positions kept exact."""

from __future__ import annotations

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from deltatail.state.actions import parse_json_actions
from deltatail.state.commit import Commit
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError
from deltatail.state.feed import ChangeBatch
from deltatail.state.filters import ChangeFilter

TS = pa.timestamp("us", tz="UTC")
ROWS = pa.record_batch(
    {
        "id": pa.array([1, 2, 3, 4, 5, 6], pa.int64()),
        "region": pa.array(["emea", "amer", "emea", None, "emea", "apac"]),
        "amount": pa.array([Decimal("1.00"), Decimal("20.50"), Decimal("30.00"), None, Decimal("50.25"), Decimal("7")],
                           pa.decimal128(10, 2)),
        "day": pa.array([dt.date(2024, 1, d) for d in range(1, 7)]),
        "at": pa.array([dt.datetime(2024, 1, d, 12, tzinfo=dt.UTC) for d in range(1, 7)], TS),
        "name": pa.array(["anna", "bob", "annie", "carl", "ann", None]),
        "_change_type": ["insert", "delete", "insert", "update_preimage", "update_postimage", "insert"],
        "_commit_version": pa.array([7] * 6, pa.int64()),
        "_commit_timestamp": pa.array([0] * 6, TS),
    }
)  # fmt: skip
START = Position.change(7, 100)


def kept(f: ChangeFilter) -> list[tuple[int, list[int]]]:
    """(first position index, ids) of each batch the filter hands on."""
    out = f.compile(ROWS.schema.names).apply(ChangeBatch(START, ROWS))
    return [(b.start.index, b.rows.column("id").to_pylist()) for b in out]


@pytest.mark.parametrize(
    ("where", "ids"),
    [
        ("region = 'emea'", [1, 3, 5]),
        ("region <> 'emea'", [2, 6]),  # a null region is neither equal nor unequal: dropped
        ("amount > 10", [2, 3, 5]),
        ("amount >= 20.5 AND amount < 50", [2, 3]),
        ("amount BETWEEN 7 AND 30", [2, 3, 6]),
        ("day >= '2024-01-03' AND day <= DATE '2024-01-05'", [3, 4, 5]),
        ("at < TIMESTAMP '2024-01-02 13:00:00'", [1, 2]),
        ("id IN (2, 4, 6)", [2, 4, 6]),
        ("NOT id IN (2, 4, 6)", [1, 3, 5]),
        ("region IS NULL OR name IS NULL", [4, 6]),
        ("region IS NOT NULL AND name LIKE 'ann%'", [1, 3, 5]),
        ("(id = 1 OR id = 2) AND _change_type = 'delete'", [2]),
        ("_commit_version = 7 AND id > -1", [1, 2, 3, 4, 5, 6]),
        ("id = 99", []),
    ],
)
def test_predicates(where: str, ids: list[int]) -> None:
    got = [i for _, batch_ids in kept(ChangeFilter(where=where)) for i in batch_ids]
    assert got == ids


def test_kept_rows_keep_their_positions_in_runs_of_consecutive_rows() -> None:
    assert kept(ChangeFilter(where="region = 'emea'")) == [(100, [1]), (102, [3]), (104, [5])]
    assert kept(ChangeFilter(where="id < 4")) == [(100, [1, 2, 3])]
    assert kept(ChangeFilter(change_types=frozenset({"insert", "update_postimage"}))) == [
        (100, [1]),
        (102, [3]),
        (104, [5, 6]),
    ]
    assert kept(ChangeFilter(where="id > 0")) == [(100, [1, 2, 3, 4, 5, 6])]


def test_columns_keep_the_change_columns() -> None:
    [batch] = ChangeFilter(columns=("id", "name")).compile(ROWS.schema.names).apply(ChangeBatch(START, ROWS))
    assert batch.rows.schema.names == ["id", "name", "_change_type", "_commit_version", "_commit_timestamp"]
    assert batch.start == START and len(batch) == 6


def test_change_types_and_where_together() -> None:
    f = ChangeFilter(where="region = 'emea'", change_types=frozenset({"insert"}))
    assert kept(f) == [(100, [1]), (102, [3])]


@pytest.mark.parametrize(
    ("f", "message"),
    [
        (ChangeFilter(columns=("id", "nope")), "columns: nope not in the table"),
        (ChangeFilter(change_types=frozenset({"upsert"})), "change_types: upsert"),
        (ChangeFilter(where="nope = 1"), "unknown column 'nope'"),
        (ChangeFilter(where="region = "), "cannot parse"),
        (ChangeFilter(where="1 = 1"), "a comparison needs a column"),
        (ChangeFilter(where="s.x = 1"), "qualified names"),
        (ChangeFilter(where="upper(region) = 'EMEA'"), "is not a column or a literal"),
        (ChangeFilter(where="day = DATE 'not a date'"), "is not a valid date"),
    ],
)
def test_bad_filters_are_config_errors_naming_the_culprit(f: ChangeFilter, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        f.compile(ROWS.schema.names)


def test_a_literal_that_does_not_fit_the_column_type_is_a_config_error() -> None:
    f = ChangeFilter(where="day > 'soon'").compile(ROWS.schema.names)
    with pytest.raises(ConfigError, match="cannot compare"):
        f.apply(ChangeBatch(START, ROWS))


def test_skip_operations_by_commit_operation() -> None:
    f = ChangeFilter(skip_operations=frozenset({"OPTIMIZE"}))
    assert not f.skips(Commit.from_actions(3, [])) and not f.skips(None)
    commit = Commit.from_actions(3, parse_json_actions(b'{"commitInfo":{"operation":"OPTIMIZE"}}\n'))
    write = Commit.from_actions(3, parse_json_actions(b'{"commitInfo":{"operation":"WRITE"}}\n'))
    assert f.skips(commit) and not f.skips(write)


def test_an_empty_filter_is_empty() -> None:
    assert ChangeFilter().is_empty and not ChangeFilter(columns=("id",)).is_empty


# ---------------------------------------------------------------- dropping a whole file --

NAMES = ["id", "region", "amount", "day", "at", "name"]


def constants(**values: object) -> pa.RecordBatch:
    """One row of a file's shared values: its partition columns, and the commit's version."""
    columns = {"_commit_version": pa.array([7], pa.int64())}
    columns.update({k: pa.array([v], pa.string()) for k, v in values.items()})
    return pa.record_batch(columns)


def test_a_file_is_dropped_when_its_shared_values_fail_the_predicate() -> None:
    f = ChangeFilter(where="region = 'emea' AND _commit_version > 5").compile(NAMES)
    assert f.drops_every_row(constants(region="amer"), "insert")
    assert not f.drops_every_row(constants(region="emea"), "insert")
    assert f.drops_every_row(constants(region=None), None)  # null: the predicate drops every row, as SQL does
    assert ChangeFilter(where="_commit_version < 7").compile(NAMES).drops_every_row(constants(), None)


def test_a_file_is_kept_whenever_the_answer_depends_on_its_rows() -> None:
    f = ChangeFilter(where="region = 'emea' AND amount > 10").compile(NAMES)
    assert not f.drops_every_row(constants(region="emea"), "insert")  # amount is in the rows
    # Never decided from part of the predicate, even where AND would allow it: kept, and filtered row by row.
    assert not f.drops_every_row(constants(region="amer"), "insert")
    by_type = ChangeFilter(where="_change_type = 'delete'").compile(NAMES)
    assert by_type.drops_every_row(constants(), "insert")
    assert not by_type.drops_every_row(constants(), None)  # a cdc file's rows carry their own change type
    assert not ChangeFilter(where="region = 'emea'").drops_every_row(constants(region="amer"), None)  # not compiled


def test_change_types_drop_the_files_of_other_types() -> None:
    f = ChangeFilter(change_types=frozenset({"delete"})).compile(NAMES)
    assert f.drops_every_row(constants(), "insert")
    assert not f.drops_every_row(constants(), "delete")
    assert not f.drops_every_row(constants(), None)
    assert not ChangeFilter(columns=("id",)).compile(NAMES).prunes


# ---------------------------------------------------------------- what is not a row predicate --


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("id IN (SELECT 1)", "subqueries are not supported"),
        ("id NOT IN (SELECT 1)", "subqueries are not supported"),
        ("id IN UNNEST(ids)", "IN takes a list of literals"),
        ("id = (SELECT max(id) FROM other)", "subqueries are not supported"),
        ("EXISTS (SELECT 1 FROM other WHERE other.id = id)", "subqueries are not supported"),
        ("id = ANY (SELECT 1)", "subqueries are not supported"),
        ("count(*) > 1", "'COUNT\\(\\*\\)' is an aggregate"),
        ("sum(amount) > 10", "is an aggregate"),
        ("row_number() OVER (ORDER BY id) = 1", "is a window function"),
        ("no_such_function(id) = 1", "is not a column or a literal"),
        ("other.id = id", "qualified names"),
        ("id = 1; DROP TABLE t", "is not supported"),
    ],
)
def test_what_is_not_a_row_predicate_is_refused(where: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ChangeFilter(where=where).compile(ROWS.schema.names)


@pytest.mark.slow
def test_a_long_and_chain_is_evaluated_without_recursion() -> None:
    # 3,000 ANDs raised RecursionError; a chain is evaluated in a loop, whatever its length.
    where = " AND ".join(["id > 1"] * 1500 + ["id < 6"] * 1501)
    assert kept(ChangeFilter(where=where)) == [(101, [2, 3, 4, 5])]
    either = " OR ".join([f"id = {i}" for i in (2, 5)] + ["id = 99"] * 2998)
    assert kept(ChangeFilter(where=either)) == [(101, [2]), (104, [5])]


@pytest.mark.parametrize(
    ("where", "message"),
    [
        ("(" * 5000 + "id = 1" + ")" * 5000, "parentheses nest 5000 deep; at most 16"),
        ("(" * 17 + "id = 1" + ")" * 17, "parentheses nest 17 deep; at most 16"),
        ("NOT " * 3000 + "id = 1", "nests too deeply"),
        ("NOT " * 60 + "id = 1", "levels deep; at most 40|nests too deeply"),
        (" AND ".join(["id > 1"] * 20000), "characters long; at most 65536"),
    ],
)
def test_predicates_too_deep_or_too_long_are_refused(where: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        ChangeFilter(where=where).compile(ROWS.schema.names)


def test_nesting_within_the_bound_works_and_quoted_parentheses_do_not_count() -> None:
    where = "(" * 16 + "id = 3 OR name = '((((((((((((((((((('" + ")" * 16
    assert kept(ChangeFilter(where=where)) == [(102, [3])]
