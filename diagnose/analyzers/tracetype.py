"""What the trace is, before judging it as steady serving: quality codes for capture passes,
fragments, cold first iterations and heavy Python tracing.

* ``graph_capture`` — CUDA/HIP stream capture (``*StreamBeginCapture`` / ``*StreamEndCapture``
  runtime calls): the kernels were recorded into a graph, not executed, so no timing
  conclusion holds. Rules with ``not_on: [graph_capture]`` are not evaluated.
* ``fragment`` — the window holds part of a forward. One test, with or without a model
  config: a step with operator shapes but no GEMM at all, or whose linear layers cover less
  than one decoder layer and a head (fewer than 4 linear calls, or every weight shape once
  with no LM head); with a model config also a step whose operators account for < 50 % of
  the config's FLOPs (:mod:`diagnose.analyzers.phasestats`). Steps replayed from a graph
  cannot be judged from shapes. A fragment prints no TPOT, MBU or bound ratio, and bound-,
  bandwidth- and TPOT-based rules are not evaluated; launch-gap and idle rules are (the
  gaps are real).
* ``cold_start`` — first-iteration costs: lazy module loading ("Lazy Function Loading"
  overhead events), module/library loading and runtime compilation calls, compile ranges
  (torch.compile, Inductor, autotuning). Gaps they explain are attributed to them
  (:mod:`diagnose.analyzers.waits`), not to launches.
* ``python_tracing_overhead`` — with_stack tracing recorded many ``python_function`` events
  (at least :data:`PYTHON_EVENTS_MIN` and :data:`PYTHON_EVENTS_PER_MS` per ms of the trace):
  every Python call paid the profiler's cost, so host times and launch gaps are inflated.
"""
from __future__ import annotations

import re

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.base import Notes
from diagnose.analyzers.stepphase import _is_int_list
from diagnose.trace.kineto import parse_input_dims
from diagnose.trace.model import QualityIssue, Trace, per_unique

FINDINGS = ()

_CAPTURE = re.compile(r"StreamBeginCapture|StreamEndCapture", re.I)
#: Weight GEMMs (attention score matmuls, aten::bmm/matmul, are not model linears).
_GEMM_OPS = {"aten::linear", "aten::mm", "aten::addmm", "aten::_scaled_mm"}
#: python_function events that make host timings suspect (count, and per ms of the trace).
PYTHON_EVENTS_MIN = 1000
PYTHON_EVENTS_PER_MS = 200.0
#: A linear whose output is at least this wide is an LM head (vocabulary projection).
LM_HEAD_MIN_OUT = 16384


def _graph_capture(trace: Trace, notes: Notes) -> None:
    rt = trace.runtime
    if len(rt) == 0:
        return
    hit = per_unique(rt["name"], lambda u: bool(_CAPTURE.search(str(u))))
    n = int(hit.sum())
    if n:
        notes.note("graph_capture", f"CUDA/HIP graph capture pass ({n} stream-capture calls): the kernels were recorded, not "
                 "executed, so no timing conclusion holds; profile a replay (and pass this file as --capture-trace "
                 "to map the replay's kernels to ops)", n)


def _cold_start(trace: Trace, notes: Notes) -> None:
    from diagnose.analyzers.hostcause import name_test

    parts = []
    ov = getattr(trace, "overhead", None)
    if ov is not None and len(ov):
        lazy = per_unique(ov["name"], lambda u: name_test("lazy_loading", str(u), "overhead"))
        if lazy.any():
            ms = float((ov["end_ns"] - ov["start_ns"]).to_numpy()[lazy].sum()) / 1e6
            parts.append(f"lazy module loading {int(lazy.sum())}x, {ms:.3f} ms")
    rt = trace.runtime
    if len(rt):
        cold = per_unique(rt["name"], lambda u: name_test("module_load", str(u), "runtime") or name_test("compile", str(u), "runtime"))
        if cold.any():
            ms = float((rt["end_ns"] - rt["start_ns"]).to_numpy()[cold].sum()) / 1e6
            parts.append(f"module loading / runtime compilation calls {int(cold.sum())}x, {ms:.3f} ms")
    ann = trace.annotations
    cpu_ann = ann[(ann["scope"] == "cpu").to_numpy()] if len(ann) else None
    for what, f in (("range", trace.cpu_ops), ("range", cpu_ann), ("frame", trace.python_frames)):
        if f is not None and len(f):
            comp = per_unique(f["name"], lambda u, w=what: name_test("compile", str(u), w))
            if comp.any():
                ms = float((f["end_ns"] - f["start_ns"]).to_numpy()[comp].sum()) / 1e6
                parts.append(f"compile {'ranges' if what == 'range' else 'frames'} {int(comp.sum())}x, {ms:.3f} ms")
    if parts:
        notes.note("cold_start", "first-iteration costs in the trace (" + "; ".join(parts) + "): timings include one-off "
                 "costs; gaps they explain are attributed to them (first_call_setup, cold_start), not to launches. "
                 "Profile a warmed-up iteration")


def _python_tracing(trace: Trace, notes: Notes) -> None:
    n = int((getattr(trace, "counts", None) or {}).get("python_function", 0))
    if n < PYTHON_EVENTS_MIN:
        return
    from diagnose.trace.slice import trace_start_ns

    t0 = trace_start_ns(trace)
    ends = [int(f["end_ns"].max()) for f in (trace.gpu, trace.runtime, trace.cpu_ops, trace.annotations) if len(f)]
    span_ms = (max(ends) - t0) / 1e6 if ends and t0 is not None else 0.0
    rate = n / span_ms if span_ms > 0 else float("inf")
    if rate >= PYTHON_EVENTS_PER_MS:
        notes.note("python_tracing_overhead", f"{n:,} python_function events ({rate:,.0f} per ms of the trace): with_stack "
                 "tracing inflates every host time, so launch gaps are overstated; re-profile without with_stack to "
                 "confirm a host/launch-bound reading", n)


def _step_is_fragment(dims_list: list, names: list, gemm_kernels: int, graph_kernels: int = 0) -> bool | None:
    """Fragment test for one step without a model config (module docstring); None: cannot
    tell (no operator shapes, or kernels replayed from a graph, whose ops are not in the trace)."""
    if graph_kernels:
        return None
    weights: dict[tuple[int, int], int] = {}
    for name, dims in zip(names, dims_list):
        if name != "aten::linear" or not dims or len(dims) < 2:
            continue
        w = dims[1]
        if _is_int_list(w, 2) and len(w) == 2:
            weights[(w[0], w[1])] = weights.get((w[0], w[1]), 0) + 1
    if not names:
        return None  # no operator shapes (graph replay, nsys): cannot tell
    has_gemm_op = any(n in _GEMM_OPS for n in names)
    if not has_gemm_op and gemm_kernels == 0:
        return True
    if not weights:
        return None
    if sum(weights.values()) < 4:
        return True
    head = any(out >= LM_HEAD_MIN_OUT for out, _ in weights)
    return all(c == 1 for c in weights.values()) and not head


def _fragment(trace: Trace, steps: pd.DataFrame, g: pd.DataFrame, notes: Notes) -> tuple[int, ...]:
    """Steps whose window holds part of a forward, judged from their operators' shapes
    (module docstring); the same test with and without a model config (with one, the
    forward-coverage test of :mod:`diagnose.analyzers.phasestats` adds to it)."""
    if len(steps) == 0:
        return ()
    ops = trace.cpu_ops
    if len(ops) == 0:
        return ()
    ops = ops.sort_values("start_ns", kind="stable")
    st, en = ops["start_ns"].to_numpy(), ops["name"].to_numpy(dtype=object)
    frag = []
    for i, r in enumerate(steps.itertuples(index=False)):
        lo, hi = np.searchsorted(st, [r.start_ns, r.end_ns], side="left")
        if hi <= lo:
            continue
        names = list(en[lo:hi])
        dims = [parse_input_dims(x) if n == "aten::linear" else None
                for n, x in zip(names, ops["input_dims"].to_numpy()[lo:hi])]
        in_step = (g["step"] == i).to_numpy() if len(g) else np.zeros(0, dtype=bool)
        gk = int((in_step & g["category"].isin(("gemm", "moe")).to_numpy()).sum()) if len(g) else 0
        gr = int((in_step & (g["launch_kind"] == "graph_launch").to_numpy()).sum()) if len(g) else 0
        if _step_is_fragment(dims, names, gk, gr):
            frag.append(i)
    if frag:
        notes.note("fragment", f"{len(frag)} of {len(steps)} step window(s) hold part of a forward (no GEMM, or the linear "
                   "layers cover less than one decoder layer and a head): TPOT, MBU and the bound ratio cannot be read from "
                   "a fragment; launch gaps and idle time still can", len(frag))
    return tuple(frag)


class TraceType(msgspec.Struct, frozen=True):
    """What the trace is (module docstring): the quality notes, and the steps that hold part of
    a forward (judged from shapes, without a model config)."""

    fragment_steps: tuple[int, ...] = ()
    notes: tuple[QualityIssue, ...] = ()


def classify_trace(trace: Trace, steps: pd.DataFrame, activities: pd.DataFrame, has_model_config: bool,
                   workload: str | None = None) -> TraceType:
    """Quality codes graph_capture, cold_start, python_tracing_overhead and fragment (the
    shape test, with or without a model config; ``has_model_config`` is kept for callers);
    ``workload``: the code of a trace that is not LLM serving
    (:mod:`diagnose.analyzers.workload`), whose steps are not judged as parts of an LLM forward."""
    notes = Notes()
    _graph_capture(trace, notes)
    _cold_start(trace, notes)
    _python_tracing(trace, notes)
    frag = () if workload else _fragment(trace, steps, activities, notes)
    return TraceType(frag, tuple(notes.issues))
