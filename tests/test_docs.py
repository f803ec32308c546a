"""The docs site: it builds with ``mkdocs build --strict`` (broken links and anchors are errors), its
index renders in Debian's Chromium, the generated options page lists every option ``--help`` prints,
and the README stays under its limit.

The browser is ``/usr/bin/chromium``, as in ``tests/tailer/test_audit_report.py``: without it the browser
test skips, saying so, unless ``DELTATAIL_REQUIRE_BROWSER=1`` (CI) makes that a failure.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from playwright.sync_api import sync_playwright

from deltatail.tailer.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM = Path("/usr/bin/chromium")
REQUIRE_ENV = "DELTATAIL_REQUIRE_BROWSER"
README_LIMIT = 400
LAUNCH_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--no-first-run"]
#: The nav entries the index page must show (mkdocs.yml).
NAV = ["Following a table", "Many tables", "Kafka", "Spark", "Auditing", "Options reference", "Architecture"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site built from this checkout; strict mode fails the build on any warning."""
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def _help_options(parser: argparse.ArgumentParser) -> set[str]:
    """The option strings ``parser``'s ``--help`` prints at the head of its option lines."""
    found: set[str] = set()
    for line in parser.format_help().splitlines():
        head = re.match(r"  (-\S.*?)(?:\s{2,}|$)", line)
        if head:
            found |= set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", head.group(1)))
    return found


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices.items())
    raise AssertionError("the parser has no subcommands")


@pytest.mark.slow  # the site build takes several seconds
def test_the_site_builds_with_every_page(site: Path) -> None:
    for page in ["following", "serve", "cursors", "object-stores", "kafka", "spark", "auditing", "lance"]:
        assert (site / page / "index.html").is_file(), page
    for page in ["errors-and-security", "deployment", "change-rows", "architecture", "contributing", "options"]:
        assert (site / page / "index.html").is_file(), page
    index = (site / "index.html").read_text(encoding="utf-8")
    assert "Quickstart" in index


@pytest.mark.slow  # the site build takes several seconds
def test_the_options_page_lists_every_option_help_prints(site: Path) -> None:
    page = (site / "options" / "index.html").read_text(encoding="utf-8")
    sections = re.split(r'<h2 id="[^"]*">', page)
    by_command: dict[str, str] = {}
    for section in sections[1:]:
        title = re.sub(r"<[^>]+>", "", section.split("</h2>", 1)[0]).replace("&para;", "").replace("¶", "").strip()
        by_command[title] = section
    parser = build_parser()
    commands = {"deltatail": parser, **{f"deltatail {n}": p for n, p in _subcommands(parser).items()}}
    for title, sub in commands.items():
        assert title in by_command, f"no section for {title}"
        listed = set(re.findall(r"<code>(--?[A-Za-z][\w-]*)</code>", by_command[title]))
        missing = _help_options(sub) - listed
        assert not missing, f"{title} --help prints {sorted(missing)}, the options page does not list them"
        for option in sorted(_help_options(sub)):
            assert option in sub.format_help()
    assert "workers" in page and "state_root" in page  # the [service] settings


@pytest.mark.slow  # the site build takes several seconds
def test_the_service_settings_show_their_bounds(site: Path) -> None:
    page = (site / "options" / "index.html").read_text(encoding="utf-8")
    assert re.search(r"<code>workers</code></td>\s*<td>whole number, 1 to \d+ \(steps share", page)
    assert re.search(r"<code>poll_interval</code></td>\s*<td>number, 0.01 to 86400</td>", page)


def chromium_or_skip() -> Path:
    if CHROMIUM.is_file() and os.access(CHROMIUM, os.X_OK):
        return CHROMIUM
    why = f"Chromium is not installed at {CHROMIUM} (apt-get install -y chromium)"
    if os.environ.get(REQUIRE_ENV, "").strip() == "1":
        pytest.fail(f"{why}, and {REQUIRE_ENV}=1 requires it")
    pytest.skip(why)


@pytest.mark.slow
def test_the_index_renders_in_chromium(site: Path) -> None:
    executable = chromium_or_skip()
    problems: list[str] = []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(executable), args=LAUNCH_ARGS)
        try:
            page = browser.new_page()
            page.on("pageerror", lambda e: problems.append(f"page error: {e}"))
            page.goto((site / "index.html").as_uri())
            page.wait_for_load_state("load")
            assert page.title().startswith("deltatail")
            assert page.locator("article h1").first.inner_text().rstrip("¶").strip() == "deltatail"
            nav = page.locator("nav.md-nav--primary").inner_text()
            for entry in NAV:
                assert entry in nav, f"{entry!r} not in the navigation"
            assert page.locator("article h2", has_text="Quickstart").count() == 1
            assert page.locator("article pre").first.is_visible()
        finally:
            browser.close()
    assert problems == []


def test_the_readme_is_under_its_limit() -> None:
    lines = (ROOT / "README.md").read_text(encoding="utf-8").count("\n")
    assert lines <= README_LIMIT, f"README.md has {lines} lines; the limit is {README_LIMIT} (move text to docs/)"


def test_the_quickstart_commands_come_first() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```bash\n(.*?)\n```", readme, re.S)
    assert blocks[:2] == [
        "python3 -m venv .venv && .venv/bin/pip install -q '.[demo]' && .venv/bin/deltatail demo",
        "python3 -m venv .venv && .venv/bin/pip install -q -e '.[test]' && .venv/bin/pytest",
    ]
