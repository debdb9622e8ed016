"""Analyzers: pure functions from a normalized :class:`~diagnose.trace.model.Trace` to findings.

``analyze(trace, options)`` runs them in a fixed order (launch links -> steps -> per-device,
per-phase timeline and categories -> latency) and returns an :class:`Analysis`, whose
``to_dict()`` is the JSON report contract (``schema_version`` 1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diagnose import accounting
from diagnose.accounting import ModelSpec
from diagnose.analyzers.attainment import AttainmentInputs, phase_attainment, step_shape_flops
from diagnose.analyzers.categories import CATEGORIES, CATEGORY_NAMES, category_ids
from diagnose.analyzers.latency import LatencyFindings, latency_findings, step_table
from diagnose.analyzers.phases import (
    _backward_starts,
    assign_steps,
    find_steps,
    link_launches,
    steps_from_shapes,
    user_grammars,
)
from diagnose.analyzers.timeline import analyze_gaps, gap_distribution
from diagnose.errors import DiagnoseError
from diagnose.hardware import peak_from_overrides
from diagnose.trace.model import NO_TIME, QualityIssue, Trace, factorize

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Options:
    """Analysis options (CLI flags win over trace metadata).

    Attributes:
        phase_regex: ``PHASE=REGEX`` strings from ``--phase``.
        model_config: path of a Hugging Face ``config.json`` (``--model-config``).
        gpu: GPU table row name (``--gpu``); peak_tflops / bandwidth_tbps override its peaks.
        batch, context, prompt_len: step shapes when the trace's markers do not carry them.
        weight_dtype, kv_dtype: bytes per weight / KV element (fp32 fp16 bf16 fp8 int8 int4);
            None = from trace metadata, else bf16.
    """

    phase_regex: tuple[str, ...] = ()
    model_config: str | None = None
    gpu: str | None = None
    peak_tflops: float | None = None
    bandwidth_tbps: float | None = None
    batch: int | None = None
    context: int | None = None
    prompt_len: int | None = None
    weight_dtype: str | None = None
    kv_dtype: str | None = None


@dataclass
class PhaseFindings:
    """Numbers for one phase on one device. Times in ms, shares are fractions in [0, 1]."""

    name: str
    device: int | None
    steps: int
    wall_ms: float
    window_ms: float
    gpu_busy_ms: float
    gpu_idle_share: float | None
    launch_gap_share: float | None
    attention_share: float | None
    kernel_ms: float
    kernel_count: int
    activity_count: int
    categories_ms: dict[str, float]
    gaps: dict[str, Any]
    top_kernels: list[dict[str, Any]]
    attainment: dict[str, Any] = field(default_factory=dict)
    unreliable: list[str] = field(default_factory=list)  # names of numbers not to be trusted

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "attainment"}
        d.update(self.attainment)
        return d

    def __getattr__(self, name: str) -> Any:  # p.mfu, p.mbu, p.bound_ratio ...
        att = self.__dict__.get("attainment") or {}
        if name in att:
            return att[name]
        raise AttributeError(name)


@dataclass
class Analysis:
    """Everything ``diagnose run`` reports for one trace (see README "JSON report")."""

    source: dict[str, str]
    devices: list[dict[str, Any]]
    phases: list[PhaseFindings]
    latency: LatencyFindings
    steps: pd.DataFrame
    quality: list[QualityIssue]
    partial: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    activities: pd.DataFrame | None = None  # trace.gpu + category, launch, step, phase columns
    extra: dict[str, Any] = field(default_factory=dict)

    def phase(self, name: str, device: int | None = None) -> PhaseFindings | None:
        for p in self.phases:
            if p.name == name and (device is None or p.device == device):
                return p
        return None

    def to_dict(self) -> dict[str, Any]:
        d = {
            "schema_version": SCHEMA_VERSION,
            "source": self.source,
            "partial": self.partial,
            "devices": self.devices,
            "phases": [p.to_dict() for p in self.phases],
            "latency": self.latency.to_dict(),
            "steps": step_records(self.steps),
            "quality": [q.to_dict() for q in self.quality],
        }
        d.update(self.extra)
        return d


def step_records(steps: pd.DataFrame) -> list[dict[str, Any]]:
    out = []
    for r in steps.to_dict("records"):
        rec = {}
        for k, v in r.items():
            if isinstance(v, float) and np.isnan(v):
                v = None
            elif isinstance(v, (int, np.integer)) and v == NO_TIME:
                v = None
            elif isinstance(v, (np.integer,)):
                v = int(v)
            elif isinstance(v, (np.floating,)):
                v = float(v)
            rec[k] = v
        out.append(rec)
    return out


def _r(x: float | None, nd: int = 6) -> float | None:
    return None if x is None else round(float(x), nd)


def _phase_findings(name: str, device: int | None, sub: pd.DataFrame, n_steps: int, wall_ns: int) -> PhaseFindings:
    gaps = analyze_gaps(
        sub["start_ns"].to_numpy(),
        sub["end_ns"].to_numpy(),
        sub["launch_end_ns"].to_numpy(),
        sub["graph_followup"].to_numpy(),
        sub["name"].to_numpy(),
    )
    dur = (sub["end_ns"] - sub["start_ns"]).to_numpy()
    cat_id = sub["category_id"].to_numpy()
    # per category: sums exact in float64 below 2**53 ns (104 days)
    per_cat = np.bincount(cat_id, weights=dur, minlength=len(CATEGORIES))
    present = np.bincount(cat_id, minlength=len(CATEGORIES)) > 0
    categories_ms = {c: round(float(per_cat[i]) / 1e6, 6) for i, c in enumerate(CATEGORIES) if present[i]}
    is_kernel = (sub["kind"] == "kernel").to_numpy()
    kernel_ns = int(dur[is_kernel].sum())
    attn_ns = int(dur[is_kernel & (cat_id == CATEGORIES.index("attention"))].sum())
    top = []
    if is_kernel.any():
        # per kernel name, in first-seen order (as groupby(sort=False))
        codes, _ = pd.factorize(sub["name_id"].to_numpy()[is_kernel], sort=False)
        first = np.full(codes.max() + 1, len(codes), dtype=np.int64)
        np.minimum.at(first, codes, np.arange(len(codes)))
        agg = pd.DataFrame(
            {"total_ns": np.bincount(codes, weights=dur[is_kernel]).astype(np.int64),
             "count": np.bincount(codes),
             "category": sub["category"].to_numpy()[is_kernel][first]},
            index=pd.Index(sub["name"].to_numpy(dtype=object)[is_kernel][first], dtype=object))
        for kname, r in agg.sort_values("total_ns", ascending=False).head(10).iterrows():
            top.append(
                {"name": kname[:200], "category": r["category"], "count": int(r["count"]),
                 "total_ms": round(float(r["total_ns"]) / 1e6, 6),
                 "share": round(float(r["total_ns"]) / kernel_ns, 6) if kernel_ns else None}
            )
    gap_info = {
        "launch": gap_distribution(gaps.launch_gaps_ns),
        "all": gap_distribution(gaps.all_gaps_ns),
        "ms_by_kind": {k: round(v / 1e6, 6) for k, v in gaps.gap_ns_by_kind.items()},
        "count_by_kind": dict(gaps.gap_count_by_kind),
        "top": gaps.top,
    }
    return PhaseFindings(
        name=name,
        device=device,
        steps=n_steps,
        wall_ms=round(wall_ns / 1e6, 6),
        window_ms=round(gaps.window_ns / 1e6, 6),
        gpu_busy_ms=round(gaps.busy_ns / 1e6, 6),
        gpu_idle_share=_r(gaps.idle_share),
        launch_gap_share=_r(gaps.launch_gap_share),
        attention_share=_r(attn_ns / kernel_ns) if kernel_ns else None,
        kernel_ms=round(kernel_ns / 1e6, 6),
        kernel_count=int(is_kernel.sum()),
        activity_count=int(len(sub)),
        categories_ms=categories_ms,
        gaps=gap_info,
        top_kernels=top,
    )


def analyze(trace: Trace, options: Options | None = None) -> Analysis:
    """Run every analyzer on ``trace``.

    Raises:
        DiagnoseError: invalid options (e.g. a bad ``--phase`` regex).
    """
    options = options or Options()
    quality = list(trace.quality)

    def note(code: str, msg: str, count: int | None = None) -> None:
        if not any(q.code == code for q in quality):
            quality.append(QualityIssue(code, msg, count))

    steps = find_steps(trace, user_grammars(options.phase_regex))
    if len(steps) == 0:
        steps = steps_from_shapes(trace)
        if len(steps):
            note("phases_from_shapes", "no step markers: phases inferred from aten::linear shapes ([B,1,H] decode, [B,S>1,H] prefill)")
        elif len(_backward_starts(trace)):
            note("training_trace", "autograd backward ops in the trace: a training step, not inference; phase 'unknown'")
        else:
            note("missing_markers", "no step markers and no usable shapes: phase is 'unknown' (use --phase PHASE=REGEX)")

    gpu = trace.gpu
    launches = link_launches(trace)
    step_idx = assign_steps(trace, steps, launches)
    name_id, names = factorize(gpu["name"])
    category_id = category_ids(gpu, name_id, names)
    g = gpu.assign(  # object columns stay object (no per-row conversion to a string dtype)
        category=pd.Series(CATEGORY_NAMES[category_id], index=gpu.index, dtype=object),
        category_id=category_id,
        name_id=name_id,
        launch_end_ns=launches["launch_end_ns"].to_numpy(),
        launch_start_ns=launches["launch_start_ns"].to_numpy(),
        launch_kind=pd.Series(launches["launch_kind"].to_numpy(dtype=object), index=gpu.index, dtype=object),
        graph_followup=launches["graph_followup"].to_numpy(),
        step=step_idx,
    )
    step_phase = steps["phase"].to_numpy() if len(steps) else np.array([], dtype=object)
    g["phase"] = pd.Series(np.where(step_idx >= 0, step_phase[np.clip(step_idx, 0, None)] if len(steps) else "unknown", "unknown"),
                           index=g.index, dtype=object)

    if len(gpu) == 0:
        note("no_gpu_activity", "no GPU activity (kernels, memcpy, memset) in the trace: GPU numbers are unavailable")
    else:
        unlinked = int((launches["launch_kind"] == "").sum())
        if unlinked:
            note("unlinked_kernels", f"{unlinked} of {len(gpu)} GPU activities have no host launch call with their correlation id; gaps before them are 'unattributed'", unlinked)
        graph_kernels = int((launches["launch_kind"] == "graph_launch").sum())
        if graph_kernels:
            n_launch = int(g.loc[g["launch_kind"] == "graph_launch", "correlation"].nunique())
            note("graph_kernels_no_launch", f"{graph_kernels} kernels replayed from {n_launch} graph launch(es): no per-kernel launch call; op-level attribution unavailable for them", graph_kernels)

    launches_info = launch_stats(trace, g)
    unreliable: list[str] = []
    cov = launches_info["graph_coverage"]
    if cov is not None and cov < GRAPH_COVERAGE_MIN:
        unreliable = ["gpu_idle_share", "launch_gap_share"]
        note("graph_coverage_low",
             f"only {launches_info['graph_launches_with_activity']} of {launches_info['graph_launches']} graph launches have GPU activity in the trace "
             f"(coverage {cov:.0%}): replayed kernels are missing, so idle and launch-gap numbers are unreliable")
    steps = step_table(steps, g)
    sf, sb, sc = step_shape_flops(trace, steps)
    steps["shape_flops"], steps["shape_bytes"], steps["shape_ops"] = sf, sb, sc
    graph_steps = np.zeros(len(steps), dtype=bool)
    if len(steps) and len(g):
        gs = g.loc[(g["step"] >= 0) & (g["launch_kind"] == "graph_launch"), "step"].unique()
        graph_steps[gs.astype(np.int64)] = True
    devices_present = sorted(int(d) for d in gpu["device"].unique()) if len(gpu) else []
    dev_list = [{"id": d, "name": trace.device_name(d)} for d in devices_present]
    listed = {d.id for d in trace.devices}
    if len(trace.devices) == 1 and len(dev_list) == 1 and dev_list[0]["id"] not in listed:
        # One visible GPU whose activities carry the host's device index (ROCm/HIP_VISIBLE_DEVICES).
        dev_list[0]["name"] = trace.devices[0].name
        note("device_id_remapped", f"activities use device id {dev_list[0]['id']} but deviceProperties lists only id {trace.devices[0].id}: taken as the same GPU")
    for d in dev_list:
        if not d["name"]:
            note("unnamed_device", f"device {d['id']} has no name in the trace: peak numbers cannot be resolved from it (use --gpu)")

    att_inputs = attainment_inputs(trace, options, dev_list, note)
    phases: list[PhaseFindings] = []
    phase_names = [p for p in ("prefill", "decode", "mixed") if len(steps) and (steps["phase"] == p).any()]
    for dev in devices_present or [None]:
        sub_all = g[g["device"] == dev] if dev is not None else g.iloc[0:0]
        dev_steps = steps if dev is None else steps[steps["device_activity_count"].apply(lambda m: dev in m)]
        all_wall = _all_wall_ns(sub_all, dev_steps) if (len(sub_all) or len(dev_steps)) else _cpu_span_ns(trace)
        pf_all = _phase_findings("all", dev, sub_all, len(steps), all_wall)
        pf_all.unreliable = list(unreliable)
        pf_all.attainment = dict(_NO_ATTAINMENT)
        phases.append(pf_all)
        for p in phase_names:
            ps = steps[steps["phase"] == p] if dev is None else dev_steps[dev_steps["phase"] == p]
            sub = sub_all[sub_all["phase"] == p]
            if dev is not None and len(ps) == 0 and len(sub) == 0:
                continue
            pf = _phase_findings(p, dev, sub, len(ps), int(ps["wall_ns"].sum()))
            pf.attainment = phase_attainment(p, ps, att_inputs, graph_steps[ps.index.to_numpy()])
            pf.unreliable = list(unreliable)
            cov = pf.attainment.get("forward_coverage")
            if cov is not None and cov < 0.5:
                pf.unreliable += ["mbu", "mfu", "bound_ratio", "achieved_tbps", "achieved_tflops", "arithmetic_intensity"]
                note("partial_forward", f"{p}: the operators in the step windows account for {cov:.0%} of the model config's FLOPs: the trace covers part of a forward, so bytes from the config overstate the work and MBU/bound_ratio are too high")
            if pf.attainment.get("achieved_tbps") and pf.attainment.get("peak_tbps") and pf.attainment["achieved_tbps"] > pf.attainment["peak_tbps"]:
                note("bandwidth_above_peak", f"{p}: achieved {pf.attainment['achieved_tbps']:.2f} TB/s exceeds the device peak {pf.attainment['peak_tbps']:.2f} TB/s: wrong peak, wrong model config, or a timing without synchronisation (S7)")
            phases.append(pf)
        unk = sub_all[sub_all["phase"] == "unknown"]
        if len(unk):
            wall = int(unk["end_ns"].max() - unk["start_ns"].min())
            pf_unk = _phase_findings("unknown", dev, unk, 0, wall)
            pf_unk.attainment = dict(_NO_ATTAINMENT)
            phases.append(pf_unk)

    return Analysis(
        source={"path": trace.source_path, "format": trace.source_format},
        devices=dev_list,
        phases=phases,
        latency=latency_findings(steps),
        steps=steps.drop(columns=["device_activity_count", "shape_bytes"]),
        quality=quality,
        partial=trace.partial,
        metadata=trace.metadata,
        activities=g,
        extra={
            "launches": launches_info,
            "gpu": _gpu_dict(att_inputs.peak),
            "model": _model_dict(att_inputs),
        },
    )


GRAPH_COVERAGE_MIN = 0.9


def launch_stats(trace: Trace, g: pd.DataFrame) -> dict[str, Any]:
    """Host launch calls, graph launches, their fan-out and coverage.

    ``host_launch_calls``: runtime calls named as launches plus any other call linked to GPU
    work by correlation (vocabulary drift such as ``INVALID``). ``graph_coverage``: share of
    graph launches with at least one GPU activity in the trace (None without graph launches).
    """
    rt = trace.runtime
    if len(rt) == 0:
        return {"host_launch_calls": 0, "graph_launches": 0, "graph_launches_with_activity": 0,
                "graph_coverage": None, "kernels_per_graph_launch_max": None}
    kinds = rt["api_kind"].to_numpy(dtype=object)
    corr = rt["correlation"].to_numpy()
    gpu_corr = g["correlation"].to_numpy() if len(g) else np.empty(0, dtype=np.int64)
    linked = pd.Series(corr, copy=False).isin(gpu_corr).to_numpy() & (corr >= 0)  # hash lookups
    is_launch = (kinds == "launch") | (kinds == "graph_launch") | (linked & (kinds != "memcpy") & (kinds != "memset"))
    graph = kinds == "graph_launch"
    n_graph = int(graph.sum())
    covered = int((graph & linked).sum())
    fan = None
    if n_graph and len(g):
        gk = g[g["launch_kind"] == "graph_launch"]
        if len(gk):
            fan = int(gk.groupby("correlation").size().max())
    return {
        "host_launch_calls": int(is_launch.sum()),
        "graph_launches": n_graph,
        "graph_launches_with_activity": covered,
        "graph_coverage": round(covered / n_graph, 6) if n_graph else None,
        "kernels_per_graph_launch_max": fan,
    }


def _gpu_dict(peak) -> dict[str, Any] | None:
    if peak is None:
        return None
    return {
        "name": peak.name,
        "peak_tflops": peak.dense_fp16_tflops,
        "peak_tbps": peak.memory_bandwidth_tbps,
        "ridge_flop_per_byte": peak.ridge_flop_per_byte,
        "source": peak.source,
        "overrides": list(peak.overrides),
    }


def _model_dict(inp: AttainmentInputs) -> dict[str, Any] | None:
    if inp.spec is None:
        return None
    sp = inp.spec
    return {
        "name": sp.name,
        "source": inp.spec_source,
        "params_total": sp.params_total,
        "weight_dtype": inp.weight_dtype,
        "weight_bytes": accounting.weight_bytes(sp, inp.weight_dtype),
        "kv_dtype": inp.kv_dtype,
        "kv_bytes_per_token": accounting.kv_bytes_per_token(sp, inp.kv_dtype),
    }


_DTYPE_ALIASES = {"float32": "fp32", "torch.float32": "fp32", "float16": "fp16", "torch.float16": "fp16", "half": "fp16",
                  "bfloat16": "bf16", "torch.bfloat16": "bf16", "fp32": "fp32", "fp16": "fp16", "bf16": "bf16",
                  "fp8": "fp8", "int8": "int8", "int4": "int4"}


def attainment_inputs(trace: Trace, options: Options, dev_list: list[dict], note) -> AttainmentInputs:
    """Resolve model config, peaks, dtypes and shapes from flags, then trace metadata.

    Raises:
        DiagnoseError: an unreadable ``--model-config``, unknown ``--gpu`` or bad override.
    """
    inp = AttainmentInputs(batch=options.batch, context=options.context, prompt_len=options.prompt_len)
    meta = trace.metadata.get("diagnose") if isinstance(trace.metadata.get("diagnose"), dict) else {}
    if options.model_config:
        from diagnose.bounds_cli import load_model_config

        inp.spec = load_model_config(options.model_config)
        inp.spec_source = options.model_config
    elif isinstance(meta.get("model_config"), dict):
        try:
            inp.spec = ModelSpec.from_hf_config(meta["model_config"], name=meta["model_config"].get("_name_or_path") or "trace metadata")
            inp.spec_source = "trace metadata"
        except DiagnoseError as e:
            note("model_config_unusable", f"model config in trace metadata is unusable: {e}")
    wd = options.weight_dtype or _DTYPE_ALIASES.get(str(meta.get("dtype", "")).lower()) or "bf16"
    inp.weight_dtype = wd
    inp.kv_dtype = options.kv_dtype or (wd if wd in ("fp32", "fp16", "bf16") else "bf16")
    if isinstance(meta.get("prefill_logits_positions"), int) and meta["prefill_logits_positions"] > 1:
        inp.lm_head = "all"  # a plain Hugging Face forward computes logits for every position
    name = dev_list[0]["name"] if dev_list else ""
    inp.peak = peak_from_overrides(options.gpu, options.peak_tflops, options.bandwidth_tbps, device_name=name)
    if inp.peak is None and dev_list:
        note("unknown_device_peak", f"device {name or '(unnamed)'!r} is not in the GPU peak table: MFU/MBU skipped (use --gpu NAME or --peak-tflops/--bandwidth-tbps)")
    return inp


_NO_ATTAINMENT = {k: None for k in ("flops", "bytes", "achieved_tflops", "achieved_tbps", "mfu", "mbu",
                                      "arithmetic_intensity", "bound", "bound_ratio", "peak_tflops", "peak_tbps")}
_NO_ATTAINMENT["attainment_missing"] = ["computed per step phase (prefill, decode, mixed) only"]


def _all_wall_ns(acts: pd.DataFrame, steps: pd.DataFrame) -> int:
    """End-to-end wall of everything on a device: from the first step start or GPU activity to
    the last completion (step end or GPU end); never shorter than a phase's summed step walls."""
    starts, ends = [], []
    if len(acts):
        starts.append(int(acts["start_ns"].min()))
        ends.append(int(acts["end_ns"].max()))
    if len(steps):
        starts.append(int(steps["start_ns"].min()))
        ends.append(int(steps["end_ns"].max()))
        ge = steps["gpu_end_ns"].to_numpy()
        ge = ge[ge != NO_TIME]
        if len(ge):
            ends.append(int(ge.max()))
    return max(ends) - min(starts) if starts else 0


def _cpu_span_ns(trace: Trace) -> int:
    lo, hi = None, None
    for f in (trace.cpu_ops, trace.runtime, trace.annotations):
        if len(f):
            a, b = int(f["start_ns"].min()), int(f["end_ns"].max())
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
    return 0 if lo is None else hi - lo
