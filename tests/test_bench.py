"""Tests for the prefill/decode benchmark (``diagnose collect bench``).

Runs the real benchmark on the "tiny" preset on CPU with small sizes (a few seconds per
run) and checks the results JSON: structure, percentile order, row count, analytic bytes
against :mod:`diagnose.accounting`, MFU/MBU with and without a peak, perplexity with a
locally saved model and tokenizer, and one-line argument errors.
"""

from __future__ import annotations

import json
import math

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from click.testing import CliRunner  # noqa: E402

from diagnose import accounting  # noqa: E402
from diagnose.accounting import ModelSpec  # noqa: E402
from diagnose.collectors import bench  # noqa: E402
from diagnose.collectors import torch_collector as tc  # noqa: E402
from diagnose.collectors.collect_cli import collect_group  # noqa: E402
from diagnose.collectors.presets import get_preset  # noqa: E402
from diagnose.errors import DiagnoseError  # noqa: E402

PROMPT_LENS = [16, 32]
BATCHES = [1, 2]
CONTEXTS = [32]
SMALL = ["--prompt-lens", "16,32", "--batches", "1,2", "--contexts", "32", "--warmup", "1", "--iters", "3"]


def _invoke(args):
    return CliRunner().invoke(collect_group, ["bench", *args])


@pytest.fixture(scope="module")
def with_peak(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results.json"
    result = _invoke(["--config", "tiny", "--device", "cpu", *SMALL, "--peak-tflops", "100",
                      "--bandwidth-tbps", "1", "--out", str(out)])
    assert result.exit_code == 0, result.output
    return {"result": result, "out": out, "data": json.loads(out.read_text())}


@pytest.fixture(scope="module")
def without_peak(tmp_path_factory):
    out = tmp_path_factory.mktemp("bench") / "results.json"
    result = _invoke(["--config", "tiny", *SMALL, "--out", str(out)])
    assert result.exit_code == 0, result.output
    return {"result": result, "out": out, "data": json.loads(out.read_text())}


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_results_structure(with_peak):
    data = with_peak["data"]
    assert data["schema"] == "diagnose.bench" and data["schema_version"] == 2
    for key in ("date", "device", "device_name", "torch_version", "config", "model", "settings", "peak", "rows"):
        assert key in data
    assert data["device"] == "cpu"
    assert data["torch_version"] == torch.__version__
    assert data["config"]["source"] == "preset:tiny"
    assert data["config"]["dtype"] == "fp32"
    assert data["config"]["model_config"]["hidden_size"] == 64
    assert data["settings"]["iters"] == 3 and data["settings"]["warmup"] == 1
    assert data["perplexity"] is None
    # Only the results file is left in the directory (atomic write).
    assert [p.name for p in with_peak["out"].parent.iterdir()] == ["results.json"]


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_row_count_order_and_percentiles(with_peak):
    rows = with_peak["data"]["rows"]
    assert len(rows) == len(PROMPT_LENS) + len(BATCHES) * len(CONTEXTS)
    prefill = [r for r in rows if r["scenario"] == "prefill"]
    decode = [r for r in rows if r["scenario"] == "decode"]
    assert [r["prompt_len"] for r in prefill] == PROMPT_LENS
    assert all(r["batch"] == 1 and r["context"] is None for r in prefill)
    assert [(r["batch"], r["context"]) for r in decode] == [(b, c) for b in BATCHES for c in CONTEXTS]
    for r in rows:
        assert r["status"] == "ok" and r["error"] is None
        assert r["iters"] == 3 and len(r["samples_ms"]) == 3
        t = r["time_ms"]
        assert 0 < t["p50"] <= t["p90"] <= t["p99"]
        assert t["min"] <= t["p50"] and t["p99"] <= t["max"]
        tokens = r["prompt_len"] if r["scenario"] == "prefill" else r["batch"]
        assert r["tokens_per_s"] == pytest.approx(tokens / (t["p50"] / 1e3))


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_analytic_numbers_match_accounting(with_peak):
    spec = ModelSpec.from_hf_config(get_preset("tiny"))
    for r in with_peak["data"]["rows"]:
        if r["scenario"] == "decode":
            step = accounting.decode_step(spec, r["batch"], r["context"], "fp32", "fp32")
            assert r["bytes"] == step.bytes_per_step
            assert r["flops"] == step.flops_per_step
        else:
            pf = accounting.prefill_flops(spec, r["prompt_len"], 1, lm_head="all")
            assert r["flops"] == pf.flops_total_causal
            assert r["flops_detail"]["total_full"] == pf.flops_total_full
            assert r["bytes"] == accounting.prefill_bytes(spec, r["prompt_len"], 1, "fp32", "fp32")


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_attainment_with_peak(with_peak):
    data = with_peak["data"]
    # GpuPeak.to_dict(): the JSON report's gpu object; 100 / 1 FLOP/B ridge
    assert data["peak"] == {"name": "custom", "peak_tflops": 100.0, "peak_tbps": 1.0, "ridge_flop_per_byte": 100.0,
                            "source": "command-line flags", "overrides": ["dense_fp16_tflops", "memory_bandwidth_tbps"],
                            "selection": "--peak-tflops/--bandwidth-tbps"}
    assert data["peak_missing"] is None
    for r in data["rows"]:
        p50_s = r["time_ms"]["p50"] / 1e3
        assert r["achieved_tbps"] == pytest.approx(r["bytes"] / p50_s / 1e12)
        assert r["achieved_tflops"] == pytest.approx(r["flops"] / p50_s / 1e12)
        assert r["mbu"] == pytest.approx(r["achieved_tbps"] / 1.0)
        assert r["mfu"] == pytest.approx(r["achieved_tflops"] / 100.0)
        bound_s = max(r["flops"] / 100e12, r["bytes"] / 1e12)
        assert r["bound_ms"] == pytest.approx(bound_s * 1e3)
        assert r["bound_ratio"] == pytest.approx(p50_s / bound_s)
        assert r["bound"] in ("compute", "memory")
        assert r["attainment_missing"] == []
    out = with_peak["result"].output
    assert "MBU" in out and "MFU" in out and "time p50 (ms)" in out


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_attainment_absent_without_peak_on_cpu(without_peak):
    data = without_peak["data"]
    assert data["peak"] is None
    assert "no device peak" in data["peak_missing"]
    for r in data["rows"]:
        for key in ("mfu", "mbu", "bound_ms", "bound_ratio"):
            assert r[key] is None
        assert r["achieved_tbps"] > 0  # analytic bytes over measured time need no peak
        assert any("no device peak" in reason for reason in r["attainment_missing"])
    assert "skipped" in without_peak["result"].output


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_decode_step_runs_at_exactly_the_context():
    """The static-cache decode step equals a full forward over context + 1 tokens, every time."""
    torch.manual_seed(0)
    model = tc._build_model(get_preset("tiny"), None, "cpu", torch.float32)
    runner = bench._Runner(model, "cpu", torch.float32)
    gen = torch.Generator().manual_seed(1)
    batch, context = 2, 20
    ids = runner.ids(gen, batch, context)
    cache = runner.static_cache(batch, context + 1)
    tok = torch.tensor([[5], [7]])
    with torch.inference_mode():
        nxt = runner.fill(cache, ids)
        ref_full = model(input_ids=ids).logits[:, -1]
        assert torch.equal(nxt, ref_full.argmax(-1, keepdim=True))
        ref = model(input_ids=torch.cat([ids, tok], 1)).logits[:, -1]
        for _ in range(3):
            out = model(input_ids=tok, use_cache=True, **{runner.cache_kw: cache}).logits[:, -1]
            bench._rewind(cache, context)
            assert torch.allclose(out, ref, atol=1e-5)
            assert int(cache.get_seq_length()) == context


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_chunked_fill_matches_one_forward(monkeypatch):
    monkeypatch.setattr(bench, "FILL_TOKENS_PER_FORWARD", 14)  # 7 tokens per sequence per forward
    torch.manual_seed(0)
    model = tc._build_model(get_preset("tiny"), None, "cpu", torch.float32)
    runner = bench._Runner(model, "cpu", torch.float32)
    ids = runner.ids(torch.Generator().manual_seed(2), 2, 20)
    cache = runner.static_cache(2, 21)
    with torch.inference_mode():
        nxt = runner.fill(cache, ids)
        assert torch.equal(nxt, model(input_ids=ids).logits[:, -1].argmax(-1, keepdim=True))


def test_time_stats_are_numpy_percentiles():
    stats = bench.time_stats_ms([1_000_000, 2_000_000, 3_000_000, 10_000_000])
    assert stats["p50"] == pytest.approx(2.5)
    assert stats["p90"] == pytest.approx(7.9)
    assert stats["p99"] == pytest.approx(9.79)
    assert stats["min"] == 1.0 and stats["max"] == 10.0


def test_attainment_partial_peak_lists_reasons():
    from diagnose.hardware import peak_from_overrides

    peak = peak_from_overrides(peak_tflops=100)
    out = bench.attainment(0.001, 10**9, 10**6, peak, None)
    assert out["mfu"] == pytest.approx(1e12 / 1e12 / 100)
    assert out["mbu"] is None and out["bound_ratio"] is None
    assert any(m.startswith("mbu") for m in out["attainment_missing"])
    assert any(m.startswith("bound") for m in out["attainment_missing"])


# -- perplexity ---------------------------------------------------------------------

TEXT = "the quick brown fox jumps over the lazy dog and the dog sleeps " * 6


@pytest.fixture(scope="module")
def local_model(tmp_path_factory):
    """A tiny Llama with random weights and a word-level tokenizer, saved to a directory."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedTokenizerFast

    path = tmp_path_factory.mktemp("model")
    words = sorted(set(TEXT.split()))
    vocab = {"[UNK]": 0, **{w: i + 1 for i, w in enumerate(words)}}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="[UNK]").save_pretrained(path)
    fields = get_preset("tiny")
    fields["vocab_size"] = 32
    cfg = AutoConfig.for_model(fields.pop("model_type"), **fields)
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(path)
    text = path / "text.txt"
    text.write_text(TEXT)
    return path, text


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_perplexity_with_real_weights(local_model, tmp_path):
    path, text = local_model
    out = tmp_path / "r.json"
    result = _invoke(["--model", str(path), "--prompt-lens", "8", "--batches", "1", "--contexts", "8",
                      "--warmup", "0", "--iters", "1", "--perplexity-text", str(text), "--out", str(out)])
    assert result.exit_code == 0, result.output
    data = json.loads(out.read_text())
    ppl = data["perplexity"]
    assert data["config"]["source"] == f"model:{path}"
    assert len(data["rows"]) == 2
    assert ppl["reason"] is None and ppl["tokens"] == len(TEXT.split()) - 1
    # Independent check: the whole text fits one window, so exp(mean loss) of one forward.
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    ids = AutoTokenizer.from_pretrained(path, local_files_only=True)(TEXT, return_tensors="pt")["input_ids"]
    with torch.inference_mode():
        loss = model(input_ids=ids, labels=ids).loss
    assert ppl["value"] == pytest.approx(math.exp(float(loss)), rel=1e-4)
    assert f"perplexity {ppl['value']:.4f}" in result.output


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_perplexity_windows_cover_every_token_once(local_model):
    path, text = local_model
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, local_files_only=True)
    whole = bench.perplexity_of_text(model, str(path), str(text), "cpu")
    windowed = bench.perplexity_of_text(model, str(path), str(text), "cpu", window=7)
    assert windowed["tokens"] == whole["tokens"] == len(TEXT.split()) - 1
    assert windowed["window"] == 7
    assert math.isfinite(windowed["value"]) and windowed["value"] > 1


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_perplexity_skipped_with_random_weights(tmp_path):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    out = tmp_path / "r.json"
    result = _invoke(["--config", "tiny", "--prompt-lens", "8", "--batches", "1", "--contexts", "8",
                      "--warmup", "0", "--iters", "1", "--perplexity-text", str(text), "--out", str(out)])
    assert result.exit_code == 0, result.output
    ppl = json.loads(out.read_text())["perplexity"]
    assert ppl["value"] is None and "meaningless" in ppl["reason"]
    assert "perplexity skipped" in result.output and "meaningless" in result.output


# -- argument errors ----------------------------------------------------------------


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--config", "tiny", "--prompt-lens", "0"], "--prompt-lens"),
        (["--config", "tiny", "--batches", "1,x"], "--batches"),
        (["--config", "tiny", "--contexts", ""], "--contexts"),
        (["--config", "tiny", "--iters", "0"], "--iters"),
        (["--config", "tiny", "--warmup", "-1"], "--warmup"),
        (["--config", "nope"], "unknown model config"),
        (["--config", "tiny", "--model", "/x"], "exactly one of --config or --model"),
        ([], "exactly one of --config or --model"),
        (["--config", "tiny", "--device", "tpu"], "tpu"),
        (["--config", "tiny", "--gpu", "NoSuchGPU"], "unknown GPU"),
        (["--config", "tiny", "--peak-tflops", "-1"], "--peak-tflops"),
        (["--config", "tiny", "--perplexity-text", "/no/such/file.txt"], "--perplexity-text"),
        (["--config", "tiny", "--iters", "abc"], "abc"),
    ],
)
def test_bad_args_exit_2_with_one_line(args, needle, tmp_path):
    out = tmp_path / "r.json"
    result = _invoke([*args, "--out", str(out)])
    assert result.exit_code == 2, result.output
    lines = [ln for ln in result.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("Error: ") and needle in lines[0]
    assert "Traceback" not in result.output
    assert not out.exists()


def test_library_validation_raises():
    with pytest.raises(DiagnoseError, match="exactly one"):
        bench.run_bench(config=None, model_path=None)
    with pytest.raises(DiagnoseError, match="--batches"):
        bench.run_bench(config=get_preset("tiny"), batches=[])
    with pytest.raises(DiagnoseError, match="dtype"):
        bench.run_bench(config=get_preset("tiny"), dtype="int8")


def test_cuda_unavailable_is_one_line(tmp_path):
    if torch.cuda.is_available():
        pytest.skip("CUDA is available here")
    result = _invoke(["--config", "tiny", "--device", "cuda", *SMALL, "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    assert result.stderr.strip().splitlines() == [
        "Error: --device cuda requested but torch.cuda.is_available() is False"
    ]


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_out_of_memory_row_is_reported_and_the_run_continues(monkeypatch, tmp_path):
    real_decode = bench._Runner.decode

    def decode(self, ids, cache, context):
        if ids.shape[0] == 2:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB\nmore detail")
        return real_decode(self, ids, cache, context)

    monkeypatch.setattr(bench._Runner, "decode", decode)
    out = tmp_path / "r.json"
    result = _invoke(["--config", "tiny", *SMALL, "--out", str(out)])
    assert result.exit_code == 0, result.output
    rows = json.loads(out.read_text())["rows"]
    assert [r["status"] for r in rows] == ["ok", "ok", "ok", "oom"]
    oom = rows[-1]
    assert oom["error"] == "cpu out of memory: CUDA out of memory. Tried to allocate 64.00 GiB"
    assert oom["time_ms"] is None and oom["tokens_per_s"] is None and oom["samples_ms"] == []
    assert oom["bytes"] > 0  # analytic numbers are still there
    assert "OOM" in result.stdout and "(1 out of memory)" in result.stdout


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_missing_tokenizer_fails_before_any_row(local_model, tmp_path):
    import shutil

    path, text = local_model
    bare = tmp_path / "bare"
    bare.mkdir()
    for name in ("config.json", "model.safetensors"):
        shutil.copy(path / name, bare / name)
    result = _invoke(["--model", str(bare), *SMALL, "--perplexity-text", str(text), "--out", str(tmp_path / "r.json")])
    assert result.exit_code == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: cannot load the tokenizer of"), result.stderr
    assert not (tmp_path / "r.json").exists()


@pytest.mark.slow  # runs the benchmark's models on CPU
def test_progress_goes_to_stderr(without_peak):
    err = without_peak["result"].stderr
    assert "bench: prefill S=16" in err and "bench: decode B=2 ctx=32" in err
    assert "bench:" not in without_peak["result"].stdout
