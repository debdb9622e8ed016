"""Name columns are categoricals from the loader on (issue 28): categories are the names used,
in first-seen order, so ``model.factorize`` reads the codes as they are; no process-wide
cache of factorizations exists."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from diagnose.trace import load_trace, model
from diagnose.trace.model import FRAMES, as_categorical, categorical, factorize, frame, per_unique

from conftest import shared_trace

KINETO = "hta/trace_diff/control.json.gz"


def _first_seen(values: list) -> tuple[list[int], list]:
    seen: dict = {}
    return [seen.setdefault(v, len(seen)) for v in values], list(seen)


@pytest.fixture(scope="module")
def control():
    return load_trace(str(shared_trace(KINETO)))


def test_every_name_column_is_a_first_seen_categorical(control):
    for attr in FRAMES:
        f = getattr(control, attr)
        if not len(f):
            continue
        cat = f["name"].array
        assert isinstance(cat, pd.Categorical), attr
        names = f["name"].astype(object).tolist()
        codes, uniques = _first_seen(names)
        assert list(cat.categories) == uniques, attr  # every category used, in first-seen order
        assert cat.codes.tolist() == codes, attr
    # the HTA control trace (rank 3 of 8): 9,450 GPU activities of 174 distinct names, 24,692
    # runtime calls of 15, 40,506 ops of 176 (counted from the events with msgspec)
    assert [(len(getattr(control, a)), len(getattr(control, a)["name"].cat.categories)) for a in ("gpu", "runtime", "cpu_ops")] \
        == [(9450, 174), (24692, 15), (40506, 176)]


def test_factorize_reads_the_codes_and_matches_the_strings(control):
    g = control.gpu
    codes, uniques = factorize(g["name"])
    ref_codes, ref_uniques = _first_seen(g["name"].astype(object).tolist())
    assert codes.tolist() == ref_codes and uniques.tolist() == ref_uniques
    # a subset (one device's rows, a filter) is recoded from the integer codes, same answer
    sub = g[g["kind"] != "kernel"]
    codes, uniques = factorize(sub["name"])
    ref_codes, ref_uniques = _first_seen(sub["name"].astype(object).tolist())
    assert codes.tolist() == ref_codes and uniques.tolist() == ref_uniques
    assert not hasattr(model, "_FACTORIZED")  # no process-wide cache keyed by memory addresses


def test_factorize_semantics_on_small_inputs():
    vals = ["b", None, "a", "b", None, "c"]
    codes, uniques = factorize(vals)
    assert codes.tolist() == [0, 1, 2, 0, 1, 3] and uniques.tolist() == ["b", None, "a", "c"]
    cat = pd.Categorical(vals, categories=["c", "a", "b", "z"])  # any order, an unused category, NaN
    codes, uniques = factorize(pd.Series(cat))
    assert codes.tolist() == [0, 1, 2, 0, 1, 3] and uniques.tolist() == ["b", None, "a", "c"]
    assert per_unique(cat, lambda u: u is None).tolist() == [False, True, False, False, True, False]
    # codes into values that repeat, with -1 and None as missing
    c = categorical(np.array([3, 0, -1, 1, 2, 0]), np.array(["x", "y", None, "x"], dtype=object))
    assert list(c.categories) == ["x", "y"] and c.codes.tolist() == [0, 0, -1, 1, -1, 0]
    a = as_categorical(["k2", "k1", "k2"])
    assert list(a.categories) == ["k2", "k1"] and a.codes.tolist() == [0, 1, 0]
    assert as_categorical(a) is a  # already first-seen: kept as it is


def test_frame_builds_categorical_names_from_strings():
    f = frame(model.RUNTIME_COLUMNS, {"name": ["cudaLaunchKernel", "cudaMemcpyAsync", "cudaLaunchKernel"],
                                      "api_kind": ["launch", "memcpy", "launch"], "start_ns": [1, 2, 3],
                                      "end_ns": [2, 3, 4], "correlation": [1, 2, 3], "pid": [7, 7, 7], "tid": [7, 7, 7]})
    assert f["name"].dtype == "category" and f["api_kind"].dtype == object
    assert list(f["name"].cat.categories) == ["cudaLaunchKernel", "cudaMemcpyAsync"]
    assert frame(model.GPU_COLUMNS)["name"].dtype == "category"  # empty frames too


@pytest.mark.parametrize("dtype", [np.int8, np.int16, np.int64])
def test_first_seen_check_in_the_codes_own_width(dtype):
    """``model._first_seen`` (codes already their own first-seen factorization, every value
    used) on int8/int16/int64 codes, by brute force: orders, gaps, missing (-1) codes, and
    int8 codes up to 127 (where ``top + 1`` would wrap)."""
    rng = np.random.default_rng(3)
    top = int(np.iinfo(dtype).max) if dtype is np.int8 else 300

    def brute(codes: list[int], k: int) -> bool:
        return len(codes) > 0 and k > 0 and _first_seen(codes)[0] == codes and len(set(codes)) == k and min(codes) >= 0

    cases = [([], 0), ([0], 1), ([-1], 0), ([0, -1], 1), ([1, 0], 2), ([0, 2, 1], 3), ([0, 1, 1, 0], 2), ([0, 1], 3),
             (list(range(top + 1)) + [top, 0], top + 1), (list(range(top)) + [top + 1 if dtype is not np.int8 else -1], top)]
    for n in (1, 5, 50, 400):
        for k in (1, 3, 40, top + 1):
            c = np.concatenate((np.arange(min(k, n)), rng.integers(-1 if n % 2 else 0, k, n))).tolist()
            cases.append((c, k))
            cases.append((_first_seen(c)[0], len(set(c))))
    for codes, k in cases:
        got = model._first_seen(np.array(codes, dtype=dtype), k)
        assert got == (brute(codes, k) or (not codes and k == 0)), (codes[:12], k)
