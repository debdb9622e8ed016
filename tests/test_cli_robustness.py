"""Issue 15 cases that live in the command layer and the rule engine: merged ranks through
``diagnose run``, a failed rank's exit status, terminal escape sequences, rules files that
amplify output or memory, an unmatched --phase-regex, compare/sweep on unlike traces."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

from conftest import PRINT_PEAK_RSS_BYTES
from diagnose.cli import main
import test_robustness2


#: the merged-ranks trace fixture of test_robustness2, shared
merged_ranks = test_robustness2.merged_ranks


def run(*args: str):
    return CliRunner().invoke(main, list(args))


def test_run_on_merged_ranks_reports_rank_by_rank(merged_ranks):
    merged, p0, p1 = merged_ranks
    r = run("run", "--trace", str(merged), "--format", "json")
    assert r.exit_code == 0, r.output
    fleet = json.loads(r.output)
    # the same shape as a --trace-dir run: one row per rank, labelled by the merger's prefix
    assert [(row["rank"], row["label"]) for row in fleet["ranks"]] == [(0, "TP00-DP00-PP00-EP00"), (1, "TP01-DP00-PP00-EP00")]
    single = json.loads(run("run", "--trace", str(p0), "--format", "json").output)
    assert fleet["reports"][0]["latency"] == single["latency"]
    text = run("run", "--trace", str(merged))
    assert text.exit_code == 0 and "[TP01-DP00-PP00-" in text.output  # the table folds long labels


def test_fleet_with_a_failed_rank_exits_2_and_reports_the_others(kineto, tmp_path):
    for r in range(2):
        kineto().launch("k", 10, 5, launch_ts=0).write(tmp_path / f"rank-{r}.json")
    (tmp_path / "rank-2.json").write_text('{"traceEvents": [')
    r = run("run", "--trace-dir", str(tmp_path), "--executor", "serial", "--format", "json")
    assert r.exit_code == 2  # unusable input for one rank, as for a single unusable trace
    assert r.stderr.startswith(f"error: {tmp_path / 'rank-2.json'}: ")
    fleet = json.loads(r.stdout)
    assert [row["rank"] for row in fleet["ranks"]] == [0, 1] and fleet["failed"] == 1


def test_terminal_output_escapes_control_sequences(tmp_path):
    """A marker and a kernel name holding OSC (set window title) and CSI (clear screen)
    sequences reach the terminal as visible text (\\x1b...), never as raw escapes."""
    ev = [
        {"ph": "X", "cat": "user_annotation", "name": "diagnose:decode[bs=1 ctx=16]\u001b]0;pwned\u0007\u001b[2J",
         "pid": 1, "tid": 1, "ts": 0, "dur": 50, "args": {}},
        {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "pid": 1, "tid": 1, "ts": 1, "dur": 2,
         "args": {"correlation": 5}},
        {"ph": "X", "cat": "kernel", "name": "evil\u001b[31mkernel\u009b2J", "pid": 0, "tid": 7, "ts": 10, "dur": 20,
         "args": {"device": 0, "stream": 7, "correlation": 5}},
    ]
    p = tmp_path / "esc.json"
    p.write_text(json.dumps({"traceEvents": ev, "deviceProperties": [{"id": 0, "name": "NVIDIA H100 80GB HBM3"}]}))
    env = {**os.environ, "COLUMNS": "160"}  # wide enough for the kernel's whole name (at 80 it is shortened)
    out = subprocess.run([sys.executable, "-c", "from diagnose.cli import main; main()", "run", "--trace", str(p)],
                         capture_output=True, timeout=120, env=env)
    assert out.returncode == 0, out.stderr
    for raw in (b"\x1b]0;", b"\x1b[2J", b"\x1b[31m", b"\xc2\x9b", b"\x07"):
        assert raw not in out.stdout
    assert b"evil\\x1b[31mkernel\\x9b2J" in out.stdout  # shown, escaped


def _rules_dir(tmp_path, summary: str):
    src = (__import__("conftest").ROOT / "rules" / "S3-gpu-idle.yaml").read_text()
    d = tmp_path / "rules"
    d.mkdir()
    start = src.index("summary: >-")
    end = src.index("\nwhy:")
    (d / "S3-gpu-idle.yaml").write_text(src[:start] + "summary: " + json.dumps(summary) + src[end:])
    return d


@pytest.mark.slow  # resource-bound check (memory and time limits)
def test_rules_file_with_a_huge_format_width_is_refused(tmp_path, kineto):
    d = _rules_dir(tmp_path, "{all.gpu_idle_share:100000000}")
    trace = kineto().launch("k", 10, 5, launch_ts=0).write(tmp_path / "t.json")
    r = run("gate", "--trace", str(trace), "--rules", str(d))
    assert r.exit_code == 2
    assert r.output.count("\n") == 1 and "S3-gpu-idle.yaml" in r.output
    assert "width or precision over 64" in r.output


@pytest.mark.slow  # resource-bound check (memory and time limits)
def test_rules_config_alias_bomb_refused_in_bounded_memory(tmp_path, kineto):
    """A 'billion laughs' YAML: nine levels of ten aliases each expand to 10**9 items."""
    lines = ['a0: &a0 ["x", "x", "x", "x", "x", "x", "x", "x", "x", "x"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]")
    cfg = tmp_path / "bomb.yaml"
    cfg.write_text("thresholds:\n" + "\n".join("  " + ln for ln in lines) + "\n")
    assert cfg.stat().st_size < 2_000
    trace = kineto().launch("k", 10, 5, launch_ts=0).write(tmp_path / "t.json")
    code = ("import sys\nfrom click.testing import CliRunner\nfrom diagnose.cli import main\n"
            "r = CliRunner().invoke(main, ['gate', '--trace', sys.argv[1], '--rules-config', sys.argv[2]])\n"
            "print(r.exit_code)\nprint(r.output.strip())\n" + PRINT_PEAK_RSS_BYTES)
    out = subprocess.run([sys.executable, "-c", code, str(trace), str(cfg)], capture_output=True, text=True, timeout=120)
    exit_code, message, rss_bytes = out.stdout.strip().splitlines()
    assert exit_code == "2"
    assert message.startswith(f"error: rules file {cfg}: not valid YAML") and "aliases" in message  # the rules file, not the trace
    assert int(rss_bytes) < 500e6


def test_unmatched_phase_regex_is_reported(kineto, tmp_path):
    trace = kineto().launch("k", 10, 5, launch_ts=0).write(tmp_path / "t.json")
    r = run("run", "--trace", str(trace), "--format", "json", "--phase-regex", "decode=^no_such_marker")
    q = {x["code"]: x for x in json.loads(r.output)["quality"]}
    assert q["phase_regex_unmatched"]["message"].startswith("--phase-regex decode=^no_such_marker matched no range")


def test_compare_warns_when_traces_differ_in_device(kineto, tmp_path):
    def trace(name, device_name):
        b = kineto(deviceProperties=[{"id": 0, "name": device_name}])
        for i in range(3):
            b.annotation("diagnose:decode[bs=8 ctx=2048]", 1000 * i, 100)
            b.launch("gemv", 1000 * i + 200, 300, launch_ts=1000 * i + 10)
        return b.write(tmp_path / name)

    a, b_ = trace("a.json", "NVIDIA H100 80GB HBM3"), trace("b.json", "NVIDIA A100-SXM4-80GB")
    r = run("compare", "--baseline", str(a), "--candidate", str(b_), "--format", "json")
    w = json.loads(r.output)["warnings"]
    assert w == ["the traces differ in device (baseline NVIDIA H100 80GB HBM3, candidate NVIDIA A100-SXM4-80GB): "
                 "the comparison may not be like for like"]
    same = run("compare", "--baseline", str(a), "--candidate", str(a), "--format", "json")
    assert json.loads(same.output)["warnings"] == []


def test_missing_module_of_a_broken_install_is_one_line_exit_3(capsys, monkeypatch):
    """A module of diagnose itself missing (a broken install) is an internal error: one line,
    exit 3, no traceback; an optional extra stays the exit-2 install hint."""
    from diagnose.cliutil import guarded

    def broken():
        raise ModuleNotFoundError("No module named 'diagnose.engine'", name="diagnose.engine")

    def no_dash():
        raise ModuleNotFoundError("No module named 'dash'", name="dash")

    monkeypatch.delenv("DIAGNOSE_DEBUG", raising=False)
    with pytest.raises(SystemExit) as ei:
        guarded(broken)()
    assert ei.value.code == 3
    assert capsys.readouterr().err == ("internal error: ModuleNotFoundError: No module named 'diagnose.engine' "
                                       "(set DIAGNOSE_DEBUG=1 for a traceback)\n")
    with pytest.raises(SystemExit) as ei:
        guarded(no_dash)()
    assert ei.value.code == 2
    assert capsys.readouterr().err.startswith("error: this needs the optional 'dash' package: ")


@pytest.mark.parametrize("cmd", [["run", "--trace", "{t}"], ["gate", "--trace", "{t}", "--fail-on", "high"], ["rules", "list"],
                                 ["rules", "test"]])
def test_empty_rules_folder_is_an_error_not_an_all_clear(cmd, tmp_path, kineto):
    """A --rules folder without rule files would fire nothing and pass every gate."""
    trace = kineto().launch("k", 10, 5, launch_ts=0).write(tmp_path / "t.json")
    empty = tmp_path / "rules"
    empty.mkdir()
    r = run(*[c.format(t=trace) for c in cmd], "--rules", str(empty))
    assert r.exit_code == 2
    assert r.output.strip() == f"error: no rule files (*.yaml) found in {empty}"


def test_compare_refuses_a_truncated_candidate_unless_allowed(tmp_path):
    """Like gate: a partial candidate (the sample cut at 2,000 bytes) is not a verdict."""
    from conftest import ROOT

    sample = ROOT / "samples" / "tiny_cpu.json.gz"
    trunc = tmp_path / "trunc.json.gz"
    trunc.write_bytes(sample.read_bytes()[:2000])
    r = run("compare", "--baseline", str(sample), "--candidate", str(trunc), "--format", "json")
    assert r.exit_code == 1
    d = json.loads(r.output)
    assert d["verdict"] == "unreliable"
    assert d["unreliable"] == ["candidate: partial trace file, quality: truncated, quality: fragment"]
    r2 = run("compare", "--baseline", str(sample), "--candidate", str(trunc), "--format", "json", "--allow-partial")
    assert json.loads(r2.output)["verdict"] == "not comparable"  # no TPOT in the readable part
    r3 = run("compare", "--baseline", str(sample), "--candidate", str(trunc), "--format", "json", "--allow-partial",
             "--allow-missing")
    assert r3.exit_code == 0


def test_sweep_warns_when_points_differ_in_device(kineto, tmp_path):
    """A sweep over traces of two GPUs is not a context or batch series of one setup."""
    def trace(name, device_name, ctx):
        b = kineto(deviceProperties=[{"id": 0, "name": device_name}])
        for i in range(3):
            b.annotation(f"diagnose:decode[bs=8 ctx={ctx}]", 1000 * i, 100)
            b.launch("gemv", 1000 * i + 200, 300, launch_ts=1000 * i + 10)
        return b.write(tmp_path / name)

    a = trace("a.json", "NVIDIA H100 80GB HBM3", 2048)
    b_ = trace("b.json", "NVIDIA A100-SXM4-80GB", 4096)
    r = run("sweep", "--trace", str(a), "--trace", str(b_), "--format", "json")
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["warnings"] == [
        f"the traces differ in device ({a} NVIDIA H100 80GB HBM3, {b_} NVIDIA A100-SXM4-80GB): the comparison may not be like "
        "for like"]
