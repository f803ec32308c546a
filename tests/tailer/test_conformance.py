"""Conformance of :class:`tailer.log.delta_log.DeltaLog` snapshots over every table of the shared corpus.

For every table in ``manifest.json`` (one test each, id = the table path):

- every version with an expectation in ``tests/expectations/snapshot_expectations.json`` builds, has
  ``snap.version`` equal to the version asked for, and has exactly the expected live
  ``FileKey(decoded path, DV unique id)`` set. The expectations come from deltalake 1.6.6 plus an
  independent log replay and peer-authored cross-checks (see ``generate_snapshot_expectations.py``;
  nothing there is computed by deltatail);
- every version the expectations say a correct reader must refuse raises that exact error class;
- the latest snapshot (``snapshot()`` with no version) is the newest version, its protocol
  reader/writer versions and metadata id equal deltalake's, and ``latest_version()`` and
  ``earliest_version()`` agree with the listing;
- tables in :data:`EXPECTED_ERRORS` raise exactly that class from ``DeltaLog(root).snapshot()``,
  with the table path in the message (and the unsupported features in ``.features``).

Deliberate behaviours encoded here (the corpus traps of MANIFEST.md):

- Log-only tables and tables whose data or DV files are missing or misnamed (the four delta-spark
  DV tables with the unrecorded ``test%dv%prefix-``, ``spark-variant-stable-feature-checkpoint``)
  still have snapshots: reconstruction reads only the log, never data or DV files.
- ``delta-golden/corrupted-last-checkpoint-kernel`` has an empty ``_last_checkpoint``: the reader
  falls back to listing, logs a warning, and every version is still exact.
- A commit gap *below* a usable checkpoint is harmless (``data_err_logs/table_b`` reads at 10..13,
  and at 0..6 from commit 0; 8 and 9 are VersionGapError); a gap *above* the newest usable
  checkpoint is a VersionGapError (``table_c`` at 13, ``versions-not-contiguous``) while versions
  below the gap still read (``table_c`` 0..11). A log whose first commits were cleaned up without
  a checkpoint to cover them cannot serve those versions (VersionNotFoundError), e.g.
  ``checkpoint_with_partitions`` at v1.
- Catalog-managed tables (commits past v0 only in ``_delta_log/_staged_commits``) are refused by
  the reader-feature gate (``catalogManaged`` / ``catalogOwned`` reader features).
- Path canonicalization: ``canonicalized-paths-*`` remove ``file:/x`` / ``file:///x`` to cancel
  the add of ``/x`` (Delta Spark's golden expectation, not deltalake's).
- A ``metaData`` without ``schemaString`` (a required field) does not stop the snapshot: the
  schema is parsed lazily, as Delta's own readers do (the delta-golden tables written that way,
  e.g. ``deltalog-commit-info``, ``corrupted-last-checkpoint``, ``update-deleted-directory``, are
  read by Delta's golden tests; only deltalake refuses them), so their live files come from the
  reference log replay, and ``snap.schema`` must raise InvalidLogError at those versions.
  ``delta-rs/delta-live-table`` has no schema at v0 and one at v1.
"""

from __future__ import annotations

import json
import logging
import sys
from functools import cache
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py (tests/ is not a package)
from corpus import corpus_root, manifest_paths, read_manifest

from deltatail.state.errors import (
    DeltaTailError,
    InvalidLogError,
    TableNotFoundError,
    UnsupportedFeatureError,
    VersionGapError,
    VersionNotFoundError,
)
from deltatail.state.files import FileKey
from deltatail.tailer.log.delta_log import DeltaLog

EXPECTATIONS = Path(__file__).resolve().parents[1] / "expectations" / "snapshot_expectations.json"

#: Tables whose latest snapshot must fail: table path -> (exact error class, why).
EXPECTED_ERRORS: dict[str, tuple[type[DeltaTailError], str]] = {
    # Reader-feature gate (deltalake refuses the catalog tables too). The seven variant tables are read since
    # issue #18: their live files are deltalake's; their rows are checked against Spark in test_variant_tables.py.
    "kernel-rs/table-with-geo": (UnsupportedFeatureError, "reader feature geospatial"),
    "kernel-rs/catalog_managed_0": (UnsupportedFeatureError, "catalogManaged; commits 1-2 only staged"),
    "delta-kernel-java/catalog-owned-preview": (UnsupportedFeatureError, "catalogManaged; commits 1-2 only staged"),
    "delta-kernel-java/workload-basic_catalog_managed/delta": (UnsupportedFeatureError, "catalogManaged; 2-3 staged"),
    "delta-rs/simple_table_features": (UnsupportedFeatureError, "minReaderVersion 5 (with readerFeatures)"),
    "delta-golden/deltalog-invalid-protocol-version/delta": (UnsupportedFeatureError, "minReaderVersion 99"),
    "delta-rs/data_err_logs/table_d": (UnsupportedFeatureError, "catalogOwned (delta-rs asserts open fails)"),
    "delta-rs/data_err_logs/table_e": (UnsupportedFeatureError, "catalogOwned (delta-rs asserts open fails)"),
    "delta-rs/data_err_logs/table_f": (UnsupportedFeatureError, "catalogOwned from v0 (delta-rs: open fails)"),
    "delta-rs/data_err_logs/table_h": (UnsupportedFeatureError, "catalogOwned in checkpoint 9999 (open fails)"),
    "delta-rs/data_err_logs/table_i": (UnsupportedFeatureError, "catalogOwned in checkpoint 9999 (open fails)"),
    # Broken logs. from-checkpoint-missing-*: checkpoint 10 lacks that action (versions 0-9 still read from commits).
    "delta-golden/deltalog-state-reconstruction-without-protocol/delta": (InvalidLogError, "no protocol action"),
    "delta-golden/deltalog-state-reconstruction-without-metadata/delta": (InvalidLogError, "no metaData action"),
    "delta-golden/deltalog-state-reconstruction-from-checkpoint-missing-protocol/delta": (InvalidLogError, "ckpt 10"),
    "delta-golden/deltalog-state-reconstruction-from-checkpoint-missing-metadata/delta": (InvalidLogError, "ckpt 10"),
    "delta-golden/data-reader-absolute-paths-escaped-chars/delta": (InvalidLogError, "no metaData action at all"),
    "delta-golden/no-delta-log-folder/delta": (TableNotFoundError, "no _delta_log directory"),
    # Version gaps above the newest usable checkpoint.
    "delta-golden/versions-not-contiguous/delta": (VersionGapError, "commit 1 missing, no checkpoint"),
    "delta-rs/data_err_logs/table_c": (VersionGapError, "commit 12 missing above checkpoint 10 (delta-rs: fails)"),
}

#: Tables without any expectation, with the reason (reported as skips). Keep empty: prefer an error or a
#: partial expectation.
SKIPPED: dict[str, str] = {}

#: Tables whose reading must log a warning (logger "deltatail"), with what it is about.
EXPECTED_WARNINGS: dict[str, str] = {
    "delta-golden/corrupted-last-checkpoint-kernel/delta": "_last_checkpoint",
}

ERROR_CLASSES: dict[str, type[DeltaTailError]] = {
    c.__name__: c
    for c in (InvalidLogError, TableNotFoundError, UnsupportedFeatureError, VersionGapError, VersionNotFoundError)
}


@cache
def expectations() -> dict[str, Any]:
    with EXPECTATIONS.open(encoding="utf-8") as f:
        tables: dict[str, Any] = json.load(f)["tables"]
    return tables


def _keys(raw: list[list[str | None]]) -> set[FileKey]:
    out: set[FileKey] = set()
    for path, dv in raw:
        assert path is not None
        out.add(FileKey(path, dv))
    return out


def _fmt(keys: set[FileKey], limit: int = 4) -> str:
    shown = sorted(keys, key=lambda k: (k.path, k.dv_id or ""))[:limit]
    more = f" (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(f"({k.path!r}, {k.dv_id!r})" for k in shown) + more


def _diff(version: int, want: set[FileKey], got: set[FileKey]) -> str:
    return (
        f"v{version}: live keys differ: missing {len(want - got)} [{_fmt(want - got)}], "
        f"unexpected {len(got - want)} [{_fmt(got - want)}]"
    )


def _check_error(root: Path, err: BaseException, cls: type[DeltaTailError], what: str) -> list[str]:
    problems: list[str] = []
    if type(err) is not cls:
        problems.append(f"{what}: raised {type(err).__name__} ({err}), expected exactly {cls.__name__}")
    elif str(root) not in str(err):
        problems.append(f"{what}: {cls.__name__} message does not name the table {root}: {err}")
    return problems


def test_expectations_cover_the_manifest() -> None:
    root = corpus_root()
    manifest = [e["path"] for e in read_manifest(root)]
    tables = expectations()
    assert sorted(tables) == sorted(manifest), "re-run tests/expectations/generate_snapshot_expectations.py"
    assert set(EXPECTED_ERRORS) <= set(manifest)
    assert set(SKIPPED) <= set(manifest)
    assert not set(SKIPPED) & set(EXPECTED_ERRORS)
    for path in manifest:
        rec = tables[path]
        predicted = rec["latest_error"][0] if rec["latest_error"] else None
        listed = EXPECTED_ERRORS[path][0].__name__ if path in EXPECTED_ERRORS else None
        assert predicted == listed, f"{path}: generator predicts {predicted} for the latest, EXPECTED_ERRORS {listed}"
        assert rec["versions"] or path in EXPECTED_ERRORS or path in SKIPPED, f"{path} has no expectation"


@pytest.mark.parametrize("table", manifest_paths())
def test_snapshots_match_expectations(table: str, caplog: pytest.LogCaptureFixture) -> None:
    root = corpus_root() / table
    if table in SKIPPED:
        pytest.skip(SKIPPED[table])
    rec = expectations()[table]
    problems: list[str] = []
    caplog.set_level(logging.WARNING, logger="deltatail")

    # Tables that must fail as a whole (latest snapshot).
    if table in EXPECTED_ERRORS:
        cls, why = EXPECTED_ERRORS[table]
        try:
            DeltaLog(str(root)).snapshot()
        except Exception as e:
            problems += _check_error(root, e, cls, f"latest snapshot ({why})")
            features = rec["latest_error"][2] if len(rec["latest_error"]) > 2 else None
            if features and isinstance(e, UnsupportedFeatureError) and set(e.features) != set(features):
                problems.append(f"latest snapshot: .features {sorted(e.features)} != expected {features}")
        else:
            problems.append(f"latest snapshot: no error, expected {cls.__name__} ({why})")

    log = DeltaLog(str(root))
    schemaless = set(rec["schemaless_versions"])
    # Every readable version, built once.
    for v_str, raw in rec["versions"].items():
        v = int(v_str)
        try:
            snap = log.snapshot(v)
        except Exception as e:
            problems.append(f"v{v}: {type(e).__name__}: {e}")
            continue
        if snap.version != v:
            problems.append(f"v{v}: snap.version is {snap.version}")
        if v in schemaless:
            try:
                snap.schema  # noqa: B018 - the property parses the schema
            except InvalidLogError:
                pass
            except Exception as e:
                problems.append(f"v{v}: schema of a metaData without schemaString: {type(e).__name__}: {e}")
            else:
                problems.append(f"v{v}: schema of a metaData without schemaString did not raise InvalidLogError")
        want, got = _keys(raw), snap.live_keys()
        if want != got:
            problems.append(_diff(v, want, got))

    # Versions a correct reader must refuse.
    for v_str, (cls_name, why, *_) in rec["version_errors"].items():
        v = int(v_str)
        cls = ERROR_CLASSES[cls_name]
        try:
            log.snapshot(v)
        except Exception as e:
            problems += _check_error(root, e, cls, f"v{v} ({why})")
        else:
            problems.append(f"v{v}: no error, expected {cls_name} ({why})")

    # The latest snapshot, and protocol/metadata against deltalake.
    if table not in EXPECTED_ERRORS:
        latest = rec["latest_version"]
        try:
            snap = log.snapshot()
            if snap.version != latest:
                problems.append(f"snapshot() is at version {snap.version}, the latest is {latest}")
            elif str(latest) in rec["versions"] and snap.live_keys() != _keys(rec["versions"][str(latest)]):
                problems.append("snapshot(): " + _diff(latest, _keys(rec["versions"][str(latest)]), snap.live_keys()))
            peer = rec.get("deltalake_latest")
            if peer is not None:
                pp = peer["protocol"]
                assert snap.protocol is not None and snap.metadata is not None
                got_p = (snap.protocol.min_reader_version, snap.protocol.min_writer_version)
                if got_p != (pp["min_reader_version"], pp["min_writer_version"]):
                    problems.append(f"latest protocol versions {got_p} != deltalake {pp}")
                if snap.metadata.id != peer["metadata_id"]:
                    problems.append(f"latest metadata id {snap.metadata.id!r} != deltalake {peer['metadata_id']!r}")
        except Exception as e:
            problems.append(f"snapshot(): {type(e).__name__}: {e}")
        for name, want in (("latest_version", latest), ("earliest_version", rec["earliest_version"])):
            try:
                got_v = getattr(log, name)()
            except Exception as e:
                problems.append(f"{name}(): {type(e).__name__}: {e}")
                continue
            if got_v != want:
                problems.append(f"{name}() = {got_v}, expected {want}")

    if table in EXPECTED_WARNINGS:
        about = EXPECTED_WARNINGS[table]
        warned = [r for r in caplog.records if r.levelno >= logging.WARNING and about in r.getMessage()]
        if not warned:
            problems.append(f"no warning about {about} was logged (logger 'deltatail')")

    if problems:
        pytest.fail(f"{table} ({rec['source']}):\n  " + "\n  ".join(problems), pytrace=False)
