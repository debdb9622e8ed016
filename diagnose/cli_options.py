"""The shared command-line option set: the same flags, with one meaning, on ``run``, ``serve``,
``gate``, ``compare`` and ``sweep`` (a test checks every command's ``--help`` against
:data:`ANALYSIS_FLAGS` and :data:`RULE_FLAGS`).

A CLI module: library code builds :class:`~diagnose.options.AnalysisOptions` directly.
"""
from __future__ import annotations

from typing import Any, Callable

import click

from diagnose.clitypes import MAX_BATCH, MAX_TOKENS, MAX_TP, POSITIVE_FINITE
from diagnose.errors import DiagnoseError
from diagnose.options import DTYPES, AnalysisOptions, RuleOptions

#: Every analysis flag (README "Usage"); ``--phase-regex`` is also ``--phase PHASE=REGEX`` on ``run``.
ANALYSIS_FLAGS = ("--model-config", "--gpu", "--peak-tflops", "--bandwidth-tbps", "--batch", "--context", "--prompt-len",
                  "--weight-dtype", "--kv-dtype", "--tp", "--capture-trace", "--phase-regex", "--window", "--device",
                  "--lenient")
RULE_FLAGS = ("--threshold", "--rules-config", "--rules")

_ANALYSIS_PARAMS = ("model_config", "gpu", "peak_tflops", "bandwidth_tbps", "batch", "context", "prompt_len",
                    "weight_dtype", "kv_dtype", "tp", "capture_trace", "phase_regex", "window", "device", "lenient")
_RULE_PARAMS = ("threshold_specs", "rules_config", "rules_dir")


def analysis_options(fn: Callable | None = None, *, device_help: str | None = None) -> Callable:
    """Add the analysis flags; the command receives them as keyword arguments (use
    :func:`split_options`)."""
    def deco(f: Callable) -> Callable:
        opts = [
            click.option("--model-config", default=None, metavar="FILE|NAME",
                         help="Hugging Face config.json of the model, or a shipped model name (see `diagnose bounds --help`); else the trace's metadata."),
            click.option("--gpu", default=None, help="GPU peak-table row, e.g. H100-SXM, A100-80GB-SXM, MI300X (see `diagnose bounds --help`)."),
            click.option("--peak-tflops", type=POSITIVE_FINITE, default=None, help="Override the dense FP16/BF16 peak, TFLOP/s."),
            click.option("--bandwidth-tbps", type=POSITIVE_FINITE, default=None, help="Override the memory bandwidth, TB/s."),
            click.option("--batch", type=click.IntRange(min=1, max=MAX_BATCH), default=None, help="Sequences per step, when markers do not say."),
            click.option("--context", type=click.IntRange(min=1, max=MAX_TOKENS), default=None, help="KV context per sequence in decode steps."),
            click.option("--prompt-len", type=click.IntRange(min=1, max=MAX_TOKENS), default=None, help="Prompt tokens per sequence in prefill steps."),
            click.option("--weight-dtype", type=click.Choice(DTYPES), default=None,
                         help="Weight dtype for bytes (default: the config's quantization, trace metadata, else bf16)."),
            click.option("--kv-dtype", type=click.Choice(DTYPES), default=None,
                         help="KV-cache dtype for bytes (default: the weight dtype when 16/32-bit, else bf16)."),
            click.option("--tp", type=click.IntRange(min=1, max=MAX_TP), default=None,
                         help="Tensor-parallel degree of the traced rank (default: the trace's distributedInfo.world_size)."),
            click.option("--capture-trace", type=click.Path(dir_okay=False), default=None, metavar="FILE",
                         help="The CUDA-graph capture trace matching a replay trace: maps replayed kernels to ops and shapes."),
            click.option("--phase-regex", "phase_regex", multiple=True, metavar="PHASE=REGEX",
                         help="Steps of a phase (prefill, decode, mixed): a regex (re.search) on step-marker and GPU "
                              "annotation names, else on with_stack python frames ('file(line): function'); repeatable."),
            click.option("--window", default=None, metavar="START:END",
                         help="Analyse only events starting in this window, ms from the trace start (e.g. 100:250, 500:)."),
            click.option("--device", type=int, default=None,
                         help=device_help or "Analyse only this GPU device id (default: every device; the rules read each one and the report leads with the finding of largest stake, naming its device)."),
            click.option("--lenient", is_flag=True, help="Repair numbers written with a decimal comma (a locale bug) instead of refusing the file."),
        ]
        for o in reversed(opts):
            f = o(f)
        return f

    return deco(fn) if fn is not None else deco


def rule_options(fn: Callable) -> Callable:
    """Add ``--threshold``, ``--rules-config`` and ``--rules``."""
    opts = [
        click.option("--threshold", "threshold_specs", multiple=True, metavar="RULE.NAME=VALUE",
                     help="Override a rule threshold, e.g. S3-launch-gaps.max_launch_gap_share=0.2; repeatable."),
        click.option("--rules-config", type=click.Path(dir_okay=False), default=None,
                     help="YAML: thresholds (RULE.NAME: value) and disable (rule ids)."),
        click.option("--rules", "rules_dir", type=click.Path(), default=None, help="Rules directory (default: the packaged rules)."),
    ]
    for o in reversed(opts):
        fn = o(fn)
    return fn


def split_options(kwargs: dict[str, Any], extra_phase_regex: tuple[str, ...] = ()) -> tuple[AnalysisOptions, RuleOptions, dict[str, Any]]:
    """Pop the shared flags out of a command's keyword arguments.

    Returns:
        (analysis options, rule options, the remaining keyword arguments).

    Raises:
        DiagnoseError: a ``--phase`` alias that is not PHASE=REGEX.
    """
    rest = dict(kwargs)
    a = {k: rest.pop(k) for k in _ANALYSIS_PARAMS if k in rest}
    r = {k: rest.pop(k) for k in _RULE_PARAMS if k in rest}
    a["phase_regex"] = tuple(a.get("phase_regex") or ()) + tuple(extra_phase_regex)
    rules = RuleOptions(rules_dir=r.get("rules_dir"), rules_config=r.get("rules_config"),
                        thresholds=tuple(r.get("threshold_specs") or ()))
    return AnalysisOptions.from_kwargs(**a), rules, rest


def phase_regex_alias(values: tuple[str, ...]) -> tuple[str, ...]:
    """``run --phase PHASE=REGEX`` (kept as an alias of ``--phase-regex``: the ``=`` tells it
    apart from ``gate --phase NAME``).

    Raises:
        DiagnoseError: a value without ``=``.
    """
    for v in values:
        if "=" not in v:
            raise DiagnoseError(f"--phase expects PHASE=REGEX on `run` (an alias of --phase-regex), got {v!r}")
    return tuple(values)
