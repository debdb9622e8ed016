"""Model accounting against domain.md sections 2-3, with hand-derived expectations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REF_7B_CONFIG

from diagnose.accounting import (
    weight_matrices,
    DTYPE_BYTES,
    FRAGMENTATION_FACTOR,
    GB,
    GiB,
    KiB,
    MiB,
    ModelSpec,
    decode_step,
    decode_step_bound_s,
    kv_budget,
    kv_bytes_per_token,
    kv_bytes_per_token_from_shape,
    prefill_bound_s,
    prefill_bytes,
    prefill_flops,
    ridge_point_flop_per_byte,
    weight_bytes,
    weight_bytes_breakdown,
)
from diagnose.errors import DiagnoseError

DATA = Path(__file__).parent / "data"

REF_CFG = dict(REF_7B_CONFIG)  # domain.md section 2, reference config "7B-like"


@pytest.fixture
def ref() -> ModelSpec:
    return ModelSpec.from_hf_config(REF_CFG, name="7B-like")


def small(**over) -> ModelSpec:
    """Tiny config for hand arithmetic: L=2, H=64, n_h=4, d=16, F=128, V=100."""
    cfg = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "num_key_value_heads": 1,
        "head_dim": 16,
        "intermediate_size": 128,
        "vocab_size": 100,
        "tie_word_embeddings": False,
    }
    cfg.update(over)
    return ModelSpec.from_hf_config(cfg)


# -- reference config, parameters and bytes ----------------------------------------


def test_reference_params_match_domain(ref: ModelSpec) -> None:
    # q,o: 2*4096*(32*128) = 33,554,432; k,v: 2*4096*(8*128) = 8,388,608.
    assert ref.params_attention_per_layer == 41_943_040
    # 3 * 4096 * 11008
    assert ref.params_mlp_per_layer == 135_266_304
    assert ref.params_per_layer == 177_209_344
    assert ref.params_body == 5_670_699_008
    assert ref.params_embedding == 1_048_576_000  # 2 * 128000 * 4096, untied
    assert ref.params_total == 6_719_275_008


def test_reference_weight_bytes(ref: ModelSpec) -> None:
    assert weight_bytes(ref, "bf16") == 13_438_550_016
    assert weight_bytes(ref, "fp16") == 13_438_550_016
    assert round(weight_bytes(ref, "bf16") / GB, 2) == 13.44
    assert weight_bytes(ref, "fp32") == 26_877_100_032
    assert weight_bytes(ref, "fp8") == 6_719_275_008
    assert weight_bytes(ref, "int8") == 6_719_275_008


def test_weight_matrices_sum_to_params(ref: ModelSpec) -> None:
    assert sum(o * i * n for _, o, i, n in weight_matrices(ref)) == ref.params_total
    tied = small(tie_word_embeddings=True)
    assert sum(o * i * n for _, o, i, n in weight_matrices(tied)) == tied.params_total


def test_int4_weights_with_group_scales(ref: ModelSpec) -> None:
    # Values: 6,719,275,008 / 2 = 3,359,637,504 B. Every input dim (4096, 11008 = 86*128)
    # is a multiple of 128, so groups = params / 128 = 52,494,336; fp16 scales = 2 B each.
    wb = weight_bytes_breakdown(ref, "int4")
    assert wb.values_bytes == 3_359_637_504
    assert wb.scales_bytes == 104_988_672
    assert wb.total_bytes == 3_464_626_176 == weight_bytes(ref, "int4")
    assert wb.group_size == 128
    assert weight_bytes_breakdown(ref, "bf16").scales_bytes == 0
    # group 64 doubles the scales
    assert weight_bytes_breakdown(ref, "int4", group_size=64).scales_bytes == 2 * 104_988_672


def test_int4_groups_round_up_per_matrix() -> None:
    # small(): groups = out * ceil(in / 128) per matrix; every in-dim (64 or 128) fits
    # one group per row. Per layer q 64 + k 16 + v 16 + o 64 + gate 128 + up 128 +
    # down 64 = 480; 2 layers 960; embedding 100 + LM head 100 -> 1160 groups, 2320 B.
    spec = small()
    assert spec.params_total == 82_432
    wb = weight_bytes_breakdown(spec, "int4")
    assert wb.values_bytes == 41_216
    assert wb.scales_bytes == 2_320
    assert wb.total_bytes == 43_536


def test_unknown_dtype_raises(ref: ModelSpec) -> None:
    with pytest.raises(DiagnoseError, match="unknown dtype 'fp4'"):
        weight_bytes(ref, "fp4")
    with pytest.raises(DiagnoseError, match="KV dtype"):
        kv_bytes_per_token(ref, "int2")


def test_dtype_table() -> None:
    assert DTYPE_BYTES == {"fp32": 4, "fp16": 2, "bf16": 2, "fp8": 1, "int8": 1, "int4": 0.5}


# -- KV cache ----------------------------------------------------------------------


def test_reference_kv_per_token_and_sequence(ref: ModelSpec) -> None:
    # 2 * 32 * 8 * 128 * 2 B
    assert kv_bytes_per_token(ref) == 131_072 == 128 * KiB
    per_tok = kv_bytes_per_token(ref)
    assert 2048 * per_tok == 256 * MiB
    assert 8192 * per_tok == 1 * GiB
    assert 32768 * per_tok == 4 * GiB
    assert 131072 * per_tok == 16 * GiB


def test_kv_quantized(ref: ModelSpec) -> None:
    assert kv_bytes_per_token(ref, "int8") == 65_536  # halves
    assert kv_bytes_per_token(ref, "fp8") == 65_536
    assert kv_bytes_per_token(ref, "int4") == 32_768  # quarters
    assert kv_bytes_per_token(ref, "fp32") == 262_144
    assert kv_bytes_per_token_from_shape(32, 8, 128, "int4") == 32_768


def test_mqa_gqa_mha_tied() -> None:
    mqa = small()  # n_kv = 1
    # q,o: 2*64*(4*16) = 8192; k,v: 2*64*(1*16) = 2048
    assert mqa.params_attention_per_layer == 10_240
    assert mqa.params_mlp_per_layer == 24_576  # 3*64*128
    assert mqa.params_per_layer == 34_816
    assert mqa.params_body == 69_632
    assert mqa.params_embedding == 12_800  # 2 * 100 * 64
    assert mqa.params_total == 82_432
    assert kv_bytes_per_token(mqa) == 128  # 2*2*1*16*2
    assert kv_bytes_per_token(mqa, "int8") == 64
    assert kv_bytes_per_token(mqa, "int4") == 32

    mha = small(num_key_value_heads=4)
    assert mha.params_attention_per_layer == 16_384  # 4 * 64 * 64
    assert kv_bytes_per_token(mha) == 512  # 2*2*4*16*2

    tied = small(tie_word_embeddings=True)
    assert tied.params_embedding == 6_400
    assert tied.params_total == 69_632 + 6_400


def test_defaults_mha_and_head_dim() -> None:
    cfg = {
        "num_hidden_layers": 2,
        "hidden_size": 64,
        "num_attention_heads": 4,
        "intermediate_size": 128,
        "vocab_size": 100,
    }
    spec = ModelSpec.from_hf_config(cfg)
    assert spec.num_key_value_heads == 4  # MHA by default
    assert spec.head_dim == 16  # 64 // 4
    assert spec.tie_word_embeddings is False
    # explicit nulls behave like absence
    spec2 = ModelSpec.from_hf_config({**cfg, "num_key_value_heads": None, "head_dim": None})
    assert spec2 == spec


@pytest.mark.parametrize("key", ["num_hidden_layers", "hidden_size", "num_attention_heads", "intermediate_size", "vocab_size"])
def test_missing_key_names_it(key: str) -> None:
    cfg = dict(REF_CFG)
    del cfg[key]
    with pytest.raises(DiagnoseError) as info:
        ModelSpec.from_hf_config(cfg)
    msg = str(info.value)
    assert key in msg and "\n" not in msg


def test_bad_values_raise() -> None:
    with pytest.raises(DiagnoseError, match="hidden_size"):
        ModelSpec.from_hf_config({**REF_CFG, "hidden_size": "4096"})
    with pytest.raises(DiagnoseError, match="num_key_value_heads"):
        ModelSpec.from_hf_config({**REF_CFG, "num_key_value_heads": 5})
    with pytest.raises(DiagnoseError, match="JSON object"):
        ModelSpec.from_hf_config([1, 2])  # type: ignore[arg-type]


def test_nested_text_config() -> None:
    cfg = {"model_type": "llava", "tie_word_embeddings": False, "text_config": dict(REF_CFG)}
    spec = ModelSpec.from_hf_config(cfg)
    assert spec.params_total == 6_719_275_008


def test_qwen3_config_file() -> None:
    cfg = json.loads((DATA / "qwen3_0_6b_config.json").read_text())
    spec = ModelSpec.from_hf_config(cfg)
    assert spec.name == "qwen3"
    assert spec.head_dim == 128  # explicit, not 1024 // 16 = 64
    # 2*1024*(16*128) + 2*1024*(8*128) = 4,194,304 + 2,097,152
    assert spec.params_attention_per_layer == 6_291_456
    assert spec.params_mlp_per_layer == 9_437_184  # 3*1024*3072
    assert spec.params_body == 440_401_920  # 28 * 15,728,640
    assert spec.params_embedding == 155_582_464  # tied: 151936 * 1024
    assert spec.params_total == 595_984_384
    assert weight_bytes(spec, "bf16") == 1_191_968_768
    assert kv_bytes_per_token(spec) == 114_688  # 2*28*8*128*2 = 112 KiB


# -- prefill FLOPs -----------------------------------------------------------------


def test_prefill_attention_flops_reference(ref: ModelSpec) -> None:
    # Full: L * 2 * (2 * n_h * d * S^2) = 32 * 2 * 2 * 32 * 128 * S^2 = 2^19 * S^2.
    # S = 2048 = 2^11: 2^41; S = 8192 = 2^13: 2^45. Causal is half.
    p2k = prefill_flops(ref, 2048)
    assert p2k.flops_attention_full == 2**41 == 2_199_023_255_552  # "2.2 TFLOP"
    assert p2k.flops_attention_causal == 2**40 == 1_099_511_627_776
    p8k = prefill_flops(ref, 8192)
    assert p8k.flops_attention_full == 2**45 == 35_184_372_088_832
    assert p8k.flops_attention_causal == 2**44 == 17_592_186_044_416
    assert round(p8k.flops_attention_full / 1e12, 1) == 35.2
    assert round(p8k.flops_attention_causal / 1e12, 1) == 17.6


def test_prefill_linear_and_head(ref: ModelSpec) -> None:
    p = prefill_flops(ref, 2048)
    assert p.flops_linear == 2 * 5_670_699_008 * 2048 == 23_227_183_136_768
    # 2 * 4096 * 128000 = 1,048,576,000 per position, all 2048 positions
    assert p.flops_lm_head == 2_147_483_648_000
    assert p.flops_total_causal == 23_227_183_136_768 + 2_147_483_648_000 + 1_099_511_627_776
    assert p.flops_total_full == 23_227_183_136_768 + 2_147_483_648_000 + 2_199_023_255_552
    last = prefill_flops(ref, 2048, lm_head="last")
    assert last.flops_lm_head == 1_048_576_000
    # batch scales everything linearly
    p4 = prefill_flops(ref, 2048, batch=4)
    assert p4.flops_total_full == 4 * p.flops_total_full
    assert prefill_flops(ref, 2048, batch=4, lm_head="last").flops_lm_head == 4 * 1_048_576_000


def test_article_2p_convention_and_attention_share(ref: ModelSpec) -> None:
    # domain.md: 2 * P_total * S ~ 27.5 TFLOP at 2048 and 110 TFLOP at 8192; at 8192 the
    # attention term is 13-24 % of prefill FLOPs depending on the convention.
    p2k, p8k = prefill_flops(ref, 2048), prefill_flops(ref, 8192)
    assert p2k.flops_2p_total == 27_522_150_432_768
    assert round(p2k.flops_2p_total / 1e12, 1) == 27.5
    assert round(p8k.flops_2p_total / 1e12) == 110
    causal = p8k.flops_attention_causal / (p8k.flops_2p_total + p8k.flops_attention_causal)
    full = p8k.flops_attention_full / (p8k.flops_2p_total + p8k.flops_attention_full)
    assert 0.13 <= causal < 0.14 and 0.24 <= full < 0.25


def test_prefill_bad_args(ref: ModelSpec) -> None:
    with pytest.raises(DiagnoseError):
        prefill_flops(ref, 0)
    with pytest.raises(DiagnoseError):
        prefill_flops(ref, 128, lm_head="none")  # type: ignore[arg-type]


def test_prefill_intensity_is_compute_bound(ref: ModelSpec) -> None:
    # domain.md section 3: ~2*P*S / weight bytes ~= 2048 FLOP/B at S=2048.
    moved = prefill_bytes(ref, 2048)
    assert moved == 13_438_550_016 + 2048 * 131_072
    ai = prefill_flops(ref, 2048).flops_2p_total / weight_bytes(ref)
    assert ai == 2048


# -- decode ------------------------------------------------------------------------

# domain.md section 3 table, ctx 2048, 2 TB/s: batch -> (KV read GB, bytes/step GB,
# step ms, tok/s, per-token share ms).
DECODE_TABLE = {
    1: (0.27, 13.71, 6.85, 146, 6.85),
    8: (2.15, 15.59, 7.79, 1027, 0.97),
    32: (8.59, 22.03, 11.01, 2905, 0.34),
    64: (17.18, 30.62, 15.31, 4180, 0.24),
    128: (34.36, 47.80, 23.90, 5356, 0.19),
}


@pytest.mark.parametrize("batch", sorted(DECODE_TABLE))
def test_decode_table(ref: ModelSpec, batch: int) -> None:
    kv_gb, step_gb, step_ms, tok_s, share_ms = DECODE_TABLE[batch]
    d = decode_step(ref, batch, 2048)
    assert d.bytes_per_step == 13_438_550_016 + batch * 2048 * 131_072
    assert round(d.weight_bytes / GB, 2) == 13.44
    assert round(d.kv_read_bytes / GB, 2) == kv_gb
    assert round(d.bytes_per_step / GB, 2) == step_gb
    t = d.step_s(2.0)
    assert round(t * 1e3, 2) == step_ms
    assert round(d.tokens_per_s(2.0)) == tok_s
    assert round(t * 1e3 / batch, 2) == share_ms


def test_decode_weights_only_bound(ref: ModelSpec) -> None:
    d = decode_step(ref, 1, 0)
    assert d.bytes_per_step == 13_438_550_016
    assert round(d.step_s(2.0) * 1e3, 2) == 6.72
    assert round(1 / d.step_s(2.0), 1) == 148.8
    # decode B=1: ~2P / 2P = 1 FLOP/B (domain.md section 3)
    assert d.arithmetic_intensity == 1.0
    assert round(d.flops_per_step / 1e9, 1) == 13.4


def test_decode_flops(ref: ModelSpec) -> None:
    d = decode_step(ref, 1, 2048)
    assert d.flops_matmul == 13_438_550_016  # 2 * P
    assert d.flops_attention == 4 * 32 * 128 * 2048 * 32 == 1_073_741_824
    assert d.flops_per_step == 14_512_291_840
    assert d.arithmetic_intensity == pytest.approx(14_512_291_840 / 13_706_985_472)
    d8 = decode_step(ref, 8, 2048, weight_dtype="int8", kv_dtype="int8")
    assert d8.bytes_per_step == 6_719_275_008 + 8 * 2048 * 65_536


def test_bounds_helpers() -> None:
    assert ridge_point_flop_per_byte(300, 2) == 150.0
    assert decode_step_bound_s(13_438_550_016, 2.0) == pytest.approx(6.719275008e-3)
    # 35.2 TFLOP at 300 TFLOP/s
    assert prefill_bound_s(35_184_372_088_832, 300) == pytest.approx(0.11728124029610667)
    with pytest.raises(DiagnoseError):
        decode_step_bound_s(1, 0)
    with pytest.raises(DiagnoseError):
        prefill_bound_s(1, -1)


# -- KV capacity -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("seq_len", "ceiling", "usable"),
    [(2048, 240, 180), (8192, 60, 45), (32768, 15, 11), (131072, 3, 2)],
)
def test_kv_capacity_60_gib(ref: ModelSpec, seq_len: int, ceiling: int, usable: int) -> None:
    # domain.md section 3: ~60 GiB for KV -> 240/60/15/3 sequences, ~180/45/10/2 usable.
    # floor(0.75 * 15) = 11 where the article says "~10".
    b = kv_budget(kv_bytes_per_token(ref), seq_len, kv_memory_bytes=60 * GiB)
    assert b.max_sequences == ceiling
    assert b.usable_sequences == usable
    assert b.fragmentation_factor == FRAGMENTATION_FACTOR == 0.75


@pytest.mark.parametrize(
    ("seq_len", "ceiling", "usable"),
    [(2048, 229, 171), (8192, 57, 42), (32768, 14, 10), (131072, 3, 2)],
)
def test_kv_capacity_80_gb_card(ref: ModelSpec, seq_len: int, ceiling: int, usable: int) -> None:
    # 80e9 - 5e9 - 13,438,550,016 = 61,561,449,984 B (57.33 GiB; the article's "~60 GiB").
    # 2k: 61,561,449,984 // 268,435,456 = 229; 8k: // 2^30 = 57; 32k: // 2^32 = 14; 128k: 3.
    b = kv_budget(
        kv_bytes_per_token(ref), seq_len, memory_gb=80, overhead_gb=5, weight_bytes=weight_bytes(ref)
    )
    assert b.kv_memory_bytes == 61_561_449_984
    assert round(b.kv_memory_gib, 2) == 57.33
    assert b.max_sequences == ceiling
    assert b.usable_sequences == usable


def test_kv_budget_totals_and_errors(ref: ModelSpec) -> None:
    b = kv_budget(131_072, 32768, batch=8)
    assert b.kv_bytes_per_sequence == 4 * GiB
    assert b.kv_bytes_total == 32 * GiB
    assert b.kv_gib_total == 32.0
    assert b.max_sequences is None and b.usable_sequences is None and b.fits is None
    fit = kv_budget(131_072, 32768, batch=16, kv_memory_bytes=60 * GiB)
    assert fit.fits is False  # 15 max
    with pytest.raises(DiagnoseError, match="no memory left"):
        kv_budget(131_072, 2048, memory_gb=16, overhead_gb=5, weight_bytes=weight_bytes(ref))
    with pytest.raises(DiagnoseError):
        kv_budget(131_072, 0)


# == beyond dense bf16 (issue 14 item 1) ============================================
# Small configs for hand arithmetic; norms and biases are never counted.

from diagnose.accounting import (
    UNSUPPORTED_KEYS,
    UnsupportedModelConfig,
    experts_touched,
    kv_layout,
    load_model_config,
    model_weights,
    step_cost,
)

SMALL = {
    "num_hidden_layers": 2, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 1,
    "head_dim": 16, "intermediate_size": 128, "vocab_size": 100, "tie_word_embeddings": False,
}
# small(): attention q 64*64 = 4,096 + k 64*16 = 1,024 + v 1,024 + o 4,096 = 10,240 per layer;
# MLP 3*64*128 = 24,576; body 2 * 34,816 = 69,632; embedding + LM head 2 * 100 * 64 = 12,800.
SMALL_LINEAR = 69_632
SMALL_EMB_HEAD = 12_800


def spec_of(**over) -> ModelSpec:
    return ModelSpec.from_hf_config({**SMALL, **over})


# -- mixture of experts ------------------------------------------------------------


def test_experts_touched_formula() -> None:
    # E * (1 - (1 - k/E)^T); Mixtral E = 8, k = 2: 1 - 0.75^T
    assert experts_touched(8, 2, 1) == 2.0
    assert experts_touched(8, 2, 8) == pytest.approx(8 * (1 - 0.75**8)) == pytest.approx(7.19909668)
    assert experts_touched(8, 2, 64) == pytest.approx(8 * (1 - 1.00974e-8), rel=1e-9)
    assert experts_touched(32, 4, 32) == pytest.approx(32 * (1 - 0.875**32)) == pytest.approx(31.55392521)
    assert experts_touched(4, 4, 3) == 4.0  # k = E: every expert
    assert experts_touched(8, 2, 0) == 0.0
    with pytest.raises(DiagnoseError):
        experts_touched(8, 9, 1)


def test_moe_params_and_active() -> None:
    s = spec_of(num_local_experts=4, num_experts_per_tok=2)
    # per layer: attention 10,240 + router 64*4 = 256 + 4 experts * 24,576 = 98,304 -> 108,800
    assert (s.params_expert, s.params_router, s.params_moe_block) == (24_576, 256, 98_560)
    assert s.params_total == 2 * 108_800 + SMALL_EMB_HEAD == 230_400
    # active: 2 * (10,240 + 256 + 2 * 24,576) = 119,296 + LM head 6,400 (not the embedding)
    assert s.params_active_per_token == 125_696
    # num_experts (Qwen) and n_routed_experts (DeepSeek) read the same way
    assert spec_of(num_experts=4, num_experts_per_tok=2).params_total == 230_400
    assert spec_of(n_routed_experts=4, num_experts_per_tok=2).params_total == 230_400
    assert spec_of(num_experts=0).moe is None  # Qwen-MoE configs with 0 experts are dense
    with pytest.raises(DiagnoseError, match="num_experts_per_tok"):
        spec_of(num_local_experts=4)


def test_moe_dense_layers_and_shared_experts() -> None:
    # DeepSeek style: first_k_dense_replace 1 -> layer 0 dense (3*64*128 = 24,576);
    # layer 1: router 256 + 1 shared of width 32 (3*64*32 = 6,144) + 4 experts of 6,144 = 30,976
    s = spec_of(n_routed_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, n_shared_experts=1,
                first_k_dense_replace=1)
    assert s.moe.moe_layers == (False, True)
    assert s.params_total == 2 * 10_240 + 24_576 + 30_976 + SMALL_EMB_HEAD == 88_832
    # active: 20,480 + 24,576 + (256 + 6,144 + 2 * 6,144) + LM head 6,400
    assert s.params_active_per_token == 20_480 + 24_576 + 18_688 + 6_400 == 70_144
    # Qwen2-MoE: shared_expert_intermediate_size; MoE where (i + 1) % decoder_sparse_step == 0
    q = spec_of(num_experts=4, num_experts_per_tok=2, moe_intermediate_size=32, shared_expert_intermediate_size=64,
                decoder_sparse_step=2)
    assert q.moe.moe_layers == (False, True) and q.moe.shared_intermediate_size == 64
    assert spec_of(num_experts=4, num_experts_per_tok=2, mlp_only_layers=[0, 1]).num_moe_layers == 0
    assert spec_of(n_routed_experts=4, num_experts_per_tok=2, moe_layer_freq=2).moe.moe_layers == (True, False)


def test_moe_decode_bytes() -> None:
    s = spec_of(num_local_experts=4, num_experts_per_tok=2)
    # non-expert bf16: 2 * (2 * 10,240 + 2 * 256 + 12,800) = 67,584; one expert 24,576 * 2 = 49,152 B
    w = model_weights(s)
    assert (w.non_expert_bytes, w.expert_bytes) == (67_584, 49_152.0)
    # B = 1: 2 experts per layer -> 2 layers * 2 * 49,152 = 196,608; KV 2*2*1*16*2 = 128 B/token * 10
    d = decode_step(s, 1, 10)
    assert d.experts_touched_per_layer == 2.0
    assert d.bytes_per_step == 67_584 + 196_608 + 1_280 == 265_472
    # B = 3: 4 * (1 - 0.5^3) = 3.5 experts -> 2 * 3.5 * 49,152 = 344,064
    d3 = decode_step(s, 3, 10)
    assert d3.experts_touched_per_layer == 3.5
    assert d3.bytes_per_step == 67_584 + 344_064 + 3 * 1_280 == 415_488
    # FLOPs: 2 * (all non-expert params 33,792 + 2 layers * 2 * 24,576) * 3 + attention
    # 4 * 4 * 16 * 10 keys * 2 layers * 3 = 15,360
    assert d3.flops_per_step == 2 * (33_792 + 98_304) * 3 + 15_360


# -- quantization_config -------------------------------------------------------------


@pytest.mark.parametrize(
    ("quant", "expected"),
    [
        # fp8: linear 69,632 * 1 B + embedding and LM head 12,800 * 2 B
        ({"quant_method": "fp8", "weight_block_size": [128, 128]}, 69_632 + 25_600),
        # modules_to_not_convert: layer 1's MLP (24,576) stays bf16
        ({"quant_method": "fbgemm_fp8", "modules_to_not_convert": ["model.layers.1.mlp"]},
         (69_632 - 24_576) + 2 * 24_576 + 25_600),
        # AWQ 4-bit, group 32: values 69,632 / 2 = 34,816 B; groups out * ceil(in / 32) per matrix:
        # q 64*2 + k 16*2 + v 16*2 + o 64*2 + gate 128*2 + up 128*2 + down 64*4 = 1,088 per layer,
        # 2,176 groups * (16 + 4) bits = 5,440 B
        ({"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True}, 34_816 + 5_440 + 25_600),
        # GPTQ 8-bit, group -1 (one per output channel), lm_head true: values (69,632 + 6,400) B;
        # groups 2 * (64 + 16 + 16 + 64 + 128 + 128 + 64) + 100 = 1,060 * 24 bits = 3,180 B;
        # embedding 6,400 * 2 B
        ({"quant_method": "gptq", "bits": 8, "group_size": -1, "lm_head": True}, 76_032 + 3_180 + 12_800),
        # bitsandbytes nf4: 4 + 32/64 = 4.5 bits: 69,632 * 4.5 / 8 = 39,168
        ({"quant_method": "bitsandbytes", "load_in_4bit": True}, 39_168 + 25_600),
        # double quant: 4 + 8/64 + 32/(64*256) = 2113/512 bits: 69,632 * 2113 / 4096 = 35,921
        ({"quant_method": "bitsandbytes", "_load_in_4bit": True, "bnb_4bit_use_double_quant": True}, 35_921 + 25_600),
        ({"quant_method": "bitsandbytes", "load_in_8bit": True}, 69_632 + 25_600),
        # compressed-tensors FP8, ignore lm_head and (regex) both q_proj (2 * 4,096 stay bf16)
        ({"quant_method": "compressed-tensors", "ignore": ["lm_head", "re:.*self_attn.q_proj$"],
          "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}}},
         (69_632 - 8_192) + 2 * 8_192 + 25_600),
        # mxfp4 quantizes routed experts only: a dense model stays bf16
        ({"quant_method": "mxfp4"}, 2 * (69_632 + 12_800)),
    ],
)
def test_quantized_weight_bytes(quant: dict, expected: int) -> None:
    s = spec_of(quantization_config=quant)
    assert model_weights(s).bytes == expected
    assert weight_bytes(s, None) == expected
    assert weight_bytes(s, "bf16") == 2 * 82_432  # --weight-dtype overrides the config
    assert model_weights(s, "int8").bytes == 82_432


def test_mxfp4_experts_and_modules_to_not_convert() -> None:
    q = {"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router",
                                                             "model.embed_tokens", "lm_head"]}
    s = spec_of(num_local_experts=4, num_experts_per_tok=2, quantization_config=q)
    w = model_weights(s)
    # one expert 24,576 * 4.25 / 8 = 13,056 B; 8 experts (2 layers x 4) = 104,448 B
    assert w.expert_bytes == 13_056.0
    assert w.bytes == 67_584 + 104_448
    assert w.weight_format.startswith("mxfp4 (4.25 bit) on routed experts")
    # an expert excluded by name stays bf16 (gpt-oss names the fused experts module)
    s2 = spec_of(num_local_experts=4, num_experts_per_tok=2,
                 quantization_config={"quant_method": "mxfp4", "modules_to_not_convert": ["model.layers.1.mlp.experts"]})
    assert model_weights(s2).bytes == 67_584 + 4 * 13_056 + 4 * 49_152


def test_compressed_tensors_kv_scheme_and_refusals() -> None:
    fp8 = {"num_bits": 8, "type": "float"}
    s = spec_of(quantization_config={"quant_method": "compressed-tensors", "kv_cache_scheme": fp8,
                                     "config_groups": {"g": {"weights": fp8}}})
    assert kv_bytes_per_token(s, None) == 64  # 2 * 2 layers * 1 head * 16 * 1 B (fp8 from the config)
    assert decode_step(s, 1, 10).kv_read_bytes == 640
    with pytest.raises(UnsupportedModelConfig) as info:
        spec_of(quantization_config={"quant_method": "compressed-tensors",
                                     "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int"}}}})
    assert info.value.key == "quantization_config.config_groups.group_0"
    with pytest.raises(UnsupportedModelConfig) as info:
        spec_of(quantization_config={"quant_method": "hqq"})
    assert info.value.key == "quantization_config.quant_method"
    assert "'hqq'" in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(DiagnoseError, match="bits"):
        spec_of(quantization_config={"quant_method": "gptq", "group_size": 128})


# -- attention variants --------------------------------------------------------------


def test_sliding_window_sources() -> None:
    assert spec_of(sliding_window=8).layer_windows == (8, 8)  # bare (Mistral-7B-v0.1): every layer
    lt = spec_of(sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    assert lt.layer_windows == (8, None)
    assert spec_of(sliding_window=8, use_sliding_window=False).layer_windows == ()
    # Qwen2: layers from max_window_layers on, only when use_sliding_window is true (default false)
    assert spec_of(sliding_window=8, max_window_layers=1, use_sliding_window=True).layer_windows == (None, 8)
    assert spec_of(sliding_window=8, max_window_layers=1).layer_windows == ()
    assert spec_of(sliding_window=None).layer_windows == ()
    with pytest.raises(UnsupportedModelConfig) as info:
        spec_of(sliding_window=8, model_type="gemma2")  # interleaving implied by the architecture
    assert info.value.key == "sliding_window"
    with pytest.raises(UnsupportedModelConfig) as info:
        spec_of(sliding_window=8, layer_types=["linear_attention", "full_attention"])
    assert info.value.key == "layer_types"


def test_sliding_window_decode_and_prefill() -> None:
    s = spec_of(sliding_window=8, layer_types=["sliding_attention", "full_attention"])
    # KV per token and layer 2 * 1 * 16 * 2 B = 64; B = 2, ctx = 100: full 2 * 100 * 64 = 12,800,
    # sliding 2 * min(100, 8) * 64 = 1,024
    d = decode_step(s, 2, 100)
    assert d.kv_read_bytes == 13_824
    assert kv_layout(s).sequence_elements(100) == 32 * 100 + 32 * 8
    # attention FLOPs 4 * 4 * 16 = 256 per key: (200 + 16) keys
    assert d.flops_attention == 256 * 216
    # prefill S = 20, B = 1: full layer 256 * 400 = 102,400 (causal 51,200); sliding layer
    # 256 * 20 * 8 = 40,960 full, 256 * (2 * 8 * 20 - 8^2) / 2 = 32,768 causal
    p = prefill_flops(s, 20, 1)
    assert (p.flops_attention_full, p.flops_attention_causal) == (143_360, 83_968)
    # S <= W: a sliding layer is a full one
    assert prefill_flops(s, 8, 1).flops_attention_causal == prefill_flops(small(), 8, 1).flops_attention_causal


def test_mla_params_kv_and_tp() -> None:
    m = {"num_hidden_layers": 1, "hidden_size": 64, "num_attention_heads": 4, "num_key_value_heads": 4,
         "intermediate_size": 128, "vocab_size": 100, "kv_lora_rank": 16, "q_lora_rank": 32,
         "qk_nope_head_dim": 8, "qk_rope_head_dim": 4, "v_head_dim": 8}
    s = ModelSpec.from_hf_config(m)
    # q_a 64*32 = 2,048; q_b 32*4*(8+4) = 1,536; kv_a 64*(16+4) = 1,280; kv_b 16*4*(8+8) = 1,024;
    # o 4*8*64 = 2,048
    assert s.params_attention_per_layer == 7_936
    assert kv_bytes_per_token(s) == (16 + 4) * 2  # the latent, fp16
    assert kv_bytes_per_token(s, tp=2) == 40  # replicated on every rank
    # tp 2: q_a and kv_a replicated (2,048 + 1,280), q_b 32*2*12 = 768, kv_b 16*2*16 = 512, o 2*8*64 = 1,024;
    # MLP 3*64*64 = 12,288; vocab 50*64 * 2
    assert model_weights(s, tp=2).params == 2_048 + 1_280 + 768 + 512 + 1_024 + 12_288 + 6_400
    # attention FLOPs per key: 2 * 4 * (12 + 8) = 160
    assert decode_step(s, 1, 10).flops_attention == 1_600
    with pytest.raises(DiagnoseError, match="v_head_dim"):
        ModelSpec.from_hf_config({k: v for k, v in m.items() if k != "v_head_dim"})


# -- tensor parallelism --------------------------------------------------------------


def test_tensor_parallel_shards() -> None:
    s = small()
    # tp 2: q 64*32 = 2,048, k and v replicated (n_kv 1 < tp: 64*16 each), o 2,048; MLP 3*64*64 =
    # 12,288 -> 18,432 per layer, 36,864; vocab ceil(100/2) = 50 rows: 2 * 50 * 64 = 6,400
    w = model_weights(s, tp=2)
    assert w.params == 43_264 and w.bytes == 86_528
    assert kv_bytes_per_token(s, tp=2) == 128  # 1 KV head per rank, as at tp 1
    ref = ModelSpec.from_hf_config(REF_CFG)
    # 8 KV heads, tp 2: 4 per rank -> 2 * 32 * 4 * 128 * 2 = 65,536 B per token
    assert kv_bytes_per_token(ref, tp=2) == 65_536
    assert model_weights(ref, tp=2).bytes == 13_438_550_016 // 2  # everything splits evenly here
    with pytest.raises(DiagnoseError, match="num_attention_heads"):
        model_weights(s, tp=3)
    with pytest.raises(DiagnoseError, match="intermediate_size"):
        model_weights(spec_of(num_attention_heads=8, num_key_value_heads=8, head_dim=8, intermediate_size=100), tp=8)
    with pytest.raises(DiagnoseError, match="tensor-parallel"):
        model_weights(s, tp=0)


# -- refused and ignored keys --------------------------------------------------------


@pytest.mark.parametrize("key, value", [("ep_size", 8), ("attention_chunk_size", 8192), ("index_topk", 2048),
                                        ("layers_block_type", ["mamba", "attention"]), ("residual_moe", True),
                                        ("sliding_window_pattern", 6)])
def test_unsupported_keys_are_refused_by_name(key: str, value) -> None:
    over = {key: value}
    if key == "sliding_window_pattern":
        over["sliding_window"] = 8
    with pytest.raises(UnsupportedModelConfig) as info:
        spec_of(**over)
    assert info.value.key == key and isinstance(info.value, DiagnoseError)
    assert key in str(info.value) and "\n" not in str(info.value)


def test_harmless_keys_are_ignored() -> None:
    base = small()
    same = spec_of(attention_bias=True, mlp_bias=True, pretraining_tp=2, rope_scaling={"type": "yarn", "factor": 4},
                   ep_size=1, num_nextn_predict_layers=0, swiglu_limit=7.0, torch_dtype="float32")
    assert same.params_total == base.params_total and model_weights(same).bytes == model_weights(base).bytes
    assert "ep_size" in UNSUPPORTED_KEYS and "num_nextn_predict_layers" not in UNSUPPORTED_KEYS


# -- step_cost: the analysis' per-step price ------------------------------------------


def _engine_step_reference(spec, weight_dtype, kv_dtype, lm_head, phase, batch, tokens, kv_tokens):
    """The engine convention of step_cost derived from the config fields alone: linear layers
    for every token, the LM head for the sampled rows only (decode: each sequence; prefill
    "last": each prompt, "all": each position; mixed without request counts: each
    sequence), the untied embedding table gathered (T rows of H 16-bit elements), not
    streamed and not a matmul; attention over the KV tokens (decode) or causal prompts split
    equally (prefill); a mixed step without per-sequence sums has no attention term."""
    h, v, L = spec.hidden_size, spec.vocab_size, spec.num_hidden_layers
    untied = 0 if spec.tie_word_embeddings else v * h
    head = v * h
    body = spec.params_total - untied - head
    wb = weight_bytes(spec, weight_dtype)
    emb_bytes = model_weights(spec, weight_dtype).embedding_bytes
    kvb = kv_bytes_per_token(spec, kv_dtype)
    attn_pair = 4 * spec.num_attention_heads * spec.head_dim
    if phase == "decode":
        if not batch:
            return None, None
        flops = 2 * body * batch + 2 * head * batch
        if not kv_tokens:
            return float(flops), None
        flops += attn_pair * kv_tokens * L
        return float(flops), float(wb - emb_bytes + batch * h * 2 + kv_tokens * kvb)
    if phase == "prefill":
        if not batch or not tokens:
            return None, None
        seq = max(1, tokens // batch)
        rows = batch if lm_head == "last" else tokens
        flops = 2 * body * tokens + 2 * head * rows + L * batch * attn_pair * seq * seq // 2
        return float(flops), float(wb - emb_bytes + tokens * h * 2 + tokens * kvb)
    if phase == "mixed" and tokens:
        rows = batch or tokens
        return float(2 * body * tokens + 2 * head * rows), float(wb - emb_bytes + tokens * h * 2 + (tokens + (kv_tokens or 0)) * kvb)
    return None, None


@pytest.mark.parametrize("cfg", ["ref", "qwen3", "small", "tied"])
@pytest.mark.parametrize("dtypes", [("bf16", "bf16"), ("fp32", "fp32"), ("int4", "bf16"), ("int8", "int8")])
def test_step_cost_is_exactly_the_engine_formula(cfg: str, dtypes: tuple[str, str]) -> None:
    spec = {"ref": lambda: ModelSpec.from_hf_config(REF_CFG),
            "qwen3": lambda: ModelSpec.from_hf_config(json.loads((DATA / "qwen3_0_6b_config.json").read_text())),
            "small": small, "tied": lambda: small(tie_word_embeddings=True)}[cfg]()
    wd, kd = dtypes
    shapes = [(None, None, None), (1, None, None), (1, None, 2048), (32, None, 55_086), (3, 51, 51),
              (15, 15_360, None), (16, 8_944, None), (7, 100, None), (37, 8_192, 63_000), (None, 8_192, None),
              (5, 0, 0), (4, 3, None)]
    for phase in ("decode", "prefill", "mixed", "unknown"):
        for lm_head in ("last", "all"):
            for batch, tokens, kv_tokens in shapes:
                want = _engine_step_reference(spec, wd, kd, lm_head, phase, batch, tokens, kv_tokens)
                got = step_cost(spec, phase, batch=batch, tokens=tokens, kv_tokens=kv_tokens,
                                weight_dtype=wd, kv_dtype=kd, lm_head=lm_head)
                assert (got.flops, got.bytes) == want, (phase, lm_head, batch, tokens, kv_tokens)
                if got.flops is not None:  # the terms add up to the totals
                    assert sum(t.flops or 0 for t in got.terms) == got.flops
                if got.bytes is not None:
                    assert sum(t.bytes or 0 for t in got.terms) == pytest.approx(got.bytes, rel=1e-12)


def test_step_cost_reference_decode_drops_the_embedding_matmul() -> None:
    """docs/prefill-decode.md section 2's reference config, batch 1: the article's 2 * P = 13.44
    GFLOP per token counts the 524,288,000-parameter embedding table as a matmul; the engine
    gathers one row: 2 * (6,719,275,008 - 524,288,000) = 12,389,974,016 FLOP, and reads the
    weights without the table: 13,438,550,016 - 1,048,576,000 + 8,192 B."""
    spec = ModelSpec.from_hf_config(REF_CFG)
    c = step_cost(spec, "decode", batch=1, kv_tokens=0)
    assert c.flops == 12_389_974_016
    c = step_cost(spec, "decode", batch=1, kv_tokens=2048)
    assert c.bytes == 13_438_550_016 - 1_048_576_000 + 4096 * 2 + 2048 * 131_072


def test_step_cost_gpt_oss_decode_expert_reading_1() -> None:
    """expert_readings.md section 1: gpt-oss-20b decode, batch 32, 55,086 KV tokens, MI300X 5.3 TB/s:
    the reading's ~14.0 GB -> 2.65 ms."""
    s = load_model_config("gpt-oss-20b")
    c = step_cost(s, "decode", batch=32, kv_tokens=55_086)
    # non-expert bf16 weights read: 2 * (attention 637,009,920 + routers 2,211,840 params) + the
    # LM head 201,088 x 2,880 x 2 B = 1,158,266,880; the embedding table (as large again) is
    # gathered, not streamed: 32 rows of 2,880 bf16 = 184,320 B
    assert c.weight_bytes == 3_594_977_280 - 1_158_266_880 == 2_436_710_400
    gather = 32 * 2880 * 2
    # experts: E_touched = 32 * (1 - (28/32)^32) = 31.5539 of 32; one expert 3*2880*2880 * 4.25/8
    # = 13,219,200 B; 24 layers -> 24 * 31.5539 * 13,219,200 = 10,010,823,557 B
    touched = 32 * (1 - (28 / 32) ** 32)
    assert c.experts_touched_per_layer == pytest.approx(touched, rel=1e-12)
    assert c.expert_bytes == round(24 * touched * 13_219_200) == 10_010_823_557
    # KV: 12 full layers * 2 * 8 * 64 * 2 B = 24,576 B/token * 55,086 = 1,353,793,536; 12 sliding
    # layers * 2,048 B * 32 sequences * min(55,086 / 32 = 1,721.4, 128) = 100,663,296
    assert c.kv_bytes == 1_353_793_536 + 100_663_296
    assert c.bytes == 2_436_710_400 + gather + 10_010_823_557 + 1_454_456_832 == 13_902_175_109
    assert round(c.bytes / 5.3e12 * 1e3, 2) == 2.62  # ms
    # The reading's 14.0 GB: no routers (4,423,680), no gathered rows, all 32 experts read
    # (+ (32 - 31.554) * 24 * 13,219,200 = 141,522,043 B) -> 14,039,089,152 B, 2.65 ms
    reading = c.bytes - gather - 4_423_680 + (32 - touched) * 24 * 13_219_200
    assert round(reading / 1e9, 1) == 14.0 and round(reading / 5.3e12 * 1e3, 2) == 2.65
    assert any("uniform, independent routing" in a for a in c.assumptions)
    assert any("mean kv_tokens / batch = 1,721.4" in a for a in c.assumptions)


def test_step_cost_qwen3_8b_prefill_expert_reading_3() -> None:
    """expert_readings.md section 3: Qwen3-8B prefill of 15 x 1,024 tokens: linear 213.5 TFLOP +
    causal attention 4.6 TFLOP = 218 TFLOP."""
    s = load_model_config("qwen3-8b")
    c = step_cost(s, "prefill", batch=15, tokens=15_360, lm_head="last")
    # linear 2 * 6,945,767,424 * 15,360 = 213,373,975,265,280; LM head 2 * 4096 * 151936 * 15
    # = 18,669,895,680 (the last position of each prompt)
    linear = 2 * 6_945_767_424 * 15_360 + 2 * 4096 * 151_936 * 15
    assert linear == 213_392_645_160_960
    assert abs(linear / 213.5e12 - 1) < 0.001  # the reading rounds up: 213.39 TFLOP
    # causal attention: 36 layers * 15 prompts * 4 * 32 * 128 * 1024^2 / 2 = 4,638,564,679,680
    attention = 36 * 15 * 4 * 32 * 128 * 1024**2 // 2
    assert round(attention / 1e12, 1) == 4.6
    assert c.flops == linear + attention == 218_031_209_840_640
    assert round(c.flops / 1e12) == 218


def test_step_cost_moe_mixed_and_tp() -> None:
    s = spec_of(num_local_experts=4, num_experts_per_tok=2, sliding_window=8,
                layer_types=["sliding_attention", "full_attention"])
    # mixed, 3 tokens over 3 sequences with 30 cached: experts touched by all 3 tokens 3.5;
    # KV write 3 * 128 + full read 30 * 64 + sliding 3 * min(10, 8) * 64
    c = step_cost(s, "mixed", batch=3, tokens=3, kv_tokens=30)
    assert c.experts_touched_per_layer == 3.5
    assert c.kv_bytes == 3 * 128 + 30 * 64 + 3 * 8 * 64
    # weights without the embedding table (100 x 64 bf16 = 12,800 B) + 3 gathered rows of 64
    assert c.bytes == 67_584 - 12_800 + 3 * 64 * 2 + 2 * 3.5 * 49_152 + c.kv_bytes
    # linear 20,992 + 2 of 4 experts 98,304 params per token; the LM head (6,400) for the 3
    # sequences' sampled rows; no embedding matmul, no attention (no per-sequence sums)
    assert c.flops == 2 * (20_992 + 98_304) * 3 + 2 * 6_400 * 3
    c2 = step_cost(s, "decode", batch=1, kv_tokens=5, tp=2)
    w2 = model_weights(s, tp=2)
    assert c2.weight_bytes == w2.non_expert_bytes - w2.embedding_bytes and any("tensor parallel 2" in a for a in c2.assumptions)
    assert step_cost(s, "decode", batch=None).flops is None
