"""Layers from named frames: ``nn.Module`` frames (with_modules), the module paths a capture
trace recorded for graph-replayed kernels, and record_function / NVTX ranges that name a
layer index.

**Module frames.** A kernel belongs to the frames open on its launching thread when its launch
call ran (a Python call stack: frames nest). The *layer class* is the outermost module class
with at least two instances under one parent frame of which at least half hold attention
between two GEMMs (qkv -> attention -> o_proj: ``Qwen2DecoderLayer`` under ``Qwen2Model``; the
``GraphModule`` pieces of a PIECEWISE-compiled vLLM model are cut at attention and are never
layers); the *model* is that parent, *the forward* the kernels
launched inside the model's outermost frame (``Qwen3ForCausalLM`` when it is a frame), plus
root frames that follow it in the same step or replay (``LogitsProcessor``: the LM head).
Layers are numbered by time inside their forward; ``pre`` and ``post`` are the forward's
kernels before the first and after the last layer kernel (GPU order).

Op classes from the module path (the first match from the layer down): an attention module
(``...Attention``, ``...Attn``) gives ``qkv`` for its GEMM kernels before its first attention
kernel, ``o_proj`` for those after its last, ``attention`` for the rest; an MLP/MoE module
(``mlp``, ``moe``, ``expert``, ``feedforward``, ``ffn``) ``mlp``; a norm module ``norm``;
communication kernels ``communication``; the rest of the layer ``other`` (residual adds). Pre
and post: embedding modules ``embedding``, norms ``norm`` (the final norm), GEMMs after the
layers ``lm_head``, sampling kernels or sampler modules ``sampler``.

**Ranges.** CPU ranges (``record_function``, NVTX) whose names carry a layer index
(:data:`LAYER_RANGE`: ``model.layers.7``, ``layers.7.self_attn``, ``layer7_fwd``,
``DecoderLayer_7``, ``block 7``...): the kernels launched inside the range of index *i* on its
thread are layer *i*; the forward is the step; op classes by position
(:func:`diagnose.analyzers.layerseg.position_classes`).
"""
from __future__ import annotations

import re

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.layerseg import (
    ATTENTION,
    COMM_C,
    EMBEDDING,
    LM_HEAD,
    MLP,
    NORM_C,
    O_PROJ,
    OTHER_C,
    QKV,
    SAMPLER,
)
from diagnose.trace.model import NO_TIME, factorize

_SUFFIX = re.compile(r"_\d+$")
_ATTN_MOD = re.compile(r"attn|attention", re.I)
_MLP_MOD = re.compile(r"mlp|moe|expert|feed_?forward|ffn", re.I)
_NORM_MOD = re.compile(r"norm", re.I)
_EMBED_MOD = re.compile(r"embed", re.I)
_NOT_EMBED = re.compile(r"rotary|rope|position", re.I)
_SAMPLER_MOD = re.compile(r"sampl", re.I)
_HEAD_MOD = re.compile(r"lm_?head|logits", re.I)

#: A range name that names a layer index: ``layers.7``, ``layer7``, ``layer_7_fwd``,
#: ``DecoderLayer_7``, ``block 7``, ``blocks.7``, ``h.7`` (GPT-2 style).
LAYER_RANGE = re.compile(r"(?:^|[^a-z])(?:decoder_?)?(?:layers?|blocks?|h)[._\s#-]?(\d{1,4})(?![\d])", re.I)


class FrameTree(msgspec.Struct):
    """Frames as a tree: class name, parent (-1 root) and an order key (start time, or the
    first kernel's position for capture paths) per frame."""

    cls: np.ndarray
    parent: np.ndarray
    order: np.ndarray

    def __len__(self) -> int:
        return len(self.cls)


class FrameLayers(msgspec.Struct):
    """Per kernel (aligned with the kernel arrays given): ``forward`` (an id, -1 outside every
    forward), ``layer`` (-1 pre/outside, 0.. layer index), ``part`` (0 outside, 1 pre, 2 layer,
    3 post), ``op_class`` (:data:`~diagnose.analyzers.layerseg.OP_CLASSES` code); and the layer
    class and model names."""

    forward: np.ndarray
    layer: np.ndarray
    part: np.ndarray
    op_class: np.ndarray
    layer_class: str
    model: str


def class_of(name: str) -> str:
    """``Qwen2DecoderLayer`` of ``nn.Module: Qwen2DecoderLayer_5`` or ``Qwen2DecoderLayer_5``."""
    if name.startswith("nn.Module: "):
        name = name[len("nn.Module: "):]
    return _SUFFIX.sub("", name)


def trace_frames(modules: pd.DataFrame) -> tuple[FrameTree, np.ndarray, np.ndarray, np.ndarray]:
    """The trace's ``nn.Module`` frames as a :class:`FrameTree`, with each frame's tid, start
    and end (ns), frames sorted by (tid, start, longest first)."""
    m = modules.sort_values(["tid", "start_ns", "end_ns"], ascending=[True, True, False], kind="stable")
    tid = m["tid"].to_numpy(np.int64)
    st = m["start_ns"].to_numpy(np.int64)
    en = m["end_ns"].to_numpy(np.int64)
    parent = _parents(tid, st, en)
    names = m["name"].to_numpy(dtype=object)
    codes, uniq = pd.factorize(names)
    cls = np.array([class_of(str(n)) for n in uniq], dtype=object)[codes] if len(names) else np.zeros(0, dtype=object)
    return FrameTree(cls, parent, st), tid, st, en


def kernel_leaves(tid: np.ndarray, st: np.ndarray, en: np.ndarray, ktid: np.ndarray, kt: np.ndarray,
                  parent: np.ndarray | None = None) -> np.ndarray:
    """Innermost frame (index) open on each kernel's launching thread at its launch time
    (``kt``, ns; NO_TIME: none), -1 when none. Frames sorted as :func:`trace_frames` gives;
    ``parent``: their parents (computed when None). Per thread: the last frame that started at
    or before the launch, then up its parents until one has not ended (frames nest)."""
    out = np.full(len(kt), -1, dtype=np.int64)
    if not len(st) or not len(kt):
        return out
    if parent is None:
        parent = _parents(tid, st, en)
    for th in np.unique(tid):
        lo, hi = np.searchsorted(tid, th, "left"), np.searchsorted(tid, th, "right")
        ks = np.flatnonzero((ktid == th) & (kt != NO_TIME))
        if not len(ks):
            continue
        cur = lo + np.searchsorted(st[lo:hi], kt[ks], side="right") - 1
        cur[cur < lo] = -1
        while True:
            live = cur >= 0
            stale = live.copy()
            stale[live] = en[cur[live]] < kt[ks][live]
            if not stale.any():
                break
            cur[stale] = parent[cur[stale]]
        out[ks] = cur
    return out


def _parents(tid: np.ndarray, st: np.ndarray, en: np.ndarray) -> np.ndarray:
    """Parent frame of each frame (sorted by thread, start, longest first), -1 for a root:
    the latest earlier frame of its thread still open at its start (what a stack walk gives,
    :func:`~diagnose.analyzers.nesting.prev_exceeding`)."""
    from diagnose.analyzers.nesting import prev_exceeding

    return prev_exceeding(en, st, strict=False, group=tid)


def path_frames(paths: np.ndarray) -> tuple[FrameTree, np.ndarray]:
    """A :class:`FrameTree` from module paths (``"A_0 > B_3 > C_7"`` per kernel, None for
    none) and each kernel's leaf frame (-1 for None); a frame is a distinct path prefix, its
    order the first kernel that has it."""
    ids: dict[str, int] = {}
    cls: list[str] = []
    parent: list[int] = []
    order: list[int] = []
    leaf = np.full(len(paths), -1, dtype=np.int64)
    for k, p in enumerate(paths):
        if not p:
            continue
        par = -1
        prefix = ""
        for part in str(p).split(" > "):
            prefix = f"{prefix} > {part}" if prefix else part
            f = ids.get(prefix)
            if f is None:
                f = ids[prefix] = len(cls)
                cls.append(class_of(part))
                parent.append(par)
                order.append(k)
            par = f
        leaf[k] = par
    return FrameTree(np.array(cls, dtype=object), np.array(parent, dtype=np.int64), np.array(order, dtype=np.int64)), leaf


def _ancestors(parent: np.ndarray, leaf: np.ndarray, depth: int) -> np.ndarray:
    """(kernels, depth) frame ids: column 0 the leaf, then its parent... (-1 past the root)."""
    out = np.full((len(leaf), depth), -1, dtype=np.int64)
    cur = leaf.copy()
    for d in range(depth):
        out[:, d] = cur
        ok = cur >= 0
        nxt = np.full(len(cur), -1, dtype=np.int64)
        nxt[ok] = parent[cur[ok]]
        cur = nxt
    return out


def _depths(parent: np.ndarray) -> np.ndarray:
    d = np.zeros(len(parent), dtype=np.int64)
    for i in range(len(parent)):  # parents come first in both builders (sorted by start / prefix order)
        if parent[i] >= 0:
            d[i] = d[parent[i]] + 1
    return d


def _sandwiched(tree: FrameTree, depth: np.ndarray, leaf: np.ndarray, order: np.ndarray, is_attn: np.ndarray,
                is_gemm: np.ndarray) -> np.ndarray:
    """Per frame, whether its kernels hold attention with a GEMM before the first attention
    kernel and one after the last (GPU order): qkv -> attention -> o_proj, as a decoder layer
    does (a compiled graph piece of vLLM's PIECEWISE mode, cut at attention, does not)."""
    n = len(tree)
    big = np.iinfo(np.int64).max
    a_lo, g_lo = np.full(n, big, dtype=np.int64), np.full(n, big, dtype=np.int64)
    a_hi, g_hi = np.full(n, -1, dtype=np.int64), np.full(n, -1, dtype=np.int64)
    for mask, lo, hi in ((is_attn, a_lo, a_hi), (is_gemm, g_lo, g_hi)):
        m = (leaf >= 0) & mask
        np.minimum.at(lo, leaf[m], order[m])
        np.maximum.at(hi, leaf[m], order[m])
    for i in np.argsort(-depth, kind="stable"):  # children before parents
        p = tree.parent[i]
        if p >= 0:
            a_lo[p], a_hi[p] = min(a_lo[p], a_lo[i]), max(a_hi[p], a_hi[i])
            g_lo[p], g_hi[p] = min(g_lo[p], g_lo[i]), max(g_hi[p], g_hi[i])
    return (a_hi >= 0) & (g_lo < a_lo) & (g_hi > a_hi)


def layer_class(tree: FrameTree, leaf: np.ndarray, is_attn: np.ndarray, is_gemm: np.ndarray | None = None,
                order: np.ndarray | None = None) -> tuple[str | None, np.ndarray]:
    """The layer class (see the module doc) and its instances' frame ids, or (None, []).
    With ``is_gemm`` and ``order`` (GPU order per kernel), an instance counts only when its
    attention sits between GEMMs (:func:`_sandwiched`)."""
    n = len(tree)
    if n == 0:
        return None, np.zeros(0, dtype=np.int64)
    depth = _depths(tree.parent)
    if is_gemm is not None and order is not None:
        attn = _sandwiched(tree, depth, leaf, order, is_attn, is_gemm).astype(np.int64)
    else:
        attn = np.zeros(n, dtype=np.int64)
        np.add.at(attn, leaf[(leaf >= 0) & is_attn], 1)
        for i in np.argsort(-depth, kind="stable"):  # children before parents
            if tree.parent[i] >= 0:
                attn[tree.parent[i]] += attn[i]
    child = np.flatnonzero(tree.parent >= 0)
    if not len(child):
        return None, np.zeros(0, dtype=np.int64)
    ccode, cuniq = pd.factorize(tree.cls[child])
    pair, inv = np.unique(ccode.astype(np.int64) * (n + 1) + tree.parent[child], return_inverse=True)
    cnt = np.bincount(inv)
    with_attn = np.bincount(inv, weights=attn[child] > 0)
    dmin = np.full(len(pair), np.iinfo(np.int64).max)
    np.minimum.at(dmin, inv, depth[child])
    ok = np.flatnonzero((cnt >= 2) & (with_attn * 2 >= cnt))
    if not len(ok):
        return None, np.zeros(0, dtype=np.int64)
    pick = ok[np.lexsort((-cnt[ok], dmin[ok]))[0]]
    best = cuniq[pair[pick] // (n + 1)]
    inst = np.flatnonzero((tree.cls == best) & (tree.parent >= 0))
    return str(best), inst


def frame_layers(tree: FrameTree, leaf: np.ndarray, group: np.ndarray, gpu_order: np.ndarray, category: np.ndarray) -> FrameLayers | None:
    """Forwards, layers and op classes of the kernels from their frames.

    Args:
        tree: the frames.
        leaf: per kernel, its innermost frame (-1 none).
        group: per kernel, the step (trace frames) or graph replay (capture paths) it belongs
            to: root frames after the model's in the same group are its post (LM head).
        gpu_order: per kernel, its rank in GPU start order (per device).
        category: per kernel, its kernel category.

    Returns:
        :class:`FrameLayers`, or None when no layer class is found.
    """
    is_attn = category == "attention"
    lcls, inst = layer_class(tree, leaf, is_attn, category == "gemm", gpu_order)
    if lcls is None:
        return None
    depth = int(_depths(tree.parent).max()) + 1
    anc = _ancestors(tree.parent, leaf, depth)
    n = len(leaf)
    root = np.where(leaf >= 0, anc[np.arange(n), np.maximum((anc >= 0).sum(axis=1) - 1, 0)], -1)
    is_inst = np.zeros(len(tree) + 1, dtype=bool)
    is_inst[inst] = True
    hit = is_inst[anc]  # (kernels, depth): the ancestor at that level is a layer instance
    has = hit.any(axis=1)
    lay_frame = np.where(has, anc[np.arange(n), hit.argmax(axis=1)], -1)
    model_roots = np.unique(root[has])
    forward = np.where(np.isin(root, model_roots) & (leaf >= 0), root, -1)
    _extend_post(forward, root, group, gpu_order, model_roots, leaf)
    # layer index: order of the instance's first key within its forward
    layer = np.full(n, -1, dtype=np.int64)
    part = np.where(forward >= 0, 1, 0).astype(np.int8)
    if has.any():
        inst_u, first = np.unique(lay_frame[has], return_index=True)
        fw_i = forward[has][first]
        o = np.lexsort((tree.order[inst_u], fw_i))  # by forward, then time
        rank = np.empty(len(o), dtype=np.int64)
        fs = fw_i[o]
        starts = np.r_[0, np.flatnonzero(fs[1:] != fs[:-1]) + 1]
        rank[o] = np.arange(len(o)) - np.repeat(starts, np.diff(np.r_[starts, len(o)]))
        layer[has] = rank[np.searchsorted(inst_u, lay_frame[has])]
        part[has] = 2
    # pre / post by GPU order around the forward's layer kernels
    fw_ok = (forward >= 0) & ~has
    if fw_ok.any() and has.any():
        fu, finv = np.unique(forward[has], return_inverse=True)
        last = np.full(len(fu), -1, dtype=np.int64)
        np.maximum.at(last, finv, gpu_order[has])
        j = np.searchsorted(fu, forward[fw_ok])
        known = (j < len(fu)) & (fu[np.minimum(j, len(fu) - 1)] == forward[fw_ok])
        lo = np.where(known, last[np.minimum(j, len(fu) - 1)], np.iinfo(np.int64).max)
        part[fw_ok] = np.where(gpu_order[fw_ok] > lo, 3, 1)
    op = _op_classes(tree, anc, hit, part, category, gpu_order, lay_frame)
    model = str(tree.cls[tree.parent[inst[0]]]) if len(inst) and tree.parent[inst[0]] >= 0 else ""
    return FrameLayers(forward, layer, part, op, lcls, model)


def _extend_post(forward: np.ndarray, root: np.ndarray, group: np.ndarray, gpu_order: np.ndarray,
                 model_roots: np.ndarray, leaf: np.ndarray) -> None:
    """Kernels of other root frames after a model forward in the same group (step or replay)
    join that forward (its post: the LM head in ``LogitsProcessor``)."""
    cand = np.flatnonzero((forward < 0) & (leaf >= 0) & (group >= 0))
    fw = np.flatnonzero(forward >= 0)
    if not len(cand) or not len(fw):
        return
    ids, first = np.unique(forward[fw], return_index=True)  # each forward's first kernel (GPU order)
    span = int(gpu_order.max()) + 2
    key = group[fw][first] * span + gpu_order[fw][first]
    srt = np.argsort(key)
    key, ids = key[srt], ids[srt]
    q = group[cand] * span + gpu_order[cand]
    j = np.searchsorted(key, q, side="left") - 1  # the latest forward that started before
    ok = j >= 0
    ok[ok] = key[j[ok]] // span == group[cand][ok]
    forward[cand[ok]] = ids[j[ok]]


#: Module-class kinds for op classes: attention, MLP/MoE, norm, embedding, sampler, LM head.
_KINDS = ((0, _ATTN_MOD, None), (1, _MLP_MOD, None), (2, _NORM_MOD, None), (3, _EMBED_MOD, _NOT_EMBED),
          (4, _SAMPLER_MOD, None), (5, _HEAD_MOD, None))


def _frame_kinds(cls: np.ndarray) -> np.ndarray:
    """Per frame (and a last entry for "no frame"), its kind code (:data:`_KINDS`) or -1."""
    out = np.full(len(cls) + 1, -1, dtype=np.int8)
    memo: dict[str, int] = {}
    for i, c in enumerate(cls):
        k = memo.get(c)
        if k is None:
            k = next((code for code, rx, extra in _KINDS if rx.search(c) and not (extra is not None and extra.search(c))), -1)
            memo[c] = k
        out[i] = k
    return out


def _op_classes(tree: FrameTree, anc: np.ndarray, hit: np.ndarray, part: np.ndarray, category: np.ndarray,
                gpu_order: np.ndarray, lay_frame: np.ndarray) -> np.ndarray:
    n = len(part)
    out = np.full(n, OTHER_C, dtype=np.int8)
    fkind = _frame_kinds(tree.cls)
    # the frames strictly inside the layer instance (or up to the root outside layers)
    below = (np.cumsum(hit, axis=1) == 0) & (anc >= 0)
    attn_mod = np.full(n, -1, dtype=np.int64)
    kind = np.full(n, -1, dtype=np.int8)
    for d in range(anc.shape[1] - 1, -1, -1):  # outermost first: the first match from the layer down wins
        k = fkind[anc[:, d]]
        m = below[:, d] & (kind < 0) & (k >= 0)
        if m.any():
            kind[m] = k[m]
            a = m & (k == 0)
            attn_mod[a] = anc[a, d]
    lay = part == 2
    out[lay & (kind == 1)] = MLP
    out[lay & (kind == 2)] = NORM_C
    am = lay & (kind == 0)
    if am.any():
        out[am] = ATTENTION
        att = am & (category == "attention")
        if att.any():
            mu, minv = np.unique(attn_mod[att], return_inverse=True)
            lo_m = np.full(len(mu), np.iinfo(np.int64).max, dtype=np.int64)
            hi_m = np.full(len(mu), -1, dtype=np.int64)
            np.minimum.at(lo_m, minv, gpu_order[att])
            np.maximum.at(hi_m, minv, gpu_order[att])
            j = np.minimum(np.searchsorted(mu, attn_mod[am]), len(mu) - 1)
            known = mu[j] == attn_mod[am]
            lo = np.where(known, lo_m[j], np.iinfo(np.int64).min)
            hi = np.where(known, hi_m[j], np.iinfo(np.int64).max)
            gemm = category[am] == "gemm"
            o = gpu_order[am]
            sub = out[am]
            sub[gemm & (o < lo)] = QKV
            sub[gemm & (o > hi)] = O_PROJ
            out[am] = sub
    edge = (part == 1) | (part == 3)
    out[edge & (kind == 3)] = EMBEDDING
    out[edge & (kind == 2)] = NORM_C
    out[edge & ((kind == 4) | (category == "sampling"))] = SAMPLER
    out[(part == 3) & (category == "gemm") & (kind != 4)] = LM_HEAD
    out[(part == 3) & (kind == 5) & (category != "sampling")] = LM_HEAD
    out[(part > 0) & (category == "communication")] = COMM_C
    return out


def range_layers(annotations: pd.DataFrame, ktid: np.ndarray, kt: np.ndarray) -> tuple[np.ndarray, str] | None:
    """Per kernel, the layer index of the CPU range naming one that its launch call ran in
    (-1 none), and the range name pattern (index as ``#``); None when no pattern names at
    least two layers. The pattern naming the most distinct indices wins."""
    if not len(annotations):
        return None
    ann = annotations[(annotations["scope"] == "cpu").to_numpy()]
    if not len(ann):
        return None
    codes, uniq = factorize(ann["name"])
    pat: dict[int, str] = {}
    idx: dict[int, int] = {}
    for c, u in enumerate(uniq):
        s = str(u)
        m = LAYER_RANGE.search(s)
        if m is None:
            continue
        pat[c] = s[:m.start(1)] + "#" + s[m.end(1):]
        idx[c] = int(m.group(1))
    if not pat:
        return None
    by: dict[str, set] = {}
    for c, p in pat.items():
        by.setdefault(p, set()).add(idx[c])
    best = max(by, key=lambda p: (len(by[p]), p))
    if len(by[best]) < 2:
        return None
    use = np.array([pat.get(c) == best for c in range(len(uniq))] + [False], dtype=bool)
    code_idx = np.array([idx.get(c, -1) for c in range(len(uniq))] + [-1], dtype=np.int64)
    sel = use[codes]
    r = ann[sel]
    r_idx = code_idx[codes[sel]]
    order = np.lexsort((-r["end_ns"].to_numpy(np.int64), r["start_ns"].to_numpy(np.int64), r["tid"].to_numpy(np.int64)))
    leaf = kernel_leaves(r["tid"].to_numpy(np.int64)[order], r["start_ns"].to_numpy(np.int64)[order],
                         r["end_ns"].to_numpy(np.int64)[order], ktid, kt)
    out = np.where(leaf >= 0, r_idx[order][np.maximum(leaf, 0)], -1)
    return out, best
