"""The soak test's writer: a seeded life of a Delta table, written by deltalake in a process of its own.

``python soak_writer.py TABLE TRUTH SEED OPERATIONS PAUSE`` makes ``OPERATIONS`` operations
(appends, deletes, updates, merges, OPTIMIZE, checkpoints, VACUUM with the retention check off,
log cleanup, an added column, a property change, a RESTORE), chosen by ``SEED``. After each it
appends the table's rows at its version to ``TRUTH`` (JSON lines ``{"version", "rows"}``, rows
as ``[id, v]``): the ground truth, read before VACUUM or cleanup can take it. Before operation
``PAUSE`` it creates ``TABLE.paused`` and waits for ``TABLE.stopped`` (the tailer is down), then
rewrites every row, vacuums and cleans the log up past the tailer, and creates ``TABLE.gap``.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from pathlib import Path

import pyarrow as pa
from deltalake import DeltaTable, write_deltalake

PROPERTIES = {"delta.enableChangeDataFeed": "true", "delta.logRetentionDuration": "interval 1 hour"}
HOUR_NS = 3_600 * 10**9


def rows(ids: list[int], rng: random.Random) -> pa.Table:
    return pa.table({"id": pa.array(ids, pa.int64()), "v": pa.array([rng.randrange(1000) for _ in ids], pa.int64())})


class Life:
    def __init__(self, root: Path, truth: Path, seed: int) -> None:
        self.root, self.uri, self.truth = root, str(root), truth.open("a")
        self.rng = random.Random(seed)
        self.next_id = 0
        self.restored = False
        self.widened = False

    def record(self) -> None:
        table = DeltaTable(self.uri)
        data = table.to_pyarrow_table(columns=["id", "v"])
        pairs = sorted(zip(data.column("id").to_pylist(), data.column("v").to_pylist(), strict=True))
        self.truth.write(json.dumps({"version": table.version(), "rows": pairs}) + "\n")
        self.truth.flush()

    def new_ids(self, n: int) -> list[int]:
        self.next_id += n
        return list(range(self.next_id - n, self.next_id))

    def some_id(self) -> int:
        return self.rng.randrange(max(self.next_id, 1))

    def vacuum_and_clean(self) -> None:
        """VACUUM with the retention check off, then a checkpoint and log cleanup of every older commit."""
        table = DeltaTable(self.uri)
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
        table = DeltaTable(self.uri)
        table.create_checkpoint()
        for file in (self.root / "_delta_log").iterdir():  # commits and older checkpoints alike, so that the
            # cleanup's last checkpoint to keep is the new one, whichever rule of deltalake's picks it
            if file.name[:20].isdigit() and int(file.name[:20]) < table.version():  # older than logRetentionDuration
                old = file.stat().st_mtime_ns - 2 * HOUR_NS
                os.utime(file, ns=(old, old))
        table.cleanup_metadata()

    def step(self) -> None:
        op = self.rng.choices(
            ["append", "delete", "update", "merge", "optimize", "checkpoint", "vacuum", "widen", "property", "restore"],
            weights=[30, 12, 12, 12, 4, 4, 1, 1, 1, 1],
        )[0]
        table = DeltaTable(self.uri)
        if op == "append" or self.next_id < 10:
            write_deltalake(
                self.uri, rows(self.new_ids(self.rng.randint(1, 5)), self.rng), mode="append", schema_mode="merge"
            )
        elif op == "delete":
            low = self.some_id()
            table.delete(f"id >= {low} and id < {low + 3}")
        elif op == "update":
            low = self.some_id()
            table.update(predicate=f"id >= {low} and id < {low + 4}", updates={"v": "v + 1"})
        elif op == "merge":
            ids = [self.some_id() for _ in range(3)] + self.new_ids(2)
            source = rows(sorted(set(ids)), self.rng)
            (
                table.merge(source, "t.id = s.id", source_alias="s", target_alias="t")
                .when_matched_update(updates={"v": "s.v"})
                .when_not_matched_insert(updates={"id": "s.id", "v": "s.v"})
                .execute()
            )
        elif op == "optimize":
            table.optimize.compact()
        elif op == "checkpoint":
            table.create_checkpoint()
        elif op == "vacuum":
            self.vacuum_and_clean()
        elif op == "widen" and not self.widened:  # an added column
            self.widened = True
            extra = rows(self.new_ids(2), self.rng).append_column("w", pa.array(["x", "y"]))
            write_deltalake(self.uri, extra, mode="append", schema_mode="merge")
        elif op == "property":
            table.alter.set_table_properties({"delta.deletedFileRetentionDuration": "interval 2 days"})
        elif op == "restore" and not self.restored:
            self.restored = True  # an append undone: no file it brings back can have been vacuumed
            write_deltalake(self.uri, rows(self.new_ids(2), self.rng), mode="append", schema_mode="merge")
            self.record()
            DeltaTable(self.uri).restore(DeltaTable(self.uri).version() - 1)
        self.record()

    def gap(self) -> None:
        """Everything rewritten, vacuumed and the log cleaned up while the tailer is stopped."""
        Path(f"{self.root}.paused").touch()
        while not Path(f"{self.root}.stopped").exists():
            time.sleep(0.05)
        DeltaTable(self.uri).update(updates={"v": "v + 1000"})
        self.record()
        self.vacuum_and_clean()
        self.record()
        Path(f"{self.root}.gap").touch()


def main() -> None:
    root, truth, seed, operations, pause = Path(sys.argv[1]), Path(sys.argv[2]), *map(int, sys.argv[3:6])
    life = Life(root, truth, seed)
    write_deltalake(life.uri, rows(life.new_ids(10), life.rng), configuration=PROPERTIES)
    life.record()
    for i in range(operations):
        if i == pause:
            life.gap()
        life.step()
        time.sleep(0.05)  # a live table, not a bulk load: the tailer keeps up between its deaths


if __name__ == "__main__":
    main()
    sys.stdout.flush()
    os._exit(0)  # deltalake's runtime threads can abort a normal interpreter exit ("terminate called ...")
