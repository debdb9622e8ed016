"""Per-kernel efficiency table (analyzers/kernels.py) and operator FLOP/byte models
(analyzers/opcost.py): exact numbers derived by hand, on the real traces of ../shared/traces
(expert_readings.md sections 1, 3, 4, 8) and on the op formulas themselves."""
from __future__ import annotations

import dataclasses
import math

import pandas as pd
import pytest
from conftest import shared_trace

from diagnose.analyzers import analyze
from diagnose.trace.capture import load_capture_mapping
from diagnose.analyzers.kernels import (
    SHAPES_UNKNOWN,
    kernel_records,
    kernel_table,
    step_seq_info,
)
from diagnose.analyzers.opcost import SeqInfo, op_bytes, op_cost, op_flops
from diagnose.hardware import gpu_by_name
from diagnose.trace.load import load_trace

SGLANG = "tracelens/sglang_prefilldecode/sglang_Qwen3-8B_prefilldecode.json.gz"
VLLM_DIR = "tracelens/vllm_decode_full/"
VLLM_EXEC = VLLM_DIR + "graph_execution.json.gz"
VLLM_CAPTURE = VLLM_DIR + "graph_capture_rank_0.1773709742341309550.pt.trace.json.gz"
H100 = "tracelens/h100/Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz"
NSYS = "nvfuser/ee4fcf3/report1.sqlite"

# aiter::mha_batch_prefill's Input Dims in the SGLang trace: q [tokens, heads, dim], the paged
# K/V pools, cu_seqlens_q [B+1], kv_indptr [B+1], kv_page_indices, then 24 scalars/None.
MHA_DIMS = [[15360, 32, 128], [835874, 8, 128], [835874, 8, 128], [16], [16], [15616]] + [[]] * 24
MHA_TYPES = ["c10::BFloat16"] * 3 + ["int"] * 3 + ["Scalar"] * 12 + [""] * 12
SGLANG_MARKER = "execute_15360_context_15(sq15360sk15360sqsq15728640sqsk15728640)_generation_0(sq0sk0sqsq0sqsk0)"
# causal (query, key) pairs per layer, domain.md convention S^2/2 per sequence:
# 15 sequences x 1024^2 / 2 = 7,864,320
MHA_CALL_FLOPS = 4 * 32 * 128 * (15 * 1024 * 1024 // 2)  # = 128,849,018,880 FLOP per layer


@pytest.fixture(scope="module")
def sglang():
    tr = load_trace(str(shared_trace(SGLANG)))
    return tr, analyze(tr)


@pytest.fixture(scope="module")
def vllm():
    tr = load_trace(str(shared_trace(VLLM_EXEC)))
    return tr, analyze(tr)


# ----------------------------------------------------------------------------- op formulas


@pytest.mark.parametrize(
    "name,dims,expected",
    [
        # today's attainment.op_flops results, unchanged
        ("aten::mm", [[15360, 4096], [4096, 24576]], 2 * 15360 * 4096 * 24576),
        ("aten::mm", [[32768, 2048], [2048, 2048], [32768, 2048]], 2 * 32768 * 2048 * 2048),  # out= variant
        ("aten::addmm", [[1024], [8944, 1024], [1024, 1024], [], []], 2 * 8944 * 1024 * 1024),
        ("aten::linear", [[16, 559, 1024], [2816, 1024], []], 2 * 16 * 559 * 1024 * 2816),
        ("aten::bmm", [[1, 32, 1], [1, 1, 559]], 2 * 1 * 32 * 1 * 559),
        ("aten::baddbmm", [[8, 2, 17], [8, 2, 128], [8, 128, 17], [], []], 2 * 8 * 2 * 128 * 17),
        ("aten::matmul", [[2, 8, 2, 128], [2, 8, 128, 17]], 2 * 16 * 2 * 128 * 17),
        ("aten::matmul", [[128], [128, 17]], 2 * 128 * 17),
        ("aten::_scaled_mm", [[64, 4096], [4096, 1024], [], []], 2 * 64 * 4096 * 1024),
        ("aten::scaled_dot_product_attention", [[16, 16, 559, 64], [16, 16, 559, 64], [16, 16, 559, 64], [], [], [], [], []],
         4 * 16 * 16 * 559 * 559 * 64),  # full mask: the causal flag is not in Input Dims
        ("aten::_flash_attention_forward", [[16, 559, 16, 64], [16, 559, 16, 64], [16, 559, 16, 64]] + [[]] * 12,
         4 * 16 * 16 * 559 * 559 * 64),
        ("aten::mm", [[3, 2048]], None),
        # new
        ("vllm::rocm_unquantized_gemm", [[32, 2880], [201088, 2880], []], 2 * 32 * 2880 * 201088),
        ("aiter::mha_batch_prefill", MHA_DIMS, MHA_CALL_FLOPS),
        ("aten::add", [[2048, 2048], [2048, 2048]], None),  # not a GEMM (attainment's generic path said 2*2048^3)
        ("vllm::moe_forward", [[32, 3072], [32, 32], [], []], None),
    ],
)
def test_op_flops(name, dims, expected):
    assert op_flops(name, dims) == expected


def test_attention_conventions():
    # SDPA with is_causal visible in Concrete Inputs (query, key, value, attn_mask, dropout_p, is_causal, ...)
    q = [[16, 16, 559, 64]] * 3 + [[]] * 5
    conc = ["", "", "", "", "0.", "True", "0.125", "False"]
    assert op_flops("aten::scaled_dot_product_attention", q, concrete=conc) == 4 * 16 * 64 * 16 * (559 * 559 - 559 * 559 / 2)
    # mha_batch_prefill: full mask doubles the causal count
    assert op_flops("aiter::mha_batch_prefill", MHA_DIMS, causal=False) == 2 * MHA_CALL_FLOPS
    # the step marker's sums give the same count for 15 equal prompts ...
    seq = step_seq_info(SGLANG_MARKER)
    assert seq == SeqInfo(batch=15, q_tokens=15360, kv_tokens=15360, q_sq_sum=15 * 1024**2, qk_sum=15 * 1024**2)
    assert op_flops("aiter::mha_batch_prefill", MHA_DIMS, seqs=seq) == MHA_CALL_FLOPS
    # ... and the exact one for unequal prompts: 2 x 7680 tokens: pairs = 2 * 7680^2 / 2 = 58,982,400
    uneven = SeqInfo(batch=2, q_tokens=15360, q_sq_sum=2 * 7680**2, qk_sum=2 * 7680**2)
    assert op_flops("aiter::mha_batch_prefill", MHA_DIMS, seqs=uneven) == 4 * 32 * 128 * 58_982_400
    # cached prefix: one sequence of 1024 new tokens over 3072 keys: pairs = 1024*3072 - 1024^2/2
    prefix = SeqInfo(batch=1, q_tokens=1024, kv_tokens=3072, q_sq_sum=1024**2, qk_sum=1024 * 3072)
    dims1 = [[1024, 32, 128], [835874, 8, 128], [835874, 8, 128], [2], [2], [3072]]
    assert op_flops("aiter::mha_batch_prefill", dims1, seqs=prefix) == 4 * 32 * 128 * (1024 * 3072 - 1024**2 // 2)
    # bytes: Q and O of the new tokens, K and V of the keys read (not the 835,874-slot pool), bf16
    assert op_cost("aiter::mha_batch_prefill", dims1, MHA_TYPES, seqs=prefix).bytes == 2 * (2 * 1024 * 32 * 128 + 2 * 3072 * 8 * 128)
    # a step whose token count differs from the op's is not applied: back to cu_seqlens (B = 1)
    assert op_flops("aiter::mha_batch_prefill", dims1, seqs=step_seq_info(SGLANG_MARKER)) == 4 * 32 * 128 * (1024**2 // 2)
    # vLLM decode attention reads the KV cache: no count without the step's sums, exact with them
    ua = [[32, 64, 64], [32, 8, 64], [32, 8, 64], [32, 64, 64], [], [], [], [0]]
    assert op_flops("vllm::unified_attention_with_output", ua) is None
    dec = step_seq_info("execute_32_context_0(sq0sk0sqsq0sqsk0)_generation_32(sq32sk55086sqsq32sqsk55086)")
    assert op_flops("vllm::unified_attention_with_output", ua, seqs=dec) == 4 * 64 * 64 * (55086 - 32 // 2)


def test_step_seq_info_adds_context_and_generation():
    s = step_seq_info("execute_8192_context_9(sq8155sk8430sqsq7475785sqsk7671310)_generation_37(sq37sk34489sqsq37sqsk34489)")
    assert s == SeqInfo(batch=9 + 37, q_tokens=8155 + 37, kv_tokens=8430 + 34489, q_sq_sum=7475785 + 37, qk_sum=7671310 + 34489)
    assert step_seq_info("step[EXTEND bs=15 toks=15360]", "prefill", 15, 15360, None) == SeqInfo(batch=15, q_tokens=15360)
    assert step_seq_info("x", "decode", 32, None, 55086) == SeqInfo(32, 32, 55086, 32, 55086)
    assert step_seq_info("x", "prefill", None, None, None) is None


def test_op_bytes():
    bf16 = ["c10::BFloat16", "c10::BFloat16"]
    # GEMM: A + B + C, 2 B each: (15360*4096 + 4096*24576 + 15360*24576) * 2
    assert op_bytes([[15360, 4096], [4096, 24576]], bf16, "aten::mm") == 1_082_130_432
    # out= variant: the output is already an argument
    assert op_bytes([[32768, 2048], [2048, 2048], [32768, 2048]], bf16 * 2, "aten::mm") == 2 * (2 * 32768 * 2048 + 2048 * 2048)
    # without a name: the tensor arguments only (attainment._op_bytes today)
    assert op_bytes([[15360, 4096], [4096, 24576]], bf16) == 2 * (15360 * 4096 + 4096 * 24576)
    # elementwise, fp32: broadcast output [16,559,1024]: in 16*559*1024 + 16*559 + out 16*559*1024, 4 B
    c = op_cost("aten::mul", [[16, 559, 1024], [16, 559, 1]], ["float", "float"])
    assert (c.flops, c.bytes, c.model) == (16 * 559 * 1024, 4 * (2 * 16 * 559 * 1024 + 16 * 559), "elementwise")
    # copy_: read the source, write the destination (both arguments); no FLOPs
    assert op_cost("aten::copy_", [[15360, 4096], [15360, 4096], []], ["c10::BFloat16"] * 2 + ["Scalar"]).bytes == 2 * 2 * 15360 * 4096
    # cat of a TensorList: inputs + an output of their summed size
    assert op_cost("aten::cat", [[[16, 16, 559, 32], [16, 16, 559, 32]], []], ["TensorList", "Scalar"]).bytes == 2 * 2 * (2 * 16 * 16 * 559 * 32)
    # in-place add_: reads both, writes the first
    assert op_cost("aten::add_", [[4096], [4096], []], ["float", "float", "Scalar"]).bytes == 4 * 3 * 4096
    # a KV-cache store's pool argument is not bytes moved: no model
    assert op_cost("sglang::store_cache", [[15360, 1024], [15360, 1024], [835874, 1024], [835874, 1024], [15360], [], []]).bytes is None


# ----------------------------------------------------------------------------- real traces


def test_sglang_gate_up_gemm_row(sglang):
    """Expert reading 3: gate_up [15360,4096] x [4096,24576] (aten::mm's own dims; the linear
    weight is [24576,4096] transposed) 6.77 ms per call = 457 TFLOP/s, 0.35 of MI300X."""
    tr, a = sglang
    mi300x = gpu_by_name("MI300X")
    kt = kernel_table(tr, a.activities, mi300x, steps=a.steps)
    r = kt.iloc[0]  # the costliest row
    assert (r.phase, r.op, r.input_dims, r.calls) == ("prefill", "aten::mm", "[[15360,4096],[4096,24576]]", 36)
    assert r.input_types == '["c10::BFloat16","c10::BFloat16"]'
    assert r.kernel.startswith("Cijk_Alik_Bljk_BBS_BH_Bias_HA_S_SAV_UserArgs_MT128x256x32")
    assert r.total_ms == pytest.approx(243.643021, abs=1e-9)  # 243,643,021 ns of kernel time in the trace
    # of the prefill kernel time: 492,672,806 ns (521 kernels) with the step's own kernels,
    # 492,773,592 ns (527) when the 6 launched before the marker count too: which kernels
    # are "prefill" is the phase assignment's call, read from the activities
    acts = a.activities
    pre = acts[(acts["kind"] == "kernel") & (acts["phase"] == "prefill")]
    prefill_ns = int((pre["end_ns"] - pre["start_ns"]).sum())
    assert prefill_ns in (492_672_806, 492_773_592)
    # the share is of the time kernels ran (their union over streams): 4.7 µs less, where two
    # kernels overlap
    from diagnose.analyzers.timeline import union_busy_ns

    busy_ns = union_busy_ns(pre["start_ns"].to_numpy(), pre["end_ns"].to_numpy())
    assert prefill_ns - busy_ns == 4_686
    assert r.kernel_time_share == pytest.approx(243_643_021 / busy_ns, rel=1e-12)
    assert r.flops == 36 * 2 * 15360 * 4096 * 24576  # 111,325,552,312,320 FLOP
    assert r.bytes == 36 * 1_082_130_432
    tflops = 36 * 2 * 15360 * 4096 * 24576 / 243.643021e-3 / 1e12  # = 456.92 TFLOP/s
    assert r.achieved_tflops == pytest.approx(tflops, rel=1e-12)
    assert 410 <= r.achieved_tflops <= 505
    assert r.peak_tflops_share == pytest.approx(tflops / 1307.4, rel=1e-12)
    assert r.peak_tflops_share == pytest.approx(0.35, abs=0.005)
    # arithmetic intensity 2*15360*4096*24576 / 1,082,130,432 = 2857.67 FLOP/B > ridge 1307.4/5.3 = 246.7
    assert r.arithmetic_intensity_flop_per_byte == pytest.approx(2 * 15360 * 4096 * 24576 / 1_082_130_432, rel=1e-12)
    assert (r.bound, r.cost_model, r.op_source, r.shapes_unknown) == ("compute", "gemm", "trace", None)
    # the other three layer GEMMs, expert: qkv 543, o 629, down 583 TFLOP/s
    got = {d: t for d, t in zip(kt["input_dims"], kt["achieved_tflops"]) if isinstance(d, str)}
    assert got["[[15360,4096],[4096,6144]]"] == pytest.approx(543, abs=1)
    assert got["[[15360,4096],[4096,4096]]"] == pytest.approx(629, abs=1)
    assert got["[[15360,12288],[12288,4096]]"] == pytest.approx(583, abs=1)


def test_sglang_prefill_flops_linear_plus_causal_attention(sglang):
    """Expert reading 3: linear 213.5 TFLOP + causal attention 4.6 TFLOP = 218 TFLOP."""
    tr, a = sglang
    kt = kernel_table(tr, a.activities, gpu_by_name("MI300X"), steps=a.steps)
    gemm = kt[kt["cost_model"] == "gemm"]
    # 36 layers x 2*15360*4096*(6144 + 4096 + 24576 + 12288) + lm_head 2*15*4096*151936
    linear = 36 * 2 * 15360 * 4096 * (6144 + 4096 + 24576 + 12288) + 2 * 15 * 4096 * 151936
    assert linear == 213_392_645_160_960
    assert gemm["flops"].sum() == linear
    att = kt[kt["op"] == "aiter::mha_batch_prefill"]
    assert len(att) == 1
    r = att.iloc[0]
    assert "FmhaBatchPrefillWithPagedKVCacheKernel" in r.kernel
    assert r.calls == 36 and r.flops == 36 * MHA_CALL_FLOPS == 4_638_564_679_680
    assert r.cost_note.startswith("causal, step sums")
    # bytes: 36 x 2 B x (2 x 15360*32*128 (Q, O) + 2 x 15360*8*128 (K, V))
    assert r.bytes == 36 * 2 * (2 * 15360 * 32 * 128 + 2 * 15360 * 8 * 128)
    assert r.total_ms == pytest.approx(20.075158, abs=1e-9)
    assert (linear + r.flops) / 1e12 == pytest.approx(218.0, abs=0.1)
    # without the step table the batch comes from cu_seqlens ([16] -> 15): the same count
    r2 = kernel_table(tr, a.activities, None)
    assert r2.loc[r2["op"] == "aiter::mha_batch_prefill", "flops"].item() == 36 * MHA_CALL_FLOPS


def test_sglang_without_peak_has_no_fractions(sglang):
    tr, a = sglang
    kt = kernel_table(tr, a.activities, None, steps=a.steps)
    assert kt["peak_tflops_share"].isna().all() and kt["peak_tbps_share"].isna().all()
    assert kt["bound"].isna().all()
    rec = kernel_records(kt, top=1)[0]
    assert rec["peak_tflops_share"] is None and rec["bound"] is None
    assert rec["achieved_tflops"] == pytest.approx(456.9207517, rel=1e-9)
    assert rec["calls"] == 36 and isinstance(rec["calls"], int)
    # shares of one phase add up to the summed kernel time over the kernel busy time: 1 where no
    # kernels overlap (the unknown phase), a little more where two prefill kernels overlap
    acts = a.activities
    from diagnose.analyzers.timeline import union_busy_ns

    want = []
    for ph in sorted(kt["phase"].unique()):
        k = acts[(acts["kind"] == "kernel") & (acts["phase"] == ph)]
        want.append(int((k["end_ns"] - k["start_ns"]).sum()) / union_busy_ns(k["start_ns"].to_numpy(), k["end_ns"].to_numpy()))
    assert kt.groupby("phase")["kernel_time_share"].sum().sort_index().tolist() == pytest.approx(want, abs=1e-12)


def test_duplicate_external_ids_pick_the_flop_op(sglang):
    """Where several ops carry one id, the FLOP-carrying op wins over an inner non-FLOP op,
    and the innermost FLOP op (aten::mm) over an enclosing aten::linear."""
    tr, a = sglang
    ops = tr.cpu_ops
    mm = ops[(ops["name"] == "aten::mm") & (ops["input_dims"] == b"[[15360, 4096], [4096, 24576]]")].iloc[0]
    extra = pd.DataFrame({
        "name": ["aten::linear", "aten::empty"],
        "start_ns": [mm.start_ns - 1000, mm.start_ns + 10],
        "end_ns": [mm.end_ns + 1000, mm.start_ns + 20],
        "external_id": [mm.external_id, mm.external_id],
        "tid": [mm.tid, mm.tid],
        "input_dims": [b"[[15360, 4096], [24576, 4096], []]", b"[[], [], [], []]"],
        "input_types": [b'["c10::BFloat16", "c10::BFloat16", ""]', None],
        "concrete_inputs": [None, None],
    })
    tr2 = dataclasses.replace(tr, cpu_ops=pd.concat([ops, extra[ops.columns]], ignore_index=True))
    kt = kernel_table(tr2, a.activities, None, steps=a.steps)
    first = kt[kt["kernel"].str.contains("MT128x256x32")]
    # the one call whose id is shared still reads as aten::mm: the row keeps all 36 calls
    assert list(zip(first["op"], first["input_dims"], first["calls"])) == [("aten::mm", "[[15360,4096],[4096,24576]]", 36)]


def test_vllm_graph_replay_without_capture_has_no_shapes(vllm):
    tr, a = vllm
    kt = kernel_table(tr, a.activities, gpu_by_name("MI300X"), steps=a.steps)
    moe = kt[kt["kernel"].str.startswith("_matmul_ogs_")]
    assert len(moe) == 2 and moe["op"].isna().all() and moe["input_dims"].isna().all()
    assert set(moe["shapes_unknown"]) == {SHAPES_UNKNOWN[5]}
    assert moe["calls"].sum() == 48
    # 421 kernels replayed by the one hipGraphLaunch have no op; the 4 eager ones do
    assert kt.loc[kt["op_source"] == "trace", "calls"].sum() == 4
    assert kt.loc[kt["op_source"].isna(), "calls"].sum() == 421
    assert kt.attrs["capture"] is None


def test_vllm_capture_maps_replayed_kernels_to_ops(vllm):
    """Expert reading 8: the bs=32 FULL capture maps the 421 replayed kernels of
    graph_execution back to ops and shapes (TraceLens merge_capture_trace_into_graph)."""
    tr, a = vllm
    cm = load_capture_mapping(str(shared_trace(VLLM_CAPTURE)))
    assert (cm.batch_size, cm.mode, len(cm.windows)) == (32, "FULL", 1)  # sidecar execution_details.json
    w = cm.windows[0]
    assert len(w.kinds) == 421 and set(w.kinds) == {"kernel"} and None not in w.kernels
    kt = kernel_table(tr, a.activities, gpu_by_name("MI300X"), capture=cm, steps=a.steps)
    assert kt.attrs["capture"]["graph_launches"] == 1
    assert kt.attrs["capture"]["graph_launches_matched"] == 1
    assert kt.attrs["capture"]["kernels_mapped"] == 421
    assert kt["op"].notna().all() and kt["shapes_unknown"].isna().all()
    moe = kt[kt["kernel"].str.startswith("_matmul_ogs_")]
    assert set(moe["kernel"]) == {"_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1",
                                  "_matmul_ogs_NNT_bf16xbf16xmxfp4_16x128x256x1_swiglu"}
    assert set(moe["op"]) == {"vllm::moe_forward"}
    assert set(moe["input_dims"]) == {"[[32,3072],[32,32],[],[]]"}  # hidden padded to 3072, router logits [32 tokens, 32 experts]
    assert set(moe["op_source"]) == {"capture"} and list(moe["calls"]) == [24, 24]
    # expert reading 1: MoE expert GEMMs 7.04 ms; no FLOPs (expert weights are not op inputs)
    assert moe["total_ms"].sum() == pytest.approx(7.034595, abs=1e-9)
    assert moe["flops"].isna().all() and moe["cost_note"].str.startswith("MoE").all()
    # a captured dense GEMM: qkv addmm [32,2880] x [2880,5120], 24 layers
    qkv = kt[kt["input_dims"] == "[[5120],[32,2880],[2880,5120],[],[]]"].iloc[0]
    assert (qkv.op, qkv.calls, qkv.flops, qkv.bound) == ("aten::addmm", 24, 24 * 2 * 32 * 2880 * 5120, "memory")
    # attention, marker generation_32(sq32 sk55086 sqsq32 sqsk55086): per full-attention layer
    # 4*64*64*(55086 - 32/2) FLOP, bytes 2*(2*32*64*64 + 2*55086*8*64); the 3d kernel and its
    # reduce_segments share each call's cost by time, so their sums are the 12 calls' cost
    att = kt[kt["op"] == "vllm::unified_attention_with_output"].set_index("kernel")
    full = att.loc[["kernel_unified_attention_3d", "reduce_segments"]]
    assert full["flops"].sum() == pytest.approx(12 * 4 * 64 * 64 * (55086 - 16), rel=1e-12)
    assert full["bytes"].sum() == pytest.approx(12 * 2 * (2 * 32 * 64 * 64 + 2 * 55086 * 8 * 64), rel=1e-12)  # 1.36 GB: expert's 1.35 GB KV
    # the 2d kernel serves the sliding-window (128) layers: the full-context count would be
    # 8.4 TB/s > 5.3 TB/s, so it is dropped rather than reported
    sw = att.loc["kernel_unified_attention_2d"]
    assert math.isnan(sw["flops"]) and sw["cost_note"].startswith("counted work exceeds the device peak")


def test_capture_from_another_batch_size_is_refused(vllm, tmp_path):
    """A capture for a smaller padded batch than the step's cannot be the graph replayed."""
    tr, a = vllm
    cm = load_capture_mapping(str(shared_trace(VLLM_CAPTURE)))
    cm.batch_size = 16  # the step is execute_32_...: 32 tokens
    kt = kernel_table(tr, a.activities, None, capture=cm, steps=a.steps)
    assert kt.attrs["capture"]["graph_launches_matched"] == 0
    assert set(kt.loc[kt["op"].isna(), "shapes_unknown"]) == {SHAPES_UNKNOWN[6]}


def test_h100_gemm_aggregate():
    """Expert reading 4: GEMMs 5.51 TFLOP / 8.86 ms = 622 TFLOP/s (63 % of H100 SXM)."""
    tr = load_trace(str(shared_trace(H100)))
    a = analyze(tr)
    kt = kernel_table(tr, a.activities, gpu_by_name("H100-SXM"), steps=a.steps)
    gemm = kt[kt["cost_model"] == "gemm"]
    assert set(gemm["phase"]) == {"prefill"}
    # 24 layers x 2 x 8944 tokens (16 x 559) x 1024 x (4 x 1024 + 3 x 2816) + rope bmm 2*32*559
    assert gemm["flops"].sum() == 24 * 2 * 8944 * 1024 * (4 * 1024 + 3 * 2816) + 2 * 32 * 559 == 5_514_536_717_248
    assert gemm["total_ms"].sum() == pytest.approx(8.858227, abs=1e-9)
    agg = gemm["flops"].sum() / (gemm["total_ms"].sum() * 1e-3) / 1e12
    assert agg == pytest.approx(622.53, abs=0.01)
    assert agg / 989.4 == pytest.approx(0.63, abs=0.005)
    # kernels of step #5, launched before the profiling window, have no op
    unk = kt[kt["phase"] == "unknown"]
    assert unk["op"].isna().all() and set(unk["shapes_unknown"]) == {SHAPES_UNKNOWN[4]}


def test_nsys_rows_are_time_only():
    tr = load_trace(str(shared_trace(NSYS)))
    a = analyze(tr)
    kt = kernel_table(tr, a.activities, gpu_by_name("H100-SXM"), steps=a.steps)
    assert (len(kt), int(kt["calls"].sum())) == (16, 18)  # 18 kernels, 16 names
    assert kt["op"].isna().all() and kt["input_dims"].isna().all()
    assert set(kt["shapes_unknown"]) == {SHAPES_UNKNOWN[7]}
    assert kt["achieved_tflops"].isna().all() and kt["bound"].isna().all()
    assert kt["total_ms"].sum() == pytest.approx(10.167602, abs=1e-9)
    top = kt.iloc[0]
    assert (top.kernel, top.calls) == ("nvjet_tst_192x192_64x4_2x1_v_bz_coopB_TNN", 1)
    assert top.kernel_time_share == pytest.approx(2.187752 / 10.167602, rel=1e-9)


def test_kineto_without_operators_is_time_only():
    tr = load_trace(str(shared_trace("tracelens/mi210/gpu_only_trace.json.gz")))  # no cpu_op events at all
    a = analyze(tr)
    kt = kernel_table(tr, a.activities, gpu_by_name("MI300X"))
    assert (len(kt), int(kt["calls"].sum())) == (45, 562)  # 562 kernels of 45 names
    assert kt["total_ms"].sum() == pytest.approx(5.343422, abs=1e-9)
    assert set(kt["shapes_unknown"]) == {SHAPES_UNKNOWN[8]} and kt["flops"].isna().all()


def test_empty_activities():
    tr = load_trace(str(shared_trace("nano-vllm-zhang-yuhui/prefill.json")))
    a = analyze(tr)
    kt = kernel_table(tr, a.activities, None)
    assert len(kt) == 0 and "achieved_tflops" in kt.columns
    assert kernel_records(kt) == []


def test_capture_alignment_variants(vllm):
    """The same capture explains a second replay of the graph, a replay whose scheduler
    reordered two nodes, and (CUDA-style) a capture whose launches carry no kernel names."""
    tr, a = vllm
    cm = load_capture_mapping(str(shared_trace(VLLM_CAPTURE)))
    cols = ["kernel", "op", "input_dims", "calls", "total_ms", "flops"]
    base = kernel_table(tr, a.activities, None, capture=cm, steps=a.steps)
    acts = a.activities
    graph = acts[acts["launch_kind"] == "graph_launch"]
    # (a) a second replay 20 ms later (another correlation id): every graph row doubles
    again = graph.assign(correlation=graph["correlation"] + 10**9, start_ns=graph["start_ns"] + 20_000_000,
                         end_ns=graph["end_ns"] + 20_000_000)
    kt2 = kernel_table(tr, pd.concat([acts, again], ignore_index=True), None, capture=cm, steps=a.steps)
    assert kt2.attrs["capture"]["graph_launches_matched"] == 2 and kt2.attrs["capture"]["kernels_mapped"] == 842
    qkv2 = kt2[kt2["input_dims"] == "[[5120],[32,2880],[2880,5120],[],[]]"].iloc[0]
    assert (qkv2.calls, qkv2.flops) == (48, 48 * 2 * 32 * 2880 * 5120)
    # (b) the first _topk_forward and the _sum_bitmatrix_rows after it swap places on the GPU:
    # names no longer match in order; matched per name in order, every kernel keeps its op
    topk = graph.index[graph["name"] == "_topk_forward"][0]
    nxt = graph.index[(graph["name"] == "_sum_bitmatrix_rows") & (graph["start_ns"] > graph.at[topk, "start_ns"])][0]
    swapped = acts.copy()
    swapped.loc[[topk, nxt], "start_ns"] = [acts.at[nxt, "start_ns"], acts.at[topk, "start_ns"]]
    swapped.loc[[topk, nxt], "end_ns"] = [acts.at[nxt, "end_ns"], acts.at[topk, "end_ns"]]
    kt3 = kernel_table(tr, swapped, None, capture=cm, steps=a.steps)
    assert kt3.attrs["capture"]["graph_launches_matched"] == 1
    key = ["kernel", "op", "input_dims", "calls"]
    assert kt3[key].sort_values(key).reset_index(drop=True).equals(base[key].sort_values(key).reset_index(drop=True))
    # (c) no kernel names in the capture (CUDA runtime events): aligned by kind and count only
    blind = dataclasses.replace(cm, windows=[dataclasses.replace(w, kernels=(None,) * len(w.kernels)) for w in cm.windows])
    kt4 = kernel_table(tr, acts, None, capture=blind, steps=a.steps)
    assert kt4.attrs["capture"]["graph_launches_matched_by_count_only"] == 1
    assert kt4[cols].equals(base[cols])
