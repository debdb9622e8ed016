"""Click commands for analytic bounds: ``diagnose kv-budget`` and ``diagnose bounds``.

Thin wrappers over :mod:`diagnose.accounting`, :mod:`diagnose.roofline` and
:mod:`diagnose.hardware`. Both commands print either rich tables (units in every column
header; GB = 1e9 bytes, GiB = 2**30) or JSON. ``--model-config`` takes a ``config.json``
path or the name of a shipped config (``diagnose bounds --help`` lists them). Bad input
(missing or unreadable config, non-JSON, missing keys, an unsupported config key, unknown
GPU, bad numbers) prints one ``error: ...`` line on stderr and exits with status 2, never a
traceback.

The commands are exported as :data:`kv_budget_command` and :data:`bounds_command` for the
main group to register. :func:`load_model_config` is re-exported from
:mod:`diagnose.accounting` for callers that still import it from here.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, NoReturn

import click
from rich.console import Console
from rich.table import Table

from diagnose.accounting import (
    DTYPE_BITS,
    FRAGMENTATION_FACTOR,
    GB,
    GiB,
    KiB,
    ModelSpec,
    decode_step,
    experts_touched,
    kv_budget,
    kv_bytes_per_token,
    kv_layout,
    load_model_config,
    model_weights,
    read_model_config,
    prefill_bytes,
    prefill_flops,
    shipped_model_configs,
)
from diagnose.clitypes import MAX_BATCH, MAX_TOKENS, NON_NEGATIVE_FINITE, POSITIVE_FINITE, POSITIVE_INT_LIST
from diagnose.inputs import MODEL_SIZE_BOUNDS
from diagnose.errors import DiagnoseError
from diagnose.hardware import GpuPeak, peak_from_overrides
from diagnose.roofline import roofline

__all__ = ["bounds_command", "kv_budget_command", "load_model_config"]

_DTYPES = click.Choice(sorted(DTYPE_BITS), case_sensitive=False)
_FORMATS = click.Choice(["text", "json"], case_sensitive=False)


def _fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit with status 2."""
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(2)


def _model_config_help(what: str) -> str:
    return f"Hugging Face config.json, or a shipped config name ({', '.join(shipped_model_configs())}): {what}"


def _console() -> Console:
    console = Console(file=sys.stdout)
    if not console.is_terminal:
        console = Console(file=sys.stdout, width=200, color_system=None)
    return console


def _gb(n: float) -> str:
    return f"{n / GB:,.2f}"


def _gib(n: float) -> str:
    return f"{n / GiB:,.3f}"


# -- kv-budget ----------------------------------------------------------------------


@click.command("kv-budget")
@click.option("--layers", type=click.IntRange(min=1, max=MODEL_SIZE_BOUNDS["num_hidden_layers"]), help="num_hidden_layers L (or from --model-config).")
@click.option("--kv-heads", type=click.IntRange(min=1, max=MODEL_SIZE_BOUNDS["num_key_value_heads"]), help="num_key_value_heads n_kv (or from --model-config).")
@click.option("--head-dim", type=click.IntRange(min=1, max=MODEL_SIZE_BOUNDS["head_dim"]), help="head_dim d (or from --model-config).")
@click.option("--seq-len", type=click.IntRange(min=1, max=MAX_TOKENS), required=True, help="Tokens per sequence (prompt + output).")
@click.option("--batch", type=click.IntRange(min=1, max=MAX_BATCH), default=1, show_default=True, help="Concurrent sequences.")
@click.option(
    "--bytes-per-elem",
    type=POSITIVE_FINITE,
    default=2.0,
    show_default=True,
    help="KV element size in bytes: 2 fp16/bf16, 1 int8/fp8, 0.5 int4.",
)
@click.option(
    "--model-config",
    type=str,
    help=_model_config_help("gives the KV layout (GQA, MLA, sliding windows) and the weight bytes."),
)
@click.option(
    "--weight-dtype",
    type=_DTYPES,
    default=None,
    help="Weight dtype for the weight bytes of --model-config [default: the config's quantization_config, else bf16].",
)
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor-parallel size: KV heads and weights per rank (vLLM sharding).")
@click.option("--memory-gb", type=POSITIVE_FINITE, help="Device memory in GB (1e9 bytes).")
@click.option(
    "--overhead-gb",
    type=NON_NEGATIVE_FINITE,
    default=0.0,
    show_default=True,
    help="Runtime overhead in GB (1e9): CUDA context, activations, allocator slack.",
)
@click.option("--weights-gb", type=NON_NEGATIVE_FINITE, help="Weight bytes in GB (1e9) when no --model-config.")
@click.option(
    "--kv-memory-gib",
    type=POSITIVE_FINITE,
    help="Memory for the KV cache in GiB (2^30), instead of --memory-gb arithmetic.",
)
@click.option("--format", "fmt", type=_FORMATS, default="text", show_default=True)
def kv_budget_command(
    layers: int | None,
    kv_heads: int | None,
    head_dim: int | None,
    seq_len: int,
    batch: int,
    bytes_per_elem: float,
    model_config: str | None,
    weight_dtype: str | None,
    tp: int,
    memory_gb: float | None,
    overhead_gb: float,
    weights_gb: float | None,
    kv_memory_gib: float | None,
    fmt: str,
) -> None:
    """KV-cache bytes per token and per batch, and how many sequences fit.

    KV bytes per token = 2 * L * n_kv * d * bytes per element (docs/prefill-decode.md section 2); from
    --model-config, MLA layers cache kv_lora_rank + qk_rope_head_dim per token and
    sliding-window layers hold at most their window of each sequence. With --tp, per rank:
    max(1, n_kv / tp) KV heads. With --memory-gb (or --kv-memory-gib): concurrency ceiling =
    floor(KV memory / KV per sequence), usable = floor(0.75 * ceiling) after fragmentation
    (docs/prefill-decode.md section 3).
    """
    notes: list[str] = []
    try:
        spec = load_model_config(model_config) if model_config else None
        shape_flags = any(v is not None for v in (layers, kv_heads, head_dim))
        if spec is not None:
            layers = spec.num_hidden_layers if layers is None else layers
            kv_heads = spec.num_key_value_heads if kv_heads is None else kv_heads
            head_dim = spec.head_dim if head_dim is None else head_dim
        missing = [f for f, v in (("--layers", layers), ("--kv-heads", kv_heads), ("--head-dim", head_dim)) if v is None]
        if missing:
            _fail(f"give {', '.join(missing)} or --model-config")
        for flag, value in (("--layers", layers), ("--kv-heads", kv_heads), ("--head-dim", head_dim)):
            if value <= 0:
                _fail(f"{flag} must be > 0, got {value}")
        if not bytes_per_elem > 0 or math.isinf(bytes_per_elem):
            _fail(f"--bytes-per-elem must be > 0, got {bytes_per_elem}")
        if spec is not None and weights_gb is not None:
            _fail("give --weights-gb or --model-config, not both")
        if weights_gb is not None and weights_gb < 0:
            _fail(f"--weights-gb must be >= 0, got {weights_gb}")
        if kv_memory_gib is not None and not kv_memory_gib > 0:
            _fail(f"--kv-memory-gib must be > 0, got {kv_memory_gib}")
        if weight_dtype is not None and spec is None:
            _fail("--weight-dtype needs --model-config")
        per_seq: int | None = None
        if spec is not None and not shape_flags:
            lay = kv_layout(spec, tp)
            per_token = math.ceil(lay.elements_per_token * bytes_per_elem)
            if lay.sliding:
                per_seq = math.ceil(lay.sequence_elements(seq_len) * bytes_per_elem)
                windows = ", ".join(str(w) for w, _ in lay.sliding)
                notes.append(f"{spec.num_sliding_layers} sliding-window layers (window {windows}) hold at most their window of each sequence")
            kv_heads_rank = None if spec.mla is not None else max(1, kv_heads // tp)
            if spec.mla is not None:
                notes.append("MLA: kv_lora_rank + qk_rope_head_dim elements per token and layer (--kv-heads/--head-dim do not apply)")
        else:
            if tp > 1 and kv_heads % tp and tp % kv_heads:
                _fail(f"--tp {tp}: --kv-heads {kv_heads} and {tp} do not divide one another")
            kv_heads_rank = max(1, kv_heads // tp)
            per_token = math.ceil(2 * layers * kv_heads_rank * head_dim * bytes_per_elem)
            if spec is not None and (spec.mla is not None or spec.layer_windows):
                notes.append("shape flags given: every layer counted as full GQA attention with those shapes")
        if spec is not None:
            w_bytes = model_weights(spec, weight_dtype, tp).bytes
        else:
            w_bytes = round((weights_gb or 0.0) * GB)
        budget = kv_budget(
            per_token,
            seq_len,
            batch,
            memory_gb=memory_gb,
            overhead_gb=overhead_gb,
            weight_bytes=w_bytes,
            kv_memory_bytes=None if kv_memory_gib is None else round(kv_memory_gib * GiB),
            kv_bytes_per_sequence=per_seq,
        )
    except DiagnoseError as exc:
        _fail(str(exc))

    result: dict[str, Any] = {
        "model": spec.name if spec else None,
        "layers": layers,
        "kv_heads": kv_heads,
        "kv_heads_per_rank": kv_heads_rank,
        "head_dim": head_dim,
        "tp": tp,
        "bytes_per_elem": bytes_per_elem,
        "kv_bytes_per_token": budget.kv_bytes_per_token,
        "seq_len": budget.seq_len,
        "batch": budget.batch,
        "kv_bytes_per_sequence": budget.kv_bytes_per_sequence,
        "kv_bytes_total": budget.kv_bytes_total,
        "kv_gib_per_sequence": budget.kv_gib_per_sequence,
        "kv_gib_total": budget.kv_gib_total,
        "memory_gb": budget.memory_gb,
        "overhead_gb": budget.overhead_gb,
        "weight_bytes": budget.weight_bytes,
        "weight_dtype": (weight_dtype.lower() if weight_dtype else model_weights(spec, None, tp).weight_format) if spec else None,
        "kv_memory_bytes": budget.kv_memory_bytes,
        "kv_memory_gib": budget.kv_memory_gib,
        "max_sequences": budget.max_sequences,
        "usable_sequences": budget.usable_sequences,
        "fragmentation_factor": budget.fragmentation_factor,
        "fits": budget.fits,
    }
    if memory_gb is not None and spec is None and weights_gb is None and kv_memory_gib is None:
        notes.append("no weights subtracted from --memory-gb: give --model-config or --weights-gb")
    if kv_memory_gib is not None and memory_gb is not None:
        notes.append("--kv-memory-gib given: --memory-gb/--overhead-gb/weights are not used for the KV memory")
    result["notes"] = notes
    if fmt.lower() == "json":
        click.echo(json.dumps(result, indent=2))
        return
    for n in notes:
        click.echo(f"note: {n}", err=True)

    console = _console()
    table = Table(title="KV-cache budget", show_header=True)
    table.add_column("quantity")
    table.add_column("bytes", justify="right")
    table.add_column("GB (1e9 B)", justify="right")
    table.add_column("GiB (2^30 B)", justify="right")
    table.add_row(
        f"KV per token (2 x {layers} x {kv_heads_rank} x {head_dim} x {bytes_per_elem:g} B)"
        if kv_heads_rank is not None and not (spec is not None and spec.mla is not None)
        else f"KV per token (MLA latent, {bytes_per_elem:g} B per element)",
        f"{budget.kv_bytes_per_token:,}",
        f"{budget.kv_bytes_per_token / GB:.6f}",
        f"{budget.kv_bytes_per_token / GiB:.6f}",
    )
    table.add_row(
        f"KV per sequence ({seq_len:,} tokens)",
        f"{budget.kv_bytes_per_sequence:,}",
        _gb(budget.kv_bytes_per_sequence),
        _gib(budget.kv_bytes_per_sequence),
    )
    table.add_row(
        f"KV for batch {batch}",
        f"{budget.kv_bytes_total:,}",
        _gb(budget.kv_bytes_total),
        _gib(budget.kv_bytes_total),
    )
    if budget.weight_bytes:
        table.add_row("weights", f"{budget.weight_bytes:,}", _gb(budget.weight_bytes), _gib(budget.weight_bytes))
    if budget.kv_memory_bytes is not None:
        table.add_row(
            "memory left for KV",
            f"{budget.kv_memory_bytes:,}",
            _gb(budget.kv_memory_bytes),
            _gib(budget.kv_memory_bytes),
        )
    console.print(table)
    if budget.max_sequences is not None:
        console.print(
            f"Concurrency ceiling: {budget.max_sequences} sequences of {seq_len:,} tokens "
            f"(floor of KV memory / KV per sequence); about {budget.usable_sequences} usable "
            f"after fragmentation (x{FRAGMENTATION_FACTOR:g}, rounded down). "
            f"Batch {batch} {'fits' if budget.fits else 'does NOT fit'}."
        )
    else:
        console.print("Give --memory-gb (or --kv-memory-gib) for the concurrency ceiling.")


# -- bounds -------------------------------------------------------------------------


#: Hugging Face ``torch_dtype`` / ``dtype`` values -> the KV-cache dtype a serving engine uses
#: with its default kv_cache_dtype "auto" (the model's dtype).
_CONFIG_DTYPES = {"float16": "fp16", "half": "fp16", "bfloat16": "bf16", "float32": "fp32", "float": "fp32"}


def default_kv_dtype(cfg: dict[str, Any], spec: ModelSpec) -> tuple[str, str]:
    """KV-cache dtype when ``--kv-dtype`` is not given, and where it came from: the config's
    KV scheme (``quantization_config.kv_cache_scheme``), else the model's dtype
    (``torch_dtype``, or ``dtype`` as transformers >= 4.56 writes it; a multimodal wrapper's
    ``text_config`` too), as vLLM's ``kv_cache_dtype="auto"`` does, else fp16.

    Returns:
        (dtype, source), e.g. ("bf16", "config torch_dtype").
    """
    if spec.quantization is not None and spec.quantization.kv_dtype:
        return spec.quantization.kv_dtype, "config quantization_config"
    for where in (cfg, cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else {}):
        for key in ("torch_dtype", "dtype"):
            v = _CONFIG_DTYPES.get(str(where.get(key, "")).lower().removeprefix("torch."))
            if v is not None:
                return v, f"config {key}"
    return "fp16", "default (the config names no dtype)"


def _model_json(spec: ModelSpec, weight_dtype: str | None, kv_dtype: str | None, tp: int,
                kv_dtype_source: str | None = None) -> dict[str, Any]:
    w = model_weights(spec, weight_dtype, tp)
    out: dict[str, Any] = {
        "name": spec.name,
        "num_hidden_layers": spec.num_hidden_layers,
        "hidden_size": spec.hidden_size,
        "num_attention_heads": spec.num_attention_heads,
        "num_key_value_heads": spec.num_key_value_heads,
        "head_dim": spec.head_dim,
        "intermediate_size": spec.intermediate_size,
        "vocab_size": spec.vocab_size,
        "tie_word_embeddings": spec.tie_word_embeddings,
        "params_attention_per_layer": spec.params_attention_per_layer,
        "params_mlp_per_layer": spec.params_mlp_per_layer,
        "params_per_layer": spec.params_per_layer,
        "params_body": spec.params_body,
        "params_embedding": spec.params_embedding,
        "params_total": spec.params_total,
        "params_active_per_token": spec.params_active_per_token,
        "params_mtp": spec.params_mtp,
        "moe": None,
        "attention": "mla" if spec.mla is not None else "gqa",
        "sliding_layers": spec.num_sliding_layers,
        "sliding_windows": sorted({x for x in spec.layer_windows if x is not None}),
        "tp": tp,
        "params_per_rank": w.params,
        "weight_dtype": weight_dtype or ("bf16" if spec.quantization is None else spec.quantization.method),
        "weight_format": w.weight_format,
        "weight_bytes": w.bytes,
        "kv_dtype": kv_dtype or "fp16",
        "kv_dtype_source": kv_dtype_source,
        "kv_bytes_per_token": kv_bytes_per_token(spec, kv_dtype, tp=tp),
    }
    if spec.moe is not None:
        out["moe"] = {
            "num_experts": spec.moe.num_experts,
            "num_experts_per_tok": spec.moe.num_experts_per_tok,
            "moe_intermediate_size": spec.moe.expert_intermediate_size,
            "shared_expert_intermediate_size": spec.moe.shared_intermediate_size,
            "moe_layers": spec.num_moe_layers,
            "params_expert": spec.params_expert,
            "params_experts": spec.params_experts,
            "expert_bytes_per_rank": w.expert_bytes,
        }
    return out


def _assumptions(spec: ModelSpec, tp: int) -> list[str]:
    out = []
    if spec.moe is not None:
        out.append(
            "MoE: experts touched per layer = E * (1 - (1 - k/E)^B) for B tokens: uniform, independent routing, "
            "which maximises the experts touched, so skewed real routing reads less than this figure"
        )
    if spec.layer_windows:
        out.append("sliding-window layers read min(context, window) tokens of KV per sequence")
    if spec.mla is not None:
        out.append("MLA: KV cache kv_lora_rank + qk_rope_head_dim per token and layer; attention FLOPs in the "
                   "per-head (non-absorbed) form")
    if spec.quantization is not None:
        out.append("quantization_config: block/channel scales of fp8 are not counted; AWQ/GPTQ add (16 + bits) bits per group")
    if spec.mtp_layers:
        out.append(f"num_nextn_predict_layers = {spec.mtp_layers}: the multi-token-prediction layer(s) "
                   f"({spec.params_mtp:,} params) are not counted: they run only for MTP speculative decoding")
    if tp > 1:
        out.append(f"tensor parallel {tp}: bytes and FLOPs of one rank (vLLM sharding: attention, MLP and expert widths "
                   "split, KV heads max(1, n_kv / tp), vocab-parallel embedding and LM head, routers replicated); "
                   "communication not counted")
    out.append("decode reads the whole embedding table once per step (the article's convention)")
    return out


def _bounds_result(
    spec: ModelSpec,
    peak: GpuPeak,
    batches: list[int],
    context: int,
    prompt_lens: list[int],
    weight_dtype: str | None,
    kv_dtype: str | None,
    lm_head: str,
    tp: int = 1,
    kv_dtype_source: str | None = None,
) -> dict[str, Any]:
    """Everything ``diagnose bounds`` reports, as a JSON-ready dict."""
    tflops = peak.dense_fp16_tflops
    tbps = peak.memory_bandwidth_tbps
    assert tflops is not None and tbps is not None

    def decode_row(batch: int, ctx: int) -> dict[str, Any]:
        step = decode_step(spec, batch, ctx, weight_dtype, kv_dtype, tp=tp)
        memory_ms = step.bytes_per_step / (tbps * 1e12) * 1e3
        compute_ms = step.flops_per_step / (tflops * 1e12) * 1e3
        roof = roofline(step.flops_per_step, step.bytes_per_step, None, peak, rounded=False)
        assert roof.bound_s is not None
        step_ms = roof.bound_s * 1e3
        return {
            "batch": batch,
            "context": ctx,
            "weight_bytes": step.weight_bytes,
            "expert_read_bytes": step.expert_read_bytes,
            "experts_touched_per_layer": step.experts_touched_per_layer,
            "kv_read_bytes": step.kv_read_bytes,
            "bytes_per_step": step.bytes_per_step,
            "bytes_per_step_gb": step.bytes_per_step / GB,
            "flops_per_step": step.flops_per_step,
            "memory_ms": memory_ms,
            "compute_ms": compute_ms,
            "step_ms": step_ms,
            "tokens_per_s": batch / (step_ms / 1e3),
            "per_token_ms": step_ms / batch,
            "arithmetic_intensity": roof.arithmetic_intensity,
            "bound": roof.bound,
        }

    decode = [decode_row(b, context) for b in batches]
    floor = decode_row(1, 0)

    prefill = []
    for s in prompt_lens:
        f = prefill_flops(spec, s, 1, lm_head, tp=tp)  # type: ignore[arg-type]
        moved = prefill_bytes(spec, s, 1, weight_dtype, kv_dtype, tp=tp)
        memory_ms = moved / (tbps * 1e12) * 1e3
        causal_ms = f.flops_total_causal / (tflops * 1e12) * 1e3
        full_ms = f.flops_total_full / (tflops * 1e12) * 1e3
        causal = roofline(f.flops_total_causal, moved, None, peak, rounded=False)
        full = roofline(f.flops_total_full, moved, None, peak, rounded=False)
        assert causal.bound_s is not None and full.bound_s is not None
        touched = None
        if spec.moe is not None:
            touched = experts_touched(spec.moe.num_experts, spec.moe.num_experts_per_tok, s)
        prefill.append(
            {
                "prompt_len": s,
                "batch": 1,
                "lm_head": lm_head,
                "flops_linear": f.flops_linear,
                "flops_lm_head": f.flops_lm_head,
                "flops_attention_causal": f.flops_attention_causal,
                "flops_attention_full": f.flops_attention_full,
                "flops_total_causal": f.flops_total_causal,
                "flops_total_full": f.flops_total_full,
                "flops_2p_total": f.flops_2p_total,
                "attention_share_causal": f.attention_share_causal,
                "attention_share_full": f.attention_share_full,
                "bytes_moved": moved,
                "experts_touched_per_layer": touched,
                "compute_ms_causal": causal_ms,
                "compute_ms_full": full_ms,
                "memory_ms": memory_ms,
                "bound_ms": causal.bound_s * 1e3,
                "bound_ms_full": full.bound_s * 1e3,
                "arithmetic_intensity_causal": causal.arithmetic_intensity,
                "arithmetic_intensity_full": full.arithmetic_intensity,
            }
        )

    return {
        "model": _model_json(spec, weight_dtype, kv_dtype, tp, kv_dtype_source),
        "gpu": peak.to_dict(),
        "conventions": {
            "units": "GB = 1e9 B, GiB = 2^30 B, TB/s = 1e12 B/s, TFLOP/s = 1e12 FLOP/s",
            "peak": "dense FP16/BF16 tensor-core peak (prefill runs in 16 bit whatever the weight dtype)",
            "per_rank": f"every byte and FLOP is one tensor-parallel rank's (--tp {tp})",
            "decode_bytes": "every non-expert weight once (embedding table and LM head included) + per MoE layer "
            "E_touched * expert bytes, E_touched = E * (1 - (1 - k/E)^batch) + batch * context * KV bytes per token "
            "(sliding-window layers: min(context, window)) (docs/prefill-decode.md section 3)",
            "decode_flops": "2 * P * batch + 2 * n_h * (d_qk + d_v) per key read per layer; P = the parameters a token "
            "multiplies (params_total for a dense model, embedding included; MoE: top-k experts)",
            "decode_step": "max(bytes / bandwidth, FLOPs / peak); tokens/s = batch / step",
            "prefill_flops": "linear 2 * params_body_active * S; LM head 2 * H * V per position "
            f"({lm_head}); attention full = L * 2 * (2 * n_h * d * S^2), causal = full / 2 "
            "(sliding layers: S * W full, W * S - W^2 / 2 causal)",
            "prefill_bytes": "weights read (MoE: experts touched by S tokens) + S * KV bytes per token "
            "(activations not counted)",
            "prefill_bound": "bound_ms = max(causal FLOPs / peak, bytes / bandwidth); "
            "bound_ms_full uses full-attention FLOPs",
        },
        "assumptions": _assumptions(spec, tp),
        "decode_weights_only": {"step_ms": floor["step_ms"], "tokens_per_s": floor["tokens_per_s"]},
        "decode": decode,
        "prefill": prefill,
    }


@click.command("bounds")
@click.option("--model-config", type=str, required=True, help=_model_config_help("the model to bound."))
@click.option("--gpu", type=str, help="GPU row name (e.g. H100-SXM, A100-80GB-SXM, MI300X).")
@click.option("--peak-tflops", type=POSITIVE_FINITE, help="Dense FP16/BF16 peak in TFLOP/s (1e12); overrides --gpu.")
@click.option("--bandwidth-tbps", type=POSITIVE_FINITE, help="Memory bandwidth in TB/s (1e12 B/s); overrides --gpu.")
@click.option("--batch", "batches", type=POSITIVE_INT_LIST, default="1,8,32,64,128", show_default=True,
              help="Decode batch sizes, comma-separated.")
@click.option("--context", type=click.IntRange(min=0, max=MAX_TOKENS), default=2048, show_default=True,
              help="Decode context (tokens in each sequence's cache).")
@click.option("--prompt-len", "prompt_lens", type=POSITIVE_INT_LIST, default="512,2048,8192", show_default=True,
              help="Prefill prompt lengths, comma-separated.")
@click.option("--weight-dtype", type=_DTYPES, default=None,
              help="Every weight in this dtype [default: the config's quantization_config, else bf16].")
@click.option("--kv-dtype", type=_DTYPES, default=None,
              help="KV-cache dtype [default: the config's kv_cache_scheme, else the model's dtype (torch_dtype), else fp16].")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tensor-parallel size: bounds of one rank (vLLM sharding).")
@click.option(
    "--lm-head",
    type=click.Choice(["all", "last"]),
    default="all",
    show_default=True,
    help="Prefill LM head on all positions (HF forward) or the last one (serving engines).",
)
@click.option("--format", "fmt", type=_FORMATS, default="text", show_default=True)
def bounds_command(
    model_config: str,
    gpu: str | None,
    peak_tflops: float | None,
    bandwidth_tbps: float | None,
    batches: list[int],
    context: int,
    prompt_lens: list[int],
    weight_dtype: str | None,
    kv_dtype: str | None,
    tp: int,
    lm_head: str,
    fmt: str,
) -> None:
    """Analytic lower bounds for decode steps and prefill passes of a model on a GPU.

    Decode step >= bytes per step / bandwidth; prefill >= FLOPs / peak (docs/prefill-decode.md
    section 3). MoE, quantization_config, sliding windows and MLA are read from the config
    (docs/model-accounting.md). Give --gpu NAME, or --peak-tflops and --bandwidth-tbps
    (which also override the row's figures).
    """
    weight_dtype = weight_dtype.lower() if weight_dtype else None
    kv_dtype = kv_dtype.lower() if kv_dtype else None
    try:
        cfg, cfg_name = read_model_config(model_config)
        spec = ModelSpec.from_hf_config(cfg, name=cfg_name)
        peak = peak_from_overrides(gpu=gpu, peak_tflops=peak_tflops, bandwidth_tbps=bandwidth_tbps)
        if peak is None:
            _fail("give --gpu NAME, or both --peak-tflops and --bandwidth-tbps")
        if peak.dense_fp16_tflops is None or peak.memory_bandwidth_tbps is None:
            _fail("give both --peak-tflops and --bandwidth-tbps (or --gpu NAME)")
        kv_source = "--kv-dtype"
        if kv_dtype is None:
            kv_dtype, kv_source = default_kv_dtype(cfg, spec)
        result = _bounds_result(spec, peak, batches, context, prompt_lens, weight_dtype, kv_dtype, lm_head, tp, kv_source)
    except DiagnoseError as exc:
        _fail(str(exc))

    if fmt.lower() == "json":
        click.echo(json.dumps(result, indent=2))
        return
    _print_bounds(result)


def _print_bounds(r: dict[str, Any]) -> None:
    console = _console()
    m, dev = r["model"], r["gpu"]
    moe = m["moe"]

    title = f"Model {m['name']}" + (f" (one of {m['tp']} tensor-parallel ranks)" if m["tp"] > 1 else "")
    mt = Table(title=title)
    mt.add_column("quantity")
    mt.add_column("count / bytes", justify="right")
    mt.add_column("GB (1e9 B)", justify="right")
    mt.add_column("GiB (2^30 B)", justify="right")
    mt.add_row("params: attention per layer", f"{m['params_attention_per_layer']:,}", "", "")
    if moe is None:
        mt.add_row("params: MLP per layer", f"{m['params_mlp_per_layer']:,}", "", "")
    else:
        mt.add_row(f"params: one expert (3 x H x {moe['moe_intermediate_size']})", f"{moe['params_expert']:,}", "", "")
        mt.add_row(f"params: experts ({moe['moe_layers']} MoE layers x {moe['num_experts']})", f"{moe['params_experts']:,}", "", "")
    mt.add_row(f"params: {m['num_hidden_layers']} layers", f"{m['params_body']:,}", "", "")
    head = "embedding (tied head)" if m["tie_word_embeddings"] else "embedding + LM head"
    mt.add_row(f"params: {head}", f"{m['params_embedding']:,}", "", "")
    mt.add_row("params: total", f"{m['params_total']:,}", "", "")
    mt.add_row("params: active per token (no embedding)", f"{m['params_active_per_token']:,}", "", "")
    if m["params_mtp"]:
        mt.add_row("params: MTP layers (not counted)", f"{m['params_mtp']:,}", "", "")
    mt.add_row(f"weight bytes ({m['weight_format']})", f"{m['weight_bytes']:,}", _gb(m["weight_bytes"]), _gib(m["weight_bytes"]))
    mt.add_row(
        f"KV bytes per token ({m['kv_dtype']}, {m['kv_dtype_source']})" if m.get("kv_dtype_source") else f"KV bytes per token ({m['kv_dtype']})",
        f"{m['kv_bytes_per_token']:,} ({m['kv_bytes_per_token'] / KiB:g} KiB)",
        "",
        "",
    )
    console.print(mt)

    over = ""
    if dev["overrides"] and dev["name"] != "custom":
        over = f" (flags override: {', '.join(dev['overrides'])})"
    chosen = f" Chosen by {dev['selection']}." if dev.get("selection") else ""
    console.print(
        f"Device {dev['name']}{over}: {dev['peak_tflops']:g} TFLOP/s dense FP16/BF16, "
        f"{dev['peak_tbps']:g} TB/s; ridge point {dev['ridge_flop_per_byte']:.1f} FLOP/B.{chosen} "
        f"Source: {dev['source']}",
        soft_wrap=True,
    )
    floor = r["decode_weights_only"]
    console.print(
        f"Weights-only decode bound (batch 1, no KV): {floor['step_ms']:.2f} ms/step, "
        f"{floor['tokens_per_s']:.1f} tok/s.",
        soft_wrap=True,
    )

    dt = Table(title="Decode step lower bound")
    cols = ["batch", "context (tokens)", "weights (GB)"]
    if moe is not None:
        cols.append("experts/layer")
    cols += ["KV read (GB)", "bytes/step (GB)", "step (ms)", "throughput (tok/s)", "per-token share (ms)",
             "AI (FLOP/B)", "bound"]
    for col in cols:
        dt.add_column(col, justify="right")
    for d in r["decode"]:
        row = [str(d["batch"]), f"{d['context']:,}", _gb(d["weight_bytes"])]
        if moe is not None:
            row.append(f"{d['experts_touched_per_layer']:.2f} of {moe['num_experts']}")
        row += [
            _gb(d["kv_read_bytes"]),
            _gb(d["bytes_per_step"]),
            f"{d['step_ms']:.2f}",
            f"{d['tokens_per_s']:,.0f}",
            f"{d['per_token_ms']:.2f}",
            f"{d['arithmetic_intensity']:.1f}",
            d["bound"],
        ]
        dt.add_row(*row)
    console.print(dt)

    pt = Table(title="Prefill lower bound (batch 1)")
    for col in (
        "prompt (tokens)",
        "linear (TFLOP)",
        "LM head (TFLOP)",
        "attn causal (TFLOP)",
        "attn full (TFLOP)",
        "attn share causal/full (%)",
        "bound causal (ms)",
        "bound full (ms)",
        "AI causal (FLOP/B)",
    ):
        pt.add_column(col, justify="right")
    for p in r["prefill"]:
        pt.add_row(
            f"{p['prompt_len']:,}",
            f"{p['flops_linear'] / 1e12:.2f}",
            f"{p['flops_lm_head'] / 1e12:.2f}",
            f"{p['flops_attention_causal'] / 1e12:.2f}",
            f"{p['flops_attention_full'] / 1e12:.2f}",
            f"{100 * p['attention_share_causal']:.1f} / {100 * p['attention_share_full']:.1f}",
            f"{p['bound_ms']:.2f}",
            f"{p['bound_ms_full']:.2f}",
            f"{p['arithmetic_intensity_causal']:,.0f}",
        )
    console.print(pt)

    console.print("Conventions:")
    for key, text in r["conventions"].items():
        console.print(f"  {key}: {text}", highlight=False, soft_wrap=True)
    console.print("Assumptions:")
    for text in r["assumptions"]:
        console.print(f"  - {text}", highlight=False, soft_wrap=True)
