"""Normalized trace model shared by every loader (Kineto JSON, nsys SQLite) and analyzer.

All times are int64 **nanoseconds** on one clock per trace, normalized once at the loader
boundary (Kineto ``ts`` is microseconds whatever ``displayTimeUnit`` says; nsys is already ns).

Column contracts (pandas DataFrames, one row per event):

``gpu`` — GPU activities that occupy a device (never annotations, never syncs):
    kind (str: "kernel" | "memcpy" | "memset"), name (str), device (int64), stream (int64),
    start_ns (int64), end_ns (int64, >= start_ns), correlation (int64, -1 = unknown),
    external_id (int64, -1 = unknown), bytes (int64, -1 = unknown; memcpy/memset only).

``runtime`` — host-side CUDA/HIP runtime and driver API calls:
    name (str), api_kind (str: "launch" | "graph_launch" | "memcpy" | "memset" | "sync" |
    "other"), start_ns, end_ns (int64), correlation (int64, -1 = none), pid (int64),
    tid (int64).

``cpu_ops`` — framework operators (``cpu_op`` / legacy ``Operator``):
    name (str), start_ns, end_ns (int64), external_id (int64), tid (int64),
    input_dims, input_types (object: raw ``Input Dims`` / ``Input type`` JSON, decoded on
    demand with ``diagnose.trace.kineto.parse_input_dims``; None when not recorded).

``annotations`` — user ranges, used for phases and steps, never counted as GPU busy time:
    name (categorical of str: nsys exports hold millions of ranges with a few hundred
    names), scope (categorical: "cpu" | "gpu"), device (int64, -1 for CPU ranges),
    start_ns, end_ns (int64), pid (int64), tid (int64).

``gpu_syncs`` — ``cuda_sync`` events shown on a GPU stream (waits, event syncs); used to
    label gaps, never busy time: name, device, stream, start_ns, end_ns.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

NO_TIME = -(2**63)  # int64 sentinel for "no such timestamp" (times themselves may be negative)

GPU_COLUMNS = {
    "kind": "object",
    "name": "object",
    "device": "int64",
    "stream": "int64",
    "start_ns": "int64",
    "end_ns": "int64",
    "correlation": "int64",
    "external_id": "int64",
    "bytes": "int64",
}
RUNTIME_COLUMNS = {
    "name": "object",
    "api_kind": "object",
    "start_ns": "int64",
    "end_ns": "int64",
    "correlation": "int64",
    "pid": "int64",
    "tid": "int64",
}
CPU_OP_COLUMNS = {
    "name": "object",
    "start_ns": "int64",
    "end_ns": "int64",
    "external_id": "int64",
    "tid": "int64",
    "input_dims": "object",
    "input_types": "object",
}
ANNOTATION_COLUMNS = {
    "name": "category",
    "scope": "category",
    "device": "int64",
    "start_ns": "int64",
    "end_ns": "int64",
    "pid": "int64",
    "tid": "int64",
}
SYNC_COLUMNS = {
    "name": "object",
    "device": "int64",
    "stream": "int64",
    "start_ns": "int64",
    "end_ns": "int64",
}


def factorize(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """(codes, uniques) of a 1-D sequence of hashable values (names, categories): codes int64
    into uniques, in first-seen order, like ``pd.factorize(values, sort=False)`` except that
    None is a value like any other. 3-5x faster than ``pd.factorize`` on object arrays of
    ``str`` (which first infers a string dtype for them). A categorical gives its own codes
    and categories at no cost (categories' order; code -1 for a missing value).
    """
    if isinstance(getattr(values, "dtype", None), pd.CategoricalDtype):  # codes for free
        cat = values.cat if isinstance(values, pd.Series) else values
        return np.asarray(cat.codes, dtype=np.int64), np.asarray(cat.categories, dtype=object)
    if isinstance(values, pd.Series):
        values = values.to_numpy(dtype=object)
    seen: dict[Any, int] = {}
    codes = np.fromiter((seen.setdefault(v, len(seen)) for v in values), dtype=np.int64, count=len(values))
    return codes, np.fromiter(seen, dtype=object, count=len(seen))


def frame(columns: dict[str, str], data: dict[str, Any] | None = None) -> pd.DataFrame:
    """Build a DataFrame with exactly ``columns`` (name -> dtype), empty when ``data`` is None.
    Arrays already of their column's dtype are used as they are (each its own block: no copy,
    no stacking), so frames of millions of rows (nsys NVTX ranges) cost milliseconds.

    Raises:
        KeyError: when ``data`` lacks one of the columns.
    """
    if not data:
        return pd.DataFrame({c: pd.Series([], dtype=t) for c, t in columns.items()})
    out = {}
    n = len(next(iter(data.values())))
    for c, t in columns.items():
        if c not in data and t == "object":
            out[c] = pd.Series([None] * n, dtype=object)  # optional column not provided
            continue
        v = data[c]
        if t == "category":
            out[c] = v if isinstance(getattr(v, "dtype", None), pd.CategoricalDtype) else pd.Series(v, dtype="category")
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
    """

    source_path: str
    source_format: str
    gpu: pd.DataFrame = field(default_factory=lambda: frame(GPU_COLUMNS))
    runtime: pd.DataFrame = field(default_factory=lambda: frame(RUNTIME_COLUMNS))
    cpu_ops: pd.DataFrame = field(default_factory=lambda: frame(CPU_OP_COLUMNS))
    annotations: pd.DataFrame = field(default_factory=lambda: frame(ANNOTATION_COLUMNS))
    gpu_syncs: pd.DataFrame = field(default_factory=lambda: frame(SYNC_COLUMNS))
    devices: list[DeviceInfo] = field(default_factory=list)
    metadata: dict[str, Any] = field(default_factory=dict)
    quality: list[QualityIssue] = field(default_factory=list)
    partial: bool = False

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
