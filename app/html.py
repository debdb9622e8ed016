"""Self-contained HTML report: one file, plotly.js inlined once, opens offline.

``write_html(analysis_or_report, path)`` renders the same content as the app's pages —
the headline banner, where the GPU waited, symptom cards, rules not evaluated,
prefill-vs-decode table, gap statistics, timeline with the host lane, the coverage line and
the layer heat strip (click a cell: its kernels are highlighted on the timeline), category breakdown,
roofline, the kernel table, top kernels, data-quality warnings —
from the pure builders in :mod:`diagnose.app.figures`. The timeline is the full-range figure
(aggregated to ``max_points`` elements for big traces); zooming in the file rescales it but
does not re-render detail (that needs ``diagnose serve``).
"""
from __future__ import annotations

import datetime as _dt
import json
import os
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping

import plotly.graph_objects as go
from plotly.offline import get_plotlyjs

from diagnose.app import figures as F
from diagnose.app import layerstrip as LS
from diagnose.app.causeview import legend_entries, waits_causes
from diagnose.app.timeline import host_lane, legend_causes, prepare_timeline, timeline_figure
from diagnose.hardware import describe_devices, describe_peak
from diagnose.pipeline import device_headline_lines

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
.cause { display: inline-block; padding: 0 0.4em; border-radius: 4px; color: #111; font-size: 0.85em; }
.legend { display: flex; flex-wrap: wrap; gap: 0.3em 1.2em; margin: 0.4em 0; font-size: 0.88em; }
.legend-head { font-weight: 600; } .swatch { display: inline-block; width: 1.4em; height: 0.8em; margin-right: 0.35em; vertical-align: middle; border-radius: 2px; }
table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; font-size: 0.92em; }
th, td { border: 1px solid #ddd; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }
th { background: #f5f5f5; } .na { color: #888; } .why { color: #888; font-size: 0.8em; display: block; max-width: 28em; }
.caveat { font-size: 0.9em; opacity: 0.9; margin-top: 0.3em; }
.muted { color: #666; font-size: 0.9em; } td.name { max-width: 60em; word-break: break-all; font-family: monospace; font-size: 0.85em; }
"""


@lru_cache(maxsize=1)
def _template():
    import jinja2

    env = jinja2.Environment(loader=jinja2.PackageLoader("diagnose.app", "templates"),
                             autoescape=jinja2.select_autoescape(["html", "j2"]), trim_blocks=True, lstrip_blocks=True)
    return env.get_template("report.html.j2")


def _fig(fig: go.Figure, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True})


def render_html(report: Mapping, activities=None, *, title: str | None = None, max_points: int = 20000, host=None,
                host_index=None, path=None, t0_ns: int | None = None, layer_frame=None) -> str:
    """The whole report as one HTML document (string), from the Jinja2 template
    ``app/templates/report.html.j2`` (autoescaped: names from the trace are text, never markup).
    ``t0_ns``: the trace start (``Analysis.t0_ns``), the timeline's origin as of every ``start_ms``."""
    src = report.get("source") or {}
    name = os.path.basename(str(src.get("path") or "trace"))
    cards = []
    for c in F.symptom_cards_data(report):
        mvt = c["measured"] + [{"text": f"{p['label']}: {p['measured_text']} vs threshold {p['threshold_text']}", "why": ""}
                               for p in c["pairs"]]
        cards.append({**c, "mvt": mvt, "safe_id": F.safe_id(c["id"]),
                      "head": " · ".join(x for x in (c["symptom"], c["title"]) if x) or c["id"]})
    phase_tables = []
    for d in F.report_devices(report) or [None]:
        t = F.phases_table_data(report, d)
        cols = t["phases"]
        rows = [{"metric": r["metric"], "expected": F.expected_text(r, cols),
                 "cells": [{"text": r["display"][c], "reason": r["reasons"][c], "na": r["display"][c] == F.NA} for c in cols]}
                for r in t["rows"]]
        gaps = []
        for pname, p in F.phases_for_device(report, d).items():
            g = p.get("gaps") or {}
            ms, cnt, la = g.get("ms_by_kind") or {}, g.get("count_by_kind") or {}, g.get("launch") or {}
            gaps.append([pname, F.fmt_value(p.get("window_ms"), "ms"), F.fmt_value(p.get("gpu_idle_share"), "share"),
                         F.fmt_value(p.get("launch_gap_share"), "share"), f"{cnt.get('launch', 0)} / {F.fmt_value(ms.get('launch'), 'ms')}",
                         F.fmt_value(la.get("p50_us"), "µs"), F.fmt_value(la.get("p99_us"), "µs"),
                         f"{cnt.get('other', 0)} / {F.fmt_value(ms.get('other'), 'ms')}"])
        phase_tables.append({"device": d, "heading": F.device_heading(report, d), "cols": cols,
                             "rows": rows, "tpot_definition": t.get("tpot_definition"), "gaps": gaps})
    waits = []
    for d in F.report_devices(report):
        w = F.waits_data(report, d)
        if w["rows"]:
            waits.append({**w, "device": d, "idle_text": F.fmt_value(w["idle_ms"], "ms")})
    td = prepare_timeline(activities, dict(report), host, host_index, path, t0_ns=t0_ns) if activities is not None else None
    timeline = None
    if td is not None:
        tfig = timeline_figure(td, max_points=max_points)
        tfig.add_trace(LS.highlight_trace())  # the layer strip's clicks fill it
        timeline = _fig(tfig, "timeline-graph")
    strip = LS.strip_data(report, layer_frame, activities, td)
    kern = [{**k, "total_text": F.fmt_value(k["total_ms"]), "mean_text": F.fmt_value(k["mean_us"]),
             "share_text": F.fmt_value(k["share"], "share")} for k in F.kernels_table_data(report, activities, limit=60)]
    return _template().render(
        title=title or f"diagnose report: {name}",
        css=_CSS,
        plotlyjs=get_plotlyjs(),
        source={"path": src.get("path"), "format": src.get("format")},
        devices=(("GPU " + describe_devices(report["devices"], report.get("gpu"))
                  + (" · peaks " + describe_peak(report["gpu"]) if report.get("gpu") else ""))
                 if report.get("devices") else "no GPU"),
        partial=bool(report.get("partial")),
        generated=_dt.datetime.now().strftime("%Y-%m-%d %H:%M"),
        banner=F.banner_data(report),
        device_headlines=device_headline_lines(report),
        key_numbers=[{**k, "value_text": F.fmt_value(k["value"], k["unit"])} for k in F.key_numbers(report)],
        waits=waits,
        waits_legend=legend_entries(waits_causes(waits)),
        timeline_legend=legend_entries(legend_causes(td)) if td is not None else [],
        cards=cards,
        symptoms_missing=report.get("symptoms") is None,
        not_evaluated=F.not_evaluated_data(report),
        not_evaluated_none="none reported" if report.get("not_evaluated") is not None else "not available",
        phase_tables=phase_tables,
        timeline=timeline,
        coverage=LS.coverage_texts(report),
        layer_strip=_fig(LS.strip_figure(strip), "layer-strip") if strip is not None else None,
        layer_strip_cells=json.dumps(strip["cells"] if strip is not None else {}).replace("</", "<\\/"),
        layer_click_js=LS.CLICK_JS,
        categories=_fig(F.categories_figure(report), "categories-graph"),
        attention=[{**a, "ms_text": F.fmt_value(a["attention_ms"], "ms")} for a in F.attention_rows(report)],
        roofline=_fig(F.roofline_figure(report), "roofline-graph"),
        kernel_table=F.kernel_table_rows(report),
        peak_column=F.peak_column(report),
        kernels=kern,
        quality=report.get("quality") or [],
    )


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
    host = hx = lane = lf = None
    if isinstance(analysis_or_report, Mapping):
        report, acts = dict(analysis_or_report), None
    else:
        report, acts = analysis_or_report.to_dict(), getattr(analysis_or_report, "activities", None)
    if verdicts:
        from diagnose.pipeline import ensure_verdicts

        ensure_verdicts(report, ruleset)
    if acts is not None:
        host = host_lane(getattr(analysis_or_report, "trace", None), report)
        hx = getattr(analysis_or_report, "host_index", None)
        from diagnose.app.pathlane import path_lane

        lane = path_lane(getattr(analysis_or_report, "paths", None))
        lf = getattr(analysis_or_report, "layer_frame", None)
    text = render_html(report, acts, title=title, max_points=max_points, host=host, host_index=hx, path=lane,
                       t0_ns=None if acts is None else getattr(analysis_or_report, "t0_ns", None), layer_frame=lf)
    p = Path(path)
    p.write_text(text, encoding="utf-8")
    return p
