"""Kineto (torch.profiler) JSON loader: ``.json`` and ``.json.gz`` of every era we have seen.

Handled variations (each seen in a real trace of the test corpus):

* PyTorch 1.8/1.9 capitalised categories (``Kernel``, ``Runtime``, ``Operator``, ``Memcpy``,
  ``Memset``), ``tid`` written as ``"stream 7"``, lower-case ``"external id"``;
* ``displayTimeUnit: "ns"`` — ``ts``/``dur`` are still microseconds (Kineto always writes µs;
  the key only tells viewers how to display them);
* fractional-µs ``ts`` relative to ``baseTimeNanoseconds``, wherever that key sits in the
  file (before or after ``traceEvents``): absolute ns = base + round(ts * 1000), computed
  exactly from the integer and fractional parts (no float rounding of the base);
* ROCm traces (``hip*`` runtime names under ``cuda_runtime``), no ``deviceProperties``, no
  metadata events, no CPU ops, no kernels; a legacy top-level JSON list of events;
* other backends' host calls: ``xpu_runtime``/``xpu_driver`` (Intel XPU),
  ``privateuse1_runtime``/``privateuse1_driver``, ``mtia_runtime``, read and linked like CUDA's;
* duration events written as ``B``/``E`` pairs: paired per (pid, tid), LIFO, into ranges
  (markers, annotations and ops alike); an unpaired one is dropped (``unmatched_begin_end``);
* several ranks merged into one file (SGLang ProfileMerger: pids ``"[TP01-DP00-PP00-EP00] 83"``):
  ``Trace.ranks``, a ``rank`` column, ids qualified per rank (``ranks_merged``; see
  :mod:`diagnose.trace.ranks`);
* complete events without ``dur`` (``missing_duration``), with a ``ts``/``dur`` that is not a
  number (``bad_value``) or with a number beyond float64 such as ``1e400``
  (``out_of_range_value``): excluded and counted, the rest of the file is analysed;
* profiler ``overhead`` events kept (``Trace.overhead``); ``python_function`` events counted
  (``Trace.counts``) and kept as ``Trace.python_frames`` (name, times, pid, tid: engine step
  entry points are read from them; their args are never materialised);
* refused in one line: an empty event list, JSON nested thousands of levels deep, and (in
  :mod:`diagnose.trace.reading`) gzip data that inflates implausibly.

Decoding uses msgspec typed structs with ``args`` kept as raw bytes, so argument objects
of events the analysis does not need (``python_function``, instant events, flows...) are
never materialised. A ``cpu_op``'s ``Input Dims``, ``Input type`` and ``Concrete Inputs``
(scalar arguments as strings, e.g. SDPA's ``is_causal``) stay raw JSON bytes in the
``cpu_ops`` frame, decoded on demand (:func:`parse_input_dims`); equal ``Concrete Inputs``
share one object.
"""
from __future__ import annotations

import decimal
import mmap
import operator
import os
import pickle
import re
import select
import signal
import struct
import sys
import threading
from typing import Any, NamedTuple, Union

import msgspec
import numpy as np

from diagnose.errors import TraceFormatError
from diagnose.trace.apis import api_kind
from diagnose.trace.reading import read_bytes_partial
from diagnose.trace.model import (
    ANNOTATION_COLUMNS,
    CPU_OP_COLUMNS,
    GPU_COLUMNS,
    OVERHEAD_COLUMNS,
    PYTHON_FRAME_COLUMNS,
    RANK_ID_SHIFT,
    RUNTIME_COLUMNS,
    SYNC_COLUMNS,
    DeviceInfo,
    Trace,
    factorize,
    frame,
)


class _OpArgs(msgspec.Struct, gc=False):
    """Operator arguments, kept as raw JSON and decoded on demand (both schemas below)."""

    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    concrete_inputs: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Concrete Inputs")


class _Args(_OpArgs, gc=False):
    """The ``args`` fields the analysis uses, decoded inline (unknown keys are skipped in C)."""

    # Any: exporters sometimes write these as strings (e.g. memory events' "bytes"); one odd
    # value must not push the whole file onto the slow path. Coerced with _int() when read.
    device: Any = None
    stream: Any = None
    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_legacy: Any = msgspec.field(default=None, name="external id")
    bytes: Any = None


_I64 = 2**63


def _int(v: Any, default: int = -1) -> int:
    """An id-like arg as int64; anything else (None, NaN, text, out of range) -> default."""
    if type(v) is int:
        return v if -_I64 < v < _I64 else default
    if v is None or isinstance(v, bool):
        return default
    if isinstance(v, str):
        try:
            v = float(v)
        except ValueError:
            return default
    if isinstance(v, float):
        return int(v) if v == v and -9.2e18 < v < 9.2e18 else default
    return default


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float | None = None
    dur: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: _Args | None = None


class _LooseEvent(msgspec.Struct, gc=False):
    """Fallback when a file has odd field types (numbers as strings, names as numbers)."""

    ph: Any = ""
    cat: Any = ""
    name: Any = ""
    ts: Any = None
    dur: Any = None
    pid: Any = None
    tid: Any = None
    args: msgspec.Raw = msgspec.Raw()


_any_dec = msgspec.json.Decoder()
_raw_items_dec = msgspec.json.Decoder(list[msgspec.Raw])


class _Doc(msgspec.Struct, gc=False):
    """One-pass decode of a well-formed Kineto document's events (its other keys are read by
    :func:`_top_metadata`). Anything odd falls back to the robust path (:func:`_split_top`)."""

    traceEvents: list[_Event]


_doc_dec = msgspec.json.Decoder(_Doc)


_ARGS_FIELDS = msgspec.structs.fields(_Args)  # once: reading them per event cost ~50 us each
_RAW_ARGS = ("input_dims", "input_types", "concrete_inputs")  # kept as raw JSON, never coerced to int
_args_dec = msgspec.json.Decoder(_Args)

# Events the coercion below cannot use are not dropped silently: they become a placeholder
# complete event of one of these categories, which _group counts (quality codes bad_value
# and out_of_range_value) and never analyses.
_BAD_VALUE = "\x00bad_value"
_OUT_OF_RANGE = "\x00out_of_range"


def _out_of_range(e: BaseException) -> bool:
    """msgspec's error for a JSON number beyond float64 (``1e400``) or a too-long integer."""
    return "out of range" in str(e)


def _coerce_args(raw: msgspec.Raw) -> _Args | None | str:
    """Args of a loose event: take what can be read as the fields of :class:`_Args`
    (unknown keys skipped unread); ``_OUT_OF_RANGE`` when a used field holds a number
    beyond float64."""
    if not raw:
        return None
    try:
        a = _args_dec.decode(raw)
    except msgspec.ValidationError as e:
        return _OUT_OF_RANGE if _out_of_range(e) else None  # else: not an object
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    kw: dict[str, Any] = {}
    for f in _ARGS_FIELDS:
        v = getattr(a, f.name)
        if v is None or f.name in _RAW_ARGS:
            continue
        try:
            kw[f.name] = int(float(v))
        except (TypeError, ValueError, OverflowError):
            pass
    return _Args(device=kw.get("device"), stream=kw.get("stream"), correlation=kw.get("correlation"),
                 external_id=kw.get("external_id"), external_id_legacy=kw.get("external_id_legacy"),
                 bytes=kw.get("bytes"), input_dims=a.input_dims, input_types=a.input_types,
                 concrete_inputs=a.concrete_inputs)


_BAD = object()  # a value that is present but not a usable number


def _num(v: Any) -> Any:
    """ts/dur of a loose event: float, the string itself for a finite number written as a
    JSON string (parsed exactly later: :func:`_exact_ns`), None (absent) or _BAD (text,
    list, NaN, inf...)."""
    if v is None:
        return None
    if isinstance(v, bool):
        return _BAD
    if isinstance(v, (int, float, str)):
        try:
            f = float(v)
        except (ValueError, OverflowError):  # "abc"; an integer beyond float64
            return _BAD
        if f - f != 0.0:  # NaN and inf written as text
            return _BAD
        return v if isinstance(v, str) else f
    return _BAD


def _exact_ns(text: str) -> int | None:
    """A number of µs written as a string (``"1700000000123456.789"``) as integer ns, exactly
    (decimal arithmetic, half to even): float64 keeps ~16 significant digits, so an absolute
    epoch time in µs would lose its sub-µs digits. None when it is not a finite decimal or its
    magnitude is beyond any timestamp (the float check then drops it)."""
    try:
        d = decimal.Decimal(text.strip())
    except (decimal.InvalidOperation, ValueError):
        return None
    if not d.is_finite() or d.adjusted() > 20:
        return None
    return int((d * 1000).to_integral_value(rounding=decimal.ROUND_HALF_EVEN))


def _string_times(ts_vals: list, dur_vals: list) -> tuple[list[int], list, list] | None:
    """(rows, exact ts ns or None, exact dur ns or None) of the events whose ts or dur is a
    numeric string; None when there is none (the common case: one scan of the types)."""
    if str not in set(map(type, ts_vals)) and str not in set(map(type, dur_vals)):
        return None
    rows, ts_ns, dur_ns = [], [], []
    for i, (t, d) in enumerate(zip(ts_vals, dur_vals)):
        if type(t) is str or type(d) is str:
            rows.append(i)
            ts_ns.append(_exact_ns(t) if type(t) is str else None)
            dur_ns.append(_exact_ns(d) if type(d) is str else None)
    return rows, ts_ns, dur_ns


def _counted(ph: str, cat: str) -> bool:
    """Whether a dropped event is worth a quality note: an event the analysis reads."""
    return ph in ("X", "B", "E") and _CAT_BUCKET.get(cat.lower()) is not None


def _coerce_event(ev: _LooseEvent, oor: bool = False) -> _Event:
    def pt(v):
        return v if isinstance(v, (int, str)) and not isinstance(v, bool) else None

    ph = ev.ph if isinstance(ev.ph, str) else str(ev.ph)
    cat = ev.cat if isinstance(ev.cat, str) else str(ev.cat)
    ts, dur = _num(ev.ts), _num(ev.dur)
    args = _coerce_args(ev.args)
    if oor or args is _OUT_OF_RANGE or ts is _BAD or dur is _BAD:
        if _counted(ph, cat):
            bad = _OUT_OF_RANGE if oor or args is _OUT_OF_RANGE else _BAD_VALUE
            return _Event(ph="X", cat=bad, name="", ts=None, dur=None)
        ts = None if ts is _BAD else ts
        dur = None if dur is _BAD else dur
        args = None if args is _OUT_OF_RANGE else args
    return _Event(
        ph=ph,
        cat=cat,
        name=ev.name if isinstance(ev.name, str) else str(ev.name),
        ts=ts,
        dur=dur,
        pid=pt(ev.pid),
        tid=pt(ev.tid),
        args=args,
    )


class _RawEvent(msgspec.Struct, gc=False):
    """Last resort: every field kept as raw JSON, for documents with numbers beyond float64
    (``"ts": 1e400``), which no typed or ``Any`` decode accepts."""

    ph: msgspec.Raw = msgspec.Raw()
    cat: msgspec.Raw = msgspec.Raw()
    name: msgspec.Raw = msgspec.Raw()
    ts: msgspec.Raw = msgspec.Raw()
    dur: msgspec.Raw = msgspec.Raw()
    pid: msgspec.Raw = msgspec.Raw()
    tid: msgspec.Raw = msgspec.Raw()
    args: msgspec.Raw = msgspec.Raw()


_raw_list_dec = msgspec.json.Decoder(list[_RawEvent])


def _coerce_raw_event(ev: _RawEvent) -> _Event:
    vals: dict[str, Any] = {}
    oor = False
    for f in ("ph", "cat", "name", "ts", "dur", "pid", "tid"):
        raw = getattr(ev, f)
        if not raw:
            vals[f] = None
            continue
        try:
            vals[f] = _any_dec.decode(raw)
        except msgspec.ValidationError:  # the only validation an Any decode does: number range
            vals[f] = None
            oor = True
    loose = _LooseEvent(ph=vals["ph"] if vals["ph"] is not None else "", cat=vals["cat"] if vals["cat"] is not None else "",
                        name=vals["name"] if vals["name"] is not None else "", ts=vals["ts"], dur=vals["dur"],
                        pid=vals["pid"], tid=vals["tid"], args=ev.args)
    return _coerce_event(loose, oor)


def _as_int(v: Any, default: int = -1) -> int:
    if type(v) is int:
        return v if -_I64 < v < _I64 else default
    if isinstance(v, bool):
        return default
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v) if v == v and -9.2e18 < v < 9.2e18 else default
    if isinstance(v, str):
        digits = "".join(ch for ch in v if ch.isdigit())
        if digits and len(digits) < 19:
            return int(digits)
    return default


def _us_to_ns(ts_us: np.ndarray, base_ns: int) -> np.ndarray:
    """Convert float microseconds to int64 ns exactly: base + floor(ts)*1000 + round(frac*1000)."""
    ip = np.floor(ts_us)
    frac_ns = np.rint((ts_us - ip) * 1000.0).astype(np.int64)
    return np.int64(base_ns) + ip.astype(np.int64) * 1000 + frac_ns


def _dur_to_ns(dur_us: np.ndarray) -> np.ndarray:
    return np.rint(dur_us * 1000.0).astype(np.int64)


_BYTE_POS = re.compile(r"\(byte (\d+)\)")
# "key": 0,5 is never valid JSON (after a value and a comma an object needs a key string), so
# a digit,digit right after a key's colon is a number written with a decimal comma.
_DECIMAL_COMMA = re.compile(rb'("\s*:\s*-?\d+),(\d+)(?=\s*[,}\]])')
_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")
_REPLACEMENT = "\ufffd".encode()


def _is_text_error(e: BaseException) -> bool:
    """Invalid UTF-8: msgspec < 0.23 raises UnicodeDecodeError, 0.23+ a DecodeError saying so."""
    return isinstance(e, UnicodeDecodeError) or "utf-8" in str(e).lower()


def _where(buf: bytes, pos: int) -> str:
    line = buf.count(b"\n", 0, pos) + 1
    col = pos - (buf.rfind(b"\n", 0, pos) + 1) + 1
    return f"byte {pos:,} (line {line}, column {col})"


def _split_top(path: str, buf: bytes, lenient: bool = False) -> tuple[dict[str, msgspec.Raw], bool, bytes, list[tuple[str, str, int | None]]]:
    """Return (top-level keys -> raw values, legacy_list, the bytes parsed, repairs made).

    Repairs (always): invalid UTF-8 and raw control characters inside strings become U+FFFD.
    Repairs (``lenient`` only): numbers written with a decimal comma inside event args.
    A document cut short is parsed up to its last complete event (``truncated`` repair).

    Raises:
        TraceFormatError: empty, not JSON, or malformed in a way no repair covers.
    """
    repairs: list[tuple[str, str, int | None]] = []
    head = buf[:64].lstrip()
    if not head:
        raise TraceFormatError(f"{path}: empty file")
    if head[:1] not in (b"{", b"[") or head[1:2] == b"\x00":
        raise TraceFormatError(f"{path}: not a JSON trace (expected a Kineto/Chrome trace object){_encoding_hint(bytes(buf[:8]))}")
    for _attempt in range(4):
        if head[:1] == b"[":
            try:
                _raw_items_dec.decode(buf)  # syntax only: a number beyond float64 is an event's problem
                return {"traceEvents": msgspec.Raw(buf)}, True, buf, repairs
            except (msgspec.DecodeError, UnicodeDecodeError) as e:
                err = e
        else:
            try:
                return msgspec.json.decode(buf, type=dict[str, msgspec.Raw]), False, buf, repairs
            except (msgspec.DecodeError, UnicodeDecodeError) as e:
                err = e
        msg = str(err)
        if _is_text_error(err) or "invalid character" in msg:
            if any(r[0] == "text" for r in repairs):
                break
            fixed = _CONTROL.sub(_REPLACEMENT, buf.decode("utf-8", errors="replace").encode("utf-8"))
            repairs.append(("text", "invalid UTF-8 bytes or raw control characters replaced by U+FFFD", None))
            buf = fixed
            continue
        if "truncated" in msg:
            recovered = _recover_truncated(buf)
            if recovered is None:
                raise TraceFormatError(f"{path}: JSON cut short and no complete event could be recovered") from None
            top, n_cut = recovered
            repairs.append(("truncated", f"JSON cut short: {len(buf) - n_cut:,} trailing bytes after the last complete event were dropped", n_cut))
            return top, False, buf, repairs
        m = _BYTE_POS.search(msg)
        pos = int(m.group(1)) if m else None
        window = buf[max(0, (pos or 0) - 40):(pos or 0) + 40] if pos is not None else b""
        if pos is not None and _DECIMAL_COMMA.search(window):
            if lenient and not any(r[0] == "decimal_comma" for r in repairs):
                n = len(_DECIMAL_COMMA.findall(buf))
                buf = _DECIMAL_COMMA.sub(rb"\1.\2", buf)
                repairs.append(("decimal_comma", f"{n} number(s) written with a decimal comma repaired (--lenient)", n))
                continue
            raise TraceFormatError(
                f"{path}: invalid JSON at {_where(buf, pos)}: a number written with a decimal comma "
                f"(a locale bug in the exporter); rerun with --lenient to repair it"
            ) from None
        where = f" at {_where(buf, pos)}" if pos is not None else ""
        raise TraceFormatError(f"{path}: invalid JSON{where} ({msg})") from None
    raise TraceFormatError(f"{path}: invalid JSON ({err})") from None


def _encoding_hint(head: bytes) -> str:
    """What a document that is not UTF-8 JSON looks like it is in (UTF-16/32 without a
    byte-order mark: every other byte zero), for the error message."""
    if len(head) >= 4 and head[1:2] == b"\x00" and head[3:4] == b"\x00":
        return ": it looks like UTF-16 or UTF-32 text without a byte-order mark; save it as UTF-8"
    if len(head) >= 4 and head[0:1] == b"\x00" and head[2:3] == b"\x00":
        return ": it looks like big-endian UTF-16 or UTF-32 text without a byte-order mark; save it as UTF-8"
    return ""


def _recover_truncated(buf: bytes, max_tries: int = 64) -> tuple[dict[str, msgspec.Raw], int] | None:
    """Parse a Kineto document cut short: the keys before ``traceEvents`` and every complete
    event. Returns (top-level raw values, bytes used) or None."""
    k = buf.find(b'"traceEvents"')
    if k < 0:
        return None
    lb = buf.find(b"[", k)
    if lb < 0:
        return None
    top: dict[str, msgspec.Raw] = {}
    head = buf[:k].rstrip().rstrip(b",").rstrip()
    if head.startswith(b"{") and len(head) > 1:
        try:
            top = msgspec.json.decode(head + b"}", type=dict[str, msgspec.Raw])
        except (msgspec.DecodeError, UnicodeDecodeError):
            top = {}
    end = len(buf)
    for _ in range(max_tries):
        end = buf.rfind(b"}", lb, end)
        if end < 0:
            break
        candidate = buf[lb:end + 1] + b"]"
        try:
            msgspec.json.decode(candidate)
        except (msgspec.DecodeError, UnicodeDecodeError):
            continue
        top["traceEvents"] = msgspec.Raw(candidate)
        return top, end + 1
    top["traceEvents"] = msgspec.Raw(b"[]")
    return top, lb + 1


def _decode_events(path: str, raw: msgspec.Raw | bytes, repairs: list | None = None, _repaired: bool = False) -> list[_Event]:
    """Typed decode of ``traceEvents``; odd field types fall back to a loose decode; invalid
    UTF-8 (which skipping a value during the top-level split does not detect) is repaired."""
    try:
        return _decode_lenient(raw)
    except msgspec.ValidationError as e:
        raise TraceFormatError(f"{path}: traceEvents is not a list of events ({e})") from None
    except (UnicodeDecodeError, msgspec.DecodeError) as e:
        if _repaired or not _is_text_error(e):
            raise TraceFormatError(f"{path}: invalid JSON in traceEvents ({e})") from None
        fixed = _CONTROL.sub(_REPLACEMENT, bytes(raw).decode("utf-8", errors="replace").encode("utf-8"))
        if repairs is not None and not any(r[0] == "text" for r in repairs):
            repairs.append(("text", "invalid UTF-8 bytes or raw control characters replaced by U+FFFD", None))
        return _decode_events(path, fixed, None, _repaired=True)


# category (any case) -> bucket; everything else (flows, instants...) is skipped.
# Runtime/driver calls: every category Kineto emits for a backend (libkineto ActivityType
# names: CUDA/HIP, Intel XPU, PrivateUse1 backends, MTIA) and the PyTorch 1.8/1.9 spelling;
# they are linked to GPU work by correlation id whatever the backend.
_CAT_BUCKET = {
    "kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset", "memset": "memset",
    "cuda_runtime": "runtime", "runtime": "runtime", "cuda_driver": "runtime", "driver": "runtime",
    "xpu_runtime": "runtime", "xpu_driver": "runtime", "privateuse1_runtime": "runtime",
    "privateuse1_driver": "runtime", "mtia_runtime": "runtime",
    "cpu_op": "op", "operator": "op",
    "user_annotation": "ann_cpu", "gpu_user_annotation": "ann_gpu",
    "cuda_sync": "sync",
    "overhead": "overhead",
    _BAD_VALUE: "bad", _OUT_OF_RANGE: "oor",
}
_PYFUNC = "python_function"  # counted (number, total duration) and kept without args (Trace.python_frames)
_BUCKETS = ("kernel", "memcpy", "memset", "runtime", "op", "ann_cpu", "ann_gpu", "sync", "overhead", "pyfunc", "bad", "oor")

# Strict event schema, tried first: a tagged union on "ph" decodes only complete ("X")
# events into fields -- every other phase (flows, instants, metadata...) becomes an empty
# struct, which is ~40 % of the decode time saved -- and every id is a plain int, so that
# columns come out of C-level iteration (np.fromiter) with no per-value checks. Anything
# this schema rejects (a missing or unknown "ph", a string or float id, null values...)
# raises ValidationError and that slice is decoded again with the lenient _Event schema.
_MISSING = -(2**63)  # "absent or unusable" in the raw int64 columns below
_PHASES = ("B", "E", "X", "i", "I", "C", "b", "n", "e", "s", "t", "f", "P", "N", "O", "D", "M", "V", "v", "R", "c", "(", ")")


class _StrictArgs(_OpArgs, gc=False):
    device: int = _MISSING
    stream: int = _MISSING
    correlation: int = _MISSING
    external_id: int = msgspec.field(default=_MISSING, name="External id")
    external_id_legacy: int = msgspec.field(default=_MISSING, name="external id")
    bytes: int = _MISSING


class _StrictX(msgspec.Struct, gc=False, tag_field="ph", tag="X"):
    cat: str = ""
    name: str = ""
    ts: float = float("nan")
    dur: float = float("nan")  # absent: excluded and reported (missing_duration)
    pid: int | str | None = None
    tid: int | str | None = None
    args: _StrictArgs = msgspec.field(default_factory=_StrictArgs)


# Begin/end events are rare (Kineto never writes them; some exporters do). Decoding one
# sets this thread's flag, so that _group looks for them only in event lists that have them
# (a scan of every event for them would cost ~3 % of a large file's load).
_decoded = threading.local()


class _StrictE(msgspec.Struct, gc=False, tag_field="ph", tag="E"):
    """A duration event's end (Trace Event Format): its ``args`` are never used."""

    cat: str = ""
    name: str = ""
    ts: float = float("nan")
    pid: int | str | None = None
    tid: int | str | None = None

    def __post_init__(self) -> None:
        _decoded.begin_end = True


class _StrictB(_StrictE, gc=False, tag="B"):
    """A duration event's begin; paired with its "E" by :func:`_pair_begin_end`."""

    args: _StrictArgs = msgspec.field(default_factory=_StrictArgs)


_OTHER_PHASES = tuple(msgspec.defstruct(f"_Phase{i}", [], tag_field="ph", tag=ph, gc=False)
                      for i, ph in enumerate(_PHASES) if ph not in ("X", "B", "E"))  # empty: their fields are skipped
_StrictEvent = Union[(_StrictX, _StrictB, _StrictE, *_OTHER_PHASES)]
_strict_list_dec = msgspec.json.Decoder(list[_StrictEvent])
_loose_list_dec = msgspec.json.Decoder(list[_Event])
_any_loose_list_dec = msgspec.json.Decoder(list[_LooseEvent])
_StrictDoc = msgspec.defstruct("_StrictDoc", [("traceEvents", list[_StrictEvent])], gc=False)
_strict_doc_dec = msgspec.json.Decoder(_StrictDoc)


def _decode_slice(data: bytes) -> tuple[list, bool]:
    """Decode a JSON list of events: (events, strict). Strict first, then the _Event schema,
    then _LooseEvent coerced event by event (the last two give _Event lists).

    Raises:
        msgspec.DecodeError, UnicodeDecodeError: not valid JSON (callers fall back further).
    """
    try:
        return _strict_list_dec.decode(data), True
    except msgspec.ValidationError:
        return _decode_lenient(data), False


def _decode_lenient(data: bytes | msgspec.Raw) -> list[_Event]:
    """A JSON list of events with the _Event schema, else as _LooseEvent coerced event by
    event (odd field types: a float pid, a string ts...).

    Raises:
        msgspec.ValidationError: not a list of event objects.
        msgspec.DecodeError, UnicodeDecodeError: not valid JSON.
    """
    try:
        return _loose_list_dec.decode(data)
    except msgspec.ValidationError:
        pass
    try:
        loose = _any_loose_list_dec.decode(data)
    except msgspec.ValidationError as e:
        if not _out_of_range(e):
            raise
        return [_coerce_raw_event(ev) for ev in _raw_list_dec.decode(data)]
    return [_coerce_event(ev) for ev in loose]


def _group(events: list, strict: bool) -> tuple[dict[str, list], list]:
    """Complete ("X") events by bucket (see _CAT_BUCKET), each bucket in file order (so that
    slicing a document never changes row order), and the begin/end ("B"/"E") events in file
    order; other events are dropped."""
    out: dict[str, list] = {k: [] for k in _BUCKETS}
    lists: dict[str, list | None] = {}  # category -> its bucket's list (None: not needed)
    get = lists.get
    if strict:
        xs = [e for e in events if type(e) is _StrictX]
        be = []
        if getattr(_decoded, "begin_end", False):  # set while decoding (maybe another list: then none here)
            _decoded.begin_end = False
            be = [e for e in events if type(e) is _StrictB or type(e) is _StrictE]
    else:
        xs = [e for e in events if e.ph == "X"]
        be = [e for e in events if e.ph == "B" or e.ph == "E"] if len(xs) < len(events) else []
    for e in xs:
        lst = get(e.cat, False)
        if lst is False:
            low = str(e.cat).lower()
            k = _CAT_BUCKET.get(low) or ("pyfunc" if low == _PYFUNC else None)
            lst = lists[e.cat] = out[k] if k else None
        if lst is not None:
            lst.append(e)
    return out, be


def _loose_args(a: Any) -> _Args | None:
    """A strict event's args as :class:`_Args` (begin/end events travel between processes)."""
    if a is None or type(a) is _Args:
        return a
    ids = {k: (None if getattr(a, k) == _MISSING else getattr(a, k))
           for k in ("device", "stream", "correlation", "external_id", "external_id_legacy", "bytes")}
    return _Args(**ids, input_dims=a.input_dims, input_types=a.input_types, concrete_inputs=a.concrete_inputs)


def _be_records(be: list, strict: bool) -> list[tuple]:
    """Begin/end events as picklable tuples (begin?, cat, name, ts µs, pid, tid, args as
    plain values) in file order."""
    out = []
    for e in be:
        begin = (type(e) is _StrictB) if strict else (e.ph == "B")
        a = _loose_args(getattr(e, "args", None)) if begin else None
        args = None if a is None else (a.device, a.stream, a.correlation, a.external_id, a.external_id_legacy, a.bytes,
                                       bytes(a.input_dims) or None, bytes(a.input_types) or None,
                                       bytes(a.concrete_inputs) or None)
        ts = _NAN if e.ts is None else float(e.ts)  # a numeric string (loose events): as float here
        out.append((begin, e.cat, e.name, ts, e.pid, e.tid, args))
    return out


def _pair_begin_end(records: list[tuple]) -> tuple[list[_Event], int]:
    """Pair begin/end records into complete events: per (pid, tid), in time order (file order
    on ties), each "E" closes the latest open "B" (LIFO nesting, as the Trace Event Format
    says). The range takes the begin's category, name and args. Returns (events, number of
    records without a partner or a usable timestamp, all dropped)."""
    threads: dict[tuple, list[tuple]] = {}
    unmatched = 0
    for r in records:
        ts = r[3]
        if not (isinstance(ts, float) and ts - ts == 0.0):
            unmatched += 1
            continue
        threads.setdefault((r[4], r[5]), []).append(r)
    out: list[_Event] = []
    for recs in threads.values():
        recs.sort(key=operator.itemgetter(3))  # stable: file order on equal timestamps
        stack: list[tuple] = []
        for r in recs:
            if r[0]:
                stack.append(r)
            elif stack:
                b = stack.pop()
                a = b[6]
                args = None if a is None else _Args(
                    device=a[0], stream=a[1], correlation=a[2], external_id=a[3], external_id_legacy=a[4], bytes=a[5],
                    input_dims=msgspec.Raw(a[6] or b""), input_types=msgspec.Raw(a[7] or b""),
                    concrete_inputs=msgspec.Raw(a[8] or b""))
                out.append(_Event(ph="X", cat=b[1], name=b[2], ts=b[3], dur=r[3] - b[3], pid=b[4], tid=b[5], args=args))
            else:
                unmatched += 1
        unmatched += len(stack)
    return out, unmatched


_get_args = operator.attrgetter("args")
_get_name = operator.attrgetter("name")
_get_ts = operator.attrgetter("ts")
_get_dur = operator.attrgetter("dur")
_get_pid = operator.attrgetter("pid")
_get_tid = operator.attrgetter("tid")

# SGLang's ProfileMerger prefixes every pid of a rank's trace with its rank label:
# "[TP01-DP00-PP00-EP00] 83".
_RANK_PID = re.compile(r"\[([^\[\]]{1,80})\]\s*(.*)", re.S)


def _split_rank_pids(vals: list) -> tuple[list, list | None]:
    """(pids without their rank label, labels or None when no pid has one)."""
    labels = None
    for i, v in enumerate(vals):
        if type(v) is str and v[:1] == "[":
            m = _RANK_PID.fullmatch(v)
            if m is None:
                continue
            if labels is None:
                labels, vals = [""] * len(vals), list(vals)
            labels[i] = m.group(1)
            rest = m.group(2).strip()
            try:
                vals[i] = int(rest)
            except ValueError:
                vals[i] = rest
    return vals, labels


def _ids(vals: list, default: int = -1, types: set | None = None) -> np.ndarray:
    """pid/tid-like values (int, "stream 7", None...) as int64; see _as_int. ``types``: the
    set of the values' types, when the caller has it."""
    if (types if types is not None else set(map(type, vals))) == {int}:  # only then: np.fromiter would also parse "-7" or "7"
        try:
            return np.fromiter(vals, np.int64, len(vals))
        except OverflowError:
            pass
    return np.array([v if type(v) is int and -_I64 < v < _I64 else _as_int(v, default) for v in vals], dtype=np.int64)


class _Raw:
    """Columns of one bucket's events, before the bucket's own rules (defaults, fallbacks).

    ``ts`` float64 µs (NaN = missing), ``dur`` float64 µs (NaN = missing), ``pid``/``tid``
    the values as decoded (a merged file's rank label split off), args ids int64 with
    ``_MISSING`` for absent or unusable values."""

    def __init__(self, evs: list, strict: bool) -> None:
        self.evs, self.strict, self.n = evs, strict, len(evs)
        self.name = list(map(_get_name, evs))
        self.strings: tuple | None = None  # events whose ts/dur are numeric strings (see _string_times)
        if strict:
            self.ts = np.fromiter(map(_get_ts, evs), np.float64, self.n)
            self.dur = np.fromiter(map(_get_dur, evs), np.float64, self.n)
        else:
            ts_vals, dur_vals = list(map(_get_ts, evs)), list(map(_get_dur, evs))
            self.ts = np.array([_NAN if v is None else float(v) for v in ts_vals], dtype=np.float64)
            self.dur = np.array([_NAN if v is None else float(v) for v in dur_vals], dtype=np.float64)
            self.strings = _string_times(ts_vals, dur_vals)
        self._args = list(map(_get_args, evs))
        self._pids: list | None = None
        self._types: set | None = None
        self._labels: list | None = None

    def _pid_values(self) -> list:
        if self._pids is None:
            vals = list(map(_get_pid, self.evs))
            self._types = set(map(type, vals))
            if str in self._types:
                vals, self._labels = _split_rank_pids(vals)
                self._types = None
            self._pids = vals
        return self._pids

    def pid(self, default: int = -1) -> np.ndarray:
        return _ids(self._pid_values(), default, self._types)

    def rank_labels(self, look: bool = True) -> list | None:
        """The rank label of each event ("" for none), None when no event has one. With
        ``look`` False, and when the pids were not read for a column, only a sample of the
        events (first, middle, last) is looked at first: a merged file labels every event."""
        if self._pids is None and not look:
            evs = self.evs
            if not any(type(e.pid) is str for e in (evs[0], evs[len(evs) // 2], evs[-1])):
                return None
        self._pid_values()
        return self._labels

    def tid(self, default: int = -1) -> np.ndarray:
        return _ids(list(map(_get_tid, self.evs)), default)

    def arg(self, field: str) -> np.ndarray:
        get = operator.attrgetter(field)
        if self.strict:
            try:
                return np.fromiter(map(get, self._args), np.int64, self.n)
            except OverflowError:  # ints beyond int64
                pass
        return np.array([_MISSING if a is None else _int(get(a), _MISSING) for a in self._args], dtype=np.int64)

    def arg_or(self, field: str, default: int) -> np.ndarray:
        v = self.arg(field)
        return np.where(v == _MISSING, default, v)

    def external_id(self) -> np.ndarray:
        ext = self.arg("external_id")
        missing = ext == _MISSING
        if missing.any():
            ext = np.where(missing, self.arg("external_id_legacy"), ext)
        return np.where(ext == _MISSING, -1, ext)

    def raw_arg(self, field: str, shared: bool = False) -> list:
        """Raw JSON of an arg (``Input Dims``...) as small bytes copies (never views that would
        pin the whole document in memory), None when absent. ``shared``: equal values are one
        object (``Concrete Inputs`` takes a few dozen distinct values over thousands of ops:
        memory per op is then a pointer, and forked workers pickle each value once)."""
        get = operator.attrgetter(field)
        vals = map(get, self._args) if self.strict else (None if a is None else get(a) for a in self._args)
        if not shared:
            return [bytes(v) if v else None for v in vals]
        seen: dict[bytes, bytes] = {}
        keep = seen.setdefault
        return [keep(b, b) if v and (b := bytes(v)) else None for v in vals]

    def times(self, base_ns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        keep, start, end = _times(self.ts, self.dur, base_ns)
        if self.strings is not None:  # numeric strings: their exact values replace the float ones
            rows, ts_ns, dur_ns = self.strings
            for i, t, d in zip(rows, ts_ns, dur_ns):
                if keep[i]:
                    dur = int(end[i] - start[i]) if d is None else d
                    if t is not None:
                        start[i] = base_ns + t
                    end[i] = start[i] + dur
        return keep, start, end

    @property
    def n_strings(self) -> int:
        """Events whose ts or dur was written as a JSON string."""
        return 0 if self.strings is None else len(self.strings[0])


_NAN = float("nan")


MAX_TS_US = 4e15  # ~year 2096 in epoch µs: anything larger cannot be a timestamp
MAX_DUR_US = 1e12  # ~11.6 days


def _times(ts: np.ndarray, dur: np.ndarray, base_ns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keep mask, start_ns, end_ns) from float µs: drops events without a usable ts (missing,
    not finite, beyond int64 ns) or dur (missing, negative, not finite, longer than 11 days)."""
    with np.errstate(invalid="ignore"):
        keep = np.isfinite(ts) & (np.abs(ts) <= MAX_TS_US) & np.isfinite(dur) & (dur <= MAX_DUR_US) & (dur >= 0)
    start = _us_to_ns(np.where(keep, ts, 0.0), base_ns)
    return keep, start, start + _dur_to_ns(np.where(keep, dur, 0.0))


def _gpu_columns(r: _Raw, kind: str, base_ns: int) -> tuple[dict, np.ndarray]:
    keep, start, end = r.times(base_ns)
    names = r.name
    kinds = [kind] * r.n
    if kind == "kernel":
        # ROCm <= 7.1 reports copies/fills as kernels; 7.2 as gpu_memcpy/gpu_memset.
        for i, n in enumerate(names):
            if n.startswith("__amd_rocclr_"):
                low = n.lower()
                kinds[i] = "memcpy" if "copy" in low else "memset" if "fill" in low else "kernel"
    pid = r.pid(_MISSING)
    device = r.arg("device")
    device = np.where((device == _MISSING) | (device == -2), np.where(pid == _MISSING, 0, pid), device)
    stream = r.arg("stream")
    stream = np.where((stream == _MISSING) | (stream == -2), r.tid(0), stream)
    d = {"kind": kinds, "name": names, "device": device, "stream": stream, "start_ns": start, "end_ns": end,
         "correlation": r.arg_or("correlation", -1), "external_id": r.external_id(), "bytes": r.arg_or("bytes", -1),
         "pid": np.where(pid == _MISSING, -1, pid)}
    return d, keep


def _obj(values: list) -> np.ndarray:
    """A 1-D object array of ``values`` (str, bytes or None), never reshaped."""
    return np.fromiter(values, dtype=object, count=len(values))


def _select(d: dict, keep: np.ndarray) -> dict:
    """Columns (numpy arrays; lists become object arrays) restricted to the ``keep`` rows."""
    d = {k: v if isinstance(v, np.ndarray) else _obj(v) for k, v in d.items()}
    return d if keep.all() else {k: v[keep] for k, v in d.items()}


def _concat(parts: list[dict]) -> dict:
    """One dict of columns from parts; a part without a rank column gets "" (no label)."""
    if any("rank" in p for p in parts):
        parts = [p if "rank" in p else {**p, "rank": np.full(len(p["start_ns"]), "", dtype=object)} for p in parts]
    if len(parts) == 1:
        return parts[0]
    out = {}
    for k in parts[0]:
        out[k] = np.concatenate([p[k] for p in parts])
    return out


def load_kineto(path: str, buf: bytes | bytearray | None = None, lenient: bool = False, progress=None,
                gz_cut: str | None = None, workers: int | None = None) -> Trace:
    """Load a Kineto JSON trace into the normalized :class:`Trace`.

    Args:
        path: trace path (``.json`` or ``.json.gz``; gzip is detected by content).
        buf: the already-decompressed bytes, when the caller has read them (with ``gz_cut``,
            the description of a gzip stream cut short, from ``read_bytes_partial``).
        lenient: repair numbers written with a decimal comma (a locale bug) instead of failing.
        progress: optional callback ``progress(done_bytes, total_bytes)`` for large inputs.
        workers: processes decoding a large file (>= 64 MiB) in parallel; None:
            :func:`workers_default`; 1: this process only.

    Returns:
        Trace with int64-ns frames; data-quality notes in ``trace.quality``.

    Raises:
        TraceFormatError: unreadable file, corrupt gzip, gzip that inflates implausibly
            (see :mod:`diagnose.trace.reading`), invalid JSON, JSON nested too deeply, JSON
            that is not a Chrome/Kineto trace (no ``traceEvents``), or no event at all.
    """
    if buf is None:
        buf, gz_cut = read_bytes_partial(path)
    try:
        return _load_kineto(path, buf, lenient, progress, gz_cut, workers)
    except RecursionError:  # msgspec's nesting guard: no trace is nested thousands of levels deep
        raise TraceFormatError(f"{path}: JSON nested too deeply to decode (thousands of levels of arrays/objects): not a profiler trace") from None


def _load_kineto(path: str, buf: bytes | bytearray, lenient: bool, progress, gz_cut: str | None,
                 workers: int | None) -> Trace:
    if not gz_cut and len(buf) >= CHUNKED_MIN_BYTES and buf[:64].lstrip()[:1] == b"{":
        trace = _load_chunked(path, buf, progress, workers)
        if trace is not None:
            return trace
    if isinstance(buf, bytearray):  # from a caller: the paths below want bytes
        buf = bytes(buf)
    fast, strict = None, False
    if not gz_cut and buf[:64].lstrip()[:1] == b"{":
        for dec, strict in ((_strict_doc_dec, True), (_doc_dec, False)):
            try:
                fast = dec.decode(buf)
                break
            except msgspec.ValidationError:
                continue
            except (msgspec.DecodeError, UnicodeDecodeError):
                break
    meta = None
    if fast is not None:
        try:  # the other keys; skipped values were not checked for UTF-8 by the decode above
            meta = _top_metadata(buf)
        except (msgspec.DecodeError, UnicodeDecodeError):
            fast = None  # the repairing path below
    if fast is not None and meta is not None:
        events, n = fast.traceEvents, len(buf)
        del fast
        del buf  # never hold the document and its decoded events longer than needed
        return _build(path, events, meta, legacy=False, repairs=[], buf_len=n, gz_cut=None, strict=strict)
    top, legacy, buf, repairs = _split_top(path, buf, lenient)
    if "traceEvents" not in top:
        raise TraceFormatError(
            f"{path}: JSON without 'traceEvents' — not a Kineto/Chrome trace"
        )
    metadata = _decode_values(top)
    events = _decode_events(path, top.pop("traceEvents"), repairs)
    buf_len = len(buf)
    del top, buf  # the decoded events are all we keep: never hold two copies of the document
    if legacy and events and not any(ev.ph for ev in events):
        raise TraceFormatError(f"{path}: JSON list without trace events (no 'ph' fields) — not a trace")
    return _build(path, events, metadata, legacy, repairs, buf_len, gz_cut)




_TEXT = ("name", "kind", "api_kind", "scope", "rank")
_COUNTERS = ("events", "dropped", "negative", "no_dur", "bad_name", "bad_value", "out_of_range", "pyfunc", "pyfunc_ns",
             "string_times")


class _Coded(NamedTuple):
    codes: np.ndarray
    uniques: np.ndarray


def _plural(n: int, one: str, many: str) -> str:
    return f"{n:,} {one if n == 1 else many}"


class _Columns:
    """Accumulates the columns of the events the analysis needs, chunk by chunk, so that the
    decoded structs of one chunk can be dropped before the next is decoded. Begin/end events
    are kept as records and paired at :meth:`finish`, once every chunk is in (a range may
    begin in one chunk, or one worker's share, and end in another)."""

    def __init__(self, base_ns: int) -> None:
        self.base_ns = base_ns
        self.parts: dict[str, list[dict]] = {"gpu": [], "runtime": [], "op": [], "ann": [], "sync": [], "overhead": [],
                                             "pyframe": []}
        self.n = dict.fromkeys(_COUNTERS, 0)
        self.pyfunc_by_rank: dict[str, list[int]] = {}  # rank label -> [count, ns] (merged files)
        self.be: list[tuple] = []
        self.labelled = False  # a rank label was seen: look at every pid from now on

    def add(self, events: list, strict: bool = False, count: bool = True) -> None:
        """Add decoded events: ``strict`` for :data:`_StrictEvent` lists, else :class:`_Event`."""
        if count:
            self.n["events"] += len(events)
        buckets, be = _group(events, strict)
        if be:
            self.be.extend(_be_records(be, strict))
        base_ns = self.base_ns
        self.n["bad_value"] += len(buckets.pop("bad"))
        self.n["out_of_range"] += len(buckets.pop("oor"))
        py = buckets.pop("pyfunc")
        if py:
            self._pyfunc(_Raw(py, strict))
        raws = {k: _Raw(evs, strict) for k, evs in buckets.items() if evs}
        for kind in ("kernel", "memcpy", "memset"):
            if kind in raws:
                d, keep = _gpu_columns(raws[kind], kind, base_ns)
                self._keep("gpu", d, keep, raws[kind])
        r = raws.get("runtime")
        if r is not None:
            keep, start, end = r.times(base_ns)
            codes, distinct = factorize(r.name)  # classify each distinct API name once
            kinds = np.array([api_kind(n) for n in distinct], dtype=object)[codes] if r.n else []
            d = {"name": r.name, "api_kind": kinds, "start_ns": start, "end_ns": end,
                 "correlation": r.arg_or("correlation", -1), "pid": r.pid(), "tid": r.tid()}
            self._keep("runtime", d, keep, r)
        r = raws.get("op")
        if r is not None:
            keep, start, end = r.times(base_ns)
            d = {"name": r.name, "start_ns": start, "end_ns": end, "external_id": r.external_id(), "tid": r.tid(),
                 "input_dims": r.raw_arg("input_dims"), "input_types": r.raw_arg("input_types"),
                 "concrete_inputs": r.raw_arg("concrete_inputs", shared=True)}
            self._keep("op", d, keep, r)
        for bucket, scope in (("ann_cpu", "cpu"), ("ann_gpu", "gpu")):
            r = raws.get(bucket)
            if r is not None:
                keep, start, end = r.times(base_ns)
                pids = r.pid()
                d = {"name": r.name, "scope": [scope] * r.n, "device": pids if scope == "gpu" else np.full(r.n, -1, np.int64),
                     "start_ns": start, "end_ns": end, "pid": pids, "tid": r.tid()}
                self._keep("ann", d, keep, r)
        r = raws.get("sync")
        if r is not None:
            keep, start, end = r.times(base_ns)
            d = {"name": r.name, "device": r.arg_or("device", 0), "stream": r.arg_or("stream", 0),
                 "start_ns": start, "end_ns": end}
            self._keep("sync", d, keep, r)
        r = raws.get("overhead")
        if r is not None:
            keep, start, end = r.times(base_ns)
            d = {"name": r.name, "start_ns": start, "end_ns": end, "pid": r.pid(), "tid": r.tid()}
            self._keep("overhead", d, keep, r)
        for r in raws.values():
            self.n["string_times"] += r.n_strings
            self.n["negative"] += int((r.dur < 0).sum())
            self.n["no_dur"] += int(np.isnan(r.dur).sum())
            if "\ufffd" in "".join(r.name):
                self.n["bad_name"] += sum("\ufffd" in n for n in r.name)

    def _pyfunc(self, r: _Raw) -> None:
        """Count python_function events, sum their durations and keep their name, times, pid
        and tid (never their args); events without usable times are left out silently (they
        are not analysed events: no ``missing_timestamp`` count)."""
        keep, start, end = r.times(self.base_ns)
        ns = np.where(keep, end - start, 0)
        self.n["pyfunc"] += r.n
        self.n["pyfunc_ns"] += int(ns.sum())
        d = {"name": r.name, "start_ns": start, "end_ns": end, "pid": r.pid(), "tid": r.tid()}
        labels = r.rank_labels(look=self.labelled)
        if labels is not None:
            self.labelled = True
            d["rank"] = labels
            for label, dur in zip(labels, ns.tolist()):
                c = self.pyfunc_by_rank.setdefault(label, [0, 0])
                c[0] += 1
                c[1] += dur
        self.parts["pyframe"].append(_select(d, keep))

    def state(self) -> dict:
        """Everything accumulated, as picklable data (sent back by forked workers). Text
        columns travel as (codes, unique values): pickling a million distinct ``str`` objects
        costs more than decoding them, and the shared values make later grouping faster."""
        parts = {k: [{c: _Coded(*factorize(v)) if c in _TEXT else v
                      for c, v in d.items()} for d in lst] for k, lst in self.parts.items()}
        return {"parts": parts, "n": self.n, "pyfunc_by_rank": self.pyfunc_by_rank, "be": self.be}

    def merge(self, state: dict) -> None:
        """Append another instance's :meth:`state` (its events come after this one's)."""
        for k, v in state["parts"].items():
            self.parts[k].extend({c: x.uniques[x.codes] if isinstance(x, _Coded) else x for c, x in d.items()}
                                 for d in v)
        for k, v in state["n"].items():
            self.n[k] += v
        for label, (c, ns) in state["pyfunc_by_rank"].items():
            acc = self.pyfunc_by_rank.setdefault(label, [0, 0])
            acc[0] += c
            acc[1] += ns
        self.be.extend(state["be"])

    def _keep(self, part: str, d: dict, keep: np.ndarray, r: _Raw) -> None:
        self.n["dropped"] += int((~keep).sum())
        labels = r.rank_labels(look=self.labelled)
        if labels is not None:
            self.labelled = True
            d["rank"] = labels
        self.parts[part].append(_select(d, keep))

    def finish(self, trace: Trace) -> None:
        """Build ``trace``'s frames, counts and quality notes from everything added.

        Raises:
            TraceFormatError: the document holds no event at all.
        """
        n = self.n
        if n["events"] == 0:
            if trace.partial:
                raise TraceFormatError(f"{trace.source_path}: no events: the file was cut before its first complete event")
            raise TraceFormatError(f"{trace.source_path}: no events: the trace's event list is empty")
        unmatched = 0
        if self.be:
            events, unmatched = _pair_begin_end(self.be)
            self.be = []
            self.add(events, strict=False, count=False)
        p = self.parts
        labels = sorted({lab for lst in p.values() for d in lst if "rank" in d for lab in set(d["rank"].tolist()) if lab})
        merged = len(labels) >= 2
        index = {lab: i for i, lab in enumerate(labels)}

        def build(part: str, columns: dict, ids: tuple[str, ...] = (), sort: Any = None):
            if not p[part]:
                return None
            d = _concat(p[part])
            rank = None
            if merged:
                rank = np.fromiter((index.get(x, -1) for x in d["rank"]), np.int64, len(d["rank"]))
                for c in ids:  # never link across ranks: their ids collide
                    x = np.asarray(d[c], dtype=np.int64)
                    q = (rank >= 0) & (x >= 0) & (x < (1 << RANK_ID_SHIFT))
                    d[c] = np.where(q, (rank << RANK_ID_SHIFT) | x, x)
            df = frame(columns, d)
            if rank is not None:
                df["rank"] = rank
            if sort is not None:
                df = df.sort_values(sort, kind="stable").reset_index(drop=True)
            return df

        for attr, part, columns, ids, sort in (
            ("gpu", "gpu", GPU_COLUMNS, ("correlation", "external_id"), ["device", "start_ns", "end_ns"]),
            ("runtime", "runtime", RUNTIME_COLUMNS, ("correlation",), "start_ns"),
            ("cpu_ops", "op", CPU_OP_COLUMNS, ("external_id",), None),
            ("annotations", "ann", ANNOTATION_COLUMNS, (), "start_ns"),
            ("gpu_syncs", "sync", SYNC_COLUMNS, (), None),
            ("overhead", "overhead", OVERHEAD_COLUMNS, (), "start_ns"),
            ("python_frames", "pyframe", PYTHON_FRAME_COLUMNS, (), "start_ns"),
        ):
            df = build(part, columns, ids, sort)
            if df is not None:
                setattr(trace, attr, df)
            elif merged:
                setattr(trace, attr, getattr(trace, attr).assign(rank=np.empty(0, np.int64)))
        trace.counts = {"python_function": n["pyfunc"], "python_function_ns": n["pyfunc_ns"]}
        if merged:
            trace.ranks = labels
            trace._rank_counts = {lab: {"python_function": c, "python_function_ns": ns}
                                  for lab, (c, ns) in self.pyfunc_by_rank.items() if lab}
        no_ts = n["dropped"] - n["negative"] - n["no_dur"]
        if n["negative"]:
            trace.note("negative_duration", f"{n['negative']} event(s) with a negative duration were excluded", n["negative"])
        if no_ts:
            trace.note("missing_timestamp", f"{no_ts} complete event(s) without a usable 'ts' or 'dur' (missing, not a number, or implausibly large) were skipped", no_ts)
        if n["bad_name"]:
            trace.note("invalid_utf8_names", f"{n['bad_name']} event name(s) contained invalid UTF-8 and were replaced", n["bad_name"])
        if n["no_dur"]:
            trace.note("missing_duration", f"{_plural(n['no_dur'], 'complete event', 'complete events')} without a 'dur' excluded (not counted as zero-length)", n["no_dur"])
        if n["bad_value"]:
            trace.note("bad_value", f"{_plural(n['bad_value'], 'event', 'events')} whose 'ts' or 'dur' is not a number (text, list, NaN...) excluded", n["bad_value"])
        if n["out_of_range"]:
            trace.note("out_of_range_value", f"{_plural(n['out_of_range'], 'event', 'events')} holding a number beyond the float64 range (e.g. 1e400) excluded", n["out_of_range"])
        if n["string_times"]:
            trace.note("string_timestamps", f"{_plural(n['string_times'], 'event', 'events')} with 'ts' or 'dur' written as a "
                       "JSON string: read as exact decimals (integer ns), not through float64", n["string_times"])
        if unmatched:
            trace.note("unmatched_begin_end", f"{_plural(unmatched, 'begin/end (B/E) event', 'begin/end (B/E) events')} dropped: no partner on the same pid/tid, or no usable 'ts'", unmatched)
        if merged:
            trace.note("ranks_merged", f"{len(labels)} ranks merged into one file ({', '.join(labels[:4])}{', ...' if len(labels) > 4 else ''}): "
                       "analyse them one by one (diagnose.trace.split_ranks); a whole-file analysis mixes their GPUs", len(labels))


def _base_ns(metadata: dict[str, Any]) -> int:
    """``baseTimeNanoseconds`` when it is a plausible epoch time in ns, else 0 (see _new_trace)."""
    b = metadata.get("baseTimeNanoseconds")
    if isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b <= 4e18:
        return int(b)
    return 0


def _new_trace(path: str, metadata: dict[str, Any], legacy: bool, repairs: list, buf_len: int, gz_cut: str | None) -> Trace:
    trace = Trace(source_path=path, source_format="kineto-json", metadata=metadata)
    if "baseTimeNanoseconds" in metadata and _base_ns(metadata) == 0 and metadata["baseTimeNanoseconds"] != 0:
        trace.note("bad_base_time", f"baseTimeNanoseconds {str(metadata['baseTimeNanoseconds'])[:40]!r} is not a plausible epoch time in ns: ignored (times are relative)")
    for code, msg, n in repairs:
        if code == "truncated":
            trace.partial = True
            where = f"; {gz_cut}" if gz_cut else ""
            trace.note("truncated", f"trace cut at byte {n:,} of {buf_len:,} (decompressed){where}: the complete events before it were analysed; every number is partial")
        elif code == "decimal_comma":
            trace.note("decimal_comma_repaired", msg, n)
        elif code == "text":
            trace.note("invalid_text_repaired", msg)
    if gz_cut and not trace.partial:
        trace.partial = True
        trace.note("truncated", f"{gz_cut}: the events recovered were analysed; every number is partial")
    if legacy:
        trace.note("legacy_event_list", "legacy top-level JSON list of events (no trace metadata)")
    trace.devices = _devices(metadata.get("deviceProperties"))
    return trace


def _build(path: str, events: list, metadata: dict[str, Any], legacy: bool,
           repairs: list, buf_len: int, gz_cut: str | None, strict: bool = False) -> Trace:
    """Normalized trace from decoded events and top-level metadata."""
    trace = _new_trace(path, metadata, legacy, repairs, buf_len, gz_cut)
    cols = _Columns(_base_ns(metadata))
    cols.add(events, strict)
    del events
    cols.finish(trace)
    return trace


CHUNK_BYTES = 32 * 2**20
CHUNKED_MIN_BYTES = 64 * 2**20
_EVENT_BOUNDARY = re.compile(rb"\}\s*,\s*\{")
_EVENTS_KEY = re.compile(rb'"traceEvents"\s*:\s*\[')


class _ChunkFailed(Exception):
    pass


_any_top_dec = msgspec.json.Decoder(dict[str, msgspec.Raw])


def _decode_values(top: dict[str, msgspec.Raw]) -> dict[str, Any]:
    """Top-level keys (but ``traceEvents``) decoded; a value that does not decode is None."""
    out: dict[str, Any] = {}
    for k, v in top.items():
        if k == "traceEvents":
            continue
        try:
            out[k] = _any_dec.decode(v)
        except (msgspec.DecodeError, UnicodeDecodeError):
            out[k] = None
    return out


def _top_metadata(buf: bytes | bytearray) -> dict[str, Any]:
    """Every top-level key but ``traceEvents`` of a valid document (the same on every path)."""
    located = _locate_events(buf)
    return _decode_values(located[0] if located is not None else _any_top_dec.decode(buf))


def _locate_events(buf: bytes) -> tuple[dict[str, msgspec.Raw], int, int] | None:
    """Find the ``traceEvents`` array without parsing it: (other top-level keys as raw JSON,
    index of its ``[``, index of its ``]``). The keys before and after the array are parsed
    (they must form a valid object around it); the array itself is validated slice by slice
    when decoded. None when the layout is anything else (callers then parse the whole
    document)."""
    m = _EVENTS_KEY.search(buf)
    if m is None:
        return None
    head = buf[:m.start()].rstrip()
    top: dict[str, msgspec.Raw] = {}
    try:
        if head.endswith(b","):
            top = msgspec.json.decode(head[:-1] + b"}", type=dict[str, msgspec.Raw])
        elif head.lstrip() != b"{":
            return None
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    # The array's "]" is the earliest "]" near the end after which the rest of the document
    # is a valid end of the object ("}" or more keys). A "]" inside the array leaves an
    # unbalanced rest, so it never qualifies; later ones (lists in keys written after the
    # events, e.g. deviceProperties) qualify too, hence "earliest": scan back a bounded way.
    lb, pos = m.end() - 1, len(buf)
    found: tuple[int, dict[str, msgspec.Raw]] | None = None
    for _ in range(_TAIL_CANDIDATES):
        rb = buf.rfind(b"]", lb, pos)
        if rb < 0 or len(buf) - rb > _TAIL_MAX_BYTES:
            break
        pos = rb
        rest = buf[rb + 1:].strip()
        if rest == b"}":
            found = (rb, {})
        elif rest.startswith(b","):
            try:
                found = (rb, msgspec.json.decode(b"{" + rest[1:], type=dict[str, msgspec.Raw]))
            except (msgspec.DecodeError, UnicodeDecodeError):
                continue
    if found is None or "traceEvents" in found[1]:
        return None
    top.update(found[1])
    return top, lb, found[0]


_TAIL_CANDIDATES = 64
_TAIL_MAX_BYTES = 2**20


def _slices(buf: memoryview, lb: int, rb: int) -> list[tuple[int, int]]:
    """(start, end) byte ranges of ~CHUNK_BYTES inside the array ``buf[lb:rb+1]``, each a run
    of whole events cut at a ``},{`` boundary (a cut inside a string makes that slice's decode
    fail, and the caller falls back to a whole-document parse)."""
    out = []
    pos = lb + 1
    while pos < rb:
        target = pos + CHUNK_BYTES
        m = _EVENT_BOUNDARY.search(buf, target, rb) if target < rb else None
        cut = m.start() + 1 if m else rb
        out.append((pos, cut))
        pos = (m.end() - 1) if m else rb
    return out


def _decode_slices(src: memoryview, slices: list[tuple[int, int]], base_ns: int, progress=None,
                   keep: list | None = None, keep_below: int = 0) -> _Columns:
    """Decode each slice of ``src`` into one :class:`_Columns`; ``progress(end, 0)`` after each.
    Decoded events are freed slice by slice, unless ``keep`` is given and this process's
    resident set is under ``keep_below`` bytes: a forked child that exits right after keeps
    them there and never pays for freeing them (~10 % of its time).

    Raises:
        _ChunkFailed: a slice is not a valid JSON list of events.
    """
    cols = _Columns(base_ns)
    for start, end in slices:
        chunk = b"".join((b"[", src[start:end], b"]"))  # one copy of the slice
        try:
            events, strict = _decode_slice(chunk)
        except (msgspec.DecodeError, UnicodeDecodeError):
            raise _ChunkFailed from None
        del chunk
        cols.add(events, strict)
        if keep is not None and _rss_bytes() < keep_below:
            keep.append(events)
        del events
        if progress is not None:
            progress(end, 0)
    return cols


def _rss_bytes() -> int:
    """This process's resident set size (Linux /proc; 0 elsewhere)."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * mmap.PAGESIZE
    except (OSError, ValueError, IndexError):
        return 0


def workers_default() -> int:
    """Processes for one large Kineto file: the CPUs this process may use, at most 4, on Linux
    in a single-threaded process (forking while other threads run could copy a lock they
    hold); else 1. ``DIAGNOSE_WORKERS`` sets the count (at most the CPU count), not the
    single-thread rule."""
    if not sys.platform.startswith("linux") or not hasattr(os, "fork") or threading.active_count() > 1:
        return 1
    env = os.environ.get("DIAGNOSE_WORKERS", "").strip()
    if env.isdigit() and int(env) >= 1:
        return min(int(env), os.cpu_count() or 1)
    try:
        n = len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        n = os.cpu_count() or 1
    return max(1, min(n, 4))


def _fork_decode(src: memoryview, slices: list[tuple[int, int]], base_ns: int, done: mmap.mmap, slot: int) -> tuple[int, int]:
    """Decode ``slices`` in a forked child, which shares ``src`` copy-on-write, writes the
    bytes it has decoded so far into ``done`` (int64 at ``slot``) and sends back its pickled
    columns. Returns (pid, read fd).

    Raises:
        OSError: fork or pipe failed.
    """
    r, w = os.pipe()
    parent = os.getpid()
    try:
        pid = os.fork()
    except OSError:
        os.close(r)
        os.close(w)
        raise
    if pid == 0:  # child: never returns, exits without freeing what it decoded
        code = 1
        try:
            _die_with_parent(parent)
            os.close(r)
            keep: list = []

            def progress(end: int, _total: int) -> None:
                struct.pack_into("q", done, 8 * slot, end - slices[0][0])

            # keep decoded events (never freed: the child exits) up to half the bytes of its share
            budget = sum(e - s for s, e in slices) // 2
            cols = _decode_slices(src, slices, base_ns, progress, keep, _rss_bytes() + budget)
            data = pickle.dumps(cols.state(), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(w, "wb") as f:
                f.write(data)
            code = 0
        except BaseException:  # noqa: BLE001 - the parent redoes the work on any failure
            pass
        os._exit(code)
    os.close(w)
    return pid, r


def _die_with_parent(parent: int) -> None:
    """Linux: have the kernel kill this child when its parent dies (a SIGTERM or SIGKILL sent
    to the main process alone must not leave workers decoding for seconds)."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def _fork_result(pid: int, fd: int) -> dict | None:
    """The child's columns state, or None when it failed (the caller redoes its slices)."""
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    _, status = os.waitpid(pid, 0)
    if status != 0 or not data:
        return None
    try:
        return pickle.loads(data)
    except Exception:  # noqa: BLE001
        return None


def _decode_parallel(src: memoryview, shares: list[list[tuple[int, int]]], base_ns: int, report) -> _Columns:
    """Decode each share in its own forked child; merge their columns in share order.
    A share whose child could not start or failed is decoded here.

    Raises:
        _ChunkFailed: a slice is not a valid JSON list of events.
    """
    done = mmap.mmap(-1, 8 * len(shares))
    children: dict[int, tuple[int, int]] = {}  # share index -> (pid, fd)
    states: dict[int, dict | None] = {}
    for i, share in enumerate(shares):
        try:
            children[i] = _fork_decode(src, share, base_ns, done, i)
        except OSError:
            states[i] = None
    try:
        while len(states) < len(shares):
            waiting = {fd: i for i, (pid, fd) in children.items() if i not in states}
            if not waiting:
                break
            ready, _, _ = select.select(list(waiting), [], [], 0.2)
            report(sum(struct.unpack_from(f"{len(shares)}q", done)))
            for fd in ready:
                i = waiting[fd]
                states[i] = _fork_result(children[i][0], fd)
    except BaseException:
        for i, (pid, fd) in children.items():
            if i not in states:
                os.kill(pid, signal.SIGKILL)
                _fork_result(pid, fd)
        raise
    finally:
        done.close()
    cols = _Columns(base_ns)
    for i, share in enumerate(shares):
        state = states.get(i)
        cols.merge(state if state is not None else _decode_slices(src, share, base_ns).state())
    return cols


def _load_chunked(path: str, buf: bytes, progress=None, workers: int | None = None) -> Trace | None:
    """Decode ``traceEvents`` in ~32 MiB slices cut at ``},{`` boundaries, on ``workers``
    processes (forked, sharing the decompressed document; see :func:`workers_default`).
    Each slice's decode validates its cut. Returns None (the caller falls back to the
    whole-document path) when the document or any slice does not decode cleanly."""
    located = _locate_events(buf)
    if located is None:
        try:
            top = _any_top_dec.decode(buf)
        except (msgspec.DecodeError, UnicodeDecodeError):
            return None
        raw_events = top.pop("traceEvents", None)
        if raw_events is None:
            return None
        src = memoryview(raw_events)  # a view into buf: no copy
        lb = bytes(src[:64]).find(b"[")
        rb = len(src) - 1
        while rb > 0 and src[rb] != ord("]"):
            rb -= 1
        if lb < 0 or rb <= lb:
            return None
    else:
        top, lb, rb = located
        src = memoryview(buf)
    metadata = _decode_values(top)
    del top
    base_ns = _base_ns(metadata)
    slices = _slices(src, lb, rb)
    n_workers = max(1, min(workers or workers_default(), len(slices)))
    if n_workers > 1 and threading.active_count() > 1:
        n_workers = 1  # never fork while other threads run
    total = rb - lb

    def report(done: int, _total: int = 0) -> None:
        if progress is not None:
            progress(min(done, total), total)

    try:
        if n_workers == 1:
            cols = _decode_slices(src, slices, base_ns, lambda end, _t: report(end - lb))
        else:
            # contiguous shares in file order, one per child; merged back in that order
            shares = [slices[len(slices) * i // n_workers:len(slices) * (i + 1) // n_workers] for i in range(n_workers)]
            cols = _decode_parallel(src, shares, base_ns, report)
    except _ChunkFailed:
        return None
    finally:
        src.release()
    if progress is not None:
        progress(total, total)
    trace = _new_trace(path, metadata, False, [], len(buf), None)
    cols.finish(trace)
    return trace


def parse_input_dims(raw: bytes | msgspec.Raw | list | None) -> list | None:
    """Decode a cpu_op's ``Input Dims`` (kept raw at load time) into nested lists of ints."""
    if raw is None:
        return None
    if isinstance(raw, list):
        return raw
    try:
        v = _any_dec.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    return v if isinstance(v, list) else None


def _devices(props: Any) -> list[DeviceInfo]:
    out: list[DeviceInfo] = []
    if not isinstance(props, list):
        return out
    for i, p in enumerate(props):
        if not isinstance(p, dict):
            continue
        major, minor = p.get("computeMajor"), p.get("computeMinor")
        cc = f"{major}.{minor}" if major is not None and minor is not None else None
        out.append(
            DeviceInfo(
                id=_as_int(p.get("id"), i),
                name=str(p.get("name") or ""),
                total_memory_bytes=p.get("totalGlobalMem") if isinstance(p.get("totalGlobalMem"), int) else None,
                compute_capability=cc,
                num_sms=p.get("numSms") if isinstance(p.get("numSms"), int) else None,
            )
        )
    return out
