"""The newcomer's path: the README's first command on a shipped GPU sample, README examples
that are the tool's real output, user-facing text that points only inside the project, the
shipped samples' licence and provenance, and the reasoning page that quotes every threshold.
"""
from __future__ import annotations

import fnmatch
import hashlib
import re
import shlex
import tomllib
from pathlib import Path

import pytest
from click.testing import CliRunner

from conftest import ROOT, SHARED_TRACES
from diagnose.cli import main

README = (ROOT / "README.md").read_text(encoding="utf-8")
SAMPLES = ROOT / "samples"

#: Design notes the project keeps for itself; the product must carry what users need in its
#: own words, so none of these names may appear in what a user reads.
FORBIDDEN = ("domain.md", "shared/design", "expert_readings")

#: User-facing text: the package sources (with their mapped folders), data files, rule cards,
#: templates, the user docs and the README. Contributor material (tests/, benchmarks/) may
#: name the shared corpus.
USER_FACING_GLOBS = ("README.md", "pyproject.toml", "docs/**/*", "diagnose/**/*", "app/**/*", "collectors/**/*",
                     "rules/**/*", "samples/**/*.md", "samples/LICENSE*")


def _user_facing_files() -> list[Path]:
    out = set()
    for pattern in USER_FACING_GLOBS:
        for p in ROOT.glob(pattern):
            if p.is_file() and "__pycache__" not in p.parts and p.suffix not in (".pyc", ".gz"):
                out.add(p)
    return sorted(out)


def _all_commands(group=main, prefix=()):
    """Every command path of the CLI, lazy commands included (``("run",)``, ``("rules", "list")``...)."""
    import click

    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        cmd = group.get_command(ctx, name)
        yield prefix + (name,)
        if isinstance(cmd, click.Group):
            yield from _all_commands(cmd, prefix + (name,))


def test_user_facing_files_do_not_name_design_notes():
    files = _user_facing_files()
    assert len(files) > 60  # the globs found the package, rules and docs
    hits = []
    for p in files:
        text = p.read_text(encoding="utf-8", errors="replace")
        for word in FORBIDDEN:
            if word in text:
                line = text[: text.index(word)].count("\n") + 1
                hits.append(f"{p.relative_to(ROOT)}:{line}: {word}")
    assert hits == []


def test_cli_help_does_not_name_design_notes():
    commands = [()] + list(_all_commands())
    assert ("rules", "list") in commands and ("collect", "torch") in commands and ("kv-budget",) in commands
    hits = []
    for path in commands:
        r = CliRunner().invoke(main, [*path, "--help"])
        assert r.exit_code == 0, (path, r.output)
        hits += [f"{' '.join(path)}: {w}" for w in FORBIDDEN if w in r.output]
    assert hits == []


# ------------------------------------------------------------------ README examples are real


def _text_blocks_with_commands() -> list[tuple[str, list[str]]]:
    """```text blocks whose first line is ``$ diagnose ...``: (command, shown output lines)."""
    out = []
    for block in re.findall(r"```text\n(.*?)```", README, re.DOTALL):
        lines = block.rstrip("\n").split("\n")
        if lines and lines[0].startswith("$ diagnose "):
            out.append((lines[0][2:], lines[1:]))
    return out


def test_readme_first_command_runs_on_a_shipped_gpu_sample(monkeypatch):
    """The set-up line ends with the first command: a GPU sample, a headline from a rule, a step."""
    setup = re.search(r"## Set up.*?```bash\n(.*?)\n```", README, re.DOTALL).group(1)
    first = setup.split("&&")[-1].strip()
    assert first.startswith("diagnose run --trace samples/")
    args = shlex.split(first)[1:]
    trace = ROOT / args[args.index("--trace") + 1]
    assert trace.is_file() and trace.name != "tiny_cpu.json.gz"
    monkeypatch.chdir(ROOT)
    r = CliRunner().invoke(main, [*args, "--format", "json"])
    assert r.exit_code == 0, r.output
    import json

    d = json.loads(r.output)
    assert d["headline"]["rule_id"] == "moe-kernel-bound"
    assert d["headline"]["text"] == "decode is MoE-kernel-bound: 71% of kernel time (7.53 ms) in MoE expert kernels"
    assert [(s["phase"], s["grammar"]) for s in d["steps"]] == [("decode", "vllm-v1")]
    assert d["devices"] and d["devices"][0]["id"] == 2
    text = CliRunner().invoke(main, args).output
    assert "► decode is MoE-kernel-bound" in text and any(line.startswith("decode    2      1") for line in text.splitlines())
    lines = text.splitlines()
    assert len(lines) <= 50 and max(map(len, lines)) <= 100  # a screen: 100 columns when not a terminal


def test_readme_output_blocks_are_the_tools_output(monkeypatch):
    """Every ```text block that starts with `$ diagnose ...` shows lines of that command's real
    output, in order ("…" stands for lines left out)."""
    blocks = _text_blocks_with_commands()
    assert blocks, "the README shows no command output"
    monkeypatch.chdir(ROOT)
    for command, shown in blocks:
        r = CliRunner().invoke(main, shlex.split(command)[1:])
        assert r.exit_code == 0, (command, r.output)
        got = [line.rstrip() for line in r.output.split("\n")]
        pos = 0
        for line in shown:
            if line.strip() in ("…", "..."):
                continue
            assert line.rstrip() in got[pos:], f"{command}: README line not in the output (in order): {line!r}"
            pos = got.index(line.rstrip(), pos) + 1


def _sample_headlines() -> dict[str, str]:
    from diagnose.pipeline import diagnose_trace

    out = {}
    for p in sorted(SAMPLES.rglob("*.json*")):
        a = diagnose_trace(str(p))
        out[p.relative_to(ROOT).as_posix()] = (a.to_dict().get("headline") or {}).get("text")
    return out


def test_readme_quoted_headlines_are_what_the_samples_give():
    quotes = [" ".join(q.split()) for q in re.findall(r'\*"([^"]+)"\*', README)]
    assert len(quotes) >= 2
    headlines = _sample_headlines()
    assert set(headlines) >= {"samples/tracelens/vllm_decode_mi300x.json.gz",
                              "samples/tracelens/torch_compile_prefill_mi300x.json.gz", "samples/tiny_cpu.json.gz"}
    for q in quotes:
        prefix = q[:-1] if q.endswith("…") else None
        ok = [p for p, h in headlines.items() if h and (h.startswith(prefix) if prefix else h == q)]
        assert ok, f"README quotes a headline no shipped sample gives: {q!r} (samples give {headlines})"


def test_readme_notebook_example_headline(monkeypatch):
    block = re.search(r"```python\n(import diagnose\n.*?)```", README, re.DOTALL).group(1)
    call = re.search(r"^r = (diagnose\.analyze_trace\(.*\))$", block, re.MULTILINE).group(1)
    shown = re.search(r'^r\.headline\["text"\]\s+# \'(.*)\'$', block, re.MULTILINE).group(1)
    import diagnose

    monkeypatch.chdir(ROOT)
    r = eval(call, {"diagnose": diagnose})  # the README's own call, on a shipped sample
    assert r.headline["text"] == shown


# ------------------------------------------------------------------ shipped samples


def _provenance_rows() -> list[dict[str, str]]:
    text = (SAMPLES / "tracelens" / "PROVENANCE.md").read_text(encoding="utf-8")
    rows = []
    for line in text.splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 7 and cells[0].startswith("`") and cells[0] != "file here":
            rows.append({"file": cells[0].strip("`"), "path": cells[2].strip("`"), "commit": cells[3].strip("`"),
                         "licence": cells[4], "sha256": cells[6].strip("`")})
    return rows


def test_gpu_samples_have_licence_and_provenance():
    folder = SAMPLES / "tracelens"
    rows = {r["file"]: r for r in _provenance_rows()}
    traces = sorted(p.name for p in folder.glob("*.json.gz"))
    assert traces == ["torch_compile_prefill_mi300x.json.gz", "vllm_decode_mi300x.json.gz"]
    assert set(rows) == set(traces) | {"LICENSE"}
    assert "MIT License" in (folder / "LICENSE").read_text(encoding="utf-8")
    for name, row in rows.items():
        data = (folder / name).read_bytes()
        assert hashlib.sha256(data).hexdigest() == row["sha256"], name
        assert row["commit"] == "171dd74721ca1ec45709e5805b68ae1f65e27811"
    assert rows["vllm_decode_mi300x.json.gz"]["path"] == "tests/traces/inference/vllm_decode_full/graph_execution.json.gz"
    assert rows["torch_compile_prefill_mi300x.json.gz"]["path"] == "tests/traces/torch_compile_triton/trace.json.gz"


@pytest.mark.skipif(not SHARED_TRACES.exists(), reason="shared trace corpus not available")
def test_gpu_samples_are_byte_identical_to_the_corpus_copies():
    pairs = {"vllm_decode_mi300x.json.gz": "tracelens/vllm_decode_full/graph_execution.json.gz",
             "torch_compile_prefill_mi300x.json.gz": "tracelens/torch_compile_triton/trace.json.gz",
             "LICENSE": "tracelens/LICENSE"}
    for here, there in pairs.items():
        assert (SAMPLES / "tracelens" / here).read_bytes() == (SHARED_TRACES / there).read_bytes(), here


def test_every_sample_file_is_package_data():
    """`pip install .` ships every file of samples/ (the README's first command and the notebook
    example read them from the installed package too)."""
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    globs = cfg["package-data"]["diagnose.samples"]
    files = [p.relative_to(SAMPLES).as_posix() for p in SAMPLES.rglob("*")
             if p.is_file() and p.suffix != ".py" and "__pycache__" not in p.parts]
    missing = [f for f in files if not any(fnmatch.fnmatch(f, g) and f.count("/") == g.count("/") for g in globs)]
    assert files and missing == []


# ------------------------------------------------------------------ the reasoning page


def test_reasoning_page_quotes_every_rule_threshold():
    """docs/prefill-decode.md explains every rule and quotes each threshold as
    `RULE.NAME = VALUE`; the quoted values are the rule files' values."""
    from diagnose.engine import load_rules

    page = (ROOT / "docs" / "prefill-decode.md").read_text(encoding="utf-8")
    quoted = {(m.group(1), m.group(2)): float(m.group(3))
              for m in re.finditer(r"`([A-Za-z0-9-]+)\.([a-z_0-9]+) = ([0-9.]+)`", page)}
    expected = {}
    for rule in load_rules():
        assert f"`{rule.id}`" in page, f"docs/prefill-decode.md does not explain {rule.id}"
        for name, t in rule.thresholds.items():
            expected[(rule.id, name)] = float(t.value)
    assert quoted == expected
    for sym in ("S1", "S2", "S3", "S4", "S5", "S6", "S7"):
        assert f"### {sym}:" in page
