"""Arrow columns as JSON: column-wise, with Arrow kernels where they write exactly what orjson would.

:func:`json_values` turns a column into JSON-ready Python values (pyarrow
compute doing the per-type work: timestamps formatted by ``strftime``, decimals
and dates cast to strings). For long batches, :func:`json_texts` and
:func:`column_text` make each column's JSON texts with Arrow kernels and
:func:`joined_objects` joins them into one object per row, about 3x faster than
one ``orjson.dumps`` per row and byte for byte the same (measured by
``python -m benchmarks.kafka_sink``, see ``benchmarks/README.md``). A column the
kernels cannot write exactly (floating point, binary, nested types, a string
holding a control character) takes the row path. Value rules (the same in
every path):

* integers, floats, booleans, strings: JSON numbers, booleans, strings
  (NaN and infinities become ``null``, as orjson writes them);
* decimals: strings with the column's scale (``"-1.50"``);
* timestamps with a time zone: ISO-8601 UTC with microseconds and ``Z``
  (``"2024-01-02T03:04:05.123456Z"``); timestamps without one
  (``timestamp_ntz``): the same without ``Z``; nanoseconds are truncated;
* dates: ``"YYYY-MM-DD"``; times: ``"HH:MM:SS[.ffffff]"``;
* binary: standard base64 with padding;
* structs: JSON objects; lists: arrays; maps: objects (keys that are not
  strings are written as JSON strings of themselves, nested keys as a list
  of ``{"key", "value"}`` objects);
* durations: integer counts of the column's unit;
* variants (:data:`~state.variant.VARIANT_STORAGE_TYPE`, at any depth): the value
  itself, its JSON text (:func:`~state.variant.variant_to_json`, Spark's
  ``to_json``) embedded as JSON, as Spark's ``to_json(struct(...))`` writes a
  row (``{"v":{"a":1}}``, not a string holding ``{"a":1}``); the ``debezium`` and
  ``flat`` formats instead carry it as a string holding that text, Debezium's
  ``io.debezium.data.Json`` (:mod:`sinks.kafka.connect_schema`).
"""

from __future__ import annotations

import datetime as dt
import functools
from binascii import b2a_base64
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from itertools import pairwise
from typing import Any, TypeAlias

import orjson
import pyarrow as pa
import pyarrow.compute as pc

from deltatail.state.variant import is_variant_type, variant_json_array

INSERT, DELETE = "insert", "delete"
PREIMAGE, POSTIMAGE = "update_preimage", "update_postimage"
#: Change type of a ``u`` event that carries both images of an update.
UPDATE = "update"
CHANGE_TYPES = frozenset({INSERT, DELETE, PREIMAGE, POSTIMAGE})

#: Rows of a batch encoded at once by the text sinks (JSON lines, Kafka messages): the texts of a
#: slice are held, not a batch's (a 65,536-row batch's texts, several times over while joined).
ENCODE_ROWS = 8192


# ---------------------------------------------------------------- columns --


def text_scalar(value: str) -> pa.Scalar:
    """A string scalar, typed.

    pyarrow's type inference tries to import ``dateutil`` each time (~30 µs when it is not
    installed, 1.5 µs typed), and so does a Python value passed to a kernel.
    """
    return pa.scalar(value, pa.string())


def counting_texts(start: int, stop: int) -> pa.Array:
    """The decimal texts of ``start, start + 1, ..., stop - 1`` (a string array), e.g. rows' indexes.

    Built in Arrow (a running sum of ones): ``pa.array(range(...))`` walks Python integers, ~4x the time.
    """
    ones = pa.repeat(pa.scalar(1, pa.int64()), max(stop - start, 0))
    return pc.cast(pc.add(pc.cumulative_sum(ones), pa.scalar(start - 1, pa.int64())), pa.string())


# Arrow scalars made once: passing Python strings makes pyarrow build them on every call.
_Z = text_scalar("Z")
_EMPTY = text_scalar("")


def json_values(column: pa.Array) -> list[Any]:
    """Convert an Arrow array into JSON-ready Python values, one per slot.

    Args:
        column: any Arrow array (not chunked); slices are honoured.

    Returns:
        A list as long as ``column``; nulls are ``None``. The rules are in the
        module docstring.
    """
    t = column.type
    if pa.types.is_dictionary(t):
        return json_values(column.dictionary_decode())
    if pa.types.is_timestamp(t):
        return _timestamps(column)
    if pa.types.is_decimal(t) or pa.types.is_date(t) or pa.types.is_time(t):
        return list(pc.cast(column, pa.string()).to_pylist())
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return [None if v is None else b2a_base64(v, newline=False).decode("ascii") for v in column.to_pylist()]
    if pa.types.is_binary_view(t):
        return json_values(pc.cast(column, pa.large_binary()))
    if pa.types.is_struct(t):
        if is_variant_type(t):
            return [None if v is None else orjson.Fragment(v) for v in variant_texts(column).to_pylist()]
        return _structs(column)
    if pa.types.is_map(t):
        return _maps(column)
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return _lists(column)
    if pa.types.is_fixed_size_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return _lists(pc.cast(column, pa.large_list(t.value_field)))
    if pa.types.is_duration(t):
        return list(pc.cast(column, pa.int64()).to_pylist())
    if pa.types.is_float16(t):
        return list(pc.cast(column, pa.float32()).to_pylist())
    if pa.types.is_null(t):
        return [None] * len(column)
    return list(column.to_pylist())


#: Microsecond timestamp columns up to this long are formatted in Python: for a few values (a
#: followed commit of a row or two) the five compute calls below cost more than formatting them.
SMALL_TIMESTAMP_COLUMN = 8
_EPOCH = dt.datetime(1970, 1, 1)


def _timestamps(column: pa.Array) -> list[Any]:
    # Casting a naive microsecond timestamp to string is ~30x faster than strftime
    # and always writes six fraction digits; tz-aware values are UTC instants.
    t = column.type
    if len(column) <= SMALL_TIMESTAMP_COLUMN and t.unit == "us":
        try:
            return _few_timestamps(column, zone=t.tz is not None)
        except OverflowError:
            pass  # outside datetime's years 1..9999: the compute kernels below write them
    return list(_timestamp_text(column).to_pylist())


def _timestamp_text(column: pa.Array) -> pa.Array:
    """The ISO-8601 text of each timestamp (microseconds, ``T``, ``Z`` with a zone) as a string array."""
    text = _timestamp_body(column)
    if column.type.tz is not None:
        text = pc.binary_join_element_wise(text, _Z, _EMPTY)
    return text


#: Microseconds since the epoch of 0000-01-01 and of 10000-01-01: between them Arrow writes a
#: timestamp as ``YYYY-MM-DD HH:MM:SS.ffffff``, with the space always at byte 10.
_FOUR_DIGIT_YEARS = (-62_167_219_200_000_000, 253_402_300_800_000_000)


def _timestamp_body(column: pa.Array) -> pa.Array:
    """:func:`_timestamp_text` without the ``Z``."""
    t = column.type
    micros = pc.cast(column, pa.timestamp("us", tz=t.tz), safe=False)
    if t.tz is not None:
        micros = pc.cast(micros, pa.timestamp("us"))
    text = pc.cast(micros, pa.string())
    bounds = pc.min_max(micros.cast(pa.int64()))
    low, high = bounds["min"].as_py(), bounds["max"].as_py()
    if low is not None and _FOUR_DIGIT_YEARS[0] <= low and high < _FOUR_DIGIT_YEARS[1]:
        return pc.binary_replace_slice(text, 10, 11, "T")  # bytes, not characters: 3x faster
    return pc.replace_substring(text, " ", "T", max_replacements=1)


def _few_timestamps(column: pa.Array, *, zone: bool) -> list[Any]:
    """The same strings as :func:`_timestamps`'s kernels, from ``datetime`` (microsecond units only).

    Raises:
        OverflowError: if a value is outside the years 1..9999.
    """
    suffix = "Z" if zone else ""
    return [
        None if v is None else (_EPOCH + dt.timedelta(microseconds=v)).isoformat(timespec="microseconds") + suffix
        for v in column.cast(pa.int64()).to_pylist()
    ]


# ------------------------------------------------------------ column texts --

#: Batches of at least this many rows are encoded column by column with Arrow kernels
#: (:func:`json_texts`); below it, a kernel call per column costs more than orjson per row.
VECTOR_ROWS = 32


_QUOTE = text_scalar('"')
_NULL = text_scalar("null")
#: Characters JSON requires escaped besides the quote and backslash: a string holding one is
#: left to orjson (the kernels below only escape ``"`` and ``\``).
_CONTROL = "[\x00-\x1f]"
#: What makes a string need more than its quotes: a control character, a quote or a backslash.
_SPECIAL = bytes(range(0x20)) + b'"\\'


@dataclass(frozen=True, slots=True)
class Wrapped:
    """JSON texts of a column without nulls, each ``before + body[i] + after``.

    The quotes around strings, decimals, dates, times and timestamps (and a timestamp's ``Z``) are
    left to the join that assembles whole objects (:func:`joined_objects`), which writes them
    together with its constant parts: a pass over the column less for each such column.
    """

    before: str
    body: pa.Array
    after: str

    def joined(self) -> pa.Array:
        """The texts themselves."""
        return pc.binary_join_element_wise(text_scalar(self.before), self.body, text_scalar(self.after), _EMPTY)


#: A column's JSON texts: an array of them, one constant text for every row, or a wrapped array.
Text: TypeAlias = pa.Array | pa.Scalar | Wrapped


def json_texts(column: pa.Array) -> pa.Array | None:
    """Each slot's JSON text as a string array without nulls (a null slot is ``null``).

    The texts are byte for byte what ``orjson.dumps`` writes for :func:`json_values`
    of the column, built by Arrow kernels without a Python object per value.

    Args:
        column: an Arrow array (not chunked); slices are honoured.

    Returns:
        The texts, or ``None`` when the column's type has no kernel path here
        (floating point, whose shortest forms Arrow writes in a different notation
        than orjson; binary; nested types; null) or a string holds a control
        character or is not valid UTF-8: the caller then encodes row by row.
    """
    text = column_text(column)
    return text.joined() if isinstance(text, Wrapped) else text


def column_text(column: pa.Array) -> pa.Array | Wrapped | None:
    """:func:`json_texts`, leaving the quotes of a column without nulls to the caller (:class:`Wrapped`)."""
    t = column.type
    if pa.types.is_dictionary(t):
        return column_text(column.dictionary_decode())
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        text = pc.cast(column, pa.string())
    elif pa.types.is_duration(t):
        text = pc.cast(pc.cast(column, pa.int64()), pa.string())
    elif pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_string_view(t):
        escaped = _escaped_strings(column)
        return None if escaped is None else _quoted(escaped)
    elif pa.types.is_decimal(t) or pa.types.is_date(t) or pa.types.is_time(t):
        return _quoted(pc.cast(column, pa.string()))
    elif pa.types.is_timestamp(t):
        return _quoted(_timestamp_body(column), 'Z"' if t.tz is not None else '"')
    elif is_variant_type(t):
        text = variant_texts(column)  # JSON already: embedded as it is
    else:
        return None
    return pc.fill_null(text, _NULL) if text.null_count else text


def variant_texts(column: pa.Array) -> pa.Array:
    """The JSON text of each value of a variant column (a string array, nulls kept).

    Raises:
        DataFileError: if a value's bytes break the variant encoding (deltatail's reader has checked
            every value it read, so only rows made elsewhere can).
    """
    texts = variant_json_array(column, column="a variant column")
    return texts.combine_chunks() if isinstance(texts, pa.ChunkedArray) else texts


def _quoted(body: pa.Array, after: str = '"') -> pa.Array | Wrapped:
    """``"`` + each text + ``after``, or ``null`` for a null slot."""
    if not body.null_count:
        return Wrapped('"', body, after)
    return pc.fill_null(pc.binary_join_element_wise(_QUOTE, body, text_scalar(after), _EMPTY), _NULL)


def _escaped_strings(column: pa.Array) -> pa.Array | None:
    """The strings with quotes and backslashes escaped (still unquoted), or ``None`` if one cannot be written here."""
    if not pa.types.is_string(column.type):
        column = pc.cast(column, pa.string())
    try:
        column.validate(full=True)  # UTF-8: orjson would refuse what the kernels would copy blindly
    except pa.ArrowInvalid:
        return None
    # One scan of the slice's characters (only its own: a batch sliced from a packed run of
    # readers shares the run's buffer, and scanning all of it per slice would be quadratic).
    characters = concatenated(column)
    # Deleting the special bytes and comparing lengths is a table lookup a byte: ~5x faster than a regex search.
    if len(characters.translate(None, _SPECIAL)) != len(characters):
        if pc.any(pc.match_substring_regex(column, _CONTROL)).as_py():
            return None
        column = pc.replace_substring(column, "\\", "\\\\")
        column = pc.replace_substring(column, '"', '\\"')
    return column


def constant_text(column: pa.Array) -> pa.Scalar | None:
    """The one JSON text of a column whose slots all hold the same non-null value, else ``None``.

    Meant for the commit columns, constant within a batch: one scalar replaces a
    column of texts in :func:`joined_objects`.
    """
    t = column.type
    if len(column) == 0 or column.null_count or not (pa.types.is_integer(t) or pa.types.is_timestamp(t)):
        return None
    bounds = pc.min_max(column)
    if bounds["min"] != bounds["max"]:
        return None
    text = json_texts(column.slice(0, 1))
    return None if text is None else text[0]


def joined_objects(
    length: int, names: Sequence[str], texts: Sequence[Text], tail: Sequence[pa.Array | pa.Scalar] = ()
) -> pa.Array:
    """One JSON object text per row (a string array) from its members' texts (:func:`column_texts`).

    ``tail`` is written after the last member: more texts, ending with the closing
    brace (and a newline, say); by default the brace alone. Names are written as
    given (the caller keeps them unique). Neighbouring constant parts (names,
    quotes, constant members) are joined into one before the kernel runs: its
    cost grows with the number of parts.
    """
    parts: list[str | pa.Array] = []

    def add(part: str | pa.Array | pa.Scalar) -> None:
        if isinstance(part, pa.Scalar):
            part = part.as_py()
        if isinstance(part, str) and parts and isinstance(parts[-1], str):
            parts[-1] += part
        else:
            parts.append(part)

    for i, (name, text) in enumerate(zip(names, texts, strict=True)):
        add(("{" if i == 0 else ",") + orjson.dumps(name).decode() + ":")
        if isinstance(text, Wrapped):
            add(text.before)
            add(text.body)
            add(text.after)
        else:
            add(text)
    if not parts:
        add("{")
    for part in tail or ["}"]:
        add(part)
    if len(parts) == 1 and isinstance(parts[0], str):  # every member constant
        return pa.repeat(text_scalar(parts[0]), length)
    joined: pa.Array = pc.binary_join_element_wise(
        *(text_scalar(p) if isinstance(p, str) else p for p in parts), _EMPTY
    )
    return joined


def _characters(text: pa.Array) -> memoryview:
    """The character bytes of a string array's own slots (not those of the rest of its buffer)."""
    data = text.buffers()[2]
    if data is None or not len(text):
        return memoryview(b"")
    offsets = memoryview(text.buffers()[1]).cast("i")
    return memoryview(data)[offsets[text.offset] : offsets[text.offset + len(text)]]


def concatenated(text: pa.Array) -> bytes:
    """The characters of every slot of a string array without nulls, one after the other."""
    return bytes(_characters(text))


def json_objects(length: int, names: Sequence[str], texts: Sequence[Text]) -> list[bytes]:
    """:func:`joined_objects` as one ``bytes`` per row."""
    return list(pc.cast(joined_objects(length, names, texts), pa.binary()).to_pylist())


def row_dicts(names: Sequence[str], columns: Sequence[list[Any]], length: int) -> list[dict[str, Any]]:
    """One dict per row from equally long column lists (``length`` rows even with no columns).

    A repeated name keeps its last column's value, as ``dict(zip(names, row))`` would.
    """
    return list(iter_row_dicts(names, columns, length))


def iter_row_dicts(names: Sequence[str], columns: Sequence[list[Any]], length: int) -> Iterator[dict[str, Any]]:
    """:func:`row_dicts` one at a time, built as they are taken.

    A dict that is dropped before the next one is taken is freed at once: serialising rows this
    way keeps thousands of dicts from piling up for the garbage collector to scan.
    """
    if not names:
        return ({} for _ in range(length))
    if len(names) > _MAX_BUILDER_COLUMNS:
        # strict=False: the columns come from one batch and are equally long; strict costs ~30% here.
        return (dict(zip(names, row, strict=False)) for row in zip(*columns, strict=False))
    return map(_dict_builder(tuple(names)), *columns)


#: Widest row built by a generated function; wider ones go through ``dict(zip(...))``.
_MAX_BUILDER_COLUMNS = 256


@functools.lru_cache(maxsize=256)
def _dict_builder(names: tuple[str, ...]) -> Callable[..., dict[str, Any]]:
    """A function of one argument per name returning ``{names[0]: arg0, ...}``.

    A dict display with constant keys builds a row about 2.5x faster than ``dict(zip(...))``. The
    names only enter the generated source as ``repr`` literals, and the argument names are ``_0``...
    """
    args = ", ".join(f"_{i}" for i in range(len(names)))
    items = ", ".join(f"{name!r}: _{i}" for i, name in enumerate(names))
    code = compile(f"lambda {args}: {{{items}}}", "<row_dicts>", "eval")
    builder: Callable[..., dict[str, Any]] = eval(code, {"__builtins__": {}})
    return builder


def _blank_nulls(column: pa.Array, values: list[Any]) -> list[Any]:
    if column.null_count:
        for i, ok in enumerate(column.is_valid().to_pylist()):
            if not ok:
                values[i] = None
    return values


def _structs(column: pa.Array) -> list[Any]:
    names = [f.name for f in column.type]
    children = [json_values(child) for child in column.flatten()]
    return _blank_nulls(column, list(row_dicts(names, children, len(column))))


def _child_slice(offsets: list[int], child: pa.Array) -> list[Any]:
    return json_values(child.slice(offsets[0], offsets[-1] - offsets[0]))


def _lists(column: pa.Array) -> list[Any]:
    offsets = column.offsets.to_pylist()
    items = _child_slice(offsets, column.values)
    base = offsets[0]
    return _blank_nulls(column, [items[a - base : b - base] for a, b in pairwise(offsets)])


def _maps(column: pa.Array) -> list[Any]:
    offsets = column.offsets.to_pylist()
    keys, items, base = _child_slice(offsets, column.keys), _child_slice(offsets, column.items), offsets[0]
    if pa.types.is_nested(column.type.key_type):
        rows: list[Any] = [
            [{"key": k, "value": v} for k, v in zip(keys[a - base : b - base], items[a - base : b - base], strict=True)]
            for a, b in pairwise(offsets)
        ]
    else:
        if not (pa.types.is_string(column.type.key_type) or pa.types.is_large_string(column.type.key_type)):
            keys = [orjson.dumps(k).decode() for k in keys]
        rows = [
            dict(zip(keys[a - base : b - base], items[a - base : b - base], strict=True)) for a, b in pairwise(offsets)
        ]
    return _blank_nulls(column, rows)


# ---------------------------------------------------------------- batches --


@dataclass(slots=True)
class EncodedBatch:
    """The messages of one :class:`~state.feed.ChangeBatch`, as parallel lists, in send order.

    Message ``m`` carries the position of row ``rows[m]`` of the batch (for a
    paired update: the later image). A ``None`` value is a tombstone; it
    always directly follows the event of the same row. Send order is
    ascending ``(rows[m], value is None)``.
    """

    rows: list[int] = field(default_factory=list)
    keys: list[bytes] = field(default_factory=list)
    values: list[bytes | None] = field(default_factory=list)
    change_types: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)


#: Columns constant within a batch (one commit): their text is made once (:func:`constant_text`).
_CONSTANT_COLUMNS = frozenset({"_commit_version", "_commit_timestamp"})


def column_texts(rows: pa.RecordBatch, known: dict[str, pa.Scalar] | None = None) -> dict[str, Text] | None:
    """Every column's JSON texts by name, or ``None`` if names repeat or a column has no column-wise path.

    A column's texts come from its kernel path (:func:`column_text`), or for floating point from
    :func:`value_texts`; a column of another type without a kernel path makes it ``None`` too (the
    caller then encodes row by row).

    ``known`` holds the text of columns already known to be constant (the change
    type of a batch of one kind).
    """
    names = rows.schema.names
    if len(set(names)) != len(names):
        return None
    known = known or {}
    texts: dict[str, Text] = {}
    for name, column in zip(names, rows.columns, strict=True):
        text: Text | None = known.get(name) or (constant_text(column) if name in _CONSTANT_COLUMNS else None)
        if text is None:
            text = column_text(column)
            if text is None:
                text = value_texts(column)
            if text is None:
                return None
        texts[name] = text
    return texts


def value_texts(column: pa.Array) -> pa.Array | None:
    """Each slot's JSON text for a floating-point column, as ``orjson`` writes its values; ``None`` for other types.

    The whole column is written as one JSON array by one ``orjson`` call and cut at its commas (a
    number's text holds none): the same bytes as each value inside a row's object (orjson writes no
    whitespace, so a value's text does not depend on where it stands), without a Python call per
    value (``orjson.dumps`` of one float costs some microseconds; of a list, tens of nanoseconds a value).
    """
    if not pa.types.is_floating(column.type):
        return None
    if len(column) == 0:
        return pa.array([], pa.string())
    array = orjson.dumps(json_values(column))[1:-1].decode()
    return pc.split_pattern(pa.array([array]), ",").flatten()
