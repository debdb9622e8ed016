"""Per-layer time: which decoder layer, which op class, how much of the kernel time can be
attributed at all, and which layer is the odd one out; also for CUDA/HIP graph replays.

**The forward.** The kernels launched inside the model's top ``nn.Module`` frame, or else the
kernels launched in a step (the step marker's window; a step whose attention blocks number a
multiple of ``num_hidden_layers`` holds that many forwards). Kernels of a previous step that
run inside the window (launched before it, or with no launch call in the trace) are not part
of it: the coverage line names them as the previous step's tail.

**Sources**, in order of trust; each forward takes the first that finds its layers:

1. ``modules`` — ``nn.Module`` frames (``with_modules=True``;
   :mod:`diagnose.analyzers.layerframes`);
2. ``ranges`` — record_function / NVTX ranges naming a layer index;
3. ``capture`` — the graph's capture trace (``--capture-trace``): the module path each
   replayed kernel was captured under when the capture recorded frames, else the structural
   algorithm over the roles of the captured operators (``vllm::unified_attention...``,
   ``aten::linear``, ``rms_norm``);
4. ``structural`` — the per-layer kernel sequence (:mod:`diagnose.analyzers.layerseg`)
   checked against the config's ``num_hidden_layers`` or the detected period.

When the structural algorithm also runs on a forward another source segmented, the share of
kernel time both put in the same row is reported (``agreement``).

**The table** (:mod:`diagnose.analyzers.layertable`): per device and phase, one row per layer
plus ``pre`` and ``post``, kernel time by op class, FLOPs/bytes where the kernel table knows
them; the median layer per layer type (the config's ``layer_types``/sliding windows and MoE
layers, else the attention kernels' names) and the layers at 2x or more of their type's median
(in total or in one op class).
"""
from __future__ import annotations


import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.base import declared
from diagnose.analyzers import layerframes as LF
from diagnose.analyzers import layerseg as LS
from diagnose.model import Coverage, LayerRow, LayerSegmentation
from diagnose.trace.model import Trace

FINDINGS = declared("layers")

SOURCES = ("modules", "ranges", "capture", "structural")
PARTS = ("outside", "pre", "layer", "post")
_EMBED_NAME = ("embedding", "index_select", "indexselect", "gather")


class Assignment(msgspec.Struct):
    """Per kernel (aligned with :class:`Kernels`): forward id (-1 none), part (:data:`PARTS`
    code), layer index (-1 none), op class code, and per forward its source, layer class and
    structural checks."""

    forward: np.ndarray
    part: np.ndarray
    layer: np.ndarray
    op: np.ndarray
    info: dict[int, dict] = msgspec.field(default_factory=dict)

    @classmethod
    def empty(cls, n: int) -> "Assignment":
        return cls(np.full(n, -1, np.int64), np.zeros(n, np.int8), np.full(n, -1, np.int64), np.full(n, LS.OTHER_C, np.int8))


class Kernels(msgspec.Struct):
    """The kernels of the activity table, in its order (device, GPU start)."""

    pos: np.ndarray  # positions in the activity table
    device: np.ndarray
    step: np.ndarray
    phase: np.ndarray
    category: np.ndarray
    name_id: np.ndarray
    names: np.ndarray
    dur_ns: np.ndarray
    launch_kind: np.ndarray
    launch_tid: np.ndarray
    launch_ns: np.ndarray
    correlation: np.ndarray
    op: np.ndarray
    flops: np.ndarray
    bytes: np.ndarray
    module: np.ndarray
    role: np.ndarray = None  # role code (layerseg.ROLES) from the kernel category
    backward: np.ndarray = None  # a backward-pass kernel's name (_BACKWARD)
    graph: np.ndarray = None  # replayed from a CUDA/HIP graph

    def __len__(self) -> int:
        return len(self.pos)

    def __post_init__(self) -> None:
        if self.role is None:
            self.role = LS.roles_from_categories(self.category)
        if self.backward is None:
            self.backward = _backward(self.name_id, self.names)
        if self.graph is None:
            self.graph = self.launch_kind == "graph_launch"

    @classmethod
    def of(cls, acts: pd.DataFrame, per_kernel: dict | None) -> "Kernels":
        pos = np.flatnonzero(acts["kind"].to_numpy(dtype=object) == "kernel")
        n = len(pos)
        op = np.full(n, None, dtype=object)
        flops = np.full(n, np.nan)
        byt = np.full(n, np.nan)
        module = np.full(n, None, dtype=object)
        if per_kernel and len(per_kernel.get("rows", ())):
            at = np.searchsorted(pos, per_kernel["rows"])
            op[at], flops[at], byt[at], module[at] = per_kernel["op"], per_kernel["flops"], per_kernel["bytes"], per_kernel["module"]
        def col(c, dtype=None):
            v = acts[c].to_numpy(dtype=dtype)
            return v[pos] if n < len(v) else v

        name_id = col("name_id", np.int64) if "name_id" in acts else pd.factorize(col("name", object))[0]
        role = LS.roles_from_category_ids(col("category_id", np.int64)) if "category_id" in acts else None
        return cls(pos, col("device", np.int64), col("step", np.int64), col("phase", object), col("category", object),
                   name_id, col("name", object), col("end_ns", np.int64) - col("start_ns", np.int64),
                   col("launch_kind", object), col("launch_tid", np.int64), col("launch_start_ns", np.int64),
                   col("correlation", np.int64), op, flops, byt, module, role)


class LayerSection(msgspec.Struct, frozen=True):
    """The report's ``coverage``, ``layer_segmentation`` and ``layers`` records, and per
    kernel activity its forward, part, layer and op class (``frame``: index = position in the
    activity table; for the notebook and the web report's heat strip)."""

    coverage: list[Coverage]
    segmentation: list[LayerSegmentation]
    rows: list[LayerRow]
    frame: pd.DataFrame | None = None


def layer_section(trace: Trace, acts: pd.DataFrame, spec, per_kernel: dict | None) -> LayerSection:
    """Segment every forward of ``acts`` into layers and build the report's records.

    Args:
        trace: the trace (its ``modules`` and ``annotations`` frames).
        acts: the activity table (:func:`diagnose.analyzers.activities.activity_table`).
        spec: the model config (:class:`diagnose.accounting.ModelSpec`) or None.
        per_kernel: the kernel table's per-kernel arrays (op, flops, bytes, capture module
            path; :func:`diagnose.analyzers.kernels.kernel_table`), or None.
    """
    from diagnose.analyzers import layertable as LT

    if acts is None or not len(acts):
        return LayerSection([], [], [])
    k = Kernels.of(acts, per_kernel)
    if not len(k):
        return LayerSection([], [], [])
    n_layers = getattr(spec, "num_hidden_layers", None) if spec is not None else None
    combined = Assignment.empty(len(k))
    structural = _structural(k, n_layers, use_ops=False)
    for source, fn in (("modules", _modules), ("ranges", _ranges), ("capture", _capture)):
        a = fn(trace, k, n_layers)
        if a is not None:
            _merge(combined, a, source)
    _merge(combined, structural, "structural")
    types = LT.layer_types(k, combined, spec)
    rows, segs = LT.tables(k, combined, structural, types, n_layers)
    coverage = LT.coverage(k, combined, segs, _no_layer_reasons(k, n_layers))
    frame = pd.DataFrame({"forward": combined.forward, "part": combined.part, "layer": combined.layer,
                          "op_class": combined.op}, index=k.pos)
    return LayerSection(coverage, segs, rows, frame)


def _no_layer_reasons(k: Kernels, n_layers: int | None) -> dict[int, str]:
    """Per device, why no layers were found there (the coverage line says it)."""
    out = {}
    attn = k.role == LS.ATTN
    back = k.backward
    for dev in np.unique(k.device):
        m = k.device == dev
        if (m & back).any():
            out[int(dev)] = "a training step: backward kernels are not decoder layers"
        elif (m & attn).any() and not n_layers:
            out[int(dev)] = "attention kernels, but no layer sequence that repeats: give --model-config (num_hidden_layers)"
        else:
            out[int(dev)] = "no attention kernel between two projections"
    return out


def _groups(k: Kernels) -> np.ndarray:
    """Per kernel, its forward group: (device, step) for kernels launched in a step; the whole
    device when the trace has no step at all; -1 otherwise."""
    has_steps = (k.step >= 0).any()
    if has_steps:
        key = np.where(k.step >= 0, k.device * (int(k.step.max()) + 2) + k.step, -1)
    else:
        key = k.device.copy()
    out = np.full(len(k), -1, dtype=np.int64)
    ok = key >= 0
    out[ok] = pd.factorize(key[ok])[0]
    return out


def _merge(into: Assignment, a: Assignment, source: str) -> None:
    """Take ``a``'s forwards that have layers and none of whose kernels an earlier source put
    in a forward with layers."""
    m = a.forward >= 0
    if not m.any():
        return
    fcode, fids = pd.factorize(a.forward[m])
    has_layer = np.bincount(fcode, weights=a.part[m] == 2, minlength=len(fids)) > 0
    taken = np.bincount(fcode, weights=into.part[m] == 2, minlength=len(fids)) > 0
    ok = (has_layer & ~taken)[fcode] & (into.forward[m] < 0)
    if not ok.any():
        return
    base = int(into.forward.max()) + 1 if (into.forward >= 0).any() else 0
    idx = np.flatnonzero(m)[ok]
    new_ids, new_of = pd.factorize(a.forward[idx])
    into.forward[idx] = base + new_ids
    into.part[idx] = a.part[idx]
    into.layer[idx] = a.layer[idx]
    into.op[idx] = a.op[idx]
    for j, f in enumerate(new_of):
        into.info[base + j] = {**a.info.get(int(f), {}), "source": source}


# ---------------------------------------------------------------- sources


def _modules(trace: Trace, k: Kernels, n_layers: int | None) -> Assignment | None:
    mods = getattr(trace, "modules", None)
    if mods is None or not len(mods):
        return None
    tree, tid, st, en = LF.trace_frames(mods)
    leaf = LF.kernel_leaves(tid, st, en, k.launch_tid, k.launch_ns, tree.parent)
    fl = LF.frame_layers(tree, leaf, _groups(k), np.arange(len(k)), k.category)
    return None if fl is None else _from_frames(fl)


def _capture(trace: Trace, k: Kernels, n_layers: int | None) -> Assignment | None:
    mapped = k.graph & pd.notna(k.op)
    if not mapped.any():
        return None
    has_paths = pd.notna(k.module)
    if has_paths.any():
        tree, leaf = LF.path_frames(np.where(has_paths, k.module, None))
        group = np.where(k.graph, k.correlation, -1)
        fl = LF.frame_layers(tree, leaf, group, np.arange(len(k)), k.category)
        if fl is not None:
            return _from_frames(fl)
    return _structural(k, n_layers, use_ops=True, only=_groups_with(k, mapped))


def _from_frames(fl: LF.FrameLayers) -> Assignment:
    a = Assignment(fl.forward.copy(), fl.part.astype(np.int8), fl.layer.copy(), fl.op_class.copy())
    for f in np.unique(fl.forward[fl.forward >= 0]):
        a.info[int(f)] = {"layer_class": fl.layer_class, "model": fl.model}
    return a


def _groups_with(k: Kernels, mask: np.ndarray) -> np.ndarray:
    g = _groups(k)
    return np.unique(g[mask & (g >= 0)])


def _ranges(trace: Trace, k: Kernels, n_layers: int | None) -> Assignment | None:
    r = LF.range_layers(trace.annotations, k.launch_tid, k.launch_ns)
    if r is None:
        return None
    idx, pattern = r
    groups = _groups(k)
    a = Assignment.empty(len(k))
    order = np.argsort(groups, kind="stable")
    bounds = np.searchsorted(groups[order], np.arange(int(groups.max()) + 2))
    for g in np.unique(groups[(idx >= 0) & (groups >= 0)]):
        sel = order[bounds[g]:bounds[g + 1]]
        li = idx[sel]
        inl = np.flatnonzero(li >= 0)
        first, last = int(inl[0]), int(inl[-1])
        # kernels between two layer ranges stay with the layer before them
        filled = pd.Series(np.where(li >= 0, li, np.nan)).ffill().to_numpy()
        rank = {int(v): i for i, v in enumerate(pd.unique(li[inl]))}  # layers in the order they ran
        pos = np.arange(len(sel))
        a.forward[sel] = g
        a.part[sel] = np.where(pos < first, 1, np.where(pos > last, 3, 2))
        mid = (pos >= first) & (pos <= last)
        a.layer[sel[mid]] = [rank[int(v)] for v in filled[mid]]
        roles = k.role[sel]
        lay = a.layer[sel]
        starts = np.flatnonzero(mid & np.r_[True, lay[1:] != lay[:-1]])
        blocks = []
        for i, s0 in enumerate(starts):
            e0 = starts[i + 1] if i + 1 < len(starts) else last + 1
            at = np.flatnonzero(roles[s0:e0] == LS.ATTN)
            blocks.append((int(s0 + at[0]), int(s0 + at[-1])) if len(at) else None)
        seg = LS.Segmentation(starts.astype(np.int64), last + 1, blocks, [()] * len(starts), len(starts))
        a.op[sel] = LS.position_classes(roles, seg, len(sel))
        _edge_classes(a, sel, k, roles)
        a.info[int(g)] = {"layer_class": pattern}
    return a if (a.part == 2).any() else None


# ---------------------------------------------------------------- structural


#: Kernel names of a backward pass (autograd): ``softmax_warp_backward``, ``flash_bwd``,
#: cuDNN/CUTLASS ``dgrad``/``wgrad`` kernels.
_BACKWARD = ("backward", "bwd", "dgrad", "wgrad")


def _backward(name_id: np.ndarray, names: np.ndarray) -> np.ndarray:
    """Per kernel, whether its name is a backward-pass kernel's (:data:`_BACKWARD`); one
    check per distinct name (``name_id``: dense codes of ``names``)."""
    if not len(name_id):
        return np.zeros(0, dtype=bool)
    first = np.full(int(name_id.max()) + 1, -1, dtype=np.int64)
    first[name_id[::-1]] = np.arange(len(name_id) - 1, -1, -1)
    flag = np.array([i >= 0 and any(w in str(names[i]).lower() for w in _BACKWARD) for i in first], dtype=bool)
    return flag[name_id]


def _layout_keys(groups: np.ndarray, codes: np.ndarray) -> np.ndarray:
    """Per group (index = group id), a hash of its code sequence: equal sequences, equal key."""
    n_g = int(groups.max()) + 1 if len(groups) else 0
    ok = groups >= 0
    g, c = groups[ok], codes[ok].astype(np.uint64)
    order = np.argsort(g, kind="stable")
    g, c = g[order], c[order]
    starts = np.searchsorted(g, np.arange(n_g))
    pos = np.arange(len(g)) - starts[g]
    rng = np.random.default_rng(2026)
    w = rng.integers(1, 2**62, size=int(pos.max()) + 1 if len(pos) else 1, dtype=np.int64).astype(np.uint64)
    with np.errstate(over="ignore"):
        h = np.zeros(n_g, dtype=np.uint64)
        np.add.at(h, g, (c + np.uint64(7)) * w[pos])
    lens = np.bincount(g, minlength=n_g)
    return np.unique(np.stack([h.view(np.int64), lens], axis=1), axis=0, return_inverse=True)[1].reshape(-1)


def _structural(k: Kernels, n_layers: int | None, use_ops: bool, only: np.ndarray | None = None) -> Assignment:
    """The structural algorithm on every forward group (one Python pass per distinct kernel
    sequence: the decode steps of a serving trace repeat one layout)."""
    a = Assignment.empty(len(k))
    roles = k.role
    if use_ops:
        roles = LS.roles_from_ops(k.op, roles)
    if not (roles == LS.ATTN).any():
        return a
    groups = _groups(k)
    if only is not None:
        groups = np.where(np.isin(groups, only), groups, -1)
    back = k.backward
    if back.any():  # a training step: its backward pass is not decoder layers
        groups = np.where(np.isin(groups, np.unique(groups[back])), -1, groups)
    if not (groups >= 0).any():
        return a
    keys = _layout_keys(groups, k.name_id * 8 + roles)
    order = np.argsort(groups, kind="stable")
    bounds = np.searchsorted(groups[order], np.arange(int(groups.max()) + 2))
    done: dict[int, tuple] = {}
    for g in range(int(groups.max()) + 1):
        sel = order[bounds[g]:bounds[g + 1]]
        if not len(sel):
            continue
        key = int(keys[g])
        if key not in done:
            done[key] = _segment_group(roles[sel], k.name_id[sel], k.names[sel], k.category[sel], k.op[sel], n_layers)
        res = done[key]
        if res is None:
            continue
        fw_local, part, layer, op, infos = res
        a.forward[sel] = np.where(fw_local >= 0, g * 64 + fw_local, -1)
        a.part[sel], a.layer[sel], a.op[sel] = part, layer, op
        for f, inf in infos.items():
            a.info[g * 64 + f] = inf
    return a


def _segment_group(roles, name_id, names, category, ops, n_layers):
    """One group's kernels (GPU order) -> (forward, part, layer, op class, per-forward info),
    None without layers. Several forwards when the attention blocks number a multiple of
    ``num_hidden_layers``."""
    seg = LS.segment(roles, name_id, n_layers)
    if seg is None or not (n_layers or seg.confirmed(None)):
        return None  # without a config, layers must repeat (a CNN's one softmax is no layer)
    n = len(roles)
    cuts = [0, n]
    if n_layers and seg.n_layers > n_layers and seg.n_layers % n_layers == 0 and seg.n_layers // n_layers <= 64:
        cuts = [0] + [int(seg.starts[i]) for i in range(n_layers, seg.n_layers, n_layers)] + [n]
    fw = np.full(n, -1, np.int64)
    part = np.zeros(n, np.int8)
    layer = np.full(n, -1, np.int64)
    op = np.full(n, LS.OTHER_C, np.int8)
    infos = {}
    for f in range(len(cuts) - 1):
        lo, hi = cuts[f], cuts[f + 1]
        s = seg if len(cuts) == 2 else LS.segment(roles[lo:hi], name_id[lo:hi], n_layers)
        if s is None:
            continue
        b = s.bounds() + lo
        fw[lo:hi] = f
        idx = np.arange(lo, hi)
        part[lo:hi] = np.where(idx < b[0], 1, np.where(idx >= b[-1], 3, 2))
        layer[lo:hi] = np.where(part[lo:hi] == 2, np.searchsorted(b, idx, side="right") - 1, -1)
        op[lo:hi] = LS.position_classes(roles[lo:hi], s, hi - lo)
        infos[f] = {"seg": s, "block_names": [tuple(names[lo + x:lo + y + 1]) for x, y in s.blocks]}
    view = Assignment(fw, part, layer, op)
    _edge_classes(view, np.arange(n), None, roles, names=names, category=category, ops=ops)
    return fw, view.part, layer, view.op, infos


def _edge_classes(a: Assignment, sel: np.ndarray, k: Kernels | None, roles: np.ndarray, names=None, category=None, ops=None) -> None:
    """Op classes of the pre/post kernels of ``sel``: embedding (an embedding lookup by name or
    operator), norm, LM head (a GEMM after the layers), sampler, communication, other."""
    names = k.names[sel] if k is not None else names
    category = k.category[sel] if k is not None else category
    ops = k.op[sel] if k is not None else ops
    part = a.part[sel]
    op = a.op[sel]
    edge = (part == 1) | (part == 3)
    if not edge.any():
        return
    emb = np.zeros(len(part), dtype=bool)
    for i in np.flatnonzero(part == 1):
        t = f"{names[i]} {ops[i] or ''}".lower()
        emb[i] = any(w in t for w in _EMBED_NAME)
    op[edge] = LS.OTHER_C
    op[(part == 1) & emb] = LS.EMBEDDING
    op[edge & (roles == LS.NORM)] = LS.NORM_C
    op[(part == 3) & (roles == LS.GEMM)] = LS.LM_HEAD
    op[edge & (category == "sampling")] = LS.SAMPLER
    op[edge & (roles == LS.COMM)] = LS.COMM_C
    a.op[sel] = op
