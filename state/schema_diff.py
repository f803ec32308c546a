"""The difference between two table schemas, with column mapping resolved. Pure.

Fields of the old and the new schema are matched, struct by struct, in two
passes:

1. by identity: the column-mapping field id (``delta.columnMapping.id``) when
   both fields carry one, else the physical name
   (``delta.columnMapping.physicalName``) when both carry one;
2. the fields left over, by logical name, unless their identities contradict
   each other (both have ids, or both have physical names, and they differ:
   that is a column dropped and another added under the same name).

A matched pair whose names differ is a rename. Without column mapping a
rename cannot be told from a drop and an add, and is reported as those.

Nested fields are compared by path: struct fields by name, an array's element
as ``element``, a map's key and value as ``key`` and ``value``
(``a.b``, ``tags.element``, ``m.value.x``). A name holding a dot, a backtick or
a space is quoted with backticks (`` `a.b` ``), as Spark writes paths.
A column added or dropped is reported at its own path only (not each field
under it). The nullability of an array's elements (``containsNull``) and of a
map's values (``valueContainsNull``) is reported at the ``element`` / ``value``
path.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from deltatail.state.schema import (
    FIELD_ID_KEY,
    PHYSICAL_NAME_KEY,
    ArrayType,
    DataType,
    DecimalType,
    MapType,
    PrimitiveType,
    StructField,
    StructType,
)

#: Field metadata keys that are bookkeeping, not a change a person made to the column.
_BOOKKEEPING_PREFIXES = ("delta.columnMapping.", "delta.identity.highWaterMark")


@dataclass(frozen=True, slots=True)
class ColumnRename:
    """A column whose logical name changed (matched by field id or physical name)."""

    old_path: str
    new_path: str


@dataclass(frozen=True, slots=True)
class TypeChange:
    """A column whose type changed; types are written as Delta names (``long``, ``decimal(10,2)``, ``array<int>``)."""

    path: str
    old_type: str
    new_type: str


@dataclass(frozen=True, slots=True)
class NullabilityChange:
    """A column (or array element, or map value) whose nullability changed."""

    path: str
    old_nullable: bool
    new_nullable: bool


@dataclass(frozen=True, slots=True)
class SchemaDiff:
    """What changed between two schemas. Paths of added columns are in the new schema, dropped ones in the old.

    ``type_changed``, ``nullability_changed`` and ``metadata_changed`` name the
    path in the new schema. ``metadata_changed`` lists columns whose field
    metadata (a comment, say) changed, column-mapping bookkeeping aside.
    """

    added: tuple[str, ...] = ()
    dropped: tuple[str, ...] = ()
    renamed: tuple[ColumnRename, ...] = ()
    type_changed: tuple[TypeChange, ...] = ()
    nullability_changed: tuple[NullabilityChange, ...] = ()
    metadata_changed: tuple[str, ...] = ()

    #: The kinds of change, in the order of the fields above (the names rules use).
    KINDS = ("added", "dropped", "renamed", "type_changed", "nullability_changed", "metadata_changed")

    def __bool__(self) -> bool:
        return any(getattr(self, kind) for kind in self.KINDS)

    @property
    def kinds(self) -> tuple[str, ...]:
        """The kinds of change present, e.g. ``("added", "renamed")``."""
        return tuple(kind for kind in self.KINDS if getattr(self, kind))

    @property
    def additive(self) -> bool:
        """Whether the only changes are added columns, relaxed nullability or new field metadata."""
        tightened = any(c.old_nullable and not c.new_nullable for c in self.nullability_changed)
        return not (self.dropped or self.renamed or self.type_changed or tightened)

    def to_json(self) -> dict[str, Any]:
        """The diff as a JSON-ready dict (see ``state.audit`` for the shape)."""
        return {
            "added": list(self.added),
            "dropped": list(self.dropped),
            "renamed": [{"old_path": r.old_path, "new_path": r.new_path} for r in self.renamed],
            "type_changed": [
                {"path": t.path, "old_type": t.old_type, "new_type": t.new_type} for t in self.type_changed
            ],
            "nullability_changed": [
                {"path": n.path, "old_nullable": n.old_nullable, "new_nullable": n.new_nullable}
                for n in self.nullability_changed
            ],
            "metadata_changed": list(self.metadata_changed),
        }

    @staticmethod
    def from_json(raw: dict[str, Any]) -> SchemaDiff:
        """The inverse of :meth:`to_json`; raises ``KeyError``/``TypeError`` on a malformed dict."""
        return SchemaDiff(
            added=tuple(raw["added"]),
            dropped=tuple(raw["dropped"]),
            renamed=tuple(ColumnRename(r["old_path"], r["new_path"]) for r in raw["renamed"]),
            type_changed=tuple(TypeChange(t["path"], t["old_type"], t["new_type"]) for t in raw["type_changed"]),
            nullability_changed=tuple(
                NullabilityChange(n["path"], bool(n["old_nullable"]), bool(n["new_nullable"]))
                for n in raw["nullability_changed"]
            ),
            metadata_changed=tuple(raw["metadata_changed"]),
        )


def quote_name(name: str) -> str:
    """A field name as a path segment: backtick-quoted if it holds a dot, a backtick or a space."""
    if any(c in name for c in ".` "):
        return "`" + name.replace("`", "``") + "`"
    return name


def type_name(dtype: DataType) -> str:
    """A Delta type written out: ``long``, ``decimal(10,2)``, ``array<integer>``, ``map<string,long>``, ``struct<>``."""
    if isinstance(dtype, PrimitiveType):
        return dtype.name
    if isinstance(dtype, DecimalType):
        return f"decimal({dtype.precision},{dtype.scale})"
    if isinstance(dtype, ArrayType):
        return f"array<{type_name(dtype.element_type)}>"
    if isinstance(dtype, MapType):
        return f"map<{type_name(dtype.key_type)},{type_name(dtype.value_type)}>"
    return "struct<" + ",".join(f"{quote_name(f.name)}:{type_name(f.type)}" for f in dtype.fields) + ">"


def diff_schemas(old: StructType | None, new: StructType) -> SchemaDiff:
    """What changed from ``old`` to ``new``; ``old=None`` (no schema before) makes every column added."""
    out = _Collector()
    if old is None:
        out.added = [quote_name(f.name) for f in new.fields]
    else:
        _diff_struct(old, new, "", "", out)
    return SchemaDiff(
        added=tuple(out.added),
        dropped=tuple(out.dropped),
        renamed=tuple(out.renamed),
        type_changed=tuple(out.type_changed),
        nullability_changed=tuple(out.nullability_changed),
        metadata_changed=tuple(out.metadata_changed),
    )


class _Collector:
    __slots__ = ("added", "dropped", "metadata_changed", "nullability_changed", "renamed", "type_changed")

    def __init__(self) -> None:
        self.added: list[str] = []
        self.dropped: list[str] = []
        self.renamed: list[ColumnRename] = []
        self.type_changed: list[TypeChange] = []
        self.nullability_changed: list[NullabilityChange] = []
        self.metadata_changed: list[str] = []


def _join(prefix: str, segment: str) -> str:
    return f"{prefix}.{segment}" if prefix else segment


def _physical(f: StructField) -> str | None:
    value = f.metadata.get(PHYSICAL_NAME_KEY)
    return value if isinstance(value, str) else None


def _field_id(f: StructField) -> int | None:
    value = f.metadata.get(FIELD_ID_KEY)
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _identity_match(a: StructField, b: StructField) -> bool:
    ida, idb = _field_id(a), _field_id(b)
    if ida is not None and idb is not None:
        return ida == idb
    phys_a, phys_b = _physical(a), _physical(b)
    return phys_a is not None and phys_b is not None and phys_a == phys_b


def _identities_conflict(a: StructField, b: StructField) -> bool:
    ida, idb = _field_id(a), _field_id(b)
    if ida is not None and idb is not None and ida != idb:
        return True
    phys_a, phys_b = _physical(a), _physical(b)
    return phys_a is not None and phys_b is not None and phys_a != phys_b


def _match(old: StructType, new: StructType) -> list[tuple[int, int | None]]:
    """For each old field index, the matched new field index (or ``None``)."""
    by_id: dict[int, int] = {}
    by_physical: dict[str, int] = {}
    for j, nf in enumerate(new.fields):
        fid, phys = _field_id(nf), _physical(nf)
        if fid is not None:
            by_id.setdefault(fid, j)
        if phys is not None:
            by_physical.setdefault(phys, j)
    pairs: dict[int, int] = {}
    taken: set[int] = set()
    for i, of in enumerate(old.fields):
        fid, phys = _field_id(of), _physical(of)
        candidate = by_id.get(fid) if fid is not None else None
        if candidate is None and phys is not None:
            candidate = by_physical.get(phys)
        if candidate is not None and candidate not in taken and _identity_match(of, new.fields[candidate]):
            pairs[i] = candidate
            taken.add(candidate)
    by_name = {nf.name: j for j, nf in enumerate(new.fields)}
    for i, of in enumerate(old.fields):
        if i in pairs:
            continue
        named = by_name.get(of.name)
        if named is not None and named not in taken and not _identities_conflict(of, new.fields[named]):
            pairs[i] = named
            taken.add(named)
    return [(i, pairs.get(i)) for i in range(len(old.fields))]


def _user_metadata(f: StructField) -> dict[str, Any]:
    return {k: v for k, v in f.metadata.items() if not k.startswith(_BOOKKEEPING_PREFIXES)}


def _diff_struct(old: StructType, new: StructType, old_prefix: str, new_prefix: str, out: _Collector) -> None:
    matched: set[int] = set()
    for i, j in _match(old, new):
        of = old.fields[i]
        old_path = _join(old_prefix, quote_name(of.name))
        if j is None:
            out.dropped.append(old_path)
            continue
        matched.add(j)
        nf = new.fields[j]
        new_path = _join(new_prefix, quote_name(nf.name))
        if of.name != nf.name:
            out.renamed.append(ColumnRename(old_path, new_path))
        if of.nullable != nf.nullable:
            out.nullability_changed.append(NullabilityChange(new_path, of.nullable, nf.nullable))
        if _user_metadata(of) != _user_metadata(nf):
            out.metadata_changed.append(new_path)
        _diff_type(of.type, nf.type, old_path, new_path, out)
    for j, nf in enumerate(new.fields):
        if j not in matched:
            out.added.append(_join(new_prefix, quote_name(nf.name)))


def _diff_type(old: DataType, new: DataType, old_path: str, new_path: str, out: _Collector) -> None:
    if isinstance(old, StructType) and isinstance(new, StructType):
        _diff_struct(old, new, old_path, new_path, out)
    elif isinstance(old, ArrayType) and isinstance(new, ArrayType):
        element_old, element_new = _join(old_path, "element"), _join(new_path, "element")
        if old.contains_null != new.contains_null:
            out.nullability_changed.append(NullabilityChange(element_new, old.contains_null, new.contains_null))
        _diff_type(old.element_type, new.element_type, element_old, element_new, out)
    elif isinstance(old, MapType) and isinstance(new, MapType):
        _diff_type(old.key_type, new.key_type, _join(old_path, "key"), _join(new_path, "key"), out)
        value_old, value_new = _join(old_path, "value"), _join(new_path, "value")
        if old.value_contains_null != new.value_contains_null:
            out.nullability_changed.append(
                NullabilityChange(value_new, old.value_contains_null, new.value_contains_null)
            )
        _diff_type(old.value_type, new.value_type, value_old, value_new, out)
    elif type_name(old) != type_name(new):
        out.type_changed.append(TypeChange(new_path, type_name(old), type_name(new)))
