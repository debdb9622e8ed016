"""Reading a CUDA/HIP graph *capture* trace: the GPU work each stream capture recorded, in
launch order, with the operator (and shapes) that launched it.

``diagnose run --capture-trace FILE`` maps the kernels a graph replay runs back to ops and
shapes through these windows (:mod:`diagnose.analyzers.kernels`, TraceLens'
``merge_capture_trace_into_graph``). The reader keeps what the normalized loader does not
(yet) carry: each runtime launch's ``External id`` and, on ROCm, its kernel name
(``args.kernel``).
"""
from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from typing import Any

import msgspec
import numpy as np

from diagnose.errors import TraceFormatError

_dec = msgspec.json.Decoder()


class _CArgs(msgspec.Struct, gc=False):
    external_id: Any = msgspec.field(default=None, name="External id")
    kernel: Any = None
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    concrete: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")


class _CEvent(msgspec.Struct, gc=False):
    ph: Any = None
    cat: Any = None
    name: Any = None
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: _CArgs | None = None


class _CDoc(msgspec.Struct, gc=False):
    traceEvents: list[_CEvent] = []


@dataclass(frozen=True)
class CaptureWindow:
    """The GPU work one stream capture recorded, in CPU launch order.

    Attributes:
        kinds: per launch, "kernel" | "memcpy" | "memset".
        kernels: per launch, the kernel name (ROCm runtime events carry it as ``args.kernel``)
            or None (CUDA runtime events do not: alignment is then by kind and count only).
        op_names, op_dims, op_types, op_concrete: per launch, the launching operator (the
            ``cpu_op`` whose ``External id`` the launch carries) and its raw ``Input Dims``,
            ``Input type``, ``Concrete Inputs`` JSON bytes; None where no op.
        op_call: per launch, an int numbering the op call within the window (launches of one
            call share it).
        modules: per launch, the ``nn.Module`` frames open on the launching thread, outermost
            first, joined by ``" > "`` (``"Qwen3Model_0 > Qwen3DecoderLayer_3 > ..."``), None
            without frames (a capture recorded without with_modules, or a compiled graph
            whose frames name no layer).
    """

    kinds: tuple[str, ...]
    kernels: tuple[str | None, ...]
    op_names: tuple[str | None, ...]
    op_dims: tuple[bytes | None, ...]
    op_types: tuple[bytes | None, ...]
    op_concrete: tuple[bytes | None, ...]
    op_call: tuple[int, ...]
    modules: tuple[str | None, ...] = ()


@dataclass
class CaptureMapping:
    """Capture windows of one graph-capture trace (see :func:`load_capture_mapping`).

    Attributes:
        path: the capture trace.
        batch_size: the padded batch (vLLM: tokens) the graphs were captured for, from the
            TraceLens sidecar ``execution_details.json`` or a ``capture_<bs>_<MODE>``
            annotation; None if unknown (then not checked against the replayed step).
        mode: "FULL" | "PIECEWISE" | None, same sources.
        windows: the capture windows in time order.
        notes: what was skipped or assumed while reading.
    """

    path: str
    batch_size: int | None
    mode: str | None
    windows: list[CaptureWindow] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def _raw(r: msgspec.Raw) -> bytes | None:
    b = bytes(r)
    return b or None


def _sidecar(path: str) -> tuple[int | None, str | None]:
    side = os.path.join(os.path.dirname(os.path.abspath(path)), "execution_details.json")
    if not os.path.isfile(side):
        return None, None
    try:
        with open(side, "rb") as f:
            entries = _dec.decode(f.read())
    except (OSError, msgspec.DecodeError):
        return None, None
    base = os.path.basename(path)
    for e in entries if isinstance(entries, list) else []:
        if isinstance(e, dict) and e.get("file") == base:
            bs = e.get("batch_size")
            return (bs if isinstance(bs, int) else None), (e.get("mode") if isinstance(e.get("mode"), str) else None)
    return None, None


_CAPTURE_ANN = re.compile(r"^capture_(\d+)_([A-Z]+)$")
_MODULE = "nn.Module: "


def _module_paths(launches: list, frames: list) -> list[str | None]:
    """Per launch (in ``launches`` order), the ``nn.Module`` frames open on its thread when it
    was called, outermost first, joined by ``" > "``; None without one. Frames of a thread nest
    (a Python call stack), so one sweep in time order with a stack of open frames finds them."""
    out: list[str | None] = [None] * len(launches)
    if not frames:
        return out
    by_thread: dict[Any, list] = {}
    for f in frames:
        if isinstance(f.dur, (int, float)):
            by_thread.setdefault((f.pid, f.tid), []).append((float(f.ts), 0, float(f.ts) + f.dur, f.name[len(_MODULE):]))
    for i, ev in enumerate(launches):
        if (ev.pid, ev.tid) in by_thread:
            by_thread[(ev.pid, ev.tid)].append((float(ev.ts), 1, float(ev.ts) + (ev.dur or 0), i))
    for items in by_thread.values():
        items.sort(key=lambda x: (x[0], x[1], -x[2]))  # frames before a launch at the same time, outer first
        stack: list[tuple[float, str]] = []
        for ts, kind, end, what in items:
            while stack and stack[-1][0] < ts:
                stack.pop()
            if kind == 0:
                stack.append((end, what))
            elif stack:
                out[what] = " > ".join(name for _, name in stack)
    return out


def load_capture_mapping(capture_trace: str) -> CaptureMapping:
    """Read a CUDA/HIP graph *capture* trace (Kineto JSON, plain or gzip) into its windows.

    A window runs from the end of a ``(cuda|hip)StreamBeginCapture`` call to the start of the
    next ``StreamEndCapture``; its launches are the runtime/driver calls inside it whose name
    holds ``Launch`` (not ``GraphLaunch``/``HostFunc``), ``Memcpy`` or ``Memset``, in start
    order (TraceLens ``find_capture_roots`` + ``get_subtree_events`` with the same filter).
    Each launch's ``External id`` names its operator (TraceLens reaches the same op through
    the call-stack tree).

    Raises:
        TraceFormatError: unreadable file or not a Kineto JSON object with ``traceEvents``.
    """
    from diagnose.inputs import parsing
    from diagnose.trace.reading import read_bytes

    buf = read_bytes(capture_trace)
    try:
        with parsing(f"{capture_trace}"):
            doc = msgspec.json.decode(buf, type=_CDoc)
    except (msgspec.DecodeError, msgspec.ValidationError, UnicodeDecodeError) as e:
        raise TraceFormatError(f"{capture_trace}: not a Kineto trace with traceEvents ({e})") from None
    ops: dict[int, tuple[float, _CEvent]] = {}
    begins, ends, launches, bs_ann, frames = [], [], [], [], []
    for ev in doc.traceEvents:
        cat, name = ev.cat, ev.name
        if not isinstance(name, str) or not isinstance(ev.ts, (int, float)):
            continue
        if cat in ("cpu_op", "Operator"):
            x = ev.args.external_id if ev.args is not None else None
            if isinstance(x, int) and (x not in ops or ev.ts >= ops[x][0]):  # innermost (latest start)
                ops[x] = (ev.ts, ev)
        elif cat in ("cuda_runtime", "cuda_driver", "Runtime"):
            if "BeginCapture" in name:
                begins.append(ev.ts + (ev.dur or 0))
            elif "EndCapture" in name:
                ends.append(ev.ts)
            elif (("Launch" in name and "GraphLaunch" not in name and "HostFunc" not in name)
                  or "Memcpy" in name or "Memset" in name):
                launches.append(ev)
        elif cat == "user_annotation":
            m = _CAPTURE_ANN.match(name)
            if m:
                bs_ann.append((int(m.group(1)), m.group(2)))
        elif cat == "python_function" and name.startswith(_MODULE):
            frames.append(ev)
    bs, mode = _sidecar(capture_trace)
    if bs is None and bs_ann:
        bs, mode = bs_ann[0]
    out = CaptureMapping(path=capture_trace, batch_size=bs, mode=mode)
    begins.sort()
    ends.sort()
    launches.sort(key=lambda e: e.ts)
    paths = _module_paths(launches, frames)
    lts = np.array([e.ts for e in launches], dtype=np.float64)
    lend = np.array([e.ts + (e.dur or 0) for e in launches], dtype=np.float64)
    j = 0
    for b in begins:
        while j < len(ends) and ends[j] < b:
            j += 1
        if j == len(ends):
            out.notes.append("a StreamBeginCapture without a later StreamEndCapture: window skipped")
            break
        e_ts = ends[j]
        j += 1
        sel = np.nonzero((lts >= b) & (lend <= e_ts))[0]
        kinds, kernels, names, dims, types, conc, call = [], [], [], [], [], [], []
        call_ids: dict[Any, int] = {}
        for i in sel:
            ev = launches[i]
            kinds.append("memcpy" if "Memcpy" in ev.name else "memset" if "Memset" in ev.name else "kernel")
            a = ev.args
            kn = a.kernel if a is not None and isinstance(a.kernel, str) else None
            kernels.append(kn)
            x = a.external_id if a is not None else None
            op = ops.get(x)[1] if isinstance(x, int) and x in ops else None
            names.append(op.name if op is not None else None)
            oa = op.args if op is not None else None
            dims.append(_raw(oa.input_dims) if oa is not None else None)
            types.append(_raw(oa.input_types) if oa is not None else None)
            conc.append(_raw(oa.concrete) if oa is not None else None)
            call.append(call_ids.setdefault(x if op is not None else ("launch", int(i)), len(call_ids)))
        out.windows.append(CaptureWindow(tuple(kinds), tuple(kernels), tuple(names), tuple(dims), tuple(types),
                                         tuple(conc), tuple(call), tuple(paths[i] for i in sel)))
    if not begins:
        out.notes.append("no StreamBeginCapture in the trace: not a graph-capture trace")
    return out


#: Sibling files probed for a capture pass, at most; uncompressed bytes read from each.
PROBE_FILES = 16
PROBE_BYTES = 64 * 10**6
#: Sibling files larger than this (compressed) are not probed.
PROBE_MAX_FILE_BYTES = 512 * 10**6
_CAPTURE_CALL = (b"StreamBeginCapture",)


def find_capture_passes(trace_path: str) -> list[str]:
    """Kineto files beside ``trace_path`` that are graph *capture* passes: their events hold a
    ``*StreamBeginCapture`` call within their first :data:`PROBE_BYTES` uncompressed bytes.
    Files whose name says "capture" are probed first; at most :data:`PROBE_FILES` files of at
    most :data:`PROBE_MAX_FILE_BYTES` each. Nothing is loaded: the caller only names them
    (``--capture-trace PATH``). Unreadable files are skipped.

    Returns:
        Paths (as found beside ``trace_path``), at most 3.
    """
    import gzip
    import zlib

    folder = os.path.dirname(trace_path) or "."
    me = os.path.basename(trace_path)
    try:
        names = [n for n in os.listdir(folder) if n != me and n.endswith((".json", ".json.gz"))]
    except OSError:
        return []
    names.sort(key=lambda n: ("capture" not in n.lower(), n))
    found: list[str] = []
    for n in names[:PROBE_FILES]:
        p = os.path.join(folder, n)
        try:
            if not os.path.isfile(p) or os.path.getsize(p) > PROBE_MAX_FILE_BYTES:
                continue
            opener = gzip.open if n.endswith(".gz") else open
            with opener(p, "rb") as f:
                tail, read = b"", 0
                while read < PROBE_BYTES:
                    chunk = f.read(1 << 20)
                    if not chunk:
                        break
                    read += len(chunk)
                    if any(c in tail + chunk for c in _CAPTURE_CALL):
                        found.append(p)
                        break
                    tail = chunk[-32:]
        except (OSError, EOFError, zlib.error, gzip.BadGzipFile):
            continue
        if len(found) >= 3:
            break
    return found
