"""``diagnose kv-budget`` and ``diagnose bounds`` through click's CliRunner."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import REF_7B_CONFIG
from click.testing import CliRunner

from diagnose.bounds_cli import bounds_command, kv_budget_command
from diagnose.cli import main

DATA = Path(__file__).parent / "data"
QWEN = str(DATA / "qwen3_0_6b_config.json")

REF_CFG = dict(REF_7B_CONFIG)  # domain.md section 2, reference config "7B-like"


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
    """Through the ``diagnose`` group, as users run it: one ``error:`` line, exit 2."""
    res = runner.invoke(main, [cmd.name, *args])
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
    assert out["gpu"] == {"name": "custom", "peak_tflops": 300.0, "peak_tbps": 2.0, "ridge_flop_per_byte": 150.0,
                          "source": "command-line flags", "overrides": ["dense_fp16_tflops", "memory_bandwidth_tbps"],
                          "selection": "--peak-tflops/--bandwidth-tbps"}

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
    dev = out["gpu"]
    assert (dev["name"], dev["peak_tflops"], dev["peak_tbps"]) == ("H100-SXM", 989.4, 3.35)
    assert out["decode"][0]["step_ms"] == pytest.approx(13_706_985_472 / 3.35e12 * 1e3)
    over = _json(runner, bounds_command, ["--model-config", ref_config, "--gpu", "H100-SXM",
                                          "--bandwidth-tbps", "2", "--batch", "1"])
    assert over["gpu"]["peak_tbps"] == 2.0
    assert over["gpu"]["overrides"] == ["memory_bandwidth_tbps"]
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


# -- beyond dense bf16 (issue 14 item 1 acceptance) ----------------------------------
# bytes_per_step is one rank's: every non-expert weight once (embedding and LM head
# included) + per MoE layer E_touched * expert bytes, E_touched = E * (1 - (1 - k/E)^B),
# + the KV read. Each expectation is derived by hand and must agree within 1 %.


def _bounds(runner: CliRunner, model: str, batch: str, context: int, *extra: str) -> dict:
    res = runner.invoke(main, ["bounds", "--model-config", model, "--gpu", "H100-SXM", "--batch", batch,
                               "--context", str(context), "--prompt-len", "512", *extra, "--format", "json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.output)


def _within_1pct(got: float, want: float) -> None:
    assert abs(got / want - 1) < 0.01, (got, want)


def test_mixtral_decode_bytes(runner: CliRunner) -> None:
    out = _bounds(runner, "mixtral-8x7b", "1,8,64", 2048)
    assert out["model"]["params_active_per_token"] == 12_748_587_008
    # non-expert bf16: 2 * (32 * 41,943,040 attention + 32 * 4096*8 routers + 2 * 32000 * 4096) = 3,210,739,712
    non_expert = 2 * (32 * 41_943_040 + 32 * 32_768 + 262_144_000)
    expert = 3 * 4096 * 14336 * 2  # 352,321,536 B, one expert of one layer
    for row, b in zip(out["decode"], (1, 8, 64)):
        touched = 8 * (1 - (1 - 2 / 8) ** b)  # 2, 7.199, 8.000
        want = non_expert + 32 * touched * expert + b * 2048 * 131_072  # KV 2*32*8*128*2 B per token
        _within_1pct(row["bytes_per_step"], want)
        assert row["experts_touched_per_layer"] == pytest.approx(touched, rel=1e-12)
    assert out["decode"][0]["bytes_per_step"] == 3_210_739_712 + 22_548_578_304 + 268_435_456 == 26_027_753_472


def test_gpt_oss_20b_decode_bytes(runner: CliRunner) -> None:
    out = _bounds(runner, "gpt-oss-20b", "1,32", 4096)
    assert out["model"]["params_active_per_token"] == 3_607_142_400
    non_expert = 2 * (24 * 26_542_080 + 24 * 2880 * 32 + 2 * 201_088 * 2880)  # 3,594,977,280 B bf16
    expert = 3 * 2880 * 2880 * 4.25 / 8  # MXFP4: 13,219,200 B
    kv_layer = 2 * 8 * 64 * 2  # 2,048 B per token and layer
    for row, b in zip(out["decode"], (1, 32)):
        touched = 32 * (1 - (1 - 4 / 32) ** b)  # 4, 31.554
        # 12 full layers read 4,096 tokens, 12 sliding layers min(4096, 128)
        want = non_expert + 24 * touched * expert + b * (12 * kv_layer * 4096 + 12 * kv_layer * 128)
        _within_1pct(row["bytes_per_step"], want)
        assert row["experts_touched_per_layer"] == pytest.approx(touched, rel=1e-12)
    assert out["decode"][0]["bytes_per_step"] == 3_594_977_280 + 1_269_043_200 + 100_663_296 + 3_145_728


def test_llama_fp8_decode_bytes(runner: CliRunner, tmp_path: Path) -> None:
    from diagnose.accounting import read_model_config

    cfg, _ = read_model_config("llama-3.1-8b")
    cfg["quantization_config"] = {"quant_method": "fp8", "activation_scheme": "dynamic"}
    path = tmp_path / "llama-fp8" / "config.json"
    path.parent.mkdir()
    path.write_text(json.dumps(cfg))
    # linear 32 * (41,943,040 + 176,160,768) = 6,979,321,856 at 1 B; embedding + LM head
    # 2 * 128256 * 4096 = 1,050,673,152 at 2 B -> 9,080,668,160 B; KV 131,072 B per token (bf16)
    weights = 6_979_321_856 + 2 * 1_050_673_152
    out = _bounds(runner, str(path), "1", 2048)
    _within_1pct(out["decode"][0]["bytes_per_step"], weights + 1 * 2048 * 131_072)
    assert out["decode"][0]["bytes_per_step"] == 9_349_103_616
    assert out["decode"][0]["experts_touched_per_layer"] is None
    out = _bounds(runner, str(path), "32", 8192)
    _within_1pct(out["decode"][0]["bytes_per_step"], weights + 32 * 8192 * 131_072)
    assert out["decode"][0]["bytes_per_step"] == 43_440_406_528
    # --weight-dtype keeps overriding: every weight bf16 again
    over = _bounds(runner, str(path), "1", 2048, "--weight-dtype", "bf16")
    assert over["decode"][0]["bytes_per_step"] == 2 * 8_029_995_008 + 268_435_456


def test_llama_tp2_decode_bytes(runner: CliRunner) -> None:
    out = _bounds(runner, "llama-3.1-8b", "8", 2048, "--tp", "2")
    # per rank: q, o 4096*2048 each; k, v 4096*(4*128) each -> 20,971,520; MLP 3*4096*7168 =
    # 88,080,384; 32 layers -> 3,489,660,928; vocab 64,128 rows * 4096 * 2 = 525,336,576;
    # 4,014,997,504 params * 2 B = 8,029,995,008; KV 2*32*4*128*2 = 65,536 B per token
    weights = 2 * (32 * (20_971_520 + 88_080_384) + 2 * 64_128 * 4096)
    _within_1pct(out["decode"][0]["bytes_per_step"], weights + 8 * 2048 * 65_536)
    assert out["decode"][0]["bytes_per_step"] == 8_029_995_008 + 1_073_741_824
    assert out["model"]["tp"] == 2 and out["model"]["kv_bytes_per_token"] == 65_536


def test_mixtral_tp2_decode_bytes(runner: CliRunner) -> None:
    out = _bounds(runner, "mixtral-8x7b", "32", 2048, "--tp", "2")
    # per rank non-expert: attention 32 * (2*4096*2048 + 2*4096*512) = 671,088,640; routers
    # replicated 32 * 32,768 = 1,048,576; vocab 16,000 rows * 4096 * 2 = 131,072,000 -> * 2 B
    non_expert = 2 * (671_088_640 + 1_048_576 + 131_072_000)  # 1,606,418,432
    expert = 3 * 4096 * (14336 // 2) * 2  # 176,160,768 B: expert width split 2 ways
    touched = 8 * (1 - 0.75**32)  # 7.9992
    want = non_expert + 32 * touched * expert + 32 * 2048 * 65_536
    _within_1pct(out["decode"][0]["bytes_per_step"], want)
    assert out["decode"][0]["experts_touched_per_layer"] == pytest.approx(touched, rel=1e-12)


def test_bounds_text_moe_and_assumptions(runner: CliRunner) -> None:
    res = runner.invoke(main, ["bounds", "--model-config", "gpt-oss-20b", "--gpu", "MI300X", "--batch", "32",
                               "--context", "1721", "--prompt-len", "1024"])
    assert res.exit_code == 0, res.output
    for needle in ("31.55 of 32", "active per token", "mxfp4 (4.25 bit)", "uniform, independent routing",
                   "sliding-window layers read min(context, window)"):
        assert needle in res.output, needle


def test_bounds_refuses_unsupported_configs(runner: CliRunner, tmp_path: Path) -> None:
    bad = tmp_path / "ep.json"
    bad.write_text(json.dumps({**REF_CFG, "ep_size": 8}))
    _fails(runner, bounds_command, ["--model-config", str(bad), "--gpu", "H100-SXM"], "'ep_size' is not supported")
    q = tmp_path / "hqq.json"
    q.write_text(json.dumps({**REF_CFG, "quantization_config": {"quant_method": "hqq"}}))
    _fails(runner, bounds_command, ["--model-config", str(q), "--gpu", "H100-SXM"], "quantization_config.quant_method")
    _fails(runner, bounds_command, ["--model-config", "llama-3.1-8b", "--gpu", "H100-SXM", "--tp", "3"],
           "num_attention_heads (32) is not divisible by 3")
    _fails(runner, bounds_command, ["--model-config", "llama-3.1-8b", "--gpu", "H100-SXM", "--tp", "0"], "--tp")


def test_kv_budget_sliding_window_and_tp(runner: CliRunner) -> None:
    out = _json(runner, kv_budget_command, ["--model-config", "gpt-oss-20b", "--seq-len", "4096"])
    # 24 layers * 2 * 8 * 64 * 2 B = 49,152 B per token; a 4,096-token sequence holds 12 full
    # layers * 2,048 B * 4,096 + 12 sliding layers * 2,048 B * 128 = 100,663,296 + 3,145,728
    assert out["kv_bytes_per_token"] == 49_152
    assert out["kv_bytes_per_sequence"] == 103_809_024
    assert out["weight_bytes"] == 13_747_322_880  # MXFP4 experts + bf16 rest, stored
    tp = _json(runner, kv_budget_command, ["--model-config", "llama-3.1-8b", "--seq-len", "2048", "--tp", "2"])
    assert tp["kv_bytes_per_token"] == 65_536 and tp["kv_heads_per_rank"] == 4
    assert tp["weight_bytes"] == 8_029_995_008
    flags = _json(runner, kv_budget_command, ["--layers", "32", "--kv-heads", "8", "--head-dim", "128",
                                              "--seq-len", "2048", "--tp", "16"])
    assert flags["kv_bytes_per_token"] == 2 * 32 * 1 * 128 * 2  # 8 heads over 16 ranks: 1 (replicated)


def test_int_list_type() -> None:
    from diagnose.clitypes import NON_NEGATIVE_INT_LIST, POSITIVE_INT_LIST

    assert POSITIVE_INT_LIST.convert(" 512, 2048 ", None, None) == [512, 2048]
    assert POSITIVE_INT_LIST.convert((1, 8), None, None) == [1, 8]
    assert NON_NEGATIVE_INT_LIST.convert("0,4", None, None) == [0, 4]
    import click

    for bad, needle in (("1,x", "comma-separated integers"), ("", "at least one"), ("0", ">= 1"), ("1.5", "integers")):
        with pytest.raises(click.BadParameter, match=needle):
            POSITIVE_INT_LIST.convert(bad, None, None)
