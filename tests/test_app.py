"""Figure builders, table data and callbacks of the Dash app and the HTML report.

Callbacks are thin wrappers over pure helpers (``render_page``, ``timeline_zoom``,
``kv_view``, ``compare_output``); these tests call the helpers as plain functions on real
analysis results and small inline traces with known answers.
"""
from __future__ import annotations

import copy
import io
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

pytest.importorskip("dash")
pytest.importorskip("dash_ag_grid")

from click.testing import CliRunner  # noqa: E402

from diagnose.app import figures as F  # noqa: E402
from diagnose.app.html import render_html, write_html  # noqa: E402
from diagnose.app.serve_cli import serve_command  # noqa: E402
from diagnose.app.server import (  # noqa: E402
    PAGES,
    build_state,
    create_app,
    kv_view,
    load_analyses,
    parse_contexts,
    render_page,
    timeline_zoom,
)
from diagnose.app.timeline import (  # noqa: E402
    CAUSE_LEGEND,
    GAP_CAUSES,
    figure_drawn_elements,
    parse_relayout,
    prepare_timeline,
    timeline_figure,
)
from diagnose.compare import compare_reports  # noqa: E402
from diagnose.engine import load_ruleset  # noqa: E402
from diagnose.pipeline import ensure_verdicts, run_analysis  # noqa: E402
from conftest import make_report  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared" / "traces"
VLLM = SHARED / "tracelens" / "vllm_decode_full" / "graph_execution.json.gz"
SGLANG = SHARED / "tracelens" / "sglang_prefilldecode" / "sglang_Qwen3-8B_prefilldecode.json.gz"
TINY = ROOT / "samples" / "tiny_cpu.json.gz"

SYMPTOMS = [
    {"id": "S5-long-prefill", "symptom": "S5", "title": "long prefill", "severity": "medium", "phase": "prefill",
     "scope": "trace", "summary": "a prefill holds the GPU",
     "evidence": {"findings": {"steps.prefill_max_ms": 987.4}, "thresholds": {}}, "likely_cause": "one long prompt",
     "how_to_verify": "p99 TPOT vs prefills", "fix": "chunked prefill", "references": [], "recommends": []},
    {"id": "S3-launch-gaps", "symptom": "S3", "title": "launch gaps", "severity": "high", "phase": "decode",
     "scope": "trace", "summary": "GPU idle in launch gaps",
     "evidence": {"findings": {"decode.launch_gap_share": 0.4},
                  "thresholds": {"max_launch_gap_share": {"value": 0.15, "unit": "share", "rationale": "S3"}}},
     "likely_cause": "kernel launch overhead", "how_to_verify": "timeline gaps", "fix": "CUDA graph capture",
     "references": [], "recommends": []},
]


def with_verdicts(analysis, symptoms=SYMPTOMS, not_evaluated=()):
    """A copy of ``analysis`` whose report carries these verdicts (the report is frozen)."""
    import dataclasses

    import msgspec

    from diagnose.model import NotEvaluated, Symptom

    report = msgspec.structs.replace(analysis.report, symptoms=msgspec.convert(copy.deepcopy(symptoms), list[Symptom]),
                                     not_evaluated=msgspec.convert(list(not_evaluated), list[NotEvaluated]))
    return dataclasses.replace(analysis, report=report)


def _need(p: Path) -> Path:
    if not p.exists():
        pytest.skip(f"shared trace corpus not available: {p}")
    return p


@pytest.fixture(scope="module")
def vllm():
    return run_analysis(str(_need(VLLM)))


@pytest.fixture(scope="module")
def sglang():
    return run_analysis(str(_need(SGLANG)))


@pytest.fixture(scope="module")
def tiny():
    return run_analysis(str(TINY))


def _all_phase(report, device=None):
    return F.phases_for_device(report, device)["all"]


def _ids(component) -> set[str]:
    """Every element id in a Dash component tree."""
    out: set[str] = set()
    stack = [component]
    while stack:
        c = stack.pop()
        if isinstance(c, (list, tuple)):
            stack.extend(c)
            continue
        cid = getattr(c, "id", None)
        if isinstance(cid, str):
            out.add(cid)
        ch = getattr(c, "children", None)
        if ch is not None and not isinstance(ch, str):
            stack.append(ch)
    return out


def _find(component, id_):
    stack = [component]
    while stack:
        c = stack.pop()
        if isinstance(c, (list, tuple)):
            stack.extend(c)
            continue
        if getattr(c, "id", None) == id_:
            return c
        ch = getattr(c, "children", None)
        if ch is not None and not isinstance(ch, str):
            stack.append(ch)
    return None


def _text(component) -> str:
    if component is None:
        return ""
    if isinstance(component, str):
        return component
    if isinstance(component, (int, float)):
        return str(component)
    if isinstance(component, (list, tuple)):
        return " ".join(_text(c) for c in component)
    return _text(getattr(component, "children", None))


# -- timeline ------------------------------------------------------------------------------


def _cause_counts(td) -> dict[str, int]:
    return {c: int((td.gap_cause == i).sum()) for i, c in enumerate(GAP_CAUSES) if (td.gap_cause == i).any()}


def test_timeline_gaps_match_the_analyzer_on_vllm(vllm):
    r = vllm.to_dict()
    td = prepare_timeline(vllm.activities, r, host_index=vllm.host_index)
    assert td.rows == ["steps / phases", "GPU 2 · stream 0", "GPU 2 · idle"]
    a = _all_phase(r)
    assert sum(_cause_counts(td).values()) == a["gaps"]["all"]["count"] == 3  # one bar per gap
    for i, c in enumerate(GAP_CAUSES):
        ms = float((td.gap_end[td.gap_cause == i] - td.gap_start[td.gap_cause == i]).sum()) / 1e6
        assert ms == pytest.approx(a["idle_by_cause_ms"].get(c, 0.0), abs=1e-6)


def test_timeline_gaps_match_the_analyzer_on_sglang(sglang):
    r = sglang.to_dict()
    td = prepare_timeline(sglang.activities, r, host_index=sglang.host_index)
    assert td.rows == ["steps / phases", "GPU 9 · stream 2", "GPU 9 · stream 3", "GPU 9 · idle"]
    a = _all_phase(r)
    # one bar per idle interval (18), each in its cause: the report's causes, gap for gap
    assert sum(_cause_counts(td).values()) == a["gaps"]["all"]["count"] == 18
    assert _cause_counts(td) == {c["cause"]: c["count"] for c in a["causes"] if c["count"]}
    for i, c in enumerate(GAP_CAUSES):
        ms = float((td.gap_end - td.gap_start)[td.gap_cause == i].sum()) / 1e6
        assert ms == pytest.approx(a["idle_by_cause_ms"].get(c, 0.0), abs=1e-6)


def test_timeline_detail_figure_on_vllm(vllm):
    r = vllm.to_dict()
    fig = timeline_figure(vllm.activities, r)
    meta = fig.layout.meta
    assert meta["mode"] == "detail"
    assert meta["visible_activities"] == _all_phase(r)["activity_count"] == 434
    # 434 activities + 3 gaps (the rest are < 10 ns rounding) + 1 decode band + 1 step marker.
    assert meta["drawn"] == figure_drawn_elements(fig) == 434 + 3 + 2
    names = [t.name for t in fig.data]
    cats = set(_all_phase(r)["categories_ms"])
    assert {n for n in names if n in cats} == cats
    assert "decode step" in names
    # no launch gaps in a CUDA-graph replay; its ~1 ns gaps are rounding, not drawn
    assert CAUSE_LEGEND["launch"] not in names
    gap_traces = [n for n in names if n in CAUSE_LEGEND.values()]
    assert len(fig.data) == len(cats) + len(gap_traces) + 2
    # One band for the decode step covering its GPU range (ms since t0).
    step = r["steps"][0]
    band = next(t for t in fig.data if t.name == "decode step")
    t0 = meta["t0_ns"]
    assert list(band.x[:2]) == pytest.approx([(step["gpu_start_ns"] - t0) / 1e6, (step["gpu_end_ns"] - t0) / 1e6])


def test_timeline_launch_gap_rectangles_for_host_late_trace(kineto, tmp_path):
    b = kineto()
    b.launch("gemm_kernel", 100, 10, 90)  # launch call ends at 92 µs, kernel 100-110
    b.launch("gemm_kernel", 130, 10, 125)  # launch ends 127 > 110: the GPU waited 20 µs for the host
    b.launch("elementwise_kernel", 141, 5, 100)  # launched early: the 1 µs gap before it is not a launch gap
    a = run_analysis(str(b.write(tmp_path / "late.json")))
    r = a.to_dict()
    assert _all_phase(r)["gaps"]["count_by_kind"]["launch"] == 1
    fig = timeline_figure(a.activities, r)
    by_name = {t.name: t for t in fig.data}
    launch = by_name[CAUSE_LEGEND["launch"]]
    other = by_name[CAUSE_LEGEND["switch"]]  # the early-launched kernel started 1 µs after the one before
    assert launch.meta["segments"] == 1 and other.meta["segments"] == 1
    assert list(launch.x[:2]) == pytest.approx([0.010, 0.030])  # ms since the first kernel
    assert list(other.x[:2]) == pytest.approx([0.040, 0.041])
    idle_row = fig.layout.yaxis.ticktext.index("GPU 0 · idle")
    assert launch.y[0] == idle_row and other.y[0] == idle_row
    assert launch.line.color != other.line.color
    assert fig.layout.meta["drawn"] == 3 + 2


def test_timeline_gaps_are_per_device():
    # Device 0 busy 0-100 and 300-400 ns; device 1 busy 0-350: only device 0 has a gap.
    acts = pd.DataFrame({
        "kind": "kernel", "name": ["a", "b", "c", "d"], "device": [0, 0, 1, 0], "stream": [7, 7, 7, 9],
        "start_ns": [0, 300, 0, 50], "end_ns": [100, 400, 350, 80], "category": "gemm",
        "launch_end_ns": [-1, 250, -1, -1], "graph_followup": False, "step": -1, "phase": "unknown",
    })
    td = prepare_timeline(acts, None)
    assert td.rows == ["steps / phases", "GPU 0 · stream 7", "GPU 0 · stream 9", "GPU 0 · idle",
                       "GPU 1 · stream 7", "GPU 1 · idle"]
    assert list(td.gap_row) == [3] and list(td.gap_start) == [100] and list(td.gap_end) == [300]
    assert GAP_CAUSES[td.gap_cause[0]] == "launch"  # its launch call ended at 250 ns, after the GPU idled at 100
    fig = timeline_figure(td)
    launch = next(t for t in fig.data if t.name == CAUSE_LEGEND["launch"])
    assert list(launch.x[:2]) == pytest.approx([100e-6, 300e-6]) and launch.y[0] == 3


def _synthetic(n: int, streams: int = 3, seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    which = rng.integers(0, streams, size=n)
    dur = rng.integers(1_000, 20_000, size=n)
    gap = rng.integers(100, 3_000, size=n)
    late = rng.random(n) < 0.05
    gap[late] += 50_000
    start = np.zeros(n, dtype=np.int64)
    for s in range(streams):
        m = np.nonzero(which == s)[0]
        start[m] = 10**15 + np.cumsum(gap[m] + dur[m]) - dur[m]
    cats = np.array(["gemm", "attention", "norm", "elementwise"], dtype=object)
    return pd.DataFrame({
        "kind": "kernel", "name": "k", "device": 0, "stream": which + 7, "start_ns": start, "end_ns": start + dur,
        "category": cats[rng.integers(0, 4, size=n)], "launch_end_ns": np.where(late, start + 10, start - 10_000),
        "graph_followup": False, "step": -1, "phase": "unknown",
    })


def _union_ns(s: np.ndarray, e: np.ndarray) -> int:
    o = np.argsort(s)
    s, e = s[o], e[o]
    total, cur_s, cur_e = 0, s[0], e[0]
    for a, b in zip(s[1:], e[1:]):
        if a > cur_e:
            total += cur_e - cur_s
            cur_s, cur_e = a, b
        else:
            cur_e = max(cur_e, b)
    return int(total + cur_e - cur_s)


def test_aggregated_timeline_stays_within_max_points():
    acts = _synthetic(100_000)
    fig = timeline_figure(acts, None, max_points=2_000)
    meta = fig.layout.meta
    assert meta["mode"] == "aggregated"
    assert meta["visible_activities"] == 100_000
    assert figure_drawn_elements(fig) == meta["drawn"] <= 2_000
    # Few traces: at most one per category plus two idle kinds.
    assert len(fig.data) <= 4 + 2


def test_aggregated_blocks_cover_the_busy_time():
    acts = _synthetic(20_000, streams=2, seed=3)
    td = prepare_timeline(acts, None)
    fig = timeline_figure(td, max_points=1_000)
    assert fig.layout.meta["mode"] == "aggregated"
    span = td.span_ns
    bin_ns = span / fig.layout.meta["n_bins"]
    for row in (1, 2):  # the two stream rows
        m = td.act_row == row
        busy = _union_ns(td.act_start[m], td.act_end[m])
        covered = 0.0
        n_blocks = 0
        for t in fig.data:
            if t.legendgroup and t.legendgroup.startswith("cat:"):
                x, y = np.asarray(t.x, float), np.asarray(t.y, float)
                sel = (y[0::3] == row)
                covered += float((x[1::3][sel] - x[0::3][sel]).sum()) * 1e6
                n_blocks += int(sel.sum())
        # Blocks contain every busy ns and exceed it by at most a bin per block edge.
        assert covered >= busy - 1
        assert covered <= busy + 2 * bin_ns * n_blocks + 1
        assert covered <= span + 1


def test_zoom_renders_full_detail_for_the_range():
    acts = _synthetic(50_000, seed=2)
    td = prepare_timeline(acts, None)
    full = timeline_figure(td, max_points=5_000)
    assert full.layout.meta["mode"] == "aggregated"
    lo_ms, hi_ms = 100.0, 101.0
    zoom = timeline_figure(td, max_points=5_000, x_range=[lo_ms, hi_ms])
    s = (acts["start_ns"] - td.t0_ns) / 1e6
    e = (acts["end_ns"] - td.t0_ns) / 1e6
    expected = int(((s < hi_ms) & (e > lo_ms)).sum())
    assert zoom.layout.meta["mode"] == "detail"
    assert zoom.layout.meta["visible_activities"] == expected > 0
    assert list(zoom.layout.xaxis.range) == pytest.approx([lo_ms, hi_ms])
    n_act = sum(t.meta["segments"] for t in zoom.data if t.legendgroup.startswith("cat:"))
    assert n_act == expected


def test_timeline_without_gpu_activity_explains(tiny):
    fig = timeline_figure(tiny.activities, tiny.to_dict())
    assert fig.layout.meta["mode"] == "empty"
    assert "No GPU activity" in fig.layout.annotations[0].text
    assert len(fig.data) == 0


def test_parse_relayout():
    assert parse_relayout({"xaxis.range[0]": 1, "xaxis.range[1]": 2.5}) == ("zoom", [1.0, 2.5])
    assert parse_relayout({"xaxis.range": [3, 4]}) == ("zoom", [3.0, 4.0])
    assert parse_relayout({"xaxis.autorange": True}) == ("reset", None)
    assert parse_relayout({"autosize": True}) == ("none", None)
    assert parse_relayout(None) == ("none", None)


# -- categories, roofline -----------------------------------------------------------------------


def test_categories_figure_matches_report(vllm):
    r = vllm.to_dict()
    fig = F.categories_figure(r)
    phases = F.phases_for_device(r)
    assert fig.layout.meta["phases"] == ["all", "decode"]
    assert len(fig.data) == len(phases["all"]["categories_ms"]) == 7
    moe = next(t for t in fig.data if t.name == "moe")
    assert list(moe.x) == [phases["all"]["categories_ms"]["moe"], phases["decode"]["categories_ms"]["moe"]]


def test_categories_figure_empty_without_gpu(tiny):
    fig = F.categories_figure(tiny.to_dict())
    assert fig.layout.meta["mode"] == "empty" and len(fig.data) == 0


def test_roofline_with_peaks_plots_the_phase(sglang):
    r = sglang.to_dict()
    gpu = r.get("gpu")
    if not gpu or gpu.get("peak_tflops") is None:
        pytest.skip("this checkout's analyzer does not resolve GPU peaks yet")
    fig = F.roofline_figure(r)
    meta = fig.layout.meta
    pre = F.phases_for_device(r)["prefill"]
    assert meta["mode"] == "roofline"
    assert meta["ridge_flop_per_byte"] == pytest.approx(gpu["peak_tflops"] / gpu["peak_tbps"])
    pts = next(t for t in fig.data if t.name == "phases")
    assert list(pts.x) == [pre["arithmetic_intensity"]] and list(pts.y) == [pre["achieved_tflops"]]


def test_roofline_synthetic_roof_points_and_categories():
    r = {"gpu": {"name": "X", "peak_tflops": 300.0, "peak_tbps": 2.0},
         "devices": [{"id": 0, "name": "X"}],
         "phases": [
             {"name": "prefill", "device": 0, "arithmetic_intensity": 2048.0, "achieved_tflops": 168.0, "mfu": 0.56,
              "kernel_count": 10, "categories_ms": {"gemm": 10.0},
              "category_flops": {"gemm": 1.5e12}, "category_bytes": {"gemm": 1.0e9}},
             {"name": "decode", "device": 0, "arithmetic_intensity": None, "achieved_tflops": None, "kernel_count": 5,
              "attainment_missing": ["flops (no operator shapes; give --model-config)"]},
         ]}
    fig = F.roofline_figure(r)
    mem, comp = fig.data[0], fig.data[1]
    assert list(mem.x)[1] == pytest.approx(150.0) and list(mem.y)[1] == pytest.approx(300.0)  # ridge, domain.md §3
    assert list(comp.y) == pytest.approx([300.0, 300.0])
    assert fig.layout.meta["points"] == 2
    cat = next(t for t in fig.data if t.name == "kernel categories")
    assert list(cat.x) == pytest.approx([1500.0]) and list(cat.y) == pytest.approx([150.0])
    assert fig.layout.meta["not_plotted"] == ["decode: flops (no operator shapes; give --model-config)"]


def test_roofline_without_peaks_explains(vllm):
    r = copy.deepcopy(vllm.to_dict())
    r.pop("gpu", None)
    for p in r["phases"]:
        p.pop("peak_tflops", None)
        p.pop("peak_tbps", None)
    fig = F.roofline_figure(r)
    assert fig.layout.meta["mode"] == "empty"
    assert "--gpu" in fig.layout.meta["reason"] and "does not name its GPU" in fig.layout.meta["reason"]


# -- phases table ---------------------------------------------------------------------------------


def _row(table, key):
    return next(r for r in table["rows"] if r["key"] == key)


def test_phases_table_values_are_the_report_numbers(vllm):
    r = vllm.to_dict()
    t = F.phases_table_data(r)
    dec = F.phases_for_device(r)["decode"]
    assert t["phases"] == ["prefill", "decode"] and t["device"] == 2
    for q in ("p50", "p90", "p99"):
        assert _row(t, f"tpot_{q}_ms")["values"]["decode"] == r["latency"]["tpot_ms"][q]
        assert _row(t, f"tpot_{q}_ms")["display"]["prefill"] == "—"
    for key in ("launch_gap_share", "gpu_idle_share", "attention_share", "gpu_busy_ms", "kernel_count", "steps"):
        assert _row(t, key)["values"]["decode"] == dec[key]
    ttft = _row(t, "ttft_ms")
    assert ttft["values"]["prefill"] is None and ttft["display"]["prefill"] == F.NA
    assert ttft["reasons"]["prefill"] == "no prefill step in the trace"
    for key in ("mfu", "mbu", "bound_ratio"):
        row = _row(t, key)
        assert row["values"]["decode"] == dec.get(key)
        if dec.get(key) is None:
            assert row["display"]["decode"] == F.NA and row["reasons"]["decode"]
    assert _row(t, "mfu")["expected"] == {"prefill": "typical 40-70 %", "decode": "typical 3-15 %"}


def test_phases_table_cpu_only(tiny):
    r = tiny.to_dict()
    t = F.phases_table_data(r)
    assert _row(t, "ttft_ms")["values"]["prefill"] == r["latency"]["ttft_ms"] == pytest.approx(63.742074)
    assert _row(t, "tpot_p99_ms")["values"]["decode"] == r["latency"]["tpot_ms"]["p99"]
    assert _row(t, "step_p50_ms")["values"]["decode"] == r["latency"]["decode_step_ms"]["p50"]
    lg = _row(t, "launch_gap_share")
    assert lg["values"] == {"prefill": None, "decode": None}
    assert lg["reasons"]["decode"] == "no GPU activity in this phase"


def test_phases_table_missing_optional_keys_say_why():
    r = {"latency": {}, "phases": [{"name": "decode", "device": 0, "launch_gap_share": 0.2}]}
    t = F.phases_table_data(r)
    mfu = _row(t, "mfu")
    assert mfu["display"]["decode"] == F.NA
    assert "not computed" in mfu["reasons"]["decode"]
    assert _row(t, "launch_gap_share")["display"]["decode"] == "20.0 %"


# -- overview ---------------------------------------------------------------------------------------


def test_banner_and_cards():
    base = {"phases": [], "latency": {}}
    assert F.banner_data(base)["severity"] == "unknown"
    assert "No symptom" in F.banner_data(base)["title"]
    none = F.banner_data({**base, "symptoms": [], "not_evaluated": [{"id": "S7", "missing": ["peak"]}]})
    assert none["severity"] == "none" and none["title"] == "No symptom fired" and "1 rule(s) not evaluated" in none["text"]
    r = {**base, "symptoms": SYMPTOMS}
    b = F.banner_data(r)
    assert b["severity"] == "high" and b["count"] == 2 and b["title"] == "HIGH: 2 symptoms fired"
    cards = F.symptom_cards_data(r)
    assert [c["id"] for c in cards] == ["S3-launch-gaps", "S5-long-prefill"]  # worst first
    assert cards[0]["findings"] == [("decode.launch_gap_share", "40.0 %")]
    assert cards[0]["thresholds"] == [("max_launch_gap_share", "15.0 %", "share", "S3")]
    assert cards[1]["findings"] == [("steps.prefill_max_ms", "987.4 ms")]


def test_cards_from_the_rule_engine(sglang):
    r = ensure_verdicts(sglang.to_dict())
    assert isinstance(r["symptoms"], list) and isinstance(r["not_evaluated"], list)
    cards = F.symptom_cards_data(r)
    if not cards:
        pytest.skip("no packaged rule fires on the SGLang prefill trace any more")
    ranks = [F.SEVERITY_ORDER.index(c["severity"]) for c in cards]
    assert ranks == sorted(ranks)  # worst first
    assert F.banner_data(r)["severity"] == cards[0]["severity"]
    phases = F.phases_for_device(r)
    for c in cards:
        assert c["findings"] and c["thresholds"] and c["fix"] and c["how_to_verify"]
        for name, text in c["findings"]:
            ph, _, key = name.partition(".")
            if ph in phases and key in ("gpu_idle_share", "launch_gap_share"):
                assert text == F.fmt_value(phases[ph][key], "share")
    for n, v, unit, why in (t for c in cards for t in c["thresholds"]):
        assert v != F.NA and why
    ne = F.not_evaluated_data(r)
    assert all(x["reason"] for x in ne)


def test_ensure_verdicts_keeps_existing_symptoms():
    r = {"symptoms": [SYMPTOMS[0]], "phases": [], "latency": {}}
    assert ensure_verdicts(r)["symptoms"] == [SYMPTOMS[0]]


def test_evidence_nested_thresholds():
    pairs, other = F._evidence_pairs({"launch_gap_share": {"value": 0.3, "threshold": 0.15, "unit": "share"}, "steps": 8})
    assert pairs == [{"name": "launch_gap_share", "measured": 0.3, "threshold": 0.15, "unit": "share"}]
    assert other == [("steps", "8")]


# -- kernels -------------------------------------------------------------------------------------------


def test_kernels_table_from_activities(vllm):
    r = vllm.to_dict()
    rows = F.kernels_table_data(r, vllm.activities)
    dec = [x for x in rows if x["phase"] == "decode"]
    assert sum(x["count"] for x in dec) == F.phases_for_device(r)["decode"]["kernel_count"] == 425
    assert sum(x["share"] for x in dec) == pytest.approx(1.0, abs=1e-4)  # shares rounded to 1e-6
    top = r["phases"][1]["top_kernels"][0]
    assert dec[0]["name"] == top["name"] and dec[0]["total_ms"] == pytest.approx(top["total_ms"])
    # Each kernel once per phase: every kernel of this trace is in a decode step, so no "all" copy.
    assert {x["phase"] for x in rows} == {"decode"} and len(rows) == len({x["name"] for x in rows})
    # Without activities: the report's top-10 lists, the "all" list (the same 10 kernels as decode's) once.
    assert [p["name"] for p in r["phases"]] == ["all", "decode"]
    assert [(p["name"], len(p["top_kernels"])) for p in r["phases"]] == [("all", 10), ("decode", 10)]
    assert [(x["phase"], x["name"]) for x in F.kernels_table_data(r)] == [("decode", t["name"]) for t in r["phases"][1]["top_kernels"]]


# -- KV budget -------------------------------------------------------------------------------------------


def test_kv_budget_reference_config():
    d = F.kv_budget_data(kv_memory_gib=60)  # domain.md §3: ~60 GiB for KV on an 80 GB card
    assert d["ok"] and d["kv_bytes_per_token"] == 131072 and d["weight_bytes"] == 13_438_550_016
    got = [(r["context"], r["kv_gib_per_sequence"], r["max_sequences"], r["usable_sequences"]) for r in d["rows"]]
    assert got == [(2048, 0.25, 240, 180), (8192, 1.0, 60, 45), (32768, 4.0, 15, 11), (131072, 16.0, 3, 2)]
    assert F.kv_budget_data(kv_dtype="int8")["kv_bytes_per_token"] == 65536
    assert F.kv_budget_data(kv_dtype="int4")["kv_bytes_per_token"] == 32768
    # 80 GB - 5 GB - 13.44 GB weights = 61.56 GB -> 229 sequences of 2k.
    assert F.kv_budget_data()["rows"][0]["max_sequences"] == 229


def test_kv_budget_errors_are_one_line():
    d = F.kv_budget_data(memory_gb=10)
    assert not d["ok"] and d["error"].startswith("no memory left for the KV cache")
    bad = F.kv_budget_data({**F.REFERENCE_7B, "num_key_value_heads": 5})
    assert not bad["ok"] and "multiple" in bad["error"]


def test_kv_view_and_contexts():
    assert parse_contexts("2k, 8K 32768") == [2048, 8192, 32768]
    with pytest.raises(ValueError):
        parse_contexts("2x")
    ref = [F.REFERENCE_7B[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                                       "head_dim", "intermediate_size", "vocab_size")]
    d = kv_view("7b", "", *ref, [], 80, 5, "2k", "fp16", "bf16")
    assert d["ok"] and d["rows"][0]["kv_bytes_per_sequence"] == 256 * 2**20
    assert kv_view("custom", "", *ref[:-1], None, [], 80, 5, "2k", "fp16", "bf16")["ok"] is False
    assert kv_view("7b", "", *ref, [], 80, 5, "abc", "fp16", "bf16") == {"ok": False, "error": "context 'abc' is not a whole number of tokens"}
    assert kv_view("file", "", *ref, [], 80, 5, "2k", "fp16", "auto") == {"ok": False, "error": "give a config.json path (or a shipped config name)"}


def _cli_kv(name: str, context: int, memory_gb: int = 80) -> dict:
    import json

    from diagnose.cli import main

    r = CliRunner().invoke(main, ["kv-budget", "--model-config", name, "--seq-len", str(context), "--memory-gb",
                                  str(memory_gb), "--overhead-gb", "5", "--format", "json"])
    if r.exit_code == 2:
        return {"error": r.output.strip().removeprefix("error: ")}
    assert r.exit_code == 0, r.output
    return json.loads(r.output)


def _shipped_configs():
    from diagnose.accounting import shipped_model_configs

    return shipped_model_configs()


@pytest.mark.parametrize("name", _shipped_configs())
def test_kv_page_and_kv_budget_command_give_one_answer_for_every_shipped_config(name):
    """The web KV page takes a model config like the CLI and gives the CLI's answer: the same
    KV bytes per token and per sequence (sliding windows, MLA), weights (quantization: MXFP4
    experts, FP8) and concurrency, by the shipped name and by the config file's path."""
    from importlib import resources

    contexts = (2048, 131072)
    ref = [F.REFERENCE_7B[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                                       "head_dim", "intermediate_size", "vocab_size")]
    path = str(resources.files("diagnose.data").joinpath("models", f"{name}.json"))
    for memory_gb in (80, 800):  # 80 GB: the 671B and 47B models do not fit, and both say so
        webs = (kv_view(name, "", *ref, [], memory_gb, 5, "2048, 131072", "fp16", "auto"),
                kv_view("file", path, *ref, [], memory_gb, 5, "2048, 131072", "fp16", "auto"))
        if "error" in _cli_kv(name, 2048, memory_gb):
            assert [w.get("error") for w in webs] == [_cli_kv(name, 2048, memory_gb)["error"]] * 2
            continue
        for web in webs:
            assert web["ok"], web
            for row, c in zip(web["rows"], contexts):
                cli = _cli_kv(name, c, memory_gb)
                assert (web["kv_bytes_per_token"], web["weight_bytes"], web["weight_dtype"]) == (
                    cli["kv_bytes_per_token"], cli["weight_bytes"], cli["weight_dtype"])
                assert (row["kv_bytes_per_sequence"], row["max_sequences"], row["usable_sequences"]) == (
                    cli["kv_bytes_per_sequence"], cli["max_sequences"], cli["usable_sequences"])


def test_kv_page_knows_mxfp4_like_the_cli():
    """gpt-oss-20b on 80 GB, 131k-token sequences: MXFP4 experts leave room for 18 (the page
    used to count every weight at 16 bit and said 5)."""
    ref = [F.REFERENCE_7B[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "num_key_value_heads",
                                       "head_dim", "intermediate_size", "vocab_size")]
    web = kv_view("gpt-oss-20b", "", *ref, [], 80, 5, "131072", "fp16", "auto")
    assert web["rows"][0]["max_sequences"] == _cli_kv("gpt-oss-20b", 131072)["max_sequences"] == 18


# -- compare ---------------------------------------------------------------------------------------------


def _lat_report(ttft, p50, p90, p99, idle=0.1):
    return make_report({"latency": {"ttft_ms": ttft, "tpot_ms": {"p50": p50, "p90": p90, "p99": p99, "mean": None}},
                        "phases": [{"name": "all", "device": 0, "gpu_idle_share": idle, "gpu_busy_ms": 1.0}]})


def test_compare_view_uses_the_rule_verdict():
    rs = load_ruleset()
    a = _lat_report(100.0, 20.0, 25.0, 30.0)
    d = F.compare_view(compare_reports(a, _lat_report(100.0, 20.0, 25.0, 46.0), rs))  # p99 x1.53
    assert d["verdict"] == "regression" and d["css"] == "regression"
    assert F.compare_view(compare_reports(a, _lat_report(140.0, 20.0, 25.0, 44.0), rs))["verdict"] == "no regression"  # x1.40, x1.467
    none = F.compare_view(compare_reports(make_report({}), a, rs))
    assert none["verdict"] == "not comparable" and none["css"] == "inconclusive"
    row = next(r for r in F.compare_view(compare_reports(a, _lat_report(100.0, 20.0, 25.0, 30.0, idle=0.3), rs))["rows"]
               if r["finding"] == "all.gpu_idle_share")
    assert row["change_text"] == "+20.0 pp" and row["worse"] is True


def test_compare_real_traces(vllm, tiny):
    d = compare_reports(tiny.to_dict(), vllm.to_dict(), load_ruleset())
    p99 = next(r for r in d.rows if r["finding"] == "latency.tpot_p99_ms")
    assert p99["baseline"] == tiny.to_dict()["latency"]["tpot_ms"]["p99"] and p99["candidate"] == vllm.to_dict()["latency"]["tpot_ms"]["p99"]
    assert p99["ratio"] == pytest.approx(p99["candidate"] / p99["baseline"])


# -- server ----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def app_two(vllm, tiny):
    ne = [{"id": "S7-above-peak", "symptom": "S7", "title": "above peak", "severity": "medium", "missing": ["peak_tbps"],
           "reason": "missing finding(s): peak_tbps"}]
    return create_app([str(VLLM), str(TINY)], [with_verdicts(vllm, SYMPTOMS, ne), tiny])


def test_create_app_layout_and_callbacks(app_two):
    ids = _ids(app_two.layout)
    assert {f"nav-{k}" for k, _, _ in PAGES} <= ids
    assert {"url", "trace-select", "page-content"} <= ids
    opts = _find(app_two.layout, "trace-select").options
    assert [o["value"] for o in opts] == ["0", "1"]  # indices, never paths
    assert [o["label"] for o in opts] == ["graph_execution.json.gz", "tiny_cpu.json.gz"]
    cb = app_two.callback_map
    assert {"page-content.children", "timeline-graph.figure", "kv-output.children", "compare-output.children"} <= set(cb)


def test_pages_render_with_stable_ids(app_two):
    st = app_two.diagnose_state
    expect = {
        "/": {"overview-banner", "key-numbers", "symptom-card-S3-launch-gaps", "symptom-card-S5-long-prefill",
              "not-evaluated", "quality-list"},
        "/phases": {"phases-table-2", "gaps-table-2"},
        "/timeline": {"timeline-graph"},
        "/kernels": {"categories-graph", "attention-share", "kernels-grid"},
        "/roofline": {"roofline-graph", "roofline-note"},
        "/kv": {"kv-output", "kv-table", "kv-per-token", "kv-num_hidden_layers", "kv-dtype"},
        "/compare": {"compare-a", "compare-b", "compare-output", "compare-verdict"},
    }
    for path, want in expect.items():
        assert want <= _ids(render_page(st, path, "0")), path
    page = render_page(st, "/", "0")
    banner = _find(page, "overview-banner")
    assert "HIGH: 2 symptoms fired" in _text(banner)
    card = _find(page, "symptom-card-S3-launch-gaps")
    assert "launch-gap share of GPU window (decode steps): 40.0 %" in _text(card) and "CUDA graph capture" in _text(card)
    tiny_page = render_page(st, "/", "1")
    assert st.entries[1].report["symptoms"] == []  # the rule engine ran on the CPU-only sample: nothing fires
    assert "No symptom fired" in _text(_find(tiny_page, "overview-banner"))
    ne = _find(tiny_page, "not-evaluated")
    assert len(ne.children) == len(st.entries[1].report["not_evaluated"]) > 0
    assert "missing finding" in _text(ne)
    assert "no_gpu_activity" in _text(_find(tiny_page, "quality-list"))
    assert "not-found" in _ids(render_page(st, "/etc/passwd", "0"))


def test_trace_keys_never_name_files(app_two):
    st = app_two.diagnose_state
    assert st.get("/work/secret.json").key == "0"
    assert st.get("1").path == str(TINY)
    assert st.get(None).key == "0"


def test_timeline_zoom_callback(app_two):
    st = app_two.diagnose_state
    # The axis counts from the trace start: the vLLM trace's first GPU activity is at 8.370878 ms.
    assert timeline_zoom(st, {"xaxis.range[0]": 0.0, "xaxis.range[1]": 1.0}, "0").layout.meta["visible_activities"] == 0
    fig = timeline_zoom(st, {"xaxis.range[0]": 8.0, "xaxis.range[1]": 9.0}, "0")
    assert fig.layout.meta["mode"] == "detail" and fig.layout.xaxis.title.text == "ms from trace start"
    assert fig.layout.meta["visible_activities"] == 40  # activities overlapping [8, 9) ms from the trace start
    full = timeline_zoom(st, {"xaxis.autorange": True}, "0")
    assert full.layout.meta["visible_activities"] == 434
    import dash

    assert timeline_zoom(st, {"autosize": True}, "0") is dash.no_update
    assert timeline_zoom(st, {"xaxis.range[0]": 0, "xaxis.range[1]": 1}, "1").layout.meta["mode"] == "empty"


def test_compare_page_single_trace_explains(tiny):
    app = create_app([str(TINY)], [tiny])
    page = render_page(app.diagnose_state, "/compare", "0")
    assert "compare-help" in _ids(page)
    assert "--trace baseline.json.gz --trace candidate.json.gz" in _text(page)


def test_create_app_accepts_report_dicts(tiny):
    app = create_app(["a.json"], [tiny.to_dict()])
    e = app.diagnose_state.entries[0]
    assert e.activities is None and e.label == "a.json"
    assert "kernels-grid" in _ids(render_page(app.diagnose_state, "/kernels", "0"))


def test_load_analyses_progress_bar_for_big_inputs():
    buf = io.StringIO()
    from rich.console import Console

    out = load_analyses([str(TINY)], progress_threshold_bytes=0, console=Console(file=buf, width=120))
    assert len(out) == 1 and out[0].to_dict()["latency"]["ttft_ms"] == pytest.approx(63.742074)
    assert "analysing tiny_cpu.json.gz" in buf.getvalue() and "1/1" in buf.getvalue()
    buf2 = io.StringIO()
    load_analyses([str(TINY)], console=Console(file=buf2))
    assert buf2.getvalue() == ""  # small inputs: no bar


def test_build_state_checks_lengths():
    with pytest.raises(ValueError):
        build_state(["a", "b"], [{}])


# -- serve CLI -----------------------------------------------------------------------------------------


def test_serve_missing_trace_exits_2(tmp_path):
    res = CliRunner().invoke(serve_command, ["--trace", str(tmp_path / "nope.json")])
    assert res.exit_code == 2
    assert res.output.strip().splitlines() == [f"error: trace not found: {tmp_path / 'nope.json'}"]


def test_serve_bad_trace_exits_2(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text("this is not a trace")
    res = CliRunner().invoke(serve_command, ["--trace", str(bad)])
    assert res.exit_code == 2
    lines = res.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")


def test_serve_binds_loopback_by_default(monkeypatch):
    import dash

    calls = {}
    monkeypatch.setattr(dash.Dash, "run", lambda self, **kw: calls.update(kw))
    res = CliRunner().invoke(serve_command, ["--trace", str(TINY), "--port", "8123"])
    assert res.exit_code == 0, res.output
    assert calls["host"] == "127.0.0.1" and calls["port"] == 8123 and calls["debug"] is False


# -- HTML report -------------------------------------------------------------------------------------------


def test_write_html_is_self_contained(vllm, tmp_path):
    from plotly.offline import get_plotlyjs

    out = write_html(with_verdicts(vllm), tmp_path / "report.html")
    text = out.read_text(encoding="utf-8")
    assert text.count(get_plotlyjs()[:200]) == 1  # plotly.js inlined exactly once
    assert "<script src=" not in text  # nothing fetched: opens offline
    for needle in ('id="overview-banner"', 'id="symptom-card-S3-launch-gaps"', 'id="phases-table-2"',
                   'id="timeline-graph"', 'id="categories-graph"', 'id="roofline-graph"', 'id="kernels-table"',
                   'id="quality-list"', "HIGH: 2 symptoms fired", "graph_kernels_no_launch", 'id="coverage"',
                   'id="layer-strip"'):
        assert needle in text, needle
    assert text.count("Plotly.newPlot(") == 4  # timeline, layer strip, categories, roofline


def test_render_html_from_report_dict_has_no_timeline(tiny):
    text = render_html(tiny.to_dict())
    assert "Timeline not available" in text and 'id="timeline-graph"' not in text
    assert "No symptom verdict" in text
    assert math.isclose(tiny.to_dict()["latency"]["ttft_ms"], 63.742074)
    assert "63.74 ms" in text


def test_write_html_from_dict_attaches_verdicts(tiny, tmp_path):
    text = write_html(tiny.to_dict(), tmp_path / "r.html").read_text(encoding="utf-8")
    assert "No symptom fired" in text and 'id="not-evaluated"' in text


def test_html_escapes_kernel_names(tmp_path):
    r = {"phases": [{"name": "all", "device": 0, "top_kernels": [{"name": "<script>alert(1)</script>", "category": "other",
                                                                 "count": 1, "total_ms": 1.0, "share": 1.0}]}],
         "latency": {}, "quality": [{"code": "x", "message": "<b>m</b>"}]}
    text = render_html(r)
    assert "<script>alert(1)</script>" not in text and "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&lt;b&gt;m&lt;/b&gt;" in text
