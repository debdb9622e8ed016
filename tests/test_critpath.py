"""Critical path: synthetic fixtures with hand-derived paths, and the shared traces.

Expected numbers were derived from the raw events (tests/critpath_fixtures.py states each
path; the shared-trace values were worked out event by event, see README "Critical path").
"""
from __future__ import annotations

import numpy as np
import pytest

from conftest import shared_trace
from critpath_fixtures import FIXTURES, analysis
from diagnose.analyzers import critpath as C
from diagnose.pipeline import diagnose_trace, run_analysis
from diagnose.report.pathline import path_lines


def _us(d: dict) -> dict:
    return {k: round(v * 1000, 3) for k, v in d.items()}


@pytest.mark.parametrize("name", sorted(FIXTURES))
def test_fixture_path_exact(name, tmp_path):
    events, _, start_us, end_us, kinds, host_activity = FIXTURES[name]
    a, row = analysis(name, tmp_path)
    t0 = min(e["ts"] for e in events)
    cp = a.report.steps[row].critical_path
    assert round(cp.start_ms * 1000 + t0, 3) == start_us
    assert round(cp.end_ms * 1000 + t0, 3) == end_us
    assert round(cp.length_ms * 1000, 3) == end_us - start_us
    assert _us(cp.ms_by_kind) == kinds
    p = a.paths.steps[row]
    assert int(p.dur.sum()) == p.length_ns  # contiguous segments
    got = {}
    for act, d in zip(p.activity[p.kind == C.K_HOST].tolist(), p.dur[p.kind == C.K_HOST].tolist()):
        got[act] = got.get(act, 0) + d / 1000
    assert got == host_activity


def test_fixture_details(tmp_path):
    a, row = analysis("f6_graph_replay", tmp_path)
    p = a.paths.steps[row]
    gaps = [(c, round(d / 1000, 3)) for c, d in zip(p.cause[p.kind == C.K_GAP].tolist(), p.dur[p.kind == C.K_GAP].tolist())]
    assert gaps == [("graph", 1.0), ("graph", 1.0), ("switch", 1.0)]
    assert [n for n in p.name[p.kind == 0].tolist()] == ["g1", "g2", "g3", "k4"]  # every replayed kernel
    a, row = analysis("f5_overlap_hides_prep", tmp_path)
    assert a.report.steps[row].critical_path.start_reason == "previous_step"
    assert a.report.steps[0].critical_path.start_reason == "anchor"
    a, row = analysis("f3_cross_stream_wait", tmp_path)
    p = a.paths.steps[row]
    assert "kb" not in p.name.tolist()
    assert p.name[p.kind == C.K_DEP].tolist() == ["ka"]  # the wait names what it waited for
    a, row = analysis("f4_blocking_sync", tmp_path)
    p = a.paths.steps[row]
    assert p.name[p.kind == C.K_RET].tolist() == ["cudaDeviceSynchronize"] and p.cause[p.kind == C.K_RET].tolist() == ["host_blocked"]
    # the sync's 103 µs of waiting are not on the path
    assert not any(n == "cudaDeviceSynchronize" for n in p.name[p.kind == C.K_HOST].tolist())


def test_overlap_scheduler_phase_summary(tmp_path):
    """f5b: the overlap breaks in step 2 only; the summary says where."""
    a, _ = analysis("f5b_overlap_breaks", tmp_path)
    ph = a.report.critical_path.phases[0]
    assert ph.steps == 2 and ph.steps_with_host == 2
    assert ph.host_breaks[0] == "ProfilerStep#2: 0.080000 ms host in prepare_inputs".replace("0.080000", "0.080")
    a, _ = analysis("f5_overlap_hides_prep", tmp_path)
    ph = a.report.critical_path.phases[0]
    assert ph.steps_with_host == 1  # step 1 (its host lead-in); step 2's prep is hidden
    assert a.report.steps[1].critical_path.host_ms_by_cause == {}


# ---------------------------------------------------------------- shared traces


def test_h100_step_path():
    """ProfilerStep#6: from step #5's GPU end (released through the leading
    cudaDeviceSynchronize) to the last kernel, 35.183362 ms; 86 % GPU compute."""
    a = run_analysis(str(shared_trace("tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")))
    cp = a.report.steps[0].critical_path
    assert cp.length_ms == 35.183362 and cp.start_reason == "previous_step"
    assert cp.hta_comparable_ms == 33.720757
    assert cp.ms_by_kind == {"gpu_compute": 30.118272, "memcpy": 0.137543, "gpu_gap": 1.678825, "launch_latency": 0.021127,
                             "sync_return": 0.011738, "host": 3.215857}
    assert cp.segment_count == 4147 and len(cp.segments) == C.TOP_SEGMENTS
    assert all(s.name.startswith("void pytorch_flash::flash_fwd_kernel") for s in cp.segments)


def test_sglang_prefill_wait_off_the_path():
    """The 493 ms the GPU waits for work the trace does not hold (the hipStreamWaitEvent
    before the step's first kernel) is off the path: it starts at that kernel (493.365801 ms)."""
    a = run_analysis(str(shared_trace("tracelens/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.gz")))
    s = a.report.steps[0]
    assert any(w.cause == "outside_trace" and w.duration_ms > 493 for w in s.waits)
    cp = s.critical_path
    assert cp.start_reason == "outside_trace" and cp.start_ms == 493.365801
    assert cp.length_ms == 493.908934
    assert cp.ms_by_kind["gpu_compute"] == 492.501561
    gpu = sum(v for k, v in cp.ms_by_kind.items() if k in ("gpu_compute", "memcpy", "gpu_gap"))
    assert round(gpu / cp.length_ms, 4) == 0.9972


def test_vllm_mixed_step_gpu_bound():
    """PIECEWISE mixed step: the host launched it all while the GPU ran the previous step;
    the path is GPU work only: 99.757 % GPU activities, 100 % with the gaps between them."""
    a = run_analysis(str(shared_trace("tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz")))
    cp = a.report.steps[0].critical_path
    assert cp.length_ms == 156.466417 and cp.start_reason == "outside_trace"
    assert cp.ms_by_kind == {"gpu_compute": 156.008394, "memcpy": 0.077399, "gpu_gap": 0.380624}
    assert (cp.ms_by_kind["gpu_compute"] + cp.ms_by_kind["memcpy"]) / cp.length_ms >= 0.95
    p = a.paths.steps[0]
    g = a.paths.graph
    replayed = (p.op >= 0) & g.graph[np.maximum(p.op, 0)] & (p.kind == 0)
    assert int(replayed.sum()) > 300  # graph-replayed kernels are on the path


def test_vllm_full_graph_replay_on_the_path():
    """One hipGraphLaunch replays 421 kernels: all of them are on the decode step's path
    (HTA 0.6.1 keeps only the last one of a replay)."""
    a = run_analysis(str(shared_trace("tracelens/vllm_decode_full/graph_execution.json.gz")))
    p, g = a.paths.steps[0], a.paths.graph
    on = set(p.op[(p.op >= 0) & (p.kind < C.K_GAP)].tolist())
    replay = set(np.flatnonzero(g.graph).tolist())
    assert len(replay) == 421 and replay <= on
    assert a.report.steps[0].critical_path.length_ms == 10.743181


def test_nano_vllm_decode_host_bound_by_frame_and_cause():
    """nano-vllm's eager decode: the path is host work (97.9 %), named by user frame (CPU
    attention, linear layers) and cause."""
    a = diagnose_trace(str(shared_trace("nano-vllm-zhang-yuhui/profile_results/decode_gpu_0.json")))
    cp = a.report.steps[0].critical_path
    assert cp.length_ms == 2.871429 and cp.ms_by_kind["host"] == 2.810466
    assert cp.ms_by_kind["host"] / cp.length_ms > 0.97
    ph = a.report.critical_path.phases[0]
    frames = [(f.frame, f.activity, f.cause) for f in ph.host_frames]
    # the causes are the cause table's, named as the gap classifier names them (issue 22): the CPU
    # attention launches nothing (host_compute, as its gap), first launches of kernels over 20 µs
    # (first_call_setup), the profiler's overhead events, dynamo's cache lookup (compile_guard)
    assert frames[0] == ("nanovllm/layers/attention.py(363): attention_cpu", "cpu_op", "host_compute")
    assert {f for f, _, _ in frames} >= {"nanovllm/layers/attention.py(217): forward", "nanovllm/layers/linear.py(149): forward"}
    assert cp.host_ms_by_cause == {"launch": 1.552619, "host_compute": 0.688082, "first_call_setup": 0.24908,
                                   "profiler_overhead": 0.165379, "compile_guard": 0.14244, "host_blocked": 0.012866}
    assert round(sum(cp.host_ms_by_cause.values()), 6) == cp.ms_by_kind["host"]
    line = path_lines(a.to_dict())[0]
    assert line == ("decode step path 2.871 ms (p50 of 1): 91 % host (most in `attention.py(363): attention_cpu` (host_compute): "
                    "15% of it), 9 % launch")
    assert len("critical path: " + line) <= 160


def test_window_path_without_steps():
    """Without steps the path is the whole window's: AlexNet's (from the kernel that waited
    3 s for work the trace does not hold). The report finds AlexNet's two param-benchmark
    forwards as steps (its warmup and measure ranges), so it gives their paths instead of the
    window's; the window path is walked here on the same graph with no step."""
    a = run_analysis(str(shared_trace("hta/critical_path_alexnet/benchmark_result_2869224_1695835535_trace.json.gz")))
    assert [s.name.rsplit("|", 2)[1] for s in a.report.steps] == ["warmup", "measure"]
    assert a.report.critical_path.window is None and [p.steps for p in a.report.critical_path.phases] == [2]
    w = C.path_record(C.step_paths(a.paths.graph, a.steps.iloc[0:0], a.t0_ns).window, a.t0_ns)
    assert w.start_reason == "outside_trace"
    assert w.length_ms == 1982.286
