"""``diagnose serve``: the interactive report (Dash) on one or more traces.

Exported as :data:`serve_command` for the main click group to register. Binds 127.0.0.1 by
default: the report shows file paths and kernel names, so exposing it on another interface
is an explicit choice (``--host 0.0.0.0``). Unusable traces print one ``error: ...`` line on
stderr and exit with status 2 before the server starts.
"""
from __future__ import annotations

import errno
import os
import socket
import sys

import click

from diagnose.cli_options import analysis_options, rule_options, split_options
from diagnose.cliutil import guarded
from diagnose.errors import install_hint


@click.command("serve")
@click.option("--trace", "traces", required=True, multiple=True, metavar="FILE",
              help="Trace to serve (Kineto JSON or nsys SQLite); repeat for several (two enable Compare).")
@click.option("--host", default="127.0.0.1", show_default=True, help="Interface to bind.")
@click.option("--port", default=8050, show_default=True, type=click.IntRange(0, 65535), help="Port to listen on.")
@click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
              help="A name or address clients use to reach the server, besides localhost/127.0.0.1/[::1]; "
                   "repeatable; required with --host 0.0.0.0. Requests with any other Host header get 421.")
@click.option("--debug", is_flag=True, help="Dash debug mode (reloader off, dev tools on).")
@analysis_options
@rule_options
def serve_command(traces: tuple[str, ...], host: str, port: int, allowed_hosts: tuple[str, ...], debug: bool, **shared) -> None:
    """Serve the interactive report: overview, phases, timeline, kernels, roofline, KV budget, compare.

    ``--port 0`` serves on a free port, printed in the "serving on" line. Every route answers
    only requests whose Host header is localhost, 127.0.0.1, [::1], the bound address, or a
    name given with --allowed-host (DNS rebinding guard)."""
    from diagnose.app.hostcheck import ANY_ADDRESS, CONFIG_NAMES, CONFIG_PORT, allowed_names

    if host.strip() in ANY_ADDRESS and not allowed_hosts:
        click.echo(f"error: --host {host} binds every interface: give --allowed-host NAME (the name or address clients "
                   "use to reach this server; repeatable)", err=True)
        sys.exit(2)
    for t in traces:
        if not os.path.exists(t):
            click.echo(f"error: trace not found: {t}", err=True)
            sys.exit(2)
    port = _bindable_port(host, port)  # before the analysis: a busy port fails at once
    try:
        from diagnose.app.server import create_app
    except ImportError as e:  # dash is an optional extra
        click.echo(f"error: the app needs the [app] extra ({e.name or e}): " + install_hint('app'), err=True)
        sys.exit(2)
    from diagnose.engine import load_ruleset

    options, rule_opts, _ = split_options(shared)
    ruleset = guarded(load_ruleset)(rule_opts.rules_dir, rule_opts.rules_config, rule_opts.thresholds)
    app = guarded(create_app)(list(traces), options=options, ruleset=ruleset)
    names = allowed_names(host, allowed_hosts)
    if host not in ("127.0.0.1", "localhost", "::1"):
        click.echo(f"warning: serving on {host}: anyone who can reach this address sees the report", err=True)
    port = _bindable_port(host, port)  # again: the analysis may have taken minutes
    app.server.config[CONFIG_NAMES] = names
    app.server.config[CONFIG_PORT] = port
    click.echo(f"diagnose: serving {len(traces)} trace(s) on http://{host}:{port}/ (Ctrl-C to stop)", err=True)
    app.run(host=host, port=port, debug=debug, use_reloader=False)


def _bindable_port(host: str, port: int) -> int:
    """``port`` when it can be bound on ``host`` now (the way the server will bind it), or a
    free port chosen by the system when ``port`` is 0; else one ``error:`` line and exit 2
    (Dash would take 0 for its default 8050, and a busy port would end in werkzeug's own
    three-line message after "serving on" was printed)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as werkzeug chooses it
    try:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # werkzeug sets it too
            sock.bind((host, port))
            return sock.getsockname()[1]
    except OSError as e:
        if e.errno == errno.EADDRINUSE:
            click.echo(f"error: port {port} on {host} is already in use: choose another with --port (--port 0 picks a free one)", err=True)
        else:
            click.echo(f"error: cannot serve on {host}:{port} ({e.strerror or e})", err=True)
        sys.exit(2)
