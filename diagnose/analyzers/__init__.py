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

from diagnose.analyzers.categories import CATEGORIES, categorize
from diagnose.analyzers.latency import LatencyFindings, latency_findings, step_table
from diagnose.analyzers.phases import (
    assign_steps,
    find_steps,
    link_launches,
    steps_from_shapes,
    user_grammars,
)
from diagnose.analyzers.timeline import analyze_gaps, gap_distribution
from diagnose.trace.model import NO_TIME, QualityIssue, Trace

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class Options:
    """Analysis options. ``phase_regex``: ``PHASE=REGEX`` strings from ``--phase``."""

    phase_regex: tuple[str, ...] = ()


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

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


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
    cats = sub["category"].to_numpy()
    categories_ms = {c: round(float(dur[cats == c].sum()) / 1e6, 6) for c in CATEGORIES if (cats == c).any()}
    is_kernel = (sub["kind"] == "kernel").to_numpy()
    kernel_ns = int(dur[is_kernel].sum())
    attn_ns = int(dur[is_kernel & (cats == "attention")].sum())
    top = []
    if is_kernel.any():
        kk = sub[is_kernel].assign(dur_ns=dur[is_kernel])
        agg = kk.groupby("name", sort=False).agg(total_ns=("dur_ns", "sum"), count=("dur_ns", "size"), category=("category", "first"))
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

    extra = user_grammars(options.phase_regex)
    steps = find_steps(trace, extra)
    if len(steps) == 0:
        steps = steps_from_shapes(trace)
        if len(steps):
            note("phases_from_shapes", "no step markers: phases inferred from aten::linear shapes ([B,1,H] decode, [B,S>1,H] prefill)")
        else:
            note("missing_markers", "no step markers and no usable shapes: phase is 'unknown' (use --phase PHASE=REGEX)")

    gpu = trace.gpu
    launches = link_launches(trace)
    step_idx = assign_steps(trace, steps, launches)
    g = gpu.assign(
        category=categorize(gpu),
        launch_end_ns=launches["launch_end_ns"].to_numpy(),
        launch_start_ns=launches["launch_start_ns"].to_numpy(),
        launch_kind=launches["launch_kind"].to_numpy(),
        graph_followup=launches["graph_followup"].to_numpy(),
        step=step_idx,
    )
    step_phase = steps["phase"].to_numpy() if len(steps) else np.array([], dtype=object)
    g["phase"] = np.where(step_idx >= 0, step_phase[np.clip(step_idx, 0, None)] if len(steps) else "unknown", "unknown")

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

    steps = step_table(steps, g)
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

    phases: list[PhaseFindings] = []
    phase_names = [p for p in ("prefill", "decode", "mixed") if len(steps) and (steps["phase"] == p).any()]
    for dev in devices_present or [None]:
        sub_all = g[g["device"] == dev] if dev is not None else g.iloc[0:0]
        dev_steps = steps if dev is None else steps[steps["device_activity_count"].apply(lambda m: dev in m)]
        all_wall = int(sub_all["end_ns"].max() - sub_all["start_ns"].min()) if len(sub_all) else _cpu_span_ns(trace)
        phases.append(_phase_findings("all", dev, sub_all, len(steps), all_wall))
        for p in phase_names:
            ps = steps[steps["phase"] == p] if dev is None else dev_steps[dev_steps["phase"] == p]
            sub = sub_all[sub_all["phase"] == p]
            if dev is not None and len(ps) == 0 and len(sub) == 0:
                continue
            phases.append(_phase_findings(p, dev, sub, len(ps), int(ps["wall_ns"].sum())))
        unk = sub_all[sub_all["phase"] == "unknown"]
        if len(unk):
            wall = int(unk["end_ns"].max() - unk["start_ns"].min())
            phases.append(_phase_findings("unknown", dev, unk, 0, wall))

    return Analysis(
        source={"path": trace.source_path, "format": trace.source_format},
        devices=dev_list,
        phases=phases,
        latency=latency_findings(steps),
        steps=steps.drop(columns=["device_activity_count"]),
        quality=quality,
        partial=trace.partial,
        metadata=trace.metadata,
        activities=g,
    )


def _cpu_span_ns(trace: Trace) -> int:
    lo, hi = None, None
    for f in (trace.cpu_ops, trace.runtime, trace.annotations):
        if len(f):
            a, b = int(f["start_ns"].min()), int(f["end_ns"].max())
            lo = a if lo is None else min(lo, a)
            hi = b if hi is None else max(hi, b)
    return 0 if lo is None else hi - lo
