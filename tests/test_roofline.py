"""diagnose.roofline: the one MFU/MBU/bound formula, with hand-derived numbers, and parity with
the formula the trace analysis used before it (copied below as the reference)."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest

from diagnose.hardware import GpuPeak, gpu_by_name, peak_from_overrides
from diagnose.roofline import Roofline, roofline

# domain.md section 3: 300 TFLOP/s and 2 TB/s -> ridge 150 FLOP/B.
PEAK = peak_from_overrides(peak_tflops=300, bandwidth_tbps=2)


def test_two_decode_steps_by_hand() -> None:
    # Reference config decode, B=1, ctx 2048 (domain.md section 3): 13,706,985,472 B and
    # 14,512,291,840 FLOPs per step; two steps of 10 ms each.
    f = [14_512_291_840, 14_512_291_840]
    b = [13_706_985_472, 13_706_985_472]
    r = roofline(f, b, 0.020, PEAK)
    assert r.flops == 29_024_583_680.0
    assert r.bytes == 27_413_970_944.0
    # 27,413,970,944 B / 0.020 s = 1.3706985472e12 B/s -> 1.370699 TB/s (6 decimals)
    assert r.achieved_tbps == 1.370699
    # 29,024,583,680 / 0.020 = 1.451229184e12 FLOP/s -> 1.451229 TFLOP/s
    assert r.achieved_tflops == 1.451229
    # MBU from the rounded TB/s: 1.370699 / 2 = 0.6853495 (binary float just below) -> 0.685349
    assert r.mbu == round(1.370699 / 2, 6) == 0.685349
    assert r.mfu == round(1.451229 / 300, 6) == 0.004837
    # AI = 14,512,291,840 / 13,706,985,472 = 1.05875... -> 1.059 FLOP/B < 150: memory
    assert r.arithmetic_intensity == 1.059
    assert r.bound == "memory"
    # per step max(14.5e9 / 300e12, 13.7e9 / 2e12) = 6.853492736 ms; two steps 13.706985472 ms
    assert r.bound_s == pytest.approx(0.013706985472, rel=1e-15)
    assert r.bound_ratio == round(0.020 / 0.013706985472, 4) == 1.4591
    assert (r.peak_tflops, r.peak_tbps) == (300.0, 2.0)
    assert r.missing == ()


def test_compute_bound_prefill_step() -> None:
    # Reference config prefill S=8192 (domain.md): 119,090,853,183,488 FLOPs causal and
    # 13,438,550,016 + 8192 * 131,072 = 14,512,291,840 B in 0.5 s.
    r = roofline(119_090_853_183_488, 14_512_291_840, 0.5, PEAK, rounded=False)
    assert r.achieved_tflops == 119_090_853_183_488 / 0.5 / 1e12  # 238.18 TFLOP/s
    assert r.mfu == r.achieved_tflops / 300
    assert r.arithmetic_intensity == 119_090_853_183_488 / 14_512_291_840  # 8,206 FLOP/B
    assert r.bound == "compute"
    # max(119.09e12 / 300e12 = 0.39697 s, 14.5e9 / 2e12 = 0.00726 s) = 0.39697 s
    assert r.bound_s == 119_090_853_183_488 / 300e12
    assert r.bound_ratio == 0.5 / (119_090_853_183_488 / 300e12)


def test_bound_sums_per_step_maxima() -> None:
    # One compute-bound step (3e14 FLOPs, 2e9 B: 1 s vs 1 ms) and one memory-bound step
    # (3e11 FLOPs, 2e12 B: 1 ms vs 1 s) at 300 TFLOP/s / 2 TB/s: the bound is 1 + 1 = 2 s,
    # not max(totals) = max(1.001 s, 1.001 s).
    r = roofline([3e14, 3e11], [2e9, 2e12], 4.0, PEAK)
    assert r.bound_s == 2.0
    assert r.bound_ratio == 2.0


def test_missing_inputs() -> None:
    r = roofline([1e9, float("nan")], [1e6, 1e6], 1.0, PEAK)
    assert r.flops is None and r.achieved_tflops is None and r.mfu is None and r.bound_s is None
    assert r.bytes == 2e6 and r.achieved_tbps == round(2e6 / 1.0 / 1e12, 6) == 2e-06
    assert r.arithmetic_intensity is None and r.bound is None
    assert r.missing == ("flops",)

    no_peak = roofline(1e9, 1e6, 1.0, None)
    assert no_peak.mfu is None and no_peak.peak_tflops is None and no_peak.missing == ("peak",)
    assert no_peak.arithmetic_intensity == 1000.0  # 1e9 / 1e6

    untimed = roofline(1e9, 1e6, None, PEAK)
    assert untimed.achieved_tflops is None and untimed.bound_ratio is None and "time" in untimed.missing
    assert untimed.bound_s == max(1e9 / 300e12, 1e6 / 2e12)  # 3.33 us: the bound needs no time

    half = roofline(1e9, 1e6, 0.001, peak_from_overrides(peak_tflops=100))
    # 1e9 FLOPs in 1 ms = 1 TFLOP/s; / 100 TFLOP/s = 0.01
    assert half.mfu == 0.01
    assert half.mbu is None and half.bound_s is None and half.bound is None
    assert half.missing == ("peak_tbps",)

    assert roofline(None, None, 1.0, PEAK).missing == ("flops", "bytes")
    assert roofline([], [], 1.0, PEAK).flops is None
    with pytest.raises(ValueError, match="length"):
        roofline([1.0, 2.0], [1.0], 1.0, PEAK)


def test_to_dict_is_json_ready() -> None:
    d = roofline(1e9, 1e6, None, PEAK).to_dict()
    assert d["missing"] == ["time"]
    assert set(d) == {f for f in Roofline.__dataclass_fields__}


def test_gpu_peak_to_dict_is_the_report_gpu_object() -> None:
    # The keys of the JSON report's "gpu" object (README "JSON report").
    h100 = gpu_by_name("H100-SXM")
    assert h100.to_dict() == {
        "name": "H100-SXM",
        "peak_tflops": 989.4,
        "peak_tbps": 3.35,
        "ridge_flop_per_byte": 989.4 / 3.35,  # 295.34 FLOP/B
        "source": h100.source,
        "overrides": [],
        "selection": "--gpu H100-SXM",  # how the row was chosen (issue 27)
    }


# -- parity with the analysis' formula (analyzers/attainment.py before the move) ------


def _reference(step_flops: np.ndarray, step_bytes: np.ndarray, total_s: float, peak: GpuPeak | None) -> dict:
    """The bottom half of ``phase_attainment`` as it was, verbatim in substance."""
    out: dict = {k: None for k in ("achieved_tflops", "achieved_tbps", "mfu", "mbu", "arithmetic_intensity",
                                   "bound", "bound_ratio", "bound_s")}
    flops = None if np.isnan(step_flops).any() else float(step_flops.sum())
    nbytes = None if np.isnan(step_bytes).any() else float(step_bytes.sum())
    out["flops"], out["bytes"] = flops, nbytes
    if total_s > 0:
        if flops is not None:
            out["achieved_tflops"] = round(flops / total_s / 1e12, 6)
        if nbytes is not None:
            out["achieved_tbps"] = round(nbytes / total_s / 1e12, 6)
    if flops is not None and nbytes:
        out["arithmetic_intensity"] = round(flops / nbytes, 3)
    if peak is not None:
        if out["achieved_tflops"] is not None and peak.dense_fp16_tflops:
            out["mfu"] = round(out["achieved_tflops"] / peak.dense_fp16_tflops, 6)
        if out["achieved_tbps"] is not None and peak.memory_bandwidth_tbps:
            out["mbu"] = round(out["achieved_tbps"] / peak.memory_bandwidth_tbps, 6)
        ridge = peak.ridge_flop_per_byte
        if out["arithmetic_intensity"] is not None and ridge:
            out["bound"] = "compute" if out["arithmetic_intensity"] >= ridge else "memory"
        if peak.dense_fp16_tflops and peak.memory_bandwidth_tbps and flops is not None and nbytes is not None:
            lower = np.maximum(step_flops / (peak.dense_fp16_tflops * 1e12), step_bytes / (peak.memory_bandwidth_tbps * 1e12))
            if lower.sum() > 0:
                out["bound_ratio"] = round(total_s / float(lower.sum()), 4)
                out["bound_s"] = float(lower.sum())
    return out


@pytest.mark.parametrize("seed", range(40))
def test_parity_with_the_analysis_formula(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 50))
    flops = rng.uniform(1e6, 1e15, n).round()
    nbytes = rng.uniform(1e5, 1e11, n).round()
    if seed % 7 == 3:
        flops[rng.integers(0, n)] = np.nan
    if seed % 11 == 5:
        nbytes[rng.integers(0, n)] = np.nan
    total_s = float(rng.integers(0, 10**9, n).sum()) / 1e9 if seed % 13 else 0.0
    peak = [gpu_by_name("MI300X"), gpu_by_name("RTX-4080-Laptop"), peak_from_overrides(peak_tflops=50),
            peak_from_overrides(bandwidth_tbps=1.5), None][seed % 5]
    want = _reference(flops.copy(), nbytes.copy(), total_s, peak)
    got = roofline(flops, nbytes, total_s, peak).to_dict()
    for key, value in want.items():
        assert got[key] == value, key


def test_parity_with_phase_attainment_when_present(kineto, tmp_path) -> None:
    """Against the analysis itself on a two-step decode trace (skipped once the analysis no
    longer has its own copy of the formula)."""
    attainment = pytest.importorskip("diagnose.analyzers.attainment")
    if not hasattr(attainment, "phase_attainment") or not hasattr(attainment, "AttainmentInputs"):
        pytest.skip("the analysis has no separate formula any more")
    from diagnose.accounting import ModelSpec

    spec = ModelSpec(32, 4096, 32, 8, 128, 11008, 128000)  # domain.md reference config
    # the analysis times a phase by its steps' wall or own (GPU span) time: both 10 + 12 ms here
    steps = pd.DataFrame({"wall_ns": [10_000_000, 12_000_000], "own_ns": [10_000_000, 12_000_000],
                          "shape_ops": [0, 0], "shape_flops": [0, 0],
                          "shape_bytes": [0, 0], "batch": [8, 8], "tokens": [8, 8], "kv_tokens": [8 * 2048, 8 * 2049],
                          "context": [2048, 2049]})
    peak = gpu_by_name("H100-SXM")
    inp = attainment.AttainmentInputs(spec=spec, spec_source="test", peak=peak)
    out = attainment.phase_attainment("decode", steps, inp, np.zeros(2, dtype=bool))
    # engine FLOPs and bytes (README "Engine FLOPs"): the embedding table (V H = 524,288,000
    # parameters) is a gather, no matmul: FLOPs 2 (P - V H) B + 4 n_h d kv L; bytes per step =
    # 13,438,550,016 - 2 V H + the B gathered rows (B H bf16) + kv_tokens * 131,072
    vh = 128000 * 4096
    f = [2 * (6_719_275_008 - vh) * 8 + 4 * 32 * 128 * kv * 32 for kv in (16384, 16392)]
    b = [13_438_550_016 - 2 * vh + 8 * 4096 * 2 + kv * 131_072 for kv in (16384, 16392)]
    r = roofline(f, b, 0.022, peak)
    for key in ("flops", "bytes", "achieved_tflops", "achieved_tbps", "mfu", "mbu", "arithmetic_intensity",
                "bound", "bound_ratio", "peak_tflops", "peak_tbps"):
        assert getattr(out, key) == getattr(r, key), key
    assert out.bound_s == r.bound_s
    assert math.isclose(r.bound_s, sum(x / 3.35e12 for x in b), rel_tol=1e-12)
