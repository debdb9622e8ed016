"""Issue 24 acceptance: advice that names the kernels (op classes and their loss against the
roofline, second lever, capture pass beside the trace), FLOPs the engine really runs, one
notion of fragment, precision per dtype, the small-kernel tax on the step, a report that fits
a screen; and issue 19 item 5b: op attribution through the CPU call tree.

Truth comes from the raw events of the shared traces (read here with json, not with the
tool) and hand-derived formulas; planted traces (``KinetoBuilder``) for what the corpus does
not hold (fp32 SIMT GEMMs on Hopper, a graph-replayed decode of tiny kernels)."""
from __future__ import annotations

import bisect
import gzip
import io
import itertools
import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, KinetoBuilder, shared_report, shared_trace, sweep
from diagnose.cli import main
from diagnose.pipeline import diagnose_trace

SGLANG = "tracelens/sglang_decode/sglang_Qwen3-8B_decode.json.gz"
SGLANG_CAPTURE = "tracelens/sglang_decode/bs_32_rank0.json.gz"
MI300X_BW = 5.3e12
MI300X_BF16 = 1307.4e12


def _events(rel: str | Path) -> list[dict]:
    p = shared_trace(rel) if isinstance(rel, str) else rel
    op = gzip.open if str(p).endswith(".gz") else open
    with op(p, "rt", encoding="utf-8") as f:
        d = json.load(f)
    return d["traceEvents"] if isinstance(d, dict) else d


def _report(path, **opts) -> dict:
    return shared_report(path, **opts)


def _phase(d: dict, name: str) -> dict:
    return next(p for p in d["phases"] if p["name"] == name)


def _symptom(d: dict, rid: str) -> dict | None:
    return next((s for s in d["symptoms"] if s["id"] == rid), None)


# ----------------------------------------------------------------------------- SGLang decode


def _sglang_replay_shapes() -> list[tuple[str, float, list | None]]:
    """(kernel name, duration µs, the capture launch's op Input Dims) of each of the 544
    kernels the decode step's hipGraphLaunch replays: the i-th replayed kernel is the i-th
    launch recorded between hipStreamBeginCapture and hipStreamEndCapture of the capture pass
    (expert_readings §10), whose External id names its op."""
    cap = _events(SGLANG_CAPTURE)
    begin = next(e["ts"] for e in cap if "BeginCapture" in e.get("name", ""))
    end = next(e["ts"] for e in cap if "EndCapture" in e.get("name", ""))
    launches = sorted((e for e in cap if e.get("cat") == "cuda_runtime" and "Launch" in e["name"]
                       and "GraphLaunch" not in e["name"] and begin <= e["ts"] <= end), key=lambda e: e["ts"])
    ops = {e["args"]["External id"]: e for e in cap if e.get("cat") == "cpu_op"}
    dec = _events(SGLANG)
    corr = next(e["args"]["correlation"] for e in dec if e.get("name") == "hipGraphLaunch")
    kernels = sorted((e for e in dec if e.get("cat") == "kernel" and e["args"].get("correlation") == corr), key=lambda e: e["ts"])
    assert len(kernels) == len(launches) == 544
    assert [k["name"] for k in kernels] == [la["args"]["kernel"] for la in launches]
    out = []
    for k, la in zip(kernels, launches):
        op = ops.get(la["args"].get("External id"))
        out.append((k["name"], k["dur"], op["args"].get("Input Dims") if op and op["name"] == "aten::mm" else None))
    return out


def test_sglang_decode_headline_names_the_gemms_and_small_kernels_with_their_attainment():
    """expert_readings §9 with the capture pass: qkv and o GEMMs at M=32 stream their
    operands (weights + activations, bf16) at 38 % of 5.3 TB/s; the GEMMs as a class lose
    the most against the roofline; kernels under 15 µs take 19 % of the step. The headline
    says so; "bigger batch / quantize" (they move the bound, not the gap) is not the first lever."""
    by_shape: dict[tuple, list[float]] = {}
    for _, dur, dims in _sglang_replay_shapes():
        if dims:
            by_shape.setdefault((dims[0][0], dims[0][1], dims[1][1]), []).append(dur)
    att = {}
    for (m, k, n), durs in by_shape.items():
        bytes_ = (m * k + k * n + m * n) * 2 * len(durs)
        att[(k, n)] = bytes_ / (sum(durs) * 1e-6) / MI300X_BW
    # qkv 4096 -> 6144 and o 4096 -> 4096: 38 %; down 12288 -> 4096 47 %; gate_up 57 %
    assert [round(100 * att[kn]) for kn in ((4096, 6144), (4096, 4096), (12288, 4096), (4096, 24576))] == [38, 38, 47, 57]
    d = _report(shared_trace(SGLANG), model_config="qwen3-8b", capture_trace=str(shared_trace(SGLANG_CAPTURE)))
    p = _phase(d, "decode")
    gemm = next(c for c in p["op_classes"] if c["name"] == "gemm")
    roles = {r["name"]: r["attainment"] for r in gemm["roles"]}
    assert roles["qkv"] == pytest.approx(att[(4096, 6144)], abs=1e-6)
    assert roles["o"] == pytest.approx(att[(4096, 4096)], abs=1e-6)
    assert roles["down"] == pytest.approx(att[(12288, 4096)], abs=1e-6)
    assert roles["gate_up"] == pytest.approx(att[(4096, 24576)], abs=1e-6)
    # the GEMMs lose the most (2.90 ms of the 10.37 ms step), attention next (1.21 ms at 43 %):
    # loss = Σ over the 145 GEMM kernels of duration - max(2mkn / 1307.4 TFLOP/s, bytes / 5.3 TB/s)
    loss_us = sum(dur - 1e6 * max(2 * d[0][0] * d[0][1] * d[1][1] / MI300X_BF16,
                                  (d[0][0] * d[0][1] + d[1][0] * d[1][1] + d[0][0] * d[1][1]) * 2 / MI300X_BW)
                  for _, dur, d in _sglang_replay_shapes() if d)
    assert round(loss_us / 1e3, 3) == 2.897
    ranked = [c["name"] for c in p["op_classes"] if not c["small"]]
    assert ranked[:2] == ["gemm", "attention"]
    assert gemm["loss_ms"] == pytest.approx(loss_us / 1e3, abs=1e-5)
    # small kernels: the step's own kernels under 15 µs, from the raw events (launched inside
    # step[DECODE bs=32]: the replay through its hipGraphLaunch)
    ev = _events(SGLANG)
    step = next(e for e in ev if e.get("name", "").startswith("step[DECODE"))
    launch_ts = {e["args"]["correlation"]: e["ts"] for e in ev if e.get("cat") == "cuda_runtime" and "correlation" in e.get("args", {})}
    small = [e for e in ev if e.get("cat") == "kernel" and e["dur"] < 15
             and step["ts"] <= launch_ts.get(e["args"].get("correlation"), -1) <= step["ts"] + step["dur"]]
    assert p["small_kernel_own_count"] == len(small) == 369
    share = sum(e["dur"] for e in small) / 1e3 / p["own_ms"]
    assert p["small_kernel_own_share"] == pytest.approx(share, abs=1e-6) and round(100 * share) == 19
    h = d["headline"]
    assert h["rule_id"] == "kernel-loss"
    # its share: every class's loss (kernel time above the roofline) over the step's own time
    above = sum(c["loss_ms"] for c in p["op_classes"] if c["loss_ms"] is not None) / p["own_ms"]
    assert round(100 * above) == 52
    assert h["text"] == (f"decode runs at 2.8x its bound, {above:.0%} of the steps' {p['own_ms']:.1f} ms above the roofline: "
                         f"GEMMs at 50% of peak bandwidth, 2.90 ms per step (qkv/o 38%, down 47%, gate_up 57%, lm_head 60%); "
                         f"{len(small)} kernels under 15 µs take 19% of the step")
    first = next(s for s in d["symptoms"] if not s.get("grouped_under"))
    assert first["id"] == "kernel-loss" and not {"bigger_batch", "weight_quantization"} & set(first["recommends"])
    assert _symptom(d, "S2-decode-could-improve")["grouped_under"] == "kernel-loss"
    assert _symptom(d, "second-lever")["evidence"]["labels"]["main.loss_2_class"] == "attention"


def test_capture_pass_beside_the_trace_is_named_never_loaded(tmp_path):
    """Without --capture-trace the replayed kernels have no shapes; the report names the
    capture pass lying beside the trace (SGLang's bs_32_rank0, vLLM's graph_capture_rank_0,
    and the pair copied under other names) and loads nothing; alone, nothing is named."""
    d = _report(shared_trace(SGLANG), model_config="qwen3-8b")
    q = next(q for q in d["quality"] if q["code"] == "capture_trace_available")
    assert f"--capture-trace {shared_trace(SGLANG_CAPTURE)}" in q["message"]
    assert "capture" not in d  # never loaded
    assert all(r["op"] is None for r in d["kernel_table"][:5])
    out = CliRunner().invoke(main, ["run", "--trace", str(shared_trace(SGLANG)), "--model-config", "qwen3-8b"]).output
    assert "give --capture-trace" in out and "bs_32_rank0.json.gz" in out
    vllm = _report(shared_trace("tracelens/vllm_decode_full/graph_execution.json.gz"))
    assert any(q["code"] == "capture_trace_available" and "graph_capture_rank_0" in q["message"] for q in vllm["quality"])
    renamed = tmp_path / "pair"
    renamed.mkdir()
    shutil.copy(shared_trace(SGLANG), renamed / "decode_step.json.gz")
    shutil.copy(shared_trace(SGLANG_CAPTURE), renamed / "cudagraph_bs32.json.gz")
    d = _report(renamed / "decode_step.json.gz")
    assert any(q["code"] == "capture_trace_available" and "cudagraph_bs32.json.gz" in q["message"] for q in d["quality"])
    alone = tmp_path / "alone"
    alone.mkdir()
    shutil.copy(shared_trace(SGLANG), alone / "decode_step.json.gz")
    assert not any(q["code"] == "capture_trace_available" for q in _report(alone / "decode_step.json.gz")["quality"])


# ----------------------------------------------------------------------------- engine FLOPs


def test_vllm_mixed_step_engine_flops_and_mfu():
    """expert_readings §2: marker execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)
    _generation_37(sq37sk34489sqsq37sqsk34489); gpt-oss-20b (L 24, H 2880, 64 q / 8 KV heads
    x 64, 32 experts top-4 of F 2880, V 201,088, 12 sliding (128) + 12 full layers)."""
    ev = _events("tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz")
    marker = next(e["name"] for e in ev if e.get("name", "").startswith("execute_8192_context_9"))
    assert marker == "execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)_generation_37(sq37sk34489sqsq37sqsk34489)"
    T, rows = 8192, 9 + 37
    qkv = 2 * 2880 * (64 * 64 + 2 * 8 * 64) * 24 * T
    o = 2 * 4096 * 2880 * 24 * T
    router = 2 * 2880 * 32 * 24 * T
    experts = 2 * 4 * (2880 * 5760 + 2880 * 2880) * 24 * T
    lm_head = 2 * 2880 * 201088 * rows  # logits for the 46 sampled rows only
    sq, sqsq, sqsk = 8155 + 37, 7475785 + 37, 7671310 + 34489
    pairs = sqsk - sqsq / 2 + sq / 2  # causal, exact
    attention = 4 * 64 * 64 * (12 * pairs + 12 * min(128 * sq, pairs))
    engine = qkv + o + router + experts + lm_head + attention
    d = _report(shared_trace("tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"), model_config="gpt-oss-20b",
                gpu="MI300X")
    p = _phase(d, "mixed")
    assert p["flops"] == pytest.approx(engine, rel=1e-9)
    assert round(engine / 1e12, 2) == 50.65
    assert abs(p["mfu"] / 0.248 - 1) < 0.05 and round(p["mfu"], 4) == 0.2476
    terms = {t["name"]: t for t in p["terms"]}
    assert terms["lm_head"]["flops"] == lm_head and terms["lm_head"]["flops_source"] == "marker"
    assert terms["attention"]["flops"] == pytest.approx(attention) and terms["attention"]["flops_source"] == "marker"
    assert terms["embedding"]["flops"] == 0 and terms["embedding"]["bytes"] == T * 2880 * 2
    assert terms["experts"]["flops"] == experts and terms["experts"]["flops_source"] == "config"


def test_b200_tp8_prefill_moe_flops_from_shapes_is_not_a_fragment():
    """expert_readings §11: 36 vllm::moe_forward [[888,3072],[888,128]] calls (T = 888); with
    gpt-oss-120b (k 4, F 2880, H 2880) at TP 8 each runs 2·888·4·3·2880·2880/8 FLOPs."""
    ev = _events("tracelens/b200/eager_trace.json.gz")
    moe = [e for e in ev if e.get("cat") == "cpu_op" and e["name"] == "vllm::moe_forward"]
    assert len(moe) == 36 and {e["args"]["Input Dims"][0][0] for e in moe} == {888}
    expected = 36 * 2 * 888 * 4 * 3 * 2880 * 2880 // 8
    d = _report(shared_trace("tracelens/b200/eager_trace.json.gz"), phase_regex=("prefill=^execute_context_",),
                model_config="gpt-oss-120b", gpu="B200", prompt_len=888, batch=1)
    p = _phase(d, "prefill")
    terms = {t["name"]: t for t in p["terms"]}
    assert terms["moe"]["flops"] == expected and terms["moe"]["flops_source"] == "shapes"
    assert p["flops_source"] == "shapes" and p["forward_coverage"] > 0.9
    assert "fragment" not in {q["code"] for q in d["quality"]}
    assert not p["unreliable"]


# ----------------------------------------------------------------------------- fragments


@pytest.mark.parametrize("trace", sweep(["nano-vllm-zhang-yuhui/profile_results/decode_gpu_0.json", "nano-vllm-zhang-yuhui/forward_10.json"], {1}))
def test_nano_vllm_fragment_with_and_without_a_config(trace):
    """expert_readings §6-7: a fragment of a forward (4 of 113 linears; the attention path
    only) with or without the Qwen3-0.6B config: the same fragment flag, no TPOT, no S7, no
    bound ratio."""
    for opts in ({}, {"model_config": "qwen3-0.6b"}):
        d = _report(shared_trace(trace), **opts)
        assert "fragment" in {q["code"] for q in d["quality"]}, opts
        assert d["latency"]["tpot_samples"] == 0 and d["latency"]["tpot_ms"]["p50"] is None
        fired = {s["id"] for s in d["symptoms"]}
        assert not fired & {"S7-bandwidth-above-peak", "S2-decode-could-improve", "S2-decode-far-from-bound", "kernel-loss"}
        assert d["findings"]["decode.bound_ratio"] is None and d["findings"]["trace.bandwidth_above_peak"] in (None, 0)


# ----------------------------------------------------------------------------- precision


def _gemm_trace(kernel: str, dtype: str, steps: int = 10, gemms: int = 8, gemm_us: float = 53.5, other_us: float = 58.4):
    """Steps of ``gemms`` GEMMs [64,4096]x[4096,4096] (Input type ``dtype``) run by ``kernel``,
    and one elementwise kernel each, on an H100."""
    b = KinetoBuilder()
    t = 0.0
    ext = 10_000
    for s in range(steps):
        t0 = t
        t += 10
        for _ in range(gemms):
            ext += 1
            b.events.append({"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 100, "ts": t, "dur": 4,
                             "args": {"External id": ext, "Input Dims": [[64, 4096], [4096, 4096]], "Input type": [dtype, dtype]}})
            b._corr += 1
            b.runtime("cudaLaunchKernel", t + 1, 2, b._corr)
            b.kernel(kernel, t + 5, gemm_us, b._corr, **{"External id": ext})
            t += gemm_us + 1
        b._corr += 1
        b.runtime("cudaLaunchKernel", t, 2, b._corr)
        b.kernel("void at::native::vectorized_elementwise_kernel<4, at::native::CUDAFunctor_add<float> >", t + 3, other_us, b._corr)
        b.annotation("diagnose:prefill[bs=1 toks=64]", t0, t + 3 - t0)  # the step's CPU range: its launches
        t += other_us + 40
    return b


def test_planted_fp32_simt_gemms_on_h100_get_the_precision_finding(tmp_path):
    """88 % of kernel time in cuBLAS fp32 SIMT GEMMs (``…_ffma…``, no tensor cores) on an
    H100: TF32 has a 494.7 / 66.9 = 7.39x higher peak (bf16 14.8x); the saving at the same
    share of the faster peak is t x (1 - 1/7.39). The kernel table rates them against the FP32
    peak and its ridge (66.9 / 3.35 = 20 FLOP/B: 31 FLOP/B is compute-bound there, memory-bound
    against the bf16 ridge of 295)."""
    ffma = "sm80_xmma_gemm_f32f32_f32f32_f32_nn_n_tilesize64x64x8_stage3_warpsize1x2x1_ffma_aligna4_alignc4_execute_kernel__5x_cublas"
    d = _report(_gemm_trace(ffma, "float").write(tmp_path / "fp32.json"))
    p = _phase(d, "prefill")
    t_fp32 = 10 * 8 * 53.5 / 1e3
    share = t_fp32 / (t_fp32 + 10 * 58.4 / 1e3)
    assert round(share, 2) == 0.88
    gain = 494.7 / 66.9
    assert p["precision"]["fp32_matrix_ms"] == pytest.approx(t_fp32, abs=1e-9)
    assert p["precision"]["gain"] == round(gain, 4) and p["precision"]["lever"] == "tf32"
    s = _symptom(d, "precision")
    assert s is not None and s["stake_ms"] == pytest.approx(t_fp32 * (1 - 1 / gain), abs=1e-5)
    assert s["severity"] in ("high", "medium")
    row = next(r for r in d["kernel_table"] if r["op"] == "aten::mm")
    assert (row["dtype"], row["dtype_source"], row["peak_tflops"]) == ("fp32", "kernel name", 66.9)
    flops, nbytes = 2 * 64 * 4096 * 4096, (64 * 4096 * 2 + 4096 * 4096) * 4
    assert row["arithmetic_intensity_flop_per_byte"] == pytest.approx(flops / nbytes, rel=1e-6) and row["bound"] == "compute"
    assert row["peak_tflops_share"] == pytest.approx(flops / 53.5e-6 / 66.9e12, abs=1e-6)
    # the same GEMMs in bf16 on tensor cores: no precision finding
    bf16 = "sm90_xmma_gemm_bf16bf16_bf16f32_f32_nn_n_tilesize64x64x64_warpgroupsize1x1x1_execute_segment_k_off_kernel__5x_cublas"
    d2 = _report(_gemm_trace(bf16, "c10::BFloat16", gemm_us=5.0).write(tmp_path / "bf16.json"))
    assert _symptom(d2, "precision") is None
    assert _phase(d2, "prefill")["precision"]["fp32_matrix_ms"] == 0.0
    row = next(r for r in d2["kernel_table"] if r["op"] == "aten::mm")
    assert (row["dtype"], row["peak_tflops"], row["bound"]) == ("bf16", 989.4, "memory")


# ----------------------------------------------------------------------------- small kernels


def _graph_decode(inside_idle: bool) -> KinetoBuilder:
    """10 decode steps, each one CUDA-graph replay of 20 kernels of 10 µs; the GPU 90 % busy
    (200 µs of work, 22.2 µs idle per step): between the steps, or spread over the 19 gaps
    inside each replay."""
    b = KinetoBuilder()
    t = 0.0
    gap = 22.2 / 19 if inside_idle else 0.0
    for s in range(10):
        b.annotation(f"diagnose:decode[bs=8 ctx={1000 + s}]", t, 2)
        b._corr += 1
        b.runtime("cudaGraphLaunch", t + 1, 2, b._corr)
        k = t + 3
        for i in range(20):
            b.kernel(f"graph_kernel_{i}", k, 10, b._corr)
            k += 10 + gap
        t = k - gap + (0.0 if inside_idle else 22.2)
    return b


@pytest.mark.parametrize(("inside_idle", "saving_ms", "severity"), [(False, 10 * 19 * 1.3e-3, "low"),
                                                                     (True, 10 * (19 * 1.3e-3 + 22.2e-3), "medium")])
def test_planted_graph_decode_of_tiny_kernels_has_no_high_finding(tmp_path, inside_idle, saving_ms, severity):
    """The small-kernel tax's stake is what fusing saves: one run of 20 kernels per step, 19
    merged at the published 1.3 µs each, plus the gaps between them (research: 12.4 % of the
    step with the idle between steps, 21.1 % with it inside); never the kernels' whole time."""
    d = _report(_graph_decode(inside_idle).write(tmp_path / "g.json"))
    s = _symptom(d, "small-kernel-tax")
    assert s is not None and s["stake_ms"] == pytest.approx(saving_ms, abs=1e-6)
    assert s["severity"] == severity
    assert not [x for x in d["symptoms"] if x["severity"] in ("high", "critical")]


# ----------------------------------------------------------------------------- a report that fits


GOLDENS = sorted((ROOT / "tests" / "golden").glob("*.json"))


def test_golden_reports_for_the_fit_check_and_its_width():
    from diagnose.report.terminal import report_width

    assert report_width(False, 80, environ={}) == 100
    assert len(GOLDENS) >= 30


# The inner loop renders the longest report (a model config's) and a shipped sample's; the full
# suite renders every golden report.
@pytest.mark.parametrize("golden", sweep(GOLDENS, {"expert__sglang_prefilldecode__qwen3-8b_MI300X.json",
                                                   "samples__tracelens__vllm_decode_mi300x.json"},
                                         ids=[g.name for g in GOLDENS]))
def test_every_golden_report_fits_a_screen_when_not_a_terminal(golden):
    """Every shared trace's terminal report (rendered from its golden JSON report) is at most
    100 columns and 50 lines when output is not a terminal; --full prints more."""
    from rich.console import Console

    from diagnose.report.terminal import LINE_BUDGET, render_report, report_width

    width = report_width(False, 80, environ={})
    d = json.loads(golden.read_text(encoding="utf-8"))
    buf = io.StringIO()
    render_report(d, Console(file=buf, width=width, color_system=None))
    lines = buf.getvalue().splitlines()
    assert len(lines) <= LINE_BUDGET and max(map(len, lines)) <= width, (golden.name, len(lines))
    full = io.StringIO()
    render_report(d, Console(file=full, width=width, color_system=None), full=True)
    assert max(map(len, full.getvalue().splitlines())) <= width


def test_columns_is_honoured_and_full_prints_every_table(monkeypatch):
    t = str(shared_trace(SGLANG))
    monkeypatch.setenv("COLUMNS", "80")
    out = CliRunner().invoke(main, ["run", "--trace", t, "--model-config", "qwen3-8b"]).output.splitlines()
    assert max(map(len, out)) <= 80 and len(out) <= 50
    monkeypatch.delenv("COLUMNS")
    full = CliRunner().invoke(main, ["run", "--trace", t, "--model-config", "qwen3-8b", "--full"]).output
    assert "Latency (definitions" in full and full.count("\n") > 50
    # "not evaluated" grouped by reason, one line each; "No symptom rule fired" never twice
    assert "Rules not evaluated (" in full and "missing prefill.*" in full
    assert full.count("No symptom rule fired") <= 1


# ----------------------------------------------------------------------------- op attribution (issue 19 item 5b)


def _call_tree_share(rel: str) -> float:
    """Share of kernel time whose launch call (same correlation id) lies inside a cpu_op on
    the launching thread (the CPU call tree), from the raw events."""
    ev = _events(rel)
    ops: dict[int, list[tuple[float, float]]] = {}
    for e in ev:
        if e.get("cat") in ("cpu_op", "Operator") and e.get("ph") == "X":
            ops.setdefault(e["tid"], []).append((e["ts"], e["ts"] + e.get("dur", 0)))
    launch = {e["args"]["correlation"]: e for e in ev if e.get("cat") in ("cuda_runtime", "Runtime")
              and "correlation" in e.get("args", {})}
    # per thread: op starts sorted, and the latest end among the ops started so far; a time t
    # lies inside some op iff the latest end of the ops starting at or before t reaches t
    starts, reach = {}, {}
    for tid, iv in ops.items():
        iv.sort()
        starts[tid] = [s for s, _ in iv]
        reach[tid] = list(itertools.accumulate((e for _, e in iv), max))
    total = inside = 0.0
    for k in (e for e in ev if e.get("cat") in ("kernel", "Kernel")):
        total += k["dur"]
        la = launch.get(k["args"].get("correlation"))
        if la and la["tid"] in starts:
            i = bisect.bisect_right(starts[la["tid"]], la["ts"]) - 1
            if i >= 0 and reach[la["tid"]][i] >= la["ts"]:
                inside += k["dur"]
    return inside / total


@pytest.mark.parametrize("rel", sweep(["hta/trace_diff/control.json.gz",  # 13 s: slow
                                       "hta/critical_path_alexnet/benchmark_result_2869224_1695835535_trace.json.gz"], {1}))
def test_kernels_without_an_external_id_link_get_their_op_through_the_call_tree(rel):
    """Kernels whose External id equals their correlation id and no cpu_op carries it: the
    kernel table attributed 0 % / 0.66 % of kernel time to an op; through the call tree
    (TraceLens) >= 90 %, exactly the share whose launch call runs inside an operator."""
    ev = _events(rel)
    op_ext = {e["args"].get("External id") for e in ev if e.get("cat") == "cpu_op"}
    kernels = [e for e in ev if e.get("cat") == "kernel"]
    assert all(k["args"]["External id"] == k["args"]["correlation"] for k in kernels)
    via_ext = sum(k["dur"] for k in kernels if k["args"]["External id"] in op_ext) / sum(k["dur"] for k in kernels)
    assert via_ext < 0.01
    a = diagnose_trace(str(shared_trace(rel)))
    kt = a.kernel_frame
    share = float(kt.loc[kt["op"].notna(), "total_ms"].sum() / kt["total_ms"].sum())
    want = _call_tree_share(rel)
    assert share == pytest.approx(want, abs=1e-9) and share >= 0.9
    assert set(kt["op_source"].dropna()) <= {"call_tree", "trace"}


def test_call_tree_gives_the_same_op_as_the_external_id(tmp_path):
    """The class, made from a trace that links by External id (H100 Qwen1.5 forward): with
    every kernel's External id replaced by its correlation id, each kernel-table row names
    the same op and shapes as before."""
    rel = "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
    with gzip.open(shared_trace(rel), "rt", encoding="utf-8") as f:
        doc = json.load(f)
    for e in doc["traceEvents"]:
        if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset") and "correlation" in e.get("args", {}):
            e["args"]["External id"] = e["args"]["correlation"]
    p = tmp_path / "relinked.json"
    p.write_text(json.dumps(doc))
    cols = ["phase", "op", "input_dims", "kernel", "calls"]
    before = diagnose_trace(str(shared_trace(rel))).kernel_frame
    after = diagnose_trace(str(p)).kernel_frame
    key = lambda df: sorted(map(tuple, df[cols].astype(str).to_numpy().tolist()))  # noqa: E731
    assert key(before) == key(after)
    assert (after["op_source"][after["op"].notna()] == "call_tree").all() and after["op"].notna().sum() >= 0.6 * len(after)


# ----------------------------------------------------------------------------- the ranking rule


def test_rank_by_predicted_saving_else_loss_else_stake():
    from diagnose.engine.evaluate import rank_ms

    assert rank_ms({"predicted_saving_ms": 1.0, "loss_ms": 5.0, "stake_ms": 9.0}) == 1.0
    assert rank_ms({"loss_ms": 5.0, "stake_ms": 9.0}) == 5.0
    assert rank_ms({"stake_ms": 9.0}) == 9.0
    assert rank_ms({}) == 0.0


def test_every_golden_report_ranks_by_one_rule():
    """Across the reports of every shared trace: a symptom's ``rank_basis`` names the first of
    predicted saving, loss, stake that it has, and symptoms of one severity and kind are in
    descending order of that time (the critical path's savings and the kernel table's losses
    under one rule)."""
    from diagnose.engine.evaluate import rank_ms
    from diagnose.engine.rule import load_rules

    kinds = {r.id: r.kind for r in load_rules()}
    bases = set()
    for g in sorted((ROOT / "tests" / "golden").glob("*.json")):
        syms = json.loads(g.read_text(encoding="utf-8")).get("symptoms") or []
        for s in syms:
            want = next((b for b, k in (("predicted_saving", "predicted_saving_ms"), ("loss", "loss_ms"),
                                         ("stake", "stake_ms")) if s.get(k) is not None), None)
            assert s.get("rank_basis") == want, (g.name, s["id"])
            bases.add(want)
        keyed = [(s["severity"], kinds.get(s["id"]) == "cause", rank_ms(s)) for s in syms]
        for (sev, cause, ms), (sev2, cause2, ms2) in zip(keyed, keyed[1:]):
            if (sev, cause) == (sev2, cause2):
                assert ms >= ms2, g.name
    assert bases >= {"predicted_saving", "stake"}
    # the kernel-table findings have a predicted saving where the trace gives a critical path
    # (their kernels re-timed at the roofline): far below the loss on the H100 forward, whose
    # host launches the step's last kernels late
    h100 = json.loads((ROOT / "tests" / "golden" / "expert__h100_qwen1.5-0.5b.json").read_text(encoding="utf-8"))
    kl = next(s for s in h100["symptoms"] if s["id"] == "kernel-loss")
    assert kl["rank_basis"] == "predicted_saving" and kl["predicted_saving_ms"] < kl["loss_ms"] / 5


def test_a_saved_report_ranks_kernel_findings_by_their_loss():
    """Re-evaluated without its trace (gate, compare: no critical path), the MI300X Qwen1.5
    forward's kernel-table findings rank by their loss: the sum of the prefill op classes'
    losses (GEMMs 7.42777 + elementwise 6.8704 + attention 3.57701 = 17.87518 ms), the second
    lever by the elementwise class's 6.8704 ms; elementwise-dominated keeps its stake."""
    from diagnose.pipeline import attach_verdicts

    g = ROOT / "tests" / "golden" / "shared__tracelens__mi300__Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz.json"
    d = json.loads(g.read_text(encoding="utf-8"))
    for k in ("symptoms", "headline", "not_evaluated"):
        d.pop(k, None)
    losses = [c["loss_ms"] for c in _phase(d, "prefill")["op_classes"] if c["loss_ms"] is not None]
    assert sum(losses) == pytest.approx(17.87518, abs=1e-5)
    syms = {s["id"]: s for s in attach_verdicts(d)["symptoms"]}
    assert (syms["kernel-loss"]["rank_basis"], syms["kernel-loss"]["loss_ms"]) == ("loss", pytest.approx(sum(losses), abs=1e-5))
    assert (syms["second-lever"]["rank_basis"], syms["second-lever"]["loss_ms"]) == ("loss", 6.8704)
    assert syms["elementwise-dominated"]["rank_basis"] == "stake"
    assert "predicted_saving_ms" not in syms["kernel-loss"]
    # with a trace, the what-if brings each category to its roofline: time / (time - loss)
    from diagnose.findings import as_report, roofline_speedup

    row = next(p for p in as_report(d).phases if p.name == "prefill")
    cat = row.categories_ms
    want = {c["name"]: cat[c["name"]] / (cat[c["name"]] - c["loss_ms"]) for c in _phase(d, "prefill")["op_classes"]}
    assert roofline_speedup(row, "all") == pytest.approx(want, rel=1e-12)
    assert round(want["gemm"], 3) == round(11.6457 / (11.6457 - 7.42777), 3) == 2.761
    assert roofline_speedup(row, "second") == {"elementwise": pytest.approx(want["elementwise"], rel=1e-12)}
