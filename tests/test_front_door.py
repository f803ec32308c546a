"""The front door: ``deltatail --version``, ``python -m deltatail`` and ``import deltatail``."""

from __future__ import annotations

import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["version"]


def test_the_command_says_its_version() -> None:
    done = subprocess.run([sys.executable, "-m", "deltatail", "--version"], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == f"deltatail {VERSION}", done


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
