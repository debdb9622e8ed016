"""A phase's causes of waiting, one row each (:class:`~diagnose.model.CauseRow`): the time of
each cause in the phase's gaps and in its steps, per step, as a share of the phase's own time,
and the host event (or collective) holding most of it."""
from __future__ import annotations

import numpy as np
import pandas as pd

from diagnose.analyzers.gapcause import Gaps
from diagnose.analyzers.gapview import cause_frames, short_frame
from diagnose.model import CauseRow
from diagnose.vocab import EXTERNAL_CAUSES, GAP_CAUSES


def _steps_ms(psteps: pd.DataFrame | None) -> dict[str, float] | None:
    """Idle ms per cause summed over the steps' waits (before and inside their spans)."""
    if psteps is None or not len(psteps) or "idle_by_cause_ms" not in psteps:
        return None
    out: dict[str, float] = {}
    for by in psteps["idle_by_cause_ms"]:
        for c, v in (by or {}).items():
            out[c] = out.get(c, 0.0) + float(v)
    return out


def cause_rows(g: Gaps, window_ns: int, own_ns: int | None, psteps: pd.DataFrame | None,
               coll: tuple[int, int, str | None]) -> list[CauseRow]:
    """The rows of every cause with time in the phase (``coll``: collective wait ns, calls
    waiting, the collective holding most of it), largest first."""
    dur = (g.end - g.start).astype(np.float64)
    ms = np.bincount(g.cause.astype(np.int64), weights=dur, minlength=len(GAP_CAUSES)) / 1e6
    cnt = np.bincount(g.cause.astype(np.int64), minlength=len(GAP_CAUSES))
    frames = cause_frames(g)
    by_steps = _steps_ms(psteps)
    n_steps = len(psteps) if psteps is not None else 0
    ext_idle = sum(ms[i] for i, c in enumerate(GAP_CAUSES) if c in EXTERNAL_CAUSES)
    window_ms = window_ns / 1e6
    own_ms = own_ns / 1e6 if own_ns is not None else max(window_ms - ext_idle, 0.0)
    wait_ns, calls, top = coll
    rows = []
    for i, c in enumerate(GAP_CAUSES):
        total = ms[i]
        count = int(cnt[i])
        frame = frames.get(c, (None, 0.0))[0]
        if c == "collective_wait":
            total, count, frame = wait_ns / 1e6, calls, top
        st = None if by_steps is None else (total if c == "collective_wait" else by_steps.get(c, 0.0))
        if total <= 0 and not st:
            continue
        ext = c in EXTERNAL_CAUSES
        base = window_ms if ext else own_ms
        num = st if st is not None else total
        rows.append(CauseRow(cause=c, external=ext, ms=round(float(total), 6), count=count,
                             steps_ms=None if st is None else round(float(st), 6),
                             per_step_ms=None if st is None or not n_steps else round(float(st) / n_steps, 6),
                             share=round(float(min(num / base, 1.0)), 6) if base > 0 else None,
                             frame=None if frame is None else short_frame(frame, 120)))
    rows.sort(key=lambda r: -(r.steps_ms if r.steps_ms is not None else r.ms))
    return rows
