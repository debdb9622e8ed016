"""Model accounting: parameters, weight bytes, KV-cache bytes, FLOPs and analytic bounds.

Everything here is pure arithmetic on a decoder-only transformer described by a Hugging Face
``config.json`` (config key names throughout). Formulas follow ``docs/prefill-decode.md`` (the project's
restatement of the prefill/decode article) and, beyond its dense bf16 scope, the sources named
next to each one; ``docs/model-accounting.md`` derives every formula with its assumption.

* docs/prefill-decode.md section 2 (model accounting): parameters, KV bytes per token, prefill FLOPs;
* docs/prefill-decode.md section 3 (arithmetic intensity and bounds): ridge point, decode/prefill bounds;
* docs/prefill-decode.md section 3, "KV capacity" paragraph: concurrency ceiling on a card;
* mixture of experts (Mixtral, gpt-oss, DeepSeek, Qwen-MoE): parameters, active parameters,
  the expected experts a batch touches under uniform independent routing;
* quantization from ``quantization_config`` (fp8, fbgemm_fp8, FP8 compressed-tensors, mxfp4,
  AWQ, GPTQ, bitsandbytes), honouring ``modules_to_not_convert``;
* sliding-window layers (``sliding_window``, ``layer_types``, Qwen2's ``max_window_layers``)
  and multi-head latent attention (MLA: ``kv_lora_rank`` ...);
* tensor parallelism, sharded the way vLLM shards (per-rank bytes and FLOPs).

A config key that changes bytes or FLOPs in a way not modelled here (:data:`UNSUPPORTED_KEYS`,
unknown ``quant_method`` values, unknown ``layer_types``) raises :class:`UnsupportedModelConfig`
naming the key: never a silent dense bound. Keys that change neither are ignored.

Units are fixed and named in every field: bytes are integers (``*_bytes``) unless a field says
it is an expectation (float), ``GB`` = 1e9 bytes, ``GiB`` = 2**30 bytes, ``TB/s`` = 1e12 B/s,
``TFLOP/s`` = 1e12 FLOP/s. The two gigabyte units are never mixed in one number.

Stated simplifications: norm weights and biases are not counted (docs/prefill-decode.md section 2:
"negligible"); activations are not counted as memory traffic; the decode step reads every
non-expert weight once, the whole embedding table included (the article's convention: a
real step reads only the batch's rows of it).
"""

from __future__ import annotations

import functools
import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from fractions import Fraction
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from diagnose.errors import DiagnoseError
from diagnose.inputs import check_model_sizes, parsing, read_text_file

#: Bytes in one GB (decimal) and one GiB (binary). docs/prefill-decode.md "Units".
GB = 10**9
GiB = 2**30
MiB = 2**20
KiB = 2**10

#: Storage width in bits of each supported dtype. ``fp16`` and ``bf16`` are both 16 bits.
DTYPE_BITS: dict[str, int] = {
    "fp32": 32,
    "fp16": 16,
    "bf16": 16,
    "fp8": 8,
    "int8": 8,
    "int4": 4,
}

#: Storage bytes per element of each dtype (``int4`` is half a byte).
DTYPE_BYTES: dict[str, float] = {name: bits / 8 for name, bits in DTYPE_BITS.items()}

#: Default int4 quantization group: one fp16 scale per 128 consecutive input weights.
INT4_GROUP_SIZE = 128

#: Bytes of one int4 group scale (fp16).
INT4_SCALE_BYTES = 2

#: Share of the KV-cache ceiling that is usable once allocator fragmentation is paid.
#: 0.75 reproduces docs/prefill-decode.md section 3 exactly for 240 -> 180 and 60 -> 45; with
#: ``floor`` it gives 15 -> 11 and 3 -> 2 where the article says "~10" and "~2".
FRAGMENTATION_FACTOR = 0.75

#: Bits of an unquantized weight (bf16/fp16): what serving engines load a 16/32-bit
#: checkpoint as (vLLM ``--dtype auto`` casts fp32 checkpoints to 16 bit).
UNQUANTIZED_BITS = 16

_REQUIRED_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


class UnsupportedModelConfig(DiagnoseError):
    """A config key changes bytes or FLOPs in a way this accounting does not model.

    Attributes:
        key: the config key (dotted for nested keys, e.g. ``quantization_config.quant_method``).
    """

    def __init__(self, key: str, why: str) -> None:
        self.key = key
        super().__init__(f"model config key {key!r} is not supported: {why}")


def _set(v: Any) -> bool:
    """True when a config value is present and not null/false/empty/0."""
    return v is not None and v is not False and v != 0 and v != [] and v != {} and v != ""


#: Config keys that change bytes or FLOPs but are not modelled, each with the test that its
#: value is "active" and the reason given in :class:`UnsupportedModelConfig`. Kept beside
#: the accounting so that adding support means removing a row here.
UNSUPPORTED_KEYS: dict[str, tuple[Callable[[Any], bool], str]] = {
    "ep_size": (lambda v: v not in (None, 1), "expert parallelism is not modelled (experts are split by width over tensor-parallel ranks only)"),
    "attention_chunk_size": (_set, "chunked local attention (Llama 4) is not modelled"),
    "interleave_moe_layer_step": (_set, "Llama 4 MoE interleaving is not modelled"),
    "intermediate_size_mlp": (_set, "Llama 4 dense/shared MLP widths are not modelled"),
    "moe_layers": (_set, "an explicit list of MoE layers is not modelled"),
    "mlp_layer_types": (_set, "per-layer MLP types are not modelled"),
    "residual_moe": (_set, "a dense MLP in parallel with the experts (residual MoE) is not modelled"),
    "moe_num_experts": (_set, "this MoE expert-count key is not read (use num_local_experts, num_experts or n_routed_experts)"),
    "moe_num_shared_experts": (_set, "this shared-expert key is not read (use n_shared_experts or shared_expert_intermediate_size)"),
    "dense_intermediate_size": (_set, "a separate dense-layer width is not modelled"),
    "shared_intermediate_size": (_set, "this shared-expert width key is not read (use shared_expert_intermediate_size)"),
    "cross_attention_layers": (_set, "cross-attention layers are not modelled"),
    "layers_block_type": (_set, "hybrid (state-space / linear-attention) layers are not modelled"),
    "hybrid_override_pattern": (_set, "hybrid (state-space) layers are not modelled"),
    "attn_layer_period": (_set, "hybrid (state-space) layers are not modelled"),
    "expert_layer_period": (_set, "hybrid MoE layer periods are not modelled"),
    "linear_num_key_heads": (_set, "linear-attention layers are not modelled"),
    "full_attention_interval": (_set, "linear-attention layers are not modelled"),
    "index_topk": (_set, "sparse attention with an indexer (DeepSeek-V3.2) is not modelled"),
    "compression_config": (_set, "legacy compressed-tensors configs are not modelled (use quantization_config)"),
}

#: Model types whose sliding-window layer pattern is implied by the architecture (not by the
#: config) when ``layer_types`` is absent: refused rather than guessed.
_PATTERNED_SLIDING = ("gemma2", "gemma3", "gemma3_text", "cohere2")

#: Attention kinds of ``layer_types`` that are modelled.
_LAYER_TYPES = ("full_attention", "sliding_attention")


def _check_dtype(dtype: str, what: str = "dtype") -> str:
    key = dtype.lower() if isinstance(dtype, str) else dtype
    if key not in DTYPE_BITS:
        raise DiagnoseError(
            f"unknown {what} {dtype!r}; expected one of {', '.join(DTYPE_BITS)}"
        )
    return key


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DiagnoseError(f"model config key {key!r} must be a positive integer, got {value!r}")
    return value


def _nonneg_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DiagnoseError(f"model config key {key!r} must be a non-negative integer, got {value!r}")
    return value


def _check_tp(tp: Any) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise DiagnoseError(f"tensor-parallel size must be an integer >= 1, got {tp!r}")
    return tp


# -- architecture variants ------------------------------------------------------------


@dataclass(frozen=True)
class MoeSpec:
    """Mixture-of-experts shape, in Hugging Face config terms.

    Attributes:
        num_experts: E, routed experts per MoE layer (``num_local_experts`` |
            ``num_experts`` | ``n_routed_experts``).
        num_experts_per_tok: k, experts each token is routed to (``num_experts_per_tok``).
        expert_intermediate_size: F_e, width of one expert's gated MLP
            (``moe_intermediate_size``, else ``intermediate_size``).
        shared_intermediate_size: total width of the shared-expert MLP every token runs
            (``shared_expert_intermediate_size``, else ``n_shared_experts`` x F_e; 0 if none).
        moe_layers: one bool per decoder layer, True where the MLP is a MoE block (dense
            layers from ``first_k_dense_replace``, ``moe_layer_freq``, ``mlp_only_layers``,
            ``decoder_sparse_step``).
    """

    num_experts: int
    num_experts_per_tok: int
    expert_intermediate_size: int
    shared_intermediate_size: int = 0
    moe_layers: tuple[bool, ...] = ()

    @property
    def num_moe_layers(self) -> int:
        """Decoder layers whose MLP is a MoE block."""
        return sum(self.moe_layers)


@dataclass(frozen=True)
class MlaSpec:
    """Multi-head latent attention (DeepSeek-V2/V3), config names.

    Attributes:
        kv_lora_rank: width of the compressed KV latent (cached per token and layer).
        q_lora_rank: width of the query low-rank projection, or None (a plain q_proj).
        qk_nope_head_dim: per-head query/key width without rotary embedding.
        qk_rope_head_dim: per-head rotary width (one shared rotary key cached per token).
        v_head_dim: per-head value width.
    """

    kv_lora_rank: int
    q_lora_rank: int | None
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int

    @property
    def kv_elements_per_token_per_layer(self) -> int:
        """KV-cache elements per token and layer: kv_lora_rank + qk_rope_head_dim (the
        latent vLLM's MLA backends cache; DeepSeek-V2 paper section 2.1.2)."""
        return self.kv_lora_rank + self.qk_rope_head_dim


@dataclass(frozen=True)
class QuantSpec:
    """Weight quantization read from ``quantization_config``.

    Attributes:
        method: the config's ``quant_method``.
        bits: storage bits per quantized weight, flat per-block scales included
            (mxfp4 17/4 = 4.25; bitsandbytes nf4 9/2 = 4.5; fp8 8), as an exact fraction.
        group_size: AWQ/GPTQ group along the input dimension (``-1``: one group per output
            channel), or None.
        group_bits: bits per AWQ/GPTQ group (fp16 scale + packed zero: 16 + ``bits``).
        experts_only: only routed-expert weights are quantized (mxfp4).
        lm_head: the LM head is quantized too (GPTQ ``lm_head: true``).
        skip: module-name patterns left unquantized (``modules_to_not_convert``,
            ``llm_int8_skip_modules``, compressed-tensors ``ignore``).
        kv_dtype: KV-cache dtype the config sets (compressed-tensors ``kv_cache_scheme``),
            or None.
        label: short description for reports, e.g. "mxfp4 (4.25 bit)".
    """

    method: str
    bits: Fraction
    group_size: int | None = None
    group_bits: int = 0
    experts_only: bool = False
    lm_head: bool = False
    skip: tuple[str, ...] = ()
    kv_dtype: str | None = None
    label: str = ""


def _skip_list(value: Any, key: str) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        return (value,)
    if not isinstance(value, list) or not all(isinstance(x, str) for x in value):
        raise DiagnoseError(f"model config key {key!r} must be a list of module names, got {value!r}")
    return tuple(value)


def _parse_quantization(q: Any) -> QuantSpec | None:
    """QuantSpec from a ``quantization_config`` dict (None when absent).

    Raises:
        UnsupportedModelConfig: unknown ``quant_method`` or an unmodelled variant.
        DiagnoseError: malformed values.
    """
    if q is None:
        return None
    if not isinstance(q, Mapping):
        raise DiagnoseError("model config key 'quantization_config' must be a JSON object")
    method = q.get("quant_method")
    if not isinstance(method, str):
        raise DiagnoseError("model config key 'quantization_config.quant_method' is missing")
    m = method.lower()
    skip = _skip_list(q.get("modules_to_not_convert"), "quantization_config.modules_to_not_convert")
    if m in ("fp8", "fbgemm_fp8"):
        # 1 byte per weight; fp32 block (128x128) or per-channel scales are < 0.1 % and not counted.
        skip += _skip_list(q.get("ignored_layers"), "quantization_config.ignored_layers")
        return QuantSpec(m, Fraction(8), skip=skip, label=f"{m} (8 bit)")
    if m == "mxfp4":
        # OCP MX spec: 32 FP4 (E2M1) values share one 8-bit E8M0 scale: 4 + 8/32 = 4.25 bit.
        return QuantSpec(m, Fraction(17, 4), experts_only=True, skip=skip, label="mxfp4 (4.25 bit)")
    if m in ("awq", "gptq"):
        bits = q.get("bits")
        group = q.get("group_size")
        if isinstance(bits, bool) or not isinstance(bits, int) or not 1 <= bits <= 8:
            raise DiagnoseError(f"model config key 'quantization_config.bits' must be an integer 1..8, got {bits!r}")
        if isinstance(group, bool) or not isinstance(group, int) or (group < 1 and group != -1):
            raise DiagnoseError(
                f"model config key 'quantization_config.group_size' must be a positive integer or -1, got {group!r}"
            )
        lm_head = bool(q.get("lm_head", False)) if m == "gptq" else False
        gtxt = "per output channel" if group == -1 else f"group {group}"
        return QuantSpec(m, Fraction(bits), group_size=group, group_bits=16 + bits, lm_head=lm_head, skip=skip,
                         label=f"{m} int{bits}, {gtxt} (+{16 + bits}-bit scale and zero per group)")
    if m == "bitsandbytes":
        four = bool(q.get("load_in_4bit") or q.get("_load_in_4bit"))
        eight = bool(q.get("load_in_8bit") or q.get("_load_in_8bit"))
        skip += _skip_list(q.get("llm_int8_skip_modules"), "quantization_config.llm_int8_skip_modules")
        if four:
            if q.get("bnb_4bit_use_double_quant"):
                # absmax quantized to 8 bit per 64 weights + one fp32 scale per 256 blocks.
                bits = Fraction(4) + Fraction(8, 64) + Fraction(32, 64 * 256)
                return QuantSpec(m, bits, skip=skip, label="bitsandbytes 4-bit, double quant (~4.13 bit)")
            return QuantSpec(m, Fraction(4) + Fraction(32, 64), skip=skip, label="bitsandbytes 4-bit (4.5 bit)")
        if eight:
            return QuantSpec(m, Fraction(8), skip=skip, label="bitsandbytes 8-bit (8 bit)")
        raise UnsupportedModelConfig("quantization_config", "bitsandbytes config without load_in_4bit or load_in_8bit")
    if m == "compressed-tensors":
        groups = q.get("config_groups")
        if not isinstance(groups, Mapping) or not groups:
            raise UnsupportedModelConfig("quantization_config.config_groups", "compressed-tensors config without weight groups")
        for name, g in groups.items():
            w = g.get("weights") if isinstance(g, Mapping) else None
            if not isinstance(w, Mapping) or w.get("num_bits") != 8 or w.get("type") != "float":
                raise UnsupportedModelConfig(
                    f"quantization_config.config_groups.{name}",
                    "only FP8 compressed-tensors weights (num_bits 8, type float) are modelled",
                )
        skip += _skip_list(q.get("ignore"), "quantization_config.ignore")
        kv = q.get("kv_cache_scheme")
        kv_dtype = None
        if kv is not None:
            if isinstance(kv, Mapping) and kv.get("num_bits") == 8 and kv.get("type") in ("float", "int"):
                kv_dtype = "fp8" if kv.get("type") == "float" else "int8"
            else:
                raise UnsupportedModelConfig("quantization_config.kv_cache_scheme", "only 8-bit KV-cache schemes are modelled")
        return QuantSpec(m, Fraction(8), skip=skip, kv_dtype=kv_dtype, label="compressed-tensors fp8 (8 bit)")
    raise UnsupportedModelConfig(
        "quantization_config.quant_method",
        f"quant_method {method!r} is not modelled (modelled: fp8, fbgemm_fp8, compressed-tensors fp8, mxfp4, awq, gptq, bitsandbytes)",
    )


def _module_excluded(names: tuple[str, ...], patterns: tuple[str, ...]) -> bool:
    """Whether a module named by any of ``names`` matches a ``modules_to_not_convert`` pattern.

    Matching follows transformers' ``should_convert_module`` (quantizers_utils): a pattern
    matches when ``pattern + "."`` occurs in the name, the name ends with it, or it matches
    the name's start as a regex; compressed-tensors ``re:`` patterns are regexes searched in
    the name.
    """
    from diagnose.patterns import outside_pattern

    for p in patterns:
        rx = outside_pattern(p[3:] if p.startswith("re:") else p)  # None: invalid, or nested repeats
        for name in names:
            if p.startswith("re:"):
                if rx is not None and rx.search(name):
                    return True
                continue
            if f"{p}." in name or name.endswith(p):
                return True
            if rx is not None and rx.match(name):
                return True
    return False


def _parse_moe(src: Mapping[str, Any], layers: int, intermediate: int) -> MoeSpec | None:
    key, e = None, None
    for k in ("num_local_experts", "num_experts", "n_routed_experts"):
        if src.get(k) is not None:
            key, e = k, src[k]
            break
    if key is None or e == 0:
        return None
    e = _positive_int(e, key)
    k_key = "num_experts_per_tok" if src.get("num_experts_per_tok") is not None else "experts_per_token"
    top_k = src.get(k_key)
    if top_k is None:
        raise DiagnoseError(f"model config has {key} but no 'num_experts_per_tok'")
    top_k = _positive_int(top_k, k_key)
    if top_k > e:
        raise DiagnoseError(f"model config: num_experts_per_tok ({top_k}) exceeds {key} ({e})")
    width = src.get("moe_intermediate_size")
    width = intermediate if width is None else _positive_int(width, "moe_intermediate_size")
    if src.get("shared_expert_intermediate_size") is not None:
        shared = _nonneg_int(src["shared_expert_intermediate_size"], "shared_expert_intermediate_size")
    else:
        n_shared = src.get("n_shared_experts")
        shared = 0 if n_shared is None else _nonneg_int(n_shared, "n_shared_experts") * width
    first = src.get("first_k_dense_replace")
    first = 0 if first is None else _nonneg_int(first, "first_k_dense_replace")
    freq = src.get("moe_layer_freq")
    freq = 1 if freq is None else _positive_int(freq, "moe_layer_freq")
    step = src.get("decoder_sparse_step")
    step = 1 if step is None else _positive_int(step, "decoder_sparse_step")
    only = src.get("mlp_only_layers") or []
    if not isinstance(only, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in only):
        raise DiagnoseError(f"model config key 'mlp_only_layers' must be a list of layer indices, got {only!r}")
    dense = set(only)
    # DeepSeek (modeling_deepseek.py): MoE where i >= first_k_dense_replace and
    # i % moe_layer_freq == 0; Qwen2-MoE (modeling_qwen2_moe.py): MoE where i is not in
    # mlp_only_layers and (i + 1) % decoder_sparse_step == 0.
    moe_layers = tuple(
        i >= first and i % freq == 0 and (i + 1) % step == 0 and i not in dense for i in range(layers)
    )
    return MoeSpec(e, top_k, width, shared, moe_layers)


def _parse_mla(src: Mapping[str, Any]) -> MlaSpec | None:
    if src.get("kv_lora_rank") is None:
        return None
    for key in ("qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim"):
        if src.get(key) is None:
            raise DiagnoseError(f"model config has kv_lora_rank (MLA) but no {key!r}")
    q = src.get("q_lora_rank")
    return MlaSpec(
        kv_lora_rank=_positive_int(src["kv_lora_rank"], "kv_lora_rank"),
        q_lora_rank=None if q is None else _positive_int(q, "q_lora_rank"),
        qk_nope_head_dim=_positive_int(src["qk_nope_head_dim"], "qk_nope_head_dim"),
        qk_rope_head_dim=_positive_int(src["qk_rope_head_dim"], "qk_rope_head_dim"),
        v_head_dim=_positive_int(src["v_head_dim"], "v_head_dim"),
    )


def _parse_windows(src: Mapping[str, Any], layers: int) -> tuple[int | None, ...]:
    """Per-layer sliding window (None = full attention); () when no layer slides."""
    types = src.get("layer_types")
    sw = src.get("sliding_window")
    if types is not None:
        if not isinstance(types, list) or len(types) != layers:
            raise DiagnoseError(f"model config key 'layer_types' must list {layers} layer kinds")
        bad = sorted({t for t in types if t not in _LAYER_TYPES}, key=str)
        if bad:
            raise UnsupportedModelConfig("layer_types", f"layer kind {bad[0]!r} is not modelled (modelled: {', '.join(_LAYER_TYPES)})")
        if "sliding_attention" not in types:
            return ()
        if sw is None:
            raise DiagnoseError("model config marks sliding_attention layers but has no 'sliding_window'")
        w = _positive_int(sw, "sliding_window")
        return tuple(w if t == "sliding_attention" else None for t in types)
    if "use_sliding_window" in src and not src["use_sliding_window"]:
        return ()
    if sw is None or sw is False:
        return ()
    w = _positive_int(sw, "sliding_window")
    if str(src.get("model_type", "")).lower() in _PATTERNED_SLIDING:
        raise UnsupportedModelConfig(
            "sliding_window",
            f"model_type {src.get('model_type')!r} interleaves sliding and full layers by architecture; add 'layer_types' to the config",
        )
    if _set(src.get("sliding_window_pattern")):
        raise UnsupportedModelConfig("sliding_window_pattern", "give the pattern as 'layer_types' instead")
    if "max_window_layers" in src:
        # Qwen2 family (configuration_qwen2.py): use_sliding_window defaults to False; when
        # true, layers from max_window_layers on use the window.
        if not src.get("use_sliding_window", False):
            return ()
        first = _nonneg_int(src["max_window_layers"], "max_window_layers")
        if first >= layers:
            return ()
        return tuple(w if i >= first else None for i in range(layers))
    # A bare sliding_window (Mistral-7B-v0.1): every layer slides.
    return tuple(w for _ in range(layers))


def _check_unsupported(src: Mapping[str, Any]) -> None:
    for key, (active, why) in UNSUPPORTED_KEYS.items():
        if key in src and active(src[key]):
            raise UnsupportedModelConfig(key, why)


# -- the model ------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a decoder-only transformer, in Hugging Face ``config.json`` names.

    Dense GQA models need only the first eight fields; MoE, MLA, sliding windows and
    quantization come from :meth:`from_hf_config`.

    Attributes:
        num_hidden_layers: L, number of decoder layers.
        hidden_size: H, model width.
        num_attention_heads: n_h, query heads.
        num_key_value_heads: n_kv, key/value heads (n_h for MHA, 1 for MQA, else GQA).
        head_dim: d, width of one head (unused by MLA layers, see ``mla``).
        intermediate_size: F, gated-MLP inner width of dense layers.
        vocab_size: V.
        tie_word_embeddings: whether the LM head shares the embedding matrix.
        name: label for reports (``_name_or_path`` or ``model_type`` when present).
        moe: mixture-of-experts shape, or None for a dense model.
        mla: multi-head latent attention shape, or None for GQA/MHA/MQA.
        layer_windows: per-layer sliding window in tokens (None = full attention), or ()
            when no layer slides.
        quantization: weight quantization from ``quantization_config``, or None (16 bit).
        mtp_layers: ``num_nextn_predict_layers``: DeepSeek multi-token-prediction layers,
            not counted in the forward step (see :attr:`params_mtp`).
    """

    num_hidden_layers: int
    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    tie_word_embeddings: bool = False
    name: str = "model"
    moe: MoeSpec | None = None
    mla: MlaSpec | None = None
    layer_windows: tuple[int | None, ...] = ()
    quantization: QuantSpec | None = None
    mtp_layers: int = 0

    def __post_init__(self) -> None:
        for key in (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "num_key_value_heads",
            "head_dim",
            "intermediate_size",
            "vocab_size",
        ):
            _positive_int(getattr(self, key), key)
        if self.num_attention_heads % self.num_key_value_heads:
            raise DiagnoseError(
                f"num_attention_heads ({self.num_attention_heads}) is not a multiple of "
                f"num_key_value_heads ({self.num_key_value_heads})"
            )
        if self.layer_windows and len(self.layer_windows) != self.num_hidden_layers:
            raise DiagnoseError("layer_windows must give one entry per layer")
        if self.moe is not None and len(self.moe.moe_layers) != self.num_hidden_layers:
            raise DiagnoseError("moe.moe_layers must give one entry per layer")

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], name: str | None = None) -> "ModelSpec":
        """Build a spec from a Hugging Face ``config.json`` dict.

        Defaults (docs/prefill-decode.md section 2): ``num_key_value_heads`` = ``num_attention_heads``
        (MHA) when absent or null; ``head_dim`` = ``hidden_size // num_attention_heads``
        when absent or null; ``tie_word_embeddings`` = False. When a top-level key is
        missing and the config has a nested ``text_config`` (multimodal wrappers), the
        nested values are used, falling back to the top level key by key (the vision tower
        is not counted). MoE, MLA, sliding windows and ``quantization_config`` are read as
        described in ``docs/model-accounting.md``.

        Args:
            cfg: the parsed ``config.json``.
            name: label; defaults to ``_name_or_path``, then ``model_type``, then "model".

        Returns:
            The spec.

        Raises:
            UnsupportedModelConfig: a key that changes bytes or FLOPs is not modelled
                (:data:`UNSUPPORTED_KEYS`, unknown ``quant_method`` or ``layer_types``).
            DiagnoseError: a required key is missing or not a positive integer (one-line
                message naming the key), a size beyond :data:`diagnose.inputs.MODEL_SIZE_BOUNDS`,
                or the config is not a JSON object.
        """
        if not isinstance(cfg, Mapping):
            raise DiagnoseError("model config must be a JSON object")
        check_model_sizes(cfg, "model config")
        src: Mapping[str, Any] = cfg
        text = cfg.get("text_config")
        if isinstance(text, Mapping) and any(k not in cfg for k in _REQUIRED_KEYS):
            src = {**cfg, **text}
        for key in _REQUIRED_KEYS:
            if src.get(key) is None:
                raise DiagnoseError(f"model config is missing required key {key!r}")
        _check_unsupported(src)
        n_h = _positive_int(src["num_attention_heads"], "num_attention_heads")
        hidden = _positive_int(src["hidden_size"], "hidden_size")
        layers = _positive_int(src["num_hidden_layers"], "num_hidden_layers")
        intermediate = _positive_int(src["intermediate_size"], "intermediate_size")
        n_kv = src.get("num_key_value_heads")
        n_kv = n_h if n_kv is None else _positive_int(n_kv, "num_key_value_heads")
        head_dim = src.get("head_dim")
        if head_dim is None:
            if hidden % n_h:
                raise DiagnoseError(
                    f"hidden_size ({hidden}) is not a multiple of num_attention_heads ({n_h}) "
                    "and the config has no head_dim"
                )
            head_dim = hidden // n_h
        mtp = src.get("num_nextn_predict_layers")
        label = name or src.get("_name_or_path") or src.get("model_type") or "model"
        return cls(
            num_hidden_layers=layers,
            hidden_size=hidden,
            num_attention_heads=n_h,
            num_key_value_heads=n_kv,
            head_dim=_positive_int(head_dim, "head_dim"),
            intermediate_size=intermediate,
            vocab_size=_positive_int(src["vocab_size"], "vocab_size"),
            tie_word_embeddings=bool(src.get("tie_word_embeddings", False)),
            name=str(label),
            moe=_parse_moe(src, layers, intermediate),
            mla=_parse_mla(src),
            layer_windows=_parse_windows(src, layers),
            quantization=_parse_quantization(src.get("quantization_config")),
            mtp_layers=0 if mtp is None else _nonneg_int(mtp, "num_nextn_predict_layers"),
        )

    # -- layer kinds ---------------------------------------------------------------------

    @property
    def num_moe_layers(self) -> int:
        """Layers whose MLP is a MoE block (0 for a dense model)."""
        return 0 if self.moe is None else self.moe.num_moe_layers

    @property
    def num_dense_layers(self) -> int:
        """Layers with a dense gated MLP of width ``intermediate_size``."""
        return self.num_hidden_layers - self.num_moe_layers

    @property
    def num_sliding_layers(self) -> int:
        """Layers with a sliding attention window."""
        return sum(w is not None for w in self.layer_windows)

    # -- parameters (docs/prefill-decode.md section 2) --------------------------------------------

    @property
    def params_attention_per_layer(self) -> int:
        """Attention weights of one layer.

        GQA (docs/prefill-decode.md section 2): q and o 2*H*(n_h*d) plus k and v 2*H*(n_kv*d). MLA
        (DeepSeek-V2 paper section 2.1; modeling_deepseek.py): q_a H*q_lora + q_b
        q_lora*n_h*(nope+rope) (or q H*n_h*(nope+rope) without q_lora_rank), kv_a
        H*(kv_lora+rope), kv_b kv_lora*n_h*(nope+v), o n_h*v*H.
        """
        h = self.hidden_size
        if self.mla is not None:
            m, n_h = self.mla, self.num_attention_heads
            qk = m.qk_nope_head_dim + m.qk_rope_head_dim
            q = h * m.q_lora_rank + m.q_lora_rank * n_h * qk if m.q_lora_rank else h * n_h * qk
            kv = h * (m.kv_lora_rank + m.qk_rope_head_dim) + m.kv_lora_rank * n_h * (m.qk_nope_head_dim + m.v_head_dim)
            return q + kv + n_h * m.v_head_dim * h
        d = self.head_dim
        return 2 * h * (self.num_attention_heads * d) + 2 * h * (self.num_key_value_heads * d)

    @property
    def params_mlp_per_layer(self) -> int:
        """Gated MLP (gate, up, down) of a dense layer: 3*H*F. docs/prefill-decode.md section 2."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def params_per_layer(self) -> int:
        """Attention plus dense-MLP parameters of one dense layer (norms ignored)."""
        return self.params_attention_per_layer + self.params_mlp_per_layer

    @property
    def params_expert(self) -> int:
        """One routed expert (gate, up, down): 3*H*F_e; 0 for a dense model."""
        return 0 if self.moe is None else 3 * self.hidden_size * self.moe.expert_intermediate_size

    @property
    def params_router(self) -> int:
        """Router of one MoE layer: H*E; 0 for a dense model."""
        return 0 if self.moe is None else self.hidden_size * self.moe.num_experts

    @property
    def params_shared_expert(self) -> int:
        """Shared-expert MLP of one MoE layer: 3*H*F_shared; 0 if none."""
        return 0 if self.moe is None else 3 * self.hidden_size * self.moe.shared_intermediate_size

    @property
    def params_moe_block(self) -> int:
        """MLP block of one MoE layer: router + shared expert + E routed experts."""
        if self.moe is None:
            return 0
        return self.params_router + self.params_shared_expert + self.moe.num_experts * self.params_expert

    @property
    def params_experts(self) -> int:
        """All routed-expert weights: MoE layers * E * 3*H*F_e."""
        return 0 if self.moe is None else self.num_moe_layers * self.moe.num_experts * self.params_expert

    @property
    def params_body(self) -> int:
        """Every decoder-layer weight: L * attention + dense layers * 3HF + MoE layers * MoE block."""
        return (
            self.num_hidden_layers * self.params_attention_per_layer
            + self.num_dense_layers * self.params_mlp_per_layer
            + self.num_moe_layers * self.params_moe_block
        )

    @property
    def params_body_active(self) -> int:
        """Decoder-layer weights one token uses: attention, dense MLPs, and per MoE layer the
        router, shared expert and top-k experts (= :attr:`params_body` for a dense model)."""
        if self.moe is None:
            return self.params_body
        active_block = self.params_router + self.params_shared_expert + self.moe.num_experts_per_tok * self.params_expert
        return (
            self.num_hidden_layers * self.params_attention_per_layer
            + self.num_dense_layers * self.params_mlp_per_layer
            + self.num_moe_layers * active_block
        )

    @property
    def params_embedding(self) -> int:
        """Embedding V*H, plus an LM head V*H unless tied. docs/prefill-decode.md section 2."""
        vh = self.vocab_size * self.hidden_size
        return vh if self.tie_word_embeddings else 2 * vh

    @property
    def params_lm_head(self) -> int:
        """Parameters used by the LM-head matmul (V*H, shared with the embedding if tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def params_total(self) -> int:
        """params_body + params_embedding: every stored weight (MTP layers excluded)."""
        return self.params_body + self.params_embedding

    @property
    def params_active_per_token(self) -> int:
        """Weights one token uses: attention, router, shared experts, top-k experts, dense
        MLPs and the LM head; not the embedding table (a lookup, not a matmul)."""
        return self.params_body_active + self.params_lm_head

    @property
    def params_mtp(self) -> int:
        """DeepSeek multi-token-prediction layers (``num_nextn_predict_layers``), not in
        :attr:`params_total`: each is one more decoder layer (a MoE layer when the model
        has experts) plus an ``eh_proj`` 2H*H; it shares the embedding and LM head
        (DeepSeek-V3 technical report section 2.2). Serving engines run it only for MTP
        speculative decoding, which this accounting does not model."""
        if not self.mtp_layers:
            return 0
        block = self.params_moe_block if self.moe is not None else self.params_mlp_per_layer
        return self.mtp_layers * (self.params_attention_per_layer + block + 2 * self.hidden_size * self.hidden_size)

    @property
    def kv_elements_per_token(self) -> int:
        """KV-cache elements per token over all layers: 2 * L * n_kv * d, or for MLA
        L * (kv_lora_rank + qk_rope_head_dim). Sliding layers hold at most the window."""
        if self.mla is not None:
            return self.num_hidden_layers * self.mla.kv_elements_per_token_per_layer
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim

    def weight_matrices(self) -> list[tuple[str, int, int, int]]:
        """Stored weight matrices as ``(name, out_features, in_features, count)``.

        The sum of ``out * in * count`` equals :attr:`params_total`. Used for int4 group
        accounting, where groups run along the input dimension of each matrix.
        """
        return [(m.role_name, m.out, m.inp, m.count * n) for m, n in _grouped_matrices(self, 1)]


# -- shipped configs and loading ------------------------------------------------------


def shipped_model_configs() -> tuple[str, ...]:
    """Names of the model configs shipped as package data (``diagnose/data/models/``),
    usable as ``--model-config NAME``."""
    root = resources.files("diagnose.data").joinpath("models")
    try:
        names = sorted(p.name[:-5] for p in root.iterdir() if p.name.endswith(".json"))
    except (FileNotFoundError, NotADirectoryError):
        return ()
    return tuple(names)


def read_model_config(path_or_name: str) -> tuple[dict[str, Any], str]:
    """The parsed ``config.json`` and a label, from a file path or a shipped config name.

    An existing file wins over a shipped name. The label is ``_name_or_path`` when set, else
    the folder of a ``config.json``, else the file stem.

    Raises:
        DiagnoseError: neither a readable file nor a shipped name, not JSON, not an object.
    """
    p = Path(path_or_name)
    if p.is_file():
        text = read_text_file(p, "model config")  # size bound, byte-order marks
        where = str(path_or_name)
        default_name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    else:
        key = str(path_or_name).strip().lower()
        key = key.removesuffix(".json")
        if key not in shipped_model_configs():
            if p.exists():
                raise DiagnoseError(f"cannot read model config {path_or_name}: not a file")
            raise DiagnoseError(
                f"model config not found: {path_or_name} (not a file, and not a shipped config: "
                f"{', '.join(shipped_model_configs())})"
            )
        text = resources.files("diagnose.data").joinpath("models", f"{key}.json").read_text(encoding="utf-8")
        where = f"shipped config {key}"
        default_name = key
    try:
        with parsing(f"model config {where}"):
            cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DiagnoseError(f"model config {where} is not JSON: {exc.msg} at line {exc.lineno}") from None
    if not isinstance(cfg, dict):
        raise DiagnoseError(f"model config {where} must be a JSON object")
    check_model_sizes(cfg, f"model config {where}")  # here too, to name the file
    name = cfg.get("_name_or_path") or default_name
    return cfg, str(name)


def load_model_config(path_or_name: str) -> ModelSpec:
    """Read a Hugging Face ``config.json`` (a file path, or the name of a shipped config such
    as ``gpt-oss-20b``; see :func:`shipped_model_configs`) and build a :class:`ModelSpec`.

    Raises:
        UnsupportedModelConfig: a key that changes bytes or FLOPs is not modelled.
        DiagnoseError: missing/unreadable file and no such shipped name, not JSON, or
            missing keys.
    """
    cfg, name = read_model_config(path_or_name)
    return ModelSpec.from_hf_config(cfg, name=name)


# -- per-rank weight layout (tensor parallelism) ----------------------------------------


@dataclass(frozen=True)
class _Mat:
    """One weight matrix on one tensor-parallel rank (``count`` copies: experts)."""

    role: str  # attention | mlp | shared_expert | expert | router | embedding | lm_head | tied
    role_name: str
    out: int
    inp: int
    count: int = 1
    names: tuple[str, ...] = ()


def _tp_shapes(spec: ModelSpec, tp: int) -> dict[str, int]:
    """Per-rank head counts and widths; raises when vLLM could not shard the model."""
    n_h, n_kv = spec.num_attention_heads, spec.num_key_value_heads
    if n_h % tp:
        raise DiagnoseError(f"--tp {tp}: num_attention_heads ({n_h}) is not divisible by {tp}")
    if spec.mla is None and n_kv % tp and tp % n_kv:
        raise DiagnoseError(f"--tp {tp}: num_key_value_heads ({n_kv}) and {tp} do not divide one another")
    widths = {"intermediate_size": spec.intermediate_size if spec.num_dense_layers else 0}
    if spec.moe is not None:
        widths["moe_intermediate_size"] = spec.moe.expert_intermediate_size
        widths["shared_expert_intermediate_size"] = spec.moe.shared_intermediate_size
    for key, w in widths.items():
        if w % tp:
            raise DiagnoseError(f"--tp {tp}: {key} ({w}) is not divisible by {tp}")
    return {
        "heads": n_h // tp,
        "kv_heads": max(1, n_kv // tp),  # vLLM replicates KV heads when tp > n_kv
        "f": spec.intermediate_size // tp,
        "fe": spec.moe.expert_intermediate_size // tp if spec.moe else 0,
        "fs": spec.moe.shared_intermediate_size // tp if spec.moe else 0,
        "vocab": -(-spec.vocab_size // tp),  # vocab-parallel; vLLM's padding to 64 ignored
    }


def _attention_mats(spec: ModelSpec, s: dict[str, int]) -> list[_Mat]:
    h, heads = spec.hidden_size, s["heads"]
    if spec.mla is not None:
        m = spec.mla
        qk = m.qk_nope_head_dim + m.qk_rope_head_dim
        mats = []
        if m.q_lora_rank:
            mats += [_Mat("attention", "q_a_proj", m.q_lora_rank, h),  # replicated (vLLM ReplicatedLinear)
                     _Mat("attention", "q_b_proj", heads * qk, m.q_lora_rank)]
        else:
            mats.append(_Mat("attention", "q_proj", heads * qk, h))
        return mats + [
            _Mat("attention", "kv_a_proj_with_mqa", m.kv_lora_rank + m.qk_rope_head_dim, h),  # replicated
            _Mat("attention", "kv_b_proj", heads * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
            _Mat("attention", "o_proj", h, heads * m.v_head_dim),
        ]
    d, kvh = spec.head_dim, s["kv_heads"]
    return [
        _Mat("attention", "q_proj", heads * d, h),
        _Mat("attention", "k_proj", kvh * d, h),
        _Mat("attention", "v_proj", kvh * d, h),
        _Mat("attention", "o_proj", h, heads * d),
    ]


@functools.lru_cache(maxsize=256)
def _grouped_matrices(spec: ModelSpec, tp: int) -> tuple[tuple[_Mat, int], ...]:
    """Distinct per-rank matrices and how many layers hold each (names not set)."""
    s = _tp_shapes(spec, tp)
    h = spec.hidden_size
    out: list[tuple[_Mat, int]] = []
    for m in _attention_mats(spec, s):
        out.append((m, spec.num_hidden_layers))
    if spec.num_dense_layers:
        f, n = s["f"], spec.num_dense_layers
        out += [(_Mat("mlp", "gate_proj", f, h), n), (_Mat("mlp", "up_proj", f, h), n), (_Mat("mlp", "down_proj", h, f), n)]
    if spec.moe is not None and spec.num_moe_layers:
        n, e, fe, fs = spec.num_moe_layers, spec.moe.num_experts, s["fe"], s["fs"]
        out.append((_Mat("router", "router", e, h), n))  # replicated
        if fs:
            out += [(_Mat("shared_expert", "shared_expert.gate_proj", fs, h), n),
                    (_Mat("shared_expert", "shared_expert.up_proj", fs, h), n),
                    (_Mat("shared_expert", "shared_expert.down_proj", h, fs), n)]
        out += [(_Mat("expert", "experts.gate_proj", fe, h, e), n),
                (_Mat("expert", "experts.up_proj", fe, h, e), n),
                (_Mat("expert", "experts.down_proj", h, fe, e), n)]
    if spec.tie_word_embeddings:
        out.append((_Mat("tied", "embed_tokens", s["vocab"], h), 1))
    else:
        out += [(_Mat("embedding", "embed_tokens", s["vocab"], h), 1), (_Mat("lm_head", "lm_head", s["vocab"], h), 1)]
    return tuple(out)


_MODULE_NAMES = {
    # Hugging Face module names of each matrix, across families (Llama/Qwen/DeepSeek
    # "mlp.experts.N.gate_proj", Mixtral "block_sparse_moe.experts.N.w1", gpt-oss
    # "mlp.experts.gate_up_proj"), for modules_to_not_convert.
    "gate_proj": ("mlp.gate_proj",), "up_proj": ("mlp.up_proj",), "down_proj": ("mlp.down_proj",),
    "router": ("mlp.gate", "mlp.router", "block_sparse_moe.gate"),
    "shared_expert.gate_proj": ("mlp.shared_experts.gate_proj", "mlp.shared_expert.gate_proj"),
    "shared_expert.up_proj": ("mlp.shared_experts.up_proj", "mlp.shared_expert.up_proj"),
    "shared_expert.down_proj": ("mlp.shared_experts.down_proj", "mlp.shared_expert.down_proj"),
    "experts.gate_proj": ("mlp.experts.0.gate_proj", "block_sparse_moe.experts.0.w1", "mlp.experts.gate_up_proj"),
    "experts.up_proj": ("mlp.experts.0.up_proj", "block_sparse_moe.experts.0.w3", "mlp.experts.gate_up_proj"),
    "experts.down_proj": ("mlp.experts.0.down_proj", "block_sparse_moe.experts.0.w2", "mlp.experts.down_proj"),
}


def _layer_names(role_name: str, role: str, layer: int) -> tuple[str, ...]:
    if role in ("embedding", "tied"):
        return ("model.embed_tokens",)
    if role == "lm_head":
        return ("lm_head",)
    if role == "attention":
        return (f"model.layers.{layer}.self_attn.{role_name}",)
    return tuple(f"model.layers.{layer}.{n}" for n in _MODULE_NAMES[role_name])


def _matrix_bits(m: _Mat, quant: QuantSpec | None, override: str | None, layers: list[int]) -> Fraction:
    """Storage bits of ``m`` over ``layers`` (one entry per layer holding it)."""
    n = m.out * m.inp * m.count
    if override is not None:
        bits = Fraction(DTYPE_BITS[override] * n)
        if override == "int4":  # one fp16 scale per INT4_GROUP_SIZE input weights
            bits += m.out * math.ceil(m.inp / INT4_GROUP_SIZE) * m.count * 8 * INT4_SCALE_BYTES
        return bits * len(layers)
    plain = Fraction(UNQUANTIZED_BITS * n) * len(layers)
    if quant is None or m.role in ("router", "embedding", "tied"):
        # Routers stay 16 bit (vLLM builds them with quant_config=None); embeddings are lookups.
        return plain
    if m.role == "lm_head" and not quant.lm_head:
        return plain
    if quant.experts_only and m.role != "expert":
        return plain
    per = quant.bits * n
    if quant.group_size:
        g = m.inp if quant.group_size == -1 else quant.group_size
        per += m.out * math.ceil(m.inp / g) * m.count * quant.group_bits
    total = Fraction(0)
    for layer in layers:
        names = _layer_names(m.role_name, m.role, layer)
        total += Fraction(UNQUANTIZED_BITS * n) if quant.skip and _module_excluded(names, quant.skip) else per
    return total


@dataclass(frozen=True)
class ModelWeights:
    """Weight storage of one tensor-parallel rank, split the way a decode step reads it.

    Attributes:
        tp: tensor-parallel size (1: the whole model).
        weight_format: how weights are stored, e.g. "bf16" or "mxfp4 (4.25 bit) on routed
            experts; bf16 elsewhere".
        params: parameters stored on one rank.
        bytes: bytes stored on one rank, every weight.
        non_expert_bytes: attention, dense MLPs, shared experts, routers, embedding and LM
            head on one rank (read once per step).
        embedding_bytes: the untied embedding table on one rank (part of non_expert_bytes;
            0 when tied: the tied table is counted in lm_head_bytes).
        lm_head_bytes: the LM head (or tied table) on one rank (part of non_expert_bytes).
        expert_bytes: one routed expert of one layer on one rank (gate, up, down: 3 * H *
            F_e / tp weights), float; 0.0 for a dense model.
        num_experts: E (0 for dense).
        num_experts_per_tok: k (0 for dense).
        moe_layers: layers with routed experts.
        flop_params_per_token: parameters one token multiplies on one rank, embedding table
            included (the decode convention 2 * P per token, docs/prefill-decode.md section 2; =
            params_total for a dense model at tp 1).
        body_active_params: decoder-layer parameters one token uses on one rank.
        lm_head_params: LM-head parameters on one rank.
    """

    tp: int
    weight_format: str
    params: int
    bytes: int
    non_expert_bytes: int
    embedding_bytes: int
    lm_head_bytes: int
    expert_bytes: float
    num_experts: int
    num_experts_per_tok: int
    moe_layers: int
    flop_params_per_token: int
    body_active_params: int
    lm_head_params: int

    def expert_read_bytes(self, experts_touched_per_layer: float) -> int:
        """Bytes of routed experts read when ``experts_touched_per_layer`` of E are touched in
        each MoE layer: moe_layers * touched * expert_bytes, rounded to whole bytes."""
        return round(self.moe_layers * experts_touched_per_layer * self.expert_bytes)


def _format_label(spec: ModelSpec, override: str | None) -> str:
    if override is not None:
        return override
    q = spec.quantization
    if q is None:
        return "bf16"
    where = "routed experts" if q.experts_only else "linear weights"
    head = "" if q.experts_only else (" (LM head too)" if q.lm_head else "; embedding and LM head bf16")
    return f"{q.label} on {where}{head}; routers and unconverted modules bf16"


@functools.lru_cache(maxsize=256)
def _model_weights(spec: ModelSpec, override: str | None, tp: int) -> ModelWeights:
    quant = None if override is not None else spec.quantization
    moe_idx = [i for i, is_moe in enumerate(spec.moe.moe_layers) if is_moe] if spec.moe else []
    dense_idx = [i for i in range(spec.num_hidden_layers) if not (spec.moe and spec.moe.moe_layers[i])]
    all_idx = list(range(spec.num_hidden_layers))
    non_expert = Fraction(0)
    expert_all = Fraction(0)
    emb = head = Fraction(0)
    params = 0
    flop_params = 0
    body_active = 0
    lm_params = 0
    top_k = spec.moe.num_experts_per_tok if spec.moe else 0
    for m, nlayers in _grouped_matrices(spec, tp):
        if m.role == "attention":
            layers = all_idx
        elif m.role == "mlp":
            layers = dense_idx
        elif m.role in ("router", "shared_expert", "expert"):
            layers = moe_idx
        else:
            layers = [-1]
        assert len(layers) == nlayers
        bits = _matrix_bits(m, quant, override, layers)
        count = m.out * m.inp * m.count * nlayers
        params += count
        if m.role == "expert":
            expert_all += bits
            active = m.out * m.inp * top_k * nlayers
            flop_params += active
            body_active += active
            continue
        non_expert += bits
        flop_params += count
        if m.role in ("attention", "mlp", "router", "shared_expert"):
            body_active += count
        if m.role == "embedding":
            emb += bits
        elif m.role in ("lm_head", "tied"):
            head += bits
            lm_params += count
    n_moe = len(moe_idx)
    e = spec.moe.num_experts if spec.moe else 0
    one_expert = float(expert_all / 8 / (n_moe * e)) if n_moe and e else 0.0
    return ModelWeights(
        tp=tp,
        weight_format=_format_label(spec, override),
        params=params,
        bytes=math.ceil((non_expert + expert_all) / 8),
        non_expert_bytes=math.ceil(non_expert / 8),
        embedding_bytes=math.ceil(emb / 8),
        lm_head_bytes=math.ceil(head / 8),
        expert_bytes=one_expert,
        num_experts=e,
        num_experts_per_tok=top_k,
        moe_layers=n_moe,
        flop_params_per_token=flop_params,
        body_active_params=body_active,
        lm_head_params=lm_params,
    )


def model_weights(spec: ModelSpec, weight_dtype: str | None = None, tp: int = 1) -> ModelWeights:
    """Weight storage of one tensor-parallel rank (see :class:`ModelWeights`).

    ``weight_dtype`` None: the config's ``quantization_config`` (:class:`QuantSpec`; quantized
    linear weights at its bits per weight, routers, embeddings, the LM head and modules in
    ``modules_to_not_convert`` at 16 bit), else 16 bit. A dtype name (:data:`DTYPE_BITS`)
    overrides it for every weight, embedding and LM head included (``int4`` adds one fp16
    scale per 128 input weights), as ``--weight-dtype`` does.

    Sharding (vLLM ``ColumnParallelLinear`` / ``RowParallelLinear`` /
    ``VocabParallelEmbedding`` / ``FusedMoE``): q, o, MLP and shared-expert widths and each
    expert's width split ``tp`` ways; KV heads per rank max(1, n_kv / tp) (replicated when
    tp > n_kv); embedding and LM head vocab-parallel (ceil(V / tp) rows; padding ignored);
    routers and MLA's q_a/kv_a down-projections replicated; norms not counted.

    Raises:
        DiagnoseError: unknown dtype, bad ``tp``, or a width not divisible by ``tp``.
    """
    tp = _check_tp(tp)
    override = None if weight_dtype is None else _check_dtype(weight_dtype)
    return _model_weights(spec, override, tp)


# -- weights (dense convention, whole model) -------------------------------------------


@dataclass(frozen=True)
class WeightBytes:
    """Weight storage, split into quantized values and quantization scales.

    Attributes:
        dtype: storage dtype of the values.
        params: number of parameters stored.
        values_bytes: bytes of the values (params * bits / 8).
        scales_bytes: bytes of group scales (int4 only; 0 otherwise).
        group_size: int4 group size (None for other dtypes).
        total_bytes: values_bytes + scales_bytes.
    """

    dtype: str
    params: int
    values_bytes: int
    scales_bytes: int
    group_size: int | None
    total_bytes: int

    @property
    def total_gb(self) -> float:
        """total_bytes in GB (1e9)."""
        return self.total_bytes / GB


def weight_bytes_breakdown(
    spec: ModelSpec, dtype: str = "bf16", group_size: int = INT4_GROUP_SIZE
) -> WeightBytes:
    """Bytes needed to store every weight of ``spec`` in ``dtype``, with a breakdown.

    ``fp32``/``fp16``/``bf16``/``fp8``/``int8``: params * bytes per element; per-channel
    scales of fp8/int8 schemes are negligible and not counted. ``int4``: 4 bits per value
    plus one fp16 scale (2 bytes) per ``group_size`` consecutive input weights of each
    matrix (GPTQ/AWQ style), i.e. ``out * ceil(in / group_size)`` scales per matrix;
    zero-points are not counted. All matrices, embedding and LM head included, are
    quantized alike (a simplification: some toolkits keep the LM head in 16 bit). The
    config's ``quantization_config`` is not used here (see :func:`model_weights`).

    Args:
        spec: the model.
        dtype: one of :data:`DTYPE_BITS`.
        group_size: int4 group size (default 128); ignored for other dtypes.

    Returns:
        The breakdown; ``total_bytes`` is what :func:`weight_bytes` returns.

    Raises:
        DiagnoseError: unknown dtype or non-positive group size.
    """
    dtype = _check_dtype(dtype)
    params = spec.params_total
    bits = DTYPE_BITS[dtype]
    values = math.ceil(params * bits / 8)
    scales = 0
    group: int | None = None
    if dtype == "int4":
        if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size <= 0:
            raise DiagnoseError(f"int4 group size must be a positive integer, got {group_size!r}")
        group = group_size
        n_groups = sum(out * math.ceil(inp / group) * n for _, out, inp, n in spec.weight_matrices())
        scales = n_groups * INT4_SCALE_BYTES
    return WeightBytes(dtype, params, values, scales, group, values + scales)


def weight_bytes(spec: ModelSpec, dtype: str | None = "bf16", group_size: int = INT4_GROUP_SIZE) -> int:
    """Total weight bytes of ``spec`` (docs/prefill-decode.md section 2).

    ``dtype`` a dtype name: every weight in it (``int4`` includes one fp16 scale per
    ``group_size`` input weights; see :func:`weight_bytes_breakdown`). ``dtype`` None: the
    config's own storage (:func:`model_weights` at tp 1). Reference config in bf16:
    13,438,550,016 B (13.44 GB).

    Raises:
        DiagnoseError: unknown dtype.
    """
    if dtype is None:
        return model_weights(spec, None, 1).bytes
    return weight_bytes_breakdown(spec, dtype, group_size).total_bytes


# -- KV cache -----------------------------------------------------------------------


def kv_bytes_per_token_from_shape(
    num_hidden_layers: int, num_key_value_heads: int, head_dim: int, kv_dtype: str = "fp16"
) -> int:
    """KV bytes per token = 2 (K and V) * L * n_kv * d * bytes per element.

    docs/prefill-decode.md section 2. ``int8``/``fp8`` = 1 byte, ``int4`` = half a byte (rounded up to
    whole bytes for the total); KV quantization scales are not counted.

    Raises:
        DiagnoseError: unknown dtype or non-positive shape.
    """
    kv_dtype = _check_dtype(kv_dtype, "KV dtype")
    for value, key in (
        (num_hidden_layers, "num_hidden_layers"),
        (num_key_value_heads, "num_key_value_heads"),
        (head_dim, "head_dim"),
    ):
        _positive_int(value, key)
    elems = 2 * num_hidden_layers * num_key_value_heads * head_dim
    return math.ceil(elems * DTYPE_BITS[kv_dtype] / 8)


def _kv_dtype(spec: ModelSpec, kv_dtype: str | None, default: str = "fp16") -> str:
    if kv_dtype is None:
        q = spec.quantization
        return q.kv_dtype if q is not None and q.kv_dtype else default
    return _check_dtype(kv_dtype, "KV dtype")


@dataclass(frozen=True)
class KvLayout:
    """KV-cache elements per token on one tensor-parallel rank, by attention window.

    Attributes:
        full_elements_per_token: elements per token summed over full-attention layers
            (2 * n_kv_per_rank * d per GQA layer; kv_lora_rank + qk_rope_head_dim per MLA layer).
        sliding: ``(window, elements per token summed over the layers with that window)``,
            ascending by window; () when no layer slides.
    """

    full_elements_per_token: int
    sliding: tuple[tuple[int, int], ...] = ()

    @property
    def elements_per_token(self) -> int:
        """Elements one token occupies over all layers (sliding layers included)."""
        return self.full_elements_per_token + sum(e for _, e in self.sliding)

    def sequence_elements(self, context: float) -> float:
        """Elements one sequence of ``context`` tokens holds (or a decode step reads for it):
        full layers every token, sliding layers min(context, window)."""
        return self.full_elements_per_token * context + sum(e * min(context, w) for w, e in self.sliding)


@functools.lru_cache(maxsize=256)
def _kv_layout(spec: ModelSpec, tp: int) -> KvLayout:
    if spec.mla is not None:
        per_layer = spec.mla.kv_elements_per_token_per_layer  # the latent, replicated on every rank
    else:
        per_layer = 2 * _tp_shapes(spec, tp)["kv_heads"] * spec.head_dim
    elems: dict[int | None, int] = {}
    for w in spec.layer_windows or (None,) * spec.num_hidden_layers:
        elems[w] = elems.get(w, 0) + per_layer
    full = elems.pop(None, 0)
    return KvLayout(full, tuple(sorted((w, e) for w, e in elems.items())))  # type: ignore[misc]


def kv_layout(spec: ModelSpec, tp: int = 1) -> KvLayout:
    """KV-cache elements per token on one rank, split by attention window (:class:`KvLayout`).

    GQA layers cache K and V: 2 * n_kv * d elements per token (docs/prefill-decode.md section 2), with
    max(1, n_kv / tp) heads per rank (vLLM replicates KV heads when tp > n_kv). MLA layers
    cache the latent kv_lora_rank + qk_rope_head_dim, replicated on every rank (vLLM MLA).

    Raises:
        DiagnoseError: bad ``tp`` or heads not divisible by it.
    """
    return _kv_layout(spec, _check_tp(tp))


@functools.lru_cache(maxsize=256)
def _kv_groups(spec: ModelSpec, kv_dtype: str, tp: int) -> tuple[int, tuple[tuple[int, int], ...]]:
    """(full-attention KV bytes per token, ((window, KV bytes per token of the layers with
    that window), ...)) on one rank."""
    lay = _kv_layout(spec, tp)
    bits = DTYPE_BITS[kv_dtype]
    return math.ceil(lay.full_elements_per_token * bits / 8), tuple((w, math.ceil(e * bits / 8)) for w, e in lay.sliding)


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str | None = "fp16", *, tp: int = 1) -> int:
    """KV-cache bytes one token occupies over all layers on one rank (docs/prefill-decode.md section 2).

    ``2 * L * n_kv * d * bytes_per_elem``; reference config in fp16: 131,072 B = 128 KiB.
    MLA caches ``kv_lora_rank + qk_rope_head_dim`` elements per layer (replicated on every
    rank); with ``tp`` > 1, KV heads per rank are max(1, n_kv / tp). Sliding-window layers
    hold this per token only up to their window (see :func:`kv_read_bytes`). ``kv_dtype``
    None: the config's KV scheme, else fp16.

    Raises:
        DiagnoseError: unknown dtype or bad ``tp``.
    """
    kvd = _kv_dtype(spec, kv_dtype)
    tp = _check_tp(tp)
    if tp == 1 and spec.mla is None:
        return kv_bytes_per_token_from_shape(spec.num_hidden_layers, spec.num_key_value_heads, spec.head_dim, kvd)
    full, sliding = _kv_groups(spec, kvd, tp)
    return full + sum(b for _, b in sliding)


def kv_read_bytes(spec: ModelSpec, batch: int, context: float, kv_dtype: str | None = "fp16", *, tp: int = 1) -> float:
    """KV bytes a decode step reads for ``batch`` sequences of ``context`` cached tokens each.

    Full-attention layers read ``batch * context`` tokens; a sliding-window layer reads
    ``batch * min(context, window)`` (it holds no more: Mistral/gpt-oss/Qwen2 sliding
    attention). Exact integer when ``context`` is an integer.

    Raises:
        DiagnoseError: unknown dtype or bad ``tp``.
    """
    kvd = _kv_dtype(spec, kv_dtype)
    full, sliding = _kv_groups(spec, kvd, _check_tp(tp))
    total = batch * context * full
    for w, b in sliding:
        total += batch * min(context, w) * b
    return total


def kv_sequence_bytes(spec: ModelSpec, seq_len: int, kv_dtype: str | None = "fp16", *, tp: int = 1) -> int:
    """KV bytes one sequence of ``seq_len`` tokens holds on one rank: full layers keep every
    token, sliding-window layers min(seq_len, window) (vLLM frees blocks outside the window).

    Raises:
        DiagnoseError: unknown dtype or bad ``tp``.
    """
    return int(kv_read_bytes(spec, 1, _positive_arg(seq_len, "sequence length"), kv_dtype, tp=tp))


# -- mixture of experts ---------------------------------------------------------------


def experts_touched(num_experts: int, top_k: int, tokens: float) -> float:
    """Expected distinct experts a MoE layer runs for ``tokens`` tokens.

    ``E * (1 - (1 - k/E) ** T)``: each token picks k of E experts uniformly and
    independently of the other tokens, so one expert is missed by all T tokens with
    probability (1 - k/E) ** T. Uniform independent routing maximises the experts touched:
    skewed real routing (popular experts, correlated tokens) touches fewer, so expert bytes
    from this figure are an upper estimate. Mixtral, E = 8, k = 2: T = 1 -> 2, T = 8 ->
    7.199, T = 64 -> 8.000.

    Raises:
        DiagnoseError: k outside 1..E or negative tokens.
    """
    if not 1 <= top_k <= num_experts:
        raise DiagnoseError(f"top-k ({top_k}) must be between 1 and the number of experts ({num_experts})")
    if tokens < 0:
        raise DiagnoseError(f"tokens must be >= 0, got {tokens!r}")
    return num_experts * (1.0 - (1.0 - top_k / num_experts) ** tokens)


# -- prefill ------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillFlops:
    """FLOPs of one prefill forward pass over ``batch`` prompts of ``prompt_len`` tokens.

    Conventions (docs/prefill-decode.md section 2): one multiply-add = 2 FLOPs. ``causal`` counts half
    the S x S attention work (what FlashAttention-style kernels do); ``full`` counts all of
    it (what the article's 2.2 TFLOP at S=2048 uses). ``flops_2p_total`` is the article's
    shortcut 2 * P * B * S with P the parameters one token multiplies, embedding included
    (= params_total for a dense model), kept for comparison only (it also counts the
    embedding lookup as a matmul and ignores attention). All per tensor-parallel rank.

    Attributes:
        prompt_len: S, tokens per prompt.
        batch: B, prompts.
        lm_head: "all" (logits for every position) or "last" (one per sequence).
        flops_linear: 2 * params_body_active * B * S (MoE: top-k experts).
        flops_lm_head: 2 * H * V per position whose logits are computed.
        flops_attention_full: sum over layers of B * 2 * n_h * (d_qk + d_v) * S * min(S, W)
            (= L * B * 2 * (2 * n_h * d * S^2) without windows).
        flops_attention_causal: half the full layers' pairs (S^2 / 2); a sliding layer's
            W * S - W^2 / 2 when S > W.
        flops_total_causal: linear + LM head + causal attention.
        flops_total_full: linear + LM head + full attention.
        flops_2p_total: 2 * P * B * S (article shortcut).
    """

    prompt_len: int
    batch: int
    lm_head: str
    flops_linear: int
    flops_lm_head: int
    flops_attention_full: int
    flops_attention_causal: int
    flops_total_causal: int
    flops_total_full: int
    flops_2p_total: int

    @property
    def attention_share_causal(self) -> float:
        """Causal attention FLOPs / flops_total_causal."""
        return self.flops_attention_causal / self.flops_total_causal

    @property
    def attention_share_full(self) -> float:
        """Full attention FLOPs / flops_total_full."""
        return self.flops_attention_full / self.flops_total_full


def _positive_arg(value: Any, what: str, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value == 0 and not allow_zero):
        kind = "a non-negative" if allow_zero else "a positive"
        raise DiagnoseError(f"{what} must be {kind} integer, got {value!r}")
    return value


def _attn_flops_per_pair(spec: ModelSpec, tp: int) -> int:
    """FLOPs of one (query, key) pair in one layer on one rank: 2 * heads * (d_qk + d_v)
    (QK^T and PV; 4 * n_h * d for GQA). MLA counts the per-head form (qk_nope + qk_rope,
    v_head_dim), not the weight-absorbed form vLLM uses in decode."""
    heads = spec.num_attention_heads // tp
    if spec.mla is not None:
        m = spec.mla
        return 2 * heads * (m.qk_nope_head_dim + m.qk_rope_head_dim + m.v_head_dim)
    return 4 * heads * spec.head_dim


def prefill_flops(
    spec: ModelSpec,
    prompt_len: int,
    batch: int = 1,
    lm_head: Literal["all", "last"] = "all",
    *,
    tp: int = 1,
) -> PrefillFlops:
    """FLOPs of a prefill pass on one tensor-parallel rank, by term and under both
    attention conventions.

    docs/prefill-decode.md section 2: linear layers ``2 * P_body * B*S`` (MoE: the parameters a token
    uses, top-k experts); LM head ``2*H*V`` per position whose logits are computed
    (``"all"``: every one of the S positions, as a naive Hugging Face forward does;
    ``"last"``: one per sequence, as serving engines do); attention scores plus weighted
    sum ``2 * (2 * n_h * d * S^2)`` per layer per sequence with full masking, half of that
    with causal masking. A sliding-window layer (window W < S) has S * W pairs full and
    W * S - W^2 / 2 causal (the continuous form of sum_i min(i, W), matching S^2 / 2).

    Reference config at S=8192, B=1: full attention 35,184,372,088,832 FLOPs (35.2 TFLOP),
    causal 17,592,186,044,416 (17.6 TFLOP).

    Args:
        spec: the model.
        prompt_len: S, tokens per prompt (> 0).
        batch: B, prompts (> 0).
        lm_head: "all" or "last".
        tp: tensor-parallel size (per-rank FLOPs).

    Returns:
        The per-term FLOPs.

    Raises:
        DiagnoseError: non-positive lengths, unknown ``lm_head`` or bad ``tp``.
    """
    s = _positive_arg(prompt_len, "prompt length")
    b = _positive_arg(batch, "batch")
    if lm_head not in ("all", "last"):
        raise DiagnoseError(f"lm_head must be 'all' or 'last', got {lm_head!r}")
    w = model_weights(spec, "bf16", tp)
    linear = 2 * w.body_active_params * b * s
    positions = b * s if lm_head == "all" else b
    head = 2 * w.lm_head_params * positions
    coef = b * _attn_flops_per_pair(spec, tp)
    full = causal = 0
    windows = spec.layer_windows or (None,) * spec.num_hidden_layers
    n_full = sum(x is None for x in windows)
    full += n_full * coef * s * s
    causal += n_full * coef * s * s // 2
    for win in windows:
        if win is None:
            continue
        if s <= win:
            full += coef * s * s
            causal += coef * s * s // 2
        else:
            full += coef * s * win
            causal += coef * (2 * win * s - win * win) // 2
    return PrefillFlops(
        prompt_len=s,
        batch=b,
        lm_head=lm_head,
        flops_linear=linear,
        flops_lm_head=head,
        flops_attention_full=full,
        flops_attention_causal=causal,
        flops_total_causal=linear + head + causal,
        flops_total_full=linear + head + full,
        flops_2p_total=2 * w.flop_params_per_token * b * s,
    )


def _weights_read(w: ModelWeights, tokens: int) -> tuple[int, int, float | None]:
    """(non-expert bytes, expert bytes, experts touched per layer) read for ``tokens``."""
    if not w.moe_layers:
        return w.non_expert_bytes, 0, None
    touched = experts_touched(w.num_experts, w.num_experts_per_tok, tokens)
    return w.non_expert_bytes, w.expert_read_bytes(touched), touched


def prefill_bytes(
    spec: ModelSpec,
    prompt_len: int,
    batch: int = 1,
    weight_dtype: str | None = None,
    kv_dtype: str | None = None,
    *,
    tp: int = 1,
) -> int:
    """Device-memory bytes a prefill pass must move at least, on one rank: weights read once
    (MoE: the experts B * S tokens touch, :func:`experts_touched`) plus the KV cache written
    once (``B * S * kv_bytes_per_token``); activations are not counted. Used for prefill
    arithmetic intensity (docs/prefill-decode.md section 3). ``weight_dtype``/``kv_dtype`` None: the
    config's storage (16 bit when unquantized)."""
    s = _positive_arg(prompt_len, "prompt length")
    b = _positive_arg(batch, "batch")
    w = model_weights(spec, weight_dtype, tp)
    non_expert, expert, _ = _weights_read(w, b * s)
    return non_expert + expert + b * s * kv_bytes_per_token(spec, _kv_dtype(spec, kv_dtype), tp=tp)


# -- decode -------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeStep:
    """Bytes and FLOPs of one decode step (one new token for each of ``batch`` sequences),
    on one tensor-parallel rank.

    Attributes:
        batch: B, sequences decoded together.
        context: tokens already in each sequence's KV cache.
        weight_dtype: how weights are stored (a dtype, or the config's quantization).
        kv_dtype: storage dtype of the KV cache.
        tp: tensor-parallel size.
        weight_bytes: weights read this step: every non-expert weight once plus the
            experts touched (= all weights for a dense model).
        expert_read_bytes: the routed-expert part of weight_bytes: MoE layers *
            experts_touched_per_layer * one expert's bytes (0 for dense).
        experts_touched_per_layer: E * (1 - (1 - k/E)^B), or None for a dense model.
        kv_read_bytes: B * context * KV bytes per token (sliding layers: min(context, W)).
        bytes_per_step: weight_bytes + kv_read_bytes (docs/prefill-decode.md section 3).
        flops_matmul: 2 * P * B, P the parameters a token multiplies on this rank
            (docs/prefill-decode.md section 2, "~= 2 * P"; counts the embedding lookup like the article,
            a 2*V*H per token over-count; MoE: top-k experts).
        flops_attention: 2 * n_h * (d_qk + d_v) per key read, summed over layers
            (4 * n_h * d * context * L * B without windows).
        flops_per_step: flops_matmul + flops_attention.
        arithmetic_intensity: flops_per_step / bytes_per_step, FLOP/B.
    """

    batch: int
    context: int
    weight_dtype: str
    kv_dtype: str
    weight_bytes: int
    kv_read_bytes: int
    bytes_per_step: int
    flops_matmul: int
    flops_attention: int
    flops_per_step: int
    arithmetic_intensity: float
    tp: int = 1
    expert_read_bytes: int = 0
    experts_touched_per_layer: float | None = None

    def step_s(self, bandwidth_tbps: float) -> float:
        """Lower bound of the step time in seconds at ``bandwidth_tbps`` (TB/s = 1e12 B/s)."""
        return decode_step_bound_s(self.bytes_per_step, bandwidth_tbps)

    def tokens_per_s(self, bandwidth_tbps: float) -> float:
        """Upper bound of decode throughput, tokens/s: batch / step_s."""
        return self.batch / self.step_s(bandwidth_tbps)


def _attention_keys_flops(spec: ModelSpec, tp: int, batch: int, context: float) -> float:
    """Decode attention FLOPs for ``batch`` queries over ``context`` keys each (windows capped)."""
    per_pair = _attn_flops_per_pair(spec, tp)
    windows = spec.layer_windows or (None,) * spec.num_hidden_layers
    keys = sum(batch * context if w is None else batch * min(context, w) for w in windows)
    return per_pair * keys


def decode_step(
    spec: ModelSpec,
    batch: int,
    context: int,
    weight_dtype: str | None = None,
    kv_dtype: str | None = None,
    *,
    tp: int = 1,
) -> DecodeStep:
    """Bytes moved and FLOPs done by one decode step on one rank (docs/prefill-decode.md sections 2, 3).

    ``bytes_per_step = weights read + batch * context * kv_bytes_per_token``, where weights
    read = every non-expert weight once (embedding table and LM head included, the article's
    convention) + per MoE layer ``E_touched * expert bytes`` with ``E_touched = E * (1 - (1 -
    k/E)^B)`` (uniform independent routing: an upper estimate, :func:`experts_touched`);
    sliding-window layers read min(context, window) tokens per sequence.
    ``flops_per_step = 2 * P * batch + attention``. Reference config, bf16, ctx 2048, B=1:
    13,706,985,472 B (13.71 GB).

    Args:
        spec: the model.
        batch: B (> 0).
        context: tokens in each sequence's cache (>= 0; 0 gives the weights-only bound).
        weight_dtype: dtype of every weight, or None for the config's quantization (16 bit
            when the config has none).
        kv_dtype: dtype of the KV cache, or None for the config's (fp16 when none).
        tp: tensor-parallel size (per-rank bytes and FLOPs).

    Raises:
        DiagnoseError: bad batch/context/tp or unknown dtype.
    """
    b = _positive_arg(batch, "batch")
    ctx = _positive_arg(context, "context", allow_zero=True)
    kvd = _kv_dtype(spec, kv_dtype)
    w = model_weights(spec, weight_dtype, tp)
    non_expert, expert, touched = _weights_read(w, b)
    weights = non_expert + expert
    kv = int(kv_read_bytes(spec, b, ctx, kvd, tp=tp))
    total = weights + kv
    matmul = 2 * w.flop_params_per_token * b
    attn = int(_attention_keys_flops(spec, tp, b, ctx))
    flops = matmul + attn
    return DecodeStep(
        batch=b,
        context=ctx,
        weight_dtype=w.weight_format if weight_dtype is None else weight_dtype.lower(),
        kv_dtype=kvd,
        weight_bytes=weights,
        kv_read_bytes=kv,
        bytes_per_step=total,
        flops_matmul=matmul,
        flops_attention=attn,
        flops_per_step=flops,
        arithmetic_intensity=flops / total,
        tp=tp,
        expert_read_bytes=expert,
        experts_touched_per_layer=touched,
    )


# -- one engine step, for the analysis ------------------------------------------------


@dataclass(frozen=True)
class StepCost:
    """Analytic FLOPs and bytes of one engine step, on one tensor-parallel rank.

    Attributes:
        phase: "prefill" | "decode" | "mixed".
        flops: FLOPs of the step, or None when the step's shape is unknown.
        bytes: device-memory bytes of the step (weights read + KV read/written), or None.
        weight_bytes: non-expert weights read (all weights for a dense model), bytes.
        expert_bytes: routed-expert weights read (experts touched), bytes; 0 for dense.
        kv_bytes: KV cache read and written, bytes; None when unknown.
        experts_touched_per_layer: expected experts touched per MoE layer, or None.
        assumptions: the modelling assumptions behind these numbers, one sentence each.
    """

    phase: str
    flops: float | None
    bytes: float | None
    weight_bytes: float
    expert_bytes: float
    kv_bytes: float | None
    experts_touched_per_layer: float | None
    assumptions: tuple[str, ...] = field(default_factory=tuple)


def _notes(spec: ModelSpec, w: ModelWeights, tokens: int | None, touched: float | None) -> list[str]:
    notes = []
    if w.weight_format != "bf16":
        notes.append(f"weights: {w.weight_format}")
    if w.tp > 1:
        notes.append(
            f"tensor parallel {w.tp}: per-rank bytes and FLOPs, sharded as vLLM does (attention, MLP and expert "
            "widths split, KV heads max(1, n_kv / tp), vocab-parallel embedding and LM head, routers replicated)"
        )
    if touched is not None and tokens is not None:
        notes.append(
            f"MoE: {touched:.2f} of {w.num_experts} experts touched per layer by {tokens} tokens "
            f"(E * (1 - (1 - k/E)^T), k = {w.num_experts_per_tok}): uniform, independent routing, which "
            "maximises the experts touched; skewed real routing reads fewer expert bytes"
        )
    if spec.mtp_layers:
        notes.append(
            f"num_nextn_predict_layers = {spec.mtp_layers}: the multi-token-prediction layer(s) "
            f"({spec.params_mtp:,} params) are not counted (run only for MTP speculative decoding)"
        )
    return notes


def step_cost(
    spec: ModelSpec,
    phase: str,
    *,
    batch: int | None = None,
    tokens: int | None = None,
    kv_tokens: int | None = None,
    weight_dtype: str | None = None,
    kv_dtype: str | None = None,
    tp: int = 1,
    lm_head: Literal["all", "last"] = "last",
) -> StepCost:
    """Analytic FLOPs and bytes of one engine step from the model config, on one rank.

    * ``decode`` (needs ``batch``): FLOPs ``2 * P * batch`` (P: parameters a token
      multiplies, :attr:`ModelWeights.flop_params_per_token`) plus, when ``kv_tokens`` is
      known, attention over ``kv_tokens`` keys; bytes (None without ``kv_tokens``) = weights
      read (experts touched by ``batch`` tokens) + ``kv_tokens`` * KV bytes per token.
    * ``prefill`` (needs ``batch`` and ``tokens``): FLOPs ``prefill_flops(spec, max(1,
      tokens // batch), batch, lm_head).flops_total_causal``; bytes = weights read (experts
      touched by ``tokens``) + ``tokens`` * KV bytes per token written.
    * ``mixed`` (needs ``tokens``): FLOPs ``2 * P * tokens``; bytes = weights read (experts
      touched by all ``tokens``) + (``tokens`` + ``kv_tokens``) * KV bytes per token.

    Sliding-window layers read min(context, window) tokens per sequence; with only
    ``kv_tokens`` summed over a batch, the per-sequence context is taken as the mean
    ``kv_tokens / batch`` (stated in ``assumptions``; unequal contexts make this an
    over-count). For a dense unquantized model at tp 1 this is exactly the dense formula of
    docs/prefill-decode.md sections 2-3 (weights + KV, ``2 * params_total`` per token).

    Args:
        spec: the model.
        phase: "prefill", "decode" or "mixed" (other phases give None numbers).
        batch: sequences in the step.
        tokens: new tokens in the step (prefill, mixed).
        kv_tokens: cached tokens read, summed over the batch (decode, mixed).
        weight_dtype: dtype of every weight, or None for the config's quantization.
        kv_dtype: KV-cache dtype, or None for the config's (bf16 when none).
        tp: tensor-parallel size.
        lm_head: prefill logits for "all" positions or the "last" one per sequence.

    Returns:
        The step's cost; ``flops``/``bytes`` None where the shape is unknown.

    Raises:
        DiagnoseError: unknown dtype, bad ``tp`` or a width not divisible by it.
    """
    w = model_weights(spec, weight_dtype, tp)
    kvd = _kv_dtype(spec, kv_dtype, default="bf16")
    kvb = kv_bytes_per_token(spec, kvd, tp=tp)
    full, sliding = _kv_groups(spec, kvd, tp)

    def none() -> StepCost:
        return StepCost(phase, None, None, float(w.non_expert_bytes), 0.0, None, None, tuple(_notes(spec, w, None, None)))

    def read_kv(n_seq: int | None, kv: int) -> tuple[float | int, list[str]]:
        """KV bytes read for ``kv`` cached tokens over ``n_seq`` sequences (int when exact)."""
        total: float | int = kv * full
        if not sliding:
            return total, []
        if n_seq:
            mean = kv / n_seq
            for win, b in sliding:
                total += n_seq * min(mean, win) * b
            note = (
                f"sliding-window layers ({spec.num_sliding_layers} of {spec.num_hidden_layers}): per-sequence context "
                f"taken as the mean kv_tokens / batch = {mean:,.1f} tokens (unequal contexts make the sliding KV read "
                "an over-count)"
            )
            return total, [note]
        for _, b in sliding:
            total += kv * b
        return total, ["sliding-window layers: batch unknown, so their KV read is not capped at the window (an over-count)"]

    if phase == "decode":
        if not batch:
            return none()
        non_expert, expert, touched = _weights_read(w, batch)
        notes = _notes(spec, w, batch, touched)
        matmul = 2 * w.flop_params_per_token * batch
        if not kv_tokens:
            return StepCost(phase, float(matmul), None, float(non_expert), float(expert), None, touched, tuple(notes))
        # int arithmetic where exact, one float conversion at the end (dense: the docs/prefill-decode.md numbers)
        if spec.layer_windows:
            flops: float | int = matmul + _attention_keys_flops(spec, tp, batch, kv_tokens / batch)
        else:
            flops = matmul + _attn_flops_per_pair(spec, tp) * kv_tokens * spec.num_hidden_layers
        kv_read, more = read_kv(batch, kv_tokens)
        return StepCost(phase, float(flops), float(non_expert + expert + kv_read), float(non_expert), float(expert),
                        float(kv_read), touched, tuple(notes + more))
    if phase == "prefill":
        if not batch or not tokens:
            return none()
        seq = max(1, tokens // batch)
        pf = prefill_flops(spec, seq, batch, lm_head=lm_head, tp=tp)
        non_expert, expert, touched = _weights_read(w, tokens)
        kv = tokens * kvb
        return StepCost(phase, float(pf.flops_total_causal), float(non_expert + expert + kv), float(non_expert),
                        float(expert), float(kv), touched, tuple(_notes(spec, w, tokens, touched)))
    if phase == "mixed" and tokens:
        non_expert, expert, touched = _weights_read(w, tokens)
        kv_read, more = read_kv(batch, kv_tokens or 0)
        kv = tokens * kvb + kv_read
        return StepCost(phase, float(2 * w.flop_params_per_token * tokens), float(non_expert + expert + kv),
                        float(non_expert), float(expert), float(kv), touched, tuple(_notes(spec, w, tokens, touched) + more))
    return none()


# -- bounds (docs/prefill-decode.md section 3) ---------------------------------------------------


def _positive_float(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise DiagnoseError(f"{what} must be a positive number, got {value!r}")
    return float(value)


def decode_step_bound_s(bytes_per_step: int | float, bandwidth_tbps: float) -> float:
    """Decode step lower bound in seconds = bytes per step / bandwidth (docs/prefill-decode.md section 3).

    Args:
        bytes_per_step: bytes read from device memory per step.
        bandwidth_tbps: peak memory bandwidth in TB/s (1e12 B/s).

    Raises:
        DiagnoseError: non-positive bandwidth.
    """
    return bytes_per_step / (_positive_float(bandwidth_tbps, "bandwidth (TB/s)") * 1e12)


def prefill_bound_s(flops: int | float, peak_tflops: float) -> float:
    """Prefill lower bound in seconds = FLOPs / peak FLOP/s (docs/prefill-decode.md section 3).

    Args:
        flops: FLOPs of the pass.
        peak_tflops: peak compute in TFLOP/s (1e12 FLOP/s).

    Raises:
        DiagnoseError: non-positive peak.
    """
    return flops / (_positive_float(peak_tflops, "peak compute (TFLOP/s)") * 1e12)


def ridge_point_flop_per_byte(peak_tflops: float, bandwidth_tbps: float) -> float:
    """Ridge point = peak FLOP/s / peak B/s, in FLOP/B (docs/prefill-decode.md section 3).

    300 TFLOP/s and 2 TB/s give 150 FLOP/B: below it a kernel is memory-bound.

    Raises:
        DiagnoseError: non-positive argument.
    """
    return _positive_float(peak_tflops, "peak compute (TFLOP/s)") / _positive_float(
        bandwidth_tbps, "bandwidth (TB/s)"
    )


# -- KV capacity (docs/prefill-decode.md section 3, "KV capacity") -------------------------------


@dataclass(frozen=True)
class KvBudget:
    """KV-cache footprint of a batch and, when memory is known, the concurrency ceiling.

    Attributes:
        kv_bytes_per_token: bytes one token occupies over all layers.
        seq_len: tokens per sequence (prompt + output).
        batch: sequences.
        kv_bytes_per_sequence: seq_len * kv_bytes_per_token (less for sliding-window
            layers, which hold at most their window).
        kv_bytes_total: batch * kv_bytes_per_sequence.
        memory_gb: device memory in GB (1e9), or None.
        overhead_gb: runtime overhead in GB (activations, CUDA context, allocator slack).
        weight_bytes: weights resident on the device.
        kv_memory_bytes: memory left for the KV cache, or None when memory is unknown.
        max_sequences: floor(kv_memory_bytes / kv_bytes_per_sequence), or None.
        usable_sequences: floor(max_sequences * fragmentation_factor), or None.
        fragmentation_factor: share of the ceiling usable after fragmentation.
        fits: batch <= max_sequences, or None when memory is unknown.
    """

    kv_bytes_per_token: int
    seq_len: int
    batch: int
    kv_bytes_per_sequence: int
    kv_bytes_total: int
    memory_gb: float | None
    overhead_gb: float
    weight_bytes: int
    kv_memory_bytes: int | None
    max_sequences: int | None
    usable_sequences: int | None
    fragmentation_factor: float
    fits: bool | None

    @property
    def kv_gib_per_sequence(self) -> float:
        """kv_bytes_per_sequence in GiB (2**30)."""
        return self.kv_bytes_per_sequence / GiB

    @property
    def kv_gib_total(self) -> float:
        """kv_bytes_total in GiB (2**30)."""
        return self.kv_bytes_total / GiB

    @property
    def kv_memory_gib(self) -> float | None:
        """kv_memory_bytes in GiB (2**30), or None."""
        return None if self.kv_memory_bytes is None else self.kv_memory_bytes / GiB


def kv_budget(
    kv_bytes_per_token: int,
    seq_len: int,
    batch: int = 1,
    *,
    memory_gb: float | None = None,
    overhead_gb: float = 0.0,
    weight_bytes: int = 0,
    kv_memory_bytes: int | None = None,
    fragmentation_factor: float = FRAGMENTATION_FACTOR,
    kv_bytes_per_sequence: int | None = None,
) -> KvBudget:
    """KV-cache footprint and concurrency ceiling (docs/prefill-decode.md sections 2 and 3).

    Memory for the KV cache is ``kv_memory_bytes`` when given, else
    ``memory_gb * 1e9 - overhead_gb * 1e9 - weight_bytes`` when ``memory_gb`` is given
    (GB = 1e9 throughout; pass GiB figures through ``kv_memory_bytes``). Then
    ``max_sequences = floor(kv_memory_bytes / (seq_len * kv_bytes_per_token))`` and
    ``usable_sequences = floor(max_sequences * fragmentation_factor)``.

    The default factor 0.75 reproduces docs/prefill-decode.md section 3 for the reference config with
    60 GiB of KV memory: 2k -> 240 (180 usable), 8k -> 60 (45), 32k -> 15 (11, the article
    says ~10), 128k -> 3 (2). No single factor gives both 240 -> 180 and 15 -> 10; 0.75 is
    the one the article's own 240 -> 180 and 60 -> 45 state. Note that 80 GB - 13.44 GB of
    weights - 5 GB overhead is 61.56 GB = 57.3 GiB, which the article rounds to "~60 GiB".

    Args:
        kv_bytes_per_token: bytes per token over all layers (:func:`kv_bytes_per_token`).
        seq_len: tokens per sequence (> 0).
        batch: sequences (> 0).
        memory_gb: device memory in GB (1e9 bytes), optional.
        overhead_gb: non-KV, non-weight memory in GB (1e9 bytes).
        weight_bytes: resident weight bytes.
        kv_memory_bytes: memory for KV directly, overriding the memory arithmetic.
        fragmentation_factor: in (0, 1].
        kv_bytes_per_sequence: bytes one sequence holds, when not seq_len *
            kv_bytes_per_token (sliding-window layers: :func:`kv_sequence_bytes`).

    Returns:
        The budget; ceiling fields are None when no memory figure is given.

    Raises:
        DiagnoseError: bad sizes, or weights plus overhead exceed the memory.
    """
    per_token = _positive_arg(kv_bytes_per_token, "KV bytes per token")
    s = _positive_arg(seq_len, "sequence length")
    b = _positive_arg(batch, "batch")
    if not 0 < fragmentation_factor <= 1:
        raise DiagnoseError(f"fragmentation factor must be in (0, 1], got {fragmentation_factor!r}")
    if overhead_gb < 0 or weight_bytes < 0:
        raise DiagnoseError("overhead and weight sizes must not be negative")
    per_seq = s * per_token if kv_bytes_per_sequence is None else _positive_arg(kv_bytes_per_sequence, "KV bytes per sequence")
    kv_mem: int | None = None
    if kv_memory_bytes is not None:
        kv_mem = int(kv_memory_bytes)
    elif memory_gb is not None:
        _positive_float(memory_gb, "memory (GB)")
        kv_mem = round(memory_gb * GB) - round(overhead_gb * GB) - int(weight_bytes)
    max_seq = usable = fits = None
    if kv_mem is not None:
        if kv_mem <= 0:
            raise DiagnoseError(
                f"no memory left for the KV cache: {memory_gb} GB minus {overhead_gb} GB "
                f"overhead minus {weight_bytes / GB:.2f} GB of weights is not positive"
            )
        max_seq = kv_mem // per_seq
        usable = math.floor(max_seq * fragmentation_factor)
        fits = b <= max_seq
    return KvBudget(
        kv_bytes_per_token=per_token,
        seq_len=s,
        batch=b,
        kv_bytes_per_sequence=per_seq,
        kv_bytes_total=b * per_seq,
        memory_gb=memory_gb,
        overhead_gb=overhead_gb,
        weight_bytes=int(weight_bytes),
        kv_memory_bytes=kv_mem,
        max_sequences=max_seq,
        usable_sequences=usable,
        fragmentation_factor=fragmentation_factor,
        fits=fits,
    )
