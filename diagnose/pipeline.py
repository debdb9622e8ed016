"""One entry point from a path to an :class:`~diagnose.analyzers.Analysis` (CLI, app, tests)."""
from __future__ import annotations

from diagnose.analyzers import Analysis, Options, analyze
from diagnose.trace import load_trace


def run_analysis(path: str, phase_regex: tuple[str, ...] = ()) -> Analysis:
    """Load ``path`` and run every analyzer.

    Raises:
        DiagnoseError: unusable input or options.
    """
    trace = load_trace(path)
    return analyze(trace, Options(phase_regex=tuple(phase_regex)))
