"""Acceptance of issues 13 (verdicts that name the root cause) and 14 (model accounting and the
kernel table wired into the analysis), through the public API (``diagnose_trace``), the CLI
(``run``, ``run --html``, ``compare``) and the web app, on the real shared traces.

Ground truth: ``shared/design/expert_readings.md`` (§ numbers below), re-derived here from the
raw events of each trace where the test pins a number (``_raw_*`` helpers read the trace file
read-only). Tolerances are the issues' (±3/4/5 %, ranges); where a report number is compared
with the same number computed from the raw events, the only slack is the report's rounding of
ms to 6 decimals (1 ns).
"""
from __future__ import annotations

import functools
import gzip
import html as html_lib
import json
import re

import pytest
from click.testing import CliRunner
from conftest import shared_report, shared_trace, sweep

from diagnose.cli import main
from diagnose.options import AnalysisOptions
from diagnose.pipeline import diagnose_trace

DECODE_FULL = "tracelens/vllm_decode_full/graph_execution.json.gz"
CAPTURE = "tracelens/vllm_decode_full/graph_capture_rank_0.1773709742341309550.pt.trace.json.gz"
PIECEWISE = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"
SGLANG = "tracelens/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.gz"
H100 = "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
MI300 = "tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
FORWARD_10 = "nano-vllm-zhang-yuhui/forward_10.json"
DECODE_GPU_0 = "nano-vllm-zhang-yuhui/profile_results/decode_gpu_0.json"

SGLANG_OPTS = {"model_config": "qwen3-8b", "gpu": "MI300X"}
GPT_OSS_OPTS = {"model_config": "gpt-oss-20b", "gpu": "MI300X"}

#: The report rounds ms to 6 decimals: 1 ns.
NS = 1e-6

GPU_CATS = ("kernel", "gpu_memcpy", "gpu_memset")
RUNTIME_CATS = ("cuda_runtime", "cuda_driver")


# --------------------------------------------------------------------------- helpers


@functools.cache
def _report(rel: str, **opts) -> dict:
    """The JSON report (with verdicts) of a shared trace; cached: do not mutate."""
    return shared_report(shared_trace(rel), **opts)


def report(rel: str, **opts) -> dict:
    return _report(rel, **opts)


@functools.cache
def _raw(rel: str) -> tuple:
    p = shared_trace(rel)
    opener = gzip.open if p.name.endswith(".gz") else open
    with opener(p, "rt") as f:
        return tuple(e for e in json.load(f)["traceEvents"] if e.get("ph") == "X")


def _raw_step(rel: str, marker: str) -> dict:
    """From the raw events: the one CPU annotation matching ``marker``, the GPU activities whose
    launch call (same correlation id) starts inside it, their first start and last end (µs)."""
    ev = _raw(rel)
    ms = [e for e in ev if e.get("cat") == "user_annotation" and re.search(marker, e["name"])]
    assert len(ms) == 1, [m["name"] for m in ms]
    m = ms[0]
    lo, hi = m["ts"], m["ts"] + m["dur"]
    corr = {e["args"]["correlation"] for e in ev if e.get("cat") in RUNTIME_CATS and lo <= e["ts"] <= hi
            and "correlation" in e.get("args", {})}
    acts = [e for e in ev if e.get("cat") in GPU_CATS and e.get("args", {}).get("correlation") in corr]
    return {"marker_ts": m["ts"], "first": min(e["ts"] for e in acts), "last": max(e["ts"] + e["dur"] for e in acts),
            "n": len(acts)}


def _phase(r: dict, name: str) -> dict:
    return next(p for p in r["phases"] if p["name"] == name)


def _symptom(r: dict, rule_id: str) -> dict | None:
    return next((s for s in r["symptoms"] if s["id"] == rule_id), None)


def _walk(component):
    yield component
    ch = getattr(component, "children", None)
    if isinstance(ch, (list, tuple)):
        for c in ch:
            yield from _walk(c)
    elif ch is not None and not isinstance(ch, (str, int, float)):
        yield from _walk(ch)


def _by_id(page, id_: str):
    found = [c for c in _walk(page) if getattr(c, "id", None) == id_]
    assert len(found) == 1, f"{len(found)} elements with id {id_!r}"
    return found[0]


def _cli(*args) -> tuple[int, str]:
    res = CliRunner().invoke(main, [str(a) for a in args])
    return res.exit_code, res.output


def _cli_opts(opts: dict) -> list[str]:
    out = []
    for k, v in opts.items():
        out += ["--" + k.replace("_", "-"), v]
    return out


# --------------------------------------------------------------------------- §1 vLLM FULL-graph decode


def test_full_graph_decode_tpot_is_the_step_gpu_span():
    r = report(DECODE_FULL)
    raw = _raw_step(DECODE_FULL, r"^execute_32_context_0")
    # raw: the step's 434 activities (9 memcpy + the kernels of 1 hipGraphLaunch) run from
    # 8370.878 µs to 19114.060 µs after the marker: 10.743181 ms (not 19.1 ms marker-to-end)
    span_ms = (raw["last"] - raw["first"]) / 1e3
    assert raw["n"] == 434
    assert span_ms == pytest.approx(10.743181, abs=NS)
    step = r["steps"][0]
    assert step["gpu_span_ms"] == pytest.approx(span_ms, abs=NS)
    tpot = r["latency"]["tpot_ms"]["p50"]
    assert tpot == pytest.approx(span_ms, abs=NS)
    assert tpot == pytest.approx(10.74, rel=0.05)  # issue 13 acceptance: 10.74 ms ±5 %
    assert r["latency"]["tpot_definition"] == "single decode step: its own time (GPU span minus external waits)"


def test_full_graph_decode_never_recommends_cuda_graphs():
    r = report(DECODE_FULL)
    # the step is one hipGraphLaunch replaying 421 kernels (expert §1)
    assert (r["launches"]["graph_launches"], r["launches"]["kernels_per_graph_launch_max"]) == (1, 421)
    assert r["symptoms"], "rules fired on this trace"
    assert [s["id"] for s in r["symptoms"] if "cuda_graphs" in s["recommends"]] == []
    # small-kernel-tax declares cuda_graphs and drops it, saying why
    s = _symptom(r, "small-kernel-tax")
    assert s["recommends"] == ["fewer_kernels"]
    assert s["already_in_place"] == ["not recommending cuda graphs: the steps already replay CUDA/HIP graphs"]


def test_full_graph_decode_wait_before_the_span_is_8_37_ms_and_not_the_steps_own():
    r = report(DECODE_FULL)
    raw = _raw_step(DECODE_FULL, r"^execute_32_context_0")
    # raw: marker at 0, first GPU activity (Memcpy DtoD, corr 505102) at +8370.878 µs; no GPU
    # activity of the trace runs before it
    before_ms = (raw["first"] - raw["marker_ts"]) / 1e3
    assert before_ms == pytest.approx(8.370878, abs=NS)
    assert min(e["ts"] for e in _raw(DECODE_FULL) if e.get("cat") in GPU_CATS) == raw["first"]
    step = r["steps"][0]
    before = [w for w in step["waits"] if w["where"] == "before"]
    assert sum(w["ms"] for w in before) == pytest.approx(before_ms, abs=2 * NS)
    # nothing of the trace ran on the GPU before: nothing "pipelined"
    assert "pipelined" not in [w["cause"] for w in before]
    # the wait is not part of the step's cost: own time = the span, TPOT 10.74 not 19.1
    assert step["own_ms"] == pytest.approx(step["gpu_span_ms"], abs=NS)


@pytest.mark.parametrize("rel, marker, before_ms", [
    # raw: first GPU activity 8370.878 µs after the marker (expert §1)
    (DECODE_FULL, r"^execute_32_context_0", 8.370878),
    # raw: first GPU activity 151231.271 µs after the marker (expert §2: "GPU starts 151.2 ms after")
    (PIECEWISE, r"^execute_8192_context_9", 151.231271),
])
def test_wait_before_a_pipelined_step_is_outside_trace(rel, marker, before_ms):
    raw = _raw_step(rel, marker)
    assert (raw["first"] - raw["marker_ts"]) / 1e3 == pytest.approx(before_ms, abs=NS)
    before = [w for w in report(rel)["steps"][0]["waits"] if w["where"] == "before"]
    # the first launch call (hipMemcpyAsync) ends 0.54 ms (2.23 ms) after the marker, the GPU
    # starts its copy 7.83 ms (149.0 ms) later still: the GPU was busy with, or waiting for, work
    # the trace does not hold (the previous step) the whole time
    assert [w["cause"] for w in before] == ["outside_trace"]
    assert before[0]["ms"] == pytest.approx(before_ms, abs=NS)


def test_full_graph_decode_with_model_config_is_moe_kernel_bound_via_cli():
    code, out = _cli("run", "--trace", shared_trace(DECODE_FULL), "--format", "json", *_cli_opts(GPT_OSS_OPTS))
    assert code == 0
    r = json.loads(out)
    d = _phase(r, "decode")
    # expert §1: ≈14.0 GB in 10.74 ms at 5.3 TB/s: MBU ≈ 25 %, ≈ x4 its 2.65 ms bound
    assert 0.19 <= d["mbu"] <= 0.31
    assert 3.2 <= d["bound_ratio"] <= 5.0
    # MoE kernels: _matmul_ogs 3.761878 + _matmul_ogs..swiglu 3.272717 + _combined_routing_compute
    # 0.131496 + _combined_routing_memset 0.122775 + triton_poi_fused_constant_pad_nd_moe_forward_0
    # 0.122615 + _topk_forward 0.119814 = 7.531295 ms of 10.67 ms kernel time = 71 %
    h = r["headline"]
    assert h["rule_id"] == "moe-kernel-bound"
    assert h["text"] == "decode is MoE-kernel-bound: 71% of kernel time (7.53 ms) in MoE expert kernels"
    assert h["ms"] == pytest.approx(7.531295, abs=NS)
    assert [s["id"] for s in r["symptoms"] if "cuda_graphs" in s["recommends"]] == []


def test_capture_trace_gives_the_replayed_moe_kernels_their_op():
    without = report(DECODE_FULL, **GPT_OSS_OPTS)
    moe_rows = [k for k in without["kernel_table"] if k["category"] == "moe"]
    # replayed graph kernels carry no op without the capture pass
    assert moe_rows and all(k["op"] is None for k in moe_rows)
    r = report(DECODE_FULL, capture_trace=str(shared_trace(CAPTURE)), **GPT_OSS_OPTS)
    # the capture pass holds the one FULL graph of batch 32: all 421 replayed kernels mapped
    assert (r["capture"]["graph_launches_matched"], r["capture"]["kernels_mapped"]) == (1, 421)
    moe_rows = [k for k in r["kernel_table"] if k["category"] == "moe"]
    assert moe_rows and all(k["op"] and k["op_source"] == "capture" for k in moe_rows)
    experts = {k["kernel"]: k["op"] for k in moe_rows if k["kernel"].startswith("_matmul_ogs")}
    assert experts == {"_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1": "vllm::moe_forward",
                       "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu": "vllm::moe_forward"}


# --------------------------------------------------------------------------- §2 vLLM mixed step


def test_mixed_step_span_and_stalled_decode_requests():
    r = report(PIECEWISE)
    raw = _raw_step(PIECEWISE, r"^execute_8192_context_9")
    # raw: the step's 423 activities run 156466.416 µs (not 307.7 ms from the marker)
    span_ms = (raw["last"] - raw["first"]) / 1e3
    assert raw["n"] == 423
    step = r["steps"][0]
    assert step["phase"] == "mixed"
    assert step["gpu_span_ms"] == pytest.approx(span_ms, abs=NS)
    assert step["gpu_span_ms"] == pytest.approx(156.5, rel=0.04)  # issue 13: 156.5 ms ±4 %
    # the marker's generation_37: 37 decode requests wait for the whole step
    assert step["decode_requests"] == 37
    s = _symptom(r, "mixed-step-decode-stall")
    assert s["summary"] == ("37 decode requests waited 156.5 ms for their next token inside a mixed step of "
                            "8192 tokens (> 50 ms)")
    assert r["headline"]["rule_id"] == "mixed-step-decode-stall"
    assert r["latency"]["itl_ms"]["p50"] == pytest.approx(span_ms, abs=NS)


# --------------------------------------------------------------------------- §3 SGLang prefill


def test_sglang_prefill_ttft_and_mfu():
    r = report(SGLANG, **SGLANG_OPTS)
    raw = _raw_step(SGLANG, r"^step\[EXTEND bs=15 toks=15360\]")
    # raw: the EXTEND step's activities run from 493.745 to 987.275 ms of the trace: 493.529207 ms
    # (expert §3: 492.6 ms from the first GEMM; not 987 ms)
    span_ms = (raw["last"] - raw["first"]) / 1e3
    # plus the step's own host work before its first kernel (issue 22): dispatch 0.078587 ms and
    # two gaps serialized by hipMemcpyWithStream, 0.071908 + 0.180751 ms; less the first-call
    # setup inside the span (one-time: 0.248053 - 0.104356 before the span = 0.143697 ms)
    own_ms = span_ms + 0.078587 + 0.071908 + 0.180751 - 0.143697
    assert r["latency"]["ttft_ms"] == pytest.approx(own_ms, abs=NS)
    assert r["latency"]["ttft_ms"] == pytest.approx(492.6, rel=0.03)  # issue 13: ±3 %
    # expert §3: 218 TFLOP in 492.6 ms = 443 TFLOP/s of 1307.4: MFU ≈ 34 %
    assert 0.30 <= _phase(r, "prefill")["mfu"] <= 0.38
    assert _symptom(r, "prefill-mfu-low") is not None


def test_sglang_493_ms_wait_is_on_work_outside_the_trace_not_a_host_block():
    r = report(SGLANG, **SGLANG_OPTS)
    ev = _raw(SGLANG)
    t0 = min(e["ts"] for e in ev if e.get("ph") == "X")
    by_corr = {e["args"]["correlation"]: e for e in ev if e.get("cat") in RUNTIME_CATS and "correlation" in e.get("args", {})}
    gpu = sorted((e for e in ev if e.get("cat") in GPU_CATS), key=lambda e: e["ts"])
    prev_end, nxt = gpu[0]["ts"] + gpu[0]["dur"], gpu[1]
    launch = by_corr[nxt["args"]["correlation"]]
    # raw: the GPU idles from 0.082 ms (end of the first arange kernel) to 493.366 ms
    # (resolve_future_token_ids_kernel). That kernel's hipLaunchKernel ran 0.122..0.127 ms,
    # right after a hipStreamWaitEvent (0.100 ms); the host entered hipMemcpyWithStream only
    # at 0.170 ms, after the kernel was queued. A queued kernel that does not start while the
    # GPU idles waits on an event whose producer is not in the trace; the host blocked behind
    # it, it did not cause it.
    launch_end = launch["ts"] + launch["dur"]
    memcpy = [e for e in ev if e["name"] == "hipMemcpyWithStream" and e["dur"] > 1000]
    assert len(memcpy) == 1 and memcpy[0]["ts"] > launch_end
    wait_ev = [e for e in ev if e["name"] == "hipStreamWaitEvent" and e["ts"] < launch["ts"]]
    assert [round(e["ts"] - t0, 1) for e in wait_ev] == [100.2]
    # the gap in the gap list is the whole idle interval, 493.283729 ms (issue 19: one row per
    # gap, not its pieces); its queued part after the launch returned is this wait
    gap_ms = (nxt["ts"] - prev_end) / 1e3
    assert gap_ms == pytest.approx(493.283729, abs=NS)
    g = _phase(r, "all")["gaps"]["longest"][0]
    # what the host was in (issue 13: the ≈493 ms entry names hipMemcpyWithStream) and what
    # the queued work waited on
    assert (g["ms"], g["cause"], g["host_call"], g["waited_on"]) == (
        pytest.approx(gap_ms, abs=NS), "outside_trace", "hipMemcpyWithStream", "hipStreamWaitEvent")
    assert g["parts_ms"]["outside_trace"] == pytest.approx((nxt["ts"] - launch_end) / 1e3, abs=NS)
    # the only host-blocked gaps are short ones hipMemcpyWithStream serialized once it returned
    blocked = [x for x in _phase(r, "all")["gaps"]["longest"] if x["cause"] == "host_blocked"]
    assert [(round(x["ms"], 6), x["host_call"]) for x in blocked] == [(0.237275, "hipMemcpyWithStream"),
                                                                     (0.180751, "hipMemcpyWithStream")]
    # the step's wait before its GPU work: the whole stretch from the step's anchor, same cause
    # (the other waits before the span are the host launching late, 0.08 to 0.18 ms each)
    # (after it: two short gaps the copy serialized, host_blocked, and a first call of aten::max)
    before = [w for w in r["steps"][0]["waits"] if w["where"] == "before" and w["cause"] != "launch"]
    assert [(w["cause"], w["host_call"], w["waited_on"]) for w in before] == [
        ("outside_trace", "hipMemcpyWithStream", "hipStreamWaitEvent"), ("host_blocked", "hipMemcpyWithStream", None),
        ("host_blocked", "hipMemcpyWithStream", None), ("first_call_setup", "aten::max", None)]
    assert before[0]["ms"] == pytest.approx((nxt["ts"] - prev_end) / 1e3, abs=NS)
    assert max(w["ms"] for w in r["steps"][0]["waits"] if w["cause"] == "launch") < 0.2
    # so the headline is the step's own story (expert §3: the GEMMs, gate_up the worst), no
    # host-sync advice; the low MFU is the same off-bound prefill, grouped under it
    assert r["headline"]["rule_id"] == "kernel-loss"
    assert next(s for s in r["symptoms"] if s["id"] == "prefill-mfu-low")["grouped_under"] == "kernel-loss"
    assert not [s for s in r["symptoms"] if s["id"] in ("host-blocking-wait", "S3-gpu-idle")]


def test_sglang_kernel_table_gate_up_gemm_throughput():
    r = report(SGLANG, **SGLANG_OPTS)
    ev = _raw(SGLANG)
    dims = [[15360, 4096], [4096, 24576]]
    ext = {e["args"]["External id"] for e in ev if e.get("cat") == "cpu_op" and e["name"] == "aten::mm"
           and e["args"].get("Input Dims") == dims}
    corr = {e["args"]["correlation"] for e in ev if e.get("cat") in RUNTIME_CATS and e["args"].get("External id") in ext}
    kernels = [e for e in ev if e.get("cat") == "kernel" and e["args"].get("correlation") in corr]
    # raw: 36 gate_up GEMMs (one per layer), 243.643021 ms in all; FLOPs per call
    # 2 x 15360 x 4096 x 24576 = 3,092,376,453,120 -> 36 x 3.0924e12 / 0.243643 s = 456.9 TFLOP/s
    total_ms = sum(e["dur"] for e in kernels) / 1e3
    assert (len(ext), len(kernels)) == (36, 36)
    assert total_ms == pytest.approx(243.643021, abs=NS)
    rows = [k for k in r["kernel_table"] if k["phase"] == "prefill" and k["input_dims"] == json.dumps(dims, separators=(",", ":"))]
    assert len(rows) == 1
    row = rows[0]
    assert (row["op"], row["calls"], row["category"]) == ("aten::mm", 36, "gemm")
    assert row["flops_per_call"] == 2 * 15360 * 4096 * 24576
    assert row["total_ms"] == pytest.approx(total_ms, abs=NS)
    assert row["achieved_tflops"] == pytest.approx(36 * 2 * 15360 * 4096 * 24576 / (total_ms / 1e3) / 1e12, rel=1e-6)
    assert 410 <= row["achieved_tflops"] <= 505  # issue 14 acceptance
    # the costliest prefill GEMM row: first of the table
    assert r["kernel_table"][0] is row


# --------------------------------------------------------------------------- §4-5 HF forwards


@pytest.mark.parametrize("rel, expect_ms, own_extra_ms", sweep([
    # H100: 0.290943 ms from step #5's last kernel to step #6's first: step #6's
    # cudaDeviceSynchronize returns 7.8 us after it, then its host dispatches the forward down to
    # the embedding launch (host_blocked: serialized by the sync; internal)
    (H100, 34.89, 0.290943),
    # MI300X: 0.624035 ms of dispatch (in nn.Module: Qwen2Model_0) before the first kernel, less
    # 0.057212 ms of first launches inside the span (one-time setup: not the step's own cost)
    (MI300, 33.13, 0.624035 - 0.057212),
], {0}))
def test_hf_forward_ttft_is_step6_gpu_span(rel, expect_ms, own_extra_ms):
    r = report(rel)
    raw = _raw_step(rel, r"^ProfilerStep#6$")
    # raw: ProfilerStep#6's activities span 34.892419 ms on H100 (not 49.4 from its marker,
    # which starts with a 14.1 ms cudaDeviceSynchronize on step #5) and 33.131334 ms on MI300X;
    # the step's own time adds its own host work before its first kernel (issue 22)
    span_ms = (raw["last"] - raw["first"]) / 1e3
    assert r["latency"]["ttft_ms"] == pytest.approx(span_ms + own_extra_ms, abs=NS)
    assert r["latency"]["ttft_ms"] == pytest.approx(expect_ms, rel=0.03)  # issue 13: ±3 %


def test_h100_forward_is_elementwise_dominated():
    r = report(H100)
    s = _symptom(r, "elementwise-dominated")
    assert s is not None
    assert r["headline"]["rule_id"] == "elementwise-dominated"
    assert r["headline"]["text"].startswith("prefill is elementwise-dominated: ")
    # the step itself: elementwise (no norm kernels on this trace) 20.179126 ms of 31.760058 ms
    # kernel time = 63.5 % (expert §4: 20.18 ms, 63 %)
    p = _phase(r, "prefill")
    assert p["categories_ms"]["elementwise"] == pytest.approx(20.179126, abs=NS)
    assert p["categories_ms"]["elementwise"] / p["kernel_ms"] >= 0.4


def test_h100_elementwise_headline_counts_the_steps_kernels_only():
    r = report(H100)
    # expert §4: the step's elementwise/norm/copy time is 20.18 ms; the headline's ms must be it
    assert r["headline"]["ms"] == pytest.approx(20.179126, abs=NS)
    assert "(20.2 ms)" in r["headline"]["text"]


# --------------------------------------------------------------------------- §6-7 nano-vllm fragments


def test_forward_10_is_a_fragment_and_no_bound_rule_fires():
    r = report(FORWARD_10)
    assert "fragment" in [q["code"] for q in r["quality"]]
    assert [s["id"] for s in r["symptoms"] if s["id"].startswith("S2")] == []
    ne = {n["id"]: n["reason"] for n in r["not_evaluated"]}
    for rid in ("S2-decode-far-from-bound", "S2-decode-could-improve"):
        assert ne[rid].startswith("not evaluated on this trace (quality fragment: ")
    # "never x3,824 its bound": no fired symptom speaks of the bound
    assert not any("bound" in s["summary"] for s in r["symptoms"])


def test_fragment_bound_ratio_is_not_reported_as_reliable():
    d = _phase(report(FORWARD_10), "decode")
    # quality fragment: "TPOT, MBU and the bound ratio cannot be read from it"
    assert d["bound_ratio"] is None or "bound_ratio" in d["unreliable"]
    assert d["mbu"] is None or "mbu" in d["unreliable"]


def test_decode_gpu_0_headline_is_the_host_with_its_split():
    r = report(DECODE_GPU_0)
    ev = _raw(DECODE_GPU_0)
    gpu = [e for e in ev if e.get("cat") in GPU_CATS]
    # raw: 28 GPU activities from first start to last end: 2.138840 ms
    window_ms = (max(e["ts"] + e["dur"] for e in gpu) - min(e["ts"] for e in gpu)) / 1e3
    assert len(gpu) == 28
    d = _phase(r, "decode")
    assert d["window_ms"] == pytest.approx(window_ms, abs=NS)
    h = r["headline"]
    assert h["rule_id"] == "S3-host-bound"
    # expert §6: the idle is per-region dispatch (CUDA graphs help) and CPU attention plus syncs
    # (they don't): 0.927 / 0.693 / 0.403 ms of the 2.024 ms idle (tests/test_host_causes.py)
    # the host's waits 2.023194 ms of the decode step's own 2.138840 ms (no lead-in: the window)
    assert h["text"] == ("decode is host-bound: 0.927 ms per step in triton_heuristics.py(1103): run (launch overhead), "
                         "the GPU waiting for the host 95% of the steps' 2.1 ms; waiting: launch overhead 46%, host "
                         "computing 34%, host blocked in a synchronizing call 20%")
    assert (h["share"], h["share_of"]) == (pytest.approx(2.023194 / window_ms, abs=1e-6), "step_span")
    assert h["caveat"] == "the window holds part of a forward: TPOT, MBU and the bound ratio cannot be read from it"
    assert d["launch_gap_share"] == pytest.approx(0.926753 / window_ms, abs=NS)
    assert "cuda_graphs" in _symptom(r, "S3-launch-gaps")["recommends"]
    assert _symptom(r, "host-compute")["recommends"] == ["move_host_work"]


# --------------------------------------------------------------------------- §8 capture pass


@pytest.mark.slow  # the capture trace takes 4 s to analyse; test_steps checks the SGLang capture pass
def test_capture_pass_is_recognised_and_no_timing_rule_fires():
    r = report(CAPTURE)
    ev = _raw(CAPTURE)
    names = [e["name"] for e in ev if e.get("cat") in RUNTIME_CATS]
    # raw: hipStreamBeginCapture / hipStreamEndCapture once each, 591 hipStreamGetCaptureInfo
    assert (names.count("hipStreamBeginCapture"), names.count("hipStreamEndCapture"),
            names.count("hipStreamGetCaptureInfo")) == (1, 1, 591)
    assert "graph_capture" in [q["code"] for q in r["quality"]]
    assert [s["id"] for s in r["symptoms"] if s["id"].startswith(("S2", "S3"))] == []
    ne = {n["id"]: n["reason"] for n in r["not_evaluated"]}
    for rid in ("S3-launch-gaps", "S3-gpu-idle", "S2-decode-far-from-bound"):
        assert ne[rid].startswith("not evaluated on this trace (quality graph_capture: ")
    assert r["headline"] == {
        "text": "this is a CUDA/HIP graph capture pass: nothing executed, so no timing conclusion; profile a replay "
                "(and give this file as --capture-trace to map the replay's kernels to ops)",
        "rule_id": None, "cause": "graph_capture", "device": None, "ms": None, "share": None, "share_of": None}


# --------------------------------------------------------------------------- one headline everywhere


def _terminal_headline(out: str) -> str:
    """The "► ..." line of the terminal report, with rich's wrapping (at spaces) undone."""
    lines = out.splitlines()
    i = next(i for i, ln in enumerate(lines) if ln.startswith("► "))
    parts = [lines[i][2:]]
    for ln in lines[i + 1:]:
        if ln.startswith(("  [", "┏", " ")) or not ln.strip():
            break
        parts.append(ln)
    return " ".join(p.strip() for p in parts)


@pytest.mark.parametrize("rel, opts", sweep([(DECODE_FULL, {}), (SGLANG, SGLANG_OPTS), (DECODE_GPU_0, {})],
                                             {"vllm-full-graph", "nano-vllm-fragment"},
                                             ids=["vllm-full-graph", "sglang-prefill", "nano-vllm-fragment"]))
def test_terminal_html_and_web_show_the_same_headline(rel, opts, tmp_path):
    from diagnose.app.server import create_app, render_page

    path = shared_trace(rel)
    h = report(rel, **opts)["headline"]
    assert h and h["rule_id"], "a rule fired: the headline is a verdict"
    html_file = tmp_path / "report.html"
    code, out = _cli("run", "--trace", path, "--html", html_file, *_cli_opts(opts))
    assert code == 0
    # terminal: "► TEXT" plus " [caveat: CAVEAT]" when the trace type limits it
    assert _terminal_headline(out) == h["text"] + (f" [caveat: {h['caveat']}]" if h.get("caveat") else "")
    # HTML report: <div id="headline">TEXT</div>, the caveat in its own element
    page = html_file.read_text(encoding="utf-8")
    got = re.findall(r'<div id="headline">(.*?)</div>', page, re.DOTALL)
    assert [html_lib.unescape(x) for x in got] == [h["text"]]
    caveats = [html_lib.unescape(x) for x in re.findall(r'<div class="caveat">(.*?)</div>', page, re.DOTALL)]
    assert caveats == ([h["caveat"]] if h.get("caveat") else [])
    # web overview: the element with id "headline"
    app = create_app([str(path)], options=AnalysisOptions(**opts))
    overview = render_page(app.diagnose_state, "/", "0")
    assert _by_id(overview, "headline").children == h["text"]
    web_caveats = [c.children for c in _walk(overview) if getattr(c, "className", None) == "dg-caveat"]
    assert web_caveats == ([h["caveat"]] if h.get("caveat") else [])


# --------------------------------------------------------------------------- compare: CLI == web


#: latency-regression's threshold (rules/latency-regression.yaml): max_regression, default 0.5.
TIGHT = "latency-regression.max_regression=0.04"


@pytest.mark.parametrize("baseline, candidate, thresholds, verdict", sweep([
    # TTFT 33.698157 -> 35.183362 ms (own times, test_hf_forward_ttft_is_step6_gpu_span):
    # x1.0441 <= 1.5 (default): no regression ...
    (MI300, H100, (), "no regression"),
    # ... but > 1.04 with max_regression 0.04: the override flips the verdict
    (MI300, H100, (TIGHT,), "regression"),
    # TTFT 35.183362 -> 493.716756 ms: x14.03 > 1.5
    (H100, SGLANG, (), "regression"),
    # TTFT 493.716756 -> 35.183362 ms: x0.0713
    (SGLANG, H100, (), "no regression"),
    # x0.0713 is no regression with the tight threshold either
    (SGLANG, H100, (TIGHT,), "no regression"),
], {"mi300-h100-tight"}, ids=["mi300-h100", "mi300-h100-tight", "h100-sglang", "sglang-h100", "sglang-h100-tight"]))
def test_compare_cli_and_web_agree(baseline, candidate, thresholds, verdict):
    from diagnose.app.compare_view import compare_result
    from diagnose.app.server import create_app, render_page
    from diagnose.engine import load_ruleset

    a, b = shared_trace(baseline), shared_trace(candidate)
    ttft_a, ttft_b = report(baseline)["latency"]["ttft_ms"], report(candidate)["latency"]["ttft_ms"]
    args = ["compare", "--baseline", a, "--candidate", b, "--format", "json"]
    for t in thresholds:
        args += ["--threshold", t]
    code, out = _cli(*args)
    cli = json.loads(out)
    assert cli["verdict"] == verdict
    assert code == (1 if verdict == "regression" else 0)
    assert cli["deltas"]["delta.ttft_p50_ratio"] == pytest.approx(ttft_b / ttft_a, rel=1e-9)
    app = create_app([str(a), str(b)], ruleset=load_ruleset(thresholds=list(thresholds)))
    state = app.diagnose_state
    assert compare_result(state, "0", "1").verdict == verdict
    banner = _by_id(render_page(state, "/compare", "0"), "compare-verdict")
    assert getattr(banner, "data-verdict") == verdict


def test_levers_already_in_place_are_not_recommended_in_any_view(tmp_path):
    """vLLM full-graph decode of gpt-oss-20b: one graph replay (421 kernels of one hipGraphLaunch)
    with MXFP4 experts (13,747,322,880 weight bytes for 20,907,786,240 parameters = 5.26 bits per
    weight): no view may advise CUDA graphs or weight quantization; the GPU is 99.8 % busy, so
    the step is not 'not fed'."""
    r = report(DECODE_FULL, **GPT_OSS_OPTS)
    assert r["model"]["weight_bytes"] * 8 / r["model"]["params_total"] == pytest.approx(5.26, abs=0.005)
    fired = {s["id"]: s for s in r["symptoms"]}
    assert "decode-not-fed" not in fired
    s2 = fired["S2-decode-far-from-bound"]
    assert s2["recommends"] == ["bigger_batch"]
    assert s2["already_in_place"] == [
        "not recommending weight quantization: the weights are already quantized (8 bits or fewer per weight on average)",
        "not recommending cuda graphs: the steps already replay CUDA/HIP graphs"]
    assert not any(set(s["recommends"]) & {"cuda_graphs", "weight_quantization"} for s in r["symptoms"])
    html_file = tmp_path / "r.html"
    code, _ = _cli("run", "--trace", shared_trace(DECODE_FULL), "--html", html_file, *_cli_opts(GPT_OSS_OPTS))
    assert code == 0
    page = html_lib.unescape(html_file.read_text(encoding="utf-8"))
    levers = re.findall(r'<ul class="levers">(.*?)</ul>', page, re.DOTALL)
    assert levers and not any("CUDA/HIP graph" in x or "quantize the weights" in x for x in levers)
    assert "Already in place" in page and "the steps already replay CUDA/HIP graphs" in page
    # the rule's own prose ("replay the step as a CUDA graph") is not shown once a lever is dropped
    assert "replay the step as a CUDA graph" not in page
    code, out = _cli("gate", "--trace", shared_trace(DECODE_FULL), *_cli_opts(GPT_OSS_OPTS))
    assert "replay the step as a CUDA graph" not in out and "FP8 experts" not in out


def test_compiled_block_is_an_encoder_forward_not_a_prefill():
    """torch_compile_triton (MI300X): one compiled block whose attention is bidirectional (its
    raw events: _scaled_dot_product_flash_attention with is_causal 'False', Concrete Inputs[4];
    no KV-cache kernel, no sampler): an encoder forward or one block, not an LLM prefill. Its
    one window is timed (12.549 ms, first kernel start to last kernel end), no TTFT, no
    prefill rule (prefill-mfu-low, attention-share-long-prompt) is evaluated."""
    rel = "tracelens/torch_compile_triton/trace.json.gz"
    ev = _raw(rel)
    sdpa = [e for e in ev if e["name"] == "aten::_scaled_dot_product_flash_attention"]
    assert [e["args"]["Concrete Inputs"][4] for e in sdpa] == ["False"]
    k = [e for e in ev if e.get("cat") == "kernel"]
    span_ms = round((max(e["ts"] + e["dur"] for e in k) - min(e["ts"] for e in k)) / 1000, 6)
    r = report(rel)
    assert [(s["phase"], s["evidence"], s["gpu_span_ms"]) for s in r["steps"]] == [("unknown", "shapes", span_ms)]
    assert span_ms == 12.549032
    assert "encoder_forward" in {q["code"] for q in r["quality"]}
    assert r["latency"]["ttft_ms"] is None
    assert not {"prefill-mfu-low", "attention-share-long-prompt"} & {s["id"] for s in r["symptoms"]}
    assert r["headline"]["cause"] == "encoder_forward"


def test_compiled_block_attention_rule_reads_prompt_length_from_sdpa_and_knows_flash_is_in_place(tmp_path):
    """The same compiled block made causal (is_causal 'True' on its two attention ops: a
    decoder block): its SDPA query is [8, 16, 4096, 128] (8 prompts of 4,096 tokens) and its
    one attention kernel, attn_fwd (3,683.509 µs), is Triton flash attention: the rule fires
    on the prompt length from the SDPA shape and recommends a faster fused kernel, not
    FlashAttention."""
    import trace_variants as tv

    doc = tv.load_doc(shared_trace("tracelens/torch_compile_triton/trace.json.gz"))
    doc = tv.set_concrete(doc, {"aten::_scaled_dot_product_flash_attention"}, 4, "True")
    doc = tv.set_concrete(doc, {"aten::_flash_attention_forward"}, 8, "True")
    r = diagnose_trace(str(tv.write(doc, tmp_path / "causal.json")), AnalysisOptions()).to_dict()
    assert [(s["phase"], s["batch"], s["tokens"]) for s in r["steps"]] == [("prefill", 8, 32768)]
    assert r["launches"]["fused_attention_share"] == 1.0
    s = next(s for s in r["symptoms"] if s["id"] == "attention-share-long-prompt")
    assert s["recommends"] == ["attention_tuning"]
    assert s["already_in_place"] == ["not recommending flash attention: attention already runs in fused (FlashAttention-style) kernels"]
    assert s["evidence"]["findings"]["steps.prefill_max_prompt_tokens"] == 4096