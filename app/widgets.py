"""Small Dash rendering helpers shared by the web app's pages (:mod:`diagnose.app.server`,
:mod:`diagnose.app.compare_view`)."""
from __future__ import annotations

from typing import Any

from dash import html


def table(header: list[str], body: list[list[Any]], id: str | None = None) -> html.Table:
    kw = {"id": id} if id else {}
    return html.Table(
        [html.Thead(html.Tr([html.Th(h) for h in header])),
         html.Tbody([html.Tr([c if isinstance(c, html.Td) else html.Td(c) for c in row]) for row in body])],
        className="dg-table", **kw,
    )
