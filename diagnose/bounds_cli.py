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
    KvPlan,
    ModelSpec,
    bounds_table,
    default_kv_dtype,
    kv_plan,
    load_model_config,
    read_model_config,
    shipped_model_configs,
)
from diagnose.clitypes import MAX_BATCH, MAX_TOKENS, NON_NEGATIVE_FINITE, POSITIVE_FINITE, POSITIVE_INT_LIST
from diagnose.inputs import MODEL_SIZE_BOUNDS
from diagnose.errors import DiagnoseError
from diagnose.hardware import peak_from_overrides
from diagnose.report import fmt

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
    try:
        spec = load_model_config(model_config) if model_config else None
        plan = kv_plan(spec, seq_len, batch, layers=layers, kv_heads=kv_heads, head_dim=head_dim,
                       bytes_per_elem=bytes_per_elem, weight_dtype=weight_dtype, tp=tp, memory_gb=memory_gb,
                       overhead_gb=overhead_gb, weights_gb=weights_gb, kv_memory_gib=kv_memory_gib)
    except DiagnoseError as exc:
        _fail(str(exc))
    if fmt.lower() == "json":
        click.echo(json.dumps(plan.to_dict(), indent=2))
        return
    for n in plan.notes:
        click.echo(f"note: {n}", err=True)
    _print_kv(plan)


def _print_kv(plan: KvPlan) -> None:
    """The KV budget as a rich table (bytes, GB, GiB) and the concurrency line."""
    budget, seq_len, batch = plan.budget, plan.budget.seq_len, plan.budget.batch
    console = _console()
    table = Table(title="KV-cache budget", show_header=True)
    table.add_column("quantity")
    table.add_column("bytes", justify="right")
    table.add_column("GB (1e9 B)", justify="right")
    table.add_column("GiB (2^30 B)", justify="right")
    table.add_row(
        f"KV per token (2 x {plan.layers} x {plan.kv_heads_per_rank} x {plan.head_dim} x {plan.bytes_per_elem:g} B)"
        if plan.kv_heads_per_rank is not None and not plan.mla
        else f"KV per token (MLA latent, {plan.bytes_per_elem:g} B per element)",
        f"{budget.kv_bytes_per_token:,}",
        f"{budget.kv_bytes_per_token / GB:.6f}",
        f"{budget.kv_bytes_per_token / GiB:.6f}",
    )
    table.add_row(
        f"KV per sequence ({seq_len:,} tokens)",
        f"{budget.kv_bytes_per_sequence:,}",
        fmt.gb(budget.kv_bytes_per_sequence),
        fmt.gib(budget.kv_bytes_per_sequence),
    )
    table.add_row(
        f"KV for batch {batch}",
        f"{budget.kv_bytes_total:,}",
        fmt.gb(budget.kv_bytes_total),
        fmt.gib(budget.kv_bytes_total),
    )
    if budget.weight_bytes:
        table.add_row("weights", f"{budget.weight_bytes:,}", fmt.gb(budget.weight_bytes), fmt.gib(budget.weight_bytes))
    if budget.kv_memory_bytes is not None:
        table.add_row(
            "memory left for KV",
            f"{budget.kv_memory_bytes:,}",
            fmt.gb(budget.kv_memory_bytes),
            fmt.gib(budget.kv_memory_bytes),
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
        result = bounds_table(spec, peak, batches, context, prompt_lens, weight_dtype, kv_dtype, lm_head, tp, kv_source)
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
    mt.add_row(f"weight bytes ({m['weight_format']})", f"{m['weight_bytes']:,}", fmt.gb(m["weight_bytes"]), fmt.gib(m["weight_bytes"]))
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
        row = [str(d["batch"]), f"{d['context']:,}", fmt.gb(d["weight_bytes"])]
        if moe is not None:
            row.append(f"{d['experts_touched_per_layer']:.2f} of {moe['num_experts']}")
        row += [
            fmt.gb(d["kv_read_bytes"]),
            fmt.gb(d["bytes_per_step"]),
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
