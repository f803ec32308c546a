"""Partition values: the protocol's string serialization parsed into Arrow scalars."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from typing import Any

import pyarrow as pa

from deltatail.state.errors import InvalidLogError
from deltatail.state.schema import DataType, DecimalType, PrimitiveType, StructField, to_arrow_type


def _parse_bool(raw: str) -> bool:
    lowered = raw.lower()
    if lowered not in ("true", "false"):
        raise ValueError(f"{raw!r} is not 'true' or 'false'")
    return lowered == "true"


def _parse_timestamp(raw: str) -> datetime:
    """``{year}-{month}-{day} {hour}:{minute}:{second}[.fraction]`` or ISO 8601; a zone-less value is UTC."""
    value = datetime.fromisoformat(raw)
    return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)


def _parse_timestamp_ntz(raw: str) -> datetime:
    """A wall-clock timestamp; a value carrying a zone is taken at UTC."""
    return _parse_timestamp(raw).replace(tzinfo=None)


_PARSERS: dict[str, Callable[[str], Any]] = {
    "string": str,
    "long": int,
    "integer": int,
    "short": int,
    "byte": int,
    "float": float,
    "double": float,
    "boolean": _parse_bool,
    "date": date.fromisoformat,
    "timestamp": _parse_timestamp,
    "timestamp_ntz": _parse_timestamp_ntz,
    "binary": lambda raw: raw.encode("utf-8"),
}


def parse_partition_value(raw: str | None, field: StructField) -> pa.Scalar:
    """Parse one serialized partition value into an Arrow scalar of the column's type.

    Protocol, "Partition Value Serialization": "An empty string for any type
    translates to a null partition value"; numbers are "the string
    representation of the number"; date is ``{year}-{month}-{day}``; timestamp is
    ``{year}-{month}-{day} {hour}:{minute}:{second}`` (ISO 8601 forms with ``T``,
    fractions and ``Z`` are accepted too; ``timestamp`` values without a zone are
    UTC); boolean is ``"true"`` or ``"false"``; binary is the string's UTF-8 bytes.

    Args:
        raw: the serialized value; ``None`` or ``""`` is null.
        field: the partition column.

    Raises:
        InvalidLogError: if the column's type cannot be a partition column or the value does not parse.
    """
    target = to_arrow_type(field.type)
    if raw is None or raw == "":
        return pa.scalar(None, target)
    try:
        return pa.scalar(_parse_value(raw, field.type), target)
    except (ValueError, OverflowError, InvalidOperation, pa.ArrowException) as e:
        raise InvalidLogError(f"partition value {raw!r} of column {field.name!r} is not a valid {target}: {e}") from e


def _parse_value(raw: str, dtype: DataType) -> Any:
    if isinstance(dtype, DecimalType):
        return Decimal(raw)
    if isinstance(dtype, PrimitiveType) and dtype.name in _PARSERS:
        return _PARSERS[dtype.name](raw)
    raise ValueError(f"type {dtype} cannot be a partition column")
