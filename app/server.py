"""Dash app: ``create_app(paths)`` -> a ``dash.Dash`` serving the report of each trace.

No module-level app or state: :func:`create_app` analyses the traces once (or takes the
analyses it is given), keeps them in an :class:`AppState` closed over by the callbacks, and
registers the pages explicitly (a ``dcc.Location`` router, ``use_pages=False``).

Pages (path -> element ids for tests):

* ``/`` Overview: ``overview-banner``, ``key-numbers``, ``symptom-card-<id>``,
  ``not-evaluated``, ``quality-list``.
* ``/phases``: ``phases-table-<device>``, ``gaps-table-<device>``.
* ``/timeline``: ``timeline-graph`` (zoom re-renders full detail for the range), ``coverage``,
  ``layer-strip`` (a click on a cell zooms the timeline to its kernels and highlights them).
* ``/kernels``: ``categories-graph``, ``attention-share``, ``kernels-grid``.
* ``/roofline``: ``roofline-graph``, ``roofline-note``.
* ``/kv``: KV-cache calculator, ``kv-output``.
* ``/compare``: ``compare-a``, ``compare-b``, ``compare-output``, ``compare-verdict``.

Navigation links are ``nav-overview``, ``nav-phases``, ``nav-timeline``, ``nav-kernels``,
``nav-roofline``, ``nav-kv``, ``nav-compare``. The trace is chosen with the
``trace-select`` dropdown, whose values are indices into the traces given on the command
line: no URL or callback input ever names a file.

Callbacks are thin: each calls a pure ``*_view``/``render_*`` function of this module (the
timeline page's in :mod:`diagnose.app.timelinepage`, or a builder of
:mod:`diagnose.app.figures`) that the tests call directly.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import dash
import dash_ag_grid as dag
import pandas as pd
from dash import Input, Output, State, dcc, html

from diagnose.app import hostcheck
from diagnose.app import figures as F
from diagnose.app import layerstrip as LST
from diagnose.app.cards import cause_legend, symptom_card  # noqa: F401  (re-exported)
from diagnose.app.causeview import legend_entries, waits_causes
from diagnose.app.pagetext import distinct_labels
from diagnose.app.timeline import TimelineData, host_lane, prepare_timeline
from diagnose.app.timelinepage import timeline_highlight, timeline_page, timeline_zoom
from diagnose.hardware import describe_devices, describe_peak
from diagnose.app.compare_view import compare_output, compare_page
from diagnose.app.widgets import table as _table
from diagnose.pipeline import device_headline_lines

#: Inputs larger than this get a progress bar on stderr while they are analysed.
PROGRESS_THRESHOLD_BYTES = 100 * 1024 * 1024

PAGES = [
    ("overview", "/", "Overview"),
    ("phases", "/phases", "Phases"),
    ("timeline", "/timeline", "Timeline"),
    ("kernels", "/kernels", "Kernels"),
    ("roofline", "/roofline", "Roofline"),
    ("kv", "/kv", "KV budget"),
    ("compare", "/compare", "Compare"),
]

CSS = """
body { font-family: -apple-system, BlinkMacSystemFont, "Segoe UI", Roboto, sans-serif; margin: 0; color: #222; }
.dg-header { display: flex; align-items: center; gap: 1.5em; padding: 0.6em 1.2em; background: #263238; color: white; flex-wrap: wrap; }
.dg-header h1 { font-size: 1.2em; margin: 0; }
.dg-nav a { color: #cfd8dc; margin-right: 1em; text-decoration: none; }
.dg-nav a.active { color: white; font-weight: 600; border-bottom: 2px solid #80cbc4; }
.dg-select { min-width: 320px; color: #222; }
.dg-page { padding: 1em 1.5em; max-width: 1400px; }
.dg-banner { padding: 0.8em 1.2em; border-radius: 6px; color: white; margin-bottom: 1em; }
.dg-banner h2 { margin: 0 0 0.3em 0; font-size: 1.25em; }
.dg-cards { display: flex; gap: 1em; flex-wrap: wrap; }
.dg-num { border: 1px solid #ddd; border-radius: 6px; padding: 0.5em 1em; min-width: 150px; }
.dg-num .v { font-size: 1.4em; font-weight: 600; }
.dg-num .l { color: #666; font-size: 0.85em; }
.dg-card { border: 1px solid #ddd; border-left: 6px solid #999; border-radius: 6px; padding: 0.6em 1em; margin: 0.8em 0; }
.dg-card h3 { margin: 0.2em 0; font-size: 1.05em; }
.dg-card dt { font-weight: 600; margin-top: 0.4em; }
.dg-card dd { margin-left: 1em; }
.dg-sev { display: inline-block; padding: 0 0.5em; border-radius: 4px; color: white; font-size: 0.8em; margin-right: 0.5em; }
.dg-cause { display: inline-block; padding: 0 0.4em; border-radius: 4px; color: #111; font-size: 0.85em; }
.dg-legend { display: flex; flex-wrap: wrap; gap: 0.3em 1.2em; margin: 0.4em 0; font-size: 0.88em; }
.dg-legend-head { font-weight: 600; } .dg-swatch { display: inline-block; width: 1.4em; height: 0.8em; margin-right: 0.35em; vertical-align: middle; border-radius: 2px; }
table.dg-table { border-collapse: collapse; margin: 0.5em 0 1.5em 0; font-size: 0.92em; }
table.dg-table th, table.dg-table td { border: 1px solid #ddd; padding: 0.3em 0.7em; text-align: left; vertical-align: top; }
table.dg-table th { background: #f5f5f5; }
.dg-na { color: #888; }
.dg-why { color: #888; font-size: 0.8em; display: block; max-width: 28em; }
.dg-muted { color: #666; font-size: 0.9em; }
.dg-form > div { display: flex; align-items: center; gap: 0.5em; margin: 0.2em 0; }
.dg-form label { display: inline-block; min-width: 22em; }
.dg-form input[type=number], .dg-form input[type=text] { width: 16em; }
.dg-form .dash-input-container, .dg-form .dash-input { max-width: 18em; }
.dg-verdict-regression { background: #c62828; }
.dg-verdict-ok { background: #2e7d32; }
.dg-verdict-inconclusive { background: #616161; }
.dg-caveat { font-size: 0.9em; opacity: 0.9; margin-top: 0.3em; }
"""


# -- state -------------------------------------------------------------------------------


@dataclass
class TraceEntry:
    """One analysed trace. ``key`` (its index as a string) is what the UI passes around."""

    key: str
    label: str
    path: str
    report: dict
    activities: pd.DataFrame | None = None
    host: pd.DataFrame | None = None
    host_index: Any = None
    path_lane: Any = None  # the critical-path lane (diagnose.app.pathlane.path_lane)
    t0_ns: int | None = None  # the trace start (Analysis.t0_ns): the timeline's origin, as the report's start_ms
    layer_frame: pd.DataFrame | None = None
    _timeline: TimelineData | None = field(default=None, repr=False)
    _kernels: list | None = field(default=None, repr=False)
    _strip: Any = field(default=False, repr=False)  # False: not computed yet

    @property
    def timeline(self) -> TimelineData:
        if self._timeline is None:
            self._timeline = prepare_timeline(self.activities, self.report, self.host, self.host_index, self.path_lane,
                                              t0_ns=self.t0_ns)
        return self._timeline

    @property
    def strip(self) -> dict | None:
        """The layer heat strip's data (:func:`diagnose.app.layerstrip.strip_data`), once."""
        if self._strip is False:
            self._strip = LST.strip_data(self.report, self.layer_frame, self.activities,
                                         self.timeline if self.activities is not None else None)
        return self._strip

    @property
    def kernels(self) -> list[dict]:
        if self._kernels is None:
            self._kernels = F.kernels_table_data(self.report, self.activities)
        return self._kernels


@dataclass
class AppState:
    """Traces served by one app, in command-line order, and the rules their verdicts and the
    compare page use (the same :class:`~diagnose.engine.RuleSet` as the CLI's for the same flags)."""

    entries: list[TraceEntry]
    ruleset: Any = None

    def get(self, key: Any) -> TraceEntry:
        """Entry for a dropdown value; anything unknown falls back to the first trace."""
        for e in self.entries:
            if e.key == str(key):
                return e
        return self.entries[0]


def load_analyses(paths: Sequence[str], *, analyze: Callable | None = None, options: Any = None,
                  progress_threshold_bytes: int = PROGRESS_THRESHOLD_BYTES, console=None) -> list:
    """Analyse each path once (with the shared analysis ``options``); a rich progress bar on
    stderr when any input is large.

    Raises:
        DiagnoseError: an unusable trace (propagated from ``run_analysis``).
    """
    if analyze is None:
        from diagnose.pipeline import run_analysis

        def analyze(p):
            return run_analysis(p, options)
    sizes = [os.path.getsize(p) if os.path.isfile(p) else 0 for p in paths]
    if not any(s > progress_threshold_bytes for s in sizes):
        return [analyze(p) for p in paths]
    from rich.console import Console
    from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    out = []
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console or Console(stderr=True), transient=False) as prog:
        task = prog.add_task("analysing traces", total=len(paths))
        for p, s in zip(paths, sizes):
            prog.update(task, description=f"analysing {os.path.basename(p)} ({s / 1e6:,.0f} MB)")
            out.append(analyze(p))
            prog.advance(task)
    return out


def build_state(paths: Sequence[str], analyses: Sequence | None = None, *, verdicts: bool = True,
                ruleset: Any = None, **load_kwargs) -> AppState:
    """Entries for ``paths``; ``analyses`` (Analysis objects or report dicts) skip the analysis.

    With ``verdicts`` (default), a report without ``symptoms`` gets the symptom rules of
    ``ruleset`` (None: the packaged rules) evaluated on it
    (:func:`diagnose.pipeline.ensure_verdicts`), as ``diagnose run`` does.
    """
    from diagnose.app.pathlane import path_lane
    from diagnose.pipeline import attach_verdicts, ensure_verdicts

    paths = [str(p) for p in paths]
    if analyses is None:
        analyses = load_analyses(paths, **load_kwargs)
    if len(analyses) != len(paths):
        raise ValueError(f"{len(paths)} paths but {len(analyses)} analyses")
    names = distinct_labels(paths)
    entries = []
    for i, (p, a) in enumerate(zip(paths, analyses)):
        label = names[i]
        hx = lane = t0 = lf = None
        if isinstance(a, Mapping):
            report, acts, host = dict(a), None, None
        else:
            report = a.to_dict()
            if verdicts and getattr(a, "paths", None) is not None and "symptoms" not in report:
                try:  # ranked by predicted saving (the analysis's critical paths), as `run` does; `a` is not modified
                    report = attach_verdicts(dataclasses.replace(a), ruleset).to_dict()
                except Exception:  # noqa: BLE001 - ensure_verdicts below reports a broken rule
                    pass
            acts = getattr(a, "activities", None)
            host = host_lane(getattr(a, "trace", None), report)
            hx = getattr(a, "host_index", None)
            lane = path_lane(getattr(a, "paths", None))
            t0 = getattr(a, "t0_ns", None)
            lf = getattr(a, "layer_frame", None)
        if verdicts:
            ensure_verdicts(report, ruleset)
        entries.append(TraceEntry(key=str(i), label=label, path=p, report=report, activities=acts, host=host, host_index=hx,
                                  path_lane=lane, t0_ns=t0, layer_frame=lf))
    if not entries:
        raise ValueError("create_app needs at least one trace")
    return AppState(entries, ruleset)


# -- small rendering helpers --------------------------------------------------------------


def _cell(text: str, reason: str = "") -> html.Td:
    if text == F.NA:
        return html.Td([html.Span(F.NA, className="dg-na"), html.Span(reason, className="dg-why")])
    return html.Td(text, title=reason or None)


def _graph(id: str, fig) -> dcc.Graph:
    return dcc.Graph(id=id, figure=fig, config={"displaylogo": False, "responsive": True})


# -- pages ---------------------------------------------------------------------------------


def overview_page(entry: TraceEntry) -> html.Div:
    """Overview: worst-severity banner, key numbers, symptom cards, rules not evaluated, quality."""
    r = entry.report
    b = F.banner_data(r)
    parts: list[Any] = [
        html.Div([html.H2(b["title"]), html.Div(b["text"], id="headline")] + ([html.Div(b["caveat"], className="dg-caveat")]
                 if b.get("caveat") else []), id="overview-banner", className="dg-banner",
                 style={"background": b["color"]}, **{"data-severity": b["severity"]}),
        html.Ul([html.Li(line) for line in device_headline_lines(r)], id="device-headlines"),
        html.Div([html.Div([html.Div(F.fmt_value(k["value"], k["unit"]), className="v"), html.Div(k["label"], className="l")],
                           className="dg-num", id=f"num-{k['id']}") for k in F.key_numbers(r)],
                 className="dg-cards", id="key-numbers"),
    ]
    parts.extend(waits_section(r))
    cards = F.symptom_cards_data(r)
    parts.append(html.H2("Symptoms"))
    if cards:
        for c in cards:
            parts.append(symptom_card(c))
    elif r.get("symptoms") is None:
        parts.append(html.P("Symptom rules were not run for this report: no symptom can be shown.", className="dg-muted"))
    else:
        parts.append(html.P("No symptom fired.", className="dg-muted"))
    ne = F.not_evaluated_data(r)
    parts.append(html.H3("Rules not evaluated"))
    if ne:
        parts.append(html.Ul([html.Li([html.B(x["id"]), f" ({x['title']})" if x["title"] else "", ": " + x["reason"]])
                              for x in ne], id="not-evaluated"))
    else:
        parts.append(html.P("none reported" if r.get("not_evaluated") is not None else
                            "not available (the report has no 'not_evaluated' list)", className="dg-muted",
                            id="not-evaluated"))
    parts.append(html.H3("Data quality"))
    q = r.get("quality") or []
    parts.append(html.Ul([html.Li([html.Code(x.get("code", "")), " ", x.get("message", "")]) for x in q], id="quality-list")
                 if q else html.P("no quality warnings", className="dg-muted", id="quality-list"))
    src = r.get("source") or {}
    devs = ("GPU " + describe_devices(r.get("devices") or [], r.get("gpu"))) if r.get("devices") else "no GPU"
    if r.get("devices") and r.get("gpu"):
        devs += " · peaks " + describe_peak(r["gpu"])
    parts.append(html.P([f"Source: {os.path.basename(str(src.get('path', entry.path)))} ({src.get('format', '?')}) · {devs}",
                         " · PARTIAL trace (truncated input)" if r.get("partial") else ""], className="dg-muted"))
    return html.Div(parts)


def waits_section(report: Mapping) -> list[Any]:
    """Where the GPU waited (per device, the ``all`` phase): the cause legend, idle time by
    cause, longest gaps."""
    waits = [(d, w) for d in F.report_devices(report) for w in [F.waits_data(report, d)] if w["rows"]]
    out: list[Any] = [cause_legend(legend_entries(waits_causes(w for _, w in waits)), "cause-legend")] if waits else []
    for d, w in waits:
        out.append(html.H3(f"Where the GPU waited (GPU {d}): idle {F.fmt_value(w['idle_ms'], 'ms')}"))
        out.append(html.Ul([html.Li([html.Span(c["cause"], className="dg-cause", style={"background": c["color"]}),
                                     f" {c['ms_text']}: {c['label']}", html.Span(f" — {c['levers_text']}" if c["levers_text"] else "", className="dg-muted")])
                            for c in w["causes"]], id=f"causes-{d}", className="dg-causes"))
        out.append(_table(["start (ms from trace start)", "idle", "cause", "pieces", "the host was in", "host stack", "next on the GPU"],
                          [[r["start_text"], r["ms_text"],
                            html.Span(r["cause"], className="dg-cause", style={"background": r["color"]}),
                            r["parts_text"], r["host_call"], r["stack_text"], r["next"]] for r in w["rows"]],
                          id=f"longest-gaps-{d}"))
    return out


def phases_page(entry: TraceEntry) -> html.Div:
    """Prefill vs decode table (docs/prefill-decode.md §1) and launch-gap statistics, per device."""
    r = entry.report
    parts: list[Any] = [html.H2("Prefill vs decode")]
    devs = F.report_devices(r) or [None]
    for d in devs:
        t = F.phases_table_data(r, d)
        cols = t["phases"]
        head = ["metric"] + cols + ["expected (docs/prefill-decode.md)"]
        body = []
        for row in t["rows"]:
            body.append([row["metric"]] + [_cell(row["display"][c], row["reasons"][c]) for c in cols]
                        + [html.Td(F.expected_text(row, cols), className="dg-muted")])
        parts.append(html.H3(F.device_heading(r, d)))
        parts.append(_table(head, body, id=f"phases-table-{d}"))
        if t.get("tpot_definition"):
            parts.append(html.P(f"TPOT definition: {t['tpot_definition']}", className="dg-muted"))
        parts.append(gaps_table(r, d))
    return html.Div(parts)


def gaps_table(report: Mapping, device: Any) -> html.Table:
    """Idle gaps by kind per phase: count, total ms, launch-gap p50/p99 (µs)."""
    body = []
    for name, p in F.phases_for_device(report, device).items():
        g = p.get("gaps") or {}
        ms, cnt, la = g.get("ms_by_kind") or {}, g.get("count_by_kind") or {}, g.get("launch") or {}
        body.append([name, F.fmt_value(p.get("window_ms"), "ms"), F.fmt_value(p.get("gpu_idle_share"), "share"),
                     f"{cnt.get('launch', 0)} / {F.fmt_value(ms.get('launch'), 'ms')}",
                     F.fmt_value(la.get("p50_us"), "µs"), F.fmt_value(la.get("p99_us"), "µs"),
                     f"{cnt.get('graph', 0)} / {F.fmt_value(ms.get('graph'), 'ms')}",
                     f"{cnt.get('other', 0)} / {F.fmt_value(ms.get('other'), 'ms')}",
                     f"{cnt.get('unattributed', 0)} / {F.fmt_value(ms.get('unattributed'), 'ms')}"])
    return _table(["phase", "GPU window", "idle share", "launch gaps (n / total)", "launch gap p50", "launch gap p99",
                   "graph gaps", "other gaps", "unattributed gaps"], body, id=f"gaps-table-{device}")


def kernels_page(entry: TraceEntry) -> html.Div:
    r = entry.report
    att = F.attention_rows(r)
    rows = [dict(k, share_pct=None if k["share"] is None else round(k["share"] * 100, 2)) for k in entry.kernels]
    col_defs = [
        {"field": "phase", "width": 100}, {"field": "device", "width": 90},
        {"field": "name", "flex": 3, "tooltipField": "name"}, {"field": "category", "width": 120},
        {"field": "count", "width": 100, "filter": "agNumberColumnFilter"},
        {"field": "total_ms", "headerName": "total ms", "width": 120, "filter": "agNumberColumnFilter", "sort": "desc"},
        {"field": "mean_us", "headerName": "mean µs", "width": 110, "filter": "agNumberColumnFilter"},
        {"field": "share_pct", "headerName": "% of phase kernel time", "width": 170, "filter": "agNumberColumnFilter"},
    ]
    grid = dag.AgGrid(
        id="kernels-grid", rowData=rows, columnDefs=col_defs,
        defaultColDef={"sortable": True, "filter": True, "resizable": True, "floatingFilter": True},
        dashGridOptions={"pagination": True, "paginationPageSize": 25, "tooltipShowDelay": 300},
        style={"height": "560px"},
    )
    src = ("every kernel of the trace, grouped by name" if entry.activities is not None else
           "the report's top 10 kernels per phase (no activity table available)")
    return html.Div([
        html.H2("Kernels"),
        _graph("categories-graph", F.categories_figure(r)),
        html.H3("Attention share of kernel time"),
        html.P("docs/prefill-decode.md §5: on long prompts, attention taking clearly more than its FLOP share (~15 %) means poor "
               "tiling (use an IO-aware kernel).", className="dg-muted"),
        _table(["device", "phase", "attention share", "attention ms"],
               [[a["device"], a["phase"], a["text"], F.fmt_value(a["attention_ms"], "ms")] for a in att], id="attention-share"),
        html.H3("Which kernel to tune"),
        html.P("One row per phase, op, input dims and kernel: achieved TFLOP/s and TB/s from the operator shapes, "
               "against the device peak (diagnose run --format json: kernel_table).", className="dg-muted"),
        kernel_table_view(r),
        html.H3("Top kernels"),
        html.P(f"Rows: {src}. Sort and filter in the column headers.", className="dg-muted"),
        grid,
    ])


def kernel_table_view(report: Mapping) -> Any:
    rows = F.kernel_table_rows(report)
    if not rows:
        return html.P("not available: the report has no kernel table", className="dg-muted", id="kernel-table")
    return _table(["device", "phase", "op", "input dims", "kernel", "calls", "total", "share", "TFLOP/s", "TB/s", F.peak_column(report), "bound"],
                  [[r["device"], r["phase"], r["op"], r["input_dims"], r["kernel"], r["calls"], r["total"], r["share"], r["tflops"],
                    r["tbps"], r["peak"], r["bound"]] for r in rows], id="kernel-table")


def roofline_page(entry: TraceEntry) -> html.Div:
    r = entry.report
    fig = F.roofline_figure(r)
    gpu = r.get("gpu") or {}
    if fig.layout.meta and fig.layout.meta.get("mode") == "empty":
        note = html.P(["Not available: ", fig.layout.meta["reason"].replace("<br>", " ")], className="dg-muted", id="roofline-note")
    else:
        bits = [f"Peaks of {describe_peak(gpu)}"]
        if gpu.get("source") and gpu.get("source") not in bits[0]:
            bits.append(f" (source: {gpu['source']})")
        note = html.P(bits, className="dg-muted", id="roofline-note")
    return html.Div([html.H2("Roofline"), note, _graph("roofline-graph", fig),
                     html.P("Below the ridge point a kernel is memory-bound: more FLOP/s does not help (docs/prefill-decode.md §3).",
                            className="dg-muted")])


_KV_FIELDS = [
    ("num_hidden_layers", "layers (num_hidden_layers)"),
    ("hidden_size", "hidden_size"),
    ("num_attention_heads", "num_attention_heads"),
    ("num_key_value_heads", "num_key_value_heads"),
    ("head_dim", "head_dim"),
    ("intermediate_size", "intermediate_size"),
    ("vocab_size", "vocab_size"),
]
_DTYPES = ["fp32", "fp16", "bf16", "fp8", "int8", "int4"]


#: Weight dtypes of the KV page: "auto" is the config's quantization_config (16 bit without one).
_WEIGHT_DTYPES = ["auto"] + _DTYPES


def _kv_presets() -> list[dict]:
    from diagnose.accounting import shipped_model_configs

    return ([{"label": "reference 7B-like (docs/prefill-decode.md §2)", "value": "7b"}]
            + [{"label": f"shipped config: {n}", "value": n} for n in shipped_model_configs()]
            + [{"label": "a config.json file (path below)", "value": "file"},
               {"label": "custom (edit the fields)", "value": "custom"}])


def kv_page(entry: TraceEntry) -> html.Div:
    """The KV-cache calculator, starting from the trace's model, KV dtype and device
    (:func:`figures.kv_start`)."""
    ref = F.REFERENCE_7B
    start = F.kv_start(entry.report)
    rows = [html.Div([html.Label(label, htmlFor=f"kv-{key}"),
                      dcc.Input(id=f"kv-{key}", type="number", min=1, step=1, value=ref[key], debounce=True)])
            for key, label in _KV_FIELDS]
    rows.append(html.Div([html.Label("tie_word_embeddings"),
                          dcc.Checklist(id="kv-tie", options=[{"label": " tied", "value": "tied"}], value=[], inline=True)]))
    ctrl = [
        html.Div([html.Label("model"), dcc.Dropdown(id="kv-preset", options=_kv_presets(), value=start["preset"],
                                                    clearable=False, style={"width": "26em", "display": "inline-block"})]),
        html.Div([html.Label("config.json (path on this machine, or a shipped name)", htmlFor="kv-model-config"),
                  dcc.Input(id="kv-model-config", type="text", value=start["model_config"], debounce=True,
                            style={"width": "30em"})]),
        *rows,
        html.Div([html.Label("device memory (GB = 1e9 B)"), dcc.Input(id="kv-memory", type="number", min=0,
                                                                      value=start["memory_gb"], debounce=True)]),
        html.Div([html.Label("overhead (GB)"), dcc.Input(id="kv-overhead", type="number", min=0, value=5, debounce=True)]),
        html.Div([html.Label("context lengths (tokens, comma separated; 8k ok)"),
                  dcc.Input(id="kv-contexts", type="text", value="2048, 8192, 32768, 131072", debounce=True)]),
        html.Div([html.Label("KV dtype"), dcc.Dropdown(id="kv-dtype", options=_DTYPES, value=start["kv_dtype"], clearable=False,
                                                       style={"width": "10em", "display": "inline-block"})]),
        html.Div([html.Label("weight dtype"), dcc.Dropdown(id="kv-weight-dtype", options=_WEIGHT_DTYPES, value="auto",
                                                           clearable=False, style={"width": "10em", "display": "inline-block"})]),
    ]
    model = entry.report.get("model") or {}
    info = [html.P(start["text"], className="dg-muted", id="kv-start")]
    if model.get("kv_bytes_per_token"):
        kvd = model.get("kv_dtype") or "dtype not known from the trace"
        info.append(html.P(f"This trace's model ({model.get('name')}): {model['kv_bytes_per_token']:,} KV bytes per token "
                           f"({kvd}), weights {F.fmt_value((model.get('weight_bytes') or 0) / 1e9, 'GB')}.",
                           className="dg-muted"))
    return html.Div([
        html.H2("KV-cache budget"),
        html.P("The answer of `diagnose kv-budget` for the same inputs: KV bytes per token = 2 x layers x "
               "num_key_value_heads x head_dim x bytes per element (docs/prefill-decode.md §2; MLA and sliding windows from the "
               "config). Sequences that fit = (memory - overhead - weights) / KV per sequence; usable after "
               "fragmentation = 75 % of that (docs/prefill-decode.md §3). Weights follow the config's quantization unless a "
               "weight dtype is chosen.", className="dg-muted"),
        *info,
        html.Div(ctrl, className="dg-form"),
        html.Div(kv_output(kv_view(start["preset"], start["model_config"], *[ref[k] for k, _ in _KV_FIELDS], [],
                                   start["memory_gb"], 5, "2048, 8192, 32768, 131072", start["kv_dtype"], "auto")),
                 id="kv-output"),
    ])


# Bounds on the KV calculator's inputs (callback inputs come from the browser: anything can
# arrive). No real model or device comes near them; they keep every number finite and every
# reply small.
KV_MAX_CONTEXTS = 64
KV_MAX_CONTEXT_TOKENS = 10**9
KV_MAX_TEXT = 2000
KV_MAX_MODEL_FIELD = 10**7
KV_MAX_MEMORY_GB = 10**6


def parse_contexts(text: str) -> list[int]:
    """'2048, 8k, 32K' -> [2048, 8192, 32768]. Raises ValueError on anything else, on more
    than :data:`KV_MAX_CONTEXTS` lengths, or on a length above :data:`KV_MAX_CONTEXT_TOKENS`."""
    if text is not None and not isinstance(text, str):
        raise ValueError("context lengths must be text such as '2048, 8k'")
    if len(text or "") > KV_MAX_TEXT:
        raise ValueError(f"context lengths: at most {KV_MAX_TEXT:,} characters")
    out = []
    for tok in re.split(r"[,\s;]+", (text or "").strip()):
        if not tok:
            continue
        m = re.fullmatch(r"(\d{1,12})([kK]?)", tok)
        if not m:
            raise ValueError(f"context {tok[:40]!r} is not a whole number of tokens")
        c = int(m.group(1)) * (1024 if m.group(2) else 1)
        if c > KV_MAX_CONTEXT_TOKENS:
            raise ValueError(f"context {tok!r}: at most {KV_MAX_CONTEXT_TOKENS:,} tokens")
        out.append(c)
        if len(out) > KV_MAX_CONTEXTS:
            raise ValueError(f"at most {KV_MAX_CONTEXTS} context lengths at once")
    if not out:
        raise ValueError("give at least one context length")
    return out


def _bounded(v: Any, what: str, hi: float, whole: bool) -> float | int:
    """A form value as a finite number in [0, hi] (whole when ``whole``). Raises ValueError."""
    if isinstance(v, bool) or not isinstance(v, (int, float, str)):
        raise ValueError(f"{what} must be a number")
    try:
        x = float(v)
    except (ValueError, OverflowError):
        raise ValueError(f"{what} must be a number, got {str(v)[:40]!r}") from None
    if not math.isfinite(x) or x < 0 or x > hi:
        raise ValueError(f"{what} must be a number from 0 to {hi:,}, got {str(v)[:40]}")
    if whole:
        if x != int(x):
            raise ValueError(f"{what} must be a whole number, got {str(v)[:40]}")
        return int(x)
    return x


def kv_view(preset, model_config, layers, hidden, heads, kv_heads, head_dim, inter, vocab, tie, memory_gb, overhead_gb,
            contexts_text, kv_dtype, weight_dtype) -> dict:
    """Calculator state from the form fields -> :func:`figures.kv_budget_data` result.

    ``preset``: "7b" (the reference config) or "custom" (the fields), a shipped config name,
    or "file" (``model_config``: a ``config.json`` path or a shipped name, as ``--model-config``)."""
    try:
        ctx = parse_contexts(contexts_text)
    except ValueError as e:
        return {"ok": False, "error": str(e)}
    try:
        mem = None if memory_gb in (None, "", 0) else _bounded(memory_gb, "device memory (GB)", KV_MAX_MEMORY_GB, whole=False)
        overhead = 0.0 if overhead_gb in (None, "") else _bounded(overhead_gb, "overhead (GB)", KV_MAX_MEMORY_GB, whole=False)
    except ValueError as e:
        return {"ok": False, "error": str(e)}
    for what, dt, allowed in (("KV dtype", kv_dtype, _DTYPES), ("weight dtype", weight_dtype, _WEIGHT_DTYPES)):
        if dt is not None and dt not in allowed:
            return {"ok": False, "error": f"{what} must be one of {', '.join(allowed)}"}
    wd = None if weight_dtype in (None, "auto") else weight_dtype
    common = {"memory_gb": mem, "overhead_gb": overhead, "contexts": ctx, "kv_dtype": kv_dtype or "fp16", "weight_dtype": wd}
    if preset not in ("7b", "custom", "file"):
        return F.kv_budget_data(model_config=str(preset), **common)
    if preset == "file":
        if not isinstance(model_config, str) or not model_config.strip() or len(model_config) > KV_MAX_TEXT:
            return {"ok": False, "error": "give a config.json path (or a shipped config name)"}
        return F.kv_budget_data(model_config=model_config.strip(), **common)
    vals = [layers, hidden, heads, kv_heads, head_dim, inter, vocab]
    if any(v is None or v == "" for v in vals):
        return {"ok": False, "error": "fill in every model field with a positive whole number"}
    try:
        cfg = {k: _bounded(v, label, KV_MAX_MODEL_FIELD, whole=True) for (k, label), v in zip(_KV_FIELDS, vals)}
    except ValueError as e:
        return {"ok": False, "error": str(e)}
    cfg["tie_word_embeddings"] = bool(tie)
    cfg["_name_or_path"] = "custom" if preset != "7b" else F.REFERENCE_7B["_name_or_path"]
    return F.kv_budget_data(cfg, **common)


def kv_output(d: dict) -> list:
    if not d.get("ok"):
        return [html.P(f"error: {d.get('error')}", style={"color": "#c62828"}, id="kv-error")]
    per_tok = d["kv_bytes_per_token"]
    parts = [
        html.P([html.B(f"{per_tok:,} B per token"), f" = {per_tok / 1024:,.1f} KiB ({d['kv_dtype']}); weights "
                f"{d['weight_bytes'] / 1e9:,.2f} GB ({d['weight_dtype']})"
                + (f"; memory for KV {d['kv_memory_bytes'] / 2**30:,.1f} GiB" if d.get("kv_memory_bytes") else "")],
               id="kv-per-token"),
    ]
    body = [[f"{r['context']:,}", f"{r['kv_bytes_per_sequence'] / 2**20:,.0f} MiB ({r['kv_gib_per_sequence']:.2f} GiB)",
             F.fmt_value(r["max_sequences"], "count") if r["max_sequences"] is not None else "— (no memory given)",
             F.fmt_value(r["usable_sequences"], "count") if r["usable_sequences"] is not None else "—"] for r in d["rows"]]
    parts.append(_table(["context (tokens)", "KV per sequence", "max concurrent sequences",
                         f"usable (x{d['fragmentation_factor']:g} fragmentation)"], body, id="kv-table"))
    return parts


def not_found_page(pathname: str) -> html.Div:
    return html.Div([html.H2("Page not found"), html.P(f"No page at {pathname!r}."),
                     html.Ul([html.Li(dcc.Link(label, href=href)) for _, href, label in PAGES])], id="not-found")


def render_page(state: AppState, pathname: str | None, trace_key: Any) -> html.Div:
    """Router: the page for ``pathname`` on the trace selected by ``trace_key``."""
    entry = state.get(trace_key)
    path = ((pathname if isinstance(pathname, str) else None) or "/").rstrip("/") or "/"
    builders = {
        "/": lambda: overview_page(entry),
        "/phases": lambda: phases_page(entry),
        "/timeline": lambda: timeline_page(entry),
        "/kernels": lambda: kernels_page(entry),
        "/roofline": lambda: roofline_page(entry),
        "/kv": lambda: kv_page(entry),
        "/compare": lambda: compare_page(state),
    }
    build = builders.get(path)
    return html.Div(build() if build else not_found_page(path), className="dg-page")


def nav_classes(pathname: str | None) -> list[str]:
    path = ((pathname if isinstance(pathname, str) else None) or "/").rstrip("/") or "/"
    return ["active" if href == path else "" for _, href, _ in PAGES]


def timeline_update(state: AppState, triggered, relayout: dict | None, click: dict | None, trace_key, max_points: int = 20000):
    """The timeline callback's figure; ``triggered``: the prop ids that changed. Dash sends
    props that change together in one request, so a click on the layer strip can come with the
    timeline's own relayout (the autosize of a page just drawn): the click then wins."""
    if "layer-strip.clickData" in (triggered or ()):
        return timeline_highlight(state, click, trace_key, max_points)
    return timeline_zoom(state, relayout, trace_key, max_points)


# -- app factory -----------------------------------------------------------------------------


def create_app(paths: Sequence[str], analyses: Sequence | None = None, *, title: str = "diagnose",
               max_points: int = 20000, verdicts: bool = True, options: Any = None, ruleset: Any = None,
               allowed_hosts: Sequence[str] = (), **load_kwargs) -> dash.Dash:
    """Build the Dash app for ``paths``.

    Args:
        paths: trace files (as given on the command line), at least one.
        analyses: precomputed ``Analysis`` objects or report dicts, aligned with ``paths``;
            None = analyse each path now (progress bar on stderr for inputs over 100 MB).
        title: browser title.
        max_points: timeline drawing budget (see :func:`timeline_figure`).
        verdicts: evaluate the symptom rules on reports that have no ``symptoms`` yet.
        options: the shared :class:`~diagnose.options.AnalysisOptions` for every trace.
        ruleset: the :class:`~diagnose.engine.RuleSet` for verdicts and the compare page
            (``--threshold``, ``--rules-config``); None for the packaged defaults.
        allowed_hosts: Host names accepted besides the loopback ones (``--allowed-host``);
            every other Host gets 421 on every route (:mod:`diagnose.app.hostcheck`).
        **load_kwargs: passed to :func:`load_analyses` (``analyze``, ``progress_threshold_bytes``).

    Returns:
        The app; ``app.diagnose_state`` is its :class:`AppState`.

    Raises:
        DiagnoseError: a trace cannot be analysed.
        ValueError: no paths, or ``analyses`` does not match ``paths``.
    """
    if options is not None and analyses is None:
        load_kwargs["options"] = options
    state = build_state(paths, analyses, verdicts=verdicts, ruleset=ruleset, **load_kwargs)
    app = dash.Dash(__name__, title=title, suppress_callback_exceptions=True, update_title=None,
                    serve_locally=True)
    hostcheck.install(app.server, hostcheck.allowed_names(None, allowed_hosts))  # every route: DNS rebinding guard
    app.index_string = app.index_string.replace("{%css%}", "{%css%}<style>" + CSS + "</style>")
    app.layout = html.Div([
        dcc.Location(id="url", refresh=False),
        html.Div([
            html.H1("diagnose"),
            html.Nav([dcc.Link(label, href=href, id=f"nav-{key}") for key, href, label in PAGES], className="dg-nav"),
            html.Div(dcc.Dropdown(id="trace-select", options=[{"label": e.label, "value": e.key} for e in state.entries],
                                  value=state.entries[0].key, clearable=False, searchable=False), className="dg-select"),
        ], className="dg-header"),
        html.Div(id="page-content"),
    ])

    @app.callback(Output("page-content", "children"), Input("url", "pathname"), Input("trace-select", "value"))
    def _route(pathname, trace_key):
        return render_page(state, pathname, trace_key)

    @app.callback([Output(f"nav-{key}", "className") for key, _, _ in PAGES], Input("url", "pathname"))
    def _nav(pathname):
        return nav_classes(pathname)

    @app.callback(Output("timeline-graph", "figure"), Input("timeline-graph", "relayoutData"),
                  Input("layer-strip", "clickData"), State("trace-select", "value"), prevent_initial_call=True)
    def _timeline_zoom(relayout, click, trace_key):
        return timeline_update(state, dash.callback_context.triggered_prop_ids, relayout, click, trace_key, max_points)

    @app.callback([Output(f"kv-{k}", "value") for k, _ in _KV_FIELDS], Input("kv-preset", "value"),
                  prevent_initial_call=True)
    def _kv_preset(preset):
        if preset != "7b":
            return [dash.no_update] * len(_KV_FIELDS)
        return [F.REFERENCE_7B[k] for k, _ in _KV_FIELDS]

    @app.callback(Output("kv-output", "children"),
                  [Input("kv-preset", "value"), Input("kv-model-config", "value")]
                  + [Input(f"kv-{k}", "value") for k, _ in _KV_FIELDS]
                  + [Input("kv-tie", "value"), Input("kv-memory", "value"), Input("kv-overhead", "value"),
                     Input("kv-contexts", "value"), Input("kv-dtype", "value"), Input("kv-weight-dtype", "value")],
                  prevent_initial_call=True)
    def _kv(*args):
        return kv_output(kv_view(*args))

    @app.callback(Output("compare-output", "children"), Input("compare-a", "value"), Input("compare-b", "value"),
                  prevent_initial_call=True)
    def _compare(a, b):
        return compare_output(state, a, b)

    app.diagnose_state = state
    return app
