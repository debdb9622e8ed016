"""Expected routed-expert bytes of MoE op calls, spread over their expert GEMM kernels: one op
call is one MoE layer reading the experts its step's tokens touch (the step MBU's accounting,
:func:`diagnose.analyzers.attainment.moe_layer_bytes`). Used by the kernel table
(:mod:`diagnose.analyzers.kernels`)."""
from __future__ import annotations

import math
import re

import numpy as np
import pandas as pd

from diagnose.analyzers.opcost import MoeLayerBytes


EXPERT_GEMM_KERNEL = re.compile(
    r"matmul_ogs|fused_moe_kernel|moe_gemm|moe_stage|ck_moe|fmoe|moe_mlp|moe_wna16|marlin_moe|moeflatmm"
    r"|grouped_gemm|groupedgemm|group_gemm|expert", re.IGNORECASE)
"""Kernel names of MoE expert GEMMs (vLLM triton_kernels ``_matmul_ogs_*``, vLLM/SGLang
Triton ``fused_moe_kernel``, aiter CK ``ck_moe_stage1/2`` and asm ``fmoe_*``, Marlin MoE,
grouped GEMMs). Routing, sorting, padding and the finalize/scatter kernels do not match."""


_NOT_EXPERT_GEMM = re.compile(r"finalize|scatter|gather|topk|sort|align|routing|bitmatrix|histogram|memset|count", re.IGNORECASE)


GATE_UP_SHARE = 2 / 3
"""Share of a routed expert's weights in its gate and up projections: the accounting's expert
(:attr:`diagnose.accounting.ModelSpec.params_expert`) is gate ``F_e x H`` + up ``F_e x H`` +
down ``H x F_e``, so gate_up holds ``2 F_e H / 3 F_e H`` = 2/3 and down 1/3."""


def moe_kernel_bytes(ix: np.ndarray, kinst: np.ndarray, kstart: np.ndarray, dur: np.ndarray, frac: np.ndarray,
                      kname: np.ndarray, names: np.ndarray, kstep: np.ndarray, moe: MoeLayerBytes | None,
                      bk: np.ndarray, k_model: np.ndarray, k_note: np.ndarray, k_layer: np.ndarray) -> None:
    """Expected bytes of the kernels ``ix`` (positions among the table's kernels) launched by
    MoE op calls (:func:`~diagnose.analyzers.opcost.is_moe_op`), written into ``bk`` (bytes),
    ``k_model``/``k_note`` (cost model and note) and ``k_layer`` (the layer's expert bytes).

    One op call is one MoE layer: it reads ``moe.per_layer[step]`` bytes of routed experts
    (the step's expert bytes of :func:`diagnose.accounting.step_cost` over its MoE layers).
    Among the call's kernels, the expert GEMMs (:data:`EXPERT_GEMM_KERNEL`), in start order:
    one kernel takes all of it (fused gate_up and down); two take :data:`GATE_UP_SHARE` (the
    first: gate_up, which always runs first) and the rest (down); 2n (chunked calls)
    alternate gate_up and down, each with 1/n of its share; another odd count splits by
    kernel time. The call's other kernels (routing, finalize/scatter) get no bytes. A call
    with no kernel recognised as an expert GEMM splits the bytes over all its kernels by
    kernel time (``frac``). Without ``moe`` (no model config) nothing is written.
    """
    if moe is None:
        return
    call = kinst[ix].copy()
    alone = call < 0  # no op call id: each kernel is its own call
    call[alone] = -1 - np.arange(int(alone.sum()))
    order = np.lexsort((kstart[ix], call))
    ix, call = ix[order], call[order]
    n_names = len(names)
    is_exp_name = np.array([bool(EXPERT_GEMM_KERNEL.search(n)) and not _NOT_EXPERT_GEMM.search(n)
                            if isinstance(n, str) else False for n in names], dtype=bool) if n_names else np.zeros(0, bool)
    ex = is_exp_name[kname[ix]]
    c, _ = pd.factorize(call, sort=False)  # contiguous: sorted by call
    n_calls = int(c.max()) + 1
    n_ex = np.bincount(c, weights=ex, minlength=n_calls).astype(np.int64)[c]
    cum = np.cumsum(ex)
    start_of_call = np.flatnonzero(np.r_[True, c[1:] != c[:-1]])
    before = (cum - ex)[start_of_call]  # expert kernels before each call
    pos = cum - 1 - before[c]  # position among the call's expert kernels
    ex_ns = np.bincount(c, weights=np.where(ex, dur[ix], 0.0), minlength=n_calls)[c]
    share = np.full(len(ix), np.nan)
    role = np.full(len(ix), None, dtype=object)
    one = ex & (n_ex == 1)
    share[one], role[one] = 1.0, "the call's one expert GEMM kernel: all of the layer's expert bytes"
    pair = ex & (n_ex >= 2) & (n_ex % 2 == 0)
    half = np.maximum(n_ex // 2, 1)
    gate = pair & (pos % 2 == 0)
    down = pair & (pos % 2 == 1)
    share[gate] = GATE_UP_SHARE / half[gate]
    share[down] = (1 - GATE_UP_SHARE) / half[down]
    role[gate] = "gate_up kernel (first of the call's expert GEMM pair): 2/3 of the layer's expert bytes, by weight shape (gate + up 2*F_e*H of 3*F_e*H)"
    role[down] = "down kernel (second of the call's expert GEMM pair): 1/3 of the layer's expert bytes, by weight shape (down F_e*H of 3*F_e*H)"
    odd = ex & (n_ex >= 3) & (n_ex % 2 == 1)
    share[odd] = np.where(ex_ns[odd] > 0, dur[ix][odd] / np.where(ex_ns[odd] > 0, ex_ns[odd], 1), 1.0 / n_ex[odd])
    role[odd] = "split over the call's expert GEMM kernels by kernel time (their gate_up/down roles are not known)"
    none = n_ex == 0
    share[none] = frac[ix][none]
    role[none] = "no kernel of the call recognised as an expert GEMM: split over its kernels by kernel time"
    st = kstep[ix]
    ok = (st >= 0) & (st < len(moe.per_layer))
    layer = np.full(len(ix), np.nan)
    layer[ok] = moe.per_layer[st[ok]]
    costed = ~np.isnan(share)
    bk[ix[costed]] = layer[costed] * share[costed]
    k_layer[ix[costed]] = layer[costed]
    other = ~costed
    k_note[ix[other]] = "MoE routing/combine kernel: the layer's expert bytes are on the call's expert GEMM kernels; no cost model here"
    unknown = costed & np.isnan(layer)
    k_note[ix[unknown]] = "MoE: the step's tokens are unknown (no step marker with a batch), so the experts touched are not estimated"
    known = np.flatnonzero(costed & ~np.isnan(layer))
    k_model[ix[known]] = "moe"
    # one note per distinct (step, role): a Python loop over those, never over kernels
    role_c, role_u = pd.factorize(role[known], sort=False)
    key_c, key_u = pd.factorize(st[known] * len(role_u) + role_c, sort=False)
    notes = []
    for kv in key_u:
        s_, r_ = divmod(int(kv), len(role_u))
        t = moe.tokens[s_]
        tokens = "the step's tokens" if math.isnan(t) else f"T = {int(t)} tokens"
        notes.append(
            f"expected routed-expert bytes from the model config (the step MBU's accounting): "
            f"{moe.touched[s_]:.2f} of {moe.num_experts} experts touched per layer by {tokens} "
            f"(E*(1-(1-k/E)^T), k = {moe.top_k}; uniform routing, an upper estimate) x {moe.expert_bytes / 1e6:.2f} MB "
            f"per expert = {moe.per_layer[s_] / 1e6:.1f} MB per layer; {role_u[r_]}")
    k_note[ix[known]] = np.asarray(notes, dtype=object)[key_c]
