"""Kineto event schemas: the msgspec structs a trace's events decode into, and the coercion
of events whose fields have odd types (a split of :mod:`diagnose.trace.kineto`).

Three schemas, tried in turn by :func:`diagnose.trace.kineto._decode_slice`: the strict
tagged union (:data:`_StrictEvent`: only complete events decoded into fields, ids plain
ints), :class:`_Event` (any event, ids of any type) and :class:`_LooseEvent` (every field
``Any``), coerced event by event into :class:`_Event`; :class:`_RawEvent` is the last resort
for numbers beyond float64. :data:`_CAT_BUCKET` maps an event category to the part of the
trace it feeds.
"""
from __future__ import annotations

import decimal
import threading
from typing import Any, Union

import msgspec


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
    wait_on_stream: Any = None  # cuda_sync "Stream Wait Event": the stream waited on
    wait_record: Any = msgspec.field(default=None, name="wait_on_cuda_event_record_corr_id")


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
                 bytes=kw.get("bytes"), wait_on_stream=kw.get("wait_on_stream"), wait_record=kw.get("wait_record"),
                 input_dims=a.input_dims, input_types=a.input_types, concrete_inputs=a.concrete_inputs)


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
    wait_on_stream: int = _MISSING
    wait_record: int = msgspec.field(default=_MISSING, name="wait_on_cuda_event_record_corr_id")


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


_loose_list_dec = msgspec.json.Decoder(list[_Event])


_any_loose_list_dec = msgspec.json.Decoder(list[_LooseEvent])


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
