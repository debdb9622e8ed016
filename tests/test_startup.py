"""Start-up: what the command line imports before it does any work (issue 28).

Import-graph tests, not timed tests: ``diagnose --help`` must not pay for pandas, numpy, rich
or the analyzers (~0.7 s of imports on the 2-core machine); each command imports what it
uses when it runs. The times themselves are measured by ``benchmarks/bench_startup.py``.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys

import click
import pytest
from click.testing import CliRunner

from diagnose.cli import main

# Modules the top-level help must never import (each costs tens to hundreds of ms).
HEAVY = ("pandas", "numpy", "pyarrow", "rich", "yaml", "msgspec", "plotly", "dash", "diagnose.analyzers",
         "diagnose.engine", "diagnose.pipeline", "diagnose.trace", "diagnose.accounting")


def _imported_by(args: list[str]) -> list[str]:
    """The modules loaded by ``diagnose ARGS`` in a fresh interpreter (run as the console
    script runs it), sorted."""
    code = ("import json, sys\n"
            "from diagnose.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write('\\n' + json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)
    return json.loads(out.stderr.strip().splitlines()[-1])


def _heavy(mods: list[str]) -> list[str]:
    return sorted(m for m in mods if any(m == h or m.startswith(h + ".") for h in HEAVY))


@pytest.mark.parametrize("args", [["--help"], ["-h"], ["--version"]])
def test_top_level_help_imports_no_heavy_module(args):
    mods = _imported_by(args)
    assert "diagnose.cli" in mods  # the probe ran
    assert _heavy(mods) == []


def test_help_lists_every_command_with_its_own_summary():
    """``diagnose --help`` shows the lazy commands from ``_Main.SUMMARIES``: each equals the
    first paragraph of the command's own help, so the listing is the one click would print
    with every command imported (at any terminal width)."""
    lazy = main.LAZY
    assert set(main.SUMMARIES) == set(lazy)
    ctx = click.Context(main)
    for name in lazy:
        cmd = main.get_command(ctx, name)  # imports it
        first = " ".join(cmd.help.split("\n\n")[0].split())
        assert main.SUMMARIES[name] == first, name
        stub = click.Command(name, help=main.SUMMARIES[name])
        for limit in (20, 45, 74, 200):
            assert stub.get_short_help_str(limit) == cmd.get_short_help_str(limit), (name, limit)
    listing = CliRunner().invoke(main, ["--help"], terminal_width=80).output
    for name in sorted(lazy):
        assert f"\n  {name} " in listing


def test_run_imports_no_web_stack(tmp_path):
    """``diagnose run --format json`` imports pandas and the analyzers, never the web report
    (plotly/Dash) nor the terminal tables."""
    trace = tmp_path / "t.json"
    trace.write_text('{"traceEvents": [{"ph": "X", "cat": "kernel", "name": "k", "ts": 1, "dur": 1, '
                     '"args": {"device": 0, "stream": 7, "correlation": 1}}]}')
    _imported_by(["run", "--trace", str(trace), "--format", "json"])  # fills the packaged-YAML cache if empty
    mods = _imported_by(["run", "--trace", str(trace), "--format", "json"])
    assert "pandas" in mods and "diagnose.analyzers" in mods  # the probe ran the analysis
    assert "yaml" not in mods  # rules and tables read back from the cache (diagnose.yamlio)
    assert [m for m in mods if m.split(".")[0] in ("plotly", "dash", "jinja2")] == []
    assert [m for m in mods if m.startswith(("rich.table", "diagnose.report.terminal"))] == []
    assert "pyarrow" not in mods  # pandas is imported without it (cliutil._PandasWithoutArrow)


def _subprocess_report(args: list[str]) -> tuple[str, list[str]]:
    """(stdout, modules loaded) of ``diagnose ARGS`` in a fresh interpreter."""
    code = ("import json, sys\n"
            "from diagnose.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write('\\n' + json.dumps(sorted(sys.modules)))\n")
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300)
    return out.stdout, json.loads(out.stderr.strip().splitlines()[-1])


@pytest.mark.parametrize("rel", ["samples/tracelens/torch_compile_prefill_mi300x.json.gz",
                                 "../shared/traces/nvfuser/ee4fcf3/report1.sqlite"])
def test_command_line_report_equals_the_library_report(rel):
    """The command line imports pandas without pyarrow; a test process (like a notebook) has
    pandas with pyarrow-backed strings. The JSON report is the same byte for byte, and the
    nsys reader still reads Arrow tables through pyarrow, imported after pandas."""
    from conftest import ROOT

    path = ROOT / rel
    if not path.exists():
        pytest.skip(f"{rel} absent")
    import pyarrow  # noqa: F401  (the library side: pandas as a user's process has it)

    lib = CliRunner().invoke(main, ["run", "--trace", str(path), "--format", "json"])
    assert lib.exit_code == 0, lib.output
    text, mods = _subprocess_report(["run", "--trace", str(path), "--format", "json"])
    assert text == lib.output
    assert ("pyarrow" in mods) == rel.endswith(".sqlite")  # the adbc reader for nsys only
    if rel.endswith(".sqlite"):
        assert "adbc_driver_sqlite" in mods


@pytest.mark.slow  # collects the whole suite once
def test_every_heavy_test_id_is_collected():
    """tests/inner_loop_heavy.txt names tests that exist (a renamed test would silently come
    back into the inner loop)."""
    from conftest import HEAVY, ROOT

    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider"],
                         cwd=ROOT, capture_output=True, text=True, timeout=600).stdout
    collected = {line.strip() for line in out.splitlines() if "::" in line}
    assert sorted(HEAVY - collected) == []
    assert len(HEAVY) == 166


@pytest.mark.parametrize("args,code", [(["--version"], 0), (["run", "--trace", "/nonexistent/t.json"], 2),
                                       (["run", "--trace", "SAMPLE", "--format", "json"], 0),
                                       (["gate", "--trace", "SAMPLE", "--max-launch-gap-share", "0"], 1)])
def test_console_script_exits_with_the_command_status_after_its_output(args, code):
    """``diagnose.cli:entry`` (the console script) ends the process with ``os._exit`` after a
    command: the exit status is the command's, every byte of its output is written (a pipe),
    and exit handlers registered in the process still run."""
    from conftest import ROOT

    sample = str(ROOT / "samples/tracelens/torch_compile_prefill_mi300x.json.gz")
    argv = ["diagnose"] + [sample if a == "SAMPLE" else a for a in args]
    code_txt = ("import atexit, sys\n"
                "atexit.register(lambda: sys.stderr.write('handler ran\\n'))\n"
                f"sys.argv = {argv!r}\n"
                "from diagnose.cli import entry\nentry()\n")
    out = subprocess.run([sys.executable, "-c", code_txt], capture_output=True, text=True, timeout=300)
    assert out.returncode == code, out.stderr
    assert out.stderr.endswith("handler ran\n")
    if args[0] == "run" and code == 0:
        lib = CliRunner().invoke(main, argv[1:])
        assert out.stdout == lib.output and json.loads(out.stdout)["source"]["format"] == "kineto-json"


def test_large_file_workers_fork_before_pandas_imports():
    """``diagnose run`` on a large Kineto file forks its decoding workers right after the read,
    before pandas and the analyzers import (they import while the workers decode); the
    report is the library's. The loader's modules import no pandas. (The HTA control trace,
    with the chunked-load threshold lowered to 1 MiB in the child.)"""
    from conftest import SHARED_TRACES

    path = SHARED_TRACES / "hta/trace_diff/control.json.gz"
    if not path.exists():
        pytest.skip("shared trace corpus not available")
    code = ("import json, os, sys\n"
            "import diagnose.trace.kineto as K, diagnose.trace.reading\n"
            "light = 'pandas' in sys.modules\n"
            "K.CHUNKED_MIN_BYTES = K.CHUNK_BYTES = 1 << 20\n"
            "seen = []\n"
            "init = K._Forked.__init__\n"
            "def spy(self, *a, **k):\n    seen.append('pandas' in sys.modules)\n    init(self, *a, **k)\n"
            "K._Forked.__init__ = spy\n"
            "from diagnose.cli import main\n"
            "try:\n    main(sys.argv[1:])\nexcept SystemExit:\n    pass\n"
            "sys.stderr.write('\\n' + json.dumps([light, seen]))\n")
    env = dict(os.environ, DIAGNOSE_WORKERS="2")
    out = subprocess.run([sys.executable, "-c", code, "run", "--trace", str(path), "--format", "json"],
                         capture_output=True, text=True, timeout=300, env=env)
    light, seen = json.loads(out.stderr.strip().splitlines()[-1])
    assert light is False  # the loader's modules: no pandas
    assert seen == [False]  # one early start, before pandas
    lib = CliRunner().invoke(main, ["run", "--trace", str(path), "--format", "json"])
    assert out.stdout == lib.output


def test_run_collects_young_objects_less_often_then_restores(monkeypatch):
    """`run` raises the youngest generation's gc threshold for the command (a large trace's
    millions of long-lived containers were walked 170 times at CPython's 700) and restores it."""
    import gc

    import diagnose.cli as cli
    import diagnose.pipeline as pipeline
    from conftest import ROOT

    seen = []
    real = pipeline.diagnose_trace

    def spy(*a, **k):
        seen.append(gc.get_threshold())
        return real(*a, **k)

    monkeypatch.setattr(pipeline, "diagnose_trace", spy)
    before = gc.get_threshold()
    sample = str(ROOT / "samples/tracelens/torch_compile_prefill_mi300x.json.gz")
    result = CliRunner().invoke(main, ["run", "--trace", sample, "--format", "json"])
    assert result.exit_code == 0, result.output
    assert seen == [(200_000, *before[1:])] and cli._GC_YOUNG_OBJECTS == 200_000
    assert gc.get_threshold() == before
    result = CliRunner().invoke(main, ["run", "--trace", str(ROOT / "no-such-file.json")])
    assert result.exit_code == 2 and gc.get_threshold() == before


def test_restoring_the_threshold_walks_no_young_objects():
    """Setting CPython's 700 back after `run` collects nothing at once: the containers `run`
    left young (5,000 here) go to the oldest generation unvisited, and objects another
    program froze stay frozen."""
    import gc

    import diagnose.cli as cli

    before = gc.get_threshold()
    gc.set_threshold(1_000_000, *before[1:])
    try:
        young = [[i] for i in range(5_000)]
        assert gc.get_count()[0] > 4_000  # (frees since the last collection count down)
        collections = gc.get_stats()[0]["collections"]
        cli._restore_gc_threshold(before)
        more = [[i] for i in range(100)]  # under 700 new containers: no collection now
        assert gc.get_stats()[0]["collections"] == collections and gc.get_threshold() == before
        assert gc.get_count()[0] < 700 and len(young) + len(more) == 5_100
        gc.freeze()
        frozen = gc.get_freeze_count()
        assert frozen > 0
        gc.set_threshold(1_000_000, *before[1:])
        cli._restore_gc_threshold(before)
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()
        gc.set_threshold(*before)


def test_progress_bar_needs_a_terminal_before_rich_is_imported(monkeypatch):
    """``diagnose run`` imports rich for its progress bar only where rich's console could find
    stderr a terminal: a TTY, or TTY_COMPATIBLE / FORCE_COLOR set (rich's own test)."""
    import io

    from diagnose import pipeline

    monkeypatch.delenv("TTY_COMPATIBLE", raising=False)
    monkeypatch.delenv("FORCE_COLOR", raising=False)
    monkeypatch.setattr(pipeline.sys, "stderr", io.StringIO())
    assert pipeline._may_be_terminal() is False
    monkeypatch.setenv("FORCE_COLOR", "")
    assert pipeline._may_be_terminal() is True
    monkeypatch.delenv("FORCE_COLOR")
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    assert pipeline._may_be_terminal() is True

    class Tty(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.delenv("TTY_COMPATIBLE")
    monkeypatch.setattr(pipeline.sys, "stderr", Tty())
    assert pipeline._may_be_terminal() is True
