"""The one analysis option set shared by ``run``, ``serve``, ``gate``, ``compare``, ``sweep`` and
the notebook API (:func:`diagnose.analyze_trace`), and the rule options.

Every command builds these from the same click options (``diagnose/cli_options.py``), so an
option means the same thing everywhere: flags win over trace metadata.
"""
from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any

DTYPES = ("fp32", "fp16", "bf16", "fp8", "int8", "int4")


@dataclass(frozen=True)
class AnalysisOptions:
    """How to analyse a trace.

    Attributes:
        phase_regex: ``PHASE=REGEX`` step-marker regexes (``--phase-regex``; ``run --phase``).
        model_config: a Hugging Face ``config.json`` path or a shipped model name (``--model-config``).
        gpu: GPU table row name (``--gpu``); peak_tflops / bandwidth_tbps override its peaks.
        batch, context, prompt_len: step shapes when the trace's markers do not carry them.
        weight_dtype, kv_dtype: bytes per weight / KV element; None = from the config or
            trace metadata, else bf16.
        tp: tensor-parallel degree of the traced rank (``--tp``; default: the trace's
            ``distributedInfo.world_size`` when the model config is sharded, else 1).
        capture_trace: the CUDA-graph capture trace matching a replay trace (``--capture-trace``).
        window: ``START:END`` in ms from the trace start (``--window``), applied to every trace.
        device: analyse only this GPU device id (``--device``).
        lenient: repair numbers written with a decimal comma (``--lenient``).
    """

    phase_regex: tuple[str, ...] = ()
    model_config: str | None = None
    gpu: str | None = None
    peak_tflops: float | None = None
    bandwidth_tbps: float | None = None
    batch: int | None = None
    context: int | None = None
    prompt_len: int | None = None
    weight_dtype: str | None = None
    kv_dtype: str | None = None
    tp: int | None = None
    capture_trace: str | None = None
    window: str | None = None
    device: int | None = None
    lenient: bool = False

    @classmethod
    def from_kwargs(cls, **kw: Any) -> "AnalysisOptions":
        """Build from keyword arguments, ignoring names that are not options (CLI leftovers)."""
        names = {f.name for f in fields(cls)}
        kw = {k: v for k, v in kw.items() if k in names}
        if "phase_regex" in kw:
            kw["phase_regex"] = tuple(kw["phase_regex"] or ())
        return cls(**kw)

    def with_(self, **kw: Any) -> "AnalysisOptions":
        return replace(self, **kw)


@dataclass(frozen=True)
class RuleOptions:
    """Which rules and thresholds to use: ``--rules`` (a directory), ``--rules-config`` (YAML)
    and ``--threshold RULE.NAME=VALUE`` (wins over the config file)."""

    rules_dir: str | None = None
    rules_config: str | None = None
    thresholds: tuple[str, ...] = field(default_factory=tuple)
