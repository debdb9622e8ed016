"""Small numeric helpers shared by the findings, rule and report layers."""
from __future__ import annotations

import math
import numbers
from typing import Any

Number = int | float
_BIG = 2**1023  # integers beyond this are out of float64's range


def num(x: Any) -> Number | None:
    """A finite int/float, else None (bool -> int; NaN/inf/strings/None and integers beyond
    the float64 range -> None)."""
    if x is None or isinstance(x, str):
        return None
    if isinstance(x, bool):
        return int(x)
    if isinstance(x, numbers.Integral):
        return int(x) if -_BIG < x < _BIG else None  # beyond float64: not a usable number
    if not isinstance(x, numbers.Real):
        return None
    try:
        f = float(x)
    except OverflowError:
        return None
    if math.isnan(f) or math.isinf(f):
        return None
    return f


def div(a: Any, b: Any) -> float | None:
    """a / b for finite numbers, None when either is missing or b is 0."""
    a, b = num(a), num(b)
    if a is None or b is None or b == 0:
        return None
    return a / b


def fmt_ms(v: float) -> str:
    """A duration in ms as a reader wants it: 3 significant digits under 10 ms ("0.927",
    "2.01"), one decimal under 100 ("27.5"), whole ms with thousands separators above ("186",
    "11,720")."""
    a = abs(v)
    if a < 10:
        return f"{v:.3g}"
    if a < 100:
        return f"{v:.1f}"
    return f"{v:,.0f}"
