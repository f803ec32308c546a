"""The audit report: one self-contained HTML page a person can open anywhere, offline.

:func:`write_report` writes, for a list of audit events and the alerts they
raised:

- a summary (table, versions, time span, commits, rows, alerts);
- the timeline: rows changed per commit, stacked by change type (inserted,
  deleted, updated), and a strip of the commits over time, one point per
  commit, coloured by operation (hover for who and how much);
- the commit table, sortable by any column and filterable by operation, user
  and free text;
- the schema history (every commit that changed the schema, with what changed)
  and the other table changes (protocol, properties, domains);
- the alerts raised.

The charts are Vega-Lite specifications rendered in the page by Vega, whose
JavaScript (Vega, Vega-Lite and Vega-Embed, about 0.9 MB) is inlined from
``vl-convert-python``'s bundle, so the page needs no network. Vega was chosen
over plotly.js (about 4.6 MB inlined) for the page's size, and because a chart
is a declarative JSON document built here in Python. The tables are plain HTML
made here, with a few lines of script for sorting and filtering.

Install with ``pip install 'deltatail[report]'``.
"""

from __future__ import annotations

import functools
import html
import os
import uuid
from collections import Counter
from collections.abc import Sequence
from typing import Any

import orjson

from deltatail.state.alerts import Alert
from deltatail.state.audit import AuditEvent
from deltatail.state.errors import ConfigError, DeltaTailError

#: Width of the charts in CSS pixels (wider timelines scroll sideways).
CHART_WIDTH = 1100

#: Colours of the change types (ColorBrewer "Set2"-like, readable on white).
_CHANGE_COLOURS = {"inserted": "#1b9e77", "deleted": "#d95f02", "updated": "#7570b3"}


def require_report_extra() -> None:
    """Check that the report's extra (``vl-convert-python``) can be imported, before any work is done.

    Raises:
        ConfigError: if ``vl-convert-python`` is not installed (or its import fails).
    """
    try:
        import vl_convert  # noqa: F401
    except ImportError as e:
        raise ConfigError("the HTML audit report needs vl-convert-python: pip install 'deltatail[report]'") from e


@functools.cache
def vega_bundle() -> str:
    """The Vega, Vega-Lite and Vega-Embed JavaScript bundle (computed once per process, ~2 s).

    Raises:
        ConfigError: if ``vl-convert-python`` is not installed.
    """
    try:
        import vl_convert
    except ImportError as e:
        raise ConfigError("the HTML audit report needs vl-convert-python: pip install 'deltatail[report]'") from e
    bundle: str = vl_convert.javascript_bundle(None)  # type: ignore[arg-type]  # the stub omits the default
    return bundle


def _script_json(value: Any) -> str:
    """JSON safe inside a ``<script>`` element (no ``</``, no HTML comment openers)."""
    text = orjson.dumps(value, default=str).decode()
    return text.replace("</", "<\\/").replace("<!--", "<\\!--")


def _e(value: Any) -> str:
    return html.escape("" if value is None else str(value), quote=True)


def _fmt_int(value: int | None) -> str:
    return "?" if value is None else f"{value:,}"


def _fmt_bytes(value: int | None) -> str:
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{value} B"


def _chart_rows(events: Sequence[AuditEvent]) -> list[dict[str, Any]]:
    rows = []
    for e in events:
        c = e.counts
        rows.append(
            {
                "version": e.version,
                "time": e.timestamp_iso,
                "operation": e.operation or "(none)",
                "user": e.user or "(unrecorded)",
                "inserted": c.rows_inserted or 0,
                "deleted": c.rows_deleted or 0,
                "updated": c.rows_updated or 0,
                "rows": (c.rows_inserted or 0) + (c.rows_deleted or 0) + (c.rows_updated or 0),
                "known": None not in (c.rows_inserted, c.rows_deleted, c.rows_updated),
            }
        )
    return rows


def timeline_spec(events: Sequence[AuditEvent]) -> dict[str, Any]:
    """The Vega-Lite specification of the timeline: rows per commit by change type, and one point per commit."""
    values = _chart_rows(events)
    tooltip = [
        {"field": "version", "type": "quantitative", "title": "version"},
        {"field": "time", "type": "nominal", "title": "time (UTC)"},
        {"field": "operation", "type": "nominal"},
        {"field": "user", "type": "nominal"},
        {"field": "inserted", "type": "quantitative", "format": ","},
        {"field": "deleted", "type": "quantitative", "format": ","},
        {"field": "updated", "type": "quantitative", "format": ","},
    ]
    return {
        "$schema": "https://vega.github.io/schema/vega-lite/v6.json",
        "resolve": {"scale": {"color": "independent"}},
        "data": {"values": values},
        "config": {"view": {"stroke": None}, "axis": {"labelFontSize": 11, "titleFontSize": 12}},
        "vconcat": [
            {
                "name": "rows",
                "title": "Rows changed per commit, by change type",
                "width": CHART_WIDTH,
                "height": 220,
                "transform": [{"fold": ["inserted", "deleted", "updated"], "as": ["change", "count"]}],
                "mark": {"type": "bar", "tooltip": True},
                "encoding": {
                    "x": {"field": "version", "type": "ordinal", "title": "version",
                          "axis": {"labelOverlap": True}},
                    "y": {"field": "count", "type": "quantitative", "title": "rows", "stack": "zero"},
                    "color": {
                        "field": "change",
                        "type": "nominal",
                        "title": "change",
                        "scale": {"domain": list(_CHANGE_COLOURS), "range": list(_CHANGE_COLOURS.values())},
                    },
                    "tooltip": [*tooltip, {"field": "change", "type": "nominal"},
                                {"field": "count", "type": "quantitative", "format": ","}],
                },
            },
            {
                "name": "commits",
                "title": "Commits over time, by operation",
                "width": CHART_WIDTH,
                "height": {"step": 22},
                "mark": {"type": "point", "filled": True, "size": 90, "tooltip": True},
                "encoding": {
                    "x": {"field": "time", "type": "temporal", "title": "commit time (UTC)",
                          "scale": {"type": "utc"}, "axis": {"format": "%Y-%m-%d %H:%M:%S"}},
                    "y": {"field": "operation", "type": "nominal", "title": None},
                    "color": {"field": "operation", "type": "nominal", "legend": None},
                    "tooltip": tooltip,
                },
            },
        ],
    }  # fmt: skip


def _changes_cell(e: AuditEvent) -> str:
    badges = []
    if e.table_created:
        badges.append(("created", "created"))
    if e.schema_change is not None:
        badges.append(("schema", "schema: " + ", ".join(e.schema_change.kinds)))
    if e.protocol_change is not None:
        p = e.protocol_change
        badges.append(("protocol", f"protocol {p.new_min_reader_version}/{p.new_min_writer_version}"))
    if e.property_changes:
        badges.append(("props", f"{len(e.property_changes)} properties"))
    if e.domain_changes:
        badges.append(("domain", f"{len(e.domain_changes)} domains"))
    if e.no_op:
        badges.append(("noop", "no-op"))
    return " ".join(f'<span class="badge {cls}">{_e(text)}</span>' for cls, text in badges)


def _commit_rows(events: Sequence[AuditEvent], alerts_by_version: dict[int, list[Alert]]) -> str:
    out = []
    for e in events:
        c = e.counts
        raised = alerts_by_version.get(e.version, [])
        alert_cell = " ".join(f'<span class="badge sev-{_e(a.severity)}">{_e(a.rule)}</span>' for a in raised)
        rows_sort = (c.rows_inserted or 0) + (c.rows_deleted or 0) + (c.rows_updated or 0)
        cells = [
            (e.version, _e(e.version)),
            (e.timestamp_ms, _e(e.timestamp_iso)),
            (e.operation or "", _e(e.operation or "")),
            (e.user or "", _e(e.user or "")),
            (e.actor.engine_info or e.actor.client_version or "", _e(e.actor.engine_info or e.actor.client_version)),
            (e.predicate or "", f'<span class="pred">{_e(e.predicate)}</span>'),
            (c.rows_inserted if c.rows_inserted is not None else -1, _fmt_int(c.rows_inserted)),
            (c.rows_deleted if c.rows_deleted is not None else -1, _fmt_int(c.rows_deleted)),
            (c.rows_updated if c.rows_updated is not None else -1, _fmt_int(c.rows_updated)),
            (c.files_added - c.files_removed, f"+{c.files_added} / -{c.files_removed}"),
            (c.bytes_added, f"+{_fmt_bytes(c.bytes_added)} / -{_fmt_bytes(c.bytes_removed)}"),
            (rows_sort, _changes_cell(e)),
            (len(raised), alert_cell),
        ]
        tds = "".join(f'<td data-sort="{_e(key)}">{text}</td>' for key, text in cells)
        out.append(
            f'<tr data-operation="{_e(e.operation or "(none)")}" data-user="{_e(e.user or "(unrecorded)")}">{tds}</tr>'
        )
    return "\n".join(out)


def _schema_history(events: Sequence[AuditEvent]) -> str:
    items = []
    for e in events:
        d = e.schema_change
        if d is None:
            continue
        parts = []
        if d.added:
            parts.append(("added", ", ".join(d.added)))
        if d.dropped:
            parts.append(("dropped", ", ".join(d.dropped)))
        if d.renamed:
            parts.append(("renamed", ", ".join(f"{r.old_path} → {r.new_path}" for r in d.renamed)))
        if d.type_changed:
            parts.append(("type changed", ", ".join(f"{t.path}: {t.old_type} → {t.new_type}" for t in d.type_changed)))
        if d.nullability_changed:
            parts.append(
                (
                    "nullability changed",
                    ", ".join(
                        f"{n.path}: {'nullable' if n.new_nullable else 'not null'}" for n in d.nullability_changed
                    ),
                )
            )
        if d.metadata_changed:
            parts.append(("field metadata changed", ", ".join(d.metadata_changed)))
        detail = "".join(f"<li><b>{_e(k)}</b>: <code>{_e(v)}</code></li>" for k, v in parts)
        head = (
            f"version {e.version} · {_e(e.timestamp_iso)} · {_e(e.operation or '')} · {_e(e.user or 'unrecorded user')}"
        )
        created = " (table created)" if e.table_created else ""
        items.append(f"<li><div>{head}{created}</div><ul>{detail}</ul></li>")
    if not items:
        return "<p>No schema change in these commits.</p>"
    return f'<ol class="history">{"".join(items)}</ol>'


def _table_changes(events: Sequence[AuditEvent]) -> str:
    rows = []
    for e in events:
        p = e.protocol_change
        if p is not None:
            features = [f"+{f}" for f in sorted({*p.reader_features_added, *p.writer_features_added})]
            features += [f"-{f}" for f in sorted({*p.reader_features_removed, *p.writer_features_removed})]
            old = "—" if p.old_min_reader_version is None else f"{p.old_min_reader_version}/{p.old_min_writer_version}"
            text = f"reader/writer {old} → {p.new_min_reader_version}/{p.new_min_writer_version}"
            if features:
                text += "; features " + " ".join(features)
            rows.append((e, "protocol", text))
        for kind, changes in (("property", e.property_changes), ("domain", e.domain_changes)):
            for v in changes:
                rows.append(
                    (e, kind, f"{v.key}: {v.old if v.old is not None else '—'} → {v.new if v.new is not None else '—'}")
                )
        for v in e.metadata_changes:
            if v.key != "id" or not e.table_created:
                rows.append(
                    (
                        e,
                        "metadata",
                        f"{v.key}: {v.old if v.old is not None else '—'} → {v.new if v.new is not None else '—'}",
                    )
                )
    if not rows:
        return "<p>No protocol, property or domain change in these commits.</p>"
    body = "".join(
        f"<tr><td>{e.version}</td><td>{_e(e.timestamp_iso)}</td><td>{_e(e.user or '')}</td>"
        f"<td>{_e(kind)}</td><td><code>{_e(text)}</code></td></tr>"
        for e, kind, text in rows
    )
    return (
        '<table class="plain"><thead><tr><th>version</th><th>time (UTC)</th><th>user</th><th>kind</th>'
        f"<th>change</th></tr></thead><tbody>{body}</tbody></table>"
    )


def _alerts_table(alerts: Sequence[Alert]) -> str:
    if not alerts:
        return "<p>No alert was raised.</p>"
    body = "".join(
        f'<tr class="sev-{_e(a.severity)}"><td>{_e(a.severity)}</td><td>{_e(a.rule)}</td><td>{a.version}</td>'
        f"<td>{_e(a.event.timestamp_iso)}</td><td>{_e(a.event.operation or '')}</td><td>{_e(a.event.user or '')}</td>"
        f"<td>{_e('; '.join(a.reasons))}</td></tr>"
        for a in alerts
    )
    return (
        '<table class="plain" id="alerts"><thead><tr><th>severity</th><th>rule</th><th>version</th>'
        "<th>time (UTC)</th><th>operation</th><th>user</th><th>why</th></tr></thead>"
        f"<tbody>{body}</tbody></table>"
    )


def _options(values: Sequence[str]) -> str:
    return "".join(f'<option value="{_e(v)}">{_e(v)}</option>' for v in values)


_CSS = """
body{font:14px/1.45 system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#1f2328;background:#f6f8fa}
header{background:#24292f;color:#fff;padding:16px 24px}header h1{margin:0 0 4px;font-size:20px}
header .sub{color:#c9d1d9;font-size:13px;word-break:break-all}
main{padding:16px 24px;max-width:1600px}
section{background:#fff;border:1px solid #d0d7de;border-radius:6px;padding:12px 16px;margin:0 0 16px}
h2{font-size:16px;margin:4px 0 12px}
.stats{display:flex;flex-wrap:wrap;gap:12px}.stat{background:#f6f8fa;border-radius:6px;padding:8px 12px;min-width:120px}
.stat b{display:block;font-size:18px}
#timeline{width:100%;overflow-x:auto}
#commits td:nth-child(2),#commits td:nth-child(10),#commits td:nth-child(11){white-space:nowrap}
.filters{display:flex;gap:12px;align-items:center;margin:0 0 8px;flex-wrap:wrap}
table{border-collapse:collapse;width:100%;font-size:13px}
th,td{border-bottom:1px solid #eaeef2;padding:4px 6px;text-align:left;vertical-align:top}
th{background:#f6f8fa;position:sticky;top:0}
#commits th{cursor:pointer;user-select:none;white-space:nowrap}
#commits th.asc::after{content:" ▲"}#commits th.desc::after{content:" ▼"}
#commits td:nth-child(n+7):nth-child(-n+9){text-align:right}
.pred{font-family:ui-monospace,monospace;font-size:12px;color:#57606a}
.badge{display:inline-block;border-radius:10px;padding:0 7px;margin:1px;font-size:11px;background:#eaeef2}
.badge.schema{background:#ddf4ff}.badge.protocol{background:#fbefff}.badge.props{background:#fff8c5}
.badge.created{background:#dafbe1}.badge.noop{background:#eee}
.sev-critical .badge,.badge.sev-critical,tr.sev-critical td:first-child{background:#ffebe9;color:#a40e26}
.badge.sev-warning,tr.sev-warning td:first-child{background:#fff8c5}
.badge.sev-info{background:#ddf4ff}
ol.history li{margin:0 0 8px}code{font-size:12px}
.count{color:#57606a}
"""

_SCRIPT = """
(function () {
  const spec = JSON.parse(document.getElementById('timeline-spec').textContent);
  const done = (state) => { document.body.dataset.chart = state; };
  vegaEmbed('#timeline', spec, {renderer: 'svg', actions: false})
    .then((result) => { window.auditView = result.view; done('ready'); })
    .catch((err) => { console.error(err); done('error'); });

  const table = document.getElementById('commits');
  const body = table.tBodies[0];
  const op = document.getElementById('filter-operation');
  const user = document.getElementById('filter-user');
  const text = document.getElementById('filter-text');
  const shown = document.getElementById('shown');
  function filter() {
    const o = op.value, u = user.value, t = text.value.trim().toLowerCase();
    let n = 0;
    for (const row of body.rows) {
      const ok = (!o || row.dataset.operation === o) && (!u || row.dataset.user === u)
        && (!t || row.textContent.toLowerCase().includes(t));
      row.hidden = !ok;
      if (ok) n += 1;
    }
    shown.textContent = n + ' of ' + body.rows.length + ' commits';
  }
  op.addEventListener('change', filter);
  user.addEventListener('change', filter);
  text.addEventListener('input', filter);
  filter();

  table.tHead.addEventListener('click', (ev) => {
    const th = ev.target.closest('th');
    if (!th) return;
    const index = th.cellIndex;
    const numeric = th.dataset.type === 'number';
    const ascending = !th.classList.contains('asc');
    for (const h of table.tHead.rows[0].cells) h.classList.remove('asc', 'desc');
    th.classList.add(ascending ? 'asc' : 'desc');
    const key = (row) => {
      const v = row.cells[index].dataset.sort;
      return numeric ? Number(v) : v.toLowerCase();
    };
    const rows = Array.from(body.rows);
    rows.sort((a, b) => {
      const x = key(a), y = key(b);
      const c = x < y ? -1 : x > y ? 1 : 0;
      return ascending ? c : -c;
    });
    for (const row of rows) body.appendChild(row);
  });
})();
"""

_COLUMNS = (
    ("version", "number"),
    ("time (UTC)", "number"),
    ("operation", "text"),
    ("user", "text"),
    ("engine", "text"),
    ("predicate", "text"),
    ("inserted", "number"),
    ("deleted", "number"),
    ("updated", "number"),
    ("files", "number"),
    ("bytes", "number"),
    ("changes", "number"),
    ("alerts", "number"),
)


def render_report(events: Sequence[AuditEvent], alerts: Sequence[Alert], *, title: str | None = None) -> str:
    """The report's HTML (see the module docstring).

    Raises:
        ConfigError: if ``vl-convert-python`` is not installed.
    """
    events = sorted(events, key=lambda e: e.version)
    table = events[0].table_path if events else "(no commits)"
    title = title or f"Audit of {table}"
    by_version: dict[int, list[Alert]] = {}
    for a in alerts:
        by_version.setdefault(a.version, []).append(a)
    operations = sorted({e.operation or "(none)" for e in events})
    users = sorted({e.user or "(unrecorded)" for e in events})
    span = f"{events[0].timestamp_iso} → {events[-1].timestamp_iso}" if events else "—"
    versions = f"{events[0].version} to {events[-1].version}" if events else "—"
    severities = Counter(a.severity for a in alerts)
    totals = {
        "inserted": sum(e.counts.rows_inserted or 0 for e in events),
        "deleted": sum(e.counts.rows_deleted or 0 for e in events),
        "updated": sum(e.counts.rows_updated or 0 for e in events),
    }
    stats = [
        ("commits", f"{len(events):,}"),
        ("versions", versions),
        ("rows inserted", f"{totals['inserted']:,}"),
        ("rows deleted", f"{totals['deleted']:,}"),
        ("rows updated", f"{totals['updated']:,}"),
        ("schema changes", str(sum(1 for e in events if e.schema_change is not None and not e.table_created))),
        ("alerts", ", ".join(f"{n} {s}" for s, n in sorted(severities.items())) or "none"),
    ]
    stat_html = "".join(f'<div class="stat"><span>{_e(k)}</span><b>{_e(v)}</b></div>' for k, v in stats)
    head = "".join(f'<th data-type="{kind}">{_e(name)}</th>' for name, kind in _COLUMNS)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<meta name="generator" content="deltatail">
<title>{_e(title)}</title>
<style>{_CSS}</style>
<script>{vega_bundle()}</script>
</head>
<body data-chart="pending">
<header><h1>{_e(title)}</h1><div class="sub">{_e(table)} · {_e(span)}</div></header>
<main>
<section id="summary"><h2>Summary</h2><div class="stats">{stat_html}</div></section>
<section><h2>Timeline</h2><div id="timeline"></div></section>
<section><h2>Commits</h2>
<div class="filters">
<label>operation <select id="filter-operation"><option value="">all</option>{_options(operations)}</select></label>
<label>user <select id="filter-user"><option value="">all</option>{_options(users)}</select></label>
<label>search <input id="filter-text" type="search" placeholder="predicate, engine, …"></label>
<span class="count" id="shown"></span>
</div>
<table id="commits"><thead><tr>{head}</tr></thead>
<tbody>
{_commit_rows(events, by_version)}
</tbody></table></section>
<section id="schema-history"><h2>Schema history</h2>{_schema_history(events)}</section>
<section id="table-changes"><h2>Protocol, property and domain changes</h2>{_table_changes(events)}</section>
<section id="alerts-raised"><h2>Alerts raised</h2>{_alerts_table(alerts)}</section>
</main>
<script type="application/json" id="timeline-spec">{_script_json(timeline_spec(events))}</script>
<script>{_SCRIPT}</script>
</body></html>
"""


def write_report(events: Sequence[AuditEvent], alerts: Sequence[Alert], path: str, *, title: str | None = None) -> int:
    """Write the report to ``path`` (atomically: a temporary file renamed over it); returns its size in bytes.

    Raises:
        ConfigError: if ``vl-convert-python`` is not installed.
        DeltaTailError: if the file cannot be written (the message names it).
    """
    page = render_report(events, alerts, title=title).encode()
    directory = os.path.dirname(os.path.abspath(path))
    tmp = os.path.join(directory, f".{os.path.basename(path)}.{uuid.uuid4().hex}.tmp")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)  # the umask applies, as for any new file
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(page)
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as e:
        raise DeltaTailError(f"cannot write the audit report: {e.strerror or e}", file=path) from e
    return len(page)
