"""Frozen, unit-suffixed results of the analysis and the JSON report they serialise to.

:class:`Analysis` is what :func:`diagnose.analyzers.analyze` returns; ``to_dict()`` is the
JSON report contract (README "JSON report"), computed once per analysis and cached.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diagnose.trace.model import NO_TIME, QualityIssue

SCHEMA_VERSION = 2


@dataclass(frozen=True)
class PhaseResult:
    """Numbers for one phase on one device. Times in ms; shares are fractions in [0, 1].

    ``attainment`` holds the roofline numbers (mfu, mbu, achieved_tflops, ... see
    :mod:`diagnose.analyzers.attainment`); ``unreliable`` names numbers not to be trusted.
    """

    name: str
    device: int | None
    steps: int
    wall_ms: float
    own_ms: float | None
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
    idle_by_cause_ms: dict[str, float]
    small_kernel_ms: float
    small_kernel_count: int
    h2d_ms: float
    comm_exposed_ms: float
    top_kernels: list[dict[str, Any]]
    attainment: dict[str, Any] = field(default_factory=dict)
    unreliable: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in self.__dict__.items() if k != "attainment"}
        d["unreliable"] = list(self.unreliable)
        d.update(self.attainment)
        return d

    def __getattr__(self, name: str) -> Any:  # p.mfu, p.mbu, p.bound_ratio ...
        att = self.__dict__.get("attainment") or {}
        if name in att:
            return att[name]
        raise AttributeError(name)


@dataclass
class Analysis:
    """Everything ``diagnose run`` reports for one trace (README "JSON report").

    ``activities`` is the GPU activity frame (``trace.gpu`` plus category, launch, step and
    phase columns); ``extra`` holds the other top-level report sections by key (launches, gpu,
    model, and, once :func:`diagnose.pipeline.attach_verdicts` ran, the verdicts).
    """

    source: dict[str, str]
    devices: list[dict[str, Any]]
    phases: list[PhaseResult]
    latency: Any
    steps: pd.DataFrame
    quality: list[QualityIssue]
    partial: bool
    metadata: dict[str, Any] = field(default_factory=dict)
    activities: pd.DataFrame | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    trace: Any = None
    host_index: Any = None  # what the host did per thread (waits.HostIndex): the app draws gap causes with it
    internal: dict[str, Any] = field(default_factory=dict)  # analyzer results not in the report (the whole kernel table, t0)
    _dict: dict[str, Any] | None = field(default=None, repr=False)

    def phase(self, name: str, device: int | None = None) -> PhaseResult | None:
        for p in self.phases:
            if p.name == name and (device is None or p.device == device):
                return p
        return None

    def to_dict(self) -> dict[str, Any]:
        """The JSON report. The phases, latency and step records are built once and cached;
        each call returns a new top-level dict with the current ``extra`` sections (verdicts
        added by :func:`diagnose.pipeline.attach_verdicts` included)."""
        if self._dict is None:
            self._dict = {
                "schema_version": SCHEMA_VERSION,
                "source": self.source,
                "partial": self.partial,
                "devices": self.devices,
                "phases": [p.to_dict() for p in self.phases],
                "latency": self.latency.to_dict(),
                "steps": step_records(self.steps),
                "quality": [q.to_dict() for q in self.quality],
            }
        return {**self._dict, **self.extra}


def step_records(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """The step table as JSON-able records (NaN and NO_TIME -> None, numpy scalars -> Python)."""
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
