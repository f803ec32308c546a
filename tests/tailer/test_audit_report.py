"""The HTML audit report, opened in a real headless Chromium (Debian's package) driven by playwright.

The browser is ``/usr/bin/chromium`` (``apt-get install -y chromium``); playwright's own browser
downloads are never used. Without Chromium the browser test skips, saying so, unless
``DELTATAIL_REQUIRE_BROWSER=1`` (CI) makes that a failure. The page is loaded from a ``file:`` URL
with every other request refused and recorded: it must need none. A screenshot and the page are
saved under ``test-artifacts/`` (git-ignored) for people to look at.
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from audit_tables import AuditTables
from playwright.sync_api import Page, Route, sync_playwright

from deltatail.state.alerts import Alert, evaluate, parse_alert_rules
from deltatail.state.errors import ConfigError, DeltaTailError
from deltatail.tailer.audit import report as audit_report
from deltatail.tailer.audit.report import write_report

CHROMIUM = Path("/usr/bin/chromium")
REQUIRE_ENV = "DELTATAIL_REQUIRE_BROWSER"
ARTIFACTS = Path(__file__).resolve().parents[2] / "test-artifacts"
LAUNCH_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--no-first-run",
]

#: The page, the console problems (errors and warnings) and the non-file requests it made.
Loaded = tuple[Page, list[str], list[str]]

RULES = [
    {"name": "large delete", "severity": "critical", "rows_deleted_pct_over": 50},
    {"name": "schema", "schema_change": True},
    {"name": "restore or vacuum", "severity": "info", "operation_in": ["RESTORE", "VACUUM START", "VACUUM END"]},
    {"name": "outsider", "user_not_in": ["alice@corp", "bob@corp", "admin@corp", "svc-optimizer"]},
]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> tuple[AuditTables, list[Alert], Path]:
    tables = AuditTables(tmp_path_factory.mktemp("report"))
    rules = parse_alert_rules(RULES)
    alerts = [a for e in tables.followed for a in evaluate(rules, e).alerts]
    path = tmp_path_factory.mktemp("html") / "audit.html"
    size = write_report(tables.followed, alerts, str(path))
    assert size == path.stat().st_size
    return tables, alerts, path


def chromium_or_skip() -> Path:
    if CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    why = f"Chromium is not installed at {CHROMIUM} (apt-get install -y chromium)"
    if os.environ.get(REQUIRE_ENV, "").strip() == "1":
        pytest.fail(f"{why}, and {REQUIRE_ENV}=1 requires it")
    pytest.skip(why)


@pytest.fixture(scope="module")
def page(report: tuple[AuditTables, list[Alert], Path]) -> Iterator[Loaded]:
    executable = chromium_or_skip()
    _, _, path = report
    problems: list[str] = []
    requests: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(executable), args=LAUNCH_ARGS)
        try:
            pg = browser.new_page(viewport={"width": 1400, "height": 1000})

            def refuse(route: Route) -> None:
                if route.request.url.startswith("file:"):
                    route.continue_()
                else:
                    requests.append(route.request.url)
                    route.abort()

            pg.route("**/*", refuse)
            pg.on(
                "console", lambda m: problems.append(f"{m.type}: {m.text}") if m.type in ("error", "warning") else None
            )
            pg.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            pg.goto(path.as_uri())
            pg.wait_for_selector("body[data-chart=ready]", timeout=30_000)
            yield pg, problems, requests
        finally:
            browser.close()


@pytest.mark.slow
def test_renders_offline_without_console_errors(page: Loaded) -> None:
    pg, problems, requests = page
    assert problems == []
    assert requests == []
    ARTIFACTS.mkdir(exist_ok=True)
    pg.screenshot(path=str(ARTIFACTS / "audit-report.png"), full_page=True)
    assert (ARTIFACTS / "audit-report.png").stat().st_size > 10_000


def test_the_chart_has_one_mark_per_commit(page: Loaded, report: tuple[AuditTables, list[Alert], Path]) -> None:
    pg, _, _ = page
    tables, _, path = report
    ARTIFACTS.mkdir(exist_ok=True)
    shutil.copy(path, ARTIFACTS / "audit-report.html")
    n = len(tables.followed)
    commits = pg.locator("#timeline g.commits_marks path")
    assert commits.count() == n
    labels = [commits.nth(i).get_attribute("aria-label") or "" for i in range(n)]
    assert sorted(int(label.split("version: ")[1].split(";")[0]) for label in labels) == list(range(n))
    # the bars: one per commit and change type (inserted, deleted, updated)
    assert pg.locator("#timeline g.rows_marks path").count() == 3 * n


def test_the_table_filters_and_sorts(page: Loaded, report: tuple[AuditTables, list[Alert], Path]) -> None:
    pg = page[0]
    tables, _, _ = report
    rows = pg.locator("#commits tbody tr:not([hidden])")
    total = len(tables.followed)
    assert rows.count() == total
    pg.select_option("#filter-operation", "DELETE")
    assert rows.count() == 1 and rows.first.locator("td").first.inner_text() == "2"
    assert pg.inner_text("#shown") == f"1 of {total} commits"
    pg.select_option("#filter-operation", "WRITE")
    pg.select_option("#filter-user", "mallory@corp")
    assert [rows.nth(i).locator("td").first.inner_text() for i in range(rows.count())] == ["8", "12"]
    pg.select_option("#filter-operation", "")
    pg.select_option("#filter-user", "")
    pg.fill("#filter-text", "t.id = s.id")
    assert rows.count() == 1 and rows.first.locator("td").first.inner_text() == "4"
    pg.fill("#filter-text", "")
    assert rows.count() == total
    header = pg.locator("#commits thead th", has_text="deleted")
    header.click()
    header.click()  # descending: the overwrite (8 rows) first, then DELETE (2)
    assert [rows.nth(i).locator("td").first.inner_text() for i in range(2)] == ["12", "2"]
    pg.locator("#commits thead th", has_text="version").click()
    assert rows.first.locator("td").first.inner_text() == "0"


def test_schema_history_and_alerts(page: Loaded, report: tuple[AuditTables, list[Alert], Path]) -> None:
    pg = page[0]
    _, alerts, path = report
    history = pg.inner_text("#schema-history")
    assert "version 0" in history and "(table created)" in history
    assert "version 8" in history and "added: w" in history
    assert "version 9" in history and "dropped: w" in history
    changes = pg.inner_text("#table-changes")
    assert "delta.enableChangeDataFeed: — → true" in changes and "reader/writer 1/2 → 1/4" in changes
    assert pg.locator("#alerts tbody tr").count() == len(alerts)
    assert {a.rule for a in alerts} == {"large delete", "schema", "restore or vacuum", "outsider"}
    size = path.stat().st_size
    assert size < 2_000_000, size  # the inlined Vega bundle is ~0.9 MB


def test_report_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(DeltaTailError, match="cannot write the audit report") as e:
        write_report([], [], str(tmp_path / "no" / "such" / "dir" / "a.html"))
    assert e.value.file is not None and e.value.file.endswith("a.html")
    monkeypatch.setitem(sys.modules, "vl_convert", None)  # as if vl-convert-python were not installed
    audit_report.vega_bundle.cache_clear()
    try:
        with pytest.raises(ConfigError, match=r"needs vl-convert-python: pip install 'deltatail\[report\]'"):
            write_report([], [], str(tmp_path / "a.html"))
    finally:
        audit_report.vega_bundle.cache_clear()
    assert not (tmp_path / "a.html").exists()


def test_an_empty_report_is_still_a_page(tmp_path: Path) -> None:
    path = tmp_path / "empty.html"
    write_report([], [], str(path), title="Nothing <yet>")
    text = path.read_text()
    assert "<title>Nothing &lt;yet&gt;</title>" in text and "No alert was raised." in text
