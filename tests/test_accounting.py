"""Model accounting against domain.md sections 2-3, with hand-derived expectations."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from diagnose.accounting import (
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

# domain.md section 2, reference config "7B-like".
REF_CFG = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 11008,
    "vocab_size": 128000,
    "tie_word_embeddings": False,
}


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
    assert sum(o * i * n for _, o, i, n in ref.weight_matrices()) == ref.params_total
    tied = small(tie_word_embeddings=True)
    assert sum(o * i * n for _, o, i, n in tied.weight_matrices()) == tied.params_total


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
