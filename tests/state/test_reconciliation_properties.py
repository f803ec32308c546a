"""Property tests of log replay against a reference model written from the protocol text.

Protocol, "Action Reconciliation": "Logical files in a table are identified by their (path,
deletionVector.uniqueId) primary key ... To replay the log, scan all file actions and keep only the
newest reference for each logical file. add actions in the result identify logical files currently
present in the table ... remove actions in the result identify tombstones". "The latest protocol
action seen wins", "the latest metaData action seen wins", "the latest version seen for a given
appId wins"; the newer revision: the latest domainMetadata per domain wins and ``removed`` hides it.

The generator respects the single-commit rules ("at most one file action of the same type for any
path", no add and remove of the same (path, DV) tuple), so within a commit no two file actions share
a key and "newest" is well defined whatever order the actions are written in; the order is shuffled.

Property 1: incremental replay equals the model after every commit.
Property 2: a checkpoint at any version k (the reconciled state written back as actions) followed
by commits k+1.. gives the same state as the full replay.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from deltatail.state.actions import (
    Action,
    Add,
    DeletionVector,
    DomainMetadata,
    Format,
    Metadata,
    Protocol,
    Remove,
    Txn,
)
from deltatail.state.commit import Commit
from deltatail.state.files import FileKey, FileTable, PartitionValuesPool
from deltatail.state.snapshot import Snapshot

PATHS = ("a.parquet", "b=1/c.parquet", "d e.parquet", "f.parquet")
APPS = ("app-1", "app-2")
DOMAINS = ("delta.rowTracking", "app.x", "app.y")

# Raw descriptors: (storageType, pathOrInlineDv, offset). Index 0 means "no DV".
DV_SPECS: tuple[tuple[str, str, int | None] | None, ...] = (
    None,
    ("i", "wi5b=000010000siXQKl0rr91000f55c8Xg0@@D72lkbi5=-{L", None),
    ("u", "ab^-aqEH.-t@S}K{vb[*k^", 4),
    ("u", "ab^-aqEH.-t@S}K{vb[*k^", 45),
)

PROTOCOLS = (Protocol(1, 2), Protocol(3, 7, frozenset({"deletionVectors"}), frozenset({"deletionVectors"})))
SCHEMA = '{"type":"struct","fields":[{"name":"x","type":"long","nullable":true,"metadata":{}}]}'


def spec_unique_id(dv_index: int) -> str | None:
    """The protocol's uniqueId: <storageType><pathOrInlineDv>, then @<offset> when there is one."""
    spec = DV_SPECS[dv_index]
    if spec is None:
        return None
    storage, value, offset = spec
    return storage + value if offset is None else f"{storage}{value}@{offset}"


# -- generated commits, as plain data -------------------------------------------------------------


@dataclass(frozen=True)
class FileOp:
    kind: str  # "add" or "remove"
    path: str
    dv_index: int
    info: int  # size of an add, deletionTimestamp of a remove


@dataclass(frozen=True)
class GenCommit:
    file_ops: tuple[FileOp, ...]
    txns: tuple[tuple[str, int], ...]
    domains: tuple[tuple[str, str, bool], ...]
    protocol: int | None
    metadata: str | None


def _metadata(config: str) -> Metadata:
    return Metadata(id="t", schema_string=SCHEMA, partition_columns=(), configuration={"gen": config}, format=Format())


def _dv(dv_index: int) -> DeletionVector | None:
    spec = DV_SPECS[dv_index]
    if spec is None:
        return None
    storage, value, offset = spec
    return DeletionVector(storage, value, size_in_bytes=40, cardinality=6, offset=offset)


def _to_action(op: FileOp) -> Action:
    if op.kind == "add":
        return Add(
            path=op.path,
            partition_values={"k": str(op.info % 3)},
            size=op.info,
            modification_time=1000 + op.info,
            data_change=True,
            deletion_vector=_dv(op.dv_index),
        )
    return Remove(path=op.path, deletion_timestamp=op.info, data_change=True, deletion_vector=_dv(op.dv_index))


def to_commit(version: int, gen: GenCommit, order: list[int]) -> Commit:
    actions: list[Action] = []
    if gen.protocol is not None:
        actions.append(PROTOCOLS[gen.protocol])
    if gen.metadata is not None:
        actions.append(_metadata(gen.metadata))
    actions += [Txn(app, v) for app, v in gen.txns]
    actions += [DomainMetadata(d, c, r) for d, c, r in gen.domains]
    file_actions = [_to_action(op) for op in gen.file_ops]
    actions += [file_actions[i] for i in order]
    return Commit.from_actions(version, actions)  # also checks that the generator obeys the rules


_dv_choice = st.none() | st.integers(0, len(DV_SPECS) - 1)


@st.composite
def gen_commit(draw: st.DrawFn) -> tuple[GenCommit, list[int]]:
    ops: list[FileOp] = []
    for path in PATHS:
        add_dv, remove_dv = draw(st.tuples(_dv_choice, _dv_choice).filter(lambda t: t[0] is None or t[0] != t[1]))
        if remove_dv is not None:
            ops.append(FileOp("remove", path, remove_dv, draw(st.integers(1, 10**6))))
        if add_dv is not None:
            ops.append(FileOp("add", path, add_dv, draw(st.integers(1, 10**6))))
    txns = draw(st.dictionaries(st.sampled_from(APPS), st.integers(0, 50), max_size=2))
    domains = draw(
        st.dictionaries(
            st.sampled_from(DOMAINS), st.tuples(st.sampled_from(['{"v":1}', '{"v":2}', ""]), st.booleans()), max_size=3
        )
    )
    gen = GenCommit(
        file_ops=tuple(ops),
        txns=tuple(sorted(txns.items())),
        domains=tuple((d, c, r) for d, (c, r) in sorted(domains.items())),
        protocol=draw(st.none() | st.integers(0, len(PROTOCOLS) - 1)),
        metadata=draw(st.none() | st.sampled_from(["m1", "m2", "m3"])),
    )
    order = draw(st.permutations(list(range(len(ops)))))
    return gen, order


@st.composite
def histories(draw: st.DrawFn) -> list[tuple[GenCommit, Commit]]:
    """Commit 0 holds protocol + metadata (and possibly files, txns, domains), then up to 12 more."""
    zero, zero_order = draw(gen_commit())
    zero = GenCommit(zero.file_ops, zero.txns, zero.domains, protocol=0, metadata="m0")
    rest = draw(st.lists(gen_commit(), max_size=12))
    history = [(zero, to_commit(0, zero, zero_order))]
    history += [(g, to_commit(v, g, order)) for v, (g, order) in enumerate(rest, start=1)]
    return history


# -- the reference model --------------------------------------------------------------------------


@dataclass
class Model:
    newest: dict[tuple[str, str | None], tuple[str, int]] = field(default_factory=dict)
    txns: dict[str, int] = field(default_factory=dict)
    domains: dict[str, str] = field(default_factory=dict)
    protocol: Protocol | None = None
    config: str | None = None

    def apply(self, gen: GenCommit) -> None:
        """Fold one generated commit in, straight from its plain-data description."""
        if gen.protocol is not None:
            self.protocol = PROTOCOLS[gen.protocol]
        if gen.metadata is not None:
            self.config = gen.metadata
        for app, version in gen.txns:
            self.txns[app] = version
        for name, configuration, removed in gen.domains:
            if removed:
                self.domains.pop(name, None)
            else:
                self.domains[name] = configuration
        # keys within one commit are distinct (generator rules), so the order here is immaterial
        for op in gen.file_ops:
            self.newest[(op.path, spec_unique_id(op.dv_index))] = (op.kind, op.info)

    def live(self) -> dict[FileKey, int]:
        return {FileKey(p, dv): info for (p, dv), (kind, info) in self.newest.items() if kind == "add"}

    def tombstones(self) -> dict[FileKey, int]:
        return {FileKey(p, dv): info for (p, dv), (kind, info) in self.newest.items() if kind == "remove"}


def assert_matches(snapshot: Snapshot, model: Model) -> None:
    live = {entry.key: entry.size for entry in snapshot.live_files()}
    assert live == model.live()
    assert {entry.key: entry.timestamp for entry in snapshot.tombstones} == model.tombstones()
    assert snapshot.txns == model.txns
    assert {name: d.configuration for name, d in snapshot.domains.items()} == model.domains
    assert snapshot.protocol == model.protocol
    assert snapshot.metadata is not None
    assert snapshot.metadata.configuration["gen"] == model.config


# -- properties -----------------------------------------------------------------------------------


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(histories())
def test_incremental_replay_matches_the_model(history: list[tuple[GenCommit, Commit]]) -> None:
    snapshot = Snapshot.empty("tbl")
    model = Model()
    for gen, c in history:
        snapshot, applied = snapshot.apply(c)
        model.apply(gen)
        assert snapshot.version == c.version
        assert applied.commit is c
        assert_matches(snapshot, model)
    snapshot.require_valid()


def checkpoint(snapshot: Snapshot) -> Snapshot:
    """Write the reconciled state back as actions and load it as a checkpoint at the same version."""
    actions: list[Action] = []
    assert snapshot.protocol is not None
    assert snapshot.metadata is not None
    actions += [snapshot.protocol, snapshot.metadata]
    actions += [Txn(app, version) for app, version in snapshot.txns.items()]
    actions += list(snapshot.domains.values())
    for e in snapshot.live_files():
        actions.append(
            Add(
                path=e.path,
                partition_values=e.partition_values or {},
                size=e.size or 0,
                modification_time=e.timestamp or 0,
                data_change=False,
                deletion_vector=e.deletion_vector,
            )
        )
    for e in snapshot.tombstones:
        actions.append(
            Remove(
                path=e.path,
                deletion_timestamp=e.timestamp,
                data_change=False,
                partition_values=e.partition_values,
                size=e.size,
                deletion_vector=e.deletion_vector,
            )
        )
    c = Commit.from_actions(snapshot.version, actions, check_duplicates=False)
    pool = PartitionValuesPool()
    files, tombstones = FileTable(pool), FileTable(pool)
    for a in c.adds:
        files.put_add(a)
    for r in c.removes:
        tombstones.put_remove(r)
    return Snapshot.from_checkpoint(
        "tbl",
        c.version,
        c.protocol,
        c.metadata,
        {t.app_id: t.version for t in c.txns},
        {d.domain: d for d in c.domain_metadata},
        files,
        tombstones,
    )


@pytest.mark.slow
@settings(max_examples=300, deadline=None)
@given(st.data(), histories())
def test_checkpoint_then_tail_equals_full_replay(data: st.DataObject, history: list[tuple[GenCommit, Commit]]) -> None:
    commits = [c for _, c in history]
    k = data.draw(st.integers(0, len(commits) - 1), label="checkpoint version")
    full = Snapshot.empty("tbl").apply_all(commits)
    model = Model()
    for gen, _ in history:
        model.apply(gen)

    at_k = Snapshot.empty("tbl").apply_all(commits[: k + 1])
    resumed = checkpoint(at_k).apply_all(commits[k + 1 :])

    assert resumed.version == full.version == len(commits) - 1
    assert_matches(full, model)
    assert_matches(resumed, model)
    # the surviving file entries carry the same information either way
    for key in full.live_keys():
        assert resumed.files.get(key) == full.files.get(key)
    for entry in full.tombstones:
        assert resumed.tombstones.get(entry.key) == entry
