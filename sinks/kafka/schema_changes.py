"""Schema-change events in Debezium's shape, for the Kafka sink's ``schema_changes=true``.

Debezium's relational connectors write every change of a captured table's schema to the
*schema change topic*, named after the logical server (``topic.prefix``, here ``server_name``),
keyed by ``{"databaseName": ...}``; the value holds the ``source`` block, ``ts_ms``,
``databaseName``, ``schemaName``, ``ddl`` and ``tableChanges``: one entry per changed table with
its ``type`` (``CREATE``, ``ALTER``, ``DROP``), ``id`` (``"db"."table"``) and the whole table
*after* the change (``table.columns``: ``name``, ``jdbcType``, ``typeName``, ``typeExpression``,
``position``, ``optional``...). deltatail writes the same shape for each version whose schema
differs from the one before it (the first version of a table is a ``CREATE``), with:

- ``ddl``: ``null`` (a Delta commit has no DDL text); ``tableChanges[0].deltaChanges`` holds what
  changed, as the audit feed names it (``added``, ``dropped``, ``renamed``, ``type_changed``...;
  :class:`state.schema_diff.SchemaDiff`), which Debezium's consumers ignore;
- ``typeName``: the Delta type (``long``, ``decimal(10,2)``, ``struct<a:long>``); ``jdbcType`` its
  ``java.sql.Types`` code; ``length``/``scale`` a decimal's precision and scale;
- ``source``: as the change events' (connector ``deltatail``, ``commit_version``, ``table_id``).
"""

from __future__ import annotations

from typing import Any

import orjson

from deltatail.sinks.kafka.debezium import EventOptions, deltatail_version
from deltatail.state.feed import TableInfo
from deltatail.state.schema import ArrayType, DataType, DecimalType, MapType, PrimitiveType, StructType
from deltatail.state.schema_diff import SchemaDiff, type_name

#: ``java.sql.Types`` of each Delta primitive type (Debezium's ``jdbcType``).
_JDBC_TYPES = {
    "boolean": 16,  # BOOLEAN
    "byte": -6,  # TINYINT
    "short": 5,  # SMALLINT
    "integer": 4,  # INTEGER
    "long": -5,  # BIGINT
    "float": 7,  # REAL
    "double": 8,  # DOUBLE
    "string": 12,  # VARCHAR
    "binary": -3,  # VARBINARY
    "date": 91,  # DATE
    "timestamp": 2014,  # TIMESTAMP_WITH_TIMEZONE
    "timestamp_ntz": 93,  # TIMESTAMP
}
_DECIMAL, _STRUCT, _ARRAY, _OTHER = 3, 2002, 2003, 1111  # DECIMAL, STRUCT, ARRAY, OTHER


def jdbc_type(dtype: DataType) -> int:
    """The ``java.sql.Types`` code of a Delta type (``OTHER`` for maps, variants and unknown names)."""
    if isinstance(dtype, PrimitiveType):
        return _JDBC_TYPES.get(dtype.name, _OTHER)
    if isinstance(dtype, DecimalType):
        return _DECIMAL
    if isinstance(dtype, StructType):
        return _STRUCT
    if isinstance(dtype, ArrayType):
        return _ARRAY
    if isinstance(dtype, MapType):
        return _OTHER
    return _OTHER


def _column(position: int, name: str, dtype: DataType, nullable: bool) -> dict[str, Any]:
    decimal = dtype if isinstance(dtype, DecimalType) else None
    written = type_name(dtype)
    return {
        "name": name,
        "jdbcType": jdbc_type(dtype),
        "nativeType": None,
        "typeName": written,
        "typeExpression": written,
        "charsetName": None,
        "length": None if decimal is None else decimal.precision,
        "scale": None if decimal is None else decimal.scale,
        "position": position,
        "optional": nullable,
        "autoIncremented": False,
        "generated": False,
        "comment": None,
    }


def schema_change_message(
    table: TableInfo,
    events: EventOptions,
    *,
    version: int,
    timestamp_ms: int,
    schema: StructType,
    diff: SchemaDiff,
    created: bool,
    key_columns: tuple[str, ...] = (),
) -> tuple[bytes, bytes]:
    """The key and value of the schema-change event of ``version``, whose schema (after it) is ``schema``.

    ``created``: the version creates the table (``CREATE``), else the schema changed (``ALTER``).
    """
    db = events.source_db
    table_name = events.table_name(table)
    source = {
        "version": deltatail_version(),
        "connector": "deltatail",
        "name": events.server_name,
        "ts_ms": timestamp_ms,
        "snapshot": "false",
        "db": db,
        "schema": events.source_schema,
        "table": table_name,
        "table_path": table.path,
        "table_id": table.table_id,
        "commit_version": version,
    }
    qualified = ".".join(f'"{part}"' for part in (events.source_schema or db, table_name))
    change = {
        "type": "CREATE" if created else "ALTER",
        "id": qualified,
        "table": {
            "defaultCharsetName": None,
            "primaryKeyColumnNames": list(key_columns),
            "columns": [_column(i + 1, f.name, f.type, f.nullable) for i, f in enumerate(schema.fields)],
            "comment": None,
        },
        "deltaChanges": diff.to_json(),
    }
    value = {
        "source": source,
        "ts_ms": timestamp_ms,
        "databaseName": db,
        "schemaName": events.source_schema,
        "ddl": None,
        "tableChanges": [change],
    }
    return orjson.dumps({"databaseName": db}), orjson.dumps(value)
