"""The service's configuration is checked before anything starts; every error names the key or the table."""

from __future__ import annotations

import socket
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from state.errors import ConfigError, DeltaTailError, TableNotFoundError
from tailer.cli.serve import check_discovered_sink, check_distinct_sinks, check_tables, load_serve_config, source
from tailer.follow.stats import TableState, TableStats
from tailer.serve.discovery import find_tables
from tailer.serve.http import HealthServer, readiness

ROOT = Path(__file__).resolve().parents[2]


def table(path: Path) -> Path:
    write_deltalake(str(path), pa.table({"id": [1, 2], "v": ["a", "b"]}))
    return path


def write(tmp_path: Path, body: str) -> Path:
    config = tmp_path / "serve.toml"
    config.write_text(f'[service]\nstate_root = "{tmp_path / "state"}"\n' + body)
    return config


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("[services]\nx = 1\n", "unknown section 'services'"),
        ('nope = 1\n[[tables]]\npath = "/t"\n', "unknown key 'nope' in \\[service\\]"),
        ('[[tables]]\npath = "/t"\npoll = 1\n', "unknown setting 'poll' in table 't'"),
        ('[defaults]\nstate_dir = "/x"\n[[tables]]\npath = "/t"\n', "unknown setting 'state_dir' in \\[defaults\\]"),
        ('[[tables]]\nname = "x"\n', "needs a path"),
        ('[[tables]]\npath = "/a/t"\n[[tables]]\npath = "/b/t"\n', "two tables are named 't'"),
        ('[[discover]]\nroot = "/x"\ndepth = 2\n', "unknown key 'depth' in \\[\\[discover\\]\\] #1"),
        ("", "names no tables"),
        ('[[tables]]\npath = "/t"\npoll_interval = "fast"\n', "invalid value for poll_interval"),
    ],
)
def test_bad_configurations_name_the_key_or_table(tmp_path: Path, body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as info:
        load_serve_config(str(write(tmp_path, body)))
    assert info.value.file == str(tmp_path / "serve.toml")


def test_state_root_is_required(tmp_path: Path) -> None:
    config = tmp_path / "serve.toml"
    config.write_text('[[tables]]\npath = "/t"\n')
    with pytest.raises(ConfigError, match="needs state_root"):
        load_serve_config(str(config))


def test_tables_are_checked_before_anything_starts(tmp_path: Path) -> None:
    a = table(tmp_path / "a")
    (tmp_path / "link").symlink_to(a)
    missing = source("gone", {"path": str(tmp_path / "gone")})
    with pytest.raises(TableNotFoundError, match="table 'gone'"):
        check_tables([missing])
    with pytest.raises(ConfigError, match="'a' and 'link' are the same table"):
        check_tables([source("a", {"path": str(a)}), source("link", {"path": str(tmp_path / "link")})])
    with pytest.raises(DeltaTailError, match=r"table 'a': .*unknown column 'colour'"):
        check_tables([source("a", {"path": str(a), "where": "colour = 'red'"})])
    check_tables([source("a", {"path": str(a), "where": "v = 'a'"})])  # a good one passes


def test_an_address_in_use_is_refused(tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen on 127.0.0.1:{port}"):
            HealthServer("127.0.0.1", port, list)


@pytest.mark.slow
def test_the_command_refuses_a_bad_file_with_one_line(tmp_path: Path) -> None:
    config = write(tmp_path, f'[[tables]]\npath = "{tmp_path / "nothing"}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "tailer.cli", "serve", "--config", str(config)], cwd=ROOT, capture_output=True, text=True
    )
    assert done.returncode == 1
    assert "table 'nothing'" in done.stderr and "Traceback" not in done.stderr


def test_discovery_finds_tables_but_not_tables_inside_tables(tmp_path: Path) -> None:
    table(tmp_path / "sales" / "orders")
    table(tmp_path / "sales" / "refunds")
    table(tmp_path / "hr" / "people")
    (tmp_path / "sales" / "orders" / "nested").mkdir()
    table(tmp_path / "sales" / "orders" / "nested" / "inner")
    table(tmp_path / ".hidden" / "t")
    assert find_tables(str(tmp_path)) == [str(tmp_path / p) for p in ("hr/people", "sales/orders", "sales/refunds")]
    assert find_tables(str(tmp_path), include=["sales/*"], exclude=["*/refunds"]) == [str(tmp_path / "sales/orders")]
    assert find_tables(str(tmp_path), max_depth=1) == []
    with pytest.raises(ConfigError, match="not a directory"):
        find_tables(str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match="name object-store tables one by one"):
        find_tables("s3://bucket/lake")


def test_readiness_says_which_tables_are_not_ready() -> None:
    ok = TableStats("/a", "a", state=TableState.FOLLOWING)
    close = TableStats("/b", "b", state=TableState.CATCHING_UP, delivered_commit_ms=1000 * 990)
    far = TableStats("/c", "c", state=TableState.CATCHING_UP, delivered_commit_ms=0)
    failed = TableStats("/d", "d", state=TableState.FAILED, error="boom")
    problems = readiness([ok, close, far, failed], 60.0, 1000.0)
    assert [p.split(":")[0] for p in problems] == ["c", "d"] and "boom" in problems[1]
    assert readiness([ok, close], 60.0, 1000.0) == []


@pytest.mark.slow
def test_two_tables_with_one_sink_file_are_refused_before_anything_starts(tmp_path: Path) -> None:
    """Two tables whose filled sink URIs name one file (or directory): ConfigError naming both, nothing written."""
    a, b = table(tmp_path / "a"), table(tmp_path / "b")
    out = tmp_path / "out.jsonl"
    config = write(
        tmp_path,
        f'listen = "off"\n[defaults]\nsink = "jsonl:{out}"\n[[tables]]\npath = "{a}"\n[[tables]]\npath = "{b}"\n',
    )
    done = subprocess.run(
        [sys.executable, "-m", "tailer.cli", "serve", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "tables 'a' and 'b' have the same sink" in done.stderr and str(out) in done.stderr, done.stderr
    assert "Traceback" not in done.stderr
    assert not out.exists() and not (tmp_path / "state").exists()


@pytest.mark.parametrize(
    ("first", "second"),
    [
        ("parquet:{d}/out", "parquet:{d}/./sub/../out"),  # one directory, written two ways
        ("jsonl:{d}/{{table_id}}.jsonl", "jsonl:{d}/{tid_a}.jsonl"),  # filled: the same file
    ],
)
def test_filled_sink_uris_naming_one_place_are_refused(tmp_path: Path, first: str, second: str) -> None:
    a, b = table(tmp_path / "a"), table(tmp_path / "b")
    probe = [source("a", {"path": str(a)}), source("b", {"path": str(b)})]
    ids = check_tables(probe)
    fill = {"d": tmp_path, "tid_a": ids["a"]}
    sources = [
        source("a", {"path": str(a), "sink": first.format(**fill)}),
        source("b", {"path": str(b), "sink": second.format(**fill)}),
    ]
    with pytest.raises(ConfigError, match="tables 'a' and 'b' have the same sink"):
        check_distinct_sinks(sources, check_tables(sources))


def test_distinct_sinks_stdout_and_kafka_may_be_shared(tmp_path: Path) -> None:
    a, b = table(tmp_path / "a"), table(tmp_path / "b")
    for uri in ("jsonl:-", f"jsonl:{tmp_path}/{{table_name}}.jsonl", f"parquet:{tmp_path}/{{table_id}}"):
        sources = [source("a", {"path": str(a), "sink": uri}), source("b", {"path": str(b), "sink": uri})]
        check_distinct_sinks(sources, check_tables(sources))


def test_discovery_with_one_default_sink_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="every discovered table"):
        check_discovered_sink({"sink": f"jsonl:{tmp_path}/all.jsonl"})
    check_discovered_sink({"sink": f"jsonl:{tmp_path}/{{table_name}}.jsonl"})
    check_discovered_sink({})  # jsonl:- by default
