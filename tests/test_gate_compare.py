"""`diagnose gate`, `compare` and `sweep` on inline Kineto traces with known answers.

Trace shapes (all times µs, as Kineto writes them):

* eager decode: 5 steps `diagnose:decode[bs=1 ctx=2048]`, one every 200 µs, 8 kernels of 9 µs
  per step, each launched by its own cudaLaunchKernel 20 µs apart. Every launch call ends
  after the previous kernel finished, so every gap is a launch gap: window 949 µs (first
  kernel at 4, last ends at 953), busy 5 * 8 * 9 = 360 µs, idle 589 µs: 35 gaps of 11 µs inside
  the steps are launch (the host's untraced 8 µs before each 2 µs launch call is no more than one
  launch costs), the 4 gaps of 51 µs between steps host_unknown (40 µs with no host event on the
  launching thread: the marker ended, the next had not begun): launch gaps 385 µs.
* graph decode: the same 5 steps and kernels replayed from one cudaGraphLaunch per step
  (all kernels share its correlation id). The host issues a step every 20 µs, ahead of the
  GPU, so kernels run back to back with 1 µs gaps inside each replay: window 399 µs, busy 360,
  idle 39 µs, launch gaps 0.
"""
from __future__ import annotations

import gzip
import json
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

from diagnose.rules_cli import compare_command, gate_command, sweep_command

N_STEPS, KERNELS, KERNEL_US = 5, 8, 9


def eager_decode(kineto, path, ctx=2048):
    b = kineto()
    for i in range(N_STEPS):
        t = 1000 + 200 * i
        b.annotation(f"diagnose:decode[bs=1 ctx={ctx}]", t, 160)
        for j in range(KERNELS):
            h = t + 1 + 20 * j  # launch call [h, h + 2]
            b.launch(f"gemv_kernel_{j}", h + 3, KERNEL_US, launch_ts=h, launch_dur=2)
    return b.write(path)


def graph_decode(kineto, path, ctx=2048):
    b = kineto()
    corr = 9000
    gpu_free = 0
    for i in range(N_STEPS):
        t = 1000 + 20 * i
        b.annotation(f"diagnose:decode[bs=1 ctx={ctx}]", t, 10)
        corr += 1
        b.runtime("cudaGraphLaunch", t + 1, 3, corr)
        s = max(t + 5, gpu_free + 1)
        for j in range(KERNELS):
            b.kernel(f"gemv_kernel_{j}", s + 10 * j, KERNEL_US, corr)
        gpu_free = s + 10 * (KERNELS - 1) + KERNEL_US
    return b.write(path)


def periodic_decode(kineto, path, period_us, n_steps=20, ctx=2048, bs=1, kernels=4):
    """Decode steps every ``period_us``; each step's GPU work (4 kernels, 10 % of the period
    each) ends at a fixed offset, so every TPOT sample equals the period."""
    b = kineto()
    kd = period_us / 10
    for i in range(n_steps):
        t = 1000 + period_us * i
        b.annotation(f"diagnose:decode[bs={bs} ctx={ctx}]", t, 20)
        for j in range(kernels):
            b.launch(f"gemv_kernel_{j}", t + 10 + kd * j, kd, launch_ts=t + 1 + 2 * j, launch_dur=1)
    return b.write(path)


def run(cmd, args):
    return CliRunner().invoke(cmd, [str(a) for a in args])


# ---------------------------------------------------------------- gate


def test_gate_eager_decode_fires_s3_and_fails(kineto, tmp_path):
    trace = eager_decode(kineto, tmp_path / "eager.json")
    r = run(gate_command, ["--trace", trace, "--format", "json"])
    assert r.exit_code == 1, r.output
    out = json.loads(r.output)
    assert out["result"] == "fail"
    check = [c for c in out["checks"] if c["phase"] == "decode"][0]
    assert check["status"] == "fail"
    assert check["value"] == pytest.approx(385 / 949, abs=1e-6)
    assert check["threshold"] == 0.15
    fired = {s["id"]: s for s in out["symptoms"]}
    assert "S3-launch-gaps" in fired
    # no idle with an external cause: the own window is the whole 949 µs window; launch gaps
    # are the dispatch part of each gap (issue 22)
    assert fired["S3-launch-gaps"]["evidence"]["findings"]["decode.launch_gap_own_share"] == pytest.approx(385 / 949, abs=1e-6)
    assert fired["S3-launch-gaps"]["evidence"]["findings"]["decode.launch_gap_count"] == N_STEPS * (KERNELS - 1)
    assert fired["S3-launch-gaps"]["summary"].startswith("decode launch gaps 40.6% of the 0.95 ms GPU window > 15%")


def test_gate_graph_replay_passes(kineto, tmp_path):
    trace = graph_decode(kineto, tmp_path / "graph.json")
    r = run(gate_command, ["--trace", trace, "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["result"] == "pass"
    check = [c for c in out["checks"] if c["phase"] == "decode"][0]
    assert check["status"] == "pass" and check["value"] == 0.0
    fired = {s["id"] for s in out["symptoms"]}
    assert not {i for i in fired if i.startswith("S3")}
    # text output: measured vs threshold
    r = run(gate_command, ["--trace", trace])
    assert r.exit_code == 0
    assert "PASS  decode launch_gap_share 0.0 % <= 15.0 %" in r.output
    assert r.output.rstrip().endswith("result: PASS")


def test_gate_graph_idle_share_exact(kineto, tmp_path):
    trace = graph_decode(kineto, tmp_path / "graph.json")
    r = run(gate_command, ["--trace", trace, "--max-idle-share", "0.05", "--format", "json"])
    assert r.exit_code == 1
    idle = [c for c in json.loads(r.output)["checks"] if c["metric"] == "gpu_idle_share"][0]
    assert idle["value"] == pytest.approx(39 / 399, abs=1e-6) and idle["status"] == "fail"
    assert run(gate_command, ["--trace", trace, "--max-idle-share", "0.10"]).exit_code == 0


def test_gate_eager_text_output(kineto, tmp_path):
    trace = eager_decode(kineto, tmp_path / "eager.json")
    r = run(gate_command, ["--trace", trace])
    assert r.exit_code == 1
    assert "FAIL  decode launch_gap_share 40.6 % > 15.0 % (window 0.949 ms, 5 steps)" in r.output
    assert "[high] S3-launch-gaps" in r.output
    assert "result: FAIL" in r.output


def test_gate_threshold_flag_and_override_agree(kineto, tmp_path):
    trace = eager_decode(kineto, tmp_path / "eager.json")
    r = run(gate_command, ["--trace", trace, "--max-launch-gap-share", "0.7", "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert "S3-launch-gaps" not in {s["id"] for s in out["symptoms"]}  # the rule used 0.7 too
    r = run(gate_command, ["--trace", trace, "--threshold", "S3-launch-gaps.max_launch_gap_share=0.7", "--format", "json"])
    assert r.exit_code == 0
    assert [c for c in json.loads(r.output)["checks"] if c["phase"] == "decode"][0]["threshold"] == 0.7
    cfg = tmp_path / "rules.yaml"
    cfg.write_text("thresholds:\n  S3-launch-gaps: {max_launch_gap_share: 0.7}\n")
    assert run(gate_command, ["--trace", trace, "--rules-config", cfg]).exit_code == 0


def test_gate_fail_on_severity(kineto, tmp_path):
    trace = graph_decode(kineto, tmp_path / "graph.json")
    # Every kernel of these traces is 9 µs: small-kernel-tax fires on both (360 µs of kernels
    # under 15 µs in the 399 µs graph window); it is off here, the test is about --fail-on.
    cfg = tmp_path / "rules.yaml"
    cfg.write_text("disable: [small-kernel-tax]\n")
    # Timed as the user's own regions (--phase-regex), the graph trace fires one info rule only:
    # each region ends on the CPU before its GPU work (S7). Engine markers alone would not.
    user = ["--phase-regex", "decode=^diagnose:decode", "--rules-config", cfg]
    assert json.loads(run(gate_command, ["--trace", trace, "--format", "json", "--rules-config", cfg]).output)["symptoms"] == []
    r = run(gate_command, ["--trace", trace, "--format", "json", *user])
    fired = {s["id"]: s["severity"] for s in json.loads(r.output)["symptoms"]}
    assert fired == {"S7-cpu-region-shorter-than-gpu": "info"}
    assert run(gate_command, ["--trace", trace, "--fail-on", "low", *user]).exit_code == 0
    r = run(gate_command, ["--trace", trace, "--fail-on", "info", *user])
    assert r.exit_code == 1
    assert "fail-on: info -> 1 symptom(s) at or above it" in r.output
    # With the launch-gap limit raised to 0.7, the eager trace still fires S3-gpu-idle and
    # S3-host-bound (the host's launches), high: the idle time is more than half of the steps'
    # own time (severity follows the time at stake); its step regions (160 µs) outlast their
    # GPU span (144 µs), so no S7 here.
    eager = eager_decode(kineto, tmp_path / "eager.json")
    raised = ["--max-launch-gap-share", "0.7", "--rules-config", cfg]
    out = json.loads(run(gate_command, ["--trace", eager, *raised, "--format", "json"]).output)
    assert {s["id"]: s["severity"] for s in out["symptoms"]} == {"S3-host-bound": "high", "S3-gpu-idle": "high"}
    assert out["symptoms"][0]["stake_share"] >= 0.5 and out["symptoms"][0]["stake_share_of"] == "step_span"
    assert run(gate_command, ["--trace", eager, *raised, "--fail-on", "critical"]).exit_code == 0
    assert run(gate_command, ["--trace", eager, *raised, "--fail-on", "high"]).exit_code == 1


def test_gate_on_real_vllm_graph_trace():
    from conftest import shared_trace

    trace = shared_trace("tracelens/vllm_decode_full/graph_execution.json.gz")
    r = run(gate_command, ["--trace", trace, "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    decode = [c for c in out["checks"] if c["phase"] == "decode"][0]
    assert decode["value"] == 0.0 and decode["status"] == "pass"
    assert out["device"] == 2


def test_gate_missing_file_exits_2(tmp_path):
    r = run(gate_command, ["--trace", tmp_path / "nope.json"])
    assert r.exit_code == 2
    assert r.output.strip().startswith("error: ") and len(r.output.strip().splitlines()) == 1
    assert "Traceback" not in r.output


def test_gate_not_a_trace_exits_2(tmp_path):
    p = tmp_path / "notes.json"
    p.write_text("this is not json")
    r = run(gate_command, ["--trace", p, "--junit", tmp_path / "j.xml"])
    assert r.exit_code == 2 and r.output.startswith("error: ")
    root = ET.parse(tmp_path / "j.xml").getroot()
    suite = root.find("testsuite")
    assert suite.get("errors") == "1" and suite.find("testcase/error") is not None


def test_gate_bad_threshold_exits_2(kineto, tmp_path):
    trace = graph_decode(kineto, tmp_path / "graph.json")
    r = run(gate_command, ["--trace", trace, "--threshold", "S3-launch-gaps.nope=1"])
    assert r.exit_code == 2 and "has no threshold 'nope'" in r.output
    r = run(gate_command, ["--trace", trace, "--threshold", "S3-launch-gaps.max_launch_gap_share"])
    assert r.exit_code == 2 and "RULE.NAME=VALUE" in r.output


def test_gate_phase_without_data(kineto, tmp_path):
    trace = graph_decode(kineto, tmp_path / "graph.json")
    r = run(gate_command, ["--trace", trace, "--phase", "prefill"])
    assert r.exit_code == 1
    assert "prefill: no data (use --allow-missing to accept)" in r.output
    r = run(gate_command, ["--trace", trace, "--phase", "prefill", "--phase", "decode", "--allow-missing"])
    assert r.exit_code == 0, r.output
    assert "SKIP  prefill: no data (allowed by --allow-missing)" in r.output


def test_gate_partial_trace_fails_unless_allowed(kineto, tmp_path):
    trace = graph_decode(kineto, tmp_path / "graph.json")
    data = gzip.compress(trace.read_bytes())
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) - 40])  # a truncated gzip: loaded as a partial trace
    r = run(gate_command, ["--trace", cut, "--format", "json"])
    assert r.exit_code == 1, r.output
    rel = [c for c in json.loads(r.output)["checks"] if c["metric"] == "reliability"][0]
    assert rel["status"] == "fail" and "partial trace file" in rel["message"]
    r = run(gate_command, ["--trace", cut, "--allow-partial", "--allow-missing"])
    assert r.exit_code == 0, r.output
    assert "allowed by --allow-partial" in r.output


def test_gate_unreliable_quality_code_fails(kineto, tmp_path, monkeypatch):
    import diagnose.rules_cli as rc

    trace = graph_decode(kineto, tmp_path / "graph.json")
    real = rc.analyse_report

    def flagged(path, options, ruleset=None):
        import msgspec

        from diagnose.model import QualityIssue

        rep = real(path, options, ruleset)
        return msgspec.structs.replace(rep, quality=rep.quality + [QualityIssue(code="graph_coverage_low", message="coverage 40 %")])

    monkeypatch.setattr(rc, "analyse_report", flagged)
    r = run(gate_command, ["--trace", trace])
    assert r.exit_code == 1 and "quality: graph_coverage_low" in r.output
    assert run(gate_command, ["--trace", trace, "--allow-partial"]).exit_code == 0


def test_gate_junit(kineto, tmp_path):
    trace = eager_decode(kineto, tmp_path / "eager.json")
    junit = tmp_path / "out.xml"
    r = run(gate_command, ["--trace", trace, "--junit", junit, "--fail-on", "high"])
    assert r.exit_code == 1
    suite = ET.parse(junit).getroot().find("testsuite")
    cases = {(c.get("classname"), c.get("name")): c for c in suite.findall("testcase")}
    assert cases[("diagnose.gate.trace", "reliability")].find("failure") is None
    assert cases[("diagnose.gate.decode", "launch_gap_share")].find("failure") is not None
    assert cases[("diagnose.rules", "S3-launch-gaps")].find("failure") is not None
    assert cases[("diagnose.rules", "S2-decode-far-from-bound")].find("skipped") is not None  # not evaluated
    n_fail = sum(1 for c in suite.findall("testcase") if c.find("failure") is not None)
    assert suite.get("failures") == str(n_fail) and suite.get("tests") == str(len(cases))


# ---------------------------------------------------------------- compare


def test_compare_flags_60_percent_tpot_regression(kineto, tmp_path):
    base = periodic_decode(kineto, tmp_path / "base.json", 1000)
    cand = periodic_decode(kineto, tmp_path / "cand.json", 1600)
    r = run(compare_command, ["--baseline", base, "--candidate", cand, "--format", "json"])
    assert r.exit_code == 1, r.output
    out = json.loads(r.output)
    assert out["regression"] is True
    assert out["deltas"]["delta.tpot_p99_ratio"] == pytest.approx(1.6)
    assert out["deltas"]["delta.tpot_p50_ratio"] == pytest.approx(1.6)
    rows = {m["name"]: m for m in out["metrics"]}
    assert rows["TPOT p99 (ms)"]["baseline"] == pytest.approx(1.0)
    assert rows["TPOT p99 (ms)"]["candidate"] == pytest.approx(1.6)
    assert [s["id"] for s in out["symptoms"]] == ["latency-regression"]
    r = run(compare_command, ["--baseline", base, "--candidate", cand])
    assert r.exit_code == 1
    assert "TPOT p99 (ms)" in r.output and "x1.600 (+60.0 %)" in r.output
    assert "verdict: REGRESSION" in r.output


def test_compare_passes_10_percent(kineto, tmp_path):
    base = periodic_decode(kineto, tmp_path / "base.json", 1000)
    cand = periodic_decode(kineto, tmp_path / "cand.json", 1100)
    r = run(compare_command, ["--baseline", base, "--candidate", cand, "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["regression"] is False
    assert out["deltas"]["delta.tpot_p99_ratio"] == pytest.approx(1.1)
    assert out["symptoms"] == []
    r = run(compare_command, ["--baseline", base, "--candidate", cand])
    assert r.exit_code == 0 and "verdict: no regression" in r.output
    # A stricter roll-back threshold turns the same 10 % into a regression.
    r = run(compare_command, ["--baseline", base, "--candidate", cand, "--threshold", "latency-regression.max_regression=0.05"])
    assert r.exit_code == 1


def test_compare_metrics_file_s6(kineto, tmp_path):
    base = periodic_decode(kineto, tmp_path / "base.json", 1000)
    m = tmp_path / "m.json"
    m.write_text(json.dumps({"perplexity_baseline": 5.0, "perplexity_candidate": 5.4}))
    r = run(compare_command, ["--baseline", base, "--candidate", base, "--metrics", m])
    assert r.exit_code == 1
    assert "S6-perplexity-up" in r.output and "perplexity 5.000 -> 5.400 (+8.0% > +3%)" in r.output
    m.write_text(json.dumps({"perplexity_baseline": 5.0, "perplexity_candidate": 5.05}))
    assert run(compare_command, ["--baseline", base, "--candidate", base, "--metrics", m]).exit_code == 0
    r = run(compare_command, ["--baseline", base, "--candidate", base, "--metrics", tmp_path / "none.json"])
    assert r.exit_code == 2 and "metrics file not found" in r.output


def test_compare_new_symptoms_listed(kineto, tmp_path):
    base = graph_decode(kineto, tmp_path / "graph.json")
    cand = eager_decode(kineto, tmp_path / "eager.json")
    r = run(compare_command, ["--baseline", base, "--candidate", cand, "--format", "json"])
    out = json.loads(r.output)
    assert "S3-launch-gaps" in out["new_trace_symptoms"]
    change = {m["name"]: m for m in out["metrics"]}["decode launch-gap share"]["change"]
    assert change == pytest.approx(385 / 949, abs=1e-6)


def test_compare_missing_file_exits_2(kineto, tmp_path):
    base = periodic_decode(kineto, tmp_path / "base.json", 1000)
    r = run(compare_command, ["--baseline", base, "--candidate", tmp_path / "missing.json"])
    assert r.exit_code == 2 and r.output.startswith("error: ")


# ---------------------------------------------------------------- sweep


def test_sweep_context_from_step_markers_fires_s1(kineto, tmp_path):
    # TPOT = 1000 + 200 µs per 1024 tokens of context: 1.2, 1.8, 4.2 ms.
    paths = [periodic_decode(kineto, tmp_path / f"c{c}.json", 1000 + 200 * c // 1024, ctx=c, bs=8) for c in (1024, 4096, 16384)]
    args = ["--format", "json"]
    for p in paths:
        args += ["--trace", p]
    r = run(sweep_command, args)
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert [p["ctx"] for p in out["points"]] == [1024, 4096, 16384]
    assert [p["batch"] for p in out["points"]] == [8, 8, 8]
    assert [p["tpot_ms"] for p in out["points"]] == pytest.approx([1.2, 1.8, 4.2])
    f = out["findings"]
    assert f["sweep.tpot_ctx_slope_ms_per_1k"] == pytest.approx(0.2 / 1.024)
    assert f["sweep.tpot_ctx_slope_r2"] == pytest.approx(1.0)
    assert f["sweep.tpot_ctx_growth"] == pytest.approx(3.5)
    assert "S1-tpot-grows-with-context" in [s["id"] for s in out["symptoms"]]
    # --fail-on turns a sweep symptom into exit 1
    assert run(sweep_command, [*args, "--fail-on", "medium"]).exit_code == 1


def test_sweep_labels_for_gpus(kineto, tmp_path):
    one = periodic_decode(kineto, tmp_path / "tp1.json", 1000)
    four = periodic_decode(kineto, tmp_path / "tp4.json", 1100)
    r = run(sweep_command, ["--trace", one, "--trace", four, "--label", "gpus=1", "--label", "gpus=4", "--format", "json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.output)
    assert out["findings"]["sweep.tp_tpot_ratio"] == pytest.approx(1.1)
    assert [s["id"] for s in out["symptoms"]] == ["S4-tp-slower"]
    r = run(sweep_command, ["--trace", one, "--trace", four, "--label", "gpus=1", "--label", "gpus=4"])
    assert "[high] S4-tp-slower" in r.output


def test_sweep_input_errors(kineto, tmp_path):
    one = periodic_decode(kineto, tmp_path / "a.json", 1000)
    r = run(sweep_command, ["--trace", one])
    assert r.exit_code == 2 and "at least two" in r.output
    r = run(sweep_command, ["--trace", one, "--trace", one, "--label", "ctx=1"])
    assert r.exit_code == 2 and "one label per trace" in r.output
    r = run(sweep_command, ["--trace", one, "--trace", one, "--label", "ctx=1", "--label", "colour=2"])
    assert r.exit_code == 2 and "unknown key 'colour'" in r.output


def test_compare_new_symptoms_are_the_candidates_own():
    """New and resolved symptoms read each report's own verdicts, so their text is what
    `diagnose run` printed ("decode is MoE-kernel-bound ...", never "n/a is ..."); with rule
    options both reports are evaluated again with the same rules and labels: same text."""
    from conftest import ROOT, shared_trace
    from diagnose.compare import compare_reports
    from diagnose.engine import load_ruleset
    from diagnose.options import AnalysisOptions
    from diagnose.pipeline import diagnose_trace

    rs = load_ruleset()
    a = diagnose_trace(str(ROOT / "samples" / "tiny_cpu.json.gz"), AnalysisOptions(), rs).report
    b = diagnose_trace(str(shared_trace("tracelens/vllm_decode_full/graph_execution.json.gz")),
                       AnalysisOptions(model_config="gpt-oss-20b", gpu="MI300X"), rs).report
    own = [(s.summary, s.headline or None) for s in b.symptoms if s.id not in {x.id for x in a.symptoms}]
    assert any(h and h.startswith("decode is MoE-kernel-bound") for _, h in own), own
    for reevaluate in (False, True):
        cmp = compare_reports(a, b, rs, reevaluate=reevaluate)
        assert [(s["summary"], s.get("headline")) for s in cmp.new_symptoms] == own
        assert [s["id"] for s in cmp.resolved_symptoms] == [s.id for s in a.symptoms if s.id not in {x.id for x in b.symptoms}]
