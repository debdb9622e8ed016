"""Kernel categories from a data table of regexes over the *base* kernel name.

The table is ``diagnose/data/kernel_categories.yaml`` (each row cites where its names come
from). Categories: gemm, attention, norm, elementwise (activation / elementwise), communication,
memcpy, memset, moe, sampling, other.
"""
from __future__ import annotations

import re
from functools import lru_cache

import numpy as np
import pandas as pd

from diagnose.analyzers.base import declared
from diagnose.trace.model import factorize
from diagnose.vocab import CATEGORIES, SHARE_CATEGORIES


# Generic launch wrappers whose first template argument names the real operator.
_WRAPPERS = re.compile(r"^(cutlass::)?(Kernel\d*|device_kernel)$")


@lru_cache(maxsize=1)
def _table() -> tuple[tuple[str, re.Pattern], ...]:
    from diagnose.tables import category_table

    return tuple((r.category, re.compile(r.pattern, re.I)) for r in category_table().categories)


def _strip_brackets(s: str, open_ch: str, close_ch: str) -> str:
    out = []
    depth = 0
    for ch in s:
        if ch == open_ch:
            depth += 1
        elif ch == close_ch and depth:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def _first_template_arg(s: str) -> str:
    i = s.find("<")
    if i < 0:
        return ""
    depth = 0
    start = i + 1
    for j in range(i, len(s)):
        ch = s[j]
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth -= 1
            if depth == 0:
                return s[start:j]
        elif ch == "," and depth == 1:
            return s[start:j]
    return s[start:]


@lru_cache(maxsize=65536)
def base_name(name: str) -> str:
    """Strip a demangled kernel name to its base name.

    ``void flashinfer::BatchDecodeWithPagedKVCacheKernel<...>(Params)`` ->
    ``flashinfer::BatchDecodeWithPagedKVCacheKernel``; ``cutlass::Kernel2<cutlass_80_wmma_...>(...)``
    -> ``cutlass_80_wmma_...`` (the wrapped operator).
    """
    s = name.strip()
    if s.startswith("void "):
        s = s[5:]
    s = s.replace("(anonymous namespace)", "anon")
    no_params = _strip_brackets(s, "(", ")")
    base = _strip_brackets(no_params, "<", ">").strip()
    # A return type may remain before the name ("float foo"): keep the last token.
    if " " in base:
        base = base.split()[-1]
    if _WRAPPERS.match(base):
        inner = _first_template_arg(no_params).strip()
        if inner:
            inner = _strip_brackets(inner, "<", ">").strip()
            base = inner.split()[-1] if inner.split() else base
    return base or name


@lru_cache(maxsize=65536)
def classify_kernel(name: str) -> str:
    """Category of a kernel from its (full or base) name; "other" when no row matches."""
    b = base_name(name)
    for cat, rx in _table():
        if rx.search(b):
            return cat
    return "other"


CATEGORY_NAMES = np.array(CATEGORIES, dtype=object)
_CATEGORY_ID = {c: i for i, c in enumerate(CATEGORIES)}


def category_ids(gpu: pd.DataFrame, name_codes: np.ndarray | None = None, names: np.ndarray | None = None) -> np.ndarray:
    """Category per row of a ``gpu`` frame (memcpy/memset by activity kind, kernels by name)
    as an index into :data:`CATEGORIES` (int8); :data:`CATEGORY_NAMES` maps it to the name.

    Args:
        gpu: frame with ``kind`` and ``name``.
        name_codes, names: ``factorize(gpu["name"])`` when the caller has it (classification
            runs once per distinct name either way).
    """
    if name_codes is None or names is None:
        name_codes, names = factorize(gpu["name"])
    by_name = np.array([_CATEGORY_ID[classify_kernel(n)] for n in names], dtype=np.int8)
    out = by_name[name_codes] if len(gpu) else np.empty(0, dtype=np.int8)
    kinds = gpu["kind"].to_numpy(dtype=object)
    for kind in ("memcpy", "memset"):
        out[kinds == kind] = _CATEGORY_ID[kind]
    return out


FINDINGS = declared("categories", share_categories=", ".join(SHARE_CATEGORIES))
