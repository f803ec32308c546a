"""The front door: ``deltatail --version``, ``python -m deltatail`` and ``import deltatail``."""

from __future__ import annotations

import importlib.metadata
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from setuptools.config.expand import read_attr

ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
#: The version the wheel's metadata gets: setuptools reads the attribute pyproject.toml names, as a build does.
VERSION = read_attr(PROJECT["tool"]["setuptools"]["dynamic"]["version"]["attr"], root_dir=ROOT)


def test_the_command_says_its_version() -> None:
    done = subprocess.run([sys.executable, "-m", "deltatail", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"deltatail {VERSION}", done


def test_the_version_is_written_once_and_agrees_everywhere() -> None:
    # pyproject.toml takes it from deltatail/_version.py; the installed metadata, __version__ and --version agree.
    assert "version" not in PROJECT["project"] and "version" in PROJECT["project"]["dynamic"]
    assert PROJECT["tool"]["setuptools"]["dynamic"]["version"] == {"attr": "deltatail._version.__version__"}
    assert VERSION == "0.1.0"  # the text of deltatail/_version.py
    assert importlib.metadata.version("deltatail") == VERSION  # written by `pip install` from pyproject.toml
    import deltatail

    assert deltatail.__version__ == VERSION
    script = subprocess.run([str(_SCRIPT), "--version"], capture_output=True, text=True)
    full = subprocess.run([sys.executable, "-m", "deltatail", "-v", "--version"], capture_output=True, text=True)
    assert script.stdout == full.stdout == f"deltatail {VERSION}\n", (script, full)


def test_python_dash_m_deltatail_runs_the_command() -> None:
    done = subprocess.run([sys.executable, "-m", "deltatail", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"deltatail {VERSION}", done
    usage = subprocess.run([sys.executable, "-m", "deltatail"], capture_output=True, text=True)
    assert usage.returncode == 2 and "usage: deltatail" in usage.stderr


def test_import_deltatail_exposes_the_public_api(tmp_path: Path) -> None:
    import deltatail

    assert deltatail.__version__ == VERSION
    for name in ("ChangeFeed", "DeltaLog", "Tailer", "TailerConfig", "Sink", "Position", "DeltaTailError"):
        assert name in deltatail.__all__ and hasattr(deltatail, name), name
    assert issubclass(deltatail.UnsafePathError, deltatail.DeltaTailError)
    missing = tmp_path / "nothing"
    with pytest.raises(deltatail.DeltaTailError, match=str(missing)):
        deltatail.DeltaLog(str(missing)).latest_version()


#: Run first in a child process: at its exit (also by sys.exit), print the top-level modules it imported.
_AT_EXIT = "import atexit, sys; atexit.register(lambda: print(*sorted({m.split('.')[0] for m in sys.modules})))"
#: What a command that only starts must not import (the command line's and the readers' dependencies).
_HEAVY = {"pyarrow", "numpy", "pandas", "deltalake", "lance", "kafka", "sqlglot", "orjson"}
_SCRIPT = Path(sys.executable).parent / "deltatail"


@pytest.mark.parametrize(
    ("code", "printed"),
    [
        ("import deltatail", ""),
        ("import deltatail; print(deltatail.__version__)", VERSION),
        ("from deltatail import main; sys.exit(main(['--version']))", f"deltatail {VERSION}"),
        # the console script the wheel installs, as `deltatail --version` runs it
        (
            f"import runpy; sys.argv = [{str(_SCRIPT)!r}, '--version']; "
            f"runpy.run_path({str(_SCRIPT)!r}, run_name='__main__')",
            f"deltatail {VERSION}",
        ),
    ],
)
def test_import_deltatail_and_the_version_do_not_import_pyarrow(code: str, printed: str) -> None:
    # The public names load on first use (deltatail/__init__.py): a command starts in the time its own work needs.
    done = subprocess.run([sys.executable, "-c", f"{_AT_EXIT}; {code}"], capture_output=True, text=True)
    assert done.returncode == 0, done
    *lines, modules = done.stdout.splitlines()
    assert "\n".join(lines) == printed
    loaded = set(modules.split())
    assert "deltatail" in loaded
    assert not loaded & _HEAVY, sorted(loaded & _HEAVY)


def test_a_public_name_imports_its_module_on_first_use() -> None:
    code = "import deltatail, sys; deltatail.DeltaLog; print('pyarrow' in sys.modules, 'DeltaLog' in dir(deltatail))"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.split() == ["True", "True"]
    import deltatail

    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        deltatail.Nothing  # noqa: B018


def test_the_command_line_imports_the_sql_parser_and_kafka_only_when_used() -> None:
    # A command without --filter, or without a Kafka sink, does not import sqlglot or kafka-python at start.
    code = (
        f"{_AT_EXIT}; import deltatail.tailer.cli.main, deltatail.sinks.uris; "
        "from deltatail.tailer.cli.sink_uri import open_sink; open_sink('jsonl:-'); "
        "print('sqlglot' in sys.modules, 'kafka' in sys.modules); "
        "from deltatail.state.filters import compile_predicate; compile_predicate('id > 1', {'id'}); "
        "open_sink('kafka://127.0.0.1:9/t'); print('sqlglot' in sys.modules, 'kafka' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done
    assert done.stdout.splitlines()[:2] == ["False False", "True True"], done.stdout


#: Modules a `deltatail run` of a Delta table never needs: the other formats, audit, serve, the progress bars.
_NOT_FOR_A_DELTA_RUN = {
    "lance",
    "pyiceberg",
    "rich",
    "prometheus_client",
    "deltatail.tailer.formats.iceberg",
    "deltatail.tailer.formats.lance",
    "deltatail.tailer.iceberg",
    "deltatail.tailer.lance",
    "deltatail.tailer.cli.audit",
    "deltatail.tailer.cli.serve",
    "deltatail.tailer.cli.demo",
    # the object-store client, the audit model and its webhooks, the SQL parser, the version's metadata
    "obstore",
    "asyncio",
    "sqlglot",
    "urllib.request",
    "deltatail.tailer.storage.objectstore",
    "deltatail.state.audit",
    "deltatail.tailer.audit.feed",
    "deltatail.tailer.audit.alerts",
}


def test_run_on_a_delta_table_imports_no_other_format_audit_serve_or_rich(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": [1, 2, 3]}))
    out = tmp_path / "out.jsonl"
    argv = ["run", str(table), "--state-dir", str(tmp_path / "state"), "--until-caught-up", "--sink", f"jsonl:{out}"]
    code = (
        "import sys; from deltatail.tailer.cli.main import main; code = main(sys.argv[1:]); "
        "print(*sorted(sys.modules)); sys.exit(code)"
    )
    done = subprocess.run([sys.executable, "-c", code, *argv], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    loaded = set(done.stdout.split())
    assert "deltatail.tailer.formats.delta" in loaded  # the child really ran the command
    assert not loaded & _NOT_FOR_A_DELTA_RUN, sorted(loaded & _NOT_FOR_A_DELTA_RUN)
    assert [m for m in loaded if m.startswith(("deltatail.tailer.iceberg.", "deltatail.tailer.lance."))] == []
    rows = [line for line in out.read_text().splitlines() if line]
    assert len(rows) == 3  # written by deltalake above: three inserted rows
    # the cursor commands read the state directory and the log: no sink, audit model, object store or parser either
    for command in (["status", str(tmp_path / "state")], ["signal", str(tmp_path / "state"), "status"]):
        shown = subprocess.run([sys.executable, "-c", code, *command], capture_output=True, text=True)
        assert shown.returncode == 0, shown.stderr
        *lines, modules = shown.stdout.splitlines()
        assert str(table) in "\n".join(lines)
        loaded = set(modules.split())
        assert "deltatail.tailer.cli.cursor" in loaded
        not_needed = _NOT_FOR_A_DELTA_RUN | {"importlib.metadata", "email", "deltatail.sinks"}
        assert not loaded & not_needed, (command, sorted(loaded & not_needed))


def _loaded_after(code: str, *argv: str) -> set[str]:
    """Every module a child process has imported once ``code`` ran (it may use ``sys.argv``)."""
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; {code}; print(*sorted(sys.modules))", *argv],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    return set(done.stdout.splitlines()[-1].split())


#: What the Python API's change feed leaves to the first use that needs it (pyarrow.compute: a filter, a deletion
#: vector, a type cast; the variant codecs: a variant column; obstore: an object-store URI; the audit model).
_NOT_FOR_THE_FEED = {
    "pyarrow.compute",
    "obstore",
    "asyncio",
    "sqlglot",
    "email",
    "importlib.metadata",
    "deltatail.state.audit",
    "deltatail.state.variant",
    "deltatail.tailer.storage.objectstore",
    "deltatail.tailer.audit.feed",
}


def test_import_deltatail_reads_no_distribution_metadata() -> None:
    loaded = _loaded_after("import deltatail; deltatail.__version__")
    assert "deltatail._version" in loaded
    assert not loaded & {"importlib.metadata", "email"}, sorted(loaded & {"importlib.metadata", "email"})


def test_the_change_feed_imports_no_compute_kernels_object_store_or_audit(tmp_path: Path) -> None:
    import pyarrow as pa
    from deltalake import write_deltalake

    table = tmp_path / "t"
    write_deltalake(str(table), pa.table({"id": [1, 2, 3]}))
    write_deltalake(str(table), pa.table({"id": [4]}), mode="append")
    loaded = _loaded_after("from deltatail import ChangeFeed")
    assert "deltatail.tailer.read.feed" in loaded
    assert not loaded & _NOT_FOR_THE_FEED, sorted(loaded & _NOT_FOR_THE_FEED)
    # reading a plain local table's changes needs none of them either
    read = (
        "from deltatail import ChangeFeed; "
        "print(sorted(r for b in ChangeFeed(sys.argv[1]).batches(0, 1) for r in b.rows.column('id').to_pylist()))"
    )
    done = subprocess.run(
        [sys.executable, "-c", f"import sys; {read}; print(*sorted(sys.modules))", str(table)],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    rows, modules = done.stdout.splitlines()
    assert rows == "[1, 2, 3, 4]"  # written by deltalake above
    assert not set(modules.split()) & _NOT_FOR_THE_FEED, sorted(set(modules.split()) & _NOT_FOR_THE_FEED)
