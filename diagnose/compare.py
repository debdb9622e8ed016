"""Compare a candidate trace with a baseline: ``baseline.*``, ``candidate.*`` and ``delta.*``
findings, the regression verdict of the compare-scope rules, and per-category and per-kernel
time deltas. ``diagnose compare`` and the web ``/compare`` page both call :func:`compare_reports`,
so they always give the same verdict for the same thresholds.

Devices are paired by id (:func:`diagnose.findings.pair_devices`): device 0 of the baseline
with device 0 of the candidate, 1 with 1...; a file of one device with the other's one
device; traces whose device sets differ are refused unless the caller says which to pair.
Latency (TTFT, TPOT) belongs to the trace; every per-device number is compared pair by pair.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from msgspec import UNSET

from diagnose.analyzers.base import declared
from diagnose.engine import RuleSet, Verdicts, evaluate
from diagnose.findings import Findings, as_report, device_rows, pair_devices, report_findings, select_device
from diagnose.model import Report
from diagnose.numeric import div

FINDINGS = declared("compare")


_DELTA_RATIOS = {
    "ttft_ratio": "latency.ttft_ms",
    "ttft_p50_ratio": "latency.ttft_p50_ms",
    "ttft_p90_ratio": "latency.ttft_p90_ms",
    "ttft_p99_ratio": "latency.ttft_p99_ms",
    "tpot_p50_ratio": "latency.tpot_p50_ms",
    "tpot_p90_ratio": "latency.tpot_p90_ms",
    "tpot_p99_ratio": "latency.tpot_p99_ms",
    "decode_step_p50_ratio": "latency.decode_step_p50_ms",
}
_DELTA_CHANGES = {
    "decode_launch_gap_share_change": "decode.launch_gap_share",
    "all_gpu_idle_share_change": "all.gpu_idle_share",
    "decode_mbu_change": "decode.mbu",
    "decode_mfu_change": "decode.mfu",
    "prefill_mfu_change": "prefill.mfu",
}


def compare_findings(baseline: Report | Mapping[str, Any], candidate: Report | Mapping[str, Any],
                     device: int | None = None, candidate_device: int | None = None) -> Findings:
    """``baseline.*``, ``candidate.*`` (every single-trace finding) and ``delta.*``, the
    baseline's numbers of ``device`` against the candidate's of ``candidate_device`` (default:
    the same id).

    Ratios are candidate / baseline (None when either is missing or the baseline is 0).
    ``delta.worst_latency_ratio`` is the largest of the TTFT and TPOT p50/p90/p99 ratios
    (the TTFT proxy ratio stands in when no prefill percentile exists): docs/prefill-decode.md §7
    "any of TTFT/TPOT p50/p90/p99 more than 50 % worse than baseline = roll back".
    """
    fb = report_findings(baseline, device)
    fc = report_findings(candidate, device if candidate_device is None else candidate_device)
    out: Findings = {}
    for k, v in fb.items():
        out[f"baseline.{k}"] = v
    for k, v in fc.items():
        out[f"candidate.{k}"] = v
    for name, src in _DELTA_RATIOS.items():
        out[f"delta.{name}"] = div(fc.get(src), fb.get(src))
    for name, src in _DELTA_CHANGES.items():
        a, b = fb.get(src), fc.get(src)
        out[f"delta.{name}"] = None if a is None or b is None else b - a
    keys = ["ttft_p50_ratio", "ttft_p90_ratio", "ttft_p99_ratio", "tpot_p50_ratio", "tpot_p90_ratio", "tpot_p99_ratio"]
    vals = [out[f"delta.{k}"] for k in keys if out[f"delta.{k}"] is not None]
    if out["delta.ttft_p50_ratio"] is None and out["delta.ttft_ratio"] is not None:
        vals.append(out["delta.ttft_ratio"])
    out["delta.worst_latency_ratio"] = max(vals) if vals else None
    return out


#: The rows ``compare`` shows: (label, finding, kind, delta finding). kind "ms" rows change as
#: a ratio, "pct" rows as percentage points.
COMPARE_ROWS = (
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
)

REGRESSION_RULE = "latency-regression"

#: Rows of :data:`COMPARE_ROWS` that belong to the trace (its steps), not to a device.
TRACE_ROW_PREFIX = "latency."


@dataclass(frozen=True)
class Comparison:
    """The result of :func:`compare_reports`.

    Attributes:
        findings: baseline.*, candidate.*, delta.* and metrics.* findings.
        verdicts: compare- (and metrics-) scope rule verdicts.
        rows: one dict per :data:`COMPARE_ROWS` row: name, finding, kind, baseline,
            candidate, ratio (ms rows) or change (pct rows).
        regression: the latency-regression rule fired.
        comparable: that rule could be evaluated (a TTFT/TPOT number in both traces).
        failing: fired symptoms at or above ``fail_on``.
        new_symptoms, resolved_symptoms: the trace-scope symptoms fired only in the candidate /
            only in the baseline (each report's own, or both re-evaluated with the same rules:
            see :func:`compare_reports`).
        category_deltas: per kernel category, per phase present in both: baseline_ms,
            candidate_ms, ratio.
        kernel_deltas: the kernels with the largest absolute time change (top kernels of
            each phase): name, category, phase, baseline_ms, candidate_ms, ratio.
        warnings: reasons the numbers may not compare like for like.
        pairs: the device pairings compared, (baseline device, candidate device) each
            (:func:`diagnose.findings.pair_devices`); device-level rows, deltas and symptoms
            carry theirs as ``devices``.
        exit_code: 1 on a failing symptom, when not comparable unless allowed, or when a report
            is unreliable unless allowed; else 0.
        unreliable: "baseline: ..." / "candidate: ..." for each report with unreliable or
            unrepresentative numbers (partial file, truncated, capture pass, fragment...).
        allow_partial: whether those were accepted (the verdict then ignores them).
    """

    findings: Findings
    verdicts: Verdicts
    rows: list[dict[str, Any]]
    regression: bool
    comparable: bool
    failing: list[dict[str, Any]]
    new_symptoms: list[dict[str, Any]]
    resolved_symptoms: list[dict[str, Any]]
    category_deltas: list[dict[str, Any]]
    kernel_deltas: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    exit_code: int = 0
    unreliable: list[str] = field(default_factory=list)
    allow_partial: bool = False
    pairs: list[tuple[int | None, int | None]] = field(default_factory=list)

    @property
    def verdict(self) -> str:
        """"unreliable" | "regression" | "fail" | "not comparable" | "no regression"."""
        if self.unreliable and not self.allow_partial:
            return "unreliable"
        if self.regression:
            return "regression"
        if self.failing:
            return "fail"
        if not self.comparable:
            return "not comparable"
        return "no regression"

    @property
    def why_not_comparable(self) -> str:
        """Why the traces' latencies cannot be compared, in plain words
        (:func:`latency_gap_reason`); empty when they can."""
        return "" if self.comparable else latency_gap_reason(self.findings)

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "pairs": [{"baseline": b, "candidate": c} for b, c in self.pairs],
            "metrics": self.rows,
            "deltas": {k: v for k, v in self.findings.items() if k.startswith("delta.")},
            "category_deltas": self.category_deltas,
            "kernel_deltas": self.kernel_deltas,
            "symptoms": self.verdicts.symptoms,
            "not_evaluated": self.verdicts.not_evaluated,
            "new_trace_symptoms": [s["id"] for s in self.new_symptoms],
            "resolved_trace_symptoms": [s["id"] for s in self.resolved_symptoms],
            "regression": self.regression,
            "comparable": self.comparable,
            "unreliable": self.unreliable,
            "warnings": self.warnings,
            "exit_code": self.exit_code,
        }


_TTFT_KEYS = ("latency.ttft_ms", "latency.ttft_p50_ms", "latency.ttft_p90_ms", "latency.ttft_p99_ms")
_TPOT_KEYS = ("latency.tpot_p50_ms", "latency.tpot_p90_ms", "latency.tpot_p99_ms")


def latency_gap_reason(findings: Mapping[str, Any]) -> str:
    """Why ``delta.worst_latency_ratio`` is missing, as a user reads it: which trace has no
    prefill step (no TTFT) or no decode steps (no TPOT: it needs two consecutive decode
    steps), e.g. "the baseline has no decode steps (no TPOT); the candidate has no prefill
    step (no TTFT): no TTFT or TPOT is measured in both traces". Empty when a ratio exists.

    ``findings``: :func:`compare_findings` (``baseline.*``, ``candidate.*``, ``delta.*``)."""
    if findings.get("delta.worst_latency_ratio") is not None:
        return ""

    def has(side: str, keys: tuple[str, ...]) -> bool:
        return any(findings.get(f"{side}.{k}") is not None for k in keys)

    ttft = {s: has(s, _TTFT_KEYS) for s in ("baseline", "candidate")}
    tpot = {s: has(s, _TPOT_KEYS) for s in ("baseline", "candidate")}
    if (ttft["baseline"] and ttft["candidate"]) or (tpot["baseline"] and tpot["candidate"]):
        return "the baseline's TTFT or TPOT is 0 ms: no ratio to the candidate can be formed"
    parts = []
    for side, other in (("baseline", "candidate"), ("candidate", "baseline")):
        lack = []
        if not tpot[side] and (tpot[other] or not ttft[side]):
            n_dec = findings.get(f"{side}.steps.decode_count") or 0
            lack.append("no decode steps (no TPOT)" if not n_dec else
                        f"only {int(n_dec)} decode step (no TPOT: the interval between two consecutive decode steps)")
        if not ttft[side] and (ttft[other] or not tpot[side]):
            lack.append("no prefill step (no TTFT)")
        if lack:
            parts.append(f"the {side} has " + " and ".join(lack))
    if not any(ttft.values()) and not any(tpot.values()) and not any(
            findings.get(f"{x}.steps.decode_count") for x in ("baseline", "candidate")):
        return "neither trace has a prefill or decode step: no TTFT or TPOT to compare"
    return "; ".join(parts) + ": no TTFT or TPOT is measured in both traces"


def compare_reports(baseline: Report | Mapping[str, Any], candidate: Report | Mapping[str, Any], ruleset: RuleSet,
                    metrics: Findings | None = None, device: int | None = None, fail_on: str = "high",
                    allow_missing: bool = False, allow_partial: bool = False, reevaluate: bool = False,
                    pair_spec: str | None = None) -> Comparison:
    """Compare two reports with the compare-scope rules (and metrics-scope ones when
    ``metrics`` is given), honouring the rule set's thresholds and disabled rules, device pair
    by device pair. A report with :func:`unreliable_reasons` makes the verdict "unreliable"
    (exit 1) unless ``allow_partial``, as ``diagnose gate`` does.

    Devices: ``device`` (in both reports), else the pairings of ``pair_spec`` (``--pair-devices
    0:1,1:0``), else :func:`diagnose.findings.pair_devices` (by id). Each pairing's rows, deltas
    and verdicts carry ``devices`` [baseline, candidate]; the trace's latency rows come once.

    New and resolved symptoms: each report's own trace verdicts (``symptoms``, attached by
    :func:`diagnose.pipeline.attach_verdicts`, one per device), matched across the pairings, so
    their text is the one ``diagnose run`` prints; with ``reevaluate`` (the rule options
    ``--threshold``, ``--rules``, ``--rules-config`` were given), or for a report without
    verdicts, both are evaluated again with ``ruleset`` on every device.

    Raises:
        DiagnoseError: ``device`` is in neither report; the device sets differ and no pairing
            was given; a pairing names a device a report lacks.
    """
    baseline, candidate = as_report(baseline), as_report(candidate)
    if device is not None:
        pairs = [(select_device(baseline, device), select_device(candidate, device))]
    else:
        pairs = [(p[0], p[1]) for p in pair_devices([baseline, candidate], ["baseline", "candidate"], pair_spec)]
    scopes = ["compare"] + (["metrics"] if metrics else [])
    per_pair = []
    for db, dc in pairs:
        f = compare_findings(baseline, candidate, db, dc)
        if metrics:
            f.update(metrics)
        per_pair.append((db, dc, f, evaluate(ruleset.rules, f, scope=scopes, overrides=ruleset.overrides)))
    findings = per_pair[0][2]
    verdicts = _merge_pair_verdicts(per_pair, len(pairs) > 1)
    sb, sc = (trace_symptoms(r, ruleset, None, reevaluate) for r in (baseline, candidate))
    new, gone = _new_and_resolved(sb, sc, pairs)
    regression = any(s["id"] == REGRESSION_RULE for s in verdicts.symptoms)
    failing = verdicts.at_least(fail_on)
    comparable = not any(n["id"] == REGRESSION_RULE for n in verdicts.not_evaluated)
    unreliable = [f"{label}: {', '.join(r)}" for label, rep in (("baseline", baseline), ("candidate", candidate))
                  if (r := unreliable_reasons(rep))]
    code = 1 if failing or (not comparable and not allow_missing) or (unreliable and not allow_partial) else 0
    rows = []
    for i, (db, dc, f, _) in enumerate(per_pair):
        fb = {k[len("baseline."):]: v for k, v in f.items() if k.startswith("baseline.")}
        fc = {k[len("candidate."):]: v for k, v in f.items() if k.startswith("candidate.")}
        for label, key, kind, dkey in COMPARE_ROWS:
            trace_row = key.startswith(TRACE_ROW_PREFIX)
            if trace_row and i:
                continue
            rows.append({"name": label, "finding": key, "kind": kind, "baseline": fb.get(key), "candidate": fc.get(key),
                         ("ratio" if kind == "ms" else "change"): f.get(dkey), "devices": None if trace_row else [db, dc]})
    warnings = like_for_like_warnings([baseline, candidate], ["baseline", "candidate"], devices=list(pairs[0]))
    cat = [dict(d, devices=[db, dc]) for db, dc in pairs for d in category_deltas(baseline, candidate, db, dc)]
    ker = [dict(d, devices=[db, dc]) for db, dc in pairs for d in kernel_deltas(baseline, candidate, db, candidate_device=dc)]
    ker.sort(key=lambda r: (-abs(r["candidate_ms"] - r["baseline_ms"]), r["name"]))
    return Comparison(findings=findings, verdicts=verdicts, rows=rows, regression=regression, comparable=comparable,
                      failing=failing, new_symptoms=new, resolved_symptoms=gone, category_deltas=cat,
                      kernel_deltas=ker[:10], warnings=warnings, exit_code=code, unreliable=unreliable,
                      allow_partial=allow_partial, pairs=pairs)


def _merge_pair_verdicts(per_pair: list, several: bool) -> Verdicts:
    """The verdicts of every pairing in one: a verdict that reads the same in several pairings
    (a trace-level rule such as the latency regression) once; with several pairings each
    entry carries ``devices`` [baseline, candidate]."""
    out = Verdicts()
    seen: set[tuple] = set()
    for db, dc, _, v in per_pair:
        for bucket, entries in (("symptoms", v.symptoms), ("passed", v.passed), ("not_evaluated", v.not_evaluated)):
            for e in entries:
                key = (bucket, e["id"], e.get("summary") or e.get("reason"))
                if key in seen:
                    continue
                seen.add(key)
                getattr(out, bucket).append(dict(e, devices=[db, dc]) if several else e)
    return out


def _new_and_resolved(sb: list[dict], sc: list[dict], pairs: list[tuple]) -> tuple[list[dict], list[dict]]:
    """Trace-scope symptoms fired only in the candidate / only in the baseline, matched by rule
    id and device pairing (a symptom of an unpaired device is neither)."""
    to_c = {b: c for b, c in pairs}
    to_b = {c: b for b, c in pairs}
    keys_b = {(s["id"], to_c[s.get("device")]) for s in sb if s.get("device") in to_c}
    keys_c = {(s["id"], s.get("device")) for s in sc if s.get("device") in to_b}
    new = [s for s in sc if s.get("device") in to_b and (s["id"], s.get("device")) not in keys_b]
    gone = [s for s in sb if s.get("device") in to_c and (s["id"], to_c[s.get("device")]) not in keys_c]
    return new, gone


def trace_symptoms(report: Report, ruleset: RuleSet, device: int | None = None, reevaluate: bool = False) -> list[dict[str, Any]]:
    """The trace-scope symptoms of a report, each with its ``device``: its own (as ``diagnose
    run`` printed them) unless ``reevaluate`` or it has none attached; else evaluated with
    ``ruleset`` on every device (only ``device`` when given) with the same unreliable numbers
    and labels the pipeline uses (:func:`diagnose.pipeline.evaluate_devices`)."""
    from diagnose.pipeline import evaluate_devices

    if report.symptoms is not UNSET and not reevaluate:
        return [s.to_dict() for s in report.symptoms if device is None or s.device in (device, UNSET, None)]
    return evaluate_devices(report, ruleset, device)[1].symptoms


def _setup(report: Report, device: int | None) -> dict[str, Any]:
    """What must match for two traces to compare like for like: device name, model, decode batch."""
    try:
        dev = select_device(report, device)
    except Exception:  # noqa: BLE001 - a device missing from one report is reported by compare itself
        dev = None
    name = next((d.name for d in report.devices if d.id == dev), None)
    model = report.model
    f = report_findings(report, dev)
    return {"device": name or None, "model": (model.name, model.params_total) if model else None,
            "decode batch": f.get("steps.decode_p50_batch"), "prompt tokens": f.get("steps.prefill_p50_prompt_tokens")}


def like_for_like_warnings(reports: Sequence[Report | Mapping[str, Any]], labels: Sequence[str], device: int | None = None,
                           keys: Sequence[str] = ("device", "model", "decode batch", "prompt tokens"),
                           devices: Sequence[int | None] | None = None) -> list[str]:
    """One warning per setting that differs between the reports (device name, model config,
    median decode batch, median prompt length): the comparison may not be like for like.
    ``devices``: the device read in each report (default ``device`` in all)."""
    devs = list(devices) if devices is not None else [device] * len(reports)
    setups = [_setup(as_report(r), d) for r, d in zip(reports, devs)]
    out = []
    for k in keys:
        vals = [s[k] for s in setups]
        known = [v for v in vals if v is not None]
        if len(set(map(_plain, known))) > 1:
            shown = ", ".join(f"{lab} {_plain(v[0] if isinstance(v, tuple) else v)}" for lab, v in zip(labels, vals) if v is not None)
            out.append(f"the traces differ in {k} ({shown}): the comparison may not be like for like")
    return out


def _plain(v: Any) -> str:
    """A setting as people write it: a whole float as an integer (batch 2, not 2.0)."""
    if isinstance(v, float) and v.is_integer():
        return str(int(v))
    return str(v)


def unreliable_reasons(report: Report | Mapping[str, Any]) -> list[str]:
    """Why a report's numbers are unreliable or unrepresentative: partial file, quality codes
    that make numbers unreliable, or a trace type that is not serving (a capture pass, a
    fragment of a forward)."""
    from diagnose.vocab import UNRELIABLE_CODES, UNREPRESENTATIVE_TRACE_TYPES

    report = as_report(report)
    out = []
    if report.partial:
        out.append("partial trace file")
    codes = {q.code for q in report.quality}
    out += [f"quality: {c}" for c in UNRELIABLE_CODES + UNREPRESENTATIVE_TRACE_TYPES if c in codes]
    return out


def category_deltas(baseline: Report, candidate: Report, device: int | None = None,
                    candidate_device: int | None = None) -> list[dict[str, Any]]:
    """Per phase present in both reports and kernel category present in either: time in each
    (ms, the category's busy union on the device) and candidate / baseline, the baseline's
    ``device`` against the candidate's ``candidate_device`` (default: the same id). A trade
    (GEMM slower, elementwise faster) shows here even when the totals match."""
    pb = device_rows(as_report(baseline), device)
    pc = device_rows(as_report(candidate), device if candidate_device is None else candidate_device)
    out = []
    for name in pb:
        if name not in pc or name == "unknown":
            continue
        cb, cc = pb[name].categories_ms, pc[name].categories_ms
        for cat in sorted(set(cb) | set(cc), key=lambda c: -max(cb.get(c, 0.0), cc.get(c, 0.0))):
            b, c = cb.get(cat, 0.0), cc.get(cat, 0.0)
            out.append({"phase": name, "category": cat, "baseline_ms": b, "candidate_ms": c, "ratio": div(c, b)})
    return out


def kernel_deltas(baseline: Report, candidate: Report, device: int | None = None, limit: int = 10,
                  candidate_device: int | None = None) -> list[dict[str, Any]]:
    """The ``limit`` kernels (by name, among each report's top kernels per phase) whose time
    changed most, largest absolute change first; a kernel absent from one side counts 0 ms there
    (the baseline's ``device`` against the candidate's ``candidate_device``, default the same id)."""
    pb = device_rows(as_report(baseline), device)
    pc = device_rows(as_report(candidate), device if candidate_device is None else candidate_device)
    out = []
    for name in pb:
        if name not in pc or name in ("all", "unknown"):
            continue
        kb = {k.name: k for k in pb[name].top_kernels}
        kc = {k.name: k for k in pc[name].top_kernels}
        for k in set(kb) | set(kc):
            b = kb[k].total_ms if k in kb else 0.0
            c = kc[k].total_ms if k in kc else 0.0
            cat = (kb.get(k) or kc.get(k)).category
            out.append({"phase": name, "name": k, "category": cat, "baseline_ms": b, "candidate_ms": c, "ratio": div(c, b)})
    out.sort(key=lambda r: (-abs(r["candidate_ms"] - r["baseline_ms"]), r["name"]))
    return out[:limit]
