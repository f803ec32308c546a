"""Filters on the change feed: columns, a row predicate, change types, and commits skipped by operation.

A filter never moves a row's position. Rows it drops are simply not delivered;
the rows it keeps go out at the positions they have unfiltered, so the cursor,
exactly-once delivery and a restart work as without a filter (a batch whose
kept rows are not consecutive is handed on as several batches, one per run of
consecutive positions). Changing a filter between two runs changes only which
rows are delivered from then on.

- ``columns``: the table columns to deliver (the three change columns always go).
- ``where``: a SQL predicate over the table's columns and the change columns,
  evaluated with Arrow compute on each batch (SQL semantics: a row whose
  predicate is null is dropped). Comparisons, ``AND``/``OR``/``NOT``,
  ``IN (...)``, ``BETWEEN``, ``IS [NOT] NULL``, ``LIKE``; literals are cast to
  the column's type (``amount > 10``, ``day >= '2024-01-01'``,
  ``ts < TIMESTAMP '2024-01-01 00:00:00'``). It is parsed with sqlglot. It is a
  condition on each row's own columns: subqueries, aggregates, window functions,
  other functions and qualified names (``other.id``) are refused, as is a
  predicate longer than :data:`MAX_WHERE_CHARS` characters, nesting parentheses
  deeper than :data:`MAX_WHERE_NESTING` or expressions deeper than
  :data:`MAX_WHERE_DEPTH` (a chain of ``AND`` or of ``OR`` is one level, however long).
- ``change_types``: deliver only these (``insert``, ``delete``,
  ``update_preimage``, ``update_postimage``): Delta's ``ignoreDeletes`` is
  ``change_types = ["insert", "update_preimage", "update_postimage"]``.
- ``skip_operations``: commits whose ``commitInfo.operation`` is one of these
  (``OPTIMIZE``, ``VACUUM START``...) deliver nothing.

Pruning: a file whose rows all share the values the filter looks at — its
partition values, its commit's version and timestamp, and (a data file, not
a cdc file) its change type — is dropped whole when the filter drops those
values (:meth:`ChangeFilter.drops_every_row`): the reader counts its rows
instead of reading them, so the positions of the rows after it do not move.
Partition Value Serialization: "Partition values are stored as strings" in
the ``add`` action, and every row of the file has them.
"""

from __future__ import annotations

import datetime as dt
import decimal
import functools
import importlib
import types
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import TYPE_CHECKING, Any

import pyarrow as pa

from deltatail.state.commit import Commit
from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError
from deltatail.state.feed import CHANGE_COLUMNS, CHANGE_TYPE_COLUMN, ChangeBatch


class _OnFirstUse(types.ModuleType):
    """A module imported when one of its names is first read: sqlglot, for the first predicate compiled.

    A command without a filter (most) does not pay for importing the SQL parser, a fifth of the
    command line's start-up, nor ``pyarrow.compute`` (~0.1 s), whose kernels only a filter applies.
    """

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module(self.__name__), name)


if TYPE_CHECKING:
    import pyarrow.compute as pc
    import sqlglot
    import sqlglot.errors
    from sqlglot import expressions as sx
else:
    pc = _OnFirstUse("pyarrow.compute")
    sqlglot = _OnFirstUse("sqlglot")
    sx = _OnFirstUse("sqlglot.expressions")


CHANGE_TYPES = ("insert", "delete", "update_preimage", "update_postimage")

#: A compiled predicate: a batch's rows to a boolean mask (null: unknown, dropped).
Predicate = Callable[[pa.RecordBatch], pa.Array]


@dataclass(frozen=True)
class ChangeFilter:
    """What of the change feed to deliver (see the module docstring).

    Raises:
        ConfigError: from :meth:`compile`, naming the setting, column or predicate at fault.
    """

    columns: tuple[str, ...] | None = None
    where: str | None = None
    change_types: frozenset[str] | None = None
    skip_operations: frozenset[str] = frozenset()
    _predicate: Predicate | None = field(default=None, compare=False, repr=False)
    _where_columns: frozenset[str] | None = field(default=None, compare=False, repr=False)

    @property
    def is_empty(self) -> bool:
        """Whether the filter lets everything through."""
        return self.columns is None and self.where is None and self.change_types is None and not self.skip_operations

    def compile(self, names: Sequence[str]) -> ChangeFilter:
        """Check the filter against a table's column names and compile its predicate.

        Raises:
            ConfigError: for an unknown column (in ``columns`` or ``where``), an unknown change
                type, or a predicate that does not parse or uses something not supported.
        """
        known = set(names) | set(CHANGE_COLUMNS)
        if self.columns is not None:
            unknown = [c for c in self.columns if c not in known]
            if unknown:
                raise ConfigError(f"columns: {', '.join(unknown)} not in the table (its columns: {', '.join(names)})")
        if self.change_types is not None:
            wrong = sorted(self.change_types - set(CHANGE_TYPES))
            if wrong:
                raise ConfigError(f"change_types: {', '.join(wrong)} (known: {', '.join(CHANGE_TYPES)})")
        predicate, used = (None, frozenset[str]()) if self.where is None else _compile(self.where, known)
        return ChangeFilter(self.columns, self.where, self.change_types, self.skip_operations, predicate, used)

    def output_schema(self, schema: pa.Schema) -> pa.Schema:
        """The schema of delivered rows, given the unfiltered one: only the chosen columns, and the change columns."""
        if self.columns is None:
            return schema
        return pa.schema([f for f in schema if f.name in self.columns or f.name in CHANGE_COLUMNS])

    @property
    def prunes(self) -> bool:
        """Whether the filter can drop a file whole (it has change types or a predicate)."""
        return self.change_types is not None or self.where is not None

    def drops_every_row(self, constants: pa.RecordBatch, change_type: str | None) -> bool:
        """Whether every row of a file is dropped, knowing only the values all its rows share.

        Args:
            constants: one row of the columns every row of the file has the same value in
                (partition columns, ``_commit_version``, ``_commit_timestamp``); a column left
                out is unknown.
            change_type: the change type of every row (a data file's task), or ``None`` (a cdc
                file's rows carry their own).

        ``False`` whenever the answer depends on anything else: a filter that was not
        compiled, or a predicate over a column not in ``constants``.

        Raises:
            ConfigError: as :meth:`apply`, if the predicate cannot be evaluated on these types.
        """
        if self.change_types is not None and change_type is not None and change_type not in self.change_types:
            return True
        if self.where is None or self._predicate is None or self._where_columns is None:
            return False
        known = set(constants.schema.names)
        if change_type is not None:
            known.add(CHANGE_TYPE_COLUMN)
            constants = constants.append_column(CHANGE_TYPE_COLUMN, pa.array([change_type], pa.string()))
        if not self._where_columns <= known:
            return False
        verdict = self._predicate(constants)
        return not (verdict.null_count == 0 and bool(verdict[0].as_py()))

    def skips(self, commit: Commit | None) -> bool:
        """Whether ``commit``'s rows are not delivered at all (its operation is skipped)."""
        if commit is None or commit.commit_info is None:
            return False
        return self.skips_operation(commit.commit_info.operation)

    def skips_operation(self, operation: str | None) -> bool:
        """Whether a version made by ``operation`` (any case) delivers nothing."""
        return operation is not None and operation.upper() in self.skip_operations

    def apply(self, batch: ChangeBatch) -> list[ChangeBatch]:
        """The rows of ``batch`` to deliver, at their own positions, as batches of consecutive positions.

        Raises:
            ConfigError: if the predicate cannot be evaluated on the batch's types (a literal that does
                not fit a column's type).
        """
        rows = batch.rows
        mask: pa.Array | None = None
        if self.change_types is not None:
            wanted = pa.array(sorted(self.change_types), pa.string())
            mask = pc.is_in(rows.column(CHANGE_TYPE_COLUMN), value_set=wanted)
        if self.where is not None:
            predicate = self._predicate if self._predicate is not None else compile_predicate(self.where, None)
            keep = pc.fill_null(predicate(rows), False)
            mask = keep if mask is None else pc.and_(mask, keep)
        if self.columns is not None:
            names = [c for c in rows.schema.names if c in self.columns or c in CHANGE_COLUMNS]
            rows = rows.select(names)
        if mask is None:
            return [ChangeBatch(batch.start, rows)]
        return _runs(batch.start, rows, mask)


def _runs(start: Position, rows: pa.RecordBatch, mask: pa.Array) -> list[ChangeBatch]:
    kept = pc.indices_nonzero(mask)
    n = len(kept)
    if n == 0:
        return []
    if n == rows.num_rows:
        return [ChangeBatch(start, rows)]
    breaks = [0]
    if n > 1:
        steps = pc.subtract(kept.slice(1), kept.slice(0, n - 1))
        breaks += [int(i) + 1 for i in pc.indices_nonzero(pc.not_equal(steps, pa.scalar(1, steps.type))).to_pylist()]
    breaks.append(n)
    out = []
    for a, b in pairwise(breaks):
        first = int(kept[a].as_py())
        position = Position(start.version, start.snapshot_rank, start.index + first)
        out.append(ChangeBatch(position, rows.slice(first, b - a)))
    return out


# ---------------------------------------------------------------- the predicate --


def compile_predicate(text: str, columns: set[str] | None) -> Predicate:
    """A SQL predicate as a function from a batch to its boolean mask.

    Args:
        text: the predicate (``where``).
        columns: the names it may use (``None``: not checked).

    Raises:
        ConfigError: if it does not parse, uses an unknown column, or something not supported.
    """
    return _compile(text, columns)[0]


#: The longest predicate accepted, in characters (an ``IN`` list of a thousand keys fits).
MAX_WHERE_CHARS = 65536
#: The deepest parenthesis nesting accepted: the parser recurses per level, and a predicate
#: nesting deeper than this is generated, not written.
MAX_WHERE_NESTING = 16
#: The deepest expression tree accepted once parsed (a chain of ``AND`` or of ``OR`` counts as one
#: level, however long: it is evaluated in a loop), so compiling and evaluating stay shallow.
MAX_WHERE_DEPTH = 40


def _compile(text: str, columns: set[str] | None) -> tuple[Predicate, frozenset[str]]:
    """:func:`compile_predicate`, and the columns the predicate reads."""
    if len(text) > MAX_WHERE_CHARS:
        raise ConfigError(f"where: the predicate is {len(text)} characters long; at most {MAX_WHERE_CHARS}")
    nesting = _paren_nesting(text)
    if nesting > MAX_WHERE_NESTING:
        raise ConfigError(f"where: parentheses nest {nesting} deep; at most {MAX_WHERE_NESTING}")
    short = text if len(text) <= 200 else text[:200] + "..."
    try:
        tree = sqlglot.parse_one(text)
    except (sqlglot.errors.ParseError, sqlglot.errors.TokenError) as e:
        raise ConfigError(f"where: cannot parse {short!r}: {str(e).splitlines()[0]}") from None
    except RecursionError:  # NOT NOT NOT ...: nesting without parentheses
        raise ConfigError(f"where: {short!r} nests too deeply; at most {MAX_WHERE_DEPTH} levels") from None
    if not isinstance(tree, sx.Expression):
        raise ConfigError(f"where: {short!r} is not a predicate")
    depth = _depth(tree)
    if depth > MAX_WHERE_DEPTH:
        raise ConfigError(f"where: {short!r} nests {depth} levels deep; at most {MAX_WHERE_DEPTH}")
    _refuse_queries(tree, short)
    compiler = _Compiler(short, columns)
    predicate = compiler.boolean(tree)
    return predicate, frozenset(compiler.used)


def _paren_nesting(text: str) -> int:
    """The deepest parenthesis nesting of ``text`` outside quoted strings and names."""
    deepest = depth = 0
    quote: str | None = None
    for char in text:
        if quote is not None:
            quote = None if char == quote else quote  # a doubled quote closes and reopens: same count
        elif char in "'\"`":
            quote = char
        elif char == "(":
            depth += 1
            deepest = max(deepest, depth)
        elif char == ")":
            depth -= 1
    return deepest


def _depth(tree: sx.Expression) -> int:
    """The depth of a parsed predicate, without recursion; a chain of one of ``AND``/``OR`` is one level."""
    deepest = 0
    stack: list[tuple[sx.Expression, int]] = [(tree, 1)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        for child in node.iter_expressions():
            chained = isinstance(node, sx.And | sx.Or) and type(child) is type(node)
            stack.append((child, depth if chained else depth + 1))
    return deepest


def _refuse_queries(tree: sx.Expression, text: str) -> None:
    """Refuse what is not a predicate over the row's own columns, with the reason.

    Raises:
        ConfigError: for a subquery, an aggregate or a window function anywhere in the tree.
    """
    for node in tree.walk():
        if isinstance(node, sx.Query | sx.Subquery | sx.Exists):
            reason = "subqueries are not supported"
        elif isinstance(node, sx.AggFunc):
            reason = f"{node.sql()!r} is an aggregate"
        elif isinstance(node, sx.Window):
            reason = f"{node.sql()!r} is a window function"
        else:
            continue
        raise ConfigError(f"where: {reason}; the predicate is a condition on each row's own columns, in {text!r}")


def _chain(node: sx.And | sx.Or) -> list[sx.Expression]:
    """The operands of a chain of one of ``AND``/``OR``, left to right, without recursion."""
    out: list[sx.Expression] = []
    stack: list[sx.Expression] = [node]
    while stack:
        item = stack.pop()
        if type(item) is type(node):
            stack += [item.expression, item.this]
        else:
            out.append(item)
    return out


@functools.cache
def _comparisons() -> dict[type[sx.Expression], Callable[[object, object], pa.Array]]:
    """The comparison operators, by their node type (made when the first predicate is compiled)."""
    return {
        sx.EQ: pc.equal,
        sx.NEQ: pc.not_equal,
        sx.GT: pc.greater,
        sx.GTE: pc.greater_equal,
        sx.LT: pc.less,
        sx.LTE: pc.less_equal,
    }


@dataclass(frozen=True)
class _Literal:
    value: object


#: A value of the predicate: a column (a batch-to-array function) or a literal.
Operand = Callable[[pa.RecordBatch], pa.Array] | _Literal


class _Compiler:
    def __init__(self, text: str, columns: set[str] | None) -> None:
        self.text = text
        self.columns = columns
        self.used: set[str] = set()

    def fail(self, what: str) -> ConfigError:
        return ConfigError(f"where: {what} in {self.text!r}")

    def boolean(self, node: sx.Expression) -> Predicate:
        if isinstance(node, sx.Paren):
            return self.boolean(node.this)
        if isinstance(node, sx.And | sx.Or):
            terms = [self.boolean(term) for term in _chain(node)]
            combine = pc.and_kleene if isinstance(node, sx.And) else pc.or_kleene

            def chained(b: pa.RecordBatch) -> pa.Array:
                mask = terms[0](b)
                for term in terms[1:]:
                    mask = combine(mask, term(b))
                return mask

            return chained
        if isinstance(node, sx.Not):
            inner = self.boolean(node.this)
            return lambda b: pc.invert(inner(b))
        if type(node) in _comparisons():
            op = _comparisons()[type(node)]
            left_o, right_o = self.operand(node.this), self.operand(node.expression)
            if isinstance(left_o, _Literal) and isinstance(right_o, _Literal):
                raise self.fail("a comparison needs a column")
            return lambda b: self._call(op, _value(left_o, b), _value(right_o, b))
        if isinstance(node, sx.Is):
            if not isinstance(node.expression, sx.Null):
                raise self.fail("only IS NULL and IS NOT NULL are supported")
            column = self.column(node.this)
            return lambda b: pc.is_null(column(b))
        if isinstance(node, sx.In):
            if any(node.args.get(k) is not None for k in ("query", "unnest", "field")) or not node.expressions:
                raise self.fail("IN takes a list of literals: IN (1, 2)")
            column = self.column(node.this)
            items = [self.literal(e) for e in node.expressions]
            return lambda b: self._in(column(b), items)
        if isinstance(node, sx.Between):
            column = self.column(node.this)
            low, high = self.literal(node.args["low"]), self.literal(node.args["high"])
            return lambda b: pc.and_kleene(
                self._call(pc.greater_equal, column(b), _Literal(low)),
                self._call(pc.less_equal, column(b), _Literal(high)),
            )
        if isinstance(node, sx.Like):
            column = self.column(node.this)
            pattern = self.literal(node.expression)
            if not isinstance(pattern, str):
                raise self.fail("LIKE takes a string pattern")
            return lambda b: pc.match_like(column(b), pattern)
        if isinstance(node, sx.Column):
            column = self.column(node)
            return lambda b: column(b)
        raise self.fail(f"{node.sql()!r} is not supported")

    def column(self, node: sx.Expression) -> Callable[[pa.RecordBatch], pa.Array]:
        operand = self.operand(node)
        if isinstance(operand, _Literal):
            raise self.fail(f"{node.sql()!r} must be a column")
        return operand

    def operand(self, node: sx.Expression) -> Operand:
        if isinstance(node, sx.Paren):
            return self.operand(node.this)
        if isinstance(node, sx.Column):
            if node.table:
                raise self.fail(
                    f"{node.sql()!r}: qualified names (other tables, nested fields) are not supported;"
                    " use the row's own top-level columns"
                )
            name = node.name
            if self.columns is not None and name not in self.columns:
                raise self.fail(f"unknown column {name!r}")
            self.used.add(name)
            return lambda b: b.column(name)
        return _Literal(self.literal(node))

    def literal(self, node: sx.Expression) -> object:
        if isinstance(node, sx.Paren):
            return self.literal(node.this)
        if isinstance(node, sx.Null):
            return None
        if isinstance(node, sx.Boolean):
            return bool(node.this)
        if isinstance(node, sx.Neg):
            inner = self.literal(node.this)
            if isinstance(inner, int | float | decimal.Decimal) and not isinstance(inner, bool):
                return -inner
            raise self.fail(f"cannot negate {node.this.sql()!r}")
        if isinstance(node, sx.Literal):
            if node.is_string:
                return str(node.this)
            text = str(node.this)
            if text.lstrip("-").isdigit():
                return int(text)
            return decimal.Decimal(text) if "e" not in text.lower() else float(text)
        if isinstance(node, sx.Cast) and isinstance(node.this, sx.Literal) and node.this.is_string:
            kind = node.to.this
            text = str(node.this.this)
            try:
                if kind == sx.DataType.Type.DATE:
                    return dt.date.fromisoformat(text)
                if kind in (sx.DataType.Type.TIMESTAMP, sx.DataType.Type.TIMESTAMPTZ):
                    moment = dt.datetime.fromisoformat(text)
                    return moment if moment.tzinfo is not None else moment.replace(tzinfo=dt.UTC)
            except ValueError:
                raise self.fail(f"{node.sql()!r} is not a valid {kind.value.lower()}") from None
        raise self.fail(f"{node.sql()!r} is not a column or a literal")

    def _in(self, value: pa.Array, items: list[object]) -> pa.Array:
        try:
            value_set = pa.array([_scalar_for(item, value.type) for item in items], value.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError) as e:
            raise self.fail(f"the IN list does not fit column type {value.type}: {e}") from None
        return pc.is_in(value, value_set=value_set)

    def _call(
        self, op: Callable[[object, object], pa.Array], left: pa.Array | _Literal, right: pa.Array | _Literal
    ) -> pa.Array:
        try:
            if isinstance(left, _Literal) and isinstance(right, pa.Array):
                return op(_scalar_for(left.value, right.type), right)
            if isinstance(right, _Literal) and isinstance(left, pa.Array):
                return op(left, _scalar_for(right.value, left.type))
            return op(left, right)
        except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError, ValueError) as e:
            raise self.fail(f"cannot compare: {e}") from None


def _value(operand: Operand, batch: pa.RecordBatch) -> pa.Array | _Literal:
    return operand if isinstance(operand, _Literal) else operand(batch)


def _scalar_for(value: object, dtype: pa.DataType) -> pa.Scalar:
    """``value`` as a scalar of ``dtype`` (a string literal is cast: dates, timestamps, decimals...)."""
    if value is None:
        return pa.scalar(None, dtype)
    if isinstance(value, str) and not (pa.types.is_string(dtype) or pa.types.is_large_string(dtype)):
        return pa.scalar(value, pa.string()).cast(dtype)
    if isinstance(value, decimal.Decimal) and pa.types.is_floating(dtype):
        value = float(value)
    if isinstance(value, int | decimal.Decimal) and pa.types.is_decimal(dtype):
        return pa.scalar(decimal.Decimal(value), dtype)
    if isinstance(value, dt.datetime) and pa.types.is_timestamp(dtype) and dtype.tz is None:
        value = value.astimezone(dt.UTC).replace(tzinfo=None)
    return pa.scalar(value).cast(dtype) if not isinstance(value, bool) else pa.scalar(value, pa.bool_())
