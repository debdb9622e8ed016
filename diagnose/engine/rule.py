"""Rules: the model (one YAML file per rule, checked against ``rules/rule.schema.json``),
loading, summary templates, threshold overrides and the ``--rules-config`` file.

Source of thresholds: ``docs/prefill-decode.md`` §3, §5, §7 (the article's numbers), cited
in each rule's ``rationale``.
"""
from __future__ import annotations

import ast
import json
import math
import re
import string
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence


from diagnose.engine.condition import compile_condition, compile_expression, mangle
from diagnose.engine.errors import RuleError
from diagnose.errors import DiagnoseError
from diagnose.inputs import finite_number, read_text_file
from diagnose.yamlio import MAX_USER_YAML_BYTES, is_yaml_error, load_user_yaml, load_yaml

Number = int | float

_SEGMENT = r"[a-z][a-z0-9]*(?:_[a-z0-9]+)*"
FINDING_NAME_RE = re.compile(rf"^{_SEGMENT}(?:\.{_SEGMENT})+$")
THRESHOLD_NAME_RE = re.compile(rf"^{_SEGMENT}$")
RULE_ID_RE = re.compile(r"^[A-Za-z][A-Za-z0-9-]*$")
#: Largest width or precision a summary/headline format spec may ask for ({x:100000000} would
#: print a 100 MB line).
MAX_FORMAT_NUMBER = 64


#: Where a threshold may come from (``basis.kind`` of a rule threshold; "Derive, never fit"):
#: the article's symptom table and readings (docs/prefill-decode.md), a hardware constant, a
#: published measurement, or the definition of the symptom's own words ("most" = more than half).
BASIS_KINDS = ("article", "hardware", "publication", "definition")

#: What a rule's ``share_of`` finding is a share of: the finding's last segment -> the
#: denominator's name in the JSON report (``headline.share_of``, ``symptoms[].share_of``).
#: ``window_ms`` is the whole GPU window (for a share of time with an external cause, which the
#: own window leaves out); ``<phase>.own_ms`` of a phase without steps (the ``all`` row of a
#: trace without steps) falls back to that phase's own GPU window (:func:`share_finding`), as
#: the phase's cause rows do.
SHARE_DENOMINATORS = {"own_window_ms": "phase_window", "window_ms": "phase_window", "gpu_busy_ms": "busy_union",
                      "kernel_busy_ms": "kernel_time", "own_ms": "step_span"}


def share_fallback(share_of: str) -> str | None:
    """The finding a ``share_of`` falls back to when it is null: a phase's own time
    (``<phase>.own_ms``, null without steps) -> the phase's own GPU window; else None."""
    phase, _, last = share_of.rpartition(".")
    return f"{phase}.own_window_ms" if last == "own_ms" and phase != "steps" else None


@dataclass(frozen=True)
class Basis:
    """Where a threshold's number comes from: ``kind`` (:data:`BASIS_KINDS`) and ``source``
    (the docs section, the hardware constant, the publication, or the definition)."""

    kind: str
    source: str


@dataclass(frozen=True)
class Threshold:
    """A named threshold: value, unit, why that number, and its basis (where it comes from)."""

    value: Number
    unit: str
    rationale: str
    basis: Basis | None = None


@dataclass(frozen=True, eq=False)
class Rule:
    """One symptom rule (a ``rules/<id>.yaml`` file). See ``rules/rule.schema.json``."""

    id: str
    symptom: str
    title: str
    severity: str
    phase: str
    scope: str
    requires: tuple[str, ...]
    thresholds: dict[str, Threshold]
    condition: str
    summary: str
    likely_cause: str
    how_to_verify: str
    fix: str
    references: tuple[str, ...]
    why: str = ""
    evidence: tuple[str, ...] = ()
    min_samples: dict[str, int] = field(default_factory=dict)
    source: str = ""
    tree: ast.Expression | None = field(default=None, repr=False)
    not_on: tuple[str, ...] = ()
    recommends: tuple[str, ...] = ()
    cause: str = ""
    stake_ms: str = ""
    stake_tree: ast.Expression | None = field(default=None, repr=False)
    loss_ms: str = ""
    loss_tree: ast.Expression | None = field(default=None, repr=False)
    headline: str = ""
    labels: tuple[str, ...] = ()
    kind: str = "symptom"
    whatif: Mapping[str, Any] | None = None  # README "What-if": what the lever removes (remove, speedup, phase)
    share_of: str = ""

    @property
    def share_denominator(self) -> str | None:
        """The name of what this rule's share is a share of (:data:`SHARE_DENOMINATORS`), or None."""
        return SHARE_DENOMINATORS.get(self.share_of.rpartition(".")[2]) if self.share_of else None

    def threshold_values(self) -> dict[str, Number]:
        return {k: t.value for k, t in self.thresholds.items()}

    def with_thresholds(self, values: Mapping[str, Number]) -> "Rule":
        """A copy with some threshold values replaced (names must exist)."""
        th = dict(self.thresholds)
        for k, v in values.items():
            th[k] = replace(th[k], value=v)
        return replace(self, thresholds=th)


@lru_cache(maxsize=1)
def rule_schema() -> dict:
    """The JSON Schema every rule file must satisfy (``rules/rule.schema.json``)."""
    return json.loads(resources.files("diagnose.rules").joinpath("rule.schema.json").read_text(encoding="utf-8"))


def _validate_schema(data: Any, where: str) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(rule_schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: list(e.absolute_path))
    if errors:
        e = errors[0]
        loc = "/".join(str(p) for p in e.absolute_path) or "(top level)"
        more = f" (+{len(errors) - 1} more)" if len(errors) > 1 else ""
        raise RuleError(f"{where}: schema: at {loc}: {e.message}{more}")


#: The headline field the engine fills with the rule's share and its denominator
#: (:func:`share_text`): ``{share}`` -> "64% of kernel time".
SHARE_FIELD = "share"


def share_text(share: float, denominator: str, base_ms: float | None, left_out_ms: float | None = None) -> str:
    """The share as a headline prints it, with what it is a share of: "64% of kernel time",
    "20% of the 100.0 ms GPU window" (one decimal under 10 %, so a small share never reads
    0%); a window with idle left out (an external cause: ``left_out_ms``) says so."""
    pct = f"{share:.0%}" if share >= 0.1 or share == 0 else f"{share:.1%}"

    def ms(x: float | None) -> str:
        return "n/a" if x is None else f"{x:.1f}" if x >= 1 else f"{x:.3f}"

    left = f" ({ms(left_out_ms)} ms of waits with an external cause left out)" if left_out_ms else ""
    return {"kernel_time": f"{pct} of kernel time",
            "phase_window": f"{pct} of the {ms(base_ms)} ms GPU window{left}",
            "busy_union": f"{pct} of the {ms(base_ms)} ms of GPU busy time",
            "step_span": f"{pct} of the steps' {ms(base_ms)} ms"}[denominator]


def _check_template(template: str, allowed: set[str], where: str, what: str = "summary") -> None:
    try:
        parts = list(string.Formatter().parse(template))
    except ValueError as e:
        raise RuleError(f"{where}: {what} template is invalid: {e}") from None
    for _, fname, spec, conv in parts:
        if fname is None:
            continue
        if spec and any(int(d) > MAX_FORMAT_NUMBER for d in re.findall(r"\d+", spec)):
            raise RuleError(f"{where}: {what} field {fname!r}: format spec {spec!r} asks for a width or precision over {MAX_FORMAT_NUMBER}")
        if fname == "" or fname not in allowed:
            raise RuleError(f"{where}: {what} refers to {fname!r}, which is not a required/evidence finding or a threshold")
        if conv:
            raise RuleError(f"{where}: {what} field {fname!r}: conversions (!r/!s/!a) are not allowed")
        if spec and ("{" in spec or "}" in spec):
            raise RuleError(f"{where}: {what} field {fname!r}: nested format fields are not allowed")
        if spec and spec != "ms":
            ok = False
            for probe in (0.5, 1):
                try:
                    format(probe, spec)
                    ok = True
                except (ValueError, TypeError):
                    pass
            if not ok:
                raise RuleError(f"{where}: {what} field {fname!r}: format spec {spec!r} does not format numbers")


def render_template(template: str, values: Mapping[str, Any]) -> str:
    """Fill ``{name[:spec]}`` fields with numbers (dotted finding names taken literally; None ->
    "n/a"); the spec ``ms`` formats a duration with :func:`diagnose.numeric.fmt_ms`."""
    out = []
    for lit, fname, spec, _ in string.Formatter().parse(template):
        out.append(lit)
        if fname is None:
            continue
        v = values.get(fname)
        if v is None:
            out.append("n/a")
            continue
        if spec == "ms" and isinstance(v, (int, float)):
            from diagnose.numeric import fmt_ms

            out.append(fmt_ms(float(v)))
            continue
        try:
            out.append(format(v, spec or ""))
        except (ValueError, TypeError):
            try:
                out.append(format(float(v), spec or ""))
            except (ValueError, TypeError):
                out.append(str(v))
    return "".join(out)


def _finite(value: Any, what: str) -> Number:
    """A threshold value: a finite number (NaN compares false with everything: a rule or a
    gate with a NaN threshold would never fire or never fail).

    Raises:
        RuleError: not a finite number.
    """
    try:
        return finite_number(value, what)
    except DiagnoseError as e:
        raise RuleError(str(e)) from None


def rule_from_dict(data: Any, where: str, expected_id: str | None = None, validate: bool = True) -> Rule:
    """Validate one parsed rule file and compile its condition.

    ``validate=False`` skips the JSON Schema check (used for the packaged rules, which the
    test suite validates; importing jsonschema costs seconds on some installs). The
    condition is always parsed and checked against the allowlist.

    Raises:
        RuleError: schema violation, id/file-name mismatch, unknown names, refused condition,
            bad summary template.
    """
    if validate:
        _validate_schema(data, where)
    rid = data["id"]
    if expected_id is not None and rid != expected_id:
        raise RuleError(f"{where}: id {rid!r} does not match the file name {expected_id!r}.yaml")
    requires = tuple(data["requires"])
    evidence = tuple(x for x in data.get("evidence", []) if x not in requires)
    thresholds = {k: Threshold(_finite(v["value"], f"{where}: threshold {k}"), v["unit"], v["rationale"],
                               Basis(**v["basis"]) if isinstance(v.get("basis"), dict) else None)
                  for k, v in (data.get("thresholds") or {}).items()}
    names = {mangle(f): "finding" for f in requires}
    names.update({k: "threshold" for k in thresholds})
    tree = compile_condition(data["condition"], names, where)
    unused = [k for k in thresholds if k not in {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)}]
    if unused:
        raise RuleError(f"{where}: threshold(s) {', '.join(unused)} declared but not used in the condition")
    labels = tuple(data.get("labels") or ())
    share_of = (data.get("share_of") or "").strip()
    stake = (data.get("stake_ms") or "").strip()
    headline = (data.get("headline") or "").strip()
    if bool(share_of) != bool(stake):
        raise RuleError(f"{where}: stake_ms and share_of go together (the time at stake and what it is a share of)")
    if share_of and share_of.rpartition(".")[2] not in SHARE_DENOMINATORS:
        raise RuleError(f"{where}: share_of {share_of!r} is not a denominator finding "
                        f"(<phase>.own_window_ms, <phase>.window_ms, <phase>.gpu_busy_ms, <phase>.kernel_busy_ms, <phase>.own_ms or steps.own_ms)")
    for f in (share_of, share_fallback(share_of) if share_of else None):
        if f and f not in requires and f not in evidence:
            evidence = evidence + (f,)
    allowed = set(requires) | set(evidence) | set(thresholds) | set(labels)
    _check_template(data["summary"], allowed, where)
    if headline:
        _check_template(headline, allowed | ({SHARE_FIELD} if share_of else set()), where, "headline")
        if share_of and "{" + SHARE_FIELD + "}" not in headline:
            raise RuleError(f"{where}: a headline of a rule with a share prints it: put {{{SHARE_FIELD}}} in the headline "
                            "(it renders as e.g. '64% of kernel time', naming the denominator)")
    cause = (data.get("cause") or "").strip()
    if cause:
        _check_template(cause, set(labels), where, "cause")
    stake_tree = None
    if stake:
        snames = {mangle(f): "finding" for f in (*requires, *evidence)}
        snames.update({k: "threshold" for k in thresholds})
        stake_tree = compile_expression(stake, snames, f"{where}: stake_ms")
    loss = (data.get("loss_ms") or "").strip()
    loss_tree = None
    if loss:
        lnames = {mangle(f): "finding" for f in (*requires, *evidence)}
        lnames.update({k: "threshold" for k in thresholds})
        loss_tree = compile_expression(loss, lnames, f"{where}: loss_ms")
    whatif = data.get("whatif")
    if whatif is not None:
        _check_whatif(whatif, where)
    from diagnose.vocab import LEVERS, QUALITY_CODES

    for lever in data.get("recommends") or ():
        if lever not in LEVERS:
            raise RuleError(f"{where}: recommends {lever!r}, not a lever of diagnose/data/causes.yaml ({', '.join(LEVERS)})")
    for code in data.get("not_on") or ():
        if code not in QUALITY_CODES:
            raise RuleError(f"{where}: not_on {code!r} is not a quality code of diagnose/vocab.py")
    return Rule(
        id=rid,
        symptom=data["symptom"],
        title=data["title"],
        severity=data["severity"],
        phase=data["phase"],
        scope=data["scope"],
        requires=requires,
        thresholds=thresholds,
        condition=data["condition"].strip(),
        summary=data["summary"].strip(),
        likely_cause=data["likely_cause"].strip(),
        how_to_verify=data["how_to_verify"].strip(),
        fix=data["fix"].strip(),
        references=tuple(data["references"]),
        why=(data.get("why") or "").strip(),
        evidence=evidence,
        min_samples=dict(data.get("min_samples") or {}),
        source=where,
        tree=tree,
        not_on=tuple(data.get("not_on") or ()),
        recommends=tuple(data.get("recommends") or ()),
        cause=cause,
        stake_ms=stake,
        stake_tree=stake_tree,
        loss_ms=loss,
        loss_tree=loss_tree,
        headline=headline,
        labels=labels,
        kind=data.get("kind") or "symptom",
        whatif=whatif,
        share_of=share_of,
    )


def _check_whatif(spec: Mapping[str, Any], where: str) -> None:
    """A rule's ``whatif`` must parse as a what-if scenario (the ``--remove`` / ``--speedup``
    grammar of :mod:`diagnose.analyzers.whatif`)."""
    from diagnose.analyzers.whatif import parse_remove, parse_speedup

    try:
        for r in spec.get("remove") or ():
            parse_remove(str(r))
        for cat, f in (spec.get("speedup") or {}).items():
            parse_speedup(f"{cat}={f}")
    except DiagnoseError as e:
        raise RuleError(f"{where}: whatif: {e}") from None
    if spec.get("roofline") not in (None, "all", "second"):
        raise RuleError(f"{where}: whatif: roofline is 'all' (every op class at its roofline) or 'second' "
                        f"(the class with the second largest loss), not {spec.get('roofline')!r}")


def parse_yaml(text: str, where: str, user: bool = True) -> Any:
    """Parse a rule, fixture or rules-config file. Files a user gives (``user``) are parsed
    without anchors/aliases and up to 1 MiB (:func:`diagnose.yamlio.load_user_yaml`); the
    packaged ones with the fast C loader.

    Raises:
        RuleError: invalid YAML, naming the file (and that the rules file, not the trace, is at fault).
    """
    try:
        return load_user_yaml(text) if user else load_yaml(text)
    except Exception as e:  # noqa: BLE001 - PyYAML's errors (imported only when a file is parsed)
        if not is_yaml_error(e):
            raise
        mark = getattr(e, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise RuleError(f"rules file {where}: not valid YAML{at}: {getattr(e, 'problem', None) or e}") from None


def _rule_files(path: str | Path | None):
    """(display name, stem, text) for every rule file under ``path`` (default: packaged rules)."""
    if path is None:
        root = resources.files("diagnose.rules")
        items = [(f"rules/{p.name}", p.name[:-5], p) for p in root.iterdir() if p.name.endswith(".yaml") and p.is_file()]
    else:
        p = Path(path)
        if not p.exists():
            raise RuleError(f"rules path not found: {path}")
        if p.is_file():
            items = [(str(p), p.stem, p)]
        else:
            items = [(str(f), f.stem, f) for f in p.iterdir() if f.suffix == ".yaml" and f.is_file()]
    for where, stem, f in sorted(items, key=lambda x: x[1]):
        if path is None:
            text = f.read_text(encoding="utf-8")
        else:
            try:  # at most 1 MiB (parse_yaml's bound), byte-order marks honoured
                text = read_text_file(f, "rules file", MAX_USER_YAML_BYTES)
            except DiagnoseError as e:
                raise RuleError(str(e)) from None
        yield where, stem, text


def load_rules(path: str | Path | None = None, validate: bool | None = None) -> list[Rule]:
    """Load and validate rule files, sorted by id.

    Args:
        path: a directory of ``<id>.yaml`` files (its ``fixtures/`` folder is ignored), one
            rule file, or None for the rules packaged in ``diagnose.rules``.
        validate: check each file against ``rule.schema.json``; default: yes for user rule
            files, no for the packaged ones (validated by the test suite and ``rules test``).

    Raises:
        RuleError: any invalid file (the message names it and what is wrong); duplicate ids;
            no rule file at all.
    """
    if path is None:
        return list(_packaged_rules(bool(validate)))
    return _load(path, True if validate is None else validate)


@lru_cache(maxsize=2)
def _packaged_rules(validate: bool) -> tuple[Rule, ...]:
    return tuple(_load(None, validate))


def _load(path, validate: bool = True) -> list[Rule]:
    rules: list[Rule] = []
    seen: dict[str, str] = {}
    for where, stem, text in _rule_files(path):
        data = parse_yaml(text, where, user=path is not None)
        r = rule_from_dict(data, where, expected_id=stem, validate=validate)
        if r.id in seen:
            raise RuleError(f"{where}: duplicate rule id {r.id!r} (also in {seen[r.id]})")
        seen[r.id] = where
        rules.append(r)
    if not rules:
        # an empty folder would pass every gate and fire nothing: a silent all-clear
        raise RuleError(f"no rule files (*.yaml) found in {path or 'the packaged rules'}")
    return sorted(rules, key=lambda r: r.id)


def parse_threshold_specs(specs: Iterable[str]) -> dict[str, float]:
    """``["S3-launch-gaps.max_launch_gap_share=0.2"]`` -> ``{"S3-launch-gaps.max_launch_gap_share": 0.2}``.

    Raises:
        DiagnoseError: not RULE.NAME=NUMBER.
    """
    out: dict[str, float] = {}
    for spec in specs or ():
        if "=" not in spec or "." not in spec.split("=", 1)[0]:
            raise DiagnoseError(f"--threshold expects RULE.NAME=VALUE, got {spec!r}")
        key, val = (s.strip() for s in spec.split("=", 1))
        try:
            num = float(val[:-1]) / 100.0 if val.endswith("%") else float(val)
        except ValueError:
            raise DiagnoseError(f"--threshold {key}: {val!r} is not a number") from None
        if not math.isfinite(num):
            raise DiagnoseError(f"--threshold {key}: {val!r} is not finite")
        out[key] = num
    return out


@dataclass
class RulesConfig:
    """Contents of a ``--rules-config`` YAML file."""

    overrides: dict[str, float] = field(default_factory=dict)
    disable: tuple[str, ...] = ()


def load_rules_config(path: str) -> RulesConfig:
    """Read a rules config::

        thresholds:
          S3-launch-gaps.max_launch_gap_share: 0.2      # flat RULE.NAME keys, or
          S2-decode-far-from-bound: {max_bound_ratio: 4}  # nested per rule
        disable: [S7-cpu-region-shorter-than-gpu]

    Raises:
        RuleError: missing/unreadable file, bad YAML, unknown keys, non-numeric values.
    """
    try:
        text = read_text_file(path, "rules config", MAX_USER_YAML_BYTES)
    except DiagnoseError as e:
        raise RuleError(str(e)) from None
    data = parse_yaml(text, str(path)) or {}
    if not isinstance(data, dict):
        raise RuleError(f"{path}: a rules config is a mapping with keys thresholds and disable")
    extra = set(data) - {"thresholds", "disable"}
    if extra:
        raise RuleError(f"{path}: unknown key(s) {', '.join(sorted(map(str, extra)))} (allowed: thresholds, disable)")
    cfg = RulesConfig()
    th = data.get("thresholds") or {}
    if not isinstance(th, dict):
        raise RuleError(f"{path}: thresholds must be a mapping")
    for k, v in th.items():
        items = [(f"{k}.{n}", x) for n, x in v.items()] if isinstance(v, dict) else [(str(k), v)]
        for key, x in items:
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not math.isfinite(x):
                raise RuleError(f"{path}: threshold {key} must be a number, got {x!r}")
            if "." not in key:
                raise RuleError(f"{path}: threshold key {key!r} must be RULE.NAME")
            cfg.overrides[key] = x
    dis = data.get("disable") or []
    if not isinstance(dis, list) or not all(isinstance(x, str) for x in dis):
        raise RuleError(f"{path}: disable must be a list of rule ids")
    cfg.disable = tuple(dis)
    return cfg


def apply_overrides(rules: Sequence[Rule], overrides: Mapping[str, Number] | None) -> list[Rule]:
    """Rules with ``{"RULE.NAME": value}`` overrides applied.

    Raises:
        RuleError: unknown rule id or threshold name, or a non-numeric value.
    """
    if not overrides:
        return list(rules)
    by_id = {r.id: r for r in rules}
    per_rule: dict[str, dict[str, Number]] = {}
    for key, val in overrides.items():
        rid, _, name = str(key).rpartition(".")
        if rid not in by_id:
            raise RuleError(f"threshold override {key!r}: unknown rule {rid!r}")
        if name not in by_id[rid].thresholds:
            have = ", ".join(by_id[rid].thresholds) or "none"
            raise RuleError(f"threshold override {key!r}: rule {rid} has no threshold {name!r} (has: {have})")
        _finite(val, f"threshold override {key!r}")
        per_rule.setdefault(rid, {})[name] = val
    return [r.with_thresholds(per_rule[r.id]) if r.id in per_rule else r for r in rules]


@dataclass(frozen=True)
class RuleSet:
    """The rules to evaluate and their threshold overrides (``{"RULE.NAME": value}``), after
    ``--rules``, ``--rules-config`` (thresholds, disable) and ``--threshold`` were applied."""

    rules: tuple[Rule, ...]
    overrides: dict[str, Number] = field(default_factory=dict)

    def effective(self) -> dict[str, Rule]:
        """Rules by id with the overrides applied."""
        return {r.id: r for r in apply_overrides(self.rules, self.overrides)}


def load_ruleset(rules_dir: str | None = None, rules_config: str | None = None, thresholds: Iterable[str] = (),
                 extra: Mapping[str, Number] | None = None) -> RuleSet:
    """Rules minus disabled ones, with overrides. Precedence: config < ``extra`` < ``thresholds``.

    Raises:
        RuleError: invalid rules, config, or an override naming an unknown rule or threshold.
        DiagnoseError: a malformed ``--threshold`` spec.
    """
    rules = load_rules(rules_dir)
    overrides: dict[str, Number] = {}
    disabled: tuple[str, ...] = ()
    if rules_config:
        cfg = load_rules_config(rules_config)
        overrides.update(cfg.overrides)
        disabled = cfg.disable
        unknown = [d for d in disabled if d not in {r.id for r in rules}]
        if unknown:
            raise RuleError(f"{rules_config}: disable names unknown rule(s): {', '.join(unknown)}")
    overrides.update(extra or {})
    overrides.update(parse_threshold_specs(thresholds))
    apply_overrides(rules, overrides)  # validate names now: exit 2 on a typo
    rules = [r for r in rules if r.id not in disabled]
    overrides = {k: v for k, v in overrides.items() if k.rpartition(".")[0] not in disabled}
    return RuleSet(tuple(rules), overrides)
