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

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diagnose.analyzers.base import Context, declared
from diagnose.numeric import div, num
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


def percentiles_ms(samples_ns: np.ndarray) -> dict[str, float | None]:
    """p50/p90/p99 (and mean) in ms; None when there is no sample."""
    if len(samples_ns) == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    x = np.asarray(samples_ns, dtype=np.float64) / 1e6
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"p50": round(float(p50), 6), "p90": round(float(p90), 6), "p99": round(float(p99), 6), "mean": round(float(x.mean()), 6)}


TPOT_INTERVALS = "interval between completions of consecutive decode steps"
TPOT_SINGLE = "single decode step: its own time (GPU span minus external waits)"
ITL_INTERVALS = "interval between completions of consecutive decode or mixed steps with decode requests"
ITL_SINGLE = "single step with decode requests: its own time"


@dataclass(frozen=True)
class LatencyFindings:
    """TTFT proxy, TPOT and ITL distributions (ms), with the sample counts behind them."""

    ttft_ms: float | None = None
    ttft_samples: int = 0
    tpot_ms: dict[str, float | None] = field(default_factory=lambda: percentiles_ms(np.zeros(0)))
    tpot_samples: int = 0
    tpot_definition: str = TPOT_INTERVALS
    itl_ms: dict[str, float | None] = field(default_factory=lambda: percentiles_ms(np.zeros(0)))
    itl_samples: int = 0
    itl_definition: str = ITL_INTERVALS
    prefill_step_ms: dict[str, float | None] = field(default_factory=lambda: percentiles_ms(np.zeros(0)))
    decode_step_ms: dict[str, float | None] = field(default_factory=lambda: percentiles_ms(np.zeros(0)))
    mixed_step_ms: dict[str, float | None] = field(default_factory=lambda: percentiles_ms(np.zeros(0)))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def _intervals(done: np.ndarray, own: np.ndarray, single: str, several: str) -> tuple[np.ndarray, str]:
    if len(done) >= 2:
        return np.diff(np.sort(done)), several
    if len(done) == 1:
        return own, single
    return np.zeros(0, dtype=np.int64), several


def latency_findings(steps: pd.DataFrame) -> LatencyFindings:
    """TTFT proxy, TPOT and ITL from a step table with ``done_ns`` and ``own_ns``. Steps
    marked incomplete (``complete`` False: a launch of theirs has no GPU record) are left out
    of every number; steps whose own time is unreliable (``own_reliable`` False) are left out
    of the TTFT proxy and the step-time distributions, and kept for TPOT/ITL (their
    completions are still the markers' steps)."""
    if "complete" in steps:
        steps = steps[steps["complete"].to_numpy(dtype=bool)]
    if len(steps) == 0:
        return LatencyFindings()
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
    return LatencyFindings(
        ttft_ms=round(float(pre[0]) / 1e6, 6) if len(pre) else None,
        ttft_samples=int(len(pre)),
        tpot_ms=percentiles_ms(tpot), tpot_samples=int(len(tpot)), tpot_definition=tpot_def,
        itl_ms=percentiles_ms(itl), itl_samples=int(len(itl)), itl_definition=itl_def,
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


def mark_step_quality(ctx: Context) -> None:
    """Mark the steps whose numbers cannot be trusted (internal columns of the step table):

    * ``complete`` False: a launch call inside the step's CPU range has no GPU record
      (``ctx.extra["_orphan_launch_ns"]``, from the launches analyzer: the profiler dropped
      it). Such a step is left out of every latency number.
    * ``own_reliable`` False: the decode steps of a batch size whose GPU busy times differ by
      more than :data:`ATTRIBUTION_SPREAD` (note ``step_attribution_unreliable``): their own
      times are not reported (``own_ms`` null), so no step is called slow for work that
      was not its own; TPOT from the steps' completions is kept.
    """
    steps = ctx.steps
    n = len(steps)
    complete = np.ones(n, dtype=bool)
    orphans = np.sort(np.asarray(ctx.extra.get("_orphan_launch_ns", np.zeros(0)), dtype=np.int64))
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
                ctx.note("step_attribution_unreliable",
                         f"decode steps of batch {int(b)} did {busy[grp].min():.3f} to {busy[grp].max():.3f} ms of GPU work "
                         f"({busy[grp].max() / busy[grp].min():,.0f}x apart): GPU work is not attributed to the step that "
                         "launched it (deferred into a burst); their own times are not reported, TPOT comes from the "
                         "steps' completions", int(grp.sum()))
    steps["complete"] = complete
    steps["own_reliable"] = reliable & complete


FINDINGS = declared("latency")


def run(ctx: Context) -> None:
    """Add GPU ranges, wall and completion times to the step table; TTFT proxy, TPOT and ITL
    (``ctx.latency``)."""
    ctx.steps = step_table(ctx.steps, ctx.activities)
    mark_step_quality(ctx)
    ctx.latency = latency_findings(ctx.steps)


def _pct(values: list, q: float) -> float | None:
    """Percentile with numpy's linear interpolation, None when empty."""
    return float(np.percentile(values, q)) if len(values) else None


def findings_of_phase(p: dict, out: dict) -> None:
    n = p["name"]
    out[f"{n}.steps"] = num(p.get("steps"))
    out[f"{n}.wall_ms"] = num(p.get("wall_ms"))
    out[f"{n}.own_ms"] = num(p.get("own_ms"))


def findings(report: dict, device, out: dict) -> None:
    """Flatten ``latency`` and ``steps`` of a report into ``out`` (names in :data:`FINDINGS`)."""
    lat = report.get("latency") or {}
    out["latency.ttft_ms"] = num(lat.get("ttft_ms"))
    out["latency.ttft_samples"] = num(lat.get("ttft_samples"))
    pre = lat.get("prefill_step_ms") or {}
    tp = lat.get("tpot_ms") or {}
    itl = lat.get("itl_ms") or {}
    dec = lat.get("decode_step_ms") or {}
    for q in ("p50", "p90", "p99"):
        out[f"latency.ttft_{q}_ms"] = num(pre.get(q))
        out[f"latency.tpot_{q}_ms"] = num(tp.get(q))
        out[f"latency.itl_{q}_ms"] = num(itl.get(q))
        out[f"latency.prefill_step_{q}_ms"] = num(pre.get(q))
        out[f"latency.decode_step_{q}_ms"] = num(dec.get(q))
    out["latency.tpot_mean_ms"] = num(tp.get("mean"))
    out["latency.tpot_samples"] = num(lat.get("tpot_samples"))
    out["latency.itl_samples"] = num(lat.get("itl_samples"))
    out["latency.tpot_p99_over_p50"] = div(tp.get("p99"), tp.get("p50"))
    _step_findings(list(report.get("steps") or []), out)
    out["latency.decode_throughput_tok_s"] = (
        div(out["steps.decode_p50_batch"] * 1000.0, out["latency.tpot_p50_ms"])
        if out.get("steps.decode_p50_batch") is not None else None
    )


def _step_findings(steps: list[dict], out: dict) -> None:
    steps = sorted(steps, key=lambda s: (num(s.get("start_ns")) or 0))
    by = {ph: [s for s in steps if s.get("phase") == ph] for ph in ("prefill", "decode", "mixed")}
    out["steps.count"] = len(steps)
    for ph in ("prefill", "decode", "mixed"):
        out[f"steps.{ph}_count"] = len(by[ph])
    pw = [w for w in (num(s.get("own_ms")) for s in by["prefill"]) if w is not None]
    dw = [w for w in (num(s.get("own_ms")) for s in by["decode"]) if w is not None]
    out["steps.prefill_max_ms"] = max(pw) if pw else None
    out["steps.prefill_p50_ms"] = _pct(pw, 50)
    out["steps.decode_p50_ms"] = _pct(dw, 50)
    out["steps.decode_p99_ms"] = _pct(dw, 99)
    out["steps.decode_max_ms"] = max(dw) if dw else None

    # Prefill (or mixed) steps with a decode step both before and after them (S5).
    phases = [s.get("phase") for s in steps]
    dec_idx = [i for i, ph in enumerate(phases) if ph == "decode"]
    if len(dec_idx) >= 2:
        lo, hi = dec_idx[0], dec_idx[-1]
        inter = [num(steps[i].get("own_ms")) for i in range(lo + 1, hi) if phases[i] in ("prefill", "mixed")]
        inter = [w for w in inter if w is not None]
        out["steps.prefill_interleaved_count"] = len(inter)
        out["steps.prefill_interleaved_max_ms"] = max(inter) if inter else 0.0
    else:
        out["steps.prefill_interleaved_count"] = 0
        out["steps.prefill_interleaved_max_ms"] = None

    mixed = [s for s in by["mixed"] if num(s.get("own_ms")) is not None]
    longest = max(mixed, key=lambda s: num(s.get("own_ms"))) if mixed else None
    out["steps.mixed_max_ms"] = num(longest.get("own_ms")) if longest else None
    out["steps.mixed_max_decode_requests"] = num(longest.get("decode_requests")) if longest else None
    out["steps.mixed_max_tokens"] = num(longest.get("tokens")) if longest else None

    db = [b for b in (num(s.get("batch")) for s in by["decode"]) if b is not None]
    dc = [c for c in (num(s.get("context")) for s in by["decode"]) if c is not None]
    out["steps.decode_p50_batch"] = _pct(db, 50)
    out["steps.decode_max_batch"] = max(db) if db else None
    out["steps.decode_p50_context"] = _pct(dc, 50)
    out["steps.decode_max_context"] = max(dc) if dc else None
    ptoks, prompts = [], []
    for s in by["prefill"]:
        t, b = num(s.get("tokens")), num(s.get("batch"))
        if t is not None:
            ptoks.append(t)
            prompts.append(t / b if b else t)
    out["steps.prefill_max_tokens"] = max(ptoks) if ptoks else None
    out["steps.prefill_max_prompt_tokens"] = max(prompts) if prompts else None
    out["steps.prefill_p50_prompt_tokens"] = _pct(prompts, 50)

    # User-timed CPU regions shorter than the GPU work they launched (S7). Engine step
    # markers (vLLM, SGLang, this project's collector) end before their GPU work by design
    # (asynchronous launch); only regions the user timed themselves (--phase-regex) count.
    with_gpu = timed = shorter = 0
    ratios = []
    for s in steps:
        cs, ce = num(s.get("start_ns")), num(s.get("end_ns"))
        gs, ge = num(s.get("gpu_start_ns")), num(s.get("gpu_end_ns"))
        if None in (cs, ce, gs, ge) or s.get("scope", "cpu") != "cpu":
            continue
        with_gpu += 1
        if not str(s.get("grammar") or "").startswith("user:"):
            continue
        timed += 1
        cpu, gpu = ce - cs, ge - gs
        if ce < ge and cpu < gpu:
            shorter += 1
        if cpu > 0:
            ratios.append(gpu / cpu)
    out["steps.with_gpu_count"] = with_gpu
    out["steps.user_timed_count"] = timed
    out["steps.cpu_shorter_than_gpu_count"] = shorter if timed else None
    out["steps.cpu_shorter_than_gpu_share"] = shorter / timed if timed else None
    out["steps.max_gpu_over_cpu"] = max(ratios) if ratios else None
