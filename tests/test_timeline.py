"""Inline-trace tests with exact expected numbers: busy union, idle share, launch gaps,
attention share with templated names, TPOT percentiles."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.analyzers import analyze
from diagnose.analyzers.categories import base_name, classify_kernel
from diagnose.analyzers.timeline import union_busy_ns
from diagnose.trace.kineto import load_kineto


def _an(builder, tmp_path, name="t.json"):
    return analyze(load_kineto(str(builder.write(tmp_path / name))))


def test_busy_is_union_of_overlapping_kernels(kineto, tmp_path):
    # [0,10] and [5,15] overlap on one stream, [12,20] overlaps on another, [30,40] alone.
    b = kineto()
    b.kernel("k1", 0, 10, stream=7).kernel("k2", 5, 10, stream=7).kernel("k3", 12, 8, stream=8).kernel("k4", 30, 10, stream=7)
    a = _an(b, tmp_path)
    p = a.phase("all")
    assert p.gpu_busy_ms == 0.030  # 0-20 and 30-40 µs
    assert p.window_ms == 0.040
    assert p.gpu_idle_share == 0.25
    assert p.kernel_ms == 0.038  # sum of durations is not busy time


def test_zero_length_kernel_counts_zero():
    s = np.array([0, 10_000, 20_000], dtype=np.int64)
    e = np.array([5_000, 10_000, 25_000], dtype=np.int64)
    assert union_busy_ns(s, e) == 10_000


def test_submicrosecond_timestamps_kept_to_the_ns(kineto, tmp_path):
    b = kineto()
    b.kernel("a", 100.7, 0.2).kernel("b", 101.0, 0.0005)
    t = load_kineto(str(b.write(tmp_path / "t.json")))
    assert t.gpu["start_ns"].tolist() == [100_700, 101_000]
    assert (t.gpu["end_ns"] - t.gpu["start_ns"]).tolist() == [200, 0]  # 0.5 ns rounds to even 0


def _four_kernels(b, launch_ts):
    # kernels of 10 µs at 0, 20, 40, 60; idle gaps 10 µs each; window 70 µs.
    for i, lt in enumerate(launch_ts):
        b.launch(f"k{i}", 20 * i, 10, launch_ts=lt, launch_dur=2)
    return b


def test_launch_gaps_host_late(kineto, tmp_path):
    # Each launch call ends at 18, 38, 58: after the previous kernel ended (10, 30, 50).
    a = _an(_four_kernels(kineto(), [-5, 16, 36, 56]), tmp_path)
    p = a.phase("all")
    assert p.gpu_idle_share == pytest.approx(30 / 70, abs=1e-6)
    assert p.launch_gap_share == pytest.approx(30 / 70, abs=1e-6)
    assert p.gaps.launch.count == 3
    assert p.gaps.launch.p50_us == 10.0


def test_gaps_with_launch_in_time_are_not_launch_gaps(kineto, tmp_path):
    # All launches happen up front (ending at -3..3): the GPU never waited for the host.
    a = _an(_four_kernels(kineto(), [-5, -3, -1, 1]), tmp_path)
    p = a.phase("all")
    assert p.gpu_idle_share == pytest.approx(30 / 70, abs=1e-6)
    assert p.launch_gap_share == 0.0
    assert p.gaps.count_by_kind["other"] == 3


def test_graph_replay_gaps_are_not_launch_gaps(kineto, tmp_path):
    # The same four kernels replayed by one cudaGraphLaunch (one correlation id, 4 kernels).
    b = kineto()
    b.runtime("cudaGraphLaunch", -5, 3, 500)
    for i in range(4):
        b.kernel(f"k{i}", 20 * i, 10, corr=500)
    a = _an(b, tmp_path)
    p = a.phase("all")
    assert p.gpu_idle_share == pytest.approx(30 / 70, abs=1e-6)
    assert p.launch_gap_share == 0.0
    assert p.gaps.count_by_kind["graph"] == 3
    codes = {q.code: q for q in a.quality}
    assert codes["graph_kernels_no_launch"].count == 4


def test_attention_share_with_templated_names(kineto, tmp_path):
    b = kineto()
    b.kernel("void flashinfer::BatchDecodeWithPagedKVCacheKernel<true, 2u, 4u, 8u, 16u, 1u, 8u, (flashinfer::PageStorage)0, "
             "flashinfer::LogitsPostHook<(flashinfer::PosEncodingMode)0>, __nv_bfloat16>(flashinfer::paged_kv_t<__nv_bfloat16, int>, float*)", 0, 20)
    b.kernel("void cutlass::Kernel2<cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8>(cutlass_80_tensorop_bf16_s16816gemm_relu_bf16_64x64_32x6_tn_align8::Params)", 20, 30)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 50, 30)
    b.memcpy(80, 50)
    a = _an(b, tmp_path)
    p = a.phase("all")
    assert p.attention_share == 0.25  # 20 / (20 + 30 + 30); memcpy is not kernel time
    assert p.categories_ms == {"gemm": 0.03, "attention": 0.02, "communication": 0.03, "memcpy": 0.05}


@pytest.mark.parametrize(
    "name,base,cat",
    [
        ("void flashinfer::BatchDecodeWithPagedKVCacheKernel<true, 2u>(flashinfer::paged_kv_t<__nv_bfloat16, int>)",
         "flashinfer::BatchDecodeWithPagedKVCacheKernel", "attention"),
        # pplx-kernels' all-to-all combine moves tokens between GPUs: communication, not MoE compute
        ("void combineKernel<(DispatchLayout)0, 128>(Params)", "combineKernel", "communication"),
        ("void deep_ep::internode_ll::dispatch<true, 8>(Params)", "deep_ep::internode_ll::dispatch", "communication"),
        ("void deep_ep::layout::get_dispatch_layout(long const*, int*)", "deep_ep::layout::get_dispatch_layout", "moe"),
        ("nvshmemi_init_array_kernel", "nvshmemi_init_array_kernel", "communication"),
        # a cuDNN convolution is an (implicit) matrix multiply, whatever activation its name fuses
        ("void cudnn::detail::dgrad_engine<float, 512, 6, 5, 3, 3, 3, false>(int, int)", "cudnn::detail::dgrad_engine", "gemm"),
        ("volta_scudnn_128x64_relu_interior_nn_v1", "volta_scudnn_128x64_relu_interior_nn_v1", "gemm"),
        # an Inductor kernel fused from an op named after a collective is a pointwise kernel
        ("triton_poi_fused_all_reduce_0", "triton_poi_fused_all_reduce_0", "elementwise"),
        ("void (anonymous namespace)::elementwise_kernel_with_index<int, at::native::arange_cuda_out(c10::Scalar const&)::{lambda()#1}>(int, F)",
         "anon::elementwise_kernel_with_index", "elementwise"),
        ("nvjet_hsh_128x256_64x4_1x2_h_bz_coopB_NNT", "nvjet_hsh_128x256_64x4_1x2_h_bz_coopB_NNT", "gemm"),
        ("triton_red_fused_add_mean_mul_pow_rsqrt_0", "triton_red_fused_add_mean_mul_pow_rsqrt_0", "norm"),
        ("flash_fwd_splitkv_combine_kernel", "flash_fwd_splitkv_combine_kernel", "attention"),
        ("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT32x32x256", "Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT32x32x256", "gemm"),
    ],
)
def test_kernel_base_names_and_categories(name, base, cat):
    assert base_name(name) == base
    assert classify_kernel(name) == cat


def test_tpot_percentiles(kineto, tmp_path):
    # Prefill then 5 decode steps completing at 100, 110, 120, 130, 160 ms (step boundaries in µs).
    b = kineto()
    b.annotation("diagnose:prefill[bs=1 toks=16]", 0, 50_000)
    b.launch("gemm_prefill", 10_000, 60_000, launch_ts=1_000)  # GPU finishes at 70 ms
    ends = [100_000, 110_000, 120_000, 130_000, 160_000]
    start = 70_000
    for i, e in enumerate(ends):
        b.annotation(f"diagnose:decode[bs=1 ctx={16 + i}]", start + 100, 500)
        b.launch("gemv_decode", e - 1_000, 1_000, launch_ts=start + 200)
        start = e
    a = _an(b, tmp_path)
    lat = a.latency
    assert lat.ttft_ms == 60.0  # own time: the prefill kernel's span, 10 -> 70 ms (the marker started at 0)
    assert lat.tpot_samples == 4  # intervals 10, 10, 10, 30 ms
    assert lat.tpot_ms.p50_ms == 10.0
    assert lat.tpot_ms.p90_ms == 24.0  # linear interpolation: 10 + 0.7 * 20
    assert lat.tpot_ms.p99_ms == 29.4
    assert a.phase("decode").step_count == 5
    assert a.phase("prefill").step_count == 1


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 500)), min_size=1, max_size=40), st.integers(-10**9, 10**9))
def test_union_invariants(intervals, shift):
    s = np.array([a for a, _ in intervals], dtype=np.int64)
    e = s + np.array([d for _, d in intervals], dtype=np.int64)
    busy = union_busy_ns(s, e)
    assert 0 <= busy <= int((e - s).sum())
    assert busy <= int(e.max() - s.min())
    assert union_busy_ns(s + shift, e + shift) == busy  # invariant under a time shift
    # brute force on a grid
    covered = np.zeros(int(e.max()) + 1, dtype=bool)
    for a, b_ in zip(s, e):
        covered[a:b_] = True
    assert busy == int(covered.sum())
