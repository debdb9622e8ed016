"""Tests for ``diagnose collect nsys`` with a fake ``nsys`` executable.

The fake (a Python script written into tmp_path and put first on PATH) appends its argv as
one JSON line to ``$FAKE_NSYS_LOG`` and creates the files the real nsys would:
``profile ... -o OUT ...`` writes ``OUT.nsys-rep``; ``export ... --output FILE REP`` writes
FILE (refusing, like nsys, to overwrite an existing one). ``$FAKE_NSYS_FAIL`` set to
``profile`` or ``export`` makes that call print two stderr lines and exit 3.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from diagnose.collectors import nsys_collector as nc
from diagnose.collectors.collect_cli import collect_group
from diagnose.errors import DiagnoseError

FAKE_NSYS = r'''#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_NSYS_LOG"], "a") as fh:
    fh.write(json.dumps(sys.argv) + "\n")
if os.environ.get("FAKE_NSYS_FAIL") == args[0]:
    sys.stderr.write("some earlier noise\nfatal: fake " + args[0] + " failure\n")
    sys.exit(3)
if args[0] == "profile":
    sys.stderr.write("app says hello on stderr\n")
    out = args[args.index("-o") + 1]
    open(out + ".nsys-rep", "w").write("rep")
elif args[0] == "export":
    out = args[args.index("--output") + 1]
    if not os.path.exists(args[-1]):
        sys.stderr.write("ERROR: no such report\n"); sys.exit(1)
    if os.path.exists(out):
        sys.stderr.write("ERROR: output file exists\n"); sys.exit(1)
    open(out, "w").write("sqlite")
else:
    sys.exit(64)
'''

APP = ["python", "-u", "serve.py", "--port", "8000"]


@pytest.fixture
def fake_nsys(tmp_path, monkeypatch):
    """Put a fake nsys first on PATH; return (its path, a reader of the recorded argvs)."""
    bindir = tmp_path / "bin"
    bindir.mkdir()
    exe = bindir / "nsys"
    exe.write_text(FAKE_NSYS.replace("{python}", sys.executable))
    exe.chmod(0o755)
    log = tmp_path / "nsys-calls.jsonl"
    monkeypatch.setenv("FAKE_NSYS_LOG", str(log))
    monkeypatch.delenv("FAKE_NSYS_FAIL", raising=False)
    monkeypatch.setenv("PATH", f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}")

    def calls() -> list[list[str]]:
        if not log.exists():
            return []
        return [json.loads(line) for line in log.read_text().splitlines()]

    return str(exe), calls


def _invoke(args):
    return CliRunner().invoke(collect_group, ["nsys", *args])


def _one_error_line(result) -> str:
    """The last stderr line, which must be the one ``Error: ...`` line."""
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    errors = [ln for ln in lines if ln.startswith("Error:")]
    assert len(errors) == 1 and lines[-1] == errors[0], result.stderr
    return errors[0]


def test_cli_runs_profile_then_export(fake_nsys, tmp_path):
    exe, calls = fake_nsys
    out = tmp_path / "runs" / "rep"
    result = _invoke(["--out", str(out), "--", *APP])
    assert result.exit_code == 0, result.output
    assert calls() == [
        [exe, "profile", "--trace=cuda,nvtx", "--cuda-graph-trace=node", "-o", str(out),
         "--force-overwrite", "true", *APP],
        [exe, "export", "--type", "sqlite", "--output", f"{out}.sqlite", f"{out}.nsys-rep"],
    ]
    assert (tmp_path / "runs" / "rep.nsys-rep").exists()
    assert (tmp_path / "runs" / "rep.sqlite").exists()
    assert f"next: diagnose run --trace {out}.sqlite" in result.stdout
    # The profiled command's stderr passes through.
    assert "app says hello on stderr" in result.stderr


def test_library_returns_paths_and_argv(fake_nsys, tmp_path):
    exe, calls = fake_nsys
    out = str(tmp_path / "r")
    summary = nc.collect_nsys(["./app"], out)
    assert summary["nsys"] == exe
    assert summary["report"] == out + ".nsys-rep"
    assert summary["sqlite"] == out + ".sqlite"
    assert summary["profile_argv"] == calls()[0]
    assert summary["export_argv"] == calls()[1]
    assert summary["next"] == f"diagnose run --trace {out}.sqlite"


def test_default_out_and_suffix_and_no_separator(fake_nsys, tmp_path, monkeypatch):
    exe, calls = fake_nsys
    monkeypatch.chdir(tmp_path)
    result = _invoke(["python", "app.py", "--batch", "8"])  # no "--": options after CMD are CMD's
    assert result.exit_code == 0, result.output
    assert calls()[0][-3:] == ["app.py", "--batch", "8"]
    assert calls()[0][calls()[0].index("-o") + 1] == "report"
    assert (tmp_path / "report.sqlite").exists()
    result = _invoke(["--out", "x.nsys-rep", "--", "app"])
    assert result.exit_code == 0, result.output
    assert calls()[-1][-2:] == ["x.sqlite", "x.nsys-rep"]


def test_rerun_replaces_a_stale_sqlite(fake_nsys, tmp_path):
    out = tmp_path / "r"
    (tmp_path / "r.sqlite").write_text("old")
    result = _invoke(["--out", str(out), "--", "app"])
    assert result.exit_code == 0, result.output
    assert (tmp_path / "r.sqlite").read_text() == "sqlite"


def test_no_nsys_on_path(tmp_path, monkeypatch):
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    result = _invoke(["--out", str(tmp_path / "r"), "--", "app"])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "Error: Nsight Systems `nsys` not found on PATH; install Nsight Systems or pass --nsys PATH"
    ]
    with pytest.raises(DiagnoseError, match="not found on PATH"):
        nc.collect_nsys(["app"], str(tmp_path / "r"))


def test_explicit_nsys_path_without_path(fake_nsys, tmp_path, monkeypatch):
    exe, calls = fake_nsys
    empty = tmp_path / "empty"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    result = _invoke(["--nsys", exe, "--out", str(tmp_path / "r"), "--", "app"])
    assert result.exit_code == 0, result.output
    assert [c[0] for c in calls()] == [exe, exe]


def test_bad_explicit_nsys_path(tmp_path):
    result = _invoke(["--nsys", str(tmp_path / "nope" / "nsys"), "--", "app"])
    assert result.exit_code == 2
    assert "is not an executable file" in _one_error_line(result)


@pytest.mark.parametrize("args", [[], ["--"], ["--out", "r", "--"]])
def test_empty_cmd(args, fake_nsys, tmp_path):
    exe, calls = fake_nsys
    result = _invoke(args)
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "Error: no command to profile: put it after --, e.g. diagnose collect nsys --out report -- python app.py"
    ]
    assert calls() == []


def test_nsys_profile_failure(fake_nsys, tmp_path, monkeypatch):
    exe, calls = fake_nsys
    monkeypatch.setenv("FAKE_NSYS_FAIL", "profile")
    result = _invoke(["--out", str(tmp_path / "r"), "--", "app"])
    assert result.exit_code == 2
    assert _one_error_line(result) == "Error: nsys profile failed (exit 3): fatal: fake profile failure"
    assert len(calls()) == 1  # no export after a failed profile
    assert not (tmp_path / "r.sqlite").exists()


def test_nsys_export_failure(fake_nsys, tmp_path, monkeypatch):
    exe, calls = fake_nsys
    monkeypatch.setenv("FAKE_NSYS_FAIL", "export")
    result = _invoke(["--out", str(tmp_path / "r"), "--", "app"])
    assert result.exit_code == 2
    assert _one_error_line(result) == "Error: nsys export failed (exit 3): fatal: fake export failure"
    # The export's own output is captured, not echoed.
    assert "some earlier noise" not in result.stderr
    assert len(calls()) == 2
    assert "next:" not in result.stdout


def test_output_base():
    assert nc.output_base("a/b.nsys-rep") == "a/b"
    assert nc.output_base("a/b.sqlite") == "a/b"
    assert nc.output_base("a/b") == "a/b"
    assert Path(nc.output_base(".nsys-rep")).name == ".nsys-rep"
