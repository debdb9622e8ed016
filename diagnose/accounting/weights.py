"""Weight bytes per tensor-parallel rank: the per-rank matrices of a model (sharded as vLLM
shards them), their bits under quantization, and :func:`model_weights`."""
from __future__ import annotations

import functools
import math
from fractions import Fraction

import msgspec

from diagnose.errors import DiagnoseError
from diagnose.accounting.units import DTYPE_BITS, GB, INT4_GROUP_SIZE, INT4_SCALE_BYTES, UNQUANTIZED_BITS, _check_dtype, _check_tp
from diagnose.accounting.quant import QuantSpec, _module_excluded
from diagnose.accounting.spec import ModelSpec


class _Mat(msgspec.Struct, frozen=True):
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


def weight_matrices(spec: ModelSpec) -> list[tuple[str, int, int, int]]:
    """Stored weight matrices as ``(name, out_features, in_features, count)``.

    The sum of ``out * in * count`` equals :attr:`ModelSpec.params_total`. Used for int4 group
    accounting, where groups run along the input dimension of each matrix.
    """
    return [(m.role_name, m.out, m.inp, m.count * n) for m, n in _grouped_matrices(spec, 1)]


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


class ModelWeights(msgspec.Struct, frozen=True):
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
        expert_active_params: the routed-expert part of body_active_params (k experts per
            MoE layer; 0 for dense).
        expert_params: one routed expert of one layer on one rank (gate, up and down: 3 * H
            * F_e / tp for a gated expert); 0 for dense.
        hidden_size: H (the width of one embedding row).
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
    expert_active_params: int = 0
    expert_params: int = 0
    hidden_size: int = 0

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
    expert_active = 0
    expert_one = 0
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
            expert_active += active
            expert_one += m.out * m.inp
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
        expert_active_params=expert_active,
        expert_params=expert_one,
        hidden_size=spec.hidden_size,
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




class WeightBytes(msgspec.Struct, frozen=True):
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
        n_groups = sum(out * math.ceil(inp / group) * n for _, out, inp, n in weight_matrices(spec))
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
