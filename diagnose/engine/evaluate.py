"""Evaluation of rules over a findings namespace: fired symptoms, passed rules, and rules not
evaluated for lack of inputs (never silently passing)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from diagnose.engine.condition import eval_condition, mangle
from diagnose.engine.rule import Number, Rule, apply_overrides, render_template
from diagnose.vocab import SEVERITY_RANK


@dataclass
class Verdicts:
    """Result of :func:`evaluate`.

    Attributes:
        symptoms: fired rules, worst severity first: {id, symptom, title, severity, phase,
            scope, summary, evidence {findings, thresholds}, likely_cause, how_to_verify,
            fix, references}.
        not_evaluated: {id, symptom, title, severity, missing [finding names], reason}.
        passed: evaluated rules that did not fire: {id, symptom, title, severity, phase,
            scope, summary, evidence}.
    """

    symptoms: list[dict[str, Any]] = field(default_factory=list)
    not_evaluated: list[dict[str, Any]] = field(default_factory=list)
    passed: list[dict[str, Any]] = field(default_factory=list)

    @property
    def fired_ids(self) -> list[str]:
        return [s["id"] for s in self.symptoms]

    def worst(self) -> str | None:
        return self.symptoms[0]["severity"] if self.symptoms else None

    def at_least(self, severity: str) -> list[dict[str, Any]]:
        """Fired symptoms with severity >= ``severity``."""
        return [s for s in self.symptoms if SEVERITY_RANK[s["severity"]] >= SEVERITY_RANK[severity]]

    def to_dict(self) -> dict[str, Any]:
        return {"symptoms": self.symptoms, "not_evaluated": self.not_evaluated, "passed": self.passed}


from diagnose.numeric import num as _clean  # noqa: E402


def evaluate(rules: Sequence[Rule], findings: Mapping[str, Any], scope: str | Iterable[str] | None = "trace",
             overrides: Mapping[str, Number] | None = None, unreliable: Iterable[str] | None = None) -> Verdicts:
    """Evaluate ``rules`` of ``scope`` over ``findings``.

    Args:
        rules: from :func:`load_rules`.
        findings: dotted finding name -> number (None/NaN/absent = missing).
        scope: one scope, several, or None for every rule.
        overrides: ``{"RULE.NAME": value}`` threshold overrides.
        unreliable: finding names that are None because the report marks them unreliable
            (:func:`unreliable_findings`); only changes the not-evaluated reason.

    Returns:
        :class:`Verdicts`; a rule with a missing required finding, too few samples, or a
        condition that cannot be computed (division by zero) is in ``not_evaluated``.

    Raises:
        RuleError: an override names an unknown rule or threshold.
    """
    rules = apply_overrides(rules, overrides)
    scopes = None if scope is None else ({scope} if isinstance(scope, str) else set(scope))
    v = Verdicts()
    unreliable = set(unreliable or ())

    def why_missing(names: list[str]) -> str:
        bad = [n for n in names if n in unreliable]
        gone = [n for n in names if n not in unreliable]
        parts = []
        if gone:
            parts.append("missing finding(s): " + ", ".join(gone))
        if bad:
            parts.append("unreliable finding(s) (see quality): " + ", ".join(bad))
        return "; ".join(parts)

    for r in rules:
        if scopes is not None and r.scope not in scopes:
            continue
        head = {"id": r.id, "symptom": r.symptom, "title": r.title, "severity": r.severity}
        vals = {n: _clean(findings.get(n)) for n in r.requires}
        missing = [n for n, x in vals.items() if x is None]
        if missing:
            v.not_evaluated.append({**head, "missing": missing, "reason": why_missing(missing)})
            continue
        short = []
        for n, need in r.min_samples.items():
            have = _clean(findings.get(n))
            if have is None:
                missing.append(n)
            elif have < need:
                short.append(f"{n} = {have:g} < {need}")
        if missing or short:
            reason = "; ".join(filter(None, [why_missing(missing) if missing else "",
                                             "too few samples: " + ", ".join(short) if short else ""]))
            v.not_evaluated.append({**head, "missing": missing, "reason": reason})
            continue
        env = {mangle(n): x for n, x in vals.items()}
        env.update(r.threshold_values())
        try:
            fired = eval_condition(r.tree, env)
        except (ZeroDivisionError, OverflowError) as e:
            v.not_evaluated.append({**head, "missing": [], "reason": f"condition could not be computed: {type(e).__name__}"})
            continue
        ev_findings = dict(vals)
        for n in r.evidence:
            ev_findings[n] = _clean(findings.get(n))
        for n in r.min_samples:
            ev_findings.setdefault(n, _clean(findings.get(n)))
        template_vals = {**ev_findings, **r.threshold_values()}
        entry = {
            **head,
            "phase": r.phase,
            "scope": r.scope,
            "summary": render_template(r.summary, template_vals),
            "evidence": {
                "findings": ev_findings,
                "thresholds": {k: {"value": t.value, "unit": t.unit, "rationale": t.rationale} for k, t in r.thresholds.items()},
            },
        }
        if fired:
            entry.update(likely_cause=r.likely_cause, how_to_verify=r.how_to_verify, fix=r.fix, references=list(r.references))
            v.symptoms.append(entry)
        else:
            v.passed.append(entry)
    v.symptoms.sort(key=lambda s: (-SEVERITY_RANK[s["severity"]], s["id"]))
    return v
