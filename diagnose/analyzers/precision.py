"""Data type of each kernel's matrix work, and the precision lever: fp32 GEMMs that run without
tensor cores.

**Kernel dtype** (:data:`diagnose.vocab.DTYPES`), from the kernel name where the library writes
it, else from the launching operator's ``Input type``:

* NVIDIA cuBLAS/CUTLASS/cuDNN names: ``sgemm`` (``volta_sgemm_*``, ``ampere_sgemm_*``,
  ``cutlass_80_simt_sgemm``, ``implicit_convolve_sgemm``), ``ffma`` (``sm80_xmma_gemm_f32f32_…
  _ffma``), ``simt``, ``scudnn``, ``gemmk1_kernel<float``/``gemmSN_*_kernel<float`` are
  **fp32 on CUDA cores** (SIMT: no tensor cores); ``tf32``, ``s1688gemm``/``s16816gemm``
  (CUTLASS TF32 tensor ops) are **tf32**; ``bf16``/``bfloat16``, ``f16``/``fp16``/``half``/
  ``h1688``/``h16816``/``hcudnn``, ``fp8``/``e4m3``/``e5m2``, ``fp4``/``e2m1``, ``int8``/
  ``imma``/``igemm`` name theirs (fp4 named with a 16-bit type, ``bf16xbf16xmxfp4``, is
  weight-only quantization: the math runs in the 16-bit type); cuBLASLt ``nvjet_<a><b><c>_`` kernels put the input type
  first (``h`` fp16, ``t`` bf16).
* AMD Tensile/hipBLASLt ``Cijk_<A>_<B>_<type>…``: the type token after the two index
  specs: ``S``/``SB`` fp32 (CDNA runs it on its FP32 matrix units), ``B``/``BBS``… bf16,
  ``H``/``HHS``… fp16, ``F8``… fp8, ``I8``… int8.
* Otherwise the operator's first floating input: ``float`` fp32, ``c10::Half`` fp16,
  ``c10::BFloat16`` bf16, ``c10::Float8_*`` fp8 (an fp32 GEMM without a telling kernel name
  is taken as running without tensor cores: PyTorch's default since 1.12 is
  ``torch.backends.cuda.matmul.allow_tf32 = False``).

The kernel table rates a row against its dtype's peak (:meth:`diagnose.hardware.GpuPeak.
peak_tflops_for`): an fp32 SIMT GEMM at 60 TFLOP/s on an H100 is at 90 % of its 66.9 TFLOP/s
peak and compute-bound at its arithmetic intensity, not "6 % of peak, memory-bound" against
the bf16 ridge.

**The precision lever** (:func:`precision_summaries`): the time of fp32 matrix work without
tensor cores on a GPU whose tensor peak is higher; its expected gain is the ratio of the
peaks (TF32 tensor / FP32 where the part has TF32, else FP16/BF16 tensor / FP32), and the
saving of running that work at the same share of the faster peak is ``t * (1 - 1 / gain)``.
"""
from __future__ import annotations

from diagnose.analyzers.base import declared

import re
from functools import lru_cache
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from diagnose.analyzers.opcost import GEMM_OPS
from diagnose.hardware import GpuPeak
from diagnose.patterns import clip

FINDINGS = declared("precision")

#: Name pieces of each dtype. The dtype named first in the name wins (template arguments and
#: CUTLASS/cuBLAS names list the input type first: ``paged_attention<…, __hip_bfloat16, …,
#: Fp8KVCacheDataType)0>`` is bf16, ``e4m3e4m3_bf16f32`` fp8); at one position the order
#: below decides (bf16 before fp16: "bf16" holds "f16"; mangled ``DF16b`` is bf16).
DTYPE_NAME_PATTERNS = (
    ("fp4", re.compile(r"mxfp4|nvfp4|fp4|e2m1", re.I)),
    ("fp8", re.compile(r"fp8|e4m3|e5m2|float8", re.I)),
    ("bf16", re.compile(r"bf16|bfloat16|df16b", re.I)),
    ("fp16", re.compile(r"fp16|f16|half|h1688|h16816|hgemm|hcudnn", re.I)),
    ("tf32", re.compile(r"tf32|s1688gemm|s16816gemm", re.I)),
    ("fp32", re.compile(r"sgemm|ffma|simt|scudnn|gemmk1_kernel<float|gemmsn_[nt]n_kernel<float", re.I)),
    ("int8", re.compile(r"int8|i8i8|imma|igemm", re.I)),
)
_TENSILE = {"S": "fp32", "B": "bf16", "H": "fp16", "F": "fp8", "I": "int8"}
_NVJET = {"h": "fp16", "t": "bf16"}
_OP_TYPES = {"float": "fp32", "c10::Half": "fp16", "c10::BFloat16": "bf16", "c10::Float8_e4m3fn": "fp8",
             "c10::Float8_e5m2": "fp8", "c10::Float8_e4m3fnuz": "fp8", "c10::Float8_e5m2fnuz": "fp8"}
#: Operators whose fp32 inputs mean fp32 matrix work (convolutions run as implicit GEMMs).
MATRIX_OPS = GEMM_OPS | frozenset({"aten::convolution", "aten::_convolution", "aten::cudnn_convolution", "aten::conv2d",
                                   "aten::conv1d", "aten::conv3d", "aten::cudnn_convolution_relu",
                                   "aten::cudnn_convolution_add_relu"})
_dec = msgspec.json.Decoder()


@lru_cache(maxsize=4096)
def dtype_from_name(name: str) -> str | None:
    """The dtype a kernel name states (module docstring), or None."""
    s = clip(name.strip())
    if s.startswith("void "):
        s = s[5:]
    if s.startswith("Cijk_"):
        parts = s.split("_", 4)
        if len(parts) > 3 and parts[3]:
            return _TENSILE.get(parts[3][0])
    if s.startswith("nvjet_") and len(s) > 6:
        return _NVJET.get(s[6])
    found, at = None, len(s) + 1
    for dtype, rx in DTYPE_NAME_PATTERNS:  # the type named first wins (template arguments in order)
        m = rx.search(s)
        if m is not None and m.start() < at:
            found, at = dtype, m.start()
    if found == "fp4":  # weight-only fp4 (``mxfp4`` with a 16-bit type named): the math runs in the 16-bit type
        for dtype, rx in DTYPE_NAME_PATTERNS[2:4]:
            if rx.search(s):
                return dtype
    return found


def dtype_from_types(types: Any) -> str | None:
    """The dtype of an operator's first floating-point input (raw ``Input type`` JSON or its
    decoded list), or None."""
    if types is None:
        return None
    if isinstance(types, (str, bytes)):
        try:
            types = _dec.decode(types)
        except msgspec.DecodeError:
            return None
    if not isinstance(types, list):
        return None
    for t in types:
        if isinstance(t, str) and t in _OP_TYPES:
            return _OP_TYPES[t]
    return None


def row_dtypes(kernels: np.ndarray, ops: np.ndarray, types: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(dtype, source) per kernel-table row: "kernel name" where the name states it, else
    "operator input types" (None where neither does)."""
    n = len(kernels)
    dtype = np.full(n, None, dtype=object)
    source = np.full(n, None, dtype=object)
    for i in range(n):
        k = kernels[i]
        d = dtype_from_name(k) if isinstance(k, str) else None
        if d is not None:
            dtype[i], source[i] = d, "kernel name"
            continue
        d = dtype_from_types(types[i])
        if d is not None:
            dtype[i], source[i] = d, "operator input types"
    return dtype, source


def row_peaks(dtype: np.ndarray, peak: GpuPeak | None) -> np.ndarray:
    """The compute peak (TFLOP/s) of each row's dtype (NaN without a peak)."""
    if peak is None:
        return np.full(len(dtype), np.nan)
    cache: dict = {}
    out = np.empty(len(dtype))
    for i, d in enumerate(dtype):
        if d not in cache:
            v = peak.peak_tflops_for(d)
            cache[d] = np.nan if v is None else float(v)
        out[i] = cache[d]
    return out


# ----------------------------------------------------------------------------- the lever


class PrecisionSummary(msgspec.Struct, frozen=True):
    """fp32 matrix work without tensor cores in one phase on one device.

    Attributes:
        fp32_matrix_ms: time of fp32 GEMM/convolution kernels that use no tensor cores, ms.
        fp32_matrix_share: of the phase's kernel time.
        gain: the lever's peak / the FP32 peak (None: the GPU's FP32 or tensor peak unknown).
        lever: "tf32" (TF32 tensor cores) or "bf16" (bf16/fp16 autocast), None without a gain.
        saving_ms: ``fp32_matrix_ms * (1 - 1 / gain)``; None without a gain.
        bf16_gain: FP16/BF16 tensor peak / FP32 peak (the larger, lossier lever), or None.
    """

    fp32_matrix_ms: float
    fp32_matrix_share: float | None
    gain: float | None
    lever: str | None
    saving_ms: float | None
    bf16_gain: float | None


def is_fp32_matrix(table: pd.DataFrame) -> np.ndarray:
    """Rows of the kernel table that are fp32 matrix work without tensor cores: the kernel
    name says so (sgemm, ffma, simt, scudnn...; AMD Tensile type S), or an fp32 GEMM or
    convolution operator whose kernel name states no dtype."""
    dt = table["dtype"].to_numpy(dtype=object)
    src = table["dtype_source"].to_numpy(dtype=object)
    op = table["op"].to_numpy(dtype=object)
    by_name = (dt == "fp32") & (src == "kernel name")
    by_op = (dt == "fp32") & (src == "operator input types") & pd.Series(op, dtype=object).isin(MATRIX_OPS).to_numpy()
    return by_name | by_op


def precision_summaries(table: pd.DataFrame, peak: GpuPeak | None) -> dict[tuple[int, str], PrecisionSummary]:
    """:class:`PrecisionSummary` per (device, phase) of the kernel table (:func:`~diagnose.
    analyzers.kernels.kernel_table` with its ``dtype`` columns)."""
    out: dict[tuple[int, str], PrecisionSummary] = {}
    if len(table) == 0 or "dtype" not in table:
        return out
    fp32 = is_fp32_matrix(table)
    f32 = peak.fp32_tflops if peak is not None else None
    tf32 = peak.tf32_tflops if peak is not None else None
    half = peak.dense_fp16_tflops if peak is not None else None
    bf16_gain = half / f32 if f32 and half and half > f32 else None
    if f32 and tf32 and tf32 > f32:
        gain, lever = tf32 / f32, "tf32"
    elif bf16_gain:
        gain, lever = bf16_gain, "bf16"
    else:
        gain, lever = None, None
    ms = table["total_ms"].to_numpy(dtype=np.float64)
    for (dev, ph), idx in table.groupby(["device", "phase"], sort=False).indices.items():
        total = float(ms[idx].sum())
        t = float(ms[idx][fp32[idx]].sum())
        out[(int(dev), str(ph))] = PrecisionSummary(
            fp32_matrix_ms=round(t, 6), fp32_matrix_share=round(t / total, 6) if total > 0 else None,
            gain=None if gain is None else round(gain, 4), lever=lever,
            saving_ms=None if gain is None else round(t * (1.0 - 1.0 / gain), 6),
            bf16_gain=None if bf16_gain is None else round(bf16_gain, 4))
    return out
