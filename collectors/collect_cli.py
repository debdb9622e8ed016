"""``diagnose collect``: capture profiler traces of prefill and decode.

Subcommands: ``torch`` (a torch.profiler trace), ``bench`` (timed prefill/decode rows,
see :mod:`diagnose.collectors.bench`) and ``nsys`` (run a command under Nsight Systems, see
:mod:`diagnose.collectors.nsys_collector`). The group is registered on the main
``diagnose`` group; it can also be run alone with
``python -m diagnose.collectors.collect_cli torch ...``. torch and transformers are
imported only when a subcommand runs, so registering the group costs nothing.

Argument errors (including click's own parse errors) are reported as one line,
``Error: <message>``, on stderr with exit status 2 and no traceback.
"""

from __future__ import annotations

import click

from diagnose.clitypes import POSITIVE_FINITE, POSITIVE_INT_LIST
from diagnose.collectors.presets import get_preset, preset_names
from diagnose.errors import DiagnoseError


class OneLineUsageError(click.UsageError):
    """A usage error printed as a single ``Error: ...`` line (exit status 2)."""

    def show(self, file=None) -> None:  # noqa: D102 - click API
        click.echo(f"Error: {self.format_message()}", file=file, err=file is None)


class _OneLineCommand(click.Command):
    """A click command whose parse errors are one line, without the usage banner."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        try:
            return super().parse_args(ctx, args)
        except OneLineUsageError:
            raise
        except click.UsageError as exc:
            raise OneLineUsageError(exc.format_message(), ctx) from None


@click.group(name="collect")
def collect_group() -> None:
    """Capture profiler traces of prefill and decode steps."""


@collect_group.command(name="torch", cls=_OneLineCommand)
@click.option("--config", "config_name", metavar="|".join(preset_names()), help="Model config preset (random weights).")
@click.option("--model", "model_path", metavar="PATH_OR_HUB_ID", help="Local checkpoint directory or hub id org/name.")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "bf16", "fp16"]),
    default=None,
    help="Weights/activations dtype [default: fp32 on cpu, bf16 on cuda].",
)
@click.option("--batch", type=int, required=True, help="Batch size B (sequences).")
@click.option("--prompt-len", type=int, required=True, help="Prompt length S (tokens per sequence).")
@click.option("--decode-steps", type=int, required=True, help="Decode steps N to record.")
@click.option("--cuda-graph", is_flag=True, help="Replay decode steps from CUDA graphs (CUDA only).")
@click.option("--warmup", type=int, default=1, show_default=True, help="Warm-up rounds K (prefill + 2 decode) outside the profiler.")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Output trace; gzip when it ends in .gz.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for weights and prompt.")
def collect_torch_cmd(
    config_name: str | None,
    model_path: str | None,
    device: str,
    dtype: str | None,
    batch: int,
    prompt_len: int,
    decode_steps: int,
    cuda_graph: bool,
    warmup: int,
    out: str,
    seed: int,
) -> None:
    """Record one prefill + N decode steps with torch.profiler into a Kineto trace.

    Each step is a record_function range named diagnose:prefill[bs=B toks=B*S] or
    diagnose:decode[bs=B ctx=C]; run metadata is stored under the trace's top-level
    "diagnose" key.
    """
    if dtype is None:
        dtype = "bf16" if device == "cuda" else "fp32"
    try:
        config = get_preset(config_name) if config_name is not None else None
        if config_name is not None and model_path is not None:
            raise DiagnoseError("give exactly one of --config or --model")
        from diagnose.collectors.torch_collector import collect_torch, validate_args

        # Check everything before the (slow) torch import and model build.
        validate_args(config, model_path, device, dtype, batch, prompt_len, decode_steps, cuda_graph, warmup)
        try:
            summary = collect_torch(
                **_model_kwargs(config, model_path, device, dtype),
                batch=batch,
                prompt_len=prompt_len,
                decode_steps=decode_steps,
                out=out,
                cuda_graph=cuda_graph,
                warmup=warmup,
                seed=seed,
            )
        except RuntimeError as exc:
            if "out of memory" in str(exc).lower():
                first = str(exc).strip().splitlines()[0]
                raise click.ClickException(f"{device} out of memory: {first}") from None
            raise
    except DiagnoseError as exc:
        raise OneLineUsageError(str(exc)) from None
    steps = summary["steps"]
    click.echo(
        f"wrote {summary['path']} ({summary['bytes']} bytes): {steps['prefill']} prefill + "
        f"{steps['decode']} decode steps, bs={batch}, {device}/{dtype}"
        + (", cuda-graph" if cuda_graph else "")
    )


def _model_kwargs(config, model_path: str | None, device: str, dtype: str) -> dict:
    """The model and placement arguments both collectors take."""
    return {"config": config, "model_path": model_path, "device": device, "dtype": dtype}


@collect_group.command(name="bench", cls=_OneLineCommand)
@click.option("--config", "config_name", metavar="|".join(preset_names()), help="Model config preset (random weights).")
@click.option("--model", "model_path", metavar="PATH", help="Local checkpoint directory (real weights; enables --perplexity-text).")
@click.option("--device", type=click.Choice(["cpu", "cuda"]), default="cpu", show_default=True)
@click.option(
    "--dtype",
    type=click.Choice(["fp32", "bf16", "fp16"]),
    default=None,
    help="Weights/activations/KV dtype [default: fp32 on cpu, bf16 on cuda].",
)
@click.option("--prompt-lens", "p_lens", type=POSITIVE_INT_LIST, default="512,2048,8192", show_default=True, help="Prefill prompt lengths S (batch 1), comma-separated.")
@click.option("--batches", "b_list", type=POSITIVE_INT_LIST, default="1,8,32", show_default=True, help="Decode batch sizes B, comma-separated.")
@click.option("--contexts", "c_list", type=POSITIVE_INT_LIST, default="2048,16384", show_default=True, help="Decode KV-cache lengths C, comma-separated (every B x C is a row).")
@click.option("--warmup", type=int, default=2, show_default=True, help="Untimed iterations per row.")
@click.option("--iters", type=int, default=10, show_default=True, help="Timed iterations per row.")
@click.option("--gpu", default=None, help="GPU peak-table row (e.g. H100-SXM); default: from the CUDA device name.")
@click.option("--peak-tflops", type=POSITIVE_FINITE, default=None, help="Dense FP16/BF16 peak, TFLOP/s (overrides the row).")
@click.option("--bandwidth-tbps", type=POSITIVE_FINITE, default=None, help="Memory bandwidth, TB/s (overrides the row).")
@click.option("--perplexity-text", type=click.Path(dir_okay=False), default=None, help="Text file: also report perplexity (real weights only).")
@click.option("--out", type=click.Path(dir_okay=False), required=True, help="Results JSON file.")
@click.option("--seed", type=int, default=0, show_default=True, help="Seed for weights and token ids.")
def collect_bench_cmd(
    config_name: str | None,
    model_path: str | None,
    device: str,
    dtype: str | None,
    p_lens: list[int],
    b_list: list[int],
    c_list: list[int],
    warmup: int,
    iters: int,
    gpu: str | None,
    peak_tflops: float | None,
    bandwidth_tbps: float | None,
    perplexity_text: str | None,
    out: str,
    seed: int,
) -> None:
    """Time prefill (per prompt length, batch 1) and decode steps (per batch x context).

    Warm-up first, a device synchronize before every timestamp, p50/p90/p99 per row,
    tokens/s, analytic FLOPs and bytes, MFU/MBU and the ratio to the analytic lower bound
    when the device peak is known. Writes a JSON results file and prints a table.
    """
    import sys

    if dtype is None:
        dtype = "bf16" if device == "cuda" else "fp32"
    try:
        if config_name is not None and model_path is not None:
            raise DiagnoseError("give exactly one of --config or --model")
        config = get_preset(config_name) if config_name is not None else None
        from diagnose.collectors.bench import results_table, run_bench, validate_bench_args
        from diagnose.hardware import peak_from_overrides

        validate_bench_args(config, model_path, device, dtype, p_lens, b_list, c_list, warmup, iters, perplexity_text)
        peak_from_overrides(gpu=gpu, peak_tflops=peak_tflops, bandwidth_tbps=bandwidth_tbps)
        results = run_bench(
            **_model_kwargs(config, model_path, device, dtype),
            prompt_lens=p_lens, batches=b_list, contexts=c_list, warmup=warmup, iters=iters, seed=seed,
            gpu=gpu, peak_tflops=peak_tflops, bandwidth_tbps=bandwidth_tbps,
            perplexity_text=perplexity_text, out=out,
            config_label=f"preset:{config_name}" if config_name else f"model:{model_path}",
            progress=lambda line: click.echo(f"bench: {line}", err=True),
        )
    except DiagnoseError as exc:
        raise OneLineUsageError(str(exc)) from None

    from rich.console import Console

    console = Console(file=sys.stdout)
    if not console.is_terminal:
        console = Console(file=sys.stdout, width=160, color_system=None)
    console.print(results_table(results))
    ppl = results.get("perplexity")
    if ppl is not None:
        if ppl["value"] is None:
            click.echo(f"perplexity skipped: {ppl['reason']}")
        else:
            click.echo(f"perplexity {ppl['value']:.4f} over {ppl['tokens']} tokens of {ppl['text']} (window {ppl['window']})")
    oom = sum(1 for r in results["rows"] if r["status"] != "ok")
    click.echo(f"wrote {out}: {len(results['rows'])} rows" + (f" ({oom} out of memory)" if oom else ""))


@collect_group.command(
    name="nsys",
    cls=_OneLineCommand,
    context_settings={"ignore_unknown_options": True, "allow_interspersed_args": False},
)
@click.option("--out", default="report", show_default=True, help="Output base: writes OUT.nsys-rep and OUT.sqlite.")
@click.option("--nsys", "nsys_path", default=None, metavar="PATH", help="nsys executable [default: nsys on PATH].")
@click.argument("cmd", nargs=-1, type=click.UNPROCESSED)
def collect_nsys_cmd(out: str, nsys_path: str | None, cmd: tuple[str, ...]) -> None:
    """Profile CMD under Nsight Systems and export the report to SQLite.

    Runs `nsys profile --trace=cuda,nvtx --cuda-graph-trace=node -o OUT --force-overwrite
    true CMD...`, then `nsys export --type sqlite --output OUT.sqlite OUT.nsys-rep`, and
    prints the `diagnose run` command for the result. Put CMD after `--`.
    """
    from diagnose.collectors.nsys_collector import collect_nsys

    try:
        summary = collect_nsys(list(cmd), out, nsys=nsys_path)
    except DiagnoseError as exc:
        raise OneLineUsageError(str(exc)) from None
    click.echo(f"wrote {summary['report']} and {summary['sqlite']}")
    click.echo(f"next: {summary['next']}")


if __name__ == "__main__":  # pragma: no cover
    collect_group()
