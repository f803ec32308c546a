"""Each command's settings model: built once from flags, ``DELTATAIL_*`` and the TOML file, typed and bounded.

The models are built by the command line's own parser and parse functions (:mod:`tailer.cli.model`,
:mod:`tailer.cli.serve_config`); the configs the loops run with are built from them. Expected values
are written out here, never read from the code under test.
"""

from __future__ import annotations

import argparse
import dataclasses
import importlib.util
import re
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import write_deltalake

from deltatail.state.errors import ConfigError
from deltatail.state.filters import ChangeFilter
from deltatail.tailer.cli.audit import _follow_config
from deltatail.tailer.cli.configure import tailer_config
from deltatail.tailer.cli.main import build_parser
from deltatail.tailer.cli.model import (
    AuditCommandSettings,
    ChangesSettings,
    RunSettings,
    ServeTableSettings,
    SnapshotSettings,
    TableArg,
    audit_command_settings,
    changes_settings,
    model_fields,
    run_settings,
    snapshot_settings,
)
from deltatail.tailer.cli.serve_config import (
    TABLE_SETTINGS,
    DiscoverSettings,
    ServiceSettings,
    load_serve_config,
)
from deltatail.tailer.cli.settings import DISCOVER_SETTINGS, RUN_SETTINGS, SERVICE_SETTINGS, key_lines
from deltatail.tailer.formats.registry import open_table
from deltatail.tailer.serve.service import ServiceOptions


def parse(*argv: str) -> argparse.Namespace:
    return build_parser().parse_args(list(argv))


def write(path: Path, text: str) -> str:
    path.write_text(text)
    return str(path)


# ---------------------------------------------------------------- the specs and the models


def test_every_setting_spec_is_a_field_of_its_model() -> None:
    """A setting added to a spec table without a model field (or the other way round) fails here, not at run time."""
    assert set(RUN_SETTINGS) <= model_fields(RunSettings)
    assert model_fields(ServeTableSettings) >= TABLE_SETTINGS
    assert {"state_dir", "sink_retries"}.isdisjoint(model_fields(ServeTableSettings))
    assert set(SERVICE_SETTINGS) == model_fields(ServiceSettings)
    assert set(DISCOVER_SETTINGS) == model_fields(DiscoverSettings)


def test_models_are_frozen() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        RunSettings(table="t", state_dir="s").poll_interval = 2.0  # type: ignore[misc]
    with pytest.raises(dataclasses.FrozenInstanceError):
        DiscoverSettings(root="/r").max_depth = 1  # type: ignore[misc]


def test_the_options_page_shows_each_settings_default_from_the_model() -> None:
    spec = importlib.util.spec_from_file_location("gen_options", Path(__file__).parents[2] / "docs" / "gen_options.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    page = module.options_markdown()
    rows = {m[1]: m[2] for m in re.finditer(r"^\| `(\w+)` \| [^|]* \| ([^|]*) \|$", page, re.MULTILINE)}
    assert rows["poll_interval"] == "`1`" and rows["snapshot_commits"] == "`1000`" and rows["sink"] == "`jsonl:-`"
    assert rows["on_schema_change"] == "`evolve`" and rows["no_watch"] == "`false`" and rows["where"] == ""
    assert rows["workers"] == "`2`" and rows["state_root"] == "required" and rows["listen"] == "`127.0.0.1:9108`"
    assert rows["include"] == "`*`" and rows["max_depth"] == "`8`"


# ---------------------------------------------------------------- run


def test_run_defaults_make_the_documented_tailer_config() -> None:
    s = run_settings(parse("run", "/t", "--state-dir", "/s"), env={})
    assert (s.table, s.state_dir, s.sink, s.sink_retries) == ("/t", "/s", "jsonl:-", None)
    c = tailer_config(s.table, s.state_dir, s)
    assert (c.poll_interval, c.max_poll_interval, c.watch) == (1.0, 5.0, True)
    assert (c.checkpoint_commits, c.checkpoint_seconds, c.snapshot_commits) == (50, 5.0, 1000)
    assert (c.on_sink_gap, c.on_data_loss, c.initial_snapshot, c.until_caught_up) == ("fail", "fail", False, False)
    assert c.options.reader_processes == 2 and c.options.allow_non_additive and c.options.filter.is_empty


def test_run_model_from_flags() -> None:
    args = parse(
        *("run", "/t", "--state-dir", "/s", "--sink", "jsonl:/o.jsonl", "--poll-interval", "2.5", "--no-watch"),
        *("--checkpoint-commits", "7", "--starting-version", "3", "--net-changes", "--key", "id, k"),
        *("--columns", "id,v", "--change-types", "insert", "--skip-operations", "optimize", "--where", "v > 1"),
        *("--sink-retries", "4", "--on-schema-change", "stop", "--reader-processes", "0"),
        *("--storage-option", "AWS_REGION=eu-west-1", "--external-root", "/elsewhere"),
    )
    s = run_settings(args, env={})
    assert (s.sink, s.poll_interval, s.no_watch, s.checkpoint_commits) == ("jsonl:/o.jsonl", 2.5, True, 7)
    assert (s.starting_version, s.sink_retries, s.storage) == (3, 4, {"aws_region": "eu-west-1"})
    c = tailer_config("/t", s.state_dir, s)
    assert (c.starting_version, c.poll_interval, c.watch, c.storage_options) == (3, 2.5, False, s.storage)
    assert c.options.key_columns == ("id", "k") and c.options.net_changes and not c.options.allow_non_additive
    assert c.options.external_roots == ("/elsewhere",) and c.options.reader_processes == 0
    assert c.options.filter == ChangeFilter(
        columns=("id", "v"), where="v > 1", change_types=frozenset({"insert"}), skip_operations=frozenset({"OPTIMIZE"})
    )
    assert s.table_arg("/t") == TableArg("/t", {"aws_region": "eu-west-1"}, ("/elsewhere",), None)


def test_run_model_from_a_config_file(tmp_path: Path) -> None:
    config = write(
        tmp_path / "run.toml",
        '[run]\nstate-dir = "/from-file"\nmax_poll_interval = 9\ncolumns = ["a", "b"]\n'
        'on_data_loss = "skip"\nexternal_roots = ["/r"]\n[storage]\naws_region = "x"\naws_allow_http = true\n',
    )
    s = run_settings(parse("run", "/t", "--config", config), env={})
    assert (s.state_dir, s.max_poll_interval, s.columns, s.on_data_loss) == ("/from-file", 9.0, ("a", "b"), "skip")
    assert s.storage == {"aws_region": "x", "aws_allow_http": "true"} and s.external_roots == ("/r",)
    assert s.table_arg(s.table).external_roots == ("/r",)  # the file's roots open the table too


def test_run_model_from_the_environment(tmp_path: Path) -> None:
    env = {
        "DELTATAIL_STATE_DIR": "/from-env",
        "DELTATAIL_SNAPSHOT_COMMITS": "12",
        "DELTATAIL_UNTIL_CAUGHT_UP": "yes",
        "DELTATAIL_CHANGE_TYPES": "insert,delete",
        "DELTATAIL_STARTING_VERSION": "latest",
    }
    s = run_settings(parse("run", "/t"), env=env)
    assert (s.state_dir, s.snapshot_commits, s.until_caught_up) == ("/from-env", 12, True)
    assert s.change_types == ("insert", "delete") and s.starting_version == "latest"


def test_run_model_precedence_flag_over_environment_over_file(tmp_path: Path) -> None:
    config = write(tmp_path / "run.toml", 'state_dir = "/file"\npoll_interval = 3\nsink = "jsonl:/file"\nkey = "f"\n')
    env = {"DELTATAIL_CONFIG": config, "DELTATAIL_POLL_INTERVAL": "2", "DELTATAIL_SINK": "jsonl:/env"}
    s = run_settings(parse("run", "/t", "--sink", "jsonl:/flag"), env=env)
    assert (s.state_dir, s.poll_interval, s.sink, s.key) == ("/file", 2.0, "jsonl:/flag", "f")
    s = run_settings(parse("run", "/t", "--config", config, "--poll-interval", "1.5"), env={})
    assert (s.poll_interval, s.sink) == (1.5, "jsonl:/file")


def test_run_without_a_state_dir_is_refused() -> None:
    with pytest.raises(ConfigError, match="--state-dir is required"):
        run_settings(parse("run", "/t"), env={})


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"DELTATAIL_POLL_INTERVAL": "90000"}, "poll_interval in DELTATAIL_POLL_INTERVAL: must be at most 86400"),
        ({"DELTATAIL_CHECKPOINT_SECONDS": "0.001"}, "checkpoint_seconds in DELTATAIL_CHECKPOINT_SECONDS: must be at"),
        ({"DELTATAIL_READER_PROCESSES": "-1"}, "reader_processes in DELTATAIL_READER_PROCESSES: must be at least 0"),
        ({"DELTATAIL_ON_DATA_LOSS": "ignore"}, "expected one of fail, resnapshot, skip, got 'ignore'"),
        ({"DELTATAIL_ON_SINK_GAP": "skip"}, "on_sink_gap in DELTATAIL_ON_SINK_GAP: expected one of fail, accept"),
        ({"DELTATAIL_EXTERNAL_ROOTS": "relative/dir"}, "relative/dir"),
    ],
)
def test_run_bounds_from_the_environment_are_refused_naming_key_and_source(env: dict[str, str], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        run_settings(parse("run", "/t", "--state-dir", "/s"), env=env)
    assert message in str(info.value)


def test_run_unknown_key_in_the_file_is_refused(tmp_path: Path) -> None:
    config = write(tmp_path / "run.toml", 'state_dir = "/s"\nworkers = 2\n')
    with pytest.raises(ConfigError) as info:
        run_settings(parse("run", "/t", "--config", config), env={})
    assert "unknown setting 'workers' in config file" in str(info.value) and info.value.file == config


def test_run_contradicting_settings_are_refused_when_the_config_is_built() -> None:
    s = run_settings(parse("run", "/t", "--state-dir", "/s", "--key", "id"), env={})
    with pytest.raises(ConfigError, match="key needs net_changes"):
        tailer_config("/t", s.state_dir, s)
    s = run_settings(parse("run", "/t", "--state-dir", "/s", "--on-schema-change", "stop", "--allow-non-additive"), {})
    with pytest.raises(ConfigError, match="allow_non_additive contradicts"):
        tailer_config("/t", s.state_dir, s)
    s = run_settings(parse("run", "/t", "--state-dir", "/s"), {"DELTATAIL_STARTING_TIMESTAMP": "2024-01-01"})
    both = dataclasses.replace(s, starting_version=1)
    with pytest.raises(ConfigError, match="at most one of starting_version and starting_timestamp"):
        tailer_config("/t", s.state_dir, both)
    s = run_settings(parse("run", "/t", "--state-dir", "/s", "--starting-timestamp", "yesterday"), env={})
    with pytest.raises(ConfigError, match="starting_timestamp"):
        tailer_config("/t", s.state_dir, s)


# ---------------------------------------------------------------- changes and snapshot


def test_changes_model_from_flags() -> None:
    args = parse(
        *("changes", "/t", "--starting-timestamp", "2024-01-01T00:00:00Z", "--ending-version", "9"),
        *("--net-changes", "--key", "id", "--columns", "id,v", "--skip-operations", "optimize,vacuum start"),
        *("--output", "o.parquet", "--storage-option", "AWS_REGION=x", "--format", "delta"),
    )
    s = changes_settings(args)
    assert s == ChangesSettings(
        table=TableArg("/t", {"aws_region": "x"}, (), "delta"),
        starting_timestamp_ms=1704067200000,
        ending_version=9,
        net_changes=True,
        key=("id",),
        output="o.parquet",
        reader_processes=2,
        filter=ChangeFilter(columns=("id", "v"), skip_operations=frozenset({"OPTIMIZE", "VACUUM START"})),
    )


def test_changes_refuses_key_without_net_changes_and_a_bad_timestamp() -> None:
    with pytest.raises(ConfigError, match="--key needs --net-changes"):
        changes_settings(parse("changes", "/t", "--key", "id"))
    with pytest.raises(ConfigError, match="--starting-timestamp"):
        changes_settings(parse("changes", "/t", "--starting-timestamp", "yesterday"))


def test_snapshot_model_from_flags() -> None:
    s = snapshot_settings(parse("snapshot", "/t", "--version", "4", "--json", "--storage-option", "A=b"))
    assert s == SnapshotSettings(TableArg("/t", {"a": "b"}), version=4, json=True)
    with pytest.raises(ConfigError, match="KEY=VALUE"):
        snapshot_settings(parse("snapshot", "/t", "--storage-option", "novalue"))


# ---------------------------------------------------------------- audit


def test_audit_range_model_from_flags(tmp_path: Path) -> None:
    s = audit_command_settings(
        parse("audit", "/t", "--starting-version", "2", "--ending-version", "5", "--format", "jsonl", "--counted"),
        env={},
    )
    assert isinstance(s, AuditCommandSettings) and not s.follow
    assert (s.starting_version, s.ending_version, s.output_format, s.counted) == (2, 5, "jsonl", True)
    assert s.alerts.rules == () and s.table == TableArg("/t")


def test_audit_follow_model_from_environment_and_file(tmp_path: Path) -> None:
    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": [1]}))
    config = write(
        tmp_path / "a.toml",
        'poll_interval = 4\ncheckpoint_commits = 3\n[[audit.alerts]]\nname = "any delete"\nrows_deleted_over = 0\n',
    )
    env = {"DELTATAIL_CONFIG": config, "DELTATAIL_STATE_DIR": str(tmp_path / "s"), "DELTATAIL_NO_WATCH": "true"}
    s = audit_command_settings(parse("audit", str(table), "--follow", "--checkpoint-commits", "8"), env=env)
    assert [r.name for r in s.alerts.rules] == ["any delete"]
    c = _follow_config(s, open_table(str(table), {}))
    assert (c.state_dir, c.poll_interval, c.watch, c.checkpoint_commits) == (str(tmp_path / "s"), 4.0, False, 8)
    assert (c.max_poll_interval, c.snapshot_commits, c.counted, c.starting_version) == (5.0, 1000, False, None)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--poll-interval", "2"], "--poll-interval is a setting of --follow"),
        (["--follow"], "--follow needs --state-dir"),
        (["--follow", "--state-dir", "/s", "--ending-version", "3"], "--ending-version ends a range"),
        (["--follow", "--state-dir", "/s", "--html", "r.html"], "--html writes the report of a range"),
        (["--output", "log.csv"], "--output must end in .jsonl or .parquet, got 'log.csv'"),
        (["--alert-output", "a.txt"], "--alert-output must end in .jsonl"),
    ],
)
def test_audit_contradicting_flags_are_refused(argv: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        audit_command_settings(parse("audit", "/t", *argv), env={})


def test_audit_bounds_from_the_file_are_refused_naming_the_file(tmp_path: Path) -> None:
    config = write(tmp_path / "a.toml", "snapshot_commits = 0\n")
    with pytest.raises(ConfigError) as info:
        audit_command_settings(parse("audit", "/t", "--config", config), env={})
    assert f"snapshot_commits in {config}: must be at least 1, got 0" in str(info.value)


# ---------------------------------------------------------------- serve


def test_serve_model_defaults(tmp_path: Path) -> None:
    path = write(tmp_path / "s.toml", f'[service]\nstate_root = "{tmp_path}"\n[[discover]]\nroot = "{tmp_path}"\n')
    config = load_serve_config(path)
    assert config.options == ServiceOptions(
        workers=2, step_versions=50, safety_poll_seconds=10.0, discover_seconds=30.0, status_seconds=30.0
    )
    assert (config.listen, config.ready_lag_seconds, config.min_readable_seconds) == ("127.0.0.1:9108", 300.0, 86400.0)
    assert config.defaults == ServeTableSettings() and config.defaults.sink == "jsonl:-"
    assert config.discover == [DiscoverSettings(root=str(tmp_path), include=("*",), exclude=(), max_depth=8)]


def test_serve_tables_take_the_defaults_with_their_own_settings_over_them(tmp_path: Path) -> None:
    path = write(
        tmp_path / "s.toml",
        f'[service]\nstate_root = "{tmp_path}"\nworkers = 3\nlisten = "off"\n'
        '[defaults]\nsink = "jsonl:/{table_name}.jsonl"\npoll-interval = 2\nskip_operations = ["OPTIMIZE"]\n'
        '[storage]\naws_region = "a"\naws_endpoint = "http://e"\n'
        '[[tables]]\npath = "/x/orders"\npoll_interval = 0.5\n[tables.storage]\naws_region = "b"\n'
        '[[tables]]\npath = "lance:///x/vectors"\nname = "v"\nformat = "lance"\n',
    )
    config = load_serve_config(path)
    assert config.options.workers == 3 and config.listen is None
    (orders_name, orders), (v_name, v) = config.tables
    assert (orders_name, orders.path, orders.poll_interval, orders.sink) == (
        "orders",
        "/x/orders",
        0.5,
        "jsonl:/{table_name}.jsonl",
    )
    assert orders.skip_operations == ("OPTIMIZE",) and orders.storage == {"aws_region": "b", "aws_endpoint": "http://e"}
    assert (v_name, v.format, v.poll_interval, v.storage) == (
        "v",
        "lance",
        2.0,
        {"aws_region": "a", "aws_endpoint": "http://e"},
    )


#: The ``[service]`` table every case below starts with (``{root}``: the test's directory).
SERVICE = '[service]\nstate_root = "{root}"\n'
#: A table, for the cases that name none.
TABLE = '[[tables]]\npath = "/t"\n'


@pytest.mark.parametrize(
    ("body", "message"),
    [
        (SERVICE + '[defaults]\nstate_dir = "/s"\n' + TABLE, "unknown setting 'state_dir' in [defaults]"),
        (SERVICE + TABLE + "until_caught_up = true\n", "unknown setting 'until_caught_up' in table 't'"),
        (SERVICE + "threads = 2\n" + TABLE, "unknown key 'threads' in [service]"),
        (SERVICE + '[[discover]]\nroot = "{root}"\ndepth = 2\n', "unknown key 'depth' in [[discover]] #1"),
        (SERVICE + "[defaults]\nsnapshot_commits = 0\n" + TABLE, "snapshot_commits in [defaults]: must be at least 1"),
        (SERVICE + TABLE + "max_poll_interval = 1e9\n", "max_poll_interval in table 't': must be at most 86400"),
        (SERVICE + "fatal_seconds = 0.5\n" + TABLE, "fatal_seconds in [service]: must be at least 1, got 0.5"),
        (SERVICE + "stall_seconds = 100000\n" + TABLE, "stall_seconds in [service]: must be at most 86400"),
    ],
)
def test_serve_unknown_keys_and_bounds_are_refused_naming_the_file_and_the_section(
    tmp_path: Path, body: str, message: str
) -> None:
    path = write(tmp_path / "s.toml", body.format(root=tmp_path))
    with pytest.raises(ConfigError) as info:
        load_serve_config(path)
    assert message in str(info.value) and info.value.file == path


# ---------------------------------------------------------------- lines


def test_key_lines_reads_tables_and_array_entries() -> None:
    text = (
        'sink = "jsonl:-"\n'  # 1
        "[service]\n"  # 2
        "workers = 2  # a comment\n"  # 3
        "[[tables]]\n"  # 4
        'path = "/a"\n'  # 5
        "[tables.storage]\n"  # 6
        'aws_region = "x"\n'  # 7
        "[[tables]]\n"  # 8
        '"poll-interval" = 1\n'  # 9
    )
    assert key_lines(text) == {
        ("", 0): {"sink": 1},
        ("service", 0): {"workers": 3},
        ("tables", 0): {"path": 5},
        ("tables.storage", 0): {"aws_region": 7},
        ("tables", 1): {"poll-interval": 9},
    }


def test_a_bad_value_in_a_file_names_its_line(tmp_path: Path) -> None:
    run = write(tmp_path / "run.toml", '# settings\n[run]\nstate_dir = "/s"\n\ncheckpoint-commits = 0\n')
    with pytest.raises(ConfigError) as info:
        run_settings(parse("run", "/t", "--config", run), env={})
    assert info.value.message == f"invalid value for checkpoint_commits in {run}: must be at least 1, got 0 (line 5)"
    typo = write(tmp_path / "typo.toml", 'state_dir = "/s"\npol_interval = 1\n')
    with pytest.raises(ConfigError, match=r"unknown setting 'pol_interval' in config file \(line 2\)"):
        run_settings(parse("run", "/t", "--config", typo), env={})
    serve = write(
        tmp_path / "serve.toml",
        f'[service]\nstate_root = "{tmp_path}"\n[[tables]]\npath = "/a"\n[[tables]]\npath = "/b"\nworkers = 3\n'
        '[[tables]]\npath = "/c"\nsnapshot_commits = -2\n',
    )
    with pytest.raises(ConfigError) as info:
        load_serve_config(serve)
    assert info.value.message == "unknown setting 'workers' in table 'b' (line 7)" and info.value.file == serve
    fixed = write(tmp_path / "serve2.toml", Path(serve).read_text().replace("workers = 3\n", ""))
    with pytest.raises(ConfigError) as info:
        load_serve_config(fixed)
    assert info.value.message == "invalid value for snapshot_commits in table 'c': must be at least 1, got -2 (line 9)"
