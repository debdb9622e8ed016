"""A fired symptom's card and the cause legend on the web pages (the HTML report's template
renders the same data: :func:`diagnose.app.figures.symptom_cards_data`,
:func:`diagnose.app.causeview.legend_entries`)."""
from __future__ import annotations

from typing import Any

from dash import html

from diagnose.app import figures as F


def symptom_card(c: dict) -> html.Div:
    """One fired symptom, for people: findings by their labels, thresholds in words, evidence,
    likely cause, how to verify and one "what to change" section (:func:`figures.symptom_cards_data`)."""
    head = " · ".join(x for x in (c["symptom"], c["title"]) if x) or c["id"]
    body: list[Any] = [html.H3([html.Span(c["severity"].upper(), className="dg-sev", style={"background": c["color"]}), head]),
                       html.P(c["summary"])]
    dl: list[Any] = []
    mvt: list[Any] = [html.Li([m["text"], html.Span(m["why"], className="dg-why") if m["why"] else ""], title=m["key"])
                      for m in c["measured"]]
    mvt += [html.Li(f"{p['label']}: {p['measured_text']} vs threshold {p['threshold_text']}") for p in c["pairs"]]
    if mvt:
        dl += [html.Dt("Measured vs threshold"), html.Dd(html.Ul(mvt))]
    if c["evidence"]:
        dl += [html.Dt("Evidence"), html.Dd(html.Ul([html.Li(f"{k}: {v}") for k, v in c["evidence"]]))]
    for key, label in (("likely_cause", "Likely cause"), ("how_to_verify", "How to verify")):
        if c[key]:
            dl += [html.Dt(label), html.Dd(c[key])]
    if c["change"] or c["in_place"]:
        dl += [html.Dt("What to change"),
               html.Dd([html.Ul([html.Li(x) for x in c["change"]], className="dg-levers")]
                       + ([html.Div("Already in place: " + "; ".join(c["in_place"]), className="dg-muted")]
                          if c["in_place"] else []))]
    if c["references"]:
        dl += [html.Dt("References"), html.Dd(", ".join(c["references"]), className="dg-muted")]
    body.append(html.Dl(dl))
    return html.Div(body, id=f"symptom-card-{F.safe_id(c['id'])}", className="dg-card",
                    style={"borderLeftColor": c["color"]})


def cause_legend(entries: list[dict], id: str) -> html.Div:
    """The cause legend (:func:`diagnose.app.causeview.legend_entries`): one swatch in the
    cause table's colour and "name: short" per cause the page shows; the cause's one-line
    meaning on hover."""
    items: list[Any] = [html.Span("Causes:", className="dg-legend-head")]
    items += [html.Span([html.Span(className="dg-swatch", style={"background": e["color"]}), e["text"]],
                        className="dg-legend-item", title=e["label"], **{"data-cause": e["cause"]}) for e in entries]
    return html.Div(items, id=id, className="dg-legend")
