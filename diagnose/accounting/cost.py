"""FLOPs and bytes of a step: prefill FLOPs and bytes, a decode step, the expected experts a
MoE layer touches, :func:`step_cost` per step and rank, and the analytic bounds."""
from __future__ import annotations

from typing import Literal

import msgspec

from diagnose.errors import DiagnoseError
from diagnose.accounting.units import _positive_arg, _positive_float
from diagnose.accounting.spec import ModelSpec
from diagnose.accounting.weights import ModelWeights, model_weights
from diagnose.accounting.kv import _kv_dtype, _kv_groups, kv_bytes_per_token, kv_read_bytes


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




class PrefillFlops(msgspec.Struct, frozen=True):
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




class DecodeStep(msgspec.Struct, frozen=True):
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




class SeqSums(msgspec.Struct, frozen=True):
    """Sums over the sequences of one engine step (vLLM v1 step markers
    ``execute_T_context_N(sqA skB sqsqC sqskD)_generation_M(...)``, both groups added).

    Attributes:
        q_tokens: ``sum Sq``, the step's new (query) tokens.
        kv_tokens: ``sum Sk``, keys per sequence (cached prefix + new) summed.
        q_sq_sum: ``sum Sq**2``.
        qk_sum: ``sum Sq*Sk``.
    """

    q_tokens: int
    kv_tokens: int
    q_sq_sum: int
    qk_sum: int

    @property
    def causal_pairs(self) -> float:
        """(query, key) pairs a causal kernel computes, summed over sequences: a query at
        position ``Sk - Sq + i`` sees ``Sk - Sq + i + 1`` keys, so ``sum(Sq*Sk - Sq**2/2 +
        Sq/2)`` (exact; one decode token: ``Sk``)."""
        return self.qk_sum - self.q_sq_sum / 2 + self.q_tokens / 2


class CostTerm(msgspec.Struct, frozen=True):
    """One term of a step's FLOPs and bytes, with where each number comes from.

    Attributes:
        name: "linear" (attention projections, dense MLPs, shared experts, routers),
            "experts" (routed experts), "lm_head", "embedding" (a gather: bytes, no FLOPs),
            "attention" (scores and weighted sum), "kv_cache" (KV read and written), or, from
            operator shapes, "gemm" and "moe".
        flops: FLOPs, or None when this term was not counted.
        bytes: bytes, or None.
        flops_source, bytes_source: "config" (model config x the step's tokens), "marker"
            (the step marker's per-sequence sums or request counts), "shapes" (operator
            ``Input Dims``), or None.
    """

    name: str
    flops: float | None
    bytes: float | None
    flops_source: str | None
    bytes_source: str | None


class StepCost(msgspec.Struct, frozen=True):
    """Analytic FLOPs and bytes of one engine step, on one tensor-parallel rank.

    Attributes:
        phase: "prefill" | "decode" | "mixed".
        flops: FLOPs of the step, or None when the step's shape is unknown.
        bytes: device-memory bytes of the step (weights read + KV read/written), or None.
        weight_bytes: non-expert weights read (all weights for a dense model), the untied
            embedding table excluded (a gather reads its rows: the ``embedding`` term), bytes.
        expert_bytes: routed-expert weights read (experts touched), bytes; 0 for dense.
        kv_bytes: KV cache read and written, bytes; None when unknown.
        experts_touched_per_layer: expected experts touched per MoE layer, or None.
        assumptions: the modelling assumptions behind these numbers, one sentence each.
        terms: the FLOP and byte terms (:class:`CostTerm`) that add up to ``flops`` and
            ``bytes``.
    """

    phase: str
    flops: float | None
    bytes: float | None
    weight_bytes: float
    expert_bytes: float
    kv_bytes: float | None
    experts_touched_per_layer: float | None
    assumptions: tuple[str, ...] = msgspec.field(default_factory=tuple)
    terms: tuple[CostTerm, ...] = ()


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


#: Bytes of one embedding-table element (tables stay 16 bit under weight quantization).
EMBEDDING_ELEMENT_BYTES = 2


def _attention_pairs_flops(spec: ModelSpec, tp: int, seqs: SeqSums) -> float:
    """Attention FLOPs of a step from its sequence sums: full layers the causal pairs,
    sliding-window layers at most ``W`` keys per query (``min(W * sum Sq, causal pairs)``:
    exact once every sequence is longer than the window)."""
    per_pair = _attn_flops_per_pair(spec, tp)
    pairs = seqs.causal_pairs
    windows = spec.layer_windows or (None,) * spec.num_hidden_layers
    return per_pair * sum(pairs if w is None else min(w * seqs.q_tokens, pairs) for w in windows)


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
    seqs: SeqSums | None = None,
    logit_rows: int | None = None,
) -> StepCost:
    """FLOPs and bytes the engine runs in one step, from the model config, on one rank.

    Engine conventions (what serving engines compute, not the article's ``2 * P`` shortcut):

    * linear layers ``2 * P_body * T`` (``T`` the step's tokens: decode the batch, prefill
      and mixed the new tokens; MoE: ``k`` experts per token, the ``experts`` term);
    * the LM head ``2 * H * V`` per **sampled row** only: decode one per sequence, prefill
      one per prompt (``lm_head="last"``; ``"all"`` every position, as a plain Hugging Face
      forward does), mixed ``logit_rows`` (the marker's prefill + decode requests), else
      one per sequence;
    * the embedding as a gather: ``T * H`` 16-bit elements read, no FLOPs (the table is
      not streamed);
    * attention ``2 * n_h * (d_qk + d_v)`` per (query, key) pair: from ``seqs`` (the
      marker's sums, :attr:`SeqSums.causal_pairs`) when given; else decode ``kv_tokens``
      keys (one query per sequence), prefill an equal split of ``tokens`` over ``batch``
      causal prompts (:func:`prefill_flops`); a mixed step without sums has no attention
      term. Sliding-window layers cap the keys per query at the window.

    Bytes: non-expert weights read once (embedding table excluded, LM head included) +
    the gathered embedding rows + routed experts touched (:func:`experts_touched`) + KV read
    (decode, mixed: ``kv_tokens``; sliding layers min(context, W) per sequence, the context
    taken as the mean ``kv_tokens / batch``) and written (prefill, mixed: ``tokens``).

    Each term is in ``terms`` with its source ("config"; "marker" where the marker's sums or
    request counts give it).

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
        seqs: the step's per-sequence sums (attention pairs), optional.
        logit_rows: rows the LM head computes (the marker's request count), optional.

    Returns:
        The step's cost; ``flops``/``bytes`` None where the shape is unknown.

    Raises:
        DiagnoseError: unknown dtype, bad ``tp`` or a width not divisible by it.
    """
    w = model_weights(spec, weight_dtype, tp)
    kvd = _kv_dtype(spec, kv_dtype, default="bf16")
    table_free = w.non_expert_bytes - w.embedding_bytes  # the untied table is gathered, not streamed
    shape = _step_tokens(phase, batch, tokens, lm_head, logit_rows)
    if shape is None:
        return StepCost(phase, None, None, float(table_free), 0.0, None, None, tuple(_notes(spec, w, None, None)))
    t, rows, rows_source = shape
    non_expert, expert, touched = _weights_read(w, t)
    notes = _notes(spec, w, t, touched)
    attn, attn_src = _attention_term(spec, tp, phase, batch, tokens, kv_tokens, lm_head, seqs, t, notes)
    kv = _kv_term(spec, kvd, tp, phase, batch, tokens, kv_tokens, notes)
    gather = t * w.hidden_size * EMBEDDING_ELEMENT_BYTES
    linear = 2 * (w.body_active_params - w.expert_active_params) * t
    experts = 2 * w.expert_active_params * t
    head = 2 * w.lm_head_params * rows
    terms = [CostTerm("linear", float(linear), float(table_free - w.lm_head_bytes), "config", "config"),
             CostTerm("lm_head", float(head), float(w.lm_head_bytes), rows_source, "config"),
             CostTerm("embedding", 0.0, float(gather), "config", "config")]
    if w.moe_layers:
        terms.append(CostTerm("experts", float(experts), float(expert), "config", "config"))
    terms.append(CostTerm("attention", None if attn is None else float(attn), None, None if attn is None else attn_src, None))
    terms.append(CostTerm("kv_cache", None, None if kv is None else float(kv), None, None if kv is None else "config"))
    flops = float(linear + experts + head + (attn or 0))
    nbytes = None if kv is None else float(non_expert - w.embedding_bytes + gather + expert + kv)
    return StepCost(phase, flops, nbytes, float(table_free), float(expert),
                    None if kv is None else float(kv), touched, tuple(notes), tuple(terms))


def _step_tokens(phase: str, batch: int | None, tokens: int | None, lm_head: str,
                 logit_rows: int | None) -> tuple[int, int, str] | None:
    """(tokens the linear layers see, rows the LM head computes, the rows' source) of a step;
    None when its shape is unknown."""
    if phase == "decode" and batch:
        return batch, batch, "config"
    if phase == "prefill" and batch and tokens:
        return tokens, (batch if lm_head == "last" else tokens), "config"
    if phase == "mixed" and tokens:
        return tokens, (logit_rows or batch or tokens), ("marker" if logit_rows else "config")
    return None


def _attention_term(spec: ModelSpec, tp: int, phase: str, batch, tokens, kv_tokens, lm_head: str,
                    seqs: SeqSums | None, t: int, notes: list[str]) -> tuple[float | int | None, str]:
    """(attention FLOPs, source) of a step: the marker's sums, else decode over ``kv_tokens``,
    prefill over equal causal prompts; a mixed step without sums has none (noted)."""
    if seqs is not None and seqs.q_tokens == t:
        return _attention_pairs_flops(spec, tp, seqs), "marker"
    if phase == "decode":
        if not kv_tokens:
            return None, "config"
        if spec.layer_windows:
            return _attention_keys_flops(spec, tp, batch, kv_tokens / batch), "config"
        return _attn_flops_per_pair(spec, tp) * kv_tokens * spec.num_hidden_layers, "config"
    if phase == "prefill":
        return prefill_flops(spec, max(1, tokens // batch), batch, lm_head=lm_head, tp=tp).flops_attention_causal, "config"
    notes.append("attention not counted: the step's per-sequence sums are unknown (no vLLM-style step marker)")
    return None, "config"


def _kv_term(spec: ModelSpec, kvd: str, tp: int, phase: str, batch, tokens, kv_tokens, notes: list[str]) -> float | int | None:
    """KV-cache bytes of a step: read (decode, mixed: ``kv_tokens``; sliding layers at most
    the window per sequence) and written (prefill, mixed: ``tokens``); None for a decode
    step without ``kv_tokens``."""
    kvb = kv_bytes_per_token(spec, kvd, tp=tp)
    full, sliding = _kv_groups(spec, kvd, tp)

    def read_kv(n_seq: int | None, kv: int) -> float | int:
        """KV bytes read for ``kv`` cached tokens over ``n_seq`` sequences (int when exact)."""
        total: float | int = kv * full
        if not sliding:
            return total
        if n_seq:
            mean = kv / n_seq
            for win, b in sliding:
                total += n_seq * min(mean, win) * b
            notes.append(
                f"sliding-window layers ({spec.num_sliding_layers} of {spec.num_hidden_layers}): per-sequence context "
                f"taken as the mean kv_tokens / batch = {mean:,.1f} tokens (unequal contexts make the sliding KV read "
                "an over-count)")
            return total
        for _, b in sliding:
            total += kv * b
        notes.append("sliding-window layers: batch unknown, so their KV read is not capped at the window (an over-count)")
        return total

    if phase == "decode":
        return read_kv(batch, kv_tokens) if kv_tokens else None
    if phase == "prefill":
        return tokens * kvb
    return tokens * kvb + read_kv(batch, kv_tokens or 0)


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
