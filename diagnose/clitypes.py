"""Shared click parameter types.

:class:`IntList` parses comma-separated integers (``--batch 1,8,32``) with a lower bound, so
every command reports a bad list the same way: click's usage error, which the ``diagnose``
group prints as one ``error: Invalid value for '--batch': ...`` line with exit status 2.
"""

from __future__ import annotations

from typing import Any

import click


class IntList(click.ParamType):
    """Comma-separated integers, each >= ``min_value``, as a list (``"512, 2048"`` -> [512, 2048]).

    Attributes:
        min_value: smallest accepted value (1: positive counts; 0: allows a zero context).

    A list or tuple of ints (a default given in Python) passes through the same checks.
    Errors (empty list, a non-integer item, an item below ``min_value``) raise
    :class:`click.BadParameter` via :meth:`fail`.
    """

    name = "integers"

    def __init__(self, min_value: int = 1) -> None:
        self.min_value = min_value

    def get_metavar(self, param: click.Parameter, ctx: click.Context | None = None) -> str:
        return "N[,N...]"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> list[int]:
        if isinstance(value, (list, tuple)):
            parts: list[Any] = list(value)
        else:
            text = str(value)
            parts = [p.strip() for p in text.split(",")] if text.strip() else []
        if not parts:
            self.fail(f"needs at least one integer, got {value!r}", param, ctx)
        out: list[int] = []
        for part in parts:
            if isinstance(part, bool):
                self.fail(f"takes comma-separated integers, got {value!r}", param, ctx)
            try:
                n = int(part)
            except (TypeError, ValueError):
                self.fail(f"takes comma-separated integers, got {value!r}", param, ctx)
            if isinstance(part, float) or n < self.min_value:
                self.fail(f"values must be integers >= {self.min_value}, got {part!r}", param, ctx)
            out.append(n)
        return out


#: Upper bounds of the integer options (sequences per step, tokens per sequence, tensor-parallel
#: degree): the model-config bounds of :data:`diagnose.inputs.MODEL_SIZE_BOUNDS` (context
#: 10^8 tokens, 10^5 heads), and 10^7 sequences.
MAX_BATCH = 10_000_000
MAX_TOKENS = 100_000_000
MAX_TP = 100_000

#: Positive integers (batch sizes, prompt lengths).
POSITIVE_INT_LIST = IntList(1)

#: Non-negative integers (contexts, where 0 means "no KV cache").
NON_NEGATIVE_INT_LIST = IntList(0)


class FiniteFloat(click.ParamType):
    """A finite number within bounds: click's ``FloatRange`` lets ``nan`` and ``inf`` through
    (``nan`` fails every comparison, so a gate threshold of NaN passed whatever it measured:
    pallets/click#3347). The check is :func:`diagnose.inputs.finite_number`, the one used for
    rule thresholds and rules configs.

    Attributes:
        lo, hi: bounds (None: unbounded); ``lo_open``: strictly above ``lo``.
    """

    name = "number"

    def __init__(self, lo: float | None = None, hi: float | None = None, lo_open: bool = False) -> None:
        self.lo, self.hi, self.lo_open = lo, hi, lo_open

    def _wanted(self) -> str:
        if self.lo == 0 and self.lo_open and self.hi is None:
            return "a positive finite number"
        if self.lo == 0 and not self.lo_open and self.hi is None:
            return "a finite number >= 0"
        if self.lo is not None and self.hi is not None:
            return f"a finite number from {self.lo:g} to {self.hi:g}"
        return "a finite number"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            x = float(value)
        else:
            try:
                x = float(str(value).strip())
            except ValueError:
                self.fail(f"must be {self._wanted()}, got {value!r}", param, ctx)
        from diagnose.errors import DiagnoseError
        from diagnose.inputs import finite_number

        try:
            finite_number(x, "value", lo=self.lo, hi=self.hi, lo_open=self.lo_open)
        except DiagnoseError:
            self.fail(f"must be {self._wanted()}, got {value!r}", param, ctx)
        return x


#: Peaks, bandwidths, sizes in GB: > 0 and finite.
POSITIVE_FINITE = FiniteFloat(0, None, lo_open=True)
#: Sizes that may be zero (an overhead): >= 0 and finite.
NON_NEGATIVE_FINITE = FiniteFloat(0, None)
#: Shares and fractions: [0, 1], finite.
FRACTION = FiniteFloat(0, 1)
