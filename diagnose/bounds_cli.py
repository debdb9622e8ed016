"""Click commands for analytic bounds: ``diagnose kv-budget`` and ``diagnose bounds``.

Thin wrappers over :mod:`diagnose.accounting` and :mod:`diagnose.hardware`. Both commands
print either rich tables (units in every column header; GB = 1e9 bytes, GiB = 2**30) or
JSON. Bad input (missing or unreadable config, non-JSON, missing keys, unknown GPU, bad
numbers) prints one ``error: ...`` line on stderr and exits with status 2, never a
traceback.

The commands are exported as :data:`kv_budget_command` and :data:`bounds_command` for the
main group to register.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path
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
    kv_budget,
    kv_bytes_per_token,
    prefill_bytes,
    prefill_flops,
    ridge_point_flop_per_byte,
    weight_bytes,
)
from diagnose.errors import DiagnoseError
from diagnose.hardware import GpuPeak, peak_from_overrides

_DTYPES = click.Choice(sorted(DTYPE_BITS), case_sensitive=False)
_FORMATS = click.Choice(["text", "json"], case_sensitive=False)


def _fail(message: str) -> NoReturn:
    """Print ``error: message`` on stderr and exit with status 2."""
    click.echo(f"error: {message}", err=True)
    raise click.exceptions.Exit(2)


def load_model_config(path: str) -> ModelSpec:
    """Read a Hugging Face ``config.json`` and build a :class:`ModelSpec`.

    Raises:
        DiagnoseError: missing/unreadable file, not JSON, or missing keys.
    """
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise DiagnoseError(f"model config not found: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = getattr(exc, "strerror", None) or exc.__class__.__name__
        raise DiagnoseError(f"cannot read model config {path}: {reason}") from None
    try:
        cfg = json.loads(text)
    except json.JSONDecodeError as exc:
        raise DiagnoseError(f"model config {path} is not JSON: {exc.msg} at line {exc.lineno}") from None
    name = cfg.get("_name_or_path") if isinstance(cfg, dict) else None
    if not name:
        # ".../Qwen3-0.6B/config.json" -> "Qwen3-0.6B"; "qwen3_0_6b_config.json" -> its stem.
        name = p.parent.name if p.name == "config.json" and p.parent.name else p.stem
    return ModelSpec.from_hf_config(cfg, name=name)


def _int_list(value: str, flag: str, allow_zero: bool = False) -> list[int]:
    out: list[int] = []
    for part in value.split(","):
        part = part.strip()
        try:
            n = int(part)
        except ValueError:
            _fail(f"{flag} takes comma-separated integers, got {value!r}")
        if n < 0 or (n == 0 and not allow_zero):
            _fail(f"{flag} values must be {'>= 0' if allow_zero else '> 0'}, got {n}")
        out.append(n)
    return out


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
@click.option("--layers", type=int, help="num_hidden_layers L (or from --model-config).")
@click.option("--kv-heads", type=int, help="num_key_value_heads n_kv (or from --model-config).")
@click.option("--head-dim", type=int, help="head_dim d (or from --model-config).")
@click.option("--seq-len", type=int, required=True, help="Tokens per sequence (prompt + output).")
@click.option("--batch", type=int, default=1, show_default=True, help="Concurrent sequences.")
@click.option(
    "--bytes-per-elem",
    type=float,
    default=2.0,
    show_default=True,
    help="KV element size in bytes: 2 fp16/bf16, 1 int8/fp8, 0.5 int4.",
)
@click.option(
    "--model-config",
    type=str,
    help="Hugging Face config.json: gives L, n_kv, d and the weight bytes.",
)
@click.option(
    "--weight-dtype",
    type=_DTYPES,
    default="bf16",
    show_default=True,
    help="Weight dtype for the weight bytes of --model-config.",
)
@click.option("--memory-gb", type=float, help="Device memory in GB (1e9 bytes).")
@click.option(
    "--overhead-gb",
    type=float,
    default=0.0,
    show_default=True,
    help="Runtime overhead in GB (1e9): CUDA context, activations, allocator slack.",
)
@click.option("--weights-gb", type=float, help="Weight bytes in GB (1e9) when no --model-config.")
@click.option(
    "--kv-memory-gib",
    type=float,
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
    weight_dtype: str,
    memory_gb: float | None,
    overhead_gb: float,
    weights_gb: float | None,
    kv_memory_gib: float | None,
    fmt: str,
) -> None:
    """KV-cache bytes per token and per batch, and how many sequences fit.

    KV bytes per token = 2 * L * n_kv * d * bytes per element (domain.md section 2).
    With --memory-gb (or --kv-memory-gib): concurrency ceiling = floor(KV memory / KV per
    sequence), usable = floor(0.75 * ceiling) after fragmentation (domain.md section 3).
    """
    try:
        spec = load_model_config(model_config) if model_config else None
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
        elems = 2 * layers * kv_heads * head_dim
        per_token = math.ceil(elems * bytes_per_elem)
        if spec is not None:
            w_bytes = weight_bytes(spec, weight_dtype)
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
        )
    except DiagnoseError as exc:
        _fail(str(exc))

    result: dict[str, Any] = {
        "model": spec.name if spec else None,
        "layers": layers,
        "kv_heads": kv_heads,
        "head_dim": head_dim,
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
        "weight_dtype": weight_dtype.lower() if spec else None,
        "kv_memory_bytes": budget.kv_memory_bytes,
        "kv_memory_gib": budget.kv_memory_gib,
        "max_sequences": budget.max_sequences,
        "usable_sequences": budget.usable_sequences,
        "fragmentation_factor": budget.fragmentation_factor,
        "fits": budget.fits,
    }
    notes = []
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
        f"KV per token (2 x {layers} x {kv_heads} x {head_dim} x {bytes_per_elem:g} B)",
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


def _bounds_result(
    spec: ModelSpec,
    peak: GpuPeak,
    batches: list[int],
    context: int,
    prompt_lens: list[int],
    weight_dtype: str,
    kv_dtype: str,
    lm_head: str,
) -> dict[str, Any]:
    """Everything ``diagnose bounds`` reports, as a JSON-ready dict."""
    tflops = peak.dense_fp16_tflops
    tbps = peak.memory_bandwidth_tbps
    assert tflops is not None and tbps is not None
    ridge = ridge_point_flop_per_byte(tflops, tbps)
    w_bytes = weight_bytes(spec, weight_dtype)
    kv_tok = kv_bytes_per_token(spec, kv_dtype)

    def decode_row(batch: int, ctx: int) -> dict[str, Any]:
        step = decode_step(spec, batch, ctx, weight_dtype, kv_dtype)
        memory_ms = step.bytes_per_step / (tbps * 1e12) * 1e3
        compute_ms = step.flops_per_step / (tflops * 1e12) * 1e3
        step_ms = max(memory_ms, compute_ms)
        return {
            "batch": batch,
            "context": ctx,
            "weight_bytes": step.weight_bytes,
            "kv_read_bytes": step.kv_read_bytes,
            "bytes_per_step": step.bytes_per_step,
            "bytes_per_step_gb": step.bytes_per_step / GB,
            "flops_per_step": step.flops_per_step,
            "memory_ms": memory_ms,
            "compute_ms": compute_ms,
            "step_ms": step_ms,
            "tokens_per_s": batch / (step_ms / 1e3),
            "per_token_ms": step_ms / batch,
            "arithmetic_intensity": step.arithmetic_intensity,
            "bound": "memory" if memory_ms >= compute_ms else "compute",
        }

    decode = [decode_row(b, context) for b in batches]
    floor = decode_row(1, 0)

    prefill = []
    for s in prompt_lens:
        f = prefill_flops(spec, s, 1, lm_head)  # type: ignore[arg-type]
        moved = prefill_bytes(spec, s, 1, weight_dtype, kv_dtype)
        memory_ms = moved / (tbps * 1e12) * 1e3
        causal_ms = f.flops_total_causal / (tflops * 1e12) * 1e3
        full_ms = f.flops_total_full / (tflops * 1e12) * 1e3
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
                "compute_ms_causal": causal_ms,
                "compute_ms_full": full_ms,
                "memory_ms": memory_ms,
                "bound_ms": max(causal_ms, memory_ms),
                "bound_ms_full": max(full_ms, memory_ms),
                "arithmetic_intensity_causal": f.flops_total_causal / moved,
                "arithmetic_intensity_full": f.flops_total_full / moved,
            }
        )

    return {
        "model": {
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
            "weight_dtype": weight_dtype,
            "weight_bytes": w_bytes,
            "kv_dtype": kv_dtype,
            "kv_bytes_per_token": kv_tok,
        },
        "device": {
            "name": peak.name,
            "vendor": peak.vendor,
            "peak_tflops": tflops,
            "bandwidth_tbps": tbps,
            "memory_gb": peak.memory_gb,
            "ridge_flop_per_byte": ridge,
            "source": peak.source,
            "source_url": peak.source_url,
            "overrides": list(peak.overrides),
        },
        "conventions": {
            "units": "GB = 1e9 B, GiB = 2^30 B, TB/s = 1e12 B/s, TFLOP/s = 1e12 FLOP/s",
            "peak": "dense FP16/BF16 tensor-core peak (prefill runs in 16 bit whatever the weight dtype)",
            "decode_bytes": "weight bytes + batch * context * KV bytes per token (domain.md section 3)",
            "decode_flops": "2 * params_total * batch + 4 * n_h * d * context * L * batch",
            "decode_step": "max(bytes / bandwidth, FLOPs / peak); tokens/s = batch / step",
            "prefill_flops": "linear 2 * params_body * S; LM head 2 * H * V per position "
            f"({lm_head}); attention full = L * 2 * (2 * n_h * d * S^2), causal = full / 2",
            "prefill_bytes": "weight bytes + S * KV bytes per token (activations not counted)",
            "prefill_bound": "bound_ms = max(causal FLOPs / peak, bytes / bandwidth); "
            "bound_ms_full uses full-attention FLOPs",
        },
        "decode_weights_only": {"step_ms": floor["step_ms"], "tokens_per_s": floor["tokens_per_s"]},
        "decode": decode,
        "prefill": prefill,
    }


@click.command("bounds")
@click.option("--model-config", type=str, required=True, help="Hugging Face config.json of the model.")
@click.option("--gpu", type=str, help="GPU row name (e.g. H100-SXM, A100-80GB-SXM, MI300X).")
@click.option("--peak-tflops", type=float, help="Dense FP16/BF16 peak in TFLOP/s (1e12); overrides --gpu.")
@click.option("--bandwidth-tbps", type=float, help="Memory bandwidth in TB/s (1e12 B/s); overrides --gpu.")
@click.option("--batch", "batch_s", default="1,8,32,64,128", show_default=True, help="Decode batch sizes.")
@click.option("--context", type=int, default=2048, show_default=True, help="Decode context (tokens in cache).")
@click.option("--prompt-len", "prompt_s", default="512,2048,8192", show_default=True, help="Prefill prompt lengths.")
@click.option("--weight-dtype", type=_DTYPES, default="bf16", show_default=True)
@click.option("--kv-dtype", type=_DTYPES, default="fp16", show_default=True)
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
    batch_s: str,
    context: int,
    prompt_s: str,
    weight_dtype: str,
    kv_dtype: str,
    lm_head: str,
    fmt: str,
) -> None:
    """Analytic lower bounds for decode steps and prefill passes of a model on a GPU.

    Decode step >= bytes per step / bandwidth; prefill >= FLOPs / peak (domain.md
    section 3). Give --gpu NAME, or --peak-tflops and --bandwidth-tbps (which also
    override the row's figures).
    """
    batches = _int_list(batch_s, "--batch")
    prompt_lens = _int_list(prompt_s, "--prompt-len")
    if context < 0:
        _fail(f"--context must be >= 0, got {context}")
    weight_dtype, kv_dtype = weight_dtype.lower(), kv_dtype.lower()
    try:
        spec = load_model_config(model_config)
        peak = peak_from_overrides(gpu=gpu, peak_tflops=peak_tflops, bandwidth_tbps=bandwidth_tbps)
        if peak is None:
            _fail("give --gpu NAME, or both --peak-tflops and --bandwidth-tbps")
        if peak.dense_fp16_tflops is None or peak.memory_bandwidth_tbps is None:
            _fail("give both --peak-tflops and --bandwidth-tbps (or --gpu NAME)")
        result = _bounds_result(spec, peak, batches, context, prompt_lens, weight_dtype, kv_dtype, lm_head)
    except DiagnoseError as exc:
        _fail(str(exc))

    if fmt.lower() == "json":
        click.echo(json.dumps(result, indent=2))
        return
    _print_bounds(result)


def _print_bounds(r: dict[str, Any]) -> None:
    console = _console()
    m, dev = r["model"], r["device"]

    mt = Table(title=f"Model {m['name']}")
    mt.add_column("quantity")
    mt.add_column("count / bytes", justify="right")
    mt.add_column("GB (1e9 B)", justify="right")
    mt.add_column("GiB (2^30 B)", justify="right")
    mt.add_row("params: attention per layer", f"{m['params_attention_per_layer']:,}", "", "")
    mt.add_row("params: MLP per layer", f"{m['params_mlp_per_layer']:,}", "", "")
    mt.add_row(f"params: {m['num_hidden_layers']} layers", f"{m['params_body']:,}", "", "")
    head = "embedding (tied head)" if m["tie_word_embeddings"] else "embedding + LM head"
    mt.add_row(f"params: {head}", f"{m['params_embedding']:,}", "", "")
    mt.add_row("params: total", f"{m['params_total']:,}", "", "")
    mt.add_row(f"weight bytes ({m['weight_dtype']})", f"{m['weight_bytes']:,}", _gb(m["weight_bytes"]), _gib(m["weight_bytes"]))
    mt.add_row(
        f"KV bytes per token ({m['kv_dtype']})",
        f"{m['kv_bytes_per_token']:,} ({m['kv_bytes_per_token'] / KiB:g} KiB)",
        "",
        "",
    )
    console.print(mt)

    over = ""
    if dev["overrides"] and dev["name"] != "custom":
        over = f" (flags override: {', '.join(dev['overrides'])})"
    console.print(
        f"Device {dev['name']}{over}: {dev['peak_tflops']:g} TFLOP/s dense FP16/BF16, "
        f"{dev['bandwidth_tbps']:g} TB/s; ridge point {dev['ridge_flop_per_byte']:.1f} FLOP/B. "
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
    for col in (
        "batch",
        "context (tokens)",
        "weights (GB)",
        "KV read (GB)",
        "bytes/step (GB)",
        "step (ms)",
        "throughput (tok/s)",
        "per-token share (ms)",
        "AI (FLOP/B)",
        "bound",
    ):
        dt.add_column(col, justify="right")
    for d in r["decode"]:
        dt.add_row(
            str(d["batch"]),
            f"{d['context']:,}",
            _gb(d["weight_bytes"]),
            _gb(d["kv_read_bytes"]),
            _gb(d["bytes_per_step"]),
            f"{d['step_ms']:.2f}",
            f"{d['tokens_per_s']:,.0f}",
            f"{d['per_token_ms']:.2f}",
            f"{d['arithmetic_intensity']:.1f}",
            d["bound"],
        )
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
