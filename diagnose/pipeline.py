"""One entry point from a path to an :class:`~diagnose.analyzers.Analysis` (CLI, app, tests)."""
from __future__ import annotations

import os

from diagnose.analyzers import Analysis, Options, analyze
from diagnose.trace import load_trace
from diagnose.trace.reading import Prefetch
from diagnose.trace.slice import parse_window, slice_trace


PROGRESS_MIN_BYTES = 100 * 10**6


def input_size(path: str) -> int:
    """Bytes to parse: the file size, or for gzip the uncompressed size from its trailer
    (ISIZE, modulo 2**32: a lower bound for files over 4 GiB). 0 when unreadable."""
    try:
        size = os.path.getsize(path)
        with open(path, "rb") as f:
            if f.read(2) != b"\x1f\x8b" or size < 18:
                return size
            f.seek(-4, os.SEEK_END)
            return max(size, int.from_bytes(f.read(4), "little"))
    except OSError:
        return 0


def run_analysis(path: str, phase_regex: tuple[str, ...] = (), options: Options | None = None, lenient: bool = False,
                 show_progress: bool = False, window: str | None = None, device: int | None = None,
                 prefetch: Prefetch | None = None, workers: int | None = None) -> Analysis:
    """Load ``path`` and run every analyzer.

    Args:
        path: trace file.
        phase_regex: shorthand for ``Options(phase_regex=...)`` when ``options`` is None.
        options: every analysis option.
        lenient: repair numbers written with a decimal comma (Kineto).
        window: ``START:END`` in ms from the trace start (``--window``); device: one device.
        show_progress: draw a progress bar on stderr (when it is a terminal) for inputs over
            100 MB (uncompressed).
        prefetch: a :class:`~diagnose.trace.reading.Prefetch` already reading ``path``.
        workers: processes for decoding a large Kineto file (None: one per CPU, up to 4).

    Raises:
        DiagnoseError: unusable input or options.
    """
    opts = options or Options(phase_regex=tuple(phase_regex))
    window_ms = parse_window(window)

    def load(progress=None):
        trace = load_trace(path, lenient=lenient, progress=progress, prefetch=prefetch, workers=workers)
        if window_ms is not None or device is not None:
            slice_trace(trace, window_ms, device)
        return trace

    size = input_size(path) if show_progress else 0
    console = None
    if size >= PROGRESS_MIN_BYTES and os.path.getsize(path) >= 5 * 10**6:
        from rich.console import Console

        console = Console(stderr=True)
    if console is None or not console.is_terminal:
        return analyze(load(), opts)
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    # auto_refresh off: no refresh thread, so the loader may fork decoding workers (it never
    # forks while other threads run); the bar is redrawn on each progress call instead
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.percentage:>3.0f}%"),
                  TimeElapsedColumn(), console=console, transient=True, auto_refresh=False) as bar:
        task = bar.add_task(f"reading {os.path.basename(path)} ({size / 1e6:,.0f} MB)", total=1.0)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=0.9 * done / max(total, 1), refresh=True)

        trace = load(progress)
        bar.update(task, completed=0.9, description="analysing", refresh=True)
        result = analyze(trace, opts)
        bar.update(task, completed=1.0)
    return result
