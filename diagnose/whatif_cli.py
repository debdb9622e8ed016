"""``diagnose whatif``: predicted step times if some time went away (a thin click command
over :mod:`diagnose.analyzers.whatif`).

Exit status as for every ``diagnose`` command: 0 success; 2 unusable input or arguments (an
unknown cause or category, a bad regex or factor: one ``error:`` line); 3 an internal error.
"""
from __future__ import annotations

import json

import click

from diagnose.cli_options import analysis_options, rule_options, split_options
from diagnose.cliutil import guarded
from diagnose.errors import DiagnoseError
from diagnose.textsafe import safe


@click.command("whatif")
@click.option("--trace", "trace_path", required=True, metavar="FILE", help="Kineto JSON (.json/.json.gz) or nsys SQLite trace.")
@click.option("--remove", "removes", multiple=True, metavar="CAUSE[:FRAME-REGEX]",
              help="Take away host time and waits of a cause of the cause table (launch, graph, host_blocked, "
                   "dependency, switch, cold_start, profiler_overhead, host_compute, first_call_setup, compile_guard, "
                   "data_loading, collective_wait; idle = every internal cause of idle time), optionally only under python frames, CPU ops or "
                   "ranges whose name matches the regex; repeatable.")
@click.option("--speedup", "speedups", multiple=True, metavar="CATEGORY=FACTOR",
              help="Run a kernel category (gemm, attention, norm, elementwise, communication, moe, sampling, memcpy, "
                   "memset, other) FACTOR times faster (inf: it takes no time); repeatable.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--steps", "max_steps", type=click.IntRange(min=0), default=20, show_default=True,
              help="Steps listed one by one in the text output.")
@analysis_options
@rule_options
@guarded
def whatif_command(trace_path: str, removes: tuple[str, ...], speedups: tuple[str, ...], fmt: str, max_steps: int,
                   **shared) -> None:
    """Predicted step times if some time went away: each step's critical path re-timed with
    the given causes removed and kernel categories sped up (p50 per phase, and per step), and
    the predicted saving of every finding with a stake (what the report ranks by).

    Example: diagnose whatif --trace t.json.gz --remove compile_guard --speedup gemm=2
    """
    from diagnose.analyzers.whatif import scenario, scenario_table
    from diagnose.engine import load_ruleset
    from diagnose.pipeline import diagnose_trace

    sc = scenario(removes, speedups)  # bad specs fail before the trace is read
    options, rule_opts, _ = split_options(shared)
    ruleset = load_ruleset(rule_opts.rules_dir, rule_opts.rules_config, rule_opts.thresholds)
    a = diagnose_trace(trace_path, options, ruleset)
    if getattr(a.trace, "ranks", None):
        raise DiagnoseError(f"{trace_path} holds {len(a.trace.ranks)} merged ranks: split the file and run whatif per rank")
    table = scenario_table(a.paths, a.steps, sc) if (removes or speedups) else None
    findings = [{"id": s.id, "severity": s.severity, "stake_ms": _v(s.stake_ms),
                 "predicted_saving_ms": _v(s.predicted_saving_ms), "rank_basis": _v(s.rank_basis)}
                for s in (a.report.symptoms or [])]
    if fmt == "json":
        click.echo(json.dumps({"trace": trace_path, "whatif": table, "findings": findings}, indent=1))
        return
    _text(trace_path, table, findings, max_steps)


def _v(x):
    import msgspec

    return None if x is msgspec.UNSET else x


def _text(path: str, table: dict | None, findings: list[dict], max_steps: int) -> None:
    echo = lambda s="": click.echo(safe(s))  # noqa: E731 - names from the trace: control characters escaped
    echo(f"diagnose whatif — {path}")
    if findings:
        echo("Findings ranked by predicted saving where the critical path exists, else by stake:")
        echo(f"  {'finding':28s} {'severity':9s} {'stake ms':>10s} {'saving ms':>10s}  ranked by")
        for f in findings:
            st = "—" if f["stake_ms"] is None else f"{f['stake_ms']:.3f}"
            sv = "—" if f["predicted_saving_ms"] is None else f"{f['predicted_saving_ms']:.3f}"
            echo(f"  {f['id'][:28]:28s} {f['severity']:9s} {st:>10s} {sv:>10s}  {f['rank_basis'] or '—'}")
    else:
        echo("No finding fired.")
    if table is None:
        echo("Give --remove CAUSE[:FRAME-REGEX] and/or --speedup CATEGORY=FACTOR for new step times.")
        return
    echo(f"Scenario: {table['scenario']}")
    if not table["steps"]:
        echo("No critical path to re-time (no GPU work).")
        return
    echo(f"  {'phase':8s} {'steps':>5s} {'path p50 ms':>12s} {'new p50 ms':>11s} {'saving p50':>11s} {'saving total ms':>16s}")
    for p in table["phases"]:
        echo(f"  {p['phase']:8s} {p['steps']:>5d} {p['path_p50_ms']:>12.3f} {p['new_p50_ms']:>11.3f} "
             f"{p['saving_p50_ms']:>11.3f} {p['saving_ms']:>16.3f}")
    rows = table["steps"]
    if max_steps and rows:
        echo(f"  {'step':40s} {'phase':8s} {'path ms':>10s} {'new ms':>10s} {'saving ms':>10s}")
        for r in rows[:max_steps]:
            echo(f"  {r['name'][:40]:40s} {r['phase']:8s} {r['path_ms']:>10.3f} {r['new_ms']:>10.3f} {r['saving_ms']:>10.3f}")
        if len(rows) > max_steps:
            echo(f"  ... {len(rows) - max_steps} more steps (--steps N, or --format json)")
