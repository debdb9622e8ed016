"""Timed prefill and decode benchmark: the article's two timers (docs/prefill-decode.md section 4).

:func:`run_bench` builds a decoder-only model with Hugging Face ``transformers`` (random
weights from a preset config, or a local checkpoint, exactly as
:mod:`diagnose.collectors.torch_collector` does) and times:

* **prefill** at each prompt length S (batch 1): one forward over ``[1, S]`` random token
  ids with a fresh KV cache, plus the greedy (argmax) pick of the next token;
* **decode** at each (batch B, context C): the KV cache is first built by a prefill of C
  random tokens per sequence (in chunks of at most :data:`FILL_TOKENS_PER_FORWARD` tokens,
  logits for the last position only) into a static cache of C + 1 slots. Each timed step
  feeds ``[B, 1]`` token ids, attends over the C cached tokens plus itself, writes its K/V
  into slot C and picks the next token by argmax; the cache is then rewound to C tokens
  (outside the timed region), so every timed step runs at exactly context C.

Timing: ``warmup`` untimed iterations per row first (the first calls allocate and pick
kernels), then ``iters`` timed iterations, each read with ``time.perf_counter_ns`` after
a device synchronize (``torch.cuda.synchronize()`` on CUDA; CPU work is synchronous).
On CUDA each timed iteration is an NVTX range named like the torch collector's markers
(``diagnose:prefill[bs=1 toks=S]``, ``diagnose:decode[bs=B ctx=C]``), so a benchmark run
under ``diagnose collect nsys`` can be analysed with ``diagnose run``.
Per row: p50/p90/p99 (numpy linear interpolation), mean, min and max in ms, and tokens/s
(prefill: prompt tokens / p50; decode: B / p50, the decode throughput).

Analytic numbers come from :mod:`diagnose.accounting`, with weights and KV cache in the
run's dtype:

* prefill: FLOPs = ``prefill_flops(spec, S, 1, lm_head="all").flops_total_causal`` (causal
  attention, LM head over all S positions: what the naive forward timed here computes;
  the full-mask and ``2 * P * S`` conventions are reported next to it); bytes =
  ``prefill_bytes(spec, S, 1)`` (weights read once + the KV cache written once);
* decode: ``decode_step(spec, B, C)``: bytes = weights + B * C * KV bytes per token,
  FLOPs = 2 * P * B + attention over the context.

Achieved TFLOP/s and TB/s divide those by the p50 time. With a device peak (resolved from
``torch.cuda.get_device_name()`` on CUDA, or ``gpu`` / ``peak_tflops`` /
``bandwidth_tbps``): MFU, MBU, the analytic lower bound max(FLOPs / peak FLOP/s,
bytes / peak B/s), which of the two terms sets it (``bound``: arithmetic intensity against
the ridge point), and ``bound_ratio`` = p50 / lower bound, all from
:func:`diagnose.roofline.roofline` (the formula the trace analysis uses), unrounded. Without a peak those fields are null and ``attainment_missing`` says
why. Units: TFLOP/s = 1e12 FLOP/s, TB/s = 1e12 B/s, GB = 1e9 B.

Optional perplexity (symptom S6, docs/prefill-decode.md section 7): over a text file, with the model's
own tokenizer, only for real weights (``model_path``); with random weights the number is
meaningless and is skipped with a reason.

torch and transformers are imported lazily (the ``collect`` extra).
"""

from __future__ import annotations

import datetime as _dt
import functools
import inspect
import json
import os
import platform
import tempfile
import time
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from diagnose import accounting
from diagnose.accounting import ModelSpec
from diagnose.collectors.perplexity import (  # noqa: F401  (re-exported)
    PERPLEXITY_WINDOW,
    perplexity_from_ids,
    perplexity_of_text,
    perplexity_token_ids,
)
from diagnose.errors import DiagnoseError
from diagnose.report import fmt
from diagnose.roofline import roofline

BENCH_SCHEMA = "diagnose.bench"
"""Value of ``results["schema"]``."""

BENCH_SCHEMA_VERSION = 2
"""Value of ``results["schema_version"]``. 2: ``peak`` is :meth:`GpuPeak.to_dict`
(``peak_tflops``, ``peak_tbps``; was ``dense_fp16_tflops``, ``memory_bandwidth_tbps``)."""

DEFAULT_PROMPT_LENS = (512, 2048, 8192)
DEFAULT_BATCHES = (1, 8, 32)
DEFAULT_CONTEXTS = (2048, 16384)
DEFAULT_WARMUP = 2
DEFAULT_ITERS = 10

FILL_TOKENS_PER_FORWARD = 8192
"""Most tokens (batch * chunk) per forward while building a decode row's KV cache."""

"""Tokens predicted per forward when computing perplexity (capped by the model's
``max_position_embeddings - 1``)."""

PERCENTILES = (50, 90, 99)

_NO_PEAK_REASON = (
    "no device peak: {what} is not in the GPU table; pass --gpu NAME or "
    "--peak-tflops X --bandwidth-tbps Y"
)


# -- argument checks ----------------------------------------------------------------


def _check_int_list(values: Any, flag: str) -> list[int]:
    if isinstance(values, (str, bytes)) or not isinstance(values, Sequence) or not values:
        raise DiagnoseError(f"{flag} needs at least one integer")
    out = []
    for v in values:
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:
            raise DiagnoseError(f"{flag} values must be integers >= 1, got {v!r}")
        out.append(v)
    return out


def validate_bench_args(
    config: dict | None,
    model_path: str | None,
    device: str,
    dtype: str,
    prompt_lens: Sequence[int],
    batches: Sequence[int],
    contexts: Sequence[int],
    warmup: int,
    iters: int,
    perplexity_text: str | None = None,
) -> None:
    """Check benchmark arguments without importing torch.

    Raises:
        DiagnoseError: any argument out of range or inconsistent (one-line message).
    """
    from diagnose.collectors.torch_collector import validate_model_args

    validate_model_args(config, model_path, device, dtype)
    _check_int_list(prompt_lens, "--prompt-lens")
    _check_int_list(batches, "--batches")
    _check_int_list(contexts, "--contexts")
    for name, value, low in (("warmup", warmup, 0), ("iters", iters, 1)):
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
            raise DiagnoseError(f"--{name} must be an integer >= {low}, got {value!r}")
    if perplexity_text is not None and not os.path.isfile(perplexity_text):
        raise DiagnoseError(f"--perplexity-text {perplexity_text!r}: no such file")


# -- statistics and analytic numbers ------------------------------------------------


def time_stats_ms(samples_ns: Sequence[int]) -> dict[str, float]:
    """p50/p90/p99 (numpy linear interpolation), mean, min and max of timings, in ms."""
    import numpy as np

    arr = np.asarray(samples_ns, dtype=np.float64) / 1e6
    p50, p90, p99 = (float(x) for x in np.percentile(arr, PERCENTILES))
    return {
        "p50": p50,
        "p90": p90,
        "p99": p99,
        "mean": float(arr.mean()),
        "min": float(arr.min()),
        "max": float(arr.max()),
    }


def prefill_analytic(spec: ModelSpec, prompt_len: int, weight_dtype: str, kv_dtype: str) -> dict:
    """Analytic FLOPs and bytes of one batch-1 prefill row (see the module docstring)."""
    pf = accounting.prefill_flops(spec, prompt_len, 1, lm_head="all")
    nbytes = accounting.prefill_bytes(spec, prompt_len, 1, weight_dtype, kv_dtype)
    return {
        "flops": pf.flops_total_causal,
        "bytes": nbytes,
        "flops_detail": {
            "linear": pf.flops_linear,
            "lm_head": pf.flops_lm_head,
            "attention_causal": pf.flops_attention_causal,
            "attention_full": pf.flops_attention_full,
            "total_causal": pf.flops_total_causal,
            "total_full": pf.flops_total_full,
            "total_2p": pf.flops_2p_total,
        },
        "bytes_detail": {
            "weight_bytes": accounting.weight_bytes(spec, weight_dtype),
            "kv_write_bytes": prompt_len * accounting.kv_bytes_per_token(spec, kv_dtype),
        },
    }


def decode_analytic(spec: ModelSpec, batch: int, context: int, weight_dtype: str, kv_dtype: str) -> dict:
    """Analytic FLOPs and bytes of one decode step at (batch, context)."""
    ds = accounting.decode_step(spec, batch, context, weight_dtype, kv_dtype)
    return {
        "flops": ds.flops_per_step,
        "bytes": ds.bytes_per_step,
        "flops_detail": {"matmul": ds.flops_matmul, "attention": ds.flops_attention},
        "bytes_detail": {"weight_bytes": ds.weight_bytes, "kv_read_bytes": ds.kv_read_bytes},
    }


def attainment(
    time_s: float | None, flops: int, nbytes: int, peak: Any | None, no_peak_reason: str | None
) -> dict:
    """Achieved TFLOP/s and TB/s at ``time_s``, and MFU/MBU/bound against ``peak``.

    One step of :func:`diagnose.roofline.roofline` at full precision (``rounded=False``:
    rows of a tiny model on CPU reach only micro-TFLOP/s, which the report's 6-decimal
    rounding would erase).

    Args:
        time_s: the row's p50 time in seconds (None when the row did not run).
        flops: analytic FLOPs of one iteration.
        nbytes: analytic bytes of one iteration.
        peak: a :class:`diagnose.hardware.GpuPeak`, or None.
        no_peak_reason: why ``peak`` is None (listed in ``attainment_missing``).

    Returns:
        ``achieved_tflops``, ``achieved_tbps``, ``arithmetic_intensity``, ``mfu``,
        ``mbu``, ``bound_ms``, ``bound`` ("compute" | "memory"), ``bound_ratio``,
        ``attainment_missing`` (list of reasons for null fields).
    """
    roof = roofline(flops, nbytes, time_s, peak, rounded=False)
    missing: list[str] = []
    if "time" in roof.missing:
        missing.append("time (the row did not run)")
    if peak is None:
        missing.append(no_peak_reason or "no device peak")
    else:
        if "peak_tflops" in roof.missing:
            missing.append("mfu (no peak TFLOP/s: pass --peak-tflops)")
        if "peak_tbps" in roof.missing:
            missing.append("mbu (no memory bandwidth: pass --bandwidth-tbps)")
        if roof.bound_s is None:
            missing.append("bound (needs both peak TFLOP/s and memory bandwidth)")
    return {
        "arithmetic_intensity": roof.arithmetic_intensity,
        "achieved_tflops": roof.achieved_tflops,
        "achieved_tbps": roof.achieved_tbps,
        "mfu": roof.mfu,
        "mbu": roof.mbu,
        "bound_ms": None if roof.bound_s is None else roof.bound_s * 1e3,
        "bound": roof.bound,
        "bound_ratio": roof.bound_ratio,
        "attainment_missing": missing,
    }


# -- torch helpers ------------------------------------------------------------------


def _is_oom(exc: BaseException) -> bool:
    text = str(exc).lower()
    return "out of memory" in text or "can't allocate memory" in text or "cannot allocate memory" in text


def _forward_params(model: Any) -> set[str]:
    try:
        return set(inspect.signature(model.forward).parameters)
    except (TypeError, ValueError):
        return set()


def _rewind(cache: Any, length: int) -> None:
    """Set a static cache back to ``length`` tokens (the next write goes to slot ``length``)."""
    layers = getattr(cache, "layers", None) or []
    done = False
    for layer in layers:
        cum = getattr(layer, "cumulative_length", None)
        if cum is None:
            continue
        if hasattr(cum, "fill_"):
            cum.fill_(length)
        else:
            layer.cumulative_length = length
        if hasattr(layer, "cumulative_length_int"):
            layer.cumulative_length_int = length
        done = True
    if not done and not getattr(cache, "_diagnose_positional", False):
        raise DiagnoseError(
            "this transformers version's StaticCache cannot be rewound; the benchmark needs transformers >= 5"
        )


class _Runner:
    """Forward helpers bound to one model, device and cache convention."""

    def __init__(self, model: Any, device: str, torch_dtype: Any) -> None:
        import torch

        from diagnose.collectors import torch_collector as tc

        self.torch = torch
        self.model = model
        self.device = device
        self.torch_dtype = torch_dtype
        self.cache_kw = tc._cache_kwarg(model)
        params = _forward_params(model)
        self.has_logits_to_keep = "logits_to_keep" in params
        self.has_cache_position = "cache_position" in params
        self.vocab = int(model.config.vocab_size)
        self.sync: Callable[[], None] = torch.cuda.synchronize if device == "cuda" else (lambda: None)

    def ids(self, gen: Any, batch: int, length: int) -> Any:
        return self.torch.randint(0, self.vocab, (batch, length), generator=gen).to(self.device)

    def prefill(self, ids: Any) -> Any:
        """One naive forward over ``ids`` with a fresh cache; returns the argmax next ids."""
        out = self.model(input_ids=ids, use_cache=True)
        return out.logits[:, -1, :].argmax(dim=-1, keepdim=True)

    def static_cache(self, batch: int, max_len: int) -> Any:
        from diagnose.collectors import torch_collector as tc

        cache = tc._make_static_cache(self.model, batch, max_len, self.device, self.torch_dtype)
        cache._diagnose_positional = self.has_cache_position
        return cache

    def _cache_forward(self, ids: Any, cache: Any, start: int, last_only: bool) -> Any:
        kwargs: dict[str, Any] = {"input_ids": ids, "use_cache": True, self.cache_kw: cache}
        if self.has_cache_position:  # transformers 4.x: the cache writes at cache_position
            kwargs["cache_position"] = self.torch.arange(start, start + ids.shape[1], device=self.device)
        if last_only and self.has_logits_to_keep:
            kwargs["logits_to_keep"] = 1
        out = self.model(**kwargs)
        return out.logits[:, -1, :].argmax(dim=-1, keepdim=True)

    def fill(self, cache: Any, ids: Any) -> Any:
        """Prefill ``ids`` ([B, C]) into ``cache`` in chunks; returns the argmax next ids."""
        batch, context = ids.shape
        chunk = max(1, FILL_TOKENS_PER_FORWARD // batch)
        nxt = None
        for start in range(0, context, chunk):
            nxt = self._cache_forward(ids[:, start : start + chunk], cache, start, last_only=True)
        return nxt

    def decode(self, ids: Any, cache: Any, context: int) -> Any:
        """One decode step at exactly ``context`` cached tokens; returns the argmax next ids."""
        return self._cache_forward(ids, cache, context, last_only=False)

    def timed(self, fn: Callable[[], Any], marker: str, after: Callable[[], None] | None = None) -> int:
        """Run ``fn`` between two synchronized timestamps; return the elapsed ns.

        On CUDA the iteration is also an NVTX range named ``marker`` (pushed before the
        first timestamp, popped after the second), so a run under ``diagnose collect
        nsys`` carries the phase markers the analyzer parses.
        """
        nvtx = self.device == "cuda"
        self.sync()
        if nvtx:
            self.torch.cuda.nvtx.range_push(marker)
        t0 = time.perf_counter_ns()
        fn()
        self.sync()
        t1 = time.perf_counter_ns()
        if nvtx:
            self.torch.cuda.nvtx.range_pop()
        if after is not None:
            after()
        return t1 - t0


# -- the benchmark ------------------------------------------------------------------


def _device_name(device: str) -> str:
    if device == "cuda":
        import torch

        return torch.cuda.get_device_name(torch.cuda.current_device())
    return platform.processor() or platform.machine() or "cpu"


def _resolve_peak(
    device: str, device_name: str, gpu: str | None, peak_tflops: float | None, bandwidth_tbps: float | None
) -> tuple[Any | None, str | None]:
    """(peak, reason when None). On CPU only the flags give a peak."""
    from diagnose.hardware import peak_from_overrides

    peak = peak_from_overrides(
        gpu=gpu,
        peak_tflops=peak_tflops,
        bandwidth_tbps=bandwidth_tbps,
        device_name=device_name if device == "cuda" else "",
    )
    if peak is not None:
        return peak, None
    what = f"device {device_name!r}" if device == "cuda" else f"CPU device {device_name!r}"
    return None, _NO_PEAK_REASON.format(what=what)


def _peak_json(peak: Any | None) -> dict | None:
    """The peak as the JSON report's ``gpu`` object (:meth:`GpuPeak.to_dict`), or None."""
    return None if peak is None else peak.to_dict()


def _row(
    scenario: str,
    batch: int,
    prompt_len: int | None,
    context: int | None,
    analytic: dict,
    samples_ns: list[int] | None,
    error: str | None,
    peak: Any | None,
    no_peak_reason: str | None,
    warmup: int,
) -> dict:
    stats = time_stats_ms(samples_ns) if samples_ns else None
    p50_s = stats["p50"] / 1e3 if stats else None
    if p50_s:
        tokens = prompt_len * batch if scenario == "prefill" else batch
        tok_s = tokens / p50_s
    else:
        tok_s = None
    row = {
        "scenario": scenario,
        "batch": batch,
        "prompt_len": prompt_len,
        "context": context,
        "status": "ok" if error is None else "oom",
        "error": error,
        "warmup": warmup,
        "iters": len(samples_ns) if samples_ns else 0,
        "time_ms": stats,
        "samples_ms": [s / 1e6 for s in samples_ns] if samples_ns else [],
        "tokens_per_s": tok_s,
        **analytic,
    }
    row.update(attainment(p50_s, analytic["flops"], analytic["bytes"], peak, no_peak_reason))
    return row


def run_bench(
    config: dict | None = None,
    model_path: str | None = None,
    device: str = "cpu",
    dtype: str | None = None,
    prompt_lens: Sequence[int] = DEFAULT_PROMPT_LENS,
    batches: Sequence[int] = DEFAULT_BATCHES,
    contexts: Sequence[int] = DEFAULT_CONTEXTS,
    warmup: int = DEFAULT_WARMUP,
    iters: int = DEFAULT_ITERS,
    gpu: str | None = None,
    peak_tflops: float | None = None,
    bandwidth_tbps: float | None = None,
    perplexity_text: str | None = None,
    out: str | None = None,
    seed: int = 0,
    config_label: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> dict:
    """Time prefill and decode rows and return (and optionally write) the results.

    Args:
        config: Hugging Face config dict (a preset); random weights from ``seed``.
        model_path: Local checkpoint directory (or hub id). Exactly one of
            config/model_path.
        device: ``"cpu"`` or ``"cuda"``.
        dtype: ``"fp32"``, ``"bf16"`` or ``"fp16"`` (weights, activations and KV cache);
            default fp32 on CPU, bf16 on CUDA.
        prompt_lens: Prompt lengths S of the prefill rows (batch 1).
        batches: Batch sizes B of the decode rows.
        contexts: KV-cache lengths C of the decode rows (every B x C pair is a row).
        warmup: Untimed iterations per row, >= 0.
        iters: Timed iterations per row, >= 1.
        gpu: GPU table row name for the peak (``diagnose.hardware.gpu_by_name``).
        peak_tflops: Dense FP16/BF16 peak override, TFLOP/s.
        bandwidth_tbps: Memory bandwidth override, TB/s.
        perplexity_text: Text file for perplexity (real weights only).
        out: Where to write the results JSON (atomically); None writes nothing.
        seed: Seed for weights and token ids.
        config_label: How the model was chosen, for the results (e.g. ``"preset:tiny"``).
        progress: Called with a short line before each row (e.g. ``click.echo`` to stderr).

    Returns:
        The results dict written to ``out``: ``schema``, ``schema_version``, ``date``
        (UTC), ``device``, ``device_name``, ``torch_version``, ``transformers_version``,
        ``config`` (source, dtype, model_config), ``model`` (params, weight and KV bytes),
        ``settings``, ``peak`` (or null, with ``peak_missing``), ``rows`` (prefill rows in
        ``prompt_lens`` order, then decode rows batch-major) and ``perplexity`` (or null).
        A row that ran out of memory has ``status: "oom"``, its ``error`` and null times.

    Raises:
        DiagnoseError: bad arguments, CUDA unavailable, unknown GPU, unloadable model or
            tokenizer.
    """
    if dtype is None:
        dtype = "bf16" if device == "cuda" else "fp32"
    validate_bench_args(config, model_path, device, dtype, prompt_lens, batches, contexts, warmup, iters, perplexity_text)
    from diagnose.hardware import peak_from_overrides

    peak_from_overrides(gpu=gpu, peak_tflops=peak_tflops, bandwidth_tbps=bandwidth_tbps)  # check flags early

    import torch
    import transformers

    from diagnose.collectors import torch_collector as tc

    if device == "cuda" and not torch.cuda.is_available():
        raise DiagnoseError("--device cuda requested but torch.cuda.is_available() is False")
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}[dtype]
    say = progress or (lambda _line: None)

    # Tokenize the perplexity text first: a missing tokenizer fails before the long part.
    ppl_ids = None
    if perplexity_text is not None and model_path is not None:
        ppl_ids = perplexity_token_ids(model_path, perplexity_text)

    torch.manual_seed(seed)
    model = _build(config, model_path, device, torch_dtype)
    hf_config = tc._jsonable(model.config.to_dict())
    label = config_label or (f"model:{model_path}" if model_path else "config")
    name = os.path.basename(os.path.normpath(model_path)) if model_path else label.split(":", 1)[-1]
    spec = ModelSpec.from_hf_config(hf_config, name=name)
    weight_dtype = kv_dtype = dtype

    device_name = _device_name(device)
    peak, no_peak_reason = _resolve_peak(device, device_name, gpu, peak_tflops, bandwidth_tbps)
    runner = _Runner(model, device, torch_dtype)
    gen = torch.Generator(device="cpu").manual_seed(seed)
    run = _RunSettings(device, warmup, iters, weight_dtype, kv_dtype, peak, no_peak_reason, say)
    with torch.inference_mode():
        rows = _prefill_rows(runner, gen, spec, prompt_lens, run) + _decode_rows(runner, gen, spec, batches, contexts, run)
    ppl = _perplexity(model, ppl_ids, perplexity_text, model_path, device, say)
    results = {
        "schema": BENCH_SCHEMA,
        "schema_version": BENCH_SCHEMA_VERSION,
        "date": _dt.datetime.now(_dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "device": device,
        "device_name": device_name,
        "torch_version": torch.__version__,
        "transformers_version": transformers.__version__,
        "config": {
            "source": label,
            "dtype": dtype,
            "weight_dtype": weight_dtype,
            "kv_dtype": kv_dtype,
            "model_config": hf_config,
        },
        "model": {"name": spec.name, "params_total": spec.params_total, "params_active_per_token": spec.params_active_per_token,
                  "weight_bytes": accounting.weight_bytes(spec, weight_dtype),
                  "kv_bytes_per_token": accounting.kv_bytes_per_token(spec, kv_dtype)},
        "settings": _settings(prompt_lens, batches, contexts, warmup, iters, seed, device),
        "peak": _peak_json(peak),
        "peak_missing": no_peak_reason,
        "rows": rows,
        "perplexity": ppl,
    }
    if out is not None:
        write_results(results, out)
    return results


def _build(config, model_path, device: str, torch_dtype):
    """The model (:func:`~diagnose.collectors.torch_collector._build_model`); out of memory
    while building it is one DiagnoseError line."""
    from diagnose.collectors import torch_collector as tc

    try:
        return tc._build_model(config, model_path, device, torch_dtype)
    except (RuntimeError, MemoryError) as exc:
        if not (isinstance(exc, MemoryError) or _is_oom(exc)):
            raise
        raise DiagnoseError(f"{device} out of memory while building the model: {tc._one_line(exc)}") from None


def _settings(prompt_lens, batches, contexts, warmup: int, iters: int, seed: int, device: str) -> dict:
    """The results' ``settings``: what was run and how it was timed."""
    return {
        "prompt_lens": list(prompt_lens),
        "batches": list(batches),
        "contexts": list(contexts),
        "warmup": warmup,
        "iters": iters,
        "seed": seed,
        "timer": "time.perf_counter_ns",
        "synchronize": "torch.cuda.synchronize() before each timestamp" if device == "cuda" else "none (CPU work is synchronous)",
        "percentiles": "numpy linear interpolation over the timed iterations",
        "derived_from": "p50",
        "prefill": "batch 1, fresh cache, LM head over all S positions; FLOPs use causal attention",
        "decode": "static KV cache of context+1 slots filled by a chunked prefill; every timed step runs at exactly `context` cached tokens",
        "units": {"time": "ms", "flops": "FLOP", "bytes": "B", "tflops": "1e12 FLOP/s", "tbps": "1e12 B/s"},
    }


@dataclass(frozen=True)
class _RunSettings:
    """What every timed row shares: device, warm-up and timed iterations, dtypes, the peak (or
    why there is none) and the progress callback."""

    device: str
    warmup: int
    iters: int
    weight_dtype: str
    kv_dtype: str
    peak: Any
    no_peak_reason: str | None
    say: Any


def _prefill_rows(runner: "_Runner", gen, spec: ModelSpec, prompt_lens, run: _RunSettings) -> list[dict]:
    """One timed prefill row per prompt length (batch 1, fresh cache); an OOM row says so."""
    from diagnose.collectors import torch_collector as tc

    rows: list[dict] = []
    for s in prompt_lens:
        run.say(f"prefill S={s}")
        ids = runner.ids(gen, 1, s)
        samples, error = None, None
        try:
            for _ in range(run.warmup):
                runner.prefill(ids)
            marker = tc.prefill_marker(1, s)
            run_once = functools.partial(runner.prefill, ids)
            samples = [runner.timed(run_once, marker) for _ in range(run.iters)]
        except (RuntimeError, MemoryError) as exc:
            if not (isinstance(exc, MemoryError) or _is_oom(exc)):
                raise
            error = f"{run.device} out of memory: {tc._one_line(exc)}"
            samples = None
        ids = run_once = None
        _free(run.device)
        rows.append(
            _row("prefill", 1, s, None, prefill_analytic(spec, s, run.weight_dtype, run.kv_dtype),
                 samples, error, run.peak, run.no_peak_reason, run.warmup)
        )
    return rows


def _decode_rows(runner: "_Runner", gen, spec: ModelSpec, batches, contexts, run: _RunSettings) -> list[dict]:
    """One timed decode row per (batch, context): a static cache filled to ``context`` tokens,
    every timed step at exactly that context (rewound after each); an OOM row says so."""
    from diagnose.collectors import torch_collector as tc

    rows: list[dict] = []
    for b in batches:
        for c in contexts:
            run.say(f"decode B={b} ctx={c}")
            samples, error, cache = None, None, None
            try:
                cache = runner.static_cache(b, c + 1)
                nxt = runner.fill(cache, runner.ids(gen, b, c))
                state = {"ids": nxt}

                def step() -> None:
                    state["ids"] = runner.decode(state["ids"], cache, c)

                def rewind() -> None:
                    _rewind(cache, c)

                for _ in range(run.warmup):
                    step()
                    rewind()
                marker = tc.decode_marker(b, c)
                samples = [runner.timed(step, marker, after=rewind) for _ in range(run.iters)]
            except (RuntimeError, MemoryError) as exc:
                if not (isinstance(exc, MemoryError) or _is_oom(exc)):
                    raise
                error = f"{run.device} out of memory: {tc._one_line(exc)}"
                samples = None
            cache = None
            _free(run.device)
            rows.append(
                _row("decode", b, None, c, decode_analytic(spec, b, c, run.weight_dtype, run.kv_dtype),
                     samples, error, run.peak, run.no_peak_reason, run.warmup)
            )
    return rows


def _perplexity(model, ppl_ids, perplexity_text: str | None, model_path: str | None, device: str, say) -> dict | None:
    """The perplexity entry of the results: None without text; a reason with random weights."""
    ppl = None
    if perplexity_text is not None:
        if model_path is None:
            ppl = {
                "value": None,
                "text": perplexity_text,
                "tokens": None,
                "window": None,
                "reason": "perplexity is meaningless with random weights (--config); pass --model PATH with real weights",
            }
        else:
            say("perplexity")
            ppl = perplexity_from_ids(model, ppl_ids, device)
            ppl["text"] = perplexity_text
    return ppl


def _free(device: str) -> None:
    import gc

    gc.collect()
    if device == "cuda":
        import torch

        torch.cuda.empty_cache()


def write_results(results: dict, out: str) -> None:
    """Write ``results`` as indented JSON to ``out`` atomically (parents created)."""
    out_dir = os.path.dirname(os.path.abspath(out))
    os.makedirs(out_dir, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out_dir, prefix=".diagnose-bench-", suffix=".json")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(results, fh, indent=2, allow_nan=False)
            fh.write("\n")
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        os.replace(tmp, out)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _num(x: float | None, spec: str = "{:.3f}") -> str:
    return fmt.NA if x is None else spec.format(x)


def results_table(results: dict) -> Any:
    """A rich Table of the rows, laid out like docs/prefill-decode.md section 4."""
    from rich.table import Table

    peak = results.get("peak")
    title = f"{results['config']['source']} {results['config']['dtype']} on {results['device_name']} ({results['device']})"
    table = Table(title=title, title_justify="left")
    for col, justify in (
        ("scenario", "left"),
        ("parameters", "left"),
        ("time p50 (ms)", "right"),
        ("time p99 (ms)", "right"),
        ("derived", "right"),
        ("MFU / MBU", "right"),
        ("bound (ms)", "right"),
        ("ratio", "right"),
    ):
        table.add_column(col, justify=justify)
    for r in results["rows"]:
        if r["scenario"] == "prefill":
            params = f"S={r['prompt_len']}"
        else:
            params = f"B={r['batch']}, ctx {fmt.tokens(r['context'])}"
        if r["status"] != "ok":
            table.add_row(r["scenario"], params, "OOM", "OOM", fmt.NA, fmt.NA, _num(r["bound_ms"], "{:.4g}"), fmt.NA)
            continue
        t = r["time_ms"]
        if r["scenario"] == "prefill":
            derived = f"{r['achieved_tflops']:.3g} TFLOP/s"
            att = f"MFU {fmt.pct(r['mfu'])}" if r["mfu"] is not None else fmt.NA
        else:
            derived = f"{r['tokens_per_s']:,.0f} tok/s"
            att = f"MBU {fmt.pct(r['mbu'])}" if r["mbu"] is not None else fmt.NA
        ratio = fmt.NA if r["bound_ratio"] is None else f"{r['bound_ratio']:.2f}x"
        bound = fmt.NA if r["bound_ms"] is None else f"{r['bound_ms']:.4g} ({r['bound']})"
        table.add_row(r["scenario"], params, f"{t['p50']:.3f}", f"{t['p99']:.3f}", derived, att, bound, ratio)
    if peak is None:
        table.caption = f"MFU/MBU/bound skipped: {results.get('peak_missing')}"
    else:
        table.caption = (
            f"peak {peak['name']}: {_num(peak['peak_tflops'], '{:g}')} TFLOP/s dense FP16/BF16, "
            f"{_num(peak['peak_tbps'], '{:g}')} TB/s; derived numbers use p50"
        )
    return table
