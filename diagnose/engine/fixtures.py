"""Rule fixtures: positive and negative findings-level cases per rule (``fixtures/<id>.yaml``)."""
from __future__ import annotations

from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Sequence

from diagnose.engine.errors import RuleError
from diagnose.engine.evaluate import evaluate
from diagnose.engine.rule import FINDING_NAME_RE, Rule, parse_yaml

EXPECTATIONS = ("fire", "pass", "not_evaluated")


@dataclass
class FixtureResult:
    rule_id: str
    case: str
    expect: str
    got: str
    detail: str = ""

    @property
    def ok(self) -> bool:
        return self.expect == self.got


def _fixture_texts(path: str | Path | None):
    if path is None:
        root = resources.files("diagnose.rules").joinpath("fixtures")
        items = [(f"rules/fixtures/{p.name}", p.name[:-5], p) for p in root.iterdir() if p.name.endswith(".yaml")]
    else:
        root = Path(path)
        root = root / "fixtures" if (root / "fixtures").is_dir() else root
        items = [(str(p), p.stem, p) for p in root.glob("*.yaml")] if root.is_dir() else []
    return {stem: (where, f.read_text(encoding="utf-8")) for where, stem, f in items}


def run_fixtures(rules: Sequence[Rule], path: str | Path | None = None) -> list[FixtureResult]:
    """Run every rule's fixtures (``fixtures/<rule id>.yaml``).

    A fixture file::

        rule: S3-launch-gaps
        cases:
          - name: host-late launches
            expect: fire            # fire | pass | not_evaluated
            findings: {decode.launch_gap_share: 0.3, decode.activity_count: 400}
            overrides: {max_launch_gap_share: 0.2}   # optional, this rule's thresholds

    Each rule needs at least one ``fire`` and one ``pass`` case; a rule without fixtures, or
    a fixture for an unknown rule, is a failed result.

    Args:
        rules: loaded rules.
        path: the rules directory (fixtures in its ``fixtures/``) or the fixtures directory;
            None for the packaged fixtures.
    """
    texts = _fixture_texts(path)
    results: list[FixtureResult] = []
    by_id = {r.id: r for r in rules}
    for stem in sorted(set(texts) - set(by_id)):
        results.append(FixtureResult(stem, "(file)", "rule exists", "no such rule", texts[stem][0]))
    for r in rules:
        if r.id not in texts:
            results.append(FixtureResult(r.id, "(file)", "fixtures", "none", f"add fixtures/{r.id}.yaml"))
            continue
        where, text = texts[r.id]
        try:
            data = parse_yaml(text, where)
            cases = _check_fixture(data, r, where)
        except RuleError as e:
            results.append(FixtureResult(r.id, "(file)", "valid fixture", "invalid", str(e)))
            continue
        for i, c in enumerate(cases):
            name = str(c.get("name") or f"case {i + 1}")
            ov = {f"{r.id}.{k}": v for k, v in (c.get("overrides") or {}).items()}
            try:
                verdict = evaluate([r], c.get("findings") or {}, scope=None, overrides=ov)
            except RuleError as e:
                results.append(FixtureResult(r.id, name, c["expect"], "error", str(e)))
                continue
            if verdict.symptoms:
                got, detail = "fire", verdict.symptoms[0]["summary"]
            elif verdict.passed:
                got, detail = "pass", verdict.passed[0]["summary"]
            else:
                got, detail = "not_evaluated", verdict.not_evaluated[0]["reason"]
            if got == "not_evaluated" and c["expect"] == "not_evaluated" and c.get("missing"):
                if sorted(c["missing"]) != sorted(verdict.not_evaluated[0]["missing"]):
                    got = "not_evaluated(missing=" + ",".join(verdict.not_evaluated[0]["missing"]) + ")"
            results.append(FixtureResult(r.id, name, c["expect"], got, detail))
    return results


def _check_fixture(data: Any, rule: Rule, where: str) -> list[dict]:
    if not isinstance(data, dict) or set(data) - {"rule", "cases"} or data.get("rule") != rule.id:
        raise RuleError(f"{where}: a fixture file is {{rule: {rule.id}, cases: [...]}}")
    cases = data.get("cases")
    if not isinstance(cases, list) or not cases:
        raise RuleError(f"{where}: cases must be a non-empty list")
    for c in cases:
        if not isinstance(c, dict) or set(c) - {"name", "expect", "findings", "overrides", "missing"}:
            raise RuleError(f"{where}: each case has name, expect, findings, and optional overrides, missing")
        if c.get("expect") not in EXPECTATIONS:
            raise RuleError(f"{where}: case {c.get('name')!r}: expect must be one of {', '.join(EXPECTATIONS)}")
        f = c.get("findings") or {}
        if not isinstance(f, dict):
            raise RuleError(f"{where}: case {c.get('name')!r}: findings must be a mapping")
        for k, v in f.items():
            if not FINDING_NAME_RE.match(str(k)):
                raise RuleError(f"{where}: case {c.get('name')!r}: {k!r} is not a finding name")
            if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float))):
                raise RuleError(f"{where}: case {c.get('name')!r}: {k} must be a number or null")
    kinds = {c["expect"] for c in cases}
    if not {"fire", "pass"} <= kinds:
        raise RuleError(f"{where}: needs at least one 'fire' (positive) and one 'pass' (negative) case")
    return cases
