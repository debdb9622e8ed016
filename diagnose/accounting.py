"""Model accounting: parameters, weight bytes, KV-cache bytes, FLOPs and analytic bounds.

Everything here is pure arithmetic on a decoder-only (GQA) transformer described by a
Hugging Face ``config.json``. Formulas follow ``domain.md`` (the project's restatement of
the prefill/decode article):

* section 2 (model accounting): parameters, KV bytes per token, prefill FLOPs;
* section 3 (arithmetic intensity and bounds): ridge point, decode/prefill lower bounds;
* section 3, "KV capacity" paragraph: concurrency ceiling on a card.

Units are fixed and named in every field: bytes are exact integers (``*_bytes``),
``GB`` = 1e9 bytes, ``GiB`` = 2**30 bytes, ``TB/s`` = 1e12 B/s, ``TFLOP/s`` = 1e12 FLOP/s.
The two gigabyte units are never mixed in one number.

Scope and stated simplifications:

* Dense decoder-only models with a gated MLP (gate, up, down). Mixture-of-experts, sliding
  window and multi-latent attention are not modelled.
* Norm weights and biases are ignored (domain.md section 2: "negligible").
* Activations are not counted as memory traffic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal, Mapping

from diagnose.errors import DiagnoseError

#: Bytes in one GB (decimal) and one GiB (binary). domain.md "Units".
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
#: 0.75 reproduces domain.md section 3 exactly for 240 -> 180 and 60 -> 45; with
#: ``floor`` it gives 15 -> 11 and 3 -> 2 where the article says "~10" and "~2".
FRAGMENTATION_FACTOR = 0.75

_REQUIRED_KEYS = (
    "num_hidden_layers",
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "vocab_size",
)


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


@dataclass(frozen=True)
class ModelSpec:
    """Shape of a dense decoder-only transformer, in Hugging Face ``config.json`` names.

    Attributes:
        num_hidden_layers: L, number of decoder layers.
        hidden_size: H, model width.
        num_attention_heads: n_h, query heads.
        num_key_value_heads: n_kv, key/value heads (n_h for MHA, 1 for MQA, else GQA).
        head_dim: d, width of one head.
        intermediate_size: F, gated-MLP inner width.
        vocab_size: V.
        tie_word_embeddings: whether the LM head shares the embedding matrix.
        name: label for reports (``_name_or_path`` or ``model_type`` when present).
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

    @classmethod
    def from_hf_config(cls, cfg: Mapping[str, Any], name: str | None = None) -> "ModelSpec":
        """Build a spec from a Hugging Face ``config.json`` dict.

        Defaults (domain.md section 2): ``num_key_value_heads`` = ``num_attention_heads``
        (MHA) when absent or null; ``head_dim`` = ``hidden_size // num_attention_heads``
        when absent or null; ``tie_word_embeddings`` = False. When a top-level key is
        missing and the config has a nested ``text_config`` (multimodal wrappers), the
        nested values are used, falling back to the top level key by key.

        Args:
            cfg: the parsed ``config.json``.
            name: label; defaults to ``_name_or_path``, then ``model_type``, then "model".

        Returns:
            The spec.

        Raises:
            DiagnoseError: a required key is missing or not a positive integer (one-line
                message naming the key), or the config is not a JSON object.
        """
        if not isinstance(cfg, Mapping):
            raise DiagnoseError("model config must be a JSON object")
        src: Mapping[str, Any] = cfg
        text = cfg.get("text_config")
        if isinstance(text, Mapping) and any(k not in cfg for k in _REQUIRED_KEYS):
            src = {**cfg, **text}
        for key in _REQUIRED_KEYS:
            if src.get(key) is None:
                raise DiagnoseError(f"model config is missing required key {key!r}")
        n_h = _positive_int(src["num_attention_heads"], "num_attention_heads")
        hidden = _positive_int(src["hidden_size"], "hidden_size")
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
        label = name or src.get("_name_or_path") or src.get("model_type") or "model"
        return cls(
            num_hidden_layers=_positive_int(src["num_hidden_layers"], "num_hidden_layers"),
            hidden_size=hidden,
            num_attention_heads=n_h,
            num_key_value_heads=n_kv,
            head_dim=_positive_int(head_dim, "head_dim"),
            intermediate_size=_positive_int(src["intermediate_size"], "intermediate_size"),
            vocab_size=_positive_int(src["vocab_size"], "vocab_size"),
            tie_word_embeddings=bool(src.get("tie_word_embeddings", False)),
            name=str(label),
        )

    # -- parameters (domain.md section 2) --------------------------------------------

    @property
    def params_attention_per_layer(self) -> int:
        """q and o projections 2*H*(n_h*d) plus k and v 2*H*(n_kv*d). domain.md section 2."""
        h, d = self.hidden_size, self.head_dim
        return 2 * h * (self.num_attention_heads * d) + 2 * h * (self.num_key_value_heads * d)

    @property
    def params_mlp_per_layer(self) -> int:
        """Gated MLP (gate, up, down): 3*H*F. domain.md section 2."""
        return 3 * self.hidden_size * self.intermediate_size

    @property
    def params_per_layer(self) -> int:
        """Attention plus MLP parameters of one layer (norms ignored)."""
        return self.params_attention_per_layer + self.params_mlp_per_layer

    @property
    def params_body(self) -> int:
        """L * params_per_layer: every parameter that takes part in a matmul per token."""
        return self.num_hidden_layers * self.params_per_layer

    @property
    def params_embedding(self) -> int:
        """Embedding V*H, plus an LM head V*H unless tied. domain.md section 2."""
        vh = self.vocab_size * self.hidden_size
        return vh if self.tie_word_embeddings else 2 * vh

    @property
    def params_lm_head(self) -> int:
        """Parameters used by the LM-head matmul (V*H, shared with the embedding if tied)."""
        return self.vocab_size * self.hidden_size

    @property
    def params_total(self) -> int:
        """params_body + params_embedding (stored parameters)."""
        return self.params_body + self.params_embedding

    @property
    def kv_elements_per_token(self) -> int:
        """K and V elements cached per token over all layers: 2 * L * n_kv * d."""
        return 2 * self.num_hidden_layers * self.num_key_value_heads * self.head_dim

    def weight_matrices(self) -> list[tuple[str, int, int, int]]:
        """Stored weight matrices as ``(name, out_features, in_features, count)``.

        The sum of ``out * in * count`` equals :attr:`params_total`. Used for int4 group
        accounting, where groups run along the input dimension of each matrix.
        """
        h, d, f = self.hidden_size, self.head_dim, self.intermediate_size
        n_h, n_kv, layers = self.num_attention_heads, self.num_key_value_heads, self.num_hidden_layers
        mats = [
            ("q_proj", n_h * d, h, layers),
            ("k_proj", n_kv * d, h, layers),
            ("v_proj", n_kv * d, h, layers),
            ("o_proj", h, n_h * d, layers),
            ("gate_proj", f, h, layers),
            ("up_proj", f, h, layers),
            ("down_proj", h, f, layers),
            ("embed_tokens", self.vocab_size, h, 1),
        ]
        if not self.tie_word_embeddings:
            mats.append(("lm_head", self.vocab_size, h, 1))
        return mats


# -- weights ------------------------------------------------------------------------


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
    quantized alike (a simplification: some toolkits keep the LM head in 16 bit).

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


def weight_bytes(spec: ModelSpec, dtype: str = "bf16", group_size: int = INT4_GROUP_SIZE) -> int:
    """Total weight bytes of ``spec`` stored in ``dtype`` (domain.md section 2).

    ``int4`` includes one fp16 scale per ``group_size`` (default 128) input weights; see
    :func:`weight_bytes_breakdown` for the split. Reference config in bf16:
    13,438,550,016 B (13.44 GB).

    Raises:
        DiagnoseError: unknown dtype.
    """
    return weight_bytes_breakdown(spec, dtype, group_size).total_bytes


# -- KV cache -----------------------------------------------------------------------


def kv_bytes_per_token_from_shape(
    num_hidden_layers: int, num_key_value_heads: int, head_dim: int, kv_dtype: str = "fp16"
) -> int:
    """KV bytes per token = 2 (K and V) * L * n_kv * d * bytes per element.

    domain.md section 2. ``int8``/``fp8`` = 1 byte, ``int4`` = half a byte (rounded up to
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


def kv_bytes_per_token(spec: ModelSpec, kv_dtype: str = "fp16") -> int:
    """KV-cache bytes one token occupies over all layers (domain.md section 2).

    ``2 * L * n_kv * d * bytes_per_elem``; reference config in fp16: 131,072 B = 128 KiB.
    """
    return kv_bytes_per_token_from_shape(
        spec.num_hidden_layers, spec.num_key_value_heads, spec.head_dim, kv_dtype
    )


# -- prefill ------------------------------------------------------------------------


@dataclass(frozen=True)
class PrefillFlops:
    """FLOPs of one prefill forward pass over ``batch`` prompts of ``prompt_len`` tokens.

    Conventions (domain.md section 2): one multiply-add = 2 FLOPs. ``causal`` counts half
    the S x S attention work (what FlashAttention-style kernels do); ``full`` counts all of
    it (what the article's 2.2 TFLOP at S=2048 uses). ``flops_2p_total`` is the article's
    shortcut 2 * params_total * B * S, kept for comparison only (it also counts the
    embedding lookup as a matmul and ignores attention).

    Attributes:
        prompt_len: S, tokens per prompt.
        batch: B, prompts.
        lm_head: "all" (logits for every position) or "last" (one per sequence).
        flops_linear: 2 * params_body * B * S.
        flops_lm_head: 2 * H * V per position whose logits are computed.
        flops_attention_full: L * B * 2 * (2 * n_h * d * S^2).
        flops_attention_causal: flops_attention_full / 2.
        flops_total_causal: linear + LM head + causal attention.
        flops_total_full: linear + LM head + full attention.
        flops_2p_total: 2 * params_total * B * S (article shortcut).
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


def prefill_flops(
    spec: ModelSpec,
    prompt_len: int,
    batch: int = 1,
    lm_head: Literal["all", "last"] = "all",
) -> PrefillFlops:
    """FLOPs of a prefill pass, by term and under both attention conventions.

    domain.md section 2: linear layers ``2 * P_body * B*S``; LM head ``2*H*V`` per position
    whose logits are computed (``"all"``: every one of the S positions, as a naive Hugging
    Face forward does; ``"last"``: one per sequence, as serving engines do); attention
    scores plus weighted sum ``2 * (2 * n_h * d * S^2)`` per layer per sequence with full
    masking, half of that with causal masking.

    Reference config at S=8192, B=1: full attention 35,184,372,088,832 FLOPs (35.2 TFLOP),
    causal 17,592,186,044,416 (17.6 TFLOP).

    Args:
        spec: the model.
        prompt_len: S, tokens per prompt (> 0).
        batch: B, prompts (> 0).
        lm_head: "all" or "last".

    Returns:
        The per-term FLOPs.

    Raises:
        DiagnoseError: non-positive lengths or unknown ``lm_head``.
    """
    s = _positive_arg(prompt_len, "prompt length")
    b = _positive_arg(batch, "batch")
    if lm_head not in ("all", "last"):
        raise DiagnoseError(f"lm_head must be 'all' or 'last', got {lm_head!r}")
    linear = 2 * spec.params_body * b * s
    positions = b * s if lm_head == "all" else b
    head = 2 * spec.hidden_size * spec.vocab_size * positions
    full = spec.num_hidden_layers * b * 2 * (2 * spec.num_attention_heads * spec.head_dim * s * s)
    causal = full // 2
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
        flops_2p_total=2 * spec.params_total * b * s,
    )


def prefill_bytes(
    spec: ModelSpec,
    prompt_len: int,
    batch: int = 1,
    weight_dtype: str = "bf16",
    kv_dtype: str = "fp16",
) -> int:
    """Device-memory bytes a prefill pass must move at least: weights read once plus the KV
    cache written once (``weight_bytes + B * S * kv_bytes_per_token``); activations are
    not counted. Used for prefill arithmetic intensity (domain.md section 3)."""
    s = _positive_arg(prompt_len, "prompt length")
    b = _positive_arg(batch, "batch")
    return weight_bytes(spec, weight_dtype) + b * s * kv_bytes_per_token(spec, kv_dtype)


# -- decode -------------------------------------------------------------------------


@dataclass(frozen=True)
class DecodeStep:
    """Bytes and FLOPs of one decode step (one new token for each of ``batch`` sequences).

    Attributes:
        batch: B, sequences decoded together.
        context: tokens already in each sequence's KV cache.
        weight_dtype: storage dtype of weights.
        kv_dtype: storage dtype of the KV cache.
        weight_bytes: all weights, read once per step.
        kv_read_bytes: B * context * kv_bytes_per_token.
        bytes_per_step: weight_bytes + kv_read_bytes (domain.md section 3).
        flops_matmul: 2 * params_total * B (domain.md section 2, "~= 2 * P"; counts the
            embedding lookup like the article, a 2*V*H per token over-count).
        flops_attention: 4 * n_h * d * context * L * B (QK^T and PV over the context).
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

    def step_s(self, bandwidth_tbps: float) -> float:
        """Lower bound of the step time in seconds at ``bandwidth_tbps`` (TB/s = 1e12 B/s)."""
        return decode_step_bound_s(self.bytes_per_step, bandwidth_tbps)

    def tokens_per_s(self, bandwidth_tbps: float) -> float:
        """Upper bound of decode throughput, tokens/s: batch / step_s."""
        return self.batch / self.step_s(bandwidth_tbps)


def decode_step(
    spec: ModelSpec,
    batch: int,
    context: int,
    weight_dtype: str = "bf16",
    kv_dtype: str = "fp16",
) -> DecodeStep:
    """Bytes moved and FLOPs done by one decode step (domain.md sections 2 and 3).

    ``bytes_per_step = weight_bytes + batch * context * kv_bytes_per_token``;
    ``flops_per_step = 2 * params_total * batch + 4 * n_h * d * context * L * batch``.
    Reference config, bf16, ctx 2048, B=1: 13,706,985,472 B (13.71 GB).

    Args:
        spec: the model.
        batch: B (> 0).
        context: tokens in each sequence's cache (>= 0; 0 gives the weights-only bound).
        weight_dtype: dtype of the weights.
        kv_dtype: dtype of the KV cache.

    Raises:
        DiagnoseError: bad batch/context or unknown dtype.
    """
    b = _positive_arg(batch, "batch")
    ctx = _positive_arg(context, "context", allow_zero=True)
    w = weight_bytes(spec, weight_dtype)
    kv = b * ctx * kv_bytes_per_token(spec, kv_dtype)
    total = w + kv
    matmul = 2 * spec.params_total * b
    attn = 4 * spec.num_attention_heads * spec.head_dim * ctx * spec.num_hidden_layers * b
    flops = matmul + attn
    return DecodeStep(
        batch=b,
        context=ctx,
        weight_dtype=weight_dtype.lower(),
        kv_dtype=kv_dtype.lower(),
        weight_bytes=w,
        kv_read_bytes=kv,
        bytes_per_step=total,
        flops_matmul=matmul,
        flops_attention=attn,
        flops_per_step=flops,
        arithmetic_intensity=flops / total,
    )


# -- bounds (domain.md section 3) ---------------------------------------------------


def _positive_float(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise DiagnoseError(f"{what} must be a positive number, got {value!r}")
    return float(value)


def decode_step_bound_s(bytes_per_step: int | float, bandwidth_tbps: float) -> float:
    """Decode step lower bound in seconds = bytes per step / bandwidth (domain.md section 3).

    Args:
        bytes_per_step: bytes read from device memory per step.
        bandwidth_tbps: peak memory bandwidth in TB/s (1e12 B/s).

    Raises:
        DiagnoseError: non-positive bandwidth.
    """
    return bytes_per_step / (_positive_float(bandwidth_tbps, "bandwidth (TB/s)") * 1e12)


def prefill_bound_s(flops: int | float, peak_tflops: float) -> float:
    """Prefill lower bound in seconds = FLOPs / peak FLOP/s (domain.md section 3).

    Args:
        flops: FLOPs of the pass.
        peak_tflops: peak compute in TFLOP/s (1e12 FLOP/s).

    Raises:
        DiagnoseError: non-positive peak.
    """
    return flops / (_positive_float(peak_tflops, "peak compute (TFLOP/s)") * 1e12)


def ridge_point_flop_per_byte(peak_tflops: float, bandwidth_tbps: float) -> float:
    """Ridge point = peak FLOP/s / peak B/s, in FLOP/B (domain.md section 3).

    300 TFLOP/s and 2 TB/s give 150 FLOP/B: below it a kernel is memory-bound.

    Raises:
        DiagnoseError: non-positive argument.
    """
    return _positive_float(peak_tflops, "peak compute (TFLOP/s)") / _positive_float(
        bandwidth_tbps, "bandwidth (TB/s)"
    )


# -- KV capacity (domain.md section 3, "KV capacity") -------------------------------


@dataclass(frozen=True)
class KvBudget:
    """KV-cache footprint of a batch and, when memory is known, the concurrency ceiling.

    Attributes:
        kv_bytes_per_token: bytes one token occupies over all layers.
        seq_len: tokens per sequence (prompt + output).
        batch: sequences.
        kv_bytes_per_sequence: seq_len * kv_bytes_per_token.
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
) -> KvBudget:
    """KV-cache footprint and concurrency ceiling (domain.md sections 2 and 3).

    Memory for the KV cache is ``kv_memory_bytes`` when given, else
    ``memory_gb * 1e9 - overhead_gb * 1e9 - weight_bytes`` when ``memory_gb`` is given
    (GB = 1e9 throughout; pass GiB figures through ``kv_memory_bytes``). Then
    ``max_sequences = floor(kv_memory_bytes / (seq_len * kv_bytes_per_token))`` and
    ``usable_sequences = floor(max_sequences * fragmentation_factor)``.

    The default factor 0.75 reproduces domain.md section 3 for the reference config with
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
    per_seq = s * per_token
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
