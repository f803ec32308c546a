"""How the suite's tests are shared out between pytest-xdist workers (a pytest plugin, ``-p xdist_plan``).

pytest-xdist's ``--dist loadfile`` keeps each test file on one worker, so that a file's expensive
fixtures (a Spark session, the Flink JVM, the object-store servers, tables built once per module)
start once, as in a serial run. It hands the files out in order of their number of tests, so that the
files of many fast tests went first and a file of a few long tests (the damaged-table sweep, the soak
test, Flink) could start last and run alone on one worker while the other had nothing left to do.

This scheduler keeps the file as the unit and changes two things:

- the files are handed out longest first, by :data:`SECONDS` (each file's time in a two-worker run
  of the whole suite; a file missing from it counts :data:`SECONDS_PER_TEST` a test), so that the
  long files start early and the short ones fill the gaps at the end;
- the tests of a file in :data:`SPREAD` are units of their own: such a file has no fixture that
  costs more to start twice than its tests take (each test copies its own tables), and kept whole
  it would be the longest unit of the run.

The plugin is listed in ``addopts`` (``pyproject.toml``) and does nothing without xdist (``-n 0``,
``-p no:xdist``).
"""

from __future__ import annotations

from typing import Any

import pytest

#: Seconds each file took in a two-worker run of the whole suite with ``DELTATAIL_DAMAGE_SWEEP=1``
#: (2026-11-27, on the shared 2-core machine). Only the order matters: relative figures suffice.
SECONDS: dict[str, float] = {}

#: The weight of a test of a file not in :data:`SECONDS`.
SECONDS_PER_TEST = 0.05

#: Files whose tests are shared out one by one instead of as a file.
SPREAD: frozenset[str] = frozenset(
    {
        "tests/tailer/test_damaged_tables.py",
    }
)


def scope_of(nodeid: str) -> str:
    """The unit a test is scheduled in: its file, or the test itself in a :data:`SPREAD` file."""
    path = nodeid.split("::", 1)[0]
    return nodeid if path in SPREAD else path


def weight(scope: str, tests: int) -> float:
    """The expected seconds of a unit of ``tests`` tests (a spread file's time is shared by its tests)."""
    path = scope.split("::", 1)[0]
    if path in SECONDS:
        return SECONDS[path] if scope == path else SECONDS[path] / max(tests, 1)
    return SECONDS_PER_TEST * tests


def longest_first(units: dict[str, dict[str, bool]]) -> list[str]:
    """The units' scopes, heaviest first (ties in collection order)."""
    spread: dict[str, int] = {}
    for scope in units:
        path = scope.split("::", 1)[0]
        if path != scope:
            spread[path] = spread.get(path, 0) + 1
    weights = {s: weight(s, spread.get(s.split("::", 1)[0], len(tests))) for s, tests in units.items()}
    return sorted(units, key=lambda s: -weights[s])  # sorted() is stable: ties keep collection order


def _make_scheduler_class() -> type[Any]:
    from xdist.scheduler import LoadScopeScheduling

    class PlannedScheduling(LoadScopeScheduling):  # type: ignore[misc]
        """``loadfile`` with :func:`scope_of`'s units handed out :func:`longest_first`."""

        ordered = False

        def _split_scope(self, nodeid: str) -> str:
            return scope_of(nodeid)

        def _assign_work_unit(self, node: Any) -> None:
            # The base class pops the work queue's first unit; the queue is complete at the first call.
            if not self.ordered:
                self.ordered = True
                for scope in longest_first(dict(self.workqueue)):
                    self.workqueue.move_to_end(scope)
            super()._assign_work_unit(node)

    return PlannedScheduling


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """The scheduler of the run, for ``--dist loadfile`` (the suite's setting) only."""
    if config.getoption("dist") != "loadfile":
        return None
    return _make_scheduler_class()(config, log)
