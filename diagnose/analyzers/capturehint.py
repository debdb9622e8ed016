"""Naming the capture pass that would map a graph replay's kernels to their ops.

Kernels replayed from a CUDA/HIP graph carry no operator, so the kernel table has no shapes
for them and no loss against the roofline. When the trace's folder holds a graph-capture
pass (:func:`diagnose.trace.capture.find_capture_passes`), the report names it: ``--capture-trace
PATH`` maps them (TraceLens merges the two the same way). It is never loaded unless given.
"""
from __future__ import annotations

import pandas as pd

from diagnose.trace.capture import find_capture_passes
from diagnose.trace.model import QualityIssue, Trace

FINDINGS = ()


def capture_suggestion(trace: Trace, table: pd.DataFrame, unmapped_note: str) -> tuple[QualityIssue, ...]:
    """A ``capture_trace_available`` note when rows of the kernel table ``table`` say
    ``unmapped_note`` (replayed from a graph, no capture given) and a capture pass lies beside
    ``trace.source_path``; else nothing."""
    if len(table) == 0 or not trace.source_path:
        return ()
    rows = table["shapes_unknown"].to_numpy(dtype=object) == unmapped_note
    if not rows.any():
        return ()
    found = find_capture_passes(str(trace.source_path))
    if not found:
        return ()
    n = int(table["calls"].to_numpy()[rows].sum())
    ms = float(table["total_ms"].to_numpy()[rows].sum())
    also = f" (also: {', '.join(found[1:])})" if len(found) > 1 else ""
    return (QualityIssue("capture_trace_available",
                         f"{n} graph-replayed kernels ({ms:.3f} ms) have no operator shapes, so no loss against the "
                         f"roofline: {found[0]} beside the trace is a graph-capture pass; give --capture-trace {found[0]} "
                         f"to map them to their ops and shapes{also}"),)
