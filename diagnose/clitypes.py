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


#: Positive integers (batch sizes, prompt lengths).
POSITIVE_INT_LIST = IntList(1)

#: Non-negative integers (contexts, where 0 means "no KV cache").
NON_NEGATIVE_INT_LIST = IntList(0)
