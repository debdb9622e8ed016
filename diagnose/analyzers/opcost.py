"""FLOPs and bytes of one framework operator from its recorded shapes (``Input Dims``).

Conventions (units in the names: FLOP counts 2 per multiply-add, bytes are bytes of device
memory moved, one pass over every operand; caches and re-reads are ignored):

* **GEMM** (``aten::mm/addmm/bmm/baddbmm/addbmm/matmul/linear/_scaled_mm``, vLLM's
  ``rocm_unquantized_gemm``): ``2*M*K*N`` times the broadcast batch (TraceLens GEMM perf
  model; PyTorch ``torch.utils.flop_counter``: ``mm_flop = 2*m*k*n``). Bytes
  ``(M*K + K*N + M*N) * bytes_per_element`` (+ bias), each operand with its own ``Input
  type``; the output takes the first operand's type (TraceLens ``GEMM.bytes``).
* **Attention** (FlashAttention paper, Dao et al. 2022, section 3.1 / appendix: forward FLOPs
  ``4 * B * H * Sq * Sk * D`` = ``QK^T`` plus ``PV``, 2 FLOP per multiply-add):
  ``4 * H * D * pairs`` where ``pairs`` counts the (query, key) pairs computed.

  - full mask: ``pairs = sum(Sq * Sk)``; this is today's SDPA count (``attainment.op_flops``)
    and is kept as the default when the causal flag is not visible (an upper bound);
  - causal (docs/prefill-decode.md section 2, the convention of this project): ``pairs = sum(Sq * Sk -
    Sq**2 / 2)`` per sequence, i.e. ``S**2 / 2`` for a prompt without cached prefix (the
    ``S / 2`` diagonal is ignored: 0.05 % at S = 1,024) and ``Sk - 1/2`` for one decode token.
  - varlen / paged ops (``aiter::mha_batch_prefill``, ``flash_attn`` varlen,
    ``aten::_flash_attention_forward`` with packed ``[total_tokens, heads, dim]`` inputs,
    vLLM ``unified_attention``) carry only the *total* query tokens in their shapes. The
    per-sequence sums come from a :class:`SeqInfo` the caller passes (vLLM-style step marker
    ``execute_T_context_N(sq..sk..sqsq..sqsk..)_generation_M(...)`` holds ``sum Sq``,
    ``sum Sk``, ``sum Sq**2`` and ``sum Sq*Sk``); without it, the batch size ``B`` is read
    from ``cu_seqlens`` (``B + 1`` entries) or from ``SeqInfo.batch`` (e.g. the marker
    ``step[EXTEND bs=15 toks=15360]``) and the tokens are assumed split equally with no
    cached prefix: ``sum Sq**2 = T**2 / B``. For a fixed total, equal lengths minimise
    ``sum Sq**2``, so this is a lower bound of the causal FLOPs. Serving prefill ops are
    causal; SDPA-family ops are counted with a full mask unless ``concrete`` (Kineto
    ``Concrete Inputs``) says ``is_causal``.
  - Bytes: ``Q + O`` (queries and output, ``sum Sq * H * D`` each) plus ``K + V`` read once
    (``sum Sk * H_kv * D`` each; for a paged KV cache the pool shape is *not* what is read).
  - Not visible in the shapes: sliding windows (vLLM passes them as layer attributes), so
    models with sliding-window layers (gpt-oss) are over-counted on those layers.
* **Elementwise** (TraceLens unary/binary elementwise perf models): bytes = inputs + output
  (output = broadcast of the tensor inputs; in-place ``op_`` writes its first input; ``copy_``
  reads the source and writes the destination); FLOPs = output elements for arithmetic, 0 for
  pure data movement (copy, cast, cat, fill).
* **Norms** (aten ``layer_norm``/``rms_norm``/``group_norm``): bytes = inputs + an output
  of the first input's shape; no FLOPs.
* **Operands** (:data:`OPERAND_OPS`: serving-engine norm/activation ops such as
  ``aiter::rmsnorm``, ``sgl_kernel::silu_and_mul`` that take their output as an argument):
  bytes = the sum of the tensor arguments. No FLOPs.
* **MoE** (:func:`is_moe_op`: ``vllm::moe_forward``, fused-experts ops): the expert weights
  are not operator inputs, so :func:`op_cost` gives no numbers. With a model config the
  kernel table gives their kernels the expected routed-expert bytes of one layer at the
  step's tokens (:mod:`diagnose.analyzers.kernels`, from :func:`diagnose.accounting.step_cost`,
  the accounting of the step's MBU).
* Every other op (KV-cache stores, gathers, Inductor ``triton_*`` kernels whose arguments
  include whole tables): no cost model, FLOPs and bytes None.

Input encodings: ``dims`` is the decoded ``Input Dims`` list (one entry per argument: a list
of ints for a tensor, ``[]`` for a scalar/None, a list of lists for a TensorList); ``types``
the decoded ``Input type`` list (``"c10::BFloat16"``, ``"float"``, ...; unknown -> 2 bytes);
``concrete`` the decoded ``Concrete Inputs`` list of strings (``"True"``, ``"1024"``, ``""``).
"""
from __future__ import annotations

import math
import re
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np

from diagnose.patterns import clip

TYPE_BYTES = {"float": 4, "c10::Half": 2, "c10::BFloat16": 2, "double": 8, "c10::Float8_e4m3fn": 1,
              "c10::Float8_e5m2": 1, "signed char": 1, "unsigned char": 1, "int": 4, "long int": 8,
              "c10::Float8_e4m3fnuz": 1, "c10::Float8_e5m2fnuz": 1}
"""Bytes per element by Kineto ``Input type`` (attainment.py's table; unknown types count 2)."""

GEMM_OPS = frozenset({"aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm", "aten::matmul", "aten::linear",
                      "aten::_scaled_mm", "aten::addbmm", "vllm::rocm_unquantized_gemm"})
SDPA_BHSD = frozenset({"aten::scaled_dot_product_attention", "aten::_scaled_dot_product_flash_attention",
                       "aten::_scaled_dot_product_efficient_attention", "aten::_scaled_dot_product_cudnn_attention"})
SDPA_BSHD = frozenset({"aten::_flash_attention_forward", "aten::_efficient_attention_forward",
                       "flash_attn::_flash_attn_forward"})
VARLEN_ATTENTION = frozenset({"aiter::mha_batch_prefill", "flash_attn::_flash_attn_varlen_forward",
                              "vllm::unified_attention", "vllm::unified_attention_with_output"})
ATTENTION_OPS = SDPA_BHSD | SDPA_BSHD | VARLEN_ATTENTION
FLOP_OPS = GEMM_OPS | ATTENTION_OPS


_ENGINE_ATTENTION = re.compile(r"attention|attn", re.I)


def is_attention_op(name: object) -> bool:
    """Whether operator ``name`` computes attention: the ops of :data:`ATTENTION_OPS`, or a
    serving engine's own attention op (``sglang_profiler::attention_paged_attention_*``,
    FlashInfer/aiter paged-decode ops: a name with "attention"/"attn" that is not an Inductor
    kernel), whose cost :func:`op_cost` reads from a paged KV pool in its shapes."""
    if not isinstance(name, str):
        return False
    return name in ATTENTION_OPS or (not name.startswith("triton_") and _ENGINE_ATTENTION.search(clip(name)) is not None)


def is_moe_op(name: object) -> bool:
    """Whether operator ``name`` runs a MoE layer's routed experts (``vllm::moe_forward``,
    ``vllm::moe_forward_shared``, ``*fused_moe*``, ``*fused_experts*``). Inductor kernels named
    after the op they were fused from (``triton_poi_fused_constant_pad_nd_moe_forward_0``: the
    padding before it) are not."""
    if not isinstance(name, str):
        return False
    low = name.lower()
    return ("moe" in low or "fused_experts" in low) and not low.startswith("triton_")


MOE_NO_CONFIG_NOTE = "MoE: the expert weights are not operator inputs (give --model-config for their expected bytes)"
"""Ops whose FLOPs :func:`op_flops` counts (model FLOPs: GEMM and attention)."""

# Index of the is_causal argument in each op's schema (Concrete Inputs position).
_CAUSAL_ARG = {"aten::scaled_dot_product_attention": 5, "aten::_scaled_dot_product_flash_attention": 4,
               "aten::_scaled_dot_product_efficient_attention": 6, "aten::_scaled_dot_product_cudnn_attention": 6,
               "aten::_flash_attention_forward": 8, "flash_attn::_flash_attn_forward": 5,
               "flash_attn::_flash_attn_varlen_forward": 9, "aiter::mha_batch_prefill": 12,
               "aten::_efficient_attention_forward": 9}
CONCRETE_OPS = frozenset(_CAUSAL_ARG)
"""Ops whose cost reads their ``Concrete Inputs`` (the ``is_causal`` / mask-type argument at
the index above): the FLOPs of any other op follow from its shapes alone."""
# Index of the cu_seqlens_q argument of varlen ops (B + 1 entries).
_CU_SEQLENS_ARG = {"aiter::mha_batch_prefill": 3, "flash_attn::_flash_attn_varlen_forward": 3,
                   "aten::_flash_attention_forward": 3, "aten::_efficient_attention_forward": 4}
# Ops that read their KV from a paged cache: K/V shapes are the pool, not the tokens read.
_PAGED_KV = frozenset({"aiter::mha_batch_prefill"})
# Ops whose K/V inputs are the step's new tokens only (the cache is a layer attribute).
_NEW_KV_ONLY = frozenset({"vllm::unified_attention", "vllm::unified_attention_with_output"})

_UNARY = {"abs", "neg", "exp", "exp2", "log", "log2", "sqrt", "rsqrt", "sin", "cos", "tanh", "sigmoid", "silu",
          "gelu", "relu", "erf", "reciprocal", "clamp", "clamp_min", "clamp_max", "sign", "square", "pow",
          "hardtanh", "leaky_relu", "softplus", "mish", "floor", "ceil", "round", "logical_not", "bitwise_not",
          "_softmax", "softmax"}
_BINARY = {"add", "sub", "rsub", "mul", "div", "maximum", "minimum", "where", "masked_fill", "eq", "ne", "lt",
           "gt", "le", "ge", "threshold_backward", "logical_and", "logical_or", "bitwise_and", "bitwise_or",
           "fmod", "remainder", "lerp", "addcmul", "addcdiv", "gelu_backward", "silu_backward",
           "sigmoid_backward", "tanh_backward"}
_MOVE = {"copy_", "_to_copy", "to", "clone", "contiguous", "fill_", "zero_", "cat"}
ELEMENTWISE_OPS = frozenset({f"aten::{b}" for b in _UNARY | _BINARY | _MOVE}
                            | {f"aten::{b}_" for b in _UNARY | _BINARY})
NORM_OPS = frozenset({"aten::native_layer_norm", "aten::layer_norm", "aten::rms_norm", "aten::_fused_rms_norm",
                      "aten::native_group_norm", "aten::group_norm"})
"""aten norms: they return a tensor of their first input's shape (bytes = inputs + output)."""
OPERAND_OPS = frozenset({"aiter::rmsnorm", "aiter::add_rmsnorm", "aiter::rms_norm", "aiter::fused_add_rms_norm",
                         "aiter::rmsnorm2d_fwd_ck", "aiter::rmsnorm2d_fwd_with_add_ck",
                         "sgl_kernel::silu_and_mul", "sgl_kernel::gelu_and_mul", "sgl_kernel::gelu_tanh_and_mul",
                         "_C::silu_and_mul", "_C::gelu_and_mul", "_C::gelu_tanh_and_mul", "_C::rms_norm",
                         "_C::fused_add_rms_norm"})
"""Serving-engine norm/activation kernels that take every tensor they touch, output included,
as an argument (e.g. ``aiter::rmsnorm(out, input, weight, eps)``, ``silu_and_mul(out, x)``):
bytes = the sum of the tensor arguments (a lower bound where one is updated in place). Other
custom ops are not counted this way: their arguments often include whole tables or pools of
which they touch a few rows (KV-cache pools, embedding tables, RoPE caches)."""


class SeqInfo(msgspec.Struct, frozen=True):
    """Sequence statistics of one engine step, for attention ops whose shapes hold only totals.

    Attributes:
        batch: sequences in the step (B), or None.
        q_tokens: total query tokens ``sum Sq`` (must equal the op's packed token count for
            the sums below to be used).
        kv_tokens: total key tokens ``sum Sk`` (cached prefix + new), or None (= q_tokens).
        q_sq_sum: ``sum Sq**2`` (vLLM marker ``sqsq``), or None (equal split assumed).
        qk_sum: ``sum Sq*Sk`` (vLLM marker ``sqsk``), or None (= q_sq_sum: no cached prefix).
    """

    batch: int | None = None
    q_tokens: int | None = None
    kv_tokens: int | None = None
    q_sq_sum: int | None = None
    qk_sum: int | None = None


class MoeLayerBytes(msgspec.Struct, frozen=True):
    """Routed-expert bytes one MoE layer reads in each step, on one rank: the step's
    ``expert_bytes`` of :func:`diagnose.accounting.step_cost` (the number inside the step's
    MBU) divided by the MoE layers, so the per-layer figures of a step add up to it. Built
    by :func:`diagnose.analyzers.attainment.moe_layer_bytes`; the kernel table gives it to the
    kernels of MoE op calls.

    Attributes:
        per_layer: bytes (1 B units, float) per row of the step table; NaN where unknown
            (the step's batch or tokens are unknown, or its phase has no model cost).
        touched: expected experts touched per MoE layer, ``E * (1 - (1 - k/E) ** T)``
            (:func:`diagnose.accounting.experts_touched`), per step; NaN where unknown.
        tokens: T, the tokens routed in the step (decode: the batch; prefill and mixed: the
            step's new tokens), per step; NaN where unknown.
        num_experts: E, routed experts per MoE layer.
        top_k: k, experts per token.
        expert_bytes: one routed expert of one layer on one rank (gate, up and down), bytes.
        moe_layers: MoE layers of the model.
    """

    per_layer: np.ndarray
    touched: np.ndarray
    tokens: np.ndarray
    num_experts: int
    top_k: int
    expert_bytes: float
    moe_layers: int


class OpCost(msgspec.Struct, frozen=True):
    """FLOPs and bytes of one operator call.

    Attributes:
        flops: FLOP (2 per multiply-add), or None when no model applies.
        bytes: bytes moved to/from device memory, or None.
        model: "gemm" | "attention" | "elementwise" | "norm" | "operands" | None: which formula.
        note: how the numbers were obtained where a choice was made (e.g. "causal, equal
            split of 15360 tokens over 15 sequences"), or why they are missing.
    """

    flops: int | None
    bytes: int | None
    model: str | None
    note: str | None = None


NO_COST = OpCost(None, None, None)


#: Largest size of one tensor dimension taken as real (2^40 elements); larger, or negative
#: (symbolic sizes, crafted shapes), makes a shape unusable.
MAX_DIM = 1 << 40
#: The note of an op whose ``Input Dims`` hold a negative or implausible size.
BAD_SHAPE_NOTE = "Input Dims hold a negative or implausible size (symbolic or crafted shape): FLOPs and bytes unknown"


def _ints(x: Any) -> list[int] | None:
    """A shape: a non-empty list of sizes in [0, MAX_DIM], else None."""
    if isinstance(x, list) and x and all(isinstance(v, int) and not isinstance(v, bool) and 0 <= v <= MAX_DIM for v in x):
        return x
    return None


def bad_shape(dims: Any, depth: int = 0) -> bool:
    """Whether decoded ``Input Dims`` hold a size that is negative or beyond :data:`MAX_DIM`
    anywhere (a shape of such sizes must never give a cost, let alone a negative one)."""
    if depth > 3 or not isinstance(dims, list):
        return False
    for v in dims:
        if isinstance(v, list):
            if bad_shape(v, depth + 1):
                return True
        elif isinstance(v, int) and not isinstance(v, bool) and not 0 <= v <= MAX_DIM:
            return True
    return False


def _tbytes(types: Sequence | None, i: int) -> int:
    t = types[i] if types and i < len(types) else None
    return TYPE_BYTES.get(t, 2) if isinstance(t, str) else 2


def _flag(concrete: Sequence | None, i: int | None) -> bool | None:
    if concrete is None or i is None or i >= len(concrete):
        return None
    v = concrete[i]
    if v in ("True", "true"):
        return True
    if v in ("False", "false"):
        return False
    if isinstance(v, str) and v.isdigit():  # _efficient_attention_forward's custom_mask_type: 0 none, 1/2 causal
        return int(v) != 0
    return None


def _gemm_flops(name: str, dims: list) -> int | None:
    """attainment.op_flops' GEMM branch, unchanged (results must stay identical)."""
    if name in ("aten::addmm", "aten::baddbmm", "aten::addbmm"):
        dims = dims[1:]
    if name in ("aten::linear", "vllm::rocm_unquantized_gemm"):
        a, w = _ints(dims[0]) if dims else None, _ints(dims[1]) if len(dims) > 1 else None
        if not a or not w or len(w) != 2:
            return None
        return 2 * math.prod(a[:-1]) * a[-1] * w[0]
    if len(dims) < 2:
        return None
    a, b = _ints(dims[0]), _ints(dims[1])
    if not a or not b:
        return None
    if len(a) == 1 or len(b) == 1:
        return 2 * math.prod(a) * (b[-1] if len(b) > 1 else 1)
    m, k = a[-2], a[-1]
    n = b[-1]
    batch = max(math.prod(a[:-2]), math.prod(b[:-2]))
    return 2 * batch * m * k * n


_GEMM_ARITY = {"aten::mm": 2, "aten::bmm": 2, "aten::matmul": 2, "aten::addmm": 3, "aten::baddbmm": 3,
               "aten::addbmm": 3}


def _gemm_cost(name: str, dims: list, types: Sequence | None) -> OpCost:
    f = _gemm_flops(name, dims)
    if f is None:
        return NO_COST
    tensors = [(i, d) for i, d in enumerate(dims) if _ints(d)]
    nbytes = sum(math.prod(d) * _tbytes(types, i) for i, d in tensors)
    if name in ("aten::linear", "vllm::rocm_unquantized_gemm"):
        a, w = dims[0], dims[1]
        out_elems = math.prod(a[:-1]) * w[0]
        passed = False
    else:
        off = 1 if name in ("aten::addmm", "aten::baddbmm", "aten::addbmm") else 0
        a, b = dims[off], dims[off + 1]
        if len(a) == 1 or len(b) == 1:
            out_elems = math.prod(a[:-1]) * (b[-1] if len(b) > 1 else 1)
        elif name == "aten::addbmm":
            out_elems = a[-2] * b[-1]
        else:
            out_elems = max(math.prod(a[:-2]), math.prod(b[:-2])) * a[-2] * b[-1]
        passed = len(tensors) > _GEMM_ARITY.get(name, 99)  # out= variant: the output is an argument
    if not passed:
        first = tensors[0][0] if name not in ("aten::addmm", "aten::baddbmm", "aten::addbmm") or len(tensors) < 2 else tensors[1][0]
        nbytes += out_elems * _tbytes(types, first)
    return OpCost(f, nbytes, "gemm")


def _seq_pairs(t_q: int, seqs: SeqInfo | None, batch: int | None, causal: bool) -> tuple[float, int, str] | None:
    """(query-key pairs, key tokens, note) for a packed varlen call of ``t_q`` query tokens."""
    if seqs is not None and seqs.q_tokens == t_q and seqs.q_sq_sum is not None:
        qk = seqs.qk_sum if seqs.qk_sum is not None else seqs.q_sq_sum
        kv = seqs.kv_tokens if seqs.kv_tokens is not None else t_q
        pairs = qk - seqs.q_sq_sum / 2 if causal else qk
        return pairs, kv, f"{'causal' if causal else 'full'}, step sums (sum Sq^2={seqs.q_sq_sum}, sum Sq*Sk={qk})"
    b = batch or (seqs.batch if seqs is not None and seqs.q_tokens in (None, t_q) else None)
    if not b or b <= 0:
        return None
    sq2 = t_q * t_q / b
    pairs = sq2 / 2 if causal else sq2
    return pairs, t_q, f"{'causal' if causal else 'full'}, equal split of {t_q} tokens over {b} sequences, no cached prefix"


def _attention_cost(name: str, dims: list, types: Sequence | None, concrete: Sequence | None,
                    seqs: SeqInfo | None, causal: bool | None) -> OpCost:
    q = _ints(dims[0]) if dims else None
    k = _ints(dims[1]) if len(dims) > 1 else None
    if not q or not k:
        return NO_COST
    bpe = _tbytes(types, 0)
    if causal is None:
        causal = _flag(concrete, _CAUSAL_ARG.get(name))
    if name in SDPA_BHSD or (name in SDPA_BSHD and len(q) == 4):
        if len(q) != 4 or len(k) != 4:
            return NO_COST
        if name in SDPA_BHSD:
            b, h, sq, d = q
            hk, sk = k[1], k[2]
        else:
            b, sq, h, d = q
            sk, hk = k[1], k[2]
        v = _ints(dims[2]) if len(dims) > 2 else None
        dv = v[-1] if v else d
        if causal:
            pairs = b * (sq * sk - sq * sq / 2)
            note = "causal (is_causal in Concrete Inputs)"
        else:
            pairs = b * sq * sk
            note = "full mask (causal flag not visible: an upper bound)" if causal is None else "full mask"
        flops = 4 * b * h * sq * sk * d if not causal else round(4 * h * d * pairs)
        nbytes = bpe * (b * h * sq * d + b * hk * sk * d + b * hk * sk * dv + b * h * sq * dv)
        return OpCost(flops, nbytes, "attention", note)
    # packed varlen / paged: q = [total_tokens, heads, dim]
    if len(q) != 3:
        return NO_COST
    t_q, h, d = q
    hk = k[-2] if len(k) >= 3 else h
    if causal is None:
        causal = True  # serving prefill/extend attention is causal
    batch = None
    cu = _CU_SEQLENS_ARG.get(name)
    if cu is not None and cu < len(dims):
        c = _ints(dims[cu])
        if c and len(c) == 1 and c[0] >= 2:
            batch = c[0] - 1
    if name in _NEW_KV_ONLY and not (seqs is not None and seqs.q_tokens == t_q and seqs.q_sq_sum is not None):
        return OpCost(None, None, None, "attention over the KV cache: sequence lengths not in the shapes (needs the step's sq/sk sums)")
    r = _seq_pairs(t_q, seqs, batch, causal)
    if r is None:
        return OpCost(None, None, None, "varlen attention: batch size not in the shapes (pass SeqInfo.batch)")
    pairs, kv_tokens, note = r
    if name not in _PAGED_KV and name not in _NEW_KV_ONLY and len(k) == 3 and not (seqs is not None and seqs.q_tokens == t_q and seqs.kv_tokens):
        kv_tokens = k[0]  # dense packed K: its rows are the keys read
    flops = round(4 * h * d * pairs)
    nbytes = bpe * (2 * t_q * h * d + 2 * kv_tokens * hk * d)
    return OpCost(flops, nbytes, "attention", note)


def _paged_attention_cost(dims: list, types: Sequence | None, seqs: SeqInfo | None) -> OpCost:
    """A serving engine's paged attention op (:func:`is_attention_op` beyond
    :data:`ATTENTION_OPS`): queries ``[T, H, D]`` first, a KV pool ``[..., H_kv, D]`` (4-D or
    more) among the arguments. The pool is not what is read: the step's sums (``seqs``, the
    marker's ``sum Sk``) give the keys, read once as K and V at the pool's element size;
    FLOPs ``4 * H * D`` per causal (query, key) pair."""
    q = _ints(dims[0]) if dims else None
    if not q or len(q) != 3:
        return OpCost(None, None, None, "no cost model for this op")
    t_q, h, d = q
    pool = next(((i, p) for i, p in enumerate(map(_ints, dims[1:]), start=1) if p and len(p) >= 4 and p[-1] == d and p[-2] <= h),
                None)
    if pool is None:
        return OpCost(None, None, None, "no cost model for this op")
    if seqs is None or seqs.q_tokens != t_q or seqs.kv_tokens is None:
        return OpCost(None, None, None, "paged attention: sequence lengths not in the shapes (needs the step's sq/sk sums)")
    i, p = pool
    hk = p[-2]
    sqsq = seqs.q_sq_sum if seqs.q_sq_sum is not None else t_q
    qk = seqs.qk_sum if seqs.qk_sum is not None else seqs.kv_tokens
    pairs = qk - sqsq / 2 + t_q / 2
    nbytes = _tbytes(types, 0) * 2 * t_q * h * d + _tbytes(types, i) * 2 * seqs.kv_tokens * hk * d
    return OpCost(round(4 * h * d * pairs), nbytes, "attention",
                  f"paged KV cache: {seqs.kv_tokens} keys read as K and V (step sums), causal pairs")


def _flat_tensors(dims: list) -> list[tuple[int, list[int]]]:
    """(argument index, shape) of every tensor argument, TensorList entries flattened."""
    out = []
    for i, d in enumerate(dims):
        s = _ints(d)
        if s is not None:
            out.append((i, s))
        elif isinstance(d, list) and d and all(isinstance(x, list) for x in d):
            out.extend((i, s2) for s2 in map(_ints, d) if s2)
    return out


def _broadcast(shapes: list[list[int]]) -> list[int]:
    n = max(len(s) for s in shapes)
    out = [1] * n
    for s in shapes:
        for j, v in enumerate(s, start=n - len(s)):
            if out[j] == 1:
                out[j] = v
            elif v not in (1, out[j]):
                raise ValueError("shapes do not broadcast")
    return out


def _elementwise_cost(name: str, dims: list, types: Sequence | None) -> OpCost:
    base = name.split("::", 1)[1]
    ts = _flat_tensors(dims)
    if not ts:
        return NO_COST
    inbytes = sum(math.prod(s) * _tbytes(types, i) for i, s in ts)
    bpe0 = _tbytes(types, ts[0][0])
    if base in ("copy_",):  # read the source, write the destination: both are arguments
        return OpCost(0, inbytes, "elementwise")
    if base in ("fill_", "zero_"):
        return OpCost(0, math.prod(ts[0][1]) * bpe0, "elementwise")
    if base == "cat":
        out = sum(math.prod(s) for _, s in ts)
        return OpCost(0, inbytes + out * bpe0, "elementwise")
    if base.endswith("_"):  # in-place: the first input is also the output
        out = math.prod(ts[0][1])
        return OpCost(out, inbytes + out * bpe0, "elementwise")
    try:
        out = math.prod(_broadcast([s for _, s in ts]))
    except ValueError:
        return OpCost(None, inbytes, "operands", "inputs do not broadcast: operand bytes only")
    flops = 0 if base in _MOVE else out
    return OpCost(flops, inbytes + out * bpe0, "elementwise")


def op_cost(name: str, dims: list | None, types: list | None = None, *, concrete: list | None = None,
            seqs: SeqInfo | None = None, causal: bool | None = None) -> OpCost:
    """FLOPs, bytes and the formula used for one call of operator ``name`` (module docstring).

    Args:
        name: the cpu_op name (``aten::mm``, ``aiter::mha_batch_prefill``, ...).
        dims: decoded ``Input Dims``; None or empty -> :data:`NO_COST`.
        types: decoded ``Input type`` (bytes per element; None -> 2 bytes).
        concrete: decoded ``Concrete Inputs`` (attention ``is_causal``), optional.
        seqs: the step's sequence statistics for varlen/paged attention, optional.
        causal: force the attention mask convention (None: from ``concrete``, else full for
            SDPA-family ops and causal for varlen/paged serving ops).

    Returns:
        An :class:`OpCost`; never raises on odd shapes (a shape it cannot read gives None
        fields).
    """
    if not dims or not isinstance(dims, list):
        return NO_COST
    if bad_shape(dims):
        return OpCost(None, None, None, BAD_SHAPE_NOTE)
    try:
        if name in GEMM_OPS:
            return _gemm_cost(name, dims, types)
        if name in ATTENTION_OPS:
            return _attention_cost(name, dims, types, concrete, seqs, causal)
        if name in ELEMENTWISE_OPS:
            return _elementwise_cost(name, dims, types)
        if name in NORM_OPS:
            ts = _flat_tensors(dims)
            if not ts:
                return NO_COST
            inb = sum(math.prod(s) * _tbytes(types, i) for i, s in ts)
            return OpCost(None, inb + math.prod(ts[0][1]) * _tbytes(types, ts[0][0]), "norm")
        if name in OPERAND_OPS:
            b = _operand_bytes(dims, types)
            return OpCost(None, b, "operands") if b else NO_COST
        if is_moe_op(name):
            return OpCost(None, None, None, MOE_NO_CONFIG_NOTE)
        if is_attention_op(name):
            return _paged_attention_cost(dims, types, seqs)
        return OpCost(None, None, None, "no cost model for this op")
    except (TypeError, ValueError, IndexError, ZeroDivisionError):
        return NO_COST


def op_flops(name: str, dims: list | None, *, concrete: list | None = None, seqs: SeqInfo | None = None,
             causal: bool | None = None) -> int | None:
    """Model FLOPs (GEMM and attention only, 2 per multiply-add) of one call, None when unknown.

    Identical to ``attainment.op_flops`` for the ops it handled (GEMMs; SDPA-family ops with
    4-D shapes, full mask) when ``concrete``, ``seqs`` and ``causal`` are not given. New:
    vLLM ``rocm_unquantized_gemm``; causal counts from ``concrete``/``causal``; packed
    varlen and paged attention (``aiter::mha_batch_prefill`` of SGLang's CK FMHA prefill,
    flash-attn varlen, vLLM unified attention) from ``seqs`` or, failing that, the batch
    in ``cu_seqlens`` with an equal split. Elementwise ops return None here (their
    per-element counts are in :func:`op_cost`, not model FLOPs).
    """
    if name not in FLOP_OPS and not is_attention_op(name):
        return None
    return op_cost(name, dims, None, concrete=concrete, seqs=seqs, causal=causal).flops


def _operand_bytes(dims: list | None, types: list | None) -> int | None:
    """Sum of the plain tensor arguments' bytes (``attainment._op_bytes``, unchanged)."""
    if not dims or bad_shape(dims):
        return None
    total = 0
    for i, d in enumerate(dims):
        dd = _ints(d)
        if not dd:
            continue
        total += math.prod(dd) * _tbytes(types, i)
    return total or None


def op_bytes(dims: list | None, types: list | None, name: str | None = None, *, seqs: SeqInfo | None = None) -> int | None:
    """Bytes one call moves, None when unknown.

    Without ``name``: the sum of the tensor arguments' sizes (``Input Dims`` x ``Input type``
    bytes, unknown types 2 B, TensorLists skipped) -- exactly ``attainment._op_bytes`` today.
    With ``name``: :func:`op_cost`'s model (GEMM/attention/elementwise add the output that is
    not an argument; attention reads K/V of the tokens, not the paged pool).
    """
    if name is None:
        return _operand_bytes(dims, types)
    return op_cost(name, dims, types, seqs=seqs).bytes
