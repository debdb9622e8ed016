"""One line per phase saying what sets the step time (README "Critical path"), shared by
the terminal report, the HTML report and the web overview.

``decode step path 3.101 ms (p50 of 1): 66 % host python in `attention.py(363): attention_cpu`,
12 % host CPU op in `linear.py(149): forward`, 9 % launch``: the largest parts of the
critical path, summed over the phase's steps, as shares of the summed path lengths. GPU time
is by kind; host time is by activity and frame (the innermost user python frame, else CPU
op), with its cause when it is not the default ``launch``; launch calls and launch latency
are ``launch``; blocking calls that did not wait and sync returns are ``sync``.
"""
from __future__ import annotations

from typing import Any, Mapping

from diagnose.vocab import PATH_KIND_LABELS

#: Parts of a path named in the line.
LINE_PARTS = 3
_ACTIVITY_WORDS = {"python": "host python", "python_in_op": "host python", "cpu_op": "host CPU op",
                   "runtime": "host runtime call", "range": "host", "overhead": "profiler overhead",
                   "untracked": "host (untracked)"}


def _short_frame(frame: str, n: int = 60) -> str:
    """``a/b/c.py(12): fn`` -> ``c.py(12): fn`` (the file's base name), cut to ``n``."""
    head, sep, tail = frame.partition("): ")
    if sep and "/" in head:
        frame = head.rsplit("/", 1)[1] + sep + tail
    return frame if len(frame) <= n else frame[: n - 1] + "…"


def _parts(ms_by_kind: Mapping[str, float], frames: list[Mapping[str, Any]]) -> list[tuple[str, float]]:
    """(label, ms) of the path: GPU kinds, launch (launch calls and latency), sync (blocking
    calls that did not wait, sync returns), and the rest of the host time as one part named by
    its largest frame (``frames``: the longest host (frame, cause, activity) entries)."""
    acc: dict[str, float] = {}

    def add(label: str, v: float) -> None:
        if v > 0:
            acc[label] = acc.get(label, 0.0) + v

    for k, v in ms_by_kind.items():
        if k == "launch_latency":
            add("launch", v)
        elif k == "sync_return":
            add("sync", v)
        elif k != "host":
            add(PATH_KIND_LABELS.get(k, k), v)
    host = float(ms_by_kind.get("host", 0.0))
    rest = []
    for f in frames:
        act, ms = f.get("activity"), float(f.get("ms") or 0.0)
        if act in ("launch", "sync"):
            add(act, ms)
            host -= ms
        else:
            rest.append(f)
    if host > 0:
        label = "host"
        by_frame: dict[str, list] = {}
        for f in rest:  # one frame may hold several activities and causes
            e = by_frame.setdefault(str(f.get("frame") or ""), [0.0, f])
            e[0] += float(f.get("ms") or 0.0)
            if float(f.get("ms") or 0.0) > float(e[1].get("ms") or 0.0):
                e[1] = f
        top = max(by_frame.items(), key=lambda kv: kv[1][0], default=None)
        if top is not None and top[0]:
            ms, f = top[1]
            word = _ACTIVITY_WORDS.get(f.get("activity") or "", "host")
            cause = f.get("cause")
            where = f"`{_short_frame(top[0])}`" + (f" ({cause})" if cause and cause != "launch" else "")
            share = ms / host
            label = f"{word} in {where}" if share >= 0.5 else f"host (most in {where}: {share:.0%} of it)"
        add(label, host)
    return sorted(acc.items(), key=lambda kv: -kv[1])


def _body(parts: list[tuple[str, float]], total: float) -> str:
    shown = [(label, v) for label, v in parts[:LINE_PARTS] if total > 0 and round(100 * v / total) >= 1]
    return ", ".join(f"{100 * v / total:.0f} % {label}" for label, v in shown) or "empty"


def phase_line(p: Mapping[str, Any]) -> str:
    """The line of one ``critical_path.phases[]`` entry of the JSON report."""
    total = float(p.get("length_total_ms") or 0.0)
    parts = _parts(p.get("ms_by_kind") or {}, p.get("host_frames") or [])
    body = _body(parts, total)
    n = int(p.get("steps") or 0)
    line = f"{p['phase']} step path {float(p.get('length_p50_ms') or 0):.3f} ms (p50 of {n}): {body}"
    brk = int(p.get("steps_with_host") or 0)
    if n > 1 and 0 < brk:
        line += f"; host on the path in {brk} of {n} steps"
    return line


def window_line(w: Mapping[str, Any]) -> str:
    """The line of the whole window's path (``critical_path.window``: no steps)."""
    total = float(w.get("length_ms") or 0.0)
    segs = [s for s in w.get("segments") or [] if s.get("kind") == "host"]
    frames = [{"frame": s.get("frame"), "cause": s.get("cause"), "activity": s.get("activity"), "ms": s.get("ms")}
              for s in segs]
    parts = _parts(w.get("ms_by_kind") or {}, frames)
    body = _body(parts, total)
    why = {"outside_trace": " (starts after a wait the trace does not explain)",
           "previous_step": " (from the previous GPU end)"}.get(str(w.get("start_reason")), "")
    return f"window path {total:.3f} ms{why}: {body}"


def path_lines(report: Mapping[str, Any]) -> list[str]:
    """Every path line of a JSON report (none without a ``critical_path`` section)."""
    cp = report.get("critical_path") or {}
    lines = [phase_line(p) for p in cp.get("phases") or []]
    if cp.get("window"):
        lines.append(window_line(cp["window"]))
    return lines
