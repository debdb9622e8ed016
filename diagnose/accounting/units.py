"""Units, dtype widths and argument checks shared by the accounting modules."""
from __future__ import annotations

import math
from typing import Any

from diagnose.errors import DiagnoseError


#: Bytes in one GB (decimal) and one GiB (binary). docs/prefill-decode.md "Units".
GB = 10**9
GiB = 2**30
MiB = 2**20
KiB = 2**10

#: Storage width in bits of each supported dtype. ``fp16`` and ``bf16`` are both 16 bits.
DTYPE_BITS: dict[str, int] = {
    "fp32": 32,
    "fp16": 16,
    "bf16": 16,
    "fp8": 8,
    "int8": 8,
    "int4": 4,
}

#: Storage bytes per element of each dtype (``int4`` is half a byte).
DTYPE_BYTES: dict[str, float] = {name: bits / 8 for name, bits in DTYPE_BITS.items()}

#: Default int4 quantization group: one fp16 scale per 128 consecutive input weights.
INT4_GROUP_SIZE = 128

#: Bytes of one int4 group scale (fp16).
INT4_SCALE_BYTES = 2

#: Share of the KV-cache ceiling that is usable once allocator fragmentation is paid.
#: 0.75 reproduces docs/prefill-decode.md section 3 exactly for 240 -> 180 and 60 -> 45; with
#: ``floor`` it gives 15 -> 11 and 3 -> 2 where the article says "~10" and "~2".
FRAGMENTATION_FACTOR = 0.75

#: Bits of an unquantized weight (bf16/fp16): what serving engines load a 16/32-bit
#: checkpoint as (vLLM ``--dtype auto`` casts fp32 checkpoints to 16 bit).
UNQUANTIZED_BITS = 16


class UnsupportedModelConfig(DiagnoseError):
    """A config key changes bytes or FLOPs in a way this accounting does not model.

    Attributes:
        key: the config key (dotted for nested keys, e.g. ``quantization_config.quant_method``).
    """

    def __init__(self, key: str, why: str) -> None:
        self.key = key
        super().__init__(f"model config key {key!r} is not supported: {why}")


def _check_dtype(dtype: str, what: str = "dtype") -> str:
    key = dtype.lower() if isinstance(dtype, str) else dtype
    if key not in DTYPE_BITS:
        raise DiagnoseError(
            f"unknown {what} {dtype!r}; expected one of {', '.join(DTYPE_BITS)}"
        )
    return key


def _positive_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
        raise DiagnoseError(f"model config key {key!r} must be a positive integer, got {value!r}")
    return value


def _nonneg_int(value: Any, key: str) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise DiagnoseError(f"model config key {key!r} must be a non-negative integer, got {value!r}")
    return value


def _check_tp(tp: Any) -> int:
    if isinstance(tp, bool) or not isinstance(tp, int) or tp < 1:
        raise DiagnoseError(f"tensor-parallel size must be an integer >= 1, got {tp!r}")
    return tp


def _positive_arg(value: Any, what: str, allow_zero: bool = False) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0 or (value == 0 and not allow_zero):
        kind = "a non-negative" if allow_zero else "a positive"
        raise DiagnoseError(f"{what} must be {kind} integer, got {value!r}")
    return value




def _positive_float(value: float, what: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0 or math.isinf(value):
        raise DiagnoseError(f"{what} must be a positive number, got {value!r}")
    return float(value)
