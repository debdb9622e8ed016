"""The project's own traces end to end: the shipped sample and a fresh CPU collection are
split into exactly one prefill and N decode steps, with the model config read back from the
trace metadata."""
from __future__ import annotations

import json

from click.testing import CliRunner

from conftest import ROOT
from diagnose.accounting import ModelSpec
from diagnose.cli import main
from diagnose.collectors.presets import get_preset
from diagnose.pipeline import run_analysis

TINY_PARAMS = ModelSpec.from_hf_config(get_preset("tiny")).params_total


def test_shipped_sample_steps_and_config():
    a = run_analysis(str(ROOT / "samples" / "tiny_cpu.json.gz"))
    assert a.steps["phase"].tolist() == ["prefill"] + ["decode"] * 8  # recorded with --decode-steps 8
    assert a.steps["batch"].tolist() == [2] * 9
    assert a.steps["context"].tolist()[1:] == list(range(32, 40))  # --prompt-len 32
    d = a.to_dict()
    assert d["model"]["source"] == "trace metadata"
    assert d["model"]["params_total"] == TINY_PARAMS
    assert a.latency.tpot_samples == 7


def test_collect_then_run(tmp_path):
    out = tmp_path / "t.json.gz"
    r = CliRunner().invoke(main, ["collect", "torch", "--config", "tiny", "--device", "cpu", "--batch", "2",
                                  "--prompt-len", "16", "--decode-steps", "5", "--out", str(out)])
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(main, ["run", "--trace", str(out), "--format", "json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    phases = {p["name"]: p for p in d["phases"]}
    assert phases["prefill"]["steps"] == 1
    assert phases["decode"]["steps"] == 5
    assert d["model"]["source"] == "trace metadata"
    assert d["model"]["params_total"] == TINY_PARAMS
    assert [s["context"] for s in d["steps"] if s["phase"] == "decode"] == [16, 17, 18, 19, 20]
    assert "no_gpu_activity" in {q["code"] for q in d["quality"]}
