"""Tests for the Nsight Systems SQLite / .nsys-rep loader (diagnose.trace.nsys)."""
from __future__ import annotations

import hashlib
import os
import shutil
import sqlite3
import stat
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from diagnose.errors import TraceFormatError
from diagnose.trace import nsys, nsys_db
from diagnose.trace.model import ANNOTATION_COLUMNS, GPU_COLUMNS, RUNTIME_COLUMNS
from diagnose.trace.nsys import load_nsys_rep, load_nsys_sqlite

HAS_ADBC = nsys.adbc_available()
needs_adbc = pytest.mark.skipif(not HAS_ADBC, reason="adbc-driver-sqlite not installed")


@pytest.fixture(autouse=True, params=[pytest.param("adbc", marks=needs_adbc), "sqlite3"])
def reader(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test runs once per bulk reader (through DIAGNOSE_NSYS_READER)."""
    monkeypatch.setenv(nsys.READER_ENV, request.param)
    return request.param


TRACES = Path(__file__).resolve().parents[1].parent / "shared" / "traces"
REAL = {
    # dir: (kernels, kernel ns, runtime rows, NVTX ranges, export schema)
    "64ee035": (19, 393_539, 968, 652, "3.16.1"),
    "ee4fcf3": (18, 10_167_602, 990, 13_513, "3.17.1"),
}

# ---------------------------------------------------------------- fixture builder
# Column names are the real ones from the 3.16.1 / 3.17.1 exports (subset).
SCHEMA = {
    "StringIds": "id INTEGER PRIMARY KEY, value TEXT NOT NULL",
    "CUPTI_ACTIVITY_KIND_KERNEL": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER, streamId INTEGER NOT NULL, correlationId INTEGER, globalPid INTEGER, "
        "demangledName INTEGER NOT NULL, shortName INTEGER NOT NULL, mangledName INTEGER, "
        "graphNodeId INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_RUNTIME": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, eventClass INTEGER NOT NULL, "
        "globalTid INTEGER, correlationId INTEGER, nameId INTEGER NOT NULL, returnValue INTEGER, "
        "callchainId INTEGER"
    ),
    "CUPTI_ACTIVITY_KIND_GRAPH_TRACE": (
        "start INTEGER NOT NULL, end INTEGER NOT NULL, deviceId INTEGER NOT NULL, "
        "contextId INTEGER, greenContextId INTEGER, streamId INTEGER NOT NULL, "
        "correlationId INTEGER, globalPid INTEGER, graphId INTEGER, graphExecId INTEGER"
    ),
    "NVTX": (
        "start INTEGER NOT NULL, end INTEGER, eventType INTEGER NOT NULL, rangeId INTEGER, "
        "category INTEGER, color INTEGER, text TEXT, globalTid INTEGER, endGlobalTid INTEGER, "
        "textId INTEGER, domainId INTEGER"
    ),
    "TARGET_INFO_GPU": (
        "vmId INTEGER, id INTEGER NOT NULL, name TEXT, totalMemory INTEGER, smCount INTEGER, "
        "computeMajor INTEGER, computeMinor INTEGER"
    ),
}


def gtid(pid: int, tid: int) -> int:
    """nsys globalTid layout: vm/host bits above 48, pid in bits 24..47, tid in 0..23."""
    return (1 << 48) | (pid << 24) | tid


def make_db(
    path: Path,
    *,
    strings: dict[int, str] | None = None,
    kernels: list[tuple] | None = None,
    runtime: list[tuple] | None = None,
    graphs: list[tuple] | None = None,
    nvtx: list[tuple] | None = None,
    nvtx_table: str = "NVTX_EVENTS",
    gpus: list[tuple] | None = None,
    driver: list[tuple] | None = None,
) -> Path:
    """Create an nsys-like SQLite file holding only the tables given (None = table absent).

    kernels: (start, end, deviceId, streamId, correlationId, globalPid, demangledName, shortName)
    runtime, driver: (start, end, globalTid, correlationId, nameId)
    graphs: (start, end, deviceId, streamId, correlationId, globalPid, graphId)
    nvtx: (start, end, eventType, text, globalTid, textId)
    gpus: (id, name, totalMemory, smCount, computeMajor, computeMinor)
    """
    con = sqlite3.connect(path)
    con.execute(f"CREATE TABLE StringIds ({SCHEMA['StringIds']})")
    con.executemany("INSERT INTO StringIds VALUES (?, ?)", sorted((strings or {}).items()))
    if kernels is not None:
        con.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_KERNEL ({SCHEMA['CUPTI_ACTIVITY_KIND_KERNEL']})")
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_KERNEL (start, end, deviceId, streamId, correlationId, "
            "globalPid, demangledName, shortName) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            kernels,
        )
    if runtime is not None:
        con.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_RUNTIME ({SCHEMA['CUPTI_ACTIVITY_KIND_RUNTIME']})")
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_RUNTIME (start, end, eventClass, globalTid, correlationId, "
            "nameId) VALUES (?, ?, 0, ?, ?, ?)",
            runtime,
        )
    if driver is not None:  # same columns as the runtime table
        con.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_DRIVER ({SCHEMA['CUPTI_ACTIVITY_KIND_RUNTIME']})")
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_DRIVER (start, end, eventClass, globalTid, correlationId, "
            "nameId) VALUES (?, ?, 1, ?, ?, ?)",
            driver,
        )
    if graphs is not None:
        con.execute(f"CREATE TABLE CUPTI_ACTIVITY_KIND_GRAPH_TRACE ({SCHEMA['CUPTI_ACTIVITY_KIND_GRAPH_TRACE']})")
        con.executemany(
            "INSERT INTO CUPTI_ACTIVITY_KIND_GRAPH_TRACE (start, end, deviceId, streamId, correlationId, "
            "globalPid, graphId) VALUES (?, ?, ?, ?, ?, ?, ?)",
            graphs,
        )
    if nvtx is not None:
        con.execute(f"CREATE TABLE {nvtx_table} ({SCHEMA['NVTX']})")
        con.executemany(
            f"INSERT INTO {nvtx_table} (start, end, eventType, text, globalTid, textId) VALUES (?, ?, ?, ?, ?, ?)",
            nvtx,
        )
    if gpus is not None:
        con.execute(f"CREATE TABLE TARGET_INFO_GPU ({SCHEMA['TARGET_INFO_GPU']})")
        con.executemany(
            "INSERT INTO TARGET_INFO_GPU (vmId, id, name, totalMemory, smCount, computeMajor, computeMinor) "
            "VALUES (281474976710656, ?, ?, ?, ?, ?, ?)",
            gpus,
        )
    con.commit()
    con.close()
    return path


PID, TID = 4242, 4243
GPID = (1 << 48) | (PID << 24)
H200 = (0, "NVIDIA H200", 150_137_864_192, 132, 9, 0)


def codes(trace) -> dict[str, object]:
    return {q.code: q for q in trace.quality}


def assert_contract(trace) -> None:
    for df, cols in ((trace.gpu, GPU_COLUMNS), (trace.runtime, RUNTIME_COLUMNS), (trace.annotations, ANNOTATION_COLUMNS)):
        if trace.ranks:  # several processes with GPU work: one rank each (model.py's contract adds a rank column)
            cols = {**cols, "rank": "int64"}
        assert list(df.columns) == list(cols)
        assert {c: str(t) for c, t in df.dtypes.items()} == cols
    assert (trace.gpu["end_ns"] >= trace.gpu["start_ns"]).all()


# ---------------------------------------------------------------- real exports


def real_path(name: str) -> Path:
    p = TRACES / "nvfuser" / name / "report1.sqlite"
    if not TRACES.is_dir():
        pytest.skip(f"{TRACES} absent")
    if not p.is_file():
        pytest.skip(f"{p} absent")
    return p


@pytest.mark.parametrize("name", sorted(REAL))
def test_real_export_matches_sql(name: str, reader: str) -> None:
    path = real_path(name)
    n_kernels, kernel_ns, n_runtime, n_nvtx, schema = REAL[name]
    before = hashlib.sha256(path.read_bytes()).hexdigest()

    trace = load_nsys_sqlite(str(path))

    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    sql_k, sql_k_ns = con.execute("SELECT count(*), sum(end - start) FROM CUPTI_ACTIVITY_KIND_KERNEL").fetchone()
    sql_rt = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_RUNTIME").fetchone()[0]
    sql_cp, sql_cp_bytes = con.execute("SELECT count(*), sum(bytes) FROM CUPTI_ACTIVITY_KIND_MEMCPY").fetchone()
    sql_ms = con.execute("SELECT count(*) FROM CUPTI_ACTIVITY_KIND_MEMSET").fetchone()[0]
    sql_nvtx = con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE end IS NOT NULL AND eventType IN (59, 60)").fetchone()[0]
    sql_ov, sql_ov_ns = con.execute("SELECT count(*), sum(end - start) FROM PROFILER_OVERHEAD").fetchone()
    con.close()

    assert trace.source_format == "nsys-sqlite"
    assert trace.metadata["nsys"]["reader"] == reader and "reader_fallbacks" not in trace.metadata["nsys"]
    assert_contract(trace)
    k = trace.gpu[trace.gpu["kind"] == "kernel"]
    assert len(k) == sql_k == n_kernels
    assert int((k["end_ns"] - k["start_ns"]).sum()) == sql_k_ns == kernel_ns
    cp = trace.gpu[trace.gpu["kind"] == "memcpy"]
    assert len(cp) == sql_cp and int(cp["bytes"].sum()) == sql_cp_bytes
    assert (trace.gpu["kind"] == "memset").sum() == sql_ms
    assert len(trace.runtime) == sql_rt == n_runtime
    assert len(trace.annotations) == sql_nvtx == n_nvtx
    assert (k["name"] != "").all()
    # nsys's own overhead (PROFILER_OVERHEAD: CUPTI buffer flushes, TLS allocation...)
    assert len(trace.overhead) == sql_ov == {"64ee035": 24, "ee4fcf3": 102}[name]
    assert int((trace.overhead["end_ns"] - trace.overhead["start_ns"]).sum()) == sql_ov_ns
    assert "CUPTI Buffer flush" in set(trace.overhead["name"])
    # gpu frame sorted by (device, start)
    assert (np.diff(trace.gpu["start_ns"].to_numpy()) >= 0).all()

    assert [(d.id, d.name, d.num_sms, d.compute_capability) for d in trace.devices] == [(0, "NVIDIA H200", 132, "9.0")]
    assert trace.metadata["nsys"]["export_schema_version"] == schema
    assert codes(trace) == {}

    # Every kernel is launched by exactly one runtime/driver launch call with its correlation.
    launches = trace.runtime[trace.runtime["api_kind"].isin(["launch", "graph_launch"])]
    assert launches["correlation"].is_unique
    assert set(k["correlation"]) <= set(launches["correlation"])
    assert len(launches) == n_kernels  # no graphs: one launch per kernel
    # nsys's "_v7000" suffixes are stripped
    assert "cudaLaunchKernel" in set(trace.runtime["name"])
    assert not trace.runtime["name"].str.contains(r"_v\d{4,5}$").any()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before


def test_real_3_17_two_processes_get_pid_qualified_correlation() -> None:
    trace = load_nsys_sqlite(str(real_path("ee4fcf3")))
    # The 3.17 sample has a second CUDA process whose correlation ids 1 and 127 collide.
    assert sorted(trace.runtime["pid"].unique().tolist()) == [50556, 50922]
    assert trace.metadata["nsys"]["correlation"] == "pid<<32|correlationId"
    assert trace.runtime["correlation"].is_unique
    assert ((trace.gpu["correlation"].to_numpy() >> 32) == 50556).all()
    assert trace.metadata["nsys"]["cuda_devices"] == [
        {"gpu_id": 0, "cuda_id": 0, "pid": 50922},
        {"gpu_id": 0, "cuda_id": 0, "pid": 50556},
    ]
    # syncs are named by the API call that caused them (syncType says "stream wait" for them)
    assert trace.gpu_syncs["name"].tolist() == ["Stream Sync", "Stream Sync", "Context Sync"]
    assert trace.gpu_syncs["stream"].tolist() == [7, 7, -1]


def test_real_3_16_single_process_keeps_raw_correlation() -> None:
    trace = load_nsys_sqlite(str(real_path("64ee035")))
    assert trace.metadata["nsys"]["correlation"] == "correlationId"
    assert trace.gpu["correlation"].tolist()[:3] == [158, 186, 240]
    assert trace.gpu_syncs["name"].tolist() == ["Stream Sync"]
    memcpy = trace.gpu[trace.gpu["kind"] == "memcpy"]
    assert memcpy["name"].tolist() == ["Memcpy DtoH (Device -> Pinned)"]
    assert trace.gpu[trace.gpu["kind"] == "memset"]["name"].tolist() == ["Memset (Device)"]


# ---------------------------------------------------------------- fixtures


def test_graph_fanout_next_to_eager_launches(tmp_path: Path) -> None:
    strings = {1: "cudaGraphLaunch_v10000", 2: "cudaLaunchKernel_v7000", 10: "void gemm<64>(float*)", 11: "gemm", 12: "rmsnorm"}
    graph_corr = 500
    kernels, runtime = [], []
    runtime.append((1_000, 9_000, gtid(PID, TID), graph_corr, 1))
    for i in range(30):  # one graph launch -> 30 kernels sharing its correlation id
        s = 10_000 + i * 2_000
        kernels.append((s, s + 1_500, 0, 7, graph_corr, GPID, 10, 11))
    for i in range(10):  # 10 eager launches, one kernel each
        c = 600 + i
        rs = 100_000 + i * 3_000
        runtime.append((rs, rs + 1_000, gtid(PID, TID), c, 2))
        kernels.append((rs + 2_000, rs + 2_500, 0, 7, c, GPID, 12, 12))
    trace = load_nsys_sqlite(str(make_db(tmp_path / "g.sqlite", strings=strings, kernels=kernels, runtime=runtime, gpus=[H200])))

    assert_contract(trace)
    assert len(trace.gpu) == 40 and (trace.gpu["kind"] == "kernel").all()
    launches = trace.runtime[trace.runtime["api_kind"].isin(["launch", "graph_launch"])]
    assert len(launches) == 11
    assert launches["api_kind"].value_counts().to_dict() == {"launch": 10, "graph_launch": 1}
    graph_row = trace.runtime[trace.runtime["api_kind"] == "graph_launch"]
    assert graph_row["name"].tolist() == ["cudaGraphLaunch"]
    assert int((trace.gpu["correlation"] == graph_row["correlation"].iloc[0]).sum()) == 30
    assert trace.gpu["correlation"].value_counts().max() == 30
    # the graph launch's API time is counted once
    assert int((graph_row["end_ns"] - graph_row["start_ns"]).sum()) == 8_000
    assert trace.runtime["pid"].unique().tolist() == [PID] and trace.runtime["tid"].unique().tolist() == [TID]
    # demangledName preferred over shortName
    assert set(trace.gpu["name"]) == {"void gemm<64>(float*)", "rmsnorm"}


def test_graph_level_records(tmp_path: Path) -> None:
    strings = {1: "cudaGraphLaunch_v10000"}
    runtime = [(1_000, 3_000, gtid(PID, TID), 77, 1), (5_000, 6_000, gtid(PID, TID), 78, 1)]
    graphs = [(10_000, 90_000, 0, 7, 77, GPID, 3), (100_000, 180_000, 0, 7, 78, GPID, 3)]
    trace = load_nsys_sqlite(str(make_db(tmp_path / "gl.sqlite", strings=strings, runtime=runtime, graphs=graphs, kernels=[])))
    assert trace.gpu["kind"].tolist() == ["kernel", "kernel"]
    assert trace.gpu["name"].tolist() == ["cudaGraph 3", "cudaGraph 3"]
    assert trace.gpu["correlation"].tolist() == [77, 78]
    q = codes(trace)["nsys_graph_level"]
    assert "per-kernel detail unavailable" in q.message and q.count == 2


def test_no_nvtx_table(tmp_path: Path) -> None:
    trace = load_nsys_sqlite(str(make_db(tmp_path / "n.sqlite", kernels=[], runtime=[], gpus=[H200])))
    q = codes(trace)["nsys_no_nvtx"]
    assert q.message == "no NVTX captured"
    assert len(trace.annotations) == 0 and list(trace.annotations.columns) == list(ANNOTATION_COLUMNS)


def test_nvtx_versioned_table_textid_and_range_kinds(tmp_path: Path) -> None:
    strings = {20: "decode_step", 21: "prefill", 22: "open_forever", 23: "a mark"}
    g = gtid(PID, TID)
    nvtx = [
        (1_000, 5_000, 59, None, g, 20),  # push/pop, name only via textId
        (6_000, 9_000, 60, None, gtid(PID, TID + 1), 21),  # start/end
        (10_000, None, 59, None, g, 22),  # never popped: skipped and counted
        (11_000, None, 34, None, g, 23),  # mark: instant, skipped silently
        (12_000, 13_000, 59, "inline text", g, None),  # name in `text`
    ]
    trace = load_nsys_sqlite(
        str(make_db(tmp_path / "v.sqlite", strings=strings, kernels=[], runtime=[], nvtx=nvtx, nvtx_table="NVTX_EVENTS_V3"))
    )
    assert_contract(trace)
    ann = trace.annotations
    assert ann["name"].tolist() == ["decode_step", "prefill", "inline text"]
    assert ann["start_ns"].tolist() == [1_000, 6_000, 12_000]
    assert ann["end_ns"].tolist() == [5_000, 9_000, 13_000]
    assert set(ann["scope"]) == {"cpu"} and set(ann["device"]) == {-1}
    assert ann["tid"].tolist() == [TID, TID + 1, TID] and set(ann["pid"]) == {PID}
    q = codes(trace)
    assert "nsys_no_nvtx" not in q
    assert q["nsys_nvtx_unterminated"].count == 1
    assert trace.metadata["nsys"]["nvtx_table"] == "NVTX_EVENTS_V3"


def test_reverse_ordered_kernels_and_absent_tables(tmp_path: Path) -> None:
    strings = {1: "k"}
    kernels = []
    for i in reversed(range(10)):  # stored newest first
        s = 1_000_000 + i * 15_000  # 10 µs kernels, 5 µs apart
        kernels.append((s, s + 10_000, 0, 7, 100 + i, GPID, 1, 1))
    trace = load_nsys_sqlite(str(make_db(tmp_path / "r.sqlite", strings=strings, kernels=kernels, runtime=[], gpus=[H200])))
    start = trace.gpu["start_ns"].to_numpy()
    end = trace.gpu["end_ns"].to_numpy()
    assert np.diff(start).tolist() == [15_000] * 9
    assert (start[1:] - end[:-1]).tolist() == [5_000] * 9
    assert trace.gpu["correlation"].tolist() == list(range(100, 110))
    q = codes(trace)["nsys_table_absent"]
    assert "CUPTI_ACTIVITY_KIND_MEMCPY" in q.message and "CUPTI_ACTIVITY_KIND_MEMSET" in q.message
    assert "CUPTI_ACTIVITY_KIND_KERNEL" not in q.message and q.count == 2


def test_device_ids_starting_at_3(tmp_path: Path) -> None:
    strings = {1: "k"}
    kernels = [(2_000, 3_000, 4, 7, 2, GPID, 1, 1), (1_000, 2_000, 3, 7, 1, GPID, 1, 1)]
    gpus = [(4, "NVIDIA H200", 150_000_000_000, 132, 9, 0), (3, "NVIDIA H200", 150_000_000_000, 132, 9, 0)]
    trace = load_nsys_sqlite(str(make_db(tmp_path / "d.sqlite", strings=strings, kernels=kernels, runtime=[], gpus=gpus)))
    assert [d.id for d in trace.devices] == [3, 4]
    assert trace.device_name(3) == "NVIDIA H200" and trace.device_name(0) == ""
    assert trace.gpu["device"].tolist() == [3, 4]
    assert "nsys_unknown_device" not in codes(trace)


def test_two_processes_with_colliding_correlation_ids(tmp_path: Path) -> None:
    strings = {1: "cudaLaunchKernel_v7000", 2: "k"}
    pa, pb = 100, 200
    kernels = [(5_000, 6_000, 0, 7, 1, (1 << 48) | (pa << 24), 2, 2), (7_000, 8_000, 1, 7, 1, (1 << 48) | (pb << 24), 2, 2)]
    runtime = [(1_000, 2_000, gtid(pa, pa), 1, 1), (3_000, 4_000, gtid(pb, pb), 1, 1)]
    trace = load_nsys_sqlite(str(make_db(tmp_path / "mp.sqlite", strings=strings, kernels=kernels, runtime=runtime)))
    assert trace.metadata["nsys"]["correlation"] == "pid<<32|correlationId"
    rt = dict(zip(trace.runtime["correlation"], trace.runtime["pid"]))
    assert [rt[c] for c in trace.gpu["correlation"]] == [pa, pb]


def test_two_processes_on_one_gpu_keep_their_own_stream_7(tmp_path: Path) -> None:
    """MPS / co-located instances: two processes on device 0, each with a stream 7. A stream
    is (pid, device, stream): process 100's 30 ms kernel is not a "late completion" of
    process 200's kernels, which start inside it."""
    from diagnose.trace import load_trace

    strings = {1: "cudaLaunchKernel_v7000", 2: "long_gemm", 3: "short_k"}
    pa, pb = 100, 200
    ms = 1_000_000
    kernels = [(0, 30 * ms, 0, 7, 1, (1 << 48) | (pa << 24), 2, 2)]
    kernels += [(5 * ms * (i + 1), 5 * ms * (i + 1) + 2 * ms, 0, 7, 10 + i, (1 << 48) | (pb << 24), 3, 3) for i in range(5)]
    runtime = [(0, 1_000, gtid(pa, pa), 1, 1)] + [(5 * ms * (i + 1) - 10_000, 5 * ms * (i + 1) - 9_000, gtid(pb, pb), 10 + i, 1)
                                                  for i in range(5)]
    path = make_db(tmp_path / "mps.sqlite", strings=strings, kernels=kernels, runtime=runtime)
    raw = load_nsys_sqlite(str(path))
    assert raw.gpu["pid"].tolist() == [pa] + [pb] * 5
    assert_contract(raw)
    trace = load_trace(str(path))  # + normalization
    # the union of [0, 30) ms and five 2 ms kernels inside it: 30 ms busy, nothing clipped
    # (keyed by (device, stream) alone, the long kernel was cut at 5 ms: 25 ms removed)
    assert "deferred_completion_clipped" not in codes(trace)
    assert (trace.gpu["end_ns"] - trace.gpu["start_ns"]).tolist() == [30 * ms] + [2 * ms] * 5


def test_single_process_gpu_rows_carry_its_pid(tmp_path: Path) -> None:
    strings = {1: "cudaLaunchKernel_v7000", 2: "k"}
    kernels = [(5_000, 6_000, 0, 7, 1, GPID, 2, 2)]
    runtime = [(1_000, 2_000, gtid(PID, TID), 1, 1)]
    trace = load_nsys_sqlite(str(make_db(tmp_path / "one.sqlite", strings=strings, kernels=kernels, runtime=runtime)))
    assert trace.metadata["nsys"]["correlation"] == "correlationId"
    assert trace.gpu["pid"].tolist() == [PID]
    assert len(trace.overhead) == 0 and list(trace.overhead.columns) == ["name", "start_ns", "end_ns", "pid", "tid"]


def test_driver_table_name_fallback_and_unresolved_ids(tmp_path: Path) -> None:
    strings = {1: "cudaLaunchKernel_v7000", 2: "cuLaunchKernelEx", 3: "", 4: "short_k", 5: "void full_k<1>()"}
    g = gtid(PID, TID)
    runtime = [(100, 200, g, 1, 1), (150, 160, g, 9, 99)]  # nameId 99 is not in StringIds
    driver = [(300, 400, g, 2, 2)]
    kernels = [
        (1_000, 2_000, 0, 7, 1, GPID, 3, 4),  # demangledName is "" -> shortName
        (3_000, 4_000, 0, 7, 2, GPID, 5, 4),  # demangledName preferred
        (5_000, 6_000, 0, 7, 3, GPID, 77, 78),  # neither id resolves
    ]
    trace = load_nsys_sqlite(str(make_db(tmp_path / "dr.sqlite", strings=strings, kernels=kernels, runtime=runtime, driver=driver)))
    assert trace.gpu["name"].tolist() == ["short_k", "void full_k<1>()", ""]
    assert trace.runtime["name"].tolist() == ["cudaLaunchKernel", "", "cuLaunchKernelEx"]
    assert trace.runtime["api_kind"].tolist() == ["launch", "other", "launch"]
    assert codes(trace)["nsys_unresolved_names"].count == 2


def test_not_sqlite_and_unrelated_sqlite(tmp_path: Path) -> None:
    junk = tmp_path / "trace.sqlite"
    junk.write_text('{"traceEvents": []}')
    with pytest.raises(TraceFormatError, match="not an SQLite file"):
        load_nsys_sqlite(str(junk))

    other = tmp_path / "other.sqlite"
    con = sqlite3.connect(other)
    con.execute("CREATE TABLE users (id INTEGER, name TEXT)")
    con.commit()
    con.close()
    with pytest.raises(TraceFormatError, match="without Nsight Systems tables"):
        load_nsys_sqlite(str(other))

    with pytest.raises(TraceFormatError, match="no such file"):
        load_nsys_sqlite(str(tmp_path / "missing.sqlite"))

    good = make_db(tmp_path / "good.sqlite", strings={1: "k"}, kernels=[(1, 2, 0, 7, 1, GPID, 1, 1)] * 2000)
    cut = tmp_path / "cut.sqlite"
    cut.write_bytes(good.read_bytes()[:5000])
    with pytest.raises(TraceFormatError):
        load_nsys_sqlite(str(cut))


def test_opens_read_only(tmp_path: Path) -> None:
    path = make_db(tmp_path / "ro.sqlite", strings={1: "k"}, kernels=[(1, 2, 0, 7, 1, GPID, 1, 1)])
    path.chmod(stat.S_IRUSR)
    tmp_path.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        before = sorted(os.listdir(tmp_path))
        trace = load_nsys_sqlite(str(path))
        assert len(trace.gpu) == 1
        assert sorted(os.listdir(tmp_path)) == before
    finally:
        tmp_path.chmod(stat.S_IRWXU)
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)


# ---------------------------------------------------------------- .nsys-rep


def test_rep_without_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rep = tmp_path / "report1.nsys-rep"
    rep.write_bytes(b"not really a report")
    monkeypatch.setattr(nsys.shutil, "which", lambda name: None)
    with pytest.raises(TraceFormatError, match=r"needs Nsight Systems' `nsys` on PATH.*nsys export --type sqlite FILE"):
        load_nsys_rep(str(rep))


FAKE_NSYS = """#!/bin/sh
[ "$1" = export ] && [ "$2" = --type ] && [ "$3" = sqlite ] && [ "$4" = --output ] || exit 3
if [ -n "$FAKE_NSYS_FAIL" ]; then echo "fatal: $FAKE_NSYS_FAIL" >&2; exit 1; fi
cp "$FAKE_NSYS_DB" "$5"
"""


@pytest.fixture
def fake_nsys(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nsys"
    exe.write_text(FAKE_NSYS)
    exe.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")
    db = make_db(tmp_path / "exported.sqlite", strings={1: "k"}, kernels=[(1_000, 2_000, 0, 7, 1, GPID, 1, 1)])
    monkeypatch.setenv("FAKE_NSYS_DB", str(db))
    return db


def test_rep_exports_to_private_tmpdir(tmp_path: Path, fake_nsys: Path) -> None:
    src = tmp_path / "in"
    src.mkdir()
    rep = src / "report1.nsys-rep"
    rep.write_bytes(b"report bytes")
    trace = load_nsys_rep(str(rep))
    assert trace.source_path == str(rep) and trace.source_format == "nsys-sqlite"
    assert trace.metadata["nsys"]["exported_from_rep"] is True
    assert len(trace.gpu) == 1
    assert sorted(os.listdir(src)) == ["report1.nsys-rep"]
    assert rep.read_bytes() == b"report bytes"


def test_rep_export_failure(tmp_path: Path, fake_nsys: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    rep = tmp_path / "bad.nsys-rep"
    rep.write_bytes(b"x")
    monkeypatch.setenv("FAKE_NSYS_FAIL", "unsupported report version")
    with pytest.raises(TraceFormatError, match="failed: fatal: unsupported report version"):
        load_nsys_rep(str(rep))


@pytest.mark.skipif(shutil.which("nsys") is None, reason="nsys not on PATH")
@pytest.mark.parametrize("name", sorted(REAL))
def test_real_rep_parity(name: str) -> None:
    sqlite_trace = load_nsys_sqlite(str(real_path(name)))
    rep_trace = load_nsys_rep(str(real_path(name).with_suffix(".nsys-rep")))
    assert len(rep_trace.gpu) == len(sqlite_trace.gpu)
    assert int((rep_trace.gpu["end_ns"] - rep_trace.gpu["start_ns"]).sum()) == int(
        (sqlite_trace.gpu["end_ns"] - sqlite_trace.gpu["start_ns"]).sum()
    )
    assert len(rep_trace.runtime) == len(sqlite_trace.runtime)


# ---------------------------------------------------------------- readers (adbc vs sqlite3)


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def assert_same_trace(a, b) -> None:
    """Same frames (values, dtypes, order, index), metadata (but the reader), notes, devices."""
    for name in ("gpu", "runtime", "annotations", "gpu_syncs", "cpu_ops", "overhead"):
        pd.testing.assert_frame_equal(getattr(a, name), getattr(b, name), check_exact=True)
    ma, mb = dict(a.metadata["nsys"]), dict(b.metadata["nsys"])
    for m in (ma, mb):
        m.pop("reader")
        m.pop("reader_fallbacks", None)
    assert ma == mb
    assert [vars(q) for q in a.quality] == [vars(q) for q in b.quality]
    assert a.devices == b.devices and a.partial == b.partial


def both(path: Path):
    """(adbc trace, sqlite3 trace) of ``path``; the file is unchanged by either."""
    before = sha(path)
    a = load_nsys_sqlite(str(path), reader="adbc")
    b = load_nsys_sqlite(str(path), reader="sqlite3")
    assert a.metadata["nsys"]["reader"] == "adbc" and b.metadata["nsys"]["reader"] == "sqlite3"
    assert sha(path) == before
    return a, b


def mixed_db(path: Path, n_nvtx: int = 40) -> Path:
    """Two processes, runtime + driver, graphs, NULL NVTX ends, text and textId names,
    unresolved ids, huge globalTid high bits, reversed rows: everything the loader maps."""
    big = 1 << 62  # high bits above the pid must not disturb int64 decoding
    strings = {1: "cudaLaunchKernel_v7000", 2: "cuLaunchKernelEx", 3: "cudaGraphLaunch_v10000", 4: "",
               5: "void k<1>()", 6: "k", 20: "decode_step", 21: "prefill"}
    pa_, pb = 100, 200
    kernels = [(5_000 + 10 * i, 5_005 + 10 * i, i % 2, 7, i, (1 << 48) | (pa_ << 24), 5 if i % 3 else 4, 6)
               for i in reversed(range(30))]
    kernels.append((9_000, 9_100, 0, 7, 1, (1 << 48) | (pb << 24), 77, 78))  # unresolved names
    runtime = [(1_000 + 10 * i, 1_004 + 10 * i, big | (pa_ << 24) | 5, i, 1 if i % 5 else 99) for i in range(30)]
    runtime.append((900, 950, big | (pb << 24) | 6, 1, 1))  # colliding correlation id, other pid
    driver = [(2_000, 2_100, big | (pa_ << 24) | 5, 500, 2)]
    graphs = [(20_000, 29_000, 0, 7, 600, (1 << 48) | (pa_ << 24), 3)]
    nvtx = []
    for i in range(n_nvtx):
        g = big | (pa_ << 24) | (5 + i % 3)
        end = None if i % 7 == 3 else 1_000 + 100 * i + 50
        text = None if i % 2 else f"step {i % 4}"
        nvtx.append((1_000 + 100 * i, end, 59 if i % 3 else 60, text, g, 20 + i % 3))  # textId 22: unknown
    nvtx.append((50, 60, 34, "a mark", big, None))
    return make_db(path, strings=strings, kernels=kernels, runtime=runtime, driver=driver, graphs=graphs,
                   nvtx=nvtx, gpus=[H200])


@needs_adbc
@pytest.mark.parametrize("name", sorted(REAL))
def test_readers_identical_on_real_exports(name: str) -> None:
    a, b = both(real_path(name))
    assert_same_trace(a, b)
    assert "reader_fallbacks" not in a.metadata["nsys"]


@needs_adbc
def test_readers_identical_on_fixture(tmp_path: Path) -> None:
    a, b = both(mixed_db(tmp_path / "m.sqlite"))
    assert_same_trace(a, b)
    assert "reader_fallbacks" not in a.metadata["nsys"]
    assert a.metadata["nsys"]["correlation"] == "pid<<32|correlationId"
    assert codes(a)["nsys_nvtx_unterminated"].count == 6
    assert set(a.annotations["name"]) == {"step 0", "step 2", "decode_step", "prefill", ""}
    assert a.runtime["pid"].tolist()[0] == 200 and set(a.runtime["tid"]) == {5, 6}


@needs_adbc
def test_parallel_range_reads_match(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = mixed_db(tmp_path / "p.sqlite", n_nvtx=200)
    con = sqlite3.connect(path)  # holes in the rowids: ranges must still cover every row once
    con.execute('DELETE FROM NVTX_EVENTS WHERE rowid % 11 = 0')
    con.commit()
    con.close()
    whole = load_nsys_sqlite(str(path), reader="sqlite3")
    monkeypatch.setattr(nsys_db, "SPLIT_ROWS", 7)
    monkeypatch.setattr(nsys_db, "_cpus", lambda: 4)
    seen: list[str] = []
    real_fetch = nsys_db._fetch_part
    monkeypatch.setattr(nsys_db, "_fetch_part", lambda con, sql, *a: seen.append(sql) or real_fetch(con, sql, *a))
    split = load_nsys_sqlite(str(path), reader="adbc")
    # 4 ranges x 2 reads (the ranges, then the textIds of the rows without text)
    assert sum("rowid BETWEEN" in q and "NVTX_EVENTS" in q for q in seen) == 8
    assert_same_trace(split, whole)
    assert len(split.annotations) > 100


@needs_adbc
def test_type_surprises_fall_back_to_sqlite3(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """ADBC infers column types from the first batch; any other type, later or first, makes
    that one query go through sqlite3, so the result is the sqlite3 reader's."""
    monkeypatch.setattr(nsys_db, "ARROW_BATCH_ROWS", 4)
    strings = {1: "cudaLaunchKernel_v7000", 2: "k"}
    kernels = [(1_000 * i, 1_000 * i + 500, 0, 7, i, GPID, 2, 2) for i in range(1, 11)]
    runtime = [(1_000 * i - 400, 1_000 * i - 300, gtid(PID, TID), i, 1) for i in range(1, 11)]
    path = make_db(tmp_path / "t.sqlite", strings=strings, kernels=kernels, runtime=runtime)
    con = sqlite3.connect(path)
    # Non-integral REALs stay REAL in an INTEGER column: one in the 3rd batch, one in the 1st.
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET end = 9500.5 WHERE correlationId = 9")
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_RUNTIME SET start = 599.5 WHERE correlationId = 1")
    con.commit()
    con.close()
    a, b = both(path)
    assert_same_trace(a, b)
    assert a.metadata["nsys"]["reader_fallbacks"] == ["CUPTI_ACTIVITY_KIND_KERNEL", "CUPTI_ACTIVITY_KIND_RUNTIME"]
    assert a.gpu["end_ns"].tolist()[8] == 9_500 and a.runtime["start_ns"].tolist()[0] == 599  # truncated, as before

    con = sqlite3.connect(path)
    con.execute("UPDATE CUPTI_ACTIVITY_KIND_KERNEL SET streamId = 'seven' WHERE correlationId = 2")
    con.commit()
    con.close()
    for r in ("adbc", "sqlite3"):
        with pytest.raises(TraceFormatError, match="non-integer value in CUPTI_ACTIVITY_KIND_KERNEL.stream"):
            load_nsys_sqlite(str(path), reader=r)


@needs_adbc
def test_adbc_reads_odd_paths_read_only(tmp_path: Path) -> None:
    d = tmp_path / "odd dir #1 é?"
    d.mkdir()
    path = mixed_db(d / "re port%20.sqlite")
    path.chmod(stat.S_IRUSR)
    d.chmod(stat.S_IRUSR | stat.S_IXUSR)
    try:
        before = sorted(os.listdir(d))
        a, b = both(path)
        assert "reader_fallbacks" not in a.metadata["nsys"]  # the URI reached the driver intact
        assert_same_trace(a, b)
        assert sorted(os.listdir(d)) == before
    finally:
        d.chmod(stat.S_IRWXU)
        path.chmod(stat.S_IRUSR | stat.S_IWUSR)


@needs_adbc
def test_adbc_connection_cannot_write(tmp_path: Path) -> None:
    path = make_db(tmp_path / "w.sqlite", strings={1: "k"}, kernels=[(1, 2, 0, 7, 1, GPID, 1, 1)])
    before = sha(path)
    con = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    db = nsys._Db(con, str(path), path.resolve().as_uri() + "?mode=ro", "adbc")
    try:
        cur = db._arrow_cons(1)[0].cursor()
        try:
            with pytest.raises(Exception):  # noqa: B017 - "readonly"; older drivers say less
                cur.execute("CREATE TABLE x (a INTEGER)")
        finally:
            try:
                cur.close()
            except Exception:  # noqa: BLE001 - adbc 1.0 also fails closing the failed statement
                pass
    finally:
        db.close()
        con.close()
    assert sha(path) == before


def test_reader_choice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_db(tmp_path / "c.sqlite", strings={1: "k"}, kernels=[(1, 2, 0, 7, 1, GPID, 1, 1)])
    with pytest.raises(ValueError, match="one of auto, adbc, sqlite3"):
        load_nsys_sqlite(str(path), reader="duckdb")
    monkeypatch.setenv(nsys.READER_ENV, "sqlite3")
    assert load_nsys_sqlite(str(path)).metadata["nsys"]["reader"] == "sqlite3"
    monkeypatch.setenv(nsys.READER_ENV, "auto")
    assert load_nsys_sqlite(str(path)).metadata["nsys"]["reader"] == ("adbc" if HAS_ADBC else "sqlite3")
    # Without the package: auto quietly uses sqlite3, an explicit adbc is an error.
    monkeypatch.setattr(nsys_db, "_ADBC", False)
    assert load_nsys_sqlite(str(path), reader="auto").metadata["nsys"]["reader"] == "sqlite3"
    with pytest.raises(ValueError, match="adbc-driver-sqlite"):
        load_nsys_sqlite(str(path), reader="adbc")


@pytest.mark.parametrize("ids", [[3, 1, 2, 7], [5, 10**12, 2]], ids=["dense", "sparse"])
def test_string_table_lookup(ids: list[int]) -> None:
    vals = [f"s{i}" for i in ids]
    st = nsys._Strings(np.array(ids + [-4], dtype=np.int64), np.array(vals + ["neg"], dtype=object))
    assert (st._lut is not None) == (max(ids) < 10**6)
    q = np.array([ids[1], -1, 999_999_999_999_999, ids[0], 4, ids[1]], dtype=np.int64)
    assert st.take(q).tolist() == [vals[1], None, None, vals[0], None, vals[1]]
    sub = st.subset(q)
    assert sorted(sub.ids.tolist()) == sorted([ids[0], ids[1]])
    assert sub.map(str.upper).take(np.array([ids[0]])).tolist() == [vals[0].upper()]
    assert nsys._Strings.empty().take(q).tolist() == [None] * len(q)


def test_factor_concat_shares_values() -> None:
    f = nsys._Factor.concat([
        (np.array([0, 1, -1, 0]), np.array(["a", "b"], dtype=object)),
        (np.array([1, 0, -1]), np.array(["a", "c"], dtype=object)),
    ])
    assert f.values().tolist() == ["a", "b", None, "a", "c", "a", None]
    assert f.uniques.tolist() == ["a", "b", "c"]


def test_nvtx_without_text_column_and_textid_fallback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = make_db(tmp_path / "nt.sqlite", strings={20: "decode_step", 21: "prefill"}, kernels=[], runtime=[])
    con = sqlite3.connect(path)
    con.execute("CREATE TABLE NVTX_EVENTS (start INTEGER NOT NULL, end INTEGER, eventType INTEGER, globalTid INTEGER, textId INTEGER)")
    g = gtid(PID, TID)
    con.executemany("INSERT INTO NVTX_EVENTS VALUES (?, ?, 59, ?, ?)",
                    [(1_000, 2_000, g, 20), (3_000, None, g, 21), (4_000, 5_000, g, 21), (6_000, 7_000, g, 99)])
    con.commit()
    con.close()
    trace = load_nsys_sqlite(str(path))
    assert trace.annotations["name"].tolist() == ["decode_step", "prefill", ""]
    assert codes(trace)["nsys_unresolved_names"].count == 1

    # If the blank-text rows read back in a different number than Python counted, every row's
    # textId is read instead: same names.
    real_read = nsys._Db.read

    def short_read(self, table, cols, where="", *a, **k):
        out = real_read(self, table, cols, where, *a, **k)
        if "textId" in out and "IS NULL OR" in where:
            out["textId"] = out["textId"][1:]
        return out

    mixed = mixed_db(tmp_path / "m.sqlite")
    want = load_nsys_sqlite(str(mixed))
    monkeypatch.setattr(nsys._Db, "read", short_read)
    again = load_nsys_sqlite(str(mixed))
    pd.testing.assert_frame_equal(again.annotations, want.annotations)
    assert (again.annotations["name"] == "decode_step").any()
