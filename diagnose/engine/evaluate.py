"""Evaluation of rules over a findings namespace: fired symptoms, passed rules, and rules not
evaluated for lack of inputs (never silently passing)."""
from __future__ import annotations

from typing import Any, Callable, Iterable, Mapping, Sequence

import msgspec

from diagnose.engine.condition import eval_condition, eval_expression, mangle
from diagnose.engine.rule import (SHARE_DENOMINATORS, SHARE_FIELD, Number, Rule, apply_overrides, render_template,
                                  share_fallback, share_text)
from diagnose.vocab import LEVERS, QUALITY_CODES, SEVERITY_RANK, STEP_PHASES


class Verdicts(msgspec.Struct):
    """Result of :func:`evaluate`.

    Attributes:
        symptoms: fired rules, worst severity first: {id, symptom, title, severity, phase,
            scope, summary, evidence {findings, thresholds}, likely_cause, how_to_verify,
            fix, references}.
        not_evaluated: {id, symptom, title, severity, missing [finding names], reason}.
        passed: evaluated rules that did not fire: {id, symptom, title, severity, phase,
            scope, summary, evidence}.
    """

    symptoms: list[dict[str, Any]] = msgspec.field(default_factory=list)
    not_evaluated: list[dict[str, Any]] = msgspec.field(default_factory=list)
    passed: list[dict[str, Any]] = msgspec.field(default_factory=list)

    @property
    def fired_ids(self) -> list[str]:
        return [s["id"] for s in self.symptoms]

    @property
    def headline(self) -> dict[str, Any] | None:
        """The lead verdict of the first fired symptom (the ranking puts the biggest time at
        stake first), or None when nothing fired: {text, rule_id, cause, device, ms, share,
        share_of}: ``share`` is the share the text prints, of the denominator ``share_of``."""
        return headline_of(self.symptoms)

    def worst(self) -> str | None:
        return self.symptoms[0]["severity"] if self.symptoms else None

    def at_least(self, severity: str) -> list[dict[str, Any]]:
        """Fired symptoms with severity >= ``severity``."""
        return [s for s in self.symptoms if SEVERITY_RANK[s["severity"]] >= SEVERITY_RANK[severity]]

    def to_dict(self) -> dict[str, Any]:
        return {"symptoms": self.symptoms, "not_evaluated": self.not_evaluated, "passed": self.passed}


from diagnose.numeric import num as _clean  # noqa: E402


def headline_of(symptoms: Sequence[Mapping[str, Any]]) -> dict[str, Any] | None:
    """The headline of ranked symptoms: the first one not grouped under another, as {text,
    rule_id, cause, device, ms, share, share_of}; None when none fired."""
    for s in symptoms:
        if s.get("grouped_under"):
            continue
        h = {"text": s.get("headline") or s["summary"], "rule_id": s["id"], "cause": s.get("cause") or None,
             "device": s.get("device"), "ms": s.get("stake_ms"), "share": s.get("share"), "share_of": s.get("share_of")}
        if s.get("predicted_saving_ms") is not None:
            h["predicted_saving_ms"] = s["predicted_saving_ms"]
        return h
    return None


def _stake_base_ms(findings: Mapping[str, Any]) -> tuple[float | None, str]:
    """What the severity of a stake is judged against, and its name: the steps' own time
    (``steps.own_ms``, else the sum of ``<phase>.own_ms`` over the step phases: "step_span"),
    or the device's own GPU window (``all.own_window_ms``: "phase_window") when the trace has
    no steps. Time outside the steps (the previous step's tail, waits on work not in the
    trace) is not what a rule's lever can win back."""
    own = _clean(findings.get("steps.own_ms"))
    if own is None:
        parts = [x for x in (_clean(findings.get(f"{p}.own_ms")) for p in STEP_PHASES) if x]
        own = sum(parts) if parts else None
    if own:
        return own, "step_span"
    win = _clean(findings.get("all.own_window_ms"))
    return (win if win is not None else _clean(findings.get("all.window_ms"))), "phase_window"


def severity_for_share(share: float) -> str:
    """Severity from the share of the window at stake: >= 50 % high, >= 20 % medium,
    >= 5 % low, else info (project defaults: severity follows the time at stake). The share
    is compared at the 6 digits the report keeps (0.36 / 1.8 is 20 %, not 19.999... %)."""
    share = round(share, 6)
    if share >= 0.5:
        return "high"
    if share >= 0.2:
        return "medium"
    if share >= 0.05:
        return "low"
    return "info"


def cause_levers(cause: str | None) -> tuple[str, ...]:
    """The levers of a rendered rule cause ``idle:<cause>`` (the cause table's), else ()."""
    from diagnose.vocab import CAUSE_LEVERS

    if not cause or not cause.startswith("idle:"):
        return ()
    return CAUSE_LEVERS.get(cause[len("idle:"):], ())


def _levers(r: Rule, findings: Mapping[str, Any], cause: str | None = None) -> tuple[list[str], list[str]]:
    """(levers recommended: the rule's cause's from the cause table, then the rule's own;
    notes on levers dropped because the evidence shows them in place)."""
    from diagnose.engine.condition import eval_condition as _evc, names_in

    keep, notes = [], []
    for name in dict.fromkeys((*cause_levers(cause), *r.recommends)):
        lv = LEVERS[name]
        if lv.present_when:
            tree = _present_tree(lv.present_when)
            env = {n: _clean(findings.get(n.replace("__", "."))) for n in names_in(tree)}
            try:
                present = None not in env.values() and _evc(tree, env)
            except (ZeroDivisionError, OverflowError):
                present = False
            if present:
                notes.append(f"not recommending {name.replace('_', ' ')}: {lv.present_text}")
                continue
        keep.append(name)
    return keep, notes


_PRESENT_TREES: dict[str, Any] = {}


def _present_tree(text: str):
    from diagnose.engine.condition import compile_condition

    if text not in _PRESENT_TREES:
        import ast as _ast
        import re as _re

        mangled = _re.sub(r"(?<=[a-z0-9_])\.(?=[a-z])", "__", text)
        names = {n.id: "finding" for n in _ast.walk(_ast.parse(mangled, mode="eval")) if isinstance(n, _ast.Name)}
        _PRESENT_TREES[text] = compile_condition(mangled, names, "vocab.LEVERS")
    return _PRESENT_TREES[text]


def evaluate(rules: Sequence[Rule], findings: Mapping[str, Any], scope: str | Iterable[str] | None = "trace",
             overrides: Mapping[str, Number] | None = None, unreliable: Iterable[str] | None = None,
             labels: Mapping[str, str] | None = None, savings: Callable[[Rule], float | None] | None = None) -> Verdicts:
    """Evaluate ``rules`` of ``scope`` over ``findings``.

    Args:
        rules: from :func:`load_rules`.
        findings: dotted finding name -> number (None/NaN/absent = missing).
        scope: one scope, several, or None for every rule.
        overrides: ``{"RULE.NAME": value}`` threshold overrides.
        unreliable: finding names that are None because the report marks them unreliable
            (:func:`unreliable_findings`); only changes the not-evaluated reason.
        labels: text values for templates (``trace.main_phase``, ``all.top_idle_cause``...).
        savings: for a fired rule with a ``whatif``, its predicted step-time saving in ms
            (:func:`diagnose.pipeline.attach_verdicts` re-times the trace's dependency graph),
            or None where there is no critical path.

    Returns:
        :class:`Verdicts`; a rule with a missing required finding, too few samples, a
        condition that cannot be computed (division by zero), or whose ``not_on`` names a
        quality code the trace has (``quality.<code>`` > 0), is in ``not_evaluated``. Fired
        symptoms with ``stake_ms`` get their severity from the share at stake of the steps'
        own time (the GPU window without steps; :func:`severity_for_share`). One ranking rule
        (:func:`rank_ms`): a symptom's predicted saving where the critical path gives one
        (``predicted_saving_ms``; its severity then follows the saving's share), else its loss
        against the roofline (``loss_ms``: kernel-table findings; severity from the loss's share),
        else its stake. Symptoms are ranked by severity, then rules that name a root cause
        (``kind: cause``) before those that describe a symptom, then that time; those sharing a
        ``cause`` are grouped under the first (``grouped_under``).

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

    labels = dict(labels or {})
    for r in rules:
        if scopes is not None and r.scope not in scopes:
            continue
        head = {"id": r.id, "symptom": r.symptom, "title": r.title, "severity": r.severity}
        blocked = [c for c in r.not_on if (_clean(findings.get(f"quality.{c}")) or 0) > 0]
        if blocked:
            v.not_evaluated.append({**head, "missing": [], "reason": "; ".join(
                f"not evaluated on this trace (quality {c}: {QUALITY_CODES[c].meaning})" for c in blocked)})
            continue
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
        entry = _entry(r, head, vals, findings, labels, fired, savings)
        if fired:
            v.symptoms.append(entry)
        else:
            v.passed.append(entry)
    rank_symptoms(v.symptoms, {r.id: r.kind for r in rules})
    return v


def rank_symptoms(symptoms: list[dict[str, Any]], kinds: Mapping[str, str]) -> None:
    """Sort fired symptoms in place (of one device or of several): severity, then rules that
    name a root cause (``kinds[id] == "cause"``) before those that describe a symptom, then
    the ranking time (:func:`rank_ms`), then id and device; those of one device sharing a ``cause`` are grouped
    under the first (``grouped_under``)."""
    for s in symptoms:  # a previous ranking's grouping is redone
        s.pop("grouped_under", None)
        s.pop("related", None)
    symptoms.sort(key=lambda s: (-SEVERITY_RANK[s["severity"]], kinds.get(s["id"]) != "cause", -rank_ms(s),
                                 s["id"], -1 if s.get("device") is None else s["device"]))
    _group(symptoms)


def _entry(r: Rule, head: dict[str, Any], vals: dict[str, Any], findings: Mapping[str, Any], labels: Mapping[str, str],
           fired: bool, savings: Callable[[Rule], float | None] | None = None) -> dict[str, Any]:
    """The verdict entry of an evaluated rule: its evidence (findings, thresholds, labels) and
    summary; for a fired rule also its prose, cause, headline, time at stake, its predicted
    saving where ``savings`` gives one (and the severity that follows from the share of the
    saving, else of the stake), and the levers it recommends less those already in place."""
    ev_findings = dict(vals)
    for n in r.evidence:
        ev_findings[n] = _clean(findings.get(n))
    for n in r.min_samples:
        ev_findings.setdefault(n, _clean(findings.get(n)))
    rule_labels = {k: labels.get(k) for k in r.labels}
    template_vals = {**ev_findings, **r.threshold_values(), **rule_labels}
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
    if rule_labels:
        entry["evidence"]["labels"] = rule_labels
    if fired:
        entry.update(likely_cause=r.likely_cause, how_to_verify=r.how_to_verify, fix=r.fix, references=list(r.references))
        if r.cause:
            entry["cause"] = render_template(r.cause, rule_labels)
        _rank_time(entry, r, ev_findings, findings, savings)
        if r.headline:
            share = entry.get("share")
            text = None if share is None else share_text(share, entry["share_of"], entry.get("share_base_ms"),
                                                         _left_out_ms(r, findings))
            entry["headline"] = render_template(r.headline, {**template_vals, SHARE_FIELD: text})
        keep, notes = _levers(r, findings, entry.get("cause"))
        entry["recommends"] = keep
        if notes:
            entry["already_in_place"] = notes
            # the rule's prose may name the dropped levers: every view shows this instead
            entry["fix"] = ("; ".join(LEVERS[k].text for k in keep) + ". " if keep else "") + " ".join(
                n[0].upper() + n[1:] + "." for n in notes)
    return entry


def _share_finding(r: Rule, findings: Mapping[str, Any]) -> str | None:
    """The finding a rule's share is of: its ``share_of``, or, when that is null, its
    fallback (:func:`~diagnose.engine.rule.share_fallback`: a phase without steps -> its own
    GPU window); None without ``share_of``."""
    if not r.share_of:
        return None
    fb = share_fallback(r.share_of)
    return fb if fb and _clean(findings.get(r.share_of)) is None else r.share_of


def _left_out_ms(r: Rule, findings: Mapping[str, Any]) -> float | None:
    """Idle time with an external cause that a phase's own window leaves out, when the rule's
    share is of that window and it is at least 1 % of the whole window (else None)."""
    of = _share_finding(r, findings) or ""
    if not of.endswith(".own_window_ms"):
        return None
    phase = of.rpartition(".")[0]
    whole, own = _clean(findings.get(f"{phase}.window_ms")), _clean(findings.get(of))
    if whole is None or own is None or whole - own < 0.01 * whole:
        return None
    return whole - own


def _rank_time(entry: dict[str, Any], r: Rule, ev_findings: Mapping[str, Any], findings: Mapping[str, Any],
               savings: Callable[[Rule], float | None] | None) -> None:
    """A fired rule's time at stake (``stake_ms``); its share of the severity base
    (``stake_share``, named by ``stake_share_of``); the rule's own share (``share`` of
    ``share_of``, ``share_base_ms``): the share its headline prints; its loss against the
    roofline (``loss_ms``); its predicted saving (``predicted_saving_ms``); which of them ranks
    it (``rank_basis``: predicted saving, else loss, else stake), and the severity that follows
    the ranking time's share of the severity base (:func:`rank_ms`). Each share has one
    denominator, named next to it."""
    window, window_of = _stake_base_ms(findings)
    env = {mangle(n): x for n, x in ev_findings.items() if x is not None}
    env.update(r.threshold_values())
    if r.stake_tree is not None:
        try:
            stake = eval_expression(r.stake_tree, env)
        except (ZeroDivisionError, OverflowError, KeyError):
            stake = None
        if stake is not None:
            stake = max(stake, 0.0)
            entry["stake_ms"] = round(stake, 6)
            entry["rank_basis"] = "stake"
            if window:
                entry["stake_share"] = round(min(stake / window, 1.0), 6)
                entry["stake_share_of"] = window_of
                entry["severity"] = severity_for_share(stake / window)
            of = _share_finding(r, findings)
            base = _clean(findings.get(of)) if of else None
            if base:
                entry["share"] = round(min(stake / base, 1.0), 6)
                entry["share_of"] = SHARE_DENOMINATORS[of.rpartition(".")[2]]
                entry["share_base_ms"] = round(base, 6)
    if r.loss_tree is not None:
        try:
            loss = eval_expression(r.loss_tree, env)
        except (ZeroDivisionError, OverflowError, KeyError):
            loss = None
        if loss is not None:
            entry["loss_ms"] = round(loss, 6)
            entry["rank_basis"] = "loss"
            if window:
                entry["severity"] = severity_for_share(min(loss / window, 1.0))
    saving = savings(r) if savings is not None and r.whatif else None
    if saving is not None:
        entry["predicted_saving_ms"] = round(saving, 6)
        entry["rank_basis"] = "predicted_saving"
        if window:
            entry["severity"] = severity_for_share(min(saving / window, 1.0))


def rank_ms(symptom: Mapping[str, Any]) -> float:
    """The time a symptom is ranked by (the report's one ranking rule): its predicted
    step-time saving where the critical path gives one (``predicted_saving_ms``), else its
    loss against the roofline (``loss_ms``: kernel-table findings), else its stake (0 without
    any)."""
    for key in ("predicted_saving_ms", "loss_ms", "stake_ms"):
        v = symptom.get(key)
        if v is not None:
            return float(v)
    return 0.0


def _group(symptoms: list[dict[str, Any]]) -> None:
    """Symptoms of one device that share a root cause (``cause``) follow the first of them
    (the one with the most at stake), marked ``grouped_under`` it; the lead lists them in
    ``related``."""
    lead: dict[tuple, dict] = {}
    ordered: list[dict] = []
    followers: dict[int, list[dict]] = {}
    for s in symptoms:
        c = s.get("cause")
        key = (s.get("device"), c)
        if c and key in lead:
            s["grouped_under"] = lead[key]["id"]
            lead[key].setdefault("related", []).append(s["id"])
            followers[id(lead[key])].append(s)
            continue
        if c:
            lead[key] = s
        followers[id(s)] = []
        ordered.append(s)
    symptoms[:] = [x for s in ordered for x in [s, *followers[id(s)]]]
