"""The bounds tables of ``diagnose bounds``: analytic decode and prefill lower bounds of a model
on a GPU, from the accounting (:mod:`diagnose.accounting.cost`) and the one roofline formula
(:func:`diagnose.roofline.roofline`); :func:`default_kv_dtype`, the KV-cache dtype a config
implies. The command and any other view call :func:`bounds_table`."""
from __future__ import annotations

from typing import Any

from diagnose.accounting.cost import decode_step, experts_touched, prefill_bytes, prefill_flops
from diagnose.accounting.kv import kv_bytes_per_token
from diagnose.accounting.spec import ModelSpec
from diagnose.accounting.units import GB
from diagnose.accounting.weights import model_weights
from diagnose.hardware import GpuPeak
from diagnose.roofline import roofline


#: Hugging Face ``torch_dtype`` / ``dtype`` values -> the KV-cache dtype a serving engine uses
#: with its default kv_cache_dtype "auto" (the model's dtype).
_CONFIG_DTYPES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32"}


def default_kv_dtype(cfg: dict[str, Any], spec: ModelSpec) -> tuple[str, str]:
    """KV-cache dtype when ``--kv-dtype`` is not given, and where it came from: the config's
    KV scheme (``quantization_config.kv_cache_scheme``), else the model's dtype
    (``torch_dtype``, or ``dtype`` as transformers >= 4.56 writes it; a multimodal wrapper's
    ``text_config`` too), as vLLM's ``kv_cache_dtype="auto"`` does, else fp16.

    Returns:
        (dtype, source), e.g. ("bf16", "config torch_dtype").
    """
    if spec.quantization is not None and spec.quantization.kv_dtype:
        return spec.quantization.kv_dtype, "config quantization_config"
    for where in (cfg, cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}):
        for key in ("torch_dtype", "dtype"):
            v = _CONFIG_DTYPES.get(str(where.get(key, "")).lower().removeprefix("torch."))
            if v is not None:
                return v, f"config {key}"
    return "fp16", "default (the config names no dtype)"


def _model_json(spec: ModelSpec, weight_dtype: str | None, kv_dtype: str | None, tp: int,
                kv_dtype_source: str | None = None) -> dict[str, Any]:
    w = model_weights(spec, weight_dtype, tp)
    out: dict[str, Any] = {
        "name": spec.name,
        "num_hidden_layers": spec.num_hidden_layers,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "params_attention_per_layer": spec.params_attention_per_layer,
        "params_mlp_per_layer": spec.params_mlp_per_layer,
        "params_per_layer": spec.params_per_layer,
        "params_body": spec.params_body,
        "params_embedding": spec.params_embedding,
        "params_total": spec.params_total,
        "params_active_per_token": spec.params_active_per_token,
        "params_mtp": spec.params_mtp,
        "moe": None,
        "attention": "mla" if spec.mla is not None else "gqa",
        "sliding_layers": spec.num_sliding_layers,
        "sliding_windows": sorted({x for x in spec.layer_windows if x is not None}),
        "tp": tp,
        "params_per_rank": w.params,
        "weight_dtype": weight_dtype or ("bf16" if spec.quantization is None else spec.quantization.method),
        "weight_format": w.weight_format,
        "weight_bytes": w.bytes,
        "kv_dtype": kv_dtype or "fp16",
        "kv_dtype_source": kv_dtype_source,
        "kv_bytes_per_token": kv_bytes_per_token(spec, kv_dtype, tp=tp),
    }
    if spec.moe is not None:
        out["moe"] = {
            "num_experts": spec.moe.num_experts,
            "num_experts_per_tok": spec.moe.num_experts_per_tok,
            "moe_intermediate_size": spec.moe.expert_intermediate_size,
            "shared_expert_intermediate_size": spec.moe.shared_intermediate_size,
            "moe_layers": spec.num_moe_layers,
            "params_expert": spec.params_expert,
            "params_experts": spec.params_experts,
            "expert_bytes_per_rank": w.expert_bytes,
        }
    return out


def _assumptions(spec: ModelSpec, tp: int) -> list[str]:
    out = []
    if spec.moe is not None:
        out.append(
            "MoE: experts touched per layer = E * (1 - (1 - k/E)^B) for B tokens: uniform, independent routing, "
            "which maximises the experts touched, so skewed real routing reads less than this figure"
        )
    if spec.layer_windows:
        out.append("sliding-window layers read min(context, window) tokens of KV per sequence")
    if spec.mla is not None:
        out.append("MLA: KV cache kv_lora_rank + qk_rope_head_dim per token and layer; attention FLOPs in the "
                   "per-head (non-absorbed) form")
    if spec.quantization is not None:
        out.append("quantization_config: block/channel scales of fp8 are not counted; AWQ/GPTQ add (16 + bits) bits per group")
    if spec.mtp_layers:
        out.append(f"num_nextn_predict_layers = {spec.mtp_layers}: the multi-token-prediction layer(s) "
                   f"({spec.params_mtp:,} params) are not counted: they run only for MTP speculative decoding")
    if tp > 1:
        out.append(f"tensor parallel {tp}: bytes and FLOPs of one rank (vLLM sharding: attention, MLP and expert widths "
                   "split, KV heads max(1, n_kv / tp), vocab-parallel embedding and LM head, routers replicated); "
                   "communication not counted")
    out.append("decode reads the whole embedding table once per step (the article's convention)")
    return out


def bounds_table(
    spec: ModelSpec,
    peak: GpuPeak,
    batches: list[int],
    context: int,
    prompt_lens: list[int],
    weight_dtype: str | None,
    kv_dtype: str | None,
    lm_head: str,
    tp: int = 1,
    kv_dtype_source: str | None = None,
) -> dict[str, Any]:
    """Everything ``diagnose bounds`` reports, as a JSON-ready dict: the model, the GPU peaks,
    the conventions and assumptions, and one decode row per batch (weights-only floor first)
    and one prefill row per prompt length (step bytes and FLOPs per rank, the memory- and
    compute-bound times, their max as the bound, tokens/s). ``peak`` must have both peaks."""
    tflops = peak.dense_fp16_tflops
    tbps = peak.memory_bandwidth_tbps
    assert tflops is not None and tbps is not None

    def decode_row(batch: int, ctx: int) -> dict[str, Any]:
        step = decode_step(spec, batch, ctx, weight_dtype, kv_dtype, tp=tp)
        memory_ms = step.bytes_per_step / (tbps * 1e12) * 1e3
        compute_ms = step.flops_per_step / (tflops * 1e12) * 1e3
        roof = roofline(step.flops_per_step, step.bytes_per_step, None, peak, rounded=False)
        assert roof.bound_s is not None
        step_ms = roof.bound_s * 1e3
        return {
            "batch": batch,
            "context": ctx,
            "weight_bytes": step.weight_bytes,
            "expert_read_bytes": step.expert_read_bytes,
            "experts_touched_per_layer": step.experts_touched_per_layer,
            "kv_read_bytes": step.kv_read_bytes,
            "bytes_per_step": step.bytes_per_step,
            "bytes_per_step_gb": step.bytes_per_step / GB,
            "flops_per_step": step.flops_per_step,
            "memory_ms": memory_ms,
            "compute_ms": compute_ms,
            "step_ms": step_ms,
            "tokens_per_s": batch / (step_ms / 1e3),
            "per_token_ms": step_ms / batch,
            "arithmetic_intensity": roof.arithmetic_intensity,
            "bound": roof.bound,
        }

    decode = [decode_row(b, context) for b in batches]
    floor = decode_row(1, 0)

    prefill = []
    for s in prompt_lens:
        f = prefill_flops(spec, s, 1, lm_head, tp=tp)  # type: ignore[arg-type]
        moved = prefill_bytes(spec, s, 1, weight_dtype, kv_dtype, tp=tp)
        memory_ms = moved / (tbps * 1e12) * 1e3
        causal_ms = f.flops_total_causal / (tflops * 1e12) * 1e3
        full_ms = f.flops_total_full / (tflops * 1e12) * 1e3
        causal = roofline(f.flops_total_causal, moved, None, peak, rounded=False)
        full = roofline(f.flops_total_full, moved, None, peak, rounded=False)
        assert causal.bound_s is not None and full.bound_s is not None
        touched = None
        if spec.moe is not None:
            touched = experts_touched(spec.moe.num_experts, spec.moe.num_experts_per_tok, s)
        prefill.append(
            {
                "prompt_len": s,
                "batch": 1,
                "lm_head": lm_head,
                "flops_linear": f.flops_linear,
                "flops_lm_head": f.flops_lm_head,
                "flops_attention_causal": f.flops_attention_causal,
                "flops_attention_full": f.flops_attention_full,
                "flops_total_causal": f.flops_total_causal,
                "flops_total_full": f.flops_total_full,
                "flops_2p_total": f.flops_2p_total,
                "attention_share_causal": f.attention_share_causal,
                "attention_share_full": f.attention_share_full,
                "bytes_moved": moved,
                "experts_touched_per_layer": touched,
                "compute_ms_causal": causal_ms,
                "compute_ms_full": full_ms,
                "memory_ms": memory_ms,
                "bound_ms": causal.bound_s * 1e3,
                "bound_ms_full": full.bound_s * 1e3,
                "arithmetic_intensity_causal": causal.arithmetic_intensity,
                "arithmetic_intensity_full": full.arithmetic_intensity,
            }
        )

    return {
        "model": _model_json(spec, weight_dtype, kv_dtype, tp, kv_dtype_source),
        "gpu": peak.to_dict(),
        "conventions": {
            "units": "GB = 1e9 B, GiB = 2^30 B, TB/s = 1e12 B/s, TFLOP/s = 1e12 FLOP/s",
            "peak": "dense FP16/BF16 tensor-core peak (prefill runs in 16 bit whatever the weight dtype)",
            "per_rank": f"every byte and FLOP is one tensor-parallel rank's (--tp {tp})",
            "decode_bytes": "every non-expert weight once (embedding table and LM head included) + per MoE layer "
            "E_touched * expert bytes, E_touched = E * (1 - (1 - k/E)^batch) + batch * context * KV bytes per token "
            "(sliding-window layers: min(context, window)) (docs/prefill-decode.md section 3)",
            "decode_flops": "2 * P * batch + 2 * n_h * (d_qk + d_v) per key read per layer; P = the parameters a token "
            "multiplies (params_total for a dense model, embedding included; MoE: top-k experts)",
            "decode_step": "max(bytes / bandwidth, FLOPs / peak); tokens/s = batch / step",
            "prefill_flops": "linear 2 * params_body_active * S; LM head 2 * H * V per position "
            f"({lm_head}); attention full = L * 2 * (2 * n_h * d * S^2), causal = full / 2 "
            "(sliding layers: S * W full, W * S - W^2 / 2 causal)",
            "prefill_bytes": "weights read (MoE: experts touched by S tokens) + S * KV bytes per token "
            "(activations not counted)",
            "prefill_bound": "bound_ms = max(causal FLOPs / peak, bytes / bandwidth); "
            "bound_ms_full uses full-attention FLOPs",
        },
        "assumptions": _assumptions(spec, tp),
        "decode_weights_only": {"step_ms": floor["step_ms"], "tokens_per_s": floor["tokens_per_s"]},
        "decode": decode,
        "prefill": prefill,
    }
