"""Golden whole-report tests (Perfetto diff-test style).

For every shared Kineto / nsys SQLite trace and every shipped sample, the whole JSON report
of ``diagnose run --format json`` (verdicts included) is checked in under ``tests/golden/``,
floats rounded to 6 significant digits and paths made relative. A change that moves any
number, verdict or quality code shows as a diff here.

Regenerate after a reviewed change::

    python -m pytest tests/test_golden.py --update-golden

then read ``git diff tests/golden`` before committing.
"""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, SHARED_TRACES, sweep
from diagnose.cli import main

GOLDEN = Path(__file__).parent / "golden"
#: The flat findings of each golden report (the rules' namespace), numbers only.
FINDINGS_GOLDEN = GOLDEN / "findings"
SAMPLES = ROOT / "samples"

#: (golden name, path, extra CLI arguments). Shared traces are found relative to
#: ``../shared/traces``; cases whose file is absent are skipped.
def _cases() -> list[tuple[str, Path, tuple[str, ...]]]:
    out = []
    for p in sorted(SAMPLES.rglob("*.json*")):
        out.append(("samples__" + p.relative_to(SAMPLES).as_posix().replace("/", "__"), p, ()))
    if SHARED_TRACES.exists():
        for p in sorted(SHARED_TRACES.rglob("*")):
            if not p.is_file() or p.name == "execution_details.json":
                continue
            if not (p.name.endswith((".json", ".json.gz", ".sqlite"))):
                continue
            rel = p.relative_to(SHARED_TRACES)
            out.append(("shared__" + str(rel).replace("/", "__"), p, ()))
    out.extend(_config_cases())
    return out


def _config_cases() -> list[tuple[str, Path, tuple[str, ...]]]:
    """Runs with a model config and GPU: the settings of shared/design/expert_readings.md."""
    tl = SHARED_TRACES / "tracelens"
    capture = tl / "vllm_decode_full" / "graph_capture_rank_0.1773709742341309550.pt.trace.json.gz"
    cases = [
        ("expert__vllm_decode_full__gpt-oss-20b_MI300X", tl / "vllm_decode_full" / "graph_execution.json.gz",
         ("--model-config", "gpt-oss-20b", "--gpu", "MI300X", "--capture-trace", str(capture))),
        ("expert__vllm_prefilldecode_piecewise__gpt-oss-20b_MI300X", tl / "vllm_prefilldecode_piecewise" / "graph_execution.json.gz",
         ("--model-config", "gpt-oss-20b", "--gpu", "MI300X")),
        ("expert__sglang_prefilldecode__qwen3-8b_MI300X", tl / "sglang_prefilldecode" / "sglang_Qwen3-8B_prefilldecode.json.gz",
         ("--model-config", "qwen3-8b", "--gpu", "MI300X")),
        ("expert__h100_qwen1.5-0.5b", tl / "h100" / "Qwen_Qwen1.5-0.5B-Chat__1016005.json.gz", ("--model-config", "qwen1.5-0.5b")),
    ]
    return [c for c in cases if c[1].exists()]


CASES = _cases()


def normalize(obj, root_paths: tuple[tuple[str, str], ...]):
    """Floats to 6 significant digits, absolute paths made relative (stable across machines)."""
    if isinstance(obj, float):
        if not math.isfinite(obj) or obj == 0.0:
            return obj
        return float(f"{obj:.6g}")
    if isinstance(obj, str):
        for prefix, repl in root_paths:
            if prefix in obj:
                obj = obj.replace(prefix, repl)
        return obj
    if isinstance(obj, list):
        return [normalize(x, root_paths) for x in obj]
    if isinstance(obj, dict):
        return {k: normalize(v, root_paths) for k, v in obj.items()}
    return obj


def report_for(path: Path, extra: tuple[str, ...]) -> tuple[dict, dict]:
    """(the report without its ``findings``, the findings): both normalized."""
    r = CliRunner().invoke(main, ["run", "--trace", str(path), "--format", "json", *extra])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    findings = d.pop("findings")
    roots = ((str(SHARED_TRACES) + "/", "<shared>/"), (str(ROOT) + "/", "<project>/"))
    return normalize(d, roots), normalize(findings, roots)


def _check(golden: Path, got, request, sort_keys: bool = False) -> None:
    text = json.dumps(got, indent=1, sort_keys=sort_keys, ensure_ascii=False) + "\n"
    if request.config.getoption("--update-golden"):
        golden.write_text(text, encoding="utf-8")
        return
    if not golden.exists():
        pytest.fail(f"no golden file {golden.name}: run pytest {Path(__file__).name} --update-golden and review it")
    want = json.loads(golden.read_text(encoding="utf-8"))
    if got != want:
        diffs = list(_diff(want, got, ""))
        pytest.fail(f"{len(diffs)} difference(s) from {golden.name} (regenerate with --update-golden after review):\n"
                    + "\n".join(diffs[:40]))


#: The inner loop's representatives: both shipped samples, one shared Kineto trace, one nsys
#: SQLite report and one run with a model config; the rest of the corpus runs in the full suite.
INNER_LOOP = {"samples__tiny_cpu.json.gz", "samples__tracelens__vllm_decode_mi300x.json.gz",
              "shared__tracelens__sglang_decode__sglang_Qwen3-8B_decode.json.gz",
              "shared__nvfuser__64ee035__report1.sqlite", "expert__h100_qwen1.5-0.5b"}


@pytest.mark.parametrize("name,path,extra", sweep(CASES, INNER_LOOP, ids=[c[0] for c in CASES]))
def test_golden_report(name, path, extra, request):
    """The whole report (prose and numbers) and, in a separate golden, its flat findings
    (numbers only: a wording change does not churn them)."""
    report, findings = report_for(path, extra)
    _check(GOLDEN / f"{name}.json", report, request)
    _check(FINDINGS_GOLDEN / f"{name}.json", findings, request, sort_keys=True)


def test_every_golden_file_has_a_case():
    names = {c[0] for c in CASES}
    stale = sorted(p.stem for d in (GOLDEN, FINDINGS_GOLDEN) for p in d.glob("*.json") if p.stem not in names)
    if SHARED_TRACES.exists():
        assert not stale, f"golden files without a trace: {stale}"


def _diff(a, b, path):
    if isinstance(a, dict) and isinstance(b, dict):
        for k in sorted(set(a) | set(b)):
            if k not in a:
                yield f"+ {path}.{k} = {_short(b[k])}"
            elif k not in b:
                yield f"- {path}.{k} (was {_short(a[k])})"
            else:
                yield from _diff(a[k], b[k], f"{path}.{k}")
    elif isinstance(a, list) and isinstance(b, list):
        if len(a) != len(b):
            yield f"~ {path}: list length {len(a)} -> {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            yield from _diff(x, y, f"{path}[{i}]")
    elif a != b:
        yield f"~ {path}: {_short(a)} -> {_short(b)}"


def _short(v) -> str:
    s = json.dumps(v, ensure_ascii=False)
    return s if len(s) <= 120 else s[:117] + "..."


def test_every_golden_report_matches_the_published_json_schema():
    """The report contract (diagnose/data/report.schema.json, shipped in the package) holds on
    every golden report."""
    import jsonschema
    from importlib import resources

    schema = json.loads(resources.files("diagnose.data").joinpath("report.schema.json").read_text(encoding="utf-8"))
    validator = jsonschema.Draft202012Validator(schema)
    files = sorted(GOLDEN.glob("*.json"))
    assert files
    for f in files:
        errors = sorted(validator.iter_errors(json.loads(f.read_text(encoding="utf-8"))), key=lambda e: list(e.absolute_path))
        assert not errors, f"{f.name}: {'/'.join(map(str, errors[0].absolute_path))}: {errors[0].message}"
