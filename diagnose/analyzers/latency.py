"""Per-step wall times, TTFT proxy and TPOT percentiles.

Definitions (README "Definitions"):

* **step wall time** = from the step marker's start (the host starts launching) to the later of
  the marker's end and the end of the last GPU activity launched inside it ("launch to GPU
  finish").
* **TTFT proxy** = wall time of the first prefill step. It excludes tokenization, queueing and
  network, which a live service's TTFT also holds (domain.md §1).
* **TPOT** samples = intervals between the completions of consecutive decode steps (the time
  a user waits between two tokens of one request, vLLM's ITL). Prefill and mixed steps are
  not samples, but an interval that spans one (a prefill interleaved with decode) keeps it:
  that is the S5 spike. With a single decode step, its wall time is the only sample.
  vLLM's benchmark TPOT, (latency - TTFT) / (n_out - 1), is the mean of these intervals.
* Percentiles: numpy linear interpolation (same as vLLM's benchmark_serving).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from diagnose.trace.model import NO_TIME


def step_table(steps: pd.DataFrame, activities: pd.DataFrame) -> pd.DataFrame:
    """Add GPU range and wall time to each step.

    Args:
        steps: from :func:`diagnose.analyzers.phases.find_steps`.
        activities: GPU activity frame with a ``step`` column (index into ``steps``, -1 none).

    Returns:
        ``steps`` plus gpu_start_ns, gpu_end_ns (NO_TIME when the step launched no GPU work),
        activity_count, wall_ns, and device_activity_count ({device: count}).
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
    steps["device_activity_count"] = per_dev
    return steps


def percentiles_ms(samples_ns: np.ndarray) -> dict[str, float | None]:
    """p50/p90/p99 (and mean) in ms; None when there is no sample."""
    if len(samples_ns) == 0:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    x = np.asarray(samples_ns, dtype=np.float64) / 1e6
    p50, p90, p99 = np.percentile(x, [50, 90, 99])
    return {"p50": round(float(p50), 6), "p90": round(float(p90), 6), "p99": round(float(p99), 6), "mean": round(float(x.mean()), 6)}


@dataclass
class LatencyFindings:
    """TTFT proxy and TPOT distribution (ms), with the sample counts behind them."""

    ttft_ms: float | None = None
    ttft_samples: int = 0
    tpot_ms: dict[str, float | None] = field(default_factory=lambda: percentiles_ms(np.zeros(0)))
    tpot_samples: int = 0
    tpot_definition: str = "interval between completions of consecutive decode steps"
    prefill_step_ms: dict[str, float | None] = field(default_factory=lambda: percentiles_ms(np.zeros(0)))
    decode_step_ms: dict[str, float | None] = field(default_factory=lambda: percentiles_ms(np.zeros(0)))

    def to_dict(self) -> dict[str, Any]:
        return dict(self.__dict__)


def latency_findings(steps: pd.DataFrame) -> LatencyFindings:
    """TTFT proxy and TPOT from a step table produced by :func:`step_table`."""
    out = LatencyFindings()
    if len(steps) == 0:
        return out
    steps = steps.sort_values("start_ns", kind="stable")
    done = np.maximum(steps["end_ns"].to_numpy(dtype=np.int64), steps["gpu_end_ns"].to_numpy(dtype=np.int64))
    phase = steps["phase"].to_numpy()
    wall = steps["wall_ns"].to_numpy(dtype=np.int64)
    pre = wall[phase == "prefill"]
    if len(pre):
        out.ttft_ms = round(float(pre[0]) / 1e6, 6)
        out.ttft_samples = int(len(pre))
        out.prefill_step_ms = percentiles_ms(pre)
    dec_done = done[phase == "decode"]
    dec_wall = wall[phase == "decode"]
    if len(dec_done) >= 2:
        samples = np.diff(dec_done)
    elif len(dec_done) == 1:
        samples = dec_wall
        out.tpot_definition = "single decode step: its wall time (launch to GPU finish)"
    else:
        samples = np.zeros(0, dtype=np.int64)
    out.tpot_ms = percentiles_ms(samples)
    out.tpot_samples = int(len(samples))
    out.decode_step_ms = percentiles_ms(dec_wall)
    return out
