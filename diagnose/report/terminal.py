"""Terminal report (rich): the headline first, then the ranked findings, where the GPU
waited, per-phase numbers, latency, top kernels, rules not evaluated and data quality.

Every text that comes from the trace (kernel, marker and call names, paths) goes through
:func:`diagnose.textsafe.safe`: control characters are shown escaped, never sent to the
terminal (a name with an escape sequence must not clear the screen or set the title).
"""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table
from rich.text import Text

from diagnose.analyzers import Analysis
from diagnose.hardware import describe_devices, describe_peak
from diagnose.pipeline import device_headline_lines
from diagnose.report import fmt
from diagnose.textsafe import safe
from diagnose.vocab import CAUSE_COLORS, GAP_CAUSE_LABELS, GAP_CAUSES, SEVERITY_STYLES


def _console(console: Console | None) -> Console:
    c = console or Console()
    if console is None and not c.is_terminal:
        c = Console(width=160)
    return c


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


def render(analysis: Analysis, console: Console | None = None, layers: bool = False) -> None:
    """Print the analysis to ``console`` (stdout by default); ``layers``: with the whole
    layer x op-class table."""
    render_report(analysis.to_dict(), console, metadata=analysis.metadata, layers=layers)


def render_report(d: dict[str, Any], console: Console | None = None, metadata: dict | None = None,
                  layers: bool = False) -> None:
    """Print a JSON report (``Analysis.to_dict()`` with verdicts)."""
    from diagnose.report import layers_text

    c = _console(console)
    c.print(Text(safe(f"diagnose — {d['source']['path']}  ({d['source']['format']})"), style="bold"))
    if d.get("partial"):
        c.print(Text("PARTIAL TRACE: every number below comes from an incomplete file", style="bold red"))
    listed = [p.get("name") for p in ((metadata or {}).get("deviceProperties") or []) if isinstance(p, dict)]
    no_gpu = "none with activity in the analysed events" + (f" (the trace lists {len(listed)} GPU(s))" if listed else " (CPU only)")
    gpu = d.get("gpu")
    c.print(Text(safe(f"GPU devices: {describe_devices(d['devices'], gpu) or no_gpu}")))
    if gpu and d["devices"]:
        c.print(Text(safe(f"Peaks: {describe_peak(gpu)}"), style="dim"))
    line = steps_line(d)
    if line:
        c.print(Text(safe(line)))

    symptoms = d.get("symptoms") or []
    h = d.get("headline")
    if "symptoms" in d:
        sev = symptoms[0]["severity"] if symptoms and h and h.get("rule_id") else "info"
        c.print(Text("► " + headline_text(h), style="bold " + SEVERITY_STYLES.get(sev, "")))
    for line in device_headline_lines(d):  # each device's own headline, when the trace has several
        c.print(Text(safe("  " + line), style="dim"))
    several = len(d.get("device_verdicts") or []) > 1
    for s in symptoms:
        indent = "      " if s.get("grouped_under") else "  "
        where = f" (device {s['device']})" if several and s.get("device") is not None else ""
        line = f"{indent}[{s['severity']}] {s['id']}{where}: {s['summary']}"
        if s.get("predicted_saving_ms") is not None:
            line += f" (predicted saving {s['predicted_saving_ms']:.3f} ms)"
        c.print(Text(safe(line), style=SEVERITY_STYLES.get(s["severity"], "")))
        if not s.get("grouped_under"):
            recs = s.get("recommends") or []
            if recs:
                from diagnose.vocab import LEVERS

                c.print(Text(safe(f"{indent}  fix: " + "; ".join(LEVERS[r].text for r in recs if r in LEVERS)), style="dim"))
            for note in s.get("already_in_place") or []:
                c.print(Text(safe(f"{indent}  ({note})"), style="dim"))
    if "symptoms" in d and not symptoms:
        ne = len(d.get("not_evaluated") or [])
        tail = f" ({ne} rule(s) not evaluated for lack of inputs: see below)" if ne else ""
        c.print(Text("No symptom rule fired." + tail, style="green"))
    _render_path(c, d)
    layers_text.render_summary(c, d, table_hint=not layers)
    if layers:
        layers_text.render_table(c, d)

    t = Table(title="Phases (per device)", header_style="bold")
    for col in ("phase", "device", "steps", "own ms", "wall ms", "GPU busy ms", "idle share", "launch-gap share",
                "attention share", "kernels"):
        t.add_column(col, justify="left" if col == "phase" else "right")
    extra_cols = [k for k in ("mfu", "mbu", "bound_ratio") if any(k in p for p in d["phases"])]
    for k in extra_cols:
        t.add_column(k.upper() if k != "bound_ratio" else "bound ratio", justify="right")
    for p in d["phases"]:
        busy = fmt.ms(p["gpu_busy_ms"]) if p["device"] is not None else "—"
        row = [p["name"], fmt.number(p["device"]), str(p["steps"]), fmt.ms(p.get("own_ms")), fmt.ms(p["wall_ms"]), busy,
               fmt.pct(p["gpu_idle_share"]), fmt.pct(p["launch_gap_share"]), fmt.pct(p["attention_share"]), str(p["kernel_count"])]
        for k in extra_cols:
            v = p.get(k)
            cell = fmt.pct(v) if k in ("mfu", "mbu") else fmt.number(v, 2)
            row.append("n/a" if v is not None and k in (p.get("unreliable") or []) else cell)
        t.add_row(*row)
    c.print(t)
    c.print("[dim]own = GPU span of the steps minus waits not caused by them (the time base of TTFT, TPOT, MFU, MBU); "
            "wall = marker start to GPU end" + ("; n/a = cannot be read from this trace (see Data quality)" if any(p.get("unreliable") for p in d["phases"]) else "")
            + "[/dim]")

    sources = sorted({(p.get("flops_source"), p.get("bytes_source")) for p in d["phases"] if p.get("bytes_source") or p.get("flops_source")},
                     key=str)
    for fs, bs in sources:
        c.print(Text(safe(f"MFU FLOPs from {fs or 'nothing'}; MBU bytes from {bs or 'nothing'}"
                          + (" (every operator's inputs and outputs: not comparable with an MBU over weights + KV cache)"
                             if bs and "operand" in bs else "")), style="dim"))

    lat = d["latency"]
    lt = Table(title="Latency (definitions: README §Definitions)", header_style="bold")
    for col in ("metric", "samples", "p50 ms", "p90 ms", "p99 ms"):
        lt.add_column(col, justify="left" if col == "metric" else "right")
    n_pre = lat["ttft_samples"]
    lt.add_row(f"TTFT proxy (first of {n_pre} prefill steps)" if n_pre > 1 else "TTFT proxy (first prefill step)",
               "1" if n_pre else "0", fmt.ms(lat["ttft_ms"]), "", "")
    tp = lat["tpot_ms"]
    lt.add_row("TPOT", str(lat["tpot_samples"]), fmt.ms(tp["p50"]), fmt.ms(tp["p90"]), fmt.ms(tp["p99"]))
    itl = lat.get("itl_ms") or {}
    if lat.get("itl_samples"):
        lt.add_row("ITL (decode + mixed)", str(lat["itl_samples"]), fmt.ms(itl.get("p50")), fmt.ms(itl.get("p90")), fmt.ms(itl.get("p99")))
    for key, label in (("prefill_step_ms", "prefill step (own)"), ("decode_step_ms", "decode step (own)"),
                       ("mixed_step_ms", "mixed step (own)")):
        v = lat.get(key) or {}
        if v.get("p50") is not None:
            lt.add_row(label, "", fmt.ms(v["p50"]), fmt.ms(v["p90"]), fmt.ms(v["p99"]))
    c.print(lt)
    c.print(f"[dim]TPOT = {escape(lat['tpot_definition'])}[/dim]")

    _render_waits(c, d)

    for p in d["phases"]:
        if p["name"] == "all" or p["activity_count"] == 0:
            continue
        g = p["gaps"]["launch"]
        cats = ", ".join(f"{k} {v:.3f}" for k, v in sorted(p["categories_ms"].items(), key=lambda kv: -kv[1]))
        c.print(Text(f"{p['name']} (device {p['device']}): categories ms: {cats}", style="bold"))
        if g["count"]:
            c.print(f"  launch gaps: {g['count']}, p50 {g['p50_us']} µs, p99 {g['p99_us']} µs, max {g['max_us']} µs, total {g['total_us']} µs")
        for k in p["top_kernels"][:5]:
            c.print(Text(safe(f"  {k['total_ms']:10.3f} ms  {k['count']:5d}×  {k['category']:13s} {k['name'][:90]}")))

    kt = d.get("kernel_table") or []
    if kt:
        _render_kernel_table(c, kt)

    _render_tail(c, d)


def _render_tail(c: Console, d: dict[str, Any]) -> None:
    """The rules not evaluated and the data-quality issues."""
    if d.get("not_evaluated"):
        c.print(Text(safe("Rules not evaluated: " + "; ".join(
            f"{n['id']} ({n.get('reason') or 'missing ' + ', '.join(n.get('missing') or [])})" for n in d["not_evaluated"])),
            style="dim"))
    if d["quality"]:
        c.print("[bold]Data quality:[/bold]")
        for q in d["quality"]:
            c.print(Text.assemble(("  ", ""), (safe(q["code"]), "yellow"), (": " + safe(q["message"]), "")))


def _render_path(c: Console, d: dict[str, Any]) -> None:
    """What sets the step time: one line per phase (README "Critical path")."""
    from diagnose.report.pathline import path_lines

    for line in path_lines(d):
        c.print(Text(safe("critical path: " + line), style="bold"))


def _render_waits(c: Console, d: dict[str, Any]) -> None:
    """Where the GPU waited: idle time by cause and the longest gaps with what the host did."""
    rows = [p for p in d["phases"] if p["name"] == "all" and p.get("idle_by_cause_ms")]
    if not rows:
        return
    for p in rows:
        by = p["idle_by_cause_ms"]
        total = sum(by.values())
        if total <= 0:
            continue
        head = Text(f"Where the GPU waited (device {p['device']}, idle {total:.3f} ms): ", style="bold")
        for i, (k, v) in enumerate(sorted(by.items(), key=lambda kv: -kv[1])):
            head.append(", " if i else "")
            head.append(f"{k} {v:.3f} ms", style=_cause_style(k))
        c.print(head)
        t = Table(header_style="bold", title=None)
        # the start counts from the trace start (the JSON's start_ms, --window, the web and HTML
        # timelines); 10 columns wide, so the header wraps to 3 lines rather than widen the table
        t.add_column("start ms from trace start", justify="right", overflow="fold", max_width=10)
        for col in ("idle ms", "cause", "host was in", "host stack (innermost last)", "next on the GPU"):
            t.add_column(col, justify="right" if col == "idle ms" else "left", overflow="fold")
        for g in p["gaps"].get("longest") or []:
            cause = g["cause"] + (f" (after {g['waited_on']})" if g.get("waited_on") else "")
            stack = " > ".join((g.get("host_stack") or [])[-4:]) or "—"
            t.add_row(fmt.ms(g["start_ms"]), fmt.ms(g["ms"]), Text(safe(cause), style=_cause_style(g["cause"])),
                      safe(g.get("host_call") or "—"), safe(stack), safe(g.get("next") or "")[:60])
        c.print(t)
        legend = Text()  # the cause legend: each cause shown, in its colour, and what it means
        for i, k in enumerate(k for k in GAP_CAUSES if k in by):
            legend.append("; " if i else "", style="dim")
            legend.append(k, style=_cause_style(k))
            legend.append(f": {GAP_CAUSE_LABELS[k]}", style="dim")
        c.print(legend)
    steps = d.get("steps") or []
    before = [(s, w) for s in steps[:50] for w in (s.get("waits") or []) if w.get("where") == "before" and w["ms"] >= 1.0]
    if before:
        c.print(Text("Before their GPU work, steps waited:", style="bold"))
        for s, w in before[:8]:
            line = Text(safe(f"  {s['name'][:60]}: {w['ms']:.3f} ms "))
            line.append(safe(w["cause"]), style=_cause_style(w["cause"]))
            line.append(safe((f" after {w['waited_on']}" if w.get("waited_on") else "")
                             + (f" (host in {w['host_call']})" if w.get("host_call") else "")
                             + f" — {GAP_CAUSE_LABELS.get(w['cause'], '')}"))
            c.print(line)


def _cause_style(cause: str) -> str:
    """A cause's colour (the cause table's, as every view) as a rich style."""
    color = CAUSE_COLORS.get(cause)
    return f"bold {color}" if color else ""


def _render_kernel_table(c: Console, rows: list[dict[str, Any]]) -> None:
    t = Table(title="Which kernel to tune (kernel table, top rows)", header_style="bold")
    for col in ("device", "phase", "op", "input dims", "kernel", "calls", "ms", "share", "TFLOP/s", "TB/s", "% peak", "bound"):
        t.add_column(col, justify="right" if col in ("calls", "ms", "share", "TFLOP/s", "TB/s", "% peak") else "left",
                     overflow="fold")
    for r in rows[:10]:
        frac = max([x for x in (r.get("peak_tflops_share"), r.get("peak_tbps_share")) if x is not None], default=None)
        t.add_row(fmt.number(r.get("device")), r.get("phase") or "", safe(r.get("op") or "—"), safe(str(r.get("input_dims") or ""))[:40],
                  safe(str(r.get("kernel") or ""))[:48], str(r.get("calls")), fmt.ms(r.get("total_ms")),
                  fmt.pct(r.get("kernel_time_share")), fmt.number(r.get("achieved_tflops"), 1), fmt.number(r.get("achieved_tbps"), 2),
                  fmt.pct(frac), r.get("bound") or (r.get("shapes_unknown") and "shapes unknown") or "—")
    c.print(t)
