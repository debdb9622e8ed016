"""What :func:`diagnose.analyzers.analyze` returns: the report record and the frames behind it.

:class:`Analysis` holds the :class:`~diagnose.model.Report` (the JSON report contract, README
"JSON report") and what the notebook API and the web report draw from besides it: the
normalized trace, the GPU activity frame, the whole step table and kernel table, and the host
index the gap causes were read from.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from diagnose.model import SCHEMA_VERSION, Device, Latency, PhaseRow, QualityIssue, Report, Step, Wait
from diagnose.trace.model import NO_TIME

__all__ = ["Analysis", "SCHEMA_VERSION", "step_records", "report_steps"]


@dataclass
class Analysis:
    """One analysed trace.

    Attributes:
        report: the report record (verdicts and findings once
            :func:`diagnose.pipeline.attach_verdicts` ran; it replaces this field).
        trace: the normalized :class:`~diagnose.trace.model.Trace`.
        activities: ``trace.gpu`` plus category, launch, step and phase columns.
        steps: the whole step table (one row per step; ``waits`` as dicts).
        kernel_frame: the whole kernel table (:func:`diagnose.analyzers.kernels.kernel_table`);
            the report keeps its top rows.
        host_index: what the host did per thread (:class:`~diagnose.analyzers.waits.HostIndex`):
            the notebook and the web report name gap causes with it.
        t0_ns: the trace start every ``start_ms`` counts from.
        paths: the critical paths (:class:`~diagnose.analyzers.critpath.Paths`, with the
            dependency graph they were walked on): the what-if and the web timeline use them.
        layer_frame: per kernel activity (index = its position in ``activities``): forward,
            part (0 outside a forward, 1 pre, 2 layer, 3 post), layer and op_class codes
            (:func:`diagnose.analyzers.layers.layer_section`); None without kernels.
    """

    report: Report
    trace: Any = None
    activities: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    kernel_frame: pd.DataFrame | None = None
    host_index: Any = None
    t0_ns: int = 0
    paths: Any = None
    layer_frame: pd.DataFrame | None = None

    # the report's sections, for callers that read an analysis like a report
    @property
    def source(self):
        return self.report.source

    @property
    def devices(self) -> list[Device]:
        return self.report.devices

    @property
    def phases(self) -> list[PhaseRow]:
        return self.report.phases

    @property
    def latency(self) -> Latency:
        return self.report.latency

    @property
    def quality(self) -> list[QualityIssue]:
        return self.report.quality

    @property
    def partial(self) -> bool:
        return self.report.partial

    @property
    def metadata(self) -> dict[str, Any]:
        return self.trace.metadata if self.trace is not None else {}

    def phase(self, name: str, device: int | None = None) -> PhaseRow | None:
        return self.report.phase(name, device)

    def to_dict(self) -> dict[str, Any]:
        """The JSON report as builtins (``json.loads`` of ``diagnose run --format json``)."""
        return self.report.to_dict()


#: Step-table columns only the analyzers use (not in the JSON report).
_INTERNAL_STEP_COLUMNS = ("device_activity_count", "shape_bytes", "own_ns", "done_ns", "complete", "own_reliable",
                          "graph_step", "shape_gemm_flops", "shape_attention_flops", "shape_moe_flops",
                          "seq_info")


def report_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The step table as reported: ``own_ms`` (ms, 6 decimals) instead of the internal ns
    columns; column order as documented in the README."""
    out = steps.drop(columns=[c for c in _INTERNAL_STEP_COLUMNS if c in steps])
    if "own_ns" in steps:
        own = (steps["own_ns"].to_numpy() / 1e6).round(6)
        if "own_reliable" in steps:  # an incomplete step, or one whose GPU work is not its own: unknown
            own = np.where(steps["own_reliable"].to_numpy(dtype=bool), own, np.nan)
        out.insert(out.columns.get_loc("gpu_busy_ms") + 1 if "gpu_busy_ms" in out else len(out.columns), "own_ms", own)
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, float) and np.isnan(v):
        return None
    if isinstance(v, (int, np.integer)) and v == NO_TIME:
        return None
    if isinstance(v, np.integer):
        return int(v)
    if isinstance(v, np.floating):
        return float(v)
    return v


def step_records(steps: pd.DataFrame) -> list[dict[str, Any]]:
    """The step table as JSON-able records (NaN and NO_TIME -> None, numpy scalars -> Python)."""
    return [{k: _plain(v) for k, v in r.items()} for r in steps.to_dict("records")]


_COUNTS = ("batch", "tokens", "context", "kv_tokens", "prefill_requests", "decode_requests")


def step_structs(steps: pd.DataFrame, paths: dict | None = None) -> list[Step]:
    """The report's step records (:class:`~diagnose.model.Step`) from the reported step table
    (:func:`report_steps`); counts a nullable column held as floats become ints. ``paths``:
    step row -> its :class:`~diagnose.model.CriticalPath` (None for the others)."""
    out = []
    for i, rec in enumerate(step_records(steps)):
        if paths is not None:
            rec["critical_path"] = paths.get(i)
        for k in _COUNTS:
            v = rec.get(k)
            if isinstance(v, float) and v.is_integer():
                rec[k] = int(v)
        rec["waits"] = [Wait(where=w["where"], start_ms=w["start_ms"], duration_ms=w["ms"], cause=w["cause"],
                             parts_ms=w.get("parts_ms") or {w["cause"]: w["ms"]}, host_call=w.get("host_call"),
                             host_stack=list(w.get("host_stack") or []), waited_on=w.get("waited_on"))
                        for w in rec.get("waits") or []]
        out.append(Step(**rec))
    return out


def with_sections(report: Report, **sections: Any) -> Report:
    """A copy of ``report`` with ``sections`` replaced (the report is frozen)."""
    return msgspec.structs.replace(report, **sections)
