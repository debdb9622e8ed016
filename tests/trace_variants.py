"""Variants of real Kineto traces for the step-finding tests: the same GPU work with less
evidence (markers removed, python frames removed, every CPU event removed), planted repeated
steps, and time-scaled copies. The variants are written to a test's tmp_path; the shared
trace files are never modified.
"""
from __future__ import annotations

import copy
import gzip
import json
import tarfile
from pathlib import Path

GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"}
MARKER_CATS = {"user_annotation", "gpu_user_annotation"}
#: PyTorch <= 1.9 wrote record_function ranges as Operator events.
LEGACY_RANGE_PREFIXES = ("ProfilerStep#", "enumerate(DataLoader)#", "Optimizer.")
_ID_KEYS = ("correlation", "External id", "external id")


def load_doc(path: Path | str, member: str | None = None) -> dict:
    """The JSON document of a Kineto trace (``.json``, ``.json.gz``, or ``member`` of a ``.tar.gz``);
    a top-level event list becomes ``{"traceEvents": [...]}``."""
    path = Path(path)
    if member is not None:
        with tarfile.open(path) as tf:
            f = tf.extractfile(member)
            assert f is not None, member
            doc = json.load(f)
    else:
        raw = path.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        doc = json.loads(raw)
    return doc if isinstance(doc, dict) else {"traceEvents": doc}


def _with_events(doc: dict, events: list) -> dict:
    out = {k: v for k, v in doc.items() if k != "traceEvents"}
    out["traceEvents"] = events
    return out


def _is_marker(e: dict) -> bool:
    if e.get("cat") in MARKER_CATS:
        return True
    return e.get("cat") == "Operator" and str(e.get("name", "")).startswith(LEGACY_RANGE_PREFIXES)


def strip_markers(doc: dict) -> dict:
    """Every record_function / profiler range removed (CPU and GPU-side annotations, the legacy
    ProfilerStep / DataLoader / Optimizer Operator ranges); ops, frames and GPU work kept."""
    return _with_events(doc, [e for e in doc["traceEvents"] if not _is_marker(e)])


def strip_frames(doc: dict) -> dict:
    """Every python_function event (with_stack frames) removed."""
    return _with_events(doc, [e for e in doc["traceEvents"] if e.get("cat") != "python_function"])


def kernels_only(doc: dict) -> dict:
    """Only the GPU activities (kernels, copies, sets): no CPU op, runtime call, annotation,
    frame, flow or metadata event (some engines export only the GPU side)."""
    return _with_events(doc, [e for e in doc["traceEvents"] if e.get("cat") in GPU_CATS])


def retime(doc: dict, factor: float) -> dict:
    """Every ts and dur multiplied by ``factor`` (the same trace at another time scale)."""
    events = copy.deepcopy(doc["traceEvents"])
    base = min(e["ts"] for e in events if isinstance(e.get("ts"), (int, float)))
    for e in events:
        if isinstance(e.get("ts"), (int, float)):
            e["ts"] = base + (e["ts"] - base) * factor
        if isinstance(e.get("dur"), (int, float)):
            e["dur"] = e["dur"] * factor
    return _with_events(doc, events)


def set_concrete(doc: dict, op_names: set[str], index: int, value: str) -> dict:
    """``Concrete Inputs[index]`` set to ``value`` on the ops named in ``op_names`` (e.g. an
    attention op's is_causal flag)."""
    events = copy.deepcopy(doc["traceEvents"])
    for e in events:
        a = e.get("args")
        if e.get("name") in op_names and isinstance(a, dict) and isinstance(a.get("Concrete Inputs"), list):
            ci = a["Concrete Inputs"]
            if index < len(ci):
                ci[index] = value
    return _with_events(doc, events)


def repeat(doc: dict, copies: int, idle_us: float, wrap: str | None = None) -> dict:
    """``copies`` back-to-back copies of the document's timed events, each shifted by the
    source's span plus ``idle_us`` of idle time, ids offset per copy (a planted loop of
    identical steps). ``wrap``: also wrap each copy in a ``user_annotation`` of that name with
    ``#<copy>`` appended (a ProfilerStep-like range)."""
    src = [e for e in doc["traceEvents"] if isinstance(e.get("ts"), (int, float)) and e.get("cat") != "Trace"]
    meta = [e for e in doc["traceEvents"] if not isinstance(e.get("ts"), (int, float))]
    t0 = min(e["ts"] for e in src)
    t1 = max(e["ts"] + (e.get("dur") or 0) for e in src)
    max_id = 0
    for e in src:
        for k in _ID_KEYS:
            v = (e.get("args") or {}).get(k)
            if isinstance(v, int):
                max_id = max(max_id, v)
        if isinstance(e.get("id"), int):
            max_id = max(max_id, e["id"])
    shift, step_id = (t1 - t0) + idle_us, max_id + 1
    out = list(meta)
    for c in range(copies):
        for e in src:
            x = copy.deepcopy(e)
            x["ts"] = e["ts"] + c * shift
            a = x.get("args")
            if isinstance(a, dict):
                for k in _ID_KEYS:
                    if isinstance(a.get(k), int):
                        a[k] += c * step_id
            if isinstance(x.get("id"), int):
                x["id"] += c * step_id
            out.append(x)
        if wrap:
            out.append({"ph": "X", "cat": "user_annotation", "name": f"{wrap}#{c + 1}", "pid": 1, "tid": 1,
                        "ts": t0 + c * shift - 1, "dur": (t1 - t0) + 2, "args": {}})
    return _with_events(doc, out)


def write(doc: dict, path: Path) -> Path:
    """Write ``doc`` as JSON (gzipped when the name ends with .gz); returns the path."""
    data = json.dumps(doc).encode()
    path.write_bytes(gzip.compress(data, compresslevel=1) if path.name.endswith(".gz") else data)
    return path
