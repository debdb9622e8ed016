"""Symptom rules: findings namespace, YAML rule loading, a small safe condition evaluator.

Pipeline: a JSON report (``run_analysis(path).to_dict()``) is flattened by
:func:`findings_from_report` into a numbers-only namespace with stable dotted names
(``decode.launch_gap_share``, ``latency.tpot_p99_ms``...). Several reports give sweep or
compare findings (:func:`findings_from_reports`); a metrics file gives ``metrics.*``
(:func:`findings_from_metrics`). Rules (one YAML file each, ``rules/*.yaml``, checked
against ``rules/rule.schema.json``) are evaluated over that namespace by :func:`evaluate`.

Condition language (checked when the rule loads, never passed to ``eval``):

* findings are referenced with dots replaced by ``__`` (``decode.launch_gap_share`` ->
  ``decode__launch_gap_share``) and must be listed in the rule's ``requires``;
* thresholds by their bare name (declared under ``thresholds``);
* ``and or not``, unary ``-``/``+``, ``+ - * /``, comparisons ``< <= > >= == !=``
  (chains allowed), int/float/bool literals, and calls to ``min``, ``max``, ``abs``.

Anything else (attribute access, subscripts, other calls, ``**``, strings, lambdas,
comprehensions, conditional expressions...) makes :func:`load_rules` raise
:class:`RuleError` naming the file and the construct.

A rule whose required finding is missing (absent or None/NaN) or below its ``min_samples``
is *not evaluated*, never passing. Source of thresholds: ``/work/shared/design/domain.md``
§3, §5, §7 (the article's numbers), cited in each rule's ``rationale``.
"""
from __future__ import annotations

import ast
import json
import math
import numbers
import operator
import re
import string
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import yaml

from diagnose.errors import DiagnoseError
from diagnose.yamlio import load_yaml

SEVERITIES = ("info", "low", "medium", "high", "critical")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}
SCOPES = ("trace", "sweep", "compare", "metrics")
PHASE_NAMES = ("all", "prefill", "decode", "mixed", "unknown")
CATEGORIES = ("gemm", "attention", "norm", "elementwise", "communication", "moe", "sampling", "memcpy", "memset", "other")
KERNEL_SHARE_CATEGORIES = ("gemm", "norm", "elementwise", "moe", "sampling", "other")
UNRELIABLE_CODES = ("partial_trace", "graph_coverage_low")
KNOWN_QUALITY_CODES = (
    "bandwidth_above_peak",
    "graph_coverage_low",
    "partial_trace",
    "missing_markers",
    "phases_from_shapes",
    "unlinked_kernels",
    "graph_kernels_no_launch",
    "no_gpu_activity",
)
MAX_CONDITION_CHARS = 1000
MAX_CONDITION_NODES = 300

_SEGMENT = r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*"
FINDING_NAME_RE = re.compile(rf"^{_SEGMENT}(?:\.{_SEGMENT})+$")
THRESHOLD_NAME_RE = re.compile(rf"^{_SEGMENT}$")
RULE_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")


class RuleError(DiagnoseError):
    """A rule file, fixture, override or rules config is invalid (message names the file)."""


Number = int | float
Findings = dict[str, "Number | None"]


# --------------------------------------------------------------------------------------
# Findings catalog (documented in docs/rules.md by ``diagnose rules doc``)
# --------------------------------------------------------------------------------------

#: (name pattern, unit, description). ``<phase>`` is one of all|prefill|decode|mixed|unknown,
#: ``<category>`` a kernel category, ``<code>`` a report quality code, ``<finding>`` any
#: single-trace finding name.
FINDINGS_CATALOG: list[tuple[str, str, str]] = [
    # per phase, on the selected device
    ("<phase>.steps", "count", "engine steps of the phase (all: every step)"),
    ("<phase>.wall_ms", "ms", "sum of the phase's step wall times (launch to GPU finish); all: GPU window or CPU span"),
    ("<phase>.window_ms", "ms", "first GPU activity start to last GPU activity end of the phase"),
    ("<phase>.gpu_busy_ms", "ms", "union of the phase's GPU activity intervals (all streams merged)"),
    ("<phase>.gpu_idle_share", "fraction", "1 - busy / window"),
    ("<phase>.launch_gap_share", "fraction", "idle gaps whose next activity's launch call ended after the GPU went idle, / window"),
    ("<phase>.attention_share", "fraction", "attention kernel time / kernel time"),
    ("<phase>.kernel_ms", "ms", "sum of kernel durations (not busy time)"),
    ("<phase>.kernel_count", "count", "kernels in the phase"),
    ("<phase>.activity_count", "count", "GPU activities (kernels, memcpy, memset) in the phase"),
    ("<phase>.<category>_ms", "ms", "summed duration of the category (0 when absent)"),
    ("<phase>.<category>_share", "fraction", "category kernel time / kernel time, for gemm, norm, elementwise, moe, sampling, other"),
    ("<phase>.comm_share", "fraction", "communication (NCCL/RCCL...) kernel time / kernel time"),
    ("<phase>.launch_gap_ms", "ms", "total launch gaps"),
    ("<phase>.graph_gap_ms", "ms", "total gaps inside one CUDA/HIP graph replay"),
    ("<phase>.other_gap_ms", "ms", "total gaps whose next activity was launched in time (dependency, sync, queueing)"),
    ("<phase>.unattributed_gap_ms", "ms", "total gaps before activities with no linked launch call"),
    ("<phase>.other_gap_share", "fraction", "other gaps / window"),
    ("<phase>.launch_gap_count", "count", "number of launch gaps"),
    ("<phase>.launch_gap_p50_us", "µs", "median launch gap"),
    ("<phase>.launch_gap_p99_us", "µs", "p99 launch gap"),
    ("<phase>.gap_max_us", "µs", "longest idle gap of any kind"),
    ("<phase>.mfu", "fraction", "model FLOPs utilization (roofline analyzer; absent when model/GPU unknown)"),
    ("<phase>.mbu", "fraction", "model bandwidth utilization = achieved B/s / peak B/s (roofline analyzer)"),
    ("<phase>.achieved_tflops", "TFLOP/s", "achieved FLOP rate (1e12 FLOP/s)"),
    ("<phase>.achieved_tbps", "TB/s", "achieved device-memory bandwidth (1e12 B/s)"),
    ("<phase>.arithmetic_intensity", "FLOP/B", "FLOPs / bytes moved"),
    ("<phase>.bound_ratio", "ratio", "measured time / analytic lower bound (>= 1; 1.5 good, 3-4 a real problem)"),
    ("<phase>.peak_tbps", "TB/s", "device peak memory bandwidth used for MBU"),
    ("<phase>.peak_tflops", "TFLOP/s", "device peak FLOP rate used for MFU"),
    ("<phase>.compute_bound", "0/1", "1 when the roofline analyzer says 'compute', 0 for 'memory'"),
    ("<phase>.bandwidth_over_peak", "ratio", "achieved_tbps / peak_tbps (> 1 is physically impossible: S7)"),
    ("<phase>.flops", "FLOP", "FLOPs of the phase's steps (attainment analyzer)"),
    ("<phase>.bytes", "B", "device-memory bytes of the phase's steps (attainment analyzer)"),
    ("<phase>.forward_coverage", "fraction", "FLOPs seen in the step windows / the model config's FLOPs"),
    ("<phase>.graph_coverage", "fraction", "per-phase graph coverage when the report provides it"),
    # latency
    ("latency.ttft_ms", "ms", "TTFT proxy: wall time of the first prefill step"),
    ("latency.ttft_samples", "count", "prefill steps"),
    ("latency.ttft_p50_ms", "ms", "p50 of prefill step wall times (TTFT proxy distribution)"),
    ("latency.ttft_p90_ms", "ms", "p90 of prefill step wall times"),
    ("latency.ttft_p99_ms", "ms", "p99 of prefill step wall times"),
    ("latency.tpot_p50_ms", "ms", "p50 TPOT (interval between completions of consecutive decode steps)"),
    ("latency.tpot_p90_ms", "ms", "p90 TPOT"),
    ("latency.tpot_p99_ms", "ms", "p99 TPOT"),
    ("latency.tpot_mean_ms", "ms", "mean TPOT"),
    ("latency.tpot_samples", "count", "TPOT samples"),
    ("latency.tpot_p99_over_p50", "ratio", "p99 TPOT / p50 TPOT"),
    ("latency.prefill_step_p50_ms", "ms", "p50 prefill step wall time"),
    ("latency.prefill_step_p90_ms", "ms", "p90 prefill step wall time"),
    ("latency.prefill_step_p99_ms", "ms", "p99 prefill step wall time"),
    ("latency.decode_step_p50_ms", "ms", "p50 decode step wall time"),
    ("latency.decode_step_p90_ms", "ms", "p90 decode step wall time"),
    ("latency.decode_step_p99_ms", "ms", "p99 decode step wall time"),
    ("latency.decode_throughput_tok_s", "tokens/s", "median decode batch / p50 TPOT"),
    # steps
    ("steps.count", "count", "engine steps (all phases)"),
    ("steps.prefill_count", "count", "prefill steps"),
    ("steps.decode_count", "count", "decode steps"),
    ("steps.mixed_count", "count", "mixed (chunked-prefill) steps"),
    ("steps.prefill_max_wall_ms", "ms", "longest prefill step wall time"),
    ("steps.prefill_p50_wall_ms", "ms", "median prefill step wall time"),
    ("steps.decode_p50_wall_ms", "ms", "median decode step wall time"),
    ("steps.decode_p99_wall_ms", "ms", "p99 decode step wall time"),
    ("steps.decode_max_wall_ms", "ms", "longest decode step wall time"),
    ("steps.prefill_interleaved_count", "count", "prefill or mixed steps with a decode step before and after them"),
    ("steps.prefill_interleaved_max_wall_ms", "ms", "longest such step (0 when none; None with fewer than 2 decode steps)"),
    ("steps.decode_p50_batch", "sequences", "median batch of decode steps (from step markers)"),
    ("steps.decode_max_batch", "sequences", "largest decode batch"),
    ("steps.decode_p50_context", "tokens", "median context length of decode steps (from step markers)"),
    ("steps.decode_max_context", "tokens", "largest decode context"),
    ("steps.prefill_max_tokens", "tokens", "largest prefill step token count (all sequences)"),
    ("steps.prefill_max_prompt_tokens", "tokens", "largest prompt length: prefill tokens / batch (tokens when batch unknown)"),
    ("steps.prefill_p50_prompt_tokens", "tokens", "median prompt length of prefill steps"),
    ("steps.with_gpu_count", "count", "steps that launched GPU work"),
    ("steps.cpu_shorter_than_gpu_count", "count", "steps whose CPU range ends before their GPU work and is shorter than its GPU span"),
    ("steps.cpu_shorter_than_gpu_share", "fraction", "cpu_shorter_than_gpu_count / with_gpu_count"),
    ("steps.max_gpu_over_cpu", "ratio", "largest GPU span / CPU duration of a step"),
    # trace
    ("trace.partial", "0/1", "1 when the report says the trace file was incomplete"),
    ("trace.unreliable", "0/1", "1 when partial or quality has partial_trace / graph_coverage_low; phase numbers a phase lists as unreliable are None unless include_unreliable"),
    ("trace.device", "id", "GPU device whose numbers the phase findings are (most GPU busy time unless chosen)"),
    ("trace.device_count", "count", "GPU devices with activity"),
    ("trace.gpu_activity_count", "count", "GPU activities on the selected device"),
    ("trace.graph_kernel_count", "count", "GPU activities replayed from CUDA/HIP graph launches (all devices)"),
    ("trace.graph_kernel_share", "fraction", "graph_kernel_count / GPU activities on all devices"),
    ("trace.graph_launches", "count", "graph launch calls on the host (report launches.graph_launches)"),
    ("trace.graph_coverage", "fraction", "share of graph launches with GPU activity in the trace (report launches.graph_coverage; low = replayed kernels missing)"),
    ("trace.host_launch_calls", "count", "host launch calls (report launches.host_launch_calls)"),
    ("trace.unlinked_count", "count", "GPU activities with no host launch call"),
    ("trace.bandwidth_above_peak", "0/1", "1 when the quality code bandwidth_above_peak is present or a phase's achieved_tbps > peak_tbps; 0 when checked and not; None when no bandwidth numbers"),
    ("trace.max_bandwidth_over_peak", "ratio", "largest achieved_tbps / peak_tbps over the device's phases"),
    ("quality.<code>", "count or 0/1", "the report's quality issue count (1 without a count); 0 for known codes that are absent"),
    # sweep
    ("sweep.points", "count", "traces in the sweep"),
    ("sweep.ctx_points", "count", "distinct context lengths in the context series (points sharing the most common batch)"),
    ("sweep.ctx_min", "tokens", "smallest context of the series"),
    ("sweep.ctx_max", "tokens", "largest context of the series"),
    ("sweep.tpot_ctx_slope_ms_per_1k", "ms per 1k tokens", "least-squares slope of p50 TPOT against context"),
    ("sweep.tpot_ctx_slope_r2", "fraction", "R^2 of that linear fit (1 = perfectly linear)"),
    ("sweep.tpot_ctx_growth", "ratio", "p50 TPOT at the largest context / at the smallest"),
    ("sweep.ctx_ratio", "ratio", "largest / smallest context"),
    ("sweep.batch_points", "count", "distinct batch sizes in the batch series (points sharing the most common context)"),
    ("sweep.batch_max", "sequences", "largest batch"),
    ("sweep.batch_prev", "sequences", "second-largest batch"),
    ("sweep.throughput_last_tok_s", "tokens/s", "decode throughput (batch / p50 TPOT) at the largest batch"),
    ("sweep.throughput_prev_tok_s", "tokens/s", "decode throughput at the second-largest batch"),
    ("sweep.throughput_gain_last_batch_doubling", "ratio", "throughput gain per batch doubling over the last step: (thr_last / thr_prev) ** (1 / log2(b_last / b_prev))"),
    ("sweep.throughput_gain_total", "ratio", "throughput at the largest batch / at the smallest"),
    ("sweep.tpot_batch_growth_last", "ratio", "p50 TPOT at the largest batch / at the second-largest"),
    ("sweep.gpus_min", "GPUs", "fewest GPUs in the sweep"),
    ("sweep.gpus_max", "GPUs", "most GPUs in the sweep"),
    ("sweep.tpot_fewest_gpus_ms", "ms", "p50 TPOT with the fewest GPUs (mean over such points)"),
    ("sweep.tpot_most_gpus_ms", "ms", "p50 TPOT with the most GPUs"),
    ("sweep.tp_tpot_ratio", "ratio", "tpot_most_gpus / tpot_fewest_gpus (>= 1: parallelism did not help decode)"),
    ("sweep.decode_comm_share_most_gpus", "fraction", "decode communication share with the most GPUs"),
    ("sweep.prefill_prompt_short", "tokens", "shortest prompt of the prefill series"),
    ("sweep.prefill_prompt_long", "tokens", "longest prompt of the prefill series"),
    ("sweep.prefill_mfu_short", "fraction", "prefill MFU at the shortest prompt"),
    ("sweep.prefill_mfu_long", "fraction", "prefill MFU at the longest prompt"),
    ("sweep.prefill_mfu_short_over_long", "ratio", "prefill_mfu_short / prefill_mfu_long"),
    # compare
    ("baseline.<finding>", "as the finding", "every single-trace finding of the baseline trace"),
    ("candidate.<finding>", "as the finding", "every single-trace finding of the candidate trace"),
    ("delta.ttft_ratio", "ratio", "candidate / baseline TTFT proxy"),
    ("delta.ttft_p50_ratio", "ratio", "candidate / baseline p50 TTFT (prefill step wall)"),
    ("delta.ttft_p90_ratio", "ratio", "candidate / baseline p90 TTFT"),
    ("delta.ttft_p99_ratio", "ratio", "candidate / baseline p99 TTFT"),
    ("delta.tpot_p50_ratio", "ratio", "candidate / baseline p50 TPOT"),
    ("delta.tpot_p90_ratio", "ratio", "candidate / baseline p90 TPOT"),
    ("delta.tpot_p99_ratio", "ratio", "candidate / baseline p99 TPOT"),
    ("delta.decode_step_p50_ratio", "ratio", "candidate / baseline p50 decode step wall"),
    ("delta.worst_latency_ratio", "ratio", "largest of the TTFT/TPOT p50/p90/p99 ratios that exist (TTFT proxy when no percentile)"),
    ("delta.decode_launch_gap_share_change", "fraction (points)", "candidate - baseline decode launch-gap share"),
    ("delta.all_gpu_idle_share_change", "fraction (points)", "candidate - baseline GPU idle share"),
    ("delta.decode_mbu_change", "fraction (points)", "candidate - baseline decode MBU"),
    ("delta.decode_mfu_change", "fraction (points)", "candidate - baseline decode MFU"),
    ("delta.prefill_mfu_change", "fraction (points)", "candidate - baseline prefill MFU"),
    # metrics
    ("metrics.<key>", "as given", "every numeric top-level key of the --metrics JSON file"),
    ("metrics.perplexity_change", "fraction", "perplexity_candidate / perplexity_baseline - 1"),
    ("metrics.spec_acceptance_rate", "fraction", "speculative-decoding acceptance rate (key spec_acceptance_rate or acceptance_rate)"),
]


def catalog_regex() -> re.Pattern:
    """One regex matching every name the catalog documents (used by tests and docs)."""
    single = []
    for pat, _, _ in FINDINGS_CATALOG:
        if pat.startswith(("baseline.", "candidate.")):
            continue
        single.append(_pattern_to_regex(pat))
    single_rx = "(?:" + "|".join(single) + ")"
    return re.compile(rf"^(?:{single_rx}|(?:baseline|candidate)\.{single_rx})$")


def _pattern_to_regex(pat: str) -> str:
    rx = re.escape(pat)
    rx = rx.replace(re.escape("<phase>"), "(?:" + "|".join(PHASE_NAMES) + ")")
    rx = rx.replace(re.escape("<category>"), "(?:" + "|".join(CATEGORIES) + ")")
    rx = rx.replace(re.escape("<code>"), _SEGMENT)
    rx = rx.replace(re.escape("<key>"), _SEGMENT)
    return rx


# --------------------------------------------------------------------------------------
# Findings from reports
# --------------------------------------------------------------------------------------


def _num(x: Any) -> Number | None:
    """A finite int/float, else None (bool -> int; NaN/inf/strings -> None)."""
    if x is None or isinstance(x, str):
        return None
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, numbers.Integral):
        return int(x)
    if not isinstance(x, numbers.Real):
        return None
    f = float(x)
    if math.isnan(f) or math.isinf(f):
        return None
    return f


def _div(a: Any, b: Any) -> float | None:
    a, b = _num(a), _num(b)
    if a is None or b is None or b == 0:
        return None
    return a / b


def _pct(values: Sequence[float], q: float) -> float | None:
    """Percentile with linear interpolation (numpy's default), None when empty."""
    v = sorted(x for x in values if x is not None)
    if not v:
        return None
    if len(v) == 1:
        return float(v[0])
    pos = (len(v) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(v) - 1)
    return float(v[lo] + (v[hi] - v[lo]) * (pos - lo))


def sanitize_code(code: str) -> str:
    """Quality code -> a finding-name segment (lowercase, [a-z0-9_], no double '_')."""
    s = re.sub(r"[^a-z0-9]+", "_", str(code).lower()).strip("_")
    if not s or not s[0].isalpha():
        s = "q_" + s if s else "q"
    return s


def select_device(report: Mapping[str, Any], device: int | None = None) -> int | None:
    """Device whose phases the findings describe: ``device`` if given, else most GPU busy.

    Raises:
        DiagnoseError: ``device`` is not one of the report's devices.
    """
    phases = list(report.get("phases") or [])
    alls = [p for p in phases if p.get("name") == "all"]
    if not alls:  # reports without an "all" row: any phase stands for its device
        by_dev: dict[Any, dict] = {}
        for p in phases:
            by_dev.setdefault(p.get("device"), p)
        alls = list(by_dev.values())
    devs = [p.get("device") for p in alls]
    if device is not None:
        if device not in devs:
            known = ", ".join(str(d) for d in devs if d is not None) or "none"
            raise DiagnoseError(f"device {device} is not in the trace (devices with GPU activity: {known})")
        return device
    if not alls:
        return None
    best = max(alls, key=lambda p: (_num(p.get("gpu_busy_ms")) or 0.0, -(p.get("device") or 0)))
    return best.get("device")


def unreliable_findings(report: Mapping[str, Any], device: int | None = None) -> set[str]:
    """Dotted names of the selected device's phase numbers the report marks unreliable
    (each phase's ``unreliable`` list, e.g. idle and launch-gap shares when graph coverage is low)."""
    dev = select_device(report, device)
    out: set[str] = set()
    for p in report.get("phases") or []:
        if p.get("device") == dev and p.get("name") in PHASE_NAMES:
            out |= {f"{p['name']}.{k}" for k in p.get("unreliable") or []}
    return out


def _phase_findings(p: Mapping[str, Any], out: Findings) -> None:
    n = p.get("name")
    if n not in PHASE_NAMES:
        return
    for k in ("steps", "wall_ms", "window_ms", "gpu_busy_ms", "gpu_idle_share", "launch_gap_share",
              "attention_share", "kernel_ms", "kernel_count", "activity_count"):
        out[f"{n}.{k}"] = _num(p.get(k))
    cats = p.get("categories_ms") or {}
    kernel_ms = _num(p.get("kernel_ms"))
    for c in CATEGORIES:
        out[f"{n}.{c}_ms"] = _num(cats.get(c, 0.0))
    for c in KERNEL_SHARE_CATEGORIES:
        out[f"{n}.{c}_share"] = _div(cats.get(c, 0.0), kernel_ms)
    out[f"{n}.comm_share"] = _div(cats.get("communication", 0.0), kernel_ms)
    gaps = p.get("gaps") or {}
    by_kind = gaps.get("ms_by_kind") or {}
    for kind in ("launch", "graph", "other", "unattributed"):
        out[f"{n}.{kind}_gap_ms"] = _num(by_kind.get(kind)) if by_kind else None
    out[f"{n}.other_gap_share"] = _div(by_kind.get("other"), p.get("window_ms")) if by_kind else None
    launch = gaps.get("launch") or {}
    out[f"{n}.launch_gap_count"] = _num(launch.get("count")) if launch else None
    out[f"{n}.launch_gap_p50_us"] = _num(launch.get("p50_us"))
    out[f"{n}.launch_gap_p99_us"] = _num(launch.get("p99_us"))
    out[f"{n}.gap_max_us"] = _num((gaps.get("all") or {}).get("max_us"))
    for k in ("mfu", "mbu", "achieved_tflops", "achieved_tbps", "arithmetic_intensity", "bound_ratio",
              "peak_tbps", "peak_tflops", "flops", "bytes", "forward_coverage", "graph_coverage"):
        if k in p:
            out[f"{n}.{k}"] = _num(p.get(k))
    if "bound" in p:
        b = p.get("bound")
        out[f"{n}.compute_bound"] = 1 if b == "compute" else 0 if b == "memory" else None
    if "achieved_tbps" in p or "peak_tbps" in p:
        out[f"{n}.bandwidth_over_peak"] = _div(p.get("achieved_tbps"), p.get("peak_tbps"))


def _step_findings(steps: list[Mapping[str, Any]], out: Findings) -> None:
    def wall_ms(s):
        w = _num(s.get("wall_ns"))
        return None if w is None else w / 1e6

    steps = sorted(steps, key=lambda s: (_num(s.get("start_ns")) or 0))
    by = {ph: [s for s in steps if s.get("phase") == ph] for ph in ("prefill", "decode", "mixed")}
    out["steps.count"] = len(steps)
    for ph in ("prefill", "decode", "mixed"):
        out[f"steps.{ph}_count"] = len(by[ph])
    pw = [w for w in (wall_ms(s) for s in by["prefill"]) if w is not None]
    dw = [w for w in (wall_ms(s) for s in by["decode"]) if w is not None]
    out["steps.prefill_max_wall_ms"] = max(pw) if pw else None
    out["steps.prefill_p50_wall_ms"] = _pct(pw, 50)
    out["steps.decode_p50_wall_ms"] = _pct(dw, 50)
    out["steps.decode_p99_wall_ms"] = _pct(dw, 99)
    out["steps.decode_max_wall_ms"] = max(dw) if dw else None

    # Prefill (or mixed) steps with a decode step both before and after them (S5).
    phases = [s.get("phase") for s in steps]
    dec_idx = [i for i, ph in enumerate(phases) if ph == "decode"]
    inter = []
    if len(dec_idx) >= 2:
        lo, hi = dec_idx[0], dec_idx[-1]
        inter = [wall_ms(steps[i]) for i in range(lo + 1, hi) if phases[i] in ("prefill", "mixed")]
        inter = [w for w in inter if w is not None]
        out["steps.prefill_interleaved_count"] = len(inter)
        out["steps.prefill_interleaved_max_wall_ms"] = max(inter) if inter else 0.0
    else:
        out["steps.prefill_interleaved_count"] = 0
        out["steps.prefill_interleaved_max_wall_ms"] = None

    db = [_num(s.get("batch")) for s in by["decode"]]
    db = [b for b in db if b is not None]
    dc = [_num(s.get("context")) for s in by["decode"]]
    dc = [c for c in dc if c is not None]
    out["steps.decode_p50_batch"] = _pct(db, 50)
    out["steps.decode_max_batch"] = max(db) if db else None
    out["steps.decode_p50_context"] = _pct(dc, 50)
    out["steps.decode_max_context"] = max(dc) if dc else None
    ptoks, prompts = [], []
    for s in by["prefill"]:
        t, b = _num(s.get("tokens")), _num(s.get("batch"))
        if t is not None:
            ptoks.append(t)
            prompts.append(t / b if b else t)
    out["steps.prefill_max_tokens"] = max(ptoks) if ptoks else None
    out["steps.prefill_max_prompt_tokens"] = max(prompts) if prompts else None
    out["steps.prefill_p50_prompt_tokens"] = _pct(prompts, 50)

    # Timed CPU regions shorter than the GPU work they launched (S7).
    with_gpu = shorter = 0
    ratios = []
    for s in steps:
        cs, ce = _num(s.get("start_ns")), _num(s.get("end_ns"))
        gs, ge = _num(s.get("gpu_start_ns")), _num(s.get("gpu_end_ns"))
        if None in (cs, ce, gs, ge) or s.get("scope", "cpu") != "cpu":
            continue
        with_gpu += 1
        cpu, gpu = ce - cs, ge - gs
        if ce < ge and cpu < gpu:
            shorter += 1
        if cpu > 0:
            ratios.append(gpu / cpu)
    out["steps.with_gpu_count"] = with_gpu
    out["steps.cpu_shorter_than_gpu_count"] = shorter if with_gpu else None
    out["steps.cpu_shorter_than_gpu_share"] = shorter / with_gpu if with_gpu else None
    out["steps.max_gpu_over_cpu"] = max(ratios) if ratios else None


def findings_from_report(report: Mapping[str, Any], device: int | None = None, include_unreliable: bool = False) -> Findings:
    """Flatten one JSON report into ``{dotted name: number or None}``.

    Args:
        report: ``run_analysis(path).to_dict()`` (schema_version 1), possibly with the
            roofline fields (mfu, mbu, bound_ratio...) on its phases.
        device: GPU device id for the ``<phase>.*`` findings; default the device with the
            most GPU busy time (ties: lowest id).
        include_unreliable: keep numbers a phase lists under ``unreliable`` (default: they
            become None, so rules that need them are not evaluated).

    Returns:
        Numbers only (ints, floats; flags as 0/1); None where a value is unknown. Names are
        listed in :data:`FINDINGS_CATALOG`.

    Raises:
        DiagnoseError: ``device`` is not in the report.
    """
    out: Findings = {}
    dev = select_device(report, device)
    phases = report.get("phases") or []
    for p in phases:
        if p.get("device") == dev:
            _phase_findings(p, out)

    lat = report.get("latency") or {}
    out["latency.ttft_ms"] = _num(lat.get("ttft_ms"))
    out["latency.ttft_samples"] = _num(lat.get("ttft_samples"))
    pre = lat.get("prefill_step_ms") or {}
    tp = lat.get("tpot_ms") or {}
    dec = lat.get("decode_step_ms") or {}
    for q in ("p50", "p90", "p99"):
        out[f"latency.ttft_{q}_ms"] = _num(pre.get(q))
        out[f"latency.tpot_{q}_ms"] = _num(tp.get(q))
        out[f"latency.prefill_step_{q}_ms"] = _num(pre.get(q))
        out[f"latency.decode_step_{q}_ms"] = _num(dec.get(q))
    out["latency.tpot_mean_ms"] = _num(tp.get("mean"))
    out["latency.tpot_samples"] = _num(lat.get("tpot_samples"))
    out["latency.tpot_p99_over_p50"] = _div(tp.get("p99"), tp.get("p50"))

    _step_findings(list(report.get("steps") or []), out)
    out["latency.decode_throughput_tok_s"] = (
        _div(out["steps.decode_p50_batch"] * 1000.0, out["latency.tpot_p50_ms"])
        if out.get("steps.decode_p50_batch") is not None else None
    )

    quality = report.get("quality") or []
    codes: dict[str, Number] = {}
    for q in quality:
        c = sanitize_code(q.get("code", ""))
        cnt = _num(q.get("count"))
        codes[c] = codes.get(c, 0) + (cnt if cnt is not None else 1)
    for c in KNOWN_QUALITY_CODES:
        out[f"quality.{c}"] = codes.get(c, 0)
    for c, v in codes.items():
        out[f"quality.{c}"] = v

    partial = 1 if report.get("partial") else 0
    out["trace.partial"] = partial
    out["trace.unreliable"] = 1 if partial or any(codes.get(c) for c in UNRELIABLE_CODES) else 0
    out["trace.device"] = dev
    alls = [p for p in phases if p.get("name") == "all" and p.get("device") is not None]
    out["trace.device_count"] = len(alls)
    out["trace.gpu_activity_count"] = out.get("all.activity_count")
    total_acts = sum(_num(p.get("activity_count")) or 0 for p in alls)
    graph = codes.get("graph_kernels_no_launch", 0)
    out["trace.graph_kernel_count"] = graph
    out["trace.graph_kernel_share"] = graph / total_acts if total_acts else None
    launches = report.get("launches") or {}
    out["trace.graph_launches"] = _num(launches.get("graph_launches"))
    out["trace.graph_coverage"] = _num(launches.get("graph_coverage"))
    out["trace.host_launch_calls"] = _num(launches.get("host_launch_calls"))
    out["trace.unlinked_count"] = codes.get("unlinked_kernels", 0)
    ratios = [out[k] for k in out if k.endswith(".bandwidth_over_peak") and out[k] is not None]
    out["trace.max_bandwidth_over_peak"] = max(ratios) if ratios else None
    if codes.get("bandwidth_above_peak"):
        out["trace.bandwidth_above_peak"] = 1
    elif ratios:
        out["trace.bandwidth_above_peak"] = 1 if max(ratios) > 1.0 else 0
    else:
        out["trace.bandwidth_above_peak"] = None
    if not include_unreliable:
        for name in unreliable_findings(report, dev):
            if name in out:
                out[name] = None
    return out


_LABEL_ALIASES = {
    "ctx": "ctx", "context": "ctx",
    "bs": "batch", "batch": "batch",
    "gpus": "gpus", "tp": "gpus", "n_gpus": "gpus", "world_size": "gpus",
    "prompt": "prompt", "toks": "prompt", "prompt_tokens": "prompt",
    "name": "name", "label": "name",
}


def parse_label(spec: str) -> dict[str, Any]:
    """``"ctx=2048,bs=8"`` -> ``{"ctx": 2048, "batch": 8}``.

    Keys: ctx|context, bs|batch, gpus|tp|n_gpus|world_size, prompt|toks|prompt_tokens
    (numbers) and name|label (free text).

    Raises:
        DiagnoseError: malformed pair, unknown key, or a non-numeric value.
    """
    out: dict[str, Any] = {}
    for part in (x.strip() for x in spec.replace(";", ",").split(",")):
        if not part:
            continue
        if "=" not in part:
            raise DiagnoseError(f"--label expects KEY=VALUE[,KEY=VALUE], got {spec!r}")
        k, v = (s.strip() for s in part.split("=", 1))
        key = _LABEL_ALIASES.get(k.lower())
        if key is None:
            raise DiagnoseError(f"--label: unknown key {k!r} (use ctx, bs, gpus, prompt or name)")
        if key == "name":
            out[key] = v
            continue
        try:
            num = float(v)
        except ValueError:
            raise DiagnoseError(f"--label {k}: {v!r} is not a number") from None
        if not math.isfinite(num) or num <= 0:
            raise DiagnoseError(f"--label {k}: must be a positive number, got {v!r}")
        out[key] = int(num) if num.is_integer() else num
    return out


def sweep_points(reports: Sequence[Mapping[str, Any]], labels: Sequence[Mapping[str, Any] | str | None] | None = None,
                 device: int | None = None) -> list[dict[str, Any]]:
    """One point per report: name, ctx, batch, gpus, prompt, tpot_ms, throughput_tok_s, prefill_mfu,
    decode_comm_share. Labels win over values read from step markers."""
    labels = list(labels) if labels else [None] * len(reports)
    if len(labels) != len(reports):
        raise DiagnoseError(f"{len(labels)} labels for {len(reports)} traces: give one --label per --trace, or none")
    pts = []
    for i, (rep, lab) in enumerate(zip(reports, labels)):
        lab = parse_label(lab) if isinstance(lab, str) else dict(lab or {})
        f = findings_from_report(rep, device)
        tpot = f.get("latency.tpot_p50_ms")
        if tpot is None:
            tpot = f.get("latency.decode_step_p50_ms")
        batch = lab.get("batch", f.get("steps.decode_p50_batch"))
        pt = {
            "name": lab.get("name") or (rep.get("source") or {}).get("path") or f"trace{i + 1}",
            "ctx": lab.get("ctx", f.get("steps.decode_p50_context")),
            "batch": batch,
            "gpus": lab.get("gpus", f.get("trace.device_count") or None),
            "prompt": lab.get("prompt", f.get("steps.prefill_p50_prompt_tokens")),
            "tpot_ms": tpot,
            "throughput_tok_s": _div(batch * 1000.0, tpot) if batch is not None else None,
            "prefill_mfu": f.get("prefill.mfu"),
            "decode_comm_share": f.get("decode.comm_share"),
        }
        pts.append(pt)
    return pts


def _mode(values: list) -> Any:
    counts: dict[Any, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return max(counts, key=lambda k: (counts[k], -(k if isinstance(k, (int, float)) else 0))) if counts else None


def _series(points: list[dict], x: str, y: str, hold: str) -> list[tuple[float, float]]:
    """(x, mean y) per distinct x among points with x and y known, holding ``hold`` at the
    value shared by the most distinct x (points with ``hold`` unknown join every group)."""
    usable = [p for p in points if p.get(x) is not None and p.get(y) is not None]
    if not usable:
        return []
    holds = {p.get(hold) for p in usable if p.get(hold) is not None}
    if len(holds) > 1:
        best = max(sorted(holds), key=lambda h: len({p[x] for p in usable if p.get(hold) in (h, None)}))
        usable = [p for p in usable if p.get(hold) in (best, None)]
    groups: dict[float, list[float]] = {}
    for p in usable:
        groups.setdefault(p[x], []).append(p[y])
    return sorted((k, sum(v) / len(v)) for k, v in groups.items())


def sweep_findings(points: list[dict[str, Any]]) -> Findings:
    """``sweep.*`` findings from :func:`sweep_points` (see the catalog for definitions)."""
    out: Findings = {"sweep.points": len(points)}
    ctx = _series(points, "ctx", "tpot_ms", "batch")
    out["sweep.ctx_points"] = len(ctx)
    for k in ("ctx_min", "ctx_max", "tpot_ctx_slope_ms_per_1k", "tpot_ctx_slope_r2", "tpot_ctx_growth", "ctx_ratio"):
        out[f"sweep.{k}"] = None
    if len(ctx) >= 2:
        xs = [c for c, _ in ctx]
        ys = [t for _, t in ctx]
        mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
        sxx = sum((x - mx) ** 2 for x in xs)
        sxy = sum((x - mx) * (y - my) for x, y in zip(xs, ys))
        syy = sum((y - my) ** 2 for y in ys)
        slope = sxy / sxx
        out["sweep.ctx_min"], out["sweep.ctx_max"] = xs[0], xs[-1]
        out["sweep.tpot_ctx_slope_ms_per_1k"] = slope * 1000.0
        out["sweep.tpot_ctx_slope_r2"] = (sxy * sxy) / (sxx * syy) if syy > 0 else 0.0
        out["sweep.tpot_ctx_growth"] = _div(ys[-1], ys[0])
        out["sweep.ctx_ratio"] = _div(xs[-1], xs[0])

    bat = _series(points, "batch", "throughput_tok_s", "ctx")
    tpb = dict(_series(points, "batch", "tpot_ms", "ctx"))
    out["sweep.batch_points"] = len(bat)
    for k in ("batch_max", "batch_prev", "throughput_last_tok_s", "throughput_prev_tok_s",
              "throughput_gain_last_batch_doubling", "throughput_gain_total", "tpot_batch_growth_last"):
        out[f"sweep.{k}"] = None
    if len(bat) >= 2:
        (_, t0), (bp, tprev), (bl, tl) = bat[0], bat[-2], bat[-1]
        out["sweep.batch_max"], out["sweep.batch_prev"] = bl, bp
        out["sweep.throughput_last_tok_s"], out["sweep.throughput_prev_tok_s"] = tl, tprev
        doublings = math.log2(bl / bp)
        gain = _div(tl, tprev)
        out["sweep.throughput_gain_last_batch_doubling"] = gain ** (1.0 / doublings) if gain and doublings > 0 else None
        out["sweep.throughput_gain_total"] = _div(tl, t0)
        out["sweep.tpot_batch_growth_last"] = _div(tpb.get(bl), tpb.get(bp))

    gp = _series(points, "gpus", "tpot_ms", "batch")
    for k in ("gpus_min", "gpus_max", "tpot_fewest_gpus_ms", "tpot_most_gpus_ms", "tp_tpot_ratio", "decode_comm_share_most_gpus"):
        out[f"sweep.{k}"] = None
    if len(gp) >= 2:
        (g0, t0), (gn, tn) = gp[0], gp[-1]
        out["sweep.gpus_min"], out["sweep.gpus_max"] = g0, gn
        out["sweep.tpot_fewest_gpus_ms"], out["sweep.tpot_most_gpus_ms"] = t0, tn
        out["sweep.tp_tpot_ratio"] = _div(tn, t0)
        comm = [p["decode_comm_share"] for p in points if p.get("gpus") == gn and p.get("decode_comm_share") is not None]
        out["sweep.decode_comm_share_most_gpus"] = max(comm) if comm else None

    pf = _series(points, "prompt", "prefill_mfu", "batch")
    for k in ("prefill_prompt_short", "prefill_prompt_long", "prefill_mfu_short", "prefill_mfu_long", "prefill_mfu_short_over_long"):
        out[f"sweep.{k}"] = None
    if len(pf) >= 2:
        (ps, ms), (pl, ml) = pf[0], pf[-1]
        out["sweep.prefill_prompt_short"], out["sweep.prefill_prompt_long"] = ps, pl
        out["sweep.prefill_mfu_short"], out["sweep.prefill_mfu_long"] = ms, ml
        out["sweep.prefill_mfu_short_over_long"] = _div(ms, ml)
    return out


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


def compare_findings(baseline: Mapping[str, Any], candidate: Mapping[str, Any], device: int | None = None) -> Findings:
    """``baseline.*``, ``candidate.*`` (every single-trace finding) and ``delta.*``.

    Ratios are candidate / baseline (None when either is missing or the baseline is 0).
    ``delta.worst_latency_ratio`` is the largest of the TTFT and TPOT p50/p90/p99 ratios
    (the TTFT proxy ratio stands in when no prefill percentile exists): domain.md §7
    "any of TTFT/TPOT p50/p90/p99 more than 50 % worse than baseline = roll back".
    """
    fb, fc = findings_from_report(baseline, device), findings_from_report(candidate, device)
    out: Findings = {}
    for k, v in fb.items():
        out[f"baseline.{k}"] = v
    for k, v in fc.items():
        out[f"candidate.{k}"] = v
    for name, src in _DELTA_RATIOS.items():
        out[f"delta.{name}"] = _div(fc.get(src), fb.get(src))
    for name, src in _DELTA_CHANGES.items():
        a, b = fb.get(src), fc.get(src)
        out[f"delta.{name}"] = None if a is None or b is None else b - a
    keys = ["ttft_p50_ratio", "ttft_p90_ratio", "ttft_p99_ratio", "tpot_p50_ratio", "tpot_p90_ratio", "tpot_p99_ratio"]
    vals = [out[f"delta.{k}"] for k in keys if out[f"delta.{k}"] is not None]
    if out["delta.ttft_p50_ratio"] is None and out["delta.ttft_ratio"] is not None:
        vals.append(out["delta.ttft_ratio"])
    out["delta.worst_latency_ratio"] = max(vals) if vals else None
    return out


def findings_from_reports(reports: Sequence[Mapping[str, Any]], labels: Sequence[Any] | None = None,
                          device: int | None = None) -> Findings:
    """Findings over several traces.

    * ``labels == ["baseline", "candidate"]`` with two reports: compare findings
      (:func:`compare_findings`: ``baseline.*``, ``candidate.*``, ``delta.*``).
    * otherwise a sweep: ``labels`` is one entry per report, each a ``"ctx=2048,bs=8"``
      string, a dict with keys ctx/batch/gpus/prompt/name, or None (values then come from
      the step markers: median decode context and batch, devices with activity, median
      prompt length). Returns ``sweep.*`` findings (:func:`sweep_findings`).

    Raises:
        DiagnoseError: labels and reports differ in number, or a label is malformed.
    """
    if labels is not None and len(reports) == 2 and [str(x) for x in labels] == ["baseline", "candidate"]:
        return compare_findings(reports[0], reports[1], device)
    return sweep_findings(sweep_points(reports, labels, device))


def findings_from_metrics(metrics: Mapping[str, Any]) -> Findings:
    """``metrics.*`` from a metrics JSON object (e.g. ``{"perplexity_baseline": 5.1,
    "perplexity_candidate": 5.3}``): every numeric top-level key, plus
    ``metrics.perplexity_change`` and ``metrics.spec_acceptance_rate``.

    Raises:
        DiagnoseError: ``metrics`` is not a JSON object.
    """
    if not isinstance(metrics, Mapping):
        raise DiagnoseError("metrics file must hold a JSON object of numbers, e.g. {\"perplexity_baseline\": 5.1, \"perplexity_candidate\": 5.3}")
    out: Findings = {}
    for k, v in metrics.items():
        n = _num(v)
        if n is not None and not isinstance(v, str):
            out[f"metrics.{sanitize_code(k)}"] = n
    pb, pc = out.get("metrics.perplexity_baseline"), out.get("metrics.perplexity_candidate")
    out["metrics.perplexity_change"] = (pc / pb - 1.0) if pb and pc is not None else None
    acc = out.get("metrics.spec_acceptance_rate", out.get("metrics.acceptance_rate"))
    out["metrics.spec_acceptance_rate"] = acc
    return out


def load_metrics(path: str) -> Findings:
    """Read a metrics JSON file and return :func:`findings_from_metrics`.

    Raises:
        DiagnoseError: missing, unreadable or not a JSON object.
    """
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DiagnoseError(f"metrics file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise DiagnoseError(f"cannot read metrics file {path}: {getattr(e, 'strerror', None) or type(e).__name__}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DiagnoseError(f"metrics file {path} is not JSON: {e.msg} at line {e.lineno}") from None
    return findings_from_metrics(data)


# --------------------------------------------------------------------------------------
# Condition language
# --------------------------------------------------------------------------------------

ALLOWED_FUNCTIONS = {"min": min, "max": max, "abs": abs}
_BINOPS = {ast.Add: ("+", operator.add), ast.Sub: ("-", operator.sub), ast.Mult: ("*", operator.mul), ast.Div: ("/", operator.truediv)}
_CMPOPS = {ast.Lt: operator.lt, ast.LtE: operator.le, ast.Gt: operator.gt, ast.GtE: operator.ge, ast.Eq: operator.eq, ast.NotEq: operator.ne}
_ALLOWED_HELP = ("allowed: and/or/not, unary -, + - * /, comparisons, finding names (dots as '__'), "
                 "threshold names, int/float/bool literals, min() max() abs()")
_OP_SYMBOL = {ast.Pow: "**", ast.Mod: "%", ast.FloorDiv: "//", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>",
              ast.BitOr: "|", ast.BitAnd: "&", ast.BitXor: "^", ast.Invert: "~", ast.Is: "is", ast.IsNot: "is not",
              ast.In: "in", ast.NotIn: "not in"}


def mangle(finding: str) -> str:
    """``decode.launch_gap_share`` -> ``decode__launch_gap_share`` (the name used in conditions)."""
    return finding.replace(".", "__")


def unmangle(name: str) -> str:
    """Inverse of :func:`mangle`."""
    return name.replace("__", ".")


def _refuse(where: str, text: str, node: ast.AST, what: str) -> RuleError:
    seg = None
    try:
        seg = ast.get_source_segment(text, node)
    except Exception:  # noqa: BLE001 — only used for the message
        seg = None
    at = f" in {seg[:60]!r}" if seg else ""
    return RuleError(f"{where}: condition refused: {what}{at}; {_ALLOWED_HELP}")


def compile_condition(text: str, names: Mapping[str, str], where: str = "condition") -> ast.Expression:
    """Parse and check a condition; return its AST (evaluated by :func:`eval_condition`).

    Args:
        text: the expression.
        names: allowed names -> "finding" | "threshold" (mangled finding names).
        where: prefix for error messages (the rule file).

    Raises:
        RuleError: syntax error, a construct outside the allowlist, an unknown name, or an
            expression that is not a truth value.
    """
    if not isinstance(text, str) or not text.strip():
        raise RuleError(f"{where}: condition is empty")
    if len(text) > MAX_CONDITION_CHARS:
        raise RuleError(f"{where}: condition longer than {MAX_CONDITION_CHARS} characters")
    try:
        tree = ast.parse(text.strip(), mode="eval")
    except SyntaxError as e:
        raise RuleError(f"{where}: condition is not a valid expression: {e.msg} (column {e.offset})") from None
    except (RecursionError, MemoryError, ValueError) as e:
        raise RuleError(f"{where}: condition refused: too deeply nested or invalid ({type(e).__name__})") from None
    n_nodes = sum(1 for _ in ast.walk(tree))
    if n_nodes > MAX_CONDITION_NODES:
        raise RuleError(f"{where}: condition too large ({n_nodes} nodes > {MAX_CONDITION_NODES})")
    kind = _check(tree.body, names, where, text.strip())
    if kind != "bool":
        raise RuleError(f"{where}: condition must be a truth value (a comparison, and/or/not), got an arithmetic expression")
    return tree


def _check(node: ast.AST, names: Mapping[str, str], where: str, text: str) -> str:
    """Type-check one node: returns "bool" or "num"; raises RuleError on anything else."""
    t = type(node)
    if t is ast.BoolOp:
        for v in node.values:
            if _check(v, names, where, text) != "bool":
                raise _refuse(where, text, v, "operands of and/or must be comparisons or truth values")
        return "bool"
    if t is ast.UnaryOp:
        k = _check(node.operand, names, where, text)
        if isinstance(node.op, ast.Not):
            if k != "bool":
                raise _refuse(where, text, node, "'not' needs a truth value")
            return "bool"
        if isinstance(node.op, (ast.USub, ast.UAdd)):
            if k != "num":
                raise _refuse(where, text, node, "unary minus needs a number")
            return "num"
        raise _refuse(where, text, node, f"operator {_OP_SYMBOL.get(type(node.op), type(node.op).__name__)!r} is not allowed")
    if t is ast.BinOp:
        if type(node.op) not in _BINOPS:
            raise _refuse(where, text, node, f"operator {_OP_SYMBOL.get(type(node.op), type(node.op).__name__)!r} is not allowed")
        for side in (node.left, node.right):
            if _check(side, names, where, text) != "num":
                raise _refuse(where, text, side, "arithmetic needs numbers")
        return "num"
    if t is ast.Compare:
        for op in node.ops:
            if type(op) not in _CMPOPS:
                raise _refuse(where, text, node, f"comparison {_OP_SYMBOL.get(type(op), type(op).__name__)!r} is not allowed")
        for side in [node.left, *node.comparators]:
            if _check(side, names, where, text) != "num":
                raise _refuse(where, text, side, "comparisons need numbers")
        return "bool"
    if t is ast.Name:
        if node.id not in names:
            raise _refuse(
                where, text, node,
                f"unknown name {node.id!r} (a finding must be listed in requires and written with '__' "
                f"for dots; a threshold must be declared under thresholds)",
            )
        return "num"
    if t is ast.Constant:
        v = node.value
        if isinstance(v, bool):
            return "bool"
        if isinstance(v, (int, float)):
            if isinstance(v, float) and not math.isfinite(v):
                raise _refuse(where, text, node, "non-finite constant")
            return "num"
        raise _refuse(where, text, node, f"{type(v).__name__} constant is not allowed (numbers and True/False only)")
    if t is ast.Call:
        f = node.func
        if not isinstance(f, ast.Name) or f.id not in ALLOWED_FUNCTIONS:
            try:
                fname = f.id if isinstance(f, ast.Name) else ast.unparse(f)[:60]
            except Exception:  # noqa: BLE001 — message only
                fname = type(f).__name__
            raise _refuse(where, text, node, f"call to {fname!r} is not allowed (only min, max, abs)")
        if node.keywords or any(isinstance(a, ast.Starred) for a in node.args):
            raise _refuse(where, text, node, "keyword or starred arguments are not allowed")
        n = len(node.args)
        if (f.id == "abs" and n != 1) or (f.id in ("min", "max") and n < 2):
            raise _refuse(where, text, node, f"{f.id}() takes {'one argument' if f.id == 'abs' else 'two or more arguments'}")
        for a in node.args:
            if _check(a, names, where, text) != "num":
                raise _refuse(where, text, a, f"{f.id}() needs numbers")
        return "num"
    label = {ast.Attribute: "attribute access", ast.Subscript: "subscript", ast.Lambda: "lambda",
             ast.ListComp: "comprehension", ast.SetComp: "comprehension", ast.DictComp: "comprehension",
             ast.GeneratorExp: "generator expression", ast.IfExp: "conditional expression",
             ast.NamedExpr: "assignment expression", ast.JoinedStr: "f-string", ast.Tuple: "tuple",
             ast.List: "list", ast.Dict: "dict", ast.Set: "set", ast.Await: "await", ast.Starred: "starred expression",
             ast.Yield: "yield", ast.YieldFrom: "yield", ast.Slice: "slice"}.get(t, t.__name__)
    raise _refuse(where, text, node, f"{label} is not allowed")


def eval_condition(tree: ast.Expression, env: Mapping[str, Number]) -> bool:
    """Evaluate a tree from :func:`compile_condition` over ``env`` (mangled name -> number).

    Raises:
        ZeroDivisionError, OverflowError: arithmetic on the values (caller reports the rule
            as not evaluated).
    """
    return bool(_ev(tree.body, env))


def _ev(node: ast.AST, env: Mapping[str, Number]) -> Any:
    t = type(node)
    if t is ast.Compare:
        left = _ev(node.left, env)
        for op, comp in zip(node.ops, node.comparators):
            right = _ev(comp, env)
            if not _CMPOPS[type(op)](left, right):
                return False
            left = right
        return True
    if t is ast.BoolOp:
        if isinstance(node.op, ast.And):
            return all(_ev(v, env) for v in node.values)
        return any(_ev(v, env) for v in node.values)
    if t is ast.BinOp:
        return _BINOPS[type(node.op)][1](_ev(node.left, env), _ev(node.right, env))
    if t is ast.UnaryOp:
        v = _ev(node.operand, env)
        if isinstance(node.op, ast.Not):
            return not v
        return -v if isinstance(node.op, ast.USub) else +v
    if t is ast.Name:
        return env[node.id]
    if t is ast.Constant:
        return node.value
    if t is ast.Call:
        return ALLOWED_FUNCTIONS[node.func.id](*(_ev(a, env) for a in node.args))
    raise RuleError(f"internal: unexpected node {t.__name__}")  # unreachable after compile_condition


# --------------------------------------------------------------------------------------
# Rules
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Threshold:
    """A named threshold: value, unit, and why that number (with its source)."""

    value: Number
    unit: str
    rationale: str


@dataclass(frozen=True, eq=False)
class Rule:
    """One symptom rule (a ``rules/<id>.yaml`` file). See ``rules/rule.schema.json``."""

    id: str
    symptom: str
    title: str
    severity: str
    phase: str
    scope: str
    requires: tuple[str, ...]
    thresholds: dict[str, Threshold]
    condition: str
    summary: str
    likely_cause: str
    how_to_verify: str
    fix: str
    references: tuple[str, ...]
    why: str = ""
    evidence: tuple[str, ...] = ()
    min_samples: dict[str, int] = field(default_factory=dict)
    source: str = ""
    tree: ast.Expression | None = field(default=None, repr=False)

    def threshold_values(self) -> dict[str, Number]:
        return {k: t.value for k, t in self.thresholds.items()}

    def with_thresholds(self, values: Mapping[str, Number]) -> "Rule":
        """A copy with some threshold values replaced (names must exist)."""
        th = dict(self.thresholds)
        for k, v in values.items():
            th[k] = replace(th[k], value=v)
        return replace(self, thresholds=th)


@lru_cache(maxsize=1)
def rule_schema() -> dict:
    """The JSON Schema every rule file must satisfy (``rules/rule.schema.json``)."""
    return json.loads(resources.files("diagnose.rules").joinpath("rule.schema.json").read_text(encoding="utf-8"))


def _validate_schema(data: Any, where: str) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(rule_schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        loc = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise RuleError(f"{where}: schema: at {loc}: {e.message}{more}")


def _check_template(template: str, allowed: set[str], where: str, what: str = "summary") -> None:
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise RuleError(f"{where}: {what} template is invalid: {e}") from None
    for _, fname, spec, conv in parts:
        if fname is None:
            continue
        if fname == "" or fname not in allowed:
            raise RuleError(f"{where}: {what} refers to {fname!r}, which is not a required/evidence finding or a threshold")
        if conv:
            raise RuleError(f"{where}: {what} field {fname!r}: conversions (!r/!s/!a) are not allowed")
        if spec and ("{" in spec or "}" in spec):
            raise RuleError(f"{where}: {what} field {fname!r}: nested format fields are not allowed")
        if spec:
            ok = False
            for probe in (0.5, 1):
                try:
                    format(probe, spec)
                    ok = True
                except (ValueError, TypeError):
                    pass
            if not ok:
                raise RuleError(f"{where}: {what} field {fname!r}: format spec {spec!r} does not format numbers")


def render_template(template: str, values: Mapping[str, Any]) -> str:
    """Fill ``{name[:spec]}`` fields with numbers (dotted finding names taken literally; None -> "n/a")."""
    out = []
    for lit, fname, spec, _ in string.Formatter().parse(template):
        out.append(lit)
        if fname is None:
            continue
        v = values.get(fname)
        if v is None:
            out.append("n/a")
            continue
        try:
            out.append(format(v, spec or ""))
        except (ValueError, TypeError):
            try:
                out.append(format(float(v), spec or ""))
            except (ValueError, TypeError):
                out.append(str(v))
    return "".join(out)


def rule_from_dict(data: Any, where: str, expected_id: str | None = None, validate: bool = True) -> Rule:
    """Validate one parsed rule file and compile its condition.

    ``validate=False`` skips the JSON Schema check (used for the packaged rules, which the
    test suite validates; importing jsonschema costs seconds on some installs). The
    condition is always parsed and checked against the allowlist.

    Raises:
        RuleError: schema violation, id/file-name mismatch, unknown names, refused condition,
            bad summary template.
    """
    if validate:
        _validate_schema(data, where)
    rid = data["id"]
    if expected_id is not None and rid != expected_id:
        raise RuleError(f"{where}: id {rid!r} does not match the file name {expected_id!r}.yaml")
    requires = tuple(data["requires"])
    evidence = tuple(x for x in data.get("evidence", []) if x not in requires)
    thresholds = {k: Threshold(v["value"], v["unit"], v["rationale"]) for k, v in (data.get("thresholds") or {}).items()}
    names = {mangle(f): "finding" for f in requires}
    names.update({k: "threshold" for k in thresholds})
    tree = compile_condition(data["condition"], names, where)
    unused = [k for k in thresholds if k not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}]
    if unused:
        raise RuleError(f"{where}: threshold(s) {', '.join(unused)} declared but not used in the condition")
    allowed = set(requires) | set(evidence) | set(thresholds)
    _check_template(data["summary"], allowed, where)
    return Rule(
        id=rid,
        symptom=data["symptom"],
        title=data["title"],
        severity=data["severity"],
        phase=data["phase"],
        scope=data["scope"],
        requires=requires,
        thresholds=thresholds,
        condition=data["condition"].strip(),
        summary=data["summary"].strip(),
        likely_cause=data["likely_cause"].strip(),
        how_to_verify=data["how_to_verify"].strip(),
        fix=data["fix"].strip(),
        references=tuple(data["references"]),
        why=(data.get("why") or "").strip(),
        evidence=evidence,
        min_samples=dict(data.get("min_samples") or {}),
        source=where,
        tree=tree,
    )


def _parse_yaml(text: str, where: str) -> Any:
    try:
        return load_yaml(text)
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise RuleError(f"{where}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None


def _rule_files(path: str | Path | None):
    """(display name, stem, text) for every rule file under ``path`` (default: packaged rules)."""
    if path is None:
        root = resources.files("diagnose.rules")
        items = [(f"rules/{p.name}", p.name[:-5], p) for p in root.iterdir() if p.name.endswith(".yaml") and p.is_file()]
    else:
        p = Path(path)
        if not p.exists():
            raise RuleError(f"rules path not found: {path}")
        if p.is_file():
            items = [(str(p), p.stem, p)]
        else:
            items = [(str(f), f.stem, f) for f in p.iterdir() if f.suffix == ".yaml" and f.is_file()]
    for where, stem, f in sorted(items, key=lambda x: x[1]):
        try:
            text = f.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as e:
            raise RuleError(f"{where}: cannot read: {type(e).__name__}") from None
        yield where, stem, text


def load_rules(path: str | Path | None = None, validate: bool | None = None) -> list[Rule]:
    """Load and validate rule files, sorted by id.

    Args:
        path: a directory of ``<id>.yaml`` files (its ``fixtures/`` folder is ignored), one
            rule file, or None for the rules packaged in ``diagnose.rules``.
        validate: check each file against ``rule.schema.json``; default: yes for user rule
            files, no for the packaged ones (validated by the test suite and ``rules test``).

    Raises:
        RuleError: any invalid file (the message names it and what is wrong); duplicate ids.
    """
    if path is None:
        return list(_packaged_rules(bool(validate)))
    return _load(path, True if validate is None else validate)


@lru_cache(maxsize=2)
def _packaged_rules(validate: bool) -> tuple[Rule, ...]:
    return tuple(_load(None, validate))


def _load(path, validate: bool = True) -> list[Rule]:
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for where, stem, text in _rule_files(path):
        data = _parse_yaml(text, where)
        r = rule_from_dict(data, where, expected_id=stem, validate=validate)
        if r.id in seen:
            raise RuleError(f"{where}: duplicate rule id {r.id!r} (also in {seen[r.id]})")
        seen[r.id] = where
        rules.append(r)
    return sorted(rules, key=lambda r: r.id)


# --------------------------------------------------------------------------------------
# Overrides
# --------------------------------------------------------------------------------------


def parse_threshold_specs(specs: Iterable[str]) -> dict[str, float]:
    """``["S3-launch-gaps.max_launch_gap_share=0.2"]`` -> ``{"S3-launch-gaps.max_launch_gap_share": 0.2}``.

    Raises:
        DiagnoseError: not RULE.NAME=NUMBER.
    """
    out: dict[str, float] = {}
    for spec in specs or ():
        if "=" not in spec or "." not in spec.split("=", 1)[0]:
            raise DiagnoseError(f"--threshold expects RULE.NAME=VALUE, got {spec!r}")
        key, val = (s.strip() for s in spec.split("=", 1))
        try:
            num = float(val[:-1]) / 100.0 if val.endswith("%") else float(val)
        except ValueError:
            raise DiagnoseError(f"--threshold {key}: {val!r} is not a number") from None
        if not math.isfinite(num):
            raise DiagnoseError(f"--threshold {key}: {val!r} is not finite")
        out[key] = num
    return out


@dataclass
class RulesConfig:
    """Contents of a ``--rules-config`` YAML file."""

    overrides: dict[str, float] = field(default_factory=dict)
    disable: tuple[str, ...] = ()


def load_rules_config(path: str) -> RulesConfig:
    """Read a rules config::

        thresholds:
          S3-launch-gaps.max_launch_gap_share: 0.2      # flat RULE.NAME keys, or
          S2-decode-far-from-bound: {max_bound_ratio: 4}  # nested per rule
        disable: [S7-cpu-region-shorter-than-gpu]

    Raises:
        RuleError: missing/unreadable file, bad YAML, unknown keys, non-numeric values.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise RuleError(f"rules config not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise RuleError(f"cannot read rules config {path}: {type(e).__name__}") from None
    data = _parse_yaml(text, str(path)) or {}
    if not isinstance(data, dict):
        raise RuleError(f"{path}: a rules config is a mapping with keys thresholds and disable")
    extra = set(data) - {"thresholds", "disable"}
    if extra:
        raise RuleError(f"{path}: unknown key(s) {', '.join(sorted(map(str, extra)))} (allowed: thresholds, disable)")
    cfg = RulesConfig()
    th = data.get("thresholds") or {}
    if not isinstance(th, dict):
        raise RuleError(f"{path}: thresholds must be a mapping")
    for k, v in th.items():
        items = [(f"{k}.{n}", x) for n, x in v.items()] if isinstance(v, dict) else [(str(k), v)]
        for key, x in items:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise RuleError(f"{path}: threshold {key} must be a number, got {x!r}")
            if "." not in key:
                raise RuleError(f"{path}: threshold key {key!r} must be RULE.NAME")
            cfg.overrides[key] = x
    dis = data.get("disable") or []
    if not isinstance(dis, list) or not all(isinstance(x, str) for x in dis):
        raise RuleError(f"{path}: disable must be a list of rule ids")
    cfg.disable = tuple(dis)
    return cfg


def apply_overrides(rules: Sequence[Rule], overrides: Mapping[str, Number] | None) -> list[Rule]:
    """Rules with ``{"RULE.NAME": value}`` overrides applied.

    Raises:
        RuleError: unknown rule id or threshold name, or a non-numeric value.
    """
    if not overrides:
        return list(rules)
    by_id = {r.id: r for r in rules}
    per_rule: dict[str, dict[str, Number]] = {}
    for key, val in overrides.items():
        rid, _, name = str(key).rpartition(".")
        if rid not in by_id:
            raise RuleError(f"threshold override {key!r}: unknown rule {rid!r}")
        if name not in by_id[rid].thresholds:
            have = ", ".join(by_id[rid].thresholds) or "none"
            raise RuleError(f"threshold override {key!r}: rule {rid} has no threshold {name!r} (has: {have})")
        if isinstance(val, bool) or not isinstance(val, (int, float)):
            raise RuleError(f"threshold override {key!r}: value must be a number, got {val!r}")
        per_rule.setdefault(rid, {})[name] = val
    return [r.with_thresholds(per_rule[r.id]) if r.id in per_rule else r for r in rules]


# --------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------


@dataclass
class Verdicts:
    """Result of :func:`evaluate`.

    Attributes:
        symptoms: fired rules, worst severity first: {id, symptom, title, severity, phase,
            scope, summary, evidence {findings, thresholds}, likely_cause, how_to_verify,
            fix, references}.
        not_evaluated: {id, symptom, title, severity, missing [finding names], reason}.
        passed: evaluated rules that did not fire: {id, symptom, title, severity, phase,
            scope, summary, evidence}.
    """

    symptoms: list[dict[str, Any]] = field(default_factory=list)
    not_evaluated: list[dict[str, Any]] = field(default_factory=list)
    passed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def fired_ids(self) -> list[str]:
        return [s["id"] for s in self.symptoms]

    def worst(self) -> str | None:
        return self.symptoms[0]["severity"] if self.symptoms else None

    def at_least(self, severity: str) -> list[dict[str, Any]]:
        """Fired symptoms with severity >= ``severity``."""
        return [s for s in self.symptoms if SEVERITY_RANK[s["severity"]] >= SEVERITY_RANK[severity]]

    def to_dict(self) -> dict[str, Any]:
        return {"symptoms": self.symptoms, "not_evaluated": self.not_evaluated, "passed": self.passed}


def _clean(v: Any) -> Number | None:
    return _num(v)


def evaluate(rules: Sequence[Rule], findings: Mapping[str, Any], scope: str | Iterable[str] | None = "trace",
             overrides: Mapping[str, Number] | None = None, unreliable: Iterable[str] | None = None) -> Verdicts:
    """Evaluate ``rules`` of ``scope`` over ``findings``.

    Args:
        rules: from :func:`load_rules`.
        findings: dotted finding name -> number (None/NaN/absent = missing).
        scope: one scope, several, or None for every rule.
        overrides: ``{"RULE.NAME": value}`` threshold overrides.
        unreliable: finding names that are None because the report marks them unreliable
            (:func:`unreliable_findings`); only changes the not-evaluated reason.

    Returns:
        :class:`Verdicts`; a rule with a missing required finding, too few samples, or a
        condition that cannot be computed (division by zero) is in ``not_evaluated``.

    Raises:
        RuleError: an override names an unknown rule or threshold.
    """
    rules = apply_overrides(rules, overrides)
    scopes = None if scope is None else ({scope} if isinstance(scope, str) else set(scope))
    v = Verdicts()
    unreliable = set(unreliable or ())

    def why_missing(names: list[str]) -> str:
        bad = [n for n in names if n in unreliable]
        gone = [n for n in names if n not in unreliable]
        parts = []
        if gone:
            parts.append("missing finding(s): " + ", ".join(gone))
        if bad:
            parts.append("unreliable finding(s) (see quality): " + ", ".join(bad))
        return "; ".join(parts)

    for r in rules:
        if scopes is not None and r.scope not in scopes:
            continue
        head = {"id": r.id, "symptom": r.symptom, "title": r.title, "severity": r.severity}
        vals = {n: _clean(findings.get(n)) for n in r.requires}
        missing = [n for n, x in vals.items() if x is None]
        if missing:
            v.not_evaluated.append({**head, "missing": missing, "reason": why_missing(missing)})
            continue
        short = []
        for n, need in r.min_samples.items():
            have = _clean(findings.get(n))
            if have is None:
                missing.append(n)
            elif have < need:
                short.append(f"{n} = {have:g} < {need}")
        if missing or short:
            reason = "; ".join(filter(None, [why_missing(missing) if missing else "",
                                             "too few samples: " + ", ".join(short) if short else ""]))
            v.not_evaluated.append({**head, "missing": missing, "reason": reason})
            continue
        env = {mangle(n): x for n, x in vals.items()}
        env.update(r.threshold_values())
        try:
            fired = eval_condition(r.tree, env)
        except (ZeroDivisionError, OverflowError) as e:
            v.not_evaluated.append({**head, "missing": [], "reason": f"condition could not be computed: {type(e).__name__}"})
            continue
        ev_findings = dict(vals)
        for n in r.evidence:
            ev_findings[n] = _clean(findings.get(n))
        for n in r.min_samples:
            ev_findings.setdefault(n, _clean(findings.get(n)))
        template_vals = {**ev_findings, **r.threshold_values()}
        entry = {
            **head,
            "phase": r.phase,
            "scope": r.scope,
            "summary": render_template(r.summary, template_vals),
            "evidence": {
                "findings": ev_findings,
                "thresholds": {k: {"value": t.value, "unit": t.unit, "rationale": t.rationale} for k, t in r.thresholds.items()},
            },
        }
        if fired:
            entry.update(likely_cause=r.likely_cause, how_to_verify=r.how_to_verify, fix=r.fix, references=list(r.references))
            v.symptoms.append(entry)
        else:
            v.passed.append(entry)
    v.symptoms.sort(key=lambda s: (-SEVERITY_RANK[s["severity"]], s["id"]))
    return v


def add_verdicts_to_report(report: dict, rules: Sequence[Rule] | None = None,
                           overrides: Mapping[str, Number] | None = None, device: int | None = None) -> dict:
    """Add ``symptoms`` and ``not_evaluated`` (trace-scope rules) to a JSON report.

    The report is updated in place and also returned. ``symptoms`` entries:
    {id, symptom, title, severity, phase, scope, summary, evidence, likely_cause,
    how_to_verify, fix, references}, worst first; ``not_evaluated``: {id, symptom, title,
    severity, missing, reason}.

    Raises:
        RuleError: invalid rules or overrides.
    """
    rules = load_rules() if rules is None else rules
    verdicts = evaluate(rules, findings_from_report(report, device), scope="trace", overrides=overrides,
                        unreliable=unreliable_findings(report, device))
    report["symptoms"] = verdicts.symptoms
    report["not_evaluated"] = verdicts.not_evaluated
    return report


# --------------------------------------------------------------------------------------
# Fixtures
# --------------------------------------------------------------------------------------

EXPECTATIONS = ("fire", "pass", "not_evaluated")


@dataclass
class FixtureResult:
    rule_id: str
    case: str
    expect: str
    got: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.expect == self.got


def _fixture_texts(path: str | Path | None):
    if path is None:
        root = resources.files("diagnose.rules").joinpath("fixtures")
        items = [(f"rules/fixtures/{p.name}", p.name[:-5], p) for p in root.iterdir() if p.name.endswith(".yaml")]
    else:
        root = Path(path)
        root = root / "fixtures" if (root / "fixtures").is_dir() else root
        items = [(str(p), p.stem, p) for p in root.glob("*.yaml")] if root.is_dir() else []
    return {stem: (where, f.read_text(encoding="utf-8")) for where, stem, f in items}


def run_fixtures(rules: Sequence[Rule], path: str | Path | None = None) -> list[FixtureResult]:
    """Run every rule's fixtures (``fixtures/<rule id>.yaml``).

    A fixture file::

        rule: S3-launch-gaps
        cases:
          - name: host-late launches
            expect: fire            # fire | pass | not_evaluated
            findings: {decode.launch_gap_share: 0.3, decode.activity_count: 400}
            overrides: {max_launch_gap_share: 0.2}   # optional, this rule's thresholds

    Each rule needs at least one ``fire`` and one ``pass`` case; a rule without fixtures, or
    a fixture for an unknown rule, is a failed result.

    Args:
        rules: loaded rules.
        path: the rules directory (fixtures in its ``fixtures/``) or the fixtures directory;
            None for the packaged fixtures.
    """
    texts = _fixture_texts(path)
    results: list[FixtureResult] = []
    by_id = {r.id: r for r in rules}
    for stem in sorted(set(texts) - set(by_id)):
        results.append(FixtureResult(stem, "(file)", "rule exists", "no such rule", texts[stem][0]))
    for r in rules:
        if r.id not in texts:
            results.append(FixtureResult(r.id, "(file)", "fixtures", "none", f"add fixtures/{r.id}.yaml"))
            continue
        where, text = texts[r.id]
        try:
            data = _parse_yaml(text, where)
            cases = _check_fixture(data, r, where)
        except RuleError as e:
            results.append(FixtureResult(r.id, "(file)", "valid fixture", "invalid", str(e)))
            continue
        for i, c in enumerate(cases):
            name = str(c.get("name") or f"case {i + 1}")
            ov = {f"{r.id}.{k}": v for k, v in (c.get("overrides") or {}).items()}
            try:
                verdict = evaluate([r], c.get("findings") or {}, scope=None, overrides=ov)
            except RuleError as e:
                results.append(FixtureResult(r.id, name, c["expect"], "error", str(e)))
                continue
            if verdict.symptoms:
                got, detail = "fire", verdict.symptoms[0]["summary"]
            elif verdict.passed:
                got, detail = "pass", verdict.passed[0]["summary"]
            else:
                got, detail = "not_evaluated", verdict.not_evaluated[0]["reason"]
            if got == "not_evaluated" and c["expect"] == "not_evaluated" and c.get("missing"):
                if sorted(c["missing"]) != sorted(verdict.not_evaluated[0]["missing"]):
                    got = "not_evaluated(missing=" + ",".join(verdict.not_evaluated[0]["missing"]) + ")"
            results.append(FixtureResult(r.id, name, c["expect"], got, detail))
    return results


def _check_fixture(data: Any, rule: Rule, where: str) -> list[dict]:
    if not isinstance(data, dict) or set(data) - {"rule", "cases"} or data.get("rule") != rule.id:
        raise RuleError(f"{where}: a fixture file is {{rule: {rule.id}, cases: [...]}}")
    cases = data.get("cases")
    if not isinstance(cases, list) or not cases:
        raise RuleError(f"{where}: cases must be a non-empty list")
    for c in cases:
        if not isinstance(c, dict) or set(c) - {"name", "expect", "findings", "overrides", "missing"}:
            raise RuleError(f"{where}: each case has name, expect, findings, and optional overrides, missing")
        if c.get("expect") not in EXPECTATIONS:
            raise RuleError(f"{where}: case {c.get('name')!r}: expect must be one of {', '.join(EXPECTATIONS)}")
        f = c.get("findings") or {}
        if not isinstance(f, dict):
            raise RuleError(f"{where}: case {c.get('name')!r}: findings must be a mapping")
        for k, v in f.items():
            if not FINDING_NAME_RE.match(str(k)):
                raise RuleError(f"{where}: case {c.get('name')!r}: {k!r} is not a finding name")
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise RuleError(f"{where}: case {c.get('name')!r}: {k} must be a number or null")
    kinds = {c["expect"] for c in cases}
    if not {"fire", "pass"} <= kinds:
        raise RuleError(f"{where}: needs at least one 'fire' (positive) and one 'pass' (negative) case")
    return cases


# --------------------------------------------------------------------------------------
# Reference documentation
# --------------------------------------------------------------------------------------


def rules_markdown(rules: Sequence[Rule]) -> str:
    """The rules reference (``docs/rules.md``): index, condition language, findings, one
    section per rule."""
    L: list[str] = []
    L.append("# Symptom rules reference")
    L.append("")
    L.append("<!-- Generated by `diagnose rules doc > docs/rules.md`; do not edit by hand. -->")
    L.append("")
    L.append("Each rule is one YAML file `rules/<id>.yaml`, checked against `rules/rule.schema.json`, with")
    L.append("positive and negative fixtures in `rules/fixtures/<id>.yaml` (`diagnose rules test` runs them).")
    L.append("Thresholds come from the article's numbers (`domain.md` §3, §5, §7). A rule whose required")
    L.append("finding is missing is reported as **not evaluated** with the missing names, never as passing.")
    L.append("")
    L.append("| id | symptom | severity | scope | phase | title |")
    L.append("|---|---|---|---|---|---|")
    for r in rules:
        L.append(f"| [`{r.id}`](#{r.id.lower()}) | {r.symptom} | {r.severity} | {r.scope} | {r.phase} | {r.title} |")
    L.append("")
    L.append("## Scopes")
    L.append("")
    L.append("- **trace**: one trace (`diagnose run`, `diagnose gate`); findings from `findings_from_report`.")
    L.append("- **sweep**: several traces of one setup at different context / batch / GPU count / prompt length")
    L.append("  (`diagnose sweep --trace A --trace B ... [--label ctx=2048,bs=8 ...]`).")
    L.append("- **compare**: a baseline and a candidate trace (`diagnose compare --baseline A --candidate B`).")
    L.append("- **metrics**: numbers from a metrics JSON file (`--metrics FILE` on `compare` and `gate`).")
    L.append("")
    L.append("## Commands")
    L.append("")
    L.append("Exit status: 0 pass, 1 a check failed, 2 unusable input or arguments (one `error:` line), 3 internal error.")
    L.append("")
    L.append("- `diagnose gate --trace F [--phase decode ...] [--max-launch-gap-share 0.15] [--max-idle-share X]")
    L.append("  [--fail-on SEVERITY] [--allow-partial] [--allow-missing] [--junit out.xml] [--threshold RULE.NAME=V]")
    L.append("  [--rules-config FILE] [--metrics FILE]`: prints measured vs threshold per checked phase (default decode).")
    L.append("  Fails (1) when a phase exceeds the launch-gap (or idle) limit; when a checked phase has no data")
    L.append("  (`<phase>: no data`; `--allow-missing` turns it into a skip: a gate that measured nothing must not pass")
    L.append("  silently, and 2 stays reserved for unreadable input); when the trace is flagged unreliable (`partial`,")
    L.append("  quality `partial_trace` / `graph_coverage_low`) unless `--allow-partial`; and with `--fail-on` when a")
    L.append("  symptom at or above that severity fires. `--max-launch-gap-share` defaults to, and overrides, the")
    L.append("  `S3-launch-gaps` threshold. `--junit` writes one testcase per check and per rule (not evaluated = skipped).")
    L.append("- `diagnose compare --baseline A --candidate B [--format text|json] [--metrics FILE] [--fail-on high]`:")
    L.append("  TTFT/TPOT p50/p90/p99, launch-gap share, idle share, MBU/MFU side by side with ratios; exits 1 when a")
    L.append("  compare/metrics symptom at or above `--fail-on` fires (`latency-regression`, `S6-perplexity-up`).")
    L.append("- `diagnose sweep --trace A --trace B ... [--label ctx=2048,bs=8 ...]`: one label per trace, in order")
    L.append("  (keys ctx, bs, gpus, prompt, name); without labels, batch and context are the medians of the decode step")
    L.append("  markers and the GPU count is the number of devices with activity. Exits 0 unless `--fail-on` is given.")
    L.append("- `diagnose rules list | test | doc`.")
    L.append("")
    L.append("## Condition language")
    L.append("")
    L.append("A condition is a Python-syntax expression checked by an allowlist when the rule loads (never")
    L.append("`eval`): findings are written with dots replaced by `__` (`decode.launch_gap_share` ->")
    L.append("`decode__launch_gap_share`) and must be listed in `requires`; thresholds by their bare name.")
    L.append("Allowed: `and`, `or`, `not`, unary `-`, `+ - * /`, comparisons `< <= > >= == !=` (chains too),")
    L.append("int/float/True/False literals, and `min()`, `max()`, `abs()`. Refused at load, with the file and the")
    L.append("construct named: attribute access, subscripts, any other call, `**`, `%`, `//`, strings, lambdas,")
    L.append("comprehensions, conditional expressions. A division by zero makes the rule not evaluated.")
    L.append("")
    L.append("The `summary` template fills `{finding.name:spec}` and `{threshold:spec}` fields with numbers")
    L.append("(format specs like `.1%`, `.2f`); a missing evidence value prints `n/a`.")
    L.append("")
    L.append("## Overriding thresholds")
    L.append("")
    L.append("- Python: `evaluate(rules, findings, overrides={\"S3-launch-gaps.max_launch_gap_share\": 0.2})`.")
    L.append("- CLI: `--threshold S3-launch-gaps.max_launch_gap_share=0.2` (repeatable; `20%` also accepted).")
    L.append("- CLI: `--rules-config FILE`, a YAML file:")
    L.append("")
    L.append("```yaml")
    L.append("thresholds:")
    L.append("  S3-launch-gaps.max_launch_gap_share: 0.2")
    L.append("  S2-decode-far-from-bound: {max_bound_ratio: 4}")
    L.append("disable: [S7-cpu-region-shorter-than-gpu]")
    L.append("```")
    L.append("")
    L.append("`--threshold` wins over the config file. An unknown rule or threshold name is an error (exit 2).")
    L.append("")
    L.append("## Findings")
    L.append("")
    L.append("Numbers only (flags are 0/1); `None` when unknown. `<phase>` is one of " + ", ".join(PHASE_NAMES) + ";")
    L.append("phase findings describe one GPU device: the one with the most GPU busy time unless `--device` is given.")
    L.append("`<category>` is one of " + ", ".join(CATEGORIES) + ".")
    L.append("")
    L.append("| finding | unit | meaning |")
    L.append("|---|---|---|")
    for name, unit, desc in FINDINGS_CATALOG:
        L.append(f"| `{name}` | {unit} | {desc} |")
    L.append("")
    L.append("## Rules")
    for r in rules:
        L.append("")
        L.append(f"### {r.id}")
        L.append("")
        L.append(f"**{r.title}** — symptom {r.symptom}, severity **{r.severity}**, scope {r.scope}, phase {r.phase}.")
        L.append("")
        L.append("**What it detects.** Fires when:")
        L.append("")
        L.append("```")
        L.append(r.condition)
        L.append("```")
        L.append("")
        L.append("Requires: " + ", ".join(f"`{x}`" for x in r.requires) + ".")
        if r.evidence:
            L.append("Also shown as evidence: " + ", ".join(f"`{x}`" for x in r.evidence) + ".")
        if r.min_samples:
            L.append("Minimum samples: " + ", ".join(f"`{k}` >= {v}" for k, v in r.min_samples.items()) + ".")
        L.append(f"Summary: \"{r.summary}\"")
        L.append("")
        if r.thresholds:
            L.append("| threshold | value | unit | rationale |")
            L.append("|---|---|---|---|")
            for k, t in r.thresholds.items():
                L.append(f"| `{k}` | {t.value} | {t.unit} | {t.rationale} |")
            L.append("")
        if r.why:
            L.append(f"**Why it matters.** {r.why}")
            L.append("")
        L.append(f"**Likely cause.** {r.likely_cause}")
        L.append("")
        L.append(f"**How to verify.** {r.how_to_verify}")
        L.append("")
        L.append(f"**Fix.** {r.fix}")
        L.append("")
        L.append("**References.**")
        L.append("")
        for ref in r.references:
            L.append(f"- {ref}")
    L.append("")
    return "\n".join(L)
