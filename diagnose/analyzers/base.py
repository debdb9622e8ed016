"""What every analyzer shares: the finding declaration and the analysis context.

An analyzer is a module in :data:`diagnose.analyzers.ANALYZERS`. It declares the findings it
produces (``FINDINGS = declared("<module>")``: name, unit and description, kept in the
catalog ``diagnose/data/findings.yaml`` under the module's name) and exposes

* ``run(ctx: Context) -> None``: compute its part of the analysis from the trace and the
  results of the analyzers before it, storing frozen results on ``ctx``;
* ``findings(report, device, out) -> None`` (optional): flatten its part of the JSON report
  into the rule engine's namespace (``out[name] = number or None``) for the device whose
  phases the rules read.

The findings catalog (``diagnose.findings.CATALOG``, documented in ``docs/rules.md``) is built
from these declarations, so a metric's name, unit and computation are one grep apart.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from diagnose.numeric import num
from diagnose.options import AnalysisOptions
from diagnose.trace.model import QualityIssue, Trace


@dataclass(frozen=True)
class Finding:
    """A finding an analyzer produces.

    Attributes:
        name: dotted name; ``<phase>`` stands for one of vocab.PHASES, ``<category>`` for a
            kernel category, ``<code>`` for a quality code, ``<kind>`` for a gap kind or
            cause, ``<key>`` for a metrics-file key, ``<finding>`` for any single-trace finding.
        unit: ``ms``, ``µs``, ``fraction``, ``count``, ``ratio``, ``TB/s``, ``0/1``...
        description: what it measures (and how).
    """

    name: str
    unit: str
    description: str


def declared(section: str, **fields: str) -> tuple[Finding, ...]:
    """The findings a module declares in the catalog ``diagnose/data/findings.yaml``
    (``section``: the module's name), with ``{field}`` placeholders of the descriptions
    filled from ``fields``.

    Raises:
        DiagnoseError: the packaged catalog is malformed or has no such section.
    """
    from diagnose.errors import DiagnoseError
    from diagnose.tables import finding_table

    rows = finding_table().get(section)
    if rows is None:
        raise DiagnoseError(f"diagnose/data/findings.yaml has no section {section!r}")
    return tuple(Finding(r.name, r.unit, r.description.format(**fields) if fields else r.description) for r in rows)


@dataclass
class Context:
    """The blackboard analyzers read from and write to, in :data:`ANALYZERS` order.

    Attributes set by the analyzers (each documents what it sets): ``launches`` (per GPU
    activity: launch call times and kind), ``steps`` (the step table), ``activities`` (the GPU
    activity frame with category, launch, step and phase columns), ``devices`` (report device
    list), ``phases`` (per-device, per-phase results), ``latency``, ``attainment_inputs``,
    ``extra`` (top-level report sections by key).
    """

    trace: Trace
    options: AnalysisOptions
    quality: list[QualityIssue] = field(default_factory=list)
    launches: pd.DataFrame | None = None
    steps: pd.DataFrame | None = None
    activities: pd.DataFrame | None = None
    devices: list[dict[str, Any]] = field(default_factory=list)
    phases: list[Any] = field(default_factory=list)
    latency: Any = None
    attainment_inputs: Any = None
    extra: dict[str, Any] = field(default_factory=dict)

    def note(self, code: str, message: str, count: int | None = None) -> None:
        """Add a quality issue once per code (the first message wins)."""
        if not any(q.code == code for q in self.quality):
            self.quality.append(QualityIssue(code, message, count))

    def has(self, code: str) -> bool:
        return any(q.code == code for q in self.quality)


def quality_counts(report: dict) -> dict[str, int | float]:
    """``{code: count}`` of a JSON report's quality issues (1 for an issue without a count;
    codes sanitized to finding-name segments, see :func:`sanitize_code`)."""
    codes: dict[str, int | float] = {}
    for q in report.get("quality") or []:
        c = sanitize_code(q.get("code", ""))
        cnt = num(q.get("count"))
        codes[c] = codes.get(c, 0) + (cnt if cnt is not None else 1)
    return codes


def sanitize_code(code: str) -> str:
    """Quality code -> a finding-name segment (lowercase, [a-z0-9_], no double '_')."""
    import re

    s = re.sub(r"[^a-z0-9]+", "_", str(code).lower()).strip("_")
    if not s or not s[0].isalpha():
        s = "q_" + s if s else "q"
    return s
