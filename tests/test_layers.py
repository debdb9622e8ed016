"""Per-layer time (issue 26): layer segmentation from every source, the layer x op-class
table, the outlier finding, the coverage line and the guard against graph-launch rows.

Expected numbers are derived from the raw events (kernel -> launch call by correlation ->
the ``nn.Module`` frames open on the launching thread; see ``_raw_module_layers``), not from
the tool. "Kernel time" is ``cat: kernel`` events only on both sides (memsets and copies are
not kernels: on H100 the 168 ``Memset (Device)`` of the Linears would add 0.145 ms).
"""
from __future__ import annotations

import gzip
import json
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import KinetoBuilder, shared_trace, sweep
from diagnose.cli import main
from diagnose.findings import flatten, labels
from diagnose.pipeline import attach_verdicts, run_analysis
from diagnose.options import AnalysisOptions

H100 = "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
MI300 = "tracelens/mi300/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
VLLM_FULL = "tracelens/vllm_decode_full/graph_execution.json.gz"
VLLM_CAPTURE = "tracelens/vllm_decode_full/graph_capture_rank_0.1773709742341309550.pt.trace.json.gz"
PIECEWISE = "tracelens/vllm_prefilldecode_piecewise/graph_execution.json.gz"
SGLANG = "tracelens/sglang_decode/sglang_Qwen3-8B_decode.json.gz"
SGLANG_CAPTURE = "tracelens/sglang_decode/bs_32_rank0.json.gz"
RESNET = "kineto-tb-plugin/resnet50_num_workers_0_pt1.9/worker0.1623143089861.pt.trace.json.gz"


def _events(path: Path) -> list[dict]:
    raw = path.read_bytes()
    doc = json.loads(gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw)
    return [e for e in (doc["traceEvents"] if isinstance(doc, dict) else doc) if e.get("ph") == "X"]


def _raw_module_layers(path: Path, top: str, layer: str, attn: str, mlp: str) -> dict:
    """From the raw events: kernel time (µs) launched inside frame ``top`` and, per layer
    frame (time order), inside its ``attn`` / ``mlp`` module frames and in all."""
    ev = _events(path)
    rt = {}
    for e in ev:
        if e.get("cat") in ("cuda_runtime", "cuda_driver"):
            rt.setdefault(e["args"].get("correlation"), e)
    frames = [e for e in ev if e.get("cat") == "python_function" and e["name"].startswith("nn.Module: ")]
    t = next(e for e in frames if e["name"] == f"nn.Module: {top}")
    layers = sorted((e for e in frames if re.fullmatch(rf"nn\.Module: {layer}_\d+", e["name"])), key=lambda e: e["ts"])
    subs = [e for e in frames if re.fullmatch(rf"nn\.Module: ({attn}|{mlp})_\d+", e["name"])]
    out = {"top_us": 0.0, "layers": [{"all": 0.0, "attn": 0.0, "mlp": 0.0} for _ in layers]}
    for k in ev:
        if k.get("cat") != "kernel":
            continue
        launch = rt.get(k["args"].get("correlation"))
        if launch is None or not (t["ts"] <= launch["ts"] <= t["ts"] + t["dur"]):
            continue
        out["top_us"] += k["dur"]
        at = launch["ts"]
        li = next((i for i, f in enumerate(layers) if f["ts"] <= at <= f["ts"] + f["dur"]), None)
        if li is None:
            continue
        out["layers"][li]["all"] += k["dur"]
        sub = next((f for f in subs if f["ts"] <= at <= f["ts"] + f["dur"]), None)
        if sub is not None:
            out["layers"][li]["attn" if sub["name"].startswith(f"nn.Module: {attn}_") else "mlp"] += k["dur"]
    return out


def _layer_rows(a, phase=None):
    return [r for r in a.report.layers if r.part == "layer" and (phase is None or r.phase == phase)]


def _attn_ms(r) -> float:
    return sum(r.op_class_ms.get(c, 0.0) for c in ("qkv", "attention", "o_proj"))


# ---------------------------------------------------------------- module frames (with_modules)


@pytest.mark.parametrize("rel,top_ms,layer0", sweep([
    (H100, 31.7601, (0.6483, 0.3353)),
    (MI300, 29.7432, (0.5519, 0.4088)),
], {0}))
def test_hf_qwen_forward_from_module_frames(rel, top_ms, layer0):
    path = shared_trace(rel)
    raw = _raw_module_layers(path, "Qwen2Model_0", "Qwen2DecoderLayer", "Qwen2Attention", "Qwen2MLP")
    assert raw["top_us"] / 1e3 == pytest.approx(top_ms, abs=5e-5)
    a = run_analysis(str(path))
    (seg,) = a.report.layer_segmentation
    assert (seg.source, seg.confidence, seg.layers, seg.layer_class) == ("modules", "high", 24, "Qwen2DecoderLayer")
    rows = [r for r in a.report.layers if r.device == seg.device and r.phase == seg.phase]
    assert [r.part for r in rows] == ["pre"] + ["layer"] * 24 + ["post"]
    # layer rows + pre/post = the kernel time launched inside Qwen2Model_0 (0.1 % acceptance; exact to rounding)
    total = sum(r.kernel_ms for r in rows)
    assert total == pytest.approx(raw["top_us"] / 1e3, rel=1e-3)
    assert total == pytest.approx(raw["top_us"] / 1e3, abs=3e-5)
    # attention / MLP split per layer = the module frames'
    lay = _layer_rows(a)
    for r, want in zip(lay, raw["layers"]):
        assert r.kernel_ms == pytest.approx(want["all"] / 1e3, abs=2e-6)
        assert _attn_ms(r) == pytest.approx(want["attn"] / 1e3, abs=3e-6)
        assert r.op_class_ms.get("mlp", 0.0) == pytest.approx(want["mlp"] / 1e3, abs=2e-6)
    assert (round(_attn_ms(lay[0]), 4), round(lay[0].op_class_ms["mlp"], 4)) == layer0
    # the structural algorithm, run beside the frames, puts 99.9 % of the forward in the same rows
    assert seg.agreement["structural"] >= 0.999


def test_h100_previous_step_tail_is_named_not_counted():
    a = run_analysis(str(shared_trace(H100)))
    (c,) = a.report.coverage
    # 1,465 kernels, 45.4327 ms in the file; 436 of them (13.6726 ms) have no launch in the file: step #5's tail
    assert (c.kernel_ms, c.forward_ms, c.previous_step_ms) == pytest.approx((45.4327, 31.7601, 13.6726), abs=5e-5)
    assert c.source == "modules" and c.layers == 24
    assert "previous step's tail" in c.text and "24 layers" in c.text


# ---------------------------------------------------------------- vLLM FULL decode (gpt-oss-20b)


def test_vllm_full_capture_and_structural_agree():
    opts = AnalysisOptions.from_kwargs(model_config="gpt-oss-20b", gpu="MI300X",
                                       capture_trace=str(shared_trace(VLLM_CAPTURE)))
    a = run_analysis(str(shared_trace(VLLM_FULL)), opts)
    (seg,) = a.report.layer_segmentation
    assert (seg.source, seg.layers, seg.confidence) == ("capture", 24, "high")
    assert seg.agreement["structural"] >= 0.95
    assert seg.agreement["structural"] == 1.0
    lay = _layer_rows(a)
    # layer 0 has 16 kernels (plain rms_norm, no to_copy); then sliding 17 and full 18, alternating
    assert [r.kernel_count for r in lay] == [16] + [18, 17] * 11 + [18]
    assert [r.layer_type for r in lay] == ["sliding_attention", "full_attention"] * 12
    assert sum(r.kernel_ms for r in lay) == pytest.approx(10.372085, abs=3e-5)
    # full-attention layers are compared with full-attention layers: none is an outlier for its type
    for r in lay:
        assert max([r.ratio_to_type_median, *r.class_ratio.values()]) < 2.0
    assert seg.type_medians_ms == pytest.approx({"sliding_attention": 0.4235, "full_attention": 0.45798}, abs=5e-6)
    attach_verdicts(a)
    assert "layer-outlier" not in [s.id for s in a.report.symptoms]
    # replayed kernels mapped to ops through the capture: the costed rows have TB/s
    assert a.report.coverage[0].graph_op_share == 1.0
    assert all(r.achieved_tbps for r in lay)


@pytest.mark.parametrize("config", ["gpt-oss-20b", None])
def test_vllm_full_structural_without_capture(config):
    opts = AnalysisOptions.from_kwargs(model_config=config) if config else None
    a = run_analysis(str(shared_trace(VLLM_FULL)), opts)
    (seg,) = a.report.layer_segmentation
    assert (seg.source, seg.layers, seg.confidence) == ("structural", 24, "high")
    assert "period 35 kernels = 2 layers" in seg.basis and "name-count mode 24" in seg.basis
    assert ("config num_hidden_layers 24" if config else "no model config") in seg.basis
    assert len(seg.layer_types) == 2
    assert seg.max_ratio is not None and seg.max_ratio < 2.0
    c = a.report.coverage[0]
    assert c.graph_forward_share == 1.0 and c.graph_op_share == 0.0
    assert "give --capture-trace" in c.text


def test_vllm_full_without_step_markers(tmp_path):
    """Markers removed (a variant of the real trace): the forward is the device's kernels."""
    doc = json.loads(gzip.decompress(shared_trace(VLLM_FULL).read_bytes()))
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in ("user_annotation", "gpu_user_annotation")]
    p = tmp_path / "no_markers.json"
    p.write_text(json.dumps(doc))
    a = run_analysis(str(p))
    (seg,) = a.report.layer_segmentation
    assert (seg.layers, seg.source) == (24, "structural")
    assert sum(r.kernel_ms for r in _layer_rows(a)) == pytest.approx(10.372085, abs=3e-5)


# ---------------------------------------------------------------- vLLM PIECEWISE mixed step


def test_piecewise_eager_attention_lands_in_its_layer():
    a = run_analysis(str(shared_trace(PIECEWISE)), AnalysisOptions.from_kwargs(model_config="gpt-oss-20b"))
    (seg,) = a.report.layer_segmentation
    assert (seg.source, seg.layers, seg.phase) == ("structural", 24, "mixed")
    g = a.activities
    lf = a.layer_frame
    eager = g[(g["launch_kind"] == "launch") & (g["name"] == "kernel_unified_attention_2d")].sort_values("start_ns")
    assert len(eager) == 24
    assert lf.loc[eager.index, "part"].tolist() == [2] * 24
    assert lf.loc[eager.index, "layer"].tolist() == list(range(24))
    # ... in the same layer as the graph-replayed qkv GEMM launched before it
    for pos in eager.index:
        before = g.index[(g["start_ns"] < g.at[pos, "start_ns"]) & (g["category"] == "gemm")][-1]
        assert lf.at[before, "layer"] == lf.at[pos, "layer"] and lf.at[before, "op_class"] == 0  # qkv
    lay = _layer_rows(a)
    assert [r.layer_type for r in lay] == ["sliding_attention", "full_attention"] * 12
    assert max(max([r.ratio_to_type_median, *r.class_ratio.values()]) for r in lay) < 2.0


# ---------------------------------------------------------------- SGLang decode


def test_sglang_decode_layer7_qkv_outlier():
    """Expert reading §9: layer 7's qkv GEMM took 148.78 µs against a typical ~21 µs."""
    a = run_analysis(str(shared_trace(SGLANG)))
    attach_verdicts(a)
    (seg,) = a.report.layer_segmentation
    assert (seg.layers, seg.confidence) == (36, "high")
    assert [r.kernel_count for r in _layer_rows(a)] == [15] * 36
    assert (seg.max_ratio_layer, seg.max_ratio_class) == (7, "qkv")
    assert seg.max_ratio == pytest.approx(7.0077, abs=1e-4)
    s = next(s for s in a.report.symptoms if s.id == "layer-outlier")
    assert s.summary.startswith("layer 7 (qkv) takes 7.0x the median")


def test_sglang_capture_module_paths():
    opts = AnalysisOptions.from_kwargs(capture_trace=str(shared_trace(SGLANG_CAPTURE)))
    a = run_analysis(str(shared_trace(SGLANG)), opts)
    (seg,) = a.report.layer_segmentation
    assert (seg.source, seg.layers, seg.layer_class, seg.confidence) == ("capture", 36, "Qwen3DecoderLayer", "high")
    assert seg.agreement["structural"] == 1.0
    rows = [r for r in a.report.layers if r.phase == seg.phase]
    # the replay: 544 kernels, 9.656404 ms (gather, 36 x 15, final norm, LM head in LogitsProcessor, cast)
    assert sum(r.kernel_count for r in rows) == 544
    assert sum(r.kernel_ms for r in rows) == pytest.approx(9.656404, abs=3e-5)
    # post: the final add-RMSNorm and LogitsProcessor (the LM head GEMM 396.83 µs and its cast)
    assert rows[-1].kernel_ms == pytest.approx(0.410009, abs=2e-6)
    assert rows[-1].op_class_ms == pytest.approx({"norm": 0.004726, "lm_head": 0.405283}, abs=2e-6)


# ---------------------------------------------------------------- record_function / NVTX ranges


def test_ranges_source_from_renamed_module_frames(tmp_path):
    """Variant: the decoder-layer frames become record_function ranges ``model.layers.<i>``
    and every other python frame is dropped: the same layers, from ranges."""
    path = shared_trace(H100)
    doc = json.loads(gzip.decompress(path.read_bytes()))
    out = []
    for e in doc["traceEvents"]:
        if e.get("cat") == "python_function":
            m = re.fullmatch(r"nn\.Module: Qwen2DecoderLayer_(\d+)", e.get("name", ""))
            if not m:
                continue
            e = {**e, "cat": "user_annotation", "name": f"model.layers.{m.group(1)}", "args": {}}
        out.append(e)
    doc["traceEvents"] = out
    p = tmp_path / "ranges.json"
    p.write_text(json.dumps(doc))
    a = run_analysis(str(p))
    b = run_analysis(str(path))
    (seg,) = a.report.layer_segmentation
    assert (seg.source, seg.layers, seg.layer_class) == ("ranges", 24, "model.layers.#")
    assert [r.kernel_ms for r in _layer_rows(a)] == [r.kernel_ms for r in _layer_rows(b)]


# ---------------------------------------------------------------- a synthetic replay


def _replay(tmp_path: Path, attention_factor: float, layers: int = 12) -> Path:
    """One decode step replayed from one graph launch: gather, ``layers`` x [rms_norm, qkv GEMM,
    rotary, KV-cache store, attention, o GEMM, rms_norm, gate_up GEMM, act_and_mul, down GEMM],
    final rms_norm, LM-head GEMM, argmax. Layer 7's attention-class kernels (rotary, cache
    store, attention) take ``attention_factor`` x their usual time."""
    b = KinetoBuilder()
    b.annotation("ProfilerStep#1", 0, 100)
    b.runtime("cudaGraphLaunch", 10, 20, 77)
    seq = [("vectorized_gather_kernel", 6, False)]
    for i in range(layers):
        f = attention_factor if i == 7 else 1.0
        seq += [("rms_norm_kernel", 5, False), ("sm90_xmma_gemm_bf16_qkv", 20, False),
                ("rotary_embedding_kernel", 6 * f, True), ("reshape_and_cache_flash_kernel", 4 * f, True),
                ("flash_fwd_splitkv_kernel", 30 * f, True), ("sm90_xmma_gemm_bf16_o", 16, False),
                ("rms_norm_kernel", 5, False), ("sm90_xmma_gemm_bf16_gate_up", 60, False),
                ("act_and_mul_kernel", 8, False), ("sm90_xmma_gemm_bf16_down", 40, False)]
    seq += [("rms_norm_kernel", 5, False), ("sm90_xmma_gemm_bf16_lm_head", 300, False), ("argmax_kernel", 4, False)]
    t = 40.0
    for name, dur, _ in seq:
        b.kernel(name, t, dur, corr=77)
        t += dur + 1
    return b.write(tmp_path / "replay.json")


def test_planted_slow_attention_in_layer_7(tmp_path):
    a = run_analysis(str(_replay(tmp_path, 2.0)))
    attach_verdicts(a)
    (seg,) = a.report.layer_segmentation
    assert (seg.layers, seg.source, seg.confidence) == (12, "structural", "high")
    assert (seg.max_ratio_layer, seg.max_ratio_class, seg.max_ratio) == (7, "attention", 2.0)
    assert seg.max_ratio_excess_ms == pytest.approx(0.040, abs=1e-9)  # (6 + 4 + 30) µs more than the median
    f = flatten(a.report)
    assert (f["layers.max_ratio"], f["layers.max_ratio_layer"], f["layers.count"]) == (2.0, 7, 12)
    assert labels(a.report)["layers.max_ratio_class"] == "attention"
    s = next(s for s in a.report.symptoms if s.id == "layer-outlier")
    assert s.summary.startswith("layer 7 (attention) takes 2.0x the median of the decoder layers")
    assert a.report.coverage[0].graph_forward_share == 1.0


def test_no_outlier_below_twice_the_median(tmp_path):
    a = run_analysis(str(_replay(tmp_path, 1.9)))
    attach_verdicts(a)
    (seg,) = a.report.layer_segmentation
    assert (seg.max_ratio_layer, seg.max_ratio_class) == (7, "attention")
    assert seg.max_ratio == pytest.approx(1.9)
    assert "layer-outlier" not in [s.id for s in a.report.symptoms]


# ---------------------------------------------------------------- traces without decoder layers


def test_training_trace_has_no_layers():
    a = run_analysis(str(shared_trace(RESNET)))
    assert a.report.layers == [] and a.report.layer_segmentation == []
    (c,) = a.report.coverage
    assert c.source is None and c.forward_share == 0.0
    assert c.text.startswith("GPU 0: no decoder layers found")


# ---------------------------------------------------------------- outputs


def test_terminal_prints_coverage_and_summary_and_table_on_request():
    path = str(shared_trace(VLLM_FULL))
    out = CliRunner().invoke(main, ["run", "--trace", path]).output
    assert "Coverage: GPU 2: 100.0 % of kernel time (10.675 of 10.675 ms) attributed to 24 layers" in out
    assert "Layers (decode, GPU 2): 24 layers from structural (confidence high)" in out
    assert "Layers × op class" not in out
    full = CliRunner().invoke(main, ["run", "--trace", path, "--layers"]).output
    assert "Layers × op class, decode (GPU 2)" in full


def test_notebook_layers_dataframe():
    from diagnose import analyze_trace

    r = analyze_trace(str(shared_trace(H100)))
    df = r.layers
    assert len(df) == 26 and df["part"].tolist() == ["pre"] + ["layer"] * 24 + ["post"]
    lay = df[df["part"] == "layer"]
    assert (lay["qkv"] + lay["attention"] + lay["o_proj"]).sum() == pytest.approx(15.4659, abs=1e-4)
    assert lay["mlp"].sum() == pytest.approx(7.9825, abs=1e-4)
    assert df["kernel_ms"].sum() == pytest.approx(31.7601, abs=1e-4)
    assert r.coverage["text"].str.startswith("GPU 0: 69.9 %").all()


def test_html_report_has_coverage_and_strip(tmp_path):
    pytest.importorskip("plotly")
    from diagnose.app.html import write_html

    a = run_analysis(str(shared_trace(VLLM_FULL)))
    text = write_html(a, tmp_path / "r.html").read_text()
    assert '<ul id="coverage"><li>GPU 2: 100.0 % of kernel time' in text
    assert 'id="layer-strip"' in text and "selected layer cell" in text
    cells = json.loads(re.search(r'<script type="application/json" id="layer-strip-cells">(.*?)</script>', text, re.S).group(1))
    assert len(cells["7|attention"]) == 5  # to_copy, rotary, KV store, attention, reduce_segments


def test_web_timeline_page_has_coverage_and_strip():
    dash = pytest.importorskip("dash")
    from diagnose.app.server import create_app, timeline_highlight, timeline_page, timeline_update

    a = run_analysis(str(shared_trace(VLLM_FULL)))
    app = create_app([VLLM_FULL], [a])
    st = app.diagnose_state
    page = str(timeline_page(st.get("0")))
    assert "coverage" in page and "attributed to 24 layers" in page and "layer-strip" in page
    fig = timeline_highlight(st, {"points": [{"x": "7", "y": "attention"}]}, "0")
    assert fig.data[-1].name == "selected layer cell" and fig.layout.meta["highlighted"] == 5
    assert len([x for x in fig.data[-1].x if x is not None]) == 10
    # a click sent in one request with the timeline's autosize relayout (a page just drawn) still highlights
    both = {"timeline-graph.relayoutData": "timeline-graph", "layer-strip.clickData": "layer-strip"}
    fig = timeline_update(st, both, {"autosize": True}, {"points": [{"x": "7", "y": "attention"}]}, "0")
    assert fig.data[-1].name == "selected layer cell" and fig.layout.meta["highlighted"] == 5
    assert timeline_update(st, {"timeline-graph.relayoutData": "timeline-graph"}, {"autosize": True},
                           {"points": [{"x": "7", "y": "attention"}]}, "0") is dash.no_update


# ---------------------------------------------------------------- graph launches are never ops


_GRAPH_LAUNCH = re.compile(r"(?:cuda|hip|cu)GraphLaunch", re.I)


def _graph_launch_rows(report: dict) -> list[str]:
    bad = []
    for r in report.get("kernel_table") or []:
        for k in ("op", "category", "kernel"):
            if r.get(k) and _GRAPH_LAUNCH.search(str(r[k])):
                bad.append(f"kernel_table.{k}={r[k]}")
    for p in report.get("phases") or []:
        bad += [f"categories_ms.{c}" for c in p.get("categories_ms") or {} if _GRAPH_LAUNCH.search(c)]
        bad += [f"top_kernels={k['name']}" for k in p.get("top_kernels") or []
                if _GRAPH_LAUNCH.search(str(k.get("name"))) or _GRAPH_LAUNCH.search(str(k.get("category")))]
    for r in report.get("layers") or []:
        bad += [f"layers.op_class_ms.{c}" for c in r.get("op_class_ms") or {} if _GRAPH_LAUNCH.search(c)]
    return bad


def test_no_report_row_names_a_graph_launch_as_an_op():
    """Every golden report (test_golden keeps them equal to today's output on every shared
    trace) and the whole kernel tables of the graph-replay traces."""
    golden = sorted((Path(__file__).parent / "golden").glob("*.json"))
    assert golden
    for p in golden:
        assert _graph_launch_rows(json.loads(p.read_text())) == [], p.name
    for rel in (VLLM_FULL, PIECEWISE, SGLANG, "hta/negative_queue_length_values_check/rank0.json.gz"):
        a = run_analysis(str(shared_trace(rel)))
        kt = a.kernel_frame
        for col in ("op", "category", "kernel"):
            assert not kt[col].dropna().astype(str).str.contains(_GRAPH_LAUNCH).any(), (rel, col)
        assert _graph_launch_rows(a.to_dict()) == []


def test_coverage_in_every_golden_report_with_kernels():
    golden = sorted((Path(__file__).parent / "golden").glob("*.json"))
    for p in golden:
        d = json.loads(p.read_text())
        kernels = sum(x["kernel_count"] for x in d["phases"] if x["name"] == "all" and x["device"] is not None)
        if kernels:
            assert d["coverage"] and all(c["text"].startswith(f"GPU {c['device']}: ") for c in d["coverage"]), p.name
        else:
            assert d["coverage"] == [], p.name
