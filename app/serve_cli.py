"""``diagnose serve``: the interactive report (Dash) on one or more traces.

Exported as :data:`serve_command` for the main click group to register. Binds 127.0.0.1 by
default: the report shows file paths and kernel names, so exposing it on another interface
is an explicit choice (``--host 0.0.0.0``). Unusable traces print one ``error: ...`` line on
stderr and exit with status 2 before the server starts.
"""
from __future__ import annotations

import os
import sys

import click

from diagnose.cliutil import guarded
from diagnose.errors import install_hint


@click.command("serve")
@click.option("--trace", "traces", required=True, multiple=True, metavar="FILE",
              help="Trace to serve (Kineto JSON or nsys SQLite); repeat for several (two enable Compare).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8050, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option("--debug", is_flag=True, help="Dash debug mode (reloader off, dev tools on).")
def serve_command(traces: tuple[str, ...], host: str, port: int, debug: bool) -> None:
    """Serve the interactive report: overview, phases, timeline, kernels, roofline, KV budget, compare."""
    for t in traces:
        if not os.path.exists(t):
            click.echo(f"error: trace not found: {t}", err=True)
            sys.exit(2)
    try:
        from diagnose.app.server import create_app
    except ImportError as e:  # dash is an optional extra
        click.echo(f"error: the app needs the [app] extra ({e.name or e}): " + install_hint('app'), err=True)
        sys.exit(2)
    app = guarded(create_app)(list(traces))
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: serving on {host}: anyone who can reach this address sees the report", err=True)
    click.echo(f"diagnose: serving {len(traces)} trace(s) on http://{host}:{port}/ (Ctrl-C to stop)", err=True)
    app.run(host=host, port=port, debug=debug, use_reloader=False)
