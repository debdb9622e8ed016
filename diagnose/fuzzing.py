"""Mutations of real traces for fuzzing the loaders (tests/test_fuzz.py, benchmarks/fuzz_loaders.py).

Two families, both deterministic for a given ``random.Random``:

* **structural** — decode the trace, then change a few events: a field set to a value of
  another JSON type (string ts, list dur, huge or negative numbers, NaN-like strings, nested
  objects), a field deleted, an event duplicated or replaced by a scalar, ``args`` swapped
  for a list, a top-level key (``baseTimeNanoseconds``, ``deviceProperties``) corrupted;
* **byte-level** — flip, delete or insert bytes, cut the file short, or gzip it and cut the
  compressed stream;
* **issue 15** (:func:`mutant2` only) — what real exporters and hostile inputs do: begin/end
  (``B``/``E``) pairs instead of complete events (some unmatched), another backend's runtime
  categories (``xpu_runtime``, ``privateuse1_driver``...), several ranks merged into one file
  (``"[TP01-DP00-PP00-EP00] 83"`` pids, colliding ids), numbers beyond float64 (``1e400``),
  missing or non-numeric ``dur``, deep nesting, empty event lists, two processes on one
  stream, profiler ``overhead`` and ``python_function`` events.

:func:`mutant` is the first generator, kept unchanged so that recorded seeds replay the same
inputs (tests/test_fuzz.py); :func:`mutant2` draws half of its inputs from the issue-15
family and the rest from :func:`mutant`.

The promise checked: loading and analysing never raises anything but
:class:`~diagnose.errors.DiagnoseError` (one clear line, exit 2 at the CLI).
"""
from __future__ import annotations

import gzip
import random
import re
from typing import Any

import msgspec

_FIELDS = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "args", "id")
_ARG_FIELDS = ("device", "stream", "correlation", "External id", "external id", "bytes", "Input Dims", "Input type",
               "Concrete Inputs")
_CATS = ("kernel", "Kernel", "cuda_runtime", "cuda_driver", "cpu_op", "user_annotation", "gpu_user_annotation",
         "gpu_memcpy", "gpu_memset", "cuda_sync", "python_function", "ac2g")
_NAMES = ("cudaLaunchKernel", "cudaGraphLaunch", "hipGraphLaunch", "INVALID", "aten::linear", "aten::mm",
          "diagnose:decode[bs=1 ctx=8]", "diagnose:prefill[bs=1 toks=8]", "step[DECODE bs=2]",
          "execute_4_context_1(sq3sk3)_generation_3(sq3sk30)", "flash_fwd_kernel", "ProfilerStep#1", "\ufffd")


def _random_value(rng: random.Random) -> Any:
    choice = rng.randrange(14)
    return [
        None, True, -1, 0, 2**63 - 1, -(2**62), 1e308, -1e-9, 3.5,
        "12", "NaN", "", [1, 2, [3]], {"x": {"y": [1]}},
    ][choice]


def mutate_structure(doc: Any, rng: random.Random, n: int = 3) -> Any:
    """Return a mutated copy of a decoded Kineto document (dict or list)."""
    doc = msgspec.json.decode(msgspec.json.encode(doc))
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    if isinstance(doc, dict) and rng.random() < 0.15:
        key = rng.choice(["baseTimeNanoseconds", "deviceProperties", "distributedInfo", "traceEvents", "diagnose"])
        doc[key] = _random_value(rng)
        events = doc.get("traceEvents")
    if not isinstance(events, list) or not events:
        return doc
    for _ in range(n):
        i = rng.randrange(len(events))
        ev = events[i]
        op = rng.randrange(9)
        if not isinstance(ev, dict) or op == 0:
            events[i] = _random_value(rng)
        elif op == 1:
            ev.pop(rng.choice(_FIELDS), None)
        elif op == 2:
            ev[rng.choice(_FIELDS)] = _random_value(rng)
        elif op == 3:
            args = ev.setdefault("args", {})
            if isinstance(args, dict):
                args[rng.choice(_ARG_FIELDS)] = _random_value(rng)
        elif op == 4:
            ev["cat"] = rng.choice(_CATS)
            ev.setdefault("ph", "X")
        elif op == 5:
            ev["name"] = rng.choice(_NAMES)
        elif op == 6:
            events.insert(rng.randrange(len(events) + 1), dict(ev))
        elif op == 7:
            ev["args"] = [1, "a", None]
        else:
            if isinstance(ev.get("ts"), (int, float)):
                ev["ts"] = ev["ts"] * rng.choice([-1, 0, 1e6, 1e-6])
    return doc


def mutate_bytes(data: bytes, rng: random.Random) -> bytes:
    """Byte-level damage: flips, deletions, insertions, truncation, or a cut gzip stream."""
    b = bytearray(data)
    op = rng.randrange(6)
    if not b:
        return bytes(b)
    if op == 0:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] = rng.randrange(256)
    elif op == 1:
        i = rng.randrange(len(b))
        del b[i:i + rng.randint(1, 64)]
    elif op == 2:
        i = rng.randrange(len(b))
        b[i:i] = rng.choice([b",", b"}", b"]", b"{", b'"', b"\\", b"\x00", b"\xff\xfe", b"0,5", b"nan", b"1e999"])
    elif op == 3:
        b = b[: rng.randrange(len(b))]
    elif op == 4:
        gz = gzip.compress(bytes(b))
        return gz[: rng.randrange(1, len(gz))]
    else:
        gz = bytearray(gzip.compress(bytes(b)))
        gz[rng.randrange(10, len(gz))] ^= 0xFF
        return bytes(gz)
    return bytes(b)


def mutant(seed_doc: Any, seed_bytes: bytes, rng: random.Random) -> bytes:
    """One fuzz input: structural mutation (encoded), sometimes followed by byte damage."""
    if rng.random() < 0.6:
        data = msgspec.json.encode(mutate_structure(seed_doc, rng, n=rng.randint(1, 6)))
        return mutate_bytes(data, rng) if rng.random() < 0.2 else data
    return mutate_bytes(seed_bytes, rng)


_BACKEND_CATS = (("xpu_runtime", "xpu_driver"), ("privateuse1_runtime", "privateuse1_driver"), ("mtia_runtime", "mtia_runtime"))
_NUMBER_FIELD = re.compile(rb'"(ts|dur|correlation|pid|device|stream)":\s*(-?\d+(?:\.\d+)?(?:[eE][-+]?\d+)?)')


def _events_of(doc: Any) -> list | None:
    events = doc.get("traceEvents") if isinstance(doc, dict) else doc
    return events if isinstance(events, list) else None


def mutate_issue15(doc: Any, rng: random.Random) -> bytes:
    """One issue-15 mutation of a decoded Kineto document, encoded (some are byte-level)."""
    doc = msgspec.json.decode(msgspec.json.encode(doc))
    events = _events_of(doc)
    if not events:
        return msgspec.json.encode(doc)
    xs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    op = rng.randrange(10)
    if op == 0 and xs:  # complete events as begin/end pairs; ends appended out of place, some lost
        for e in rng.sample(xs, min(len(xs), rng.randint(1, 40))):
            e["ph"] = "B"
            dur = e.pop("dur", None)
            if rng.random() < 0.9 and isinstance(e.get("ts"), (int, float)) and isinstance(dur, (int, float)):
                end = {"ph": "E", "pid": e.get("pid"), "tid": e.get("tid"), "ts": e["ts"] + dur}
                events.insert(rng.randrange(len(events) + 1), end)
        if rng.random() < 0.3:
            events.append({"ph": "E", "pid": 1, "tid": 1, "ts": 0})
    elif op == 1:  # another backend's runtime/driver categories
        rt, drv = rng.choice(_BACKEND_CATS)
        for e in xs:
            if e.get("cat") == "cuda_runtime":
                e["cat"] = rt
            elif e.get("cat") == "cuda_driver":
                e["cat"] = drv
    elif op == 2:  # ranks merged into one file (ids collide), a few events left unlabelled
        merged = []
        for r in range(rng.randint(1, 3)):
            for e in events:
                e2 = dict(e) if isinstance(e, dict) else e
                if isinstance(e2, dict) and rng.random() < 0.98:
                    e2["pid"] = f"[TP{r:02d}-DP00-PP00-EP00] {e2.get('pid')}"
                merged.append(e2)
        events[:] = merged
    elif op == 3 and xs:  # ph X without dur, or with a dur that is not a number
        for e in rng.sample(xs, min(len(xs), rng.randint(1, 10))):
            if rng.random() < 0.5:
                e.pop("dur", None)
            else:
                e["dur"] = rng.choice(["abc", "NaN", "inf", [1], {"v": 1}, True, "", "1e400", 2**63])
    elif op == 4 and xs:  # two processes on one GPU: kernels of another pid, overlapping
        for e in rng.sample(xs, min(len(xs), rng.randint(1, 10))):
            e2 = dict(e)
            e2["pid"] = rng.choice([7, 999, -1, "proc"])
            if isinstance(e2.get("ts"), (int, float)):
                e2["ts"] += rng.uniform(-5, 5)
            events.append(e2)
    elif op == 5:  # profiler overhead and python_function events, some odd
        for _ in range(rng.randint(1, 20)):
            events.append({"ph": "X", "cat": rng.choice(["overhead", "python_function", "Overhead"]),
                           "name": rng.choice(["Activity Buffer Request", "Lazy Function Loading", "f"]),
                           "pid": rng.choice([-1, 0, 100, "[TP00-DP00-PP00-EP00] 5"]), "tid": 0,
                           "ts": rng.choice([0, 1e6, -5, "x", None, 3.5]), "dur": rng.choice([1, 0, -1, None, "2"])})
    elif op == 6:  # empty event list
        if isinstance(doc, dict):
            doc["traceEvents"] = []
        else:
            doc = []
    data = msgspec.json.encode(doc)
    if op == 7:  # numbers beyond float64
        hits = list(_NUMBER_FIELD.finditer(data))
        for m in sorted(rng.sample(hits, min(len(hits), rng.randint(1, 5))), key=lambda m: -m.start()):
            data = data[:m.start(2)] + rng.choice([b"1e400", b"-1e999", b"1" * 400, b"1e309"]) + data[m.end(2):]
    elif op == 8:  # deep nesting around the document or inside an event
        k = rng.choice([10, 1000, 20_000, 100_000])
        if rng.random() < 0.5:
            data = b"[" * k + data + b"]" * k
        else:
            data = data.replace(b'"args":', b'"args":' + b"[" * k + b"1" + b"]" * k + b', "a2":', 1)
    elif op == 9 and rng.random() < 0.5:  # gzip it (ratio far below the bomb limit)
        data = gzip.compress(data, 1)
    return data


def mutant2(seed_doc: Any, seed_bytes: bytes, rng: random.Random) -> bytes:
    """One fuzz input: half from :func:`mutate_issue15` (sometimes with byte damage on
    top), half from :func:`mutant`."""
    if rng.random() < 0.5:
        data = mutate_issue15(seed_doc, rng)
        return mutate_bytes(data, rng) if rng.random() < 0.1 else data
    return mutant(seed_doc, seed_bytes, rng)
