"""Tests for the torch.profiler collector (``diagnose collect torch``).

Runs the real collector on the "tiny" preset on CPU (a few seconds) and checks the
exported Kineto trace with the stdlib only: step markers, their ctx values, the
top-level "diagnose" metadata object and recorded shapes.
"""

from __future__ import annotations

import gzip
import json
import re

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from diagnose.collectors import presets  # noqa: E402
from diagnose.collectors import torch_collector as tc  # noqa: E402
from diagnose.collectors.collect_cli import collect_group  # noqa: E402
from diagnose.errors import DiagnoseError  # noqa: E402

BATCH, PROMPT, STEPS = 2, 32, 5
MARKER_RE = re.compile(r"^diagnose:(prefill|decode)\[bs=(\d+) (toks|ctx)=(\d+)\]$")


def _annotations(trace: dict) -> list[dict]:
    return sorted(
        (e for e in trace["traceEvents"] if e.get("cat") == "user_annotation" and e["name"].startswith("diagnose:")),
        key=lambda e: e["ts"],
    )


@pytest.fixture(scope="module")
def recorded(tmp_path_factory):
    """One CLI run: tiny config, B=2, S=32, 5 decode steps, gzip output."""
    out_dir = tmp_path_factory.mktemp("collect")
    out = out_dir / "trace.json.gz"
    result = CliRunner().invoke(
        collect_group,
        ["torch", "--config", "tiny", "--device", "cpu", "--batch", str(BATCH), "--prompt-len", str(PROMPT),
         "--decode-steps", str(STEPS), "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    with gzip.open(out, "rt", encoding="utf-8") as fh:
        trace = json.load(fh)
    return {"result": result, "out": out, "dir": out_dir, "trace": trace}


def test_cli_reports_and_writes_only_the_output(recorded):
    assert recorded["out"].exists()
    assert "1 prefill + 5 decode steps" in recorded["result"].output
    # Atomic write: no temporary files left beside the output.
    assert sorted(p.name for p in recorded["dir"].iterdir()) == ["trace.json.gz"]


def test_exactly_one_prefill_and_n_decode_markers(recorded):
    names = [e["name"] for e in _annotations(recorded["trace"])]
    prefill = [n for n in names if n.startswith("diagnose:prefill[")]
    decode = [n for n in names if n.startswith("diagnose:decode[")]
    assert prefill == [f"diagnose:prefill[bs={BATCH} toks={BATCH * PROMPT}]"]
    assert len(decode) == STEPS
    assert all(MARKER_RE.match(n) for n in names)
    # Prefill first, then decode steps with ctx = S + i in time order.
    assert names[0] == prefill[0]
    ctx = [int(MARKER_RE.match(n).group(4)) for n in decode]
    assert ctx == [32, 33, 34, 35, 36]
    assert all(int(MARKER_RE.match(n).group(2)) == BATCH for n in names)


def test_metadata_is_a_top_level_object(recorded):
    meta = recorded["trace"]["diagnose"]
    assert isinstance(meta, dict)
    assert meta["collector"] == "diagnose.collectors.torch_collector"
    assert meta["model_config"]["num_hidden_layers"] == 2
    assert meta["model_config"]["hidden_size"] == 64
    assert meta["model_config"]["model_type"] == "llama"
    assert (meta["batch"], meta["prompt_len"], meta["decode_steps"]) == (BATCH, PROMPT, STEPS)
    assert (meta["device"], meta["dtype"], meta["cuda_graph"]) == ("cpu", "fp32", False)
    assert meta["torch_version"] == torch.__version__
    assert re.match(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$", meta["created_utc"])
    assert "name" in meta["device_properties"]


def test_cpu_ops_carry_input_dims_per_phase(recorded):
    trace = recorded["trace"]
    steps = _annotations(trace)
    linears = [e for e in trace["traceEvents"] if e.get("cat") == "cpu_op" and e["name"] in ("aten::linear", "aten::mm")]
    assert linears and all("Input Dims" in e["args"] for e in linears)

    def first_dims_in(step):
        lo, hi = step["ts"], step["ts"] + step["dur"]
        return {tuple(e["args"]["Input Dims"][0]) for e in linears
                if e["name"] == "aten::linear" and lo <= e["ts"] <= hi}

    # Activations are [B, S, H] in prefill and [B, 1, H] in decode (H = 64; the MLP
    # down projection reads [B, *, F], F = 128).
    assert first_dims_in(steps[0]) == {(BATCH, PROMPT, 64), (BATCH, PROMPT, 128)}
    for step in steps[1:]:
        assert first_dims_in(step) == {(BATCH, 1, 64), (BATCH, 1, 128)}


def test_plain_json_output_and_zero_decode_steps(tmp_path):
    out = tmp_path / "sub" / "t.json"
    result = CliRunner().invoke(
        collect_group,
        ["torch", "--config", "tiny", "--batch", "1", "--prompt-len", "4", "--decode-steps", "0",
         "--warmup", "0", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    trace = json.loads(out.read_text(encoding="utf-8"))
    assert [e["name"] for e in _annotations(trace)] == ["diagnose:prefill[bs=1 toks=4]"]
    assert trace["diagnose"]["decode_steps"] == 0


@pytest.mark.parametrize(
    "args, message",
    [
        (["--config", "tiny", "--batch", "0"], "--batch must be an integer >= 1"),
        (["--config", "tiny", "--batch", "1", "--decode-steps", "-1"], "--decode-steps must be an integer >= 0"),
        (["--config", "huge", "--batch", "1"], "unknown model config 'huge'"),
        (["--config", "tiny", "--batch", "1", "--cuda-graph"], "--cuda-graph needs --device cuda"),
        (["--config", "tiny", "--model", "x/y", "--batch", "1"], "exactly one of --config or --model"),
        (["--batch", "1"], "exactly one of --config or --model"),
        (["--config", "tiny", "--batch", "1", "--model", "/no/such/dir"], "exactly one of"),
        (["--config", "tiny"], "Missing option '--batch'"),
        (["--config", "tiny", "--batch", "1", "--dtype", "int3"], "'int3' is not one of"),
    ],
)
def test_bad_args_exit_2_with_one_line(tmp_path, args, message):
    out = tmp_path / "t.json.gz"
    base = ["torch", "--prompt-len", "8", "--out", str(out)]
    if "--decode-steps" not in args:
        base += ["--decode-steps", "1"]
    result = CliRunner().invoke(collect_group, base + args)
    assert result.exit_code == 2, result.output
    assert isinstance(result.exception, SystemExit)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert message in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()


def test_missing_model_dir_exits_2(tmp_path):
    result = CliRunner().invoke(
        collect_group,
        ["torch", "--model", str(tmp_path / "nope"), "--batch", "1", "--prompt-len", "4", "--decode-steps", "1",
         "--out", str(tmp_path / "t.json")],
    )
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [result.stderr.strip()]
    assert "no such directory" in result.stderr


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the no-CUDA error")
def test_cuda_unavailable_exits_2(tmp_path):
    result = CliRunner().invoke(
        collect_group,
        ["torch", "--config", "tiny", "--device", "cuda", "--batch", "1", "--prompt-len", "4", "--decode-steps", "1",
         "--out", str(tmp_path / "t.json")],
    )
    assert result.exit_code == 2
    assert len(result.stderr.strip().splitlines()) == 1
    assert "torch.cuda.is_available() is False" in result.stderr


def test_marker_helpers():
    assert tc.prefill_marker(4, 512) == "diagnose:prefill[bs=4 toks=2048]"
    assert tc.decode_marker(4, 515) == "diagnose:decode[bs=4 ctx=515]"


def test_library_validation_raises_diagnose_error():
    with pytest.raises(DiagnoseError, match="--cuda-graph needs --device cuda"):
        tc.validate_args(presets.get_preset("tiny"), None, "cpu", "fp32", 1, 8, 1, cuda_graph=True)
    with pytest.raises(DiagnoseError, match="--prompt-len"):
        tc.validate_args(presets.get_preset("tiny"), None, "cpu", "fp32", 1, 0, 1)
    with pytest.raises(DiagnoseError, match="unknown model config"):
        presets.get_preset("nope")


def test_ref7b_preset_matches_domain_parameter_count():
    # domain.md section 2: total 6,719,275,008 parameters for the 7B-like reference.
    c = presets.get_preset("ref7b")
    L, H, nh, nkv, d, F, V = (c[k] for k in ("num_hidden_layers", "hidden_size", "num_attention_heads",
                                             "num_key_value_heads", "head_dim", "intermediate_size", "vocab_size"))
    attn = 2 * H * nh * d + 2 * H * nkv * d
    mlp = 3 * H * F
    assert attn == 41_943_040 and mlp == 135_266_304
    total = L * (attn + mlp) + V * H * (1 if c["tie_word_embeddings"] else 2)
    assert total == 6_719_275_008
    assert c["model_type"] == presets.get_preset("tiny")["model_type"] == "llama"


@pytest.mark.slow  # runs a model twice on CPU
def test_static_cache_decode_matches_dynamic_cache():
    """The --cuda-graph path decodes with a StaticCache; on CPU (eager) it must produce the
    same greedy tokens as the default DynamicCache path."""
    torch.manual_seed(0)
    model = tc._build_model(presets.get_preset("tiny"), None, "cpu", torch.float32)
    kw = tc._cache_kwarg(model)
    prompt = torch.randint(0, 256, (2, 8))

    def run(cache):
        toks = []
        with torch.no_grad():
            ids, cache = tc._forward(model, prompt, cache, kw)
            toks.append(ids)
            for _ in range(4):
                ids, cache = tc._forward(model, ids, cache, kw)
                toks.append(ids)
        return torch.cat(toks, dim=1), cache

    dynamic, _ = run(None)
    static, cache = run(tc._make_static_cache(model, 2, 8 + 4, "cpu", torch.float32))
    assert torch.equal(dynamic, static)
    assert int(cache.get_seq_length()) == 8 + 4


@pytest.mark.slow  # saves and reloads a model, then runs it on CPU
def test_model_from_local_directory(tmp_path):
    model = tc._build_model(presets.get_preset("tiny"), None, "cpu", torch.float32)
    model.save_pretrained(tmp_path / "tiny-model")
    out = tmp_path / "m.json.gz"
    result = CliRunner().invoke(
        collect_group,
        ["torch", "--model", str(tmp_path / "tiny-model"), "--dtype", "bf16", "--batch", "1", "--prompt-len", "8",
         "--decode-steps", "2", "--warmup", "0", "--out", str(out)],
    )
    assert result.exit_code == 0, result.output
    with gzip.open(out, "rt", encoding="utf-8") as fh:
        trace = json.load(fh)
    assert [e["name"] for e in _annotations(trace)] == [
        "diagnose:prefill[bs=1 toks=8]", "diagnose:decode[bs=1 ctx=8]", "diagnose:decode[bs=1 ctx=9]"]
    assert trace["diagnose"]["dtype"] == "bf16"
    assert trace["diagnose"]["model_config"]["num_hidden_layers"] == 2
