"""``diagnose`` command line: a thin click group over library functions.

Exit status: 0 success; 1 a check failed (``gate``, ``compare``); 2 unusable input or
arguments (one line on stderr, never a traceback); 3 an internal error (one line; set
``DIAGNOSE_DEBUG=1`` to see the traceback).
"""
from __future__ import annotations

import importlib
import os
import sys
from contextlib import ExitStack

import click

from diagnose import __version__
from diagnose.cli_options import analysis_options, phase_regex_alias, rule_options, split_options
from diagnose.cliutil import OneLineGroup, guard_all, guarded
from diagnose.errors import DiagnoseError, install_hint


def _run_fleet(paths, trace_dir, executor, scheduler, fmt, out_path, options, ruleset) -> None:
    """Several traces (repeated --trace, --trace-dir, a tar archive of traces) as one fleet."""
    from diagnose.archive import archive_traces, is_archive
    from diagnose.multi import analyze_many, discover_with_skipped, relabel, sort_by_rank

    skipped: list[tuple[str, str]] = []
    if trace_dir:
        found, skipped = discover_with_skipped(trace_dir)
        paths = paths + found
    seen: set[str] = set()
    unique = []
    for p in paths:
        key = os.path.realpath(p)
        if key in seen:
            click.echo(f"note: {p} given more than once: analysed once", err=True)
            continue
        seen.add(key)
        unique.append(p)
    if scheduler and executor == "auto":
        executor = "dask"
    with ExitStack() as stack:  # archives are read from private temporary copies, removed on exit
        paths, labels = [], {}
        for p in unique:
            if not is_archive(p):
                paths.append(p)
                continue
            arch = stack.enter_context(archive_traces(p))
            paths += sort_by_rank(arch.paths)  # in rank order, as --trace-dir
            labels.update({q: arch.label(q) for q in arch.paths})
            skipped += [(f"{p}:{name}", why) for name, why in arch.skipped]
        if scheduler and labels:
            raise DiagnoseError("a tar archive is read on this machine: unpack it where the Dask workers can read it "
                                "and give --trace-dir")
        result = analyze_many(paths, options=options, executor=executor, scheduler=scheduler, lenient=options.lenient,
                              ruleset=ruleset, skipped=skipped)
        relabel(result, labels)
    _emit_fleet(result, fmt, out_path)


def _emit_fleet(result: dict, fmt: str, out_path: str | None) -> None:
    """Print a fleet result (several ranks); exit 2 when a rank could not be analysed (the
    others are still reported), as for any unusable input."""
    from diagnose.report.fleet import render_fleet
    from diagnose.report.jsonout import to_json
    from diagnose.textsafe import safe

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
    errors = result.get("errors") or []
    for e in errors:
        msg, path = str(e.get("error")), str(e.get("path"))
        where = "" if msg.startswith(path) else path + (f" [{e['label']}]" if e.get("label") else "") + ": "
        click.echo(safe(f"error: {where}{msg}"), err=True)
    if not result.get("ranks"):
        raise DiagnoseError("no trace could be analysed")
    if errors:
        raise SystemExit(2)


class _Main(OneLineGroup):
    """The top-level group: commands other than ``run`` are imported when first used, so that
    ``diagnose run`` starts reading the trace without paying for their imports, and
    ``diagnose --help`` lists them from :data:`SUMMARIES` without importing any (their modules
    pull in pandas and the analyzers: ~0.7 s)."""

    # name -> (module, attribute, wrap with guarded())
    LAZY = {
        "bounds": ("diagnose.bounds_cli", "bounds_command", True),
        "kv-budget": ("diagnose.bounds_cli", "kv_budget_command", True),
        "collect": ("diagnose.collectors.collect_cli", "collect_group", True),
        "gate": ("diagnose.rules_cli", "gate_command", True),
        "compare": ("diagnose.rules_cli", "compare_command", True),
        "sweep": ("diagnose.rules_cli", "sweep_command", True),
        "rules": ("diagnose.rules_cli", "rules_group", True),
        "serve": ("diagnose.app.serve_cli", "serve_command", True),
        "whatif": ("diagnose.whatif_cli", "whatif_command", True),
    }
    #: The first paragraph of each lazy command's help, shown by ``diagnose --help`` (kept equal
    #: to the commands' own help by tests/test_startup.py).
    SUMMARIES = {
        "bounds": "Analytic lower bounds for decode steps and prefill passes of a model on a GPU.",
        "kv-budget": "KV-cache bytes per token and per batch, and how many sequences fit.",
        "collect": "Capture profiler traces of prefill and decode steps.",
        "gate": "CI gate: check a trace against thresholds; exit 0 pass, 1 fail, 2 unusable input.",
        "compare": "Compare a candidate trace with a baseline: TTFT/TPOT deltas, per-category and per-kernel time "
                   "deltas, and the regression verdict.",
        "sweep": "Context / batch / GPU-count / prompt-length sweep over several traces (S1, S4, prefill MFU).",
        "rules": "Symptom rules: list them, run their fixtures, generate their reference.",
        "serve": "Serve the interactive report: overview, phases, timeline, kernels, roofline, KV budget, compare.",
        "whatif": "Predicted step times if some time went away: each step's critical path re-timed with the "
                  "given causes removed and kernel categories sped up (p50 per phase, and per step), and the "
                  "predicted saving of every finding with a stake (what the report ranks by).",
    }
    _listing = False

    def list_commands(self, ctx):
        return sorted(set(super().list_commands(ctx)) | set(self.LAZY))

    def format_commands(self, ctx, formatter):
        self._listing = True  # the listing needs each command's summary only: import none
        try:
            super().format_commands(ctx, formatter)
        finally:
            self._listing = False

    def get_command(self, ctx, name):
        if name in self.LAZY and name not in self.commands:
            if self._listing:
                return click.Command(name, help=self.SUMMARIES[name])
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
              help="Kineto JSON (.json/.json.gz) or nsys SQLite (.sqlite) trace; repeat for several ranks. A tar "
                   "archive of traces (.tar.gz, .tgz, .tar) is read as one trace per rank, like --trace-dir.")
@click.option("--trace-dir", default=None, metavar="DIR",
              help="A directory with one trace per rank (analysed in parallel); files left out are listed.")
@click.option("--executor", type=click.Choice(["auto", "serial", "process", "dask"]), default="auto", show_default=True,
              help="How several traces are analysed: local processes by default, or a Dask cluster.")
@click.option("--scheduler", default=None, metavar="ADDRESS",
              help="Dask distributed scheduler address (e.g. tcp://host:8786) for fleets that outgrow one machine.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="Terminal report or the JSON report contract (README 'JSON report').")
@click.option("--phase", "phase_alias", multiple=True, metavar="PHASE=REGEX",
              help="Alias of --phase-regex (the '=' tells it from `gate --phase NAME`); repeatable.")
@click.option("--out", "out_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the JSON report to this file.")
@click.option("--html", "html_path", type=click.Path(dir_okay=False), default=None,
              help="Also write the report as one self-contained HTML file (opens offline).")
@click.option("--layers", "show_layers", is_flag=True,
              help="Print the whole layer x op-class table (the coverage line and a layer summary are always printed).")
@click.option("--full", is_flag=True,
              help="Terminal report: every table whole (by default the report fits 50 lines of the terminal's width, "
                   "100 columns when output is not a terminal; COLUMNS sets it).")
@analysis_options
@rule_options
@guarded
def run_command(trace_paths: tuple[str, ...], trace_dir: str | None, executor: str, scheduler: str | None, fmt: str,
                phase_alias: tuple[str, ...], out_path: str | None, html_path: str | None, show_layers: bool = False,
                full: bool = False,
                **shared) -> None:
    """Analyse a trace and print the report; with several traces (--trace repeated or
    --trace-dir), analyse them in parallel and print one row per rank with stragglers marked.

    Attainment (MFU, MBU, bound ratio) needs the device's peaks (resolved from the trace's
    device name, or --gpu / --peak-tflops / --bandwidth-tbps) and, for bytes, the model config
    (from trace metadata written by `diagnose collect`, or --model-config).
    """
    import gc

    threshold = gc.get_threshold()
    gc.set_threshold(_GC_YOUNG_OBJECTS, *threshold[1:])
    try:
        with ExitStack() as stack:  # what _run sets for the command's duration
            _run(trace_paths, trace_dir, executor, scheduler, fmt, phase_alias, out_path, html_path, show_layers, full,
                 shared, stack)
    finally:
        _restore_gc_threshold(threshold)


def _restore_gc_threshold(threshold: tuple[int, ...]) -> None:
    """Set ``threshold`` back without a collection of everything `run` left young: up to
    :data:`_GC_YOUNG_OBJECTS` containers (the report's, the frames'), which the next allocation
    under CPython's 700 would walk at once (25 ms after a 255 MB trace, once the output is
    written). ``gc.freeze()`` then ``gc.unfreeze()`` moves them to the oldest generation
    unvisited (CPython: two list splices, the young count reset); their cycles of garbage are
    collected with that generation's next collection. Not when something already froze
    objects (``gc.get_freeze_count()``): unfreezing would hand them back to the collector."""
    import gc

    if gc.get_freeze_count() == 0:
        gc.freeze()
        gc.unfreeze()
    gc.set_threshold(*threshold)


#: Container objects allocated between two collections of the youngest generation during
#: `run` (CPython's default is 700). A large trace's load and analysis allocate millions
#: (the decoded events' lists, pandas' frames and indexes) that live until the report, and a
#: collection visits what its young containers hold (a list of 444,000 numbers is one young
#: object): at 700, 170 collections took 0.04-0.1 s of a 255 MB trace's run; at 20,000, six
#: took 0.024-0.04 s; at 200,000, none on that trace (benchmarks/README.md). Cycles of
#: garbage wait longer for their collection: 936 objects were left at the end of that run.
_GC_YOUNG_OBJECTS = 200_000


def _run(trace_paths: tuple[str, ...], trace_dir: str | None, executor: str, scheduler: str | None, fmt: str,
         phase_alias: tuple[str, ...], out_path: str | None, html_path: str | None, show_layers: bool, full: bool,
         shared: dict, stack: ExitStack) -> None:
    from diagnose.archive import is_archive

    archives = any(is_archive(p) for p in trace_paths)
    if len(trace_paths) == 1 and not trace_dir and not scheduler and not archives:
        from diagnose.trace.memory import freed_memory_reused
        from diagnose.trace.reading import Prefetch, sniff

        # one trace, in this process: the memory of the document, freed once decoded, is
        # what the analysis allocates next (no page faults)
        stack.enter_context(freed_memory_reused())

        try:  # read and gunzip while the analysis modules import (errors surface in the load)
            prefetch = Prefetch(trace_paths[0]) if sniff(trace_paths[0]) == "kineto" else None
        except DiagnoseError:
            prefetch = None
        if prefetch is not None:  # a large file: its forked workers decode while pandas and the analyzers import
            from diagnose.trace.kineto import start_prefetched  # numpy, msgspec: no pandas

            start_prefetched(prefetch)
    else:
        prefetch = None
    from diagnose.engine import load_ruleset
    from diagnose.pipeline import diagnose_trace

    options, rule_opts, _ = split_options(shared, phase_regex_alias(phase_alias))
    ruleset = load_ruleset(rule_opts.rules_dir, rule_opts.rules_config, rule_opts.thresholds)
    if not trace_paths and not trace_dir:
        raise DiagnoseError("give --trace FILE (repeatable) or --trace-dir DIR")
    if trace_dir or len(trace_paths) > 1 or scheduler or archives:
        if html_path:
            raise DiagnoseError("--html applies to a single --trace" + (" (a tar archive holds one trace per rank)" if archives else ""))
        _run_fleet(list(trace_paths), trace_dir, executor, scheduler, fmt, out_path, options, ruleset)
        return
    trace_path = trace_paths[0]
    analysis = diagnose_trace(trace_path, options, ruleset, show_progress=True, prefetch=prefetch)
    if getattr(analysis.trace, "ranks", None):
        # several ranks merged into one file (SGLang ProfileMerger): report rank by rank, as --trace-dir does
        from diagnose.multi import analyze_merged

        if html_path:
            raise DiagnoseError(f"{trace_path} holds {len(analysis.trace.ranks)} merged ranks: --html applies to one rank "
                                "(split the file, or drop --html for the per-rank report)")
        _emit_fleet(analyze_merged(trace_path, options, ruleset), fmt, out_path)
        return
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

        render(analysis, full=full, layers=show_layers)
        if html_path:
            click.echo(f"HTML report: {html_path}")


def _register() -> None:
    guard_all(main)


_register()


def entry() -> None:
    """The ``diagnose`` console script: :func:`main`, then, once the command has finished and
    its output is flushed, the exit handlers run and the process ends without freeing every
    object one by one (``os._exit``). After a large trace that teardown is 0.1-0.2 s of a
    4 s run on a 2-core machine (the trace's frames, the analysis), spent after the last
    line is printed; mypy ends the same way. A command that raised, a non-integer exit, a
    flush that fails (a closed pipe) or threads still running end the normal way."""
    import threading

    try:
        main()
        code: object = 0
    except SystemExit as e:
        code = e.code
    if code is None:
        code = 0
    if not isinstance(code, int) or threading.active_count() > 1:
        raise SystemExit(code)
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except (OSError, ValueError):
        raise SystemExit(code) from None
    import atexit

    run_exit_handlers = getattr(atexit, "_run_exitfuncs", None)
    if run_exit_handlers is None:  # another interpreter: the normal way
        raise SystemExit(code)
    run_exit_handlers()
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(code)


if __name__ == "__main__":  # pragma: no cover
    entry()
