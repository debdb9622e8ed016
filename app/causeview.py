"""The waits section's rows, shared by the HTML report and the web overview: idle time by
cause (colour, label and levers from the cause table, diagnose/data/causes.yaml) and the
longest gaps, one row per gap with its pieces and the host's stack; and the cause legend of
the overview, the timeline and the HTML report (one entry per cause a view shows, its colour
and words the cause table's: the same entries as the timeline figure's own legend)."""
from __future__ import annotations

from typing import Any, Iterable, Mapping

from diagnose.report import fmt
from diagnose.vocab import CAUSE_COLORS, CAUSE_LEVERS, GAP_CAUSE_LABELS, GAP_CAUSE_TABLE, LEVERS

#: Each cause's legend text: its name and short words (the cause table's), on every page's
#: legend and on the timeline figure's legend entries.
CAUSE_LEGEND = {c.name: f"{c.name}: {c.short}" for c in GAP_CAUSE_TABLE}


def _ms(v: Any) -> str:
    text = fmt.value(v, "ms")
    return "not available" if text == fmt.NA else text


def cause_color(cause: str) -> str:
    """The cause table's colour of ``cause`` (unknown's for a name it lacks)."""
    return CAUSE_COLORS.get(cause, CAUSE_COLORS["unknown"])


def cause_rows(by_cause_ms: Mapping[str, float]) -> list[dict]:
    """[{cause, color, ms_text, label, levers_text}], largest first."""
    return [{"cause": c, "color": cause_color(c), "ms_text": _ms(v), "label": GAP_CAUSE_LABELS.get(c, c),
             "levers_text": "; ".join(LEVERS[x].text for x in CAUSE_LEVERS.get(c, ()) if x in LEVERS)}
            for c, v in sorted(by_cause_ms.items(), key=lambda kv: -kv[1])]


def gap_rows(longest: Iterable[Mapping]) -> list[dict]:
    """[{start_text, ms_text, cause, cause_name, color, parts_text, host_call, stack_text, next}]."""
    rows = []
    for g in longest:
        c = g.get("cause") or ""
        parts = g.get("parts_ms") or {}
        rows.append({"start_text": _ms(g.get("start_ms")), "ms_text": _ms(g.get("ms")),
                     "cause": c + (f" (after {g['waited_on']})" if g.get("waited_on") else ""), "cause_name": c,
                     "color": cause_color(c),
                     "parts_text": ", ".join(f"{k} {_ms(v)}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1])),
                     "host_call": g.get("host_call") or "—",
                     "stack_text": " > ".join(g.get("host_stack") or []) or "—", "next": str(g.get("next") or "")[:100]})
    return rows


def legend_entries(causes: Iterable[str]) -> list[dict]:
    """The cause legend of a view: one entry per cause in ``causes`` (the causes the view
    shows; repeats ignored, names the table lacks left out: they have no colour of their
    own), in the cause table's order.

    Returns:
        [{cause, color, text, label}]: ``color`` the table's ``color``, ``text`` "name: short"
        (:data:`CAUSE_LEGEND`), ``label`` the table's one-line meaning.
    """
    present = set(causes)
    return [{"cause": c.name, "color": c.color, "text": CAUSE_LEGEND[c.name], "label": c.label}
            for c in GAP_CAUSE_TABLE if c.name in present]


def waits_causes(waits: Iterable[Mapping]) -> set[str]:
    """The causes a waits section shows: of every device's ``figures.waits_data`` (idle time
    by cause and the longest gaps)."""
    return ({c["cause"] for w in waits for c in w["causes"]}
            | {r["cause_name"] for w in waits for r in w["rows"] if r["cause_name"]})
