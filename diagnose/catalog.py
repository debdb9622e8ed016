"""The findings catalog: every finding name the rules can read, with unit and description,
built from the declarations next to the code that computes each one (the analyzers of
:data:`diagnose.analyzers.ANALYZERS`, the trace-level and metrics findings of
:mod:`diagnose.findings`, :mod:`diagnose.sweep` and :mod:`diagnose.compare`).
``docs/rules.md`` documents it (``diagnose rules doc``)."""
from __future__ import annotations

import re
from functools import lru_cache

from diagnose import compare, findings, sweep
from diagnose.analyzers import ANALYZERS
from diagnose.analyzers.base import Finding
from diagnose.vocab import CATEGORIES, FINDING_PHASES, GAP_CAUSES, GAP_KINDS


@lru_cache(maxsize=1)
def catalog() -> tuple[Finding, ...]:
    """Every documented finding: analyzers' declarations, trace, sweep, compare, metrics."""
    out: list[Finding] = []
    for module in ANALYZERS:
        out.extend(getattr(module, "FINDINGS", ()))
    return tuple(out) + findings.TRACE_FINDINGS + findings.LABELS + sweep.FINDINGS + compare.FINDINGS + findings.METRICS_FINDINGS


_SEGMENT = r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*"


def _pattern_to_regex(pat: str) -> str:
    rx = re.escape(pat)
    rx = rx.replace(re.escape("<phase>"), "(?:" + "|".join(FINDING_PHASES) + ")")
    rx = rx.replace(re.escape("<category>"), "(?:" + "|".join(CATEGORIES) + ")")
    rx = rx.replace(re.escape("<kind>"), "(?:" + "|".join(GAP_KINDS) + ")")
    rx = rx.replace(re.escape("<cause>"), "(?:" + "|".join(GAP_CAUSES) + ")")
    rx = rx.replace(re.escape("<code>"), _SEGMENT)
    rx = rx.replace(re.escape("<key>"), _SEGMENT)
    return rx


@lru_cache(maxsize=1)
def catalog_regex() -> re.Pattern:
    """One regex matching every name the catalog documents (tests and docs use it)."""
    single = [_pattern_to_regex(f.name) for f in catalog() if not f.name.startswith(("baseline.", "candidate."))]
    single_rx = "(?:" + "|".join(single) + ")"
    return re.compile(rf"^(?:{single_rx}|(?:baseline|candidate)\.{single_rx})$")
