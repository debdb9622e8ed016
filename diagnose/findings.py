"""The findings layer between the report model and the rules.

:func:`flatten` turns a :class:`~diagnose.model.Report` into the rules' flat namespace
(``{dotted name: number or None}``: ``decode.launch_gap_share``, ``latency.tpot_p99_ms``...):
the one flatten of the model. The pipeline ships its result in the report (``findings``,
:func:`diagnose.pipeline.attach_verdicts`); ``gate``, ``compare``, ``sweep``, the web report
and the notebook read that instead of computing their own.

Names: ``<phase>.*`` from the selected device's phase rows (:func:`select_device`; ``main``
is the step phase with the most own time, else ``all``), ``latency.*``, ``steps.*`` (over the
step records), ``trace.*`` and ``quality.*``, ``model.*``. Each name is declared, with its
unit and meaning, by the analyzer module that computes the numbers behind it
(``FINDINGS = declared(...)``, catalog ``diagnose/data/findings.yaml``; :mod:`diagnose.catalog`).

Adding a finding: compute the number in an analyzer and put it on a report record
(:mod:`diagnose.model`); read it here in the function of its section (``_phase``,
``_latency``, ``_steps``, ``_trace``); declare its name in ``findings.yaml`` under the
analyzer's section. The findings golden (``tests/golden/findings``) shows the addition.
"""
from __future__ import annotations

import json
import re
from typing import Any, Mapping

from msgspec import UNSET

from diagnose.analyzers.base import declared
from diagnose.errors import DiagnoseError
from diagnose.inputs import parsing, read_text_file
from diagnose.model import Findings, PhaseRow, Report, Step, decode_report
from diagnose.numeric import div, num
from diagnose.vocab import (
    CATEGORIES,
    EXTERNAL_CAUSES,
    GAP_CAUSES,
    GAP_KINDS,
    HOST_CAUSES,
    PHASES,
    QUALITY_CODES,
    SHARE_CATEGORIES,
    STEP_PHASES,
    UNRELIABLE_CODES,
)

TRACE_FINDINGS = declared("trace", unreliable_codes=", ".join(UNRELIABLE_CODES))

#: Text values rules may print (``labels:`` in a rule); never compared, only shown.
LABELS = declared("labels")

METRICS_FINDINGS = declared("metrics")


def as_report(report: Report | Mapping[str, Any]) -> Report:
    """``report`` as a :class:`~diagnose.model.Report` (a JSON report dict is decoded)."""
    return report if isinstance(report, Report) else decode_report(dict(report))


# ---------------------------------------------------------------- device and rows


def select_device(report: Report, device: int | None = None) -> int | None:
    """Device whose phases the findings (and every view's per-device numbers) describe:
    ``device`` if given; else the device the report's headline names (the finding of largest
    stake across devices, :func:`diagnose.pipeline.attach_verdicts`); else the one with the
    most GPU busy time (ties: the lowest id).

    Raises:
        DiagnoseError: ``device`` is not one of the report's devices.
    """
    alls = [p for p in report.phases if p.name == "all"]
    if not alls:  # reports without an "all" row: any phase stands for its device
        by_dev: dict[Any, PhaseRow] = {}
        for p in report.phases:
            by_dev.setdefault(p.device, p)
        alls = list(by_dev.values())
    devs = [p.device for p in alls]
    if device is not None:
        if device not in devs:
            known = ", ".join(str(d) for d in devs if d is not None) or "none"
            raise DiagnoseError(f"device {device} is not in the trace (devices with GPU activity: {known})")
        return device
    if not alls:
        return None
    h = report.headline
    if h is not UNSET and h is not None and h.device is not None and h.device in devs:
        return h.device
    best = max(alls, key=lambda p: (num(p.gpu_busy_ms) or 0.0, -(p.device or 0)))
    return best.device


def device_ids(report: Report | Mapping[str, Any]) -> list[int]:
    """The report's devices with GPU activity (an ``all`` phase row), in id order."""
    report = as_report(report)
    return sorted({p.device for p in report.phases if p.name == "all" and p.device is not None})


#: What ``--pair-devices`` accepts (README "Comparing traces"): one pairing per comma, the
#: device ids of the traces in order joined by ':' (``0:1,1:0`` pairs baseline 0 with candidate 1
#: and baseline 1 with candidate 0).
PAIR_SPEC_HELP = "BASE:CAND[,BASE:CAND...]"


def pair_devices(reports: list[Report], labels: list[str], spec: str | None = None) -> list[tuple[int | None, ...]]:
    """Which device of each report to read together: one tuple per pairing (one device id per
    report, in order).

    Without ``spec``: by device id when every report holds the same devices (``[(0, 0), (1, 1)]``
    for two two-GPU files), the one device of each when no report holds more than one (a file per
    rank), ``[(None, ...)]`` when none has GPU activity. ``spec`` (``--pair-devices``) names the
    pairings: ``"0:1,1:0"``, one id per report joined by ':'.

    Raises:
        DiagnoseError: the device sets differ and no ``spec`` says which to pair (one line naming
            each report's devices), or ``spec`` is malformed or names a device a report lacks.
    """
    sets = [device_ids(r) for r in reports]
    if spec is not None:
        return _parse_pairs(spec, sets, labels)
    if all(s == sets[0] for s in sets):
        return [tuple(d for _ in sets) for d in sets[0]] or [tuple(None for _ in sets)]
    if all(len(s) <= 1 for s in sets):
        return [tuple(s[0] if s else None for s in sets)]
    held = "; ".join(f"{lab}: {', '.join(map(str, s)) or 'none'}" for lab, s in zip(labels, sets))
    example = ":".join(str(s[0]) if s else "0" for s in sets)
    raise DiagnoseError(f"the traces hold different devices ({held}): say which to pair with --pair-devices "
                        f"{':'.join(['D'] * len(sets))}[,...] (e.g. --pair-devices {example}), or analyse one with --device")


def _parse_pairs(spec: str, sets: list[list[int]], labels: list[str]) -> list[tuple[int | None, ...]]:
    out: list[tuple[int | None, ...]] = []
    for part in (x.strip() for x in str(spec).split(",")):
        ids = part.split(":")
        if not part or len(ids) != len(sets) or not all(i.strip().isdigit() for i in ids):
            raise DiagnoseError(f"--pair-devices expects {len(sets)} device ids joined by ':' per pairing, "
                                f"pairings separated by ',' (e.g. {':'.join(['0'] * len(sets))}), got {spec!r}")
        pair = tuple(int(i) for i in ids)
        for lab, s, d in zip(labels, sets, pair):
            if d not in s:
                raise DiagnoseError(f"--pair-devices {part}: device {d} is not in {lab} "
                                    f"(devices with GPU activity: {', '.join(map(str, s)) or 'none'})")
        out.append(pair)
    return out


def describe_pairs(pairs: list[tuple[int | None, ...]], labels: list[str]) -> str:
    """One line naming the pairings: "devices paired: baseline 0 with candidate 0, baseline 1 with candidate 1"."""
    def one(pair):
        return " with ".join(f"{lab} {'-' if d is None else d}" for lab, d in zip(labels, pair))

    return "devices paired: " + ", ".join(one(p) for p in pairs)


def device_rows(report: Report, device: int | None = None) -> dict[str, PhaseRow]:
    """``{phase name: row}`` of the selected device (:func:`select_device`)."""
    dev = select_device(report, device)
    return {p.name: p for p in report.phases if p.device == dev and p.name in PHASES}


def main_row(rows: Mapping[str, PhaseRow]) -> PhaseRow | None:
    """The step phase row with the most own time (``trace.main_phase``), else the ``all`` row."""
    steps = [p for n, p in rows.items() if n in STEP_PHASES]
    if steps:
        return max(steps, key=lambda p: num(p.own_ms) or 0.0)
    return rows.get("all")


def unreliable_findings(report: Report, device: int | None = None) -> set[str]:
    """Dotted names of the selected device's phase numbers the report marks unreliable
    (each phase's ``unreliable`` list, e.g. idle and launch-gap shares when graph coverage is low)."""
    rows = device_rows(report, device)
    main = main_row(rows)
    if main is not None:
        rows = {**rows, "main": main}
    # a number the phase marks unreliable makes the findings derived from it unreliable too
    return {f"{n}.{k}" for n, p in rows.items() for u in p.unreliable for k in (u, *_DERIVED.get(u, ()))}


#: Findings computed from a phase number (when that number is unreliable, so are they).
_DERIVED = {"launch_gap_share": ("launch_gap_own_share",), "gpu_idle_share": ("gpu_idle_own_share",)}


# ---------------------------------------------------------------- the flatten


def flatten(report: Report | Mapping[str, Any], device: int | None = None, include_unreliable: bool = False) -> Findings:
    """The report as the rules' flat namespace.

    Args:
        report: a :class:`~diagnose.model.Report` (or its JSON dict).
        device: GPU device id for the ``<phase>.*`` findings; default the device with the
            most GPU busy time (ties: lowest id).
        include_unreliable: keep numbers a phase lists under ``unreliable`` (default: they
            become None, so rules that need them are not evaluated).

    Returns:
        Numbers only (ints, floats; flags as 0/1); None where a value is unknown. Names are
        listed in :func:`diagnose.catalog.catalog`.

    Raises:
        DiagnoseError: ``device`` is not in the report.
    """
    report = as_report(report)
    dev = select_device(report, device)
    rows = device_rows(report, dev)
    out: Findings = {}
    main = main_row(rows)
    for name, p in list(rows.items()) + ([("main", main)] if main is not None else []):
        _phase(p, name, out)
    own = [x for x in (num(rows[ph].own_ms) for ph in STEP_PHASES if ph in rows) if x]
    out["steps.own_ms"] = sum(own) if own else None
    _launches(report, out)
    out["trace.device"] = dev
    alls = [p for p in report.phases if p.name == "all" and p.device is not None]
    out["trace.device_count"] = len(alls)
    out["trace.gpu_activity_count"] = next((num(p.activity_count) for p in alls if p.device == dev), None)
    _latency(report, out)
    _steps(report.steps, out)
    m = report.model
    if m is not None:  # weight_bytes is per rank under tensor parallelism: the whole model's bits per weight
        wb, params, tp = num(m.weight_bytes), num(m.params_total), num(m.tp) or 1
        out["model.weight_bits"] = wb * tp * 8 / params if wb and params else None
    else:
        out["model.weight_bits"] = None
    _trace(report, out)
    _layers(report, dev, main, out)
    if not include_unreliable:
        for name in unreliable_findings(report, dev):
            if name in out:
                out[name] = None
    return out


def _phase(p: PhaseRow, n: str, out: Findings) -> None:
    """``<n>.*`` of one phase row: waits, steps, attainment, phase stats, timeline, categories.

    Shares of the window are over the phase's *own* window (``<n>.own_window_ms``: the GPU
    window less idle time whose cause is outside the served steps, equal to ``window_ms``
    when there is none): one denominator for every share of the window a rule reads."""
    measured = p.activity_count > 0  # no GPU activity: nothing measured
    by = p.idle_by_cause_ms
    for c in GAP_CAUSES:
        out[f"{n}.idle_{c}_ms"] = float(by.get(c, 0.0)) if measured else None
    longest = p.gaps.longest
    out[f"{n}.longest_gap_ms"] = (longest[0].duration_ms if longest else 0.0) if measured else None
    window, busy = p.window_ms, p.gpu_busy_ms
    own_share = own_idle = own_window = None
    if measured and window and busy is not None:
        own_window = max(window - sum(float(by.get(c, 0.0)) for c in EXTERNAL_CAUSES), 0.0)
        own_idle = max(0.0, own_window - busy)
        own_share = own_idle / own_window if own_window > 0 else None
    out[f"{n}.own_window_ms"] = own_window
    # the row's own share (reports written before the row carried it: the same formula here)
    out[f"{n}.gpu_idle_own_share"] = (num(p.gpu_idle_own_share) if p.gpu_idle_own_share is not None else own_share) if measured else None
    out[f"{n}.idle_own_ms"] = own_idle
    hb = [g.duration_ms for g in longest if g.cause == "host_blocked"]
    out[f"{n}.longest_host_blocked_ms"] = (max(hb) if hb else 0.0) if measured else None
    _causes(p, n, out, measured)
    out[f"{n}.steps"] = num(p.step_count)
    out[f"{n}.wall_ms"] = num(p.wall_ms)
    out[f"{n}.own_ms"] = num(p.own_ms)
    _attainment(p, n, out)
    for k in ("small_kernel_ms", "small_kernel_count", "h2d_ms", "comm_exposed_ms"):
        out[f"{n}.{k}"] = num(getattr(p, k))
    out[f"{n}.small_kernel_share"] = div(p.small_kernel_ms, own_window)
    out[f"{n}.h2d_share"] = div(p.h2d_ms, own_window)
    out[f"{n}.comm_exposed_share"] = div(p.comm_exposed_ms, own_window)
    hidden = None if p.comm_hidden_ms is UNSET else num(p.comm_hidden_ms)
    out[f"{n}.comm_hidden_ms"] = hidden
    out[f"{n}.comm_hidden_share"] = div(hidden, (hidden or 0.0) + (num(p.comm_exposed_ms) or 0.0)) if hidden is not None else None
    out[f"{n}.top_kernel_share"] = num(p.top_kernels[0].kernel_time_share) if p.top_kernels else None
    out[f"{n}.small_kernel_own_count"] = num(p.small_kernel_own_count)
    out[f"{n}.small_kernel_own_share"] = num(p.small_kernel_own_share)
    out[f"{n}.small_kernel_saving_ms"] = num(p.small_kernel_saving_ms)
    _kernel_advice(p, n, out)
    _timeline(p, n, out, own_window)
    _categories(p, n, out)


def _cause_num(r: Any) -> float:
    """A cause row's time: in the phase's steps when it has steps, else in its gaps."""
    return float(r.steps_ms if r.steps_ms is not None else r.ms)


#: Host causes that name what the host did (host_unknown says the trace does not show it).
KNOWN_HOST = tuple(c for c in HOST_CAUSES if c != "host_unknown")


def top_host_cause(p: PhaseRow) -> Any:
    """The phase's largest internal cause the host's events name (a
    :class:`~diagnose.model.CauseRow`; never ``host_unknown``), or None."""
    rows = [r for r in p.causes if r.cause in KNOWN_HOST and not r.external and _cause_num(r) > 0]
    return max(rows, key=_cause_num) if rows else None


def _causes(p: PhaseRow, n: str, out: Findings, measured: bool) -> None:
    """``<n>.idle_<cause>_share``, ``<n>.per_step_<cause>_ms``, the top host cause's numbers,
    the graph-step share and the collectives' split."""
    rows = {r.cause: r for r in p.causes}
    for c in GAP_CAUSES:
        r = rows.get(c)
        out[f"{n}.idle_{c}_share"] = (num(r.share) if r is not None else 0.0) if measured else None
        out[f"{n}.per_step_{c}_ms"] = (num(r.per_step_ms) if r is not None else (0.0 if p.step_count else None)) if measured else None
    top = top_host_cause(p)
    host_internal = [r for r in p.causes if r.cause in KNOWN_HOST and not r.external]
    out[f"{n}.host_cause_ms"] = (_cause_num(top) if top is not None else 0.0) if measured else None
    out[f"{n}.host_cause_per_step_ms"] = ((num(top.per_step_ms) if top.per_step_ms is not None else top.ms)
                                          if top is not None else 0.0) if measured else None
    out[f"{n}.host_cause_share"] = (num(top.share) if top is not None else 0.0) if measured else None
    out[f"{n}.host_idle_ms"] = sum(_cause_num(r) for r in host_internal) if measured else None
    out[f"{n}.host_idle_share"] = (min(1.0, sum(num(r.share) or 0.0 for r in host_internal)) if measured else None)
    idle_steps = [r for r in p.causes if not r.external and r.steps_ms is not None and r.cause != "collective_wait"]
    own = num(p.own_ms)
    out[f"{n}.step_idle_share"] = (min(1.0, sum(float(r.steps_ms) for r in idle_steps) / own) if idle_steps and own
                                   else out.get(f"{n}.gpu_idle_own_share")) if measured else None
    out[f"{n}.graph_step_share"] = num(p.graph_step_share) if p.graph_step_share is not None else 0.0
    out[f"{n}.collective_comm_ms"] = num(p.collective_comm_ms)
    out[f"{n}.collective_wait_ms"] = num(p.collective_wait_ms)
    cw = rows.get("collective_wait")
    out[f"{n}.collective_wait_share"] = num(cw.share) if cw is not None else 0.0


def _attainment(p: PhaseRow, n: str, out: Findings) -> None:
    for k in ("mfu", "mbu", "achieved_tflops", "achieved_tbps", "arithmetic_intensity", "bound_ratio",
              "peak_tbps", "peak_tflops", "flops", "bytes", "forward_coverage"):
        v = getattr(p, k)
        if v is not UNSET:
            out[f"{n}.{k}"] = num(v)
    out[f"{n}.compute_bound"] = 1 if p.bound == "compute" else 0 if p.bound == "memory" else None
    # a fragment's (or any unreliable) attainment says nothing about the timing
    out[f"{n}.bandwidth_over_peak"] = None if "achieved_tbps" in p.unreliable else div(p.achieved_tbps, p.peak_tbps)


def ranked_classes(p: PhaseRow) -> list:
    """The phase's op classes a finding may name, by loss: known loss, not small (a small
    class's loss is a per-kernel fixed cost the small-kernel tax prices)."""
    return [c for c in p.op_classes if c.loss_ms is not None and not c.small]


def roofline_speedup(phase_row, which: str) -> dict[str, float]:
    """``--speedup`` factors that bring a phase's op classes to their roofline (README "Op
    classes and their loss"): per kernel category, its kernel time T over T - loss, the loss
    summed over the classes of that category; ``which``: ``all`` classes with a known loss, or
    ``second``: the class with the second largest loss a finding may name
    (:func:`ranked_classes`). Categories not in the vocabulary are left out;
    a loss of all the time removes the category (``inf``)."""
    from diagnose.vocab import CATEGORIES

    classes = [c for c in phase_row.op_classes if c.loss_ms is not None]
    if which == "second":
        ranked = ranked_classes(phase_row)
        classes = ranked[1:2]
    loss: dict[str, float] = {}
    for c in classes:
        if c.name in CATEGORIES and c.loss_ms > 0:
            loss[c.name] = loss.get(c.name, 0.0) + c.loss_ms
    out = {}
    for cat, lost in loss.items():
        total = float((phase_row.categories_ms or {}).get(cat) or 0.0)
        total = max(total, sum(c.total_ms for c in phase_row.op_classes if c.name == cat))
        out[cat] = float("inf") if lost >= total else total / (total - lost)
    return out


def _kernel_advice(p: PhaseRow, n: str, out: Findings) -> None:
    """Loss against the roofline (``loss_*``) and the precision lever of one phase row."""
    known = [c.loss_ms for c in p.op_classes if c.loss_ms is not None]
    out[f"{n}.loss_ms"] = sum(known) if known else None
    ranked = ranked_classes(p)
    own = num(p.own_ms)
    for i in (1, 2):
        c = ranked[i - 1] if len(ranked) >= i else None
        out[f"{n}.loss_{i}_ms"] = None if c is None else c.loss_ms
        out[f"{n}.loss_{i}_step_ms"] = None if c is None else c.loss_step_ms
        out[f"{n}.loss_{i}_attainment"] = None if c is None else c.attainment
        out[f"{n}.loss_{i}_share"] = None if c is None else div(c.loss_ms, own)
    pr = p.precision
    out[f"{n}.fp32_matrix_ms"] = None if pr is None else pr.fp32_matrix_ms
    out[f"{n}.fp32_matrix_share"] = None if pr is None else pr.fp32_matrix_share
    out[f"{n}.precision_gain"] = None if pr is None else pr.gain
    out[f"{n}.precision_bf16_gain"] = None if pr is None else pr.bf16_gain
    out[f"{n}.precision_saving_ms"] = None if pr is None else pr.saving_ms


def _timeline(p: PhaseRow, n: str, out: Findings, own_window: float | None = None) -> None:
    for k in ("window_ms", "gpu_busy_ms", "gpu_idle_share", "launch_gap_share"):
        out[f"{n}.{k}"] = num(getattr(p, k))
    by_kind = p.gaps.ms_by_kind
    for kind in GAP_KINDS:
        out[f"{n}.{kind}_gap_ms"] = num(by_kind.get(kind)) if by_kind else None
    out[f"{n}.other_gap_share"] = div(by_kind.get("other"), own_window) if by_kind else None
    out[f"{n}.launch_gap_own_share"] = div(by_kind.get("launch", 0.0), own_window) if by_kind else None
    launch = p.gaps.launch
    out[f"{n}.launch_gap_count"] = num(launch.count)
    out[f"{n}.launch_gap_p50_us"] = num(launch.p50_us)
    out[f"{n}.launch_gap_p99_us"] = num(launch.p99_us)
    out[f"{n}.gap_max_us"] = num(p.gaps.all.max_us)


def kernel_busy_ms(p: PhaseRow) -> float | None:
    """The phase's kernel time as a share's denominator: the union of its kernels' intervals
    (``kernel_busy_ms``; a report written before it existed: the summed ``kernel_ms``)."""
    return num(p.kernel_ms if p.kernel_busy_ms is UNSET else p.kernel_busy_ms)


def _categories(p: PhaseRow, n: str, out: Findings) -> None:
    """Category times (busy unions) and their shares of the kernel busy time."""
    for k in ("attention_share", "kernel_ms", "kernel_count", "activity_count"):
        out[f"{n}.{k}"] = num(getattr(p, k))
    cats = p.categories_ms
    busy = kernel_busy_ms(p)
    out[f"{n}.kernel_busy_ms"] = busy
    for c in CATEGORIES:
        out[f"{n}.{c}_ms"] = num(cats.get(c, 0.0))
    for c in SHARE_CATEGORIES:
        out[f"{n}.{c}_share"] = div(cats.get(c, 0.0), busy)
    out[f"{n}.comm_share"] = div(cats.get("communication", 0.0), busy)
    # elementwise and norm kernels never overlap each other's streams in practice; their sum
    # is bounded by the kernel busy time to keep the share a share
    en = round(cats.get("elementwise", 0.0) + cats.get("norm", 0.0), 6)  # the report's ms precision
    en = min(en, busy) if busy is not None else en
    out[f"{n}.elementwise_norm_ms"] = num(en)
    out[f"{n}.elementwise_norm_share"] = div(en, busy)
    kcats = {c: v for c, v in cats.items() if c not in ("memcpy", "memset")}
    out[f"{n}.top_category_share"] = div(max(kcats.values()), busy) if kcats else None


def _launches(report: Report, out: Findings) -> None:
    counts = quality_counts(report)
    launches = report.launches
    out["trace.graph_launches"] = num(launches.graph_launches)
    out["trace.graph_coverage"] = num(launches.graph_coverage)
    out["trace.host_launch_calls"] = num(launches.host_launch_calls)
    graph = counts.get("graph_kernels_no_launch", 0)
    total_acts = sum(num(p.activity_count) or 0 for p in report.phases if p.name == "all" and p.device is not None)
    out["trace.graph_kernel_count"] = graph
    out["trace.graph_kernel_share"] = graph / total_acts if total_acts else None
    out["trace.fused_attention_share"] = num(launches.fused_attention_share)
    ind = num(launches.inductor_kernels)
    out["trace.inductor_kernel_share"] = ind / total_acts if total_acts and ind is not None else None
    out["trace.unlinked_count"] = counts.get("unlinked_kernels", 0)


def _latency(report: Report, out: Findings) -> None:
    lat = report.latency
    out["latency.ttft_ms"] = num(lat.ttft_ms)
    out["latency.ttft_samples"] = num(lat.ttft_samples)
    pre, tp, itl, dec = lat.prefill_step_ms, lat.tpot_ms, lat.itl_ms, lat.decode_step_ms
    for q in ("p50", "p90", "p99"):
        f = f"{q}_ms"
        out[f"latency.ttft_{q}_ms"] = num(getattr(pre, f))
        out[f"latency.tpot_{q}_ms"] = num(getattr(tp, f))
        out[f"latency.itl_{q}_ms"] = num(getattr(itl, f))
        out[f"latency.prefill_step_{q}_ms"] = num(getattr(pre, f))
        out[f"latency.decode_step_{q}_ms"] = num(getattr(dec, f))
    out["latency.tpot_mean_ms"] = num(tp.mean_ms)
    out["latency.tpot_samples"] = num(lat.tpot_samples)
    out["latency.itl_samples"] = num(lat.itl_samples)
    out["latency.tpot_p99_over_p50"] = div(tp.p99_ms, tp.p50_ms)


def _pct(values: list, q: float) -> float | None:
    """Percentile with numpy's linear interpolation, None when empty."""
    import numpy as np

    return float(np.percentile(values, q)) if len(values) else None


def _steps(steps: list[Step], out: Findings) -> None:
    """``steps.*`` over the step records (and ``latency.decode_throughput_tok_s``)."""
    steps = sorted(steps, key=lambda s: s.start_ns)
    by = {ph: [s for s in steps if s.phase == ph] for ph in STEP_PHASES}
    out["steps.count"] = len(steps)
    for ph in STEP_PHASES:
        out[f"steps.{ph}_count"] = len(by[ph])
    pw = [s.own_ms for s in by["prefill"] if s.own_ms is not None]
    dw = [s.own_ms for s in by["decode"] if s.own_ms is not None]
    out["steps.prefill_max_ms"] = max(pw) if pw else None
    out["steps.prefill_p50_ms"] = _pct(pw, 50)
    out["steps.decode_p50_ms"] = _pct(dw, 50)
    out["steps.decode_p99_ms"] = _pct(dw, 99)
    out["steps.decode_max_ms"] = max(dw) if dw else None
    # prefill (or mixed) steps with a decode step both before and after them (S5)
    phases = [s.phase for s in steps]
    dec_idx = [i for i, ph in enumerate(phases) if ph == "decode"]
    if len(dec_idx) >= 2:
        inter = [steps[i].own_ms for i in range(dec_idx[0] + 1, dec_idx[-1]) if phases[i] in ("prefill", "mixed")]
        inter = [w for w in inter if w is not None]
        out["steps.prefill_interleaved_count"] = len(inter)
        out["steps.prefill_interleaved_max_ms"] = max(inter) if inter else 0.0
    else:
        out["steps.prefill_interleaved_count"] = 0
        out["steps.prefill_interleaved_max_ms"] = None
    mixed = [s for s in by["mixed"] if s.own_ms is not None]
    longest = max(mixed, key=lambda s: s.own_ms) if mixed else None
    out["steps.mixed_max_ms"] = num(longest.own_ms) if longest else None
    out["steps.mixed_max_decode_requests"] = num(longest.decode_requests) if longest else None
    out["steps.mixed_max_tokens"] = num(longest.tokens) if longest else None
    db = [s.batch for s in by["decode"] if s.batch is not None]
    dc = [s.context for s in by["decode"] if s.context is not None]
    out["steps.decode_p50_batch"] = _pct(db, 50)
    out["steps.decode_max_batch"] = max(db) if db else None
    out["steps.decode_p50_context"] = _pct(dc, 50)
    out["steps.decode_max_context"] = max(dc) if dc else None
    ptoks, prompts = [], []
    for s in by["prefill"]:
        if s.tokens is not None:
            ptoks.append(s.tokens)
            prompts.append(s.tokens / s.batch if s.batch else s.tokens)
    out["steps.prefill_max_tokens"] = max(ptoks) if ptoks else None
    out["steps.prefill_max_prompt_tokens"] = max(prompts) if prompts else None
    out["steps.prefill_p50_prompt_tokens"] = _pct(prompts, 50)
    _user_timed(steps, out)
    out["latency.decode_throughput_tok_s"] = (div(out["steps.decode_p50_batch"] * 1000.0, out["latency.tpot_p50_ms"])
                                              if out.get("steps.decode_p50_batch") is not None else None)


def _user_timed(steps: list[Step], out: Findings) -> None:
    """User-timed CPU regions shorter than the GPU work they launched (S7). Engine step markers
    (vLLM, SGLang, this project's collector) end before their GPU work by design (asynchronous
    launch); only ranges the user timed themselves (--phase-regex on a marker, not on an engine's
    python frame, which also returns before its GPU work by design) count."""
    with_gpu = timed = shorter = 0
    ratios = []
    for s in steps:
        if s.gpu_start_ns is None or s.gpu_end_ns is None or s.scope != "cpu":
            continue
        with_gpu += 1
        if not str(s.grammar or "").startswith("user:") or s.evidence != "marker":
            continue
        timed += 1
        cpu, gpu = s.end_ns - s.start_ns, s.gpu_end_ns - s.gpu_start_ns
        if s.end_ns < s.gpu_end_ns and cpu < gpu:
            shorter += 1
        if cpu > 0:
            ratios.append(gpu / cpu)
    out["steps.with_gpu_count"] = with_gpu
    out["steps.user_timed_count"] = timed
    out["steps.cpu_shorter_than_gpu_count"] = shorter if timed else None
    out["steps.cpu_shorter_than_gpu_share"] = shorter / timed if timed else None
    out["steps.max_gpu_over_cpu"] = max(ratios) if ratios else None


def _trace(report: Report, out: Findings) -> None:
    codes = quality_counts(report)
    for c in QUALITY_CODES:
        out[f"quality.{c}"] = codes.get(c, 0)
    for c, v in codes.items():
        out[f"quality.{c}"] = v
    partial = 1 if report.partial else 0
    out["trace.partial"] = partial
    out["trace.unreliable"] = 1 if partial or any(codes.get(c) for c in UNRELIABLE_CODES) else 0
    ratios = [out[k] for k in out if k.endswith(".bandwidth_over_peak") and out[k] is not None]
    out["trace.max_bandwidth_over_peak"] = max(ratios) if ratios else None
    if codes.get("bandwidth_above_peak"):
        out["trace.bandwidth_above_peak"] = 1
    elif ratios:
        out["trace.bandwidth_above_peak"] = 1 if max(ratios) > 1.0 else 0
    else:
        out["trace.bandwidth_above_peak"] = None


def main_segmentation(report: Report, device: int | None, main: PhaseRow | None = None):
    """The layer segmentation the ``layers.*`` findings describe: the device's main phase's
    (``main``: :func:`main_row`), else its segmentation with the most forward time; None."""
    segs = [s for s in report.layer_segmentation if s.device == device]
    if not segs:
        return None
    if main is not None:
        hit = [s for s in segs if s.phase == main.name]
        if hit:
            return hit[0]
    return max(segs, key=lambda s: s.forward_ms)


_CONFIDENCE = {"high": 3, "medium": 2, "low": 1}


def _layers(report: Report, dev: int | None, main: PhaseRow | None, out: Findings) -> None:
    """``layers.*`` (the main phase's segmentation) and ``coverage.*`` of the device."""
    seg = main_segmentation(report, dev, main)
    out["layers.count"] = seg.layers if seg is not None else None
    out["layers.expected"] = seg.expected_layers if seg is not None else None
    out["layers.confidence"] = _CONFIDENCE.get(seg.confidence) if seg is not None else None
    out["layers.agreement"] = seg.agreement.get("structural") if seg is not None else None
    out["layers.max_ratio"] = seg.max_ratio if seg is not None else None
    out["layers.max_ratio_layer"] = seg.max_ratio_layer if seg is not None else None
    out["layers.max_ratio_excess_ms"] = seg.max_ratio_excess_ms if seg is not None else None
    out["layers.max_ratio_excess_share"] = div(seg.max_ratio_excess_ms, seg.forward_ms) if seg is not None else None
    cov = next((c for c in report.coverage if c.device == dev), None)
    for k in ("forward_share", "unattributed_ms", "graph_kernel_share", "graph_forward_share", "graph_op_share", "op_share"):
        out[f"coverage.{k}"] = num(getattr(cov, k)) if cov is not None else None


def quality_counts(report: Report) -> dict[str, int | float]:
    """``{code: count}`` of a report's quality issues (1 for an issue without a count; codes
    sanitized to finding-name segments, see :func:`sanitize_code`)."""
    codes: dict[str, int | float] = {}
    for q in report.quality:
        c = sanitize_code(q.code)
        cnt = None if q.count is UNSET else num(q.count)
        codes[c] = codes.get(c, 0) + (cnt if cnt is not None else 1)
    return codes


def sanitize_code(code: str) -> str:
    """Quality code -> a finding-name segment (lowercase, [a-z0-9_], no double '_')."""
    s = re.sub(r"[^a-z0-9]+", "_", str(code).lower()).strip("_")
    if not s or not s[0].isalpha():
        s = "q_" + s if s else "q"
    return s


def report_findings(report: Report | Mapping[str, Any], device: int | None = None) -> Findings:
    """The findings a report ships (``report.findings``) when they describe ``device`` (or
    no device was asked for); else :func:`flatten` of it."""
    report = as_report(report)
    if report.findings is not UNSET and (device is None or report.findings.get("trace.device") == device):
        return dict(report.findings)
    return flatten(report, device)


# ---------------------------------------------------------------- labels


def labels(report: Report | Mapping[str, Any], device: int | None = None) -> dict[str, str]:
    """Text labels (:data:`LABELS`) of the selected device's report rows."""
    from diagnose.analyzers.categories import base_name

    report = as_report(report)
    rows: dict[str, PhaseRow] = device_rows(report, device)
    out: dict[str, str] = {}
    own = {n: num(rows[n].own_ms) or 0.0 for n in STEP_PHASES if n in rows}
    out["trace.main_phase"] = max(own, key=lambda n: own[n]) if own else "the trace"
    main = main_row(rows)
    if main is not None:
        rows = {**rows, "main": main}
    for n, p in rows.items():
        _cause_labels(p, n, out)
        if p.top_kernels:
            out[f"{n}.top_kernel"] = base_name(str(p.top_kernels[0].name or ""))[:80]
        cats = {c: v for c, v in p.categories_ms.items() if c not in ("memcpy", "memset")}
        if cats:
            out[f"{n}.top_category"] = max(cats, key=lambda c: cats[c])
        _loss_labels(p, n, out)
    a = rows.get("all")
    by = a.idle_by_cause_ms if a is not None else {}
    if by:
        out["all.top_idle_cause"] = max(by, key=lambda c: by[c])
        own = {c: v for c, v in by.items() if c not in EXTERNAL_CAUSES and v > 0}
        if own:
            out["all.top_own_idle_cause"] = max(own, key=lambda c: own[c])
    longest = a.gaps.longest if a is not None else []

    def call(g) -> str:
        return g.host_call or (f"queued after {g.waited_on}" if g.waited_on else None) or "nothing in the trace"

    if longest:
        out["all.longest_gap_host_call"] = call(longest[0])
    own_gaps = [g for g in longest if g.cause not in EXTERNAL_CAUSES]
    if own_gaps:
        out["all.longest_own_gap_host_call"] = call(max(own_gaps, key=lambda g: g.duration_ms))
    hb = [g for g in longest if g.cause == "host_blocked"]
    if hb:
        out["all.longest_host_blocked_call"] = max(hb, key=lambda g: g.duration_ms).host_call or "an unnamed call"
    seg = main_segmentation(report, select_device(report, device), main)
    if seg is not None:
        out["layers.source"] = {"modules": "nn.Module frames", "ranges": "record_function/NVTX ranges",
                                "capture": "the capture trace", "structural": "the kernel sequence"}[seg.source]
        if seg.max_ratio_class is not None:
            out["layers.max_ratio_class"] = seg.max_ratio_class
            row = next((r for r in report.layers if r.device == seg.device and r.phase == seg.phase
                        and r.layer == seg.max_ratio_layer), None)
            out["layers.max_ratio_type"] = (row.layer_type if row is not None and row.layer_type else "decoder")
    return out


def _cause_labels(p: PhaseRow, n: str, out: dict[str, str]) -> None:
    """``<n>.host_cause``, ``.host_cause_text``, ``.host_frame``, ``.frame_<cause>`` and
    ``.idle_split`` of one phase row."""
    from diagnose.vocab import GAP_CAUSE_TABLE

    from diagnose.numeric import fmt_ms

    short = {c.name: c.short for c in GAP_CAUSE_TABLE}
    for r in p.causes:
        if r.frame:
            out[f"{n}.frame_{r.cause}"] = r.frame
        per = r.per_step_ms if r.per_step_ms is not None and p.step_count else None
        out[f"{n}.amount_{r.cause}"] = f"{fmt_ms(per)} ms per step" if per is not None else f"{fmt_ms(r.ms)} ms"
    top = top_host_cause(p)
    if top is not None:
        out[f"{n}.host_cause"] = top.cause
        out[f"{n}.host_cause_amount"] = out[f"{n}.amount_{top.cause}"]
        out[f"{n}.host_cause_text"] = short.get(top.cause, top.cause)
        frame = top.frame or "an untraced host thread"
        if top.cause == "compile_guard" and (p.graph_step_share or 0) > 0:
            frame += " before the first graph replay"
        out[f"{n}.host_frame"] = frame
    waiting = [r for r in p.causes if not r.external and _cause_num(r) > 0 and r.cause != "pipelined"]
    tot = sum(_cause_num(r) for r in waiting)
    if tot > 0:
        top3 = [r for r in sorted(waiting, key=_cause_num, reverse=True)[:3] if _cause_num(r) >= 0.01 * tot]
        split = ", ".join(f"{short.get(r.cause, r.cause)} {_cause_num(r) / tot:.0%}" for r in top3)
        out[f"{n}.idle_split"] = f"; waiting: {split}" if len(top3) > 1 else ""


_LEVERS = {"tf32": "TF32 tensor cores (torch.backends.cuda.matmul.allow_tf32 = True)", "bf16": "bf16/fp16 autocast"}


def _loss_labels(p: PhaseRow, n: str, out: dict[str, str]) -> None:
    """``<n>.loss_{1,2}_class/peak/detail`` and ``<n>.precision_lever`` of one phase row."""
    from diagnose.analyzers.oploss import roles_text

    for i, c in enumerate(ranked_classes(p)[:2], start=1):
        out[f"{n}.loss_{i}_class"] = c.label
        out[f"{n}.loss_{i}_peak"] = "peak bandwidth" if c.peak == "bandwidth" else f"peak {c.dtype or 'fp16/bf16'} FLOP/s"
        detail = roles_text(c.roles)
        out[f"{n}.loss_{i}_detail"] = f" ({detail})" if detail else ""
    if p.precision is not None and p.precision.lever:
        out[f"{n}.precision_lever"] = _LEVERS[p.precision.lever]
    from diagnose.analyzers.smallkernels import NOTABLE_OWN_SHARE

    share = p.small_kernel_own_share
    out[f"{n}.small_kernel_clause"] = (f"; {p.small_kernel_own_count} kernels under 15 µs take {share:.0%} of the step"
                                       if share is not None and share >= NOTABLE_OWN_SHARE else "")


# ---------------------------------------------------------------- metrics files


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
        n = num(v)
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
    text = read_text_file(path, "metrics file")  # size bound, byte-order marks
    try:
        with parsing(f"metrics file {path}"):
            data = json.loads(text)
    except json.JSONDecodeError as e:
        raise DiagnoseError(f"metrics file {path} is not JSON: {e.msg} at line {e.lineno}") from None
    return findings_from_metrics(data)
