"""Kineto (torch.profiler) JSON loader: ``.json`` and ``.json.gz`` of every era we have seen.

Handled variations (see ``../shared/traces/MANIFEST.md``):

* PyTorch 1.8/1.9 capitalised categories (``Kernel``, ``Runtime``, ``Operator``, ``Memcpy``,
  ``Memset``), ``tid`` written as ``"stream 7"``, lower-case ``"external id"``;
* ``displayTimeUnit: "ns"`` — ``ts``/``dur`` are still microseconds (Kineto always writes µs;
  the key only tells viewers how to display them);
* fractional-µs ``ts`` relative to ``baseTimeNanoseconds``, wherever that key sits in the
  file (before or after ``traceEvents``): absolute ns = base + round(ts * 1000), computed
  exactly from the integer and fractional parts (no float rounding of the base);
* ROCm traces (``hip*`` runtime names under ``cuda_runtime``), no ``deviceProperties``, no
  metadata events, no CPU ops, no kernels; a legacy top-level JSON list of events.

Decoding uses msgspec typed structs with ``args`` kept as raw bytes, so argument objects
of events the analysis does not need (``python_function``, instant events, flows...) are
never materialised.
"""
from __future__ import annotations

import gzip
import operator
import re
import zlib
from typing import Any

import msgspec
import numpy as np
import pandas as pd

from diagnose.errors import TraceFormatError
from diagnose.trace.apis import api_kind
from diagnose.trace.model import (
    ANNOTATION_COLUMNS,
    CPU_OP_COLUMNS,
    GPU_COLUMNS,
    RUNTIME_COLUMNS,
    SYNC_COLUMNS,
    DeviceInfo,
    Trace,
    frame,
)


class _Args(msgspec.Struct, gc=False):
    """The ``args`` fields the analysis uses, decoded inline (unknown keys are skipped in C)."""

    # Any: exporters sometimes write these as strings (e.g. memory events' "bytes"); one odd
    # value must not push the whole file onto the slow path. Coerced with _int() when read.
    device: Any = None
    stream: Any = None
    correlation: Any = None
    external_id: Any = msgspec.field(default=None, name="External id")
    external_id_legacy: Any = msgspec.field(default=None, name="external id")
    bytes: Any = None
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")


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


def read_bytes(path: str) -> bytes:
    """Read a file, gunzipping it when it starts with the gzip magic.

    Raises:
        TraceFormatError: missing/unreadable file, corrupt or truncated gzip stream.
    """
    data, cut = read_bytes_partial(path)
    if cut:
        raise TraceFormatError(f"{path}: {cut}")
    return data


def read_bytes_partial(path: str) -> tuple[bytes, str | None]:
    """Like :func:`read_bytes`, but a gzip stream cut short returns what decompressed, plus a
    description of the cut (None when the file is whole).

    Raises:
        TraceFormatError: missing/unreadable file, or gzip data that is corrupt (not just cut).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceFormatError(f"{path}: is a directory, expected a trace file") from None
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read ({e.strerror})") from None
    if raw[:2] != b"\x1f\x8b":
        return raw, None
    try:
        return gzip.decompress(raw), None
    except EOFError:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = d.decompress(raw)
        except zlib.error as e:
            raise TraceFormatError(f"{path}: corrupt gzip data ({e})") from None
        if not out:
            raise TraceFormatError(f"{path}: gzip stream cut before any data") from None
        return out, f"gzip stream cut short after {len(raw):,} compressed bytes ({len(out):,} bytes recovered)"
    except (OSError, zlib.error) as e:
        raise TraceFormatError(f"{path}: corrupt gzip data ({e})") from None


class _Doc(msgspec.Struct, gc=False):
    """One-pass decode of a well-formed Kineto document: events plus the metadata keys the
    analysis reads. Anything odd falls back to the robust path (:func:`_split_top`)."""

    traceEvents: list[_Event]
    schemaVersion: Any = None
    deviceProperties: Any = None
    distributedInfo: Any = None
    baseTimeNanoseconds: Any = None
    displayTimeUnit: Any = None
    traceName: Any = None
    diagnose: Any = None  # this project's collector metadata (add_metadata_json)
    metadata: Any = None  # TraceLens/vLLM-style extra object


_doc_dec = msgspec.json.Decoder(_Doc)


def _coerce_args(raw: msgspec.Raw) -> _Args | None:
    """Args of a loose event: take what can be read as the fields of :class:`_Args`."""
    if not raw:
        return None
    try:
        obj = _any_dec.decode(raw)
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict):
        return None
    kw: dict[str, Any] = {}
    for f in msgspec.structs.fields(_Args):
        v = obj.get(f.encode_name)
        if v is None:
            continue
        if f.name in ("input_dims", "input_types"):
            kw[f.name] = msgspec.Raw(msgspec.json.encode(v))
            continue
        try:
            kw[f.name] = int(float(v))
        except (TypeError, ValueError):
            pass
    return _Args(**kw)


def _coerce_event(ev: _LooseEvent) -> _Event:
    def num(v):
        if isinstance(v, bool):
            return None
        if isinstance(v, (int, float)):
            return float(v)
        try:
            return float(v)
        except (TypeError, ValueError):
            return None

    def pt(v):
        return v if isinstance(v, (int, str)) and not isinstance(v, bool) else None

    return _Event(
        ph=ev.ph if isinstance(ev.ph, str) else str(ev.ph),
        cat=ev.cat if isinstance(ev.cat, str) else str(ev.cat),
        name=ev.name if isinstance(ev.name, str) else str(ev.name),
        ts=num(ev.ts),
        dur=num(ev.dur),
        pid=pt(ev.pid),
        tid=pt(ev.tid),
        args=_coerce_args(ev.args),
    )


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
    if head[:1] not in (b"{", b"["):
        raise TraceFormatError(f"{path}: not a JSON trace (expected a Kineto/Chrome trace object)")
    for _attempt in range(4):
        if head[:1] == b"[":
            try:
                msgspec.json.decode(buf)
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
        try:
            return msgspec.json.decode(raw, type=list[_Event])
        except msgspec.ValidationError:
            try:
                loose = msgspec.json.decode(raw, type=list[_LooseEvent])
            except msgspec.ValidationError as e:
                raise TraceFormatError(f"{path}: traceEvents is not a list of events ({e})") from None
            return [_coerce_event(ev) for ev in loose]
    except (UnicodeDecodeError, msgspec.DecodeError) as e:
        if _repaired or not _is_text_error(e):
            raise TraceFormatError(f"{path}: invalid JSON in traceEvents ({e})") from None
        fixed = _CONTROL.sub(_REPLACEMENT, bytes(raw).decode("utf-8", errors="replace").encode("utf-8"))
        if repairs is not None and not any(r[0] == "text" for r in repairs):
            repairs.append(("text", "invalid UTF-8 bytes or raw control characters replaced by U+FFFD", None))
        return _decode_events(path, fixed, None, _repaired=True)


# category (any case) -> bucket; everything else (python_function, flows, instants...) is skipped
_CAT_BUCKET = {
    "kernel": "kernel", "gpu_memcpy": "memcpy", "memcpy": "memcpy", "gpu_memset": "memset", "memset": "memset",
    "cuda_runtime": "runtime", "runtime": "runtime", "cuda_driver": "runtime", "driver": "runtime",
    "cpu_op": "op", "operator": "op",
    "user_annotation": "ann_cpu", "gpu_user_annotation": "ann_gpu",
    "cuda_sync": "sync",
}


_get_cat = operator.attrgetter("cat")
_get_ph = operator.attrgetter("ph")
_get_name = operator.attrgetter("name")
_get_ts = operator.attrgetter("ts")
_get_dur = operator.attrgetter("dur")
_get_pid = operator.attrgetter("pid")
_get_tid = operator.attrgetter("tid")
_get_args = operator.attrgetter("args")


def _bucket(events: list[_Event]) -> dict[str, list[_Event]]:
    """Group complete ("X") events by the bucket of their category, vectorised over categories."""
    buckets: dict[str, list[_Event]] = {k: [] for k in set(_CAT_BUCKET.values())}
    if not events:
        return buckets
    codes, uniques = pd.factorize(np.array(list(map(_get_cat, events)), dtype=object), sort=False)
    ph_codes, ph_uniques = pd.factorize(np.array(list(map(_get_ph, events)), dtype=object), sort=False)
    x = [i for i, v in enumerate(ph_uniques) if v == "X"]
    ph_x = ph_codes == x[0] if x else np.zeros(len(events), dtype=bool)
    for u, cat in enumerate(uniques):
        k = _CAT_BUCKET.get(str(cat).lower(), "")
        if not k:
            continue
        idx = np.nonzero((codes == u) & ph_x)[0]
        buckets[k].extend(events[i] for i in idx.tolist())
    return buckets


_NAN = float("nan")


MAX_TS_US = 4e15  # ~year 2096 in epoch µs: anything larger cannot be a timestamp
MAX_DUR_US = 1e12  # ~11.6 days


def _times(evs: list[_Event], base_ns: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(keep mask, start_ns, end_ns): drops events without a usable ts (missing, not finite,
    beyond int64 ns) or dur (negative, not finite, longer than 11 days)."""
    ts = np.array([_NAN if v is None else v for v in map(_get_ts, evs)], dtype=np.float64)
    dur = np.array([0.0 if v is None else v for v in map(_get_dur, evs)], dtype=np.float64)
    with np.errstate(invalid="ignore"):
        usable = np.isfinite(ts) & (np.abs(ts) <= MAX_TS_US) & np.isfinite(dur) & (dur <= MAX_DUR_US)
    keep = usable & ~(dur < 0)
    dur = np.where(np.isnan(dur), 0.0, dur)
    start = _us_to_ns(np.where(keep, ts, 0.0), base_ns)
    return keep, start, start + _dur_to_ns(np.where(keep, dur, 0.0))


def _arg(evs: list[_Event], field: str, default: int = -1) -> list[int]:
    get = operator.attrgetter(field)
    vals = [None if a is None else get(a) for a in map(_get_args, evs)]
    return [v if type(v) is int and -_I64 < v < _I64 else _int(v, default) for v in vals]


def _ids(vals: list) -> list[int]:
    return [v if type(v) is int and -_I64 < v < _I64 else _as_int(v) for v in vals]


def _ext_ids(evs: list[_Event]) -> list[int]:
    out = []
    for e in evs:
        a = e.args
        if a is None:
            out.append(-1)
        else:
            out.append(_int(a.external_id if a.external_id is not None else a.external_id_legacy))
    return out


def _gpu_columns(evs: list[_Event], kind: str, base_ns: int) -> tuple[dict, np.ndarray]:
    keep, start, end = _times(evs, base_ns)
    names = list(map(_get_name, evs))
    kinds = [kind] * len(evs)
    if kind == "kernel":
        # ROCm <= 7.1 reports copies/fills as kernels; 7.2 as gpu_memcpy/gpu_memset.
        for i, n in enumerate(names):
            if n.startswith("__amd_rocclr_"):
                low = n.lower()
                kinds[i] = "memcpy" if "copy" in low else "memset" if "fill" in low else "kernel"
    device = [_int(e.args.device, -2) if e.args is not None else -2 for e in evs]
    device = [d if d != -2 else _as_int(e.pid, 0) for d, e in zip(device, evs)]
    stream = [_int(e.args.stream, -2) if e.args is not None else -2 for e in evs]
    stream = [st if st != -2 else _as_int(e.tid, 0) for st, e in zip(stream, evs)]
    d = {"kind": kinds, "name": names, "device": device, "stream": stream, "start_ns": start, "end_ns": end,
         "correlation": _arg(evs, "correlation"), "external_id": _ext_ids(evs), "bytes": _arg(evs, "bytes")}
    return d, keep


def _select(d: dict, keep: np.ndarray) -> dict:
    if keep.all():
        return d
    idx = np.nonzero(keep)[0]
    return {k: (v[keep] if isinstance(v, np.ndarray) else [v[i] for i in idx]) for k, v in d.items()}


def _concat(parts: list[dict]) -> dict:
    if len(parts) == 1:
        return parts[0]
    out = {}
    for k in parts[0]:
        vals = [p[k] for p in parts]
        out[k] = np.concatenate(vals) if isinstance(vals[0], np.ndarray) else [x for v in vals for x in v]
    return out


def load_kineto(path: str, buf: bytes | None = None, lenient: bool = False, progress=None) -> Trace:
    """Load a Kineto JSON trace into the normalized :class:`Trace`.

    Args:
        path: trace path (``.json`` or ``.json.gz``; gzip is detected by content).
        buf: the already-decompressed bytes, when the caller has read them.
        lenient: repair numbers written with a decimal comma (a locale bug) instead of failing.
        progress: optional callback ``progress(done_bytes, total_bytes)`` for large inputs.

    Returns:
        Trace with int64-ns frames; data-quality notes in ``trace.quality``.

    Raises:
        TraceFormatError: unreadable file, corrupt gzip, invalid JSON, or JSON that is not a
            Chrome/Kineto trace (no ``traceEvents``).
    """
    gz_cut = None
    if buf is None:
        buf, gz_cut = read_bytes_partial(path)
    if not gz_cut and len(buf) >= CHUNKED_MIN_BYTES and buf[:64].lstrip()[:1] == b"{":
        trace = _load_chunked(path, buf, progress)
        if trace is not None:
            return trace
    fast = None
    if not gz_cut and buf[:64].lstrip()[:1] == b"{":
        try:
            fast = _doc_dec.decode(buf)
        except (msgspec.DecodeError, UnicodeDecodeError):
            fast = None
    if fast is not None:
        events, n = fast.traceEvents, len(buf)
        meta = {f: getattr(fast, f) for f in _META_FIELDS if getattr(fast, f) is not None}
        del fast, buf  # never hold the document and its decoded events longer than needed
        return _build(path, events, meta, legacy=False, repairs=[], buf_len=n, gz_cut=None)
    top, legacy, buf, repairs = _split_top(path, buf, lenient)
    if "traceEvents" not in top:
        raise TraceFormatError(
            f"{path}: JSON without 'traceEvents' — not a Kineto/Chrome trace"
        )
    metadata: dict[str, Any] = {}
    for k, v in top.items():
        if k == "traceEvents":
            continue
        try:
            metadata[k] = _any_dec.decode(v)
        except (msgspec.DecodeError, UnicodeDecodeError):
            metadata[k] = None
    events = _decode_events(path, top.pop("traceEvents"), repairs)
    buf_len = len(buf)
    del top, buf  # the decoded events are all we keep: never hold two copies of the document
    if legacy and events and not any(ev.ph for ev in events):
        raise TraceFormatError(f"{path}: JSON list without trace events (no 'ph' fields) — not a trace")
    return _build(path, events, metadata, legacy, repairs, buf_len, gz_cut)


_META_FIELDS = tuple(f for f in _Doc.__struct_fields__ if f != "traceEvents")


class _Columns:
    """Accumulates the columns of the events the analysis needs, chunk by chunk, so that the
    decoded structs of one chunk can be dropped before the next is decoded."""

    def __init__(self, base_ns: int) -> None:
        self.base_ns = base_ns
        self.parts: dict[str, list[dict]] = {"gpu": [], "runtime": [], "op": [], "ann": [], "sync": []}
        self.dropped = 0
        self.negative = 0
        self.bad_name = 0

    def add(self, events: list[_Event]) -> None:
        buckets = _bucket(events)
        base_ns = self.base_ns
        for kind in ("kernel", "memcpy", "memset"):
            if buckets[kind]:
                d, keep = _gpu_columns(buckets[kind], kind, base_ns)
                self.dropped += int((~keep).sum())
                self.parts["gpu"].append(_select(d, keep))
        evs = buckets["runtime"]
        if evs:
            keep, start, end = _times(evs, base_ns)
            self.dropped += int((~keep).sum())
            names = list(map(_get_name, evs))
            d = {"name": names, "api_kind": [api_kind(n) for n in names], "start_ns": start, "end_ns": end,
                 "correlation": _arg(evs, "correlation"), "pid": _ids(list(map(_get_pid, evs))), "tid": _ids(list(map(_get_tid, evs)))}
            self.parts["runtime"].append(_select(d, keep))
        evs = buckets["op"]
        if evs:
            keep, start, end = _times(evs, base_ns)
            self.dropped += int((~keep).sum())
            # bytes(): small copies, so the raw slices do not pin the whole document in memory
            d = {"name": list(map(_get_name, evs)), "start_ns": start, "end_ns": end,
                 "external_id": _ext_ids(evs),
                 "tid": _ids(list(map(_get_tid, evs))),
                 "input_dims": [bytes(e.args.input_dims) if e.args is not None and e.args.input_dims else None for e in evs],
                 "input_types": [bytes(e.args.input_types) if e.args is not None and e.args.input_types else None for e in evs]}
            self.parts["op"].append(_select(d, keep))
        for bucket, scope in (("ann_cpu", "cpu"), ("ann_gpu", "gpu")):
            evs = buckets[bucket]
            if evs:
                keep, start, end = _times(evs, base_ns)
                self.dropped += int((~keep).sum())
                pids = _ids(list(map(_get_pid, evs)))
                d = {"name": list(map(_get_name, evs)), "scope": [scope] * len(evs),
                     "device": pids if scope == "gpu" else [-1] * len(evs),
                     "start_ns": start, "end_ns": end, "pid": pids, "tid": _ids(list(map(_get_tid, evs)))}
                self.parts["ann"].append(_select(d, keep))
        evs = buckets["sync"]
        if evs:
            keep, start, end = _times(evs, base_ns)
            d = {"name": list(map(_get_name, evs)), "device": _arg(evs, "device", 0), "stream": _arg(evs, "stream", 0),
                 "start_ns": start, "end_ns": end}
            self.parts["sync"].append(_select(d, keep))
        for k in buckets.values():
            for e in k:
                if e.dur is not None and e.dur < 0:
                    self.negative += 1
                if "\ufffd" in e.name:
                    self.bad_name += 1

    def finish(self, trace: Trace) -> None:
        p = self.parts
        if p["gpu"]:
            trace.gpu = frame(GPU_COLUMNS, _concat(p["gpu"])).sort_values(["device", "start_ns", "end_ns"], kind="stable").reset_index(drop=True)
        if p["runtime"]:
            trace.runtime = frame(RUNTIME_COLUMNS, _concat(p["runtime"])).sort_values("start_ns", kind="stable").reset_index(drop=True)
        if p["op"]:
            trace.cpu_ops = frame(CPU_OP_COLUMNS, _concat(p["op"]))
        if p["ann"]:
            trace.annotations = frame(ANNOTATION_COLUMNS, _concat(p["ann"])).sort_values("start_ns", kind="stable").reset_index(drop=True)
        if p["sync"]:
            trace.gpu_syncs = frame(SYNC_COLUMNS, _concat(p["sync"]))
        no_ts = self.dropped - self.negative
        if self.negative:
            trace.note("negative_duration", f"{self.negative} event(s) with a negative duration were excluded", self.negative)
        if no_ts:
            trace.note("missing_timestamp", f"{no_ts} complete event(s) without a usable 'ts' or 'dur' (missing, not a number, or implausibly large) were skipped", no_ts)
        if self.bad_name:
            trace.note("invalid_utf8_names", f"{self.bad_name} event name(s) contained invalid UTF-8 and were replaced", self.bad_name)


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


def _build(path: str, events: list[_Event], metadata: dict[str, Any], legacy: bool,
           repairs: list, buf_len: int, gz_cut: str | None) -> Trace:
    """Normalized trace from decoded events and top-level metadata."""
    trace = _new_trace(path, metadata, legacy, repairs, buf_len, gz_cut)
    cols = _Columns(_base_ns(metadata))
    cols.add(events)
    del events
    cols.finish(trace)
    return trace


CHUNK_BYTES = 32 * 2**20
CHUNKED_MIN_BYTES = 64 * 2**20
_EVENT_BOUNDARY = re.compile(rb"\}\s*,\s*\{")


class _ChunkFailed(Exception):
    pass


def _load_chunked(path: str, buf: bytes, progress=None) -> Trace | None:
    """Decode ``traceEvents`` in ~32 MiB slices cut at ``},{`` boundaries; each slice's decode
    validates its cut. Returns None (caller falls back to the whole-document path) when the
    document or any slice does not decode cleanly."""
    try:
        top = msgspec.json.decode(buf, type=dict[str, msgspec.Raw])
    except (msgspec.DecodeError, UnicodeDecodeError):
        return None
    raw_events = top.pop("traceEvents", None)
    if raw_events is None:
        return None
    metadata: dict[str, Any] = {}
    for k, v in top.items():
        try:
            metadata[k] = _any_dec.decode(v)
        except (msgspec.DecodeError, UnicodeDecodeError):
            metadata[k] = None
    mv = memoryview(raw_events)
    n = len(mv)
    start = bytes(mv[:64]).find(b"[")
    end = n - 1
    while end > 0 and mv[end] != ord("]"):
        end -= 1
    if start < 0 or end <= start:
        return None
    trace = _new_trace(path, metadata, False, [], len(buf), None)
    cols = _Columns(_base_ns(metadata))
    dec = msgspec.json.Decoder(list[_Event])
    pos = start + 1
    try:
        while pos < end:
            target = pos + CHUNK_BYTES
            m = _EVENT_BOUNDARY.search(mv, target, end) if target < end else None
            cut = m.start() + 1 if m else end
            chunk = b"[" + bytes(mv[pos:cut]) + b"]"
            try:
                events = dec.decode(chunk)
            except (msgspec.DecodeError, UnicodeDecodeError):
                raise _ChunkFailed from None
            del chunk
            cols.add(events)
            del events
            if progress is not None:
                progress(cut, n)
            pos = (m.end() - 1) if m else end
    except _ChunkFailed:
        return None
    finally:
        mv.release()
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
