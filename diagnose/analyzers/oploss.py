"""Loss against the roofline per op class: which kernels hold the time a phase spends above
its bound.

An op class is what a kernel does, at the level a fix applies to: the GEMMs of one weight
(``qkv``, ``o``, ``gate_up``, ``down``, ``lm_head``, ``router`` where a model config names the
weight shape, else ``GEMM K→N``), grouped as ``GEMMs``; and the other kernel categories
(``attention``, ``MoE experts``, ``norm``, ``elementwise``...). Its **roofline time** is the sum
over its kernel-table rows of ``max(FLOPs / peak FLOP/s of the row's dtype, bytes / peak
bandwidth)`` (docs/prefill-decode.md §3); its **loss** is its kernel time minus that, and its
**attainment** the roofline time over the kernel time (the share of the binding peak it
reaches: bandwidth when its bytes take longer than its FLOPs at the peaks, else compute).
Rows whose FLOPs and bytes are unknown (no shapes: a graph replay without its capture pass)
have no roofline time: their time is reported as ``unknown_ms`` and left out of the loss.

A class whose kernels average under 15 µs is ``small``: its loss is a per-kernel fixed cost
that fusing, not a faster kernel, removes; the small-kernel tax prices it
(:mod:`diagnose.analyzers.smallkernels`), so the findings rank the other classes.
"""
from __future__ import annotations

from diagnose.analyzers.base import declared

import math
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from diagnose.accounting import ModelSpec
from diagnose.hardware import GpuPeak
from diagnose.model import OpClass
from diagnose.model_cost import OpRole

FINDINGS = declared("oploss")

#: A class whose kernels average less than this is "small" (the small-kernel threshold of
#: :mod:`diagnose.analyzers.phasestats`: a kernel about as long as its launch).
SMALL_CLASS_US = 15.0
#: Classes kept per phase in the report (by loss).
MAX_CLASSES = 12
#: Labels of the kernel categories as op classes.
KIND_LABELS = {"gemm": "GEMMs", "attention": "attention", "moe": "MoE experts", "norm": "norm", "elementwise": "elementwise",
               "communication": "communication", "sampling": "sampling", "memcpy": "copies", "memset": "memset",
               "other": "other kernels"}
_dec = msgspec.json.Decoder()


def weight_roles(spec: ModelSpec | None, tp: int = 1) -> dict[tuple[int, int], str]:
    """``{(K, N): role}`` of the model's weight GEMMs on one rank (input width K, output
    width N): qkv, q, k/v, kv, o, gate_up, gate/up, down, lm_head, router. Empty without a
    config (or one whose widths ``tp`` does not divide)."""
    if spec is None:
        return {}
    try:
        h, d = spec.hidden_size, spec.head_dim
        q = spec.num_attention_heads * d // tp
        kv = max(1, spec.num_key_value_heads // tp) * d
        f = spec.intermediate_size // tp
        v = -(-spec.vocab_size // tp)
    except (TypeError, ZeroDivisionError, AttributeError):
        return {}
    roles = {(h, q + 2 * kv): "qkv", (h, q): "q", (h, kv): "k/v", (h, 2 * kv): "kv", (q, h): "o",
             (h, 2 * f): "gate_up", (h, f): "gate/up", (f, h): "down", (h, v): "lm_head"}
    if spec.moe is not None:
        roles[(h, spec.moe.num_experts)] = "router"
        fs = spec.moe.shared_intermediate_size // tp
        if fs:
            roles.setdefault((h, 2 * fs), "shared gate_up")
            roles.setdefault((fs, h), "shared down")
    return roles


def gemm_kn(op: Any, dims: Any) -> tuple[int, int] | None:
    """(K, N) of a weight GEMM from its operator and ``Input Dims`` (``aten::mm [[M,K],[K,N]]``,
    ``aten::addmm [[N],[M,K],[K,N]]``, ``aten::linear [[...,K],[N,K]]``); None for batched
    or unreadable shapes."""
    if not isinstance(dims, str):
        return None
    try:
        d = _dec.decode(dims)
    except msgspec.DecodeError:
        return None
    if not isinstance(d, list):
        return None
    if op in ("aten::addmm",):
        d = d[1:]
    if len(d) < 2 or not all(isinstance(x, list) and len(x) == 2 and all(isinstance(v, int) for v in x) for x in d[:2]):
        return None
    w = d[1]
    if op in ("aten::linear", "vllm::rocm_unquantized_gemm"):
        return (w[1], w[0])
    return (w[0], w[1])


def _role(op: Any, dims: Any, roles: dict[tuple[int, int], str]) -> str | None:
    kn = gemm_kn(op, dims)
    if kn is None:
        return None
    return roles.get(kn) or f"GEMM {kn[0]}→{kn[1]}"


def op_classes(table: pd.DataFrame, peak: GpuPeak | None, roles: dict[tuple[int, int], str],
               steps_per_phase: dict[tuple[int, str], int]) -> dict[tuple[int, str], list[OpClass]]:
    """The op classes of every (device, phase) of the kernel table (module docstring), by
    loss (unknown losses last), at most :data:`MAX_CLASSES` per phase.

    Args:
        table: :func:`~diagnose.analyzers.kernels.kernel_table` (with ``dtype``/``peak_tflops``).
        peak: the device peaks (None: no roofline, every loss unknown).
        roles: :func:`weight_roles` of the model config.
        steps_per_phase: steps per (device, phase), for the per-step loss.
    """
    out: dict[tuple[int, str], list[OpClass]] = {}
    if len(table) == 0:
        return out
    bw = peak.memory_bandwidth_tbps if peak is not None else None
    ms = table["total_ms"].to_numpy(dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        t_f = table["flops"].to_numpy(dtype=np.float64) / table["peak_tflops"].to_numpy(dtype=np.float64) / 1e9  # ms
        t_b = table["bytes"].to_numpy(dtype=np.float64) / bw / 1e9 if bw else np.full(len(table), np.nan)
    t_f = np.where(np.isnan(t_f), 0.0, t_f)
    t_bz = np.where(np.isnan(t_b), 0.0, t_b)
    known = ~(np.isnan(table["flops"].to_numpy(dtype=np.float64)) & np.isnan(t_b)) & (peak is not None)
    roof = np.maximum(t_f, t_bz)
    cat = table["category"].to_numpy(dtype=object)
    model = table["cost_model"].to_numpy(dtype=object)
    kind = np.where(model == "gemm", "gemm", np.where(model == "moe", "moe", np.where(pd.isna(cat), "other", cat))).astype(object)
    role = np.array([_role(o, d, roles) if k == "gemm" else None for o, d, k in
                     zip(table["op"].to_numpy(dtype=object), table["input_dims"].to_numpy(dtype=object), kind)], dtype=object)
    calls = table["calls"].to_numpy(dtype=np.int64)
    dtype = table["dtype"].to_numpy(dtype=object)
    for (dev, ph), idx in table.groupby(["device", "phase"], sort=False).indices.items():
        n_steps = max(1, int(steps_per_phase.get((int(dev), str(ph)), 0)) or 1)
        classes = []
        for k in dict.fromkeys(kind[idx]):
            ix = idx[kind[idx] == k]
            classes.append(_one_class(str(k), ix, ms, roof, t_f, t_bz, known, calls, dtype, role, n_steps))
        classes.sort(key=lambda c: (c.loss_ms is None, -(c.loss_ms or 0.0), -c.total_ms))
        out[(int(dev), str(ph))] = classes[:MAX_CLASSES]
    return out


def _one_class(kind: str, ix: np.ndarray, ms, roof, t_f, t_b, known, calls, dtype, role, n_steps: int) -> OpClass:
    """One op class from its kernel-table rows ``ix``."""
    total = float(ms[ix].sum())
    kn = ix[known[ix]]
    known_ms = float(ms[kn].sum())
    roof_ms = float(roof[kn].sum()) if len(kn) else None
    loss = max(0.0, known_ms - roof_ms) if roof_ms is not None else None
    att = roof_ms / known_ms if roof_ms is not None and known_ms > 0 else None
    n_calls = int(calls[ix].sum())
    by_dtype: dict = {}
    for i in ix:
        by_dtype[dtype[i]] = by_dtype.get(dtype[i], 0.0) + ms[i]
    main_dtype = max(by_dtype, key=lambda d: by_dtype[d]) if by_dtype else None
    roles = []
    if kind == "gemm":
        names = role[ix]
        for r in dict.fromkeys(n for n in names if n is not None):
            rx = ix[names == r]
            roles.append(_role_row(r, rx, ms, roof, known, calls, dtype))
        roles.sort(key=lambda x: (x.attainment is None, x.attainment or 0.0))
    return OpClass(
        name=kind, label=KIND_LABELS.get(kind, kind), calls=n_calls, total_ms=round(total, 6),
        unknown_ms=round(total - known_ms, 6), roofline_ms=None if roof_ms is None else round(roof_ms, 6),
        loss_ms=None if loss is None else round(loss, 6), loss_step_ms=None if loss is None else round(loss / n_steps, 6),
        attainment=None if att is None else round(min(att, 1.0), 6),
        peak=("bandwidth" if float(t_b[kn].sum()) >= float(t_f[kn].sum()) else "compute") if len(kn) else None,
        dtype=main_dtype if isinstance(main_dtype, str) else None,
        small=bool(n_calls and total * 1e3 / n_calls < SMALL_CLASS_US), roles=roles)


def _role_row(name: str, rx: np.ndarray, ms, roof, known, calls, dtype) -> OpRole:
    kn = rx[known[rx]]
    t = float(ms[rx].sum())
    k_ms = float(ms[kn].sum())
    r_ms = float(roof[kn].sum()) if len(kn) else None
    att = r_ms / k_ms if r_ms is not None and k_ms > 0 else None
    d = dtype[rx[np.argmax(ms[rx])]]
    return OpRole(name=name, calls=int(calls[rx].sum()), total_ms=round(t, 6),
                  loss_ms=None if r_ms is None else round(max(0.0, k_ms - r_ms), 6),
                  attainment=None if att is None else round(min(att, 1.0), 6), dtype=d if isinstance(d, str) else None)


def roles_text(roles: list[OpRole]) -> str:
    """The roles of a GEMM class by attainment, roles at the same rounded % joined:
    "qkv/o 38%, down 47%, gate_up 57%, lm_head 60%"."""
    parts: list[tuple[int, list[str]]] = []
    for r in roles:
        if r.attainment is None:
            continue
        pct = int(math.floor(100 * r.attainment + 0.5))
        if parts and parts[-1][0] == pct:
            parts[-1][1].append(r.name)
        else:
            parts.append((pct, [r.name]))
    return ", ".join(f"{'/'.join(n)} {p}%" for p, n in parts)
