"""The CI gate as a library operation: check one report against launch-gap / idle limits and
the symptom rules, and say pass or fail (``diagnose gate`` prints and exits with it).

Decisions:

* A checked phase with no data (no activity or no steps of that phase) **fails** unless
  ``allow_missing``: a gate that passes when it measured nothing would pass silently.
* A trace whose numbers are flagged unreliable (report ``partial``, or a quality code that
  makes numbers unreliable, see :data:`diagnose.vocab.UNRELIABLE_CODES`) fails unless
  ``allow_partial``.
* ``max_launch_gap_share`` defaults to the ``S3-launch-gaps`` rule threshold (after the rule
  set's overrides) and, when given, also overrides that rule's threshold (the caller passes it
  as an ``extra`` override to :func:`diagnose.engine.load_ruleset`), so the gate and the rule
  never disagree.
* Symptom rules fail the gate only with ``fail_on`` (fired symptoms at or above it).
* Numbers a phase lists as ``unreliable`` are not used unless ``allow_partial``; a checked
  metric that is unreliable fails.
* Every device is checked (the limits and the rules, each on the device's own numbers), as
  ``diagnose run`` reads every device; ``device`` restricts the gate to one.
"""
from __future__ import annotations

import xml.etree.ElementTree as ET
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from diagnose.compare import unreliable_reasons
from diagnose.engine import RuleSet, Verdicts
from diagnose.errors import DiagnoseError
from diagnose.inputs import finite_number
from diagnose.findings import Findings, as_report, unreliable_findings
from diagnose.model import Report
from diagnose.report import fmt
from diagnose.vocab import UNREPRESENTATIVE_TRACE_TYPES

GATE_PHASES = ("all", "prefill", "decode", "mixed")
LAUNCH_RULE = "S3-launch-gaps"
LAUNCH_THRESHOLD = "max_launch_gap_share"
DEFAULT_MAX_LAUNCH_GAP_SHARE = 0.15


@dataclass(frozen=True)
class GateResult:
    """Checks (dicts: classname, name, phase, metric, status pass|fail|skipped, message, value,
    threshold), the rule verdicts, and the exit code (0 pass, 1 fail)."""

    checks: list[dict[str, Any]]
    verdicts: Verdicts
    findings: Findings
    failing_rule_ids: frozenset[str]
    exit_code: int

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [c for c in self.checks if c["status"] == "fail"]


def launch_limit(ruleset: RuleSet) -> float:
    """The S3-launch-gaps threshold after the rule set's overrides (0.15 when the rule is off)."""
    r = ruleset.effective().get(LAUNCH_RULE)
    if r is not None and LAUNCH_THRESHOLD in r.thresholds:
        return float(r.thresholds[LAUNCH_THRESHOLD].value)
    return DEFAULT_MAX_LAUNCH_GAP_SHARE


def gate_report(report: Report | Mapping[str, Any], ruleset: RuleSet, phases: Sequence[str] = ("decode",),
                max_launch_gap_share: float | None = None, max_idle_share: float | None = None,
                fail_on: str | None = None, allow_partial: bool = False, allow_missing: bool = False,
                metrics: Findings | None = None, device: int | None = None) -> GateResult:
    """Gate one JSON report (see the module docstring for the decisions): the limits and the
    trace-scope rules on every device (only ``device`` when given; checks name their device
    when there are several), the findings of the device with the first fired symptom (else of
    the first device) in ``findings``.

    Raises:
        DiagnoseError: ``device`` is not in the report, or a limit is not a finite number.
    """
    from diagnose.pipeline import evaluate_devices

    report = as_report(report)
    limit = launch_limit(ruleset) if max_launch_gap_share is None else max_launch_gap_share
    # NaN compares false with everything: a NaN limit would pass any measurement
    finite_number(limit, "max_launch_gap_share")
    if max_idle_share is not None:
        finite_number(max_idle_share, "max_idle_share")
    scopes = ["trace"] + (["metrics"] if metrics else [])
    # every device's findings (with --allow-partial, its unreliable numbers too) and verdicts
    runs, verdicts = evaluate_devices(report, ruleset, device, scopes, extra=metrics, include_unreliable=allow_partial)
    checks: list[dict[str, Any]] = []
    reasons = unreliable_reasons(report)
    if reasons:
        status = "pass" if allow_partial else "fail"
        msg = "numbers unreliable: " + ", ".join(reasons) + (" (allowed by --allow-partial)" if allow_partial else " (use --allow-partial to accept)")
    else:
        status, msg = "pass", "trace complete, no reliability flags"
    checks.append({"classname": "diagnose.gate.trace", "name": "reliability", "phase": "trace", "metric": "reliability",
                   "status": status, "message": msg, "value": None, "threshold": None})
    limits = [("launch_gap_share", limit)]
    if max_idle_share is not None:
        limits.append(("gpu_idle_share", max_idle_share))
    several = len(runs) > 1
    for run in runs:
        unreliable = unreliable_findings(report, run.device)
        checks += _limit_checks(run.findings, phases, limits, unreliable, allow_missing,
                                f"device {run.device}: " if several else "", f" (device {run.device})" if several else "")
    failing = frozenset(s["id"] for s in verdicts.at_least(fail_on)) if fail_on else frozenset()
    def on(entry) -> str:  # the device a rule check is about, when the gate reads several
        return f" (device {entry['device']})" if several and entry.get("device") is not None else ""

    for s in verdicts.symptoms:
        st = "fail" if s["id"] in failing else "pass"
        note = "" if st == "fail" else " (fired below --fail-on)" if fail_on else " (fired; not gating without --fail-on)"
        checks.append({"classname": "diagnose.rules", "name": s["id"] + on(s), "phase": s["phase"], "metric": s["id"],
                       "status": st, "message": f"[{s['severity']}] {s['summary']}{note}", "value": None, "threshold": None})
    for s in verdicts.passed:
        checks.append({"classname": "diagnose.rules", "name": s["id"] + on(s), "phase": s["phase"], "metric": s["id"],
                       "status": "pass", "message": "not fired: " + measured_text(s), "value": None, "threshold": None})
    for n in verdicts.not_evaluated:
        checks.append({"classname": "diagnose.rules", "name": n["id"], "phase": "", "metric": n["id"], "status": "skipped",
                       "message": "not evaluated: " + n["reason"], "value": None, "threshold": None})
    failed = any(c["status"] == "fail" for c in checks)
    lead = verdicts.symptoms[0].get("device") if verdicts.symptoms else runs[0].device
    findings = next(r.findings for r in runs if r.device == lead)
    return GateResult(checks=checks, verdicts=verdicts, findings=findings, failing_rule_ids=failing, exit_code=1 if failed else 0)


def _limit_checks(findings: Findings, phases: Sequence[str], limits: list, unreliable: set[str], allow_missing: bool,
                  prefix: str = "", suffix: str = "") -> list[dict[str, Any]]:
    """The launch-gap / idle limit checks of one device's findings (``prefix``/``suffix`` name
    the device in the messages and check names when the gate reads several)."""
    checks = []
    for ph in dict.fromkeys(phases):
        window = findings.get(f"{ph}.window_ms")
        steps = findings.get(f"{ph}.steps")
        for metric, lim in limits:
            val = findings.get(f"{ph}.{metric}")
            base = {"classname": f"diagnose.gate.{ph}", "name": metric + suffix, "phase": ph, "metric": metric, "value": val,
                    "threshold": lim, "device": findings.get("trace.device")}
            where = f"(window {fmt.ms(window)} ms, {steps} steps)"
            if val is None and f"{ph}.{metric}" in unreliable:
                checks.append({**base, "status": "fail",
                               "message": f"{prefix}{ph} {metric}: unreliable in this trace (see quality; use --allow-partial to accept)"})
            elif val is None:
                checks.append({**base, "status": "skipped" if allow_missing else "fail",
                               "message": f"{prefix}{ph}: no data" + (" (allowed by --allow-missing)" if allow_missing else " (use --allow-missing to accept)")})
            elif val > lim:
                checks.append({**base, "status": "fail", "message": f"{prefix}{ph} {metric} {fmt.pct(val)} > {fmt.pct(lim)} {where}"})
            else:
                checks.append({**base, "status": "pass", "message": f"{prefix}{ph} {metric} {fmt.pct(val)} <= {fmt.pct(lim)} {where}"})
    return checks


#: Trace types the gate treats like a partial trace (fails unless ``allow_partial``).
GATING_TRACE_TYPES: tuple[str, ...] = UNREPRESENTATIVE_TRACE_TYPES


def measured_text(entry: Mapping[str, Any]) -> str:
    """``finding=value, ... (thresholds: name=value)`` of a verdict entry's evidence."""
    f = entry["evidence"]["findings"]
    t = entry["evidence"]["thresholds"]
    a = ", ".join(f"{k}={fmt.short(x)}" for k, x in f.items() if x is not None)
    b = ", ".join(f"{k}={fmt.short(x['value'])}" for k, x in t.items())
    return f"{a}" + (f" (thresholds: {b})" if b else "")


def write_junit(path: str, checks: Sequence[Mapping[str, Any]], error: str | None = None) -> None:
    """One JUnit testcase per check (and per rule: not evaluated = skipped).

    Raises:
        DiagnoseError: the file cannot be written.
    """
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
    try:
        ET.ElementTree(root).write(path, encoding="utf-8", xml_declaration=True)
    except OSError as e:
        raise DiagnoseError(f"cannot write JUnit report {path}: {e.strerror or type(e).__name__}") from None
