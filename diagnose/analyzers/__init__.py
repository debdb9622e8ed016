"""Analyzers: pure functions from a normalized :class:`~diagnose.trace.model.Trace` to findings.

:data:`ANALYZERS` is the registry: the analyzer modules, in the order :func:`analyze` runs
them. Each module declares the findings it produces (``FINDINGS``) next to the code that
computes them and has ``run(ctx)`` (see :mod:`diagnose.analyzers.base`); the findings
catalog (:mod:`diagnose.findings`) is built from these declarations.

``analyze(trace, options)`` returns an :class:`Analysis`, whose ``to_dict()`` is the JSON
report contract (``schema_version`` 1). Rules are not evaluated here:
:func:`diagnose.pipeline.attach_verdicts` does that, in one place.
"""
from __future__ import annotations

import numpy as np

from diagnose.analyzers import (
    activities,
    attainment,
    categories,
    kernels,
    launches,
    latency,
    phases,
    phasestats,
    timeline,
    tracetype,
    waits,
)
from diagnose.analyzers.base import Context, Finding
from diagnose.analyzers.result import SCHEMA_VERSION, Analysis, PhaseResult, step_records
from diagnose.options import AnalysisOptions
from diagnose.trace.model import Trace

#: The analyzer registry, in run order. Modules without ``run`` only declare findings that
#: another analyzer's code computes (categories and timeline run inside phasestats).
ANALYZERS = (phases, launches, activities, waits, latency, attainment, tracetype, phasestats, kernels, timeline, categories)

__all__ = ["ANALYZERS", "Analysis", "AnalysisOptions", "Context", "Finding", "PhaseResult", "SCHEMA_VERSION",
           "analyze", "step_records"]


#: Step-table columns only the analyzers use (not in the JSON report).
_INTERNAL_STEP_COLUMNS = ("device_activity_count", "shape_bytes", "own_ns", "done_ns", "complete", "own_reliable")


def report_steps(steps):
    """The step table as reported: ``own_ms`` (ms, 6 decimals) instead of the internal ns
    columns; column order as documented in the README."""
    out = steps.drop(columns=[c for c in _INTERNAL_STEP_COLUMNS if c in steps])
    if "own_ns" in steps:
        own = (steps["own_ns"].to_numpy() / 1e6).round(6)
        if "own_reliable" in steps:  # an incomplete step, or one whose GPU work is not its own: unknown
            own = np.where(steps["own_reliable"].to_numpy(dtype=bool), own, np.nan)
        out.insert(out.columns.get_loc("gpu_busy_ms") + 1 if "gpu_busy_ms" in out else len(out.columns), "own_ms", own)
    return out


def analyze(trace: Trace, options: AnalysisOptions | None = None) -> Analysis:
    """Run every analyzer of :data:`ANALYZERS` on ``trace``.

    Raises:
        DiagnoseError: invalid options (e.g. a bad ``--phase-regex``, an unreadable
            ``--model-config``, an unknown ``--gpu``).
    """
    ctx = Context(trace=trace, options=options or AnalysisOptions(), quality=list(trace.quality))
    for module in ANALYZERS:
        run = getattr(module, "run", None)
        if run is not None:
            run(ctx)
    return Analysis(
        source={"path": trace.source_path, "format": trace.source_format},
        devices=ctx.devices,
        phases=ctx.phases,
        latency=ctx.latency,
        steps=report_steps(ctx.steps),
        quality=ctx.quality,
        partial=trace.partial,
        metadata=trace.metadata,
        activities=ctx.activities,
        extra={k: v for k, v in ctx.extra.items() if not k.startswith("_")},
        trace=trace,
        host_index=ctx.extra.get("_host"),
        internal={k[1:]: v for k, v in ctx.extra.items() if k.startswith("_") and k != "_host"},
    )
