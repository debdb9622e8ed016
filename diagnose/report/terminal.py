"""Terminal report (rich): the headline first, then the ranked findings, per-phase numbers,
latency, where the GPU waited, where the time above the roofline goes, the top kernels,
rules not evaluated and data quality.

**It fits on a screen.** The report is as wide as the terminal when output is a terminal, 100
columns otherwise, ``COLUMNS`` when set; the default report holds at most :data:`LINE_BUDGET`
lines: each section has leaner variants (fewer table rows, one line instead of a table), and
the leanest that fits is printed, most important sections last to shrink
(:func:`fit_blocks`). ``--full`` prints every table whole. Kernel names are shortened
(:func:`short_kernel`; the JSON and HTML reports keep them whole).

Every text that comes from the trace (kernel, marker and call names, paths) goes through
:func:`diagnose.textsafe.safe`: control characters are shown escaped, never sent to the
terminal (a name with an escape sequence must not clear the screen or set the title).
"""
from __future__ import annotations

import io
import os
from dataclasses import dataclass
from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from diagnose.analyzers import Analysis
from diagnose.hardware import describe_devices, describe_peak
from diagnose.pipeline import device_headline_lines
from diagnose.report import fmt
from diagnose.report.termtext import compact_table, group_not_evaluated, phase_table, short_kernel, short_op, waits_lines
from diagnose.textsafe import safe
from diagnose.vocab import SEVERITY_STYLES

#: Lines of the default report at most (``--full`` prints everything).
LINE_BUDGET = 50
#: Width when the output is not a terminal and ``COLUMNS`` is not set.
DEFAULT_WIDTH = 100


def report_width(is_terminal: bool, terminal_width: int, environ: dict | None = None) -> int:
    """Columns of the report: ``COLUMNS`` when set to a number (20..1000), else the terminal's
    width when output is a terminal, else :data:`DEFAULT_WIDTH`."""
    env = os.environ if environ is None else environ
    raw = str(env.get("COLUMNS", "")).strip()
    if raw.isdigit() and 20 <= int(raw) <= 1000:
        return int(raw)
    return terminal_width if is_terminal else DEFAULT_WIDTH


def _console(console: Console | None) -> Console:
    if console is not None:
        return console
    c = Console()
    w = report_width(c.is_terminal, c.width)
    return c if c.is_terminal and w == c.width else Console(width=w)


def headline_text(h: dict[str, Any] | None) -> str:
    """The headline as one line (with its caveat)."""
    if not h:
        return "No symptom rule fired."
    text = h["text"]
    if h.get("caveat"):
        text += f" [caveat: {h['caveat']}]"
    return safe(text)


_EVIDENCE_WORDS = {"marker": "step markers", "profiler_step": "ProfilerStep ranges", "python_frame": "engine python frames",
                   "structure": "the GPU work's structure (guessed)", "shapes": "the whole trace"}


def steps_line(d: dict[str, Any]) -> str | None:
    """One line on the steps: how many, of which phase, found from what; without any step,
    the ``no_steps`` message (what to capture)."""
    steps = d.get("steps") or []
    if not steps:
        return next((f"Steps: {q['message']}" for q in d.get("quality") or [] if q["code"] == "no_steps"), None)
    phases: dict[str, int] = {}
    for st in steps:
        phases[st["phase"]] = phases.get(st["phase"], 0) + 1
    ev = sorted({st.get("evidence", "marker") for st in steps})
    return (f"Steps: {len(steps)} (" + ", ".join(f"{n} {p}" for p, n in phases.items()) + ") from "
            + " and ".join(_EVIDENCE_WORDS.get(e, e) for e in ev))


@dataclass
class Block:
    """A section of the report: its variants from the richest (index 0) to the leanest (the
    last may be empty: the section left out)."""

    name: str
    levels: list[list[Any]]


#: The order in which sections give up lines to fit the budget (first: first to shrink).
TRIM_ORDER = ("categories", "quality", "not_evaluated", "sources", "latency", "waits", "kernels", "classes", "path",
              "layers", "symptoms", "phases")


def render(analysis: Analysis, console: Console | None = None, full: bool = False, layers: bool = False) -> None:
    """Print the analysis to ``console`` (stdout by default); ``full``: every table whole;
    ``layers``: then the whole layer x op-class table."""
    render_report(analysis.to_dict(), console, metadata=analysis.metadata, full=full, layers=layers)


def render_report(d: dict[str, Any], console: Console | None = None, metadata: dict | None = None,
                  full: bool = False, layers: bool = False) -> None:
    """Print a JSON report (``Analysis.to_dict()`` with verdicts): at most :data:`LINE_BUDGET`
    lines unless ``full``; ``layers`` (``diagnose run --layers``): the whole layer x op-class
    table after it, outside the budget (the user asked for it)."""
    from diagnose.report import layers_text

    c = _console(console)
    blocks = report_blocks(d, metadata, full, c.width, layers_hint=not layers)
    if full:
        for b in blocks:
            for r in b.levels[0]:
                c.print(r)
    else:
        chosen, trimmed, text = fit_blocks(blocks, c, LINE_BUDGET - 1)
        if text is None or c.record or c.is_jupyter:  # a recording keeps segments: print them
            for r in chosen:
                c.print(r)
        else:  # each block was rendered once, by this console, to fit it: write that text
            c.file.write(text)
            c.file.flush()
        if trimmed:
            c.print(Text("(diagnose run --full prints every table whole)", style="dim"))
    if layers:
        layers_text.render_table(c, d)


def _rendered(c: Console, renderables: list[Any]) -> str:
    """What ``c.print`` would write for ``renderables`` (styles as ``c`` renders them)."""
    with c.capture() as cap:
        for r in renderables:
            c.print(r)
    return cap.get()


def fit_blocks(blocks: list[Block], c: Console, budget: int) -> tuple[list[Any], bool, str | None]:
    """The renderables of ``blocks`` at the richest variants that fit ``budget`` lines at
    ``c``'s width: sections shrink one variant at a time in :data:`TRIM_ORDER`; if the leanest
    variants still do not fit, the report is cut at the budget. Returns (renderables, whether
    anything was left out, the text ``c`` renders them to: None when cut); a variant is
    rendered once, when the fit reaches it."""
    level = {b.name: 0 for b in blocks}
    counted: dict[tuple[str, int], tuple[int, str]] = {}

    def cost(b: Block) -> int:
        key = (b.name, level[b.name])
        if key not in counted:
            text = _rendered(c, b.levels[level[b.name]])
            counted[key] = (text.count("\n"), text)
        return counted[key][0]

    def total() -> int:
        return sum(cost(b) for b in blocks)

    trimmed = False
    for name in TRIM_ORDER:
        b = next((x for x in blocks if x.name == name), None)
        while b is not None and total() > budget and level[name] < len(b.levels) - 1:
            level[name] += 1
            trimmed = True
        if total() <= budget:
            break
    out = [r for b in blocks for r in b.levels[level[b.name]]]
    if total() > budget:  # still too long: cut
        text = _plain_lines(out, c.width)[: budget - 1]
        return [Text("\n".join(text)), Text("… (cut to fit the screen)", style="dim")], True, None
    return out, trimmed, "".join(counted[(b.name, level[b.name])][1] for b in blocks)


def _plain_lines(renderables: list[Any], width: int) -> list[str]:
    buf = io.StringIO()
    probe = Console(file=buf, width=width, color_system=None, legacy_windows=False)
    for r in renderables:
        probe.print(r)
    return buf.getvalue().splitlines()


def report_blocks(d: dict[str, Any], metadata: dict | None, full: bool, width: int = DEFAULT_WIDTH,
                  layers_hint: bool = True) -> list[Block]:
    """The report's sections, each with its variants (see :class:`Block`), for ``width`` columns
    (``layers_hint``: the layer lines point at ``--layers``)."""
    blocks = [Block("header", [_header(d, metadata)]), Block("headline", [_headline(d)]),
              Block("symptoms", _symptoms(d, full, width)), Block("hints", [_hints(d)]),
              Block("path", _path(d)), Block("layers", _layers(d, layers_hint)), Block("phases", _phases(d, full, width)),
              Block("sources", [_sources(d), []]),
              Block("latency", _latency(d, full)), Block("waits", _waits(d, full, width)),
              Block("categories", _categories(d, full)), Block("classes", _classes(d)), Block("kernels", _kernels(d, full, width)),
              Block("not_evaluated", _not_evaluated(d, full)), Block("quality", _quality(d, full))]
    return [b for b in blocks if any(b.levels)]


def _header(d: dict[str, Any], metadata: dict | None) -> list[Any]:
    out: list[Any] = [Text(safe(f"diagnose — {d['source']['path']}  ({d['source']['format']})"), style="bold")]
    if d.get("partial"):
        out.append(Text("PARTIAL TRACE: every number below comes from an incomplete file", style="bold red"))
    listed = [p.get("name") for p in ((metadata or {}).get("deviceProperties") or []) if isinstance(p, dict)]
    no_gpu = "none with activity in the analysed events" + (f" (the trace lists {len(listed)} GPU(s))" if listed else " (CPU only)")
    gpu = d.get("gpu")
    line = f"GPU devices: {describe_devices(d['devices'], gpu) or no_gpu}"
    if gpu and d["devices"]:
        line += f"; peaks {describe_peak(gpu)}"
    out.append(Text(safe(line)))
    s = steps_line(d)
    if s:
        out.append(Text(safe(s)))
    return out


def _headline(d: dict[str, Any]) -> list[Any]:
    if "symptoms" not in d:
        return []
    symptoms = d.get("symptoms") or []
    h = d.get("headline")
    if not symptoms and not h:
        ne = len(d.get("not_evaluated") or [])
        tail = f" ({ne} rule(s) not evaluated for lack of inputs: see below)" if ne else ""
        return [Text("No symptom rule fired." + tail, style="green")]
    sev = symptoms[0]["severity"] if symptoms and h and h.get("rule_id") else "info"
    out: list[Any] = [Text("► " + headline_text(h), style="bold " + SEVERITY_STYLES.get(sev, ""))]
    # each device's own headline, when the trace has several
    return out + [Text(safe("  " + line), style="dim") for line in device_headline_lines(d)]


def _symptom_lines(s: dict[str, Any], with_fix: bool, fix_chars: int | None = None, several: bool = False) -> list[Any]:
    """A symptom's summary line (naming its device when the trace has ``several``) and
    (``with_fix``) its levers, cut to ``fix_chars``."""
    from diagnose.vocab import LEVERS

    indent = "      " if s.get("grouped_under") else "  "
    where = f" (device {s['device']})" if several and s.get("device") is not None else ""
    line = f"{indent}[{s['severity']}] {s['id']}{where}: {s['summary']}"
    if s.get("predicted_saving_ms") is not None:
        line += f" (predicted saving {s['predicted_saving_ms']:.3f} ms)"
    out: list[Any] = [Text(safe(line), style=SEVERITY_STYLES.get(s["severity"], ""))]
    if with_fix and not s.get("grouped_under"):
        recs = s.get("recommends") or []
        if recs:
            fix = safe(f"{indent}  fix: " + "; ".join(LEVERS[r].text for r in recs if r in LEVERS))
            if fix_chars is not None and len(fix) > fix_chars:
                fix = fix[: fix_chars - 1] + "…"
            out.append(Text(fix, style="dim"))
        for note in s.get("already_in_place") or []:
            out.append(Text(safe(f"{indent}  ({note})"), style="dim"))
    return out


def _symptoms(d: dict[str, Any], full: bool, width: int = DEFAULT_WIDTH) -> list[list[Any]]:
    """Variants: every symptom with its fix; then fewer leads (followers named in one line),
    fixes only for the first, then the top two summaries."""
    symptoms = d.get("symptoms") or []
    if not symptoms:
        return [[]]
    several = len(d.get("device_verdicts") or []) > 1
    if full:
        return [[x for s in symptoms for x in _symptom_lines(s, True, several=several)]]
    leads = [s for s in symptoms if not s.get("grouped_under")]
    followers = [s for s in symptoms if s.get("grouped_under")]

    def variant(n_leads: int, n_fix: int, follow_lines: bool) -> list[Any]:
        out: list[Any] = []
        for i, s in enumerate(leads[:n_leads]):
            out += _symptom_lines(s, i < n_fix, width, several)
            mine = [f for f in followers if f["grouped_under"] == s["id"] and f.get("device") == s.get("device")]
            if mine and follow_lines:
                out += [x for f in mine for x in _symptom_lines(f, False, several=several)]
            elif mine:
                out.append(Text(safe("      also: " + ", ".join(f"[{f['severity']}] {f['id']}" for f in mine)
                                     + " (same cause)"), style="dim"))
        rest = leads[n_leads:]
        if rest:
            out.append(Text(safe("  also fired: " + ", ".join(f"[{s['severity']}] {s['id']}" for s in rest)), style="dim"))
        return out

    return [variant(6, 6, True), variant(4, 2, False), variant(3, 1, False), variant(2, 1, False), variant(1, 1, False)]


def _hints(d: dict[str, Any]) -> list[Any]:
    """What to give next, in one line each: a capture pass lying beside the trace; the GPU's
    peaks when the device is not in the table (the data-quality section may shrink to codes)."""
    out = []
    for q in d.get("quality") or []:
        if q["code"] == "unknown_device_peak":
            out.append(Text(safe("► MFU/MBU skipped, the device's peaks are unknown: give --gpu NAME "
                                 "(diagnose gpus lists them) or --peak-tflops/--bandwidth-tbps"), style="bold"))
        if q["code"] == "capture_trace_available":
            path = q["message"].split("give --capture-trace ", 1)[-1].split(" to map", 1)[0]
            out.append(Text(safe(f"► shapes of the graph-replayed kernels: give --capture-trace {path}"), style="bold"))
    return out


def _path(d: dict[str, Any]) -> list[list[Any]]:
    """What sets the step time: one line per phase (README "Critical path"); leaner: the first."""
    from diagnose.report.pathline import path_lines

    lines = [Text(safe("critical path: " + line), style="bold") for line in path_lines(d)]
    return [lines, lines[:1]] if len(lines) > 1 else [lines]


def _layers(d: dict[str, Any], hint: bool) -> list[list[Any]]:
    """The coverage line of each device (always) and one line per layer segmentation (README
    "Layers"); leaner: the coverage lines only."""
    from diagnose.report.layers_text import summary_lines

    n_cov = len(d.get("coverage") or [])
    lines = [Text(safe(line + (" (table: --layers)" if i >= n_cov and hint else "")), style="bold" if i < n_cov else "")
             for i, line in enumerate(summary_lines(d))]
    return [lines, lines[:n_cov]] if len(lines) > n_cov else [lines]


def _phases(d: dict[str, Any], full: bool, width: int = DEFAULT_WIDTH) -> list[list[Any]]:
    note = ("idle own = idle share of the steps' own time (GPU span less waits not caused by them: the time base of "
            "TTFT, TPOT, MFU, MBU); idle window = of the whole window, marker start to GPU end")
    if any(p.get("unreliable") for p in d["phases"]):
        note += "; n/a = cannot be read from this trace (see Data quality)"
    t_full = phase_table(d["phases"], wide=True)
    t = phase_table(d["phases"], wide=False, width=width)
    return [[t_full, Text(note, style="dim")]] if full else [[t, Text(note, style="dim")], [t]]


def _sources(d: dict[str, Any]) -> list[Any]:
    sources = sorted({(p.get("flops_source"), p.get("bytes_source")) for p in d["phases"] if p.get("bytes_source") or p.get("flops_source")},
                     key=str)
    return [Text(safe(f"MFU FLOPs from {fs or 'nothing'}; MBU bytes from {bs or 'nothing'}"
                      + (" (every operator's inputs and outputs: not comparable with an MBU over weights + KV cache)"
                         if bs and "operand" in bs else "")), style="dim") for fs, bs in sources]


def _latency(d: dict[str, Any], full: bool) -> list[list[Any]]:
    lat = d["latency"]
    tp, itl = lat["tpot_ms"], lat.get("itl_ms") or {}
    parts = [f"TTFT proxy {fmt.ms(lat['ttft_ms'])} ms" if lat["ttft_samples"] else "TTFT —",
             f"TPOT p50 {fmt.ms(tp['p50'])} / p99 {fmt.ms(tp['p99'])} ms ({lat['tpot_samples']} sample{'s' if lat['tpot_samples'] != 1 else ''})" if lat["tpot_samples"]
             else "TPOT —"]
    if lat.get("itl_samples"):
        parts.append(f"ITL p50 {fmt.ms(itl.get('p50'))} ms")
    for key, label in (("prefill_step_ms", "prefill step"), ("decode_step_ms", "decode step"), ("mixed_step_ms", "mixed step")):
        v = lat.get(key) or {}
        if v.get("p50") is not None:
            parts.append(f"{label} p50 {fmt.ms(v['p50'])} ms")
    line = Text(safe("Latency: " + " · ".join(parts)))
    definition = Text(safe(f"TPOT = {lat['tpot_definition']}"), style="dim")
    if not full:
        return [[line, definition], [line]]
    lt = Table(title="Latency (definitions: README §Definitions)", header_style="bold")
    for col in ("metric", "samples", "p50 ms", "p90 ms", "p99 ms"):
        lt.add_column(col, justify="left" if col == "metric" else "right")
    n_pre = lat["ttft_samples"]
    lt.add_row(f"TTFT proxy (first of {n_pre} prefill steps)" if n_pre > 1 else "TTFT proxy (first prefill step)",
               "1" if n_pre else "0", fmt.ms(lat["ttft_ms"]), "", "")
    lt.add_row("TPOT", str(lat["tpot_samples"]), fmt.ms(tp["p50"]), fmt.ms(tp["p90"]), fmt.ms(tp["p99"]))
    if lat.get("itl_samples"):
        lt.add_row("ITL (decode + mixed)", str(lat["itl_samples"]), fmt.ms(itl.get("p50")), fmt.ms(itl.get("p90")), fmt.ms(itl.get("p99")))
    for key, label in (("prefill_step_ms", "prefill step (own)"), ("decode_step_ms", "decode step (own)"),
                       ("mixed_step_ms", "mixed step (own)")):
        v = lat.get(key) or {}
        if v.get("p50") is not None:
            lt.add_row(label, "", fmt.ms(v["p50"]), fmt.ms(v["p90"]), fmt.ms(v["p99"]))
    return [[lt, definition]]


def _waits(d: dict[str, Any], full: bool, width: int = DEFAULT_WIDTH) -> list[list[Any]]:
    if full:
        return [waits_lines(d, gaps=99, steps=8, legend=True)]
    return [waits_lines(d, gaps=g, steps=s, legend=False, width=width, key=k)
            for g, s, k in ((5, 3, True), (3, 1, False), (1, 1, False), (0, 0, False))]


def _categories(d: dict[str, Any], full: bool) -> list[list[Any]]:
    """One line per step phase and device: its time per kernel category (busy unions, ms);
    ``full`` adds its launch gaps."""
    out: list[Any] = []
    for p in d["phases"]:
        if p["name"] == "all" or p["activity_count"] == 0:
            continue
        cats = ", ".join(f"{k} {v:.3f}" for k, v in sorted(p["categories_ms"].items(), key=lambda kv: -kv[1]))
        out.append(Text(safe(f"{p['name']} (device {p['device']}): categories ms: {cats}")))
        g = p["gaps"]["launch"]
        if full and g["count"]:
            out.append(Text(f"  launch gaps: {g['count']}, p50 {g['p50_us']} µs, p99 {g['p99_us']} µs, "
                            f"max {g['max_us']} µs, total {g['total_us']} µs", style="dim"))
    return [out] if full else [out, []]


def _classes(d: dict[str, Any]) -> list[list[Any]]:
    """One line per step phase: its kernel time above the roofline, by op class."""
    out: list[Any] = []
    for p in d["phases"]:
        classes = [c for c in p.get("op_classes") or [] if c.get("loss_ms") is not None]
        if not classes or p["name"] in ("all", "unknown"):
            continue
        steps = max(1, p.get("steps") or 1)
        total = sum(c["loss_ms"] for c in classes)
        parts = []
        for c in classes[:5]:
            if c.get("small"):
                att = "small kernels"
            else:
                att = "—" if c.get("attainment") is None else f"{fmt.pct(c['attainment'], 0)} of {'bandwidth' if c['peak'] == 'bandwidth' else 'FLOP/s'}"
            parts.append(f"{c['label']} {c['loss_ms'] / steps:.2f} ({att})")
        unknown = sum(c.get("unknown_ms") or 0.0 for c in p.get("op_classes") or [])
        tail = f"; {unknown / steps:.2f} ms of kernels without shapes not counted" if unknown >= 0.01 * steps else ""
        out.append(Text(safe(f"Above the roofline ({p['name']}, device {p['device']}), ms per step: {total / steps:.2f} = "
                             + ", ".join(parts) + tail)))
    return [out, []]


def _kernels(d: dict[str, Any], full: bool, width: int = DEFAULT_WIDTH) -> list[list[Any]]:
    rows = d.get("kernel_table") or []
    if not rows:
        return [[]]
    if full:
        return [[_kernel_table(rows, 20, wide=True)]]
    return [[_kernel_table(rows, n, width=width)] for n in (8, 5, 3)] + [[]]


def _kernel_table(rows: list[dict[str, Any]], n: int, wide: bool = False, width: int | None = None) -> Any:
    title = "Which kernel to tune (kernel table, top rows" + ("" if wide else "; names shortened, whole in --format json") + ")"
    one_phase = len({r.get("phase") for r in rows[:n]}) == 1 and not wide
    with_device = wide or len({r.get("device") for r in rows[:n]}) > 1
    if one_phase:
        title = title.replace("top rows", f"{rows[0].get('phase')}, top rows")
    cols = [("phase", "left", 8), ("op", "left", 16, 8), ("input dims", "left", 16 if not wide else None, 10),
            ("kernel", "left", None if wide else 30, 18), ("calls", "right", None), ("ms", "right", None), ("share", "right", None),
            ("dtype", "left", None), ("achieved", "right", None), ("% peak", "right", None), ("bound", "left", 9, 9)]
    body = []
    for r in rows[:n]:
        frac = max([x for x in (r.get("peak_tflops_share"), r.get("peak_tbps_share")) if x is not None], default=None)
        if r.get("bound") == "compute" and r.get("achieved_tflops") is not None:
            rate = f"{r['achieved_tflops']:.1f} TFLOP/s"
        elif r.get("achieved_tbps") is not None:
            rate = f"{r['achieved_tbps']:.2f} TB/s"
        else:
            rate = "—"
        kernel = safe(str(r.get("kernel") or "")) if wide else short_kernel(str(r.get("kernel") or ""), 30)
        body.append([r.get("phase") or "", safe(r.get("op") or "—") if wide else short_op(r.get("op")),
                     safe(str(r.get("input_dims") or "")),
                     kernel, str(r.get("calls")), fmt.ms(r.get("total_ms")), fmt.pct(r.get("kernel_time_share"), 0),
                     r.get("dtype") or "—", rate, fmt.pct(frac, 0),
                     r.get("bound") or (r.get("shapes_unknown") and "no shapes") or "—"])
    if one_phase:
        cols, body = cols[1:], [b[1:] for b in body]
    if with_device:
        cols, body = [("dev", "right", None)] + cols, [[fmt.number(r.get("device"))] + b for r, b in zip(rows[:n], body)]
    return compact_table(cols, body, title, wide, width)


def _not_evaluated(d: dict[str, Any], full: bool) -> list[list[Any]]:
    groups = group_not_evaluated(d.get("not_evaluated") or [])
    if not groups:
        return [[]]
    n = sum(len(ids) for _, ids in groups)
    lines = [Text(safe(f"  {why}: {', '.join(ids)}"), style="dim") for why, ids in groups]
    head = Text(f"Rules not evaluated ({n}), by reason:", style="dim")
    if full:
        return [[head, *lines]]
    short = [head, *lines[:3]] + ([Text(f"  … {len(groups) - 3} more reason(s)", style="dim")] if len(groups) > 3 else [])
    one = [Text(f"{n} rule(s) not evaluated for lack of inputs ({len(groups)} reason(s))", style="dim")]
    return [[head, *lines], short, one]


def _quality(d: dict[str, Any], full: bool) -> list[list[Any]]:
    qs = d["quality"]
    if not qs:
        return [[]]
    head = Text("Data quality:", style="bold")

    def line(q, cut: int | None) -> Text:
        msg = safe(q["message"])
        if cut is not None and len(msg) > cut:
            msg = msg[: cut - 1] + "…"
        return Text.assemble(("  ", ""), (safe(q["code"]), "yellow"), (": " + msg, ""))

    whole = [head, *(line(q, None) for q in qs)]
    if full:
        return [whole]
    cut = [head, *(line(q, 72) for q in qs)]
    codes = [Text.assemble(("Data quality: ", "bold"), (safe(", ".join(q["code"] for q in qs)), "yellow"))]
    return [whole, cut, codes]
