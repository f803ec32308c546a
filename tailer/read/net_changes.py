"""Net changes: cancel rewrite noise in commits without change data files.

Without cdc files, a copy-on-write rewrite emits every row of the removed file
as ``delete`` and every row of the rewritten file as ``insert``, even rows that
did not change. Net changes removes that noise within one commit:

1. A ``delete`` row and an ``insert`` row with identical values in every table
   column cancel out (as multisets: two identical deletes and one identical
   insert leave one delete).
2. With key columns, a remaining ``delete`` and ``insert`` of the same key
   become ``update_preimage`` and ``update_postimage``, provided the key occurs
   once among the deletes and once among the inserts (otherwise the pairing
   would be a guess, and the rows stay as they are).

Output order: update pairs (pre-image then post-image), then remaining
deletes, then remaining inserts, each in input order.

Memory: rule 1 needs every row of a commit with the same values side by side,
and rule 2 every row of a key, so a commit is netted in key-hash partitioned
passes (:func:`net_passes`): each pass reads the commit's files again and keeps
the rows whose key (with no key columns, whose whole row) hashes to it, so
rows that cancel or pair always meet in one pass. A commit of at most
:data:`NET_PASS_BYTES` of files is one pass (the order above); a larger one is
netted pass by pass, each pass in that order. The number of passes depends
only on the commit's file sizes, so the positions of the netted rows are the
same on every read (a restart inside the commit resumes at the same row).
"""

from __future__ import annotations

import math
import zlib
from collections import Counter, defaultdict
from collections.abc import Sequence
from typing import Any

import orjson
import pyarrow as pa

from deltatail.state.changes import FileTask
from deltatail.state.errors import ConfigError

_CHANGE = ("_change_type", "_commit_version", "_commit_timestamp")


def row_keys(table: pa.Table, columns: list[str]) -> list[bytes]:
    """A canonical byte key per row over ``columns`` (values of any type, nested included).

    Each key is copied to a ``bytes`` of its own size: the object ``orjson.dumps`` returns keeps
    its whole output buffer (about 4 KiB for a short row), which for a commit's million keys is gigabytes.
    """
    values = [table.column(c).to_pylist() for c in columns]
    return [
        bytes(memoryview(orjson.dumps(row, default=_encode, option=orjson.OPT_PASSTHROUGH_DATETIME)))
        for row in zip(*values, strict=True)
    ]


def _encode(value: Any) -> Any:
    return repr(value)


#: Bytes of a commit's files (as the log gives their sizes) netted in one pass.
NET_PASS_BYTES = 8 << 20
#: The most passes over one commit (a bound on the file sizes a log may claim).
MAX_NET_PASSES = 1024


def net_passes(tasks: Sequence[FileTask]) -> int:
    """How many key-hash partitioned passes net a commit of ``tasks``: one per :data:`NET_PASS_BYTES` of files.

    Files whose size the log omits count as nothing; the result is between 1 and :data:`MAX_NET_PASSES`.
    """
    total = sum(t.size for t in tasks if t.size is not None and t.size > 0)
    return max(1, min(math.ceil(total / NET_PASS_BYTES), MAX_NET_PASSES))


def in_pass(batch: pa.RecordBatch, key_columns: tuple[str, ...], passes: int, which: int) -> pa.RecordBatch:
    """The rows of ``batch`` that pass ``which`` of ``passes`` nets: by a hash of the key columns (or the row).

    Raises:
        ConfigError: if a key column is not a column of the batch.
    """
    table = pa.Table.from_batches([batch])
    _check_keys(table, key_columns)
    columns = list(key_columns) or [c for c in table.column_names if c not in _CHANGE]
    keep = [zlib.crc32(key) % passes == which for key in row_keys(table, columns)]
    return batch.filter(pa.array(keep, pa.bool_()))


def _check_keys(table: pa.Table, key_columns: tuple[str, ...]) -> None:
    missing = [k for k in key_columns if k not in table.column_names]
    if missing:
        raise ConfigError(f"net-changes key columns not in the table: {', '.join(missing)}")


def net_changes(table: pa.Table, key_columns: tuple[str, ...] = ()) -> pa.Table:
    """Apply the net-change rules of the module docstring to one commit's change rows.

    Raises:
        ConfigError: if a key column is not a column of the table.
    """
    _check_keys(table, key_columns)
    data_columns = [c for c in table.column_names if c not in _CHANGE]
    kinds = table.column("_change_type").to_pylist()
    full = row_keys(table, data_columns)
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
    return _pair_updates(table, keep, kinds, list(key_columns))


def _pair_updates(table: pa.Table, keep: list[int], kinds: list[str], key_columns: list[str]) -> pa.Table:
    keys = row_keys(table, key_columns)
    by_key: dict[bytes, dict[str, list[int]]] = defaultdict(lambda: {"delete": [], "insert": []})
    for i in keep:
        if kinds[i] in ("delete", "insert"):
            by_key[keys[i]][kinds[i]].append(i)
    pairs: list[tuple[int, int]] = []
    paired: set[int] = set()
    for groups in by_key.values():
        if len(groups["delete"]) == 1 and len(groups["insert"]) == 1:
            pairs.append((groups["delete"][0], groups["insert"][0]))
            paired.update((groups["delete"][0], groups["insert"][0]))
    pairs.sort()
    order = [i for pair in pairs for i in pair]
    order += [i for i in keep if i not in paired and kinds[i] != "insert"]
    order += [i for i in keep if i not in paired and kinds[i] == "insert"]
    result = table.take(pa.array(order, pa.int64()))
    types = ["update_preimage", "update_postimage"] * len(pairs) + [kinds[i] for i in order[2 * len(pairs) :]]
    index = result.column_names.index("_change_type")
    return result.set_column(index, "_change_type", pa.array(types, pa.string()))
