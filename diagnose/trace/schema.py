"""The column contracts of a :class:`~diagnose.trace.model.Trace`'s frames, and the
factorization of plain sequences: what the Kineto loader's decoding (forked workers
included, :mod:`diagnose.trace.kineto`) needs, without importing pandas, so that the command
line can start decoding a large file before pandas and the analyzers are imported."""
from __future__ import annotations

import itertools
from typing import Any

import numpy as np

NO_TIME = -(2**63)  # int64 sentinel for "no such timestamp" (times themselves may be negative)
RANK_ID_SHIFT = 40  # a merged file's correlation/external ids of rank r: r << 40 | id (ids below 2**40)

GPU_COLUMNS = {
    "kind": "object",
    "name": "category",
    "device": "int64",
    "stream": "int64",
    "start_ns": "int64",
    "end_ns": "int64",
    "correlation": "int64",
    "external_id": "int64",
    "bytes": "int64",
    "pid": "int64",
}
RUNTIME_COLUMNS = {
    "name": "category",
    "api_kind": "object",
    "start_ns": "int64",
    "end_ns": "int64",
    "correlation": "int64",
    "pid": "int64",
    "tid": "int64",
}
CPU_OP_COLUMNS = {
    "name": "category",
    "start_ns": "int64",
    "end_ns": "int64",
    "external_id": "int64",
    "tid": "int64",
    "input_dims": "object",
    "input_types": "object",
    "concrete_inputs": "object",
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
    "name": "category",
    "device": "int64",
    "stream": "int64",
    "start_ns": "int64",
    "end_ns": "int64",
    "correlation": "int64",
    "wait_stream": "int64",
    "wait_record_correlation": "int64",
}
OVERHEAD_COLUMNS = {
    "name": "category",
    "start_ns": "int64",
    "end_ns": "int64",
    "pid": "int64",
    "tid": "int64",
}
PYTHON_FRAME_COLUMNS = {
    "name": "category",
    "start_ns": "int64",
    "end_ns": "int64",
    "pid": "int64",
    "tid": "int64",
}


def factorize_values(values: Any) -> tuple[np.ndarray, np.ndarray]:
    """(codes, uniques) of a sequence of hashable values (a list, an object array): codes
    int64 into uniques, in first-seen order; None is a value like any other. A dict filled
    in C (:func:`~diagnose.trace.model.factorize` for pandas columns)."""
    n = len(values)
    seen: dict[Any, int] = {}
    # each value -> the position of its first occurrence, in C (dict.setdefault over a counter)
    first = np.fromiter(map(seen.setdefault, values, itertools.count()), dtype=np.int64, count=n)
    dense = np.cumsum(first == np.arange(n)) - 1  # at a first occurrence: its value's code
    return dense[first], np.fromiter(seen, dtype=object, count=len(seen))
