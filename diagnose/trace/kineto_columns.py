"""Decoded Kineto events -> the columns of the normalized trace frames (a split of
:mod:`diagnose.trace.kineto`).

:class:`_Columns` accumulates, chunk by chunk, the columns of the events the analysis needs
(grouped by :func:`_group`, read by :class:`_Raw`), pairs begin/end events, and builds the
:class:`~diagnose.trace.model.Trace` frames and quality notes in :meth:`_Columns.finish`.
"""
from __future__ import annotations

import operator
import re
from typing import TYPE_CHECKING, Any, NamedTuple

import msgspec
import numpy as np

from diagnose.errors import TraceFormatError
from diagnose.trace.apis import api_kind
from diagnose.trace.kineto_events import (
    _BUCKETS,
    _CAT_BUCKET,
    _I64,
    _MISSING,
    _PYFUNC,
    _Args,
    _Event,
    _StrictB,
    _StrictE,
    _StrictX,
    _as_int,
    _decoded,
    _int,
    _string_times,
)
from diagnose.trace.schema import (
    ANNOTATION_COLUMNS,
    CPU_OP_COLUMNS,
    GPU_COLUMNS,
    OVERHEAD_COLUMNS,
    PYTHON_FRAME_COLUMNS,
    RANK_ID_SHIFT,
    RUNTIME_COLUMNS,
    SYNC_COLUMNS,
    factorize_values,
)

if TYPE_CHECKING:
    from diagnose.trace.model import Trace


def _us_to_ns(ts_us: np.ndarray, base_ns: int) -> np.ndarray:
    """Convert float microseconds to int64 ns exactly: base + floor(ts)*1000 + round(frac*1000)."""
    ip = np.floor(ts_us)
    frac_ns = np.rint((ts_us - ip) * 1000.0).astype(np.int64)
    return np.int64(base_ns) + ip.astype(np.int64) * 1000 + frac_ns


def _dur_to_ns(dur_us: np.ndarray) -> np.ndarray:
    return np.rint(dur_us * 1000.0).astype(np.int64)


def _group(events: list, strict: bool) -> tuple[dict[str, list], list]:
    """Complete ("X") events by bucket (see _CAT_BUCKET), each bucket in file order (so that
    slicing a document never changes row order), and the begin/end ("B"/"E") events in file
    order; other events are dropped. Each distinct category is looked up once; the events
    are split by bucket in C (no Python code per event)."""
    out: dict[str, list] = {k: [] for k in _BUCKETS}
    if strict:
        xs = [e for e in events if type(e) is _StrictX]
        be = []
        if getattr(_decoded, "begin_end", False):  # set while decoding (maybe another list: then none here)
            _decoded.begin_end = False
            be = [e for e in events if type(e) is _StrictB or type(e) is _StrictE]
    else:
        xs = [e for e in events if e.ph == "X"]
        be = [e for e in events if e.ph == "B" or e.ph == "E"] if len(xs) < len(events) else []
    if not xs:
        return out, be
    codes = np.fromiter(map(_CAT_CODES.__getitem__, map(_get_cat, xs)), np.int8, len(xs))
    if len(_CAT_CODES) > _CAT_CODES_MAX:  # a file of countless categories: no unbounded cache
        _CAT_CODES.clear()
    counts = np.bincount(codes.astype(np.int64) + 1, minlength=len(_BUCKETS) + 1)
    present = np.flatnonzero(counts[1:]).tolist()
    if len(present) == 1 and not counts[0]:  # one bucket (a slice of kernels, say): the list as it is
        out[_BUCKETS[present[0]]] = xs
        return out, be
    for code in present:
        idx = np.flatnonzero(codes == code).tolist()
        out[_BUCKETS[code]] = list(operator.itemgetter(*idx)(xs)) if len(idx) > 1 else [xs[i] for i in idx]
    return out, be


class _CatCodes(dict):
    """Event category -> its bucket's code (index into ``_BUCKETS``; -1: a category the
    analysis skips), each category looked up when first seen (``__missing__``), then read in
    C for every event."""

    def __missing__(self, cat: Any) -> int:
        code = self[cat] = _BUCKET_CODE.get(_bucket(cat), -1)
        return code


_CAT_CODES = _CatCodes()
_CAT_CODES_MAX = 4096


def _bucket(cat: Any) -> str | None:
    """The bucket of an event category (any case), None for categories the analysis skips."""
    low = str(cat).lower()
    return _CAT_BUCKET.get(low) or ("pyfunc" if low == _PYFUNC else None)


_BUCKET_CODE = {k: i for i, k in enumerate(_BUCKETS)}
_get_cat = operator.attrgetter("cat")


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


def _ids(vals: list, default: int = -1) -> np.ndarray:
    """pid/tid-like values (int, "stream 7", None...) as int64; see _as_int."""
    arr = _int64(vals)
    if arr is not None:
        return arr
    return np.array([v if type(v) is int and -_I64 < v < _I64 else _as_int(v, default) for v in vals], dtype=np.int64)


def _int64(vals: list) -> np.ndarray | None:
    """``vals`` as int64 when every one is an int that fits (numpy's own type discovery, in C:
    a str or None gives another dtype), else None. The schemas never give a bool here."""
    if not vals:
        return None
    try:
        arr = np.array(vals)
    except (OverflowError, ValueError, TypeError):
        return None
    return arr if arr.dtype == np.int64 and arr.ndim == 1 else None


class _Raw:
    """Columns of one bucket's events, before the bucket's own rules (defaults, fallbacks).

    ``ts`` float64 µs (NaN = missing), ``dur`` float64 µs (NaN = missing), ``pid``/``tid``
    the values as decoded (a merged file's rank label split off), args ids int64 with
    ``_MISSING`` for absent or unusable values."""

    def __init__(self, evs: list, strict: bool) -> None:
        self.evs, self.strict, self.n = evs, strict, len(evs)
        self.name = list(map(_get_name, evs))
        self._names: _Coded | None = None
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
        self._ints: np.ndarray | None = None  # the pids when all are ints
        self._labels: list | None = None

    def _exact_ints(self, get) -> np.ndarray | None:
        """``get`` of every event as int64 when each is an int that fits (strict schema: ints
        read in C, no list), else None (a str, None or a huge int: the caller reads values)."""
        if not self.strict:
            return None
        try:
            return np.fromiter(map(operator.index, map(get, self.evs)), np.int64, self.n)
        except (TypeError, OverflowError):
            return None

    def _pid_values(self) -> list:
        if self._pids is None:
            self._ints = self._exact_ints(_get_pid)
            if self._ints is not None:  # no rank label: those are text
                self._pids = []
                return self._pids
            vals = list(map(_get_pid, self.evs))
            self._ints = _int64(vals)
            if self._ints is None and any(type(v) is str for v in vals):
                vals, self._labels = _split_rank_pids(vals)
            self._pids = vals
        return self._pids

    def pid(self, default: int = -1) -> np.ndarray:
        vals = self._pid_values()
        return self._ints if self._ints is not None else _ids(vals, default)

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
        ints = self._exact_ints(_get_tid)
        return ints if ints is not None else _ids(list(map(_get_tid, self.evs)), default)

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

    def names(self) -> _Coded:
        """The names, factorized (once per bucket and chunk: every later step works on codes)."""
        if self._names is None:
            self._names = _code(self.name)
        return self._names

    def raw_arg(self, field: str) -> _Coded:
        """Raw JSON of an arg (``Input Dims``...) as small bytes copies (never views that would
        pin the whole document in memory), factorized: equal values are one object (a trace
        has thousands of ops and a few hundred distinct shapes: memory per op is then a
        code, and forked workers pickle each value once). None: absent."""
        get = operator.attrgetter(field)
        if self.strict:
            vals = [bytes(v) if v else None for v in map(get, self._args)]
        else:
            vals = [None if a is None else bytes(get(a)) or None for a in self._args]
        return _code(vals)

    def raw_args(self, fields: tuple[str, ...]) -> list[_Coded]:
        """:meth:`raw_arg` of each of ``fields``, read together: each event's values joined into
        one key (``_RAW_SEP`` between them, in C), the keys factorized, then the few distinct
        keys split back into each field's values (an op's dims, types and concrete inputs repeat
        together: one copy and one hash per op instead of three). Field by field when a key
        does not split into ``len(fields)`` parts (a separator inside a value)."""
        if not self.strict or not self.n:
            return [self.raw_arg(f) for f in fields]
        keys = list(map(_RAW_SEP.join, zip(*(map(operator.attrgetter(f), self._args) for f in fields))))
        codes, uniques = factorize_values(keys)
        distinct = uniques.tolist()
        # each key holds exactly len(fields) - 1 separators unless a value holds one too:
        # counted over all keys at once, in C
        if b"".join(distinct).count(_RAW_SEP) != (len(fields) - 1) * len(distinct):
            return [self.raw_arg(f) for f in fields]
        out = []
        for values in zip(*map(operator.methodcaller("split", _RAW_SEP), distinct)):  # per field, in C
            field_codes, field_uniques = factorize_values(values)
            field_uniques[field_uniques == b""] = None  # absent (an empty Raw)
            out.append(_Coded(field_codes[codes].astype(np.int32), field_uniques))
        return out

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


_RAW_SEP = b"\x01"  # a control character: JSON text holds it only escaped (checked on split)


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
    names = r.names()
    if kind == "kernel":
        # ROCm <= 7.1 reports copies/fills as kernels; 7.2 as gpu_memcpy/gpu_memset.
        per_name = np.array([_GPU_KINDS.index(_rocclr_kind(n)) for n in names.uniques.tolist()], dtype=np.int8)
        kinds = _Coded(per_name[names.codes] if len(per_name) else np.zeros(0, np.int8), _GPU_KIND_VALUES)
    else:
        kinds = _const(r.n, kind)
    pid = r.pid(_MISSING)
    device = r.arg("device")
    device = np.where((device == _MISSING) | (device == -2), np.where(pid == _MISSING, 0, pid), device)
    stream = r.arg("stream")
    no_stream = (stream == _MISSING) | (stream == -2)
    if no_stream.any():  # the thread id stands for the stream (read only then)
        stream = np.where(no_stream, r.tid(0), stream)
    d = {"kind": kinds, "name": names, "device": device, "stream": stream, "start_ns": start, "end_ns": end,
         "correlation": r.arg_or("correlation", -1), "external_id": r.external_id(), "bytes": r.arg_or("bytes", -1),
         "pid": np.where(pid == _MISSING, -1, pid)}
    return d, keep


_GPU_KINDS = ("kernel", "memcpy", "memset")
_GPU_KIND_VALUES = np.array(_GPU_KINDS, dtype=object)


def _rocclr_kind(name: str) -> str:
    """A kernel's kind: ROCm's copy and fill kernels (``__amd_rocclr_copyBuffer``...) are
    copies and fills."""
    if name.startswith("__amd_rocclr_"):
        low = name.lower()
        return "memcpy" if "copy" in low else "memset" if "fill" in low else "kernel"
    return "kernel"


class _Coded(NamedTuple):
    """A text column as ``codes`` (int32) into distinct ``uniques`` (object array): decoded
    names stay codes from the chunk that read them until the frame is built, so no step
    (pickling a worker's share, merging shares, building the categorical) touches one
    string per event again."""

    codes: np.ndarray
    uniques: np.ndarray


def _code(values: list) -> _Coded:
    """Factorize str or bytes values, first-seen order (see :func:`~diagnose.trace.model.factorize`)."""
    codes, uniques = factorize_values(values)
    return _Coded(codes.astype(np.int32), uniques)


def _const(n: int, value: str) -> _Coded:
    """A column holding ``value`` on every row."""
    return _Coded(np.zeros(n, np.int32), np.array([value], dtype=object))


def _concat_coded(parts: list[_Coded]) -> _Coded:
    """One coded column from parts (in order), their distinct values merged."""
    if len(parts) == 1:
        return parts[0]
    # every part's distinct values factorized together (first-seen order), in C
    remaps, uniques = factorize_values(np.concatenate([u for _, u in parts]))
    remaps = remaps.astype(np.int32)
    out = []
    at = 0
    for codes, u in parts:
        remap = remaps[at:at + len(u)]
        at += len(u)
        out.append(remap[codes] if len(codes) else np.zeros(0, np.int32))
    return _Coded(np.concatenate(out), uniques)


def _used(c: _Coded) -> list:
    """The distinct values a coded column holds (its uniques may outlive dropped rows)."""
    return c.uniques[np.unique(c.codes)].tolist() if len(c.codes) else []


def _column(name: str, c: Any) -> Any:
    """A column as the frame holds it: names (and the annotation scope) categorical, other
    text columns (kinds, raw op arguments) object arrays of shared values."""
    if not isinstance(c, _Coded):
        return c
    if name in ("name", "scope"):
        from diagnose.trace.model import categorical  # pandas: in the main process, once decoded

        return categorical(c.codes, c.uniques)
    return c.uniques[c.codes] if len(c.uniques) else np.full(len(c.codes), None, dtype=object)


def _take(c: Any, order: np.ndarray) -> Any:
    return _Coded(c.codes[order], c.uniques) if isinstance(c, _Coded) else np.asarray(c)[order]


def _obj(values: list) -> np.ndarray:
    """A 1-D object array of ``values`` (str, bytes or None), never reshaped."""
    return np.fromiter(values, dtype=object, count=len(values))


def _select(d: dict, keep: np.ndarray) -> dict:
    """Columns (numpy arrays, coded columns; lists become object arrays) restricted to the
    ``keep`` rows."""
    d = {k: v if isinstance(v, (np.ndarray, _Coded)) else _obj(v) for k, v in d.items()}
    if keep.all():
        return d
    return {k: _Coded(v.codes[keep], v.uniques) if isinstance(v, _Coded) else v[keep] for k, v in d.items()}


def _concat(parts: list[dict]) -> dict:
    """One dict of columns from parts; a part without a rank column gets "" (no label)."""
    if any("rank" in p for p in parts):
        parts = [p if "rank" in p else {**p, "rank": _const(len(p["start_ns"]), "")} for p in parts]
    if len(parts) == 1:
        return parts[0]
    out = {}
    for k in parts[0]:
        if isinstance(parts[0][k], _Coded):
            out[k] = _concat_coded([p[k] for p in parts])
        else:
            out[k] = np.concatenate([p[k] for p in parts])
    return out


_COUNTERS = ("events", "dropped", "negative", "no_dur", "bad_name", "bad_value", "out_of_range", "pyfunc", "pyfunc_ns",
             "string_times")


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
        self.n_slices = 0  # slices decoded into these columns (kineto._decode_slices)

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
            names = r.names()  # classify each distinct API name once
            kinds = _code(np.array([api_kind(n) for n in names.uniques.tolist()], dtype=object))
            kinds = _Coded(kinds.codes[names.codes] if len(kinds.codes) else kinds.codes, kinds.uniques)
            d = {"name": names, "api_kind": kinds, "start_ns": start, "end_ns": end,
                 "correlation": r.arg_or("correlation", -1), "pid": r.pid(), "tid": r.tid()}
            self._keep("runtime", d, keep, r)
        r = raws.get("op")
        if r is not None:
            keep, start, end = r.times(base_ns)
            dims, types, concrete = r.raw_args(("input_dims", "input_types", "concrete_inputs"))
            d = {"name": r.names(), "start_ns": start, "end_ns": end, "external_id": r.external_id(), "tid": r.tid(),
                 "input_dims": dims, "input_types": types, "concrete_inputs": concrete}
            self._keep("op", d, keep, r)
        for bucket, scope in (("ann_cpu", "cpu"), ("ann_gpu", "gpu")):
            r = raws.get(bucket)
            if r is not None:
                keep, start, end = r.times(base_ns)
                pids = r.pid()
                d = {"name": r.names(), "scope": _const(r.n, scope), "device": pids if scope == "gpu" else np.full(r.n, -1, np.int64),
                     "start_ns": start, "end_ns": end, "pid": pids, "tid": r.tid()}
                self._keep("ann", d, keep, r)
        r = raws.get("sync")
        if r is not None:
            keep, start, end = r.times(base_ns)
            d = {"name": r.names(), "device": r.arg_or("device", 0), "stream": r.arg_or("stream", 0),
                 "start_ns": start, "end_ns": end, "correlation": r.arg_or("correlation", -1),
                 "wait_stream": r.arg_or("wait_on_stream", -1), "wait_record_correlation": r.arg_or("wait_record", -1)}
            self._keep("sync", d, keep, r)
        r = raws.get("overhead")
        if r is not None:
            keep, start, end = r.times(base_ns)
            d = {"name": r.names(), "start_ns": start, "end_ns": end, "pid": r.pid(), "tid": r.tid()}
            self._keep("overhead", d, keep, r)
        for r in raws.values():
            self.n["string_times"] += r.n_strings
            self.n["negative"] += int((r.dur < 0).sum())
            self.n["no_dur"] += int(np.isnan(r.dur).sum())
            names = r.names()  # names with a repaired byte, counted per distinct name
            bad = np.array(["\ufffd" in n for n in names.uniques.tolist()], dtype=bool)
            if bad.any():
                self.n["bad_name"] += int(np.bincount(names.codes, minlength=len(bad))[bad].sum())

    def _pyfunc(self, r: _Raw) -> None:
        """Count python_function events, sum their durations and keep their name, times, pid
        and tid (never their args); events without usable times are left out silently (they
        are not analysed events: no ``missing_timestamp`` count)."""
        keep, start, end = r.times(self.base_ns)
        ns = np.where(keep, end - start, 0)
        self.n["pyfunc"] += r.n
        self.n["pyfunc_ns"] += int(ns.sum())
        d = {"name": r.names(), "start_ns": start, "end_ns": end, "pid": r.pid(), "tid": r.tid()}
        labels = r.rank_labels(look=self.labelled)
        if labels is not None:
            self.labelled = True
            d["rank"] = _code(labels)
            for label, dur in zip(labels, ns.tolist()):
                c = self.pyfunc_by_rank.setdefault(label, [0, 0])
                c[0] += 1
                c[1] += dur
        self.parts["pyframe"].append(_select(d, keep))

    def state(self) -> dict:
        """Everything accumulated, as picklable data (sent back by forked workers). Text
        columns travel as they are kept, coded (:class:`_Coded`): pickling a million
        ``str`` objects would cost more than decoding them. Each part's slices are
        concatenated first (in the worker: one array per column travels, not one per slice)."""
        parts = {k: [_concat(v)] if len(v) > 1 else v for k, v in self.parts.items()}
        return {"parts": parts, "n": self.n, "pyfunc_by_rank": self.pyfunc_by_rank, "be": self.be}

    def merge(self, state: dict) -> None:
        """Append another instance's :meth:`state` (its events come after this one's)."""
        for k, v in state["parts"].items():
            self.parts[k].extend(v)
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
            d["rank"] = _code(labels)
        self.parts[part].append(_select(d, keep))

    def finish(self, trace: Trace) -> None:
        """Build ``trace``'s frames, counts and quality notes from everything added.

        Raises:
            TraceFormatError: the document holds no event at all.
        """
        from diagnose.trace.model import frame  # pandas: in the main process, once decoded

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
        labels = sorted({lab for lst in p.values() for d in lst if "rank" in d for lab in _used(d["rank"]) if lab})
        merged = len(labels) >= 2
        index = {lab: i for i, lab in enumerate(labels)}

        def build(part: str, columns: dict, ids: tuple[str, ...] = (), sort: Any = None):
            if not p[part]:
                return None
            d = _concat(p[part])
            p[part] = []  # the parts are in d now: free them as the columns are built
            rank = None
            if merged:
                rc = d["rank"]
                rank = np.array([index.get(x, -1) for x in rc.uniques.tolist()] + [-1], dtype=np.int64)[rc.codes]
                for c in ids:  # never link across ranks: their ids collide
                    x = np.asarray(d[c], dtype=np.int64)
                    q = (rank >= 0) & (x >= 0) & (x < (1 << RANK_ID_SHIFT))
                    d[c] = np.where(q, (rank << RANK_ID_SHIFT) | x, x)
            if sort is not None:  # stable, as DataFrame.sort_values(kind="stable")
                keys = [d[k] for k in ([sort] if isinstance(sort, str) else sort)]
                order = np.lexsort(keys[::-1]) if len(keys) > 1 else np.argsort(keys[0], kind="stable")
                d = {k: _take(v, order) for k, v in d.items()}
                rank = rank[order] if rank is not None else None
            df = frame(columns, {k: _column(k, v) for k, v in d.items() if k in columns})
            if rank is not None:
                df["rank"] = rank
            return df

        for attr, part, columns, ids, sort in (
            ("gpu", "gpu", GPU_COLUMNS, ("correlation", "external_id"), ["device", "start_ns", "end_ns"]),
            ("runtime", "runtime", RUNTIME_COLUMNS, ("correlation",), "start_ns"),
            ("cpu_ops", "op", CPU_OP_COLUMNS, ("external_id",), None),
            ("annotations", "ann", ANNOTATION_COLUMNS, (), "start_ns"),
            ("gpu_syncs", "sync", SYNC_COLUMNS, ("correlation", "wait_record_correlation"), None),
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
