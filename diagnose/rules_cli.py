"""Click commands over the library's gate, compare, sweep and rule engine: ``gate``,
``compare``, ``sweep`` and ``rules``. Each parses options, calls one library function
(:func:`diagnose.gate.gate_report`, :func:`diagnose.compare.compare_reports`,
:func:`diagnose.sweep.sweep_findings`, :mod:`diagnose.engine`) and formats its result.

Exit status (as for every ``diagnose`` command): 0 pass; 1 a check failed (gate failed,
compare found a regression, ``rules test`` had a failing fixture, sweep ``--fail-on`` hit);
2 unusable input or arguments (missing file, not a trace, bad ``--threshold``, invalid rule
file: one ``error: ...`` line on stderr); 3 an internal error (one line; ``DIAGNOSE_DEBUG=1``
shows the traceback). ``gate --phase NAME`` selects the phase to check; step-marker regexes
are ``--phase-regex`` (shared by every command).
"""
from __future__ import annotations

import json
import sys
from typing import Any

import click

from diagnose.clitypes import FRACTION
from diagnose.cli_options import analysis_options, rule_options, split_options
from diagnose.cliutil import guarded
from diagnose.engine import RuleSet, Verdicts, evaluate, load_rules, load_ruleset
from diagnose.report.rules_doc import rules_markdown
from diagnose.engine.fixtures import run_fixtures
from diagnose.errors import DiagnoseError
from diagnose.findings import PAIR_SPEC_HELP, describe_pairs, load_metrics
from diagnose.gate import GATE_PHASES, LAUNCH_RULE, LAUNCH_THRESHOLD, gate_report, measured_text, write_junit
from diagnose.model import Report
from diagnose.options import AnalysisOptions, RuleOptions
from diagnose.report import fmt as numfmt
from diagnose.textsafe import safe
from diagnose.vocab import SCOPES, SEVERITIES


def analyse_report(path: str, options: AnalysisOptions, ruleset: RuleSet | None = None) -> Report:
    """The report of one trace with its findings and trace verdicts (``ruleset``: the
    command's rule options; each command evaluates its own other scopes)."""
    from diagnose.pipeline import diagnose_trace

    return diagnose_trace(path, options, ruleset).report


def ruleset_from(rule_opts: RuleOptions, extra: dict[str, float] | None = None) -> RuleSet:
    return load_ruleset(rule_opts.rules_dir, rule_opts.rules_config, rule_opts.thresholds, extra)


def _fmt(v: Any, kind: str = "num") -> str:
    return numfmt.pct(v) if kind == "pct" else numfmt.ms(v) if kind == "ms" else numfmt.short(v)


def _where(entry: dict) -> str:
    """" on device D" / " on devices B:C" of a verdict entry that carries its device(s)."""
    if entry.get("devices") is not None:
        return " on devices " + ":".join("-" if d is None else str(d) for d in entry["devices"])
    return f" on device {entry['device']}" if entry.get("device") is not None else ""


def _print_verdicts(v: Verdicts, title: str, devices: bool = False) -> None:
    _echo(f"{title}: {len(v.symptoms)} fired, {len(v.passed)} passed, {len(v.not_evaluated)} not evaluated")
    for s in v.symptoms:
        _echo(f"  [{s['severity']}] {s['id']} ({s['symptom']}){_where(s) if devices else ''}: {s['summary']}")
        _echo(f"      fix: {s['fix']}")
    for n in v.not_evaluated:
        _echo(f"  [not evaluated] {n['id']}: {n['reason']}")


def _echo(text: str = "") -> None:
    """One line of text output; names from the trace are shown with control characters escaped."""
    click.echo(safe(text))


def _print_table(headers: list[str], rows: list[list[str]], title: str | None = None) -> None:
    """A rich table on stdout: the first column left-aligned, the others right-aligned; trace
    names escaped (control characters shown, markup inert)."""
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    t = Table(title=title, title_justify="left", box=None, pad_edge=False, header_style="bold")
    for i, h in enumerate(headers):
        t.add_column(h, justify="left" if i == 0 else "right", overflow="fold")
    for r in rows:
        t.add_row(*(escape(safe(c)) for c in r))
    c = Console()
    (c if c.is_terminal else Console(width=200, color_system=None)).print(t)


def _severity_choice():
    return click.Choice(list(SEVERITIES), case_sensitive=False)


# --------------------------------------------------------------------------------------
# gate
# --------------------------------------------------------------------------------------


@click.command("gate")
@click.option("--trace", "trace_path", required=True, metavar="FILE", help="Kineto JSON or nsys SQLite trace.")
@click.option("--phase", "phases", multiple=True, type=click.Choice(GATE_PHASES), default=("decode",), show_default=True,
              help="Phase(s) to check; repeatable. (Step-marker regexes: --phase-regex.)")
@click.option("--max-launch-gap-share", type=FRACTION, default=None, metavar="FRACTION",
              help="Fail when a checked phase's launch-gap share exceeds this (default: the S3-launch-gaps threshold, 0.15).")
@click.option("--max-idle-share", type=FRACTION, default=None, metavar="FRACTION",
              help="Also fail when a checked phase's GPU idle share exceeds this.")
@click.option("--fail-on", type=_severity_choice(), default=None,
              help="Also fail on any fired symptom rule at or above this severity.")
@click.option("--allow-partial", is_flag=True, help="Do not fail on a trace flagged partial / unreliable / capture pass / fragment.")
@click.option("--allow-missing", is_flag=True, help="Do not fail when a checked phase has no data (report it as skipped).")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), default=None, help="Write a JUnit XML report here.")
@click.option("--metrics", "metrics_path", type=click.Path(dir_okay=False), default=None, help="Metrics JSON for metrics-scope rules (S6...).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@analysis_options(device_help="GPU device id to analyse and check (default: every device, each on its own numbers).")
@rule_options
@guarded
def gate_command(trace_path, phases, max_launch_gap_share, max_idle_share, fail_on, allow_partial, allow_missing,
                 junit_path, metrics_path, fmt, **shared):
    """CI gate: check a trace against thresholds; exit 0 pass, 1 fail, 2 unusable input."""
    try:
        code = _gate(trace_path, phases, max_launch_gap_share, max_idle_share, fail_on, allow_partial, allow_missing,
                     junit_path, metrics_path, fmt, shared)
    except DiagnoseError as e:
        if junit_path:
            try:
                write_junit(junit_path, [], error=str(e))
            except DiagnoseError:
                pass
        raise
    sys.exit(code)


def _gate(trace_path, phases, max_launch_gap_share, max_idle_share, fail_on, allow_partial, allow_missing,
          junit_path, metrics_path, fmt, shared) -> int:
    options, rule_opts, _ = split_options(shared)
    extra = {f"{LAUNCH_RULE}.{LAUNCH_THRESHOLD}": max_launch_gap_share} if max_launch_gap_share is not None else None
    ruleset = ruleset_from(rule_opts, extra)
    metrics = load_metrics(metrics_path) if metrics_path else None
    report = analyse_report(trace_path, options, ruleset)
    res = gate_report(report, ruleset, phases, max_launch_gap_share, max_idle_share, fail_on, allow_partial, allow_missing,
                      metrics, options.device)
    if junit_path:
        write_junit(junit_path, res.checks)
    gate_checks = [c for c in res.checks if c["classname"] != "diagnose.rules"]
    if fmt == "json":
        click.echo(json.dumps({
            "result": "fail" if res.exit_code else "pass",
            "exit_code": res.exit_code,
            "source": report.source.to_dict(),
            "device": res.findings.get("trace.device"),
            "devices": sorted({c["device"] for c in gate_checks if c.get("device") is not None}),
            "checks": [{k: c.get(k) for k in ("phase", "metric", "device", "status", "value", "threshold", "message")}
                       for c in gate_checks],
            "symptoms": res.verdicts.symptoms,
            "not_evaluated": res.verdicts.not_evaluated,
            "fail_on": fail_on,
        }, indent=2, default=str))
        return res.exit_code
    devs = sorted({c["device"] for c in gate_checks if c.get("device") is not None})
    _echo(f"gate: {report.source.path} ({report.source.format}), "
          + (f"devices {', '.join(map(str, devs))}" if len(devs) > 1 else f"device {_fmt(res.findings.get('trace.device'))}"))
    if report.gpu is not None:
        from diagnose.hardware import describe_peak

        _echo(f"peaks: {describe_peak(report.gpu.to_dict())}")
    for c in gate_checks:
        tag = {"pass": "PASS", "fail": "FAIL", "skipped": "SKIP"}[c["status"]]
        _echo(f"  {tag:<5} {c['message']}")
    _print_verdicts(res.verdicts, "rules (trace scope" + (", metrics" if metrics_path else "") + ")", len(devs) > 1)
    if fail_on:
        _echo(f"fail-on: {fail_on} -> {len(res.failing_rule_ids)} symptom(s) at or above it")
    failed = res.failed
    if failed:
        _echo("result: FAIL (" + "; ".join(c["message"] for c in failed[:3]) + (" ..." if len(failed) > 3 else "") + ")")
    else:
        _echo("result: PASS")
    return res.exit_code


# --------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------


def _change_text(kind: str, v: float | None) -> str:
    if v is None:
        return "—"
    if kind == "ms":  # no change as shown reads +0.0, never -0.0
        return f"x{v:.3f} ({(100 * (v - 1) if abs(v - 1) >= 0.0005 else 0.0):+.1f} %)"
    return numfmt.pp(v)


@click.command("compare")
@click.option("--baseline", "baseline_path", required=True, metavar="FILE", help="Baseline trace.")
@click.option("--candidate", "candidate_path", required=True, metavar="FILE", help="Candidate trace.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--fail-on", type=_severity_choice(), default="high", show_default=True,
              help="Exit 1 when a compare/metrics symptom at or above this severity fires (the regression rule is high).")
@click.option("--metrics", "metrics_path", type=click.Path(dir_okay=False), default=None,
              help='Metrics JSON, e.g. {"perplexity_baseline": 5.1, "perplexity_candidate": 5.3} (rule S6).')
@click.option("--allow-missing", is_flag=True,
              help="Pass when the traces cannot be compared (no common TTFT/TPOT numbers); by default that fails.")
@click.option("--allow-partial", is_flag=True,
              help="Compare even when a trace is flagged partial / unreliable / capture pass / fragment; by default that fails.")
@click.option("--pair-devices", "pair_spec", default=None, metavar=PAIR_SPEC_HELP,
              help="Which devices to compare when the traces hold different ones: baseline id ':' candidate id, "
                   "pairings separated by ',' (e.g. 0:1,1:0). Default: by id (0 with 0, 1 with 1), or the one "
                   "device of each file.")
@analysis_options(device_help="Compare only this GPU device id, in both traces (default: every device, paired by id).")
@rule_options
@guarded
def compare_command(baseline_path, candidate_path, fmt, fail_on, metrics_path, allow_missing, allow_partial, pair_spec,
                    **shared):
    """Compare a candidate trace with a baseline: TTFT/TPOT deltas, per-category and
    per-kernel time deltas, and the regression verdict.

    Devices are compared pair by pair, by id (device 0 with device 0...; a file of one device
    with the other's one device); the pairs are printed. Traces whose device sets differ are
    refused (exit 2) unless --pair-devices says which to pair or --device picks one.

    Exit 1 when the candidate regressed (any TTFT/TPOT p50/p90/p99 more than 50 % worse, rule
    latency-regression), when the regression rule cannot be evaluated (no TTFT/TPOT number
    common to both traces) unless --allow-missing, or when a trace is partial or otherwise
    unreliable (as for gate) unless --allow-partial; 0 otherwise; 2 on unusable input."""
    from diagnose.compare import compare_reports

    options, rule_opts, _ = split_options(shared)
    ruleset = ruleset_from(rule_opts)
    metrics = load_metrics(metrics_path) if metrics_path else None
    base = analyse_report(baseline_path, options, ruleset)
    cand = analyse_report(candidate_path, options, ruleset)
    rule_options_given = bool(rule_opts.thresholds or rule_opts.rules_dir or rule_opts.rules_config)
    cmp = compare_reports(base, cand, ruleset, metrics, options.device, fail_on, allow_missing, allow_partial,
                          reevaluate=rule_options_given, pair_spec=pair_spec)
    if fmt == "json":
        click.echo(json.dumps({
            "schema_version": 1,
            "baseline": {"source": base.source.to_dict(), "partial": base.partial},
            "candidate": {"source": cand.source.to_dict(), "partial": cand.partial},
            **cmp.to_dict(),
        }, indent=2, default=str))
        sys.exit(cmp.exit_code)
    _echo(f"baseline:  {base.source.path}")
    _echo(f"candidate: {cand.source.path}")
    _echo(describe_pairs(cmp.pairs, ["baseline", "candidate"]))
    several = len(cmp.pairs) > 1
    for w in cmp.warnings:
        _echo(f"warning: {w}")
    for u in cmp.unreliable:
        _echo(f"{'warning' if allow_partial else 'unreliable'}: {u}")
    def pair(d) -> list[str]:  # the devices column, when more than one pairing is compared
        devs = d.get("devices")
        return [":".join("-" if x is None else str(x) for x in devs) if devs else "trace"] if several else []

    _print_table(["metric"] + (["devices"] if several else []) + ["baseline", "candidate", "change"],
                 [[r["name"], *pair(r), _fmt(r["baseline"], r["kind"]), _fmt(r["candidate"], r["kind"]),
                   _change_text(r["kind"], r.get("ratio", r.get("change")))]
                  for r in cmp.rows if r["baseline"] is not None or r["candidate"] is not None])
    if cmp.category_deltas:
        _print_table(["phase"] + (["devices"] if several else []) + ["category", "baseline ms", "candidate ms", "ratio"],
                     [[d["phase"], *pair(d), d["category"], numfmt.ms(d["baseline_ms"]), numfmt.ms(d["candidate_ms"]),
                       numfmt.NA if d["ratio"] is None else f"x{d['ratio']:.2f}"] for d in cmp.category_deltas],
                     title="kernel time by category (ms, busy time on the device):")
    if cmp.kernel_deltas:
        _print_table(["phase"] + (["devices"] if several else []) + ["baseline ms", "candidate ms", "kernel"],
                     [[d["phase"], *pair(d), numfmt.ms(d["baseline_ms"]), numfmt.ms(d["candidate_ms"]), d["name"][:80]]
                      for d in cmp.kernel_deltas[:5]], title="kernels whose time changed most (ms):")
    _print_verdicts(cmp.verdicts, "rules (compare scope" + (", metrics" if metrics_path else "") + ")", several)
    if cmp.new_symptoms:
        _echo("new in candidate: " + ", ".join(f"{s['id']} [{s['severity']}]{_where(s)}" for s in cmp.new_symptoms))
    if cmp.resolved_symptoms:
        _echo("resolved in candidate: " + ", ".join(f"{s['id']}{_where(s)}" for s in cmp.resolved_symptoms))
    if cmp.verdict == "unreliable":
        _echo("verdict: UNRELIABLE — " + "; ".join(cmp.unreliable) + " (use --allow-partial to compare anyway)")
    elif cmp.regression:
        _echo("verdict: REGRESSION — roll back (a TTFT/TPOT percentile is more than the allowed share worse than baseline)")
    elif cmp.failing:
        _echo("verdict: FAIL — " + ", ".join(s["id"] for s in cmp.failing))
    elif not cmp.comparable:
        why = cmp.why_not_comparable
        _echo(f"verdict: {'CANNOT COMPARE' if not allow_missing else 'not compared (--allow-missing)'} — {why}")
    else:
        _echo("verdict: no regression")
    sys.exit(cmp.exit_code)


# --------------------------------------------------------------------------------------
# sweep
# --------------------------------------------------------------------------------------


@click.command("sweep")
@click.option("--trace", "trace_paths", multiple=True, required=True, metavar="FILE", help="One trace per sweep point; repeat.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE[,KEY=VALUE]",
              help="One per --trace, in order: ctx=, bs=, gpus=, prompt=, name= (default: read from step markers).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--fail-on", type=_severity_choice(), default=None, help="Exit 1 when a sweep symptom at or above this fires.")
@click.option("--pair-devices", "pair_spec", default=None, metavar="D:D[:D...][,...]",
              help="Which device of each trace to read together when the traces hold different devices: one id per "
                   "--trace joined by ':', pairings separated by ',' (e.g. 0:0:1). Default: by id, or the one device of "
                   "each file.")
@analysis_options(device_help="Read only this GPU device id, in every trace (default: every device, paired by id).")
@rule_options
@guarded
def sweep_command(trace_paths, labels, fmt, fail_on, pair_spec, **shared):
    """Context / batch / GPU-count / prompt-length sweep over several traces (S1, S4, prefill MFU).

    Batch and context come from the decode step markers (median) unless --label gives them;
    the GPU count is the number of devices with activity unless --label gpus=N. Devices are
    read together by id (every trace's device 0, then device 1...; the one device of each
    file-per-rank trace); the pairings are printed, and traces whose device sets differ are
    refused (exit 2) unless --pair-devices says which to read together. Exit 0 unless
    --fail-on is given and a sweep symptom at or above it fires."""
    from diagnose.sweep import parse_label, sweep_findings, sweep_points

    if len(trace_paths) < 2:
        raise DiagnoseError("a sweep needs at least two --trace files")
    if labels and len(labels) != len(trace_paths):
        raise DiagnoseError(f"{len(labels)} --label for {len(trace_paths)} --trace: give one label per trace, in order, or none")
    options, rule_opts, _ = split_options(shared)
    parsed = [parse_label(x) for x in labels] if labels else None
    ruleset = ruleset_from(rule_opts)
    reports = [analyse_report(p, options, ruleset) for p in trace_paths]
    from diagnose.compare import like_for_like_warnings
    from diagnose.findings import pair_devices

    names = [f"trace {i + 1}" for i in range(len(reports))]
    pairings = [tuple(options.device for _ in reports)] if options.device is not None else pair_devices(reports, names, pair_spec)
    runs = []
    for devs in pairings:
        points = sweep_points(reports, parsed, devices=list(devs))
        findings = sweep_findings(points)
        v = evaluate(ruleset.rules, findings, scope="sweep", overrides=ruleset.overrides)
        for e in v.symptoms + v.passed + v.not_evaluated:
            e["devices"] = list(devs)
        runs.append((list(devs), points, findings, v))
    devs, points, findings, verdicts = runs[0]
    seen = {(e["id"], e["summary"]) for e in verdicts.symptoms + verdicts.passed}
    for _, _, _, v in runs[1:]:  # a verdict that reads the same in several pairings (trace-level) once
        for bucket in ("symptoms", "passed"):
            for e in getattr(v, bucket):
                if (e["id"], e["summary"]) not in seen:
                    seen.add((e["id"], e["summary"]))
                    getattr(verdicts, bucket).append(e)
    warnings = like_for_like_warnings(reports, [str(p["name"]) for p in points], keys=("device", "model"), devices=devs)
    code = 1 if fail_on and verdicts.at_least(fail_on) else 0
    if fmt == "json":
        click.echo(json.dumps({"schema_version": 1, "pairs": [d for d, *_ in runs], "points": points, "findings": findings,
                               "pairings": [{"devices": d, "points": p, "findings": f} for d, p, f, _ in runs],
                               "symptoms": verdicts.symptoms, "not_evaluated": verdicts.not_evaluated,
                               "warnings": warnings, "exit_code": code}, indent=2, default=str))
        sys.exit(code)
    _echo(describe_pairs([tuple(d) for d, *_ in runs], names))
    for w in warnings:
        _echo(safe(f"warning: {w}"))
    cols = [("point", "name", "s"), ("ctx", "ctx", "n"), ("batch", "batch", "n"), ("GPUs", "gpus", "n"),
            ("prompt", "prompt", "n"), ("TPOT p50 ms", "tpot_ms", "ms"), ("tok/s", "throughput_tok_s", "n"),
            ("prefill MFU", "prefill_mfu", "pct")]
    for d, pts, f, _ in runs:
        rows = [[str(p[k]) if kind == "s" else _fmt(p[k], "ms" if kind == "ms" else "pct" if kind == "pct" else "num")
                 for _, k, kind in cols] for p in pts]
        _print_table([h for h, _, _ in cols], rows,
                     title=None if len(runs) == 1 else "devices " + ":".join("-" if x is None else str(x) for x in d))
        known = {k: v for k, v in f.items() if v is not None}
        if known:
            _echo("findings: " + ", ".join(f"{k}={_fmt(v)}" for k, v in known.items()))
    _print_verdicts(verdicts, "rules (sweep scope)", len(runs) > 1)
    sys.exit(code)


# --------------------------------------------------------------------------------------
# rules list / test / doc
# --------------------------------------------------------------------------------------


@click.group("rules")
def rules_group():
    """Symptom rules: list them, run their fixtures, generate their reference."""


@rules_group.command("list")
@click.option("--rules", "rules_dir", type=click.Path(), default=None, help="Rules directory (default: the packaged rules).")
@click.option("--scope", type=click.Choice(list(SCOPES)), default=None, help="Only this scope.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@guarded
def rules_list(rules_dir, scope, fmt):
    """List rules, one per line under a header: rule id, symptom, severity, scope, title,
    [thresholds]."""
    rules = [r for r in load_rules(rules_dir) if scope is None or r.scope == scope]
    if fmt == "json":
        click.echo(json.dumps([{"id": r.id, "symptom": r.symptom, "title": r.title, "severity": r.severity, "phase": r.phase,
                                "scope": r.scope, "requires": list(r.requires), "condition": r.condition,
                                "thresholds": {k: {"value": t.value, "unit": t.unit} for k, t in r.thresholds.items()}}
                               for r in rules], indent=2))
        return
    w = max([len(r.id) for r in rules] + [len("rule")])
    ws = max([len(r.symptom) for r in rules] + [len("symptom")])
    _echo(f"{'rule':<{w}}  {'symptom':<{ws}}  {'severity':<8} {'scope':<8} title  [thresholds]")
    for r in rules:
        th = ", ".join(f"{k}={t.value:g}" for k, t in r.thresholds.items())
        _echo(f"{r.id:<{w}}  {r.symptom:<{ws}}  {r.severity:<8} {r.scope:<8} {r.title}" + (f"  [{th}]" if th else ""))


@rules_group.command("test")
@click.option("--rules", "rules_dir", type=click.Path(), default=None, help="Rules directory (fixtures in its fixtures/).")
@click.option("-v", "--verbose", is_flag=True, help="Print every case, not only failures.")
@guarded
def rules_test(rules_dir, verbose):
    """Validate every rule file against its schema, run its positive and negative fixtures;
    exit 1 if any fails."""
    rules = load_rules(rules_dir, validate=True)
    results = run_fixtures(rules, rules_dir)
    bad = [r for r in results if not r.ok]
    for r in results:
        if verbose or not r.ok:
            tag = "ok  " if r.ok else "FAIL"
            _echo(f"{tag} {r.rule_id} :: {r.case}: expected {r.expect}, got {r.got}" + (f" — {r.detail}" if r.detail and not r.ok else ""))
    n_rules = len({r.rule_id for r in results})
    _echo(f"{len(results) - len(bad)}/{len(results)} fixture cases passed ({n_rules} rules)")
    sys.exit(1 if bad else 0)


@rules_group.command("doc")
@click.option("--rules", "rules_dir", type=click.Path(), default=None, help="Rules directory (default: the packaged rules).")
@guarded
def rules_doc(rules_dir):
    """Print the rules reference in Markdown (`diagnose rules doc > docs/rules.md`)."""
    click.echo(rules_markdown(load_rules(rules_dir)), nl=False)


__all__ = ["gate_command", "compare_command", "sweep_command", "rules_group", "measured_text"]
