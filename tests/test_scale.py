"""Replicated traces (benchmarks/make_large_trace.py) give the original's results: counts and
times scale by the number of copies, ratio-of-sums shares are equal, idle shares differ only by
the 1 ms seams between copies. Also the chunked decode path equals the whole-document path."""
from __future__ import annotations

import importlib.util

import pytest

from conftest import ROOT, shared_trace
from diagnose.pipeline import run_analysis
from diagnose.trace import kineto


def _generator():
    spec = importlib.util.spec_from_file_location("make_large_trace", ROOT / "benchmarks" / "make_large_trace.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("rel", ["tracelens/vllm_decode_full/graph_execution.json.gz",
                                 pytest.param("tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", marks=pytest.mark.slow)])
def test_replicated_trace_scales(tmp_path, rel):
    src = shared_trace(rel)
    out = tmp_path / "x3.json.gz"
    res = _generator().replicate_kineto(str(src), str(out), copies=3)
    assert res["copies"] == 3
    one = run_analysis(str(src))
    three = run_analysis(str(out))
    a, b = one.phase("all"), three.phase("all")
    assert b.kernel_count == 3 * a.kernel_count
    assert b.activity_count == 3 * a.activity_count
    assert b.gpu_busy_ms == pytest.approx(3 * a.gpu_busy_ms, abs=1e-6)
    assert b.kernel_ms == pytest.approx(3 * a.kernel_ms, abs=1e-6)
    assert b.attention_share == pytest.approx(a.attention_share, abs=1e-6)
    for cat, ms in a.categories_ms.items():
        assert b.categories_ms[cat] == pytest.approx(3 * ms, abs=1e-5)
    assert len(three.steps) == 3 * len(one.steps)
    # The window: copy 3 starts 2 shifts after copy 1; between copies the GPU idles for one seam
    # (shift - window), a launch gap (the next copy's first launch comes after the seam starts).
    shift_ms = res["shift_us"] / 1e3
    assert b.window_ms == pytest.approx(2 * shift_ms + a.window_ms, abs=1e-5)
    seam_ms = shift_ms - a.window_ms
    assert b.gpu_idle_share == pytest.approx(1 - 3 * a.gpu_busy_ms / b.window_ms, abs=1e-5)
    # every gap of the original appears three times, plus the two seams (of whatever kind)
    gaps_a = sum(a.gaps.ms_by_kind.values())
    gaps_b = sum(b.gaps.ms_by_kind.values())
    assert gaps_b == pytest.approx(3 * gaps_a + 2 * seam_ms, abs=1e-5)
    assert b.gaps.ms_by_kind["launch"] >= 3 * a.gaps.ms_by_kind["launch"] - 1e-5


@pytest.mark.slow  # a replicated trace decoded whole and in slices
def test_chunked_decode_equals_whole_document(tmp_path, monkeypatch):
    src = shared_trace("hta/trace_diff/control.json.gz")
    whole = run_analysis(str(src))
    monkeypatch.setattr(kineto, "CHUNKED_MIN_BYTES", 0)
    monkeypatch.setattr(kineto, "CHUNK_BYTES", 1 << 20)  # ~30 chunks
    chunked = run_analysis(str(src))
    assert chunked.to_dict()["phases"] == whole.to_dict()["phases"]
    assert chunked.to_dict()["quality"] == whole.to_dict()["quality"]
