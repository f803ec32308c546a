"""The Spark source's schema: Arrow to Spark and back, and what rows of older versions must fit."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from deltatail.state.errors import SchemaChangeError
from deltatail.state.feed import change_schema
from deltatail.state.planning import VersionPlan


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of an Arrow change schema (:func:`tailer.read.feed.change_schema`)."""
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def arrow_target(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects from ``read`` for a Spark schema (timestamps in UTC)."""
    return to_arrow_schema(schema, timezone="UTC")


def widens(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether ``new`` is a widening of ``old`` that Delta's type widening allows (every value exactly representable).

    Protocol, "Type Widening": ``byte`` -> ``short`` -> ``int`` -> ``long``; ``float`` -> ``double``;
    ``byte``, ``short``, ``int`` -> ``double``; ``date`` -> ``timestamp_ntz``; ``decimal(p, s)`` ->
    ``decimal(p + k1, s + k2)`` with ``k1 >= k2 >= 0``; ``byte``, ``short``, ``int``, ``long`` -> a
    decimal with room for their digits (3, 5, 10, 20 before the point).
    """
    t = pa.types
    if t.is_signed_integer(old) and t.is_signed_integer(new):
        return bool(new.bit_width >= old.bit_width)
    if t.is_signed_integer(old) and t.is_float64(new):
        return bool(old.bit_width <= 32)
    if t.is_float32(old) and t.is_float64(new):
        return True
    if t.is_date32(old) and t.is_timestamp(new):
        return new.tz is None
    if t.is_signed_integer(old) and t.is_decimal(new):
        return bool(new.precision - new.scale >= {8: 3, 16: 5, 32: 10, 64: 20}[old.bit_width])
    if t.is_decimal(old) and t.is_decimal(new):
        return bool(new.scale >= old.scale and new.precision - new.scale >= old.precision - old.scale)
    return False


def fits(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether values of ``old`` can be read as ``new``.

    They can if the types are equal, ``new`` widens ``old`` (:func:`widens`), or ``new`` only adds
    struct fields (any depth).
    """
    if widens(old, new):
        return True
    if pa.types.is_struct(old) and pa.types.is_struct(new):
        names = {new.field(i).name: new.field(i).type for i in range(new.num_fields)}
        olds = (old.field(i) for i in range(old.num_fields))
        return all(f.name in names and fits(f.type, names[f.name]) for f in olds)
    if pa.types.is_list(old) and pa.types.is_list(new):
        return fits(old.value_type, new.value_type)
    if pa.types.is_map(old) and pa.types.is_map(new):
        return fits(old.key_type, new.key_type) and fits(old.item_type, new.item_type)
    return bool(old == new)


def schema_problem(plan_schema: pa.Schema, stream: pa.Schema) -> str | None:
    """``None`` if rows of ``plan_schema`` fit the stream's schema, else which column does not."""
    for f in plan_schema:
        index = stream.get_field_index(f.name)
        if index < 0:
            return f"column {f.name!r} is not in the query's schema"
        if not fits(f.type, stream.field(index).type):
            return f"column {f.name!r} has type {f.type}, the query's schema has {stream.field(index).type}"
    return None


def check_fits(plan: VersionPlan, stream: pa.Schema) -> None:
    """Refuse a version whose rows do not fit the query's fixed schema.

    A version's rows fit if each column is in the query's schema in a type that holds its values
    (:func:`fits`; columns the query has and the version lacks are null), its removed rows too
    (read in the schema before it, :meth:`~state.planning.VersionPlan.context_of`), and it does not
    drop or rename a column the query's schema has (the query would show it as null from there on,
    as if every later row had no value).

    Raises:
        SchemaChangeError: naming the version and the column.
    """
    context = plan.context
    schema = change_schema(context.schema())
    if plan.before is not None:
        gone = sorted(set(plan.before.schema().names) - set(schema.names) & set(stream.names))
        if gone:  # the query would show a dropped or renamed column as null from here on
            raise _not_fitting(
                f"the version drops or renames column {gone[0]!r}, which the query's schema has",
                context.table_root,
                context.version,
            )
        if any(plan.context_of(t) is plan.before for t in plan.tasks):
            check_schema_fits(
                change_schema(plan.before.schema()), stream, table=context.table_root, version=context.version
            )
    check_schema_fits(schema, stream, table=context.table_root, version=context.version)


def check_schema_fits(schema: pa.Schema, stream: pa.Schema, *, table: str, version: int) -> None:
    """Refuse a version whose change schema (Arrow, as Spark sees it) does not fit the query's fixed schema.

    Raises:
        SchemaChangeError: naming the version and the column.
    """
    problem = schema_problem(schema, stream)
    if problem is not None:
        raise _not_fitting(
            f"the table schema at this version does not fit the query's schema: {problem}", table, version
        )


def _not_fitting(problem: str, table: str, version: int) -> SchemaChangeError:
    return SchemaChangeError(
        f"{problem}. A query's schema "
        "is fixed when it starts (the table's schema at its latest version then). If the table changed "
        "after the query started, restart it with the same checkpointLocation: it resumes at this "
        "version, in the table's schema then. If the query's schema is newer than this version (a "
        "column renamed or dropped between the two), no query can stream across the change: read the "
        "versions before it with a batch read (spark.read, endingVersion=the version before the change) "
        "and stream the rest with a new query (new checkpointLocation, startingVersion=the version of "
        "the change)",
        table=table,
        version=version,
    )


def conform(batch: pa.RecordBatch, target: pa.Schema) -> pa.RecordBatch:
    """``batch`` in exactly ``target``'s layout: columns cast by name, missing ones (older versions) null."""
    columns = []
    for f in target:
        index = batch.schema.get_field_index(f.name)
        if index < 0:
            columns.append(pa.nulls(batch.num_rows, f.type))
            continue
        column = batch.column(index)
        columns.append(column if column.type == f.type else column.cast(f.type))
    return pa.RecordBatch.from_arrays(columns, schema=target)
