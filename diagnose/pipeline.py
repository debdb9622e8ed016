"""One entry point from a path to an :class:`~diagnose.analyzers.Analysis` (CLI, app, tests)."""
from __future__ import annotations

from diagnose.analyzers import Analysis, Options, analyze
from diagnose.trace import load_trace


def run_analysis(path: str, phase_regex: tuple[str, ...] = (), options: Options | None = None, lenient: bool = False) -> Analysis:
    """Load ``path`` and run every analyzer.

    Args:
        path: trace file.
        phase_regex: shorthand for ``Options(phase_regex=...)`` when ``options`` is None.
        options: every analysis option.
        lenient: repair numbers written with a decimal comma (Kineto).

    Raises:
        DiagnoseError: unusable input or options.
    """
    trace = load_trace(path, lenient=lenient)
    return analyze(trace, options or Options(phase_regex=tuple(phase_regex)))
