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

The package, by job: :mod:`~diagnose.accounting.units` (GB/GiB, dtype widths),
:mod:`~diagnose.accounting.spec` (:class:`ModelSpec` from a config, shipped configs),
:mod:`~diagnose.accounting.quant` (``quantization_config``), :mod:`~diagnose.accounting.weights`
(weight bytes per rank), :mod:`~diagnose.accounting.kv` (KV bytes, the KV budget) and
:mod:`~diagnose.accounting.cost` (FLOPs and bytes of a step, bounds). Every public name is
importable from ``diagnose.accounting``.
"""
from __future__ import annotations

from diagnose.accounting.units import (  # noqa: F401
    GB,
    GiB,
    MiB,
    KiB,
    DTYPE_BITS,
    DTYPE_BYTES,
    INT4_GROUP_SIZE,
    INT4_SCALE_BYTES,
    FRAGMENTATION_FACTOR,
    UNQUANTIZED_BITS,
    UnsupportedModelConfig,
)
from diagnose.accounting.quant import (  # noqa: F401
    QuantSpec,
)
from diagnose.accounting.spec import (  # noqa: F401
    UNSUPPORTED_KEYS,
    MoeSpec,
    MlaSpec,
    ModelSpec,
    shipped_model_configs,
    read_model_config,
    load_model_config,
)
from diagnose.accounting.weights import (  # noqa: F401
    weight_matrices,
    ModelWeights,
    model_weights,
    WeightBytes,
    weight_bytes_breakdown,
    weight_bytes,
)
from diagnose.accounting.kv import (  # noqa: F401
    KvPlan,
    kv_plan,
    kv_bytes_per_token_from_shape,
    KvLayout,
    kv_layout,
    kv_bytes_per_token,
    kv_read_bytes,
    kv_sequence_bytes,
    KvBudget,
    kv_budget,
)
from diagnose.accounting.cost import (  # noqa: F401
    experts_touched,
    PrefillFlops,
    prefill_flops,
    prefill_bytes,
    DecodeStep,
    decode_step,
    CostTerm,
    SeqSums,
    StepCost,
    step_cost,
    decode_step_bound_s,
    prefill_bound_s,
    ridge_point_flop_per_byte,
)
from diagnose.accounting.bounds import bounds_table, default_kv_dtype  # noqa: F401  (after cost: it uses the roofline)

__all__ = [
    "bounds_table",
    "default_kv_dtype",
    "KvPlan",
    "kv_plan",
    "GB",
    "GiB",
    "MiB",
    "KiB",
    "DTYPE_BITS",
    "DTYPE_BYTES",
    "INT4_GROUP_SIZE",
    "INT4_SCALE_BYTES",
    "FRAGMENTATION_FACTOR",
    "UNQUANTIZED_BITS",
    "UnsupportedModelConfig",
    "QuantSpec",
    "UNSUPPORTED_KEYS",
    "MoeSpec",
    "MlaSpec",
    "ModelSpec",
    "shipped_model_configs",
    "read_model_config",
    "load_model_config",
    "weight_matrices",
    "ModelWeights",
    "model_weights",
    "WeightBytes",
    "weight_bytes_breakdown",
    "weight_bytes",
    "kv_bytes_per_token_from_shape",
    "KvLayout",
    "kv_layout",
    "kv_bytes_per_token",
    "kv_read_bytes",
    "kv_sequence_bytes",
    "KvBudget",
    "kv_budget",
    "experts_touched",
    "PrefillFlops",
    "prefill_flops",
    "prefill_bytes",
    "DecodeStep",
    "decode_step",
    "CostTerm",
    "SeqSums",
    "StepCost",
    "step_cost",
    "decode_step_bound_s",
    "prefill_bound_s",
    "ridge_point_flop_per_byte",
]
