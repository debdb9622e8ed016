"""The report model: frozen ``msgspec.Struct`` records of everything ``diagnose run`` reports.

One shape for the numbers from the analyzers to every view. The analyzers build these records
(:mod:`diagnose.analyzers`), the findings layer flattens them into the rules' namespace
(:func:`diagnose.findings.flatten`), the pipeline attaches the verdicts
(:func:`diagnose.pipeline.attach_verdicts`) and the views format them. The JSON report is
``msgspec.json.encode(report)``; :func:`decode_report` reads a saved report back into a
:class:`Report`; the JSON Schema shipped as ``diagnose/data/report.schema.json`` is generated
from these classes (:func:`report_schema`, ``python -m diagnose.model``).

Conventions:

* Python field names carry their unit (``window_ms``, ``gpu_idle_share``, ``p50_ms``); where
  the JSON key of the report contract has none (``p50``, ``ms``, ``share``, ``steps``), the
  field keeps the JSON key through ``msgspec.field(name=...)``, so the contract (README "JSON
  report") does not change.
* Shares are fractions in [0, 1] (:data:`Share`); times in ms unless the name says otherwise.
* A key the report writes only sometimes (``capture``, ``forward_coverage``, the verdicts
  before :func:`~diagnose.pipeline.attach_verdicts` ran) is ``UNSET`` when absent: it is
  left out of the JSON, never written as null.

Adding a report section: add a Struct here and a field for it on :class:`Report` (``UNSET``
by default if not every report has it), have an analyzer return it and wire it in
:func:`diagnose.analyzers.analyze`, then regenerate the schema (``python -m diagnose.model``)
and the goldens (``pytest tests/test_golden.py --update-golden``: additions only).
"""
from __future__ import annotations

import json
from typing import Any, Literal, Union

import msgspec
from msgspec import UNSET, UnsetType, field

from diagnose import vocab
from diagnose.model_base import Dtype, NonNegative, Number, Record, Share, _enc_hook  # noqa: F401  (re-exported)
from diagnose.model_cost import CostTerm, OpClass, Precision

SCHEMA_VERSION = 2

# ---------------------------------------------------------------- value types (more in diagnose.model_base)

PhaseName = Literal[vocab.PHASES]  # type: ignore[valid-type]
StepPhase = Literal[vocab.STEP_PHASES + ("unknown",)]  # type: ignore[valid-type]
StepEvidence = Literal[vocab.STEP_EVIDENCE]  # type: ignore[valid-type]
GapKind = Literal[vocab.GAP_KINDS]  # type: ignore[valid-type]
GapCause = Literal[vocab.GAP_CAUSES]  # type: ignore[valid-type]
Category = Literal[vocab.CATEGORIES]  # type: ignore[valid-type]
Severity = Literal[vocab.SEVERITIES]  # type: ignore[valid-type]
Bound = Literal["compute", "memory"]
PathKind = Literal[vocab.PATH_KINDS]  # type: ignore[valid-type]
PathStart = Literal[vocab.PATH_STARTS]  # type: ignore[valid-type]
#: What a share is a share of (README "Shares and their denominators"): the steps' own time,
#: the phase's own GPU window (external idle left out), the GPU busy union, the kernel busy union.
ShareOf = Literal["step_span", "phase_window", "busy_union", "kernel_time"]

#: The rules' flat namespace: ``{dotted name: number or None}`` (:mod:`diagnose.findings`).
Findings = dict[str, Union[int, float, None]]


# ---------------------------------------------------------------- trace and setup


class Source(Record, kw_only=True):
    """The analysed file."""

    path: str
    format: Literal["kineto-json", "nsys-sqlite"]


class Device(Record, kw_only=True):
    """A GPU with activity in the trace (``name`` empty when the trace names none)."""

    id: int
    name: str


class Gpu(Record, kw_only=True):
    """The device peaks MFU/MBU are measured against (``diagnose/data/gpus.yaml`` or flags)."""

    name: str
    peak_tflops: float | None
    peak_tbps: float | None
    ridge_flop_per_byte: float | None
    source: str
    overrides: list[str]
    selection: str


class ModelInfo(Record, kw_only=True):
    """The model config the analytic bounds come from (one rank's bytes under tensor parallelism)."""

    name: str
    source: str | None
    params_total: int
    params_active_per_token: int
    weight_dtype: str | None
    weight_format: str
    weight_bytes: int
    kv_dtype: str | None
    kv_bytes_per_token: int
    tp: int
    tp_source: str | None


class QualityIssue(Record, kw_only=True):
    """Something suspect about the input (codes: :data:`diagnose.vocab.QUALITY_CODES`)."""

    code: str
    message: str
    count: int | UnsetType = UNSET


class Launches(Record, kw_only=True):
    """Host launch calls, CUDA/HIP graph launches and their coverage."""

    host_launch_calls: int
    graph_launches: int
    graph_launches_with_activity: int
    graph_coverage: Share | None
    kernels_per_graph_launch_max: int | None
    inductor_kernels: int
    fused_attention_share: Share | None


class Capture(Record, kw_only=True):
    """What ``--capture-trace`` mapped (every key absent but ``path`` for an nsys trace)."""

    path: str | UnsetType = UNSET
    files: list[str] | UnsetType = UNSET
    batch_sizes: list[int | None] | UnsetType = UNSET
    modes: list[str | None] | UnsetType = UNSET
    windows: int | UnsetType = UNSET
    graph_launches: int | UnsetType = UNSET
    graph_launches_matched: int | UnsetType = UNSET
    graph_launches_matched_by_count_only: int | UnsetType = UNSET
    notes: list[str] | UnsetType = UNSET
    kernels_mapped: int | UnsetType = UNSET


# ---------------------------------------------------------------- phases


class GapDistribution(Record, kw_only=True):
    """count, total and percentiles of a gap sample, in µs (None when empty)."""

    count: int
    total_us: float
    p50_us: float | None
    p90_us: float | None
    p99_us: float | None
    max_us: float | None


class Gap(Record, kw_only=True):
    """One idle gap: one idle interval of the device, whatever falls inside it (README
    "Causes and levers")."""

    start_ms: float  # from the trace start
    duration_ms: NonNegative = field(name="ms")
    kind: GapKind
    cause: GapCause  # the piece holding the most time
    #: every piece's attribution (sums to ms); defaults keep reports saved before issue 22 readable
    parts_ms: dict[GapCause, NonNegative] = field(default_factory=dict)
    host_call: str | None  # the host event that named the cause
    host_stack: list[str] = field(default_factory=list)  # the host's chain of events, outermost first, shortened for display
    waited_on: str | None
    next: str


class CauseRow(Record, kw_only=True):
    """One cause of waiting in a phase (README "Causes and levers"): idle gaps with this cause
    (for ``collective_wait``: the collective kernels' time beyond the fastest call of the same
    collective and size, busy time)."""

    cause: GapCause
    external: bool  # not the step's own cost (cause table)
    ms: NonNegative  # in the phase's gaps (collective_wait: in its collective kernels)
    count: int  # gaps (collective_wait: calls waiting)
    steps_ms: NonNegative | None  # in the phase's steps: their waits before and inside their GPU span; None without steps
    per_step_ms: NonNegative | None  # steps_ms / steps
    share: Share | None  # of the phase's own time (an external cause: of its window)
    frame: str | None  # the host event (or collective) that holds most of it


class Gaps(Record, kw_only=True):
    """Idle gaps of a phase: distributions, time and count per kind, the longest ones."""

    launch: GapDistribution
    all: GapDistribution
    ms_by_kind: dict[GapKind, float]
    count_by_kind: dict[GapKind, int]
    longest: list[Gap]


class TopKernel(Record, kw_only=True):
    """A kernel name of a phase, by summed time."""

    name: str
    category: Category
    count: int
    total_ms: float
    kernel_time_share: Share | None = field(name="share")


class Attainment(Record, kw_only=True):
    """Measured attainment of one phase (:mod:`diagnose.analyzers.attainment`): FLOPs and bytes
    of its steps, achieved TFLOP/s and TB/s over the steps' own time, MFU/MBU against the peaks,
    arithmetic intensity (FLOP/B), compute- or memory-bound at the ridge point, and the ratio to
    the analytic lower bound. ``attainment_missing`` says why a number is None."""

    flops: float | None
    bytes: float | None
    achieved_tflops: float | None
    achieved_tbps: float | None
    mfu: NonNegative | None
    mbu: NonNegative | None
    arithmetic_intensity: float | None
    bound: Bound | None
    bound_ratio: float | None
    peak_tflops: float | None
    peak_tbps: float | None
    flops_source: str | None | UnsetType = UNSET
    bytes_source: str | None | UnsetType = UNSET
    forward_coverage: float | UnsetType = UNSET
    bound_s: float | UnsetType = UNSET
    terms: list[CostTerm] | UnsetType = UNSET
    attainment_missing: list[str]


class PhaseTimes(Record, kw_only=True):
    """Timeline, category and gap numbers of one phase on one device (the first part of a
    :class:`PhaseRow`)."""

    name: PhaseName
    device: int | None
    step_count: int = field(name="steps")
    wall_ms: float
    own_ms: float | None
    window_ms: float
    gpu_busy_ms: float
    gpu_idle_share: Share | None
    launch_gap_share: Share | None
    attention_share: Share | None
    kernel_ms: float  # summed kernel durations (overlapping streams: more than the time kernels ran)
    #: time at least one kernel ran (the union over streams): the denominator of every share of
    #: kernel time (``categories_ms`` / it, ``attention_share``, ``top_kernels[].share``)
    kernel_busy_ms: float | UnsetType = UNSET
    kernel_count: int
    activity_count: int
    #: per category, the busy union of its activities (overlapping streams count once)
    categories_ms: dict[Category, float]
    gaps: Gaps
    idle_by_cause_ms: dict[GapCause, NonNegative]
    #: by time, largest first (defaults: reports saved before issue 22 still decode)
    causes: list[CauseRow] = field(default_factory=list)
    graph_step_share: Share | None = None  # steps whose GPU work was (partly) replayed from graph launches
    collective_comm_ms: NonNegative = 0.0  # collective kernels: the fastest call of each collective and size, per call
    collective_wait_ms: NonNegative = 0.0  # collective kernels: the time beyond it (waiting for peers)
    small_kernel_ms: float
    small_kernel_count: int
    h2d_ms: float
    comm_exposed_ms: float  # communication with nothing else running on the device
    comm_hidden_ms: float | UnsetType = UNSET  # communication with other work running
    #: per other category, the communication time during which it ran (what hid it)
    comm_hidden_behind_ms: dict[Category, NonNegative] | UnsetType = UNSET
    top_kernels: list[TopKernel]
    unreliable: list[str]
    #: idle share of the steps' own time (the window less the waits not caused by them)
    gpu_idle_own_share: Share | None = None
    #: the steps' own kernels under 15 µs (launched inside the steps), and their time over the steps' own time
    small_kernel_own_count: int | None = None
    small_kernel_own_share: NonNegative | None = None
    #: what fusing runs of small kernels could save (README "Small-kernel tax"), ms
    small_kernel_saving_ms: NonNegative | None = None
    op_classes: list[OpClass] = []
    precision: Precision | None = None


def _phase_row_type() -> type:
    """:class:`PhaseRow`: the :class:`PhaseTimes` fields, then the :class:`Attainment` ones,
    flat (the report keeps the roofline numbers on the phase row)."""
    fields = [(f.name, f.type) if f.required else (f.name, f.type, f.default) for f in msgspec.structs.fields(Attainment)]
    return msgspec.defstruct("PhaseRow", fields, bases=(PhaseTimes,), module=__name__, frozen=True, kw_only=True)


_PhaseRowBase = _phase_row_type()


class PhaseRow(_PhaseRowBase, kw_only=True):  # type: ignore[misc, valid-type]
    """Numbers for one phase (all | prefill | decode | mixed | unknown) on one device: the
    :class:`PhaseTimes` fields, then the :class:`Attainment` fields (flat in the JSON report;
    :attr:`attainment` gives them as one record)."""

    @property
    def attainment(self) -> Attainment:
        """The roofline numbers of this row as an :class:`Attainment`."""
        return Attainment(**{f: getattr(self, f) for f in Attainment.__struct_fields__})

    @classmethod
    def of(cls, times: PhaseTimes, attainment: Attainment) -> "PhaseRow":
        """One row from its two parts."""
        return cls(**msgspec.structs.asdict(times), **msgspec.structs.asdict(attainment))


# ---------------------------------------------------------------- latency and steps


class Percentiles(Record, kw_only=True):
    """p50/p90/p99 and mean of a sample, in ms (None without samples; numpy linear interpolation)."""

    p50_ms: float | None = field(name="p50")
    p90_ms: float | None = field(name="p90")
    p99_ms: float | None = field(name="p99")
    mean_ms: float | None = field(name="mean")


class Latency(Record, kw_only=True):
    """TTFT proxy, TPOT and ITL distributions with the samples behind them (README "Definitions")."""

    ttft_ms: float | None
    ttft_samples: int
    tpot_ms: Percentiles
    tpot_samples: int
    tpot_definition: str
    itl_ms: Percentiles
    itl_samples: int
    itl_definition: str
    prefill_step_ms: Percentiles
    decode_step_ms: Percentiles
    mixed_step_ms: Percentiles


class Wait(Record, kw_only=True):
    """An interval a step waited: before its GPU span or an idle gap inside it."""

    where: Literal["before", "inside"]
    start_ms: float
    duration_ms: NonNegative = field(name="ms")
    cause: GapCause
    parts_ms: dict[GapCause, NonNegative] = field(default_factory=dict)
    host_call: str | None
    host_stack: list[str] = field(default_factory=list)
    waited_on: str | None


class PathSegment(Record, kw_only=True):
    """A segment of a critical path (README "Critical path")."""

    start_ms: float  # from the trace start
    duration_ms: NonNegative = field(name="ms")
    kind: PathKind
    cause: GapCause | None  # host time, gaps, latencies, waits: why; GPU activities: None
    activity: str | None  # host segments: the innermost host event's class (diagnose.analyzers.hostpath.ACTIVITIES)
    name: str  # the GPU activity, the call, or the innermost host event
    frame: str | None  # host segments: the innermost user python frame, else CPU op or range


class CriticalPath(Record, kw_only=True):
    """The critical path of a step (or of the window without steps): README "Critical path"."""

    start_ms: float  # from the trace start
    end_ms: float
    length_ms: NonNegative
    start_reason: PathStart
    ms_by_kind: dict[PathKind, NonNegative]
    host_ms_by_cause: dict[GapCause, NonNegative]
    hta_comparable_ms: NonNegative
    segment_count: int
    segments: list[PathSegment]  # the longest ones, in time order


class PathFrame(Record, kw_only=True):
    """Host time on the critical paths of a phase, by frame, cause and activity."""

    frame: str
    cause: GapCause
    activity: str
    duration_ms: NonNegative = field(name="ms")


class PathPhase(Record, kw_only=True):
    """The critical paths of one phase's steps."""

    phase: StepPhase
    steps: int
    length_p50_ms: NonNegative
    length_total_ms: NonNegative
    ms_by_kind: dict[PathKind, NonNegative]  # summed over the steps
    share_by_kind: dict[PathKind, Share]  # of the summed lengths
    host_ms_by_cause: dict[GapCause, NonNegative]
    host_frames: list[PathFrame]
    steps_with_host: int  # steps whose path holds host time: where an overlap scheduler's overlap broke
    host_breaks: list[str]  # the steps with the most host time on their path, and where


class PathSection(Record, kw_only=True):
    """Critical paths: per phase summaries; the whole window's path when there are no steps."""

    phases: list[PathPhase]
    window: CriticalPath | None


class Step(Record, kw_only=True):
    """One step, from the evidence ``evidence`` names (a step marker, ProfilerStep, an engine
    python frame, the GPU structure or the whole trace's shapes: README "Steps"); timed as in
    README "Step time model". ``phase`` is ``unknown`` when nothing in the step tells it."""

    name: str
    phase: StepPhase
    evidence: StepEvidence
    grammar: str
    start_ns: int
    end_ns: int
    batch: int | None = None
    tokens: int | None = None
    context: int | None = None
    kv_tokens: int | None = None
    prefill_requests: int | None = None
    decode_requests: int | None = None
    scope: Literal["cpu", "gpu"]
    anchor_ns: int
    gpu_span_ms: float | None
    gpu_busy_ms: float | None
    #: None when the step is incomplete or its GPU work is not its own (see quality)
    own_ms: float | None
    waits: list[Wait]
    idle_by_cause_ms: dict[GapCause, NonNegative]
    gpu_start_ns: int | None
    gpu_end_ns: int | None
    activity_count: int
    wall_ns: int
    shape_flops: int | float
    shape_ops: int
    critical_path: CriticalPath | None | UnsetType = UNSET


class KernelRow(Record, kw_only=True):
    """One row of the kernel table, "which kernel to tune" (README "Kernel table")."""

    device: int
    phase: str
    op: str | None
    input_dims: str | None
    input_types: str | None
    kernel: str
    category: str | None
    calls: int
    total_ms: float
    mean_us: float
    kernel_time_share: float | None
    flops: float | None
    bytes: float | None
    flops_per_call: float | None
    bytes_per_call: float | None
    achieved_tflops: float | None
    achieved_tbps: float | None
    peak_tflops_share: float | None
    peak_tbps_share: float | None
    arithmetic_intensity_flop_per_byte: float | None
    bound: Bound | None
    cost_model: str | None
    cost_note: str | None
    op_source: str | None
    shapes_unknown: str | None
    dtype: Dtype | None = None
    dtype_source: str | None = None
    peak_tflops: float | None = None


# ---------------------------------------------------------------- layers


LayerPart = Literal["pre", "layer", "post"]
LayerSource = Literal["modules", "ranges", "capture", "structural"]
Confidence = Literal["high", "medium", "low"]


class LayerRow(Record, kw_only=True):
    """One row of the layer x op-class table (README "Layers"): a decoder layer of one phase
    on one device, or the forward's ``pre`` (embedding...) or ``post`` (final norm, LM head,
    sampler) part, summed over the phase's forwards. Kernel time only (memcpy/memset are not
    kernels). ``ratio_to_type_median``: the layer's time over the median layer of its type;
    ``class_ratio``: each op class's time over that class's median among the type's layers
    (types with at least three layers)."""

    device: int
    phase: str
    part: LayerPart
    layer: int | None
    layer_type: str | None
    forwards: int
    kernel_ms: float
    kernel_count: int
    op_class_ms: dict[str, float]
    flops: float | None
    bytes: float | None
    achieved_tflops: float | None
    achieved_tbps: float | None
    costed_share: Share | None
    type_median_ms: float | None
    ratio_to_type_median: float | None
    class_ratio: dict[str, float]


class LayerSegmentation(Record, kw_only=True):
    """How the layers of one phase on one device were found, and how sure that is; the layer
    furthest from its type's median (``max_ratio``: in total or in one op class)."""

    device: int
    phase: str
    source: LayerSource
    confidence: Confidence
    basis: str
    layers: int
    expected_layers: int | None
    forwards: int
    layer_class: str | None
    layer_types: list[str]
    period_kernels: int | None
    agreement: dict[str, Share]
    forward_ms: float
    layers_ms: float
    pre_ms: float
    post_ms: float
    type_medians_ms: dict[str, float]
    max_ratio: float | None
    max_ratio_layer: int | None
    max_ratio_class: str | None
    max_ratio_excess_ms: float | None
    notes: list[str]


class Coverage(Record, kw_only=True):
    """How much of one device's kernel time the report can attribute: to the forward's
    layers (and its pre/post rows), to operators, and what graph replays hide. ``text`` is the
    line every view prints."""

    device: int
    kernel_ms: float
    forward_ms: float
    layers_ms: float
    forward_share: Share | None
    unattributed_ms: float
    previous_step_ms: float
    graph_kernel_ms: float
    graph_kernel_share: Share | None
    graph_forward_share: Share | None
    graph_op_share: Share | None
    op_share: Share | None
    source: LayerSource | None
    layers: int
    text: str


# ---------------------------------------------------------------- verdicts


class Headline(Record, kw_only=True):
    """What the report leads with: the fired symptom of largest stake across devices (or what
    the trace type says). ``share`` is the share the text prints (to its printed digits), of
    the denominator ``share_of``; ``device`` the device it was found on (None: the trace as a
    whole, or no device)."""

    text: str
    rule_id: str | None
    cause: str | None
    device: int | None = None
    stake_ms: float | None = field(name="ms")
    share: Share | None
    share_of: ShareOf | None = None
    predicted_saving_ms: NonNegative | UnsetType = UNSET  # README "What-if"
    caveat: str | UnsetType = UNSET


class Threshold(Record, kw_only=True):
    """A rule threshold as the rule evaluated it."""

    value: Number
    unit: str
    rationale: str


class Evidence(Record, kw_only=True):
    """The findings, thresholds and labels a rule read."""

    findings: Findings
    thresholds: dict[str, Threshold]
    labels: dict[str, str | None] | UnsetType = UNSET


class Symptom(Record, kw_only=True):
    """A fired rule, ranked (README "Symptom rules and the headline")."""

    id: str
    symptom: str
    title: str
    severity: Severity
    phase: str
    scope: str
    summary: str
    evidence: Evidence
    likely_cause: str
    how_to_verify: str
    fix: str
    references: list[str]
    cause: str | UnsetType = UNSET
    headline: str | UnsetType = UNSET
    device: int | None | UnsetType = UNSET
    stake_ms: float | UnsetType = UNSET
    #: ``stake_ms`` over ``stake_share_of`` (the steps' own time, else the device's own window):
    #: the severity follows it, on one base for every rule
    stake_share: Share | UnsetType = UNSET
    stake_share_of: ShareOf | UnsetType = UNSET
    #: ``stake_ms`` over the rule's own denominator ``share_of`` (``share_base_ms``): what the
    #: headline prints
    share: Share | UnsetType = UNSET
    share_of: ShareOf | UnsetType = UNSET
    share_base_ms: float | UnsetType = UNSET
    predicted_saving_ms: NonNegative | UnsetType = UNSET  # re-timed critical path (README "What-if")
    loss_ms: NonNegative | UnsetType = UNSET  # kernel time above the roofline (README "Op classes and their loss")
    rank_basis: Literal["predicted_saving", "loss", "stake"] | UnsetType = UNSET  # what the symptom is ranked by
    recommends: list[str]
    already_in_place: list[str] | UnsetType = UNSET
    grouped_under: str | UnsetType = UNSET
    related: list[str] | UnsetType = UNSET


class NotEvaluated(Record, kw_only=True):
    """A rule not evaluated, and why (missing findings, trace type): on no device of the
    trace (the reason is the first device's)."""

    id: str
    symptom: str
    title: str
    severity: Severity
    missing: list[str]
    reason: str


class DeviceVerdict(Record, kw_only=True):
    """The rules' verdict on one device: its own headline (the finding of largest stake on it)
    and the rules that fired there."""

    device: int | None
    headline: Headline | None
    fired: list[str]
    worst: Severity | None


# ---------------------------------------------------------------- the report


class Report(Record, kw_only=True):
    """Everything ``diagnose run --format json`` reports for one trace (README "JSON report").

    The verdicts (``headline``, ``symptoms``, ``not_evaluated``) and the flat ``findings`` the
    rules read are UNSET until :func:`diagnose.pipeline.attach_verdicts` ran; ``rank`` ... are
    set for the per-rank reports of a fleet run (:mod:`diagnose.multi`).
    """

    schema_version: Literal[2]
    source: Source
    partial: bool
    devices: list[Device]
    phases: list[PhaseRow]
    latency: Latency
    steps: list[Step]
    quality: list[QualityIssue]
    launches: Launches
    gpu: Gpu | None
    model: ModelInfo | None
    kernel_table: list[KernelRow]
    critical_path: PathSection | UnsetType = UNSET
    coverage: list[Coverage] = []
    layer_segmentation: list[LayerSegmentation] = []
    layers: list[LayerRow] = []
    capture: Capture | UnsetType = UNSET
    headline: Headline | None | UnsetType = UNSET
    symptoms: list[Symptom] | UnsetType = UNSET
    not_evaluated: list[NotEvaluated] | UnsetType = UNSET
    #: one per device the rules read (every device with GPU activity, or the one --device chose)
    device_verdicts: list[DeviceVerdict] | UnsetType = UNSET
    verdicts_error: str | UnsetType = UNSET
    findings: Findings | UnsetType = UNSET
    rank: int | None | UnsetType = UNSET
    rank_source: str | None | UnsetType = UNSET
    rank_label: str | UnsetType = UNSET
    world_size: int | None | UnsetType = UNSET

    def phase(self, name: str, device: int | None = None) -> PhaseRow | None:
        """The row of phase ``name`` (on ``device``, else the first one), or None."""
        return next((p for p in self.phases if p.name == name and (device is None or p.device == device)), None)

    def has_quality(self, code: str) -> bool:
        return any(q.code == code for q in self.quality)


# ---------------------------------------------------------------- JSON


_encoder = msgspec.json.Encoder(enc_hook=_enc_hook)


def encode(obj: Any) -> bytes:
    """Compact JSON of a record (or any JSON-able value with numpy scalars)."""
    return _encoder.encode(obj)


def decode_report(data: bytes | str | dict) -> Report:
    """A saved JSON report (text, bytes, or the dict ``json.loads`` gave) back into a
    :class:`Report`. Integral floats are accepted for integer fields (reports written before
    the model had them as ``15360.0``).

    Raises:
        msgspec.ValidationError: the document is not a report of this schema version.
    """
    if isinstance(data, dict):
        return msgspec.convert(data, Report, strict=False)
    return msgspec.json.decode(data, type=Report, strict=False)


SCHEMA_ID = "https://github.com/diagnose-llm/diagnose/blob/main/diagnose/data/report.schema.json"


def report_schema() -> dict[str, Any]:
    """The JSON Schema of :class:`Report` (draft 2020-12), generated by ``msgspec.json.schema``.
    Shipped as ``diagnose/data/report.schema.json``."""
    s = msgspec.json.schema(Report)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", "$id": SCHEMA_ID,
            "title": "diagnose JSON report", **s}


def schema_text() -> str:
    """The shipped schema file's text (:func:`report_schema`, indented, one trailing newline)."""
    return json.dumps(report_schema(), indent=1, ensure_ascii=False) + "\n"


if __name__ == "__main__":  # python -m diagnose.model > diagnose/data/report.schema.json
    import sys

    sys.stdout.write(schema_text())
