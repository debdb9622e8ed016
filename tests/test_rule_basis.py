"""Rules that hold for the reason they fire (issue 23): every threshold in rules/ carries its
basis (the article's symptom table and readings, a hardware constant, a published measurement,
or the definition of the rule's own words), the schema refuses a threshold without one, and no
rule text (rule files and their fixtures) names a corpus trace: not a shared trace file, not a
model the corpus traces run, and no measured number that the user-facing reasoning page
(docs/prefill-decode.md) does not derive.
"""
from __future__ import annotations

import re

import pytest
import yaml

from conftest import ROOT, SHARED_TRACES
from diagnose.engine import RuleError, load_rules
from diagnose.engine.rule import BASIS_KINDS

RULES_DIR = ROOT / "rules"
DOCS = (ROOT / "docs" / "prefill-decode.md").read_text(encoding="utf-8")
RULE_FILES = sorted(RULES_DIR.glob("*.yaml")) + sorted((RULES_DIR / "fixtures").glob("*.yaml"))

#: Models the corpus traces run (the engines' test models): a rule about one of them is a rule
#: about a trace.
CORPUS_MODELS = ("qwen", "gpt-oss", "resnet", "dlrm", "alexnet")
SECTION = re.compile(r"docs/prefill-decode\.md §(\d+)(?:\.(\d+))?")


def _sections() -> set[str]:
    return {m.group(1) for m in re.finditer(r"^## (\d+)\.", DOCS, re.M)} | {
        f"{a}.{b}" for a, b in re.findall(r"^### (\d+)\.(\d+)", DOCS, re.M)}


def test_every_threshold_carries_a_basis_that_names_its_source():
    sections = _sections()
    rules = load_rules(validate=True)
    checked = 0
    for r in rules:
        refs = " ".join(r.references)
        for name, t in r.thresholds.items():
            where = f"{r.id}.{name}"
            assert t.basis is not None, f"{where}: no basis"
            assert t.basis.kind in BASIS_KINDS, where
            src = t.basis.source
            if t.basis.kind == "article":
                cited = SECTION.findall(src)
                assert cited, f"{where}: an article basis cites docs/prefill-decode.md §N: {src!r}"
                for a, b in cited:
                    assert (f"{a}.{b}" if b else a) in sections, f"{where}: no section §{a}{'.' + b if b else ''} in the docs"
            elif t.basis.kind == "publication":
                assert re.search(r"arXiv:\d{4}\.\d{4,5}|https?://|\w+/[\w.-]+", src + " " + refs), f"{where}: {src!r}"
            elif t.basis.kind == "definition":
                assert re.search(r"'[^']+'", src), f"{where}: a definition quotes the words it defines: {src!r}"
            checked += 1
    assert checked == sum(len(r.thresholds) for r in rules) and checked >= 25


def test_schema_refuses_a_threshold_without_a_basis(tmp_path):
    from test_rules import write_rule

    th = {"max_share": {"value": 0.15, "unit": "fraction", "rationale": "docs/prefill-decode.md §5.1"}}
    with pytest.raises(RuleError, match=r"thresholds/max_share: 'basis' is a required property"):
        load_rules(write_rule(tmp_path, thresholds=th))
    th["max_share"]["basis"] = {"kind": "tuned", "source": "a trace"}
    with pytest.raises(RuleError, match=r"thresholds/max_share/basis/kind: 'tuned' is not one of"):
        load_rules(write_rule(tmp_path, thresholds=th))


def _corpus_names() -> set[str]:
    """Shared trace file names (with and without extensions) and their folder names, and the
    shipped samples', of six characters or more."""
    out: set[str] = set()
    roots = [ROOT / "samples"] + ([SHARED_TRACES] if SHARED_TRACES.exists() else [])
    for root in roots:
        for p in root.rglob("*"):
            if p.name.startswith(".") or p.suffix in (".md", ".py") or p.name == "LICENSE":
                continue
            rel = p.relative_to(root)
            names = {rel.as_posix(), p.name, re.sub(r"(?:\.pt\.trace)?(?:\.(?:json|gz|sqlite|nsys-rep|tar))+$", "", p.name)}
            names |= {part for part in rel.parts[:-1]}
            # a name of its own (underscores, digits, dashes): not a word such as "prefill"
            out |= {n.lower() for n in names if len(n) >= 6 and (re.search(r"[-_.0-9]", n) or n in rel.parts[:1])}
    return out


def _rule_texts() -> list[tuple[str, str]]:
    """(where, text) of every string in every rule file and fixture file."""
    out = []

    def walk(where: str, v) -> None:
        if isinstance(v, str):
            out.append((where, v))
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(f"{where}.{k}", x)
        elif isinstance(v, list):
            for i, x in enumerate(v):
                walk(f"{where}[{i}]", x)

    for f in RULE_FILES:
        walk(f.relative_to(ROOT).as_posix(), yaml.safe_load(f.read_text(encoding="utf-8")))
    return out


def test_no_rule_text_names_a_corpus_trace_or_its_model():
    names = _corpus_names()
    assert "graph_execution" in names or not SHARED_TRACES.exists()
    assert "vllm_decode_mi300x" in names
    bad = []
    for where, text in _rule_texts():
        low = text.lower()
        bad += [(where, n) for n in names if n in low]
        bad += [(where, m) for m in CORPUS_MODELS if re.search(rf"(?<![a-z]){re.escape(m)}", low)]
    assert bad == []


#: A measured number in prose: a number with a unit of time, share or rate.
MEASURED = re.compile(r"(?<![\w.{])(\d+(?:\.\d+)?)\s?(ms|µs|us|%|TB/s|GB/s|TFLOP/s|tok/s)(?![\w])")


def test_every_measured_number_in_rule_prose_is_derived_on_the_reasoning_page():
    """A time, share or rate a rule quotes (outside its template fields) appears on
    docs/prefill-decode.md, which derives each from the article or a cited measurement: a
    number measured on one trace has no place there, so none in a rule either."""
    page = DOCS.replace("\u00a0", " ")
    shown = {(float(n), u) for n, u in MEASURED.findall(page)}
    bad = []
    for where, text in _rule_texts():
        if "/fixtures/" in where:  # fixtures are synthetic cases (their names are checked above)
            continue
        plain = re.sub(r"\{[^}]*\}", "", text)
        for n, u in MEASURED.findall(plain):
            if (float(n), u) not in shown:
                bad.append((where, f"{n} {u}"))
    assert bad == []
