"""The roofline: achieved FLOP/s and bytes/s against a device's peaks, in one place.

One formula for every caller (the trace analysis per phase, ``diagnose collect bench`` per
row, ``diagnose bounds``): given the FLOPs and bytes of each step and the total time,

* achieved TFLOP/s = sum(FLOPs) / time / 1e12; achieved TB/s = sum(bytes) / time / 1e12;
* MFU = achieved TFLOP/s / dense FP16/BF16 peak; MBU = achieved TB/s / peak bandwidth;
* arithmetic intensity (AI) = sum(FLOPs) / sum(bytes), FLOP/B; ``bound`` = "compute" when
  AI >= the ridge point (peak FLOP/s / peak B/s), else "memory" (docs/prefill-decode.md section 3);
* lower bound ``bound_s`` = sum over steps of max(FLOPs / peak FLOP/s, bytes / peak B/s)
  (each step is limited by the slower of its two roofs); ``bound_ratio`` = time / bound_s.

Units: TFLOP/s = 1e12 FLOP/s, TB/s = 1e12 B/s, seconds. Peaks come from
:class:`diagnose.hardware.GpuPeak` (``dense_fp16_tflops``, ``memory_bandwidth_tbps``).

Rounding (``rounded=True``, the JSON report's): achieved TFLOP/s and TB/s to 6 decimals, MFU
and MBU computed from those rounded values and rounded to 6 decimals, AI to 3 decimals,
``bound_ratio`` to 4; ``flops``, ``bytes`` and ``bound_s`` are never rounded.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from diagnose.hardware import GpuPeak


@dataclass(frozen=True)
class Roofline:
    """Attainment of a span of steps against a device's roofs.

    Attributes:
        flops: sum of the steps' FLOPs, or None when any step's FLOPs are unknown.
        bytes: sum of the steps' device-memory bytes, or None when any is unknown.
        time_s: the span's time in seconds, or None (not measured).
        achieved_tflops: flops / time_s / 1e12, TFLOP/s.
        achieved_tbps: bytes / time_s / 1e12, TB/s.
        mfu: achieved_tflops / peak_tflops (model FLOP/s utilisation), ratio.
        mbu: achieved_tbps / peak_tbps (memory-bandwidth utilisation), ratio.
        arithmetic_intensity: flops / bytes, FLOP/B.
        bound: "compute" when arithmetic_intensity >= the ridge point, else "memory".
        bound_s: sum over steps of max(FLOPs / peak FLOP/s, bytes / peak B/s), seconds.
        bound_ratio: time_s / bound_s (1.0 = at the roofline), ratio.
        peak_tflops: dense FP16/BF16 peak used, TFLOP/s.
        peak_tbps: memory bandwidth peak used, TB/s.
        missing: inputs that were absent, from "flops", "bytes", "time", "peak",
            "peak_tflops", "peak_tbps" (callers word their own reasons).
    """

    flops: float | None
    bytes: float | None
    time_s: float | None
    achieved_tflops: float | None
    achieved_tbps: float | None
    mfu: float | None
    mbu: float | None
    arithmetic_intensity: float | None
    bound: str | None
    bound_s: float | None
    bound_ratio: float | None
    peak_tflops: float | None
    peak_tbps: float | None
    missing: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        """All fields as a JSON-ready dict (``missing`` as a list)."""
        d = asdict(self)
        d["missing"] = list(self.missing)
        return d


def _steps(values: Any) -> np.ndarray | None:
    """Per-step values as a float64 array; None when any is None/NaN or there are none."""
    if values is None:
        return None
    if np.isscalar(values):
        values = [values]
    seq = list(values) if not isinstance(values, np.ndarray) else values
    if len(seq) == 0:
        return None
    if not isinstance(seq, np.ndarray) and any(v is None for v in seq):
        return None
    arr = np.asarray(seq, dtype=np.float64)
    if np.isnan(arr).any():
        return None
    return arr


def roofline(
    step_flops: Sequence[float | None] | np.ndarray | float | None,
    step_bytes: Sequence[float | None] | np.ndarray | float | None,
    time_s: float | None,
    peak: GpuPeak | None,
    *,
    rounded: bool = True,
) -> Roofline:
    """Achieved rates, MFU/MBU, arithmetic intensity, bound and bound ratio of a span of steps.

    Args:
        step_flops: FLOPs of each step (shape ``[n_steps]``; a scalar is one step). Any None
            or NaN makes the FLOP side unknown.
        step_bytes: device-memory bytes of each step, aligned with ``step_flops``.
        time_s: total time of the steps in seconds (e.g. the sum of step wall times), or
            None. A non-positive time gives no achieved rates.
        peak: the device's peaks, or None (MFU/MBU/bound are then None).
        rounded: round as the JSON report does (module docstring); False keeps full
            precision (the benchmark's results file).

    Returns:
        The :class:`Roofline`; a field is None when an input it needs is missing
        (``missing`` names which).

    Raises:
        ValueError: ``step_flops`` and ``step_bytes`` are both known but of different lengths.
    """
    f_arr = _steps(step_flops)
    b_arr = _steps(step_bytes)
    if f_arr is not None and b_arr is not None and len(f_arr) != len(b_arr):
        raise ValueError(f"step_flops ({len(f_arr)}) and step_bytes ({len(b_arr)}) differ in length")
    missing: list[str] = []
    flops = None if f_arr is None else float(f_arr.sum())
    nbytes = None if b_arr is None else float(b_arr.sum())
    if flops is None:
        missing.append("flops")
    if nbytes is None:
        missing.append("bytes")
    r6 = (lambda x: round(x, 6)) if rounded else (lambda x: x)
    achieved_tflops = achieved_tbps = None
    if time_s is None or not time_s > 0:
        missing.append("time")
    else:
        if flops is not None:
            achieved_tflops = r6(flops / time_s / 1e12)
        if nbytes is not None:
            achieved_tbps = r6(nbytes / time_s / 1e12)
    ai = None
    if flops is not None and nbytes:
        ai = round(flops / nbytes, 3) if rounded else flops / nbytes
    mfu = mbu = bound = bound_s = ratio = None
    peak_tflops = peak_tbps = None
    if peak is None:
        missing.append("peak")
    else:
        peak_tflops = peak.dense_fp16_tflops
        peak_tbps = peak.memory_bandwidth_tbps
        if not peak_tflops:
            missing.append("peak_tflops")
        if not peak_tbps:
            missing.append("peak_tbps")
        if achieved_tflops is not None and peak_tflops:
            mfu = r6(achieved_tflops / peak_tflops)
        if achieved_tbps is not None and peak_tbps:
            mbu = r6(achieved_tbps / peak_tbps)
        ridge = peak.ridge_flop_per_byte
        if ai is not None and ridge:
            bound = "compute" if ai >= ridge else "memory"
        if peak_tflops and peak_tbps and f_arr is not None and b_arr is not None:
            lower = np.maximum(f_arr / (peak_tflops * 1e12), b_arr / (peak_tbps * 1e12))
            if lower.sum() > 0:
                bound_s = float(lower.sum())
                if time_s is not None:
                    ratio = round(time_s / float(lower.sum()), 4) if rounded else time_s / bound_s
    return Roofline(
        flops=flops,
        bytes=nbytes,
        time_s=time_s,
        achieved_tflops=achieved_tflops,
        achieved_tbps=achieved_tbps,
        mfu=mfu,
        mbu=mbu,
        arithmetic_intensity=ai,
        bound=bound,
        bound_s=bound_s,
        bound_ratio=ratio,
        peak_tflops=peak_tflops,
        peak_tbps=peak_tbps,
        missing=tuple(missing),
    )
