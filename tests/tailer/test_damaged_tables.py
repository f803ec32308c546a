"""Damaged copies of real corpus tables: the unchanged answer or one clean error, never a traceback or a hang.

Each damage (see ``damage.py``) is one change to one file of an undamaged copy of a corpus table
(made once; the file is put back after each damage, and the copy checked equal to the table before
each): a commit file truncated, cut by a byte, emptied, deleted or bit-flipped (at JSON structure characters and at
seeded random offsets); a checkpoint part, sidecar, data, cdc or deletion-vector file deleted,
emptied, truncated or bit-flipped (in its Parquet footer and at random offsets); a ``_last_checkpoint``
that is deleted, garbage or lies (a version past the log, one without a checkpoint, three parts, a
bad checksum...). On each copy ``deltatail snapshot --json`` and ``deltatail changes`` run through the
command line's entry point (with the default reader processes) and must give either

- exit code 0 and byte for byte the undamaged copy's output (a damage deltatail routes around: an
  older checkpoint, the commits, a lying hint ignored), or
- exit code 1 and exactly one ``deltatail: error:`` line ending stderr (warnings may precede it),

never an exception escaping ``main`` (a traceback), no answer within a minute (a hang), or exit 0 with
a different answer. A different answer is accepted only where the damage made a *valid* file that
says something else, as an independent reader shows: the ``json`` module parses the flipped commit
into other actions, or ``pyarrow.parquet`` reads the flipped Parquet file into another table (Parquet
and JSON carry no checksums: no reader can tell such a file from the real one); or where the newest
commit was deleted (the log of the table as it was before that commit).

The default run damages the first file of every kind of each table; ``DELTATAIL_DAMAGE_SWEEP=1``
runs every file of every kind (at most 8 a kind on the large tables; 1,712 damages, two commands
each on an undamaged copy: a few minutes, mostly reading checkpoints and data; the commands share one
argument parser, see ``damage.py``).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py (tests/ is not a package)
from corpus import corpus_table
from damage import Damage, classify, damages, pristine_outcomes, run_damage

#: The tables damaged, with what they bring.
TABLES: dict[str, str] = {
    "delta-rs/table_with_deletion_logs": "deletion vector files, classic checkpoints 10 and 20, _last_checkpoint",
    "kernel-rs/cdf-table-with-cdc-and-dvs": "cdc files, packed deletion vectors, 26 commits",
    "delta-golden/multi-part-checkpoint/delta": "a two-part checkpoint, _last_checkpoint",
    "kernel-rs/v2-checkpoints-parquet-with-sidecars": "V2 Parquet checkpoints with Parquet sidecars",
    "kernel-rs/v2-checkpoints-json-with-sidecars": "V2 JSON checkpoints with sidecars",
    "kernel-rs/unshredded-variant": "variant columns (nested), a checkpoint with variant statistics",
    "delta-spark/variant-stats-no-checkpoint": "shredded variant columns",
    "dat/multi_partitioned/delta": "three partition columns, null and escaped partition values",
}

COMMANDS = [["snapshot", "{}", "--json"], ["changes", "{}"]]
SWEEP = os.environ.get("DELTATAIL_DAMAGE_SWEEP", "").strip() == "1"


def _check(table: str, chosen: list[Damage], tmp_path: Path) -> None:
    source = corpus_table(table)
    pristine = pristine_outcomes(source, tmp_path, COMMANDS)
    problems: list[str] = []
    for damage in chosen:
        problems += run_damage(damage, source, tmp_path, COMMANDS, pristine)
    assert not problems, f"{len(problems)} of {len(chosen)} damages went wrong:\n" + "\n\n".join(problems)


@pytest.mark.slow
@pytest.mark.parametrize("table", list(TABLES))
def test_the_first_file_of_each_kind_damaged_every_way(table: str, tmp_path: Path) -> None:
    chosen = damages(table, corpus_table(table), per_kind=1)
    kinds = {classify(d.file) for d in chosen}
    assert {"commit", "data", "last_checkpoint"} & kinds
    _check(table, chosen, tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(not SWEEP, reason="every file damaged every way takes minutes: set DELTATAIL_DAMAGE_SWEEP=1")
@pytest.mark.parametrize("table", list(TABLES))
def test_every_file_damaged_every_way(table: str, tmp_path: Path) -> None:
    _check(table, damages(table, corpus_table(table), per_kind=8), tmp_path)


def test_the_kinds_of_damage_cover_the_brief() -> None:
    """Log, checkpoint, sidecar, DV, cdc and data files, and _last_checkpoint, are each damaged somewhere."""
    kinds: dict[str, set[str]] = {}
    for table in TABLES:
        for d in damages(table, corpus_table(table), per_kind=1):
            kinds.setdefault(classify(d.file), set()).add(d.kind.split(" (")[0].split(" flipped")[0])
    assert set(kinds) == {"commit", "checkpoint", "sidecar", "dv", "cdc", "data", "last_checkpoint"}
    for kind in ("commit", "checkpoint", "sidecar", "dv", "cdc", "data"):
        assert {"deleted", "emptied", "truncated"} <= kinds[kind], kind
    assert any(k.startswith("lies") for k in kinds["last_checkpoint"])
