"""Start-up cost of the command line, next to a Python process reading the same table with ``deltalake``.

Run ``.venv/bin/python -m benchmarks.startup`` (about a minute on two cores) or add ``--quick`` for a
smoke run. Each case is a fresh child process, timed from outside: wall time, user CPU and peak RSS
(``resource.getrusage(RUSAGE_CHILDREN)`` of a helper process that runs exactly one child, so the peak is
that child's). Cases run interleaved, ``--runs`` times each; the medians are printed.

Every child reads compiled bytecode, as an installed wheel's modules are (pip compiles them): the
children write and read it under a temporary ``PYTHONPYCACHEPREFIX`` (``PYTHONDONTWRITEBYTECODE``
removed), and each case runs once unmeasured first. Without that, in an environment that sets
``PYTHONDONTWRITEBYTECODE`` and a source checkout (an editable install has no ``.pyc`` files), every
start would compile every deltatail module it imports from source (``--compile-every-start``
measures that).

Cases: ``import deltatail``; ``from deltatail import ChangeFeed`` (the Python API's change feed);
``deltatail --version``; ``deltatail run --until-caught-up`` of a small
table (3 versions, 300 rows, change data feed on) into a JSON lines file, from a fresh state
directory; ``deltatail status`` of that state directory; and the peer: ``python -c`` building
``deltalake.DeltaTable(path)`` and reading ``load_cdf(starting_version=0).read_all()`` of the same table.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

import orjson

#: Runs one command given as JSON argv in a child and prints its wall seconds, user seconds and peak KiB.
_MEASURE = """
import resource, subprocess, sys, time, json
argv = json.loads(sys.argv[1])
t0 = time.perf_counter()
code = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode
wall = time.perf_counter() - t0
r = resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps([code, wall, r.ru_utime, r.ru_maxrss]))
"""

_PEER = (
    "import sys, deltalake; t = deltalake.DeltaTable(sys.argv[1]); "
    "n = t.load_cdf(starting_version=0).read_all().num_rows; assert n > 0"
)


def _write_table(root: Path) -> Path:
    import pyarrow as pa
    from deltalake import write_deltalake

    table = root / "small"
    for v in range(3):
        ids = list(range(v * 100, (v + 1) * 100))
        rows = pa.table({"id": ids, "name": [f"n{i}" for i in ids]})
        write_deltalake(str(table), rows, mode="append", configuration={"delta.enableChangeDataFeed": "true"})
    return table


def _child_env(pycache: Path | None) -> dict[str, str]:
    """The children's environment: bytecode written and read under ``pycache`` (``None``: as inherited)."""
    env = dict(os.environ)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    return env


def _measure(argv: list[str], env: dict[str, str]) -> tuple[float, float, float]:
    """Wall s, user CPU s and peak RSS MiB of one run of ``argv``."""
    done = subprocess.run(
        [sys.executable, "-c", _MEASURE, orjson.dumps(argv).decode()],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    code, wall, user, kib = orjson.loads(done.stdout)
    if code != 0:
        raise SystemExit(f"{argv} exited {code}")
    return wall, user, kib / 1024


def _cases(table: Path, work: Path) -> dict[str, list[str]]:
    script = str(Path(sys.executable).parent / "deltatail")
    state = work / "state"
    return {
        "import deltatail": [sys.executable, "-c", "import deltatail"],
        "from deltatail import ChangeFeed": [sys.executable, "-c", "from deltatail import ChangeFeed"],
        "deltatail --version": [script, "--version"],
        "deltatail run --until-caught-up": [
            script,
            "run",
            str(table),
            "--state-dir",
            str(state),
            "--until-caught-up",
            "--sink",
            f"jsonl:{work / 'out.jsonl'}",
        ],
        "deltatail status": [script, "status", str(state)],
        "peer: DeltaTable + load_cdf": [sys.executable, "-c", _PEER, str(table)],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs of each case (default 5)")
    parser.add_argument("--quick", action="store_true", help="3 runs of each case")
    parser.add_argument(
        "--compile-every-start",
        action="store_true",
        help="no bytecode cache: the children inherit the environment (PYTHONDONTWRITEBYTECODE...) as it is",
    )
    args = parser.parse_args()
    runs = 3 if args.quick else args.runs
    print(f"{platform.machine()} {os.cpu_count()} cores, Python {platform.python_version()}, load {os.getloadavg()}")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        table = _write_table(work)
        cases = _cases(table, work)
        env = _child_env(None if args.compile_every_start else work / "pycache")
        figures: dict[str, list[tuple[float, float, float]]] = {name: [] for name in cases}
        for i in range(runs + 1):  # the first round unmeasured: it writes the bytecode the others read
            for name, argv in cases.items():
                if name.startswith("deltatail run"):
                    shutil.rmtree(work / "state", ignore_errors=True)
                    (work / "out.jsonl").unlink(missing_ok=True)
                measured = _measure(argv, env)
                if i > 0:
                    figures[name].append(measured)
    cache = "compiled every start" if args.compile_every_start else "bytecode cached"
    print(f"median of {runs} runs ({cache})  wall s   user s   peak RSS MiB")
    for name, rows in figures.items():
        wall, user, rss = (statistics.median(col) for col in zip(*rows, strict=True))
        print(f"{name:<32} {wall:6.2f}   {user:6.2f}   {rss:8.1f}")


if __name__ == "__main__":
    main()
