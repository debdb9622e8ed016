"""Click commands over the rule engine: ``gate``, ``compare``, ``sweep`` and ``rules``.

Exported for the main group to register: :data:`gate_command`, :data:`compare_command`,
:data:`sweep_command`, :data:`rules_group`.

Exit status (as for every ``diagnose`` command): 0 pass; 1 a check failed (gate failed,
compare found a regression, ``rules test`` had a failing fixture, sweep ``--fail-on`` hit);
2 unusable input or arguments (missing file, not a trace, bad ``--threshold``, invalid rule
file: one ``error: ...`` line on stderr); 3 an internal error (one line; ``DIAGNOSE_DEBUG=1``
shows the traceback).

Gate decisions:

* A checked phase with no data (no activity or no steps of that phase) prints
  ``<phase>: no data`` and **fails** (exit 1) unless ``--allow-missing``: a gate that passes
  when it measured nothing would pass silently. Exit 2 stays reserved for input that cannot be
  read at all.
* A trace whose numbers are flagged unreliable (report ``partial`` true, or quality codes
  ``partial_trace`` / ``graph_coverage_low``) fails unless ``--allow-partial``.
* ``--max-launch-gap-share`` defaults to the ``S3-launch-gaps`` rule threshold (after
  ``--rules-config`` / ``--threshold`` overrides) and, when given, also overrides that rule's
  threshold, so the gate and the rule never disagree.
* Symptom rules (trace scope, plus metrics scope with ``--metrics``) only fail the gate with
  ``--fail-on SEVERITY`` (fired symptoms at or above it); otherwise they are printed.
* Numbers a phase lists as ``unreliable`` (e.g. idle/launch-gap shares under low graph
  coverage) are not used unless ``--allow-partial``; a checked metric that is unreliable fails.
* ``--phase`` selects the phases to check; extra step-marker regexes (``diagnose run --phase
  PHASE=REGEX``) are ``--phase-regex`` here.
"""
from __future__ import annotations

import json
import sys
import xml.etree.ElementTree as ET
from typing import Any

import click

from diagnose.cliutil import guarded
from diagnose.errors import DiagnoseError
from diagnose.rules_engine import (
    SEVERITIES,
    SEVERITY_RANK,
    UNRELIABLE_CODES,
    RuleError,
    Verdicts,
    apply_overrides,
    compare_findings,
    evaluate,
    findings_from_report,
    load_metrics,
    load_rules,
    load_rules_config,
    parse_label,
    parse_threshold_specs,
    rules_markdown,
    run_fixtures,
    sweep_findings,
    sweep_points,
    unreliable_findings,
)

GATE_PHASES = ("all", "prefill", "decode", "mixed")
LAUNCH_RULE = "S3-launch-gaps"
LAUNCH_THRESHOLD = "max_launch_gap_share"


def _analyse(path: str, phase_regex: tuple[str, ...] = ()) -> dict[str, Any]:
    from diagnose.pipeline import run_analysis

    return run_analysis(path, phase_regex=phase_regex).to_dict()


def _rules_setup(rules_dir: str | None, rules_config: str | None, specs: tuple[str, ...],
                 extra: dict[str, float] | None = None):
    """(rules minus disabled ones, overrides). Precedence: config < ``extra`` < --threshold."""
    rules = load_rules(rules_dir)
    overrides: dict[str, float] = {}
    disabled: tuple[str, ...] = ()
    if rules_config:
        cfg = load_rules_config(rules_config)
        overrides.update(cfg.overrides)
        disabled = cfg.disable
        unknown = [d for d in disabled if d not in {r.id for r in rules}]
        if unknown:
            raise RuleError(f"{rules_config}: disable names unknown rule(s): {', '.join(unknown)}")
    overrides.update(extra or {})
    overrides.update(parse_threshold_specs(specs))
    apply_overrides(rules, overrides)  # validate names now: exit 2 on a typo
    rules = [r for r in rules if r.id not in disabled]
    overrides = {k: v for k, v in overrides.items() if k.rpartition(".")[0] not in disabled}
    return rules, overrides


def _fmt(v: Any, kind: str = "num") -> str:
    if v is None:
        return "—"
    if kind == "pct":
        return f"{100 * v:.1f} %"
    if kind == "ms":
        return f"{v:.3f}"
    if isinstance(v, float):
        return f"{v:.4g}"
    return str(v)


def _print_verdicts(v: Verdicts, title: str, show_passed: bool = False) -> None:
    click.echo(f"{title}: {len(v.symptoms)} fired, {len(v.passed)} passed, {len(v.not_evaluated)} not evaluated")
    for s in v.symptoms:
        click.echo(f"  [{s['severity']}] {s['id']} ({s['symptom']}): {s['summary']}")
        click.echo(f"      fix: {s['fix']}")
    if show_passed:
        for s in v.passed:
            click.echo(f"  [pass] {s['id']}: {_measured(s)}")
    for n in v.not_evaluated:
        click.echo(f"  [not evaluated] {n['id']}: {n['reason']}")


def _measured(entry: dict) -> str:
    f = entry["evidence"]["findings"]
    t = entry["evidence"]["thresholds"]
    a = ", ".join(f"{k}={_fmt(x)}" for k, x in f.items() if x is not None)
    b = ", ".join(f"{k}={_fmt(x['value'])}" for k, x in t.items())
    return f"{a}" + (f" (thresholds: {b})" if b else "")


def _severity_choice():
    return click.Choice(list(SEVERITIES), case_sensitive=False)


# --------------------------------------------------------------------------------------
# gate
# --------------------------------------------------------------------------------------


def _unreliable_reasons(report: dict) -> list[str]:
    out = []
    if report.get("partial"):
        out.append("partial trace file")
    codes = {q.get("code") for q in report.get("quality") or []}
    out += [f"quality: {c}" for c in UNRELIABLE_CODES if c in codes]
    return out


def _write_junit(path: str, checks: list[dict], error: str | None = None) -> None:
    suite = ET.Element("testsuite", name="diagnose gate")
    n = fail = skip = err = 0
    if error is not None:
        n, err = 1, 1
        tc = ET.SubElement(suite, "testcase", classname="diagnose.gate", name="input")
        ET.SubElement(tc, "error", message=error).text = error
    for c in checks:
        n += 1
        tc = ET.SubElement(suite, "testcase", classname=c["classname"], name=c["name"])
        if c["status"] == "fail":
            fail += 1
            ET.SubElement(tc, "failure", message=c["message"]).text = c["message"]
        elif c["status"] == "skipped":
            skip += 1
            ET.SubElement(tc, "skipped", message=c["message"])
        else:
            ET.SubElement(tc, "system-out").text = c["message"]
    suite.set("tests", str(n))
    suite.set("failures", str(fail))
    suite.set("errors", str(err))
    suite.set("skipped", str(skip))
    root = ET.Element("testsuites")
    root.append(suite)
    ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)


@click.command("gate")
@click.option("--trace", "trace_path", required=True, metavar="FILE", help="Kineto JSON or nsys SQLite trace.")
@click.option("--phase", "phases", multiple=True, type=click.Choice(GATE_PHASES), default=("decode",), show_default=True,
              help="Phase(s) to check; repeatable.")
@click.option("--max-launch-gap-share", type=click.FloatRange(0, 1), default=None, metavar="FRACTION",
              help="Fail when a checked phase's launch-gap share exceeds this (default: the S3-launch-gaps threshold, 0.15).")
@click.option("--max-idle-share", type=click.FloatRange(0, 1), default=None, metavar="FRACTION",
              help="Also fail when a checked phase's GPU idle share exceeds this.")
@click.option("--fail-on", type=_severity_choice(), default=None,
              help="Also fail on any fired symptom rule at or above this severity.")
@click.option("--allow-partial", is_flag=True, help="Do not fail on a trace flagged partial / unreliable.")
@click.option("--allow-missing", is_flag=True, help="Do not fail when a checked phase has no data (report it as skipped).")
@click.option("--junit", "junit_path", type=click.Path(dir_okay=False), default=None, help="Write a JUnit XML report here.")
@click.option("--threshold", "threshold_specs", multiple=True, metavar="RULE.NAME=VALUE", help="Override a rule threshold; repeatable.")
@click.option("--rules-config", type=click.Path(dir_okay=False), default=None, help="YAML: thresholds (RULE.NAME: value) and disable (ids).")
@click.option("--rules", "rules_dir", type=click.Path(), default=None, help="Rules directory (default: the packaged rules).")
@click.option("--metrics", "metrics_path", type=click.Path(dir_okay=False), default=None, help="Metrics JSON for metrics-scope rules (S6...).")
@click.option("--device", type=int, default=None, help="GPU device id (default: the one with the most GPU busy time).")
@click.option("--phase-regex", multiple=True, metavar="PHASE=REGEX", help="Extra step-marker regex (as `diagnose run --phase`).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@guarded
def gate_command(trace_path, phases, max_launch_gap_share, max_idle_share, fail_on, allow_partial, allow_missing,
                 junit_path, threshold_specs, rules_config, rules_dir, metrics_path, device, phase_regex, fmt):
    """CI gate: check a trace against thresholds; exit 0 pass, 1 fail, 2 unusable input."""
    try:
        code = _gate(trace_path, phases, max_launch_gap_share, max_idle_share, fail_on, allow_partial, allow_missing,
                     junit_path, threshold_specs, rules_config, rules_dir, metrics_path, device, phase_regex, fmt)
    except DiagnoseError as e:
        if junit_path:
            try:
                _write_junit(junit_path, [], error=str(e))
            except OSError:
                pass
        raise
    sys.exit(code)


def _gate(trace_path, phases, max_launch_gap_share, max_idle_share, fail_on, allow_partial, allow_missing,
          junit_path, threshold_specs, rules_config, rules_dir, metrics_path, device, phase_regex, fmt) -> int:
    extra = {f"{LAUNCH_RULE}.{LAUNCH_THRESHOLD}": max_launch_gap_share} if max_launch_gap_share is not None else None
    rules, overrides = _rules_setup(rules_dir, rules_config, threshold_specs, extra)
    if max_launch_gap_share is None:
        eff = {r.id: r for r in apply_overrides(rules, overrides)}
        lr = eff.get(LAUNCH_RULE)
        max_launch_gap_share = lr.thresholds[LAUNCH_THRESHOLD].value if lr and LAUNCH_THRESHOLD in lr.thresholds else 0.15
    metrics = load_metrics(metrics_path) if metrics_path else {}
    report = _analyse(trace_path, tuple(phase_regex))
    # Numbers a phase marks unreliable count only when the user accepted them (--allow-partial).
    unreliable = unreliable_findings(report, device)
    findings = findings_from_report(report, device, include_unreliable=allow_partial)
    findings.update(metrics)

    checks: list[dict] = []
    reasons = _unreliable_reasons(report)
    if reasons:
        status = "pass" if allow_partial else "fail"
        msg = "numbers unreliable: " + ", ".join(reasons) + (" (allowed by --allow-partial)" if allow_partial else " (use --allow-partial to accept)")
    else:
        status, msg = "pass", "trace complete, no reliability flags"
    checks.append({"classname": "diagnose.gate.trace", "name": "reliability", "phase": "trace", "metric": "reliability",
                   "status": status, "message": msg, "value": None, "threshold": None})

    limits = [("launch_gap_share", max_launch_gap_share)]
    if max_idle_share is not None:
        limits.append(("gpu_idle_share", max_idle_share))
    seen = []
    for ph in phases:
        if ph in seen:
            continue
        seen.append(ph)
        window = findings.get(f"{ph}.window_ms")
        steps = findings.get(f"{ph}.steps")
        for metric, limit in limits:
            val = findings.get(f"{ph}.{metric}")
            base = {"classname": f"diagnose.gate.{ph}", "name": metric, "phase": ph, "metric": metric, "value": val, "threshold": limit}
            if val is None and f"{ph}.{metric}" in unreliable:
                checks.append({**base, "status": "fail",
                               "message": f"{ph} {metric}: unreliable in this trace (see quality; use --allow-partial to accept)"})
            elif val is None:
                st = "skipped" if allow_missing else "fail"
                checks.append({**base, "status": st,
                               "message": f"{ph}: no data" + (" (allowed by --allow-missing)" if allow_missing else " (use --allow-missing to accept)")})
            elif val > limit:
                checks.append({**base, "status": "fail",
                               "message": f"{ph} {metric} {_fmt(val, 'pct')} > {_fmt(limit, 'pct')} (window {_fmt(window, 'ms')} ms, {steps} steps)"})
            else:
                checks.append({**base, "status": "pass",
                               "message": f"{ph} {metric} {_fmt(val, 'pct')} <= {_fmt(limit, 'pct')} (window {_fmt(window, 'ms')} ms, {steps} steps)"})

    scopes = ["trace"] + (["metrics"] if metrics_path else [])
    verdicts = evaluate(rules, findings, scope=scopes, overrides=overrides, unreliable=() if allow_partial else unreliable)
    failing_ids = {s["id"] for s in verdicts.at_least(fail_on)} if fail_on else set()
    for s in verdicts.symptoms:
        st = "fail" if s["id"] in failing_ids else "pass"
        note = "" if st == "fail" else " (fired below --fail-on)" if fail_on else " (fired; not gating without --fail-on)"
        checks.append({"classname": "diagnose.rules", "name": s["id"], "phase": s["phase"], "metric": s["id"], "status": st,
                       "message": f"[{s['severity']}] {s['summary']}{note}", "value": None, "threshold": None})
    for s in verdicts.passed:
        checks.append({"classname": "diagnose.rules", "name": s["id"], "phase": s["phase"], "metric": s["id"], "status": "pass",
                       "message": "not fired: " + _measured(s), "value": None, "threshold": None})
    for n in verdicts.not_evaluated:
        checks.append({"classname": "diagnose.rules", "name": n["id"], "phase": "", "metric": n["id"], "status": "skipped",
                       "message": "not evaluated: " + n["reason"], "value": None, "threshold": None})

    failed = [c for c in checks if c["status"] == "fail"]
    code = 1 if failed else 0
    if junit_path:
        try:
            _write_junit(junit_path, checks)
        except OSError as e:
            raise DiagnoseError(f"cannot write JUnit report {junit_path}: {e.strerror or type(e).__name__}") from None

    if fmt == "json":
        click.echo(json.dumps({
            "result": "fail" if failed else "pass",
            "exit_code": code,
            "source": report.get("source"),
            "device": findings.get("trace.device"),
            "checks": [{k: c[k] for k in ("phase", "metric", "status", "value", "threshold", "message")} for c in checks
                       if c["classname"] != "diagnose.rules"],
            "symptoms": verdicts.symptoms,
            "not_evaluated": verdicts.not_evaluated,
            "fail_on": fail_on,
        }, indent=2, default=str))
        return code

    src = report.get("source") or {}
    click.echo(f"gate: {src.get('path', trace_path)} ({src.get('format', '?')}), device {_fmt(findings.get('trace.device'))}")
    for c in checks:
        if c["classname"] == "diagnose.rules":
            continue
        tag = {"pass": "PASS", "fail": "FAIL", "skipped": "SKIP"}[c["status"]]
        click.echo(f"  {tag:<5} {c['message']}")
    _print_verdicts(verdicts, "rules (trace scope" + (", metrics" if metrics_path else "") + ")")
    if fail_on:
        click.echo(f"fail-on: {fail_on} -> {len(failing_ids)} symptom(s) at or above it")
    if failed:
        click.echo("result: FAIL (" + "; ".join(c["message"] for c in failed[:3]) + (" ..." if len(failed) > 3 else "") + ")")
    else:
        click.echo("result: PASS")
    return code


# --------------------------------------------------------------------------------------
# compare
# --------------------------------------------------------------------------------------

_COMPARE_ROWS = [
    ("TTFT proxy (ms)", "latency.ttft_ms", "ms", "delta.ttft_ratio"),
    ("TTFT p50 (ms)", "latency.ttft_p50_ms", "ms", "delta.ttft_p50_ratio"),
    ("TTFT p90 (ms)", "latency.ttft_p90_ms", "ms", "delta.ttft_p90_ratio"),
    ("TTFT p99 (ms)", "latency.ttft_p99_ms", "ms", "delta.ttft_p99_ratio"),
    ("TPOT p50 (ms)", "latency.tpot_p50_ms", "ms", "delta.tpot_p50_ratio"),
    ("TPOT p90 (ms)", "latency.tpot_p90_ms", "ms", "delta.tpot_p90_ratio"),
    ("TPOT p99 (ms)", "latency.tpot_p99_ms", "ms", "delta.tpot_p99_ratio"),
    ("decode step p50 (ms)", "latency.decode_step_p50_ms", "ms", "delta.decode_step_p50_ratio"),
    ("decode launch-gap share", "decode.launch_gap_share", "pct", "delta.decode_launch_gap_share_change"),
    ("GPU idle share", "all.gpu_idle_share", "pct", "delta.all_gpu_idle_share_change"),
    ("decode MBU", "decode.mbu", "pct", "delta.decode_mbu_change"),
    ("decode MFU", "decode.mfu", "pct", "delta.decode_mfu_change"),
    ("prefill MFU", "prefill.mfu", "pct", "delta.prefill_mfu_change"),
]


def _change_text(kind: str, v: float | None) -> str:
    if v is None:
        return "—"
    if kind == "ms":
        return f"x{v:.3f} ({100 * (v - 1):+.1f} %)"
    return f"{100 * v:+.1f} pp"


@click.command("compare")
@click.option("--baseline", "baseline_path", required=True, metavar="FILE", help="Baseline trace.")
@click.option("--candidate", "candidate_path", required=True, metavar="FILE", help="Candidate trace.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--fail-on", type=_severity_choice(), default="high", show_default=True,
              help="Exit 1 when a compare/metrics symptom at or above this severity fires (the regression rule is high).")
@click.option("--threshold", "threshold_specs", multiple=True, metavar="RULE.NAME=VALUE", help="Override a rule threshold; repeatable.")
@click.option("--rules-config", type=click.Path(dir_okay=False), default=None, help="YAML: thresholds and disable.")
@click.option("--rules", "rules_dir", type=click.Path(), default=None, help="Rules directory (default: the packaged rules).")
@click.option("--metrics", "metrics_path", type=click.Path(dir_okay=False), default=None,
              help='Metrics JSON, e.g. {"perplexity_baseline": 5.1, "perplexity_candidate": 5.3} (rule S6).')
@click.option("--device", type=int, default=None, help="GPU device id in both traces (default: most GPU busy time).")
@click.option("--phase-regex", multiple=True, metavar="PHASE=REGEX", help="Extra step-marker regex (as `diagnose run --phase`).")
@click.option("--allow-missing", is_flag=True,
              help="Pass when the traces cannot be compared (no common TTFT/TPOT numbers); by default that fails.")
@guarded
def compare_command(baseline_path, candidate_path, fmt, fail_on, threshold_specs, rules_config, rules_dir, metrics_path,
                    device, phase_regex, allow_missing):
    """Compare a candidate trace with a baseline: TTFT/TPOT deltas and the regression verdict.

    Exit 1 when the candidate regressed (any TTFT/TPOT p50/p90/p99 more than 50 % worse, rule
    latency-regression) or when the regression rule cannot be evaluated (no TTFT/TPOT number
    common to both traces) unless --allow-missing; 0 otherwise; 2 on unusable input."""
    rules, overrides = _rules_setup(rules_dir, rules_config, threshold_specs)
    metrics = load_metrics(metrics_path) if metrics_path else {}
    base = _analyse(baseline_path, tuple(phase_regex))
    cand = _analyse(candidate_path, tuple(phase_regex))
    findings = compare_findings(base, cand, device)
    findings.update(metrics)
    scopes = ["compare"] + (["metrics"] if metrics_path else [])
    verdicts = evaluate(rules, findings, scope=scopes, overrides=overrides)
    fb = {k[len("baseline."):]: v for k, v in findings.items() if k.startswith("baseline.")}
    fc = {k[len("candidate."):]: v for k, v in findings.items() if k.startswith("candidate.")}
    tb = evaluate(rules, fb, scope="trace", overrides=overrides)
    tc = evaluate(rules, fc, scope="trace", overrides=overrides)
    new_symptoms = [s for s in tc.symptoms if s["id"] not in set(tb.fired_ids)]
    gone_symptoms = [s for s in tb.symptoms if s["id"] not in set(tc.fired_ids)]
    regression = any(s["id"] == "latency-regression" for s in verdicts.symptoms)
    failing = verdicts.at_least(fail_on)
    incomparable = next((n for n in verdicts.not_evaluated if n["id"] == "latency-regression"), None)
    code = 1 if failing or (incomparable is not None and not allow_missing) else 0
    warnings = [f"{label}: numbers unreliable ({', '.join(r)})" for label, rep in (("baseline", base), ("candidate", cand))
                if (r := _unreliable_reasons(rep))]

    if fmt == "json":
        click.echo(json.dumps({
            "schema_version": 1,
            "baseline": {"source": base.get("source"), "partial": base.get("partial")},
            "candidate": {"source": cand.get("source"), "partial": cand.get("partial")},
            "metrics": [{"name": label, "finding": key, "baseline": fb.get(key), "candidate": fc.get(key),
                         ("ratio" if kind == "ms" else "change"): findings.get(dkey)}
                        for label, key, kind, dkey in _COMPARE_ROWS],
            "deltas": {k: v for k, v in findings.items() if k.startswith("delta.")},
            "symptoms": verdicts.symptoms,
            "not_evaluated": verdicts.not_evaluated,
            "new_trace_symptoms": [s["id"] for s in new_symptoms],
            "resolved_trace_symptoms": [s["id"] for s in gone_symptoms],
            "regression": regression,
            "comparable": incomparable is None,
            "warnings": warnings,
            "exit_code": code,
        }, indent=2, default=str))
        sys.exit(code)

    click.echo(f"baseline:  {(base.get('source') or {}).get('path', baseline_path)}")
    click.echo(f"candidate: {(cand.get('source') or {}).get('path', candidate_path)}")
    for w in warnings:
        click.echo(f"warning: {w}")
    w0 = max(len(r[0]) for r in _COMPARE_ROWS)
    click.echo(f"{'metric':<{w0}}  {'baseline':>12}  {'candidate':>12}  change")
    for label, key, kind, dkey in _COMPARE_ROWS:
        b, c = fb.get(key), fc.get(key)
        if b is None and c is None:
            continue
        click.echo(f"{label:<{w0}}  {_fmt(b, kind):>12}  {_fmt(c, kind):>12}  {_change_text(kind, findings.get(dkey))}")
    _print_verdicts(verdicts, "rules (compare scope" + (", metrics" if metrics_path else "") + ")")
    if new_symptoms:
        click.echo("new in candidate: " + ", ".join(f"{s['id']} [{s['severity']}]" for s in new_symptoms))
    if gone_symptoms:
        click.echo("resolved in candidate: " + ", ".join(s["id"] for s in gone_symptoms))
    if regression:
        click.echo("verdict: REGRESSION — roll back (a TTFT/TPOT percentile is more than the allowed share worse than baseline)")
    elif failing:
        click.echo("verdict: FAIL — " + ", ".join(s["id"] for s in failing))
    elif incomparable is not None:
        why = incomparable.get("reason") or ", ".join(incomparable.get("missing", []))
        click.echo(f"verdict: {'CANNOT COMPARE' if not allow_missing else 'not compared (--allow-missing)'} — {why}")
    else:
        click.echo("verdict: no regression")
    sys.exit(code)


# --------------------------------------------------------------------------------------
# sweep
# --------------------------------------------------------------------------------------


@click.command("sweep")
@click.option("--trace", "trace_paths", multiple=True, required=True, metavar="FILE", help="One trace per sweep point; repeat.")
@click.option("--label", "labels", multiple=True, metavar="KEY=VALUE[,KEY=VALUE]",
              help="One per --trace, in order: ctx=, bs=, gpus=, prompt=, name= (default: read from step markers).")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@click.option("--fail-on", type=_severity_choice(), default=None, help="Exit 1 when a sweep symptom at or above this fires.")
@click.option("--threshold", "threshold_specs", multiple=True, metavar="RULE.NAME=VALUE", help="Override a rule threshold; repeatable.")
@click.option("--rules-config", type=click.Path(dir_okay=False), default=None, help="YAML: thresholds and disable.")
@click.option("--rules", "rules_dir", type=click.Path(), default=None, help="Rules directory (default: the packaged rules).")
@click.option("--device", type=int, default=None, help="GPU device id in every trace (default: most GPU busy time).")
@click.option("--phase-regex", multiple=True, metavar="PHASE=REGEX", help="Extra step-marker regex (as `diagnose run --phase`).")
@guarded
def sweep_command(trace_paths, labels, fmt, fail_on, threshold_specs, rules_config, rules_dir, device, phase_regex):
    """Context / batch / GPU-count / prompt-length sweep over several traces (S1, S4, prefill MFU).

    Batch and context come from the decode step markers (median) unless --label gives them;
    the GPU count is the number of devices with activity unless --label gpus=N. Exit 0 unless
    --fail-on is given and a sweep symptom at or above it fires."""
    if len(trace_paths) < 2:
        raise DiagnoseError("a sweep needs at least two --trace files")
    if labels and len(labels) != len(trace_paths):
        raise DiagnoseError(f"{len(labels)} --label for {len(trace_paths)} --trace: give one label per trace, in order, or none")
    parsed = [parse_label(x) for x in labels] if labels else None
    rules, overrides = _rules_setup(rules_dir, rules_config, threshold_specs)
    reports = [_analyse(p, tuple(phase_regex)) for p in trace_paths]
    points = sweep_points(reports, parsed, device)
    findings = sweep_findings(points)
    verdicts = evaluate(rules, findings, scope="sweep", overrides=overrides)
    code = 1 if fail_on and verdicts.at_least(fail_on) else 0
    if fmt == "json":
        click.echo(json.dumps({"schema_version": 1, "points": points, "findings": findings, "symptoms": verdicts.symptoms,
                               "not_evaluated": verdicts.not_evaluated, "exit_code": code}, indent=2, default=str))
        sys.exit(code)
    cols = [("point", "name", "s"), ("ctx", "ctx", "n"), ("batch", "batch", "n"), ("GPUs", "gpus", "n"),
            ("prompt", "prompt", "n"), ("TPOT p50 ms", "tpot_ms", "ms"), ("tok/s", "throughput_tok_s", "n"),
            ("prefill MFU", "prefill_mfu", "pct")]
    rows = [[str(p[k]) if kind == "s" else _fmt(p[k], "ms" if kind == "ms" else "pct" if kind == "pct" else "num")
             for _, k, kind in cols] for p in points]
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, (h, _, _) in enumerate(cols)]
    click.echo("  ".join(h.ljust(w) if i == 0 else h.rjust(w) for i, ((h, _, _), w) in enumerate(zip(cols, widths))))
    for r in rows:
        click.echo("  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths))))
    known = {k: v for k, v in findings.items() if v is not None}
    if known:
        click.echo("findings: " + ", ".join(f"{k}={_fmt(v)}" for k, v in known.items()))
    _print_verdicts(verdicts, "rules (sweep scope)")
    sys.exit(code)


# --------------------------------------------------------------------------------------
# rules list / test / doc
# --------------------------------------------------------------------------------------


@click.group("rules")
def rules_group():
    """Symptom rules: list them, run their fixtures, generate their reference."""


@rules_group.command("list")
@click.option("--rules", "rules_dir", type=click.Path(), default=None, help="Rules directory (default: the packaged rules).")
@click.option("--scope", type=click.Choice(["trace", "sweep", "compare", "metrics"]), default=None, help="Only this scope.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True)
@guarded
def rules_list(rules_dir, scope, fmt):
    """List rules: id, symptom, severity, scope, thresholds."""
    rules = [r for r in load_rules(rules_dir) if scope is None or r.scope == scope]
    if fmt == "json":
        click.echo(json.dumps([{"id": r.id, "symptom": r.symptom, "title": r.title, "severity": r.severity, "phase": r.phase,
                                "scope": r.scope, "requires": list(r.requires), "condition": r.condition,
                                "thresholds": {k: {"value": t.value, "unit": t.unit} for k, t in r.thresholds.items()}}
                               for r in rules], indent=2))
        return
    w = max((len(r.id) for r in rules), default=2)
    for r in rules:
        th = ", ".join(f"{k}={t.value:g}" for k, t in r.thresholds.items())
        click.echo(f"{r.id:<{w}}  {r.symptom:<26} {r.severity:<8} {r.scope:<8} {r.title}" + (f"  [{th}]" if th else ""))


@rules_group.command("test")
@click.option("--rules", "rules_dir", type=click.Path(), default=None, help="Rules directory (fixtures in its fixtures/).")
@click.option("-v", "--verbose", is_flag=True, help="Print every case, not only failures.")
@guarded
def rules_test(rules_dir, verbose):
    """Validate every rule file against its schema, run its positive and negative fixtures;
    exit 1 if any fails."""
    rules = load_rules(rules_dir, validate=True)
    if not rules:
        raise DiagnoseError(f"no rule files found in {rules_dir or 'the packaged rules'}")
    results = run_fixtures(rules, rules_dir)
    bad = [r for r in results if not r.ok]
    for r in results:
        if verbose or not r.ok:
            tag = "ok  " if r.ok else "FAIL"
            click.echo(f"{tag} {r.rule_id} :: {r.case}: expected {r.expect}, got {r.got}" + (f" — {r.detail}" if r.detail and not r.ok else ""))
    n_rules = len({r.rule_id for r in results})
    click.echo(f"{len(results) - len(bad)}/{len(results)} fixture cases passed ({n_rules} rules)")
    sys.exit(1 if bad else 0)


@rules_group.command("doc")
@click.option("--rules", "rules_dir", type=click.Path(), default=None, help="Rules directory (default: the packaged rules).")
@guarded
def rules_doc(rules_dir):
    """Print the rules reference in Markdown (`diagnose rules doc > docs/rules.md`)."""
    click.echo(rules_markdown(load_rules(rules_dir)), nl=False)


__all__ = ["gate_command", "compare_command", "sweep_command", "rules_group", "SEVERITY_RANK"]
