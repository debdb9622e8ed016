"""Structural layer segmentation: the decoder layers of one forward from its kernel sequence.

A CUDA/HIP graph replay (and any trace recorded without module frames) shows a flat sequence
of kernels. A decoder-only transformer runs the same block per layer (pre-norm):
``input norm -> q/k/v projection(s) -> rotary, KV-cache store -> attention -> o projection ->
post-attention norm -> MLP or MoE``, so the layers are found by their attention:

1. **Roles.** Each kernel gets a role: ``attn``, ``gemm``, ``norm``, ``comm`` or ``other``,
   from the project's kernel categories (``diagnose/data/kernel_categories.yaml``: attention,
   gemm, norm, communication; MoE expert kernels are ``other``) or, with a capture trace, from
   the operator that launched it (:func:`roles_from_ops`).
2. **Attention blocks** are maximal runs of ``attn`` kernels (KV-cache store, attention,
   split-K reduce). Only a run with a projection on both sides (a ``gemm`` before it since the
   previous block, and one after it before the next) is a layer's attention: a metadata
   kernel named like attention before the first layer (``create_flashinfer_kv_indices``) is
   not.
3. **Layer start.** From attention block *i*, back to the GEMM run before it (qkv, or q, k, v
   separately), then to the ``norm`` kernel before that: the input norm. Without a norm
   kernel (an eager RMSNorm decomposed into pow/mean/rsqrt/mul) the layer starts after the
   previous GEMM, one kernel further when that kernel is ``other`` (the previous layer's
   residual add stays with it).
4. **Last layer.** It ends after as many kernels as the layers of its type (the modal length
   of the layers with the same attention-block kernels); the rest is ``post`` (final norm,
   LM head, sampling), everything before layer 0 ``pre``.
5. **Cross-checks** (the confidence): the layer count against ``num_hidden_layers`` of the
   model config; the name-count mode (the number of times the most kernel instances' names
   repeat) and the autocorrelation period of the name sequence (one layer, or two for models
   whose layer types alternate); how many layers repeat their type's kernel sequence.

Numbers from this algorithm on the shared traces (hand-checked from the raw events): vLLM
FULL decode 24 layers (16 kernels in layer 0, then 17/18 alternating); SGLang decode 36 x 15;
HF Qwen1.5 eager 24 layers, 99.96 % of kernel time in the same layer as the module frames.

Op classes by position inside a layer (:func:`position_classes`): ``qkv`` the GEMM run before
the attention block, ``attention`` the kernels between it and ``o_proj`` (the first GEMM
after the block), ``norm`` the norm kernels and the non-GEMM kernels between the layer start
and qkv or between o_proj and the MLP's first GEMM (input/post-attention norms with their
residual adds when those are separate kernels), ``mlp`` the rest after o_proj (router,
experts, activation, down projection), ``communication`` collective kernels anywhere.
"""
from __future__ import annotations

import re

import msgspec
import numpy as np

ROLES = ("attn", "gemm", "norm", "comm", "other")
ATTN, GEMM, NORM, COMM, OTHER = range(5)

#: Op classes of a layer row and of the pre/post rows (JSON ``op_class_ms`` keys).
OP_CLASSES = ("qkv", "attention", "o_proj", "mlp", "norm", "communication", "embedding", "lm_head", "sampler", "other")
QKV, ATTENTION, O_PROJ, MLP, NORM_C, COMM_C, EMBEDDING, LM_HEAD, SAMPLER, OTHER_C = range(len(OP_CLASSES))

_CATEGORY_ROLE = {"attention": ATTN, "gemm": GEMM, "norm": NORM, "communication": COMM}

#: Operators of a capture trace (or of the trace itself) by role: the op names vLLM, SGLang
#: and PyTorch record around the kernels (``vllm::unified_attention_with_output``,
#: ``aten::linear``, ``_C::rms_norm``, ``vllm::all_reduce``...).
_OP_ROLES = (
    (COMM, re.compile(r"all_?reduce|all_?gather|reduce_?scatter|all_?to_?all|nccl|rccl|c10d", re.I)),
    (ATTN, re.compile(r"attention|attn|flash|sdpa|mha|mla|paged|reshape_and_cache|kv_cache", re.I)),
    (NORM, re.compile(r"rms_?norm|layer_?norm|group_?norm", re.I)),
    (GEMM, re.compile(r"aten::(linear|mm|addmm|matmul|bmm|baddbmm|_scaled_mm)$|gemm|_mm\b|scaled_mm", re.I)),
)


def roles_from_categories(category: np.ndarray) -> np.ndarray:
    """Role code per kernel (:data:`ROLES`) from its kernel category."""
    cats = np.asarray(category, dtype=object)
    uniq, inv = np.unique(cats.astype(str), return_inverse=True)
    table = np.array([_CATEGORY_ROLE.get(u, OTHER) for u in uniq], dtype=np.int8)
    return table[inv.reshape(-1)] if len(cats) else np.zeros(0, dtype=np.int8)


def roles_from_category_ids(category_id: np.ndarray) -> np.ndarray:
    """Role code per kernel from its category id (an index into the kernel categories,
    :data:`diagnose.analyzers.categories.CATEGORY_NAMES`)."""
    from diagnose.analyzers.categories import CATEGORY_NAMES

    table = np.array([_CATEGORY_ROLE.get(c, OTHER) for c in CATEGORY_NAMES], dtype=np.int8)
    ids = np.asarray(category_id, dtype=np.int64)
    return table[np.clip(ids, 0, len(table) - 1)]


def op_role(op: str | None) -> int | None:
    """Role of an operator name, None when the name says nothing (``aten::copy_``)."""
    if not op:
        return None
    for role, rx in _OP_ROLES:
        if rx.search(op):
            return role
    return None


def roles_from_ops(ops: np.ndarray, fallback: np.ndarray) -> np.ndarray:
    """Role per kernel from its launching operator (capture trace or trace), else ``fallback``
    (the category roles)."""
    ops = np.asarray(ops, dtype=object)
    out = np.asarray(fallback, dtype=np.int8).copy()
    cache: dict = {}
    for i, op in enumerate(ops):
        if op is None:
            continue
        r = cache.get(op, -1)
        if r == -1:
            r = cache[op] = op_role(op)
        if r is not None:
            out[i] = r
    return out


class Segmentation(msgspec.Struct):
    """The layers of one kernel sequence.

    Attributes:
        starts: first kernel of each layer (positions in the sequence).
        end: one past the last layer's last kernel (``post`` runs from there).
        blocks: (first, last) kernel of each layer's attention block.
        types: per layer, the type key (its attention block's kernel names).
        n_blocks: attention blocks found (before the config check).
        name_mode: the name-count mode (None when no name repeats).
        period: the autocorrelation period of the name sequence (kernels), None if too short.
        period_rate: the share of positions equal at that lag.
        template_match: layers whose kernel-name sequence equals their type's modal one.
        notes: what disagreed.
    """

    starts: np.ndarray
    end: int
    blocks: list[tuple[int, int]]
    types: list[tuple]
    n_blocks: int
    name_mode: int | None = None
    period: int | None = None
    period_rate: float | None = None
    template_match: int = 0
    notes: list[str] = msgspec.field(default_factory=list)

    @property
    def n_layers(self) -> int:
        return len(self.starts)

    def bounds(self) -> np.ndarray:
        """Layer boundaries: ``starts`` then ``end`` (layer i = [b[i], b[i+1]))."""
        return np.r_[self.starts, self.end].astype(np.int64)

    def checks(self) -> dict[str, bool]:
        """The cross-checks: ``period`` (the period is one layer's length, or two layers'
        when types alternate), ``mode`` (the name-count mode equals the layer count),
        ``template`` (all layers but at most two repeat their type's kernel sequence), and
        ``two_layer_period`` (the period spans two layers)."""
        lens = np.diff(self.bounds())
        one = int(np.median(lens)) if len(lens) else 0
        two = int(np.median(lens[:-1] + lens[1:])) if len(lens) > 1 else 0
        period = self.period is not None and self.n_layers >= 2 and self.period in (one, two)
        return {"period": period, "two_layer_period": period and self.period == two and two != one,
                "mode": self.n_layers >= 2 and self.name_mode == self.n_layers,
                "template": self.n_layers >= 2 and self.template_match >= self.n_layers - 2}

    def confirmed(self, num_layers: int | None) -> bool:
        """Whether the layer count is confirmed: by ``num_layers`` (a multiple of it: several
        forwards), else by the sequence repeating (the period or the name-count mode)."""
        if num_layers:
            return self.n_layers % num_layers == 0
        c = self.checks()
        return c["period"] or c["mode"]


def _blocks(roles: np.ndarray) -> list[tuple[int, int]]:
    """Maximal runs of attention kernels with a GEMM on both sides (see the module doc)."""
    a = roles == ATTN
    n = len(a)
    if not a.any():
        return []
    d = np.diff(np.r_[0, a.astype(np.int8), 0])
    first, last = np.flatnonzero(d == 1), np.flatnonzero(d == -1) - 1
    gpos = np.flatnonzero(roles == GEMM)
    out = []
    for i, (f, l) in enumerate(zip(first, last)):
        lo = out[-1][1] if out else -1
        hi = first[i + 1] if i + 1 < len(first) else n
        k = np.searchsorted(gpos, f)
        before = k > 0 and gpos[k - 1] > lo
        after = k < len(gpos) and gpos[k] < hi
        if before and after:
            out.append((int(f), int(l)))
    return out


def _starts(roles: np.ndarray, blocks: list[tuple[int, int]]) -> list[int]:
    starts, prev_end = [], -1
    for a, b in blocks:
        g = a - 1
        while g > prev_end and roles[g] != GEMM:
            g -= 1
        while g - 1 > prev_end and roles[g - 1] == GEMM:
            g -= 1
        k = g - 1
        while k > prev_end and roles[k] not in (NORM, GEMM, ATTN):
            k -= 1
        if k > prev_end and roles[k] == NORM:
            while k - 1 > prev_end and roles[k - 1] == NORM:
                k -= 1
            s = k
        else:
            s = k + 1
            if s < g and roles[s] == OTHER and prev_end >= 0:
                s += 1
        starts.append(max(s, 0))
        prev_end = b
    return starts


def _period(codes: np.ndarray, max_lag: int) -> tuple[int | None, float | None]:
    """Smallest lag whose equality rate is within 0.01 of the best lag's (lags 1..max_lag)."""
    n = len(codes)
    max_lag = min(max_lag, n // 2)
    if max_lag < 1:
        return None, None
    rates = np.empty(max_lag)
    step = max(1, 4_000_000 // max(n, 1))  # lags per block: at most ~4 M comparisons at once
    idx = np.arange(n)
    for p0 in range(1, max_lag + 1, step):
        lags = np.arange(p0, min(p0 + step, max_lag + 1))
        j = idx[None, :] + lags[:, None]
        ok = j < n
        eq = (codes[np.minimum(j, n - 1)] == codes[None, :]) & ok
        rates[lags - 1] = eq.sum(axis=1) / (n - lags)
    best = float(rates.max())
    p = int(np.flatnonzero(rates >= best - 0.01)[0]) + 1
    return p, round(float(rates[p - 1]), 4)


def _name_mode(codes: np.ndarray) -> int | None:
    counts = np.bincount(codes)
    counts = counts[counts >= 2]
    if not len(counts):
        return None
    weight = np.bincount(counts, weights=counts)
    return int(np.argmax(weight))


def segment(roles: np.ndarray, names: np.ndarray, num_layers: int | None = None) -> Segmentation | None:
    """Segment one forward's kernel sequence (in GPU start order) into layers.

    Args:
        roles: role code per kernel (:data:`ROLES`).
        names: kernel name code per kernel (int64; equal names, equal codes).
        num_layers: ``num_hidden_layers`` of the model config, or None.

    Returns:
        The :class:`Segmentation`, or None when no attention block is found.
    """
    roles = np.asarray(roles, dtype=np.int8)
    names = np.asarray(names, dtype=np.int64)
    blocks = _blocks(roles)
    if not blocks:
        return None
    notes = []
    n_blocks = len(blocks)
    if num_layers and n_blocks > num_layers and n_blocks % num_layers == 0:
        pass  # several forwards in one sequence: the caller splits them
    elif num_layers and n_blocks != num_layers:
        notes.append(f"{n_blocks} attention blocks, config num_hidden_layers {num_layers}")
    starts = _starts(roles, blocks)
    types = [tuple(names[a:b + 1].tolist()) for a, b in blocks]
    # the last layer: its type's modal length (from the layers that have a successor)
    lens: dict[tuple, dict[int, int]] = {}
    for i in range(len(starts) - 1):
        c = lens.setdefault(types[i], {})
        ln = starts[i + 1] - starts[i]
        c[ln] = c.get(ln, 0) + 1
    n = len(roles)
    last = lens.get(types[-1])
    if last:
        end = min(n, starts[-1] + max(last, key=lambda k: (last[k], -k)))
        end = max(end, blocks[-1][1] + 1)
    else:  # one layer, or a last type seen nowhere else: up to the last GEMM after its block
        g = np.flatnonzero(roles[blocks[-1][1] + 1:] == GEMM)
        end = n if not len(g) else blocks[-1][1] + 1 + int(g[-1]) + 1
    seg = Segmentation(np.asarray(starts, dtype=np.int64), int(end), blocks, types, n_blocks, notes=notes)
    seg.name_mode = _name_mode(names)
    bounds = seg.bounds()
    layer_len = int(np.median(np.diff(bounds))) if len(bounds) > 1 else 0
    region = names[bounds[0]:bounds[-1]]
    seg.period, seg.period_rate = _period(region, max(2, 4 * layer_len))
    sigs: dict[tuple, dict[tuple, int]] = {}
    layer_sig = []
    for i in range(seg.n_layers):
        s = tuple(names[bounds[i]:bounds[i + 1]].tolist())
        layer_sig.append(s)
        c = sigs.setdefault(types[i], {})
        c[s] = c.get(s, 0) + 1
    seg.template_match = sum(1 for i, s in enumerate(layer_sig) if max(sigs[types[i]], key=sigs[types[i]].get) == s)
    return seg


def position_classes(roles: np.ndarray, seg: Segmentation, n: int) -> np.ndarray:
    """Op-class code (:data:`OP_CLASSES`) per kernel of the sequence, by position in its layer
    (see the module doc); pre/post kernels get ``other`` here (the caller names them)."""
    out = np.full(n, OTHER_C, dtype=np.int8)
    b = seg.bounds()
    for i, blk in enumerate(seg.blocks[:seg.n_layers]):
        a, e = int(b[i]), int(b[i + 1])
        if blk is None:  # a layer range without attention kernels: by roles only
            r = roles[a:e]
            out[a:e] = np.where(r == NORM, NORM_C, np.where(r == COMM, COMM_C, OTHER_C))
            continue
        fa, la = blk
        q = fa - 1
        while q >= a and roles[q] != GEMM:
            q -= 1
        q0 = q
        while q0 - 1 >= a and roles[q0 - 1] == GEMM:
            q0 -= 1
        o = la + 1
        while o < e and roles[o] != GEMM:
            o += 1
        seg_cls = out[a:e]
        idx = np.arange(a, e)
        seg_cls[:] = MLP
        seg_cls[idx < q0] = NORM_C
        if q >= a:
            seg_cls[(idx >= q0) & (idx <= q)] = QKV
        seg_cls[(idx > q) & (idx < o)] = ATTENTION
        if o < e:
            seg_cls[idx == o] = O_PROJ
        seg_cls[(idx > o) & (idx < _mlp_start(roles, o, e))] = NORM_C
        r = roles[a:e]
        seg_cls[r == NORM] = NORM_C
        seg_cls[r == COMM] = COMM_C
    return out


def _mlp_start(roles: np.ndarray, o: int, e: int) -> int:
    """First kernel of the MLP after o_proj ``o``: the first GEMM, or the first kernel after
    the norm run that follows o_proj when a norm kernel is there (a router or expert kernel
    that is not a GEMM category starts the MLP then)."""
    k = o + 1
    g = k
    while g < e and roles[g] != GEMM:
        g += 1
    if k < e and any(roles[j] == NORM for j in range(k, g)):
        j = k
        while j < g and roles[j] != NORM:
            j += 1
        while j < g and roles[j] == NORM:
            j += 1
        return j
    return g
