"""What-if: re-timed steps on the synthetic fixtures (hand-derived savings), its two
properties on random traces (every saving within [0, time removed]; removing everything off
the path changes nothing), ranking by predicted saving, and ``diagnose whatif``."""
from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import shared_trace
from critpath_fixtures import OPTIONS, analysis, k, op, rt, step, trace_doc
from diagnose.analyzers import critpath as C
from diagnose.analyzers import whatif as W
from diagnose.cli import main
from diagnose.errors import DiagnoseError
from diagnose.pipeline import diagnose_trace, run_analysis


def _change(a, row, sc):
    (ch,) = W.step_changes(a.paths, sc, [row])
    return ch.saving_ns / 1000, ch.removed_ns / 1000


def _op(a, name):
    g = a.paths.graph
    return int(np.flatnonzero(g.name == name)[0])


@pytest.mark.parametrize("name, spec, saving_us", [
    ("f2_gpu_bound_host_ahead", (["switch"], []), 3.0),  # the three 1-µs gaps between queued kernels
    ("f6_graph_replay", (["graph"], []), 2.0),  # the two gaps inside the replay
    ("f6_graph_replay", ([], ["other=inf"]), 70.0),  # every kernel: host 10 + launch 30 + gaps 3 remain
    ("f1_serial_host_bound", (["launch"], []), 90.0),  # all host time; the last launch's latency + kc remain
    ("f5_overlap_hides_prep", (["launch:prepare_inputs"], []), 0.0),  # hidden behind step 1's kernel
    ("f5b_overlap_breaks", (["launch:prepare_inputs"], []), 80.0),  # its exposed 80 of 280 µs
    ("f5b_overlap_breaks", (["launch"], []), 90.0),  # + the launch latency
    ("f4_blocking_sync", (["host_blocked"], []), 40.0),  # aten::y starts at 12: k2 follows k1 at 115
])
def test_fixture_savings(name, spec, saving_us, tmp_path):
    a, row = analysis(name, tmp_path)
    saving, removed = _change(a, row, W.scenario(*spec))
    assert saving == saving_us
    assert 0 <= saving <= removed


def test_off_path_work_saves_nothing(tmp_path):
    a, row = analysis("f3_cross_stream_wait", tmp_path)
    assert _change(a, row, W.Scenario(ops=((_op(a, "kb"), 0.0),))) == (0.0, 50.0)  # kb: 50 µs, off the path
    assert _change(a, row, W.Scenario(ops=((_op(a, "ka"), 0.5),)))[0] == 100.0  # ka 200 -> 100 µs: kc starts at 122


def test_unblocked_time_counts_as_removed(tmp_path):
    """Removing host_blocked makes a blocking call return at once; that time is part of what
    the scenario removes in the window (a saving never exceeds it). A launch call [0, 5] µs
    whose kernel k1 [1, 2] ends while it still runs blocks; the next call [6, 11] launches
    k2 [7, 8]. Unblocked, call 1 returns at 0, call 2 starts at 1 (the 1-µs gap kept) and k2
    runs at [2, 3]: saving 5 µs of 8; removed: call 1's 5 µs and call 2's [6, 8] in the
    window, 7 µs (the step's path ends at 8). A hypothesis example once gave a saving of 6
    for a removal of 2 (the unblocked time was not counted, so host_blocked alone saved 0)."""
    events = [step(1, 0, 13), op("aten::work", 0, 6), rt("cudaLaunchKernel", 0, 5, 1), k("k1", 1, 1, 1, 7),
              op("aten::work", 6, 6), rt("cudaLaunchKernel", 6, 5, 2), k("k2", 7, 1, 2, 7)]
    a = _analyse(events, tmp_path)
    assert _change(a, 0, W.scenario(["host_blocked"])) == (5.0, 7.0)
    everything = W.Scenario(remove=(("host_blocked", None),), ops=tuple((i, 0.0) for i in range(a.paths.graph.n)))
    assert _change(a, 0, everything) == (6.0, 9.0)  # + the two kernels' 1 µs each: k2 at [2, 2]


def test_scenario_specs():
    sc = W.scenario(["compile_guard"] if "compile_guard" in W.REMOVABLE else ["cold_start"], ["gemm=2", "moe=inf"])
    assert sc.speedup == (("gemm", 2.0), ("moe", float("inf")))
    assert W.parse_remove("launch:attention\\.py") == ("launch", "attention\\.py")
    for bad in ("nonsense", "launch:(", "outside_trace"):
        with pytest.raises(DiagnoseError):
            W.parse_remove(bad)
    with pytest.raises(DiagnoseError, match="nests repeats"):  # a frame regex is an outside pattern (diagnose.patterns)
        W.parse_remove("launch:(a+)+$")
    for bad in ("gemm", "gemm=0.5", "gemm=x", "nope=2"):
        with pytest.raises(DiagnoseError):
            W.parse_speedup(bad)


# ---------------------------------------------------------------- properties


@st.composite
def _traces(draw):
    """A host thread launching kernels on two streams, with CPU work and syncs between."""
    events = []
    t, corr = 0, 0
    ends = {7: 0, 8: 0}
    last_end = 0
    n = draw(st.integers(1, 7))
    for _ in range(n):
        work = draw(st.integers(0, 40))
        events.append(op("aten::work", t, work + 6))
        t += work
        corr += 1
        events.append(rt("cudaLaunchKernel", t, 5, corr))
        s = draw(st.sampled_from([7, 8]))
        ks = max(t + draw(st.integers(1, 15)), ends[s] + draw(st.integers(0, 3)))
        kd = draw(st.integers(1, 60))
        events.append(k(f"k{corr}", ks, kd, corr, s))
        ends[s] = ks + kd
        last_end = max(last_end, ks + kd)
        t += 6
        if draw(st.booleans()) and draw(st.booleans()):
            corr += 1
            ret = max(t + 2, last_end + draw(st.integers(1, 4)))
            events.append(rt("cudaDeviceSynchronize", t, ret - t, corr))
            t = ret
    return [step(1, 0, t + 1)] + events


def _analyse(events, tmp_path):
    p = tmp_path / "prop.json"
    p.write_text(json.dumps(trace_doc(events)))
    return run_analysis(str(p), OPTIONS)


_SCENARIOS = st.sampled_from([W.scenario(["launch"]), W.scenario(["switch", "dependency"]), W.scenario(["host_blocked"]),
                              W.scenario(["idle"]), W.scenario([], ["other=3"]), W.scenario(["launch:work"], ["other=inf"])])


@pytest.mark.slow  # property loop (30 generated traces); test_fixture_savings and test_off_path_work_saves_nothing are the inner loop's
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=_traces(), sc=_SCENARIOS, keep=st.lists(st.floats(0, 1), min_size=8, max_size=8))
def test_saving_within_zero_and_removed(events, sc, keep, tmp_path):
    a = _analyse(events, tmp_path)
    if not a.paths.steps:
        return
    g = a.paths.graph
    sc = W.Scenario(remove=sc.remove, speedup=sc.speedup, ops=tuple((i, keep[i % 8]) for i in range(g.n)))
    for ch in W.step_changes(a.paths, sc):
        assert 0 <= ch.saving_ns <= ch.removed_ns


@pytest.mark.slow  # property loop (30 generated traces); test_fixture_savings and test_off_path_work_saves_nothing are the inner loop's
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(events=_traces())
def test_removing_everything_off_the_path_changes_nothing(events, tmp_path):
    a = _analyse(events, tmp_path)
    for key, p in a.paths.steps.items():
        g = a.paths.graph
        on = set(p.op[p.op >= 0].tolist())
        off_ops = tuple((i, 0.0) for i in range(g.n) if i not in on)
        hs = p.t0[p.kind == C.K_HOST]
        he = p.t1[p.kind == C.K_HOST]
        edges = [-(2**60)] + [x for ab in zip(hs.tolist(), he.tolist()) for x in ab] + [2**60]
        off_host = tuple((100, a_, b_) for a_, b_ in zip(edges[0::2], edges[1::2]) if b_ > a_)
        (ch,) = W.step_changes(a.paths, W.Scenario(ops=off_ops, host=off_host), [key])
        assert ch.saving_ns == 0


# ---------------------------------------------------------------- ranking and the command


def test_ranking_by_predicted_saving():
    """H100: removing every elementwise and norm kernel (20.2 ms at stake) shortens the step by
    only 2.416 ms -- the host launches the step's last kernels that late -- so the finding
    is ranked, and its severity set, by 2.416 ms."""
    a = diagnose_trace(str(shared_trace("tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")))
    s = a.report.symptoms[0]
    assert (s.id, s.stake_ms, s.predicted_saving_ms, s.rank_basis, s.severity) == (
        "elementwise-dominated", 20.179126, 2.415951, "predicted_saving", "low")
    assert a.report.headline.predicted_saving_ms == 2.415951


def test_rank_falls_back_to_stake_without_a_path(tmp_path):
    """A saved JSON report has no graph: its verdicts rank by stake."""
    from diagnose.pipeline import attach_verdicts

    a = run_analysis(str(shared_trace("tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz")))
    d = attach_verdicts(a.to_dict())
    s = d["symptoms"][0]
    assert s["rank_basis"] == "stake" and "predicted_saving_ms" not in s and s["severity"] == "high"


def test_whatif_command(tmp_path):
    p = shared_trace("nano-vllm-zhang-yuhui/profile_results/decode_gpu_0.json")
    # the CPU attention (nanovllm attention.py(363): attention_cpu, launching nothing) is host_compute
    # on the path as in the gaps (the cause table's name): 0.460937 ms of it on the path
    r = CliRunner().invoke(main, ["whatif", "--trace", str(p), "--remove", "host_compute:attention_cpu", "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["whatif"]["scenario"] == "--remove host_compute:attention_cpu"
    (row,) = d["whatif"]["steps"]
    assert (row["name"], row["path_ms"]) == ("trace", 2.871429)
    assert (row["saving_ms"], row["removed_ms"]) == (0.460937, 0.460937)
    r = CliRunner().invoke(main, ["whatif", "--trace", str(p), "--remove", "launch:attention_cpu", "--format", "json"])
    assert json.loads(r.output)["whatif"]["steps"][0]["removed_ms"] == 0  # not launch time
    assert [f["id"] for f in d["findings"]] == ["S3-host-bound", "S3-launch-gaps", "S3-gpu-idle", "host-compute", "host-blocked"]
    r = CliRunner().invoke(main, ["whatif", "--trace", str(p), "--speedup", "gemm=2"])
    assert r.exit_code == 0 and "Scenario: --speedup gemm=2" in r.output and "decode" in r.output
    r = CliRunner().invoke(main, ["whatif", "--trace", str(p), "--remove", "nope"])
    assert r.exit_code == 2 and "unknown cause 'nope'" in r.output


# ---------------------------------------------------------------- the fast walk


_WALK_TRACES = ["hta/critical_path_alexnet/benchmark_result_2869224_1695835535_trace.json.gz",
                "tracelens/vllm_decode_full/graph_execution.json.gz",
                "nano-vllm-zhang-yuhui/profile_results/decode_gpu_0.json",
                "hta/amd_trace/mi250_minitoy_train_ROCm6_2_kineto.json.gz"]


@pytest.mark.parametrize("rel", _WALK_TRACES)
def test_fast_walk_gives_the_reference_walks_shifts(rel, monkeypatch):
    """:func:`whatif._walk_fast` (chains of host calls summed with numpy, a Python step per
    activity and blocking call) re-times every step exactly as the event-by-event walk does,
    for GPU speedups, per-activity roofline scales, every host cause removed, lags removed,
    blocking calls unblocked and mixes of them."""
    a = run_analysis(str(shared_trace(rel)))
    paths = a.paths
    g = paths.graph
    rng = np.random.default_rng(0)
    ops = tuple((int(i), float(rng.choice([0.0, 0.5]))) for i in rng.choice(g.n, size=min(g.n, 200), replace=False))
    from diagnose.analyzers.hostpath import path_causes

    scs = ([W.scenario((), (f"{c}=inf",)) for c in ("gemm", "attention", "elementwise", "communication")]
           + [W.scenario((), ("gemm=2",)), W.Scenario(ops=ops)]
           + [W.scenario((c,), ()) for c in (*path_causes(), "idle", "launch", "host_blocked", "dependency", "switch", "graph")]
           + [W.scenario(("launch", "host_blocked"), ("gemm=2",)), W.scenario(("host_compute",), ("attention=inf",))])
    saved = 0
    from whatif_reference import walk_reference

    for sc in scs:
        monkeypatch.setattr(W, "REFERENCE_WALK", None)
        fast = W.step_changes(paths, sc)
        monkeypatch.setattr(W, "REFERENCE_WALK", walk_reference)
        assert fast == W.step_changes(paths, sc), sc.label
        saved += sum(c.saving_ns > 0 for c in fast)
    assert saved > 0  # the scenarios change something on this trace


def test_sum_to_marked_chains_equals_the_pointer_jumping():
    """Each thread's calls as one chain (parent: the thread's previous call; a chain's first
    call marked): the segmented sum gives sum_to_marked's answer; any other shape (a parent
    that is not the previous call, a first call unmarked) falls back to it."""
    from diagnose.analyzers.nesting import sum_to_marked, sum_to_marked_chains

    # threads 7: calls 0, 2, 3, 5; 9: calls 1, 4; marked 0, 3, 1
    group = np.array([7, 9, 7, 7, 9, 7])
    parent = np.array([-1, -1, 0, 2, 1, 3])
    mark = np.array([True, True, False, True, False, False])
    w = np.array([10, 20, 1, 30, 2, 4])
    root, acc = sum_to_marked_chains(group, parent, mark, w)
    assert root.tolist() == [0, 1, 0, 3, 1, 3] and acc.tolist() == [0, 0, 1, 0, 2, 4]
    rng = np.random.default_rng(3)
    for _ in range(50):
        n = int(rng.integers(1, 80))
        group = rng.integers(0, 4, n)
        parent = np.full(n, -1)
        last: dict[int, int] = {}
        for i, t in enumerate(group.tolist()):
            parent[i] = last.get(t, -1)
            last[t] = i
        mark = (rng.random(n) < 0.3) | (parent < 0)
        w = rng.integers(0, 100, n)
        want = sum_to_marked(np.where(mark, -1, parent), mark, w)
        got = sum_to_marked_chains(group, np.where(mark, -1, parent), mark, w)
        assert [a.tolist() for a in got] == [a.tolist() for a in want]
        if n > 1:  # a first call unmarked, or a parent not the previous call: the general answer
            odd = mark.copy()
            odd[0] = False
            assert [a.tolist() for a in sum_to_marked_chains(group, parent, odd, w)] == \
                [a.tolist() for a in sum_to_marked(parent, odd, w)]


def test_sum_to_marked_sums_up_to_the_nearest_marked_ancestor():
    from diagnose.analyzers.nesting import sum_to_marked

    # chains 0 <- 1 <- 2 <- 3 and 4 <- 5; 0, 2 and 4 marked
    parent = np.array([-1, 0, 1, 2, -1, 4])
    mark = np.array([True, False, True, False, True, False])
    w = np.array([10, 1, 20, 3, 40, 5])
    root, acc = sum_to_marked(parent, mark, w)
    assert root.tolist() == [0, 0, 2, 2, 4, 4]
    assert acc.tolist() == [0, 1, 0, 3, 0, 5]
    rng = np.random.default_rng(1)
    n = 500
    parent = np.array([-1] + [int(rng.integers(0, i)) for i in range(1, n)])
    mark = rng.random(n) < 0.1
    w = rng.integers(0, 1000, n)
    root, acc = sum_to_marked(parent, mark, w)
    for i in range(n):
        j, tot = i, 0
        while j >= 0 and not mark[j]:
            tot += int(w[j])
            j = int(parent[j])
        assert (int(root[i]), int(acc[i])) == (j, tot if j >= 0 else int(acc[i]))
