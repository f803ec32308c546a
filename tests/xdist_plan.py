"""How the suite's tests are shared out between pytest-xdist workers (a pytest plugin, ``-p xdist_plan``).

pytest-xdist's ``--dist loadfile`` keeps each test file on one worker, so that a file's expensive
fixtures (a Spark session, the Flink JVM, the object-store servers, tables built once per module)
start once, as in a serial run. It hands the files out in order of their number of tests, so that the
files of many fast tests went first and a file of a few long tests (the damaged-table sweep, the soak
test, Flink) could start last and run alone on one worker while the other had nothing left to do.

This scheduler keeps the file as the unit and changes three things:

- the files are handed out longest first, by :data:`SECONDS` (each file's time in a two-worker run
  of the whole suite; a file missing from it counts :data:`SECONDS_PER_TEST` a test), so that the
  long files start early and the short ones fill the gaps at the end;
- the tests of a file in :data:`SPREAD` are units of their own: such a file has no fixture that
  costs more to start twice than its tests take (each test copies its own tables), and kept whole
  it would be the longest unit of the run;
- the files of a group in :data:`GROUPS` are one unit: the files that start a Spark JVM run on one
  worker, which starts it once.

The plugin is listed in ``addopts`` (``pyproject.toml``) and does nothing without xdist (``-n 0``,
``-p no:xdist``).
"""

from __future__ import annotations

from typing import Any

import pytest

#: Seconds of the files that took a minute or more in a two-worker run of the whole suite with
#: ``DELTATAIL_DAMAGE_SWEEP=1`` (2026-11-27, the 2-core machine at a load average of about 20, so
#: several times the idle figures; the run was stopped at 3,131 of 3,645 tests, and the damaged-table
#: sweep's five tables not reached are counted at the mean of its three that ran). Only the order
#: matters. Four files were cut on 2026-11-28 and re-measured one file at a time with ``-n 0`` at a
#: load average of 15 to 21 (so on the same scale): the damaged-table sweep parses with one parser
#: (the table measured: 69 s -> 40 s), the reader-pool corpus comparisons share one pool (234 tests in
#: 424 s, where 15 tests had taken 750 s), the object-store history table is written once per store,
#: and the audit usage errors run in-process. The crash campaigns of three files start ``deltatail`` through
#: the test launcher (tests/launcher.py) since 2026-11-28; measured one file at a time with ``-n 0`` at a load
#: average of 1.3 to 3 (about idle) and put on this scale (about 2.2 times the idle figures, from the Kafka
#: file's 1,255 s against its tests' idle times): the Kafka file's five campaign tests 392 s -> 168 s, the
#: tailer's crash file about 190 s -> 112 s, the Lance run file 23 s. Two more on 2026-11-28 (``-n 0``,
#: load average 2 to 4), converted to this scale by the sweep's ratio (277 s idle then = 800 here): the
#: damaged-table sweep reuses one table copy per test (277 s -> 178 s), ``test_run.py`` waits for rows or
#: per-commit cursors instead of the 5 s checkpoint timer (its three tests 34 s -> 9 s; the file about
#: 55 s -> 30 s); the notification hubs' close no longer waits out a 20-second long poll. On 2026-11-28
#: eight more files start ``deltatail`` through the launcher (the audit campaigns also write their between-run
#: commits in-process), measured one file at a time with ``-n 0`` at a load average of 8 to 12, where the
#: Delta audit campaign ran 2.4 times its idle time (so about this scale; the mean of two runs after, the
#: launcher's own start included): the tests' seconds before -> after: serve faults 162 -> 127, Iceberg audit
#: follow 160 -> 105, audit follow 139 -> 84, on-demand snapshots 221 -> 42, Kafka signals 89 -> 27,
#: interleaved snapshots 97 -> 19, Kafka transactions 36 -> 32, the fifty-table serve 42 -> 47 (its two
#: starts saved less than the launcher's start, which a worker pays once for all its files). Nine more on
#: 2026-11-28, commands that are not about the process run in-process (``-n 0``; before -> after at a load
#: average of about 2, put on this scale at 2.2 times the after figure): unsafe paths 35 s -> 14 s, CLI UX
#: 50 s -> 13 s, audit CLI 24 s -> 11 s; at a load average of 4 to 8 (the after figure taken as it is):
#: cursor control 47 s -> 9 s, the CLI file 51 s -> 9 s, lag and status 33 s -> 12 s, data loss
#: 67 s -> 13 s, sink holdings 20 s -> 6 s; and the object-store tables read each local copy once for its
#: three stores (89 s -> 82 s at a load average of 3).
SECONDS: dict[str, float] = {
    "tests/sinks/test_kafka_tailer.py": 770,
    "tests/sinks/test_spark.py": 743,
    "tests/sinks/test_spark_lance.py": 567,
    "tests/tailer/test_damaged_tables.py": 515,
    "tests/tailer/test_reader_pool.py": 480,
    "tests/tailer/stores/test_objectstore_tables.py": 180,
    "tests/tailer/test_unsafe_paths.py": 31,
    "tests/tailer/test_run_crash.py": 240,
    "tests/state/test_action_validation.py": 258,
    "tests/sinks/test_kafka_avro.py": 241,
    "tests/test_layers.py": 203,
    "tests/tailer/test_run.py": 200,
    "tests/tailer/test_audit_cli.py": 23,
    "tests/tailer/test_iceberg_changes.py": 143,
    "tests/tailer/stores/test_objectstore_notifications.py": 100,
    "tests/state/test_variant.py": 94,
    "tests/tailer/test_conformance.py": 94,
    "tests/tailer/test_serve_config.py": 93,
    "tests/tailer/test_rows.py": 71,
    "tests/tailer/test_cli_ux.py": 28,
    "tests/tailer/test_cursor_control.py": 8,
    "tests/tailer/test_cli.py": 10,
    "tests/tailer/test_lag_and_status.py": 12,
    "tests/tailer/test_data_loss.py": 13,
    "tests/tailer/test_sink_holdings.py": 6,
    "tests/tailer/test_lance_run.py": 50,
    "tests/sinks/test_kafka.py": 69,
    "tests/tailer/stores/test_objectstore_storage.py": 64,
    "tests/tailer/test_serve_faults.py": 127,
    "tests/tailer/test_iceberg_audit_follow.py": 105,
    "tests/tailer/test_audit_follow.py": 84,
    "tests/tailer/test_serve.py": 47,
    "tests/tailer/test_on_demand_snapshots.py": 42,
    "tests/sinks/test_kafka_transactions.py": 32,
    "tests/sinks/test_kafka_signals.py": 27,
    "tests/tailer/test_interleaved_snapshots.py": 19,
}

#: The weight of a test of a file not in :data:`SECONDS` (the same run's mean over its other tests).
SECONDS_PER_TEST = 0.4

#: Files whose tests are shared out one by one instead of as a file.
SPREAD: frozenset[str] = frozenset({"tests/tailer/test_damaged_tables.py"})

#: Files scheduled together as one unit (on one worker): the files that start a local Spark session,
#: so that one worker starts the JVM (the session is kept for the process: ``getOrCreate``).
#: Kept as one unit (2026-11-28): the group weighs about 1,400 of the run's ~7,700 seconds, well under
#: one worker's half, so with the units handed out longest first it ends before the other worker's
#: share and splitting it would not end the run sooner; a second ``local[2]`` JVM would cost its start
#: and about a gigabyte, and two JVMs would compete for the same two cores (at a load average of 21 a
#: bare local session, started alone, failed with an RPC timeout).
GROUPS: dict[str, str] = {
    "tests/sinks/test_spark.py": "spark-jvm",
    "tests/sinks/test_spark_iceberg.py": "spark-jvm",
    "tests/sinks/test_spark_lance.py": "spark-jvm",
    "tests/sinks/test_spark_objectstore.py": "spark-jvm",
}


def scope_of(nodeid: str) -> str:
    """The unit a test is scheduled in: its file, its file's group, or the test itself in a :data:`SPREAD` file."""
    path = nodeid.split("::", 1)[0]
    if path in SPREAD:
        return nodeid
    return GROUPS.get(path, path)


def longest_first(units: dict[str, dict[str, bool]]) -> list[str]:
    """The units' scopes, heaviest first (ties in collection order).

    A unit weighs the sum of its tests' shares: a test of a file in :data:`SECONDS` its file's time
    divided by the file's tests, any other test :data:`SECONDS_PER_TEST`.
    """
    per_file: dict[str, int] = {}
    for tests in units.values():
        for nodeid in tests:
            path = nodeid.split("::", 1)[0]
            per_file[path] = per_file.get(path, 0) + 1

    def share(nodeid: str) -> float:
        path = nodeid.split("::", 1)[0]
        return SECONDS[path] / per_file[path] if path in SECONDS else SECONDS_PER_TEST

    weights = {scope: sum(share(n) for n in tests) for scope, tests in units.items()}
    return sorted(units, key=lambda s: -weights[s])  # sorted() is stable: ties keep collection order


def _make_scheduler_class() -> type[Any]:
    from xdist.scheduler import LoadScopeScheduling  # type: ignore[import-untyped]

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
