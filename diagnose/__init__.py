"""diagnose: why is my LLM inference slow? Prefill/decode analysis of profiler traces.

The notebook API is :func:`analyze_trace` (:mod:`diagnose.notebook`); the command line is
``diagnose`` (:mod:`diagnose.cli`). Importing this package stays light: the analysis modules
(pandas, numpy) load on first use.
"""
from __future__ import annotations

from typing import Any

__version__ = "0.2.0"
__all__ = ["__version__", "analyze_trace", "Report"]


def __getattr__(name: str) -> Any:
    if name in ("analyze_trace", "Report"):
        from diagnose import notebook

        return getattr(notebook, name)
    raise AttributeError(f"module 'diagnose' has no attribute {name!r}")
