"""CUDA/HIP graph replays mapped back to their operators through the graph's capture trace,
the way TraceLens does (``Trace2Tree/trace_capture_merge_experimental.py``,
``merge_capture_trace_into_graph``): the launches a capture window records are the graph's
nodes in order, so the i-th launch of the window is the i-th activity of each replay of that
graph (per kernel name in order when a scheduler reordered them), and the launch's
``External id`` gives the op and shapes (:mod:`diagnose.trace.capture` reads the windows).
Used by the kernel table (:mod:`diagnose.analyzers.kernels`)."""
from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from diagnose.trace.capture import CaptureMapping

# Origin codes of a kernel's operator (part of the row key).
# ORIGIN_CALL_TREE*: the operator open at the launch call on its thread (no External id link,
# :mod:`diagnose.analyzers.calltree`).
(ORIGIN_TRACE, ORIGIN_CAPTURE, ORIGIN_TRACE_NODIMS, ORIGIN_CAPTURE_NODIMS, ORIGIN_NO_OP, ORIGIN_GRAPH_NO_CAPTURE,
 ORIGIN_GRAPH_UNMATCHED, ORIGIN_NSYS, ORIGIN_NO_OPS, ORIGIN_CALL_TREE, ORIGIN_CALL_TREE_NODIMS) = range(11)
N_ORIGINS = 11
ORIGIN_SOURCE = {ORIGIN_TRACE: "trace", ORIGIN_CAPTURE: "capture", ORIGIN_TRACE_NODIMS: "trace", ORIGIN_CAPTURE_NODIMS: "capture",
                 ORIGIN_CALL_TREE: "call_tree", ORIGIN_CALL_TREE_NODIMS: "call_tree"}

def step_padded_sizes(steps: pd.DataFrame | None) -> np.ndarray | None:
    """Per step, the padded size a graph is captured for (vLLM: the step's tokens, TraceLens
    ``find_execution_details``), else its batch; -1 when unknown."""
    if steps is None or len(steps) == 0:
        return None
    col = steps["tokens"] if "tokens" in steps else steps.get("batch")
    if col is None:
        return None
    v = pd.to_numeric(col, errors="coerce").to_numpy(dtype=np.float64)
    if "batch" in steps:
        b = pd.to_numeric(steps["batch"], errors="coerce").to_numpy(dtype=np.float64)
        v = np.where(np.isnan(v), b, v)
    return np.where(np.isnan(v), -1, v).astype(np.int64)


class OpSources:
    """Operator descriptions referenced by kernels: name and raw dims/types/concrete JSON, as
    parallel object arrays appended in parts."""

    def __init__(self) -> None:
        self.parts: list[tuple[np.ndarray, ...]] = []
        self.n = 0

    def extend(self, name, dims, types, conc) -> int:
        """Append parallel sequences; returns the index of the first appended entry."""
        off = self.n
        self.parts.append(tuple(np.asarray(list(x) if isinstance(x, tuple) else x, dtype=object) for x in (name, dims, types, conc)))
        self.n += len(name)
        return off

    def columns(self) -> list[np.ndarray]:
        """[name, dims, types, concrete] object arrays over all entries."""
        if not self.parts:
            return [np.empty(0, dtype=object)] * 4
        return [np.concatenate([p[i] for p in self.parts]) for i in range(4)]


def map_graph(g: pd.DataFrame, name_codes: np.ndarray, names: np.ndarray, captures: Sequence[CaptureMapping],
               step_bs: np.ndarray | None, src: np.ndarray, inst: np.ndarray, origin: np.ndarray,
               sources: OpSources, stats: dict, modules: np.ndarray | None = None) -> None:
    """Fill ``src``/``inst``/``origin`` (per activity of ``g``, in place) for graph-replayed
    activities that a capture window explains; ``modules`` (when given, per activity): the
    capture's ``nn.Module`` path of each replayed kernel (:attr:`CaptureWindow.modules`).

    A replay (one graph launch: the activities sharing its correlation id, in start order) and
    a window match when they have the same length and the same kernel names in order, or the
    same multiset of names (then the i-th replayed kernel of a name is the i-th captured
    launch of that name: TraceLens' group-by-name alignment for graphs whose nodes the
    scheduler reordered, e.g. across streams). Windows without kernel names (CUDA runtime
    events carry none) match on kinds and count only (``graph_launches_matched_by_count_only``).
    A capture whose batch size is known and smaller than the step's padded size (``step_bs``)
    is never used; among the rest the smallest batch size wins (TraceLens
    ``find_closest_batch_size``), and launches with equal layouts take equal windows in turn.
    Launches are grouped by a hash of their layout, so Python work is per distinct layout.
    """
    is_graph = (g["launch_kind"].to_numpy(dtype=object) == "graph_launch") & (src < 0)
    idx = np.nonzero(is_graph)[0]
    if len(idx) == 0:
        return
    corr = g["correlation"].to_numpy(dtype=np.int64)[idx]
    start = g["start_ns"].to_numpy(dtype=np.int64)[idx]
    order = np.lexsort((start, corr))
    idx, corr = idx[order], corr[order]
    kind = g["kind"].to_numpy(dtype=object)[idx]
    # one code per activity: kernel name code, memcpy -> -2, memset -> -3 (capture has no memcpy names)
    code = np.where(kind == "memcpy", -2, np.where(kind == "memset", -3, name_codes[idx])).astype(np.int64)
    kcode = np.where(kind == "memcpy", -2, np.where(kind == "memset", -3, -1)).astype(np.int64)
    bounds = np.flatnonzero(np.r_[True, corr[1:] != corr[:-1], True])
    starts, lens = bounds[:-1], np.diff(bounds)
    n_launch = len(starts)
    stats["graph_launches"] = n_launch
    # layout hash per launch (vectorised): sum of code * random weight of the position
    rng = np.random.default_rng(12345)
    w = rng.integers(1, 2**62, size=int(lens.max()), dtype=np.int64).astype(np.uint64)
    pos = np.arange(len(idx)) - np.repeat(starts, lens)
    with np.errstate(over="ignore"):
        h = np.add.reduceat((code.astype(np.uint64) + np.uint64(7)) * w[pos], starts)
        hk = np.add.reduceat((kcode.astype(np.uint64) + np.uint64(7)) * w[pos], starts)
    lbs = np.full(n_launch, -1, dtype=np.int64)
    if step_bs is not None and "step" in g:
        st = g["step"].to_numpy(dtype=np.int64)[idx[starts]]
        ok = (st >= 0) & (st < len(step_bs))
        lbs[ok] = step_bs[st[ok]]
    # capture windows: codes in the replay trace's name space
    name_ix = {n: i for i, n in enumerate(names)}
    wins = []  # (capture, window, name codes, kind codes, has_names)
    for cap in captures:
        for win in cap.windows:
            kc = np.array([-2 if k == "memcpy" else -3 if k == "memset" else -1 for k in win.kinds], dtype=np.int64)
            has_names = all(k is not None for kk, k in zip(win.kinds, win.kernels) if kk == "kernel")
            cc = np.array([kc[i] if kc[i] != -1 else (name_ix.get(win.kernels[i], -4) if has_names else -1)
                           for i in range(len(win.kinds))], dtype=np.int64)
            wins.append((cap, win, cc, kc, has_names))
    by_len: dict[int, list[int]] = {}
    for wi, (_, win, _, _, _) in enumerate(wins):
        by_len.setdefault(len(win.kinds), []).append(wi)
    src_off: dict[int, int] = {}
    groups = pd.DataFrame({"h": h.view(np.int64), "hk": hk.view(np.int64), "n": lens, "bs": lbs}).groupby(
        ["h", "hk", "n", "bs"], sort=False).indices
    mapped = 0
    inst_next = int(inst.max()) + 1 if len(inst) else 0
    unverified = 0
    for (_, _, n, bs), launches_ix in groups.items():
        launches_ix = np.sort(launches_ix)
        s0 = starts[launches_ix[0]]
        seq = code[s0:s0 + n]
        kseq = kcode[s0:s0 + n]
        cands = []  # (batch_size, window index, perm graph pos -> window pos, verified)
        for wi in by_len.get(int(n), []):
            cap, win, cc, kc, has_names = wins[wi]
            if bs >= 0 and cap.batch_size is not None and cap.batch_size < bs:
                continue
            if has_names:
                if np.array_equal(cc, seq):
                    perm = np.arange(n)
                elif np.array_equal(np.sort(cc), np.sort(seq)):  # scheduler reordered: per name, in order
                    perm = np.empty(n, dtype=np.int64)
                    perm[np.argsort(seq, kind="stable")] = np.argsort(cc, kind="stable")
                else:
                    continue
                cands.append((cap.batch_size if cap.batch_size is not None else 1 << 40, wi, perm, True))
            elif np.array_equal(kc, kseq):
                cands.append((cap.batch_size if cap.batch_size is not None else 1 << 40, wi, np.arange(n), False))
        if not cands:
            continue
        best = min(c[0] for c in cands)
        cands = [c for c in cands if c[0] == best]
        # the group's launches take the equal windows in turn (PIECEWISE: identical pieces)
        for j, (_, wi, perm, verified) in enumerate(cands):
            ls = launches_ix[j::len(cands)]
            if len(ls) == 0:
                continue
            win = wins[wi][1]
            if wi not in src_off:
                src_off[wi] = sources.extend(win.op_names, win.op_dims, win.op_types, win.op_concrete)
            pos_act = idx[starts[ls][:, None] + np.arange(n)]          # (launches, n)
            has_op = np.array([x is not None for x in win.op_names], dtype=bool)[perm]
            has_dims = np.array([x is not None for x in win.op_dims], dtype=bool)[perm]
            n_call = len(win.op_call)
            src[pos_act] = np.where(has_op, src_off[wi] + perm, -1)
            inst[pos_act] = inst_next + np.arange(len(ls))[:, None] * n_call + np.asarray(win.op_call, dtype=np.int64)[perm]
            inst_next += len(ls) * n_call
            origin[pos_act] = np.where(has_op & has_dims, ORIGIN_CAPTURE, np.where(has_op, ORIGIN_CAPTURE_NODIMS, ORIGIN_NO_OP))
            if modules is not None and win.modules:  # the capture's module path of each replayed kernel
                modules[pos_act] = np.asarray(win.modules, dtype=object)[perm]
            mapped += len(ls)
            unverified += 0 if verified else len(ls)
    stats["graph_launches_matched"] = mapped
    if unverified:
        stats["graph_launches_matched_by_count_only"] = unverified
