"""Fleet analysis (diagnose.multi): discovery, executors (serial, process pool, Dask), stragglers, errors."""
from __future__ import annotations

import gzip
import json
import shutil
import sys
from pathlib import Path

import pytest
from rich.console import Console

from diagnose.errors import DiagnoseError
from diagnose.multi import analyze_many, analyze_one, discover, find_stragglers
from diagnose.report.fleet import render_fleet

SHARED_TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"

# Eight different real Kineto traces (some with decode steps, several ranks/vendors), as ranks 0..7.
FLEET = [
    "tracelens/vllm_decode_full/graph_execution.json.gz",
    "hta/nccl_parser_config/nccl_data.json.gz",
    "hta/timeline_analysis/sampled_rank-0.json.gz",
    "tracelens/torch_compile_triton/trace.json.gz",
    "tracelens/mi210/gpu_only_trace.json.gz",
    "hta/critical_path_alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
    "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz",
    "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz",
]


@pytest.fixture(scope="module")
def fleet_dir(tmp_path_factory) -> Path:
    if not SHARED_TRACES.exists():
        pytest.skip(f"shared trace corpus not available: {SHARED_TRACES}")
    d = tmp_path_factory.mktemp("fleet")
    # Written in reverse so that the directory listing order is not the rank order by chance.
    for rank in reversed(range(len(FLEET))):
        src = SHARED_TRACES / FLEET[rank]
        if not src.exists():
            pytest.skip(f"shared trace missing: {src}")
        shutil.copyfile(src, d / f"rank-{rank}.json.gz")
    return d


@pytest.fixture(scope="module")
def serial_result(fleet_dir):
    return analyze_many(discover(str(fleet_dir)), executor="serial")


def decode_trace(kineto, path: Path, period_us: float, n_steps: int = 12, kernels: int = 4) -> Path:
    """Decode steps every ``period_us``; each step's GPU work ends at a fixed offset in its
    period, so every TPOT sample (interval between step completions) equals the period."""
    b = kineto()
    kd = period_us / 10
    for i in range(n_steps):
        t = 1000 + period_us * i
        b.annotation("diagnose:decode[bs=8 ctx=2048]", t, 20)
        for j in range(kernels):
            b.launch(f"gemv_kernel_{j}", t + 10 + kd * j, kd, launch_ts=t + 1 + 2 * j, launch_dur=1)
    return b.write(path)


def _phases_latency(reports):
    return [(r["source"]["path"], r["rank"], r["phases"], r["latency"]) for r in reports]


# ---------------------------------------------------------------- discovery


def test_discover_orders_by_rank_in_name_then_trace_then_name(tmp_path):
    for n in ("rank-10.json", "rank_2.pt.trace.json.gz", "worker.rank3.sqlite", "zeta.json", "alpha.json.gz",
              "notes.txt", ".hidden.json"):
        doc = b'{"traceEvents": []}'
        (tmp_path / n).write_bytes(gzip.compress(doc) if n.endswith(".gz") else doc)
    # No rank in the name, but Kineto's distributedInfo near the top of the file.
    (tmp_path / "trace_b.json").write_text(json.dumps({"schemaVersion": 1, "distributedInfo": {"backend": "nccl", "rank": 5}, "traceEvents": []}))
    (tmp_path / "sidecar.json").write_text(json.dumps([{"file": "x.json.gz", "batch_size": 32}]))
    (tmp_path / "report1.sqlite").write_bytes(b"SQLite format 3\x00")
    (tmp_path / "report1.nsys-rep").write_bytes(b"x")  # its .sqlite export is there: not listed twice
    (tmp_path / "other.nsys-rep").write_bytes(b"x")
    (tmp_path / "sub.json").mkdir()
    (tmp_path / "config.json").write_text(json.dumps({"model": "x"}))  # a sidecar object
    got = [Path(p).name for p in discover(str(tmp_path))]
    assert got == ["rank_2.pt.trace.json.gz", "worker.rank3.sqlite", "trace_b.json", "rank-10.json",
                   "alpha.json.gz", "other.nsys-rep", "report1.sqlite", "zeta.json"]


def test_discover_keeps_corrupt_json_so_it_is_reported(tmp_path):
    (tmp_path / "rank-0.json").write_bytes(b'{"traceEvents": [')
    (tmp_path / "rank-1.json").write_bytes(b"\x00garbage")
    assert [Path(p).name for p in discover(str(tmp_path))] == ["rank-0.json", "rank-1.json"]


def test_discover_missing_empty_and_file(tmp_path):
    with pytest.raises(DiagnoseError, match="no such directory") as e:
        discover(str(tmp_path / "nope"))
    assert "\n" not in str(e.value)
    with pytest.raises(DiagnoseError, match="no trace files"):
        discover(str(tmp_path))
    (tmp_path / "readme.txt").write_text("x")
    with pytest.raises(DiagnoseError, match="no trace files"):
        analyze_many(str(tmp_path))
    with pytest.raises(DiagnoseError, match="not a directory"):
        discover(str(tmp_path / "readme.txt"))
    with pytest.raises(DiagnoseError, match="no trace files"):
        analyze_many([])


# ---------------------------------------------------------------- straggler rule


@pytest.mark.parametrize(
    "values, flagged, median, mad",
    [
        # Identical ranks and one 50 % slower: MAD 0, the 10 % floor decides.
        ([10.0, 10.0, 10.0, 10.0, 15.0], [4], 10.0, 0.0),
        # 5 % slower than identical peers: under the 10 % floor.
        ([100.0, 100.0, 100.0, 100.0, 105.0], [], 100.0, 0.0),
        # Broad spread: median 11.75, MAD 1.0; 16 is +36 % and 4.25 MAD above -> flagged;
        # 13 is +10.6 % but only 1.25 MAD above -> not.
        ([10.0, 10.5, 11.0, 11.5, 12.0, 12.5, 13.0, 16.0], [7], 11.75, 1.0),
        # Uneven fleet: median 12, MAD 2; 16 is +33 % but only 2 MAD above -> not a straggler.
        ([10.0, 10.0, 12.0, 12.0, 14.0, 14.0, 16.0], [], 12.0, 2.0),
        # Only the slow side is flagged; None (metric unavailable) is ignored.
        ([1.0, 10.0, None, 10.0, 10.0], [], 10.0, 0.0),
    ],
)
def test_find_stragglers_exact(values, flagged, median, mad):
    idx, stats = find_stragglers(values)
    assert idx == flagged
    assert stats["median"] == median
    assert stats["mad"] == mad
    assert stats["compared"] == sum(v is not None for v in values)


def test_find_stragglers_needs_three_ranks():
    idx, stats = find_stragglers([1.0, 100.0])
    assert idx == [] and stats["median"] is None and "at least 3" in stats["note"]


def test_straggler_rank_is_flagged(kineto, tmp_path):
    for rank in range(4):
        decode_trace(kineto, tmp_path / f"rank-{rank}.json", period_us=1000)
    decode_trace(kineto, tmp_path / "rank-4.json", period_us=1500)  # 50 % slower
    res = analyze_many(str(tmp_path), executor="serial")
    assert res["errors"] == []
    assert [r["rank"] for r in res["ranks"]] == [0, 1, 2, 3, 4]
    assert [r["rank_source"] for r in res["ranks"]] == ["filename"] * 5
    assert [r["tpot_p50_ms"] for r in res["ranks"]] == [1.0, 1.0, 1.0, 1.0, 1.5]
    assert [r["phase"] for r in res["ranks"]] == ["decode"] * 5
    assert [r["steps"] for r in res["ranks"]] == [12] * 5
    assert [r["device"] for r in res["ranks"]] == ["NVIDIA H100 80GB HBM3"] * 5
    assert [r["straggler"] for r in res["ranks"]] == [False, False, False, False, True]
    rule = res["straggler_rule"]
    assert (rule["metric"], rule["median"], rule["mad"], rule["compared"]) == ("tpot_p50_ms", 1.0, 0.0, 5)
    assert res["stragglers"] == [{"rank": 4, "path": str(tmp_path / "rank-4.json"), "metric": "tpot_p50_ms",
                                  "value": 1.5, "median": 1.0, "excess_share": 0.5}]
    console = Console(record=True, width=220)
    render_fleet(res, console)
    out = console.export_text()
    assert "4 SLOW" in out and out.count("SLOW") == 1
    assert "straggler: rank 4 (rank-4.json) tpot_p50_ms = 1.500, median 1.000 (+50%)" in out


def test_no_straggler_among_identical_ranks(kineto, tmp_path):
    for rank in range(4):
        decode_trace(kineto, tmp_path / f"rank{rank}.json", period_us=1000)
    res = analyze_many(str(tmp_path), executor="serial")
    assert res["stragglers"] == [] and not any(r["straggler"] for r in res["ranks"])
    console = Console(record=True, width=220)
    render_fleet(res, console)
    assert "stragglers: none (tpot_p50_ms, median 1.000, MAD 0.000)" in console.export_text()


# ---------------------------------------------------------------- errors


def test_corrupt_rank_is_reported_and_others_analysed(kineto, tmp_path):
    for rank in (0, 1, 3):
        decode_trace(kineto, tmp_path / f"rank-{rank}.json", period_us=1000)
    (tmp_path / "rank-2.json").write_bytes(b"\x00\x01 not a trace")
    (tmp_path / "rank-4.json.gz").write_bytes(b"not gzip at all")
    res = analyze_many(str(tmp_path), executor="serial")
    assert [r["rank"] for r in res["ranks"]] == [0, 1, 3]
    assert len(res["reports"]) == 3
    assert [(e["rank"], Path(e["path"]).name) for e in res["errors"]] == [(2, "rank-2.json"), (4, "rank-4.json.gz")]
    for e in res["errors"]:
        assert e["error"] and "\n" not in e["error"] and len(e["error"]) <= 300
    console = Console(record=True, width=220)
    render_fleet(res, console)
    out = console.export_text()
    assert "error: rank 2 (rank-2.json)" in out and "error: rank 4 (rank-4.json.gz)" in out
    assert "Fleet: 5 trace(s), 3 analysed (serial)" in out


def test_analyze_one_never_raises(tmp_path):
    r = analyze_one(str(tmp_path / "rank-7.json"))
    assert r["rank"] == 7 and "no such file" in r["error"] and r["source"] == {"path": str(tmp_path / "rank-7.json")}


def test_analyze_one_prefers_the_trace_rank(kineto, tmp_path):
    b = kineto(distributedInfo={"backend": "nccl", "rank": 6, "world_size": 8})
    b.annotation("diagnose:decode[bs=1 ctx=16]", 0, 20).launch("gemv", 10, 50, launch_ts=1)
    p = b.write(tmp_path / "rank-1.json")
    r = analyze_one(str(p))
    assert (r["rank"], r["rank_source"], r["world_size"]) == (6, "trace", 8)
    assert "symptoms" in r and "phases" in r
    res = analyze_many([str(p)], executor="serial")
    assert "rank-1.json: file name says rank 1, trace says rank 6 (the trace's rank is used)" in res["notes"]
    assert "world_size is 8 but 1 trace(s) were given: ranks are missing" in res["notes"]


def test_bad_executor_and_missing_dask(monkeypatch, kineto, tmp_path):
    p = str(decode_trace(kineto, tmp_path / "rank-0.json", period_us=1000))
    with pytest.raises(DiagnoseError, match="unknown executor"):
        analyze_many([p], executor="threads")
    monkeypatch.setitem(sys.modules, "distributed", None)  # import distributed -> ImportError
    with pytest.raises(DiagnoseError, match=r"pip install '\.\[dask\]' in the project's checkout"):
        analyze_many([p], executor="dask")


# ---------------------------------------------------------------- executors agree (real traces)


@pytest.mark.slow  # analyses 8 real traces twice; the synthetic fleets above are the inner loop's
def test_serial_fleet_on_real_traces(fleet_dir, serial_result):
    res = serial_result
    assert analyze_many(str(fleet_dir), executor="serial")["reports"] == res["reports"]  # a directory works too
    names = [Path(r["path"]).name for r in res["ranks"]]
    assert names == [f"rank-{i}.json.gz" for i in range(8)]
    assert res["errors"] == [] and len(res["reports"]) == 8
    assert res["executor"] == "serial"
    json.dumps(res)  # plain JSON
    # Real traces: vLLM decode step, then ranks from distributedInfo (nccl_data is rank 0 of 2).
    assert res["ranks"][0]["phase"] == "decode" and res["ranks"][0]["tpot_p50_ms"] == 10.743181  # own time of the step
    assert res["ranks"][1]["rank_source"] == "trace" and res["ranks"][1]["world_size"] == 2
    assert res["straggler_rule"]["metric"] == "all_wall_ms"  # not every rank has decode steps


@pytest.mark.slow  # executor parity: starts a process pool or a Dask cluster
def test_process_pool_matches_serial(fleet_dir, serial_result):
    res = analyze_many(discover(str(fleet_dir)), executor="process", workers=2)
    assert res["executor"] == "process" and res["workers"] == 2
    assert _phases_latency(res["reports"]) == _phases_latency(serial_result["reports"])
    assert res["reports"] == serial_result["reports"]
    assert res["ranks"] == serial_result["ranks"]
    assert res["stragglers"] == serial_result["stragglers"] and res["errors"] == []


def test_auto_executor_choice(monkeypatch):
    from diagnose.multi import _resolve_executor

    monkeypatch.setattr("os.cpu_count", lambda: 2)
    assert _resolve_executor("auto", 8, None) == "process"
    assert _resolve_executor("auto", 1, None) == "serial"
    assert _resolve_executor("auto", 8, "tcp://scheduler:8786") == "dask"
    assert _resolve_executor("serial", 8, None) == "serial"
    monkeypatch.setattr("os.cpu_count", lambda: 1)
    assert _resolve_executor("auto", 8, None) == "serial"


@pytest.fixture(scope="module")
def dask_cluster():
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None)
    try:
        yield cluster
    finally:
        cluster.close()


@pytest.mark.slow  # executor parity: starts a process pool or a Dask cluster
def test_dask_matches_serial(fleet_dir, serial_result, dask_cluster):
    res = analyze_many(discover(str(fleet_dir)), executor="auto", scheduler=dask_cluster.scheduler_address)
    assert res["executor"] == "dask" and res["workers"] == 2
    assert [Path(r["path"]).name for r in res["ranks"]] == [f"rank-{i}.json.gz" for i in range(8)]
    assert _phases_latency(res["reports"]) == _phases_latency(serial_result["reports"])
    assert res["reports"] == serial_result["reports"]
    assert res["ranks"] == serial_result["ranks"]
    assert res["errors"] == []


@pytest.mark.slow  # executor parity: starts a process pool or a Dask cluster
def test_dask_with_client_and_bad_rank(fleet_dir, dask_cluster, tmp_path):
    distributed = pytest.importorskip("distributed")
    bad = tmp_path / "rank-8.json"
    bad.write_bytes(b"{")
    paths = discover(str(fleet_dir))[:2] + [str(bad)]
    with distributed.Client(dask_cluster) as client:
        res = analyze_many(paths, executor="dask", scheduler=client)
        assert client.status == "running"  # a Client we were given is not closed
    assert len(res["ranks"]) == 2
    assert [(e["rank"], e["path"]) for e in res["errors"]] == [(8, str(bad))]


@pytest.mark.slow  # executor parity: starts a process pool or a Dask cluster
def test_dask_unreachable_scheduler(kineto, tmp_path, monkeypatch):
    pytest.importorskip("distributed")
    monkeypatch.setattr("diagnose.multi.DASK_CONNECT_TIMEOUT", "1s")
    p = str(decode_trace(kineto, tmp_path / "rank-0.json", period_us=1000))
    with pytest.raises(DiagnoseError, match="cannot connect to the Dask scheduler"):
        analyze_many([p], executor="dask", scheduler="tcp://127.0.0.1:9")
