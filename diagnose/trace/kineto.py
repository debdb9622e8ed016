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
import re
import zlib
from typing import Any

import msgspec
import numpy as np

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


class _Event(msgspec.Struct, gc=False):
    ph: str = ""
    cat: str = ""
    name: str = ""
    ts: float | None = None
    dur: float | None = None
    pid: int | str | None = None
    tid: int | str | None = None
    args: msgspec.Raw = msgspec.Raw()


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


class _GpuArgs(msgspec.Struct, gc=False):
    device: int | None = None
    stream: int | None = None
    correlation: int | None = None
    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_legacy: int | None = msgspec.field(default=None, name="external id")
    bytes: int | None = None


class _RuntimeArgs(msgspec.Struct, gc=False):
    correlation: int | None = None


class _OpArgs(msgspec.Struct, gc=False):
    external_id: int | None = msgspec.field(default=None, name="External id")
    external_id_legacy: int | None = msgspec.field(default=None, name="external id")
    input_dims: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input Dims")
    input_types: msgspec.Raw = msgspec.field(default=msgspec.Raw(), name="Input type")
    device: int | None = None


_GPU_KIND = {
    "kernel": "kernel",
    "gpu_memcpy": "memcpy",
    "memcpy": "memcpy",
    "gpu_memset": "memset",
    "memset": "memset",
}
_RUNTIME_CATS = {"cuda_runtime", "runtime", "cuda_driver", "driver"}
_OP_CATS = {"cpu_op", "operator"}
_ANNOTATION_CATS = {"user_annotation": "cpu", "gpu_user_annotation": "gpu"}
_SYNC_CATS = {"cuda_sync"}

_gpu_args_dec = msgspec.json.Decoder(_GpuArgs)
_rt_args_dec = msgspec.json.Decoder(_RuntimeArgs)
_op_args_dec = msgspec.json.Decoder(_OpArgs)
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


_FIELDS: dict[type, tuple] = {}


def _fields(cls: type) -> tuple:
    if cls not in _FIELDS:
        _FIELDS[cls] = msgspec.structs.fields(cls)
    return _FIELDS[cls]


def _decode_args(dec: msgspec.json.Decoder, raw: msgspec.Raw | None, loose_cls: type):
    if not raw:
        return loose_cls()
    try:
        return dec.decode(raw)
    except msgspec.ValidationError:
        # Odd types inside args (e.g. a stream id written as a string): coerce what we can.
        obj = _any_dec.decode(raw)
        if not isinstance(obj, dict):
            return loose_cls()
        kw = {}
        for f in _fields(loose_cls):
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
        return loose_cls(**kw)


def _as_int(v: Any, default: int = -1) -> int:
    if isinstance(v, bool):
        return default
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        return int(v)
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
        if isinstance(err, UnicodeDecodeError) or "invalid character" in msg:
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
        except msgspec.DecodeError:
            top = {}
    end = len(buf)
    for _ in range(max_tries):
        end = buf.rfind(b"}", lb, end)
        if end < 0:
            break
        candidate = buf[lb:end + 1] + b"]"
        try:
            msgspec.json.decode(candidate)
        except msgspec.DecodeError:
            continue
        top["traceEvents"] = msgspec.Raw(candidate)
        return top, end + 1
    top["traceEvents"] = msgspec.Raw(b"[]")
    return top, lb + 1


def _decode_events(path: str, raw: msgspec.Raw) -> list:
    try:
        return msgspec.json.decode(raw, type=list[_Event])
    except msgspec.ValidationError:
        try:
            return msgspec.json.decode(raw, type=list[_LooseEvent])
        except msgspec.ValidationError as e:
            raise TraceFormatError(f"{path}: traceEvents is not a list of events ({e})") from None
    except msgspec.DecodeError as e:
        raise TraceFormatError(f"{path}: invalid JSON in traceEvents ({e})") from None


def load_kineto(path: str, buf: bytes | None = None, lenient: bool = False) -> Trace:
    """Load a Kineto JSON trace into the normalized :class:`Trace`.

    Args:
        path: trace path (``.json`` or ``.json.gz``; gzip is detected by content).
        buf: the already-decompressed bytes, when the caller has read them.
        lenient: repair numbers written with a decimal comma (a locale bug) instead of failing.

    Returns:
        Trace with int64-ns frames; data-quality notes in ``trace.quality``.

    Raises:
        TraceFormatError: unreadable file, corrupt gzip, invalid JSON, or JSON that is not a
            Chrome/Kineto trace (no ``traceEvents``).
    """
    gz_cut = None
    if buf is None:
        buf, gz_cut = read_bytes_partial(path)
    top, legacy, buf, repairs = _split_top(path, buf, lenient)
    if "traceEvents" not in top:
        raise TraceFormatError(
            f"{path}: JSON without 'traceEvents' — not a Kineto/Chrome trace"
        )
    events = _decode_events(path, top["traceEvents"])
    if legacy and events and not any(ev.ph for ev in events):
        raise TraceFormatError(f"{path}: JSON list without trace events (no 'ph' fields) — not a trace")

    metadata: dict[str, Any] = {}
    for k, v in top.items():
        if k == "traceEvents":
            continue
        try:
            metadata[k] = _any_dec.decode(v)
        except msgspec.DecodeError:
            metadata[k] = None
    base_ns = metadata.get("baseTimeNanoseconds")
    base_ns = int(base_ns) if isinstance(base_ns, (int, float)) and not isinstance(base_ns, bool) else 0

    trace = Trace(source_path=path, source_format="kineto-json", metadata=metadata)
    for code, msg, n in repairs:
        if code == "truncated":
            trace.partial = True
            where = f"; {gz_cut}" if gz_cut else ""
            trace.note("truncated", f"trace cut at byte {n:,} of {len(buf):,} (decompressed){where}: the complete events before it were analysed; every number is partial")
        elif code == "decimal_comma":
            trace.note("decimal_comma_repaired", msg, n)
        elif code == "text":
            trace.note("invalid_text_repaired", msg)
    if gz_cut and not trace.partial:
        trace.partial = True
        trace.note("truncated", f"{gz_cut}: the events recovered were analysed; every number is partial")
    if legacy:
        trace.note("legacy_event_list", "legacy top-level JSON list of events (no trace metadata)")

    g = {k: [] for k in ("kind", "name", "device", "stream", "ts", "dur", "correlation", "external_id", "bytes")}
    r = {k: [] for k in ("name", "ts", "dur", "correlation", "pid", "tid")}
    o = {k: [] for k in ("name", "ts", "dur", "external_id", "tid", "input_dims", "input_types")}
    a = {k: [] for k in ("name", "scope", "device", "ts", "dur", "pid", "tid")}
    s = {k: [] for k in ("name", "device", "stream", "ts", "dur")}
    negative = 0
    no_ts = 0
    bad_name = 0

    for ev in events:
        if ev.ph != "X":
            continue
        cat = ev.cat if isinstance(ev.cat, str) else str(ev.cat)
        lc = cat.lower()
        kind = _GPU_KIND.get(lc)
        is_rt = lc in _RUNTIME_CATS
        is_op = lc in _OP_CATS
        scope = _ANNOTATION_CATS.get(lc)
        is_sync = lc in _SYNC_CATS
        if kind is None and not (is_rt or is_op or scope or is_sync):
            continue
        ts, dur = ev.ts, ev.dur
        if not isinstance(ts, (int, float)) or isinstance(ts, bool):
            try:
                ts = float(ts)
            except (TypeError, ValueError):
                no_ts += 1
                continue
        if dur is None:
            dur = 0.0
        elif not isinstance(dur, (int, float)):
            try:
                dur = float(dur)
            except (TypeError, ValueError):
                dur = 0.0
        if dur < 0:
            negative += 1
            continue
        name = ev.name if isinstance(ev.name, str) else str(ev.name)
        if "\ufffd" in name:
            bad_name += 1
        if kind is not None:
            ga = _decode_args(_gpu_args_dec, ev.args, _GpuArgs)
            if kind == "kernel" and name.startswith("__amd_rocclr_"):
                # ROCm <= 7.1 reports copies/fills as kernels; 7.2 as gpu_memcpy/gpu_memset.
                low = name.lower()
                if "copy" in low:
                    kind = "memcpy"
                elif "fill" in low:
                    kind = "memset"
            g["kind"].append(kind)
            g["name"].append(name)
            g["device"].append(ga.device if ga.device is not None else _as_int(ev.pid, 0))
            g["stream"].append(ga.stream if ga.stream is not None else _as_int(ev.tid, 0))
            g["ts"].append(ts)
            g["dur"].append(dur)
            g["correlation"].append(ga.correlation if ga.correlation is not None else -1)
            ext = ga.external_id if ga.external_id is not None else ga.external_id_legacy
            g["external_id"].append(ext if ext is not None else -1)
            g["bytes"].append(ga.bytes if ga.bytes is not None else -1)
        elif is_rt:
            ra = _decode_args(_rt_args_dec, ev.args, _RuntimeArgs)
            r["name"].append(name)
            r["ts"].append(ts)
            r["dur"].append(dur)
            r["correlation"].append(ra.correlation if ra.correlation is not None else -1)
            r["pid"].append(_as_int(ev.pid))
            r["tid"].append(_as_int(ev.tid))
        elif is_op:
            oa = _decode_args(_op_args_dec, ev.args, _OpArgs)
            o["name"].append(name)
            o["ts"].append(ts)
            o["dur"].append(dur)
            ext = oa.external_id if oa.external_id is not None else oa.external_id_legacy
            o["external_id"].append(ext if ext is not None else -1)
            o["tid"].append(_as_int(ev.tid))
            o["input_dims"].append(oa.input_dims if oa.input_dims else None)
            o["input_types"].append(oa.input_types if oa.input_types else None)
        elif scope is not None:
            a["name"].append(name)
            a["scope"].append(scope)
            a["device"].append(_as_int(ev.pid) if scope == "gpu" else -1)
            a["ts"].append(ts)
            a["dur"].append(dur)
            a["pid"].append(_as_int(ev.pid))
            a["tid"].append(_as_int(ev.tid))
        else:
            ga = _decode_args(_gpu_args_dec, ev.args, _GpuArgs)
            s["name"].append(name)
            s["device"].append(ga.device if ga.device is not None else _as_int(ev.pid, 0))
            s["stream"].append(ga.stream if ga.stream is not None else _as_int(ev.tid, 0))
            s["ts"].append(ts)
            s["dur"].append(dur)
    del events

    def times(d: dict) -> dict:
        ts = np.asarray(d.pop("ts"), dtype=np.float64)
        dur = np.asarray(d.pop("dur"), dtype=np.float64)
        start = _us_to_ns(ts, base_ns)
        d["start_ns"] = start
        d["end_ns"] = start + _dur_to_ns(dur)
        return d

    if g["kind"]:
        gd = times(g)
        trace.gpu = frame(GPU_COLUMNS, gd).sort_values(["device", "start_ns", "end_ns"], kind="stable").reset_index(drop=True)
    if r["name"]:
        rd = times(r)
        rd["api_kind"] = [api_kind(n) for n in rd["name"]]
        trace.runtime = frame(RUNTIME_COLUMNS, rd).sort_values("start_ns", kind="stable").reset_index(drop=True)
    if o["name"]:
        od = times(o)
        trace.cpu_ops = frame(CPU_OP_COLUMNS, od)
    if a["name"]:
        trace.annotations = frame(ANNOTATION_COLUMNS, times(a)).sort_values("start_ns", kind="stable").reset_index(drop=True)
    if s["name"]:
        trace.gpu_syncs = frame(SYNC_COLUMNS, times(s))

    trace.devices = _devices(metadata.get("deviceProperties"))
    if negative:
        trace.note("negative_duration", f"{negative} event(s) with a negative duration were excluded", negative)
    if no_ts:
        trace.note("missing_timestamp", f"{no_ts} complete event(s) without a usable 'ts' were skipped", no_ts)
    if bad_name:
        trace.note("invalid_utf8_names", f"{bad_name} event name(s) contained invalid UTF-8 and were replaced", bad_name)
    return trace


def parse_input_dims(raw: msgspec.Raw | list | None) -> list | None:
    """Decode a cpu_op's ``Input Dims`` (kept raw at load time) into nested lists of ints."""
    if raw is None:
        return None
    if isinstance(raw, list):
        return raw
    try:
        v = _any_dec.decode(raw)
    except msgspec.DecodeError:
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
