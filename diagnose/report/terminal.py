"""Terminal report (rich): verdict first, then per-phase numbers, latency, gaps, top kernels."""
from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from diagnose.analyzers import Analysis

_SEV_STYLE = {"critical": "bold white on red", "high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{100 * x:.1f} %"


def _ms(x: float | None, nd: int = 3) -> str:
    return "—" if x is None else f"{x:.{nd}f}"


def _num(x: Any, nd: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, float):
        return f"{x:.{nd}f}"
    return str(x)


def render(analysis: Analysis, console: Console | None = None) -> None:
    """Print the analysis to ``console`` (stdout by default)."""
    c = console or Console()
    if console is None and not c.is_terminal:
        c = Console(width=160)
    d = analysis.to_dict()
    title = f"diagnose — {d['source']['path']}  ({d['source']['format']})"
    c.print(Text(title, style="bold"))
    if d.get("partial"):
        c.print(Text("PARTIAL TRACE: every number below comes from an incomplete file", style="bold red"))
    listed = [p.get("name") for p in (analysis.metadata.get("deviceProperties") or []) if isinstance(p, dict)]
    no_gpu = "none with activity in the analysed events" + (f" (the trace lists {len(listed)} GPU(s))" if listed else " (CPU only)")
    devs = ", ".join(f"{x['id']}: {x['name'] or '(unnamed)'}" for x in d["devices"]) or no_gpu
    c.print(f"GPU devices: {devs}")

    symptoms = d.get("symptoms") or []
    if symptoms:
        worst = symptoms[0]
        c.print(Text(f"[{worst['severity'].upper()}] {worst['symptom']}: {worst['summary']}", style=_SEV_STYLE.get(worst["severity"], "")))
        for s in symptoms[1:]:
            c.print(Text(f"  [{s['severity']}] {s['symptom']}: {s['summary']}", style=_SEV_STYLE.get(s["severity"], "")))
    elif "symptoms" in d:
        ne = len(d.get("not_evaluated") or [])
        tail = f" ({ne} rule(s) not evaluated for lack of inputs: see below)" if ne else ""
        c.print(Text("No symptom rule fired." + tail, style="green"))

    t = Table(title="Phases (per device)", header_style="bold")
    for col in ("phase", "device", "steps", "wall ms", "GPU busy ms", "idle share", "launch-gap share", "attention share", "kernels"):
        t.add_column(col, justify="right" if col not in ("phase",) else "left")
    extra_cols = [k for k in ("mfu", "mbu", "bound_ratio") if any(k in p for p in d["phases"])]
    for k in extra_cols:
        t.add_column(k.upper() if k != "bound_ratio" else "bound ratio", justify="right")
    for p in d["phases"]:
        busy = _ms(p["gpu_busy_ms"]) if p["device"] is not None else "—"
        row = [p["name"], _num(p["device"]), str(p["steps"]), _ms(p["wall_ms"]), busy,
               _pct(p["gpu_idle_share"]), _pct(p["launch_gap_share"]), _pct(p["attention_share"]), str(p["kernel_count"])]
        for k in extra_cols:
            v = p.get(k)
            cell = _pct(v) if k in ("mfu", "mbu") else _num(v, 2)
            row.append(cell + " ?" if v is not None and k in (p.get("unreliable") or []) else cell)
        t.add_row(*row)
    c.print(t)
    if any(p.get("unreliable") for p in d["phases"]):
        c.print("[dim]? = unreliable (see Data quality)[/dim]")

    lat = d["latency"]
    lt = Table(title="Latency (definitions: README §Definitions)", header_style="bold")
    for col in ("metric", "samples", "p50 ms", "p90 ms", "p99 ms"):
        lt.add_column(col, justify="right" if col != "metric" else "left")
    n_pre = lat["ttft_samples"]
    lt.add_row(f"TTFT proxy (first of {n_pre} prefill steps)" if n_pre > 1 else "TTFT proxy (first prefill step)",
               "1" if n_pre else "0", _ms(lat["ttft_ms"]), "", "")
    tp = lat["tpot_ms"]
    lt.add_row("TPOT", str(lat["tpot_samples"]), _ms(tp["p50"]), _ms(tp["p90"]), _ms(tp["p99"]))
    for key, label in (("prefill_step_ms", "prefill step wall"), ("decode_step_ms", "decode step wall")):
        v = lat[key]
        if v["p50"] is not None:
            lt.add_row(label, "", _ms(v["p50"]), _ms(v["p90"]), _ms(v["p99"]))
    c.print(lt)
    c.print(f"[dim]TPOT = {lat['tpot_definition']}[/dim]")

    for p in d["phases"]:
        if p["name"] == "all" or p["activity_count"] == 0:
            continue
        g = p["gaps"]["launch"]
        cats = ", ".join(f"{k} {v:.3f}" for k, v in sorted(p["categories_ms"].items(), key=lambda kv: -kv[1]))
        c.print(f"[bold]{p['name']}[/bold] (device {p['device']}): categories ms: {cats}")
        if g["count"]:
            c.print(f"  launch gaps: {g['count']}, p50 {g['p50_us']} µs, p99 {g['p99_us']} µs, max {g['max_us']} µs, total {g['total_us']} µs")
        for k in p["top_kernels"][:5]:
            c.print(f"  {k['total_ms']:10.3f} ms  {k['count']:5d}×  {k['category']:13s} {k['name'][:90]}")

    if d.get("not_evaluated"):
        c.print("[bold]Rules not evaluated:[/bold] " + "; ".join(
            f"{n['id']} ({n.get('reason') or 'missing ' + ', '.join(n.get('missing') or [])})" for n in d["not_evaluated"]))
    if d["quality"]:
        c.print("[bold]Data quality:[/bold]")
        for q in d["quality"]:
            c.print(f"  [yellow]{q['code']}[/yellow]: {q['message']}")
