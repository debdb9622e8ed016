"""The shape of the code base: no import cycle between modules, no library module importing a
command-line module, every command sharing the analysis option set and documented in the
README, and every quality code emitted somewhere listed in the vocabulary (and vice versa)."""
from __future__ import annotations

import ast
import functools
import re
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT
from diagnose import vocab
from diagnose.cli import main
from diagnose.cli_options import ANALYSIS_FLAGS, RULE_FLAGS

#: Source folders -> import names (the card's folders map into the one import root).
PACKAGES = {"diagnose": "diagnose", "app": "diagnose.app", "collectors": "diagnose.collectors", "rules": "diagnose.rules"}
#: Command-line modules: thin layers that parse options and format results.
CLI_MODULES = {"diagnose.cli", "diagnose.cli_options", "diagnose.cliutil", "diagnose.rules_cli", "diagnose.bounds_cli",
               "diagnose.app.serve_cli", "diagnose.collectors.collect_cli", "diagnose.whatif_cli"}


def _modules() -> dict[str, Path]:
    out = {}
    for folder, pkg in PACKAGES.items():
        for p in (ROOT / folder).rglob("*.py"):
            rel = p.relative_to(ROOT / folder).with_suffix("")
            parts = [x for x in rel.parts if x != "__init__"]
            out[".".join([pkg, *parts])] = p
    return out


@functools.cache
def _tree(path: Path) -> ast.Module:
    """The parsed source of ``path``, parsed once for every test of this file (read only)."""
    return ast.parse(path.read_text(encoding="utf-8"))


def _imports(name: str, path: Path, known: set[str]) -> set[str]:
    """Project modules ``name`` imports, at module level or inside functions."""
    tree = _tree(path)
    is_pkg = path.name == "__init__.py"
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".") if is_pkg else name.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            mods = [base] + [f"{base}.{a.name}" for a in node.names]
        else:
            continue
        for m in mods:
            while m and m not in known:
                m = m.rpartition(".")[0]
            if m and m != name:
                out.add(m)
    return out


@functools.cache
def _graph_once() -> tuple[tuple[str, frozenset[str]], ...]:
    mods = _modules()
    return tuple((n, frozenset(_imports(n, p, set(mods)))) for n, p in mods.items())


def _graph() -> dict[str, set[str]]:
    """Module -> the project modules it imports (a fresh copy of the graph built once)."""
    return {n: set(deps) for n, deps in _graph_once()}


def _is_child(mod: str, parent: str) -> bool:
    return mod.startswith(parent + ".")


def test_no_library_module_imports_a_cli_module():
    bad = sorted((m, d) for m, deps in _graph().items() if m not in CLI_MODULES for d in deps if d in CLI_MODULES)
    assert bad == []


def test_no_import_cycle():
    g = _graph()
    # A package importing its own submodules (re-exports) is not a cycle of the design.
    edges = {m: {d for d in deps if not _is_child(d, m)} for m, deps in g.items()}
    cycles = []
    state: dict[str, int] = {}

    def visit(m: str, stack: list[str]) -> None:
        state[m] = 1
        for d in sorted(edges.get(m, ())):
            if state.get(d) == 1:
                cycles.append(stack[stack.index(d):] + [d] if d in stack else [m, d])
            elif d not in state:
                visit(d, stack + [d])
        state[m] = 2

    for m in sorted(edges):
        if m not in state:
            visit(m, [m])
    assert cycles == []


COMMANDS_WITH_SHARED_OPTIONS = ("run", "serve", "gate", "compare", "sweep", "whatif")


@pytest.mark.parametrize("command", COMMANDS_WITH_SHARED_OPTIONS)
def test_every_command_takes_the_shared_option_set(command):
    r = CliRunner().invoke(main, [command, "--help"], terminal_width=200)
    assert r.exit_code == 0, r.output
    flags = set(re.findall(r"(--[a-z][a-z0-9-]*)", r.output))
    assert set(ANALYSIS_FLAGS) <= flags, set(ANALYSIS_FLAGS) - flags
    assert set(RULE_FLAGS) <= flags, set(RULE_FLAGS) - flags


def test_every_command_is_in_the_readme_usage():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    usage = readme[readme.index("## Usage"):readme.index("### In CI")]
    names = set(main.list_commands(None))
    missing = [n for n in sorted(names) if f"diagnose {n}" not in usage]
    assert missing == []
    for n in sorted(names):
        r = CliRunner().invoke(main, [n, "--help"])
        assert r.exit_code == 0 and "Usage:" in r.output, n


def _emitted_quality_codes() -> set[str]:
    codes = set()
    pat = re.compile(r"""(?:note|_note|QualityIssue)\(\s*["']([a-z0-9_]+)["']""")
    for folder in PACKAGES:
        for p in (ROOT / folder).rglob("*.py"):
            codes |= set(pat.findall(p.read_text(encoding="utf-8")))
    for p in (ROOT / "diagnose" / "trace").glob("nsys*.py"):
        codes |= set(re.findall(r'"(nsys_[a-z_]+)"', p.read_text(encoding="utf-8")))
    return codes - {"nsys_path"}


def test_quality_codes_are_one_vocabulary():
    emitted = _emitted_quality_codes()
    listed = set(vocab.QUALITY_CODES)
    assert sorted(emitted - listed) == [], "emitted but not in diagnose/vocab.py"
    assert sorted(listed - emitted) == [], "listed in diagnose/vocab.py but never emitted"


def test_readme_quality_table_is_generated():
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    m = re.search(r"<!-- quality-codes:begin[^>]*-->\n(.*?)\n<!-- quality-codes:end -->", readme, re.S)
    assert m, "README lacks the generated quality-code table markers"
    assert m.group(1) == vocab.quality_table_markdown(), "regenerate: python -m diagnose.vocab"


def test_every_package_is_installed_by_a_plain_install():
    """`pip install .` (the README's set-up command) installs the packages pyproject lists, not
    what an editable install finds: every directory of the tree with an __init__.py must be
    listed (mapped directories through [tool.setuptools.package-dir])."""
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    listed = set(cfg["packages"])
    mapped = {v: k for k, v in cfg.get("package-dir", {}).items()}
    found = set()
    for init in ROOT.glob("**/__init__.py"):
        rel = init.parent.relative_to(ROOT)
        if rel.parts[0] in (".venv", "tests", "build", "benchmarks") or rel.parts[0].startswith("."):
            continue
        top = mapped.get(rel.parts[0])
        name = ".".join(([top] + list(rel.parts[1:])) if top else rel.parts)
        found.add(name)
    assert found - listed == set(), "packages missing from pyproject [tool.setuptools] packages"


# ---------------------------------------------------------------- layers and sizes

#: The layers, bottom to top (shared/design/architecture.md): trace -> analyzers -> findings
#: -> engine -> pipeline -> report/app/cli. A module may import from its own layer and the
#: layers below it, never from one above.
LAYERS = ("base", "trace", "analyzers", "findings", "engine", "pipeline", "top")

#: Modules of the base layer: vocabulary, errors, numbers and formatting, options, the report
#: model, and the domain libraries the analyzers compute with (accounting, hardware, roofline).
#: ``diagnose.report`` is the package's empty ``__init__`` (importing ``report.fmt`` runs it);
#: ``report.fmt`` imports nothing of the project, so every layer formats numbers one way.
#: ``cause_table`` reads the cause table (diagnose/data/causes.yaml) the vocabulary exposes.
BASE = {"diagnose", "diagnose.errors", "diagnose.vocab", "diagnose.cause_table", "diagnose.numeric", "diagnose.textsafe", "diagnose.yamlio",
        "diagnose.tables", "diagnose.options", "diagnose.clitypes", "diagnose.model", "diagnose.model_base",
        "diagnose.model_cost", "diagnose.report",
        "diagnose.report.fmt", "diagnose.hardware", "diagnose.roofline", "diagnose.fuzzing", "diagnose.data",
        "diagnose.rules", "diagnose.samples",
        # input validation shared by every layer: number checks, side-file reading, bounded patterns
        "diagnose.inputs", "diagnose.patterns"}
#: Library operations over reports and rules (the pipeline layer): each takes reports and a
#: rule set and returns a result record; ``catalog`` documents every scope's findings.
PIPELINE = {"diagnose.pipeline", "diagnose.gate", "diagnose.compare", "diagnose.sweep", "diagnose.multi",
            "diagnose.notebook", "diagnose.catalog"}


#: Input readers outside ``trace/`` (the trace layer): ``archive`` unpacks a tar of traces.
TRACE_INPUTS = {"diagnose.archive"}


def layer_of(module: str) -> int:
    """The layer index of a project module (:data:`LAYERS`)."""
    if module in BASE or module.startswith("diagnose.accounting"):
        return 0
    if module in TRACE_INPUTS:
        return 1
    for prefix, i in (("diagnose.trace", 1), ("diagnose.analyzers", 2), ("diagnose.engine", 4)):
        if module == prefix or module.startswith(prefix + "."):
            return i
    if module == "diagnose.findings":
        return 3
    if module in PIPELINE:
        return 5
    return 6  # report renderers, app, cli modules, collectors


def test_no_module_imports_from_a_layer_above_it():
    g = _graph()
    bad = sorted(f"{m} ({LAYERS[layer_of(m)]}) imports {d} ({LAYERS[layer_of(d)]})"
                 for m, deps in g.items() for d in deps if layer_of(d) > layer_of(m) and not _is_child(d, m))
    assert bad == []


def test_every_layer_has_modules():
    """The layer table names real modules (a renamed package must move in the table too)."""
    found = {LAYERS[layer_of(m)] for m in _graph()}
    assert found == set(LAYERS)
    assert {"diagnose.model", "diagnose.findings", "diagnose.pipeline", "diagnose.report.terminal"} <= set(_graph())


MAX_FILE_LINES = 800
MAX_FUNCTION_LINES = 120

#: Files and functions over the limits, each with the reason it is allowed for now.
SIZE_EXCEPTIONS: dict[str, str] = {}


def _sources() -> list[Path]:
    return sorted(p for folder in ("diagnose", "app", "collectors") for p in (ROOT / folder).rglob("*.py"))


def test_no_file_over_800_lines():
    over = {str(p.relative_to(ROOT)): n for p in _sources()
            if (n := p.read_text(encoding="utf-8").count("\n")) > MAX_FILE_LINES}
    assert {k: v for k, v in over.items() if k not in SIZE_EXCEPTIONS} == {}


def test_no_function_over_120_lines():
    long = {}
    for p in _sources():
        rel = str(p.relative_to(ROOT))
        if rel in SIZE_EXCEPTIONS:
            continue
        for node in ast.walk(_tree(p)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                n = node.end_lineno - node.lineno + 1
                if n > MAX_FUNCTION_LINES and f"{rel}:{node.name}" not in SIZE_EXCEPTIONS:
                    long[f"{rel}:{node.name}"] = n
    assert long == {}


def test_size_exceptions_are_still_needed():
    """An exception whose file shrank below the limits goes from the list."""
    for rel in SIZE_EXCEPTIONS:
        p = ROOT / rel.split(":")[0]
        assert p.exists(), rel
        assert p.read_text(encoding="utf-8").count("\n") > MAX_FILE_LINES, f"{rel} is within the limits: drop its exception"


@pytest.mark.slow
def test_no_duplicate_code():
    """pylint's duplicate-code check (10 similar lines; imports, docstrings, comments and
    signatures ignored) finds nothing in diagnose/, app/ and collectors/."""
    pytest.importorskip("pylint")
    import subprocess
    import sys

    r = subprocess.run([sys.executable, "-m", "pylint", "--disable=all", "--enable=duplicate-code",
                        "--min-similarity-lines=10", "--ignore-imports=yes", "--ignore-docstrings=yes",
                        "--ignore-comments=yes", "--ignore-signatures=yes", "--score=no", "diagnose", "app", "collectors"],
                       cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stdout[-4000:]
