"""``diagnose collect``: capture profiler traces of prefill and decode.

The group is registered on the main ``diagnose`` group; it can also be run alone with
``python -m diagnose.collectors.collect_cli torch ...``. torch and transformers are
imported only when a subcommand runs, so registering the group costs nothing.

Argument errors (including click's own parse errors) are reported as one line,
``Error: <message>``, on stderr with exit status 2 and no traceback.
"""

from __future__ import annotations

import click

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
                config=config,
                model_path=model_path,
                device=device,
                dtype=dtype,
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


if __name__ == "__main__":  # pragma: no cover
    collect_group()
