"""Number formatting: the one place every view (terminal, fleet table, gate, compare, bench
tables, web report) turns a number into text, so one value reads the same everywhere.

Conventions: a missing value is an em dash (:data:`NA`); a share is a percentage with one
decimal and a space (``12.3 %``); milliseconds have three decimals; GB = 1e9 B, GiB = 2**30 B.
Pure functions of their arguments; no project imports (every layer may use them).
"""
from __future__ import annotations

import math
from typing import Any

#: What a missing or non-finite value reads as.
NA = "—"


def _finite(v: Any) -> float | None:
    """A finite float, or None (None, bools, NaN, inf, non-numbers)."""
    if v is None or isinstance(v, bool):
        return None
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def pct(share: Any, nd: int = 1) -> str:
    """A fraction as a percentage: 0.1234 -> ``12.3 %``."""
    f = _finite(share)
    return NA if f is None else f"{100 * f:.{nd}f} %"


def pp(change: Any) -> str:
    """A change of a share in percentage points, signed: 0.2 -> ``+20.0 pp``."""
    f = _finite(change)
    if f is not None and round(100 * f, 1) == 0:
        f = 0.0  # no change as shown: "+0.0 pp", never "-0.0 pp"
    return NA if f is None else f"{100 * f:+.1f} pp"


def ms(v: Any, nd: int = 3) -> str:
    """Milliseconds with ``nd`` decimals (no unit)."""
    f = _finite(v)
    return NA if f is None else f"{f:.{nd}f}"


def number(v: Any, nd: int = 3) -> str:
    """A float with ``nd`` decimals, an int as it is, text as it is."""
    if isinstance(v, str):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    f = _finite(v)
    return NA if f is None else f"{f:.{nd}f}"


def short(v: Any) -> str:
    """Four significant digits for a float (``0.1523``, ``1.235e+04``), an int or text as it is."""
    if isinstance(v, str):
        return v
    if isinstance(v, int) and not isinstance(v, bool):
        return str(v)
    f = _finite(v)
    return NA if f is None else f"{f:.4g}"


def value(v: Any, unit: str = "") -> str:
    """Human text for a value in ``unit``: "share" -> ``12.3 %``, "x" -> ``1.25×``, "count" /
    "steps" -> ``1,234``; otherwise about three significant digits and the unit."""
    if isinstance(v, str):
        return v
    f = _finite(v)
    if f is None:
        return NA
    if unit == "share":
        return pct(f)
    if unit == "x":
        return f"{f:.2f}×"
    if unit in ("count", "steps"):
        return f"{int(round(f)):,}"
    if abs(f) >= 1000:
        s = f"{f:,.0f}"
    elif abs(f) >= 100:
        s = f"{f:.1f}"
    elif abs(f) >= 1:
        s = f"{f:.3g}" if abs(f) < 10 else f"{f:.2f}"
    elif f == 0:
        s = "0"
    else:
        s = f"{f:.3g}"
    return f"{s} {unit}".strip() if unit else s


def gb(n_bytes: float, nd: int = 2) -> str:
    """Bytes in GB (1e9 B) with thousands separators."""
    return f"{n_bytes / 1e9:,.{nd}f}"


def gib(n_bytes: float, nd: int = 3) -> str:
    """Bytes in GiB (2**30 B) with thousands separators."""
    return f"{n_bytes / 2**30:,.{nd}f}"


def tokens(n: int) -> str:
    """A token count, ``8k`` for whole multiples of 1024."""
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)
