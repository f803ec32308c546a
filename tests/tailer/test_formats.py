"""The table handle and the format registry: one storage per table per process, formats by prefix, setting or layout."""

from __future__ import annotations

import socket
from collections.abc import Callable, Mapping
from pathlib import Path

import lance
import orjson
import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from lance_datasets import rows

import deltatail.tailer.table
from deltatail.sinks.embedded import JsonLinesSink
from deltatail.state.errors import ConfigError, StorageError
from deltatail.tailer.cli.configure import tailer_config
from deltatail.tailer.cli.main import main
from deltatail.tailer.cli.model import TableSettings
from deltatail.tailer.formats.registry import FALLBACK, FORMATS, claimed, format_named, format_names, open_table
from deltatail.tailer.serve.service import TableSource
from deltatail.tailer.storage import LocalStorage, Storage
from deltatail.tailer.storage.factory import storage_for


def delta_table(root: Path) -> Path:
    write_deltalake(root, pa.table({"id": [1, 2, 3]}), configuration={"delta.enableChangeDataFeed": "true"})
    write_deltalake(root, pa.table({"id": [4]}), mode="append")
    return root


def lance_dataset(root: Path) -> Path:
    lance.write_dataset(rows(range(5)), str(root))
    lance.write_dataset(rows(range(5, 7)), str(root), mode="append")
    return root


@pytest.fixture
def resolutions(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Every location whose storage is resolved from now on (the real resolver still answers)."""
    seen: list[str] = []
    real: Callable[[str, Mapping[str, str] | None], Storage] = storage_for

    def counting(location: str, options: Mapping[str, str] | None = None) -> Storage:
        seen.append(location)
        return real(location, options)

    monkeypatch.setattr(deltatail.tailer.table, "storage_for", counting)
    return seen


def test_the_format_is_told_by_layout_prefix_or_setting(tmp_path: Path) -> None:
    delta = delta_table(tmp_path / "d")
    ds = lance_dataset(tmp_path / "l")
    assert open_table(str(delta)).format.name == "delta"
    assert open_table(str(ds)).format.name == "lance"
    by_prefix = open_table(f"lance://{ds}")
    assert (by_prefix.format.name, by_prefix.uri) == ("lance", str(ds))
    assert open_table(str(ds), format_name="delta").format.name == "delta"  # told: no look
    nothing = open_table(str(tmp_path / "none"))
    assert nothing.format is FALLBACK  # the Delta reader names what is missing
    assert isinstance(nothing.storage, LocalStorage) and nothing.external_roots == ()


def test_a_handle_holds_what_it_was_opened_with_and_hides_its_options(tmp_path: Path) -> None:
    table = open_table(
        "s3://bucket/t",
        {"aws_secret_access_key": "s3cr3t", "aws_region": "eu-west-1"},
        external_roots=("s3://other/root",),
        format_name="delta",
    )
    assert table.uri == "s3://bucket/t" and table.external_roots == ("s3://other/root",)
    assert table.storage.remote and not table.storage.local_files
    assert dict(table.storage_options)["aws_region"] == "eu-west-1"
    assert "s3cr3t" not in repr(table)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda p: open_table(f"lance://{p}", format_name="delta"), "is a lance:// URI, but format delta was given"),
        (lambda p: open_table(str(p), format_name="hudi"), "format='hudi' is neither delta nor iceberg nor lance"),
        (lambda p: open_table(str(p), {"aws_region": "x"}), "storage options apply to object stores"),
        (lambda p: format_named("parquet", setting="option format"), "option format='parquet'"),
    ],
)
def test_bad_locations_and_formats_are_config_errors(
    tmp_path: Path, call: Callable[[Path], object], message: str
) -> None:
    with pytest.raises(ConfigError, match=message):
        call(tmp_path)


def test_discovery_asks_each_format_to_claim_a_directory(tmp_path: Path) -> None:
    delta = delta_table(tmp_path / "d")
    ds = lance_dataset(tmp_path / "l")
    (tmp_path / "plain" / "_versions").mkdir(parents=True)  # no manifest: not a dataset
    assert claimed(str(delta)) is format_named("delta")
    assert claimed(str(ds)) is format_named("lance")
    assert claimed(str(tmp_path / "plain")) is None
    assert format_names() == tuple(sorted(f.name for f in FORMATS)) == ("delta", "iceberg", "lance")


@pytest.mark.parametrize("kind", ["delta", "lance"])
def test_one_run_resolves_the_tables_storage_once(tmp_path: Path, kind: str, resolutions: list[str]) -> None:
    root = delta_table(tmp_path / "t") if kind == "delta" else lance_dataset(tmp_path / "t")
    out = tmp_path / "out.jsonl"
    args = ["run", str(root), "--state-dir", str(tmp_path / "st"), "--sink", f"jsonl:{out}", "--until-caught-up"]
    assert main(args) == 0
    assert len(out.read_text().splitlines()) == (4 if kind == "delta" else 7)
    assert resolutions == [str(root)]


def test_snapshot_and_changes_resolve_the_storage_once(
    tmp_path: Path, resolutions: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    root = delta_table(tmp_path / "t")
    assert main(["snapshot", str(root), "--json"]) == 0
    assert orjson.loads(capsys.readouterr().out)["version"] == DeltaTable(str(root)).version() == 1
    assert main(["changes", str(root), "--starting-version", "1"]) == 0
    assert [orjson.loads(line)["id"] for line in capsys.readouterr().out.splitlines()] == [4]
    assert resolutions == [str(root), str(root)]


def test_audit_refuses_a_format_without_audit_events(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    ds = lance_dataset(tmp_path / "l")
    assert main(["audit", str(ds)]) == 2
    assert "not Lance datasets" in capsys.readouterr().err
    assert main(["audit", str(ds), "--follow", "--state-dir", str(tmp_path / "st")]) == 2
    assert "not Lance datasets" in capsys.readouterr().err


def test_an_unreachable_store_is_a_transient_error_only_when_the_format_must_be_looked_at() -> None:
    with socket.socket() as s:  # a port nobody listens on: the connection is refused
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    options = {
        "aws_endpoint": f"http://127.0.0.1:{port}",
        "aws_allow_http": "true",
        "aws_region": "us-east-1",
        "aws_access_key_id": "test",
        "aws_secret_access_key": "test",
        "max_retries": "0",
        "retry_timeout": "1s",
    }
    with pytest.raises(StorageError) as e:
        open_table("s3://bucket/t", options)
    assert e.value.transient and e.value.table == "s3://bucket/t"
    assert open_table("lance://s3://bucket/t", options).format.name == "lance"  # the prefix tells: no request


def test_a_service_table_made_without_a_handle_opens_one_in_the_fallback_format(tmp_path: Path) -> None:
    root = str(delta_table(tmp_path / "t"))
    made = TableSource(
        "t", tailer_config(root, "", TableSettings()), lambda _: JsonLinesSink(str(tmp_path / "out.jsonl"))
    )
    assert made.table_format == FALLBACK.name and made.handle().format is FALLBACK
    local_with_options = TableSource(
        "t", tailer_config(root, "", TableSettings(storage={"aws_region": "x"})), made.make_sink
    )
    with pytest.raises(ConfigError, match="storage options apply to object stores"):
        local_with_options.handle()
