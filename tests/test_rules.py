"""Rule engine: rule files and fixtures, the condition allowlist, findings with exact numbers,
not-evaluated semantics, overrides, sweep/compare/metrics findings, generated reference."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st

from diagnose.errors import DiagnoseError
from diagnose.rules_cli import rules_group
from diagnose.compare import compare_findings
from diagnose.engine import RuleError, compile_condition, evaluate, load_rules, load_rules_config, parse_threshold_specs
from diagnose.report.rules_doc import rules_markdown
from diagnose.engine.fixtures import run_fixtures
from diagnose.catalog import catalog, catalog_regex
from diagnose.findings import findings_from_metrics, flatten
from diagnose.pipeline import attach_verdicts as add_verdicts_to_report
from diagnose.sweep import sweep_findings, sweep_points


def findings_from_report(report, device=None, include_unreliable=False):
    """:func:`diagnose.findings.flatten` of a (partial) JSON report."""
    return flatten(make_report(report), device, include_unreliable)


def findings_from_reports(reports, labels):
    """Compare findings for ["baseline", "candidate"], else sweep findings."""
    reports = [make_report(r) for r in reports]
    if [str(x) for x in labels] == ["baseline", "candidate"]:
        return compare_findings(reports[0], reports[1])
    return sweep_findings(sweep_points(reports, labels))
from diagnose.trace.kineto import load_kineto
from diagnose.analyzers import analyze

from conftest import ROOT, make_report, shared_trace

RULES_DIR = ROOT / "rules"
EXPECTED_IDS = {
    "S1-throughput-flat-with-batch", "S1-tpot-grows-with-context",
    "S2-decode-could-improve", "S2-decode-far-from-bound",
    "S3-gpu-idle", "S3-launch-gaps",
    "S4-decode-comm-exposed", "S4-tp-slower",
    "S5-long-prefill-stall", "S5-tpot-p99-spikes",
    "S6-perplexity-up",
    "S7-bandwidth-above-peak", "S7-cpu-region-shorter-than-gpu",
    "attention-share-long-prompt", "decode-at-bandwidth-limit", "decode-not-fed",
    "latency-regression", "prefill-short-prompt-mfu", "speculative-acceptance-low",
    "comm-exposed", "elementwise-dominated", "h2d-copies-dominate", "host-blocking-wait", "mixed-step-decode-stall",
    "moe-kernel-bound", "prefill-mfu-low", "small-kernel-tax", "layer-outlier",
    "S3-host-bound", "host-compute", "compile-guard", "data-loading", "first-call-setup", "host-blocked", "collective-wait",
    "cold-start",
    "kernel-loss", "second-lever", "precision",
}

# A minimal valid rule; tests replace fields to break it.
BASE_RULE = {
    "id": "T-test",
    "symptom": "S3",
    "title": "test rule",
    "severity": "high",
    "phase": "decode",
    "scope": "trace",
    "requires": ["decode.launch_gap_share"],
    "thresholds": {"max_share": {"value": 0.15, "unit": "fraction",
                                 "basis": {"kind": "article", "source": "docs/prefill-decode.md §5.1"},
                                 "rationale": "docs/prefill-decode.md §5.1"}},
    "condition": "decode__launch_gap_share > max_share",
    "summary": "gaps {decode.launch_gap_share:.1%} > {max_share:.0%}",
    "why": "why it matters",
    "likely_cause": "launch overhead",
    "how_to_verify": "look at the timeline",
    "fix": "CUDA graphs",
    "references": ["docs/prefill-decode.md §5.1"],
}


def write_rule(tmp_path: Path, **changes) -> Path:
    d = dict(BASE_RULE)
    d.update(changes)
    path = tmp_path / f"{d['id']}.yaml"
    path.write_text(yaml.safe_dump(d, sort_keys=False, allow_unicode=True))
    return path


def one_rule(**changes):
    import tempfile

    with tempfile.TemporaryDirectory() as td:
        return load_rules(write_rule(Path(td), **changes))[0]


# ---------------------------------------------------------------- rule files and fixtures


def test_packaged_rules_load_and_match_repo_files():
    rules = load_rules()
    assert {r.id for r in rules} == EXPECTED_IDS
    assert {p.stem for p in RULES_DIR.glob("*.yaml")} == EXPECTED_IDS
    assert [r.id for r in load_rules(RULES_DIR)] == [r.id for r in rules]
    for r in rules:
        assert r.references and r.fix and r.how_to_verify and r.likely_cause and r.why


def test_every_rule_has_positive_and_negative_fixtures():
    for rid in EXPECTED_IDS:
        data = yaml.safe_load((RULES_DIR / "fixtures" / f"{rid}.yaml").read_text())
        kinds = {c["expect"] for c in data["cases"]}
        assert {"fire", "pass"} <= kinds, rid


@pytest.mark.parametrize("rule_id", sorted(EXPECTED_IDS))
def test_rule_fixtures_pass(rule_id):
    results = [r for r in run_fixtures(load_rules()) if r.rule_id == rule_id]
    assert len(results) >= 2, rule_id
    bad = [(r.case, r.expect, r.got, r.detail) for r in results if not r.ok]
    assert bad == []


def test_rules_test_command_exits_0():
    res = CliRunner().invoke(rules_group, ["test"])
    assert res.exit_code == 0, res.output
    m = re.search(r"(\d+)/(\d+) fixture cases passed \((\d+) rules\)", res.output)
    assert m and m.group(1) == m.group(2) and int(m.group(3)) == len(EXPECTED_IDS)


def test_rules_test_command_exits_1_on_a_failing_fixture(tmp_path):
    write_rule(tmp_path)
    (tmp_path / "fixtures").mkdir()
    (tmp_path / "fixtures" / "T-test.yaml").write_text(yaml.safe_dump({"rule": "T-test", "cases": [
        {"name": "fires", "expect": "fire", "findings": {"decode.launch_gap_share": 0.3}},
        {"name": "wrongly expected to fire", "expect": "fire", "findings": {"decode.launch_gap_share": 0.1}},
        {"name": "passes", "expect": "pass", "findings": {"decode.launch_gap_share": 0.1}},
    ]}))
    res = CliRunner().invoke(rules_group, ["test", "--rules", str(tmp_path)])
    assert res.exit_code == 1
    assert "FAIL T-test :: wrongly expected to fire: expected fire, got pass" in res.output
    assert "2/3 fixture cases passed" in res.output


def test_rule_without_negative_fixture_fails(tmp_path):
    write_rule(tmp_path)
    (tmp_path / "fixtures").mkdir()
    (tmp_path / "fixtures" / "T-test.yaml").write_text(yaml.safe_dump({"rule": "T-test", "cases": [
        {"name": "fires", "expect": "fire", "findings": {"decode.launch_gap_share": 0.3}}]}))
    results = run_fixtures(load_rules(tmp_path), tmp_path)
    assert [r.got for r in results] == ["invalid"]
    assert "needs at least one 'fire'" in results[0].detail


def test_rule_without_fixture_file_fails(tmp_path):
    write_rule(tmp_path)
    results = run_fixtures(load_rules(tmp_path), tmp_path)
    assert [(r.rule_id, r.ok) for r in results] == [("T-test", False)]


# ---------------------------------------------------------------- schema and load-time checks


def test_schema_refuses_unknown_key(tmp_path):
    p = write_rule(tmp_path, colour="red")
    with pytest.raises(RuleError, match=r"T-test\.yaml: schema: .*'colour'"):
        load_rules(p)


def test_schema_refuses_bad_severity(tmp_path):
    p = write_rule(tmp_path, severity="urgent")
    with pytest.raises(RuleError, match=r"T-test\.yaml: schema: at severity"):
        load_rules(p)


def test_schema_refuses_threshold_without_rationale(tmp_path):
    p = write_rule(tmp_path, thresholds={"max_share": {"value": 0.15, "unit": "fraction",
                                                       "basis": {"kind": "article", "source": "docs/prefill-decode.md §5.1"}}})
    with pytest.raises(RuleError, match="rationale"):
        load_rules(p)


def test_id_must_match_file_name(tmp_path):
    d = dict(BASE_RULE)
    (tmp_path / "other-name.yaml").write_text(yaml.safe_dump(d))
    with pytest.raises(RuleError, match=r"other-name\.yaml: id 'T-test' does not match"):
        load_rules(tmp_path)


def test_unused_threshold_refused(tmp_path):
    th = dict(BASE_RULE["thresholds"], spare={"value": 1, "unit": "x", "basis": {"kind": "definition", "source": "one"},
                                                "rationale": "none here"})
    with pytest.raises(RuleError, match="spare declared but not used"):
        load_rules(write_rule(tmp_path, thresholds=th))


def test_summary_must_name_known_fields(tmp_path):
    with pytest.raises(RuleError, match="summary refers to 'decode.mbu'"):
        load_rules(write_rule(tmp_path, summary="MBU {decode.mbu:.1%}"))
    with pytest.raises(RuleError, match="conversions"):
        load_rules(write_rule(tmp_path, summary="{max_share!r}"))


def test_invalid_yaml_names_the_file(tmp_path):
    (tmp_path / "broken.yaml").write_text("id: [unclosed\n")
    with pytest.raises(RuleError, match=r"broken\.yaml: not valid YAML"):
        load_rules(tmp_path)


HOSTILE = [
    ("__import__('os').system('x')", "call to \"__import__('os').system\""),
    ("__import__('os')", "call to '__import__'"),
    ("().__class__", "attribute access"),
    ("decode__launch_gap_share.real > 0", "attribute access"),
    ("9**9**9 > 1", "'**'"),
    ("[x for x in ()]", "comprehension"),
    ("lambda: 1", "lambda"),
    ("'a'*10", "str constant"),
    ("open('f')", "call to 'open'"),
    ("decode__launch_gap_share[0] > 1", "subscript"),
    ("max_share if decode__launch_gap_share else 1", "conditional expression"),
    ("eval('1') > 0", "call to 'eval'"),
    ("decode__launch_gap_share % 2 > 0", "'%'"),
    ("decode__launch_gap_share // 2 > 0", "'//'"),
    ("decode__launch_gap_share in (1, 2)", "'in'"),
    ("(x := 1) > 0", "assignment expression"),
    ("decode__mbu > 0.5", "unknown name 'decode__mbu'"),
    ("os > 1", "unknown name 'os'"),
    ("max(decode__launch_gap_share, key=abs) > 0", "keyword"),
    ("decode__launch_gap_share + 1", "must be a truth value"),
    ("decode__launch_gap_share >", "not a valid expression"),
    ("not 1.5", "'not' needs a truth value"),
    ("(decode__launch_gap_share > 0) + 1 > 0", "arithmetic needs numbers"),
    ("f\"{max_share}\" == 'x'", "f-string"),
    ("-" * 5000 + "1 > 0", "too long"),
]


@pytest.mark.parametrize("cond,needle", HOSTILE, ids=[h[0][:30] for h in HOSTILE])
def test_hostile_conditions_refused_at_load(tmp_path, cond, needle):
    p = write_rule(tmp_path, condition=cond)
    with pytest.raises(RuleError) as ei:
        load_rules(p)
    msg = str(ei.value)
    assert "T-test.yaml" in msg
    assert needle in msg


def test_deeply_nested_condition_refused_without_crash():
    cond = "(" * 400 + "1" + ")" * 400 + " > 0"
    with pytest.raises(RuleError):
        compile_condition(cond, {}, "nested.yaml")


def test_engine_source_never_calls_eval_or_exec():
    src = "\n".join(p.read_text() for p in sorted((ROOT / "diagnose" / "engine").glob("*.py")))
    code_lines = [ln for ln in src.splitlines() if not ln.lstrip().startswith(("#", '"', "*", "``"))]
    body = "\n".join(code_lines)
    assert not re.search(r"(?<![\w.])(eval|exec|compile)\(", body)
    assert "pandas" not in body


def test_allowed_constructs_evaluate_exactly():
    r = one_rule(
        requires=["decode.launch_gap_share", "decode.gpu_idle_share"],
        condition="0 < decode__launch_gap_share <= max(max_share, abs(-0.1)) * 2 and not (decode__gpu_idle_share / 2 >= 1 or False)",
    )
    fire = evaluate([r], {"decode.launch_gap_share": 0.3, "decode.gpu_idle_share": 0.5})
    assert fire.fired_ids == ["T-test"]
    # 0.31 > max(0.15, 0.1) * 2 = 0.3
    assert evaluate([r], {"decode.launch_gap_share": 0.31, "decode.gpu_idle_share": 0.5}).fired_ids == []
    assert evaluate([r], {"decode.launch_gap_share": 0.2, "decode.gpu_idle_share": 2.0}).fired_ids == []


def test_division_by_zero_is_not_evaluated():
    r = one_rule(requires=["decode.launch_gap_share", "decode.kernel_ms"],
                 condition="decode__launch_gap_share / decode__kernel_ms > max_share")
    v = evaluate([r], {"decode.launch_gap_share": 0.3, "decode.kernel_ms": 0})
    assert v.symptoms == [] and v.passed == []
    assert v.not_evaluated[0]["reason"] == "condition could not be computed: ZeroDivisionError"


# ---------------------------------------------------------------- evaluate semantics


def test_missing_required_finding_is_not_evaluated_never_passing():
    rules = load_rules()
    v = evaluate(rules, {"decode.launch_gap_own_share": 0.3, "decode.activity_count": 100})
    ne = {n["id"]: n for n in v.not_evaluated}
    assert ne["S2-decode-far-from-bound"]["missing"] == ["decode.bound_ratio"]
    assert ne["decode-not-fed"]["missing"] == ["decode.mbu", "decode.mfu", "decode.gpu_idle_own_share"]
    assert "S2-decode-far-from-bound" not in {p["id"] for p in v.passed}
    assert v.fired_ids == ["S3-launch-gaps"]
    # None and NaN count as missing too.
    v2 = evaluate(rules, {"decode.bound_ratio": None, "decode.mbu": float("nan"), "decode.mfu": 0.01})
    ne2 = {n["id"]: n["missing"] for n in v2.not_evaluated}
    assert ne2["S2-decode-far-from-bound"] == ["decode.bound_ratio"]
    assert ne2["decode-not-fed"] == ["decode.mbu", "decode.gpu_idle_own_share"]


_ALL_NAMES = sorted({n for r in load_rules() for n in (*r.requires, *r.min_samples)})
_VALUES = st.one_of(st.none(), st.floats(allow_nan=True, allow_infinity=True), st.integers(-10**6, 10**6))


@settings(max_examples=200, deadline=None)
@given(st.dictionaries(st.sampled_from(_ALL_NAMES), _VALUES))
def test_every_rule_lands_in_exactly_one_bucket(findings):
    rules = load_rules()
    v = evaluate(rules, findings, scope=None)
    ids = [x["id"] for x in (*v.symptoms, *v.passed, *v.not_evaluated)]
    assert sorted(ids) == sorted(r.id for r in rules)
    for n in v.not_evaluated:  # never passing when a required finding is missing
        r = next(r for r in rules if r.id == n["id"])
        assert set(n["missing"]) <= set(r.requires) | set(r.min_samples)


def test_min_samples_makes_rule_not_evaluated():
    v = evaluate(load_rules(), {"decode.launch_gap_own_share": 0.9, "decode.activity_count": 3})
    ne = {n["id"]: n for n in v.not_evaluated}
    assert ne["S3-launch-gaps"]["reason"] == "too few samples: decode.activity_count = 3 < 10"
    assert ne["S3-launch-gaps"]["missing"] == []


def test_symptom_entry_shape_and_worst_first_order():
    f = {"decode.launch_gap_own_share": 0.42, "decode.activity_count": 400, "decode.mbu": 0.85,
         "all.gpu_idle_share": 0.5, "all.gpu_idle_own_share": 0.5, "all.activity_count": 400, "decode.gpu_idle_share": 0.45}
    v = evaluate(load_rules(), f)
    assert v.fired_ids == ["S3-launch-gaps", "S3-gpu-idle", "decode-at-bandwidth-limit"]  # high, medium, info
    s = v.symptoms[0]
    assert set(s) >= {"id", "symptom", "severity", "summary", "evidence", "how_to_verify", "fix", "likely_cause"}
    assert s["symptom"] == "S3"
    assert s["summary"].startswith("decode launch gaps 42.0% of the n/a ms GPU window > 15%")
    assert "n/a gaps" in s["summary"]  # evidence finding not given
    assert s["evidence"]["findings"]["decode.launch_gap_own_share"] == 0.42
    assert s["evidence"]["thresholds"]["max_launch_gap_share"]["value"] == 0.15
    assert s["evidence"]["thresholds"]["max_launch_gap_share"]["unit"] == (
        "fraction of the decode GPU window, idle with an external cause left out")


def test_scope_filter():
    f = {"delta.worst_latency_ratio": 2.0, "decode.launch_gap_own_share": 0.5, "decode.activity_count": 100}
    assert evaluate(load_rules(), f, scope="compare").fired_ids == ["latency-regression"]
    assert evaluate(load_rules(), f, scope="trace").fired_ids == ["S3-launch-gaps"]
    assert set(evaluate(load_rules(), f, scope=None).fired_ids) == {"latency-regression", "S3-launch-gaps"}


def test_threshold_overrides():
    f = {"decode.launch_gap_own_share": 0.18, "decode.activity_count": 100}
    rules = load_rules()
    assert "S3-launch-gaps" in evaluate(rules, f).fired_ids
    v = evaluate(rules, f, overrides={"S3-launch-gaps.max_launch_gap_share": 0.2})
    assert "S3-launch-gaps" not in v.fired_ids
    assert {p["id"]: p for p in v.passed}["S3-launch-gaps"]["evidence"]["thresholds"]["max_launch_gap_share"]["value"] == 0.2
    # the packaged rules themselves are unchanged
    assert "S3-launch-gaps" in evaluate(load_rules(), f).fired_ids
    with pytest.raises(RuleError, match="unknown rule 'S9-nope'"):
        evaluate(rules, f, overrides={"S9-nope.x": 1})
    with pytest.raises(RuleError, match="has no threshold 'nope'"):
        evaluate(rules, f, overrides={"S3-launch-gaps.nope": 1})


def test_parse_threshold_specs():
    assert parse_threshold_specs(["S3-launch-gaps.max_launch_gap_share=0.2", "latency-regression.max_regression=25%"]) == {
        "S3-launch-gaps.max_launch_gap_share": 0.2, "latency-regression.max_regression": 0.25}
    for bad in ("S3-launch-gaps=0.2", "S3-launch-gaps.x=abc", "nothing"):
        with pytest.raises(DiagnoseError):
            parse_threshold_specs([bad])


def test_rules_config_file(tmp_path):
    p = tmp_path / "cfg.yaml"
    p.write_text("thresholds:\n  S3-launch-gaps.max_launch_gap_share: 0.3\n  S2-decode-far-from-bound: {problem_bound_ratio: 4}\n"
                 "disable: [S7-cpu-region-shorter-than-gpu]\n")
    cfg = load_rules_config(str(p))
    assert cfg.overrides == {"S3-launch-gaps.max_launch_gap_share": 0.3, "S2-decode-far-from-bound.problem_bound_ratio": 4}
    assert cfg.disable == ("S7-cpu-region-shorter-than-gpu",)
    p.write_text("thresholds: {S3-launch-gaps.max_launch_gap_share: high}\n")
    with pytest.raises(RuleError, match="must be a number"):
        load_rules_config(str(p))
    p.write_text("treshold: {}\n")
    with pytest.raises(RuleError, match="unknown key"):
        load_rules_config(str(p))


# ---------------------------------------------------------------- findings with exact numbers


def _report(b, tmp_path, name="t.json"):
    return analyze(load_kineto(str(b.write(tmp_path / name)))).to_dict()


def _decode_report(kineto, tmp_path, eager=True):
    """Two decode steps, 2 kernels each (10 µs), one NCCL kernel in step 2."""
    b = kineto()
    corr = 5000
    for i, t in enumerate((0, 100)):
        b.annotation("diagnose:decode[bs=4 ctx=2048]", t, 50)
        b.launch("ampere_fp16_gemm_128x64", t + 10, 10, launch_ts=t + 1)
        name = "ncclDevKernel_AllReduce_Sum_f16_RING_LL" if i == 1 else "flash_fwd_splitkv_kernel"
        corr += 1
        b.runtime("cudaLaunchKernel", t + 2, 2, corr)
        b.kernel(name, t + 20, 10, corr)
    return _report(b, tmp_path)


def test_findings_from_inline_decode_trace(kineto, tmp_path):
    rep = _decode_report(kineto, tmp_path)
    f = findings_from_report(rep)
    assert f["trace.device"] == 0
    assert f["steps.decode_count"] == 2
    assert f["steps.prefill_count"] == 0
    assert f["decode.kernel_ms"] == pytest.approx(0.040)
    assert f["decode.communication_ms"] == pytest.approx(0.010)
    assert f["decode.comm_share"] == pytest.approx(0.25)
    assert f["decode.attention_share"] == pytest.approx(0.25)
    assert f["decode.window_ms"] == pytest.approx(0.120)  # 10 -> 130 µs
    assert f["decode.gpu_idle_share"] == pytest.approx(80 / 120)
    assert f["latency.tpot_p50_ms"] == pytest.approx(0.100)  # completions at 30 and 130 µs
    assert f["latency.tpot_samples"] == 1
    assert f["steps.decode_p50_batch"] == 4
    assert f["steps.decode_p50_context"] == 2048
    assert f["steps.prefill_interleaved_max_ms"] == 0.0
    assert f["trace.partial"] == 0 and f["trace.unreliable"] == 0
    assert f["quality.bandwidth_above_peak"] == 0
    assert f["decode.mbu"] is None and f["decode.bound_ratio"] is None  # no GPU peak / model config
    # S7 reads only regions the user timed (--phase-regex); engine and collector markers end
    # before their GPU work by design, so they are not counted.
    assert f["steps.user_timed_count"] == 0 and f["steps.with_gpu_count"] == 2
    assert f["steps.cpu_shorter_than_gpu_share"] is None and f["steps.max_gpu_over_cpu"] is None


def test_device_with_most_busy_time_is_chosen(kineto, tmp_path):
    b = kineto()
    b.kernel("k0", 0, 10, device=0).kernel("k1", 0, 30, device=1).kernel("k1b", 40, 30, device=1)
    rep = _report(b, tmp_path)
    f = findings_from_report(rep)
    assert f["trace.device"] == 1
    assert f["all.gpu_busy_ms"] == pytest.approx(0.060)
    assert f["trace.device_count"] == 2
    f0 = findings_from_report(rep, device=0)
    assert f0["trace.device"] == 0 and f0["all.gpu_busy_ms"] == pytest.approx(0.010)
    with pytest.raises(DiagnoseError, match="device 5 is not in the trace"):
        findings_from_report(rep, device=5)


def test_roofline_fields_and_quality_codes_become_findings():
    rep = {
        "partial": False,
        "phases": [{"name": "all", "device": 0, "gpu_busy_ms": 1.0, "kernel_ms": 1.0, "categories_ms": {}},
                   {"name": "decode", "device": 0, "gpu_busy_ms": 1.0, "kernel_ms": 1.0, "categories_ms": {},
                    "window_ms": 2.0, "activity_count": 10, "idle_by_cause_ms": {"launch": 1.0},  # idle 50 %
                    "mbu": 0.4, "mfu": 0.01, "bound_ratio": 2.5, "achieved_tbps": 4.0, "peak_tbps": 3.35,
                    "bound": "memory", "peak_tflops": None}],
        "latency": {}, "steps": [],
        "quality": [{"code": "graph_coverage_low", "message": "x"}, {"code": "bandwidth_above_peak", "message": "y"}],
    }
    f = findings_from_report(rep)
    assert f["decode.mbu"] == 0.4 and f["decode.bound_ratio"] == 2.5
    assert f["decode.compute_bound"] == 0
    assert f["decode.peak_tflops"] is None
    assert f["decode.bandwidth_over_peak"] == pytest.approx(4.0 / 3.35)
    assert f["trace.bandwidth_above_peak"] == 1
    assert f["trace.unreliable"] == 1
    assert f["quality.graph_coverage_low"] == 1
    fired = evaluate(load_rules(), f).fired_ids
    assert "S7-bandwidth-above-peak" in fired and "S2-decode-could-improve" in fired and "decode-not-fed" in fired


def test_bandwidth_flag_unknown_without_numbers_and_zero_below_peak():
    base = {"phases": [{"name": "decode", "device": 0, "achieved_tbps": 2.0, "peak_tbps": 3.35}], "quality": []}
    assert findings_from_report(base)["trace.bandwidth_above_peak"] == 0
    assert findings_from_report({"phases": [], "quality": []})["trace.bandwidth_above_peak"] is None


def test_unreliable_phase_numbers_are_not_evaluated():
    rep = {"phases": [{"name": "all", "device": 0, "gpu_busy_ms": 1.0, "gpu_idle_share": 0.5, "activity_count": 100,
                       "unreliable": ["gpu_idle_share", "launch_gap_share"]},
                      {"name": "decode", "device": 0, "launch_gap_share": 0.5, "activity_count": 100,
                       "unreliable": ["gpu_idle_share", "launch_gap_share"]}],
           "quality": [{"code": "graph_coverage_low", "message": "coverage 40 %"}], "steps": [], "latency": {}}
    f = findings_from_report(rep)
    assert f["decode.launch_gap_share"] is None and f["all.gpu_idle_share"] is None
    assert f["trace.unreliable"] == 1
    assert findings_from_report(rep, include_unreliable=True)["decode.launch_gap_share"] == 0.5
    r = add_verdicts_to_report(make_report(rep))
    ne = {n.id: n for n in r.not_evaluated}
    # the own-window share is computed from the unreliable launch gaps: unreliable too
    assert ne["S3-launch-gaps"].reason == "unreliable finding(s) (see quality): decode.launch_gap_own_share"
    assert ne["S3-launch-gaps"].missing == ["decode.launch_gap_own_share"]
    assert "S3-launch-gaps" not in [s.id for s in r.symptoms]


def _fake_report(steps=(), tpot=None, prefill_steps=None, decode_steps=None, phases=()):
    return {"phases": list(phases), "quality": [], "steps": list(steps),
            "latency": {"tpot_ms": {"p50": tpot, "p90": tpot, "p99": tpot, "mean": tpot},
                        "prefill_step_ms": prefill_steps or {}, "decode_step_ms": decode_steps or {}}}


def test_s5_interleaved_prefill_findings():
    def st(phase, start, own_ms):
        return {"phase": phase, "start_ns": start, "end_ns": start + 1000, "own_ms": own_ms,
                "gpu_start_ns": None, "gpu_end_ns": None, "scope": "cpu", "batch": 1, "tokens": 8192 if phase == "prefill" else 1}

    steps = [st("prefill", 0, 900)] + [st("decode", 10 + i, 20) for i in range(5)] + [st("prefill", 100, 500)] + [st("decode", 200 + i, 22) for i in range(5)]
    f = findings_from_report(_fake_report(steps))
    assert f["steps.prefill_interleaved_count"] == 1  # the first prefill precedes every decode step
    assert f["steps.prefill_interleaved_max_ms"] == pytest.approx(500)
    assert f["steps.decode_p50_ms"] == pytest.approx(21)
    assert f["steps.prefill_max_ms"] == pytest.approx(900)
    assert f["steps.prefill_max_prompt_tokens"] == 8192
    v = evaluate(load_rules(), f)
    assert "S5-long-prefill-stall" in v.fired_ids
    assert {s["id"]: s for s in v.symptoms}["S5-long-prefill-stall"]["summary"].startswith(
        "a prefill step of 500.00 ms ran between decode steps: > 10 x decode step p50 (21.000 ms)")


def test_sweep_findings_context_batch_gpus_exact():
    # TPOT = 1.0 + 0.25 ms per 1024 tokens of context, batch 8: perfectly linear.
    ctxs = [2048, 4096, 8192, 16384]
    reps = [_fake_report(tpot=1.0 + 0.25 * c / 1024) for c in ctxs]
    f = findings_from_reports(reps, [f"ctx={c},bs=8" for c in ctxs])
    assert f["sweep.ctx_points"] == 4
    assert f["sweep.tpot_ctx_slope_ms_per_1k"] == pytest.approx(0.25 / 1.024)
    assert f["sweep.tpot_ctx_slope_r2"] == pytest.approx(1.0)
    assert f["sweep.tpot_ctx_growth"] == pytest.approx(5.0 / 1.5)
    assert f["sweep.ctx_ratio"] == 8
    assert evaluate(load_rules(), f, scope="sweep").fired_ids == ["S1-tpot-grows-with-context"]

    # Batch sweep (article §3 shape): TPOT 6.85, 7.79, 11.01, 15.31, 23.90 ms at batch 1..128.
    bs = [1, 8, 32, 64, 128]
    tp = [6.85, 7.79, 11.01, 15.31, 23.90]
    fb = findings_from_reports([_fake_report(tpot=t) for t in tp], [{"batch": b, "ctx": 2048} for b in bs])
    assert fb["sweep.batch_points"] == 5
    assert fb["sweep.throughput_last_tok_s"] == pytest.approx(128 / 23.90 * 1000)
    assert fb["sweep.throughput_gain_last_batch_doubling"] == pytest.approx((128 / 23.90) / (64 / 15.31))
    assert fb["sweep.throughput_gain_total"] == pytest.approx((128 / 23.90) / (1 / 6.85))
    assert "S1-throughput-flat-with-batch" not in evaluate(load_rules(), fb, scope="sweep").fired_ids  # x1.28 per doubling
    flat = findings_from_reports([_fake_report(tpot=t) for t in (1.0, 1.9, 3.7)], ["bs=8", "bs=16", "bs=32"])
    assert flat["sweep.throughput_gain_last_batch_doubling"] == pytest.approx((32 / 3.7) / (16 / 1.9))
    assert "S1-throughput-flat-with-batch" in evaluate(load_rules(), flat, scope="sweep").fired_ids

    # 1 vs 4 GPUs: TPOT 10 -> 11 ms.
    fg = findings_from_reports([_fake_report(tpot=10.0), _fake_report(tpot=11.0)], ["gpus=1", "gpus=4"])
    assert (fg["sweep.gpus_min"], fg["sweep.gpus_max"]) == (1, 4)
    assert fg["sweep.tp_tpot_ratio"] == pytest.approx(1.1)
    assert evaluate(load_rules(), fg, scope="sweep").fired_ids == ["S4-tp-slower"]


def test_sweep_prefill_mfu_short_vs_long():
    reps = [_fake_report(phases=[{"name": "prefill", "device": 0, "mfu": m}]) for m in (0.25, 0.5, 0.55)]
    f = findings_from_reports(reps, ["prompt=512", "prompt=2048", "prompt=8192"])
    assert (f["sweep.prefill_prompt_short"], f["sweep.prefill_prompt_long"]) == (512, 8192)
    assert f["sweep.prefill_mfu_short_over_long"] == pytest.approx(0.25 / 0.55)
    assert "prefill-short-prompt-mfu" in evaluate(load_rules(), f, scope="sweep").fired_ids


def test_sweep_label_errors():
    with pytest.raises(DiagnoseError, match="2 labels for 1 traces"):
        findings_from_reports([_fake_report(tpot=1.0)], ["ctx=1", "ctx=2"])
    with pytest.raises(DiagnoseError, match="unknown key 'colour'"):
        findings_from_reports([_fake_report(tpot=1.0)], ["colour=1"])
    with pytest.raises(DiagnoseError, match="not a number"):
        findings_from_reports([_fake_report(tpot=1.0)], ["ctx=big"])


def test_compare_findings_exact():
    base = _fake_report(tpot=10.0, prefill_steps={"p50": 100.0, "p90": 120.0, "p99": 150.0})
    cand = _fake_report(tpot=11.0, prefill_steps={"p50": 100.0, "p90": 130.0, "p99": 240.0})
    f = findings_from_reports([base, cand], ["baseline", "candidate"])
    assert f["delta.tpot_p99_ratio"] == pytest.approx(1.1)
    assert f["delta.ttft_p99_ratio"] == pytest.approx(1.6)
    assert f["delta.worst_latency_ratio"] == pytest.approx(1.6)
    assert f["baseline.latency.tpot_p50_ms"] == 10.0 and f["candidate.latency.tpot_p50_ms"] == 11.0
    v = evaluate(load_rules(), f, scope="compare")
    assert v.fired_ids == ["latency-regression"]
    assert "x1.60 the baseline" in v.symptoms[0]["summary"]


def test_metrics_findings_and_s6():
    f = findings_from_metrics({"perplexity_baseline": 5.0, "perplexity_candidate": 5.2, "note": "int4", "acceptance_rate": 0.4})
    assert f["metrics.perplexity_change"] == pytest.approx(0.04)
    assert f["metrics.spec_acceptance_rate"] == 0.4
    assert "metrics.note" not in f
    v = evaluate(load_rules(), f, scope="metrics")
    assert v.fired_ids == ["S6-perplexity-up", "speculative-acceptance-low"]
    assert v.symptoms[0]["summary"] == "perplexity 5.000 -> 5.200 (+4.0% > +3%)"
    ok = evaluate(load_rules(), findings_from_metrics({"perplexity_baseline": 5.0, "perplexity_candidate": 5.05}), scope="metrics")
    assert ok.fired_ids == [] and [n["id"] for n in ok.not_evaluated] == ["speculative-acceptance-low"]
    with pytest.raises(DiagnoseError):
        findings_from_metrics([1, 2])


def test_add_verdicts_to_report(kineto, tmp_path):
    rep = _decode_report(kineto, tmp_path)
    out = add_verdicts_to_report(rep)
    assert out is rep
    assert isinstance(rep["symptoms"], list) and isinstance(rep["not_evaluated"], list)
    ne = {n["id"]: n["missing"] for n in rep["not_evaluated"]}
    assert ne["S2-decode-far-from-bound"] == ["decode.bound_ratio"]
    # the all-reduce runs alone for 10 µs of the 120 µs decode window: exposed 8.3 % < 15 %
    assert rep["findings"]["decode.comm_exposed_share"] == pytest.approx(10 / 120)
    assert rep["findings"]["decode.comm_hidden_ms"] == 0.0
    assert "S4-decode-comm-exposed" not in [s["id"] for s in rep["symptoms"]]
    json.dumps(rep)  # serializable


# ---------------------------------------------------------------- finding names and docs


def _all_finding_names(report: dict) -> set[str]:
    names = set(findings_from_report(report))
    names |= set(findings_from_reports([report, report], ["baseline", "candidate"]))
    names |= set(findings_from_reports([report, report], ["ctx=1,bs=1,gpus=1,prompt=1", "ctx=2,bs=2,gpus=2,prompt=2"]))
    names |= set(findings_from_metrics({"perplexity_baseline": 1.0, "perplexity_candidate": 1.1, "spec_acceptance_rate": 0.5}))
    return names


def test_every_finding_name_is_documented(kineto, tmp_path):
    rx = catalog_regex()
    names = _all_finding_names(_decode_report(kineto, tmp_path))
    assert [n for n in sorted(names) if not rx.match(n)] == []
    assert "decode.launch_gap_share" in names and "sweep.tpot_ctx_slope_r2" in names and "delta.tpot_p99_ratio" in names


def test_real_trace_finding_names_documented():
    from diagnose.pipeline import run_analysis

    rep = run_analysis(str(shared_trace("tracelens/vllm_decode_full/graph_execution.json.gz"))).to_dict()
    rx = catalog_regex()
    f = findings_from_report(rep)
    assert [n for n in f if not rx.match(n)] == []
    assert f["trace.device"] == 2
    assert f["steps.decode_count"] == 1 and f["steps.decode_p50_batch"] == 32
    assert f["trace.graph_kernel_count"] == 421
    assert f["decode.launch_gap_share"] == 0.0


def test_rule_requires_are_documented_findings():
    rx = catalog_regex()
    for r in load_rules():
        for n in (*r.requires, *r.evidence, *r.min_samples):
            assert rx.match(n), (r.id, n)


def test_docs_rules_md_is_generated_and_current():
    doc = (ROOT / "docs" / "rules.md").read_text()
    assert doc == rules_markdown(load_rules()), "regenerate: diagnose rules doc > docs/rules.md"
    for r in load_rules():
        assert f"### {r.id}" in doc
    for f in catalog():
        assert f"`{f.name}`" in doc
    for section in ("**What it detects.**", "**Why it matters.**", "**How to verify.**", "**Fix.**", "**References.**"):
        assert doc.count(section) == len(EXPECTED_IDS)


def test_rules_doc_and_list_commands():
    r = CliRunner().invoke(rules_group, ["doc"])
    assert r.exit_code == 0 and r.output == rules_markdown(load_rules())
    r = CliRunner().invoke(rules_group, ["list", "--scope", "compare", "--format", "json"])
    assert r.exit_code == 0
    assert [x["id"] for x in json.loads(r.output)] == ["latency-regression"]


def test_rules_cli_bad_rules_dir_exits_2(tmp_path):
    write_rule(tmp_path, condition="open('f')")
    r = CliRunner().invoke(rules_group, ["list", "--rules", str(tmp_path)])
    assert r.exit_code == 2
    assert "T-test.yaml" in r.output and "call to 'open'" in r.output


def test_packaged_rules_pass_schema_validation():
    strict = load_rules(validate=True)
    fast = load_rules()
    assert [r.id for r in strict] == [r.id for r in fast]
    assert len(strict) == len(EXPECTED_IDS) == 39
