"""Shared command-line plumbing: one error policy for every command.

Exit status: 2 for unusable input or arguments (one ``error: ...`` line on stderr, never a
traceback); 3 for an internal error (one line; ``DIAGNOSE_DEBUG=1`` re-raises it).
"""
from __future__ import annotations

import functools
import os
import sys

import click

from diagnose.errors import DiagnoseError


def guarded(fn):
    """Turn DiagnoseError into one stderr line + exit 2, anything unexpected into exit 3."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DiagnoseError as e:
            click.echo(f"error: {e}", err=True)
            sys.exit(2)
        except (click.exceptions.Exit, click.ClickException, SystemExit, KeyboardInterrupt):
            raise
        except MemoryError:
            click.echo("error: out of memory while analysing the trace (try --window or --device)", err=True)
            sys.exit(2)
        except Exception as e:  # noqa: BLE001 — the promise is: never a traceback
            if os.environ.get("DIAGNOSE_DEBUG"):
                raise
            msg = str(e).splitlines()[0][:300] if str(e) else ""
            click.echo(f"internal error: {type(e).__name__}: {msg} (set DIAGNOSE_DEBUG=1 for a traceback)", err=True)
            sys.exit(3)

    return wrapper
