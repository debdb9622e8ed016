"""Per-kernel efficiency table: which kernel to tune.

One row per (device, phase, launching operator, its ``Input Dims``/``Input type``, kernel
name, origin of the shapes): the same GEMM kernel runs many shapes, so the shape is part of
the key. Each row says how long the kernel ran, what share of the phase's kernel time that is,
the FLOPs and bytes of the work (:mod:`diagnose.analyzers.opcost`), the achieved TFLOP/s and
TB/s, their fraction of the device peak and whether the work is compute- or memory-bound at
its arithmetic intensity (against the ridge point, docs/prefill-decode.md section 3).

**Operator of a kernel.** Kineto stamps each GPU activity with the ``External id`` of the
innermost operator open on the launching thread (CUPTI/roctracer external correlation: the
top of the id stack), so the kernel's op is the ``cpu_op`` with the same ``external_id``:
``aten::mm`` under ``aten::linear`` (its shapes ``[M,K] x [K,N]`` are the GEMM the kernel
ran), ``aiter::mha_batch_prefill`` for SGLang's CK FMHA kernel, ``vllm::moe_forward`` for
vLLM's Triton MoE kernels. Where several ops carry the same id (older traces), the
FLOP-carrying one (:data:`~diagnose.analyzers.opcost.FLOP_OPS`) wins, then the innermost
(latest start).

**FLOPs of multi-kernel ops.** An op call that launches several kernels (split-K GEMM plus
its reduction, attention plus its combine, MoE routing plus expert GEMMs) has its FLOPs and
bytes apportioned to its kernels by kernel time: every kernel of the call shows the call's
TFLOP/s, and the rows' FLOPs add up to the ops' FLOPs (no double count). Attention ops read
``is_causal`` from their ``Concrete Inputs`` (which split rows only for those ops,
:data:`~diagnose.analyzers.opcost.CONCRETE_OPS`).

**MoE layers** (``vllm::moe_forward``, fused-experts ops) have no expert weights in their
shapes. With a MoE model config each call (one layer) gets the routed-expert bytes the layer
reads at its step's tokens, from the accounting of the step's MBU
(:func:`diagnose.analyzers.attainment.moe_layer_bytes`), and its expert GEMM kernels share
them by weight shape (gate_up 2/3, down 1/3; :func:`_moe_kernel_bytes`), so each expert
kernel row has an achieved TB/s.

**CUDA/HIP graph replays** carry no operator: their kernels are mapped back through the
graph's *capture* trace the way TraceLens does (``Trace2Tree/trace_capture_merge_experimental
.py``, ``merge_capture_trace_into_graph``): the launches a capture window
(``StreamBeginCapture`` .. ``StreamEndCapture``) records on the CPU are the graph's nodes in
order, so the i-th launch of the window is the i-th activity of each replay of that graph
(per kernel name in order when a scheduler reordered them), and the launch's ``External id``
gives the op and shapes. See :func:`load_capture_mapping`.

**nsys traces** hold no operator shapes: rows give time per kernel only (``op`` None,
``shapes_unknown`` says why).

Cost: vectorised over kernels (codes and ``np.bincount``); ``Input Dims`` strings are parsed
once per distinct (op, dims, types) and a Python loop runs only per distinct op shape and,
with a capture trace, per distinct graph layout.
"""
from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.opcost import (
    ATTENTION_OPS,
    CONCRETE_OPS,
    FLOP_OPS,
    MoeLayerBytes,
    SeqInfo,
    is_moe_op,
    op_cost,
)
from diagnose.errors import TraceFormatError
from diagnose.hardware import GpuPeak
from diagnose.trace.model import Trace, factorize

_dec = msgspec.json.Decoder()

COLUMNS = ("device", "phase", "op", "input_dims", "input_types", "kernel", "category", "calls", "total_ms",
           "mean_us", "kernel_time_share", "flops", "bytes", "flops_per_call", "bytes_per_call",
           "achieved_tflops", "achieved_tbps", "peak_tflops_share", "peak_tbps_share",
           "arithmetic_intensity_flop_per_byte", "bound", "cost_model", "cost_note", "op_source", "shapes_unknown")

_TEXT_COLUMNS = ("phase", "op", "input_dims", "input_types", "kernel", "category", "bound", "cost_model", "cost_note",
                 "op_source", "shapes_unknown")

# Origin codes of a kernel's operator (part of the row key).
_TRACE, _CAPTURE, _TRACE_NODIMS, _CAPTURE_NODIMS, _NO_OP, _GRAPH_NO_CAPTURE, _GRAPH_UNMATCHED, _NSYS, _NO_OPS = range(9)
_N_ORIGINS = 9
_ORIGIN_SOURCE = {_TRACE: "trace", _CAPTURE: "capture", _TRACE_NODIMS: "trace", _CAPTURE_NODIMS: "capture"}
SHAPES_UNKNOWN = {
    _TRACE_NODIMS: "operator recorded without shapes (profile with record_shapes=True)",
    _CAPTURE_NODIMS: "operator in the capture trace recorded without shapes (record_shapes=True)",
    _NO_OP: "no operator with this kernel's external id (launched outside a recorded operator, "
            "e.g. a Triton kernel called from Python, or before the profiling window)",
    _GRAPH_NO_CAPTURE: "replayed from a CUDA/HIP graph: no operator launches it in this trace "
                       "(give the graph's capture trace)",
    _GRAPH_UNMATCHED: "replayed from a CUDA/HIP graph: no window of the capture trace matches this graph launch's activities",
    _NSYS: "Nsight Systems trace: no operator shapes (time per kernel only)",
    _NO_OPS: "the trace holds no operator (cpu_op) events: time per kernel only",
}


# ----------------------------------------------------------------------------- capture traces


class _CArgs(msgspec.Struct, gc=False):
    external_id: Any = msgspec.field(default=None, name="External id")
    kernel: Any = None
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")


class _CEvent(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None
    args: _CArgs | None = None


class _CDoc(msgspec.Struct, gc=False):
    traceEvents: list[_CEvent] = []


@dataclass(frozen=True)
class CaptureWindow:
    """The GPU work one stream capture recorded, in CPU launch order.

    Attributes:
        kinds: per launch, "kernel" | "memcpy" | "memset".
        kernels: per launch, the kernel name (ROCm runtime events carry it as ``args.kernel``)
            or None (CUDA runtime events do not: alignment is then by kind and count only).
        op_names, op_dims, op_types, op_concrete: per launch, the launching operator (the
            ``cpu_op`` whose ``External id`` the launch carries) and its raw ``Input Dims``,
            ``Input type``, ``Concrete Inputs`` JSON bytes; None where no op.
        op_call: per launch, an int numbering the op call within the window (launches of one
            call share it).
    """

    kinds: tuple[str, ...]
    kernels: tuple[str | None, ...]
    op_names: tuple[str | None, ...]
    op_dims: tuple[bytes | None, ...]
    op_types: tuple[bytes | None, ...]
    op_concrete: tuple[bytes | None, ...]
    op_call: tuple[int, ...]


@dataclass
class CaptureMapping:
    """Capture windows of one graph-capture trace (see :func:`load_capture_mapping`).

    Attributes:
        path: the capture trace.
        batch_size: the padded batch (vLLM: tokens) the graphs were captured for, from the
            TraceLens sidecar ``execution_details.json`` or a ``capture_<bs>_<MODE>``
            annotation; None if unknown (then not checked against the replayed step).
        mode: "FULL" | "PIECEWISE" | None, same sources.
        windows: the capture windows in time order.
        notes: what was skipped or assumed while reading.
    """

    path: str
    batch_size: int | None
    mode: str | None
    windows: list[CaptureWindow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _raw(r: msgspec.Raw) -> bytes | None:
    b = bytes(r)
    return b or None


def _sidecar(path: str) -> tuple[int | None, str | None]:
    side = os.path.join(os.path.dirname(os.path.abspath(path)), "execution_details.json")
    if not os.path.isfile(side):
        return None, None
    try:
        with open(side, "rb") as f:
            entries = _dec.decode(f.read())
    except (OSError, msgspec.DecodeError):
        return None, None
    base = os.path.basename(path)
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict) and e.get("file") == base:
            bs = e.get("batch_size")
            return (bs if isinstance(bs, int) else None), (e.get("mode") if isinstance(e.get("mode"), str) else None)
    return None, None


_CAPTURE_ANN = re.compile(r"^capture_(\d+)_([A-Z]+)$")


def load_capture_mapping(capture_trace: str) -> CaptureMapping:
    """Read a CUDA/HIP graph *capture* trace (Kineto JSON, plain or gzip) into its windows.

    A window runs from the end of a ``(cuda|hip)StreamBeginCapture`` call to the start of the
    next ``StreamEndCapture``; its launches are the runtime/driver calls inside it whose name
    holds ``Launch`` (not ``GraphLaunch``/``HostFunc``), ``Memcpy`` or ``Memset``, in start
    order (TraceLens ``find_capture_roots`` + ``get_subtree_events`` with the same filter).
    Each launch's ``External id`` names its operator (TraceLens reaches the same op through
    the call-stack tree).

    Raises:
        TraceFormatError: unreadable file or not a Kineto JSON object with ``traceEvents``.
    """
    from diagnose.inputs import parsing
    from diagnose.trace.reading import read_bytes

    buf = read_bytes(capture_trace)
    try:
        with parsing(f"{capture_trace}"):
            doc = msgspec.json.decode(buf, type=_CDoc)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"{capture_trace}: not a Kineto trace with traceEvents ({e})") from None
    ops: dict[int, tuple[float, _CEvent]] = {}
    begins, ends, launches, bs_ann = [], [], [], []
    for ev in doc.traceEvents:
        cat, name = ev.cat, ev.name
        if not isinstance(name, str) or not isinstance(ev.ts, (int, float)):
            continue
        if cat in ("cpu_op", "Operator"):
            x = ev.args.external_id if ev.args is not None else None
            if isinstance(x, int) and (x not in ops or ev.ts >= ops[x][0]):  # innermost (latest start)
                ops[x] = (ev.ts, ev)
        elif cat in ("cuda_runtime", "cuda_driver", "Runtime"):
            if "BeginCapture" in name:
                begins.append(ev.ts + (ev.dur or 0))
            elif "EndCapture" in name:
                ends.append(ev.ts)
            elif (("Launch" in name and "GraphLaunch" not in name and "HostFunc" not in name)
                  or "Memcpy" in name or "Memset" in name):
                launches.append(ev)
        elif cat == "user_annotation":
            m = _CAPTURE_ANN.match(name)
            if m:
                bs_ann.append((int(m.group(1)), m.group(2)))
    bs, mode = _sidecar(capture_trace)
    if bs is None and bs_ann:
        bs, mode = bs_ann[0]
    out = CaptureMapping(path=capture_trace, batch_size=bs, mode=mode)
    begins.sort()
    ends.sort()
    launches.sort(key=lambda e: e.ts)
    lts = np.array([e.ts for e in launches], dtype=np.float64)
    lend = np.array([e.ts + (e.dur or 0) for e in launches], dtype=np.float64)
    j = 0
    for b in begins:
        while j < len(ends) and ends[j] < b:
            j += 1
        if j == len(ends):
            out.notes.append("a StreamBeginCapture without a later StreamEndCapture: window skipped")
            break
        e_ts = ends[j]
        j += 1
        sel = np.nonzero((lts >= b) & (lend <= e_ts))[0]
        kinds, kernels, names, dims, types, conc, call = [], [], [], [], [], [], []
        call_ids: dict[Any, int] = {}
        for i in sel:
            ev = launches[i]
            kinds.append("memcpy" if "Memcpy" in ev.name else "memset" if "Memset" in ev.name else "kernel")
            a = ev.args
            kn = a.kernel if a is not None and isinstance(a.kernel, str) else None
            kernels.append(kn)
            x = a.external_id if a is not None else None
            op = ops.get(x)[1] if isinstance(x, int) and x in ops else None
            names.append(op.name if op is not None else None)
            oa = op.args if op is not None else None
            dims.append(_raw(oa.input_dims) if oa is not None else None)
            types.append(_raw(oa.input_types) if oa is not None else None)
            conc.append(_raw(oa.concrete) if oa is not None else None)
            call.append(call_ids.setdefault(x if op is not None else ("launch", int(i)), len(call_ids)))
        out.windows.append(CaptureWindow(tuple(kinds), tuple(kernels), tuple(names), tuple(dims), tuple(types),
                                         tuple(conc), tuple(call)))
    if not begins:
        out.notes.append("no StreamBeginCapture in the trace: not a graph-capture trace")
    return out


# ----------------------------------------------------------------------------- step sequence info

_SEQ_GROUP = re.compile(r"(?:context|generation)_(\d+)\(sq(\d+)sk(\d+)sqsq(\d+)sqsk(\d+)\)")


def step_seq_info(name: Any, phase: Any = None, batch: Any = None, tokens: Any = None, kv_tokens: Any = None) -> SeqInfo | None:
    """Sequence statistics of one step for varlen attention ops (:class:`~.opcost.SeqInfo`).

    vLLM v1 markers ``execute_T_context_N(sqA skB sqsqC sqskD)_generation_M(...)`` give
    ``sum Sq``, ``sum Sk``, ``sum Sq**2`` and ``sum Sq*Sk`` per group; a varlen attention call
    covers both groups, so they are added. Otherwise the step table's batch and tokens
    (SGLang ``step[EXTEND bs=15 toks=15360]``: equal split, no cached prefix) or, for a decode
    step, batch and KV tokens (one query token per sequence). None when nothing is known.
    """
    def _i(v):
        return None if v is None or (isinstance(v, float) and math.isnan(v)) else int(v)

    groups = _SEQ_GROUP.findall(name) if isinstance(name, str) else []
    if groups:
        n, sq, sk, sqsq, sqsk = (sum(int(g[i]) for g in groups) for i in range(5))
        return SeqInfo(batch=n, q_tokens=sq, kv_tokens=sk, q_sq_sum=sqsq, qk_sum=sqsk)
    batch, tokens, kv_tokens = _i(batch), _i(tokens), _i(kv_tokens)
    if phase == "decode" and batch and kv_tokens:
        return SeqInfo(batch=batch, q_tokens=batch, kv_tokens=kv_tokens, q_sq_sum=batch, qk_sum=kv_tokens)
    if batch:
        return SeqInfo(batch=batch, q_tokens=tokens)
    return None


def step_seq_infos(trace: Trace, steps: pd.DataFrame) -> list[SeqInfo | None]:
    """:func:`step_seq_info` of each row of ``steps`` (the step table), reading the per-sequence
    sums from the step's own name or, when the step was named by an inner marker (SGLang's
    ``step[EXTEND ...]`` inside the ``execute_..._context_N(sq..sqsq..)`` range that vLLM-style
    runners and TraceLens' splitter add), from the innermost CPU annotation with such sums
    that is open at the step's start."""
    n = len(steps)
    col = {c: (steps[c].tolist() if c in steps else [None] * n) for c in ("name", "phase", "batch", "tokens", "kv_tokens")}
    out = [step_seq_info(*(col[c][i] for c in ("name", "phase", "batch", "tokens", "kv_tokens"))) for i in range(n)]
    need = [i for i in range(n) if not (isinstance(col["name"][i], str) and _SEQ_GROUP.search(col["name"][i]))]
    ann = trace.annotations
    if not need or len(ann) == 0:
        return out
    codes, cats = factorize(ann["name"])
    hit_cat = np.array([isinstance(c, str) and _SEQ_GROUP.search(c) is not None for c in cats], dtype=bool)
    if not hit_cat.any():
        return out
    rows = np.nonzero(hit_cat[codes] & (codes >= 0))[0]
    a_start = ann["start_ns"].to_numpy(dtype=np.int64)[rows]
    a_end = ann["end_ns"].to_numpy(dtype=np.int64)[rows]
    t0 = steps["start_ns"].to_numpy(dtype=np.int64)
    for i in need:
        open_ = np.nonzero((a_start <= t0[i]) & (a_end >= t0[i]))[0]
        if len(open_):
            j = rows[open_[np.argmax(a_start[open_])]]
            si = step_seq_info(cats[codes[j]], col["phase"][i])
            if si is not None:
                out[i] = si
    return out


# ----------------------------------------------------------------------------- the table


def _empty() -> pd.DataFrame:
    return pd.DataFrame({c: pd.Series([], dtype=object) for c in COLUMNS})


def _codes(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """(codes, uniques) of a column (pandas' hash table: ~25 ns per value on object arrays of a
    few distinct strings, 20x the dict loop of ``model.factorize``)."""
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):
        return factorize(values)
    arr = values.to_numpy() if isinstance(values, pd.Series) else np.asarray(values)
    c, u = pd.factorize(arr, sort=False, use_na_sentinel=False)
    u = np.asarray(u, dtype=object)
    na = pd.isna(u)
    if na.any():  # None is a value like any other: keep it None (pandas gives NaN)
        u[na] = None
    return c.astype(np.int64), u


def _pick_ops(ops: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """(sorted unique external ids >= 0, cpu_ops row of each): one op per id, the FLOP op
    first, then the innermost (latest start, earliest end). Loaders emit ops in id order, so
    the sort is usually skipped (a check costs ~1 ms per million ops)."""
    ext = ops["external_id"].to_numpy(dtype=np.int64)
    rows = np.nonzero(ext >= 0)[0]
    ext = ext[rows]
    if len(ext) > 1 and not (ext[1:] >= ext[:-1]).all():
        order = np.argsort(ext, kind="stable")
        ext, rows = ext[order], rows[order]
    if len(ext) > 1 and (ext[1:] == ext[:-1]).any():
        flop = ops["name"].isin(FLOP_OPS).to_numpy()[rows]
        order = np.lexsort((ops["end_ns"].to_numpy()[rows], -ops["start_ns"].to_numpy()[rows], ~flop, ext))
        ext, rows = ext[order], rows[order]
        first = np.ones(len(ext), dtype=bool)
        first[1:] = ext[1:] != ext[:-1]
        return ext[first], rows[first]
    return ext, rows


def _step_bs(steps: pd.DataFrame | None) -> np.ndarray | None:
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


class _Sources:
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


def _map_graph(g: pd.DataFrame, name_codes: np.ndarray, names: np.ndarray, captures: Sequence[CaptureMapping],
               step_bs: np.ndarray | None, src: np.ndarray, inst: np.ndarray, origin: np.ndarray,
               sources: _Sources, stats: dict) -> None:
    """Fill ``src``/``inst``/``origin`` (per activity of ``g``, in place) for graph-replayed
    activities that a capture window explains.

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
            origin[pos_act] = np.where(has_op & has_dims, _CAPTURE, np.where(has_op, _CAPTURE_NODIMS, _NO_OP))
            mapped += len(ls)
            unverified += 0 if verified else len(ls)
    stats["graph_launches_matched"] = mapped
    if unverified:
        stats["graph_launches_matched_by_count_only"] = unverified


# ----------------------------------------------------------------------------- MoE expert bytes

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


def _moe_kernel_bytes(ix: np.ndarray, kinst: np.ndarray, kstart: np.ndarray, dur: np.ndarray, frac: np.ndarray,
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


def kernel_table(trace: Trace, activities: pd.DataFrame | None, peak: GpuPeak | None = None,
                 capture: CaptureMapping | Sequence[CaptureMapping] | None = None,
                 steps: pd.DataFrame | None = None, moe: MoeLayerBytes | None = None) -> pd.DataFrame:
    """The per-kernel efficiency table of ``activities`` (kernels only; memcpy/memset are not
    kernels): the steps' rows first, then phase ``unknown`` (work no step claims), each sorted
    by ``total_ms`` descending.

    Args:
        trace: the loaded trace (its ``cpu_ops`` give operators and shapes).
        activities: ``Analysis.activities`` (name, kind, device, start_ns, end_ns,
            correlation, external_id, launch_kind, step, phase; category and name_id used
            when present).
        peak: the device's peaks, or None (then the ``peak_*_share`` columns and ``bound``
            are unknown).
        capture: graph-capture trace(s) from :func:`load_capture_mapping` to map kernels
            replayed from CUDA/HIP graphs back to ops and shapes; None: those rows say
            ``shapes_unknown``.
        steps: ``Analysis.steps`` (rows in the order ``activities.step`` indexes): step
            markers give varlen attention its per-sequence sums (:func:`step_seq_info`) and
            graph replays the padded batch to choose the capture for; optional.
        moe: per step, the routed-expert bytes one MoE layer reads
            (:func:`diagnose.analyzers.attainment.moe_layer_bytes`, from the model config;
            indexed like ``steps``): kernels of MoE op calls get expected bytes
            (:func:`_moe_kernel_bytes`; cost_model "moe"). None: MoE rows have no bytes.

    Returns:
        DataFrame, one row per (device, phase, op, input_dims, input_types, kernel, origin):

        - device (int), phase (str), op (str | None: the launching cpu_op),
          input_dims / input_types (str | None: its raw ``Input Dims`` / ``Input type`` JSON),
          kernel (str: full kernel name), category (str | None: kernel category),
        - calls (int: kernel launches), total_ms (float: summed kernel time, ms),
          mean_us (float: per call, µs), kernel_time_share (float: of the kernel time of this
          phase on this device, [0, 1]),
        - flops, bytes (float: FLOP and bytes of the rows' calls, apportioned by kernel time
          within multi-kernel op calls; NaN = unknown), flops_per_call, bytes_per_call,
        - achieved_tflops (flops / kernel time, 1e12 FLOP/s), achieved_tbps (bytes / kernel
          time, 1e12 B/s), peak_tflops_share (/ ``peak.dense_fp16_tflops``),
          peak_tbps_share (/ ``peak.memory_bandwidth_tbps``),
          arithmetic_intensity_flop_per_byte (flops / bytes), bound ("compute" when the
          intensity is at or above the ridge point peak FLOP/s / peak B/s, "memory" below,
          None when unknown),
        - cost_model ("gemm" | "attention" | "elementwise" | "norm" | "operands" | "moe" |
          None) and cost_note (the convention used, or why FLOPs are missing; "moe": expected
          routed-expert bytes, no FLOPs), op_source ("trace" | "capture" |
          None), shapes_unknown (None, or why the row has no shapes).

        Missing numbers are NaN (floats) or None (objects); :func:`kernel_records` turns NaN
        into None. ``df.attrs`` holds ``{"capture": {...} | None, "source_format": ...}``.

    Raises:
        KeyError: ``activities`` lacks one of the columns above.
    """
    if activities is None or len(activities) == 0:
        out = _empty()
        out.attrs = {"capture": None, "source_format": trace.source_format}
        return out
    is_k = (activities["kind"] == "kernel").to_numpy()
    if not is_k.any():
        out = _empty()
        out.attrs = {"capture": None, "source_format": trace.source_format}
        return out
    g = activities
    n_all = len(g)
    if "name_id" in g:
        name_codes = g["name_id"].to_numpy(dtype=np.int64)
        names = None
    else:
        name_codes, names = _codes(g["name"])
    src = np.full(n_all, -1, dtype=np.int64)      # index into sources
    inst = np.full(n_all, -1, dtype=np.int64)     # op call id (for apportioning)
    origin = np.full(n_all, _NO_OP, dtype=np.int64)
    sources = _Sources()
    nsys = str(trace.source_format).startswith("nsys")
    ops = trace.cpu_ops
    if nsys:
        origin[:] = _NSYS
    elif len(ops) == 0:
        origin[:] = _NO_OPS
    else:
        ext_sorted, rows = _pick_ops(ops)
        if len(ext_sorted):
            kext = g["external_id"].to_numpy(dtype=np.int64)
            pos = np.minimum(np.searchsorted(ext_sorted, kext), len(ext_sorted) - 1)
            hit = (kext >= 0) & (ext_sorted[pos] == kext)
            op_row = rows[pos[hit]]
            op_code, used = pd.factorize(op_row, sort=False)  # one source per op call used
            cols_used = [ops[c].take(used).to_numpy(dtype=object) if c in ops else np.full(len(used), None, dtype=object)
                         for c in ("name", "input_dims", "input_types", "concrete_inputs")]
            off = sources.extend(*cols_used)
            src[hit] = off + op_code
            inst[hit] = op_row
            has_dims = ~pd.isna(cols_used[1])
            origin[hit] = np.where(has_dims[op_code], _TRACE, _TRACE_NODIMS)
    graph = (g["launch_kind"].to_numpy(dtype=object) == "graph_launch") if "launch_kind" in g else np.zeros(n_all, bool)
    if not nsys:
        origin[graph & (src < 0)] = _GRAPH_NO_CAPTURE
    cap_stats = None
    if capture is not None and not nsys:
        caps = [capture] if isinstance(capture, CaptureMapping) else list(capture)
        cap_stats = {"files": [c.path for c in caps], "batch_sizes": [c.batch_size for c in caps],
                     "modes": [c.mode for c in caps], "windows": sum(len(c.windows) for c in caps),
                     "graph_launches": 0, "graph_launches_matched": 0,
                     "notes": [n for c in caps for n in c.notes]}
        if names is None:
            names = _names_of(g, name_codes)
        _map_graph(g, name_codes, names, caps, _step_bs(steps), src, inst, origin, sources, cap_stats)
        origin[origin == _GRAPH_NO_CAPTURE] = _GRAPH_UNMATCHED

    # ---- kernels only from here
    k = np.nonzero(is_k)[0]
    dur = (g["end_ns"].to_numpy(dtype=np.int64)[k] - g["start_ns"].to_numpy(dtype=np.int64)[k]).astype(np.float64)
    ksrc, korigin = src[k], origin[k]
    dev_c, dev_u = _codes(g["device"].iloc[k] if len(k) < n_all else g["device"])
    ph_col = g["phase"] if "phase" in g else pd.Series(["unknown"] * n_all, index=g.index, dtype=object)
    ph_c, ph_u = _codes(ph_col.iloc[k] if len(k) < n_all else ph_col)
    kname = name_codes[k]
    # operator identity: (name, dims, types, concrete) codes over the referenced sources;
    # JSON re-encoded compactly so that formatting (pretty-printed traces) does not split keys
    n_src = sources.n
    src_cols = sources.columns()
    if n_src:  # Concrete Inputs only where the cost reads them: other ops keep one row per shape
        reads = pd.Series(src_cols[0], dtype=object).isin(CONCRETE_OPS).to_numpy()
        src_cols[3] = np.where(reads, src_cols[3], None)
    cols = [_column_codes(c, json=i > 0) for i, c in enumerate(src_cols)]
    if n_src:
        key = _combine([c for c, _ in cols], [len(u) for _, u in cols])
        opkey_of_src = key
        n_opkey = int(key.max()) + 1
        rep_src = _first_index(key, n_opkey)
    else:
        opkey_of_src = np.zeros(0, dtype=np.int64)
        n_opkey = 0
        rep_src = np.zeros(0, dtype=np.int64)
    (name_c, name_u), (dims_c, dims_u), (types_c, types_u), (conc_c, conc_u) = cols
    kop = np.where(ksrc >= 0, opkey_of_src[np.maximum(ksrc, 0)] if n_src else -1, -1)
    # row key: device, phase, op key, kernel name, origin
    n_names = int(name_codes.max()) + 1 if len(name_codes) else 1
    gid = _combine([dev_c, ph_c, kop + 1, kname, korigin], [len(dev_u), len(ph_u), n_opkey + 1, n_names, _N_ORIGINS])
    n_rows = int(gid.max()) + 1
    calls = np.bincount(gid, minlength=n_rows)
    total_ns = np.bincount(gid, weights=dur, minlength=n_rows)
    first = _first_index(gid, n_rows)
    # phase kernel time per (device, phase)
    dp_c = _combine([dev_c, ph_c], [len(dev_u), len(ph_u)])
    phase_ns = np.bincount(dp_c, weights=dur)[dp_c]
    # per-kernel cost: (op key, step sequence info) for attention, op key otherwise
    seq_code = np.full(len(k), -1, dtype=np.int64)
    seq_list: list[SeqInfo] = []
    if steps is not None and len(steps) and "step" in g and n_opkey:
        seq_ix: dict[SeqInfo, int] = {}
        step_code = np.full(len(steps), -1, dtype=np.int64)
        for i, si in enumerate(step_seq_infos(trace, steps)):
            if si is not None:
                step_code[i] = seq_ix.setdefault(si, len(seq_ix))
        seq_list = list(seq_ix)
        kst = g["step"].to_numpy(dtype=np.int64)[k]
        ok = (kst >= 0) & (kst < len(steps))
        seq_code[ok] = step_code[kst[ok]]
    is_attn_key = np.array([name_u[name_c[rep_src[i]]] in ATTENTION_OPS for i in range(n_opkey)], dtype=bool)
    kseq = np.where((kop >= 0) & is_attn_key[np.maximum(kop, 0)] if n_opkey else False, seq_code, -1)
    ckey = kop * (len(seq_list) + 1) + (kseq + 1)
    ck_c, ck_u = pd.factorize(ckey, sort=False)
    n_ck = len(ck_u)
    cost_flops = np.full(n_ck, np.nan)
    cost_bytes = np.full(n_ck, np.nan)
    cost_model = np.full(n_ck, None, dtype=object)
    cost_note = np.full(n_ck, None, dtype=object)
    parsed: dict = {}

    def _parse(text):
        if text is None:
            return None
        if text not in parsed:
            v = _dec.decode(text)
            parsed[text] = v if isinstance(v, list) else None
        return parsed[text]

    for i, ckv in enumerate(ck_u):
        opk = int(ckv) // (len(seq_list) + 1)
        sq = int(ckv) % (len(seq_list) + 1) - 1
        if opk < 0:
            continue
        s = rep_src[opk]
        c = op_cost(name_u[name_c[s]], _parse(dims_u[dims_c[s]]), _parse(types_u[types_c[s]]),
                    concrete=_parse(conc_u[conc_c[s]]), seqs=seq_list[sq] if sq >= 0 else None)
        if c.flops is not None:
            cost_flops[i] = c.flops
        if c.bytes is not None:
            cost_bytes[i] = c.bytes
        cost_model[i], cost_note[i] = c.model, c.note
    # apportion each op call's cost to its kernels by kernel time
    kinst = inst[k]
    has_inst = kinst >= 0
    frac = np.ones(len(k))
    if has_inst.any():
        ic, _ = pd.factorize(kinst[has_inst], sort=False)
        ins_ns = np.bincount(ic, weights=dur[has_inst])
        ins_n = np.bincount(ic)
        d = dur[has_inst]
        frac[has_inst] = np.where(ins_ns[ic] > 0, d / np.where(ins_ns[ic] > 0, ins_ns[ic], 1), 1.0 / ins_n[ic])
    fk = cost_flops[ck_c] * frac
    bk = cost_bytes[ck_c] * frac
    # MoE op calls: expected routed-expert bytes of the layer at the step's tokens
    k_model = np.full(len(k), None, dtype=object)
    k_note = np.full(len(k), None, dtype=object)
    k_layer = np.full(len(k), np.nan)
    if n_opkey:
        is_moe_key = np.array([is_moe_op(name_u[name_c[rep_src[i]]]) for i in range(n_opkey)], dtype=bool)
        kmoe = (kop >= 0) & is_moe_key[np.maximum(kop, 0)]
        if kmoe.any():
            if names is None:
                names = _names_of(g, name_codes)
            kst = g["step"].to_numpy(dtype=np.int64)[k] if "step" in g else np.full(len(k), -1, dtype=np.int64)
            kstart = g["start_ns"].to_numpy(dtype=np.int64)[k]
            _moe_kernel_bytes(np.nonzero(kmoe)[0], inst[k], kstart, dur, frac, kname, names, kst, moe,
                              bk, k_model, k_note, k_layer)
    row_flops = np.bincount(gid, weights=np.nan_to_num(fk), minlength=n_rows)
    row_flops[np.bincount(gid, weights=np.isnan(fk), minlength=n_rows) > 0] = np.nan
    row_bytes = np.bincount(gid, weights=np.nan_to_num(bk), minlength=n_rows)
    row_bytes[np.bincount(gid, weights=np.isnan(bk), minlength=n_rows) > 0] = np.nan
    # row attributes from the first kernel of each row
    fk_i = first
    r_src = ksrc[fk_i]
    r_orig = korigin[fk_i]
    if names is None:
        names = _names_of(g, name_codes)
    kernel_names = names[kname[fk_i]]
    cat = g["category"].take(k[fk_i]).to_numpy(dtype=object) if "category" in g else np.full(n_rows, None, dtype=object)
    has_src = r_src >= 0
    rs = np.maximum(r_src, 0)
    op_name = np.where(has_src, np.asarray(name_u, dtype=object)[name_c[rs]] if n_src else None, None)
    op_dims = np.where(has_src, np.asarray(dims_u, dtype=object)[dims_c[rs]] if n_src else None, None)
    op_types = np.where(has_src, np.asarray(types_u, dtype=object)[types_c[rs]] if n_src else None, None)
    with np.errstate(divide="ignore", invalid="ignore"):
        tflops = row_flops / total_ns / 1e3  # FLOP/ns = 1e9 FLOP/s
        tbps = row_bytes / total_ns / 1e3
        ai = row_flops / row_bytes
        share = total_ns / phase_ns[fk_i]
    tflops[total_ns <= 0] = np.nan
    tbps[total_ns <= 0] = np.nan
    ai[~np.isfinite(ai)] = np.nan
    pk_f = peak.dense_fp16_tflops if peak is not None else None
    pk_b = peak.memory_bandwidth_tbps if peak is not None else None
    ridge = peak.ridge_flop_per_byte if peak is not None else None
    rc = ck_c[fk_i]
    r_model = cost_model[rc]
    r_note = cost_note[rc].copy()
    moe_row = pd.notna(k_note[fk_i])
    if moe_row.any():
        r_model[moe_row] = k_model[fk_i][moe_row]
        r_note[moe_row] = k_note[fk_i][moe_row]
        # a row over steps with unequal expert bytes: its note's numbers are the first step's
        lo = np.full(n_rows, np.inf)
        hi = np.full(n_rows, -np.inf)
        kl = np.where(np.isnan(k_layer), -1.0, k_layer)
        np.minimum.at(lo, gid, kl)
        np.maximum.at(hi, gid, kl)
        varies = moe_row & (lo != hi) & (r_model == "moe")
        r_note[varies] = [f"{t} (numbers of the row's first step; the expert bytes vary by step)" for t in r_note[varies]]
    # Attention work depends on what the shapes do not show (sliding windows, per-sequence
    # lengths): a count the device could not have done in the time is an over-count, not a
    # measurement. Such rows lose their FLOPs and bytes.
    if pk_f or pk_b:
        over = (r_model == "attention") & (((tflops > pk_f) if pk_f else False) | ((tbps > pk_b) if pk_b else False))
        if over.any():
            for arr in (row_flops, row_bytes, tflops, tbps, ai):
                arr[over] = np.nan
            r_note[over] = ("counted work exceeds the device peak in the measured time: the shapes overstate it "
                            "(e.g. sliding-window layers counted with the full context); FLOPs and bytes dropped")
        # expected expert bytes assume uniform routing (the most experts touched): above the
        # peak bandwidth, real routing touched fewer experts than that estimate
        over = (r_model == "moe") & ((tbps > pk_b) if pk_b else False)
        if over.any():
            for arr in (row_bytes, tbps, ai):
                arr[over] = np.nan
            r_note[over] = ("expected expert bytes exceed the device peak bandwidth in the measured time: routing touched "
                            "fewer experts than the uniform-routing estimate; bytes dropped")
    bound = np.full(n_rows, None, dtype=object)
    if ridge:
        known = ~np.isnan(ai)
        bound[known] = np.where(ai[known] >= ridge, "compute", "memory")
    data = {
        "device": dev_u[dev_c[fk_i]].astype(np.int64),
        "phase": ph_u[ph_c[fk_i]],
        "op": op_name,
        "input_dims": op_dims,
        "input_types": op_types,
        "kernel": kernel_names,
        "category": cat,
        "calls": calls.astype(np.int64),
        "total_ms": total_ns / 1e6,
        "mean_us": total_ns / calls / 1e3,
        "kernel_time_share": share,
        "flops": row_flops,
        "bytes": row_bytes,
        "flops_per_call": row_flops / calls,
        "bytes_per_call": row_bytes / calls,
        "achieved_tflops": tflops,
        "achieved_tbps": tbps,
        "peak_tflops_share": tflops / pk_f if pk_f else np.full(n_rows, np.nan),
        "peak_tbps_share": tbps / pk_b if pk_b else np.full(n_rows, np.nan),
        "arithmetic_intensity_flop_per_byte": ai,
        "bound": bound,
        "cost_model": r_model,
        "cost_note": r_note,
        "op_source": np.array([_ORIGIN_SOURCE.get(int(o)) for o in r_orig], dtype=object),
        "shapes_unknown": np.array([SHAPES_UNKNOWN.get(int(o)) for o in r_orig], dtype=object),
    }
    for c in _TEXT_COLUMNS:  # None stays None (pandas >= 3 would infer a str dtype with NaN)
        data[c] = pd.Series(np.asarray(data[c], dtype=object), dtype=object)
    out = pd.DataFrame(data)
    # the steps' rows first (the work the report is about), then work no step claims (the
    # previous step's tail, warm-up); each by time
    out = (out.assign(_outside=(out["phase"] == "unknown").to_numpy())
           .sort_values(["_outside", "total_ms"], ascending=[True, False], kind="stable")
           .drop(columns="_outside").reset_index(drop=True))
    if cap_stats is not None:
        cap_stats["kernels_mapped"] = int(np.isin(korigin, (_CAPTURE, _CAPTURE_NODIMS)).sum())
    out.attrs = {"capture": cap_stats, "source_format": trace.source_format}
    return out


def _combine(codes: list[np.ndarray], sizes: list[int]) -> np.ndarray:
    """Dense codes (first-seen order) of the tuples of ``codes`` (each in [0, size)); pairs
    are folded one column at a time so no product of sizes can overflow int64."""
    out = codes[0].astype(np.int64)
    for c, n in zip(codes[1:], sizes[1:]):
        out = pd.factorize(out * (n + 1) + c, sort=False)[0].astype(np.int64)
    return out if len(codes) > 1 else pd.factorize(out, sort=False)[0].astype(np.int64)


def _first_index(codes: np.ndarray, n: int) -> np.ndarray:
    """Position of the first occurrence of each code 0..n-1 in ``codes`` (all present)."""
    first = np.full(n, len(codes), dtype=np.int64)
    np.minimum.at(first, codes, np.arange(len(codes), dtype=np.int64))
    return first


def _names_of(g: pd.DataFrame, name_codes: np.ndarray) -> np.ndarray:
    """Names indexed by code, from the activities' name column."""
    n = int(name_codes.max()) + 1 if len(name_codes) else 0
    return g["name"].to_numpy(dtype=object)[_first_index(name_codes, n)]


def _compact(raw: Any) -> str | None:
    """Raw ``Input Dims``-style JSON (bytes or str) re-encoded without whitespace; None stays."""
    if raw is None:
        return None
    if isinstance(raw, (bytes, bytearray, memoryview)):
        raw = bytes(raw)
    try:
        return msgspec.json.encode(_dec.decode(raw)).decode()
    except (msgspec.DecodeError, TypeError, UnicodeDecodeError):
        return None


def _column_codes(values: np.ndarray, json: bool) -> tuple[np.ndarray, list]:
    """(codes, uniques) of one source column; JSON columns compacted on their uniques."""
    c, u = _codes(values)
    if not json:
        return c, list(u)
    c2, u2 = _codes(np.array([_compact(x) for x in u], dtype=object))
    return (c2[c] if len(c) else c), list(u2)


def kernel_records(table: pd.DataFrame, top: int | None = None) -> list[dict[str, Any]]:
    """JSON-ready rows of :func:`kernel_table` (NaN -> None, numpy scalars -> Python), the
    first ``top`` rows (all when None)."""
    rows = table.head(top) if top is not None else table
    out = []
    for r in rows.to_dict("records"):
        rec = {}
        for c, v in r.items():
            if isinstance(v, (float, np.floating)):
                v = None if math.isnan(v) else float(v)
            elif isinstance(v, np.integer):
                v = int(v)
            rec[c] = v
        out.append(rec)
    return out


#: Rows of the kernel table in the JSON report (the notebook API keeps the whole table).
KERNEL_TABLE_ROWS = 20
FINDINGS = ()


def run(ctx) -> None:
    """The kernel table of the analysed trace: ``ctx.extra["kernel_table"]`` (top
    :data:`KERNEL_TABLE_ROWS` rows, JSON-ready) and ``ctx.extra["_kernel_table"]`` (the whole
    DataFrame). ``--capture-trace`` maps kernels replayed from CUDA graphs to ops and shapes
    (the quality note ``graph_kernels_no_launch`` then says how many it mapped); a MoE model
    config gives MoE kernels their expected expert bytes
    (:func:`diagnose.analyzers.attainment.moe_layer_bytes`, computed by the attainment analyzer).

    Raises:
        TraceFormatError: the capture trace cannot be read.
    """
    inp = ctx.attainment_inputs
    capture = load_capture_mapping(ctx.options.capture_trace) if ctx.options.capture_trace else None
    kt = kernel_table(ctx.trace, ctx.activities, inp.peak if inp is not None else None, capture, ctx.steps,
                      moe=ctx.extra.get("_moe_layer_bytes"))
    if capture is not None:
        _reword_graph_note(ctx, kt)
    ctx.extra["_kernel_table"] = kt
    rows = kernel_records(kt, KERNEL_TABLE_ROWS)
    for r in rows:
        for k, v in r.items():
            if isinstance(v, float):
                r[k] = round(v, 6)
    ctx.extra["kernel_table"] = rows
    if capture is not None:
        ctx.extra["capture"] = {k: v for k, v in (kt.attrs.get("capture") or {}).items()} or {"path": ctx.options.capture_trace}


def _reword_graph_note(ctx, kt: pd.DataFrame) -> None:
    """The launches analyzer's ``graph_kernels_no_launch`` note says op-level attribution is
    unavailable for graph-replayed kernels; once the capture trace mapped them to their ops,
    say how many it mapped instead (code and count unchanged)."""
    mapped = int((kt.attrs.get("capture") or {}).get("kernels_mapped") or 0)
    g = ctx.activities
    if not mapped or g is None or "launch_kind" not in g:
        return
    is_graph = g["launch_kind"].to_numpy(dtype=object) == "graph_launch"
    n_kernels = int((is_graph & (g["kind"].to_numpy(dtype=object) == "kernel")).sum())
    n_launch = int(pd.unique(g["correlation"].to_numpy()[is_graph]).size)
    for i, q in enumerate(ctx.quality):
        if q.code != "graph_kernels_no_launch":
            continue
        n = q.count if q.count is not None else int(is_graph.sum())
        if mapped >= n_kernels:
            tail = f"the capture trace (--capture-trace) mapped all {mapped} replayed kernels to their operators and shapes"
        else:
            tail = (f"the capture trace (--capture-trace) mapped {mapped} of the {n_kernels} replayed kernels to their "
                    "operators and shapes; op-level attribution unavailable for the rest")
        ctx.quality[i] = dataclasses.replace(q, message=f"{n} kernels replayed from {n_launch} graph launch(es): "
                                                        f"no per-kernel launch call; {tail}")
        break
