"""``deltatail serve`` under real faults: a fault of one table is that table's state, never a dead worker.

Each test runs the service in a child process and makes the fault real: file-descriptor and file-size
limits lowered on the running child (``prlimit``), a file where a table's state directory must be
created, the state root replaced by a file, an S3 table behind a proxy answering 500. While a fault
lasts, ``/readyz``, ``/metrics`` and the status lines must say the table is not delivering; once it is
removed, every sink must equal deltalake's ``load_cdf`` (no row lost, none twice).
"""

from __future__ import annotations

import resource
import sys
import textwrap
import threading
import time
from pathlib import Path

import pyarrow as pa
import pytest
from deltalake import DeltaTable, write_deltalake
from serve_child import CDF, ServeChild, delivered, expected, wait_for

from sinks.embedded import JsonLinesSink
from state.feed import ChangeBatch
from tailer.cli.configure import tailer_config
from tailer.follow.stats import TableState
from tailer.serve.service import Service, ServiceOptions, TableSource
from tailer.serve.state_root import StateRoot

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/: objectstores.py (tests/ is not a package)
from objectstores import Cloud, CountingProxy, Server

pytest_plugins = ("objectstore_fixtures",)


def rows(first: int, n: int = 3) -> pa.Table:
    return pa.table({"id": pa.array(range(first, first + n), pa.int64()), "v": ["x" * 40] * n})


def config(tmp_path: Path, tables: dict[str, str], *, extra: str = "", defaults: str = "") -> Path:
    body = "".join(f'[[tables]]\nname = "{name}"\npath = "{path}"\n' for name, path in tables.items())
    file = tmp_path / "serve.toml"
    file.write_text(
        textwrap.dedent(
            f"""\
            [service]
            state_root = "{tmp_path / "state"}"
            listen = "127.0.0.1:0"
            status_seconds = 0.5
            {extra}

            [defaults]
            sink = "jsonl:{tmp_path / "out"}/{{table_name}}.jsonl"
            checkpoint_seconds = 0.5
            poll_interval = 0.2
            {defaults}
            """
        )
        + body
    )
    (tmp_path / "out").mkdir(exist_ok=True)
    return file


def exact(child: ServeChild, out: Path, path: str, what: str, options: dict[str, str] | None = None) -> None:
    wait_for(lambda: delivered(out) == expected(path, options), what, child)


def no_crash(child: ServeChild) -> None:
    text = child.log.read_text()
    assert "Traceback" not in text and "Exception in thread" not in text, text[-3000:]


def test_too_many_open_files_makes_tables_unavailable_then_they_resume(tmp_path: Path) -> None:
    """EMFILE (RLIMIT_NOFILE lowered to stdio on the running child): the tables with news are unavailable.

    Before: ``Exception in thread deltatail-serve-1 ... OSError: [Errno 24]``, both workers dead, and the
    status lines went on saying ``following, 0 versions behind``. The HTTP server cannot accept while no
    descriptor is left, so the truth is read from the status lines then, and from the endpoints after.
    """
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    for i, path in enumerate((a, b)):
        write_deltalake(path, rows(i * 100), configuration=CDF)
    child = ServeChild(config(tmp_path, {"a": a, "b": b}), tmp_path / "serve.log")
    child.start()
    out = tmp_path / "out"
    try:
        exact(child, out / "a.jsonl", a, "a delivered")
        exact(child, out / "b.jsonl", b, "b delivered")
        mark = child.log.stat().st_size
        before = child.limit(resource.RLIMIT_NOFILE, 3)  # 0, 1, 2 only: no file, socket or pipe can be opened
        write_deltalake(a, rows(10), mode="append")
        write_deltalake(b, rows(110), mode="append")
        unavailable = lambda name: [  # noqa: E731
            e for e in child.events(mark) if e.get("event") == "table_unavailable" and e.get("table") == name
        ]
        wait_for(lambda: unavailable("a") and unavailable("b"), "both tables reported unavailable", child)
        assert "Errno 24" in unavailable("a")[0]["message"]
        first = child.log.stat().st_size
        time.sleep(1.5)  # a few rounds of status lines while the fault lasts
        reports = [e for e in child.events(first) if e.get("event") == "table_status"]
        assert reports, child.log.read_text()[-2000:]
        assert all(e["state"] == "unavailable" for e in reports), reports
        assert child.proc is not None and child.proc.poll() is None
        child.limit(resource.RLIMIT_NOFILE, before[0])
        exact(child, out / "a.jsonl", a, "a delivered after the fault")
        exact(child, out / "b.jsonl", b, "b delivered after the fault")
        wait_for(lambda: child.not_ready() == {}, "/readyz ready again", child)
        assert child.metric("deltatail_retries_total", table="a") >= 1
        assert child.get("/healthz")[0] == 200
    finally:
        code = child.stop()
    assert code == 0
    no_crash(child)


def test_a_full_sink_file_makes_its_table_unavailable_and_the_others_go_on(tmp_path: Path) -> None:
    """RLIMIT_FSIZE just above the big table's sink file: its writes fail (EFBIG), the small table's do not."""
    big, small = str(tmp_path / "big"), str(tmp_path / "small")
    write_deltalake(big, rows(0, 3000), configuration=CDF)
    write_deltalake(small, rows(10_000), configuration=CDF)
    child = ServeChild(config(tmp_path, {"big": big, "small": small}), tmp_path / "serve.log")
    child.start()
    out = tmp_path / "out"
    try:
        exact(child, out / "big.jsonl", big, "big delivered")
        exact(child, out / "small.jsonl", small, "small delivered")
        full = (out / "big.jsonl").stat().st_size + 10
        assert full > 4 * (out / "small.jsonl").stat().st_size
        before = child.limit(resource.RLIMIT_FSIZE, full)
        write_deltalake(big, rows(5000, 50), mode="append")
        write_deltalake(small, rows(10_010), mode="append")
        wait_for(lambda: "big" in (child.not_ready() or {}), "/readyz to say big is not ready", child)
        assert "unavailable" in (child.not_ready() or {})["big"] and "Errno 27" in (child.not_ready() or {})["big"]
        exact(child, out / "small.jsonl", small, "small delivered while big's sink is full")
        for _ in range(5):  # while the fault lasts, every scrape says so
            assert (child.states() or {}).get("big") == "unavailable"
            assert set(child.not_ready() or {}) == {"big"}
            time.sleep(0.3)
        assert child.metric("deltatail_table_state", table="small", state="following") == 1.0
        child.limit(resource.RLIMIT_FSIZE, before[0])
        exact(child, out / "big.jsonl", big, "big delivered after the fault")
        wait_for(lambda: child.not_ready() == {}, "/readyz ready again", child)
    finally:
        code = child.stop()
    assert code == 0
    no_crash(child)


def test_a_table_whose_state_directory_cannot_be_made_is_unavailable_alone(tmp_path: Path) -> None:
    """A file where the table's state directory must be created: that table retries, the other runs."""
    a, c = str(tmp_path / "a"), str(tmp_path / "c")
    write_deltalake(a, rows(0), configuration=CDF)
    write_deltalake(c, rows(100), configuration=CDF)
    (tmp_path / "state").mkdir()
    blocker = tmp_path / "state" / DeltaTable(c).metadata().id
    blocker.write_text("not a directory\n")
    child = ServeChild(config(tmp_path, {"a": a, "c": c}), tmp_path / "serve.log")
    child.start()
    out = tmp_path / "out"
    try:
        exact(child, out / "a.jsonl", a, "a delivered")
        wait_for(lambda: "c" in (child.not_ready() or {}), "/readyz to say c is not ready", child)
        assert "unavailable" in (child.not_ready() or {})["c"]
        assert (child.states() or {}) == {"a": "following", "c": "unavailable"}
        assert child.get("/healthz")[0] == 200  # one table's fault is not the process's
        blocker.unlink()
        write_deltalake(c, rows(110), mode="append")
        exact(child, out / "c.jsonl", c, "c delivered once its state directory can be made")
        wait_for(lambda: child.not_ready() == {}, "/readyz ready", child)
    finally:
        code = child.stop()
    assert code == 0
    no_crash(child)


def test_an_unusable_state_root_fails_healthz_and_exits_non_zero(tmp_path: Path) -> None:
    """The state root replaced by a file: /healthz 503, then exit 1 after fatal_seconds; a restart is exact."""
    a = str(tmp_path / "a")
    write_deltalake(a, rows(0), configuration=CDF)
    file = config(tmp_path, {"a": a}, extra="fatal_seconds = 2")
    child = ServeChild(file, tmp_path / "serve.log")
    child.start()
    out, state = tmp_path / "out", tmp_path / "state"
    try:
        exact(child, out / "a.jsonl", a, "a delivered")
        assert child.get("/healthz")[0] == 200
        state.rename(tmp_path / "state.away")
        state.write_text("not a directory\n")
        write_deltalake(a, rows(10), mode="append")
        wait_for(lambda: child.get("/healthz")[0] in (0, 503), "/healthz to fail", child, timeout=30)
        code, body = child.get("/healthz")
        assert code in (0, 503)  # 0: it exited already
        if code == 503:
            assert b"state root" in body
        assert child.proc is not None
        assert child.proc.wait(60) == 1
    finally:
        child.kill()
    text = child.log.read_text()
    assert "the service cannot serve and stops" in text and "state root" in text, text[-3000:]
    no_crash(child)
    state.unlink()
    (tmp_path / "state.away").rename(state)
    write_deltalake(a, rows(20), mode="append")
    child.start()
    try:
        exact(child, out / "a.jsonl", a, "a delivered after the restart")
    finally:
        assert child.stop() == 0


class BuggySink(JsonLinesSink):
    """A sink with a bug: its second write raises what no sink may raise (not a deltatail error)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.writes = 0

    def write(self, batch: ChangeBatch) -> None:
        self.writes += 1
        if self.writes == 2:
            raise RuntimeError("a bug in a sink")
        super().write(batch)


def test_an_unexpected_error_fails_its_table_and_the_one_worker_goes_on(tmp_path: Path) -> None:
    """A programming error in one table's step: that table is failed with the error's text; the worker lives."""
    bug, ok = str(tmp_path / "bug"), str(tmp_path / "ok")
    write_deltalake(bug, rows(0), configuration=CDF)
    write_deltalake(ok, rows(100), configuration=CDF)
    out = tmp_path / "out"
    out.mkdir()

    def table(name: str, path: str, sink: type[JsonLinesSink]) -> TableSource:
        return TableSource(name, tailer_config(path, "", {"poll_interval": 0.1}), lambda _: sink(str(out / name)))

    service = Service(
        StateRoot(tmp_path / "state"),
        [table("bug", bug, BuggySink), table("ok", ok, JsonLinesSink)],
        ServiceOptions(workers=1, safety_poll_seconds=0.2),
    )
    runner = threading.Thread(target=service.run)
    runner.start()
    try:
        wait_for(lambda: delivered(out / "ok") == expected(ok), "ok delivered")
        write_deltalake(bug, rows(10), mode="append")
        stats = {s.name: s for s in service.stats}
        wait_for(lambda: stats["bug"].state is TableState.FAILED, "bug failed")
        assert stats["bug"].error == "unexpected error (RuntimeError: a bug in a sink)"
        assert stats["bug"].errors["RuntimeError"] == 1
        write_deltalake(ok, rows(110), mode="append")
        wait_for(lambda: delivered(out / "ok") == expected(ok), "ok delivered by the same worker")
        assert service.health() is None
    finally:
        service.stop()
        runner.join(60)
    assert not runner.is_alive()


@pytest.mark.parametrize("fmt", ["", 'format = "delta"\n'], ids=["format-detected", "format-given"])
def test_a_store_failing_at_start_up_makes_its_table_unavailable_not_the_service(
    moto: Server, tmp_path: Path, fmt: str
) -> None:
    """An S3 table whose store answers 500 when serve starts: serve runs, that table retries until the store is back.

    With no ``format``, the failure is met when the format is looked at; with one, when the table is checked.
    """
    cloud = Cloud.fresh("s3", moto)
    uri = cloud.uri("orders")
    write_deltalake(uri, rows(0), storage_options=cloud.writer_options, configuration=CDF)
    proxy = CountingProxy(moto.endpoint).start()
    proxy.fail_next(1_000_000, 500)
    local = str(tmp_path / "local")
    write_deltalake(local, rows(100), configuration=CDF)
    store = {**cloud.via(proxy.endpoint).options, "max_retries": "1", "retry_timeout": "1s"}
    storage = "".join(f'{k} = "{v}"\n' for k, v in store.items())
    file = config(tmp_path, {"local": local})
    file.write_text(
        file.read_text()
        + f'[[tables]]\nname = "orders"\npath = "{uri}"\n{fmt}max_poll_interval = 0.5\n[tables.storage]\n{storage}'
    )
    child = ServeChild(file, tmp_path / "serve.log")
    out = tmp_path / "out"
    try:
        child.start()
        exact(child, out / "local.jsonl", local, "the local table delivered")
        wait_for(lambda: "orders" in (child.not_ready() or {}), "/readyz to name orders", child)
        why = (child.not_ready() or {})["orders"]
        assert "unavailable" in why and "HTTP 500" in why, why
        assert child.get("/healthz")[0] == 200
        write_deltalake(uri, rows(10), storage_options=cloud.writer_options, mode="append")
        proxy.fail_next(0)
        exact(child, out / "orders.jsonl", uri, "orders delivered once the store answers", cloud.writer_options)
        wait_for(lambda: child.not_ready() == {}, "/readyz ready", child)
    finally:
        code = child.stop()
        proxy.stop()
    assert code == 0
    no_crash(child)
