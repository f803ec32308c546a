"""The service's configuration is checked before anything starts; every error names the key or the table."""

from __future__ import annotations

import logging
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltatail.state.errors import ConfigError, DeltaTailError, TableNotFoundError
from deltatail.tailer.cli.model import ServeTableSettings
from deltatail.tailer.cli.serve import (
    _discovered,
    check_discovered_sink,
    check_distinct_sinks,
    check_sink_uris,
    check_tables,
    load_serve_config,
    source,
)
from deltatail.tailer.follow.stats import TableState, TableStats
from deltatail.tailer.serve.discovery import find_tables
from deltatail.tailer.serve.http import HealthServer, readiness

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
    missing = source("gone", ServeTableSettings(path=str(tmp_path / "gone")))
    with pytest.raises(TableNotFoundError, match="table 'gone'"):
        check_tables([missing])
    with pytest.raises(ConfigError, match="'a' and 'link' are the same table"):
        check_tables(
            [
                source("a", ServeTableSettings(path=str(a))),
                source("link", ServeTableSettings(path=str(tmp_path / "link"))),
            ]
        )
    with pytest.raises(DeltaTailError, match=r"table 'a': .*unknown column 'colour'"):
        check_tables([source("a", ServeTableSettings(path=str(a), where="colour = 'red'"))])
    check_tables([source("a", ServeTableSettings(path=str(a), where="v = 'a'"))])  # a good one passes


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
        [sys.executable, "-m", "deltatail", "serve", "--config", str(config)], cwd=ROOT, capture_output=True, text=True
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
    # The lag is the age of the oldest version not delivered (pending), not of the newest delivered one.
    close = TableStats("/b", "b", state=TableState.CATCHING_UP, newest_version=3, pending_commit_ms=1000 * 990)
    far = TableStats("/c", "c", state=TableState.CATCHING_UP, newest_version=3, pending_commit_ms=0)
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
        [sys.executable, "-m", "deltatail", "serve", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
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
    probe = [source("a", ServeTableSettings(path=str(a))), source("b", ServeTableSettings(path=str(b)))]
    ids, _ = check_tables(probe)
    fill = {"d": tmp_path, "tid_a": ids["a"]}
    sources = [
        source("a", ServeTableSettings(path=str(a), sink=first.format(**fill))),
        source("b", ServeTableSettings(path=str(b), sink=second.format(**fill))),
    ]
    with pytest.raises(ConfigError, match="tables 'a' and 'b' have the same sink"):
        check_distinct_sinks(sources, check_tables(sources)[0])


def test_distinct_sinks_stdout_and_kafka_may_be_shared(tmp_path: Path) -> None:
    a, b = table(tmp_path / "a"), table(tmp_path / "b")
    for uri in ("jsonl:-", f"jsonl:{tmp_path}/{{table_name}}.jsonl", f"parquet:{tmp_path}/{{table_id}}"):
        sources = [
            source("a", ServeTableSettings(path=str(a), sink=uri)),
            source("b", ServeTableSettings(path=str(b), sink=uri)),
        ]
        check_distinct_sinks(sources, check_tables(sources)[0])


def test_discovery_with_one_default_sink_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="every discovered table"):
        check_discovered_sink(ServeTableSettings(sink=f"jsonl:{tmp_path}/all.jsonl"))
    check_discovered_sink(ServeTableSettings(sink=f"jsonl:{tmp_path}/{{table_name}}.jsonl"))
    check_discovered_sink(ServeTableSettings())  # jsonl:- by default


@contextmanager
def caplog_records() -> Iterator[list[logging.LogRecord]]:
    """The records of the ``deltatail`` logger while inside."""
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    handler = Keep()
    logger = logging.getLogger("deltatail")
    logger.addHandler(handler)
    try:
        yield records
    finally:
        logger.removeHandler(handler)


@pytest.mark.parametrize(
    ("sink", "message"),
    [
        ("jsnl:/tmp/x.jsonl", "table 't': unknown sink URI 'jsnl:/tmp/x.jsonl'"),
        ("kafka://127.0.0.1:9/cdc?format=debezum", "table 't': kafka URI .*format='debezum'"),
        ("parquet:", "table 't': sink URI 'parquet:' has no path"),
    ],
)
def test_sink_uris_are_checked_before_anything_starts(tmp_path: Path, sink: str, message: str) -> None:
    """Before: serve started with /healthz green and the table failed when it first opened its sink."""
    t = table(tmp_path / "t")
    with pytest.raises(ConfigError, match=message):
        check_sink_uris([source("t", ServeTableSettings(path=str(t), sink=sink))])
    config = write(tmp_path, f'listen = "127.0.0.1:0"\n[[tables]]\npath = "{t}"\nsink = "{sink}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "deltatail", "serve", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert done.stderr.startswith("deltatail: error: table 't': ") and done.stderr.count("\n") == 1, done.stderr


def test_a_bad_defaults_sink_with_discovery_is_refused_at_start(tmp_path: Path) -> None:
    table(tmp_path / "lake" / "t")
    config = write(
        tmp_path, f'[defaults]\nsink = "jsnl:/x/{{table_name}}"\n[[discover]]\nroot = "{tmp_path / "lake"}"\n'
    )
    done = subprocess.run(
        [sys.executable, "-m", "deltatail", "serve", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2 and "[defaults] sink: unknown sink URI" in done.stderr, done.stderr


def test_a_discovered_table_with_a_bad_sink_is_logged_once_and_the_others_followed(tmp_path: Path) -> None:
    """The table's name fills the Kafka URI: a directory named with '?format=debezum' makes its URI bad."""
    lake = tmp_path / "lake"
    table(lake / "good")
    table(lake / "bad?format=debezum")
    config = load_serve_config(
        str(
            write(
                tmp_path,
                f'[defaults]\nsink = "kafka://127.0.0.1:9/cdc.{{table_name}}"\n[[discover]]\nroot = "{lake}"\n',
            )
        )
    )
    refused: set[str] = set()
    with caplog_records() as records:
        for _ in range(3):
            found = _discovered(config, set(), refused)
            assert [s.name for s in found] == ["good"]
    bad = [r for r in records if "cannot be followed" in r.getMessage()]
    assert len(bad) == 1 and "format='debezum'" in bad[0].getMessage(), [r.getMessage() for r in records]


def test_a_state_root_that_cannot_be_written_is_refused_at_start(tmp_path: Path) -> None:
    t = table(tmp_path / "t")
    (tmp_path / "state").write_text("a file where the state root should be\n")
    config = write(tmp_path, f'listen = "127.0.0.1:0"\n[[tables]]\npath = "{t}"\n')
    done = subprocess.run(
        [sys.executable, "-m", "deltatail", "serve", "--config", str(config)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith("deltatail: error: the state root is unusable") and "Traceback" not in done.stderr
    assert done.stderr.count("\n") == 1, done.stderr
