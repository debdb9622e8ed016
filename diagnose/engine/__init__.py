"""The rule engine: one YAML file per symptom rule (``rules/``), a safe condition language,
evaluation over the findings namespace (:mod:`diagnose.findings`), fixtures and docs.

* :mod:`.condition` — the allowlisted condition language (never ``eval``);
* :mod:`.rule` — the rule model, loading and schema check, templates, overrides, rule sets;
* :mod:`.evaluate` — fired / passed / not evaluated, ranked;
* :mod:`.fixtures` — positive and negative findings-level fixtures per rule;
* :mod:`.docs` — the rules reference (``docs/rules.md``).

Verdicts are attached to a report in one place: :func:`diagnose.pipeline.attach_verdicts`.
"""
from diagnose.engine.condition import compile_condition, eval_condition, mangle, unmangle
from diagnose.engine.errors import RuleError
from diagnose.engine.evaluate import Verdicts, evaluate
from diagnose.engine.rule import (
    FINDING_NAME_RE,
    Rule,
    RulesConfig,
    RuleSet,
    Threshold,
    apply_overrides,
    load_rules,
    load_rules_config,
    load_ruleset,
    parse_threshold_specs,
    render_template,
    rule_from_dict,
    rule_schema,
)

__all__ = [
    "FINDING_NAME_RE", "Rule", "RuleError", "RuleSet", "RulesConfig", "Threshold", "Verdicts", "apply_overrides",
    "compile_condition", "eval_condition", "evaluate", "load_rules", "load_rules_config", "load_ruleset", "mangle",
    "parse_threshold_specs", "render_template", "rule_from_dict", "rule_schema", "unmangle",
]
