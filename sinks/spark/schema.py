"""The Spark source's schema: Arrow to Spark and back, and what rows of older versions must fit."""

from __future__ import annotations

import pyarrow as pa
from pyspark.sql.pandas.types import from_arrow_schema, to_arrow_schema
from pyspark.sql.types import StructType

from state.errors import SchemaChangeError
from state.feed import change_schema
from state.planning import VersionPlan


def spark_schema(schema: pa.Schema) -> StructType:
    """The Spark schema of an Arrow change schema (:func:`tailer.read.feed.change_schema`)."""
    return from_arrow_schema(schema, prefer_timestamp_ntz=True)


def arrow_target(schema: StructType) -> pa.Schema:
    """The exact Arrow schema Spark expects from ``read`` for a Spark schema (timestamps in UTC)."""
    return to_arrow_schema(schema, timezone="UTC")


def fits(old: pa.DataType, new: pa.DataType) -> bool:
    """Whether values of ``old`` can be read as ``new``: equal, or ``new`` only adds struct fields (any depth)."""
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
    """Refuse a version whose schema does not fit the query's fixed schema.

    Raises:
        SchemaChangeError: naming the version and the column.
    """
    for context in (plan.context, plan.before) if plan.before is not None else (plan.context,):
        check_schema_fits(change_schema(context.schema()), stream, table=context.table_root, version=context.version)


def check_schema_fits(schema: pa.Schema, stream: pa.Schema, *, table: str, version: int) -> None:
    """Refuse a version whose change schema (Arrow, as Spark sees it) does not fit the query's fixed schema.

    Raises:
        SchemaChangeError: naming the version and the column.
    """
    problem = schema_problem(schema, stream)
    if problem is not None:
        raise SchemaChangeError(
            f"the table schema at this version does not fit the query's schema: {problem}; the schema is "
            "fixed when the query starts: restart it to pick up an additive change (a non-additive change "
            "cannot be streamed across)",
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
