"""Synthetic Kineto traces with hand-derived critical paths (times in µs, integers).

Host thread pid/tid 100; GPU device 0, stream 7 (and 8). Steps are ``ProfilerStep#N`` user
ranges, read as decode steps (``--phase-regex decode=^ProfilerStep#``). Each fixture states its
path by hand: segments in time order, what binds each one, and the path's kinds.
"""
from __future__ import annotations

import json
from pathlib import Path

from diagnose.options import AnalysisOptions
from diagnose.pipeline import run_analysis

H = {"pid": 100, "tid": 100}
OPTIONS = AnalysisOptions(phase_regex=("decode=^ProfilerStep#",))


def op(name, ts, dur):
    return {"ph": "X", "cat": "cpu_op", "name": name, "ts": ts, "dur": dur, "args": {}, **H}


def rt(name, ts, dur, corr):
    return {"ph": "X", "cat": "cuda_runtime", "name": name, "ts": ts, "dur": dur, "args": {"correlation": corr}, **H}


def k(name, ts, dur, corr, stream=7):
    return {"ph": "X", "cat": "kernel", "name": name, "ts": ts, "dur": dur, "pid": 0, "tid": stream,
            "args": {"correlation": corr, "stream": stream, "device": 0}}


def step(n, ts, dur):
    return {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}", "ts": ts, "dur": dur, "args": {}, **H}


FIXTURES = {
    # serial host-bound: host [0,90] (aten::a 25, launch 5, aten::b 35, launch 5, aten::c 20),
    # launch latency [90,100], kc [100,105]; ka and kb are off the path
    "f1_serial_host_bound": (
        [step(1, 0, 100), op("aten::a", 0, 30), rt("cudaLaunchKernel", 20, 5, 1), op("aten::b", 30, 40),
         rt("cudaLaunchKernel", 65, 5, 2), op("aten::c", 70, 25), rt("cudaLaunchKernel", 90, 5, 3),
         k("ka", 30, 5, 1), k("kb", 75, 5, 2), k("kc", 100, 5, 3)],
        "ProfilerStep#1", 0, 105,
        {"host": 90, "launch_latency": 10, "gpu_compute": 5}, {"cpu_op": 80, "launch": 10}),
    # GPU-bound, host ahead: host [0,10], latency [10,20], k1..k4 with three 1-µs switch gaps
    "f2_gpu_bound_host_ahead": (
        [step(1, 0, 50), op("forward", 0, 50)] + [rt("cudaLaunchKernel", 10 * i, 5, i) for i in range(1, 5)]
        + [k("k1", 20, 100, 1), k("k2", 121, 100, 2), k("k3", 222, 100, 3), k("k4", 323, 100, 4)],
        "ProfilerStep#1", 0, 423,
        {"host": 10, "launch_latency": 10, "gpu_compute": 400, "gpu_gap": 3}, {"cpu_op": 10}),
    # cross-stream wait: kc (stream 8) waits on ka (stream 7): dependency [220,222]; kb off the path
    "f3_cross_stream_wait": (
        [step(1, 0, 40), op("forward", 0, 40), rt("cudaLaunchKernel", 10, 5, 1), rt("cudaEventRecord", 16, 2, 2),
         rt("cudaLaunchKernel", 20, 5, 3), rt("cudaStreamWaitEvent", 26, 2, 4), rt("cudaLaunchKernel", 30, 5, 5),
         k("ka", 20, 200, 1, 7), k("kb", 30, 50, 3, 8), k("kc", 222, 50, 5, 8),
         {"ph": "X", "cat": "cuda_sync", "name": "Stream Wait Event", "pid": 0, "tid": 8, "ts": 28, "dur": 0,
          "args": {"correlation": 4, "cuda_sync_kind": "Stream Wait Event", "stream": 8, "wait_on_stream": 7,
                   "wait_on_cuda_event_record_corr_id": 2, "device": 0}}],
        "ProfilerStep#1", 0, 272,
        {"host": 10, "launch_latency": 10, "gpu_compute": 250, "dependency": 2}, {"cpu_op": 10}),
    # blocking sync: k2 <- launch [145,155] <- aten::y [118,145] <- sync return [115,118] <- k1
    # [15,115] <- launch [5,15] <- aten::x [0,5]; the 103 µs blocked in the sync are off the path
    "f4_blocking_sync": (
        [step(1, 0, 150), op("aten::x", 0, 11), rt("cudaLaunchKernel", 5, 5, 1), rt("cudaDeviceSynchronize", 12, 106, 2),
         op("aten::y", 118, 32), rt("cudaLaunchKernel", 145, 5, 3), k("k1", 15, 100, 1), k("k2", 155, 20, 3)],
        "ProfilerStep#1", 0, 175,
        {"host": 32, "launch_latency": 20, "gpu_compute": 120, "sync_return": 3}, {"cpu_op": 32}),
    # overlap scheduler: step 2's prepare_inputs runs while step 1's kernel runs; the path
    # starts at the previous step's GPU end 300: gap [300,301], k_step2 [301,401]
    "f5_overlap_hides_prep": (
        [step(1, 40, 60), op("execute_model", 40, 20), rt("cudaLaunchKernel", 50, 5, 1), step(2, 100, 100),
         op("prepare_inputs", 100, 80), op("execute_model", 180, 10), rt("cudaLaunchKernel", 180, 5, 2),
         k("k_step1", 60, 240, 1), k("k_step2", 301, 100, 2)],
        "ProfilerStep#2", 300, 401, {"gpu_compute": 100, "gpu_gap": 1}, {}),
    # the overlap breaks: prepare_inputs ends at 380, after the previous step's GPU end (300):
    # its last 80 µs are on the path
    "f5b_overlap_breaks": (
        [step(1, 40, 60), op("execute_model", 40, 20), rt("cudaLaunchKernel", 50, 5, 1), step(2, 100, 300),
         op("prepare_inputs", 100, 280), op("execute_model", 380, 10), rt("cudaLaunchKernel", 380, 5, 2),
         k("k_step1", 60, 240, 1), k("k_step2", 390, 100, 2)],
        "ProfilerStep#2", 300, 490, {"host": 80, "launch_latency": 10, "gpu_compute": 100}, {"cpu_op": 80}),
    # graph replay: k4 <- g3 (switch 1) <- g2 (graph 1) <- g1 (graph 1) <- cudaGraphLaunch
    # [10,40] <- host [0,10]: every replayed kernel is on the path
    "f6_graph_replay": (
        [step(1, 0, 45), op("forward", 0, 45), rt("cudaGraphLaunch", 10, 20, 1), rt("cudaLaunchKernel", 35, 5, 2),
         k("g1", 40, 20, 1), k("g2", 61, 30, 1), k("g3", 92, 10, 1), k("k4", 103, 10, 2)],
        "ProfilerStep#1", 0, 113,
        {"host": 10, "launch_latency": 30, "gpu_compute": 70, "gpu_gap": 3}, {"cpu_op": 10}),
}


def trace_doc(events: list[dict]) -> dict:
    return {"schemaVersion": 1, "deviceProperties": [{"id": 0, "name": "synthetic"}], "traceEvents": events}


def analysis(name: str, tmp: Path):
    """The analysis of fixture ``name`` (written under ``tmp``) and the step row of its window."""
    events = FIXTURES[name][0]
    p = tmp / f"{name}.json"
    p.write_text(json.dumps(trace_doc(events)))
    a = run_analysis(str(p), OPTIONS)
    row = [i for i, s in enumerate(a.report.steps) if s.name == FIXTURES[name][1]][0]
    return a, row
