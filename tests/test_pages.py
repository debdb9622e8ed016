"""Issue 27 part B: every page tells the same story, and compare speaks plain words.

Exact expected text for the symptom cards (labels, not finding keys; thresholds in words; one
"what to change" section), the compare wording (why two traces cannot be compared, neutral
colour for no change, integers as integers) and the labels that tell two files of the same
name apart. The browser half (time origin, gap position) is in tests/test_app_browser.py.
"""
from __future__ import annotations

import pytest
from click.testing import CliRunner

from conftest import make_report
from diagnose.app import figures as F
from diagnose.app.server import distinct_labels, symptom_card
from diagnose.compare import compare_reports, latency_gap_reason, like_for_like_warnings
from diagnose.engine import load_ruleset
from diagnose.vocab import LEVERS

# A fired symptom as the rule engine writes it: findings by key, a threshold, the rule's labels,
# a lever dropped because it is already in place (the engine then rewrites ``fix``).
MOE = {
    "id": "moe-kernel-bound", "symptom": "project:moe-kernels", "title": "MoE expert kernels dominate the step",
    "severity": "high", "phase": "all", "scope": "trace", "summary": "MoE kernels 7.53 ms = 71% of kernel time",
    "evidence": {"findings": {"main.moe_share": 0.706, "main.kernel_ms": 10.67, "decode.mbu": None,
                              "main.launch_gap_share": 0.0, "main.small_kernel_count": 326.0},
                 "thresholds": {"min_share": {"value": 0.5, "unit": "fraction of kernel time", "rationale": "half"},
                                "min_count": {"value": 50, "unit": "kernels", "rationale": "many"}},
                 "labels": {"trace.main_phase": "decode"}},
    "likely_cause": "an untuned fused-MoE kernel", "how_to_verify": "the kernel table",
    "fix": "tune the MoE kernels. Not recommending cuda graphs: the steps already replay CUDA/HIP graphs.",
    "references": [], "recommends": ["moe_kernels"],
    "already_in_place": ["not recommending cuda graphs: the steps already replay CUDA/HIP graphs"],
}


def _text(c) -> str:
    if isinstance(c, str):
        return c
    if isinstance(c, (list, tuple)):
        return " ".join(_text(x) for x in c)
    ch = getattr(c, "children", None)
    return "" if ch is None else _text(ch)


def test_card_for_people():
    (c,) = F.symptom_cards_data({"symptoms": [MOE], "phases": [], "latency": {}})
    assert [m["text"] for m in c["measured"]] == [
        "moe busy time / kernel busy time (decode steps): 70.6 %",  # the catalog's label (category busy unions)
        "sum of kernel durations (decode steps): 10.67 ms",
        "MBU (model bandwidth utilization) (decode steps): not available",
        "launch-gap share of GPU window (decode steps): 0.0 %",
        "kernels shorter than 15 µs (decode steps): 326",
        "threshold: at least 50.0 % of kernel time",
        "threshold: at least 50 kernels",
    ]
    assert [m["key"] for m in c["measured"]][:2] == ["main.moe_share", "main.kernel_ms"]  # kept for the tooltip
    # The rule's labels as words, never a dict repr.
    assert c["evidence"] == [("the step phase with the most own time on the device", "decode")]
    # One "what to change": the kept lever (the engine's fix only repeats it with the note).
    assert c["change"] == [LEVERS["moe_kernels"].text]
    assert c["in_place"] == ["not recommending cuda graphs: the steps already replay CUDA/HIP graphs"]
    text = _text(symptom_card(c))
    assert text.count("What to change") == 1 and "Fix" not in text and "{" not in text
    assert "main.moe_share" not in text and "Already in place: not recommending cuda graphs" in text


def test_card_keeps_the_rules_own_advice_when_nothing_is_in_place():
    s = {**MOE, "fix": "tune the MoE kernels for the device", "already_in_place": []}
    (c,) = F.symptom_cards_data({"symptoms": [s], "phases": [], "latency": {}})
    assert c["change"] == ["tune the MoE kernels for the device"]
    assert F._short({"trace.main_phase": "decode", "x_y": 2.0}) == "the step phase with the most own time on the device: decode; x y: 2"


def _lat(ttft=None, tpot=None, decode_steps=0, batch=None):
    pre = {"p50": ttft, "p90": ttft, "p99": ttft, "mean": None} if ttft is not None else {}
    tp = {"p50": tpot, "p90": tpot, "p99": tpot, "mean": None} if tpot is not None else {}
    steps = [{"name": f"decode {i}", "phase": "decode", "batch": batch, "start_ns": 1000 * i, "end_ns": 1000 * i + 500,
              "gpu_start_ns": 1000 * i, "gpu_end_ns": 1000 * i + 500, "own_ms": 0.0005} for i in range(decode_steps)]
    return make_report({"latency": {"ttft_ms": ttft, "prefill_step_ms": pre, "tpot_ms": tp}, "steps": steps,
                        "phases": [{"name": "all", "device": 0, "gpu_idle_share": 0.1, "gpu_busy_ms": 1.0}]})


@pytest.mark.parametrize("a, b, why", [
    (_lat(ttft=100.0), _lat(ttft=100.0, tpot=20.0), ""),
    (_lat(ttft=100.0), _lat(tpot=20.0, decode_steps=3),
     "the baseline has no decode steps (no TPOT); the candidate has no prefill step (no TTFT): "
     "no TTFT or TPOT is measured in both traces"),
    (_lat(), _lat(ttft=100.0, tpot=20.0, decode_steps=3),
     "the baseline has no decode steps (no TPOT) and no prefill step (no TTFT): no TTFT or TPOT is measured in both traces"),
    (_lat(decode_steps=1), _lat(tpot=20.0, decode_steps=3),
     "the baseline has only 1 decode step (no TPOT: the interval between two consecutive decode steps) and no prefill "
     "step (no TTFT): no TTFT or TPOT is measured in both traces"),
    (_lat(), _lat(), "neither trace has a prefill or decode step: no TTFT or TPOT to compare"),
])
def test_why_two_traces_cannot_be_compared(a, b, why):
    cmp = compare_reports(a, b, load_ruleset())
    assert cmp.why_not_comparable == why == latency_gap_reason(cmp.findings)
    assert cmp.verdict == ("not comparable" if why else "no regression")
    if why:
        assert F.compare_view(cmp)["explanation"] == f"Not comparable: {why}."
        assert "missing finding" not in F.compare_view(cmp)["explanation"]


def test_compare_cli_says_why_in_words(kineto, tmp_path):
    """A prefill-only baseline against a decode-only candidate (step markers, as a collector writes)."""
    import json

    from diagnose.rules_cli import compare_command

    base = kineto()
    base.annotation("diagnose:prefill[bs=1 ctx=512]", 1000, 200)
    for j in range(4):
        base.launch(f"gemm_kernel_{j}", 1010 + 40 * j, 40, launch_ts=1001 + 2 * j, launch_dur=1)
    cand = kineto()
    for i in range(10):
        t = 1000 + 1000 * i
        cand.annotation("diagnose:decode[bs=1 ctx=2048]", t, 20)
        for j in range(4):
            cand.launch(f"gemv_kernel_{j}", t + 10 + 100 * j, 100, launch_ts=t + 1 + 2 * j, launch_dur=1)
    paths = [base.write(tmp_path / "base.json"), cand.write(tmp_path / "cand.json")]
    r = CliRunner().invoke(compare_command, ["--baseline", str(paths[0]), "--candidate", str(paths[1])])
    assert r.exit_code == 1, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("verdict:"))
    assert line == ("verdict: CANNOT COMPARE — the baseline has no decode steps (no TPOT); the candidate has no prefill "
                    "step (no TTFT): no TTFT or TPOT is measured in both traces")
    out = CliRunner().invoke(compare_command, ["--baseline", str(paths[0]), "--candidate", str(paths[1]), "--format", "json"])
    assert json.loads(out.output)["verdict"] == "not comparable"


def test_no_change_is_neutral_and_never_negative_zero():
    rs = load_ruleset()
    a = make_report({"latency": {"ttft_ms": 100.0, "tpot_ms": {"p50": 20.0, "p90": 20.0, "p99": 20.0, "mean": None}},
                     "phases": [{"name": "all", "device": 0, "gpu_idle_share": 0.1, "gpu_busy_ms": 1.0}]})
    b = make_report({"latency": {"ttft_ms": 100.0, "tpot_ms": {"p50": 20.0, "p90": 20.0, "p99": 20.0, "mean": None}},
                     "phases": [{"name": "all", "device": 0, "gpu_idle_share": 0.09996, "gpu_busy_ms": 1.0}]})
    rows = {r["finding"]: r for r in F.compare_view(compare_reports(a, b, rs))["rows"]}
    assert rows["all.gpu_idle_share"]["change_text"] == "+0.0 pp" and rows["all.gpu_idle_share"]["worse"] is None
    assert rows["latency.tpot_p99_ms"]["change_text"] == "x1.000 (+0.0 %)" and rows["latency.tpot_p99_ms"]["worse"] is None
    c = make_report({"latency": {"ttft_ms": 100.0, "tpot_ms": {"p50": 20.0, "p90": 20.0, "p99": 20.0, "mean": None}},
                     "phases": [{"name": "all", "device": 0, "gpu_idle_share": 0.101, "gpu_busy_ms": 1.0}]})
    row = next(r for r in F.compare_view(compare_reports(a, c, rs))["rows"] if r["finding"] == "all.gpu_idle_share")
    assert row["change_text"] == "+0.1 pp" and row["worse"] is True


def test_integers_read_as_integers():
    w = like_for_like_warnings([_lat(decode_steps=3, batch=2), _lat(decode_steps=3, batch=8)], ["baseline", "candidate"])
    assert w == ["the traces differ in decode batch (baseline 2, candidate 8): the comparison may not be like for like"]


def test_labels_tell_files_of_the_same_name_apart():
    assert distinct_labels(["/t/vllm_decode_full/graph_execution.json.gz", "/t/vllm_eager/graph_execution.json.gz",
                            "samples/tiny_cpu.json.gz"]) == [
        "vllm_decode_full/graph_execution.json.gz", "vllm_eager/graph_execution.json.gz", "tiny_cpu.json.gz"]
    assert distinct_labels(["/x/a/t.json", "/y/a/t.json"]) == ["x/a/t.json", "y/a/t.json"]
    assert distinct_labels(["/x/t.json", "/x/t.json"]) == ["t.json (1st)", "t.json (2nd)"]


def test_kv_page_starts_from_the_traces_model_dtype_and_device():
    """gpt-oss-20b (a shipped config, no torch_dtype) on an MI300X (192 GB in gpus.yaml)."""
    from diagnose.app.server import kv_page

    start = F.kv_start({"model": {"name": "gpt-oss-20b", "source": "gpt-oss-20b", "kv_dtype": None,
                                  "kv_bytes_per_token": 49152, "weight_bytes": 1}, "gpu": {"name": "MI300X"}})
    assert (start["preset"], start["model_config"], start["kv_dtype"], start["memory_gb"]) == ("gpt-oss-20b", "", "fp16", 192.0)
    assert start["text"] == ("Starts from model gpt-oss-20b (the trace's --model-config); KV dtype fp16: default (the config "
                             "names no dtype); device memory 192 GB: MI300X, the device whose peaks the report used.")
    bf = F.kv_start({"model": {"name": "x", "source": "trace metadata", "kv_dtype": "bf16"}, "gpu": {"name": "H100-SXM"}})
    assert (bf["preset"], bf["kv_dtype"], bf["memory_gb"]) == ("7b", "bf16", 80.0)
    none = F.kv_start({})
    assert (none["preset"], none["kv_dtype"], none["memory_gb"]) == ("7b", "fp16", 80)

    class Entry:
        report = {"model": {"name": "gpt-oss-20b", "source": "gpt-oss-20b", "kv_dtype": None, "kv_bytes_per_token": 49152,
                            "weight_bytes": 13_000_000_000}, "gpu": {"name": "MI300X"}}
    page = kv_page(Entry())
    text = _text(page)
    assert "(None)" not in text and "KV bytes per token (dtype not known from the trace)" in text
    ids = {}

    def walk(c):
        if getattr(c, "id", None):
            ids[c.id] = c
        ch = getattr(c, "children", None)
        for x in ch if isinstance(ch, (list, tuple)) else [ch] if ch is not None else []:
            walk(x)
    walk(page)
    assert (ids["kv-preset"].value, ids["kv-dtype"].value, ids["kv-memory"].value) == ("gpt-oss-20b", "fp16", 192.0)
