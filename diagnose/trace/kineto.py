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
``cpu_ops`` frame, decoded on demand (:func:`parse_input_dims`); equal values share one
object. Every ``name`` column is a categorical (:mod:`diagnose.trace.model`): names stay
codes into their distinct values from the slice that decoded them to the frame.

The loader is three modules, one per job: this one reads the document (top-level keys,
repairs, slicing a large file and decoding its slices on forked workers) and builds the
:class:`~diagnose.trace.model.Trace`; :mod:`diagnose.trace.kineto_events` holds the event
schemas and the coercion of odd field types; :mod:`diagnose.trace.kineto_columns` turns
decoded events into the frames' columns.
"""
from __future__ import annotations

import bisect
import mmap
import os
import re
import select
import signal
import struct
import sys
import threading
from typing import TYPE_CHECKING, Any

import msgspec

from diagnose.errors import TraceFormatError
from diagnose.trace.kineto_columns import _Columns
from diagnose.trace.kineto_repair import _CONTROL, _REPLACEMENT, _is_text_error, _split_top
from diagnose.trace.workerpipe import receive_state, send_state
from diagnose.trace.kineto_events import _any_dec, _as_int, _decode_lenient, _Event, _StrictEvent
from diagnose.trace.reading import read_bytes_partial

if TYPE_CHECKING:  # pandas: imported by the main process once it builds the frames (see start_decode)
    from diagnose.trace.model import DeviceInfo, Trace


class _Doc(msgspec.Struct, gc=False):
    """One-pass decode of a well-formed Kineto document's events (its other keys are read by
    :func:`_top_metadata`). Anything odd falls back to the robust path (:func:`_split_top`)."""

    traceEvents: list[_Event]


_doc_dec = msgspec.json.Decoder(_Doc)


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


_strict_list_dec = msgspec.json.Decoder(list[_StrictEvent])


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


def load_kineto(path: str, buf: bytes | bytearray | None = None, lenient: bool = False, progress=None,
                gz_cut: str | None = None, workers: int | None = None, started: StartedDecode | None = None) -> Trace:
    """Load a Kineto JSON trace into the normalized :class:`Trace`.

    Args:
        path: trace path (``.json`` or ``.json.gz``; gzip is detected by content).
        buf: the already-decompressed bytes, when the caller has read them (with ``gz_cut``,
            the description of a gzip stream cut short, from ``read_bytes_partial``).
        lenient: repair numbers written with a decimal comma (a locale bug) instead of failing.
        progress: optional callback ``progress(done_bytes, total_bytes)`` for large inputs.
        workers: processes decoding a large file (>= 64 MiB) in parallel; None:
            :func:`workers_default`; 1: this process only.
        started: the decode :func:`start_decode` started on ``buf`` (its workers are collected).

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
        return _load_kineto(path, buf, lenient, progress, gz_cut, workers, started)
    except RecursionError:  # msgspec's nesting guard: no trace is nested thousands of levels deep
        raise TraceFormatError(f"{path}: JSON nested too deeply to decode (thousands of levels of arrays/objects): not a profiler trace") from None


def _load_kineto(path: str, buf: bytes | bytearray, lenient: bool, progress, gz_cut: str | None,
                 workers: int | None, started: StartedDecode | None = None) -> Trace:
    if not gz_cut and len(buf) >= CHUNKED_MIN_BYTES and buf[:64].lstrip()[:1] == b"{":
        trace = _load_chunked(path, buf, progress, workers, started)
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


def _base_ns(metadata: dict[str, Any]) -> int:
    """``baseTimeNanoseconds`` when it is a plausible epoch time in ns, else 0 (see _new_trace)."""
    b = metadata.get("baseTimeNanoseconds")
    if isinstance(b, (int, float)) and not isinstance(b, bool) and 0 <= b <= 4e18:
        return int(b)
    return 0


def _new_trace(path: str, metadata: dict[str, Any], legacy: bool, repairs: list, buf_len: int, gz_cut: str | None) -> Trace:
    from diagnose.trace.model import Trace

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


#: Bytes of JSON per slice of a large document. Small enough that one slice's decoded events
#: (~1.5x its bytes) stay in the CPU's caches while their columns are read and that the memory
#: freed after a slice serves the next one (32 MiB slices: 83,000 page faults in the workers of
#: a 255 MB trace, 2.3 s of CPU; 4 MiB: 28,000 and 1.85 s; benchmarks/README.md); large enough
#: that the per-slice work (grouping, one set of column arrays) stays small (2 MiB: slower).
CHUNK_BYTES = 4 * 2**20


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
                   bound=None) -> _Columns:
    """Decode each slice of ``src`` into one :class:`_Columns`; ``progress(end, 0)`` after each.
    Decoded events are freed slice by slice (their memory then holds the next slice's).
    ``bound()``, when given, is read before each slice: the slices from that index on are left
    (to the parent: :class:`_Forked`); ``n_slices`` of the result counts the slices decoded.

    Each slice is copied between brackets into one buffer reused for every slice. The raw
    arguments a slice's events point into are copied out by :meth:`_Columns.add` before the
    next slice overwrites the buffer.

    Raises:
        _ChunkFailed: a slice is not a valid JSON list of events.
    """
    cols = _Columns(base_ns)
    view = memoryview(bytearray(max((end - start for start, end in slices), default=0) + 2))
    for j, (start, end) in enumerate(slices):
        if bound is not None and j >= bound():
            break
        n = end - start
        view[0], view[n + 1] = 0x5B, 0x5D  # "[" ... "]"
        view[1:n + 1] = src[start:end]
        try:
            events, strict = _decode_slice(view[:n + 2])
        except (msgspec.DecodeError, UnicodeDecodeError):
            raise _ChunkFailed from None
        cols.add(events, strict)
        del events
        cols.n_slices = j + 1
        if progress is not None:
            progress(end, 0)
    return cols


def workers_default() -> int:
    """Processes decoding one large Kineto file: the CPUs this process may use, at most 4, on
    Linux in a single-threaded process (forking while other threads run could copy a lock they
    hold); else 1. On 2, one forked child and this process (:func:`_forked`); on 3 or 4, that
    many children. ``DIAGNOSE_WORKERS`` sets the count (at most the CPU count), not the
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


def _fork_decode(src: memoryview, slices: list[tuple[int, int]], base_ns: int, done: mmap.mmap, slot: int,
                 bound_slot: int | None = None) -> tuple[int, int]:
    """Decode ``slices`` in a forked child, which shares ``src`` copy-on-write, writes the
    bytes it has decoded so far into ``done`` (int64 at ``slot``) and sends back its pickled
    columns. With ``bound_slot``, it stops before the slice whose index the parent wrote at
    that int64 of ``done`` (:class:`_Forked`: the parent decodes the slices from there on);
    the count of slices it decoded travels with its columns (``n_slices``). Returns (pid,
    read fd).

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

            def progress(end: int, _total: int) -> None:
                struct.pack_into("q", done, 8 * slot, end - slices[0][0])

            def bound() -> int:
                return struct.unpack_from("q", done, 8 * bound_slot)[0]

            cols = _decode_slices(src, slices, base_ns, progress, bound if bound_slot is not None else None)
            with os.fdopen(w, "wb") as f:
                send_state(f, {**cols.state(), "n_slices": cols.n_slices})
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
    try:
        with os.fdopen(fd, "rb", buffering=0) as f:
            state = receive_state(f)
    except Exception:  # noqa: BLE001 - a cut or garbled stream: redone here
        state = None
    finally:
        _, status = os.waitpid(pid, 0)
    return state if status == 0 else None


class _Forked:
    """Shares of a document being decoded, each in its own forked child (:func:`_fork_decode`),
    from the moment this is made; :meth:`collect` waits for them and merges their columns.

    With ``parent_takes_tail``, the parent decodes the end of the last share itself when it
    collects: half of the slices that share's child has not started (the child stops where
    the parent's part begins, a bound it reads before each slice). One child and the parent
    then share a 2-CPU machine's work: the parent joins once its imports are done, instead of
    waiting on two children that competed with those imports for the two CPUs (255 MB
    replica, 12 paired runs: 3.05 against 3.10 s of CPU, the same wall time:
    ``benchmarks/README.md``). The count of
    slices the child decoded comes back with its columns, so a bound it saw late never
    decodes a slice twice (the parent redoes what is past the child instead)."""

    def __init__(self, src: memoryview, shares: list[list[tuple[int, int]]], base_ns: int,
                 parent_takes_tail: bool = False) -> None:
        self.src, self.shares, self.base_ns = src, shares, base_ns
        self.tail = parent_takes_tail and bool(shares) and bool(shares[-1])
        m = len(shares)
        self.done = mmap.mmap(-1, 8 * (m + 1))  # bytes decoded per share, then the last share's bound
        struct.pack_into("q", self.done, 8 * m, len(shares[-1]) if shares else 0)
        self.children: dict[int, tuple[int, int]] = {}  # share index -> (pid, fd)
        self.states: dict[int, dict | None] = {}
        self.own_bytes = 0
        for i, share in enumerate(shares):
            try:
                bound = m if self.tail and i == m - 1 else None
                self.children[i] = _fork_decode(src, share, base_ns, self.done, i, bound)
            except OSError:
                self.states[i] = None

    def _progress(self) -> int:
        """Bytes decoded so far: by the children, and by this process (the tail)."""
        return sum(struct.unpack_from(f"{len(self.shares)}q", self.done)) + self.own_bytes

    def _take_tail(self, report) -> tuple[int, _Columns] | None:
        """Decode here the later half of the last share's slices its child has not started:
        (index of the first, their columns), or None when nothing is left to take.

        Raises:
            _ChunkFailed: a slice is not a valid JSON list of events.
        """
        m = len(self.shares)
        last = self.shares[-1]
        if not self.tail or (m - 1) not in self.children:
            return None
        done_bytes = struct.unpack_from("q", self.done, 8 * (m - 1))[0]
        started = bisect.bisect_right([end for _, end in last], last[0][0] + done_bytes) + 1  # the child's current slice included
        k = len(last) - max(len(last) - started, 0) // 2
        if k >= len(last):
            return None
        struct.pack_into("q", self.done, 8 * m, k)

        def progress(end: int, _total: int) -> None:
            self.own_bytes = end - last[k][0]
            report(self._progress())

        return k, _decode_slices(self.src, last[k:], self.base_ns, progress)

    def collect(self, report) -> _Columns:
        """The merged columns, in share order; a share whose child could not start or failed
        is decoded here. ``report(bytes decoded)`` while waiting.

        Raises:
            _ChunkFailed: a slice is not a valid JSON list of events.
        """
        shares, states, children = self.shares, self.states, self.children
        tail = None
        try:
            tail = self._take_tail(report)
            while len(states) < len(shares):
                waiting = {fd: i for i, (pid, fd) in children.items() if i not in states}
                if not waiting:
                    break
                ready, _, _ = select.select(list(waiting), [], [], 0.2)
                report(self._progress())
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
            self.done.close()
        cols = _Columns(self.base_ns)
        for i, share in enumerate(shares):
            state = states.get(i)
            if tail is not None and i == len(shares) - 1:
                k, own = tail
                got = 0 if state is None else state.get("n_slices", len(share))
                if state is not None:
                    cols.merge(state)
                if got < k:  # the child failed (or stopped short): its slices before the parent's part
                    cols.merge(_decode_slices(self.src, share[got:k], self.base_ns).state())
                # a child past the bound (it read it late): what follows it is decoded again here
                cols.merge(own.state() if got <= k else _decode_slices(self.src, share[got:], self.base_ns).state())
                continue
            cols.merge(state if state is not None else _decode_slices(self.src, share, self.base_ns).state())
        return cols


def _forked(plan: "_Plan", n_workers: int) -> _Forked:
    """The children decoding ``plan``'s slices: on two CPUs one child, the parent taking the
    end of the work when it collects (:class:`_Forked`); else one child per CPU."""
    if n_workers == 2:
        return _Forked(plan.src, plan.shares(1), plan.base_ns, parent_takes_tail=True)
    return _Forked(plan.src, plan.shares(n_workers), plan.base_ns)


class _Plan:
    """Where a large document's events are and how they are cut: the other top-level keys
    decoded (``metadata``), the events array ``src[lb:rb + 1]`` and its slices."""

    def __init__(self, buf: bytes | bytearray) -> None:
        self.ok = False
        located = _locate_events(buf)
        if located is None:
            try:
                top = _any_top_dec.decode(buf)
            except (msgspec.DecodeError, UnicodeDecodeError):
                return
            raw_events = top.pop("traceEvents", None)
            if raw_events is None:
                return
            src = memoryview(raw_events)  # a view into buf: no copy
            lb = bytes(src[:64]).find(b"[")
            rb = len(src) - 1
            while rb > 0 and src[rb] != ord("]"):
                rb -= 1
            if lb < 0 or rb <= lb:
                return
        else:
            top, lb, rb = located
            src = memoryview(buf)
        self.metadata = _decode_values(top)
        self.base_ns = _base_ns(self.metadata)
        self.src, self.lb, self.rb = src, lb, rb
        self.slices = _slices(src, lb, rb)
        self.ok = True

    def shares(self, n_workers: int) -> list[list[tuple[int, int]]]:
        """Contiguous shares of the slices in file order, one per worker."""
        sl = self.slices
        return [sl[len(sl) * i // n_workers:len(sl) * (i + 1) // n_workers] for i in range(n_workers)]


class StartedDecode:
    """A large document's events already being decoded on forked workers
    (:func:`start_decode`); :func:`load_kineto` collects them (``started``)."""

    def __init__(self, buf: bytes | bytearray, plan: _Plan, forked: _Forked) -> None:
        self.buf, self.plan, self.forked = buf, plan, forked


def start_decode(buf: bytes | bytearray | None, gz_cut: str | None = None) -> StartedDecode | None:
    """Start decoding the decompressed document ``buf`` on forked workers, as the load of a
    large file would (:func:`workers_default`: Linux, this process single-threaded), and
    return at once; None (nothing started) when the load would not fork: a small, cut or
    unusual document, one worker, or any error (the load then does everything itself).

    The command line calls this after the read and before it imports pandas and the
    analyzers, which then import while the workers decode (on two cores: about 0.5 s of the
    ~4 s a 255 MB trace takes). This module and what the workers run import no pandas.
    """
    try:
        if buf is None or gz_cut or len(buf) < CHUNKED_MIN_BYTES or buf[:64].lstrip()[:1] != b"{":
            return None
        plan = _Plan(buf)
        n_workers = min(workers_default(), len(plan.slices)) if plan.ok else 1
        if n_workers <= 1:
            if plan.ok:
                plan.src.release()
            return None
        return StartedDecode(buf, plan, _forked(plan, n_workers))
    except Exception:  # noqa: BLE001 - the load redoes it all
        return None


def start_prefetched(prefetch) -> None:
    """:func:`start_decode` on what a :class:`~diagnose.trace.reading.Prefetch` read (waiting
    for the read), kept in its ``started`` for the load; nothing when the read failed (the
    load reports it)."""
    got = prefetch.peek()
    if got is not None:
        prefetch.started = start_decode(*got)


def _load_chunked(path: str, buf: bytes, progress=None, workers: int | None = None,
                  started: StartedDecode | None = None) -> Trace | None:
    """Decode ``traceEvents`` in ~4 MiB slices (:data:`CHUNK_BYTES`) cut at ``},{`` boundaries,
    on ``workers`` processes (forked, sharing the decompressed document; see
    :func:`workers_default`), or
    collect the workers :func:`start_decode` started on ``buf`` (``started``).
    Each slice's decode validates its cut. Returns None (the caller falls back to the
    whole-document path) when the document or any slice does not decode cleanly."""
    forked = None
    if started is not None and started.buf is buf:
        plan, forked = started.plan, started.forked
        started.buf = started.plan = started.forked = None
    else:
        plan = _Plan(buf)
        if not plan.ok:
            return None
    src, slices, base_ns, lb, rb = plan.src, plan.slices, plan.base_ns, plan.lb, plan.rb
    n_workers = 1 if forked is not None else max(1, min(workers or workers_default(), len(slices)))
    if n_workers > 1 and threading.active_count() > 1:
        n_workers = 1  # never fork while other threads run
    total = rb - lb

    def report(done: int, _total: int = 0) -> None:
        if progress is not None:
            progress(min(done, total), total)

    try:
        if forked is not None:
            cols = forked.collect(report)
        elif n_workers == 1:
            cols = _decode_slices(src, slices, base_ns, lambda end, _t: report(end - lb))
        else:
            cols = _forked(plan, n_workers).collect(report)
    except _ChunkFailed:
        return None
    finally:
        src.release()
    if progress is not None:
        progress(total, total)
    trace = _new_trace(path, plan.metadata, False, [], len(buf), None)
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
    from diagnose.trace.model import DeviceInfo

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
