"""The suite's xdist scheduling (``tests/xdist_plan.py``): which tests go together, and in what order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import xdist_plan
from xdist_plan import longest_first, scope_of

SWEEP = "tests/tailer/test_damaged_tables.py"


def test_a_file_is_one_unit_a_spread_file_a_unit_per_test_and_the_spark_files_one_unit() -> None:
    assert scope_of("tests/state/test_cursor.py::test_a[1]") == "tests/state/test_cursor.py"
    assert scope_of("tests/state/test_cursor.py::TestX::test_b") == "tests/state/test_cursor.py"
    test = f"{SWEEP}::test_every_file_damaged_every_way[t1]"
    assert scope_of(test) == test
    spark = {scope_of(f"tests/sinks/{f}::test_x") for f in ("test_spark.py", "test_spark_lance.py")}
    assert spark == {"spark-jvm"}
    assert scope_of("tests/sinks/test_spark_formats.py::test_x") == "tests/sinks/test_spark_formats.py"


def test_units_are_handed_out_heaviest_first(monkeypatch: pytest.MonkeyPatch) -> None:
    seconds = {"a.py": 10.0, "b.py": 300.0, SWEEP: 400.0, "s1.py": 60.0, "s2.py": 80.0}
    monkeypatch.setattr(xdist_plan, "SECONDS", seconds)
    monkeypatch.setattr(xdist_plan, "SECONDS_PER_TEST", 1.0)
    units = {
        "a.py": {"a.py::t": False},  # 10 s
        "many.py": {f"many.py::t{i}": False for i in range(50)},  # not in SECONDS: 50 tests at 1 s
        "b.py": {"b.py::t": False},  # 300 s
        f"{SWEEP}::x": {f"{SWEEP}::x": False},  # 400 s over its 4 tests: 100 s each
        f"{SWEEP}::y": {f"{SWEEP}::y": False},
        f"{SWEEP}::z": {f"{SWEEP}::z": False},
        f"{SWEEP}::w": {f"{SWEEP}::w": False},
        "group": {"s1.py::t": False, "s2.py::t1": False, "s2.py::t2": False},  # 60 + 80 s
        "c.py": {"c.py::t": False},  # not in SECONDS: 1 s
    }
    assert longest_first(units) == [
        "b.py",
        "group",
        f"{SWEEP}::x",
        f"{SWEEP}::y",
        f"{SWEEP}::z",
        f"{SWEEP}::w",
        "many.py",
        "a.py",
        "c.py",
    ]


@pytest.mark.slow
def test_two_workers_start_the_heaviest_file_first_and_share_a_spread_file(tmp_path: Path) -> None:
    """A real two-worker run over three files with the plugin (weights set by the run's conftest)."""
    tests = tmp_path / "tests" / "tailer"
    tests.mkdir(parents=True)
    (tmp_path / "conftest.py").write_text(
        f"import xdist_plan\nxdist_plan.SECONDS = {{'tests/test_light.py': 100.0, {SWEEP!r}: 40.0}}\n"
    )
    (tmp_path / "tests" / "test_light.py").write_text("def test_one():\n    pass\n")
    (tmp_path / "tests" / "test_many.py").write_text("\n".join(f"def test_{i}():\n    pass\n" for i in range(5)))
    (tests / "test_damaged_tables.py").write_text("\n".join(f"def test_{i}():\n    pass\n" for i in range(4)))
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-n", "2", "--dist", "loadfile", "-p", "xdist_plan", "-v", "tests"],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(Path(xdist_plan.__file__).parent)},
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    passed = [line.split() for line in done.stdout.splitlines() if " PASSED " in line]
    assert sorted(words[-1] for words in passed) == sorted(
        ["tests/test_light.py::test_one"]
        + [f"tests/test_many.py::test_{i}" for i in range(5)]
        + [f"{SWEEP}::test_{i}" for i in range(4)]
    )
    light_worker = next(words[0] for words in passed if words[-1] == "tests/test_light.py::test_one")
    first_of_that_worker = next(words[-1] for words in passed if words[0] == light_worker)
    assert first_of_that_worker == "tests/test_light.py::test_one", done.stdout
    assert {words[0] for words in passed if SWEEP in words[-1]} == {"[gw0]", "[gw1]"}, done.stdout
