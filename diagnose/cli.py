"""``diagnose`` command line: a thin click group over library functions.

Exit status: 0 success; 1 a check failed (``gate``, ``compare``); 2 unusable input or
arguments (one line on stderr, never a traceback); 3 an internal error (one line; set
``DIAGNOSE_DEBUG=1`` to see the traceback).
"""
from __future__ import annotations

import importlib
import os

import click

from diagnose import __version__
from diagnose.cliutil import OneLineGroup, guard_all, guarded
from diagnose.errors import DiagnoseError, install_hint


def attainment_options(fn):
    """Shared flags for commands that compute MFU/MBU/bound ratio."""
    opts = [
        click.option("--model-config", type=click.Path(dir_okay=False), default=None,
                     help="Hugging Face config.json of the model (else the trace's metadata)."),
        click.option("--gpu", default=None, help="GPU peak-table row, e.g. H100-SXM, A100-80GB-SXM, MI300X (see `diagnose bounds --help`)."),
        click.option("--peak-tflops", type=float, default=None, help="Override the dense FP16/BF16 peak, TFLOP/s."),
        click.option("--bandwidth-tbps", type=float, default=None, help="Override the memory bandwidth, TB/s."),
        click.option("--batch", type=click.IntRange(min=1), default=None, help="Sequences per step, when markers do not say."),
        click.option("--context", type=click.IntRange(min=1), default=None, help="KV context per sequence in decode steps."),
        click.option("--prompt-len", type=click.IntRange(min=1), default=None, help="Prompt tokens per sequence in prefill steps."),
        click.option("--weight-dtype", type=click.Choice(["fp32", "fp16", "bf16", "fp8", "int8", "int4"]), default=None,
                     help="Weight dtype for bytes (default: trace metadata, else bf16)."),
        click.option("--kv-dtype", type=click.Choice(["fp32", "fp16", "bf16", "fp8", "int8", "int4"]), default=None,
                     help="KV-cache dtype for bytes (default: the weight dtype when 16/32-bit, else bf16)."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def _run_fleet(paths, trace_dir, executor, scheduler, fmt, out_path, options, lenient) -> None:
    from diagnose.multi import analyze_many, discover, render_fleet
    from diagnose.report.jsonout import to_json

    if trace_dir:
        paths = paths + discover(trace_dir)
    seen: set[str] = set()
    unique = []
    for p in paths:
        key = os.path.realpath(p)
        if key in seen:
            click.echo(f"note: {p} given more than once: analysed once", err=True)
            continue
        seen.add(key)
        unique.append(p)
    paths = unique
    if scheduler and executor == "auto":
        executor = "dask"
    result = analyze_many(paths, options=options, executor=executor, scheduler=scheduler, lenient=lenient)
    if out_path or fmt == "json":
        text = to_json(result)
        if out_path:
            with open(out_path, "w") as f:
                f.write(text + "\n")
        if fmt == "json":
            click.echo(text)
    if fmt == "text":
        from rich.console import Console

        c = Console()
        render_fleet(result, c if c.is_terminal else Console(width=160))
    for e in result.get("errors", []):
        click.echo(f"error: {e.get('path')}: {e.get('error')}", err=True)
    if not result.get("ranks"):
        raise DiagnoseError("no trace could be analysed")


def attach_verdicts(analysis) -> None:
    """Evaluate the packaged symptom rules on ``analysis`` and keep the verdicts in its report."""
    from diagnose.rules_engine import add_verdicts_to_report

    report = add_verdicts_to_report(analysis.to_dict())
    analysis.extra["symptoms"] = report.get("symptoms", [])
    analysis.extra["not_evaluated"] = report.get("not_evaluated", [])


def make_options(phase_regex=(), **att):
    from diagnose.analyzers import Options

    return Options(phase_regex=tuple(phase_regex), **att)


class _Main(OneLineGroup):
    """The top-level group: commands other than ``run`` are imported when first used, so that
    ``diagnose run`` starts reading the trace without paying for their imports."""

    # name -> (module, attribute, wrap with guarded())
    LAZY = {
        "bounds": ("diagnose.bounds_cli", "bounds_command", False),
        "kv-budget": ("diagnose.bounds_cli", "kv_budget_command", False),
        "collect": ("diagnose.collectors.collect_cli", "collect_group", True),
        "gate": ("diagnose.rules_cli", "gate_command", True),
        "compare": ("diagnose.rules_cli", "compare_command", True),
        "sweep": ("diagnose.rules_cli", "sweep_command", True),
        "rules": ("diagnose.rules_cli", "rules_group", True),
        "serve": ("diagnose.app.serve_cli", "serve_command", True),
    }

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.LAZY))

    def get_command(self, ctx, name):
        if name in self.LAZY and name not in self.commands:
            module, attr, guard = self.LAZY[name]
            cmd = getattr(importlib.import_module(module), attr)
            if guard:
                guard_all(cmd)
            self.add_command(cmd, name)
        return super().get_command(ctx, name)


@click.group(cls=_Main, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="diagnose")
def main() -> None:
    """Why is my LLM inference slow? Analyse torch.profiler (Kineto JSON) and Nsight Systems
    (SQLite) traces: prefill vs decode, GPU idle and launch gaps, attention share, TTFT/TPOT."""


@main.command("run")
@click.option("--trace", "trace_paths", multiple=True, metavar="FILE",
              help="Kineto JSON (.json/.json.gz) or nsys SQLite (.sqlite) trace; repeat for several ranks.")
@click.option("--trace-dir", default=None, metavar="DIR", help="A directory with one trace per rank (analysed in parallel).")
@click.option("--executor", type=click.Choice(["auto", "serial", "process", "dask"]), default="auto", show_default=True,
              help="How several traces are analysed: local processes by default, or a Dask cluster.")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Dask distributed scheduler address (e.g. tcp://host:8786) for fleets that outgrow one machine.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Terminal report or the JSON report contract (README 'JSON report').")
@click.option("--phase", "phase_regex", multiple=True, metavar="PHASE=REGEX",
              help="Extra step-marker regex for a phase (prefill, decode, mixed); repeatable.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the JSON report to this file.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the report as one self-contained HTML file (opens offline).")
@click.option("--lenient", is_flag=True, help="Repair numbers written with a decimal comma (a locale bug) instead of refusing the file.")
@click.option("--window", default=None, metavar="START:END",
              help="Analyse only events starting in this window, ms from the trace start (e.g. 100:250, 500:).")
@click.option("--device", type=int, default=None, help="Analyse only this GPU device id.")
@attainment_options
@guarded
def run_command(trace_paths: tuple[str, ...], trace_dir: str | None, executor: str, scheduler: str | None, fmt: str,
                phase_regex: tuple[str, ...], out_path: str | None, html_path: str | None,
                lenient: bool, window: str | None, device: int | None, **att) -> None:
    """Analyse a trace and print the report; with several traces (--trace repeated or
    --trace-dir), analyse them in parallel and print one row per rank with stragglers marked.

    Attainment (MFU, MBU, bound ratio) needs the device's peaks (resolved from the trace's
    device name, or --gpu / --peak-tflops / --bandwidth-tbps) and, for bytes, the model config
    (from trace metadata written by `diagnose collect`, or --model-config).
    """
    if len(trace_paths) == 1 and not trace_dir and not scheduler:
        from diagnose.trace.reading import Prefetch, sniff

        try:  # read and gunzip while the analysis modules import (errors surface in the load)
            prefetch = Prefetch(trace_paths[0]) if sniff(trace_paths[0]) == "kineto" else None
        except DiagnoseError:
            prefetch = None
    else:
        prefetch = None
    from diagnose.pipeline import run_analysis

    if not trace_paths and not trace_dir:
        raise DiagnoseError("give --trace FILE (repeatable) or --trace-dir DIR")
    if trace_dir or len(trace_paths) > 1 or scheduler:
        if html_path or window or device is not None:
            raise DiagnoseError("--html, --window and --device apply to a single --trace")
        _run_fleet(list(trace_paths), trace_dir, executor, scheduler, fmt, out_path, make_options(phase_regex, **att), lenient)
        return
    trace_path = trace_paths[0]
    analysis = run_analysis(trace_path, options=make_options(phase_regex, **att), lenient=lenient, show_progress=True,
                            window=window, device=device, prefetch=prefetch)
    attach_verdicts(analysis)
    report = analysis.to_dict()
    if out_path or fmt == "json":
        from diagnose.report.jsonout import to_json

        text = to_json(report)
        if out_path:
            with open(out_path, "w") as f:
                f.write(text + "\n")
        if fmt == "json":
            click.echo(text)
    if html_path:
        try:
            from diagnose.app.html import write_html
        except ImportError:
            raise DiagnoseError("--html needs the web-report extra: " + install_hint("app")) from None
        write_html(analysis, html_path)
    if fmt == "text":
        from diagnose.report.terminal import render

        render(analysis)
        if html_path:
            click.echo(f"HTML report: {html_path}")


def _register() -> None:
    guard_all(main)


_register()

if __name__ == "__main__":  # pragma: no cover
    main()
