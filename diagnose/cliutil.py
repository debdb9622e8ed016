"""Shared command-line plumbing: one error policy for every command.

Exit status: 2 for unusable input or arguments (one ``error: ...`` line on stderr, never a
traceback); 3 for an internal error (one line; ``DIAGNOSE_DEBUG=1`` re-raises it); 130 when
interrupted (Ctrl-C: one ``interrupted`` line).
"""
from __future__ import annotations

import functools
import os
import sys

import click

from diagnose.errors import DiagnoseError, install_hint
from diagnose.textsafe import safe


# optional dependency -> the extra that installs it
_EXTRAS = {"torch": "collect", "transformers": "collect", "dash": "app", "plotly": "app", "dash_ag_grid": "app",
           "dask": "dask", "distributed": "dask", "hta": "hta"}


def guarded(fn):
    """Turn DiagnoseError, OS errors (unwritable output, ...) and missing optional extras into
    one stderr line + exit 2; anything unexpected into one line + exit 3."""
    if getattr(fn, "_diagnose_guarded", False):
        return fn

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except DiagnoseError as e:
            click.echo(safe(f"error: {e}"), err=True)
            sys.exit(2)
        except (click.exceptions.Exit, click.ClickException, SystemExit, KeyboardInterrupt):
            raise
        except ModuleNotFoundError as e:
            top = (e.name or "").split(".")[0]
            if top in _EXTRAS:
                extra = _EXTRAS[top]
                click.echo(f"error: this needs the optional '{top}' package: {install_hint(extra)}", err=True)
                sys.exit(2)
            _internal(e)  # a module of diagnose itself, or a required dependency: a broken install
        except OSError as e:
            where = f"{e.filename}: " if getattr(e, "filename", None) else ""
            click.echo(safe(f"error: {where}{e.strerror or e}"), err=True)
            sys.exit(2)
        except MemoryError:
            click.echo("error: out of memory while analysing the trace (try --window or --device)", err=True)
            sys.exit(2)
        except Exception as e:  # noqa: BLE001 — the promise is: never a traceback
            _internal(e)

    wrapper._diagnose_guarded = True  # type: ignore[attr-defined]
    return wrapper


def _internal(e: BaseException) -> None:
    """One ``internal error`` line and exit 3 (the traceback with DIAGNOSE_DEBUG=1)."""
    if os.environ.get("DIAGNOSE_DEBUG"):
        raise e
    msg = str(e).splitlines()[0][:300] if str(e) else ""
    click.echo(safe(f"internal error: {type(e).__name__}: {msg} (set DIAGNOSE_DEBUG=1 for a traceback)"), err=True)
    sys.exit(3)


class _PandasWithoutArrow:
    """A ``sys.meta_path`` finder that reports pyarrow absent while pandas itself is being
    imported, so a command's ``import pandas`` does not load pyarrow and ``pyarrow.compute``.

    pandas 3 imports both eagerly when pyarrow is installed (``adbc-driver-sqlite``, the nsys
    reader, requires it): about 0.15-0.2 s of the 0.5-0.9 s ``import pandas`` takes on a 2-core
    machine (``python -X importtime``; ``benchmarks/bench_startup.py``), most of a small trace's
    run. diagnose's analyses use numpy-backed columns and give the same reports either way (the
    library, imported next to a pandas that loaded pyarrow, runs the same code); pandas' own
    ``str`` columns use its Python storage then. Once pandas is imported, pyarrow imports
    normally (the nsys reader reads Arrow tables through it). Installed by the command line's
    entry point only: a program that imports diagnose as a library keeps its pandas as it is.
    """

    @staticmethod
    def find_spec(name, path=None, target=None):
        if name == "pyarrow":
            pd = sys.modules.get("pandas")
            if pd is not None and getattr(getattr(pd, "__spec__", None), "_initializing", False):
                raise ModuleNotFoundError("pyarrow is not loaded while pandas imports (diagnose's command line)",
                                          name="pyarrow")
        return None


def import_pandas_lean() -> None:
    """Install :class:`_PandasWithoutArrow` before pandas or pyarrow is imported (idempotent;
    nothing to do once either is)."""
    if "pandas" in sys.modules or "pyarrow" in sys.modules:
        return
    if not any(f is _PandasWithoutArrow for f in sys.meta_path):
        sys.meta_path.insert(0, _PandasWithoutArrow)  # type: ignore[arg-type]


class OneLineGroup(click.Group):
    """A click group whose usage errors (unknown option, bad value, missing argument) print one
    ``error: ...`` line and exit 2, instead of click's usage banner."""

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        import_pandas_lean()
        try:
            rv = super().main(args, prog_name, complete_var, standalone_mode=False, **extra)
        except click.UsageError as e:
            path = e.ctx.command_path if e.ctx is not None else "diagnose"
            msg = " ".join(e.format_message().split())
            click.echo(safe(f"error: {msg} (see '{path} --help')"), err=True)
            sys.exit(2)
        except click.ClickException as e:
            click.echo(f"error: {' '.join(e.format_message().split())}", err=True)
            sys.exit(e.exit_code)
        except click.exceptions.Abort as e:
            if isinstance(e.__context__, KeyboardInterrupt):  # Ctrl-C: the shell convention, 128 + SIGINT
                click.echo("interrupted", err=True)
                sys.exit(130)
            click.echo("aborted", err=True)
            sys.exit(1)
        except KeyboardInterrupt:  # raised outside click's own handling (e.g. while it parses)
            click.echo("interrupted", err=True)
            sys.exit(130)
        sys.exit(rv if isinstance(rv, int) else 0)


def guard_all(command: click.Command) -> None:
    """Wrap the callback of ``command`` and of every command below it with :func:`guarded`."""
    if command.callback is not None:
        command.callback = guarded(command.callback)
    if isinstance(command, click.Group):
        for cmd in command.commands.values():
            guard_all(cmd)
