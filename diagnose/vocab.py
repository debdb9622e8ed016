"""One vocabulary for every layer: phases, severities, rule scopes, kernel categories (with
their colours), gap kinds and causes, and report quality codes (with their meaning).

Loaders, analyzers, the rule engine, the terminal, HTML and web reports import these tables
instead of keeping copies; the README's quality-code table is generated from
:data:`QUALITY_CODES` (``python -m diagnose.vocab``), and a test checks that every code the
code base emits is listed here (and that nothing listed is never emitted).
"""
from __future__ import annotations

import msgspec


#: Phases of a report row; ``all`` is everything on a device, ``unknown`` activity no step claims.
PHASES = ("all", "prefill", "decode", "mixed", "unknown")
#: Phases a step can have (a step whose phase cannot be told is ``unknown``: STEP_PHASES + ("unknown",)).
STEP_PHASES = ("prefill", "decode", "mixed")
#: What a step was found from, in order of trust (README "Steps").
STEP_EVIDENCE = ("marker", "profiler_step", "python_frame", "structure", "shapes")
#: Quality codes of traces that are not LLM serving: steps are found and timed, no prefill/decode reading.
NON_LLM_TRACE_TYPES: tuple[str, ...] = ("training_trace", "vision_forward", "encoder_forward", "diffusion_loop")

#: Data types of matrix work, whose compute peaks differ (:meth:`diagnose.hardware.GpuPeak.peak_tflops_for`):
#: ``fp32`` is FP32 without tensor cores (NVIDIA CUDA-core SIMT ``sgemm``/``ffma`` kernels; AMD's
#: FP32 matrix path), ``tf32`` TF32 tensor cores.
DTYPES = ("fp32", "tf32", "fp16", "bf16", "fp8", "fp4", "int8")

#: Phase names a finding may start with: the report's phase rows, plus ``main``, the step
#: phase with the most own time on the device (``all`` when the trace has no steps). Rules
#: about "the step" read ``main.*`` so work outside the steps (the previous step's tail,
#: warm-up) does not count.
FINDING_PHASES = PHASES + ("main",)

SEVERITIES = ("info", "low", "medium", "high", "critical")
SEVERITY_RANK = {s: i for i, s in enumerate(SEVERITIES)}
SEVERITY_COLORS = {"critical": "#7b0000", "high": "#c62828", "medium": "#ef6c00", "low": "#f9a825",
                   "info": "#1565c0", "none": "#2e7d32", "unknown": "#616161"}
SEVERITY_STYLES = {"critical": "bold white on red", "high": "bold red", "medium": "yellow", "low": "cyan", "info": "dim"}

#: Trace types whose numbers do not describe serving (a capture pass, part of a forward): gate
#: and compare treat them like a partial trace (fail unless --allow-partial).
UNREPRESENTATIVE_TRACE_TYPES: tuple[str, ...] = ("graph_capture", "fragment")

#: What a rule reads: one trace, several traces of a sweep, a baseline/candidate pair, a metrics file.
SCOPES = ("trace", "sweep", "compare", "metrics")


class Category(msgspec.Struct, frozen=True):
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

#: Kinds of idle gap (README "Definitions"); their colours are their causes' (the cause table).
GAP_KINDS = ("launch", "graph", "other", "unattributed")

#: The cause table (``diagnose/data/causes.yaml``, :mod:`diagnose.cause_table`): every cause
#: of GPU waiting with its label, whether it is external to the step, its colour and its levers;
#: and the levers. Nothing here defines a cause, a colour or a lever: these names read the table.
import msgspec

from diagnose.cause_table import Cause, Lever, cause_table  # noqa: E402

GAP_CAUSE_TABLE: tuple[Cause, ...] = tuple(cause_table().causes)
GAP_CAUSES = tuple(c.name for c in GAP_CAUSE_TABLE)
GAP_CAUSE_LABELS = {c.name: c.label for c in GAP_CAUSE_TABLE}
#: Causes whose time is not the step's own cost (excluded from steps[].own_ms).
EXTERNAL_CAUSES = frozenset(c.name for c in GAP_CAUSE_TABLE if c.external)
#: Each cause's colour in every view (terminal, HTML, web timeline and overview).
CAUSE_COLORS = {c.name: c.color for c in GAP_CAUSE_TABLE}
#: Each cause's levers, in the order worth trying.
CAUSE_LEVERS = {c.name: tuple(c.levers) for c in GAP_CAUSE_TABLE}
#: Causes read from the host's activity, in the host classifier's precedence order.
HOST_CAUSES = cause_table().host_order


#: Kinds of critical-path segment (README "Critical path"): time in GPU activities, the gaps
#: between them, a launch call's latency until its work started, a cross-stream wait, a
#: blocking call returning after the GPU work it waited for, and host time (split by cause).
PATH_KINDS = ("gpu_compute", "gpu_communication", "memcpy", "gpu_gap", "launch_latency", "dependency", "sync_return", "host")
PATH_KIND_LABELS = {
    "gpu_compute": "GPU compute", "gpu_communication": "GPU communication", "memcpy": "memcpy/memset",
    "gpu_gap": "GPU gaps", "launch_latency": "launch latency", "dependency": "cross-stream wait",
    "sync_return": "sync return", "host": "host",
}
#: Path kinds that are waits of a cause take that cause's colour (the cause table's): a
#: blocking call returning after the GPU work it waited for is host_blocked's.
PATH_KIND_COLORS = {
    "gpu_compute": "#1f77b4", "gpu_communication": "#e377c2", "memcpy": "#7f7f7f", "gpu_gap": CAUSE_COLORS["graph"],
    "launch_latency": CAUSE_COLORS["launch"], "dependency": CAUSE_COLORS["dependency"], "sync_return": CAUSE_COLORS["host_blocked"],
    "host": "#ff7f0e",
}
#: Why a path starts where it does: the step's anchor (its marker, or the window's start),
#: the previous step's GPU end, work the GPU waited for that the trace does not hold
#: (> 1.5 ms after every in-trace predecessor), or a first activity with no predecessor.
PATH_STARTS = ("anchor", "previous_step", "outside_trace", "not_in_trace")

#: The levers (the cause table's ``levers``).
LEVER_TABLE: tuple[Lever, ...] = tuple(cause_table().levers)
LEVERS = {lv.name: lv for lv in LEVER_TABLE}


class QualityCode(msgspec.Struct, frozen=True):
    """A report quality code: its meaning (README table) and whether it makes numbers unreliable."""

    code: str
    meaning: str
    unreliable: bool = False


QUALITY_TABLE: tuple[QualityCode, ...] = (
    QualityCode("no_gpu_activity", "no kernels, memcpy or memset: GPU numbers unavailable (CPU-only traces are not an error)"),
    QualityCode("no_steps", "no step found (no step marker, ProfilerStep, engine python frame or repeating GPU structure): the message says what to capture"),
    QualityCode("steps_from_structure", "no markers or engine frames: steps guessed from the repeating bursts of GPU work (boundaries from the trace's own idle gaps or kernel sequence)"),
    QualityCode("phase_unknown", "steps found, but nothing in them tells prefill from decode: phase `unknown` (use --phase-regex PHASE=REGEX)"),
    QualityCode("phase_regex_unmatched", "a `--phase-regex` matched no range or python frame in the trace"),
    QualityCode("phase_regex_contradicted", "a `--phase-regex` label disagrees with what its steps show (shapes, token/row counts, the engine's path): the label is kept"),
    QualityCode("phases_from_shapes", "no step markers: phases read from operator shapes"),
    QualityCode("training_trace", "a training step (autograd backward ops or kernels, optimizer ranges): steps are timed, no prefill/decode reading"),
    QualityCode("vision_forward", "a convolutional (vision) forward, not LLM serving: steps are timed, no prefill/decode reading"),
    QualityCode("encoder_forward", "a transformer forward with bidirectional attention and no KV cache or sampler (an encoder, or one block), not LLM serving: no prefill/decode reading"),
    QualityCode("diffusion_loop", "repeated identical steps of GEMM + attention with no KV-cache write, sampler or causal attention (a denoising loop): steps are timed, no prefill/decode reading"),
    QualityCode("unlinked_kernels", "GPU activities without a host launch call of the same correlation id"),
    QualityCode("orphan_launches", "kernel launch calls without a GPU record (the profiler dropped them; where they sit in the message): steps holding one are left out of the per-step numbers"),
    QualityCode("step_attribution_unreliable", "decode steps of one batch size with > 100x different GPU work: kernels not attributed to the step that launched them; their own times are not reported, TPOT from the steps' completions is kept"),
    QualityCode("graph_kernels_no_launch", "kernels replayed from graph launches: no per-kernel launch; op-level attribution needs the capture trace (--capture-trace)"),
    QualityCode("capture_trace_available", "graph-replayed kernels have no shapes and a graph-capture pass lies beside the trace: the message names it for --capture-trace (never loaded unless given)"),
    QualityCode("graph_coverage_low", "fewer than 90 % of graph launches have GPU activity in the trace: idle and launch-gap numbers unreliable", True),
    QualityCode("unnamed_device", "the device has no name in the trace (vLLM ROCm traces)"),
    QualityCode("device_id_remapped", "one listed GPU whose activities carry another device index"),
    QualityCode("unknown_device_peak", "device not in the GPU table: MFU/MBU skipped"),
    QualityCode("bandwidth_above_peak", "achieved bandwidth above the device peak: wrong peak or config, or a timing without synchronisation (S7)"),
    QualityCode("fragment", "the window holds part of a forward (one test with or without a model config: no GEMM, or less than one decoder layer and a head; with a config also operators < 50 % of the model's FLOPs): no TPOT, MBU or bound ratio, and TPOT, bound and bandwidth rules are not evaluated"),
    QualityCode("graph_capture", "a CUDA/HIP graph capture pass: nothing executed, so every timing rule is not evaluated; profile a replay"),
    QualityCode("cold_start", "first-iteration costs (lazy module loading, module/JIT loading, compilation): the gaps they explain are attributed to them"),
    QualityCode("python_tracing_overhead", "heavy with_stack tracing (python_function events): host times and launch gaps are inflated"),
    QualityCode("model_config_unusable", "the model config in trace metadata lacks required keys, or has sizes beyond the accepted bounds (see \"Inputs and their bounds\")"),
    QualityCode("model_config_unsupported", "the model config in trace metadata has a key that changes bytes or FLOPs in a way not modelled (the message names it): no analytic bound"),
    QualityCode("world_size_not_tp", "`distributedInfo.world_size` does not divide the model's heads or widths (a pipeline- or data-parallel world): tp 1 is used, not an error"),
    QualityCode("truncated", "the file (JSON or gzip) was cut short; numbers are partial", True),
    QualityCode("decimal_comma_repaired", "numbers written with a decimal comma repaired (`--lenient`)"),
    QualityCode("invalid_text_repaired", "invalid UTF-8 or control characters replaced by U+FFFD"),
    QualityCode("invalid_utf8_names", "invalid UTF-8 in names replaced by U+FFFD"),
    QualityCode("negative_duration", "events with a negative duration excluded"),
    QualityCode("missing_timestamp", "events without a timestamp excluded"),
    QualityCode("outside_trace_window", "events > 24 h away from the other GPU activity (e.g. `ts` 0) excluded"),
    QualityCode("deferred_completion_clipped", "an activity ran > 1 ms past the next one on its stream: clipped, time removed reported"),
    QualityCode("duplicate_records", "GPU records that repeat another exactly (name, stream, start, end, ids: activity buffers read twice) counted once"),
    QualityCode("same_stream_overlap", "small overlaps on one stream (PDL): kept, busy is a union"),
    QualityCode("legacy_event_list", "a top-level JSON list of events (no trace metadata)"),
    QualityCode("bad_base_time", "`baseTimeNanoseconds` is not a plausible epoch time in ns: ignored, times are relative"),
    QualityCode("ranks_merged", "several ranks merged into one file (SGLang ProfileMerger), or several processes with GPU work in one Nsight Systems export: split by rank (process) before linking; each rank analysed alone"),
    QualityCode("missing_duration", "complete events (`ph: X`) without `dur` excluded"),
    QualityCode("bad_value", "events with a non-numeric timestamp or duration (e.g. `dur: \"abc\"`) excluded"),
    QualityCode("out_of_range_value", "events with numbers beyond the float64 range (e.g. `ts: 1e400`) excluded"),
    QualityCode("string_timestamps", "`ts`/`dur` written as JSON strings: parsed exactly as decimals (integer ns), never through float64"),
    QualityCode("unmatched_begin_end", "`B`/`E` duration events without their pair dropped (paired ones become ranges)"),
    QualityCode("clock_skew", "GPU activities start before their launch call starts (host/device clock skew, estimate in the message): gaps before them are unattributed, never launch gaps", True),
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
