"""Following a table across schema changes with ``deltatail run``'s default settings, to JSON lines and Parquet.

Each of the five corpus tables with a non-additive schema change (a dropped column, a rename under
column mapping, widened types) and a generated table (an added column, cdc files, an overwrite
that drops columns) is followed to its end without a stop; every delivered row must be the
reference's (:mod:`schema_change_tables`, deltalake or pyarrow reads, never deltatail), in the
schema of its own version; removed rows as they were before the version. ``on_schema_change =
stop`` still stops before the change, and the deprecated ``--allow-non-additive`` still evolves.
"""

from __future__ import annotations

import json
import sys
from collections import Counter
from pathlib import Path

import pyarrow.parquet as pq
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: corpus.py (tests/ is not a package)
from corpus import corpus_root
from schema_change_tables import CORPUS, Row, reference_rows, row_key, write_evolving_table

from deltatail.state.errors import ConfigError
from deltatail.tailer.audit.feed import AuditFeed
from deltatail.tailer.cli.main import main
from deltatail.tailer.cli.serve import load_serve_config, source


def run(table: Path, state: Path, sink: str, *extra: str) -> int:
    args = ["run", str(table), "--state-dir", str(state), "--sink", sink, "--until-caught-up"]
    return main([*args, "--reader-processes", "0", *extra])


def jsonl_rows(path: Path) -> Counter[Row]:
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    return Counter(row_key(r["_commit_version"], r["_change_type"], r) for r in rows)


def parquet_rows(directory: Path) -> tuple[Counter[Row], list[tuple[list[int], list[str]]]]:
    """The rows of every file of a Parquet sink, and per file (in name order) its versions and columns."""
    rows: Counter[Row] = Counter()
    files = []
    for f in sorted(directory.glob("*.parquet")):
        t = pq.read_table(f)
        versions = t.column("_commit_version").to_pylist()
        files.append((versions, t.schema.names))
        rows.update(row_key(r["_commit_version"], r["_change_type"], r) for r in t.to_pylist())
    return rows, files


def table_columns(table: Path, version: int) -> list[str]:
    """The logical column names of ``table`` at ``version``, from the last metaData in the JSON log up to it."""
    names: list[str] = []
    for v in range(version + 1):
        for line in (table / "_delta_log" / f"{v:020d}.json").read_text().splitlines():
            action = json.loads(line) if line.strip() else {}
            if "metaData" in action:
                names = [f["name"] for f in json.loads(action["metaData"]["schemaString"])["fields"]]
    return names


def check_follows(table: Path, last: int, tmp_path: Path) -> None:
    """``run`` with default settings delivers exactly the reference rows, to JSON lines and to Parquet."""
    expected = reference_rows(table, last)
    assert run(table, tmp_path / "s1", f"jsonl:{tmp_path / 'out.jsonl'}") == 0
    assert jsonl_rows(tmp_path / "out.jsonl") == expected
    assert run(table, tmp_path / "s2", f"parquet:{tmp_path / 'pq'}") == 0
    rows, files = parquet_rows(tmp_path / "pq")
    assert rows == expected
    seen: list[int] = []
    for versions, names in files:  # each file holds one schema: that of its rows' version (or the one before)
        seen += versions
        data = [n for n in names if not n.startswith("_")]
        assert data in (table_columns(table, versions[0]), table_columns(table, versions[0] - 1))
    assert seen == sorted(seen)  # file names order the rows


@pytest.mark.parametrize("name", sorted(CORPUS))
def test_default_run_follows_each_corpus_schema_change_to_the_end(name: str, tmp_path: Path) -> None:
    path, _, _ = CORPUS[name]
    table = corpus_root() / path
    last = max(int(p.stem) for p in (table / "_delta_log").glob("*.json"))
    check_follows(table, last, tmp_path)


def test_the_rename_delivers_the_old_name_before_and_the_new_one_after(tmp_path: Path) -> None:
    table = corpus_root() / CORPUS["delta-rs/table_with_partitioning_mapping"][0]
    assert run(table, tmp_path / "s", f"jsonl:{tmp_path / 'out.jsonl'}") == 0
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [(r["_commit_version"], r.get("id"), r.get("newid")) for r in rows] == [(1, 1, None), (4, None, 2)]
    assert "newid" not in rows[0] and "id" not in rows[1]


def test_widened_types_each_version_in_its_own_parquet_file(tmp_path: Path) -> None:
    table = corpus_root() / CORPUS["kernel-rs/type-widening"][0]
    assert run(table, tmp_path / "s", f"parquet:{tmp_path / 'pq'}") == 0
    files = sorted((tmp_path / "pq").glob("*.parquet"))
    assert [f.name[:21] for f in files] == ["v00000000000000000000", "v00000000000000000002"]
    before, after = (pq.read_schema(f) for f in files)
    assert (str(before.field("byte_long").type), str(after.field("byte_long").type)) == ("int8", "int64")
    assert (str(before.field("float_double").type), str(after.field("float_double").type)) == ("float", "double")


def test_a_generated_table_added_column_cdc_and_an_overwrite_dropping_columns(tmp_path: Path) -> None:
    table = write_evolving_table(tmp_path / "t")
    check_follows(table, 3, tmp_path)
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    deletes = [r for r in rows if r["_commit_version"] == 3 and r["_change_type"] == "delete"]
    assert sorted((r["id"], r["v"], r["w"]) for r in deletes) == [(2, "b", None), (3, "c", 30)]
    assert all("z" not in r for r in deletes)


@pytest.mark.parametrize("flags", [["--on-schema-change", "stop"]])
def test_stop_stops_before_the_change_with_everything_before_it_delivered(
    flags: list[str], tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    table = corpus_root() / CORPUS["kernel-rs/type-widening"][0]
    assert run(table, tmp_path / "s", f"jsonl:{tmp_path / 'out.jsonl'}", *flags) == 1
    err = capsys.readouterr().err
    assert "version 2" in err and "'byte_long' changed type" in err and "on_schema_change" in err
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert [r["_commit_version"] for r in rows] == [0]


def test_stop_from_a_config_file_and_the_deprecated_alias(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    table = corpus_root() / CORPUS["dat/with_schema_change"][0]
    config = tmp_path / "c.toml"
    config.write_text('on_schema_change = "stop"\n')
    assert run(table, tmp_path / "s1", f"jsonl:{tmp_path / 'a.jsonl'}", "--config", str(config)) == 1
    assert "'letter' was dropped" in capsys.readouterr().err
    assert run(table, tmp_path / "s2", f"jsonl:{tmp_path / 'b.jsonl'}", "--allow-non-additive") == 0
    assert len((tmp_path / "b.jsonl").read_text().splitlines()) == 9
    both = ["--allow-non-additive", "--on-schema-change", "stop"]
    assert run(table, tmp_path / "s3", f"jsonl:{tmp_path / 'c.jsonl'}", *both) == 2
    assert "contradicts" in capsys.readouterr().err


def test_a_serve_table_evolves_by_default_and_stops_when_its_setting_says(tmp_path: Path) -> None:
    t = write_evolving_table(tmp_path / "t")
    body = f'[[tables]]\npath = "{t}"\nname = "a"\n[[tables]]\npath = "{t}"\nname = "b"\non_schema_change = "stop"\n'
    config = tmp_path / "serve.toml"
    config.write_text(f'[service]\nstate_root = "{tmp_path / "state"}"\n' + body)
    loaded = load_serve_config(str(config))
    sources = {name: source(name, settings) for name, settings in loaded.tables}
    assert sources["a"].config.options.allow_non_additive is True
    assert sources["b"].config.options.allow_non_additive is False
    config.write_text(config.read_text().replace('"stop"', '"halt"'))
    with pytest.raises(ConfigError, match=r"on_schema_change.*evolve, stop"):
        load_serve_config(str(config))


@pytest.mark.parametrize("name", [*sorted(CORPUS), "generated"])
def test_the_audit_feed_reports_each_kind_of_schema_change_at_its_version(name: str, tmp_path: Path) -> None:
    if name == "generated":
        table, changes = write_evolving_table(tmp_path / "t"), {1: "added", 3: "dropped"}
    else:
        path, kind, version = CORPUS[name]
        table, changes = corpus_root() / path, {version: kind}
    events = {e.version: e for e in AuditFeed(str(table)).events()}
    for version, kind in changes.items():
        diff = events[version].schema_change
        assert diff is not None and kind in diff.kinds, (version, diff)
