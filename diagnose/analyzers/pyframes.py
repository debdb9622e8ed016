"""Steps from the python frames of engine step entry points (``with_stack`` tracing).

Engines that emit no step marker still show their step loop in the python frames Kineto
records with ``with_stack=True``: vLLM's ``gpu_model_runner.py(N): execute_model``, SGLang's
``model_runner.py(N): forward``, TensorRT-LLM's ``_forward_step``, nano-vllm's
``llm_engine.py(N): step`` (the grammars: ``frames`` in ``diagnose/data/step_markers.yaml``).

* **Innermost wins**: among matching frames that nest (SGLang's ``_run_batch_inner`` ⊃
  ``forward_batch_generation`` ⊃ ``ModelRunner.forward``), the innermost is the step; the
  outer ones are containers (their GPU work outside the step keeps the step's phase). An outer
  frame can hold work launched before a host wait (SGLang's scheduler frame launches a kernel
  before a 463 ms blocking copy): taking it would time the wait as the step.
* **Loops** (a grammar with ``inner``, Hugging Face's decoding loop): the outermost frames
  matching ``inner`` inside the loop are the steps, one model forward each.
* Without any engine frame, the outermost ``nn.Module: Name_N`` frames (``with_modules``) are
  the steps: one forward each.
* **Cut frames** are not steps: Kineto closes the frames still open when the profiler stops
  at one instant, so a frame that ends at the last python frame end together with another
  frame holds only part of its step.
* ``--phase-regex`` also matches frames (``re.search`` on the ``file(line): function`` text):
  :func:`user_frame_rows`.

A frame step's CPU range is the frame; its GPU work is what was launched inside it (any
thread). The rows have :data:`diagnose.analyzers.phases.STEP_COLUMNS` keys, phase ``unknown``
for engine frames (read later from what the step shows), evidence ``python_frame``.
"""
from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pandas as pd

from diagnose.patterns import clip
from diagnose.trace.model import Trace, factorize

#: The outermost module call of a forward (``with_modules``): ``nn.Module: Qwen2Model_0``.
MODULE_FRAME = re.compile(r"^nn\.Module: \w+_\d+$")


@lru_cache(maxsize=1)
def _frame_table() -> tuple[tuple[str, re.Pattern, re.Pattern | None], ...]:
    from diagnose.tables import marker_table

    return tuple((r.name, re.compile(r.pattern), re.compile(r.inner) if r.inner else None) for r in marker_table().frames)


def _matches(pf: pd.DataFrame, patterns: list[tuple[str, re.Pattern]]) -> np.ndarray:
    """Index into ``patterns`` of the first that matches each frame's name (-1: none), each
    distinct name matched once."""
    codes, uniq = factorize(pf["name"])
    hit = np.array([next((i for i, (_, rx) in enumerate(patterns) if rx.search(clip(str(u)))), -1) for u in uniq] + [-1],
                   dtype=np.int64)
    return hit[codes]


#: Frames closed by the profiler's stop share one end time, up to the conversion of their
#: float µs start and duration to ns (the JSON's resolution; 1 µs in older traces).
CUT_TOLERANCE_NS = 1_000


def _cut(pf: pd.DataFrame) -> np.ndarray:
    """Frames closed by the profiler's stop (module docstring): True where the frame ends at
    the last python frame end and at least one other frame ends at that same instant."""
    end = pf["end_ns"].to_numpy()
    last = end.max()
    at_last = end >= last - CUT_TOLERANCE_NS
    return at_last if at_last.sum() >= 2 else np.zeros(len(end), dtype=bool)


def _outermost(start: np.ndarray, end: np.ndarray, tid: np.ndarray) -> np.ndarray:
    """True for frames not inside another of the given frames on the same thread (sorted by
    thread, start, longest first: a frame is inside when an earlier one on its thread ends at
    or after its end)."""
    order = np.lexsort((-end, start, tid))
    e = pd.Series(end[order])
    t = tid[order]
    prev_max = e.groupby(t).cummax().groupby(t).shift(1, fill_value=np.iinfo(np.int64).min).to_numpy(dtype=np.int64)
    nested = e.to_numpy() <= prev_max
    out = np.zeros(len(order), dtype=bool)
    out[order] = ~nested
    return out


def _row(name: str, grammar: str, start: int, end: int, phase: str = "unknown") -> dict:
    return {"name": name, "phase": phase, "grammar": grammar, "evidence": "python_frame", "start_ns": int(start),
            "end_ns": int(end), "scope": "cpu", "batch": None, "tokens": None, "context": None, "kv_tokens": None,
            "prefill_requests": None, "decode_requests": None}


def engine_frame_rows(trace: Trace) -> list[dict]:
    """Candidate step rows from engine frames (loops expanded, cut frames dropped), else from
    the outermost ``nn.Module`` frames; nesting (innermost wins) is left to the caller."""
    pf = trace.python_frames
    if len(pf) == 0:
        return []
    table = _frame_table()
    idx = _matches(pf, [(n, rx) for n, rx, _ in table])
    cut = _cut(pf)
    names = pf["name"].to_numpy(dtype=object)
    st, en, tid = pf["start_ns"].to_numpy(), pf["end_ns"].to_numpy(), pf["tid"].to_numpy()
    rows: list[dict] = []
    inner_hit: dict[int, np.ndarray] = {}
    for i in np.flatnonzero((idx >= 0) & ~cut):
        gname, _, inner = table[idx[i]]
        if inner is None:
            rows.append(_row(str(names[i]), f"frame:{gname}", st[i], en[i]))
            continue
        if idx[i] not in inner_hit:  # each distinct name matched once
            inner_hit[idx[i]] = _matches(pf, [("inner", inner)]) >= 0
        m = inner_hit[idx[i]] & (st >= st[i]) & (en <= en[i]) & (tid == tid[i]) & ~cut
        m[i] = False
        cand = np.flatnonzero(m)
        if len(cand):
            for j in cand[_outermost(st[cand], en[cand], tid[cand])]:
                rows.append(_row(str(names[j]), f"frame:{gname}", st[j], en[j]))
    loops = {f"frame:{n}" for n, _, inner in table if inner is not None}
    if any(r["grammar"] in loops for r in rows):  # a loop's forwards are the steps, not the frames around them
        rows = [r for r in rows if r["grammar"] in loops]
    if rows:
        return rows
    cand = np.flatnonzero(_matches(pf, [("module", MODULE_FRAME)]) >= 0)
    if len(cand) == 0:
        return []
    top = cand[_outermost(st[cand], en[cand], tid[cand])]
    return [_row(str(names[j]), "frame:nn-module", st[j], en[j]) for j in top if not cut[j]]  # modules inside a cut one are pieces


def user_frame_rows(trace: Trace, grammars) -> list[dict]:
    """Rows for the frames a ``--phase-regex`` matches (``grammars``: the user's
    :class:`~diagnose.analyzers.phases.Grammar` list), phase fixed by the option."""
    pf = trace.python_frames
    if len(pf) == 0 or not grammars:
        return []
    idx = _matches(pf, [(g.name, g.pattern) for g in grammars])
    names = pf["name"].to_numpy(dtype=object)
    st, en = pf["start_ns"].to_numpy(), pf["end_ns"].to_numpy()
    return [_row(str(names[i]), grammars[idx[i]].name, st[i], en[i], grammars[idx[i]].fixed_phase or "unknown")
            for i in np.flatnonzero(idx >= 0)]
