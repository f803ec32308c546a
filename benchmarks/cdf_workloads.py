"""Delta tables with change data feed on, written by ``deltalake``, for :mod:`benchmarks.changes`.

Each table is described by a spec; :func:`ensure` writes it under a data
directory (or reuses it when a marker file says the same spec was fully
written there before) and returns the version range to read.

- :class:`AppendsSpec`: many small one-file appends.
- :class:`MixedSpec`: a partitioned table with a random mix of appends,
  deletes, updates and merges (seeded, so every run writes the same history).
- :class:`BulkSpec`: one large insert, an UPDATE of every row and a MERGE that
  updates half the rows: versions 1 and 2 hold ``2 * rows`` and ``rows``
  change rows, all in cdc files (pre- and post-images).
"""

from __future__ import annotations

import json
import random
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import pyarrow as pa
import pyarrow.compute as pc
from deltalake import DeltaTable, write_deltalake

CDF_ON = {"delta.enableChangeDataFeed": "true"}
PARTITIONS = ("a", "b", "c", "d")


class Spec(Protocol):
    """A table spec: a directory name and a builder returning the versions to read."""

    @property
    def name(self) -> str:
        """The table's directory name (unique per spec values)."""
        ...

    def build(self, path: Path) -> tuple[int, int]:
        """Write the table at ``path``; returns the ``(first, last)`` versions to read."""
        ...


@dataclass(frozen=True)
class Workload:
    """A written table and the version range the benchmark reads."""

    path: Path
    first: int
    last: int
    reused: bool
    seconds: float

    @property
    def uri(self) -> str:
        """The table root as a string."""
        return str(self.path)


def ensure(base: Path, spec: Spec, regenerate: bool = False) -> Workload:
    """The table of ``spec`` under ``base``: reused if a marker matches, else (re)written."""
    path = base / spec.name
    marker = base / f"{spec.name}.done.json"
    wanted = {"spec": repr(spec)}
    if not regenerate and marker.exists() and (path / "_delta_log").is_dir():
        saved = json.loads(marker.read_text())
        if saved.get("spec") == wanted["spec"]:
            return Workload(path, int(saved["first"]), int(saved["last"]), reused=True, seconds=0.0)
    marker.unlink(missing_ok=True)
    if path.exists():
        shutil.rmtree(path)
    started = time.perf_counter()
    first, last = spec.build(path)
    elapsed = time.perf_counter() - started
    marker.write_text(json.dumps({**wanted, "first": first, "last": last}))
    return Workload(path, first, last, reused=False, seconds=elapsed)


# -- row generators --------------------------------------------------------------------------------


def small_rows(start: int, n: int) -> pa.Table:
    """``n`` rows of a small table (id, partition, value, name) with ids from ``start``."""
    ids = pa.array(range(start, start + n), pa.int64())
    return pa.table(
        {
            "id": ids,
            "part": pa.array([PARTITIONS[i % len(PARTITIONS)] for i in range(start, start + n)]),
            "value": pc.cast(ids, pa.float64()),
            "name": pc.binary_join_element_wise("name-", pc.cast(ids, pa.string()), ""),
        }
    )


def wide_rows(n: int) -> pa.Table:
    """``n`` rows of an eight-column table (numbers, strings, a timestamp, a flag)."""
    ids = pa.array(range(n), pa.int64())
    text = pc.cast(ids, pa.string())
    micros = pc.add(pc.multiply(ids, 1_000_003), 1_700_000_000_000_000)
    return pa.table(
        {
            "id": ids,
            "name": pc.binary_join_element_wise("customer-", text, ""),
            "email": pc.binary_join_element_wise("user", text, "@example.com", ""),
            "value": pc.multiply(pc.cast(ids, pa.float64()), 0.25),
            "qty": pc.cast(pc.bit_wise_and(ids, 1023), pa.int32()),
            "ts": pc.cast(micros, pa.timestamp("us", tz="UTC")),
            "flag": pc.equal(pc.bit_wise_and(ids, 1), 0),
            "bucket": pc.cast(pc.bit_wise_and(ids, 15), pa.int32()),
        }
    )


# -- specs -----------------------------------------------------------------------------------------


@dataclass(frozen=True)
class AppendsSpec:
    """``commits`` one-file appends of ``rows`` rows each (version 0 is the first)."""

    commits: int
    rows: int

    @property
    def name(self) -> str:
        """Directory name."""
        return f"appends_{self.commits}x{self.rows}"

    def build(self, path: Path) -> tuple[int, int]:
        """Write the appends; returns ``(0, commits - 1)``."""
        # By path, not through one DeltaTable: appending through a long-lived DeltaTable slows down with every
        # commit (2,000 appends take minutes); by path each write loads from the latest checkpoint.
        write_deltalake(path, small_rows(0, self.rows), configuration=CDF_ON)
        for i in range(1, self.commits):
            write_deltalake(str(path), small_rows(i * self.rows, self.rows), mode="append")
        return 0, self.commits - 1


@dataclass(frozen=True)
class MixedSpec:
    """A partitioned table with ``commits`` versions of appends, deletes, updates and merges."""

    commits: int
    initial_rows: int = 2_000
    append_rows: int = 200
    merge_rows: int = 150
    seed: int = 7

    @property
    def name(self) -> str:
        """Directory name."""
        return f"mixed_{self.commits}_commits_s{self.seed}"

    def build(self, path: Path) -> tuple[int, int]:
        """Write the history until the table has ``commits`` versions; returns ``(0, commits - 1)``."""
        write_deltalake(path, small_rows(0, self.initial_rows), partition_by=["part"], configuration=CDF_ON)
        table = DeltaTable(path)
        history = _MixedHistory(table, random.Random(self.seed), self.initial_rows, self)
        while table.version() < self.commits - 1:
            history.step()
        return 0, self.commits - 1


class _MixedHistory:
    """Applies one random DML operation at a time (an operation matching no row commits nothing)."""

    def __init__(self, table: DeltaTable, rng: random.Random, next_id: int, spec: MixedSpec) -> None:
        self.table = table
        self.rng = rng
        self.next_id = next_id
        self.spec = spec
        self.ops: dict[str, Callable[[], None]] = {
            "append": self.append,
            "delete": self.delete,
            "update": self.update,
            "merge": self.merge,
        }

    def step(self) -> None:
        """Run one operation, chosen with weights append 4 : delete 2 : update 2 : merge 2."""
        op = self.rng.choices(list(self.ops), weights=[4, 2, 2, 2])[0]
        self.ops[op]()

    def _predicate(self) -> str:
        part = self.rng.choice(PARTITIONS)
        return f"part = '{part}' AND id % 7 = {self.rng.randrange(7)}"

    def append(self) -> None:
        """Append new rows to every partition."""
        rows = small_rows(self.next_id, self.spec.append_rows)
        write_deltalake(self.table, rows, mode="append", partition_by=["part"])
        self.next_id += self.spec.append_rows

    def delete(self) -> None:
        """Delete about a seventh of one partition."""
        self.table.delete(self._predicate())

    def update(self) -> None:
        """Update about a seventh of one partition."""
        self.table.update(updates={"value": "value + 1"}, predicate=self._predicate())

    def merge(self) -> None:
        """Upsert: existing ids (updated where still present) and a third as many new ones."""
        low = self.rng.randrange(max(1, self.next_id - 4 * self.spec.merge_rows))
        fresh = self.spec.merge_rows // 3
        source = pa.concat_tables([small_rows(low, self.spec.merge_rows), small_rows(self.next_id, fresh)])
        source = source.set_column(2, "value", pc.add(source.column("value"), 0.5))
        self.next_id += fresh
        (
            self.table.merge(source, "t.id = s.id AND t.part = s.part", source_alias="s", target_alias="t")
            .when_matched_update_all()
            .when_not_matched_insert_all()
            .execute()
        )


@dataclass(frozen=True)
class BulkSpec:
    """Version 0 inserts ``rows`` rows; version 1 updates all of them; version 2 merges new values into half.

    Versions 1 and 2 hold ``2 * rows`` and ``rows`` change rows, all in cdc files.
    """

    rows: int

    @property
    def name(self) -> str:
        """Directory name."""
        return f"bulk_{self.rows}_rows"

    def build(self, path: Path) -> tuple[int, int]:
        """Write the three versions; returns ``(1, 2)``."""
        rows = wide_rows(self.rows)
        write_deltalake(path, rows, configuration=CDF_ON)
        table = DeltaTable(path)
        table.update(updates={"value": "value + 1", "qty": "qty + 1"})
        half = rows.slice(0, self.rows // 2)
        source = half.set_column(3, "value", pc.multiply(half.column("value"), 2.0))
        table.merge(source, "t.id = s.id", source_alias="s", target_alias="t").when_matched_update_all().execute()
        return 1, 2
