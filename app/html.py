"""Self-contained HTML report: one file, plotly.js inlined once, opens offline.

``write_html(analysis_or_report, path)`` renders the same content as the app's pages —
worst-severity banner, symptom cards, rules not evaluated, prefill-vs-decode table, gap
statistics, timeline, category breakdown, roofline, top kernels, data-quality warnings —
from the pure builders in :mod:`diagnose.app.figures`. The timeline is the full-range figure
(aggregated to ``max_points`` elements for big traces); zooming in the file rescales it but
does not re-render detail (that needs ``diagnose serve``).
"""
from __future__ import annotations

import datetime as _dt
import html as _html
import os
from pathlib import Path
from typing import Any, Mapping

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from diagnose.app import figures as F
from diagnose.app.timeline import timeline_figure

_CSS = """
body { font-family: -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, sans-serif; margin: 0 auto; max-width: 1400px; padding: 1em 1.5em; color: #222; }
h1 { font-size: 1.4em; } h2 { margin-top: 1.6em; border-bottom: 1px solid #eee; }
.banner { padding: 0.8em 1.2em; border-radius: 6px; color: white; }
.banner h2 { margin: 0 0 0.3em 0; border: none; font-size: 1.25em; }
.cards { display: flex; gap: 1em; flex-wrap: wrap; margin: 1em 0; }
.num { border: 1px solid #ddd; border-radius: 6px; padding: 0.5em 1em; min-width: 150px; }
.num .v { font-size: 1.4em; font-weight: 600; } .num .l { color: #666; font-size: 0.85em; }
.card { border: 1px solid #ddd; border-left: 6px solid #999; border-radius: 6px; padding: 0.6em 1em; margin: 0.8em 0; }
.card h3 { margin: 0.2em 0; font-size: 1.05em; } .card dt { font-weight: 600; margin-top: 0.4em; } .card dd { margin-left: 1em; }
.sev { display: inline-block; padding: 0 0.5em; border-radius: 4px; color: white; font-size: 0.8em; margin-right: 0.5em; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }
th { background: #f5f5f5; } .na { color: #888; } .why { color: #888; font-size: 0.8em; display: block; max-width: 28em; }
.muted { color: #666; font-size: 0.9em; } td.name { max-width: 60em; word-break: break-all; font-family: monospace; font-size: 0.85em; }
"""


def _e(x: Any) -> str:
    return _html.escape("" if x is None else str(x))


def _table(header: list[str], rows: list[list[str]], id: str | None = None) -> str:
    """``rows`` cells are already-escaped HTML fragments (``<td>`` added here unless present)."""
    head = "".join(f"<th>{_e(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(c if c.startswith("<td") else f"<td>{c}</td>" for c in r) + "</tr>" for r in rows)
    id_attr = f' id="{_e(id)}"' if id else ""
    return f"<table{id_attr}><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fig(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def _na_cell(text: str, reason: str) -> str:
    if text == F.NA:
        return f'<td><span class="na">{F.NA}</span><span class="why">{_e(reason)}</span></td>'
    return f"<td>{_e(text)}</td>"


def render_html(report: Mapping, activities=None, *, title: str | None = None, max_points: int = 20000) -> str:
    """The whole report as one HTML document (string)."""
    src = report.get("source") or {}
    name = os.path.basename(str(src.get("path") or "trace"))
    title = title or f"diagnose report: {name}"
    parts: list[str] = [f"<h1>{_e(title)}</h1>"]
    devs = ", ".join(f"GPU {d.get('id')} {d.get('name') or '(unnamed)'}" for d in report.get("devices") or []) or "no GPU"
    parts.append(f'<p class="muted">Source: {_e(src.get("path"))} ({_e(src.get("format"))}) · {_e(devs)}'
                 f'{" · PARTIAL trace" if report.get("partial") else ""} · generated '
                 f'{_dt.datetime.now().strftime("%Y-%m-%d %H:%M")}</p>')

    # Overview
    b = F.banner_data(report)
    parts.append(f'<div id="overview-banner" class="banner" data-severity="{_e(b["severity"])}" '
                 f'style="background:{b["color"]}"><h2>{_e(b["title"])}</h2><div>{_e(b["text"])}</div></div>')
    parts.append('<div class="cards" id="key-numbers">' + "".join(
        f'<div class="num"><div class="v">{_e(F.fmt_value(k["value"], k["unit"]))}</div><div class="l">{_e(k["label"])}</div></div>'
        for k in F.key_numbers(report)) + "</div>")
    parts.append("<h2>Symptoms</h2>")
    cards = F.symptom_cards_data(report)
    if not cards:
        parts.append(f'<p class="muted">{"Symptom rules were not run for this report." if report.get("symptoms") is None else "No symptom fired."}</p>')
    for c in cards:
        dl = []
        mvt = [f"<li>measured {_e(n)} = {_e(v)}</li>" for n, v in c["findings"]]
        mvt += [f"<li>threshold {_e(n)} = {_e(v)}{f' ({_e(u)})' if u else ''}"
                f"{f'<span class=why>{_e(why)}</span>' if why else ''}</li>" for n, v, u, why in c["thresholds"]]
        mvt += [f"<li>{_e(p['name'])}: {_e(p['measured_text'])} vs threshold {_e(p['threshold_text'])}</li>" for p in c["pairs"]]
        if mvt:
            dl.append("<dt>Measured vs threshold</dt><dd><ul>" + "".join(mvt) + "</ul></dd>")
        if c["evidence"]:
            dl.append("<dt>Evidence</dt><dd><ul>" + "".join(f"<li>{_e(k)}: {_e(v)}</li>" for k, v in c["evidence"]) + "</ul></dd>")
        for key, label in (("likely_cause", "Likely cause"), ("how_to_verify", "How to verify"), ("fix", "Fix")):
            if c[key]:
                dl.append(f"<dt>{label}</dt><dd>{_e(c[key])}</dd>")
        if c["references"]:
            dl.append(f'<dt>References</dt><dd class="muted">{_e(", ".join(c["references"]))}</dd>')
        head = " · ".join(x for x in (c["symptom"], c["title"]) if x) or c["id"]
        parts.append(f'<div class="card" id="symptom-card-{_e(F.safe_id(c["id"]))}" style="border-left-color:{c["color"]}">'
                     f'<h3><span class="sev" style="background:{c["color"]}">{_e(c["severity"].upper())}</span>'
                     f'{_e(head)}</h3><p>{_e(c["summary"])}</p><dl>{"".join(dl)}</dl></div>')
    ne = F.not_evaluated_data(report)
    parts.append("<h3>Rules not evaluated</h3>")
    items = []
    for x in ne:
        title = f" ({_e(x['title'])})" if x["title"] else ""
        items.append(f"<li><b>{_e(x['id'])}</b>{title}: {_e(x['reason'])}</li>")
    if items:
        parts.append('<ul id="not-evaluated">' + "".join(items) + "</ul>")
    else:
        none_text = "none reported" if report.get("not_evaluated") is not None else "not available"
        parts.append(f'<p class="muted" id="not-evaluated">{none_text}</p>')

    # Phases
    parts.append("<h2>Prefill vs decode</h2>")
    for d in F.report_devices(report) or [None]:
        t = F.phases_table_data(report, d)
        cols = t["phases"]
        rows = [[_e(r["metric"])] + [_na_cell(r["display"][c], r["reasons"][c]) for c in cols]
                + [f'<td class="muted">{_e(F.expected_text(r, cols))}</td>']
                for r in t["rows"]]
        parts.append(f"<h3>{'GPU ' + _e(d) if d is not None else 'CPU only (no GPU activity)'}</h3>")
        parts.append(_table(["metric"] + cols + ["expected"], rows, id=f"phases-table-{d}"))
        if t.get("tpot_definition"):
            parts.append(f'<p class="muted">TPOT definition: {_e(t["tpot_definition"])}</p>')
        grows = []
        for pname, p in F.phases_for_device(report, d).items():
            g = p.get("gaps") or {}
            ms, cnt, la = g.get("ms_by_kind") or {}, g.get("count_by_kind") or {}, g.get("launch") or {}
            grows.append([_e(pname), _e(F.fmt_value(p.get("window_ms"), "ms")), _e(F.fmt_value(p.get("gpu_idle_share"), "share")),
                          _e(F.fmt_value(p.get("launch_gap_share"), "share")),
                          _e(f"{cnt.get('launch', 0)} / {F.fmt_value(ms.get('launch'), 'ms')}"),
                          _e(F.fmt_value(la.get("p50_us"), "µs")), _e(F.fmt_value(la.get("p99_us"), "µs")),
                          _e(f"{cnt.get('other', 0)} / {F.fmt_value(ms.get('other'), 'ms')}")])
        parts.append(_table(["phase", "GPU window", "idle share", "launch-gap share", "launch gaps (n / total)",
                             "launch gap p50", "launch gap p99", "other gaps (n / total)"], grows))

    # Figures
    parts.append("<h2>GPU timeline</h2>")
    if activities is not None:
        parts.append('<p class="muted">Rows = device:stream; idle row: red = launch gap (GPU waited for the host), '
                     "grey = other idle; top row = steps by phase. Big traces are merged into pixel-sized blocks: "
                     "use <code>diagnose serve</code> to zoom into full detail.</p>")
        parts.append(_fig(timeline_figure(activities, dict(report), max_points=max_points), "timeline-graph"))
    else:
        parts.append('<p class="muted">Timeline not available: this report was written from a JSON report without '
                     "the activity table (pass the Analysis, not its dict).</p>")
    parts.append("<h2>Kernel categories</h2>")
    parts.append(_fig(F.categories_figure(report), "categories-graph"))
    att = F.attention_rows(report)
    parts.append(_table(["device", "phase", "attention share of kernel time", "attention ms"],
                        [[_e(a["device"]), _e(a["phase"]), _e(a["text"]), _e(F.fmt_value(a["attention_ms"], "ms"))] for a in att],
                        id="attention-share"))
    parts.append("<h2>Roofline</h2>")
    parts.append(_fig(F.roofline_figure(report), "roofline-graph"))

    parts.append("<h2>Top kernels</h2>")
    kern = F.kernels_table_data(report, activities, limit=60)
    parts.append(_table(["device", "phase", "name", "category", "count", "total ms", "mean µs", "% of phase kernel time"],
                        [[_e(k["device"]), _e(k["phase"]), f'<td class="name">{_e(k["name"])}</td>', _e(k["category"]),
                          _e(k["count"]), _e(F.fmt_value(k["total_ms"])), _e(F.fmt_value(k["mean_us"])),
                          _e(F.fmt_value(k["share"], "share"))] for k in kern], id="kernels-table")
                 if kern else '<p class="muted">No kernels in this trace.</p>')

    parts.append("<h2>Data quality</h2>")
    q = report.get("quality") or []
    parts.append('<ul id="quality-list">' + "".join(f"<li><code>{_e(x.get('code'))}</code> {_e(x.get('message'))}</li>" for x in q)
                 + "</ul>" if q else '<p class="muted" id="quality-list">no quality warnings</p>')

    return (f'<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>{_e(title)}</title>'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">'
            f"<style>{_CSS}</style><script type=\"text/javascript\">{get_plotlyjs()}</script></head>"
            f"<body>{''.join(parts)}</body></html>\n")


def write_html(analysis_or_report: Any, path: str | os.PathLike, *, title: str | None = None,
               max_points: int = 20000, verdicts: bool = True, ruleset: Any = None) -> Path:
    """Write the report as one self-contained HTML file (plotly.js inlined once; works offline).

    Args:
        analysis_or_report: an ``Analysis`` (full report, timeline included) or a report dict
            (``Analysis.to_dict()``; no timeline: the activity table is not in the JSON).
        path: output file.
        title: page title (default "diagnose report: <trace file name>").
        max_points: timeline drawing budget.
        verdicts: evaluate the symptom rules when the report has no ``symptoms`` yet (as
            ``diagnose run`` does); a report that has them is shown as it is.

    Returns:
        The path written.
    """
    if isinstance(analysis_or_report, Mapping):
        report, acts = dict(analysis_or_report), None
    else:
        report, acts = analysis_or_report.to_dict(), getattr(analysis_or_report, "activities", None)
    if verdicts:
        from diagnose.pipeline import ensure_verdicts

        ensure_verdicts(report, ruleset)
    text = render_html(report, acts, title=title, max_points=max_points)
    p = Path(path)
    p.write_text(text, encoding="utf-8")
    return p
