"""The mkdocs hook that builds the generated pages of the docs site (``hooks:`` in ``mkdocs.yml``).

``options.md`` is written at build time from the argument parser (``tailer.cli.main.build_parser``), the
settings tables (``tailer.cli.settings``: types and bounds) and the settings model (``tailer.cli.model``,
``tailer.cli.serve_config``: defaults), so the options reference cannot drift from ``--help`` or the code.
``index.md`` is the repository's ``README.md`` and ``benchmarks.md`` is ``benchmarks/README.md``, their
links rewritten for the site, so the README stays the one copy of its text.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
from pathlib import Path
from typing import Any

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

from deltatail.tailer.cli.main import build_parser
from deltatail.tailer.cli.model import RunSettings
from deltatail.tailer.cli.serve_config import DiscoverSettings, ServiceSettings
from deltatail.tailer.cli.settings import DISCOVER_SETTINGS, RUN_SETTINGS, SERVICE_SETTINGS, Number

ROOT = Path(__file__).resolve().parent.parent


def _cell(text: str) -> str:
    """``text`` made safe for one markdown table cell."""
    return " ".join(text.split()).replace("|", "\\|")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """Every subcommand's parser by name, in the order ``--help`` lists them."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices.items())
    return {}


def _option_rows(parser: argparse.ArgumentParser) -> list[str]:
    """One table row per argument of ``parser``: its flags (or name), metavar or choices, default, help."""
    rows = []
    for action in parser._actions:
        if action.help == argparse.SUPPRESS or isinstance(action, argparse._SubParsersAction):
            continue
        name = ", ".join(f"`{s}`" for s in action.option_strings) or f"`{action.metavar or action.dest}`"
        if action.choices is not None:
            value = "|".join(str(c) for c in action.choices)
        elif action.nargs == 0:
            value = ""
        else:
            value = str(action.metavar or action.dest.upper()) if action.option_strings else ""
        default = action.default
        shown = "" if default in (None, False, argparse.SUPPRESS) or action.nargs == 0 else f"`{default}`"
        help_text = (action.help or "") % {"default": default, "prog": parser.prog} if action.help else ""
        rows.append(f"| {name} | {_cell(f'`{value}`' if value else '')} | {_cell(shown)} | {_cell(help_text)} |")
    return rows


def _bounds(convert: Any) -> str:
    """A setting's type and bounds as the settings table declares them."""
    if isinstance(convert, Number):
        low = f"{convert.at_least:g}"
        high = "" if convert.at_most is None else f"{convert.at_most:g}"
        kind = "whole number" if convert.kind is int else "number"
        bounds = f"{kind}, {low} to {high}" if high else f"{kind}, at least {low}"
        return f"{bounds} ({convert.why})" if convert.why else bounds
    # Any other converter says what it takes in its docstring's first line.
    doc = str(getattr(convert, "__doc__", None) or getattr(convert, "__name__", "")).strip()
    return doc.splitlines()[0].replace("``", "`").rstrip(".") if doc else ""


def _defaults(model: type[Any]) -> dict[str, str]:
    """Each setting's default as the settings model declares it (``required`` without one; blank for none)."""
    out: dict[str, str] = {}
    for f in dataclasses.fields(model):
        if f.default is dataclasses.MISSING:
            out[f.name] = "required" if f.default_factory is dataclasses.MISSING else ""
        elif f.default in (None, "", ()):
            out[f.name] = ""
        else:
            out[f.name] = f"`{_shown(f.default)}`"
    return out


def _shown(value: object) -> str:
    """A default as a user writes it: ``a, b``, ``false``, ``1``, ``0.5``."""
    if isinstance(value, tuple):
        return ", ".join(str(v) for v in value)
    if isinstance(value, bool):
        return str(value).lower()
    return f"{value:g}" if isinstance(value, float) else str(value)


def options_markdown() -> str:
    """The options reference page: every subcommand's arguments, then the TOML settings and their bounds."""
    parser = build_parser()
    out = [
        "# Options reference",
        "",
        "Generated at build time from the argument parser (`tailer/cli/main.py`), the settings tables",
        "(`tailer/cli/settings.py`) and the settings model (`tailer/cli/model.py`): it lists what",
        "`deltatail COMMAND --help` prints. What each feature does with them is told on its own page.",
        "",
        "## `deltatail`",
        "",
        "| option | value | default | help |",
        "|---|---|---|---|",
        *_option_rows(parser),
    ]
    for name, sub in _subcommands(parser).items():
        out += ["", f"## `deltatail {name}`", ""]
        if sub.description:
            out += [_cell(sub.description), ""]
        out += ["| option | value | default | help |", "|---|---|---|---|", *_option_rows(sub)]
    for title, table, model in (
        ("`run` settings (flags, `DELTATAIL_*`, `--config` TOML, `serve` tables)", RUN_SETTINGS, RunSettings),
        ("`[service]` settings of `deltatail serve`", SERVICE_SETTINGS, ServiceSettings),
        ("`[[discover]]` settings of `deltatail serve`", DISCOVER_SETTINGS, DiscoverSettings),
    ):
        defaults = _defaults(model)
        out += ["", f"## {title}", "", "| setting | type and bounds | default |", "|---|---|---|"]
        out += [f"| `{key}` | {_cell(_bounds(convert))} | {defaults[key]} |" for key, convert in table.items()]
    return "\n".join(out) + "\n"


def _site_links(markdown: str, from_docs: bool) -> str:
    """Links of a repository-root markdown file (or a docs page) rewritten to the site's pages."""
    if from_docs:
        markdown = markdown.replace("](../README.md", "](index.md")
        return markdown.replace("](../benchmarks/README.md", "](benchmarks.md")
    markdown = markdown.replace("](benchmarks/README.md", "](benchmarks.md")
    markdown = markdown.replace("](../docs/", "](")
    return re.sub(r"\]\(docs/", "](", markdown)


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add the generated pages: the options reference, the README as the index, the benchmarks page."""
    generated = {
        "options.md": options_markdown(),
        "index.md": _site_links((ROOT / "README.md").read_text(encoding="utf-8"), from_docs=False),
        "benchmarks.md": _site_links((ROOT / "benchmarks" / "README.md").read_text(encoding="utf-8"), False),
    }
    for path, content in generated.items():
        files.append(File.generated(config, path, content=content))
    return files


def on_page_markdown(markdown: str, page: Any, config: MkDocsConfig, files: Files) -> str:
    """Links from a docs page to the README or the benchmarks README point at their pages on the site."""
    return _site_links(markdown, from_docs=True)
