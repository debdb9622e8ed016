"""Issue 15, loader side and command robustness: each case is a fixture built here (inline, or
a real shared trace loaded, changed and written to tmp_path) with its exact expected outcome.

Numbers in comments are derived by hand from the fixture; numbers of real traces are the
ones the unchanged trace gives (asserted on it in the same test)."""
from __future__ import annotations

import copy
import gzip
import json
import os
import socket
import subprocess
import sys
import zlib
from pathlib import Path

import msgspec
import pandas as pd
import pytest
from click.testing import CliRunner

from conftest import PRINT_PEAK_RSS_BYTES, shared_trace, sweep
from diagnose.cli import main
from diagnose.errors import TraceFormatError
from diagnose.pipeline import run_analysis
from diagnose.trace import load_trace, split_ranks
from diagnose.trace import reading
from diagnose.trace.apis import api_kind

DECODE = "nano-vllm-zhang-yuhui/profile_results/decode_gpu_0.json"


def _run(args, **kw):
    return CliRunner().invoke(main, args, **kw)


def _codes(t) -> dict:
    return {q.code: q.count for q in t.quality}


def _one_error_line(r) -> str:
    """The CLI's answer to bad input: exit 2 and exactly one ``error: ...`` line."""
    assert r.exit_code == 2, (r.exit_code, r.output)
    lines = r.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "Traceback" not in r.output
    return lines[0]


def _decode_doc() -> dict:
    return msgspec.json.decode(shared_trace(DECODE).read_bytes())


def _write(path: Path, doc) -> str:
    path.write_bytes(msgspec.json.encode(doc))
    return str(path)


def _phase_numbers(a) -> list:
    return [(p["name"], p["device"], p["steps"], p["launch_gap_share"], p["gpu_idle_share"], p["gpu_busy_ms"],
             p["window_ms"], p["kernel_count"]) for p in a.to_dict()["phases"]]


# 1. Non-CUDA backends ----------------------------------------------------------------------
# The CUDA original: one decode step, 17 kernels + 11 memcpy, launch-gap share 0.433297: the
# 0.926753 ms of its 2.13884 ms window that is dispatch (issue 22: the CPU attention is
# host_compute, the sync-serialized gaps host_blocked; tests/test_host_causes.py).
CUDA_PHASES = [("all", 0, 1, 0.433297, 0.946215, 0.115038, 2.13884, 17),
               ("decode", 0, 1, 0.433297, 0.946215, 0.115038, 2.13884, 17)]


@pytest.mark.parametrize("runtime_cat, driver_cat", sweep([
    ("xpu_runtime", "xpu_driver"),
    ("privateuse1_runtime", "privateuse1_driver"),
    ("mtia_runtime", "mtia_runtime"),
], {0}))
def test_backend_runtime_categories_link_like_cuda(tmp_path, runtime_cat, driver_cat):
    doc = _decode_doc()
    original = run_analysis(str(shared_trace(DECODE)))
    assert _phase_numbers(original) == CUDA_PHASES
    n = 0
    for e in doc["traceEvents"]:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            e["cat"] = runtime_cat if e["cat"] == "cuda_runtime" else driver_cat
            n += 1
    assert n == 41 + 12  # every host call of the trace now under the other backend's categories
    renamed = run_analysis(_write(tmp_path / "backend.json", doc))
    assert _phase_numbers(renamed) == CUDA_PHASES
    assert renamed.to_dict()["launches"] == original.to_dict()["launches"]
    t = load_trace(str(tmp_path / "backend.json"))
    assert len(t.runtime) == 53


def test_xpu_launch_api_names_classify():
    assert [api_kind(n) for n in ("urEnqueueKernelLaunch", "piEnqueueKernelLaunch", "zeCommandListAppendLaunchKernel",
                                  "zeCommandListAppendLaunchCooperativeKernel")] == ["launch"] * 4
    assert [api_kind(n) for n in ("urEnqueueUSMMemcpy", "zeCommandListAppendMemoryCopy")] == ["memcpy"] * 2
    assert [api_kind(n) for n in ("urEnqueueUSMFill", "zeCommandListAppendMemoryFill")] == ["memset"] * 2
    assert [api_kind(n) for n in ("urQueueFinish", "zeEventHostSynchronize")] == ["sync"] * 2
    assert api_kind("urCommandBufferEnqueueExp") == "graph_launch"  # a SYCL graph replay


def test_xpu_inline_trace_counts_launches(kineto, tmp_path):
    b = kineto()
    # two kernels, each launched by a Unified Runtime call under xpu_runtime; the second
    # launch call ends at 25 µs, after the GPU went idle at 15 µs: a launch gap
    b.launch("gemm_xpu", 10, 5, launch_ts=0, api="urEnqueueKernelLaunch")
    b.launch("gemm_xpu", 40, 5, launch_ts=20, launch_dur=5, api="urEnqueueKernelLaunch")
    for e in b.events:
        if e["cat"] == "cuda_runtime":
            e["cat"] = "xpu_runtime"
    t = load_trace(str(b.write(tmp_path / "xpu.json")))
    assert t.runtime["api_kind"].tolist() == ["launch", "launch"]
    a = run_analysis(str(tmp_path / "xpu.json"))
    assert a.to_dict()["launches"]["host_launch_calls"] == 2


# 2. Several ranks merged into one file -----------------------------------------------------
def _remapped(doc: dict, ts_shift_us: float) -> dict:
    """Another rank of the same run: its correlation and external ids are rank 0's ids in
    reverse order (each id exists in both ranks, on different calls), its times shifted."""
    d = copy.deepcopy(doc)
    remap = {}
    for k in ("correlation", "External id"):
        ids = sorted({e["args"][k] for e in d["traceEvents"] if isinstance(e.get("args"), dict) and isinstance(e["args"].get(k), int)})
        remap[k] = dict(zip(ids, reversed(ids)))
    for e in d["traceEvents"]:
        a = e.get("args")
        if isinstance(a, dict):
            for k in ("correlation", "External id"):
                if isinstance(a.get(k), int):
                    a[k] = remap[k][a[k]]
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] += ts_shift_us
    return d


def _merge(ranks: list[tuple[str, dict]]) -> dict:
    """What SGLang's ProfileMerger writes: every pid prefixed with "[LABEL] ", events of the
    ranks concatenated, deviceProperties concatenated, other keys from the first rank."""
    out = {k: v for k, v in ranks[0][1].items() if k not in ("traceEvents", "deviceProperties")}
    out["traceEvents"], out["deviceProperties"] = [], []
    for label, d in ranks:
        for e in copy.deepcopy(d["traceEvents"]):
            e["pid"] = f"[{label}] {e.get('pid')}"
            out["traceEvents"].append(e)
        out["deviceProperties"] += d["deviceProperties"]
    return out


@pytest.fixture
def merged_ranks(tmp_path):
    doc = _decode_doc()
    # rank 1: every id collides with one of rank 0's, on another call; times shifted by
    # 0.7 ms (its kernels then fall into rank 0's launch gaps)
    r1 = _remapped(doc, 700.0)
    p0, p1 = _write(tmp_path / "rank0.json", doc), _write(tmp_path / "rank1.json", r1)
    merged = _write(tmp_path / "merged.json", _merge([("TP00-DP00-PP00-EP00", doc), ("TP01-DP00-PP00-EP00", r1)]))
    return merged, p0, p1


def test_merged_ranks_detected_and_never_cross_linked(merged_ranks):
    merged, p0, p1 = merged_ranks
    t = load_trace(merged)
    assert t.ranks == ["TP00-DP00-PP00-EP00", "TP01-DP00-PP00-EP00"]
    assert _codes(t)["ranks_merged"] == 2
    single0, single1 = load_trace(p0), load_trace(p1)
    raw0 = set(single0.gpu["correlation"]) | set(single0.runtime["correlation"])
    raw1 = set(single1.gpu["correlation"]) | set(single1.runtime["correlation"])
    assert raw0 == raw1 and len(raw0 - {-1}) == 53  # every id of one rank is also an id of the other
    # every kernel's correlation id names a launch of its own rank only
    rt = t.runtime.set_index("correlation")["rank"]
    linked = t.gpu[t.gpu["correlation"].isin(rt.index)]
    assert len(linked) == 2 * 28  # 17 kernels + 11 memcpy per rank, all linked
    assert (rt.loc[linked["correlation"]].to_numpy() == linked["rank"].to_numpy()).all()
    # pids lose their label: the GPU's pid is the device index again
    assert set(t.gpu["pid"]) == {0}


def test_split_ranks_equals_each_rank_alone(merged_ranks):
    merged, p0, p1 = merged_ranks
    whole = load_trace(merged)
    parts = split_ranks(whole)
    assert [label for label, _ in parts] == ["TP00-DP00-PP00-EP00", "TP01-DP00-PP00-EP00"]
    for (label, part), single_path in zip(parts, (p0, p1)):
        single = load_trace(single_path)
        for f in ("gpu", "runtime", "cpu_ops", "annotations", "gpu_syncs", "overhead"):
            pd.testing.assert_frame_equal(getattr(part, f), getattr(single, f), obj=f"{label} {f}")
        assert part.devices == single.devices  # each rank listed the same devices: listed once
        assert part.counts == single.counts == {"python_function": 2199, "python_function_ns": 116654890}
        assert part.ranks == [] and "ranks_merged" not in _codes(part)
        assert part.metadata["merged_rank"] == label
    assert "rank" in whole.gpu.columns  # split_ranks left the merged trace as it was
    assert split_ranks(load_trace(p0))[0][0] == ""  # a trace of one rank comes back whole


def test_merged_ranks_fleet_rows_equal_single_rank_runs(merged_ranks):
    from diagnose.analyzers import analyze
    from diagnose.multi import analyze_merged

    merged, p0, p1 = merged_ranks
    fleet = analyze_merged(merged)
    assert [(r["rank"], r["label"], r["rank_source"], r["world_size"]) for r in fleet["ranks"]] == [
        (0, "TP00-DP00-PP00-EP00", "merged", 2), (1, "TP01-DP00-PP00-EP00", "merged", 2)]
    assert fleet["errors"] == [] and fleet["failed"] == 0
    for report, single_path in zip(fleet["reports"], (p0, p1)):
        single = analyze(load_trace(single_path)).to_dict()
        assert report["phases"] == single["phases"]
        assert report["latency"] == single["latency"]
        assert [p["launch_gap_share"] for p in report["phases"]] == [0.433297, 0.433297]


# 3. Two processes on one GPU ---------------------------------------------------------------
def test_two_processes_on_one_gpu_each_with_stream_7(kineto, tmp_path):
    b = kineto()
    # process 100: one 30 ms kernel on device 0, stream 7
    b.kernel("long_gemm", 0, 30_000)
    b.events[-1]["pid"] = 100
    # process 200 (MPS, same GPU): five 2 ms kernels at 5, 10, 15, 20, 25 ms, also stream 7
    for i in range(5):
        b.kernel("short_k", 5_000 * (i + 1), 2_000)
        b.events[-1]["pid"] = 200
    a = run_analysis(str(b.write(tmp_path / "mps.json")))
    p = a.phase("all")
    # busy = union = [0, 30) ms = the window: 0 % idle. Keyed by (device, stream) only, the
    # 30 ms kernel was "clipped" at 5 ms as a late completion: busy 5 + 10 = 15 of 27 ms.
    assert (p.gpu_busy_ms, p.window_ms, p.gpu_idle_share) == (30.0, 30.0, 0.0)
    assert "deferred_completion_clipped" not in _codes(a)
    assert sorted(load_trace(str(tmp_path / "mps.json")).gpu["pid"].unique().tolist()) == [100, 200]


# 4. "ph": "X" without "dur" ----------------------------------------------------------------
def test_missing_duration_excluded_and_counted(kineto, tmp_path):
    b = kineto()
    b.kernel("a", 10, 5).kernel("zero", 20, 0).kernel("b", 30, 5)
    del b.kernel("no_dur_1", 40, 1).events[-1]["dur"]
    del b.kernel("no_dur_2", 50, 1).events[-1]["dur"]
    t = load_trace(str(b.write(tmp_path / "t.json")))
    assert t.gpu["name"].tolist() == ["a", "zero", "b"]  # an explicit dur 0 is kept
    assert _codes(t)["missing_duration"] == 2
    q = next(q for q in t.quality if q.code == "missing_duration")
    assert q.message == "2 complete events without a 'dur' excluded (not counted as zero-length)"


# 7. Step markers as B/E pairs --------------------------------------------------------------
def _steps_as(kineto, style: str):
    """Four decode steps of 100 µs, each launching one 30 µs kernel 20 µs in; a nested range
    inside each step; written as X events or as B/E pairs."""
    b = kineto()
    for i in range(4):
        t0 = 1000 * i
        b.launch("flash_fwd_splitkv_kernel", t0 + 20, 30, launch_ts=t0 + 5)
        for name, ts, dur in (("step[DECODE bs=8]", t0, 100), ("inner", t0 + 10, 50)):
            if style == "X":
                b.annotation(name, ts, dur)
            else:
                b.events.append({"ph": "B", "cat": "user_annotation", "name": name, "pid": 100, "tid": 100, "ts": ts})
    if style == "BE":  # the E events, in time order per thread (inner closes before its step)
        ends = sorted([(1000 * i + 60) for i in range(4)] + [(1000 * i + 100) for i in range(4)])
        b.events += [{"ph": "E", "pid": 100, "tid": 100, "ts": ts} for ts in ends]
    return b


def test_begin_end_pairs_are_ranges(kineto, tmp_path):
    x = load_trace(str(_steps_as(kineto, "X").write(tmp_path / "x.json")))
    be_b = _steps_as(kineto, "BE")
    be = load_trace(str(be_b.write(tmp_path / "be.json")))
    cols = ["name", "start_ns", "end_ns", "pid", "tid"]
    pd.testing.assert_frame_equal(be.annotations[cols], x.annotations[cols])
    assert be.annotations["name"].tolist()[:2] == ["step[DECODE bs=8]", "inner"]
    assert (be.annotations["end_ns"] - be.annotations["start_ns"]).tolist() == [100_000, 50_000] * 4
    ax, abe = run_analysis(str(tmp_path / "x.json")), run_analysis(str(tmp_path / "be.json"))
    assert abe.phase("decode").step_count == ax.phase("decode").step_count == 4
    assert abe.to_dict()["latency"] == ax.to_dict()["latency"]
    assert "unmatched_begin_end" not in _codes(be)


def test_unmatched_begin_end_dropped_and_counted(kineto, tmp_path):
    b = _steps_as(kineto, "BE")
    b.events.append({"ph": "E", "pid": 100, "tid": 300, "ts": 5})  # an end with no begin on its thread
    b.events.append({"ph": "B", "cat": "user_annotation", "name": "never_ends", "pid": 100, "tid": 100, "ts": 4000})
    b.events.append({"ph": "B", "cat": "cpu_op", "name": "aten::mm", "pid": 100, "tid": 101, "ts": 7})  # a B/E op ...
    b.events.append({"ph": "E", "pid": 100, "tid": 101, "ts": 9.5})  # ... becomes a 2.5 µs cpu_op
    t = load_trace(str(b.write(tmp_path / "t.json")))
    assert _codes(t)["unmatched_begin_end"] == 2
    assert len(t.annotations) == 8 and "never_ends" not in set(t.annotations["name"])
    assert t.cpu_ops[["name", "start_ns", "end_ns"]].values.tolist() == [["aten::mm", 7000, 9500]]


# 9. Numbers beyond float64 ------------------------------------------------------------------
def test_out_of_range_numbers_drop_three_kernels(tmp_path):
    text = shared_trace(DECODE).read_bytes()
    original = load_trace(str(shared_trace(DECODE)))
    doc = msgspec.json.decode(text)
    kernels = [e for e in doc["traceEvents"] if e.get("cat") == "kernel"][:3]
    out = text
    for e in kernels:  # the three first kernels' ts written as 1e400 (no JSON library emits it)
        old = b'"ts": ' + msgspec.json.encode(e["ts"]) if b'"ts": ' in out else b'"ts":' + msgspec.json.encode(e["ts"])
        assert out.count(old) >= 1
        out = out.replace(old, old.split(b":")[0] + b": 1e400", 1)
    p = tmp_path / "oor.json"
    p.write_bytes(out)
    t = load_trace(str(p))
    assert len(t.gpu) == len(original.gpu) - 3 == 25
    assert _codes(t)["out_of_range_value"] == 3
    assert len(t.runtime) == len(original.runtime) and len(t.cpu_ops) == len(original.cpu_ops)
    r = _run(["run", "--trace", str(p), "--format", "json"])
    assert r.exit_code == 0, r.output
    assert {q["code"]: q.get("count") for q in json.loads(r.output)["quality"]}["out_of_range_value"] == 3


def test_out_of_range_in_args_and_legacy_list(kineto, tmp_path):
    b = kineto()
    b.launch("k1", 10, 5, launch_ts=0).launch("k2", 30, 5, launch_ts=20).launch("k3", 50, 5, launch_ts=40)
    text = json.dumps(b.events).replace('"correlation": 1002}', '"correlation": 1e999}', 1)  # the 2nd launch call
    (tmp_path / "l.json").write_text(text)
    t = load_trace(str(tmp_path / "l.json"))
    assert _codes(t)["out_of_range_value"] == 1 and "legacy_event_list" in _codes(t)
    assert t.runtime["correlation"].tolist() == [1001, 1003] and len(t.gpu) == 3


# 10. Deep nesting ----------------------------------------------------------------------------
@pytest.mark.parametrize("text", [
    '{"traceEvents": [' + "[" * 100_000 + "]" * 100_000 + "]}",
    "[" * 100_000 + "]" * 100_000,
    '{"traceEvents": [{"ph": "X", "cat": "kernel", "ts": 1, "dur": 1, "args": ' + '{"a": ' * 100_000 + "1" + "}" * 100_000 + "}]}",
])
def test_deep_nesting_is_one_line_exit_2(tmp_path, text):
    p = tmp_path / "deep.json"
    p.write_text(text)
    line = _one_error_line(_run(["run", "--trace", str(p)]))
    assert line == f"error: {p}: JSON nested too deeply to decode (thousands of levels of arrays/objects): not a profiler trace"


# 11. Gzip bomb -------------------------------------------------------------------------------
def _bomb(path: Path, inflated_mib: int, head: bytes = b'{"traceEvents": [', tail: bytes = b"]}") -> Path:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    chunk = b" " * (1 << 20)
    with open(path, "wb") as f:
        f.write(c.compress(head))
        for _ in range(inflated_mib):
            f.write(c.compress(chunk))
        f.write(c.compress(tail))
        f.write(c.flush())
    return path


@pytest.mark.slow
def test_gzip_bomb_refused_with_bounded_memory(tmp_path):
    bomb = _bomb(tmp_path / "bomb.json.gz", 1024)  # 1 GiB of JSON whitespace
    size = bomb.stat().st_size
    assert size < 1.1e6  # ~1,000x: DEFLATE's ceiling
    code = ("import sys\n"
            "from diagnose.trace import load_trace\n"
            "from diagnose.errors import TraceFormatError\n"
            "try:\n    load_trace(sys.argv[1])\nexcept TraceFormatError as e:\n    print(e)\n"
            + PRINT_PEAK_RSS_BYTES)
    env = {k: v for k, v in os.environ.items() if k != reading.RATIO_ENV}
    out = subprocess.run([sys.executable, "-c", code, str(bomb)], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    msg, rss_bytes = out.stdout.strip().splitlines()
    limit = max(64 * 2**20, 100 * size)  # 100x the compressed size, at least 64 MiB
    assert msg == (f"{bomb}: gzip data inflates to more than {limit / 1e6:,.0f} MB from {size / 1e6:,.1f} MB (over 100x; "
                   f"real traces inflate 10-30x): refused as a likely decompression bomb; to load it anyway set "
                   f"DIAGNOSE_MAX_INFLATE_RATIO to a higher ratio (0: no limit)")
    assert int(rss_bytes) < 500e6


def test_gzip_ratio_limit_is_overridable(tmp_path, kineto, monkeypatch):
    monkeypatch.setattr(reading, "INFLATE_FLOOR_BYTES", 1 << 20)
    body = json.dumps(kineto().kernel("k", 10, 5).doc()).encode()
    bomb = _bomb(tmp_path / "padded.json.gz", 8, head=body[:-1] + b', "pad": "', tail=b'"}')  # 8 MiB, ~800x
    monkeypatch.delenv(reading.RATIO_ENV, raising=False)
    with pytest.raises(TraceFormatError, match="refused as a likely decompression bomb"):
        load_trace(str(bomb))
    monkeypatch.setenv(reading.RATIO_ENV, "2000")
    assert len(load_trace(str(bomb)).gpu) == 1
    monkeypatch.setenv(reading.RATIO_ENV, "0")  # no limit
    assert len(load_trace(str(bomb)).gpu) == 1
    monkeypatch.setenv(reading.RATIO_ENV, "lots")
    with pytest.raises(TraceFormatError, match="DIAGNOSE_MAX_INFLATE_RATIO='lots' is not a number"):
        load_trace(str(bomb))


def test_shared_traces_inflate_far_below_the_limit():
    from conftest import kineto_files

    ratios = []
    for p in kineto_files():
        if p.suffix == ".gz":
            raw = p.read_bytes()
            ratios.append(len(gzip.decompress(raw)) / len(raw))
    if not ratios:
        pytest.skip("shared trace corpus not available")
    # real traces compress 7-31x (MANIFEST sizes); the limit sits far above the largest
    assert 5 < min(ratios) and max(ratios) < 31 < reading.MAX_INFLATE_RATIO / 3


# 13. Web server inputs ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def app_state():
    pytest.importorskip("dash")
    from diagnose.app.server import build_state

    return build_state([str(shared_trace(DECODE))])


def test_timeline_zoom_with_huge_or_bad_ranges(app_state):
    from diagnose.app.server import timeline_zoom

    span_ms = 2.871429  # the timeline's span: from the trace start (its origin) to the last GPU activity's end
    fig = timeline_zoom(app_state, {"xaxis.range[0]": -1e308, "xaxis.range[1]": 1e308}, "0")
    assert tuple(fig.layout.xaxis.range) == (-span_ms, 2 * span_ms)  # clipped to one span either side
    for bad in ({"xaxis.range[0]": "nan", "xaxis.range[1]": 1}, {"xaxis.range": [float("inf"), 1]}):
        fig = timeline_zoom(app_state, bad, "0")
        assert [a.text for a in fig.layout.annotations] == ["zoom ignored: the range was not two finite numbers"]
        assert tuple(fig.layout.xaxis.range) == (0, span_ms)
    fig = timeline_zoom(app_state, {"xaxis.range[0]": 50, "xaxis.range[1]": 60}, "0")
    assert [a.text for a in fig.layout.annotations] == ["zoom ignored: the range lies outside the trace (0 to 2.871 ms)"]


def test_kv_calculator_inputs_bounded(app_state):
    import time

    from diagnose.app.server import kv_output, kv_view

    ref = [32, 4096, 32, 8, 128, 11008, 32000]

    def err(*args):
        d = kv_view(*args)
        assert d["ok"] is False
        kv_output(d)  # renders the inline message
        return d["error"]

    t0 = time.process_time()
    assert err("7b", "", *ref, [], 80, 5, ", ".join(["2048"] * 200_000), "fp16", "bf16") == "context lengths: at most 2,000 characters"
    assert err("7b", "", *ref, [], 80, 5, ",".join(["8"] * 65), "fp16", "bf16") == "at most 64 context lengths at once"
    assert time.process_time() - t0 < 1.0
    assert err("7b", "", *ref, [], 80, 5, "2000000000", "fp16", "bf16") == "context '2000000000': at most 1,000,000,000 tokens"
    assert err("custom", "", 1e308, *ref[1:], [], 80, 5, "2048", "fp16", "bf16") == \
        "layers (num_hidden_layers) must be a number from 0 to 10,000,000, got 1e+308"
    assert err("custom", "", *ref[:6], float("nan"), [], 80, 5, "2048", "fp16", "bf16") == \
        "vocab_size must be a number from 0 to 10,000,000, got nan"
    assert err("7b", "", *ref, [], float("inf"), 5, "2048", "fp16", "bf16") == \
        "device memory (GB) must be a number from 0 to 1,000,000, got inf"
    assert err("7b", "", *ref, [], 80, -1e308, "2048", "fp16", "bf16") == \
        "overhead (GB) must be a number from 0 to 1,000,000, got -1e+308"
    assert err("7b", "", *ref, [], 80, 5, "2048", "fp99", "bf16") == "KV dtype must be one of fp32, fp16, bf16, fp8, int8, int4"
    ok = kv_view("7b", "", *ref, [], 80, 5, ",".join(["2k"] * 64), "fp16", "bf16")
    assert err("file", "x" * 3000, *ref, [], 80, 5, "2048", "fp16", "auto") == "give a config.json path (or a shipped config name)"
    assert ok["ok"] and len(ok["rows"]) == 64 and ok["kv_bytes_per_token"] == 2 * 32 * 8 * 128 * 2


def test_router_ignores_non_text_paths(app_state):
    from diagnose.app.server import nav_classes, render_page

    assert nav_classes({"x": 1}) == nav_classes("/")
    assert render_page(app_state, ["/kv"], "0") is not None


# 14. Empty traces, --window outside the trace ------------------------------------------------
@pytest.mark.parametrize("text", ['{"traceEvents": []}', "[]", '{"schemaVersion": 1, "traceEvents": [], "deviceProperties": []}'])
def test_empty_trace_is_an_error(tmp_path, text):
    p = tmp_path / "empty.json"
    p.write_text(text)
    assert _one_error_line(_run(["run", "--trace", str(p)])) == f"error: {p}: no events: the trace's event list is empty"


def test_window_outside_the_trace_gives_its_span(kineto, tmp_path):
    b = kineto()
    b.kernel("k", 0, 100).kernel("k", 2_500, 100)  # the trace spans 0 to 2.6 ms
    p = str(b.write(tmp_path / "w.json"))
    assert _one_error_line(_run(["run", "--trace", p, "--window", "5:10"])) == \
        "error: --window 5:10 selects no event: the trace spans 0 to 2.600 ms from its start"
    assert _one_error_line(_run(["run", "--trace", p, "--window", "1:2"])) == \
        "error: --window 1:2 selects no event: the trace spans 0 to 2.600 ms from its start"
    r = _run(["run", "--trace", p, "--window", "2:", "--format", "json"])
    assert r.exit_code == 0 and [ph["kernel_count"] for ph in json.loads(r.output)["phases"] if ph["name"] == "all"] == [1]


# 15. A value that is not a number ------------------------------------------------------------
def test_bad_duration_value_excluded_and_counted(kineto, tmp_path):
    b = kineto()
    b.kernel("a", 10, 5).kernel("abc", 20, "abc").kernel("b", 30, 5).kernel("text_ok", 40, "2.5")
    b.kernel("nan_text", 50, "NaN").kernel("list", 60, [1])
    t = load_trace(str(b.write(tmp_path / "t.json")))
    assert t.gpu["name"].tolist() == ["a", "b", "text_ok"]  # "2.5" is a number written as text
    assert t.gpu["end_ns"].tolist() == [15_000, 35_000, 42_500]
    assert _codes(t)["bad_value"] == 3


# 16. A failed rank, Ctrl-C ------------------------------------------------------------------
def test_fleet_names_the_failed_rank(kineto, tmp_path):
    from diagnose.multi import analyze_many

    for r in range(2):
        kineto().launch("k", 10, 5, launch_ts=0).write(tmp_path / f"rank-{r}.json")
    (tmp_path / "rank-2.json").write_text('{"traceEvents": [')
    res = analyze_many(str(tmp_path), executor="serial")
    assert [row["rank"] for row in res["ranks"]] == [0, 1]
    assert res["failed"] == 1 and len(res["errors"]) == 1
    assert res["errors"][0]["rank"] == 2 and res["errors"][0]["path"].endswith("rank-2.json")


def test_ctrl_c_exits_130():
    import click

    from diagnose.cliutil import OneLineGroup

    @click.group(cls=OneLineGroup)
    def g():
        pass

    @g.command()
    def work():
        raise KeyboardInterrupt

    @g.command()
    def declined():
        raise click.Abort()

    r = CliRunner().invoke(g, ["work"])
    assert (r.exit_code, r.output.strip()) == (130, "interrupted")
    r = CliRunner().invoke(g, ["declined"])  # an Abort that is not Ctrl-C keeps its status
    assert (r.exit_code, r.output.strip()) == (1, "aborted")


@pytest.mark.skipif(sys.platform == "win32", reason="POSIX signals")
def test_ctrl_c_of_a_real_run_exits_130(tmp_path):
    # the user presses Ctrl-C while the trace is being decoded
    # A shell that starts a job in the background (``cmd &``) hands it SIGINT ignored, and the
    # child inherits that: restore Python's own handler, as a terminal's foreground job has it.
    code = ("import signal, os, threading\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "import diagnose.trace.kineto as k\n"
            "def slow(*a, **kw):\n    os.kill(os.getpid(), signal.SIGINT)\n    threading.Event().wait(30)\n"
            "k.load_kineto = slow\n"
            "from diagnose.cli import main\n"
            "main(['run', '--trace', __import__('sys').argv[1]])\n")
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1}]}')
    out = subprocess.run([sys.executable, "-c", code, str(trace)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 130, (out.returncode, out.stderr)
    assert out.stderr.strip() == "interrupted"


# 17. serve --port ------------------------------------------------------------------------------
def test_serve_port_0_picks_a_free_port_and_busy_port_is_one_line(tmp_path, kineto, monkeypatch):
    pytest.importorskip("dash")
    import dash

    trace = str(kineto().launch("k", 10, 5, launch_ts=0).write(tmp_path / "t.json"))
    ran = {}
    monkeypatch.setattr(dash.Dash, "run", lambda self, **kw: ran.update(kw))
    r = _run(["serve", "--trace", trace, "--port", "0"])
    assert r.exit_code == 0, r.output
    port = ran["port"]
    assert port != 0 and port != 8050
    assert f"on http://127.0.0.1:{port}/" in r.output
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        taken = busy.getsockname()[1]
        ran.clear()
        r = _run(["serve", "--trace", trace, "--port", str(taken)])
        assert _one_error_line(r) == (f"error: port {taken} on 127.0.0.1 is already in use: choose another with --port "
                                      "(--port 0 picks a free one)")
        assert ran == {}  # the server was never started


# Loader additions for the verdicts work (issue 13) --------------------------------------------
def test_overhead_events_and_python_function_counts():
    p = shared_trace("nano-vllm-zhang-yuhui/forward_10.json")
    doc = msgspec.json.decode(p.read_bytes())
    py = [e for e in doc["traceEvents"] if e.get("cat") == "python_function" and e.get("ph") == "X"]
    t = load_trace(str(p))
    assert t.counts == {"python_function": len(py), "python_function_ns": sum(round(e["dur"] * 1000) for e in py)}
    assert t.counts["python_function"] == 789
    assert t.overhead["name"].tolist() == ["Activity Buffer Request"]
    ov = next(e for e in doc["traceEvents"] if e.get("cat") == "overhead")
    assert int(t.overhead["end_ns"].iloc[0] - t.overhead["start_ns"].iloc[0]) == round(ov["dur"] * 1000)
    assert t.overhead.dtypes.astype(str).to_dict() == {"name": "category", "start_ns": "int64", "end_ns": "int64",
                                                       "pid": "int64", "tid": "int64"}


def test_overhead_frame_empty_with_columns(kineto, tmp_path):
    t = load_trace(str(kineto().kernel("k", 1, 1).write(tmp_path / "t.json")))
    assert list(t.overhead.columns) == ["name", "start_ns", "end_ns", "pid", "tid"] and len(t.overhead) == 0
    assert t.counts == {"python_function": 0, "python_function_ns": 0}
