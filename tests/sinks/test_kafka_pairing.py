"""The Kafka encoder's update pairing: events built column-wise against the rule applied row by row.

The rule (``sinks/kafka/pairing.py``): in row order, an image of a key pairs with the waiting image of
the other kind of that key; a second waiting image of one kind replaces the first. ``_paired`` applies
it in Python, row by row, and is the reference here; ``events`` builds the same events column-wise
when no key has two images of one kind, and falls back to the rule otherwise.
"""

from __future__ import annotations

import random

import pyarrow as pa
import pytest

from deltatail.sinks.kafka import pairing
from deltatail.state.cursor import Position
from deltatail.state.feed import ChangeBatch

PRE, POST = "update_preimage", "update_postimage"


def _batch(kinds: list[str], keys: list[str]) -> ChangeBatch:
    rows = pa.record_batch({"k": keys, "_change_type": kinds})
    return ChangeBatch(Position.change(3, 0), rows)


def _as_lists(events: pairing.Events) -> tuple[object, ...]:
    def plain(value: object) -> object:
        return value.to_pylist() if isinstance(value, pa.Array) else value

    return tuple(
        plain(v) for v in (events.rows, events.change_types, events.op, events.old, events.before, events.after)
    )


def _random_images(rng: random.Random, repeats: bool) -> tuple[list[str], list[str]]:
    """Shuffled images: update pairs, lone pre- or post-images, inserts and deletes; with ``repeats``, some keys
    have two images of one kind."""
    images = [(kind, f"k{i}") for i in range(rng.randrange(0, 40)) for kind in (PRE, POST)]
    images += [(rng.choice([PRE, POST]), f"lone{i}") for i in range(rng.randrange(0, 10))]
    images += [(rng.choice(["insert", "delete"]), f"other{i}") for i in range(rng.randrange(0, 10))]
    if repeats:
        images += [(PRE, "k0"), (POST, "k0"), (POST, "twice"), (POST, "twice")]
    rng.shuffle(images)
    return [k for k, _ in images], [key for _, key in images]


@pytest.mark.parametrize(("seed", "repeats"), [(seed, False) for seed in range(40)] + [(s, True) for s in range(10)])
def test_events_are_the_rules_and_built_column_wise_unless_a_key_repeats_a_kind(seed: int, repeats: bool) -> None:
    kinds, keys = _random_images(random.Random(seed), repeats=repeats)
    batch = _batch(kinds, keys)
    texts = pa.array(keys, pa.string())
    column_wise = pairing._matched(batch, kinds, texts, "c")
    assert (column_wise is None) == repeats  # without repeats, the column-wise path is the one checked
    assert _as_lists(pairing.events(batch, kinds, texts)) == _as_lists(pairing._paired(kinds, keys, "c"))


def test_a_pair_in_either_order_is_one_u_event_at_its_later_image() -> None:
    kinds = [POST, "insert", PRE, PRE, "delete", POST]
    keys = ["a", "b", "a", "c", "d", "c"]
    events = pairing.events(_batch(kinds, keys), kinds, pa.array(keys))
    assert events.rows == [1, 2, 4, 5]
    assert events.change_types == ["insert", "update", "delete", "update"]
    assert isinstance(events.op, pa.Array) and events.op.to_pylist() == ["c", "u", "d", "u"]
    assert events.before is not None and events.before.to_pylist() == [None, 2, 4, 3]
    assert events.after is not None and events.after.to_pylist() == [1, 0, None, 5]
