"""Every device and every stream counted once (issue 23): rules read every device of a trace and
the report leads with the finding of largest stake naming its device; compare and sweep pair
devices by id and refuse device sets they cannot pair; category shares are busy unions over
the kernel busy time, with communication split into exposed and hidden.

Planted traces (``conftest.KinetoBuilder``, times in µs): each test derives its expected
numbers from the events it writes, in a comment.
"""
from __future__ import annotations

import json
import re
from types import SimpleNamespace

import pytest
from click.testing import CliRunner

from conftest import KinetoBuilder
from diagnose.cli import main
from diagnose.findings import flatten
from diagnose.pipeline import diagnose_trace

H100 = {"name": "NVIDIA H100 80GB HBM3"}


def two_device_trace(k0: float = 144, gap0: float = 40, k1: float = 162, gap1: float = 20, n: int = 10,
                     devices: tuple[int, ...] = (0, 1)) -> KinetoBuilder:
    """Per device, ``n`` GEMM kernels of ``k`` µs from 1000 µs with ``gap`` µs between them, each
    launched up front by its own cudaLaunchKernel (the host is never late: every gap is a
    dependency wait, none has an external cause).

    Defaults: device 0 runs 10 x 144 µs with 9 gaps of 40 µs: window 1440 + 360 = 1800 µs, idle
    360 µs = 20 %; device 1 runs 10 x 162 µs with 9 gaps of 20 µs: window 1620 + 180 = 1800 µs,
    idle 180 µs = 10 %. Device 1 has the most GPU busy time (1.62 against 1.44 ms)."""
    b = KinetoBuilder(deviceProperties=[{"id": d, **H100} for d in devices])
    corr = 100
    for dev, k, gap in zip(devices, (k0, k1), (gap0, gap1)):
        t = 1000.0
        for _ in range(n):
            corr += 1
            b.runtime("cudaLaunchKernel", 10 + corr, 2, corr)
            b.kernel("gemm_kernel", t, k, corr, device=dev, stream=7)
            t += k + gap
    return b


def _run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def _json(*args) -> dict:
    r = _run(*args, "--format", "json")
    assert r.exit_code in (0, 1), r.output
    return json.loads(r.output)


# ---------------------------------------------------------------- rules per device


def test_s3_on_the_idle_device_of_two_leads_and_names_it(tmp_path):
    path = two_device_trace().write(tmp_path / "two.json")
    d = _json("run", "--trace", path)
    alls = {p["device"]: p for p in d["phases"] if p["name"] == "all"}
    assert (alls[0]["gpu_idle_share"], alls[0]["window_ms"], alls[0]["gpu_busy_ms"]) == (0.2, 1.8, 1.44)
    assert (alls[1]["gpu_idle_share"], alls[1]["window_ms"], alls[1]["gpu_busy_ms"]) == (0.1, 1.8, 1.62)
    # S3 (15 %) fires on device 0 only: idle 20 % of its 1.8 ms window, all of it dependency waits
    fired = [(s["id"], s["device"]) for s in d["symptoms"]]
    assert fired == [("S3-gpu-idle", 0)]
    h = d["headline"]
    assert h["text"] == "device 0: GPU idle 20% of the 1.8 ms GPU window, mostly dependency (longest such gap: nothing in the trace)"
    assert (h["rule_id"], h["device"], h["ms"], h["share"], h["share_of"]) == ("S3-gpu-idle", 0, 0.36, 0.2, "phase_window")
    # each device's own headline; the findings the report ships are the lead device's
    assert [(v["device"], v["fired"], (v["headline"] or {}).get("rule_id")) for v in d["device_verdicts"]] == [
        (0, ["S3-gpu-idle"], "S3-gpu-idle"), (1, [], None)]
    assert d["findings"]["trace.device"] == 0 and d["findings"]["all.gpu_idle_own_share"] == pytest.approx(0.2, abs=1e-12)
    # what the busiest device alone (the old single reading) says: 10 %, below the threshold
    a = diagnose_trace(str(path))
    assert flatten(a.report, 1)["all.gpu_idle_own_share"] == pytest.approx(0.1, abs=1e-12)
    text = _run("run", "--trace", path).output
    assert "► device 0: GPU idle 20% of the 1.8 ms GPU window" in text
    assert "  device 1: no symptom rule fired" in text
    assert "[medium] S3-gpu-idle (device 0): GPU idle 20.0% of the 1.80 ms window" in text


def test_critical_path_saving_ranks_one_device_and_stake_ranks_several(tmp_path):
    # one device (device 0 alone, every kernel launched up front, before the first one runs):
    # the window's critical path is 1.8 ms; without its 9 x 40 µs of idle it is 1.44 ms, a
    # predicted saving of 0.36 ms = 20 % of the 1.8 ms window: medium
    one = _json("run", "--trace", two_device_trace(devices=(0,)).write(tmp_path / "one.json"))
    s3 = one["symptoms"][0]
    assert (s3["id"], s3["severity"], s3["stake_ms"], s3["predicted_saving_ms"], s3["rank_basis"]) == (
        "S3-gpu-idle", "medium", 0.36, 0.36, "predicted_saving")
    assert one["headline"]["predicted_saving_ms"] == 0.36
    # two devices: the critical path runs across both, so it is no device's saving; each
    # device's rule is ranked (and its severity set) by its own stake: 0.36 / 1.8 ms = medium
    two = _json("run", "--trace", two_device_trace().write(tmp_path / "two.json"))
    s3 = two["symptoms"][0]
    assert (s3["device"], s3["severity"], s3["rank_basis"], "predicted_saving_ms" in s3) == (0, "medium", "stake", False)


def test_device_option_still_reads_one_device(tmp_path):
    path = two_device_trace().write(tmp_path / "two.json")
    d0 = _json("run", "--trace", path, "--device", "0")
    # one device in the report: the headline needs no device prefix
    assert [p["device"] for p in d0["phases"] if p["name"] == "all"] == [0]
    assert d0["headline"]["text"].startswith("GPU idle 20% of the 1.8 ms GPU window")
    assert d0["headline"]["device"] == 0
    d1 = _json("run", "--trace", path, "--device", "1")
    assert d1["symptoms"] == [] and d1["headline"] is None
    assert [v["device"] for v in d1["device_verdicts"]] == [1]


def test_the_largest_stake_across_devices_leads(tmp_path):
    # both devices idle: device 0 20 % (0.36 ms), device 1 30 %: 10 x 126 µs with 9 gaps of 60 µs,
    # window 1260 + 540 = 1800 µs, idle 0.54 ms: device 1's S3 has the larger stake and leads
    path = two_device_trace(k1=126, gap1=60).write(tmp_path / "two.json")
    d = _json("run", "--trace", path)
    assert [(s["id"], s["device"], s["stake_ms"]) for s in d["symptoms"]] == [("S3-gpu-idle", 1, 0.54), ("S3-gpu-idle", 0, 0.36)]
    assert d["headline"]["text"].startswith("device 1: GPU idle 30% of the 1.8 ms GPU window")
    assert (d["headline"]["device"], d["headline"]["share"]) == (1, 0.3)


def test_fleet_row_shows_each_devices_top_symptom(tmp_path):
    two = two_device_trace().write(tmp_path / "rank0.json")
    one = two_device_trace(devices=(0,)).write(tmp_path / "rank1.json")
    r = _run("run", "--trace", two, "--trace", one, "--format", "json", "--executor", "serial")
    assert r.exit_code == 0, r.output
    rows = {row["path"].rsplit("/", 1)[-1]: row for row in json.loads(r.output)["ranks"]}
    assert rows["rank0.json"]["top_symptom"] == "0: S3-gpu-idle; 1: —"
    assert [(h["device"], h["rule_id"]) for h in rows["rank0.json"]["device_headlines"]] == [(0, "S3-gpu-idle"), (1, None)]
    assert rows["rank1.json"]["top_symptom"] == "S3-gpu-idle" and rows["rank1.json"]["device_headlines"] == []
    text = _run("run", "--trace", two, "--trace", one, "--executor", "serial").output
    assert "0: S3-gpu-idle; 1:" in text  # the cell folds at the column's width


def test_html_and_web_views_list_each_devices_headline_and_the_kernel_tables_device(tmp_path):
    pytest.importorskip("dash")
    from diagnose.app.html import write_html
    from diagnose.app.server import kernel_table_view, overview_page

    path = two_device_trace().write(tmp_path / "two.json")
    a = diagnose_trace(str(path))
    out = write_html(a, tmp_path / "r.html")
    page = out.read_text(encoding="utf-8")
    assert '<ul id="device-headlines"><li>device 0: GPU idle 20% of the 1.8 ms GPU window' in page
    assert "<li>device 1: no symptom rule fired</li>" in page
    assert '<table id="kernel-table"><thead><tr><th>device</th><th>phase</th>' in page

    entry = SimpleNamespace(report=a.to_dict(), path=str(path), label="two.json")  # what the overview reads
    ul = next(c for c in overview_page(entry).children if getattr(c, "id", None) == "device-headlines")
    assert [li.children for li in ul.children] == [
        "device 0: GPU idle 20% of the 1.8 ms GPU window, mostly dependency (longest such gap: nothing in the trace)",
        "device 1: no symptom rule fired"]
    table = kernel_table_view(a.to_dict())
    assert [th.children for th in table.children[0].children.children][:2] == ["device", "phase"]


def test_terminal_kernel_table_carries_the_device(tmp_path):
    path = two_device_trace().write(tmp_path / "two.json")
    text = _run("run", "--trace", path).output
    header = next(line for line in text.splitlines() if "input dims" in line)
    assert header.split()[0] == "dev"
    rows = [line for line in text.splitlines() if "gemm_kernel" in line]
    assert {line.split()[0] for line in rows} >= {"0", "1"}


# ---------------------------------------------------------------- compare and sweep pair devices


def test_compare_pairs_devices_by_id_and_prints_the_pairs(tmp_path):
    base = two_device_trace().write(tmp_path / "base.json")
    # the candidate: device 1 now idles 30 % (10 x 126 µs, gaps 60 µs) and device 0 10 % (10 x 162, gaps 20):
    # the busiest device is 0 in the candidate and 1 in the baseline
    cand = two_device_trace(k0=162, gap0=20, k1=126, gap1=60).write(tmp_path / "cand.json")
    d = _json("compare", "--baseline", base, "--candidate", cand)
    assert d["pairs"] == [{"baseline": 0, "candidate": 0}, {"baseline": 1, "candidate": 1}]
    idle = {tuple(r["devices"]): (r["baseline"], r["candidate"], r["change"]) for r in d["metrics"]
            if r["finding"] == "all.gpu_idle_share"}
    # device 0: 20 % -> 10 %; device 1: 10 % -> 30 % (never device 0 against device 1)
    assert idle == {(0, 0): (0.2, 0.1, pytest.approx(-0.1, abs=1e-12)), (1, 1): (0.1, 0.3, pytest.approx(0.2, abs=1e-12))}
    # trace-scope symptoms matched per device: S3 resolved on device 0, new on device 1
    assert d["new_trace_symptoms"] == ["S3-gpu-idle"] and d["resolved_trace_symptoms"] == ["S3-gpu-idle"]
    text = _run("compare", "--baseline", base, "--candidate", cand).output
    assert "devices paired: baseline 0 with candidate 0, baseline 1 with candidate 1" in text
    assert re.search(r"GPU idle share\s+1:1\s+10\.0 %\s+30\.0 %\s+\+20\.0 pp", text)
    assert "new in candidate: S3-gpu-idle [medium] on device 1" in text
    assert "resolved in candidate: S3-gpu-idle on device 0" in text


def test_compare_refuses_different_device_sets_unless_told_which_to_pair(tmp_path):
    base = two_device_trace().write(tmp_path / "base.json")
    one = two_device_trace(devices=(0,)).write(tmp_path / "one.json")
    r = _run("compare", "--baseline", base, "--candidate", one)
    assert r.exit_code == 2
    assert r.output == ("error: the traces hold different devices (baseline: 0, 1; candidate: 0): say which to pair with "
                        "--pair-devices D:D[,...] (e.g. --pair-devices 0:0), or analyse one with --device\n")
    d = _json("compare", "--baseline", base, "--candidate", one, "--pair-devices", "1:0")
    assert d["pairs"] == [{"baseline": 1, "candidate": 0}]
    # baseline device 1 (10 % idle) against the candidate's only device (20 %)
    row = next(r for r in d["metrics"] if r["finding"] == "all.gpu_idle_share")
    assert (row["devices"], row["baseline"], row["candidate"]) == ([1, 0], 0.1, 0.2)
    bad = _run("compare", "--baseline", base, "--candidate", one, "--pair-devices", "0:1")
    assert bad.exit_code == 2 and bad.output == (
        "error: --pair-devices 0:1: device 1 is not in candidate (devices with GPU activity: 0)\n")
    # files of one device each are paired whatever their ids (a file per rank)
    other = KinetoBuilder(deviceProperties=[{"id": 3, **H100}])
    other.runtime("cudaLaunchKernel", 1, 2, 7).kernel("gemm_kernel", 1000, 100, 7, device=3)
    d = _json("compare", "--baseline", one, "--candidate", other.write(tmp_path / "dev3.json"))
    assert d["pairs"] == [{"baseline": 0, "candidate": 3}]


def test_sweep_pairs_devices_and_refuses_different_sets(tmp_path):
    a = two_device_trace().write(tmp_path / "a.json")
    b = two_device_trace(k0=162, gap0=20).write(tmp_path / "b.json")
    one = two_device_trace(devices=(0,)).write(tmp_path / "one.json")
    d = _json("sweep", "--trace", a, "--trace", b)
    assert d["pairs"] == [[0, 0], [1, 1]]
    assert [[p["device"] for p in pr["points"]] for pr in d["pairings"]] == [[0, 0], [1, 1]]
    assert "devices paired: trace 1 0 with trace 2 0, trace 1 1 with trace 2 1" in _run("sweep", "--trace", a, "--trace", b).output
    r = _run("sweep", "--trace", a, "--trace", one)
    assert r.exit_code == 2 and r.output.count("\n") == 1
    assert r.output.startswith("error: the traces hold different devices (trace 1: 0, 1; trace 2: 0)")
    d = _json("sweep", "--trace", a, "--trace", one, "--pair-devices", "0:0")
    assert d["pairs"] == [[0, 0]]


# ---------------------------------------------------------------- streams: one denominator per share


def three_stream_moe_trace() -> KinetoBuilder:
    """One decode step; three streams of one device, every kernel launched up front:

    * stream 7: 4 MoE expert GEMMs (fused_moe_kernel) of 150 µs, 100..700;
    * stream 8: DeepEP's all-to-all dispatch 120..320 and combine 600..800 (200 µs each);
    * stream 9: a shared-expert GEMM (nvjet) 150..350.
    """
    b = KinetoBuilder()
    b.annotation("diagnose:decode[bs=8 ctx=2048]", 0, 60)
    launches = [("fused_moe_kernel", 100 + 150 * i, 150, 7) for i in range(4)]
    launches += [("void deep_ep::intranode::dispatch<8, 768>(int4*, float*)", 120, 200, 8),
                 ("void deep_ep::intranode::combine<8, 768>(int4*, float*)", 600, 200, 8),
                 ("nvjet_hsh_128x256_64x4_1x2_h_bz_coopB_NNT", 150, 200, 9)]
    for i, (name, ts, dur, stream) in enumerate(launches):
        b.launch(name, ts, dur, launch_ts=2 + 5 * i, stream=stream)
    return b


def test_three_streams_shares_of_the_kernel_busy_time_and_hidden_all_to_all(tmp_path):
    path = three_stream_moe_trace().write(tmp_path / "moe3.json")
    d = _json("run", "--trace", path)
    p = next(p for p in d["phases"] if p["name"] == "decode")
    # window 100..800 = 0.7 ms, busy 0.7 ms (the combine ends the window); kernels summed 4 x 150
    # + 2 x 200 + 200 = 1.2 ms, but kernels run 0.7 ms: the busy union is the denominator
    assert (p["window_ms"], p["gpu_busy_ms"], p["kernel_ms"], p["kernel_busy_ms"]) == (0.7, 0.7, 1.2, 0.7)
    # each category's busy union: MoE 100..700, the all-to-all 120..320 + 600..800 (DeepEP moves
    # tokens between GPUs: communication), the shared-expert GEMM 150..350
    assert p["categories_ms"] == {"gemm": 0.2, "communication": 0.4, "moe": 0.6}
    f = d["findings"]
    assert (f["decode.moe_share"], f["decode.comm_share"], f["decode.gemm_share"]) == (
        pytest.approx(0.6 / 0.7, abs=1e-12), pytest.approx(0.4 / 0.7, abs=1e-12), pytest.approx(0.2 / 0.7, abs=1e-12))
    assert all(0 <= v <= 1 for k, v in f.items() if k.endswith("_share") and v is not None)
    # communication alone on the GPU only 700..800; the rest hidden: 120..320 behind the MoE GEMMs
    # (and 150..320 behind the shared GEMM), 600..700 behind the MoE GEMMs
    assert (p["comm_exposed_ms"], p["comm_hidden_ms"]) == (0.1, 0.3)
    assert p["comm_hidden_behind_ms"] == {"gemm": 0.17, "moe": 0.3}
    assert f["decode.comm_exposed_share"] == pytest.approx(0.1 / 0.7, abs=1e-12)  # 14.3 % < 15 %: S4 does not fire
    assert f["decode.comm_hidden_share"] == pytest.approx(0.75, abs=1e-12)
    assert "S4-decode-comm-exposed" not in [s["id"] for s in d["symptoms"]]
    # the headline's share is the one its text prints: 0.6 / 0.7 = 85.7 % of kernel time
    h = d["headline"]
    assert h["text"] == "decode is MoE-kernel-bound: 86% of kernel time (0.60 ms) in MoE expert kernels"
    assert (h["rule_id"], h["share"], h["share_of"], h["ms"]) == ("moe-kernel-bound", 0.857143, "kernel_time", 0.6)
    text = _run("run", "--trace", path).output
    assert "► decode is MoE-kernel-bound: 86% of kernel time (0.60 ms) in MoE expert kernels" in text
    assert "decode (device 0): categories ms: moe 0.600, communication 0.400, gemm 0.200" in text


def test_exposed_all_to_all_fires_s4_with_the_share_it_prints(tmp_path):
    # the same trace with the combine moved to 700..900: alone on the GPU for 200 of 800 µs
    b = three_stream_moe_trace()
    ev = next(e for e in b.events if e.get("name", "").startswith("void deep_ep::intranode::combine"))
    ev["ts"] = 700
    d = _json("run", "--trace", b.write(tmp_path / "moe3x.json"))
    p = next(p for p in d["phases"] if p["name"] == "decode")
    assert (p["window_ms"], p["comm_exposed_ms"], p["comm_hidden_ms"]) == (0.8, 0.2, 0.2)
    s4 = next(s for s in d["symptoms"] if s["id"] == "S4-decode-comm-exposed")
    # 0.2 / 0.8 = 25 % > 15 %
    assert (s4["share"], s4["share_of"], s4["share_base_ms"], s4["stake_ms"]) == (0.25, "phase_window", 0.8, 0.2)
    assert s4["headline"] == ("decode communication is exposed: only communication kernels run for 25% of the 0.800 ms GPU "
                              "window (0.20 ms; 0.20 ms more hidden behind compute)")


def test_gate_checks_every_device(tmp_path):
    path = two_device_trace().write(tmp_path / "two.json")
    # --max-idle-share 0.15: device 0 (20 %) fails, device 1 (10 %) passes; S3 fires on device 0
    out = _json("gate", "--trace", path, "--phase", "all", "--max-idle-share", "0.15", "--fail-on", "medium")
    assert out["result"] == "fail" and out["devices"] == [0, 1] and out["device"] == 0
    idle = {c["device"]: (c["status"], c["value"]) for c in out["checks"] if c["metric"] == "gpu_idle_share"}
    assert idle == {0: ("fail", 0.2), 1: ("pass", 0.1)}
    assert [(s["id"], s["device"]) for s in out["symptoms"]] == [("S3-gpu-idle", 0)]
    text = _run("gate", "--trace", path, "--phase", "all", "--max-idle-share", "0.15").output
    assert "FAIL  device 0: all gpu_idle_share 20.0 % > 15.0 %" in text
    assert "PASS  device 1: all gpu_idle_share 10.0 % <= 15.0 %" in text
    # --device 1 still checks that device alone: it passes
    assert _run("gate", "--trace", path, "--phase", "all", "--max-idle-share", "0.15", "--device", "1").exit_code == 0


# ---------------------------------------------------------------- categories by what a kernel does


#: One kernel name per communication row of kernel_categories.yaml, in the table's order (the
#: names its ``source`` cites), and the Inductor kernel of the same words.
COMM_KERNELS = [
    ("ncclDevKernel_AllReduce_Sum_bf16_RING_LL", "triton_red_fused_nccl_reduce_scatter_1", "elementwise"),
    ("void vllm::cross_device_reduce_1stage<__nv_bfloat16, 8>(vllm::RankData*)", "triton_poi_fused_all_gather_3", "elementwise"),
    ("multimem_all_reduce_kernel", "triton_per_fused_multimem_0", "elementwise"),
    ("moeA2ADispatchKernel", "triton_poi_fused_all_to_all_0", "elementwise"),
    # Inductor kernels named after a dispatch/combine are MoE's local permutation (the moe row)
    ("void deep_ep::internode::combine<true>(int)", "triton_poi_fused_deep_ep_internode_combine_0", "moe"),
    ("nvshmemx_barrier_all_on_stream_kernel", "triton_poi_fused_nvshmem_2", "elementwise"),
    ("dispatchKernel", "triton_poi_fused_dispatchKernel_0", "moe"),
    ("EpDispatchIntraNodeKernel", "triton_poi_fused_EpDispatchIntraNodeKernel_0", "moe"),
]


def test_every_category_row_cites_its_source_and_comm_rows_never_take_inductor_kernels():
    from diagnose.analyzers.categories import classify_kernel
    from diagnose.tables import category_table

    rows = category_table().categories
    assert all(len(r.source.strip()) > 20 for r in rows), [r.pattern for r in rows if len(r.source.strip()) <= 20]
    comm = [r for r in rows if r.category == "communication"]
    assert len(comm) == len(COMM_KERNELS) == 8
    for row, (name, inductor, cat) in zip(comm, COMM_KERNELS):
        # the row's own example is communication (this row or an earlier one), never its Inductor namesake
        assert classify_kernel(name) == "communication", name
        assert classify_kernel(inductor) == cat, inductor
        assert re.search(row.pattern, inductor, re.IGNORECASE) is None, (row.pattern, inductor)
