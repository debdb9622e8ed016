"""Pieces of the terminal report: shortened kernel names, the phase table, the waits section
and the rules not evaluated grouped by reason (:mod:`diagnose.report.terminal` lays them out)."""
from __future__ import annotations

import re
from typing import Any

from rich import box
from rich.table import Table
from rich.text import Text

from diagnose.report import fmt
from diagnose.textsafe import safe
from diagnose.vocab import CAUSE_COLORS, GAP_CAUSE_LABELS, GAP_CAUSES


def short_kernel(name: str, width: int = 30) -> str:
    """A kernel name that fits ``width`` characters: its base name (templates and arguments
    dropped, :func:`diagnose.analyzers.categories.base_name`), hipBLASLt/Tensile names as their
    type and macro tile (``Cijk_Alik_Bljk_BBS…MT256x32x64``), else the head and tail around an
    ellipsis. Text from the trace, made safe for a terminal."""
    from diagnose.analyzers.categories import base_name
    from diagnose.patterns import clip

    s = base_name(clip(name)) or clip(name)
    if s.startswith("_ZN"):
        s = _demangle_nested(s) or s
    if s.startswith("Cijk_"):
        parts = s.split("_")
        tile = next((p for p in parts if p.startswith("MT") and p[2:3].isdigit()), "")
        s = "_".join(parts[:4]) + ("…" + tile if tile else "")
    s = safe(s)
    if len(s) <= width:
        return s
    head = max(1, (width - 1) * 2 // 3)
    return s[:head] + "…" + s[len(s) - (width - 1 - head):]


def compact_table(columns: list[tuple], rows: list[list[str | Text]], title: str | None = None,
                  wide: bool = False, width: int | None = None) -> Table:
    """A table of one line per row that fits ``width`` columns: ``columns`` as (header,
    "left"|"right", max width or None[, floor]); a cell is a string or a styled rich Text.
    Right-justified (number) columns keep their full width; text columns give way down to
    their floor (then to 6), the one furthest above its floor first, cut with an ellipsis
    (``wide``: folded onto more lines instead, no width limit)."""
    t = Table(title=title, title_justify="left", header_style="bold", box=box.SIMPLE_HEAD, show_edge=False,
              pad_edge=False, padding=(0, 1), collapse_padding=True)
    specs = [(c + (6,))[:4] for c in columns]  # (name, justify, max width, floor)
    need = [max([len(name)] + [len(_plain(r[i])) for r in rows]) for i, (name, _, _, _) in enumerate(specs)]
    widths = [n if (m is None or j == "right") else min(n, max(m, len(name)))
              for n, (name, j, m, _) in zip(need, specs)]
    if not wide and width:
        avail = width - 2 * (len(specs) - 1)
        text = [i for i, (_, j, _, _) in enumerate(specs) if j == "left"]
        for floor_of in (lambda i: max(specs[i][3], min(need[i], 6)), lambda i: min(need[i], 6)):
            while sum(widths) > avail and any(widths[i] > floor_of(i) for i in text):
                k = max((i for i in text if widths[i] > floor_of(i)), key=lambda i: widths[i] - floor_of(i))
                widths[k] -= 1
    for (name, justify, _, _), w in zip(specs, widths):
        if wide:
            t.add_column(name, justify=justify, overflow="fold")
        else:
            t.add_column(name, justify=justify, no_wrap=True, overflow="ellipsis", min_width=w, max_width=w)
    for r in rows:
        t.add_row(*(c if wide or len(_plain(c)) <= w else _cut(c, w) for c, w in zip(r, widths)))
    return t


def _plain(cell: str | Text) -> str:
    return cell.plain if isinstance(cell, Text) else cell


def _cut(cell: str | Text, w: int) -> str | Text:
    """``cell`` cut to ``w`` characters, the last one an ellipsis (a Text keeps its style)."""
    if isinstance(cell, Text):
        out = cell.copy()
        out.truncate(w, overflow="ellipsis")
        return out
    return cell[: max(1, w - 1)] + "…"


def cause_legend(shown) -> Text:
    """The cause legend: each cause in ``shown``, in the cause table's order and colour, with
    what it means."""
    out = Text()
    for i, k in enumerate(k for k in GAP_CAUSES if k in shown):
        out.append("; " if i else "", style="dim")
        out.append(k, style=cause_style(k))
        out.append(safe(f": {GAP_CAUSE_LABELS.get(k, '')}"), style="dim")
    return out


def cause_style(cause: str) -> str:
    """A cause's colour (the cause table's, as every view) as a rich style."""
    color = CAUSE_COLORS.get(cause)
    return f"bold {color}" if color else ""


def _demangle_nested(s: str) -> str | None:
    """``_ZN5aiter24add_rmsnorm_quant_kernelI…`` -> ``aiter::add_rmsnorm_quant_kernel``: the
    nested name of an Itanium-mangled symbol (length-prefixed parts up to the template or end),
    None when it does not read as one."""
    i, parts = 3, []
    while i < len(s) and s[i].isdigit() and len(parts) < 8:
        j = i
        while j < len(s) and s[j].isdigit() and j - i < 4:
            j += 1
        n = int(s[i:j])
        if n <= 0 or j + n > len(s):
            return None
        parts.append(s[j:j + n])
        i = j + n
    return "::".join(parts) if parts else None


def short_op(op: Any) -> str:
    """An operator name without the ``aten::`` namespace (others keep theirs), made safe."""
    s = safe(str(op or "—"))
    return s[6:] if s.startswith("aten::") else s


def phase_table(phases: list[dict[str, Any]], wide: bool, width: int | None = None) -> Table:
    """The phase table: per phase and device its steps, own and busy time, idle on the steps'
    own time and on the window (labelled), launch gaps, attention, MFU, MBU and bound ratio."""
    cols = ["phase", "dev", "steps", "own ms", "busy ms", "idle own", "idle win", "launch", "attn"]
    if wide:
        cols[4:4] = ["wall ms"]
        cols += ["kernels"]
    extra = [k for k in ("mfu", "mbu", "bound_ratio") if any(p.get(k) is not None for p in phases)]
    rows = []
    for p in phases:
        busy = fmt.ms(p["gpu_busy_ms"]) if p["device"] is not None else "—"
        own_idle = p.get("gpu_idle_own_share") if p["name"] != "all" else None
        row = [p["name"], fmt.number(p["device"]), str(p["steps"]), fmt.ms(p.get("own_ms")), busy, fmt.pct(own_idle),
               fmt.pct(p["gpu_idle_share"]), fmt.pct(p["launch_gap_share"]), fmt.pct(p["attention_share"])]
        if wide:
            row[4:4] = [fmt.ms(p["wall_ms"])]
            row.append(str(p["kernel_count"]))
        for k in extra:
            v = p.get(k)
            cell = fmt.pct(v) if k in ("mfu", "mbu") else fmt.number(v, 2)
            row.append("n/a" if v is not None and k in (p.get("unreliable") or []) else cell)
        rows.append(row)
    names = cols + [{"mfu": "MFU", "mbu": "MBU", "bound_ratio": "×bound"}[k] for k in extra]
    return compact_table([(c, "left" if c == "phase" else "right", None) for c in names], rows, "Phases (per device)", wide, width)


def waits_lines(d: dict[str, Any], gaps: int, steps: int, legend: bool, width: int | None = None,
                key: bool = False) -> list[Any]:
    """Where the GPU waited: idle time by cause, the ``gaps`` longest gaps with what the host
    did (their start in ms from the trace start, as the JSON's ``start_ms`` and the pages),
    the waits before the first ``steps`` steps' GPU work; ``legend`` (``--full``: tables
    folded, not cut) or ``key``: under the gaps, what each cause shown means, in its colour."""
    out: list[Any] = []
    for p in [p for p in d["phases"] if p["name"] == "all" and p.get("idle_by_cause_ms")]:
        by = p["idle_by_cause_ms"]
        total = sum(by.values())
        if total <= 0:
            continue
        head = Text(f"Where the GPU waited (device {p['device']}, idle {total:.3f} ms): ", style="bold")
        for i, (k, v) in enumerate(sorted(by.items(), key=lambda kv: -kv[1])):
            head.append(", " if i else "")
            head.append(f"{k} {v:.3f} ms", style=cause_style(k))
        out.append(head)
        longest = (p["gaps"].get("longest") or [])[:gaps]
        if longest:
            rows = [[fmt.ms(g["start_ms"]), fmt.ms(g["ms"]),
                     Text(safe(g["cause"] + (f" (after {g['waited_on']})" if g.get("waited_on") else "")),
                          style=cause_style(g["cause"])),
                     safe(g.get("host_call") or "—"),
                     safe(" > ".join((g.get("host_stack") or [])[-(4 if legend else 2):]) or "—"),
                     short_kernel(g.get("next") or "", 40)] for g in longest]
            out.append(compact_table([("start ms", "right", None), ("idle ms", "right", None), ("cause", "left", 36),
                                      ("host was in", "left", 24), ("host stack (innermost last)" if legend else "host stack", "left", 30, 8),
                                      ("next on the GPU", "left", None)], rows,
                                     "Longest gaps (start: ms from the trace start)", wide=legend, width=width))
        if legend or key:
            out.append(cause_legend(by))
    before = [(s, w) for s in (d.get("steps") or [])[:50] for w in (s.get("waits") or []) if w.get("where") == "before" and w["ms"] >= 1.0]
    if before and steps:
        out.append(Text("Before their GPU work, steps waited:", style="bold"))
        for s, w in before[:steps]:
            line = Text(safe(f"  {s['name'][:60]}: {w['ms']:.3f} ms "))
            line.append(safe(w["cause"]), style=cause_style(w["cause"]))
            line.append(safe((f" after {w['waited_on']}" if w.get("waited_on") else "")
                             + (f" (host in {w['host_call']})" if w.get("host_call") else "")
                             + (f" — {GAP_CAUSE_LABELS.get(w['cause'], '')}" if legend else "")))
            out.append(line)
    return out


_SAMPLES = re.compile(r" < [0-9.e+-]+")


def group_not_evaluated(items: list[dict[str, Any]]) -> list[tuple[str, list[str]]]:
    """Rules not evaluated, grouped by reason: one (reason, [rule ids]) per distinct reason,
    where "missing finding(s)" reasons are grouped by the sections of the missing names
    (``prefill.*, steps.*``) and sample-count thresholds are dropped from the reason."""
    groups: dict[str, list[str]] = {}
    for n in items:
        reason = str(n.get("reason") or "")
        missing = [str(m) for m in n.get("missing") or []]
        if reason.startswith("missing finding(s)") and missing:
            key = "missing " + ", ".join(sorted({m.split(".", 1)[0] + ".*" for m in missing}))
        elif reason.startswith("too few samples"):
            key = _SAMPLES.sub("", reason)
        else:
            key = reason or ("missing " + ", ".join(missing))
        groups.setdefault(key, []).append(str(n["id"]))
    return sorted(groups.items(), key=lambda kv: -len(kv[1]))
