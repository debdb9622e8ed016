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
them by weight shape (gate_up 2/3, down 1/3; :func:`moe_kernel_bytes`), so each expert
kernel row has an achieved TB/s.

**CUDA/HIP graph replays** carry no operator: their kernels are mapped back through the
graph's *capture* trace the way TraceLens does (``Trace2Tree/trace_capture_merge_experimental
.py``, ``merge_capture_trace_into_graph``): the launches a capture window
(``StreamBeginCapture`` .. ``StreamEndCapture``) records on the CPU are the graph's nodes in
order, so the i-th launch of the window is the i-th activity of each replay of that graph
(per kernel name in order when a scheduler reordered them), and the launch's ``External id``
gives the op and shapes. See :func:`diagnose.trace.capture.load_capture_mapping`.

**nsys traces** hold no operator shapes: rows give time per kernel only (``op`` None,
``shapes_unknown`` says why).

Cost: vectorised over kernels (codes and ``np.bincount``); ``Input Dims`` strings are parsed
once per distinct (op, dims, types) and a Python loop runs only per distinct op shape and,
with a capture trace, per distinct graph layout.
"""
from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Sequence
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.calltree import assign_ops, link_call_tree
from diagnose.analyzers.graphmap import (
    ORIGIN_CALL_TREE_NODIMS,
    ORIGIN_CAPTURE,
    ORIGIN_CAPTURE_NODIMS,
    ORIGIN_GRAPH_NO_CAPTURE,
    ORIGIN_GRAPH_UNMATCHED,
    N_ORIGINS,
    ORIGIN_NO_OP,
    ORIGIN_NO_OPS,
    ORIGIN_NSYS,
    ORIGIN_SOURCE,
    ORIGIN_TRACE,
    ORIGIN_TRACE_NODIMS,
    OpSources,
    map_graph,
    step_padded_sizes,
)
from diagnose.analyzers.moebytes import moe_kernel_bytes
from diagnose.analyzers.nesting import lexsort
from diagnose.analyzers.timeline import union_by_group_ns
from diagnose.analyzers.precision import row_dtypes, row_peaks
from diagnose.analyzers.opcost import (
    CONCRETE_OPS,
    FLOP_OPS,
    MoeLayerBytes,
    SeqInfo,
    is_attention_op,
    is_moe_op,
    op_cost,
)
from diagnose.hardware import GpuPeak
from diagnose.model import Capture, KernelRow
from diagnose.trace.capture import CaptureMapping
from diagnose.trace.model import QualityIssue, Trace, factorize

_dec = msgspec.json.Decoder()

#: The kernel table's columns:
#:
#: - device (int), phase (str), op (str | None: the launching cpu_op),
#:   input_dims / input_types (str | None: its raw ``Input Dims`` / ``Input type`` JSON),
#:   kernel (str: full kernel name), category (str | None: kernel category),
#: - calls (int: kernel launches), total_ms (float: summed kernel time, ms),
#:   mean_us (float: per call, µs), kernel_time_share (float: of the kernel time of this
#:   phase on this device, the union of its kernels' intervals over streams; [0, 1] unless
#:   one row's kernels overlap each other on several streams),
#: - flops, bytes (float: FLOP and bytes of the rows' calls, apportioned by kernel time
#:   within multi-kernel op calls; NaN = unknown), flops_per_call, bytes_per_call,
#: - achieved_tflops (flops / kernel time, 1e12 FLOP/s), achieved_tbps (bytes / kernel
#:   time, 1e12 B/s), peak_tflops_share (/ the row's dtype peak ``peak_tflops``),
#:   peak_tbps_share (/ ``peak.memory_bandwidth_tbps``),
#:   arithmetic_intensity_flop_per_byte (flops / bytes), bound ("compute" when the
#:   intensity is at or above the row's ridge point ``peak_tflops`` / peak B/s, "memory"
#:   below, None when unknown),
#: - cost_model ("gemm" | "attention" | "elementwise" | "norm" | "operands" | "moe" |
#:   None) and cost_note (the convention used, or why FLOPs are missing; "moe": expected
#:   routed-expert bytes, no FLOPs), op_source ("trace" | "capture" | "call_tree" |
#:   None), shapes_unknown (None, or why the row has no shapes),
#: - dtype (:data:`diagnose.vocab.DTYPES` or None), dtype_source ("kernel name" | "operator
#:   input types" | None), peak_tflops (the compute peak of the row's dtype,
#:   :meth:`diagnose.hardware.GpuPeak.peak_tflops_for`; NaN without a peak): see
#:   :mod:`diagnose.analyzers.precision`.
#:
COLUMNS = ("device", "phase", "op", "input_dims", "input_types", "kernel", "category", "calls", "total_ms",
           "mean_us", "kernel_time_share", "flops", "bytes", "flops_per_call", "bytes_per_call",
           "achieved_tflops", "achieved_tbps", "peak_tflops_share", "peak_tbps_share",
           "arithmetic_intensity_flop_per_byte", "bound", "cost_model", "cost_note", "op_source", "shapes_unknown",
           "dtype", "dtype_source", "peak_tflops")

_TEXT_COLUMNS = ("phase", "op", "input_dims", "input_types", "kernel", "category", "bound", "cost_model", "cost_note",
                 "op_source", "shapes_unknown", "dtype", "dtype_source")

SHAPES_UNKNOWN = {
    ORIGIN_TRACE_NODIMS: "operator recorded without shapes (profile with record_shapes=True)",
    ORIGIN_CAPTURE_NODIMS: "operator in the capture trace recorded without shapes (record_shapes=True)",
    ORIGIN_NO_OP: "no operator with this kernel's external id (launched outside a recorded operator, "
            "e.g. a Triton kernel called from Python, or before the profiling window)",
    ORIGIN_GRAPH_NO_CAPTURE: "replayed from a CUDA/HIP graph: no operator launches it in this trace "
                       "(give the graph's capture trace)",
    ORIGIN_GRAPH_UNMATCHED: "replayed from a CUDA/HIP graph: no window of the capture trace matches this graph launch's activities",
    ORIGIN_NSYS: "Nsight Systems trace: no operator shapes (time per kernel only)",
    ORIGIN_NO_OPS: "the trace holds no operator (cpu_op) events: time per kernel only",
    ORIGIN_CALL_TREE_NODIMS: "operator (found through the CPU call tree) recorded without shapes (profile with record_shapes=True)",
}


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
        order = lexsort((ops["end_ns"].to_numpy()[rows], -ops["start_ns"].to_numpy()[rows], ~flop, ext))
        ext, rows = ext[order], rows[order]
        first = np.ones(len(ext), dtype=bool)
        first[1:] = ext[1:] != ext[:-1]
        return ext[first], rows[first]
    return ext, rows




def kernel_table(trace: Trace, activities: pd.DataFrame | None, peak: GpuPeak | None = None,
                 capture: CaptureMapping | Sequence[CaptureMapping] | None = None,
                 steps: pd.DataFrame | None = None, moe: MoeLayerBytes | None = None,
                 per_kernel: dict | None = None) -> pd.DataFrame:
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
        capture: graph-capture trace(s) from :func:`~diagnose.trace.capture.load_capture_mapping` to map kernels
            replayed from CUDA/HIP graphs back to ops and shapes; None: those rows say
            ``shapes_unknown``.
        steps: ``Analysis.steps`` (rows in the order ``activities.step`` indexes): step
            markers give varlen attention its per-sequence sums (:func:`step_seq_info`) and
            graph replays the padded batch to choose the capture for; optional.
        moe: per step, the routed-expert bytes one MoE layer reads
            (:func:`diagnose.analyzers.attainment.moe_layer_bytes`, from the model config;
            indexed like ``steps``): kernels of MoE op calls get expected bytes
            (:func:`moe_kernel_bytes`; cost_model "moe"). None: MoE rows have no bytes.
        per_kernel: a dict to fill with the per-kernel arrays of :func:`_per_kernel` (rows, op,
            flops, bytes, module); per-layer time reads them.

    Returns:
        DataFrame, one row per (device, phase, op, input_dims, input_types, kernel, origin),
        with the :data:`COLUMNS` (described there).

        Missing numbers are NaN (floats) or None (objects); :func:`kernel_records` turns NaN
        into None. ``df.attrs`` holds ``{"capture": {...} | None, "source_format": ...}``.

    Raises:
        KeyError: ``activities`` lacks one of the columns above.
    """
    is_k = (activities["kind"] == "kernel").to_numpy() if activities is not None else np.zeros(0, bool)
    if not is_k.any():
        out = _empty()
        out.attrs = {"capture": None, "source_format": trace.source_format}
        return out
    g = activities
    links = _link_ops(trace, g, capture, steps)
    name_codes, src, origin, sources, cap_stats = links.name_codes, links.src, links.origin, links.sources, links.cap_stats
    n_all = len(g)
    k = np.nonzero(is_k)[0]  # kernels only from here
    dur = (g["end_ns"].to_numpy(dtype=np.int64)[k] - g["start_ns"].to_numpy(dtype=np.int64)[k]).astype(np.float64)
    ksrc, korigin = src[k], origin[k]
    dev_c, dev_u = _codes(g["device"].iloc[k] if len(k) < n_all else g["device"])
    ph_col = g["phase"] if "phase" in g else pd.Series(["unknown"] * n_all, index=g.index, dtype=object)
    ph_c, ph_u = _codes(ph_col.iloc[k] if len(k) < n_all else ph_col)
    kname = name_codes[k]
    n_src, cols, opkey_of_src, n_opkey, rep_src = _op_keys(sources)
    kop = np.where(ksrc >= 0, opkey_of_src[np.maximum(ksrc, 0)] if n_src else -1, -1)
    # row key: device, phase, op key, kernel name, origin
    n_names = int(name_codes.max()) + 1 if len(name_codes) else 1
    gid = _combine([dev_c, ph_c, kop + 1, kname, korigin], [len(dev_u), len(ph_u), n_opkey + 1, n_names, N_ORIGINS])
    n_rows = int(gid.max()) + 1
    calls = np.bincount(gid, minlength=n_rows)
    total_ns = np.bincount(gid, weights=dur, minlength=n_rows)
    first = _first_index(gid, n_rows)
    # phase kernel time per (device, phase): the union of its kernels' intervals (streams merged),
    # the one denominator of every share of kernel time
    dp_c = _combine([dev_c, ph_c], [len(dev_u), len(ph_u)])
    phase_ns = union_by_group_ns(g["start_ns"].to_numpy(dtype=np.int64)[k], g["end_ns"].to_numpy(dtype=np.int64)[k],
                                 dp_c, int(dp_c.max()) + 1).astype(np.float64)[dp_c]
    ck_c, cost_flops, cost_bytes, cost_model, cost_note = _kernel_costs(trace, g, k, steps, kop, n_opkey, cols, rep_src)
    fk, bk, k_model, k_note, k_layer, names = _apportion(g, k, links, dur, kname, kop, n_opkey, cols, rep_src,
                                                         cost_flops[ck_c], cost_bytes[ck_c], moe)
    row_flops, row_bytes = _row_sum(gid, fk, n_rows), _row_sum(gid, bk, n_rows)
    # row attributes from the first kernel of each row
    fk_i = first
    r_src, r_orig = ksrc[fk_i], korigin[fk_i]
    if names is None:
        names = _names_of(g, name_codes)
    kernel_names = names[kname[fk_i]]
    cat = g["category"].take(k[fk_i]).to_numpy(dtype=object) if "category" in g else np.full(n_rows, None, dtype=object)
    op_name, op_dims, op_types = (_row_op_column(r_src, n_src, codes, uniques) for codes, uniques in cols[:3])
    tflops, tbps, ai, share = _rates(row_flops, row_bytes, total_ns, phase_ns[fk_i])
    dtype, dtype_src = row_dtypes(kernel_names, op_name, op_types)
    # each row against its dtype's compute peak
    pk_f, pk_b = row_peaks(dtype, peak), (peak.memory_bandwidth_tbps if peak is not None else None)
    r_model, r_note = _row_models(cost_model[ck_c[fk_i]], cost_note[ck_c[fk_i]].copy(), k_model, k_note, k_layer, fk_i, gid)
    if peak is not None:
        _drop_over_peak(r_model, r_note, tflops, tbps, ai, row_flops, row_bytes, pk_f, pk_b)
    bound = _bounds(ai, pk_f, pk_b)
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
        "peak_tflops_share": tflops / pk_f,
        "peak_tbps_share": tbps / pk_b if pk_b else np.full(n_rows, np.nan),
        "arithmetic_intensity_flop_per_byte": ai,
        "bound": bound,
        "cost_model": r_model,
        "cost_note": r_note,
        "op_source": np.array([ORIGIN_SOURCE.get(int(o)) for o in r_orig], dtype=object),
        "shapes_unknown": np.array([SHAPES_UNKNOWN.get(int(o)) for o in r_orig], dtype=object),
        "dtype": dtype,
        "dtype_source": dtype_src,
        "peak_tflops": pk_f,
    }
    _per_kernel(per_kernel, k, ksrc, n_src, cols, gid, row_flops, row_bytes, fk, bk, links.modules)
    return _frame(data, korigin, cap_stats, trace.source_format)


def _per_kernel(out: dict | None, k: np.ndarray, ksrc: np.ndarray, n_src: int, cols: list, gid: np.ndarray,
                row_flops: np.ndarray, row_bytes: np.ndarray, fk: np.ndarray, bk: np.ndarray,
                modules: np.ndarray | None) -> None:
    """Fill ``out`` (:func:`kernel_table`'s ``per_kernel``; nothing when None) with per-kernel
    arrays (kernels only): rows (their positions in the activities), op (launching operator
    name or None), flops and bytes (apportioned; NaN where the kernel's row has none) and module
    (the capture trace's module path of a graph-replayed kernel, else None)."""
    if out is None:
        return
    name_c, name_u = cols[0]
    op_of = np.asarray(name_u, dtype=object)[name_c[np.maximum(ksrc, 0)]] if n_src else np.full(len(k), None, object)
    out.update(rows=k, op=np.where(ksrc >= 0, op_of, None), flops=np.where(np.isnan(row_flops[gid]), np.nan, fk),
               bytes=np.where(np.isnan(row_bytes[gid]), np.nan, bk),
               module=modules[k] if modules is not None else np.full(len(k), None, dtype=object))


def _bounds(ai: np.ndarray, pk_f: np.ndarray, pk_b: float | None) -> np.ndarray:
    """Per row, "compute" or "memory": its arithmetic intensity against the ridge point of its
    dtype's compute peak over the bandwidth (None where either is unknown)."""
    bound = np.full(len(ai), None, dtype=object)
    if pk_b:
        ridge = pk_f / pk_b
        known = ~np.isnan(ai) & ~np.isnan(ridge)
        bound[known] = np.where(ai[known] >= ridge[known], "compute", "memory")
    return bound


def _row_sum(gid: np.ndarray, per_kernel: np.ndarray, n_rows: int) -> np.ndarray:
    """Per row, the sum of its kernels' values; NaN when any of them is unknown."""
    out = np.bincount(gid, weights=np.nan_to_num(per_kernel), minlength=n_rows)
    out[np.bincount(gid, weights=np.isnan(per_kernel), minlength=n_rows) > 0] = np.nan
    return out


def _row_op_column(r_src: np.ndarray, n_src: int, codes: np.ndarray, uniques: list) -> np.ndarray:
    """One operator column (name, dims or types) per row from its first kernel's source; None
    where the row has no operator."""
    return np.where(r_src >= 0, np.asarray(uniques, dtype=object)[codes[np.maximum(r_src, 0)]] if n_src else None, None)


def _rates(row_flops: np.ndarray, row_bytes: np.ndarray, total_ns: np.ndarray, phase_ns: np.ndarray) -> tuple[np.ndarray, ...]:
    """(achieved TFLOP/s, TB/s, arithmetic intensity FLOP/B, share of the phase's kernel time)
    per row; NaN where the time is zero or the ratio undefined."""
    with np.errstate(divide="ignore", invalid="ignore"):
        tflops = row_flops / total_ns / 1e3  # FLOP/ns = 1e9 FLOP/s
        tbps = row_bytes / total_ns / 1e3
        ai = row_flops / row_bytes
        share = total_ns / phase_ns
    tflops[total_ns <= 0] = np.nan
    tbps[total_ns <= 0] = np.nan
    ai[~np.isfinite(ai)] = np.nan
    return tflops, tbps, ai, share


def _row_models(r_model: np.ndarray, r_note: np.ndarray, k_model: np.ndarray, k_note: np.ndarray, k_layer: np.ndarray,
                first: np.ndarray, gid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row's cost model and note (its first kernel's op cost), MoE rows' from their
    kernels' expected expert bytes; a row over steps with unequal expert bytes says its note's
    numbers are the first step's."""
    moe_row = pd.notna(k_note[first])
    if moe_row.any():
        r_model[moe_row] = k_model[first][moe_row]
        r_note[moe_row] = k_note[first][moe_row]
        lo = np.full(len(first), np.inf)
        hi = np.full(len(first), -np.inf)
        kl = np.where(np.isnan(k_layer), -1.0, k_layer)
        np.minimum.at(lo, gid, kl)
        np.maximum.at(hi, gid, kl)
        varies = moe_row & (lo != hi) & (r_model == "moe")
        r_note[varies] = [f"{t} (numbers of the row's first step; the expert bytes vary by step)" for t in r_note[varies]]
    return r_model, r_note


def _frame(data: dict, korigin: np.ndarray, cap_stats: dict | None, source_format: str) -> pd.DataFrame:
    """The table from its columns: the steps' rows first (the work the report is about), then
    work no step claims (the previous step's tail, warm-up), each by time; ``attrs`` with the
    capture statistics."""
    for c in _TEXT_COLUMNS:  # None stays None (pandas >= 3 would infer a str dtype with NaN)
        data[c] = pd.Series(np.asarray(data[c], dtype=object), dtype=object)
    out = pd.DataFrame(data)
    out = (out.assign(_outside=(out["phase"] == "unknown").to_numpy())
           .sort_values(["_outside", "total_ms"], ascending=[True, False], kind="stable")
           .drop(columns="_outside").reset_index(drop=True))
    if cap_stats is not None:
        cap_stats["kernels_mapped"] = int(np.isin(korigin, (ORIGIN_CAPTURE, ORIGIN_CAPTURE_NODIMS)).sum())
    out.attrs = {"capture": cap_stats, "source_format": source_format}
    return out


class _OpLinks(msgspec.Struct):
    """Per GPU activity: the source row of its operator (``src``, -1 none), its op call
    (``inst``) and the origin code; the operator sources; capture statistics."""

    name_codes: np.ndarray
    names: np.ndarray | None
    src: np.ndarray
    inst: np.ndarray
    origin: np.ndarray
    sources: OpSources
    cap_stats: dict | None
    modules: np.ndarray | None = None  # per activity: the capture's module path of a replayed kernel


def _link_ops(trace: Trace, g: pd.DataFrame, capture, steps: pd.DataFrame | None) -> _OpLinks:
    """Each activity's operator: by ``External id`` among the trace's ops, else through the
    graph capture (:func:`~diagnose.analyzers.graphmap.map_graph`)."""
    n_all = len(g)
    if "name_id" in g:
        name_codes = g["name_id"].to_numpy(dtype=np.int64)
        names = None
    else:
        name_codes, names = _codes(g["name"])
    src = np.full(n_all, -1, dtype=np.int64)      # index into sources
    inst = np.full(n_all, -1, dtype=np.int64)     # op call id (for apportioning)
    origin = np.full(n_all, ORIGIN_NO_OP, dtype=np.int64)
    sources = OpSources()
    nsys = str(trace.source_format).startswith("nsys")
    ops = trace.cpu_ops
    if nsys:
        origin[:] = ORIGIN_NSYS
    elif len(ops) == 0:
        origin[:] = ORIGIN_NO_OPS
    else:
        ext_sorted, rows = _pick_ops(ops)
        if len(ext_sorted):
            kext = g["external_id"].to_numpy(dtype=np.int64)
            pos = np.minimum(np.searchsorted(ext_sorted, kext), len(ext_sorted) - 1)
            hit = (kext >= 0) & (ext_sorted[pos] == kext)
            assign_ops(ops, hit, rows[pos[hit]], src, inst, origin, sources, ORIGIN_TRACE, ORIGIN_TRACE_NODIMS)
        link_call_tree(g, ops, src, inst, origin, sources)
    graph = (g["launch_kind"].to_numpy(dtype=object) == "graph_launch") if "launch_kind" in g else np.zeros(n_all, bool)
    if not nsys:
        origin[graph & (src < 0)] = ORIGIN_GRAPH_NO_CAPTURE
    cap_stats = None
    modules = None
    if capture is not None and not nsys:
        caps = [capture] if isinstance(capture, CaptureMapping) else list(capture)
        cap_stats = {"files": [c.path for c in caps], "batch_sizes": [c.batch_size for c in caps],
                     "modes": [c.mode for c in caps], "windows": sum(len(c.windows) for c in caps),
                     "graph_launches": 0, "graph_launches_matched": 0,
                     "notes": [n for c in caps for n in c.notes]}
        if names is None:
            names = _names_of(g, name_codes)
        modules = np.full(n_all, None, dtype=object)
        map_graph(g, name_codes, names, caps, step_padded_sizes(steps), src, inst, origin, sources, cap_stats, modules)
        origin[origin == ORIGIN_GRAPH_NO_CAPTURE] = ORIGIN_GRAPH_UNMATCHED

    return _OpLinks(name_codes, names, src, inst, origin, sources, cap_stats, modules)


def _op_keys(sources: OpSources) -> tuple[int, list, np.ndarray, int, np.ndarray]:
    """Operator identity codes over the referenced sources: (number of sources, per column
    (codes, uniques) for name, dims, types, concrete; op key of each source; number of op keys;
    the first source of each key)."""
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
    return n_src, cols, opkey_of_src, n_opkey, rep_src


def _kernel_costs(trace: Trace, g: pd.DataFrame, k: np.ndarray, steps: pd.DataFrame | None, kop: np.ndarray,
                  n_opkey: int, cols: list, rep_src: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The cost (:func:`~diagnose.analyzers.opcost.op_cost`) of each distinct (op key, step
    sequence info) the kernels ``k`` ran: (cost code per kernel, FLOPs, bytes, model, note per
    code). Attention ops read their step's sequence sums; a Python call per distinct key."""
    (name_c, name_u), (dims_c, dims_u), (types_c, types_u), (conc_c, conc_u) = cols
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
    is_attn_key = np.array([is_attention_op(name_u[name_c[rep_src[i]]]) for i in range(n_opkey)], dtype=bool)
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
    return ck_c, cost_flops, cost_bytes, cost_model, cost_note


def _apportion(g: pd.DataFrame, k: np.ndarray, links: _OpLinks, dur: np.ndarray, kname: np.ndarray, kop: np.ndarray,
               n_opkey: int, cols: list, rep_src: np.ndarray, kflops: np.ndarray, kbytes: np.ndarray,
               moe: MoeLayerBytes | None) -> tuple[np.ndarray, ...]:
    """Each op call's cost spread over its kernels by kernel time, and MoE calls' expected
    expert bytes (:func:`~diagnose.analyzers.moebytes.moe_kernel_bytes`): (FLOPs, bytes, cost
    model, note and layer bytes per kernel, kernel names)."""
    inst, names, name_codes = links.inst, links.names, links.name_codes
    (name_c, name_u) = cols[0]
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
    fk = kflops * frac
    bk = kbytes * frac
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
            moe_kernel_bytes(np.nonzero(kmoe)[0], inst[k], kstart, dur, frac, kname, names, kst, moe,
                              bk, k_model, k_note, k_layer)
    return fk, bk, k_model, k_note, k_layer, names


def _drop_over_peak(r_model: np.ndarray, r_note: np.ndarray, tflops: np.ndarray, tbps: np.ndarray, ai: np.ndarray,
                    row_flops: np.ndarray, row_bytes: np.ndarray, pk_f: np.ndarray, pk_b: float | None) -> None:
    """In place: rows whose counted work the device could not have done in the measured time
    (above the row's dtype peak ``pk_f`` or the bandwidth ``pk_b``) lose the over-counted
    numbers (attention: FLOPs and bytes; MoE: expected bytes)."""
    # Attention work depends on what the shapes do not show (sliding windows, per-sequence
    # lengths): a count the device could not have done in the time is an over-count, not a
    # measurement. Such rows lose their FLOPs and bytes.
    with np.errstate(invalid="ignore"):
        over_f = tflops > pk_f  # a NaN peak is never exceeded
    over_b = (tbps > pk_b) if pk_b else np.zeros(len(tbps), dtype=bool)
    over = (r_model == "attention") & (over_f | over_b)
    if over.any():
        for arr in (row_flops, row_bytes, tflops, tbps, ai):
            arr[over] = np.nan
        r_note[over] = ("counted work exceeds the device peak in the measured time: the shapes overstate it "
                        "(e.g. sliding-window layers counted with the full context); FLOPs and bytes dropped")
    # expected expert bytes assume uniform routing (the most experts touched): above the
    # peak bandwidth, real routing touched fewer experts than that estimate
    over = (r_model == "moe") & over_b
    if over.any():
        for arr in (row_bytes, tbps, ai):
            arr[over] = np.nan
        r_note[over] = ("expected expert bytes exceed the device peak bandwidth in the measured time: routing touched "
                        "fewer experts than the uniform-routing estimate; bytes dropped")


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


class KernelSection(msgspec.Struct, frozen=True):
    """The kernel table of the analysed trace (the whole DataFrame; the report keeps its top
    :data:`KERNEL_TABLE_ROWS` rows), what ``--capture-trace`` mapped, and the reworded
    ``graph_kernels_no_launch`` note once the capture mapped graph kernels to ops."""

    table: pd.DataFrame
    rows: list[KernelRow]
    capture: Capture | None = None
    notes: tuple[QualityIssue, ...] = ()
    per_kernel: dict = msgspec.field(default_factory=dict)


def kernel_section(trace: Trace, activities: pd.DataFrame, steps: pd.DataFrame, peak: GpuPeak | None,
                   capture: CaptureMapping | None, moe: MoeLayerBytes | None, graph_note: QualityIssue | None = None) -> KernelSection:
    """The kernel table (:func:`kernel_table`) and its report rows. ``capture`` maps kernels
    replayed from CUDA graphs to ops and shapes (``graph_note``, the launches analyzer's
    ``graph_kernels_no_launch`` issue, is then reworded to say how many it mapped); ``moe``
    (:func:`diagnose.analyzers.attainment.moe_layer_bytes`) gives MoE kernels their expected
    expert bytes."""
    per_kernel: dict = {}
    kt = kernel_table(trace, activities, peak, capture, steps, moe=moe, per_kernel=per_kernel)
    notes: tuple[QualityIssue, ...] = ()
    if capture is not None and graph_note is not None:
        reworded = _reword_graph_note(activities, kt, graph_note)
        notes = (reworded,) if reworded is not None else ()
    rows = []
    for r in kernel_records(kt, KERNEL_TABLE_ROWS):
        rows.append(KernelRow(**{k: round(v, 6) if isinstance(v, float) else v for k, v in r.items()}))
    cap = None
    if capture is not None:
        cap = Capture(**(kt.attrs.get("capture") or {})) if kt.attrs.get("capture") else Capture(path=capture.path)
    return KernelSection(kt, rows, cap, notes, per_kernel)


def _reword_graph_note(g: pd.DataFrame, kt: pd.DataFrame, q: QualityIssue) -> QualityIssue | None:
    """The launches analyzer's ``graph_kernels_no_launch`` note says op-level attribution is
    unavailable for graph-replayed kernels; once the capture trace mapped them to their ops,
    say how many it mapped instead (code and count unchanged)."""
    mapped = int((kt.attrs.get("capture") or {}).get("kernels_mapped") or 0)
    if not mapped or g is None or "launch_kind" not in g:
        return None
    is_graph = g["launch_kind"].to_numpy(dtype=object) == "graph_launch"
    n_kernels = int((is_graph & (g["kind"].to_numpy(dtype=object) == "kernel")).sum())
    n_launch = int(pd.unique(g["correlation"].to_numpy()[is_graph]).size)
    n = q.count if q.count is not None else int(is_graph.sum())
    if mapped >= n_kernels:
        tail = f"the capture trace (--capture-trace) mapped all {mapped} replayed kernels to their operators and shapes"
    else:
        tail = (f"the capture trace (--capture-trace) mapped {mapped} of the {n_kernels} replayed kernels to their "
                "operators and shapes; op-level attribution unavailable for the rest")
    return dataclasses.replace(q, message=f"{n} kernels replayed from {n_launch} graph launch(es): no per-kernel launch call; {tail}")
