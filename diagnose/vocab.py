"""One vocabulary for every layer: phases, severities, rule scopes, kernel categories (with
their colours), gap kinds and causes, and report quality codes (with their meaning).

Loaders, analyzers, the rule engine, the terminal, HTML and web reports import these tables
instead of keeping copies; the README's quality-code table is generated from
:data:`QUALITY_CODES` (``python -m diagnose.vocab``), and a test checks that every code the
code base emits is listed here (and that nothing listed is never emitted).
"""
from __future__ import annotations

from dataclasses import dataclass

#: Phases of a report row; ``all`` is everything on a device, ``unknown`` activity no step claims.
PHASES = ("all", "prefill", "decode", "mixed", "unknown")
#: Phases a step can have.
STEP_PHASES = ("prefill", "decode", "mixed")

SEVERITIES = ("info", "low", "medium", "high", "critical")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}
SEVERITY_COLORS = {"critical": "#7b0000", "high": "#c62828", "medium": "#ef6c00", "low": "#f9a825",
                   "info": "#1565c0", "none": "#2e7d32", "unknown": "#616161"}
SEVERITY_STYLES = {"critical": "bold white on red", "high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}

#: What a rule reads: one trace, several traces of a sweep, a baseline/candidate pair, a metrics file.
SCOPES = ("trace", "sweep", "compare", "metrics")


@dataclass(frozen=True)
class Category:
    """A kernel category: ``name``, plot colour, whether ``<phase>.<name>_share`` is a finding."""

    name: str
    color: str
    share_finding: bool
    description: str


CATEGORY_TABLE: tuple[Category, ...] = (
    Category("gemm", "#1f77b4", True, "dense matrix multiplies (cuBLAS, CUTLASS, hipBLASLt, Tensile, triton mm)"),
    Category("attention", "#ff7f0e", False, "attention and KV-cache kernels (FlashAttention, FlashInfer, paged, CK FMHA)"),
    Category("norm", "#2ca02c", True, "RMSNorm / LayerNorm"),
    Category("elementwise", "#17becf", True, "activations, RoPE, casts, copies, pointwise and reductions"),
    Category("communication", "#e377c2", False, "NCCL / RCCL / custom all-reduce"),
    Category("moe", "#8c564b", True, "MoE routing and expert GEMMs"),
    Category("sampling", "#bcbd22", True, "top-k / top-p / argmax sampling"),
    Category("memcpy", "#7f7f7f", False, "memory copies (by activity kind)"),
    Category("memset", "#aec7e8", False, "memory sets (by activity kind)"),
    Category("other", "#98df8a", True, "kernels no pattern matched"),
)
CATEGORIES = tuple(c.name for c in CATEGORY_TABLE)
CATEGORY_COLORS = {c.name: c.color for c in CATEGORY_TABLE}
#: Categories with a ``<phase>.<category>_share`` finding (communication has ``comm_share``).
SHARE_CATEGORIES = tuple(c.name for c in CATEGORY_TABLE if c.share_finding)
PHASE_COLORS = {"prefill": "#ad1457", "decode": "#283593", "mixed": "#f9a825", "unknown": "#cccccc", "all": "#444444"}

#: Kinds of idle gap (README "Definitions").
GAP_KINDS = ("launch", "graph", "other", "unattributed")
GAP_COLORS = {"launch": "#d62728", "graph": "#9467bd", "other": "#b0b0b0", "unattributed": "#c9a66b"}
GAP_LABELS = {
    "launch": "launch gap (GPU waited for host)",
    "graph": "gap inside graph replay",
    "other": "idle (other: sync, dependency)",
    "unattributed": "idle (no launch call linked)",
}


@dataclass(frozen=True)
class QualityCode:
    """A report quality code: its meaning (README table) and whether it makes numbers unreliable."""

    code: str
    meaning: str
    unreliable: bool = False


QUALITY_TABLE: tuple[QualityCode, ...] = (
    QualityCode("no_gpu_activity", "no kernels, memcpy or memset: GPU numbers unavailable (CPU-only traces are not an error)"),
    QualityCode("missing_markers", "no step markers and no usable shapes: phase `unknown`"),
    QualityCode("phases_from_shapes", "no step markers: phases read from operator shapes"),
    QualityCode("training_trace", "autograd backward ops found: a training step, so no prefill/decode phase is inferred"),
    QualityCode("unlinked_kernels", "GPU activities without a host launch call of the same correlation id"),
    QualityCode("graph_kernels_no_launch", "kernels replayed from graph launches: no per-kernel launch; op-level attribution unavailable"),
    QualityCode("graph_coverage_low", "fewer than 90 % of graph launches have GPU activity in the trace: idle and launch-gap numbers unreliable", True),
    QualityCode("unnamed_device", "the device has no name in the trace (vLLM ROCm traces)"),
    QualityCode("device_id_remapped", "one listed GPU whose activities carry another device index"),
    QualityCode("unknown_device_peak", "device not in the GPU table: MFU/MBU skipped"),
    QualityCode("bandwidth_above_peak", "achieved bandwidth above the device peak: wrong peak or config, or a timing without synchronisation (S7)"),
    QualityCode("partial_forward", "the step's operators are < 50 % of the model's FLOPs: the window holds part of a forward; MBU from the config is too high"),
    QualityCode("model_config_unusable", "the model config in trace metadata lacks required keys"),
    QualityCode("truncated", "the file (JSON or gzip) was cut short; numbers are partial", True),
    QualityCode("decimal_comma_repaired", "numbers written with a decimal comma repaired (`--lenient`)"),
    QualityCode("invalid_text_repaired", "invalid UTF-8 or control characters replaced by U+FFFD"),
    QualityCode("invalid_utf8_names", "invalid UTF-8 in names replaced by U+FFFD"),
    QualityCode("negative_duration", "events with a negative duration excluded"),
    QualityCode("missing_timestamp", "events without a timestamp excluded"),
    QualityCode("outside_trace_window", "events > 24 h away from the other GPU activity (e.g. `ts` 0) excluded"),
    QualityCode("deferred_completion_clipped", "an activity ran > 1 ms past the next one on its stream: clipped, time removed reported"),
    QualityCode("same_stream_overlap", "small overlaps on one stream (PDL): kept, busy is a union"),
    QualityCode("legacy_event_list", "a top-level JSON list of events (no trace metadata)"),
    QualityCode("bad_base_time", "`baseTimeNanoseconds` is not a plausible epoch time in ns: ignored, times are relative"),
    QualityCode("sliced_window", "only part of the trace was analysed (`--window`)"),
    QualityCode("sliced_device", "only one device of the trace was analysed (`--device`)"),
    QualityCode("nsys_table_absent", "Nsight Systems export without one of the tables read (see `diagnose/trace/nsys.py`)"),
    QualityCode("nsys_no_nvtx", "Nsight Systems export without NVTX ranges: no step markers"),
    QualityCode("nsys_nvtx_unterminated", "NVTX ranges without an end excluded"),
    QualityCode("nsys_graph_level", "CUDA graphs traced at graph level: one activity per graph launch"),
    QualityCode("nsys_unresolved_names", "kernel or NVTX names whose string id does not resolve"),
    QualityCode("nsys_negative_duration", "Nsight Systems rows with a negative duration excluded"),
    QualityCode("nsys_unknown_device", "activities on a device the export does not describe"),
    QualityCode("nsys_diagnostic_data_loss", "Nsight Systems reported lost events in its diagnostics"),
)
QUALITY_CODES = {q.code: q for q in QUALITY_TABLE}
#: Codes that make the trace's numbers unreliable (``gate`` fails unless ``--allow-partial``).
UNRELIABLE_CODES = tuple(q.code for q in QUALITY_TABLE if q.unreliable)


def quality_table_markdown() -> str:
    """The README's data-quality table (between its ``quality-codes`` markers)."""
    rows = ["| code | meaning |", "|---|---|"]
    rows += [f"| `{q.code}` | {q.meaning} |" for q in QUALITY_TABLE]
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover - `python -m diagnose.vocab` prints the README table
    print(quality_table_markdown())
