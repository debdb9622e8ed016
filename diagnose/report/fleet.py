"""Terminal report of a fleet run (several ranks): one row per rank, stragglers marked, then
the straggler verdict, notes and errors. Beside :mod:`diagnose.report.terminal` (one trace);
the fleet result comes from :func:`diagnose.multi.analyze_many`."""
from __future__ import annotations

import os
from typing import Any

from rich.markup import escape as _markup_escape
from rich.table import Table

from diagnose.report import fmt
from diagnose.textsafe import safe


def render_fleet(result: dict[str, Any], console: Any) -> None:
    """Print the fleet result on a rich ``Console``: one row per rank, stragglers in bold red."""
    def escape(text: str) -> str:  # names from the trace: control characters shown, markup escaped
        return _markup_escape(safe(text))

    rows = result.get("ranks") or []
    errs = result.get("errors") or []
    t = Table(title=f"Fleet: {len(rows) + len(errs)} trace(s), {len(rows)} analysed ({result.get('executor')})",
              title_justify="left")
    for col, just in (("rank", "right"), ("trace", "left"), ("device", "left"), ("phase", "left"), ("steps", "right"),
                      ("TPOT p50 ms", "right"), ("TPOT p99 ms", "right"), ("launch gap", "right"), ("GPU idle", "right"),
                      ("busy ms", "right"), ("wall ms", "right"), ("MBU", "right"), ("top symptom", "left")):
        t.add_column(col, justify=just, overflow="fold")
    for r in rows:
        rank = fmt.NA if r.get("rank") is None else str(r["rank"])
        t.add_row(
            rank + (" SLOW" if r.get("straggler") else ""),
            escape(os.path.basename(r.get("path") or "") + (f" [{r['label']}]" if r.get("label") else "")),
            escape(r.get("device") or "?"),
            r.get("phase") or fmt.NA,
            fmt.number(r.get("steps")),
            fmt.ms(r.get("tpot_p50_ms")), fmt.ms(r.get("tpot_p99_ms")),
            fmt.pct(r.get("launch_gap_share")), fmt.pct(r.get("gpu_idle_share")),
            fmt.ms(r.get("gpu_busy_ms")), fmt.ms(r.get("wall_ms")), fmt.pct(r.get("mbu")),
            escape(r.get("top_symptom") or fmt.NA),
            style="bold red" if r.get("straggler") else None,
        )
    console.print(t)
    rule = result.get("straggler_rule") or {}
    strag = result.get("stragglers") or []
    if strag:
        for s in strag:
            exc = s.get("excess_share")
            who = f"rank {s['rank']}" if s.get("rank") is not None else "trace"
            console.print(f"[bold red]straggler[/]: {who} ({escape(os.path.basename(s.get('path') or ''))}) "
                          f"{s['metric']} = {s['value']:.3f}, median {s['median']:.3f}"
                          + (f" (+{100 * exc:.0f}%)" if exc is not None else ""), highlight=False)
    elif rule.get("note"):
        console.print(f"stragglers: not checked ({rule['note']})", highlight=False)
    else:
        console.print(f"stragglers: none ({rule.get('metric')}, median {fmt.ms(rule.get('median'))}, MAD {fmt.ms(rule.get('mad'))})",
                      highlight=False)
    for n in result.get("notes") or []:
        console.print(f"[yellow]note[/]: {escape(n)}", highlight=False)
    for e in errs:
        where = os.path.basename(e.get("path") or "") + (f" [{e['label']}]" if e.get("label") else "")
        console.print(f"[red]error[/]: rank {e.get('rank') if e.get('rank') is not None else '?'} "
                      f"({escape(where)}): {escape(str(e.get('error')))}", highlight=False)
