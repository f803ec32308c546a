"""The fields of Delta actions: each action's JSON shape declared once, its checks, and path decoding. Pure.

Used by :mod:`state.actions.model` and :mod:`state.actions.parsing`; the names with a leading
underscore are the package's internals, shared between its modules only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeAlias
from urllib.parse import unquote

from deltatail.state.errors import InvalidLogError


def decode_path(raw: str) -> str:
    """Decode a file action's path: percent-decoding, and ``file:`` URIs of local files made plain paths.

    Protocol: the path "is a URI as specified by RFC 2396 URI Generic Syntax,
    which needs to be decoded to get the data file path". Delta Spark qualifies
    paths before reconciling, so ``file:/x``, ``file:///x`` and ``/x`` name one
    file; deltatail canonicalizes the ``file:`` forms to ``/x`` here.
    """
    if "%" not in raw and not raw.startswith("file:"):
        return raw  # most paths: nothing to decode
    path = unquote(raw)
    if path.startswith("file:///"):
        return path[len("file://") :]
    if path.startswith("file://localhost/"):
        return path[len("file://localhost") :]
    if path.startswith("file:/") and not path.startswith("file://"):
        return path[len("file:") :]
    return path  # another host's file: URI stays a URI (absolute), never a relative path


# -- field validation -----------------------------------------------------------------------------
#
# Every field the protocol types is checked here for its JSON type (JSON ``true``/``false`` for a
# Boolean, an integer inside the 64-bit range for a Long, 32-bit for an Int, a string, an object of
# strings for a Map[String, String], an array of strings) and every required field for presence.
# ``null`` counts as absent: writers put ``null`` where a field has no value (delta-rs writes
# ``"baseRowId": null``), and Parquet checkpoints hold a null for every absent field. Unknown
# fields are never looked at ("readers MUST ignore unknown fields").
#
# Each action's fields are declared once as a schema (the ``_*_SCHEMA`` tables below). The parsers of
# ``add``, ``remove`` and the DV descriptor, which run once per file of a table, test their fields
# inline and consult the schema only to word the error; the other actions are validated against
# their schema directly.

_MIN_LONG, _MAX_LONG = -(2**63), 2**63 - 1
_MIN_INT, _MAX_INT = -(2**31), 2**31 - 1
_STORAGE_TYPES = ("u", "i", "p")

_Check: TypeAlias = Callable[[Any], "str | None"]
"""A field check: ``None`` when the (non-null) value is of the field's type, else what is wrong."""


def _shown(value: Any) -> str:
    """A value as a message shows it: its JSON kind and, for scalars, a short rendering."""
    if value is None:
        return "null"
    if type(value) is bool:
        return f"the boolean {'true' if value else 'false'}"
    if isinstance(value, int | float):
        return f"the number {value!r}"
    if isinstance(value, str):
        text = value if len(value) <= 40 else value[:37] + "..."
        return f"the string {text!r}"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "an object"
    return f"a {type(value).__name__}"


def _long(value: Any) -> str | None:
    if type(value) is not int:
        return f"must be a long (a JSON integer), got {_shown(value)}"
    if not _MIN_LONG <= value <= _MAX_LONG:
        return f"must be a long, got {value}, outside the 64-bit range"
    return None


def _int(value: Any) -> str | None:
    if type(value) is not int:
        return f"must be an int (a JSON integer), got {_shown(value)}"
    if not _MIN_INT <= value <= _MAX_INT:
        return f"must be an int, got {value}, outside the 32-bit range"
    return None


def _boolean(value: Any) -> str | None:
    return None if type(value) is bool else f"must be a boolean (true or false), got {_shown(value)}"


def _string(value: Any) -> str | None:
    return None if type(value) is str else f"must be a string, got {_shown(value)}"


def _string_map(value: Any) -> str | None:
    if type(value) is not dict:
        return f"must be a map (a JSON object of strings), got {_shown(value)}"
    for key, item in value.items():
        if type(key) is not str:
            return f"must be a map with string keys, got the key {key!r}"
        if item is not None and type(item) is not str:
            return f"must map strings to strings or null, but maps {key!r} to {_shown(item)}"
    return None


def _strict_string_map(value: Any) -> str | None:
    problem = _string_map(value)
    if problem is None:
        for key, item in value.items():
            if item is None:
                return f"must map strings to strings, but maps {key!r} to null"
    return problem


def _strings(value: Any) -> str | None:
    if type(value) is not list:
        return f"must be an array of strings, got {_shown(value)}"
    for i, item in enumerate(value):
        if type(item) is not str:
            return f"must be an array of strings, but element {i} is {_shown(item)}"
    return None


def _storage_type(value: Any) -> str | None:
    if type(value) is not str or value not in _STORAGE_TYPES:
        return f"must be 'u', 'i' or 'p', got {_shown(value)}"
    return None


_Schema: TypeAlias = dict[str, tuple["_Check | _Schema", bool]]
"""Field name -> (its check, or the schema of a nested struct; whether it is required)."""


def _first_problem(body: dict[str, Any], schema: _Schema, prefix: str = "") -> tuple[str, str] | None:
    """The first field of ``body`` that breaks ``schema``, as ``(dotted field name, what is wrong)``."""
    for name, (check, required) in schema.items():
        value = body.get(name)
        where = prefix + name
        if value is None:
            if required:
                return where, "is required but missing" if name not in body else "is required but null"
            continue
        if isinstance(check, dict):
            if type(value) is not dict:
                return where, f"must be an object, got {_shown(value)}"
            found = _first_problem(value, check, where + ".")
        else:
            problem = check(value)
            found = None if problem is None else (where, problem)
        if found is not None:
            return found
    return None


def _invalid(action: str, body: Any, schema: _Schema) -> InvalidLogError:
    """The error for an ``action`` whose ``body`` breaks ``schema``, naming the action and the field."""
    if type(body) is not dict:
        return InvalidLogError(f"{action} action must be a JSON object, got {_shown(body)}")
    found = _first_problem(body, schema)
    if found is None:  # an inline check refused what the schema allows: say so rather than guess a field
        return InvalidLogError(f"{action} action is malformed")
    field_name, problem = found
    return InvalidLogError(f"{action} action: field {field_name!r} {problem}")


def _validate(action: str, body: Any, schema: _Schema) -> dict[str, Any]:
    """``body`` itself when it is an object that satisfies ``schema``.

    Raises:
        InvalidLogError: naming the action and the first offending field.
    """
    if type(body) is not dict or _first_problem(body, schema) is not None:
        raise _invalid(action, body, schema)
    return body


def _nullable_strings(values: dict[str, Any]) -> bool:
    """Whether every value of a (JSON object) map is a string or null."""
    for value in values.values():  # noqa: SIM110 - a loop is twice as fast as all() over a generator here
        if value is not None and type(value) is not str:
            return False
    return True


_DV_SCHEMA: _Schema = {
    "storageType": (_storage_type, True),
    "pathOrInlineDv": (_string, True),
    "offset": (_int, False),
    "sizeInBytes": (_int, True),
    "cardinality": (_long, True),
}
_ADD_SCHEMA: _Schema = {
    "path": (_string, True),
    "partitionValues": (_string_map, True),
    "size": (_long, True),
    "modificationTime": (_long, True),
    "dataChange": (_boolean, True),
    "stats": (_string, False),
    "tags": (_string_map, False),
    "deletionVector": (_DV_SCHEMA, False),
    "baseRowId": (_long, False),
    "defaultRowCommitVersion": (_long, False),
    "clusteringProvider": (_string, False),
}
_REMOVE_SCHEMA: _Schema = {
    "path": (_string, True),
    "deletionTimestamp": (_long, False),
    "dataChange": (_boolean, True),
    "extendedFileMetadata": (_boolean, False),
    "partitionValues": (_string_map, False),
    "size": (_long, False),
    "stats": (_string, False),
    "tags": (_string_map, False),
    "deletionVector": (_DV_SCHEMA, False),
    "baseRowId": (_long, False),
    "defaultRowCommitVersion": (_long, False),
}
_CDC_SCHEMA: _Schema = {
    "path": (_string, True),
    "partitionValues": (_string_map, True),
    "size": (_long, True),
    "dataChange": (_boolean, True),
    "tags": (_string_map, False),
}
# configuration and format options are Map[String, String] with no null values: a null would reach
# code that reads a setting as a string (delta.enableChangeDataFeed ...).
_FORMAT_SCHEMA: _Schema = {"provider": (_string, True), "options": (_strict_string_map, False)}
# schemaString is required by the protocol, but real tables of the corpus (delta-rs/delta-live-table,
# delta-golden/deltalog-commit-info ...) omit it; its absence is reported when the schema is needed
# (Metadata.schema), so that such a log can still be followed for its file actions.
_METADATA_SCHEMA: _Schema = {
    "id": (_string, True),
    "name": (_string, False),
    "description": (_string, False),
    "format": (_FORMAT_SCHEMA, True),
    "schemaString": (_string, False),
    "partitionColumns": (_strings, True),
    "createdTime": (_long, False),
    "configuration": (_strict_string_map, True),
}
_PROTOCOL_SCHEMA: _Schema = {
    "minReaderVersion": (_int, True),
    "minWriterVersion": (_int, True),
    "readerFeatures": (_strings, False),
    "writerFeatures": (_strings, False),
}
_TXN_SCHEMA: _Schema = {"appId": (_string, True), "version": (_long, True), "lastUpdated": (_long, False)}
_DOMAIN_SCHEMA: _Schema = {"domain": (_string, True), "configuration": (_string, True), "removed": (_boolean, True)}
_SIDECAR_SCHEMA: _Schema = {
    "path": (_string, True),
    "sizeInBytes": (_long, True),
    "modificationTime": (_long, True),
    "tags": (_string_map, False),
}
_CHECKPOINT_METADATA_SCHEMA: _Schema = {"version": (_long, True), "tags": (_string_map, False)}
# commitInfo is free-form ("implementations are free to store any valid JSON"); only the in-commit
# timestamp, which the In-Commit Timestamps feature defines as a Long, is typed.
_COMMIT_INFO_SCHEMA: _Schema = {"inCommitTimestamp": (_long, False)}
