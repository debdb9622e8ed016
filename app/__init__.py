"""Report UI: the Dash app (``diagnose serve``) and the self-contained HTML report.

* :mod:`diagnose.app.figures` — pure figure builders and table data from the JSON report
  (categories, roofline, phases table, KV budget, compare, overview cards).
* :mod:`diagnose.app.timeline` — the aggregated GPU timeline figure.
* :mod:`diagnose.app.server` — ``create_app(paths)`` (needs the ``[app]`` extra: dash,
  dash-ag-grid).
* :mod:`diagnose.app.serve_cli` — the ``serve`` click command.
* :mod:`diagnose.app.html` — ``write_html(analysis, path)`` (needs plotly only).

Nothing is imported here, so ``diagnose.app.html`` works without dash installed.
"""
