"""Normalized trace model and loaders.

The names below are imported on first use (PEP 562), so that ``diagnose.trace.reading`` (no
numpy/pandas) can be imported on its own: ``diagnose run`` starts reading the trace before
pandas is imported.
"""
from __future__ import annotations

from typing import Any

__all__ = ["load_trace", "split_ranks", "Trace", "DeviceInfo", "QualityIssue"]


def __getattr__(name: str) -> Any:
    if name == "load_trace":
        from diagnose.trace.load import load_trace

        return load_trace
    if name == "split_ranks":
        from diagnose.trace.ranks import split_ranks

        return split_ranks
    if name in ("Trace", "DeviceInfo", "QualityIssue"):
        from diagnose.trace import model

        return getattr(model, name)
    raise AttributeError(f"module 'diagnose.trace' has no attribute {name!r}")
