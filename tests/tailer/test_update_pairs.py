"""A commit's update images read for a sink that pairs them: both images of a key side by side in one batch.

The table is written by ``deltalake`` with CDF on: 4 partitions of 400 rows, then one UPDATE of every
row. delta-rs writes each cdc file's pre-images first and its post-images after them, so the two
images of a row are 400 rows apart in the writer's order. The reference is deltalake's ``load_cdf``.
"""

from __future__ import annotations

import datetime as dt
import itertools
import random
from collections import Counter
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake

from deltatail.state.cursor import Position
from deltatail.state.errors import ConfigError
from deltatail.state.feed import ChangeBatch
from deltatail.tailer.read import net_changes as net_changes_module
from deltatail.tailer.read.feed import ChangeFeed, ChangeOptions
from deltatail.tailer.read.net_changes import in_pass
from deltatail.tailer.read.update_pairs import pair_batches, pair_cuts, paired_order

ROWS = 1_600
PRE, POST = "update_preimage", "update_postimage"


@pytest.fixture(scope="module")
def updated(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, int]:
    """The table and the version of its UPDATE of every row (``2 * ROWS`` cdc rows in 4 files)."""
    root = tmp_path_factory.mktemp("pairs") / "t"
    ids = range(ROWS)
    rows = pa.table({"id": pa.array(ids, pa.int64()), "p": pa.array([i % 4 for i in ids], pa.int64())})
    rows = rows.append_column("v", pa.array([f"v{i}" for i in ids], pa.string()))
    write_deltalake(str(root), rows, partition_by=["p"], configuration={"delta.enableChangeDataFeed": "true"})
    DeltaTable(str(root)).update(updates={"v": "concat(v, '+')"})
    return root, DeltaTable(str(root)).version()


def _reference(root: Path, version: int) -> Counter[tuple[Any, ...]]:
    table = pa.table(DeltaTable(str(root)).load_cdf(starting_version=version, ending_version=version).read_all())
    return Counter((r["id"], r["p"], r["v"], r["_change_type"]) for r in table.to_pylist())


def _read(root: Path, version: int, **options: Any) -> list[ChangeBatch]:
    return list(ChangeFeed(str(root), options=ChangeOptions(read_ahead=0, **options)).batches(version, version))


def _split_pairs(batches: list[ChangeBatch]) -> int:
    """Keys whose pre- and post-image are not in the same batch."""
    where: dict[tuple[int, str], int] = {}
    for n, batch in enumerate(batches):
        for row in batch.rows.to_pylist():
            where[(row["id"], row["_change_type"])] = n
    return sum(where[(i, PRE)] != where[(i, POST)] for i, _ in where if _ == PRE)


@pytest.mark.parametrize("passes", [1, 3], ids=["one-pass", "three-passes"])
def test_both_images_of_every_key_are_side_by_side_in_one_batch(
    updated: tuple[Path, int], monkeypatch: pytest.MonkeyPatch, passes: int
) -> None:
    root, version = updated
    plan = next(ChangeFeed(str(root)).plans(version, version))
    total = sum(t.size or 0 for t in plan.tasks)
    monkeypatch.setattr(net_changes_module, "NET_PASS_BYTES", -(-total // passes))
    assert net_changes_module.net_passes(plan.tasks) == passes
    batches = _read(root, version, batch_size=7, pair_key=("id",))
    rows = [r for b in batches for r in b.rows.to_pylist()]
    assert Counter((r["id"], r["p"], r["v"], r["_change_type"]) for r in rows) == _reference(root, version)
    # Every pre-image is followed at once by its key's post-image, in the same batch.
    kinds = [r["_change_type"] for r in rows]
    assert kinds == [PRE, POST] * ROWS
    assert all(rows[i]["id"] == rows[i + 1]["id"] for i in range(0, len(rows), 2))
    assert _split_pairs(batches) == 0
    assert max(len(b) for b in batches) == 8  # 7 rows, one more where the 7th would leave its partner behind
    # Positions count the reordered rows, and a second read gives the same rows at the same positions.
    assert [b.start.index for b in batches[1:]] == [b.end.index for b in batches[:-1]]
    again = _read(root, version, batch_size=7, pair_key=("id",))
    assert [(b.start, b.rows.to_pylist()) for b in again] == [(b.start, b.rows.to_pylist()) for b in batches]


def test_in_the_writers_order_small_batches_separate_the_images(updated: tuple[Path, int]) -> None:
    root, version = updated
    assert _split_pairs(_read(root, version, batch_size=7)) == ROWS


def test_a_commit_that_fits_in_one_batch_keeps_the_writers_order(updated: tuple[Path, int]) -> None:
    root, version = updated
    plain = [r for b in _read(root, version) for r in b.rows.to_pylist()]
    paired = _read(root, version, pair_key=("id",))
    assert len(paired) == 1 and paired[0].rows.to_pylist() == plain


def test_a_pair_key_the_table_does_not_have_is_refused(updated: tuple[Path, int]) -> None:
    root, version = updated
    with pytest.raises(ConfigError, match="no column nope") as e:
        _read(root, version, batch_size=7, pair_key=("nope",))
    assert e.value.version == version and str(root) in str(e.value)


def test_paired_order_follows_the_encoders_rule() -> None:
    """A second waiting pre-image of a key replaces the first, which stays where it was, unpaired."""
    kinds = ["insert", PRE, PRE, "delete", POST, POST, PRE]
    keys = [b"a", b"k", b"k", b"d", b"k", b"j", b"j"]
    order, firsts = paired_order(kinds, keys)
    assert order == [0, 1, 2, 4, 3, 6, 5]  # post-image j first in the writer's order: the pre-image leads
    assert firsts == {2, 5}


@pytest.mark.parametrize("coded", [False, True], ids=["change-type-strings", "change-type-coded"])
@pytest.mark.parametrize("key_type", ["string", "int", "uint64", "timestamp", "two columns"])
@pytest.mark.parametrize("seed", range(6))
def test_batches_follow_the_rule_whether_keys_repeat_or_not(seed: int, key_type: str, coded: bool) -> None:
    """Random images of random keys (each key once a kind: matched by key codes; repeated images of a key: the
    rule in Python): the rows come in :func:`paired_order` of the rule, and no batch ends between a pair's images.
    ``_change_type`` as read, or dictionary-coded as a pass holds it (``tailer/read/pass_rows.py``)."""
    rng = random.Random(seed)
    if seed % 2:  # 400 images of 60 keys
        kinds = [rng.choice([PRE, POST, "insert", "delete"]) for _ in range(400)]
        numbers = [rng.randrange(60) for _ in range(400)]
    else:  # 150 updated keys, 60 keys with one image only, 100 inserted or deleted ones, shuffled
        pairs = [(kind, i) for i in range(150) for kind in (PRE, POST)]
        pairs += [(PRE if i % 2 else POST, i) for i in range(150, 210)]
        pairs += [(rng.choice(["insert", "delete"]), i) for i in range(210, 310)]
        rng.shuffle(pairs)
        kinds, numbers = [k for k, _ in pairs], [i for _, i in pairs]
    n = len(kinds)
    if key_type == "string":
        columns: dict[str, list[object]] = {"k": [f"k{i}" for i in numbers]}
    elif key_type == "int":
        columns = {"k": [i * 7919 - 10**12 for i in numbers]}  # a wide range: codes by hashing, not offsets
    elif key_type == "uint64":  # above int64's range: their 64 bits are the key
        columns = {"k": pa.array([2**64 - 1 - i * 7919 for i in numbers], pa.uint64())}
    elif key_type == "timestamp":
        columns = {"k": pa.array([i * 10**9 for i in numbers], pa.timestamp("us", "UTC"))}
    else:
        columns = {"k": [i % 7 for i in numbers], "j": [f"j{i // 7}" for i in numbers]}
    change_types = pa.array(kinds, pa.string())
    rows = pa.table(
        {**columns, "_change_type": change_types.dictionary_encode() if coded else change_types, "row": range(n)}
    )
    columns = {c: rows.column(c).to_pylist() for c in columns}
    batches = list(pair_batches(rows, tuple(columns), 5))
    got = [r["row"] for b in batches for r in b.to_pylist()]
    order, firsts = paired_order(kinds, [repr([columns[c][i] for c in columns]).encode() for i in range(n)])
    assert got == order
    assert firsts, "no pair at all: the case proves nothing"
    ends = set(itertools.accumulate(b.num_rows for b in batches))
    assert not any(first + 1 in ends for first in firsts)


def _rule_pairs(kinds: list[str], keys: list[bytes], offset: int = 0) -> set[tuple[int, int]]:
    """The rows (plus ``offset``) of each pair the rule makes among ``kinds`` and ``keys``."""
    order, firsts = paired_order(kinds, keys)
    return {(order[f] + offset, order[f + 1] + offset) for f in firsts}


@pytest.mark.parametrize("seed", range(6))
def test_cut_slices_pair_the_images_the_whole_batch_pairs(seed: int) -> None:
    """Cuts never separate a pair: the rule makes the same pairs slice by slice as over the whole batch;
    every slice but the last has at least ``size`` rows; with a key imaged twice one way, no cut."""
    rng = random.Random(seed)
    kinds: list[str] = []
    numbers: list[int] = []
    for i in range(300):  # some pairs side by side, some far apart, lone images, inserts
        shape = rng.choice(["adjacent", "adjacent", "apart", "lone", "insert"])
        if shape == "adjacent":
            kinds += [PRE, POST] if rng.random() < 0.5 else [POST, PRE]
            numbers += [i, i]
        elif shape == "apart":
            at = rng.randrange(max(0, len(kinds) - 30), len(kinds) + 1)  # up to 30 rows apart
            kinds[at:at] = [PRE]
            numbers[at:at] = [i]
            kinds.append(POST)
            numbers.append(i)
        else:
            kinds.append(rng.choice([PRE, POST]) if shape == "lone" else "insert")
            numbers.append(i)
    rows = pa.table({"k": pa.array(numbers, pa.int64()), "_change_type": kinds})
    keys = [str(n).encode() for n in numbers]
    cuts = pair_cuts(rows, ("k",), 40)
    bounds = [0, *cuts, len(kinds)]
    assert len(cuts) > 1, "no cut: the case proves nothing"
    assert all(b - a >= 40 for a, b in itertools.pairwise(bounds[:-1]))
    sliced = set().union(*(_rule_pairs(kinds[a:b], keys[a:b], a) for a, b in itertools.pairwise(bounds)))
    assert sliced == _rule_pairs(kinds, keys)
    twice = rows.append_column("j", pa.array([0] * len(kinds))).select(["j", "_change_type"])
    assert pair_cuts(twice, ("j",), 40) == []  # one key imaged many times: only the rule in order decides
    assert pair_cuts(rows, ("k",), len(kinds)) == []


@pytest.mark.parametrize("column", ["id", "day", "name"])
def test_pair_passes_split_rows_by_key(column: str) -> None:
    """Each row is in exactly one of the passes a paired commit is read in (``--net-changes``' passes,
    :func:`pass_ids`), and every row of a key in the same one, for integer, date and string keys."""
    ids = [i % 500 - 250 for i in range(2_000)]
    batch = pa.record_batch(
        {
            "id": pa.array(ids, pa.int64()),
            "day": pa.array([dt.date(2024, 1, 1) + dt.timedelta(days=i) for i in ids], pa.date32()),
            "name": pa.array([f"n{i}" for i in ids], pa.string()),
        }
    )
    parts = [in_pass(batch, (column,), 5, which).column("id").to_pylist() for which in range(5)]
    assert sorted(i for part in parts for i in part) == sorted(ids)
    assert all(len(part) > 200 for part in parts)  # none empty or nearly: the hash spreads the keys
    homes = [{i for i in part} for part in parts]
    assert all(not (a & b) for a, b in itertools.combinations(homes, 2))


def test_a_cursor_of_row_order_3_inside_a_paired_commit_reads_it_in_that_orders_passes(
    updated: tuple[Path, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Row order 3 paired a commit in passes of 4 MiB (halved in order 4): a cursor saved in
    order 3 inside a paired commit reads the commit in order 3's passes, so the rows keep the positions the
    cursor counted. Order 3's read is the current reading with its pass size; the current passes (two
    here, three in order 3) order the rows differently."""
    root, version = updated
    plan = next(ChangeFeed(str(root)).plans(version, version))
    total = sum(t.size or 0 for t in plan.tasks)
    options = ChangeOptions(read_ahead=0, batch_size=7, pair_key=("id",))

    def read(feed: ChangeFeed) -> list[tuple[object, list[dict[str, Any]]]]:
        return [(b.start, b.rows.to_pylist()) for b in feed.batches(version, version)]

    monkeypatch.setattr(net_changes_module, "NET_PASS_BYTES", -(-total // 3))
    as_order_3 = read(ChangeFeed(str(root), options=options))
    monkeypatch.setitem(net_changes_module.PASS_BYTES_OF_ORDER, 3, -(-total // 3))
    monkeypatch.setattr(net_changes_module, "NET_PASS_BYTES", -(-total // 2))
    current = read(ChangeFeed(str(root), options=options))
    assert [rows for _, rows in current] != [rows for _, rows in as_order_3]  # else the case proves nothing

    resumed = ChangeFeed(str(root), options=options)
    resumed.adopt_row_order(Position.change(version, 10), 3)
    assert resumed.earlier_order(version) == (version, 3)
    assert read(resumed) == as_order_3
