"""Odd, broken and misleading Kineto traces (issue "Robustness", cases 1-12 and 16-19):
each is a small fixture with the stated numbers as the contract."""
from __future__ import annotations

import gzip
import json

import pytest
from click.testing import CliRunner

from diagnose.cli import main
from diagnose.options import AnalysisOptions
from diagnose.errors import TraceFormatError
from diagnose.pipeline import run_analysis
from diagnose.trace import load_trace


def _run(args):
    return CliRunner().invoke(main, args)


def _codes(a):
    return {q.code: q for q in a.quality}


# 1 ---------------------------------------------------------------------------------------
def _decimal_comma_text(kineto):
    b = kineto()
    b.launch("gemm_kernel", 10, 5, launch_ts=0).launch("gemm_kernel", 30, 5, launch_ts=20)
    text = json.dumps(b.doc())
    clean = text
    # a locale bug writes "blocks per SM": 0,5 inside the first kernel's args
    bad = text.replace('"stream": 7, "correlation": 1001', '"stream": 7, "blocks per SM": 0,5, "correlation": 1001', 1)
    assert bad != text
    return clean, bad


def test_decimal_comma_strict_names_position_and_cause(kineto, tmp_path):
    _clean, bad = _decimal_comma_text(kineto)
    p = tmp_path / "comma.json"
    p.write_text(bad)
    r = _run(["run", "--trace", str(p)])
    assert r.exit_code == 2
    assert r.output.count("\n") == 1
    assert "decimal comma" in r.output and "byte" in r.output and "--lenient" in r.output


def test_decimal_comma_lenient_gives_same_timings(kineto, tmp_path):
    clean, bad = _decimal_comma_text(kineto)
    (tmp_path / "clean.json").write_text(clean)
    (tmp_path / "bad.json").write_text(bad)
    a = run_analysis(str(tmp_path / "clean.json"))
    b = run_analysis(str(tmp_path / "bad.json"), AnalysisOptions(lenient=True))
    assert b.phase("all").to_dict()["gpu_busy_ms"] == a.phase("all").gpu_busy_ms == 0.01
    assert b.phase("all").launch_gap_share == a.phase("all").launch_gap_share
    assert _codes(b)["decimal_comma_repaired"].count == 1


# 2 ---------------------------------------------------------------------------------------
def test_invalid_utf8_and_control_characters(kineto, tmp_path):
    b = kineto()
    b.launch("KERNEL_A", 10, 5, launch_ts=0).launch("KERNEL_B", 30, 5, launch_ts=20)
    text = json.dumps(b.doc()).encode()
    (tmp_path / "clean.json").write_bytes(text)
    bad = text.replace(b"KERNEL_A", b"KERN\xff\xfeL_A").replace(b"KERNEL_B", b"KERN\x01L_B")
    (tmp_path / "bad.json").write_bytes(bad)
    a = run_analysis(str(tmp_path / "clean.json"))
    r = run_analysis(str(tmp_path / "bad.json"))
    assert r.phase("all").gpu_busy_ms == a.phase("all").gpu_busy_ms == 0.01
    assert r.phase("all").launch_gap_share == a.phase("all").launch_gap_share
    assert "invalid_text_repaired" in _codes(r)
    assert _codes(r)["invalid_utf8_names"].count == 2
    assert all("\ufffd" in n for n in r.activities["name"])


# 3 ---------------------------------------------------------------------------------------
def test_only_metadata_events(tmp_path):
    p = tmp_path / "meta.json"
    p.write_text(json.dumps({"traceEvents": [{"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "x"}}]}))
    r = _run(["run", "--trace", str(p), "--format", "json"])
    assert r.exit_code == 0
    d = json.loads(r.output)
    assert "no_gpu_activity" in {q["code"] for q in d["quality"]}


def test_single_gpu_without_distributed_info_or_memcpy(kineto, tmp_path):
    b = kineto()  # no distributedInfo, no memcpy/memset
    b.launch("k", 0, 10, launch_ts=-5)
    a = run_analysis(str(b.write(tmp_path / "one.json")))
    assert [d.to_dict() for d in a.devices] == [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]
    assert a.phase("all").gpu_busy_ms == 0.01
    assert "memcpy" not in a.phase("all").categories_ms


# 4 ---------------------------------------------------------------------------------------
def test_sub_microsecond_and_negative_durations(kineto, tmp_path):
    b = kineto()
    b.kernel("a", 100.7, 0.2).kernel("b", 101.5, 1.0).kernel("neg", 103.0, -4.0)
    t = load_trace(str(b.write(tmp_path / "t.json")))
    assert t.gpu["start_ns"].tolist() == [100_700, 101_500]
    assert t.gpu["end_ns"].tolist() == [100_900, 102_500]
    assert {q.code: q.count for q in t.quality}["negative_duration"] == 1


# 5 ---------------------------------------------------------------------------------------
def test_zero_duration_kernel_and_ts_zero_outlier(kineto, tmp_path):
    base = 1_700_000_000_000_000  # epoch µs
    b = kineto()
    b.kernel("a", base, 10).kernel("zero", base + 15, 0).kernel("b", base + 20, 10).kernel("ts0", 0, 5)
    a = run_analysis(str(b.write(tmp_path / "t.json")))
    p = a.phase("all")
    assert p.gpu_busy_ms == 0.02  # the zero-length kernel adds 0
    assert p.window_ms == 0.03  # not 50 years: the ts-0 kernel is excluded
    assert p.kernel_count == 3
    assert _codes(a)["outside_trace_window"].count == 1


# 6 ---------------------------------------------------------------------------------------
def test_base_time_after_trace_events_and_two_ranks(tmp_path):
    def doc(base, ts):
        ev = [{"ph": "X", "cat": "kernel", "name": "k", "pid": 0, "tid": 7, "ts": ts, "dur": 1.5,
               "args": {"device": 0, "stream": 7, "correlation": 1}}]
        return '{"schemaVersion": 1, "traceEvents": ' + json.dumps(ev) + ', "baseTimeNanoseconds": ' + str(base) + "}"

    # rank 0: base 1,700,000,000,000,000,000 ns, ts 2,000,000.123 µs; rank 1: another base, same instant
    (tmp_path / "r0.json").write_text(doc(1_700_000_000_000_000_000, 2_000_000.123))
    (tmp_path / "r1.json").write_text(doc(1_699_999_999_000_000_000, 3_000_000.1234))
    t0 = load_trace(str(tmp_path / "r0.json"))
    t1 = load_trace(str(tmp_path / "r1.json"))
    assert int(t0.gpu["start_ns"].iloc[0]) == 1_700_000_002_000_000_123
    assert abs(int(t1.gpu["start_ns"].iloc[0]) - int(t0.gpu["start_ns"].iloc[0])) <= 1_000  # within 1 µs


# 7 ---------------------------------------------------------------------------------------
def test_graph_launch_fanout_40(kineto, tmp_path):
    b = kineto()
    b.runtime("cudaGraphLaunch", 0, 5, 77)
    t = 10.0
    for i in range(40):
        attn = i % 4 == 0  # 10 attention kernels of 20 µs = 200 µs; 30 others (20 x 10 + 10 x 12) = 320 µs
        dur = 20.0 if attn else (10.0 if i < 27 else 12.0)
        b.kernel("flash_fwd_splitkv_kernel" if attn else "gemv_kernel", t, dur, corr=77)
        t += dur
    a = run_analysis(str(b.write(tmp_path / "g.json")))
    d = a.to_dict()
    assert d["launches"]["host_launch_calls"] == 1
    assert d["launches"]["kernels_per_graph_launch_max"] == 40
    assert a.phase("all").attention_share == pytest.approx(200 / 520, abs=1e-6)  # 38.5 %
    assert _codes(a)["graph_kernels_no_launch"].count == 40


# 8 ---------------------------------------------------------------------------------------
def test_graph_coverage_1_of_100(kineto, tmp_path):
    b = kineto()
    for i in range(100):
        b.runtime("cudaGraphLaunch", i * 100, 5, 1000 + i)
    b.kernel("k", 10, 10, corr=1000).kernel("k", 30, 10, corr=1000)
    a = run_analysis(str(b.write(tmp_path / "g.json")))
    d = a.to_dict()
    assert d["launches"]["graph_coverage"] == 0.01
    assert "graph_coverage_low" in _codes(a)
    assert set(a.phase("all").unreliable) == {"gpu_idle_share", "launch_gap_share"}


# 9 ---------------------------------------------------------------------------------------
def test_same_stream_overlap_kept(kineto, tmp_path):
    b = kineto()
    b.kernel("a", 3.0, 2.888).kernel("b", 4.112, 2.888)  # 3 -> 5.888 and 4.112 -> 7.0 on one stream
    a = run_analysis(str(b.write(tmp_path / "o.json")))
    p = a.phase("all")
    assert p.kernel_count == 2
    assert p.gpu_busy_ms == 0.004  # union 3 -> 7 µs, not 5.776
    assert p.kernel_ms == 0.005776
    assert "same_stream_overlap" in _codes(a)


# 10 --------------------------------------------------------------------------------------
def test_deferred_completion_clipped(kineto, tmp_path):
    b = kineto()
    # a memcpy whose completion is recorded 10 s late, followed by kernels on its stream
    b.memcpy(0, 10_000_000.0)
    t = 5.0
    for _ in range(500):
        b.kernel("gemm_kernel", t, 20.0)
        t += 25.0
    a = run_analysis(str(b.write(tmp_path / "late.json")))
    p = a.phase("all")
    q = _codes(a)["deferred_completion_clipped"]
    assert q.count == 1
    assert p.categories_ms["memcpy"] == 0.005  # clipped to the next start (5 µs)
    share = p.categories_ms["memcpy"] / (p.categories_ms["memcpy"] + p.categories_ms["gemm"])
    assert share == pytest.approx(0.0005, abs=1e-4)  # ~0.05 %, not ~98 %


# 11 --------------------------------------------------------------------------------------
def test_gpu_annotations_and_syncs_never_busy(kineto, tmp_path):
    b = kineto()
    b.kernel("k", 0, 10)
    b.annotation("## forward ##", -5, 1000, cat="gpu_user_annotation", pid=0, tid=7)
    b.events.append({"ph": "X", "cat": "cuda_sync", "name": "Stream Sync", "pid": 0, "tid": 7, "ts": 20, "dur": 500,
                     "args": {"device": 0, "stream": 7}})
    a = run_analysis(str(b.write(tmp_path / "a.json")))
    assert a.phase("all").gpu_busy_ms == 0.01
    assert a.phase("all").activity_count == 1


# 12 --------------------------------------------------------------------------------------
@pytest.mark.parametrize("style", ["rocm71", "rocm72"])
def test_rocm_copies_and_fills(kineto, tmp_path, style):
    b = kineto(deviceProperties=[{"id": 0, "name": "AMD Instinct MI300X"}])
    if style == "rocm71":
        b.kernel("__amd_rocclr_copyBuffer", 0, 50)
        b.kernel("__amd_rocclr_fillBufferAligned", 60, 50)
    else:
        b.kernel("Memcpy DtoD", 0, 50, cat="gpu_memcpy")
        b.kernel("Memset", 60, 50, cat="gpu_memset")
    b.kernel("Cijk_Alik_Bljk_HHS_BH_MT128x128x32", 120, 500)
    a = run_analysis(str(b.write(tmp_path / f"{style}.json")))
    assert a.phase("all").categories_ms == {"gemm": 0.5, "memcpy": 0.05, "memset": 0.05}


# 16 --------------------------------------------------------------------------------------
def _cut_trace(kineto, tmp_path):
    b = kineto()
    for i in range(20):
        b.launch("gemm_kernel", 100 * i, 50, launch_ts=100 * i - 10)
    text = json.dumps(b.doc()).encode()
    cut = text[: int(len(text) * 0.6)]  # cut mid-event
    return text, cut


def test_truncated_json_partial(kineto, tmp_path):
    _full, cut = _cut_trace(kineto, tmp_path)
    p = tmp_path / "cut.json"
    p.write_bytes(cut)
    a = run_analysis(str(p))
    assert a.partial is True
    assert "truncated" in _codes(a)
    assert 0 < a.phase("all").kernel_count < 20
    d = json.loads(_run(["run", "--trace", str(p), "--format", "json"]).output)
    assert d["partial"] is True


def test_truncated_gzip_partial(kineto, tmp_path):
    full, _cut = _cut_trace(kineto, tmp_path)
    gz = gzip.compress(full)
    p = tmp_path / "cut.json.gz"
    p.write_bytes(gz[: int(len(gz) * 0.7)])
    a = run_analysis(str(p))
    assert a.partial is True
    assert "gzip stream cut short" in _codes(a)["truncated"].message
    assert 0 < a.phase("all").kernel_count < 20


def test_corrupt_gzip_and_not_a_trace(tmp_path):
    (tmp_path / "bad.json.gz").write_bytes(b"\x1f\x8b\x08\x00garbage-garbage-garbage")
    (tmp_path / "x.json").write_text('{"hello": "world"}')
    (tmp_path / "empty.json").write_text("")
    (tmp_path / "text.json").write_text("not json at all")
    for name in ("bad.json.gz", "x.json", "empty.json", "text.json", "missing.json"):
        r = _run(["run", "--trace", str(tmp_path / name)])
        assert r.exit_code == 2, (name, r.output)
        assert r.output.startswith("error: ") and r.output.count("\n") == 1
        assert "Traceback" not in r.output


# 17 --------------------------------------------------------------------------------------
def test_templated_names_classified_by_base_name(kineto, tmp_path):
    b = kineto()
    b.kernel("void deep_ep::internode::dispatchKernel<true, 8, (DispatchLayout)1>(Params)", 0, 10)
    b.kernel("void combineKernel<(DispatchLayout)0, 128, 4>(int, void*, Config)", 10, 10)
    b.kernel("ncclDevKernel_AllReduce_Sum_bf16_RING_LL(ncclDevComm*, unsigned long, ncclWork*)", 20, 30)
    b.kernel("void flashinfer::BatchDecodeWithPagedKVCacheKernel<(flashinfer::PosEncodingMode)0, 2u, 4u>(Params)", 50, 20)
    b.runtime("cudaMemcpyAsync", 0, 100, 999)
    a = run_analysis(str(b.write(tmp_path / "t.json")))
    p = a.phase("all")
    # DeepEP dispatch 0-10 and the combine 10-20 move tokens between GPUs (all-to-all): with the
    # NCCL all-reduce 20-50, communication is 50 µs on one stream
    assert p.categories_ms == {"attention": 0.02, "communication": 0.05}
    assert p.kernel_count == 4  # the runtime memcpy call is never a kernel
    assert p.attention_share == pytest.approx(20 / 70, abs=1e-6)  # 28.6 %


# 18 --------------------------------------------------------------------------------------
def test_sglang_and_vllm_markers_and_mixed(kineto, tmp_path):
    b = kineto()
    b.annotation("step[EXTEND bs=1 toks=1024]", 0, 100).launch("gemm", 50, 1000, launch_ts=10)
    t = 2000
    for i in range(9):
        b.annotation("step[DECODE bs=1]", t, 100).launch("gemv", t + 50, 500, launch_ts=t + 10)
        t += 1000
    b.annotation("execute_1030_context_1(sq1024sk1024sqsq1048576sqsk1048576)_generation_6(sq6sk6000sqsq6sqsk6000)", t, 100)
    b.launch("gemm", t + 50, 2000, launch_ts=t + 10)
    t += 3000
    b.annotation("execute_new_0_cached_4", t, 100).launch("gemv", t + 50, 500, launch_ts=t + 10)
    a = run_analysis(str(b.write(tmp_path / "m.json")))
    assert a.steps["phase"].tolist() == ["prefill"] + ["decode"] * 9 + ["mixed", "decode"]
    assert a.steps["grammar"].tolist() == ["sglang"] * 10 + ["vllm-v1", "vllm-v1-new-cached"]
    assert a.steps["kv_tokens"].iloc[10] == 6000
    # TPOT: 10 decode steps -> 9 intervals; the one spanning the mixed step keeps it
    assert a.latency.tpot_samples == 9
    assert a.phase("mixed").step_count == 1


def test_no_markers_means_unknown(kineto, tmp_path):
    b = kineto()
    b.launch("gemm", 0, 10, launch_ts=-5)
    a = run_analysis(str(b.write(tmp_path / "n.json")))
    assert [p.name for p in a.phases] == ["all", "unknown"]
    assert len(a.steps) == 0  # one gemm: no marker, frame or repeated structure
    assert "no_steps" in _codes(a)


# 19 --------------------------------------------------------------------------------------
def test_launch_api_vocabulary_drift(kineto, tmp_path):
    b = kineto()
    b.runtime("cuLaunchKernelEx", 0, 2, 1, cat="cuda_driver").kernel("k1", 10, 5, corr=1)
    b.runtime("INVALID", 20, 2, 2).kernel("k2", 30, 5, corr=2, cat="Kernel")
    b.runtime("cudaLaunchKernel", 40, 2, 3).kernel("k3", 50, 5, corr=3)
    a = run_analysis(str(b.write(tmp_path / "v.json")))
    assert "unlinked_kernels" not in _codes(a)
    assert (a.activities["launch_kind"] != "").all()
    assert a.to_dict()["launches"]["host_launch_calls"] == 3


def test_legacy_top_level_list(tmp_path):
    ev = [{"ph": "X", "cat": "Operator", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 0, "dur": 5},
          {"ph": "X", "cat": "Runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 2, "args": {"correlation": 5}},
          {"ph": "X", "cat": "Kernel", "name": "gemm", "pid": 0, "tid": "stream 7", "ts": 10, "dur": 5, "args": {"correlation": 5, "device": 0}}]
    p = tmp_path / "legacy.json"
    p.write_text(json.dumps(ev))
    a = run_analysis(str(p))
    assert a.phase("all").kernel_count == 1
    assert a.activities["stream"].tolist() == [7]
    assert "legacy_event_list" in _codes(a)


def test_loader_errors_are_trace_format_errors(tmp_path):
    p = tmp_path / "d"
    p.mkdir()
    with pytest.raises(TraceFormatError):
        load_trace(str(p))


# --window / --device -------------------------------------------------------------------
def test_window_and_device_slices(kineto, tmp_path):
    b = kineto(deviceProperties=[{"id": 0, "name": "NVIDIA H100 80GB HBM3"}, {"id": 1, "name": "NVIDIA H100 80GB HBM3"}])
    for i in range(10):  # device 0: a 100 µs kernel every ms; device 1: one kernel
        b.kernel("k", i * 1000, 100, device=0)
    b.kernel("k1", 500, 50, device=1, stream=9)
    p = str(b.write(tmp_path / "w.json"))
    a = run_analysis(p, AnalysisOptions(window="2:5"))
    assert a.phase("all", 0).kernel_count == 3  # kernels starting at 2, 3, 4 ms
    assert "sliced_window" in _codes(a)
    a = run_analysis(p, AnalysisOptions(device=1))
    assert [d.id for d in a.devices] == [1] and a.phase("all", 1).kernel_count == 1
    for args in (["--window", "5"], ["--window", "5:2"], ["--window", "a:b"], ["--device", "7"]):
        r = _run(["run", "--trace", p, *args])
        assert r.exit_code == 2 and r.output.startswith("error: "), (args, r.output)


def test_training_trace_is_not_given_inference_phases():
    from conftest import shared_trace

    a = run_analysis(str(shared_trace("hta/trace_diff/control.json.gz")))
    # its 6 ProfilerStep ranges (#1009-#1014) are the steps, timed; [B, S, H] linears, but
    # autograd backward ran: training, so no prefill/decode phase
    assert a.steps["name"].tolist() == [f"ProfilerStep#{i}" for i in range(1009, 1015)]
    assert set(a.steps["phase"]) == {"unknown"} and set(a.steps["evidence"]) == {"profiler_step"}
    assert "training_trace" in _codes(a)
    assert a.latency.ttft_ms is None
