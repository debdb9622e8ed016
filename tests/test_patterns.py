"""diagnose.patterns.ascii_folded: a case-insensitive search sped up on ASCII text (the text
lower-cased, a case-sensitive twin pattern) answers as ``rx.search`` does on every text: the
shipped kernel-name patterns and crafted ones, on a real trace's kernel names, random ASCII
and text that is not ASCII."""
from __future__ import annotations

import random
import re

import pytest

from conftest import shared_trace
from diagnose.patterns import _lower_twin, ascii_folded

#: Patterns whose lower-cased twin would match something else: no twin (rx itself is used).
_NO_TWIN = (r"[A-z]", r"\x41bc", r"\101", r"(?P<Name>ab)", r"(?-i:AB)c", r"(?i:a)(?-i:B)", "\u017f", r"a|A",
            r"\N{LATIN CAPITAL LETTER A}b")
#: Crafted patterns that do get one (letters, ranges, classes, escapes kept as written).
_TWIN = {r"[A-F0-9]+x": "[a-f0-9]+x", r"\Sfoo\d": r"\Sfoo\d", r"Ab\.C|^X[^Y]$": r"ab\.c|^x[^y]$",
         r"\bGEMM(?=_)": r"\bgemm(?=_)", r"[^A-Z_]K": "[^a-z_]k",
         r"^(?!Triton_)(?s:.*?)NCCL": r"^(?!triton_)(?s:.*?)nccl"}


def _shipped() -> list[re.Pattern]:
    from diagnose.analyzers.categories import _table
    from diagnose.analyzers.precision import DTYPE_NAME_PATTERNS
    from diagnose.analyzers.structure import CONV_KERNEL
    from diagnose.analyzers.workload import BACKWARD_KERNEL, KV_CACHE_KERNEL, KV_WRITE_KERNEL

    return ([CONV_KERNEL, KV_CACHE_KERNEL, BACKWARD_KERNEL, KV_WRITE_KERNEL] + [rx for _, rx in DTYPE_NAME_PATTERNS]
            + [rx for _, rx in _table()])


def _texts() -> list[str]:
    rng = random.Random(7)
    alphabet = "aAbBcCdDfFgGkKmMsSxXzZ_[]^`\\ 019-:<>.\n" + "\u017f\u212a\u0130\u0131"
    words = ["GEMM", "gemm_", "Conv2d", "KV_Cache", "PagedAttention", "wgrad", "BF16", "fp8_e4m3", "Sm90", "cutlass"]
    out = ["", "A", "a", "[", "`", "_"]
    for _ in range(3000):
        parts = [rng.choice(words) if rng.random() < 0.3
                 else "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 6))) for _ in range(rng.randint(1, 5))]
        out.append("".join(parts))
    return out


def test_twins_only_where_exact():
    for pat in _NO_TWIN:
        assert _lower_twin(re.compile(pat, re.I)) is None, pat
    for pat, twin in _TWIN.items():
        assert _lower_twin(re.compile(pat, re.I)).pattern == twin, pat
    shipped = _shipped()
    assert len(shipped) == 26 and sum(_lower_twin(rx) is not None for rx in shipped) == 26


@pytest.mark.parametrize("which", ["crafted", "shipped"])
def test_folded_search_answers_as_the_pattern(which):
    pats = ([re.compile(p, re.I) for p in (*_NO_TWIN, *_TWIN)] + [re.compile("abc")] if which == "crafted"
            else _shipped())
    texts = _texts()
    assert sum(not t.isascii() for t in texts) == 1381  # both branches: folded ASCII text, and rx itself
    for rx in pats:
        found = ascii_folded(rx)
        assert [found(t) for t in texts] == [rx.search(t) is not None for t in texts], rx.pattern


def test_folded_search_on_real_kernel_names():
    from diagnose.trace import load_trace

    names = sorted({str(n) for n in load_trace(str(shared_trace("hta/trace_diff/control.json.gz"))).gpu["name"]})
    assert len(names) == 174
    for rx in _shipped():
        found = ascii_folded(rx)
        assert [found(n) for n in names] == [rx.search(n) is not None for n in names], rx.pattern
