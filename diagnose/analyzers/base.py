"""What every analyzer shares: the finding declaration and the quality notes.

An analyzer is a module in :data:`diagnose.analyzers.ANALYZERS`. It declares the findings its
numbers feed (``FINDINGS = declared("<module>")``: name, unit and description, kept in the
catalog ``diagnose/data/findings.yaml`` under the module's name) and exposes a function with
explicit inputs (the trace, options, other analyzers' results) and one frozen result
(a record of :mod:`diagnose.model` or a dataclass of its own, with the quality ``notes`` it
raised); :func:`diagnose.analyzers.analyze` wires them. The findings catalog
(:func:`diagnose.catalog.catalog`, documented in ``docs/rules.md``) is built from the
declarations; :func:`diagnose.findings.flatten` computes the values from the report model.
"""
from __future__ import annotations


import msgspec

from diagnose.trace.model import QualityIssue


class Finding(msgspec.Struct, frozen=True):
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


class Notes:
    """The data-quality issues of one analysis, in the order they were noted, one per code
    (the first message wins). :func:`diagnose.analyzers.analyze` owns one and merges each
    analyzer's notes into it; an analyzer returns its notes in its result."""

    def __init__(self, issues: list[QualityIssue] | tuple[QualityIssue, ...] = ()) -> None:
        self.issues: list[QualityIssue] = list(issues)  # the loader's, as they are

    def note(self, code: str, message: str, count: int | None = None) -> None:
        """Add an issue unless one of the same code is already there."""
        if not self.has(code):
            self.issues.append(QualityIssue(code, message, count))

    def extend(self, issues) -> None:
        for q in issues:
            if not self.has(q.code):
                self.issues.append(q)

    def has(self, code: str) -> bool:
        return any(q.code == code for q in self.issues)

    def replace(self, issue: QualityIssue) -> None:
        """Replace the issue of the same code (kept in place), if there is one."""
        self.issues = [issue if q.code == issue.code else q for q in self.issues]
