"""Pure figure builders and table data for the Dash app and the static HTML report.

Every function takes the JSON report (``Analysis.to_dict()``, schema_version 1) and, where
it needs per-activity detail, the activities frame; none of them touches global state, so
the app's callbacks are thin wrappers and the tests call these directly.

Optional report keys (added by later analyzers) are read defensively: per phase ``mfu``,
``mbu``, ``achieved_tflops``, ``achieved_tbps``, ``arithmetic_intensity``, ``bound``,
``bound_ratio``, ``peak_tflops``, ``peak_tbps``, ``flops``, ``bytes``, ``attainment_missing``
(reasons) and, for the roofline's per-category points, ``category_flops`` /
``category_bytes`` ({category: value}); top level ``symptoms``, ``not_evaluated`` and
``gpu``. A missing value is shown as "not available" with the reason.

Units: times in ms unless a name says otherwise; shares are fractions in [0, 1] (shown as
%); TFLOP/s = 1e12 FLOP/s; TB/s = 1e12 B/s; GB = 1e9 B; GiB = 2**30 B.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable, Mapping

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from diagnose.report import fmt
from diagnose.vocab import SEVERITY_COLORS, STEP_PHASES
from diagnose.app import pagetext as _words
from diagnose.app.timeline import (  # noqa: F401  (re-exported: the figure builders live here)
    CATEGORY_COLORS,
    PHASE_COLORS,
    TimelineData,
    category_color,
    figure_drawn_elements,
    parse_relayout,
    prepare_timeline,
    timeline_figure,
)

__all__ = [
    "timeline_figure", "prepare_timeline", "TimelineData", "figure_drawn_elements", "parse_relayout",
    "categories_figure", "roofline_figure", "phases_table_data", "kv_budget_data", "compare_view",
    "kernels_table_data", "attention_rows", "banner_data", "symptom_cards_data", "not_evaluated_data",
    "key_numbers", "expected_text", "fmt_value", "waits_data", "kernel_table_rows", "phases_for_device", "report_devices", "safe_id",
    "REFERENCE_7B", "CATEGORY_COLORS", "PHASE_COLORS", "NA",
]

NA = _words.NA  # a missing value on the web
# The pages' words (:mod:`diagnose.app.pagetext`), re-exported where the views read them.
_num, fmt_value, SEVERITY_ORDER, _severity_rank, sorted_symptoms, _PHASE_ROWS = (
    _words._num, _words.fmt_value, _words.SEVERITY_ORDER, _words._severity_rank, _words.sorted_symptoms, _words._PHASE_ROWS)
finding_label, symptom_cards_data, device_heading, peak_column, kv_start = (
    _words.finding_label, _words.symptom_cards_data, _words.device_heading, _words.peak_column, _words.kv_start)
_short, _evidence_pairs, _finding_text, _threshold_text, _threshold_words = (
    _words._short, _words._evidence_pairs, _words._finding_text, _words._threshold_text, _words._threshold_words)

# -- small helpers ----------------------------------------------------------------------


def safe_id(s: Any) -> str:
    """An element-id-safe version of a rule id (letters, digits, '-', '_'), used by the app
    and the HTML report for ``symptom-card-<id>``."""
    return re.sub(r"[^A-Za-z0-9_-]+", "-", str(s)).strip("-") or "x"





def report_devices(report: Mapping) -> list[int | None]:
    """Device ids that have phases in the report, in report order (None for CPU-only)."""
    out: list[int | None] = []
    for p in report.get("phases") or []:
        d = p.get("device")
        if d not in out:
            out.append(d)
    return out


def phases_for_device(report: Mapping, device: int | None = None) -> dict[str, dict]:
    """{phase name: phase dict} for ``device`` (default: the first device in the report)."""
    devs = report_devices(report)
    if device is None and devs:
        device = devs[0]
    return {p["name"]: p for p in report.get("phases") or [] if p.get("device") == device}


def _device_name(report: Mapping, device: int | None) -> str:
    for d in report.get("devices") or []:
        if d.get("id") == device:
            return d.get("name") or ""
    return ""


def _empty_figure(title: str, message: str, height: int = 320) -> go.Figure:
    fig = go.Figure()
    fig.update_layout(
        title=title, height=height, xaxis=dict(visible=False), yaxis=dict(visible=False),
        annotations=[dict(text=message, x=0.5, y=0.5, xref="paper", yref="paper", showarrow=False,
                          font=dict(size=13), align="center")],
        meta={"mode": "empty", "reason": message},
        plot_bgcolor="white",
    )
    return fig


#: Which analyzer inputs (prefix of an ``attainment_missing`` reason) each metric needs.
_NEEDS = {
    "achieved_tflops": ("flops", "steps"),
    "achieved_tbps": ("bytes", "steps"),
    "flops": ("flops", "steps"),
    "bytes": ("bytes", "steps"),
    "mfu": ("flops", "peak", "steps"),
    "mbu": ("bytes", "peak", "steps"),
    "arithmetic_intensity": ("flops", "bytes", "steps"),
    "bound": ("flops", "bytes", "peak", "steps"),
    "bound_ratio": ("flops", "bytes", "peak", "steps"),
}


def _missing_reason(phase: Mapping | None, key: str, what: str) -> str:
    """Why ``key`` is missing from a phase dict (uses the analyzer's ``attainment_missing``,
    keeping the reasons that concern the inputs ``key`` needs)."""
    if phase is None:
        return "phase not in this trace"
    if key not in phase:
        return f"{what} not computed by the analyzer that produced this report"
    reasons = [str(r) for r in phase.get("attainment_missing") or []]
    needs = _NEEDS.get(key)
    if needs:
        relevant = [r for r in reasons if r.split(" ", 1)[0].split("(", 1)[0].lower() in needs]
        reasons = relevant or reasons
    if reasons:
        return "; ".join(reasons)
    return f"{what} unknown for this phase"


# -- categories ------------------------------------------------------------------------


def categories_figure(report: Mapping, device: int | None = None) -> go.Figure:
    """Horizontal stacked bars: kernel/copy time per category (ms) for each phase.

    One trace per category (legend = category), one bar per phase of ``device`` (default the
    first device). Hover shows ms and the share of the phase's activity time.
    """
    phases = phases_for_device(report, device)
    names = [n for n, p in phases.items() if p.get("categories_ms")]
    if not names:
        return _empty_figure("Time by kernel category",
                             "No GPU activity in this trace: no kernel categories to show.")
    cats: list[str] = []
    for n in names:
        for c in phases[n]["categories_ms"]:
            if c not in cats:
                cats.append(c)
    labels = [f"{n} ({phases[n].get('steps', 0)} steps)" if n != "all" else "all (whole trace)" for n in names]
    totals = [sum(_num(v) or 0.0 for v in phases[n]["categories_ms"].values()) for n in names]
    fig = go.Figure()
    for c in cats:
        ms = [_num(phases[n]["categories_ms"].get(c)) or 0.0 for n in names]
        share = [m / t if t else 0.0 for m, t in zip(ms, totals)]
        fig.add_trace(go.Bar(
            y=labels, x=ms, name=c, orientation="h", marker_color=category_color(c),
            customdata=np.array(share) * 100,
            hovertemplate=f"{c}: %{{x:.3f}} ms (%{{customdata:.1f}} %)<extra>%{{y}}</extra>",
        ))
    fig.update_layout(
        title="Time by kernel category per phase (ms; attention share in the table below)",
        barmode="stack", height=160 + 50 * len(names), xaxis_title="ms of GPU activity",
        yaxis=dict(autorange="reversed"), legend=dict(orientation="h", y=-0.3), plot_bgcolor="white",
        margin=dict(l=170, r=20, t=50, b=40), meta={"mode": "categories", "phases": names, "categories": cats},
    )
    return fig


def attention_rows(report: Mapping) -> list[dict]:
    """Attention share of kernel time per (device, phase), with the docs/prefill-decode.md §5 reading."""
    out = []
    for p in report.get("phases") or []:
        share = _num(p.get("attention_share"))
        out.append({
            "device": p.get("device"), "phase": p.get("name"), "attention_share": share,
            "attention_ms": _num((p.get("categories_ms") or {}).get("attention")),
            "text": fmt_value(share, "share") if share is not None else f"{NA} (no kernels)",
        })
    return out


# -- kernels table ---------------------------------------------------------------------


KERNEL_COLUMNS = ["device", "phase", "name", "category", "count", "total_ms", "mean_us", "share"]


def kernels_table_data(report: Mapping, activities: pd.DataFrame | None = None, limit: int = 5000) -> list[dict]:
    """Rows for the top-kernels grid: one per (device, phase, kernel name).

    With ``activities`` every kernel is listed (grouped by name, phases as assigned by the
    analysis; ``phase`` "all" = the whole device, left out when every kernel of the device is
    in one step phase: each kernel once per phase), sorted by total time, at most ``limit``
    rows. Without it, the report's ``top_kernels`` (10 per phase; "all" left out when it lists
    the same kernels as a step phase of the device) are used.

    Returns:
        Dicts with device, phase, name, category, count, total_ms, mean_us, share (of the
        phase's kernel time, fraction).
    """
    rows: list[dict] = []
    if activities is not None and len(activities):
        k = activities[activities["kind"] == "kernel"] if "kind" in activities else activities
        if len(k):
            dur = (k["end_ns"] - k["start_ns"]).to_numpy(dtype=np.float64)
            base = pd.DataFrame({"device": k["device"].to_numpy(), "phase": k["phase"].to_numpy(dtype=object) if "phase" in k else "unknown",
                                 "name": k["name"].to_numpy(dtype=object), "category": k["category"].to_numpy(dtype=object),
                                 "dur": dur})
            both = pd.concat([base.assign(phase="all"), base[base["phase"] != "unknown"]], ignore_index=True)
            # Each kernel once per phase: a device whose kernels all belong to one step phase
            # lists that phase, not the same kernels again as "all".
            one = base.groupby("device")["phase"].agg(lambda p: p.nunique() == 1 and p.iloc[0] != "unknown")
            both = both[~((both["phase"] == "all") & both["device"].map(one).to_numpy(dtype=bool))]
            agg = both.groupby(["device", "phase", "name"], sort=False).agg(
                category=("category", "first"), count=("dur", "size"), total=("dur", "sum")).reset_index()
            tot = agg.groupby(["device", "phase"])["total"].transform("sum")
            agg["share"] = np.where(tot > 0, agg["total"] / tot, np.nan)
            agg = agg.sort_values("total", ascending=False).head(limit)
            for r in agg.itertuples(index=False):
                rows.append({
                    "device": int(r.device), "phase": str(r.phase), "name": str(r.name)[:300],
                    "category": str(r.category), "count": int(r.count),
                    "total_ms": round(float(r.total) / 1e6, 6),
                    "mean_us": round(float(r.total) / r.count / 1e3, 3),
                    "share": None if pd.isna(r.share) else round(float(r.share), 6),
                })
            return rows
    phases = report.get("phases") or []
    tops = {(p.get("device"), p.get("name")): [(t.get("name"), t.get("count")) for t in p.get("top_kernels") or []] for p in phases}
    for p in phases:
        if p.get("name") == "all" and any(d == p.get("device") and ph != "all" and v == tops[(d, "all")]
                                          for (d, ph), v in tops.items()):
            continue  # the same kernels as a step phase of the device: listed once, under that phase
        for t in p.get("top_kernels") or []:
            cnt = t.get("count") or 0
            tot = _num(t.get("total_ms"))
            rows.append({
                "device": p.get("device"), "phase": p.get("name"), "name": t.get("name"),
                "category": t.get("category"), "count": cnt, "total_ms": tot,
                "mean_us": round(tot * 1e3 / cnt, 3) if tot is not None and cnt else None,
                "share": _num(t.get("share")),
            })
    rows.sort(key=lambda r: -(r["total_ms"] or 0.0))
    return rows[:limit]


# -- roofline --------------------------------------------------------------------------


def _peaks(report: Mapping, device: int | None = None) -> tuple[float | None, float | None, str]:
    gpu = report.get("gpu") or {}
    tf, tb, name = _num(gpu.get("peak_tflops")), _num(gpu.get("peak_tbps")), str(gpu.get("name") or "")
    if tf is None or tb is None:
        for p in phases_for_device(report, device).values():
            tf = tf if tf is not None else _num(p.get("peak_tflops"))
            tb = tb if tb is not None else _num(p.get("peak_tbps"))
    return tf, tb, name


def roofline_figure(report: Mapping, device: int | None = None) -> go.Figure:
    """Roofline of the device (log-log): attainable TFLOP/s vs arithmetic intensity (FLOP/B).

    Roof = min(peak TFLOP/s, AI x peak TB/s) (docs/prefill-decode.md §3); the ridge point peak/bandwidth is
    marked. One point per phase with ``arithmetic_intensity`` and ``achieved_tflops``; one per
    kernel category when the phase carries ``category_flops``/``category_bytes``. Without
    peaks the figure is empty and says why.

    Returns:
        Figure with ``layout.meta`` = {mode: "roofline"|"empty", points, not_plotted, reason}.
    """
    tf, tb, gname = _peaks(report, device)
    if tf is None or tb is None:
        devs = report_devices(report)
        dname = _device_name(report, devs[0] if devs else None)
        why = (f"device '{dname}' is not in the GPU peak table" if dname else
               "the trace does not name its GPU" if devs and devs[0] is not None else "the trace has no GPU activity")
        return _empty_figure(
            "Roofline",
            f"Roofline not available: no peak FLOP/s and bandwidth for this device ({why}).<br>"
            "Re-run with --gpu NAME (e.g. H100-SXM) or --peak-tflops/--bandwidth-tbps.",
        )
    ridge = tf / tb
    phases = phases_for_device(report, device)
    pts = []
    not_plotted = []
    for name, p in phases.items():
        ai, ach = _num(p.get("arithmetic_intensity")), _num(p.get("achieved_tflops"))
        if "arithmetic_intensity" in (p.get("unreliable") or []):
            not_plotted.append(f"{name}: cannot be read from this trace (see Data quality)")
            continue
        if ai is None or ach is None or ai <= 0 or ach <= 0:
            if name != "all" and p.get("kernel_count"):
                not_plotted.append(f"{name}: {_missing_reason(p, 'arithmetic_intensity', 'arithmetic intensity')}")
            continue
        pts.append(dict(kind="phase", label=name, ai=ai, tflops=ach, mfu=_num(p.get("mfu")), mbu=_num(p.get("mbu")),
                        bound=p.get("bound"), bound_ratio=_num(p.get("bound_ratio"))))
        cf, cb, cms = p.get("category_flops") or {}, p.get("category_bytes") or {}, p.get("categories_ms") or {}
        for c, fl in cf.items():
            fl, by, ms = _num(fl), _num(cb.get(c)), _num(cms.get(c))
            if fl and by and ms:
                pts.append(dict(kind="category", label=f"{name}: {c}", cat=c, ai=fl / by, tflops=fl / (ms / 1e3) / 1e12))
    ais = [q["ai"] for q in pts] + [ridge]
    x_lo = 10 ** math.floor(math.log10(max(min(ais) / 10, 1e-3)))
    x_hi = 10 ** math.ceil(math.log10(max(ais) * 10))
    x = np.array([x_lo, ridge, x_hi])
    y = np.minimum(tf, x * tb)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x[:2], y=y[:2], mode="lines", name=f"memory roof ({tb:g} TB/s)",
                             line=dict(color="#1565c0", width=3), hovertemplate="%{x:.3g} FLOP/B → %{y:.3g} TFLOP/s<extra>memory roof</extra>"))
    fig.add_trace(go.Scatter(x=x[1:], y=y[1:], mode="lines", name=f"compute roof ({tf:g} TFLOP/s)",
                             line=dict(color="#c62828", width=3), hovertemplate="%{y:.3g} TFLOP/s<extra>compute roof</extra>"))
    fig.add_trace(go.Scatter(x=[ridge], y=[tf], mode="markers+text", name=f"ridge {ridge:.0f} FLOP/B",
                             marker=dict(symbol="diamond", size=11, color="#222"), text=[f"ridge {ridge:.0f} FLOP/B"],
                             textposition="top left", hovertemplate="ridge point %{x:.1f} FLOP/B<extra></extra>"))
    for kind, sym in (("phase", "circle"), ("category", "square")):
        sel = [q for q in pts if q["kind"] == kind]
        if not sel:
            continue
        colors = [PHASE_COLORS.get(q["label"], "#444") if kind == "phase" else category_color(q["cat"]) for q in sel]
        hover = []
        for q in sel:
            h = f"{q['label']}<br>AI {q['ai']:.3g} FLOP/B<br>{q['tflops']:.3g} TFLOP/s"
            if kind == "phase":
                h += (f"<br>MFU {fmt_value(q['mfu'], 'share')} · MBU {fmt_value(q['mbu'], 'share')}"
                      f"<br>bound: {q['bound'] or NA} · {fmt_value(q['bound_ratio'], 'x')} of lower bound")
            hover.append(h)
        fig.add_trace(go.Scatter(
            x=[q["ai"] for q in sel], y=[q["tflops"] for q in sel], mode="markers+text",
            name="phases" if kind == "phase" else "kernel categories",
            text=[q["label"] for q in sel], textposition="bottom right", hovertext=hover, hoverinfo="text",
            marker=dict(symbol=sym, size=14 if kind == "phase" else 9, color=colors, line=dict(width=1, color="#000")),
        ))
    notes = []
    if not pts:
        notes.append("No phase has measured FLOPs and bytes yet: only the device roof is drawn.")
    notes += [f"not plotted — {s}" for s in not_plotted]
    annotations = [dict(text="<br>".join(notes), x=0.01, y=0.99, xref="paper", yref="paper", showarrow=False,
                        align="left", xanchor="left", yanchor="top", font=dict(size=11),
                        bgcolor="rgba(255,255,255,0.85)")] if notes else []
    title = f"Roofline — {gname or _device_name(report, device) or 'device'}: {tf:g} TFLOP/s, {tb:g} TB/s"
    fig.update_layout(
        title=title, height=480, plot_bgcolor="white",
        xaxis=dict(type="log", title="arithmetic intensity (FLOP/B)", range=[math.log10(x_lo), math.log10(x_hi)], gridcolor="#eee"),
        yaxis=dict(type="log", title="attained TFLOP/s", gridcolor="#eee",
                   range=[math.log10(max(min([q["tflops"] for q in pts] + [x_lo * tb]) / 3, 1e-6)), math.log10(tf * 2)]),
        shapes=[dict(type="line", x0=ridge, x1=ridge, y0=0, y1=1, xref="x", yref="paper",
                     line=dict(dash="dot", color="#888"))],
        annotations=annotations, legend=dict(orientation="h", y=-0.2),
        meta={"mode": "roofline", "points": len(pts), "ridge_flop_per_byte": ridge, "not_plotted": not_plotted,
              "reason": None},
    )
    return fig


# -- phases table (docs/prefill-decode.md §1) ---------------------------------------------------------


# (key, metric, unit, phases it applies to (None = all), expected {phase: text})
_LATENCY_KEYS = {
    "ttft_ms": ("ttft_ms", None),
    "tpot_p50_ms": ("tpot_ms", "p50"),
    "tpot_p90_ms": ("tpot_ms", "p90"),
    "tpot_p99_ms": ("tpot_ms", "p99"),
}


def expected_text(row: Mapping, phases: list[str]) -> str:
    """The docs/prefill-decode.md §1/§3/§5 expectation for a phases-table row, as one cell of text."""
    exp = {c: row["expected"].get(c, "") for c in phases if row["expected"].get(c)}
    if not exp:
        return ""
    if len(set(exp.values())) == 1 and len(exp) > 1:
        return next(iter(exp.values()))
    return " · ".join(f"{c}: {v}" for c, v in exp.items())


def phases_table_data(report: Mapping, device: int | None = None) -> dict:
    """Prefill vs decode side by side, in the shape of docs/prefill-decode.md §1.

    Args:
        report: the report dict.
        device: device id (default: the first device with phases).

    Returns:
        {"device", "phases": ["prefill", "decode", (+"mixed"/"unknown" when present)],
        "rows": [{"key", "metric", "unit", "values": {phase: number|str|None},
        "display": {phase: text}, "reasons": {phase: why missing}, "expected": {phase: text}}]}.
        Values are the report's numbers unchanged; "n/a" cells (a metric that does not
        apply to a phase, e.g. TTFT for decode) have value None and display "—".
    """
    phases = phases_for_device(report, device)
    cols = ["prefill", "decode"] + [n for n in ("mixed", "unknown") if n in phases]
    lat = report.get("latency") or {}
    rows = []
    for key, metric, unit, applies, expected in _PHASE_ROWS:
        values, display, reasons = {}, {}, {}
        for ph in cols:
            p = phases.get(ph)
            v: Any = None
            reason = ""
            if applies is not None and ph not in applies:
                values[ph], display[ph], reasons[ph] = None, "—", "not applicable"
                continue
            if key in _LATENCY_KEYS:
                k1, k2 = _LATENCY_KEYS[key]
                v = lat.get(k1) if k2 is None else (lat.get(k1) or {}).get(k2)
                if v is None:
                    reason = ("no prefill step in the trace" if ph == "prefill" else
                              "needs decode steps (TPOT = interval between consecutive decode steps)")
            elif key in ("step_p50_ms", "step_p99_ms"):
                v = (lat.get(f"{ph}_step_ms") or {}).get("p50" if key == "step_p50_ms" else "p99")
                if v is None:
                    reason = f"no {ph} step in the trace"
            else:
                if p is None:
                    reason = f"no {ph} phase in the trace"
                else:
                    v = p.get(key)
                    if v is not None and key in (p.get("unreliable") or []):
                        v, reason = None, "cannot be read from this trace (see Data quality: e.g. a fragment of a forward)"
                    elif v is None:
                        if key in ("launch_gap_share", "gpu_idle_share", "attention_share"):
                            reason = "no GPU activity in this phase"
                        else:
                            reason = _missing_reason(p, key, metric)
            values[ph] = v
            display[ph] = fmt_value(v, unit) if v is not None else NA
            reasons[ph] = reason
        rows.append({"key": key, "metric": metric, "unit": unit, "values": values, "display": display,
                     "reasons": reasons, "expected": {ph: expected.get(ph, "") for ph in cols}})
    return {"device": device if device is not None else (report_devices(report) or [None])[0],
            "phases": cols, "rows": rows, "tpot_definition": lat.get("tpot_definition")}


# -- overview: banner, symptom cards -----------------------------------------------------


def banner_data(report: Mapping) -> dict:
    """The banner: worst severity and the report's headline (the one verdict it leads with).

    Returns:
        {"severity": critical|high|medium|low|info|none|unknown, "color", "title", "text",
        "caveat", "count"}: "none" when the rules ran and nothing fired, "unknown" when the
        report has no ``symptoms`` key (rules not run).
    """
    syms = report.get("symptoms")
    not_eval = report.get("not_evaluated") or []
    h = report.get("headline") or {}
    if syms is None:
        err = report.get("verdicts_error")
        return {"severity": "unknown", "color": SEVERITY_COLORS["unknown"], "count": 0, "caveat": None,
                "title": "No symptom verdict: symptom rules were not run for this report",
                "text": "The numbers below are measured; the rule engine (S1-S7, docs/prefill-decode.md §7) did not produce "
                        "'symptoms' for this report" + (f": {err}." if err else ".")}
    if not syms:
        ne = f"; {len(not_eval)} rule(s) not evaluated (missing inputs, see below)" if not_eval else ""
        return {"severity": "none", "color": SEVERITY_COLORS["none"], "count": 0, "caveat": None,
                "title": "No symptom fired", "text": (h.get("text") + ". " if h.get("text") else "") + f"No symptom rule fired on this trace{ne}."}
    ss = sorted_symptoms(report)
    worst = (ss[0].get("severity") or "info").lower()
    text = h.get("text") or " — ".join(x for x in (f"{ss[0].get('symptom') or ''} {ss[0].get('title') or ''}".strip(),
                                                   ss[0].get("summary") or ss[0].get("id") or "") if x)
    return {"severity": worst, "color": SEVERITY_COLORS.get(worst, SEVERITY_COLORS["unknown"]), "count": len(ss),
            "title": f"{worst.upper()}: {len(ss)} symptom{'s' if len(ss) != 1 else ''} fired", "text": text,
            "caveat": h.get("caveat")}


def waits_data(report: Mapping, device: int | None = None) -> dict:
    """Where the GPU waited on ``device``: idle ms by cause and the longest gaps, one row per
    gap (:mod:`diagnose.app.causeview`).

    Returns:
        {"idle_ms", "by_cause_text", "causes": causeview.cause_rows, "rows": causeview.gap_rows}.
    """
    from diagnose.app.causeview import cause_rows, gap_rows

    a = phases_for_device(report, device).get("all") or {}
    by = a.get("idle_by_cause_ms") or {}
    causes = cause_rows(by)
    text = "; ".join(f"{c['cause']} {c['ms_text']} ({c['label']})" for c in causes)
    return {"idle_ms": sum(by.values()) if by else None, "by_cause_text": text, "causes": causes,
            "rows": gap_rows((a.get("gaps") or {}).get("longest") or [])}


def kernel_table_rows(report: Mapping, limit: int = 20) -> list[dict]:
    """Display rows of the report's ``kernel_table`` (which kernel to tune)."""
    out = []
    for r in (report.get("kernel_table") or [])[:limit]:
        shares = [x for x in (r.get("peak_tflops_share"), r.get("peak_tbps_share")) if x is not None]
        out.append({"device": r.get("device"), "phase": r.get("phase") or "", "op": r.get("op") or "—",
                    "input_dims": str(r.get("input_dims") or "")[:60],
                    "kernel": str(r.get("kernel") or "")[:80], "calls": r.get("calls"),
                    "total": fmt_value(r.get("total_ms"), "ms"), "share": fmt_value(r.get("kernel_time_share"), "share"),
                    "tflops": fmt_value(r.get("achieved_tflops")), "tbps": fmt_value(r.get("achieved_tbps")),
                    "peak": fmt_value(max(shares), "share") if shares else NA,
                    "bound": r.get("bound") or ("shapes unknown" if r.get("shapes_unknown") else NA)})
    return out


def not_evaluated_data(report: Mapping) -> list[dict]:
    """Rules that could not be evaluated: {id, title, missing: [str], reason} (empty when absent)."""
    out = []
    for r in report.get("not_evaluated") or []:
        if not isinstance(r, Mapping):
            out.append({"id": str(r), "title": "", "missing": [], "reason": ""})
            continue
        miss = r.get("missing") or []
        miss = [str(m) for m in (miss if isinstance(miss, list) else [miss])]
        reason = str(r.get("reason") or ("missing " + ", ".join(miss) if miss else ""))
        out.append({"id": str(r.get("id")), "title": str(r.get("title") or ""), "missing": miss, "reason": reason})
    return out


def key_numbers(report: Mapping) -> list[dict]:
    """TTFT, TPOT p50/p99, GPU idle on the main phase's own time and on the window, launch gaps."""
    lat, rows = report.get("latency") or {}, phases_for_device(report)
    allp, tp = rows.get("all") or {}, lat.get("tpot_ms") or {}
    main = max((p for n, p in rows.items() if n in STEP_PHASES), key=lambda p: p.get("own_ms") or 0.0, default=None)
    return [
        {"id": "ttft", "label": "TTFT (first prefill step)", "value": lat.get("ttft_ms"), "unit": "ms"},
        {"id": "tpot-p50", "label": "TPOT p50", "value": tp.get("p50"), "unit": "ms"},
        {"id": "tpot-p99", "label": "TPOT p99", "value": tp.get("p99"), "unit": "ms"},
        {"id": "idle", "label": f"GPU idle, {main['name']} steps' own time" if main else "GPU idle (no steps)",
         "value": main.get("gpu_idle_own_share") if main else None, "unit": "share"},
        {"id": "idle-window", "label": "GPU idle, whole window", "value": allp.get("gpu_idle_share"), "unit": "share"},
        {"id": "launch-gap", "label": "launch-gap share", "value": allp.get("launch_gap_share"), "unit": "share"},
    ]


# -- KV budget (docs/prefill-decode.md §2-3) ----------------------------------------------------------

from diagnose.collectors.presets import get_preset  # noqa: E402  (pure data, no torch)

#: docs/prefill-decode.md §2 "Reference config 7B-like" (Hugging Face config names): the collector's preset.
REFERENCE_7B = {**{k: v for k, v in get_preset("ref7b").items() if k in (
    "num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "vocab_size", "tie_word_embeddings")}, "_name_or_path": "reference 7B-like (docs/prefill-decode.md §2)"}
DEFAULT_CONTEXTS = (2048, 8192, 32768, 131072)


def kv_budget_data(
    config: Mapping | None = None,
    *,
    model_config: str | None = None,
    memory_gb: float | None = 80.0,
    overhead_gb: float = 5.0,
    contexts: Iterable[int] = DEFAULT_CONTEXTS,
    kv_dtype: str = "fp16",
    weight_dtype: str | None = None,
    kv_memory_gib: float | None = None,
    tp: int = 1,
) -> dict:
    """KV-cache calculator: per-token and per-sequence KV bytes and the concurrency table, one
    row per context from :func:`diagnose.accounting.kv_plan` (what ``diagnose kv-budget``
    answers for the same inputs).

    Args:
        config: Hugging Face ``config.json`` fields (None = :data:`REFERENCE_7B`).
        model_config: a shipped config name or a ``config.json`` path instead of ``config``
            (as ``--model-config``).
        memory_gb: device memory, GB (1e9 B).
        overhead_gb: runtime overhead, GB.
        contexts: tokens per sequence, one table row each.
        kv_dtype: fp32 fp16 bf16 fp8 int8 int4; weight_dtype: the same, or None for the
            config's ``quantization_config`` (16-bit without one).
        kv_memory_gib: memory for the KV cache in GiB, overriding memory - overhead - weights
            (docs/prefill-decode.md §3 uses "~60 GiB").
        tp: tensor-parallel ranks (per-rank KV heads and weights).

    Returns:
        {"ok": True, model, kv_bytes_per_token, weight_bytes, weight_dtype, kv_memory_bytes,
        fragmentation_factor, notes, rows: [{context, kv_bytes_per_sequence,
        kv_gib_per_sequence, max_sequences, usable_sequences}]} or {"ok": False, "error":
        one-line message}.
    """
    from diagnose.accounting import DTYPE_BYTES, FRAGMENTATION_FACTOR, ModelSpec, kv_plan, load_model_config
    from diagnose.errors import DiagnoseError

    try:
        if model_config:
            spec = load_model_config(model_config)
        else:
            spec = ModelSpec.from_hf_config(dict(config if config is not None else REFERENCE_7B))
        if kv_dtype not in DTYPE_BYTES:
            raise DiagnoseError(f"unknown KV dtype {kv_dtype!r}; expected one of {', '.join(DTYPE_BYTES)}")
        ctxs = [int(c) for c in contexts]
        if not ctxs:
            raise DiagnoseError("give at least one context length")
        plans = [kv_plan(spec, c, bytes_per_elem=DTYPE_BYTES[kv_dtype], weight_dtype=weight_dtype, tp=tp,
                         memory_gb=memory_gb, overhead_gb=overhead_gb or 0.0, kv_memory_gib=kv_memory_gib) for c in ctxs]
    except DiagnoseError as e:
        return {"ok": False, "error": str(e)}
    except (TypeError, ValueError) as e:
        return {"ok": False, "error": f"invalid input: {e}"}
    rows = [{"context": p.budget.seq_len, "kv_bytes_per_sequence": p.budget.kv_bytes_per_sequence,
             "kv_gib_per_sequence": p.budget.kv_gib_per_sequence, "max_sequences": p.budget.max_sequences,
             "usable_sequences": p.budget.usable_sequences} for p in plans]
    first = plans[0]
    return {
        "ok": True, "model": spec.name, "kv_dtype": kv_dtype, "weight_dtype": first.weight_dtype,
        "kv_bytes_per_token": first.budget.kv_bytes_per_token, "weight_bytes": first.budget.weight_bytes,
        "kv_memory_bytes": first.budget.kv_memory_bytes, "memory_gb": memory_gb, "overhead_gb": overhead_gb,
        "fragmentation_factor": FRAGMENTATION_FACTOR, "notes": sorted({n for p in plans for n in p.notes}), "rows": rows,
    }


# -- compare -------------------------------------------------------------------------------

def compare_view(cmp: Any) -> dict:
    """Display data for a :class:`diagnose.compare.Comparison` (the same one ``diagnose compare``
    prints): the verdict, its CSS class, an explanation, and one row per compared metric and
    per kernel-category delta.

    Returns:
        {"verdict": "unreliable" | "regression" | "fail" | "not comparable" | "no regression", "css": "regression" | "ok" |
        "inconclusive", "explanation", "rows": [{metric, finding, a_text, b_text, change_text,
        worse}], "category_rows": [{phase, category, a_text, b_text, change_text}]}.
    """
    verdict = cmp.verdict
    css = {"regression": "regression", "fail": "regression", "not comparable": "inconclusive",
           "unreliable": "inconclusive"}.get(verdict, "ok")
    fired = [s for s in cmp.verdicts.symptoms]
    if verdict == "unreliable":
        expl = "Numbers unreliable: " + "; ".join(cmp.unreliable) + " (diagnose compare --allow-partial compares anyway)."
    elif fired:
        expl = " ".join(s["summary"] for s in fired)
    elif not cmp.comparable:
        expl = "Not comparable: " + (cmp.why_not_comparable or "no TTFT/TPOT number in both traces") + "."
    else:
        expl = "No TTFT/TPOT percentile regressed beyond the latency-regression rule's threshold."
    rows = []
    several = len(getattr(cmp, "pairs", ())) > 1  # device pairs: each device-level row names its pair
    for r in cmp.rows:
        a, b = r["baseline"], r["candidate"]
        if a is None and b is None:
            continue
        unit = "ms" if r["kind"] == "ms" else "share"
        ch = r.get("ratio", r.get("change"))
        if ch is None:
            text = NA
        elif r["kind"] == "ms":
            text = f"x{ch:.3f} ({(100 * (ch - 1) if abs(ch - 1) >= 0.0005 else 0.0):+.1f} %)"
        else:
            text = fmt.pp(ch)
        neutral = 1.0 if r["kind"] == "ms" else 0.0
        higher_better = r["finding"].endswith((".mfu", ".mbu"))
        # No change as shown (x1.000, +0.0 pp) is neither worse nor better: no colour.
        same = ch is not None and abs(ch - neutral) < 0.0005
        worse = None if ch is None or same else (ch < neutral if higher_better else ch > neutral)
        devs = f" [devices {r['devices'][0]}:{r['devices'][1]}]" if several and r.get("devices") else ""
        rows.append({"metric": r["name"] + devs, "finding": r["finding"], "a_text": fmt_value(a, unit), "b_text": fmt_value(b, unit),
                     "change_text": text, "worse": worse})
    cat_rows = [{"phase": d["phase"], "category": d["category"], "a_text": fmt_value(d["baseline_ms"], "ms"),
                 "b_text": fmt_value(d["candidate_ms"], "ms"),
                 "change_text": NA if d["ratio"] is None else f"x{d['ratio']:.2f}"} for d in cmp.category_deltas]
    return {"verdict": verdict, "css": css, "explanation": expl, "rows": rows, "category_rows": cat_rows}
