"""The web app's compare page: two served traces compared with the app's rule set, devices
paired as ``diagnose compare`` pairs them (:func:`diagnose.compare.compare_reports`). ``state``
is the app's :class:`diagnose.app.server.AppState`."""
from __future__ import annotations

from typing import Any

from dash import dcc, html

from diagnose.app import figures as F
from diagnose.app.widgets import table as _table


def compare_page(state: Any) -> html.Div:
    if len(state.entries) < 2:
        return html.Div([
            html.H2("Compare two traces"),
            html.P(["Only one trace was given. Start the app with a baseline and a candidate to compare them side by "
                    "side: ", html.Code("diagnose serve --trace baseline.json.gz --trace candidate.json.gz"),
                    ". The verdict is the one `diagnose compare` gives with the same rule options: 'regression' when "
                    "TTFT or any TPOT percentile (p50/p90/p99) is more than the latency-regression rule's threshold "
                    "(default 50 %) worse than the baseline (docs/prefill-decode.md §8)."], id="compare-help"),
        ])
    opts = [{"label": e.label, "value": e.key} for e in state.entries]
    return html.Div([
        html.H2("Compare two traces"),
        html.Div([html.Label("baseline (A)"), dcc.Dropdown(id="compare-a", options=opts, value=state.entries[0].key, clearable=False),
                  html.Label("candidate (B)"), dcc.Dropdown(id="compare-b", options=opts, value=state.entries[1].key, clearable=False)],
                 style={"maxWidth": "40em"}),
        html.Div(compare_output(state, state.entries[0].key, state.entries[1].key), id="compare-output"),
    ])


def compare_result(state: Any, a_key: Any, b_key: Any):
    """:func:`diagnose.compare.compare_reports` of two served traces with the app's rule set:
    the same verdict ``diagnose compare`` gives with the same rule options."""
    from diagnose.compare import compare_reports
    from diagnose.engine import load_ruleset

    rs = state.ruleset if state.ruleset is not None else load_ruleset()
    return compare_reports(state.get(a_key).report, state.get(b_key).report, rs)


def compare_output(state: Any, a_key: Any, b_key: Any) -> list:
    from diagnose.errors import DiagnoseError
    from diagnose.findings import describe_pairs

    a, b = state.get(a_key), state.get(b_key)
    try:
        cmp = compare_result(state, a_key, b_key)
    except DiagnoseError as e:  # device sets that cannot be paired: say so, as `diagnose compare` does
        return [html.Div([html.H2("CANNOT COMPARE"), html.Div(str(e))], id="compare-verdict",
                         className="dg-banner dg-verdict-inconclusive", **{"data-verdict": "not comparable"})]
    d = F.compare_view(cmp)
    banner = html.Div([html.H2(d["verdict"].upper()), html.Div(d["explanation"]),
                       html.Div(describe_pairs(cmp.pairs, [f"A: {a.label}", f"B: {b.label}"]), id="compare-pairs")],
                      id="compare-verdict", className=f"dg-banner dg-verdict-{d['css']}", **{"data-verdict": d["verdict"]})
    body = [[r["metric"], r["a_text"], r["b_text"],
             html.Td(r["change_text"], style={"color": "#c62828" if r["worse"] else "#2e7d32" if r["worse"] is False else None})]
            for r in d["rows"]]
    cats = [[r["phase"], r["category"], r["a_text"], r["b_text"], r["change_text"]] for r in d["category_rows"]]
    out = [banner, _table(["metric", f"A: {a.label}", f"B: {b.label}", "change (B vs A)"], body, id="compare-table")]
    if cats:
        out += [html.H3("Kernel time by category"),
                _table(["phase", "category", f"A: {a.label}", f"B: {b.label}", "B / A"], cats, id="compare-categories")]
    return out
