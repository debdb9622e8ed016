"""Kernel-cost records of a phase row (:class:`diagnose.model.PhaseTimes`): the engine's FLOP
and byte terms with their sources, the op classes and their loss against the roofline, and
the precision lever (README "Engine FLOPs", "Op classes and their loss")."""
from __future__ import annotations

from typing import Literal

from diagnose.model_base import Dtype, NonNegative, Record, Share


class CostTerm(Record, kw_only=True):
    """One FLOP/byte term of a phase's steps (summed over them), with where each number
    comes from (:func:`diagnose.accounting.step_cost`; README "Engine FLOPs")."""

    name: Literal["linear", "experts", "lm_head", "embedding", "attention", "kv_cache", "gemm", "moe"]
    flops: float | None
    bytes: float | None
    flops_source: Literal["config", "marker", "shapes"] | None
    bytes_source: Literal["config", "marker", "shapes"] | None


class OpRole(Record, kw_only=True):
    """The GEMMs of one weight inside an op class (README "Op classes and their loss")."""

    name: str
    calls: int
    total_ms: float
    loss_ms: NonNegative | None
    attainment: Share | None
    dtype: Dtype | None


class OpClass(Record, kw_only=True):
    """What one kind of kernel costs a phase against the roofline (:mod:`diagnose.analyzers.oploss`):
    kernel time, roofline time (max of FLOPs / the dtype's peak and bytes / bandwidth, over
    the rows whose work is known), the loss (the difference), its share of the binding peak
    (``attainment``) and, for GEMMs, the same per weight (``roles``)."""

    name: str
    label: str
    calls: int
    total_ms: float
    unknown_ms: float
    roofline_ms: float | None
    loss_ms: NonNegative | None
    loss_step_ms: NonNegative | None
    attainment: Share | None
    peak: Literal["bandwidth", "compute"] | None
    dtype: Dtype | None
    small: bool
    roles: list[OpRole]


class Precision(Record, kw_only=True):
    """fp32 matrix work without tensor cores in a phase, and what the precision lever would
    save (:mod:`diagnose.analyzers.precision`)."""

    fp32_matrix_ms: float
    fp32_matrix_share: Share | None
    gain: float | None
    lever: Literal["tf32", "bf16"] | None
    saving_ms: NonNegative | None
    bf16_gain: float | None


#: The roofline fields of a phase row, in report order (:class:`Attainment`).
ATTAINMENT_FIELDS = ("flops", "bytes", "achieved_tflops", "achieved_tbps", "mfu", "mbu", "arithmetic_intensity",
                     "bound", "bound_ratio", "peak_tflops", "peak_tbps", "flops_source", "bytes_source",
                     "forward_coverage", "bound_s", "terms", "attainment_missing")
