"""Normalized trace model shared by every loader (Kineto JSON, nsys SQLite) and analyzer.

All times are int64 **nanoseconds** on one clock per trace, normalized once at the loader
boundary (Kineto ``ts`` is microseconds whatever ``displayTimeUnit`` says; nsys is already ns).

Column contracts (pandas DataFrames, one row per event). Every ``name`` column is a pandas
categorical of str (millions of events share a few hundred names): categories are the names
used, in first-seen order, so :func:`factorize` reads the codes as they are and no analyzer
hashes a name string again.

``gpu`` — GPU activities that occupy a device (never annotations, never syncs):
    kind (str: "kernel" | "memcpy" | "memset"), name (categorical), device (int64), stream (int64),
    start_ns (int64), end_ns (int64, >= start_ns), correlation (int64, -1 = unknown),
    external_id (int64, -1 = unknown), bytes (int64, -1 = unknown; memcpy/memset only),
    pid (int64: the process the activity belongs to, -1 = unknown; Kineto writes the device
    index there, nsys the launching process). A stream is identified by (pid, device,
    stream): two processes sharing a GPU (MPS, co-located instances) each have a stream 7.

``runtime`` — host-side CUDA/HIP runtime and driver API calls:
    name (categorical), api_kind (str: "launch" | "graph_launch" | "memcpy" | "memset" | "sync" |
    "other"; "os" for OS runtime calls of an nsys export), start_ns, end_ns (int64),
    correlation (int64, -1 = none), pid (int64),
    tid (int64).

``cpu_ops`` — framework operators (``cpu_op`` / legacy ``Operator``):
    name (categorical), start_ns, end_ns (int64), external_id (int64), tid (int64),
    input_dims, input_types, concrete_inputs (object: raw ``Input Dims`` / ``Input type`` /
    ``Concrete Inputs`` JSON bytes, decoded on demand with
    ``diagnose.trace.kineto.parse_input_dims``; None when not recorded, and always None in
    nsys traces, which hold no operator arguments). ``Concrete Inputs`` is one string per
    argument, the value of scalar arguments (``"True"`` for SDPA's ``is_causal``, ``""`` for
    tensors): attention FLOPs read the causal flag from it.

``annotations`` — user ranges, used for phases and steps, never counted as GPU busy time:
    name (categorical of str: nsys exports hold millions of ranges with a few hundred
    names), scope (categorical: "cpu" | "gpu"), device (int64, -1 for CPU ranges),
    start_ns, end_ns (int64), pid (int64), tid (int64).

``gpu_syncs`` — ``cuda_sync`` events shown on a GPU stream (waits, event syncs); used to
    label gaps and for cross-stream dependencies, never busy time: name (categorical), device,
    stream, start_ns, end_ns, correlation (int64: the host call's, e.g. ``cudaStreamWaitEvent``; -1
    unknown), wait_stream (int64: Kineto ``wait_on_stream`` of a "Stream Wait Event", the
    stream waited on; -1 unknown), wait_record_correlation (int64: Kineto
    ``wait_on_cuda_event_record_corr_id``, the correlation of the ``cudaEventRecord`` waited
    on; -1 unknown).

``python_frames`` — Python frames of ``with_stack`` / ``with_modules`` tracing (Kineto
    ``python_function`` events): name (categorical of str: ``file(line): function`` or
    ``nn.Module: Name_N``), start_ns, end_ns, pid, tid (int64). Engine step entry points are
    read from them (:mod:`diagnose.analyzers.pyframes`), and the critical path names host
    frames with them (:mod:`diagnose.analyzers.hostpath`); nsys exports have none.

``Trace.modules`` (a view, not a frame of its own) — the ``nn.Module`` frames of a
    with_modules trace: the rows of ``python_frames`` named ``nn.Module: <Class>_<k>``, same
    columns. Per-layer time reads the model's structure from them
    (:mod:`diagnose.analyzers.layers`).

``overhead`` — profiler overhead the tracer itself recorded (Kineto ``"cat": "overhead"``:
    CUPTI/roctracer "Activity Buffer Request", "Lazy Function Loading"...): name (categorical),
    start_ns, end_ns, pid, tid (int64). nsys: its ``PROFILER_OVERHEAD`` table ("CUPTI Buffer
    flush", "CUPTI Instrumentation", ...).

Runtime calls are read from every Kineto runtime/driver category (``cuda_runtime``,
``cuda_driver``, ``xpu_runtime``, ``xpu_driver``, ``privateuse1_runtime``,
``privateuse1_driver``, ``mtia_runtime``, legacy ``Runtime``/``Driver``): one linking
(correlation id) for every backend.

Several ranks merged into one file (``Trace.ranks`` non-empty, see
:func:`diagnose.trace.ranks.split_ranks`): every frame then has one more column, ``rank``
(int64 index into ``Trace.ranks``, -1 for rows without a rank label), and the correlation
and external ids of rank ``r`` are qualified as ``r << 40 | id`` so that a kernel is never
linked to another rank's launch. :func:`~diagnose.trace.ranks.split_ranks` removes both.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import pandas as pd

from diagnose.trace.schema import (  # noqa: F401  (re-exported: the frames' contracts)
    NO_TIME,
    RANK_ID_SHIFT,
    GPU_COLUMNS,
    RUNTIME_COLUMNS,
    CPU_OP_COLUMNS,
    ANNOTATION_COLUMNS,
    SYNC_COLUMNS,
    OVERHEAD_COLUMNS,
    PYTHON_FRAME_COLUMNS,
    factorize_values,
)

#: The name prefix of an ``nn.Module`` frame in ``python_frames`` (``Trace.modules``).
MODULE_FRAME_PREFIX = "nn.Module: "
#: The frames of a :class:`Trace` (attribute name -> column contract).
FRAMES = {"gpu": GPU_COLUMNS, "runtime": RUNTIME_COLUMNS, "cpu_ops": CPU_OP_COLUMNS, "annotations": ANNOTATION_COLUMNS,
          "gpu_syncs": SYNC_COLUMNS, "overhead": OVERHEAD_COLUMNS, "python_frames": PYTHON_FRAME_COLUMNS}


def factorize(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """(codes, uniques) of a 1-D sequence of hashable values (names, categories): codes int64
    into uniques, in first-seen order, like ``pd.factorize(values, sort=False)`` except that
    None is a value like any other.

    A categorical (every name column of a loaded trace) gives its own codes: at no cost when
    its categories are in first-seen order and all used (as the loaders leave them, see
    :func:`categorical`); otherwise (a subset of rows, a re-sorted frame) its integer codes
    are factorized, never the strings (a missing value, code -1, is the unique None). Other
    sequences: a dict filled in C (kept over ``pd.factorize``, which would turn None
    into a missing value, and which is slower on the loader's fresh ``str``: measured 19 vs
    10 ms for 40k op names).
    """
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):
        cat = values.array if isinstance(values, pd.Series) else values
        return _recode(np.asarray(cat.codes), np.asarray(cat.categories, dtype=object))
    if isinstance(values, pd.Series):
        values = values.to_numpy(dtype=object)
    return factorize_values(values)


def _first_seen(codes: np.ndarray, k: int) -> bool:
    """Whether ``codes`` (into ``k`` values, -1 = missing) use every value, and first in the
    order 0, 1, ..., k-1: then they already are their own first-seen factorization."""
    n = len(codes)
    if n == 0 or k == 0 or k > n:
        return n == 0 and k == 0
    c = codes if codes.dtype.kind == "i" else codes.astype(np.int64)
    top = np.maximum.accumulate(c)  # in the codes' own width (int8/int16 for most name columns)
    if c[0] != 0 or top[-1] != k - 1:
        return False
    # c - top lies in [-1 - max, max] once c[0] == 0: no overflow, unlike top + 1
    return bool((np.subtract(c[1:], top[:-1]) <= 1).all() and c.min() >= 0)


def _recode(codes: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(codes, uniques) in first-seen order from integer ``codes`` into distinct ``values``
    (-1: missing, the unique None), by factorizing the integers (hash table, no strings)."""
    if _first_seen(codes, len(values)):
        return codes.astype(np.int64), values
    order, seen = pd.factorize(codes, sort=False)  # seen: the distinct codes in first-seen order
    table = np.append(values, None)  # code -1 -> None
    return order.astype(np.int64, copy=False), table[np.asarray(seen, dtype=np.int64)]


def categorical(codes: np.ndarray, values: np.ndarray) -> pd.Categorical:
    """A name column from integer ``codes`` into ``values`` (-1 or a None value: missing;
    values may repeat): a categorical whose categories are the values used, in first-seen
    order, so that :func:`factorize` reads its codes as they are. One hash pass over the
    integer codes; the strings are looked at once per distinct value.
    """
    codes = np.asarray(codes)
    if codes.dtype.kind != "i":
        codes = codes.astype(np.int64)
    vals = np.asarray(values, dtype=object)
    canon: dict[Any, int] = {}
    remap = np.array([-1 if v is None else canon.setdefault(v, len(canon)) for v in vals.tolist()] + [-1], dtype=np.int64)
    if len(canon) < len(vals) or (remap[:-1] != np.arange(len(vals))).any():
        codes, vals = remap[codes], np.fromiter(canon, dtype=object, count=len(canon))
    order, uniq = _recode(codes, vals)
    missing = np.equal(uniq, None)
    if missing.any():  # the missing value is no category: its rows get code -1
        pos = np.cumsum(~missing) - 1
        pos[missing] = -1
        order, uniq = pos[order], uniq[~missing]
    return pd.Categorical.from_codes(order, dtype=pd.CategoricalDtype(pd.Index(uniq, dtype=object)))


def as_categorical(values: Any) -> pd.Categorical:
    """``values`` (a sequence of str, or a categorical) as a name column: see :func:`categorical`."""
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):
        cat = values.array if isinstance(values, pd.Series) else values
        codes, cats = np.asarray(cat.codes), np.asarray(cat.categories, dtype=object)
        return cat if _first_seen(codes, len(cats)) else categorical(codes, cats)
    return categorical(*factorize(values))


def concat_named(parts: list[pd.DataFrame]) -> pd.DataFrame:
    """Frames one after the other (a new RangeIndex), a ``name`` column that is categorical in
    every part staying categorical (categories merged; ``pd.concat`` would give an object
    column of one str per row)."""
    if len(parts) == 1:
        return parts[0].reset_index(drop=True)
    cats = [p["name"].array for p in parts]
    if not all(isinstance(c, pd.Categorical) for c in cats):
        return pd.concat(parts, ignore_index=True)
    from pandas.api.types import union_categoricals

    out = pd.concat([p.drop(columns="name") for p in parts], ignore_index=True)
    out.insert(list(parts[0].columns).index("name"), "name", union_categoricals(cats))
    return out


def per_unique(values: Any, fn: Callable[[Any], Any], dtype: Any = bool) -> np.ndarray:
    """``fn`` applied once per distinct value of ``values`` (names: tens of distinct values
    among millions of events), spread back to one result per value: a ``dtype`` array.
    A missing value of a categorical (code -1) gives ``fn(None)``.
    """
    codes, uniq = factorize(values)
    out = np.array([fn(u) for u in uniq] + [fn(None)], dtype=dtype)  # the last one: code -1
    return out[codes]


_EMPTY_CATEGORICAL = pd.Categorical([], categories=pd.Index([], dtype=object))


def frame(columns: dict[str, str], data: dict[str, Any] | None = None) -> pd.DataFrame:
    """Build a DataFrame with exactly ``columns`` (name -> dtype), empty when ``data`` is None.
    Arrays already of their column's dtype are used as they are (each its own block: no copy,
    no stacking), so frames of millions of rows (nsys NVTX ranges) cost milliseconds.

    Raises:
        KeyError: when ``data`` lacks one of the columns.
    """
    if not data:  # built from numpy arrays: an empty frame costs ~0.3 ms, not ~2 ms
        return pd.DataFrame({c: _EMPTY_CATEGORICAL.copy() if t == "category" else pd.Series(np.empty(0, dtype=t), dtype=t)
                             for c, t in columns.items()}, copy=False)
    out = {}
    n = len(next(iter(data.values())))
    for c, t in columns.items():
        if c not in data and t == "object":
            out[c] = pd.Series([None] * n, dtype=object)  # optional column not provided
            continue
        v = data[c]
        if t == "category":
            out[c] = pd.Series(as_categorical(v), copy=False)
        elif t == "object":
            out[c] = pd.Series(v, dtype=object, copy=False) if not isinstance(v, pd.Series) else v.astype(object)
        else:
            out[c] = np.asarray(v, dtype=t)
    return pd.DataFrame(out, copy=False)


@dataclass(frozen=True)
class DeviceInfo:
    """One GPU as described by the trace (Kineto ``deviceProperties`` / nsys ``TARGET_INFO_GPU``).

    ``name`` may be the empty string (vLLM ROCm traces): it then matches no peak table row.
    """

    id: int
    name: str = ""
    total_memory_bytes: int | None = None
    compute_capability: str | None = None
    num_sms: int | None = None


@dataclass(frozen=True)
class QualityIssue:
    """Something suspect about the input, with a stable ``code`` (documented in the README)."""

    code: str
    message: str
    count: int | None = None

    def to_dict(self) -> dict[str, Any]:
        d = {"code": self.code, "message": self.message}
        if self.count is not None:
            d["count"] = self.count
        return d


@dataclass
class Trace:
    """A normalized trace: the frames above plus devices, metadata and data-quality notes.

    Attributes:
        source_path: path the user gave.
        source_format: "kineto-json" | "nsys-sqlite".
        metadata: top-level trace keys other than the events (Kineto: deviceProperties,
            distributedInfo, user ``add_metadata_json`` objects such as ``diagnose``).
        partial: True when the file was cut or otherwise incomplete; every number derived
            from it must be flagged partial.
        counts: event counts: ``python_function`` (number of Kineto ``python_function``
            events, i.e. with_stack tracing) and ``python_function_ns`` (their summed
            duration, ns). Kineto only; absent keys mean 0.
        ranks: rank labels (e.g. "TP01-DP00-PP00-EP00") when several ranks were merged into
            this one file (SGLang ProfileMerger), else empty; see the column contract above.
    """

    source_path: str
    source_format: str
    gpu: pd.DataFrame = field(default_factory=lambda: frame(GPU_COLUMNS))
    runtime: pd.DataFrame = field(default_factory=lambda: frame(RUNTIME_COLUMNS))
    cpu_ops: pd.DataFrame = field(default_factory=lambda: frame(CPU_OP_COLUMNS))
    annotations: pd.DataFrame = field(default_factory=lambda: frame(ANNOTATION_COLUMNS))
    gpu_syncs: pd.DataFrame = field(default_factory=lambda: frame(SYNC_COLUMNS))
    overhead: pd.DataFrame = field(default_factory=lambda: frame(OVERHEAD_COLUMNS))
    python_frames: pd.DataFrame = field(default_factory=lambda: frame(PYTHON_FRAME_COLUMNS))
    devices: list[DeviceInfo] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    quality: list[QualityIssue] = field(default_factory=list)
    partial: bool = False
    counts: dict[str, int] = field(default_factory=dict)
    ranks: list[str] = field(default_factory=list)
    _rank_counts: dict[str, dict[str, int]] = field(default_factory=dict, repr=False)  # counts per rank label

    def note(self, code: str, message: str, count: int | None = None) -> None:
        """Record a data-quality issue once per code (later calls with the same code are merged)."""
        for q in self.quality:
            if q.code == code:
                return
        self.quality.append(QualityIssue(code, message, count))

    def device_name(self, device_id: int) -> str:
        for d in self.devices:
            if d.id == device_id:
                return d.name
        return ""

    @property
    def has_gpu_activity(self) -> bool:
        return len(self.gpu) > 0

    @property
    def modules(self) -> pd.DataFrame:
        """The ``nn.Module`` frames of a with_modules trace: the rows of :attr:`python_frames`
        whose name starts with ``"nn.Module: "`` (same columns, time order kept); empty
        without with_modules (and in nsys exports). A view computed on each access (one
        prefix test per distinct name), so it always follows :attr:`python_frames`."""
        pf = self.python_frames
        if not len(pf):
            return pf
        hit = per_unique(pf["name"], lambda n: isinstance(n, str) and n.startswith(MODULE_FRAME_PREFIX))
        return pf[hit].reset_index(drop=True)
