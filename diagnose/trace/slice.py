"""Analyse a slice of a trace: a time window and/or one device (``--window``, ``--device``)."""
from __future__ import annotations

from diagnose.errors import DiagnoseError
from diagnose.trace.model import Trace


def parse_window(spec: str | None) -> tuple[float, float] | None:
    """``"START:END"`` in ms from the trace start (either side may be empty) -> (start, end).

    Raises:
        DiagnoseError: not two numbers separated by a colon, or END <= START.
    """
    if not spec:
        return None
    if ":" not in spec:
        raise DiagnoseError(f"--window expects START:END in ms from the trace start, got {spec!r}")
    a, b = spec.split(":", 1)
    try:
        start = float(a) if a.strip() else 0.0
        end = float(b) if b.strip() else float("inf")
    except ValueError:
        raise DiagnoseError(f"--window expects numbers (ms), got {spec!r}") from None
    if start != start or end != end or start == float("inf"):  # NaN or an infinite start
        raise DiagnoseError(f"--window expects finite numbers (ms), got {spec!r}")
    if end <= start or start < 0:
        raise DiagnoseError(f"--window {spec!r}: need 0 <= START < END")
    return start, end


_SPAN_FRAMES = ("gpu", "runtime", "cpu_ops", "annotations")
_SLICED_FRAMES = ("gpu", "runtime", "cpu_ops", "annotations", "gpu_syncs", "overhead", "python_frames")


def trace_start_ns(trace: Trace) -> int | None:
    """Earliest timestamp among GPU activity, runtime calls, ops and annotations."""
    starts = [int(f["start_ns"].min()) for f in (getattr(trace, a) for a in _SPAN_FRAMES) if len(f)]
    return min(starts) if starts else None


def trace_end_ns(trace: Trace) -> int | None:
    """Latest end among GPU activity, runtime calls, ops and annotations."""
    ends = [int(f["end_ns"].max()) for f in (getattr(trace, a) for a in _SPAN_FRAMES) if len(f)]
    return max(ends) if ends else None


def _outside(spec: tuple[float, float], t0: int | None, t1: int | None) -> DiagnoseError:
    end = "" if spec[1] == float("inf") else f"{spec[1]:g}"
    what = f"--window {spec[0]:g}:{end}"
    if t0 is None or t1 is None:
        return DiagnoseError(f"{what}: the trace has no timed events to slice")
    return DiagnoseError(f"{what} selects no event: the trace spans 0 to {(t1 - t0) / 1e6:,.3f} ms from its start")


def slice_trace(trace: Trace, window_ms: tuple[float, float] | None = None, device: int | None = None) -> Trace:
    """Keep events starting inside ``window_ms`` (ms from :func:`trace_start_ns`) and GPU work of
    ``device``. Modifies and returns ``trace``; notes the slice in ``trace.quality``.

    Raises:
        DiagnoseError: ``device`` has no GPU activity in the trace; the window starts after
            the trace's end or selects no event (the message gives the trace's span).
    """
    if device is not None:
        present = sorted(int(d) for d in trace.gpu["device"].unique()) if len(trace.gpu) else []
        if device not in present:
            raise DiagnoseError(f"--device {device}: no GPU activity on that device (devices with activity: {present or 'none'})")
        trace.gpu = trace.gpu[trace.gpu["device"] == device].reset_index(drop=True)
        trace.gpu_syncs = trace.gpu_syncs[trace.gpu_syncs["device"] == device].reset_index(drop=True)
        ann = trace.annotations
        trace.annotations = ann[(ann["scope"] == "cpu") | (ann["device"] == device)].reset_index(drop=True)
        trace.note("sliced_device", f"analysed device {device} only (--device)")
    if window_ms is not None:
        t0, t1 = trace_start_ns(trace), trace_end_ns(trace)
        if t0 is None or t1 is None or window_ms[0] * 1e6 > t1 - t0:
            raise _outside(window_ms, t0, t1)
        lo = t0 + int(window_ms[0] * 1e6)
        hi = t0 + int(window_ms[1] * 1e6) if window_ms[1] * 1e6 <= t1 - t0 else None  # None: to the end
        kept = {}
        for attr in _SLICED_FRAMES:
            f = getattr(trace, attr)
            if len(f):
                m = f["start_ns"] >= lo
                if hi is not None:
                    m &= f["start_ns"] < hi
                kept[attr] = f[m].reset_index(drop=True)
        if not any(len(kept.get(a, ())) for a in _SPAN_FRAMES):
            raise _outside(window_ms, t0, t1)
        for attr, f in kept.items():
            setattr(trace, attr, f)
        end = "end" if window_ms[1] == float("inf") else f"{window_ms[1]:g} ms"
        trace.note("sliced_window", f"analysed events starting between {window_ms[0]:g} ms and {end} from the trace start (--window)")
    return trace
