"""Per-step times, the TTFT proxy, TPOT and ITL percentiles.

Definitions (README "Definitions"; the step time model is :mod:`diagnose.analyzers.waits`):

* **step wall time** (``wall_ns``) = from the step marker's start to the later of the
  marker's end and the end of the last GPU activity launched inside it.
* **step own time** (``own_ns``) = the step's GPU span minus the idle gaps inside it whose
  cause is external to the step (cold start, profiler overhead, work not in the trace); the
  CPU range for a step that launched no GPU work. A marker that starts long before its GPU
  work (asynchronous scheduling, a blocking copy) does not inflate it.
* **TTFT proxy** = own time of the first prefill step. It excludes tokenization, queueing and
  network, which a live service's TTFT also holds (docs/prefill-decode.md §1).
* **TPOT** samples = intervals between the completions (last GPU activity end) of
  consecutive decode steps: the time a user waits between two tokens of one request. Prefill
  and mixed steps are not samples, but an interval that spans one keeps it (the S5 spike).
  With a single decode step, its own time is the only sample. vLLM's benchmark TPOT,
  (latency - TTFT) / (n_out - 1), is the mean of these intervals.
* **ITL** samples (vLLM's inter-token latency) = intervals between completions of
  consecutive steps that give running requests a token: decode steps and mixed steps with
  decode requests (their decode requests wait for the whole mixed step). With a single such
  step, its own time.
* Percentiles: numpy linear interpolation (as vLLM's benchmark_serving).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from diagnose.analyzers.base import Notes, declared
from diagnose.model import Latency, Percentiles
from diagnose.trace.model import NO_TIME


def step_table(steps: pd.DataFrame, activities: pd.DataFrame) -> pd.DataFrame:
    """Add GPU range and wall time to each step.

    Args:
        steps: from :func:`diagnose.analyzers.phases.find_steps` (plus the step model's columns).
        activities: GPU activity frame with a ``step`` column (index into ``steps``, -1 none).

    Returns:
        ``steps`` plus gpu_start_ns, gpu_end_ns (NO_TIME when the step launched no GPU work),
        activity_count, wall_ns, done_ns (completion: GPU end, else CPU end) and
        device_activity_count ({device: count}).
    """
    steps = steps.reset_index(drop=True).copy()
    n = len(steps)
    gs = np.full(n, NO_TIME, dtype=np.int64)
    ge = np.full(n, NO_TIME, dtype=np.int64)
    cnt = np.zeros(n, dtype=np.int64)
    per_dev: list[dict[int, int]] = [dict() for _ in range(n)]
    if n and len(activities):
        a = activities[activities["step"] >= 0]
        if len(a):
            agg = a.groupby("step").agg(s=("start_ns", "min"), e=("end_ns", "max"), c=("start_ns", "size"))
            ix = agg.index.to_numpy()
            gs[ix] = agg["s"].to_numpy()
            ge[ix] = agg["e"].to_numpy()
            cnt[ix] = agg["c"].to_numpy()
            for (st, dev), c in a.groupby(["step", "device"]).size().items():
                per_dev[int(st)][int(dev)] = int(c)
    steps["gpu_start_ns"] = gs
    steps["gpu_end_ns"] = ge
    steps["activity_count"] = cnt
    cpu_end = steps["end_ns"].to_numpy(dtype=np.int64) if n else np.zeros(0, dtype=np.int64)
    cpu_start = steps["start_ns"].to_numpy(dtype=np.int64) if n else np.zeros(0, dtype=np.int64)
    steps["wall_ns"] = np.maximum(cpu_end, ge) - cpu_start
    steps["done_ns"] = np.where(ge != NO_TIME, ge, cpu_end)
    steps["device_activity_count"] = per_dev
    return steps


def union_ns(start_ns: np.ndarray, end_ns: np.ndarray) -> int:
    """Length of the union of intervals (a phase's wall time: overlapping steps count once)."""
    from diagnose.analyzers.timeline import union_busy_ns

    return union_busy_ns(np.asarray(start_ns, dtype=np.int64), np.asarray(end_ns, dtype=np.int64))


def percentiles_ms(samples_ns: np.ndarray) -> Percentiles:
    """p50/p90/p99 (and mean) in ms; None when there is no sample."""
    if len(samples_ns) == 0:
        return Percentiles(p50_ms=None, p90_ms=None, p99_ms=None, mean_ms=None)
    x = np.asarray(samples_ns, dtype=np.float64) / 1e6
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return Percentiles(p50_ms=round(float(p50), 6), p90_ms=round(float(p90), 6), p99_ms=round(float(p99), 6),
                       mean_ms=round(float(x.mean()), 6))


TPOT_INTERVALS = "interval between completions of consecutive decode steps"
TPOT_SINGLE = "single decode step: its own time (GPU span minus external waits)"
ITL_INTERVALS = "interval between completions of consecutive decode or mixed steps with decode requests"
ITL_SINGLE = "single step with decode requests: its own time"


def _intervals(done: np.ndarray, own: np.ndarray, single: str, several: str) -> tuple[np.ndarray, str]:
    if len(done) >= 2:
        return np.diff(np.sort(done)), several
    if len(done) == 1:
        return own, single
    return np.zeros(0, dtype=np.int64), several


def latency_findings(steps: pd.DataFrame, definition: str | None = None) -> Latency:
    """TTFT proxy, TPOT and ITL from a step table with ``done_ns`` and ``own_ns``
    (``definition``: replaces both sample definitions, e.g. when fragment steps were left out).
    Steps marked incomplete (``complete`` False: a launch of theirs has no GPU record) are left
    out of every number; steps whose own time is unreliable (``own_reliable`` False) are left out
    of the TTFT proxy and the step-time distributions, and kept for TPOT/ITL (their completions
    are still the markers' steps)."""
    empty = percentiles_ms(np.zeros(0))
    if "complete" in steps:
        steps = steps[steps["complete"].to_numpy(dtype=bool)]
    if len(steps) == 0:
        return Latency(ttft_ms=None, ttft_samples=0, tpot_ms=empty, tpot_samples=0, tpot_definition=definition or TPOT_INTERVALS,
                       itl_ms=empty, itl_samples=0, itl_definition=definition or ITL_INTERVALS, prefill_step_ms=empty,
                       decode_step_ms=empty, mixed_step_ms=empty)
    steps = steps.sort_values("start_ns", kind="stable")
    done = steps["done_ns"].to_numpy(dtype=np.int64)
    own = steps["own_ns"].to_numpy(dtype=np.int64)
    phase = steps["phase"].to_numpy()
    ok = steps["own_reliable"].to_numpy(dtype=bool) if "own_reliable" in steps else np.ones(len(steps), dtype=bool)
    dreq = pd.to_numeric(steps["decode_requests"], errors="coerce").to_numpy(dtype=np.float64) if "decode_requests" in steps else np.full(len(steps), np.nan)
    pre = own[(phase == "prefill") & ok]
    is_dec = phase == "decode"
    tpot, tpot_def = _intervals(done[is_dec], own[is_dec], TPOT_SINGLE, TPOT_INTERVALS)
    gives_token = is_dec | ((phase == "mixed") & ~(dreq == 0))
    itl, itl_def = _intervals(done[gives_token], own[gives_token], ITL_SINGLE, ITL_INTERVALS)
    return Latency(
        ttft_ms=round(float(pre[0]) / 1e6, 6) if len(pre) else None,
        ttft_samples=int(len(pre)),
        tpot_ms=percentiles_ms(tpot), tpot_samples=int(len(tpot)), tpot_definition=definition or tpot_def,
        itl_ms=percentiles_ms(itl), itl_samples=int(len(itl)), itl_definition=definition or itl_def,
        prefill_step_ms=percentiles_ms(pre),
        decode_step_ms=percentiles_ms(own[is_dec & ok]),
        mixed_step_ms=percentiles_ms(own[(phase == "mixed") & ok]),
    )


#: Decode steps of one batch size whose GPU busy time differs by more than this factor are
#: not measuring their own work: a replay of the same graph does the same work each step, so
#: such a spread means kernels were attributed to the wrong step (deferred into one burst,
#: sglang#31545). Far above what a growing KV context does (one decode step reads every
#: weight once; at 100x even the KV read would have to dwarf the weights a hundredfold).
ATTRIBUTION_SPREAD = 100.0


def mark_step_quality(steps: pd.DataFrame, orphan_launch_ns: np.ndarray, notes: Notes) -> pd.DataFrame:
    """The step table with two internal columns marking the steps whose numbers cannot be trusted:

    * ``complete`` False: a launch call inside the step's CPU range has no GPU record
      (``orphan_launch_ns``, int64 ns, from :func:`diagnose.analyzers.launches.launch_links`:
      the profiler dropped it). Such a step is left out of every latency number.
    * ``own_reliable`` False: the decode steps of a batch size whose GPU busy times differ by
      more than :data:`ATTRIBUTION_SPREAD` (note ``step_attribution_unreliable``): their own
      times are not reported (``own_ms`` null), so no step is called slow for work that
      was not its own; TPOT from the steps' completions is kept.
    """
    steps = steps.copy()
    n = len(steps)
    complete = np.ones(n, dtype=bool)
    orphans = np.sort(np.asarray(orphan_launch_ns, dtype=np.int64))
    if n and len(orphans) and "scope" in steps:
        st = steps["start_ns"].to_numpy(dtype=np.int64)
        en = steps["end_ns"].to_numpy(dtype=np.int64)
        inside = np.searchsorted(orphans, en, side="right") - np.searchsorted(orphans, st, side="left")
        complete = ~((inside > 0) & (steps["scope"].to_numpy() == "cpu"))
    reliable = np.ones(n, dtype=bool)
    if n and "gpu_busy_ms" in steps:
        dec = (steps["phase"].to_numpy() == "decode") & complete
        busy = pd.to_numeric(steps["gpu_busy_ms"], errors="coerce").to_numpy(dtype=np.float64)
        batch = pd.to_numeric(steps["batch"], errors="coerce").to_numpy(dtype=np.float64)
        for b in np.unique(batch[dec & ~np.isnan(batch)]):
            grp = dec & (batch == b) & (busy > 0)
            if grp.sum() >= 2 and busy[grp].max() > ATTRIBUTION_SPREAD * busy[grp].min():
                reliable[grp] = False
                notes.note("step_attribution_unreliable",
                             f"decode steps of batch {int(b)} did {busy[grp].min():.3f} to {busy[grp].max():.3f} ms of GPU work "
                           f"({busy[grp].max() / busy[grp].min():,.0f}x apart): GPU work is not attributed to the step that "
                           "launched it (deferred into a burst); their own times are not reported, TPOT comes from the "
                           "steps' completions", int(grp.sum()))
    steps["complete"] = complete
    steps["own_reliable"] = reliable & complete
    return steps


FINDINGS = declared("latency")
