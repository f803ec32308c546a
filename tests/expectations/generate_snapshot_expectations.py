"""Generate ``snapshot_expectations.json``: the live files of every corpus table at every readable version.

Run from the repository root::

    .venv/bin/python tests/expectations/generate_snapshot_expectations.py

Nothing here imports deltatail: the expectations must come from sources independent of the code
under test. Three sources are combined, and every table records which ones it rests on:

1. **deltalake 1.6.6** (delta-rs, the only independent Delta reader available offline). For every
   version, ``DeltaTable(root, version=v).get_add_actions()`` gives the live paths (as stored in
   the log, i.e. still percent-encoded; decoded here with ``urllib.parse.unquote``, once, as the
   protocol says). deltalake does not expose deletion-vector descriptors, so:
2. **a reference log replay written here from the protocol text** (``_Replay`` below; JSON commits
   read with :mod:`json`, checkpoints, multi-part checkpoints, V2 checkpoints and sidecars with
   :mod:`pyarrow.parquet`). It supplies the DV unique ids (``storageType + pathOrInlineDv
   [+ '@' + offset]``) and predicts which versions must fail: a hole between log files below the
   version and above every usable checkpoint (VersionGapError), commits cleaned up before the
   first file with no checkpoint to cover them (VersionNotFoundError), no protocol or metaData in
   the segment (InvalidLogError), reader version or features deltatail does not support
   (UnsupportedFeatureError). A ``metaData`` without ``schemaString`` is *not* a snapshot error
   (schemas are parsed lazily, as Delta's own readers do); such versions are listed in
   ``schemaless_versions``. Its path set must equal deltalake's wherever deltalake opens the
   version, or the generator reports the table and exits non-zero (unless it is in OVERRIDES).
3. **cross-checks against peer-authored data**: DAT ``expected/<vN|latest>/table_content.parquet``,
   delta-golden ``expected/`` and DAT ``parquet/table_content.parquet`` row counts must equal the sum
   of live files' ``numRecords`` minus their DV cardinalities; deltalake's materialised DVs
   (``DeltaTable.deletion_vectors()``) must delete exactly ``cardinality`` rows of exactly the
   files the replay gives a DV; live data files must exist on disk for tables whose data is
   present (which also proves the percent-decoding).

Overrides (tables where deltalake is known to be wrong) are listed in :data:`OVERRIDES` with the
peer-authored truth they come from.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.dataset as pads
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from corpus import find_corpus, read_manifest

OUT = Path(__file__).resolve().parent / "snapshot_expectations.json"

#: Reader features deltatail claims (state/features.py), copied so that no deltatail import is needed.
#: Used only to *predict* UnsupportedFeatureError; the test's EXPECTED_ERRORS table is checked against it.
SUPPORTED_READER_FEATURES = frozenset(
    {
        "columnMapping",
        "deletionVectors",
        "timestampNtz",
        "v2Checkpoint",
        "vacuumProtocolCheck",
        "typeWidening",
        "typeWidening-preview",
        "variantType",
        "variantType-preview",
        "variantShredding",
        "variantShredding-preview",
    }
)

#: Tables whose truth is not what deltalake reports, with the peer-authored truth.
#: Maps table path -> (reason, {version: [(decoded path, dv id), ...]}).
OVERRIDES: dict[str, tuple[str, dict[int, list[tuple[str, str | None]]]]] = {
    "delta-golden/canonicalized-paths-normal-a/delta": (
        "Delta Spark golden test (manifest notes: 'the remove must cancel the add (expected: v1, no files)'): "
        "remove path file:/some/... canonicalizes to the add path /some/...; deltalake does not canonicalize "
        "(keeps 1 file at v1)",
        {0: [("/some/unqualified/absolute/path", None)], 1: []},
    ),
    "delta-golden/canonicalized-paths-normal-b/delta": (
        "Delta Spark golden test (manifest notes: expected v1, no files): remove path file:///some/... "
        "canonicalizes to the add path /some/...; deltalake does not canonicalize (keeps 1 file at v1)",
        {0: [("/some/unqualified/absolute/path", None)], 1: []},
    ),
    "delta-golden/canonicalized-paths-special-a/delta": (
        "Delta Spark golden test (manifest notes: expected v1, no files): remove file:/some/unqualified/"
        "with%20space/p@%23h canonicalizes to the add /some/unqualified/with%20space/p@%23h (decoded: "
        "'with space/p@#h'); deltalake does not canonicalize (keeps 1 file at v1)",
        {0: [("/some/unqualified/with space/p@#h", None)], 1: []},
    ),
    "delta-golden/canonicalized-paths-special-b/delta": (
        "Delta Spark golden test (manifest notes: expected v1, no files): remove file:///some/unqualified/"
        "with%20space/p@%23h canonicalizes to the add path; deltalake does not canonicalize (keeps 1 file at v1)",
        {0: [("/some/unqualified/with space/p@#h", None)], 1: []},
    ),
}

#: Delta Spark test tables whose DV files carry an unrecorded ``test%dv%prefix-`` (MANIFEST.md): deltalake
#: can only materialise their DVs from a patched copy (prefix stripped, absolute-path template filled in).
DV_PREFIX_TABLES = frozenset(
    {
        "delta-spark/table-with-dv-small",
        "delta-spark/table-with-dv-large",
        "delta-spark/partitioned-table-with-dv-large",
        "delta-spark/table-with-dv-special-char",
    }
)

_COMMIT = re.compile(r"^(\d{20})\.json$")
_CKPT_CLASSIC = re.compile(r"^(\d{20})\.checkpoint\.parquet$")
_CKPT_MULTI = re.compile(r"^(\d{20})\.checkpoint\.(\d{10})\.(\d{10})\.parquet$")
_CKPT_V2 = re.compile(r"^(\d{20})\.checkpoint\.[0-9a-fA-F-]{36}\.(json|parquet)$")

Key = tuple[str, str | None]


# --------------------------------------------------------------------------------------------------
# Reference log replay (from the protocol text; independent of deltatail)
# --------------------------------------------------------------------------------------------------


def dv_unique_id(dv: dict[str, Any] | None) -> str | None:
    """Protocol: ``uniqueId = storageType + pathOrInlineDv`` plus ``'@' + offset`` when offset is present."""
    if not dv:
        return None
    base = f"{dv['storageType']}{dv['pathOrInlineDv']}"
    off = dv.get("offset")
    return base if off is None else f"{base}@{int(off)}"


def num_records(action: dict[str, Any]) -> int | None:
    stats = action.get("stats")
    if isinstance(stats, str) and stats:
        n = json.loads(stats).get("numRecords")
        if n is not None:
            return int(n)
    parsed = action.get("stats_parsed")
    if isinstance(parsed, dict) and parsed.get("numRecords") is not None:
        return int(parsed["numRecords"])
    return None


@dataclass
class FileInfo:
    raw_path: str
    num_records: int | None
    dv_cardinality: int


@dataclass
class State:
    """Reconciled state at one version: live files by key, and the effective protocol and metadata."""

    version: int
    files: dict[Key, FileInfo] = field(default_factory=dict)
    protocol: dict[str, Any] | None = None
    metadata: dict[str, Any] | None = None
    how: str = ""

    def copy(self) -> State:
        return State(self.version, dict(self.files), self.protocol, self.metadata, self.how)


def _rows(table: pa.Table) -> list[dict[str, Any]]:
    return [{k: v for k, v in row.items() if v is not None} for row in table.to_pylist()]


def _read_actions(path: Path) -> list[dict[str, Any]]:
    if path.suffix == ".json":
        return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return _rows(pq.read_table(path))


class _Replay:
    """Replay of one table's ``_delta_log`` by listing; every readable version's state and the unreadable ones."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.log = root / "_delta_log"
        self.commits: dict[int, Path] = {}
        self.checkpoints: dict[int, list[Path]] = {}
        self.notes: list[str] = []
        parts: dict[tuple[int, int], list[tuple[int, Path]]] = {}
        for p in sorted(self.log.iterdir()) if self.log.is_dir() else []:
            if m := _COMMIT.match(p.name):
                self.commits[int(m.group(1))] = p
            elif m := _CKPT_CLASSIC.match(p.name):
                self.checkpoints.setdefault(int(m.group(1)), [p])
            elif m := _CKPT_V2.match(p.name):
                self.checkpoints[int(m.group(1))] = [p]  # V2 wins over a classic one of the same version
            elif m := _CKPT_MULTI.match(p.name):
                parts.setdefault((int(m.group(1)), int(m.group(3))), []).append((int(m.group(2)), p))
        for (v, n), got in parts.items():
            if sorted(i for i, _ in got) == list(range(1, n + 1)):
                self.checkpoints.setdefault(v, [p for _, p in sorted(got)])
            else:
                self.notes.append(f"incomplete multi-part checkpoint at v{v} ignored")

    def _checkpoint_state(self, version: int) -> State:
        actions: list[dict[str, Any]] = []
        for part in self.checkpoints[version]:
            actions.extend(_read_actions(part))
        for a in list(actions):
            if "sidecar" in a:
                actions.extend(_read_actions(self.log / "_sidecars" / unquote(a["sidecar"]["path"])))
        st = State(version, how=f"checkpoint {version}")
        for a in actions:
            if "add" in a:
                add = a["add"]
                dv = add.get("deletionVector")
                key = (unquote(add["path"]), dv_unique_id(dv))
                st.files[key] = FileInfo(add["path"], num_records(add), int(dv["cardinality"]) if dv else 0)
            elif "protocol" in a:
                st.protocol = a["protocol"]
            elif "metaData" in a:
                st.metadata = a["metaData"]
        return st

    @staticmethod
    def _apply(st: State, version: int, actions: list[dict[str, Any]]) -> State:
        nxt = st.copy()
        nxt.version = version
        adds = [a["add"] for a in actions if "add" in a]
        removes = [a["remove"] for a in actions if "remove" in a]
        for r in removes:
            nxt.files.pop((unquote(r["path"]), dv_unique_id(r.get("deletionVector"))), None)
        for add in adds:
            dv = add.get("deletionVector")
            nxt.files[(unquote(add["path"]), dv_unique_id(dv))] = FileInfo(
                add["path"], num_records(add), int(dv["cardinality"]) if dv else 0
            )
        for a in actions:
            if "protocol" in a:
                nxt.protocol = a["protocol"]
            if "metaData" in a:
                nxt.metadata = a["metaData"]
        return nxt

    def states(self) -> tuple[dict[int, State], dict[int, tuple[str, str]]]:
        """Readable versions -> state (as a reader would build it), and unreadable versions -> why."""
        commit_actions = {v: _read_actions(p) for v, p in self.commits.items()}
        existing = sorted(set(self.commits) | set(self.checkpoints))
        chains: dict[int, State] = {}
        # From version 0 by commits alone.
        if 0 in commit_actions:
            st = State(-1, how="commits from 0")
            v = 0
            while v in commit_actions:
                st = self._apply(st, v, commit_actions[v])
                chains[v] = st
                v += 1
        json_chain = dict(chains)
        # From each checkpoint (a reader uses the newest checkpoint <= v whose following commits are all there).
        for c in sorted(self.checkpoints):
            try:
                st = self._checkpoint_state(c)
            except (OSError, pa.ArrowException, json.JSONDecodeError, KeyError) as e:
                self.notes.append(f"checkpoint {c} unreadable ({type(e).__name__}), ignored")
                continue
            if c in json_chain:
                js = json_chain[c]
                if set(js.files) != set(st.files):
                    self.notes.append(f"checkpoint {c} live set differs from replaying commits 0..{c}")
            chains[c] = st
            v = c + 1
            while v in commit_actions:
                st = self._apply(st, v, commit_actions[v])
                st.how = f"checkpoint {c} + commits {c + 1}..{v}"
                chains[v] = st
                v += 1
        unreadable: dict[int, tuple[str, str]] = {}
        first_file = existing[0] if existing else 0
        for v in existing:
            if v in chains:
                continue
            missing = [m for m in range(v) if m not in commit_actions]
            if all(m < first_file for m in missing):
                # Every missing commit precedes the oldest file in the log: it was cleaned up, nothing is torn.
                unreadable[v] = (
                    "VersionNotFoundError",
                    f"the log starts at version {first_file} with no checkpoint at or below {v}: "
                    f"commits {missing[0]}..{missing[-1]} were cleaned up",
                )
            else:
                holes = [m for m in missing if m > first_file]
                unreadable[v] = (
                    "VersionGapError",
                    f"no checkpoint <= {v} is followed by contiguous commits up to {v}: commit(s) {holes[:3]} "
                    "missing between files that are present",
                )
        return chains, unreadable


def predicted_error(st: State) -> tuple[str, str] | tuple[str, str, list[str]] | None:
    """The deltatail error class a correct reader must raise for this state, from the protocol text."""
    p, m = st.protocol, st.metadata
    if p is None:
        return "InvalidLogError", f"no protocol action in the log segment for version {st.version} ({st.how})"
    if m is None:
        return "InvalidLogError", f"no metaData action in the log segment for version {st.version} ({st.how})"
    rv = int(p.get("minReaderVersion", 0))
    if rv < 1 or rv > 3:
        return "UnsupportedFeatureError", f"minReaderVersion {rv} (readers support 1..3)"
    if rv == 3:
        bad = sorted(set(p.get("readerFeatures") or []) - SUPPORTED_READER_FEATURES)
        if bad:
            return "UnsupportedFeatureError", f"unsupported reader features {bad}", bad
    # A metaData without schemaString (a required field) is not a snapshot error: Delta's own readers parse the
    # schema lazily, and the delta-golden tables written that way are read by Delta's golden tests (only deltalake
    # refuses them). The versions are listed in "schemaless_versions": their schema must fail, not the snapshot.
    return None


# --------------------------------------------------------------------------------------------------
# deltalake
# --------------------------------------------------------------------------------------------------


def _arrow(obj: Any) -> pa.Table:
    return obj if isinstance(obj, pa.Table) else pa.table(obj)


@dataclass
class PeerVersion:
    paths: set[str] | None  # decoded
    error: str | None
    protocol: dict[str, Any] | None = None
    metadata_id: str | None = None
    dv_deleted: dict[str, int] | None = None  # decoded path -> deleted rows, from materialised DVs
    dv_error: str | None = None


def _dv_deleted(dt: Any, table_uri: str) -> dict[str, int]:
    batches = _arrow(dt.deletion_vectors())
    out: dict[str, int] = {}
    prefix = table_uri.rstrip("/") + "/"
    for row in batches.to_pylist():
        fp: str = row["filepath"]
        rel = fp[len(prefix) :] if fp.startswith(prefix) else fp
        out[unquote(rel)] = sum(1 for keep in row["selection_vector"] if not keep)
    return out


def _patched_copy(root: Path, tmp: Path) -> Path:
    """A copy of a DV-prefix table that a spec reader can read (see MANIFEST.md 'Test-only file-name prefixes')."""
    dst = tmp / root.name
    shutil.copytree(root, dst)
    for f in list(dst.rglob("test%dv%prefix-*.bin")):
        f.rename(f.with_name(f.name.removeprefix("test%dv%prefix-")))
    folder = dst / "folder&with%special char"
    for commit in (dst / "_delta_log").glob("*.json"):
        text = commit.read_text(encoding="utf-8")
        if "{{FOLDER_WITH_SPECIAL_CHAR}}" in text:
            url_folder = quote(str(folder))
            text = text.replace("file:{{FOLDER_WITH_SPECIAL_CHAR}}", f"file://{url_folder}")
            text = text.replace("test%25dv%25prefix-", "")
            commit.write_text(text, encoding="utf-8")
    return dst


def peer_versions(table: str, root: Path, versions: Iterable[int]) -> dict[int, PeerVersion]:
    from deltalake import DeltaTable

    out: dict[int, PeerVersion] = {}
    with tempfile.TemporaryDirectory() as tmpd:
        patched: Path | None = None
        for v in versions:
            try:
                dt = DeltaTable(str(root), version=v)
                paths = {unquote(p) for p in _arrow(dt.get_add_actions()).column("path").to_pylist()}
                proto = dt.protocol()
                pv = PeerVersion(
                    paths=paths,
                    error=None,
                    protocol={
                        "min_reader_version": proto.min_reader_version,
                        "min_writer_version": proto.min_writer_version,
                        "reader_features": sorted(proto.reader_features) if proto.reader_features else None,
                        "writer_features": sorted(proto.writer_features) if proto.writer_features else None,
                    },
                    metadata_id=str(dt.metadata().id),
                )
            except Exception as e:  # deltalake raises several unrelated types
                out[v] = PeerVersion(paths=None, error=f"{type(e).__name__}: {' '.join(str(e).split())[:150]}")
                continue
            try:
                src = dt
                if table in DV_PREFIX_TABLES:
                    if patched is None:
                        patched = _patched_copy(root, Path(tmpd))
                    src = DeltaTable(str(patched), version=v)
                pv.dv_deleted = _dv_deleted(src, src.table_uri)
            except Exception as e:
                pv.dv_error = f"{type(e).__name__}: {' '.join(str(e).split())[:120]}"
            out[v] = pv
    return out


# --------------------------------------------------------------------------------------------------
# Peer-authored row counts
# --------------------------------------------------------------------------------------------------


def expected_row_counts(corpus: Path, entry: dict[str, Any], latest: int | None) -> dict[int, tuple[int, str]]:
    """Version -> (row count, source file) from peer-authored expected content."""
    out: dict[int, tuple[int, str]] = {}
    exp = entry.get("expected")
    if not exp:
        return out
    base = corpus / exp
    if base.is_file():  # dat/my_external_table/parquet/table_content.parquet; kernel-rs FFI .expected text dumps
        if latest is not None and base.suffix == ".parquet":
            out[latest] = (pq.read_metadata(base).num_rows, exp)
        return out
    if not base.is_dir():
        return out
    if entry["source"] == "dat":
        for d in sorted(base.iterdir()):
            f = d / "table_content.parquet"
            if not f.is_file():
                continue
            if d.name == "latest" and latest is not None:
                out.setdefault(latest, (pq.read_metadata(f).num_rows, f"{exp}/latest"))
            elif re.fullmatch(r"v\d+", d.name):
                out[int(d.name[1:])] = (pq.read_metadata(f).num_rows, f"{exp}/{d.name}")
    elif entry["source"] == "delta-golden" and latest is not None:
        n = pads.dataset(base, format="parquet").count_rows()
        out[latest] = (n, exp)
    return out


def dat_protocols(corpus: Path, entry: dict[str, Any]) -> dict[int, tuple[int, int]]:
    out: dict[int, tuple[int, int]] = {}
    if entry["source"] != "dat" or not entry.get("expected"):
        return out
    for f in sorted((corpus / entry["expected"]).glob("v*/table_version_metadata.json")):
        d = json.loads(f.read_text(encoding="utf-8"))
        out[int(d["version"])] = (int(d["min_reader_version"]), int(d["min_writer_version"]))
    return out


# --------------------------------------------------------------------------------------------------
# Main
# --------------------------------------------------------------------------------------------------


def _row_count(root: Path, info: FileInfo) -> int | None:
    """A live file's row count: its ``numRecords`` stat, else its parquet footer (if the file is present)."""
    if info.num_records is not None:
        return info.num_records
    f = root / unquote(info.raw_path)
    return pq.read_metadata(f).num_rows if f.is_file() else None


def _key_json(k: Key) -> list[str | None]:
    return [k[0], k[1]]


def build_table(corpus: Path, entry: dict[str, Any], problems: list[str]) -> dict[str, Any]:
    table = entry["path"]
    root = corpus / table
    rec: dict[str, Any] = {}
    if not (root / "_delta_log").is_dir():
        rec["source"] = "listing"
        rec["source_detail"] = "no _delta_log directory: not a Delta table"
        rec["versions"] = {}
        rec["version_errors"] = {}
        rec["schemaless_versions"] = []
        rec["latest_error"] = ["TableNotFoundError", "no _delta_log directory"]
        rec["checks"] = []
        return rec
    replay = _Replay(root)
    states, unreadable = replay.states()
    all_versions = sorted(set(states) | set(unreadable))
    latest = max(all_versions) if all_versions else None
    peer = peer_versions(table, root, sorted(states))
    counts = expected_row_counts(corpus, entry, latest)
    dat_proto = dat_protocols(corpus, entry)
    override = OVERRIDES.get(table)
    data_present = entry.get("data_files_present") == "all"

    versions: dict[str, Any] = {}
    version_errors: dict[str, list[Any]] = {}
    checks: list[str] = []
    disagreements: list[str] = []
    peer_failed: list[str] = []
    dv_checked: list[int] = []
    schemaless: list[int] = []
    for v in all_versions:
        if v in unreadable:
            version_errors[str(v)] = list(unreadable[v])
            continue
        st = states[v]
        err = predicted_error(st)
        pv = peer[v]
        if err is not None:
            version_errors[str(v)] = list(err)
            if pv.error is None:
                checks.append(f"v{v}: deltalake 1.6.6 opens it; deltatail must refuse it: {err[0]} ({err[1]})")
            continue
        if st.metadata is not None and not st.metadata.get("schemaString"):
            schemaless.append(v)
        keys = sorted(st.files, key=lambda k: (k[0], k[1] or ""))
        replay_paths = {k[0] for k in keys}
        if len(replay_paths) != len(keys):
            problems.append(f"{table} v{v}: one path live with two DVs in the replay")
        if override is not None:
            continue
        if pv.error is not None:
            peer_failed.append(f"v{v}: {pv.error}")
        elif pv.paths is not None and pv.paths != replay_paths:
            disagreements.append(
                f"v{v}: deltalake-only {sorted(pv.paths - replay_paths)[:3]}, replay-only "
                f"{sorted(replay_paths - pv.paths)[:3]}"
            )
        versions[str(v)] = [_key_json(k) for k in keys]
        # DV cross-check against deltalake's materialised deletion vectors.
        if pv.error is None:
            with_dv = {k[0]: st.files[k].dv_cardinality for k in keys if k[1] is not None}
            if pv.dv_deleted is not None:
                if pv.dv_deleted != with_dv:
                    problems.append(
                        f"{table} v{v}: DV cardinalities {with_dv} != deltalake deleted rows {pv.dv_deleted}"
                    )
                elif with_dv:
                    dv_checked.append(v)
            elif with_dv:
                checks.append(f"v{v}: DVs not materialisable by deltalake ({pv.dv_error})")
        # Row counts against peer-authored expected content.
        if v in counts:
            n, src = counts[v]
            recs = [_row_count(root, st.files[k]) for k in keys]
            if None in recs:
                checks.append(f"v{v}: row count vs {src}: n/a (a live file has neither stats nor a readable footer)")
            else:
                got = sum(r for r in recs if r is not None) - sum(st.files[k].dv_cardinality for k in keys)
                if got != n:
                    problems.append(f"{table} v{v}: live rows - DV cardinality = {got}, {src} has {n} rows")
                else:
                    checks.append(f"v{v}: live rows (numRecords or parquet footer) - DV cardinality = {n} = {src}")
        if v in dat_proto and pv.protocol is not None:
            want = dat_proto[v]
            got_p = (pv.protocol["min_reader_version"], pv.protocol["min_writer_version"])
            if want != got_p:
                problems.append(f"{table} v{v}: DAT protocol {want} != deltalake {got_p}")
        if data_present and v == latest:  # older versions' files may be vacuumed
            missing = [k[0] for k in keys if not (root / k[0]).exists()]
            if missing:
                problems.append(f"{table} v{v}: decoded live paths missing on disk: {missing[:3]}")

    if override is not None:
        reason, by_version = override
        rec["source"] = "override"
        rec["source_detail"] = reason
        for v, ks in sorted(by_version.items()):
            versions[str(v)] = [_key_json(k) for k in sorted(ks, key=lambda k: (k[0], k[1] or ""))]
    elif not versions:
        rec["source"] = "none"
        rec["source_detail"] = "no version can be read (see version_errors)"
    elif peer_failed and len(peer_failed) == len(versions):
        rec["source"] = "log-replay"
        rec["source_detail"] = (
            "reference log replay only: deltalake 1.6.6 cannot open any version ("
            + "; ".join(peer_failed[:2])
            + ")"
            + (
                "; metaData lacks schemaString, which Delta's own readers (and the delta-golden tests that use "
                "these tables) only need when the schema is read"
                if schemaless
                else ""
            )
        )
    elif peer_failed:
        rec["source"] = "deltalake-1.6.6+log-replay"
        rec["source_detail"] = (
            "paths from deltalake 1.6.6 where it opens the version, else the reference log replay ("
            + "; ".join(peer_failed[:3])
            + "); DV ids from the log"
        )
    else:
        rec["source"] = "deltalake-1.6.6"
        rec["source_detail"] = (
            "live paths from deltalake 1.6.6 get_add_actions() at every version (percent-decoded), equal to the "
            "reference log replay; DV unique ids from the log replay (deltalake does not expose them)"
        )
    if disagreements:
        problems.append(f"{table}: deltalake and the log replay disagree: {disagreements[:3]}")
    if data_present and str(latest) in versions and override is None:
        checks.append(f"v{latest}: every live path (decoded) exists under the table root")
    if dv_checked:
        patched = " (on a copy with the test%dv%prefix- DV file names fixed)" if table in DV_PREFIX_TABLES else ""
        checks.append(
            f"versions {dv_checked}: deltalake's materialised DVs{patched} delete exactly the logged DV "
            "cardinality of exactly the files that have a DV in the expectation"
        )
    rec["versions"] = versions
    rec["version_errors"] = version_errors
    rec["schemaless_versions"] = schemaless
    latest_err = version_errors.get(str(latest)) if latest is not None else None
    rec["latest_version"] = latest
    rec["earliest_version"] = min((int(v) for v in versions), default=None)
    rec["latest_error"] = latest_err
    if latest is not None and latest in peer and peer[latest].error is None and latest_err is None:
        rec["deltalake_latest"] = {"protocol": peer[latest].protocol, "metadata_id": peer[latest].metadata_id}
    rec["checks"] = checks + [f"replay: {n}" for n in replay.notes]
    return rec


def dump(doc: dict[str, Any]) -> str:
    """JSON with one line per table version (reviewable diffs without one line per file)."""
    lines = ["{"]
    head = {k: v for k, v in doc.items() if k != "tables"}
    for k, v in head.items():
        lines.append(f"  {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)},")
    lines.append('  "tables": {')
    tables = list(doc["tables"].items())
    for ti, (name, rec) in enumerate(tables):
        lines.append(f"    {json.dumps(name)}: {{")
        items = list(rec.items())
        for ii, (k, v) in enumerate(items):
            comma = "," if ii < len(items) - 1 else ""
            if k in ("versions", "version_errors") and v:
                lines.append(f"      {json.dumps(k)}: {{")
                vs = list(v.items())
                for vi, (ver, val) in enumerate(vs):
                    c2 = "," if vi < len(vs) - 1 else ""
                    lines.append(f"        {json.dumps(ver)}: {json.dumps(val, ensure_ascii=False)}{c2}")
                lines.append(f"      }}{comma}")
            else:
                lines.append(f"      {json.dumps(k)}: {json.dumps(v, ensure_ascii=False)}{comma}")
        lines.append("    }" + ("," if ti < len(tables) - 1 else ""))
    lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main() -> int:
    import deltalake

    corpus = find_corpus()
    if corpus is None:
        print("corpus not found", file=sys.stderr)
        return 2
    problems: list[str] = []
    tables: dict[str, Any] = {}
    for entry in read_manifest(corpus):
        tables[entry["path"]] = build_table(corpus, entry, problems)
        rec = tables[entry["path"]]
        print(
            f"{entry['path']}: {rec['source']}, {len(rec['versions'])} versions, "
            f"errors {sorted(rec['version_errors'])}",
            file=sys.stderr,
        )
    doc = {
        "_doc": (
            "Expected live files (percent-decoded path relative to the table root, DV unique id or null) of every "
            "corpus table at every readable version, and the versions a correct reader must refuse. Generated by "
            "tests/expectations/generate_snapshot_expectations.py (see its docstring for the sources); do not edit "
            "by hand: fix the generator or its OVERRIDES and re-run it."
        ),
        "generator": "tests/expectations/generate_snapshot_expectations.py",
        "deltalake_version": deltalake.__version__,
        "tables": tables,
    }
    OUT.write_text(dump(doc), encoding="utf-8")
    json.loads(OUT.read_text(encoding="utf-8"))
    for p in problems:
        print("PROBLEM:", p, file=sys.stderr)
    print(f"wrote {OUT} ({len(tables)} tables, {len(problems)} problems)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
