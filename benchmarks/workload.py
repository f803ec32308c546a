"""Synthetic but valid Delta tables and commits for the benchmarks.

Two kinds of workload:

- *On disk* (:func:`generate_table`): a log-only Delta table — commit 0 holds
  ``protocol`` + ``metaData`` (two columns, partitioned by the string column
  ``part``) and the first batch of ``add`` actions, later commits add further
  batches, then a real writer (``deltalake``) writes the checkpoint, then
  ``tail_commits`` commits each replace one file (one ``remove``, one ``add``).
  Data files are never written: neither deltatail nor ``deltalake`` opens them
  to load a snapshot.
- *In memory* (:class:`SyntheticFiles`): parsed :class:`~state.actions.Add` /
  :class:`~state.actions.Remove` actions grouped into :class:`~state.commit.Commit`
  objects, to drive :meth:`state.snapshot.Snapshot.apply` without any I/O.

Everything is seeded, so a given spec always produces the same paths.
"""

from __future__ import annotations

import random
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
from deltalake import DeltaTable

from deltatail.state.actions import Add, CommitInfo, Format, Metadata, Protocol, Remove
from deltatail.state.commit import Commit

PARTITION_COLUMN = "part"
SCHEMA_STRING = orjson.dumps(
    {
        "type": "struct",
        "fields": [
            {"name": "id", "type": "long", "nullable": True, "metadata": {}},
            {"name": PARTITION_COLUMN, "type": "string", "nullable": True, "metadata": {}},
        ],
    }
).decode()
_VARIANT = "89ab"
BASE_TIME_MS = 1_700_000_000_000
"""Epoch milliseconds of commit 0 (November 2023); later commits are a second apart."""


@dataclass(frozen=True, slots=True)
class TableSpec:
    """The shape of a generated table."""

    files: int
    """Live files at the checkpoint."""
    tail_commits: int
    """Commits after the checkpoint, each removing one file and adding one."""
    files_per_commit: int = 5_000
    partitions: int = 100
    seed: int = 0


@dataclass
class GeneratedTable:
    """A table written by :func:`generate_table`, with what is needed to append more commits."""

    root: Path
    spec: TableSpec
    checkpoint_version: int
    latest_version: int
    live: deque[tuple[str, int]] = field(repr=False)
    """Live ``(path, partition index)`` pairs, oldest first (the next commit removes the oldest)."""
    rng: random.Random = field(repr=False)

    @property
    def log_dir(self) -> Path:
        """The ``_delta_log`` directory."""
        return self.root / "_delta_log"

    def append_replace_commit(self) -> int:
        """Write the next commit: remove the oldest live file, add a new one. Returns its version."""
        version = self.latest_version + 1
        old_path, old_part = self.live.popleft()
        new_part = self.rng.randrange(self.spec.partitions)
        new_path = file_path(self.rng, new_part, writer=1)
        ts = commit_time(version)
        actions = [
            commit_info_action(ts, "WRITE", self.spec.partitions),
            remove_action(old_path, old_part, ts),
            add_action(self.rng, new_path, new_part, ts),
        ]
        write_commit(self.log_dir, version, actions)
        self.live.append((new_path, new_part))
        self.latest_version = version
        return version


# -- one action at a time --------------------------------------------------------------------------


def file_uuid(rng: random.Random) -> str:
    """A seeded random version-4 UUID string (formatted directly: ``uuid.UUID`` is several times slower)."""
    h = f"{rng.getrandbits(128):032x}"
    return f"{h[:8]}-{h[8:12]}-4{h[13:16]}-{_VARIANT[int(h[16], 16) & 3]}{h[17:20]}-{h[20:]}"


def file_path(rng: random.Random, part: int, writer: int = 0) -> str:
    """A Spark-style data file path, ~75 characters: ``part=<k>/part-<writer>-<uuid4>-c000.snappy.parquet``."""
    return f"{PARTITION_COLUMN}={part}/part-{writer:05d}-{file_uuid(rng)}-c000.snappy.parquet"


def commit_time(version: int) -> int:
    """The synthetic commit timestamp (epoch ms) of ``version``."""
    return BASE_TIME_MS + 1_000 * version


def stats_json(rng: random.Random) -> str:
    """A realistic ``stats`` string: record count, min/max and null counts of the data column."""
    low = rng.randrange(1_000_000_000)
    records = rng.randrange(50_000, 2_000_000)
    return orjson.dumps(
        {
            "numRecords": records,
            "minValues": {"id": low},
            "maxValues": {"id": low + records * 7},
            "nullCount": {"id": 0},
        }
    ).decode()


def add_action(rng: random.Random, path: str, part: int, ts: int) -> dict[str, Any]:
    """An ``add`` action object as a writer would log it."""
    return {
        "add": {
            "path": path,
            "partitionValues": {PARTITION_COLUMN: str(part)},
            "size": rng.randrange(8 << 20, 128 << 20),
            "modificationTime": ts,
            "dataChange": True,
            "stats": stats_json(rng),
        }
    }


def remove_action(path: str, part: int, ts: int) -> dict[str, Any]:
    """A ``remove`` action object with extended file metadata."""
    return {
        "remove": {
            "path": path,
            "deletionTimestamp": ts,
            "dataChange": True,
            "extendedFileMetadata": True,
            "partitionValues": {PARTITION_COLUMN: str(part)},
            "size": 64 << 20,
        }
    }


def commit_info_action(ts: int, operation: str, partitions: int) -> dict[str, Any]:
    """A ``commitInfo`` action."""
    return {
        "commitInfo": {
            "timestamp": ts,
            "operation": operation,
            "operationParameters": {"mode": "Append", "partitionBy": f'["{PARTITION_COLUMN}"]'},
            "isBlindAppend": operation == "WRITE",
            "engineInfo": "deltatail-benchmarks",
            "operationMetrics": {"numPartitions": str(partitions)},
        }
    }


def header_actions(table_id: str) -> list[dict[str, Any]]:
    """``protocol`` and ``metaData`` for commit 0."""
    return [
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {
            "metaData": {
                "id": table_id,
                "format": {"provider": "parquet", "options": {}},
                "schemaString": SCHEMA_STRING,
                "partitionColumns": [PARTITION_COLUMN],
                "configuration": {},
                "createdTime": BASE_TIME_MS,
            }
        },
    ]


def write_commit(log_dir: Path, version: int, actions: list[dict[str, Any]]) -> None:
    """Write ``actions`` as newline-delimited JSON commit ``version``."""
    body = b"\n".join(orjson.dumps(a) for a in actions) + b"\n"
    (log_dir / f"{version:020d}.json").write_bytes(body)


# -- whole tables ----------------------------------------------------------------------------------


def generate_table(root: Path, spec: TableSpec) -> GeneratedTable:
    """Write the table described by ``spec`` at ``root`` (which must not hold a table yet)."""
    rng = random.Random(spec.seed)
    log_dir = root / "_delta_log"
    log_dir.mkdir(parents=True)
    live: deque[tuple[str, int]] = deque()
    version = 0
    actions = header_actions(file_uuid(rng))
    while len(live) < spec.files or version == 0:
        ts = commit_time(version)
        batch = min(spec.files_per_commit, spec.files - len(live))
        actions.append(commit_info_action(ts, "WRITE", spec.partitions))
        for i in range(batch):
            part = (len(live) + i) % spec.partitions
            path = file_path(rng, part)
            actions.append(add_action(rng, path, part, ts))
            live.append((path, part))
        write_commit(log_dir, version, actions)
        actions = []
        version += 1
    checkpoint_version = version - 1
    DeltaTable(str(root)).create_checkpoint()
    table = GeneratedTable(root, spec, checkpoint_version, checkpoint_version, live, rng)
    for _ in range(spec.tail_commits):
        table.append_replace_commit()
    return table


# -- in memory -------------------------------------------------------------------------------------


class SyntheticFiles:
    """Parsed actions and commits for :meth:`~state.snapshot.Snapshot.apply`, without I/O.

    Partition-value maps and ``stats`` strings are drawn from small shared pools:
    each :class:`Add` looks like a parsed action, but building a million of them
    stays cheap. The snapshot keeps neither map objects nor stats.
    """

    def __init__(self, partitions: int = 100, seed: int = 1) -> None:
        self.rng = random.Random(seed)
        self.partitions = partitions
        self._values: list[dict[str, str | None]] = [{PARTITION_COLUMN: str(k)} for k in range(partitions)]
        self._stats = [stats_json(self.rng) for _ in range(256)]
        self.live: deque[str] = deque()
        self._count = 0

    def new_add(self, ts: int) -> Add:
        """A new file's ``add`` (the file is counted as live)."""
        part = self._count % self.partitions
        self._count += 1
        path = file_path(self.rng, part)
        self.live.append(path)
        return Add(
            path=path,
            partition_values=self._values[part],
            size=(8 << 20) + self.rng.getrandbits(26),
            modification_time=ts,
            data_change=True,
            stats=self._stats[self._count & 255],
        )

    def remove_oldest(self, ts: int) -> Remove:
        """The ``remove`` of the oldest live file."""
        path = self.live.popleft()
        part = path[len(PARTITION_COLUMN) + 1 : path.index("/")]
        return Remove(path, ts, True, True, {PARTITION_COLUMN: part}, 64 << 20)

    def bulk_commits(self, files: int, per_commit: int) -> Iterator[Commit]:
        """Commits 0, 1, ... adding ``files`` files in all; commit 0 also holds protocol and metadata."""
        version = 0
        added = 0
        while added < files or version == 0:
            batch = min(per_commit, files - added)
            ts = commit_time(version)
            adds = tuple(self.new_add(ts) for _ in range(batch))
            added += batch
            yield make_commit(version, adds, (), first=version == 0)
            version += 1

    def replace_commit(self, version: int) -> Commit:
        """Commit ``version``: remove the oldest live file, add a new one."""
        ts = commit_time(version)
        remove = self.remove_oldest(ts)
        return make_commit(version, (self.new_add(ts),), (remove,))


def make_commit(version: int, adds: tuple[Add, ...], removes: tuple[Remove, ...], *, first: bool = False) -> Commit:
    """A :class:`Commit` with a ``commitInfo``; ``first`` adds protocol and metadata."""
    protocol = Protocol(1, 2) if first else None
    metadata = Metadata("bench", SCHEMA_STRING, (PARTITION_COLUMN,), {}, format=Format()) if first else None
    info = CommitInfo({"timestamp": commit_time(version), "operation": "WRITE"})
    return Commit(version, protocol, metadata, adds, removes, (), (), (), info)
