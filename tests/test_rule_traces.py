"""Each of the 8 new rules fires through the whole pipeline on the smallest inline Kineto trace
(written to a file, then ``diagnose_trace``), and a near-miss trace does not fire it; plus the
gap-cause cases of issue 15: profiler overhead inside a late launch (case 6) and clock skew
(case 5).

Every trace is built with ``conftest.KinetoBuilder`` (times in µs, as Kineto writes them;
launch calls on host thread 100, kernels on stream 7 of device 0, an "NVIDIA H100 80GB HBM3").
Each test derives its expected numbers from the events it writes, in a comment. A near-miss
also checks the rule *was evaluated* (it is not in ``not_evaluated``), so it cannot pass
because an input went missing.
"""
from __future__ import annotations

import pytest

from diagnose.options import AnalysisOptions
from diagnose.pipeline import diagnose_trace

DECODE = "diagnose:decode[bs=1 ctx=2048]"
PREFILL = "diagnose:prefill[bs=1 toks=512]"
#: vLLM v1 marker of a chunked-prefill step: 8192 tokens, 9 prefill requests, 37 decode requests.
VLLM_MIXED = "execute_8192_context_9(sq8155sk8430sqsq1sqsk1)_generation_37(sq37sk34489sqsq37sqsk34489)"

#: Float arithmetic only (the report rounds ms to 6 decimals and divides them): not a tolerance
#: on the behaviour.
FLOAT = {"rel": 1e-9, "abs": 1e-12}


def _report(builder, tmp_path, name: str, **options) -> dict:
    path = builder.write(tmp_path / name)
    return diagnose_trace(str(path), AnalysisOptions(**options)).to_dict()


def _symptom(report: dict, rule_id: str) -> dict | None:
    return next((s for s in report["symptoms"] if s["id"] == rule_id), None)


def _assert_evaluated_not_fired(report: dict, rule_id: str) -> None:
    assert rule_id not in [s["id"] for s in report["symptoms"]]
    assert rule_id not in [n["id"] for n in report["not_evaluated"]], "near-miss must be evaluated, not skipped"


def _phase(report: dict, name: str) -> dict:
    return next(p for p in report["phases"] if p["name"] == name)


def _overhead(builder, ts: float, dur: float, name: str = "Activity Buffer Request"):
    """A Kineto profiler-overhead event (CUPTI buffer request), as torch.profiler writes it."""
    builder.events.append({"ph": "X", "cat": "overhead", "name": name, "pid": -1, "tid": 0, "ts": ts, "dur": dur, "args": {}})
    return builder


# --------------------------------------------------------------------------- comm-exposed


def _comm_trace(kineto, overlapped: bool):
    b = kineto()
    b.annotation(DECODE, 0, 2000)
    if not overlapped:
        # stream 7: gemv 100-700, all-reduce 700-1000 alone, gemv 1000-1100
        b.launch("gemv_kernel", 100, 600, 10)
        b.launch("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 700, 300, 20)
        b.launch("gemv_kernel", 1000, 100, 30)
    else:
        # all-reduce on stream 8, 550-850: only 700-850 has no compute beside it
        b.launch("gemv_kernel", 100, 600, 10)
        b.launch("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", 550, 300, 20, stream=8)
        b.launch("gemv_kernel", 850, 250, 30)
    return b


def test_comm_exposed_fires_on_an_all_reduce_alone_on_the_gpu(kineto, tmp_path):
    r = _report(_comm_trace(kineto, overlapped=False), tmp_path, "comm.json")
    s = _symptom(r, "comm-exposed")
    assert s is not None
    # window 100..1100 µs = 1.00 ms; the all-reduce 700..1000 runs alone: 0.30 ms = 30 % > 15 %,
    # none of it hidden
    assert s["summary"] == ("communication alone on the GPU 0.30 ms = 30% of the 1.00 ms window (> 15%); "
                            "0.00 ms more hidden behind other work, 0.30 ms of communication in all")
    ev = s["evidence"]["findings"]
    assert ev["all.comm_exposed_share"] == pytest.approx(0.3, **FLOAT)
    assert ev["all.comm_exposed_ms"] == pytest.approx(0.3, **FLOAT)
    assert ev["all.communication_ms"] == pytest.approx(0.3, **FLOAT)
    assert ev["all.own_window_ms"] == pytest.approx(1.0, **FLOAT)
    assert s["stake_ms"] == pytest.approx(0.3, **FLOAT)
    assert (s["share"], s["share_of"]) == (pytest.approx(0.3, **FLOAT), "phase_window")
    assert s["recommends"] == ["overlap_communication"]
    # the only cause-kind rule that fired (S4-decode-comm-exposed, 30 % of the same decode window,
    # is a symptom at equal severity, grouped under it by their common cause)
    assert r["headline"]["rule_id"] == "comm-exposed"
    assert r["headline"]["text"] == ("exposed communication: only communication kernels run for 30% of the 1.0 ms GPU window "
                                     "(0.30 ms; 0.00 ms more hidden behind compute)")
    assert (r["headline"]["share"], r["headline"]["share_of"]) == (0.3, "phase_window")
    assert _symptom(r, "S4-decode-comm-exposed")["grouped_under"] == "comm-exposed"


def test_comm_exposed_near_miss_exactly_15_percent_exposed(kineto, tmp_path):
    r = _report(_comm_trace(kineto, overlapped=True), tmp_path, "comm_near.json")
    p = _phase(r, "all")
    # window 100..1100 = 1.00 ms; all-reduce 550..850 overlaps the gemv 100..700 except 700..850:
    # exposed 0.15 ms = 15 %, not > 15 %; hidden 550..700 = 0.15 ms, behind the GEMV (gemm)
    assert p["comm_exposed_ms"] == pytest.approx(0.15, **FLOAT)
    assert p["comm_hidden_ms"] == pytest.approx(0.15, **FLOAT)
    assert p["comm_hidden_behind_ms"] == pytest.approx({"gemm": 0.15}, **FLOAT)
    assert p["window_ms"] == pytest.approx(1.0, **FLOAT)
    assert p["categories_ms"]["communication"] == pytest.approx(0.3, **FLOAT)
    _assert_evaluated_not_fired(r, "comm-exposed")
    _assert_evaluated_not_fired(r, "S4-decode-comm-exposed")


# --------------------------------------------------------------------------- elementwise-dominated


def _elementwise_trace(kineto, gemm_us: float, n_gemm: int = 8):
    b = kineto()
    b.annotation(PREFILL, 0, 3000)
    t, corr_ts = 100, 5
    for name in ["vectorized_elementwise_kernel"] * 8 + ["rms_norm_kernel"] * 4:
        b.launch(name, t, 20, corr_ts)
        t, corr_ts = t + 20, corr_ts + 3
    for _ in range(n_gemm):
        b.launch("gemm_kernel", t, gemm_us, corr_ts)
        t, corr_ts = t + gemm_us, corr_ts + 3
    return b


def test_elementwise_dominated_fires_with_norms_counted(kineto, tmp_path):
    r = _report(_elementwise_trace(kineto, gemm_us=29), tmp_path, "ew.json")
    s = _symptom(r, "elementwise-dominated")
    assert s is not None
    # 8 elementwise + 4 rms_norm kernels x 20 µs = 0.24 ms; 8 GEMMs x 29 µs = 0.232 ms; 20 kernels
    # (the rule's minimum), none under 15 µs, one stream: kernel time 0.472 ms; 0.24 > 0.232, the
    # largest group: 0.24 / 0.472 = 50.8 %; GEMM 0.232 / 0.472 = 49.2 %
    assert s["summary"] == ("elementwise/norm/copy kernels 0.24 ms = 51% of kernel time (0.47 ms), more than any "
                            "other kind of kernel: GEMM 49%, attention 0%")
    ev = s["evidence"]["findings"]
    assert ev["main.elementwise_norm_ms"] == pytest.approx(0.24, **FLOAT)
    assert ev["main.elementwise_norm_share"] == pytest.approx(0.24 / 0.472, **FLOAT)
    assert ev["main.kernel_count"] == 20
    assert _phase(r, "all")["categories_ms"] == pytest.approx({"elementwise": 0.16, "norm": 0.08, "gemm": 0.232}, **FLOAT)
    assert r["headline"]["text"] == ("prefill is elementwise-dominated: 51% of kernel time (0.2 ms) in "
                                     "elementwise/norm/copy kernels, more than in GEMMs or attention")
    assert (r["headline"]["share"], r["headline"]["share_of"]) == (pytest.approx(0.24 / 0.472, abs=1e-6), "kernel_time")
    assert s["recommends"] == ["kernel_fusion"]


def test_elementwise_dominated_near_miss_as_much_as_the_gemms(kineto, tmp_path):
    r = _report(_elementwise_trace(kineto, gemm_us=30), tmp_path, "ew_near.json")
    # 0.24 ms elementwise/norm against 8 x 0.030 = 0.24 ms of GEMM: not more than the GEMMs
    a = _phase(r, "all")
    assert a["kernel_ms"] == pytest.approx(0.48, **FLOAT)
    assert a["categories_ms"]["gemm"] == pytest.approx(0.24, **FLOAT)
    assert a["kernel_count"] == 20
    _assert_evaluated_not_fired(r, "elementwise-dominated")


def test_elementwise_dominated_needs_20_kernels(kineto, tmp_path):
    # 19 kernels: elementwise/norm 0.24 ms > 7 x 0.02 ms of GEMM, but below min_samples
    r = _report(_elementwise_trace(kineto, gemm_us=20, n_gemm=7), tmp_path, "ew_19.json")
    assert "elementwise-dominated" not in [s["id"] for s in r["symptoms"]]
    ne = next(n for n in r["not_evaluated"] if n["id"] == "elementwise-dominated")
    assert ne["reason"] == "too few samples: main.kernel_count = 19 < 20"


# --------------------------------------------------------------------------- h2d-copies-dominate


def _copy_trace(kineto, copy_name: str):
    b = kineto()
    b.annotation(DECODE, 0, 2000)
    b._corr += 1
    b.runtime("cudaMemcpyAsync", 10, 5, b._corr)
    b.kernel(copy_name, 100, 600, b._corr, cat="gpu_memcpy", bytes=64 << 20)
    b.launch("gemv_kernel", 700, 300, 20)
    b.launch("gemv_kernel", 1000, 100, 30)
    return b


def test_h2d_copies_dominate_fires(kineto, tmp_path):
    r = _report(_copy_trace(kineto, "Memcpy HtoD (Pageable -> Device)"), tmp_path, "h2d.json")
    s = _symptom(r, "h2d-copies-dominate")
    assert s is not None
    # window 100..1100 = 1.00 ms; the HtoD copy 100..700 = 0.60 ms = 60 % >= 50 %
    assert s["summary"] == "host-to-device copies 0.60 ms = 60% of the 1.00 ms GPU window (>= 50%)"
    assert s["evidence"]["findings"]["all.h2d_ms"] == pytest.approx(0.6, **FLOAT)
    assert s["evidence"]["findings"]["all.memcpy_ms"] == pytest.approx(0.6, **FLOAT)
    assert r["headline"]["text"] == ("host-to-device copies (0.6 ms) take 60% of the 1.0 ms GPU window: "
                                     "data streamed from host memory")
    # stake 0.6 ms of a 1.0 ms window: >= 50 % -> high
    assert s["severity"] == "high"


def test_h2d_copies_dominate_near_miss_device_to_device_copy(kineto, tmp_path):
    # the same 0.60 ms copy, device to device: not a host link, h2d 0 ms
    r = _report(_copy_trace(kineto, "Memcpy DtoD (Device -> Device)"), tmp_path, "dtod.json")
    a = _phase(r, "all")
    assert a["h2d_ms"] == 0.0
    assert a["categories_ms"]["memcpy"] == pytest.approx(0.6, **FLOAT)
    _assert_evaluated_not_fired(r, "h2d-copies-dominate")


# --------------------------------------------------------------------------- host-blocking-wait


def _blocking_trace(kineto, sync_end: float):
    """gemv 100..300; the host then sits in cudaStreamSynchronize 305..sync_end and launches the
    next gemv at sync_end+1 (2 µs), which runs from sync_end+5 to 1100."""
    b = kineto()
    b.annotation(DECODE, 0, 2000)
    b.launch("gemv_kernel", 100, 200, 10)
    b._corr += 1
    b.runtime("cudaStreamSynchronize", 305, sync_end - 305, b._corr)
    b.launch("gemv_kernel", sync_end + 5, 1100 - (sync_end + 5), sync_end + 1)
    return b


def test_host_blocking_wait_fires_and_names_the_call(kineto, tmp_path):
    r = _report(_blocking_trace(kineto, 795), tmp_path, "hb.json")
    s = _symptom(r, "host-blocking-wait")
    assert s is not None
    # idle 300..800 = 0.50 ms; the sync 305..795 covers 490 µs >= half of it -> host_blocked;
    # window 100..1100 = 1.00 ms: idle share 50 %, 0.50 > 15 % of 1.00
    assert s["summary"] == ("GPU idle 0.50 ms (50% of the window idle in all) while the host was blocked in "
                            "cudaStreamSynchronize")
    assert s["evidence"]["labels"] == {"all.longest_host_blocked_call": "cudaStreamSynchronize"}
    assert r["headline"]["text"] == ("GPU idle 0.5 ms (50% of the 1.0 ms GPU window) while the host blocked in "
                                     "cudaStreamSynchronize")
    gap = _phase(r, "all")["gaps"]["longest"][0]
    assert (gap["ms"], gap["cause"], gap["host_call"]) == (pytest.approx(0.5, **FLOAT), "host_blocked", "cudaStreamSynchronize")
    # a host-late gap explained by a blocking call is not a launch gap
    assert gap["kind"] == "other"
    assert _phase(r, "decode")["launch_gap_share"] == 0.0


def test_host_blocking_wait_near_miss_at_15_percent_of_the_window(kineto, tmp_path):
    r = _report(_blocking_trace(kineto, 445), tmp_path, "hb_near.json")
    gap = _phase(r, "all")["gaps"]["longest"][0]
    # idle 300..450 = 0.15 ms, still host_blocked (sync 305..445 covers 140 µs), but not more
    # than 0.15 x 1.00 ms
    assert (gap["ms"], gap["cause"]) == (pytest.approx(0.15, **FLOAT), "host_blocked")
    _assert_evaluated_not_fired(r, "host-blocking-wait")


# --------------------------------------------------------------------------- mixed-step-decode-stall


def _mixed_trace(kineto, total_us: float):
    b = kineto()
    b.annotation(VLLM_MIXED, 0, 1000)
    b.launch("gemm_kernel", 100, total_us / 2, 10)
    b.launch("gemm_kernel", 100 + total_us / 2, total_us / 2, 20)
    return b


def test_mixed_step_decode_stall_fires_on_a_vllm_chunked_prefill_step(kineto, tmp_path):
    r = _report(_mixed_trace(kineto, 60_000), tmp_path, "mixed.json")
    step = r["steps"][0]
    # the vLLM marker: 8192 tokens, 9 prefill + 37 decode requests -> mixed
    assert (step["phase"], step["tokens"], step["prefill_requests"], step["decode_requests"]) == ("mixed", 8192, 9, 37)
    # two 30 ms GEMMs back to back: own time 60.0 ms > 50 ms
    assert step["own_ms"] == pytest.approx(60.0, **FLOAT)
    s = _symptom(r, "mixed-step-decode-stall")
    assert s is not None
    assert s["summary"] == ("37 decode requests waited 60.0 ms for their next token inside a mixed step of "
                            "8192 tokens (> 50 ms)")
    # the step is the trace's only step: the stall is 100 % of the steps' own time
    assert r["headline"]["text"] == ("37 decode requests stall 60.0 ms inside a 8192-token mixed step (100% of the steps' "
                                     "60.0 ms): an ITL spike caused by the prefill chunk sharing the step")
    assert (r["headline"]["share"], r["headline"]["share_of"]) == (1.0, "step_span")
    assert s["recommends"] == ["token_budget"]
    # ITL counts the mixed step's decode requests: one sample of 60.0 ms
    assert r["latency"]["itl_ms"]["p50"] == pytest.approx(60.0, **FLOAT)


def test_mixed_step_decode_stall_near_miss_at_50_ms(kineto, tmp_path):
    r = _report(_mixed_trace(kineto, 50_000), tmp_path, "mixed_near.json")
    # 2 x 25 ms = 50.0 ms: not > 50 ms
    assert r["steps"][0]["own_ms"] == pytest.approx(50.0, **FLOAT)
    _assert_evaluated_not_fired(r, "mixed-step-decode-stall")


# --------------------------------------------------------------------------- moe-kernel-bound


def _moe_trace(kineto, moe_us: float):
    b = kineto()
    b.annotation(DECODE, 0, 2000)
    b.launch("fused_moe_kernel", 100, moe_us, 10)
    b.launch("gemv_kernel", 100 + moe_us, 1000 - moe_us, 20)
    return b


def test_moe_kernel_bound_fires(kineto, tmp_path):
    r = _report(_moe_trace(kineto, 600), tmp_path, "moe.json")
    s = _symptom(r, "moe-kernel-bound")
    assert s is not None
    # fused_moe_kernel 0.60 ms of 1.00 ms kernel time = 60 % >= 50 %
    assert s["summary"] == ("MoE kernels 0.60 ms = 60% of kernel time (1.00 ms) >= 50%; attention 0%, "
                            "launch gaps 0% of the window")
    assert s["evidence"]["findings"]["main.moe_ms"] == pytest.approx(0.6, **FLOAT)
    assert r["headline"]["text"] == "decode is MoE-kernel-bound: 60% of kernel time (0.60 ms) in MoE expert kernels"
    assert s["recommends"] == ["moe_kernels"]


def test_moe_kernel_bound_near_miss_49_percent(kineto, tmp_path):
    r = _report(_moe_trace(kineto, 490), tmp_path, "moe_near.json")
    # 0.49 of 1.00 ms = 49 % < 50 %
    assert _phase(r, "all")["categories_ms"] == pytest.approx({"moe": 0.49, "gemm": 0.51}, **FLOAT)
    _assert_evaluated_not_fired(r, "moe-kernel-bound")


# --------------------------------------------------------------------------- prefill-mfu-low


def _prefill_gemm_trace(kineto, kernel_us: float):
    """One prefill step of 4 aten::linear [1,512,4096] x [4096,4096] (no bias), each run by one
    GEMM kernel of ``kernel_us``, back to back from 100 µs."""
    b = kineto()
    b.annotation(PREFILL, 0, 300)
    for i in range(4):
        b.cpu_op("aten::linear", 10 + 20 * i, 10, input_dims=[[1, 512, 4096], [4096, 4096], []])
        b.launch("gemm_kernel", 100 + kernel_us * i, kernel_us, 12 + 20 * i)
    return b


def test_prefill_mfu_low_fires_on_a_slow_compute_bound_prefill(kineto, tmp_path):
    r = _report(_prefill_gemm_trace(kineto, 100), tmp_path, "mfu.json", gpu="H100-SXM")
    p = _phase(r, "prefill")
    # FLOPs: 4 x 2 x 512 x 4096 x 4096 = 68,719,476,736 in 4 x 100 µs = 400 µs of own time
    # -> 171.80 TFLOP/s; MFU 171.80 / 989.4 = 17.36 %
    assert r["steps"][0]["shape_flops"] == 68_719_476_736
    assert p["own_ms"] == pytest.approx(0.4, **FLOAT)
    assert p["achieved_tflops"] == pytest.approx(68_719_476_736 / 400e-6 / 1e12, abs=1e-6)
    assert p["mfu"] == pytest.approx(68_719_476_736 / 400e-6 / 989.4e12, abs=1e-6)
    # bytes (operands, 2 B each): 4 x (512x4096 + 4096x4096) x 2 = 150,994,944 B; intensity
    # 68,719,476,736 / 150,994,944 = 455.1 FLOP/B >= H100 ridge 989.4 / 3.35 = 295.3 -> compute
    assert p["bound"] == "compute"
    assert p["arithmetic_intensity"] == pytest.approx(68_719_476_736 / 150_994_944, abs=1e-3)
    # bound = max(150,994,944 / 3.35e12, 68,719,476,736 / 989.4e12) = 69.456 µs; 400 / 69.456 = 5.759
    assert p["bound_ratio"] == pytest.approx(400e-6 / (68_719_476_736 / 989.4e12), abs=1e-4)
    s = _symptom(r, "prefill-mfu-low")
    assert s is not None
    assert s["summary"] == ("prefill MFU 17.4% < 40% (172 of 989 TFLOP/s, 5.76x its bound); GEMM kernels take 100% "
                            "of kernel time, the costliest kernel is gemm_kernel (100%)")
    # stake = busy - own / bound_ratio = 0.4 - 0.4 / 5.7591 = 0.3305 ms = 83 % of the 0.4 ms step
    assert s["stake_ms"] == pytest.approx(0.4 - 0.4 / 5.7591, abs=1e-6)
    assert (s["share"], s["share_of"]) == (pytest.approx((0.4 - 0.4 / 5.7591) / 0.4, abs=1e-5), "step_span")
    assert s["recommends"] == ["gemm_tuning"]
    # the same off-bound prefill, named by the kernels that hold it: the GEMM rows' roofline
    # time is their FLOPs at the peak (69.456 µs, compute above the ridge), the loss 0.4 ms -
    # 69.456 µs = 0.3305 ms at 69.456 / 400 = 17 % of the peak; the low MFU is grouped under it
    k = _symptom(r, "kernel-loss")
    assert k["loss_ms"] == pytest.approx(0.4 - 68_719_476_736 / 989.4e12 * 1e3, abs=1e-6)
    assert r["headline"]["text"] == ("prefill runs at 5.8x its bound, 83% of the steps' 0.400 ms above the roofline: "
                                     "GEMMs at 17% of peak fp16/bf16 FLOP/s, 0.33 ms per step")
    assert s["grouped_under"] == "kernel-loss"


def test_prefill_mfu_low_near_miss_at_43_percent(kineto, tmp_path):
    r = _report(_prefill_gemm_trace(kineto, 40), tmp_path, "mfu_near.json", gpu="H100-SXM")
    p = _phase(r, "prefill")
    # the same FLOPs in 4 x 40 µs = 160 µs: 429.50 TFLOP/s, MFU 43.4 % >= 40 %
    assert p["mfu"] == pytest.approx(68_719_476_736 / 160e-6 / 989.4e12, abs=1e-6)
    assert p["bound"] == "compute"
    _assert_evaluated_not_fired(r, "prefill-mfu-low")


# --------------------------------------------------------------------------- small-kernel-tax


def _small_kernel_trace(kineto, n_small: int, small_us: float = 10):
    b = kineto()
    b.annotation(DECODE, 0, 3000)
    t = 100
    for i in range(n_small):
        b.launch("vectorized_elementwise_kernel", t, small_us, 5 + i)
        t += small_us
    b.launch("gemv_kernel", t, 2000, 5 + n_small)
    return b


def test_small_kernel_tax_fires(kineto, tmp_path):
    r = _report(_small_kernel_trace(kineto, 50), tmp_path, "small.json")
    s = _symptom(r, "small-kernel-tax")
    assert s is not None
    # 50 kernels x 10 µs = 0.50 ms under 15 µs; the step's own time 100..2600 = 2.50 ms: 20 % >= 15 %.
    # They run back to back, one run of 50: fusing it saves 49 x 1.3 µs = 63.7 µs (no gaps)
    assert s["summary"] == ("50 kernels under 15 µs take 0.50 ms = 20% of the steps' own time (2.50 ms, >= 15%); fusing "
                            "their runs would save about 0.064 ms (1.3 µs per kernel merged plus the gaps between them)")
    assert s["evidence"]["findings"]["main.small_kernel_own_count"] == 50
    assert s["stake_ms"] == pytest.approx(0.0637, abs=1e-9)
    # its share: 0.0637 / 2.5 ms = 2.5 %
    assert r["headline"]["text"] == ("small-kernel tax: 50 kernels under 15 µs take 20% of the step; fusing them saves "
                                     "about 0.06 ms, 2.5% of the steps' 2.5 ms")
    # eager launches, no graph: CUDA graphs stay recommended
    assert s["recommends"] == ["fewer_kernels", "cuda_graphs"]
    assert "already_in_place" not in s


def test_small_kernel_tax_near_miss_below_15_percent(kineto, tmp_path):
    r = _report(_small_kernel_trace(kineto, 35), tmp_path, "small_35.json")
    a = _phase(r, "all")
    # 35 x 10 µs = 0.35 ms of 2.35 ms = 14.9 % < 15 %
    assert (a["small_kernel_count"], a["small_kernel_ms"]) == (35, pytest.approx(0.35, **FLOAT))
    assert a["window_ms"] == pytest.approx(2.35, **FLOAT)
    _assert_evaluated_not_fired(r, "small-kernel-tax")


def test_small_kernel_tax_near_miss_15us_is_not_small(kineto, tmp_path):
    r = _report(_small_kernel_trace(kineto, 50, small_us=15), tmp_path, "small_15.json")
    # "under 15 µs" is strict: 50 kernels of exactly 15 µs are not small
    assert _phase(r, "all")["small_kernel_count"] == 0
    _assert_evaluated_not_fired(r, "small-kernel-tax")


# --------------------------------------------------------------------------- issue 15 case 6


def _late_launch_trace(kineto, with_overhead: bool):
    """A decode step of 10 kernels of 20 µs: 5 from 100 to 200 µs, 5 from 1200 to 1300 µs. The
    6th kernel's launch call (cudaLaunchKernel 203..1198) ends long after the GPU went idle;
    with ``with_overhead`` the profiler's "Activity Buffer Request" (205..1195) sits inside it."""
    b = kineto()
    b.annotation(DECODE, 0, 3000)
    for i in range(5):
        b.launch("gemv_kernel", 100 + 20 * i, 20, 10 + 3 * i)
    b.launch("gemv_kernel", 1200, 20, 203, launch_dur=995)
    for i in range(4):
        b.launch("gemv_kernel", 1220 + 20 * i, 20, 1199.5 + 0.1 * i, launch_dur=0.05)
    if with_overhead:
        _overhead(b, 205, 990)
    return b


def test_profiler_overhead_inside_a_late_launch_is_not_a_launch_gap(kineto, tmp_path):
    r = _report(_late_launch_trace(kineto, with_overhead=True), tmp_path, "overhead.json")
    d = _phase(r, "decode")
    # gap 200..1200 = 1.0 ms; the launch ended at 1198 (host late), but the overhead event
    # 205..1195 covers 990 µs of it -> profiler_overhead, kind other, no launch gap; its pieces:
    # 990 µs overhead, 8 µs in the step's range and the launch call (launch), 2 µs queued
    gap = d["gaps"]["longest"][0]
    assert gap == {"start_ms": pytest.approx(0.2, **FLOAT), "ms": pytest.approx(1.0, **FLOAT), "kind": "other",
                   "cause": "profiler_overhead",
                   "parts_ms": pytest.approx({"profiler_overhead": 0.99, "launch": 0.008, "dependency": 0.002}, **FLOAT),
                   "host_call": "Activity Buffer Request", "host_stack": ["diagnose:decode[bs=1 ctx=2048]"],
                   "waited_on": None, "next": "gemv_kernel"}
    assert d["idle_by_cause_ms"] == pytest.approx({"profiler_overhead": 1.0}, **FLOAT)
    assert d["launch_gap_share"] == 0.0
    assert d["gaps"]["ms_by_kind"]["launch"] == 0.0
    # 10 activities: S3-launch-gaps is evaluated, and does not fire
    _assert_evaluated_not_fired(r, "S3-launch-gaps")
    # the overhead is external to the step: own = span 1.2 ms - 1.0 ms = 0.2 ms
    step = r["steps"][0]
    assert step["gpu_span_ms"] == pytest.approx(1.2, **FLOAT)
    assert step["own_ms"] == pytest.approx(0.2, **FLOAT)


def test_the_same_late_launch_without_overhead_is_a_launch_gap(kineto, tmp_path):
    r = _report(_late_launch_trace(kineto, with_overhead=False), tmp_path, "late.json")
    d = _phase(r, "decode")
    # host late by 1198 - 200 = 998 µs (+20 µs allowance) >= the 1000 µs gap: all launch;
    # 1.0 / 1.2 ms window = 83.3 %
    gap = d["gaps"]["longest"][0]
    assert (gap["kind"], gap["cause"]) == ("launch", "launch")
    assert d["launch_gap_share"] == pytest.approx(1.0 / 1.2, abs=1e-6)
    s = _symptom(r, "S3-launch-gaps")
    assert s is not None
    assert s["summary"] == ("decode launch gaps 83.3% of the 1.20 ms GPU window > 15% (1 gaps, median 1000.0 µs; "
                            "GPU idle 83.3%)")
    assert r["steps"][0]["own_ms"] == pytest.approx(1.2, **FLOAT)


# --------------------------------------------------------------------------- issue 15 case 5


def _skew_trace(kineto, skewed: bool):
    """Like the late-launch trace, but the 6th kernel (1200 µs) is launched by a call that starts
    at 1220 µs, 20 µs *after* the kernel starts (clock skew); or, not skewed, at 1190..1198."""
    b = kineto()
    b.annotation(DECODE, 0, 3000)
    for i in range(5):
        b.launch("gemv_kernel", 100 + 20 * i, 20, 10 + 3 * i)
    b.launch("gemv_kernel", 1200, 20, 1220 if skewed else 1190, launch_dur=2 if skewed else 8)
    for i in range(4):
        b.launch("gemv_kernel", 1220 + 20 * i, 20, 30 + 3 * i)
    return b


def test_clock_skew_gap_is_unattributed_not_launch(kineto, tmp_path):
    r = _report(_skew_trace(kineto, skewed=True), tmp_path, "skew.json")
    q = [x for x in r["quality"] if x["code"] == "clock_skew"]
    # one activity starts 1220 - 1200 = 20 µs before its launch call starts
    assert q == [{"code": "clock_skew", "count": 1, "message":
                  "1 GPU activities start before their launch call starts (host/device clock skew; median lead device 0: "
                  "20.0 µs): the gaps before them are unattributed, never launch gaps"}]
    d = _phase(r, "decode")
    gap = d["gaps"]["longest"][0]
    # gap 200..1200 µs before the skewed kernel: unattributed, not launch
    assert (gap["start_ms"], gap["ms"], gap["kind"]) == (pytest.approx(0.2, **FLOAT), pytest.approx(1.0, **FLOAT), "unattributed")
    assert gap["cause"] == "unknown"  # the launch call is in the trace, its time unusable
    assert d["launch_gap_share"] == 0.0
    assert d["gaps"]["ms_by_kind"] == pytest.approx({"launch": 0.0, "graph": 0.0, "other": 0.0, "unattributed": 1.0}, **FLOAT)
    _assert_evaluated_not_fired(r, "S3-launch-gaps")


def test_without_skew_the_same_gap_is_a_launch_gap(kineto, tmp_path):
    r = _report(_skew_trace(kineto, skewed=False), tmp_path, "noskew.json")
    assert "clock_skew" not in [x["code"] for x in r["quality"]]
    d = _phase(r, "decode")
    # launch call 1190..1198 ends 998 µs after the GPU went idle at 200: launch gap, 1.0 / 1.2
    assert d["launch_gap_share"] == pytest.approx(1.0 / 1.2, abs=1e-6)
    assert _symptom(r, "S3-launch-gaps") is not None


def test_clock_skew_gap_inside_a_step_still_counts_in_its_own_time(kineto, tmp_path):
    r = _report(_skew_trace(kineto, skewed=True), tmp_path, "skew_own.json")
    step = r["steps"][0]
    # every activity of the step was launched from it and is in the trace; its span is
    # 100..1300 µs. The 1.0 ms gap has an unknown cause, not one outside the step: own 1.2 ms
    assert step["gpu_span_ms"] == pytest.approx(1.2, **FLOAT)
    assert step["own_ms"] == pytest.approx(1.2, **FLOAT)
    # before the span: the first kernel, queued at 10+ µs, starts at 100 µs with nothing earlier
    # on the GPU: a wait on work the trace does not hold (outside the step's own time)
    assert step["idle_by_cause_ms"] == {"unknown": pytest.approx(1.0, **FLOAT), "outside_trace": pytest.approx(0.1, **FLOAT)}
