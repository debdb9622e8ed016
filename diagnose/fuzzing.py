"""Mutations of real traces for fuzzing the loaders (tests/test_fuzz.py, benchmarks/fuzz_loaders.py).

Two families, both deterministic for a given ``random.Random``:

* **structural** — decode the trace, then change a few events: a field set to a value of
  another JSON type (string ts, list dur, huge or negative numbers, NaN-like strings, nested
  objects), a field deleted, an event duplicated or replaced by a scalar, ``args`` swapped
  for a list, a top-level key (``baseTimeNanoseconds``, ``deviceProperties``) corrupted;
* **byte-level** — flip, delete or insert bytes, cut the file short, or gzip it and cut the
  compressed stream.

The promise checked: loading and analysing never raises anything but
:class:`~diagnose.errors.DiagnoseError` (one clear line, exit 2 at the CLI).
"""
from __future__ import annotations

import gzip
import random
from typing import Any

import msgspec

_FIELDS = ("ph", "cat", "name", "ts", "dur", "pid", "tid", "args", "id")
_ARG_FIELDS = ("device", "stream", "correlation", "External id", "external id", "bytes", "Input Dims", "Input type")
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
