"""``diagnose kv-budget`` and ``diagnose bounds`` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from diagnose.bounds_cli import bounds_command, kv_budget_command

DATA = Path(__file__).parent / "data"
QWEN = str(DATA / "qwen3_0_6b_config.json")

REF_CFG = {
    "num_hidden_layers": 32,
    "hidden_size": 4096,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "head_dim": 128,
    "intermediate_size": 11008,
    "vocab_size": 128000,
    "tie_word_embeddings": False,
}


@pytest.fixture
def runner() -> CliRunner:
    return CliRunner()


@pytest.fixture
def ref_config(tmp_path: Path) -> str:
    p = tmp_path / "ref" / "config.json"
    p.parent.mkdir()
    p.write_text(json.dumps(REF_CFG))
    return str(p)


def _json(runner: CliRunner, cmd, args: list[str]) -> dict:
    res = runner.invoke(cmd, [*args, "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _fails(runner: CliRunner, cmd, args: list[str], needle: str) -> None:
    res = runner.invoke(cmd, args)
    assert res.exit_code == 2, res.output
    assert res.exception is None or isinstance(res.exception, SystemExit)
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert needle in lines[0]


# -- kv-budget ---------------------------------------------------------------------


def test_kv_budget_flags_json(runner: CliRunner) -> None:
    out = _json(runner, kv_budget_command, ["--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                                            "--seq-len", "32768", "--batch", "8"])
    assert out["kv_bytes_per_token"] == 131_072
    assert out["kv_bytes_per_sequence"] == 4 * 2**30
    assert out["kv_bytes_total"] == 32 * 2**30
    assert out["kv_gib_total"] == 32.0
    assert out["max_sequences"] is None


@pytest.mark.parametrize(("seq", "ceiling", "usable"), [(2048, 240, 180), (8192, 60, 45), (32768, 15, 11), (131072, 3, 2)])
def test_kv_budget_60_gib_table(runner: CliRunner, seq: int, ceiling: int, usable: int) -> None:
    out = _json(runner, kv_budget_command, ["--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                                            "--seq-len", str(seq), "--kv-memory-gib", "60"])
    assert (out["max_sequences"], out["usable_sequences"]) == (ceiling, usable)


def test_kv_budget_80_gb_card_with_model_config(runner: CliRunner, ref_config: str) -> None:
    out = _json(runner, kv_budget_command, ["--model-config", ref_config, "--seq-len", "2048",
                                            "--memory-gb", "80", "--overhead-gb", "5", "--batch", "64"])
    assert out["kv_bytes_per_token"] == 131_072
    assert out["weight_bytes"] == 13_438_550_016
    assert out["kv_memory_bytes"] == 61_561_449_984
    assert (out["max_sequences"], out["usable_sequences"], out["fits"]) == (229, 171, True)


def test_kv_budget_weights_gb_and_int8(runner: CliRunner) -> None:
    out = _json(runner, kv_budget_command, ["--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                                            "--seq-len", "8192", "--bytes-per-elem", "1",
                                            "--memory-gb", "80", "--overhead-gb", "5", "--weights-gb", "13.44"])
    assert out["kv_bytes_per_token"] == 65_536
    # 80e9 - 5e9 - 13.44e9 = 61.56e9 B; // (8192 * 65,536 = 536,870,912) = 114
    assert out["kv_memory_bytes"] == 61_560_000_000
    assert out["max_sequences"] == 114


def test_kv_budget_qwen3(runner: CliRunner) -> None:
    out = _json(runner, kv_budget_command, ["--model-config", QWEN, "--seq-len", "40960"])
    assert out["kv_bytes_per_token"] == 114_688
    assert out["kv_bytes_total"] == 40960 * 114_688
    assert out["model"] == "qwen3_0_6b_config"  # no _name_or_path: the file stem


def test_kv_budget_text(runner: CliRunner) -> None:
    res = runner.invoke(kv_budget_command, ["--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                                            "--seq-len", "2048", "--kv-memory-gib", "60"])
    assert res.exit_code == 0, res.output
    assert "131,072" in res.output
    assert "GB (1e9 B)" in res.output and "GiB (2^30 B)" in res.output
    assert "240 sequences" in res.output and "180 usable" in res.output


def test_kv_budget_errors(runner: CliRunner, tmp_path: Path) -> None:
    _fails(runner, kv_budget_command, ["--seq-len", "2048"], "--layers")
    _fails(runner, kv_budget_command, ["--model-config", str(tmp_path / "nope.json"), "--seq-len", "8"], "not found")
    _fails(runner, kv_budget_command, ["--layers", "0", "--kv-heads", "8", "--head-dim", "128", "--seq-len", "8"], "--layers")
    _fails(runner, kv_budget_command, ["--layers", "32", "--kv-heads", "8", "--head-dim", "128", "--seq-len", "2048",
                                       "--memory-gb", "16", "--overhead-gb", "5", "--weights-gb", "13.44"], "no memory left")


# -- bounds ------------------------------------------------------------------------

# domain.md section 3 table at ctx 2048, 2 TB/s.
DECODE = {
    1: (13.71, 6.85, 146, 6.85),
    8: (15.59, 7.79, 1027, 0.97),
    32: (22.03, 11.01, 2905, 0.34),
    64: (30.62, 15.31, 4180, 0.24),
    128: (47.80, 23.90, 5356, 0.19),
}


def test_bounds_reference_json(runner: CliRunner, ref_config: str) -> None:
    out = _json(runner, bounds_command, ["--model-config", ref_config, "--peak-tflops", "300",
                                         "--bandwidth-tbps", "2", "--batch", "1,8,32,64,128",
                                         "--context", "2048", "--prompt-len", "2048,8192"])
    m = out["model"]
    assert m["params_total"] == 6_719_275_008
    assert m["params_attention_per_layer"] == 41_943_040
    assert m["params_mlp_per_layer"] == 135_266_304
    assert m["weight_bytes"] == 13_438_550_016
    assert m["kv_bytes_per_token"] == 131_072
    assert out["device"]["ridge_flop_per_byte"] == 150.0
    assert out["device"]["name"] == "custom"

    assert [d["batch"] for d in out["decode"]] == [1, 8, 32, 64, 128]
    for d in out["decode"]:
        gb, ms, tok, share = DECODE[d["batch"]]
        assert d["context"] == 2048
        assert d["bytes_per_step"] == 13_438_550_016 + d["batch"] * 2048 * 131_072
        assert round(d["bytes_per_step"] / 1e9, 2) == gb
        assert round(d["step_ms"], 2) == ms
        assert round(d["tokens_per_s"]) == tok
        assert round(d["per_token_ms"], 2) == share
        assert d["bound"] == "memory"
    assert round(out["decode_weights_only"]["step_ms"], 2) == 6.72
    assert round(out["decode_weights_only"]["tokens_per_s"], 1) == 148.8

    p2k, p8k = out["prefill"]
    assert p2k["prompt_len"] == 2048
    assert p2k["flops_linear"] == 23_227_183_136_768
    assert p2k["flops_attention_full"] == 2_199_023_255_552
    assert p2k["flops_attention_causal"] == 1_099_511_627_776
    assert p8k["flops_attention_full"] == 35_184_372_088_832
    assert p8k["flops_attention_causal"] == 17_592_186_044_416
    # causal total at 8192 (LM head on all positions):
    # 92,908,732,547,072 + 8,589,934,592,000 + 17,592,186,044,416 = 119,090,853,183,488
    assert p8k["flops_total_causal"] == 119_090_853_183_488
    assert p8k["bound_ms"] == pytest.approx(119_090_853_183_488 / 300e12 * 1e3)
    assert round(p8k["bound_ms"], 1) == 397.0
    assert p8k["bound_ms_full"] == pytest.approx(p8k["flops_total_full"] / 300e12 * 1e3)
    assert p8k["arithmetic_intensity_causal"] > 150  # compute-bound


def test_bounds_gpu_row_and_override(runner: CliRunner, ref_config: str) -> None:
    out = _json(runner, bounds_command, ["--model-config", ref_config, "--gpu", "h100-sxm", "--batch", "1",
                                         "--prompt-len", "512"])
    dev = out["device"]
    assert (dev["name"], dev["peak_tflops"], dev["bandwidth_tbps"]) == ("H100-SXM", 989.4, 3.35)
    assert out["decode"][0]["step_ms"] == pytest.approx(13_706_985_472 / 3.35e12 * 1e3)
    over = _json(runner, bounds_command, ["--model-config", ref_config, "--gpu", "H100-SXM",
                                          "--bandwidth-tbps", "2", "--batch", "1"])
    assert over["device"]["bandwidth_tbps"] == 2.0
    assert over["device"]["overrides"] == ["memory_bandwidth_tbps"]
    assert round(over["decode"][0]["step_ms"], 2) == 6.85


def test_bounds_qwen3_dtypes(runner: CliRunner) -> None:
    out = _json(runner, bounds_command, ["--model-config", QWEN, "--gpu", "L4", "--weight-dtype", "int8",
                                         "--kv-dtype", "int8", "--batch", "1", "--context", "0",
                                         "--lm-head", "last", "--prompt-len", "1024"])
    assert out["model"]["params_total"] == 595_984_384
    assert out["model"]["weight_bytes"] == 595_984_384
    assert out["model"]["kv_bytes_per_token"] == 57_344
    assert out["decode"][0]["bytes_per_step"] == 595_984_384
    # LM head on the last position only: 2 * 1024 * 151936
    assert out["prefill"][0]["flops_lm_head"] == 311_164_928


def test_bounds_text(runner: CliRunner, ref_config: str) -> None:
    res = runner.invoke(bounds_command, ["--model-config", ref_config, "--peak-tflops", "300",
                                         "--bandwidth-tbps", "2"])
    assert res.exit_code == 0, res.output
    text = res.output
    for needle in ("6,719,275,008", "13,438,550,016", "131,072", "150.0 FLOP/B",
                   "bytes/step (GB)", "step (ms)", "throughput (tok/s)", "per-token share (ms)",
                   "AI (FLOP/B)", "attn causal (TFLOP)", "bound causal (ms)", "GiB (2^30 B)",
                   "13.71", "6.85", "1,027", "5,356", "47.80", "6.72 ms/step", "148.8 tok/s",
                   "Conventions", "causal = full / 2"):
        assert needle in text, needle


def test_bounds_errors(runner: CliRunner, ref_config: str, tmp_path: Path) -> None:
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    no_keys = tmp_path / "nokeys.json"
    no_keys.write_text(json.dumps({"hidden_size": 64}))
    _fails(runner, bounds_command, ["--model-config", str(tmp_path / "missing.json"), "--gpu", "H100-SXM"], "not found")
    _fails(runner, bounds_command, ["--model-config", str(bad_json), "--gpu", "H100-SXM"], "not JSON")
    _fails(runner, bounds_command, ["--model-config", str(no_keys), "--gpu", "H100-SXM"], "num_hidden_layers")
    _fails(runner, bounds_command, ["--model-config", ref_config, "--gpu", "TPU-v5"], "valid names")
    _fails(runner, bounds_command, ["--model-config", ref_config], "--gpu")
    _fails(runner, bounds_command, ["--model-config", ref_config, "--peak-tflops", "300"], "--bandwidth-tbps")
    _fails(runner, bounds_command, ["--model-config", ref_config, "--gpu", "L4", "--batch", "1,x"], "--batch")
    _fails(runner, bounds_command, ["--model-config", ref_config, "--gpu", "L4", "--prompt-len", "0"], "--prompt-len")
    _fails(runner, bounds_command, ["--model-config", ref_config, "--peak-tflops", "-1", "--bandwidth-tbps", "2"],
           "--peak-tflops")
