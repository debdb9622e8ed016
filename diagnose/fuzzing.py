"""Mutations of real traces for fuzzing the loaders (tests/test_fuzz.py, benchmarks/fuzz_loaders.py).

Two families, both deterministic for a given ``random.Random``:

* **structural** — decode the trace, then change a few events: a field set to a value of
  another JSON type (string ts, list dur, huge or negative numbers, NaN-like strings, nested
  objects), a field deleted, an event duplicated or replaced by a scalar, ``args`` swapped
  for a list, a top-level key (``baseTimeNanoseconds``, ``deviceProperties``) corrupted;
* **byte-level** — flip, delete or insert bytes, cut the file short, or gzip it and cut the
  compressed stream;
* **issue 20** (:func:`mutant3` only) — other encodings (UTF-8 and UTF-16/32 byte-order marks,
  UTF-16 without one), 64-bit and out-of-range ids, negative, symbolic and huge ``Input
  Dims``, duplicated GPU records, ``ts``/``dur`` as strings, pathological names (400 KB
  repeats, control characters, marker look-alikes), dropped GPU records, model configs in
  trace metadata; nsys SQLite exports mutated in SQL (NULL NVTX ends, start/end ranges,
  several processes, duplicates, text in integer columns); side inputs (model configs,
  metrics JSON, rules and rules-config YAML: deep nesting, huge sizes, NaN/inf, aliases);
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


# ---------------------------------------------------------------------------------------------
# Issue 20 families (mutant3): encodings, 64-bit ids, negative and symbolic shapes, duplicated
# records, numeric-string timestamps, pathological names; nsys SQLite exports with NULL NVTX
# ends, start/end ranges, several processes; side inputs (model config, metrics JSON, rules
# and rules-config YAML) with deep nesting, huge sizes, NaN/inf and other encodings.

#: What a mutant3 input is, and so which loader reads it (benchmarks/fuzz_loaders.py).
KINDS = ("trace", "nsys", "model_config", "metrics", "rules_config", "rule")

_ID_VALUES = (2**63 - 1, 2**63, 2**64 - 1, 2**64, -(2**63), -(2**63) - 1, 2**53 + 1, -1, -2, 0,
              "18446744073709551615", "9223372036854775808", "0x7fffffffffffffff", 1.8446744073709552e19)
_SHAPES = ([[-4096, 4096], [4096, 4608]], [[4, -1, 64], [64, 64]], [["s0", 4096], [4096, 4096]], [[1.5, 2], [2, 3]],
           [[2**62, 2**62], [2**62, 2**62]], [[8, 1, 4096], [-1, 4096]], [[[[[[1]]]]]], [[], []], [[0, 0], [0, 0]],
           [[8, 32, 128, 64], [8, 32, -128, 64], [8, 32, 128, 64]], [None, [1]], "[[1,2]]", [[True, 2], [2, 3]])
_STEP_NAMES = ("diagnose:decode[bs=99999999999999999999 ctx=18446744073709551616]", "diagnose:prefill[bs=0 toks=0]",
               "step[DECODE bs=-1]", "execute_99999999999999999999_context_1(sq3sk3)_generation_3(sq1sk30)",
               "execute_context_0(0)_generation_0(0)", "diagnose:decode[bs=1 ctx=1]" + "x" * 5000)


def _long_name(rng: random.Random) -> str:
    unit = rng.choice(["sm90_", "ck::", "cub::", "memcpy", "a", "_v1234", "(", "<", "[TP00] ", "\x1b[2J", "execute_1_"])
    return unit * rng.choice([1000, 10_000, 40_000])


def mutate_issue20(doc: Any, rng: random.Random) -> bytes:
    """One issue-20 mutation of a decoded Kineto document, encoded (some change the bytes'
    encoding rather than the events)."""
    doc = msgspec.json.decode(msgspec.json.encode(doc))
    events = _events_of(doc) or []
    xs = [e for e in events if isinstance(e, dict) and e.get("ph") == "X"]
    gpu = [e for e in xs if str(e.get("cat", "")).lower() in ("kernel", "gpu_memcpy", "gpu_memset")]
    ops = [e for e in xs if e.get("cat") in ("cpu_op", "Operator")]
    op = rng.randrange(8)
    if op == 0 and xs:  # 64-bit and out-of-range ids
        for e in rng.sample(xs, min(len(xs), rng.randint(1, 20))):
            args = e.setdefault("args", {})
            if isinstance(args, dict):
                args[rng.choice(["correlation", "External id", "device", "stream"])] = rng.choice(_ID_VALUES)
            if rng.random() < 0.3:
                e[rng.choice(["pid", "tid"])] = rng.choice(_ID_VALUES)
    elif op == 1 and ops:  # negative, symbolic, huge, malformed shapes
        for e in rng.sample(ops, min(len(ops), rng.randint(1, 20))):
            if isinstance(e.get("args"), dict):
                e["args"]["Input Dims"] = rng.choice(_SHAPES)
                if rng.random() < 0.3:
                    e["name"] = rng.choice(["aten::mm", "aten::linear", "aten::scaled_dot_product_attention", "aten::add"])
    elif op == 2 and gpu:  # every GPU record twice (buffers re-read), or a few
        dup = gpu if rng.random() < 0.5 else rng.sample(gpu, min(len(gpu), rng.randint(1, 10)))
        events.extend(msgspec.json.decode(msgspec.json.encode(dup)))
    elif op == 3 and xs:  # ts/dur written as strings (large absolute values)
        for e in rng.sample(xs, min(len(xs), rng.randint(1, 40))):
            for k in ("ts", "dur"):
                v = e.get(k)
                if isinstance(v, (int, float)):
                    e[k] = rng.choice([repr(v), f"{v + 1.7e15:.3f}" if k == "ts" else f"{v:.3f}", " 12.5 ", "1e3", "-0",
                                       "1_000", "0x10", "1e999999999", "Infinity"])
    elif op == 4 and xs:  # pathological names: long repeats, control characters, marker look-alikes
        for e in rng.sample(xs, min(len(xs), rng.randint(1, 3))):
            e["name"] = _long_name(rng) if rng.random() < 0.6 else rng.choice(_STEP_NAMES)
    elif op == 5 and xs:  # orphan launches: drop the first GPU records; or a launch burst
        for e in gpu[: rng.randint(1, 20)]:
            if e in events:
                events.remove(e)
    elif op == 6 and isinstance(doc, dict):  # side input inside the trace: a model config in metadata
        doc["diagnose"] = {"model_config": _model_config(rng), "dtype": rng.choice(["bf16", "fp8", None, 7])}
        doc["distributedInfo"] = {"rank": 0, "world_size": rng.choice([1, 2, 3, 5, 2**40, -1, "2", None])}
    data = _dumps(doc)
    if op == 7 or rng.random() < 0.15:  # encodings
        data = _encode(data, rng)
    return data


def _dumps(obj: Any) -> bytes:
    """JSON of ``obj``; integers beyond 64 bits and NaN/inf written as Python's json writes
    them (``NaN``, ``Infinity``: what some exporters emit)."""
    try:
        return msgspec.json.encode(obj)
    except (OverflowError, TypeError, ValueError):
        import json

        return json.dumps(obj, allow_nan=True).encode()


def _encode(data: bytes, rng: random.Random) -> bytes:
    text = data.decode("utf-8", errors="replace")
    choice = rng.randrange(7)
    if choice == 0:
        return b"\xef\xbb\xbf" + data
    if choice == 1:
        return b"\xff\xfe" + text.encode("utf-16-le")
    if choice == 2:
        return b"\xfe\xff" + text.encode("utf-16-be")
    if choice == 3:
        return text.encode("utf-16-le")  # no byte-order mark
    if choice == 4:
        return b"\xff\xfe\x00\x00" + text.encode("utf-32-le")
    if choice == 5:
        return b"\xff\xfe" + data  # a UTF-16 mark on UTF-8 bytes
    return gzip.compress(b"\xef\xbb\xbf" + data, 1)


_REF_CONFIG = {"num_hidden_layers": 32, "hidden_size": 4096, "num_attention_heads": 32, "num_key_value_heads": 8,
               "head_dim": 128, "intermediate_size": 11008, "vocab_size": 128000, "max_position_embeddings": 8192}
_HUGE = (3_000_000_000, 10**12, 2**63, 10**400, 1e308, float("nan"), float("inf"), -1, 0, 1.5, "32", True, None, [32])


def _model_config(rng: random.Random) -> dict:
    cfg = dict(_REF_CONFIG)
    for _ in range(rng.randint(1, 4)):
        k = rng.choice(list(_REF_CONFIG) + ["num_local_experts", "num_experts_per_tok", "moe_intermediate_size",
                                            "sliding_window", "layer_types", "kv_lora_rank", "num_nextn_predict_layers"])
        cfg[k] = rng.choice(_HUGE)
    if rng.random() < 0.3:
        cfg["quantization_config"] = {"quant_method": rng.choice(["fp8", "awq", "gptq", "mxfp4", "x"]), "bits": rng.choice([4, 8, -1, 10**9]),
                                      "group_size": rng.choice([128, 0, -1, 10**12]),
                                      "modules_to_not_convert": rng.choice([["lm_head"], ["re:(.*)*x"], ["re:(a+)+$"], ["x"] * 100_000, "("])}
    if rng.random() < 0.2:
        cfg["layer_types"] = ["full_attention"] * rng.choice([32, 10**5])
    if rng.random() < 0.2:
        cfg["text_config"] = dict(cfg)
    return cfg


def _nested(depth: int, rng: random.Random) -> str:
    o, c = rng.choice([("[", "]"), ("{\"a\":", "}")])
    return o * depth + "1" + c * depth


def side_input(kind: str, rng: random.Random) -> bytes:
    """One model config, metrics JSON, rules config or rule file: valid, huge, deep, NaN,
    other encodings."""
    op = rng.randrange(6)
    if kind == "model_config":
        if op == 0:
            text = _nested(rng.choice([100, 5000, 50_000]), rng)
        else:
            text = _dumps(_model_config(rng)).decode()
    elif kind == "metrics":
        if op == 0:
            text = '{"perplexity_baseline": ' + _nested(rng.choice([100, 5000, 50_000]), rng) + "}"
        else:
            vals = [5.1, float("nan"), float("inf"), -1e308, "5.3", None, [1], 10**400]
            import json as _json

            text = _json.dumps({"perplexity_baseline": rng.choice(vals), "perplexity_candidate": rng.choice(vals),
                                "spec_acceptance_rate": rng.choice(vals)}, allow_nan=True) if op != 1 else \
                '{"perplexity_baseline": 1e400, "x": ' + "1" * 5000 + "}"
    elif kind == "rules_config":
        if op == 0:
            text = "thresholds:\n  a: " + "[" * rng.choice([100, 5000, 50_000]) + "]" * 10
        elif op == 1:
            text = "thresholds:\n  S3-launch-gaps.max_launch_gap_share: " + rng.choice([".nan", ".inf", "-.inf", "1e400", "0.2", "'0.2'", "[1]"])
        elif op == 2:
            text = "a: &x [1, 2]\nb: *x\n"
        elif op == 3:
            text = "thresholds:\n" + "".join(f"  S3-launch-gaps.x{i}: 1\n" for i in range(rng.choice([10, 2_000])))
        else:
            text = "disable: [" + ",".join(["S3-launch-gaps"] * rng.choice([1, 1000])) + "]\nthresholds: {S3-gpu-idle: {max_idle_share: 0.5}}"
    else:  # a rule file
        base = ("id: fuzz-rule\nsymptom: S3\ntitle: t\nseverity: high\nphase: decode\nscope: trace\n"
                "requires: [decode.launch_gap_share]\nthresholds:\n  t:\n    value: {v}\n    unit: fraction\n    rationale: r\n"
                "condition: decode__launch_gap_share > t\nsummary: 's {{decode.launch_gap_share:{spec}}}'\n"
                "likely_cause: c\nhow_to_verify: h\nfix: f\nreferences: [x]\n")
        if op == 0:
            text = "a: " + "[" * rng.choice([100, 5000, 50_000]) + "]" * 3
        else:
            text = base.format(v=rng.choice([".nan", ".inf", "0.15", "1e400", "'x'"]), spec=rng.choice([".1%", "100000000", ".64f", ">", "{x}"]))
            if op == 2:
                text = text.replace("condition: decode__launch_gap_share > t", "condition: " + "(" * 500 + "decode__launch_gap_share" + ")" * 500 + " > t")
    data = text.encode("utf-8")
    if rng.random() < 0.2:
        data = _encode(data, rng)
    return data


def mutate_nsys(db_bytes: bytes, rng: random.Random) -> bytes:
    """One mutation of an nsys SQLite export (bytes of the database), done in SQL on an
    in-memory copy: NVTX rows with NULL ends (marks, domain creates, an unterminated push),
    start/end ranges, step markers of several processes, exact duplicate kernels, NULLs and
    text in integer columns, 64-bit ids, negative durations, a table dropped."""
    import sqlite3

    con = sqlite3.connect(":memory:")
    try:
        con.deserialize(db_bytes)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type='table'")}
        nvtx = next((t for t in sorted(tables) if t.startswith("NVTX_EVENTS")), None)
        kern = "CUPTI_ACTIVITY_KIND_KERNEL" if "CUPTI_ACTIVITY_KIND_KERNEL" in tables else None
        for _ in range(rng.randint(1, 3)):
            op = rng.randrange(9)
            if op == 0 and nvtx:  # NULL-end rows: marks, domain creates, unterminated pushes and start/end ranges
                for _ in range(rng.randint(1, 50)):
                    con.execute(f"INSERT INTO {nvtx} (start, end, eventType, text, globalTid) "
                                f"SELECT start + 1, NULL, ?, ?, globalTid FROM {nvtx} ORDER BY random() LIMIT 1",
                                (rng.choice([34, 75, 59, 60, 33, 39, None, -1]), rng.choice(["CCCL", None, "", "m"])))
            elif op == 1 and nvtx:  # start/end ranges as step markers around existing ranges
                con.execute(f"UPDATE {nvtx} SET eventType = 60, text = ? WHERE rowid IN "
                            f"(SELECT rowid FROM {nvtx} ORDER BY random() LIMIT ?)",
                            (rng.choice(["diagnose:decode[bs=2 ctx=64]", "diagnose:prefill[bs=1 toks=128]", "step[DECODE bs=2]"]),
                             rng.randint(1, 30)))
            elif op == 2 and kern:  # every kernel written twice
                con.execute(f"INSERT INTO {kern} SELECT * FROM {kern}")
            elif op == 3 and kern:  # a second process: kernels and launches copied under another pid
                pid = rng.choice([7, 2**24 - 1, 0])
                con.execute(f"INSERT INTO {kern} SELECT * FROM {kern} LIMIT 50")
                con.execute(f"UPDATE {kern} SET globalPid = ((globalPid >> 48) << 48) | (? << 24), deviceId = deviceId + 1 "
                            f"WHERE rowid IN (SELECT rowid FROM {kern} ORDER BY rowid DESC LIMIT 50)", (pid,))
            elif op == 4:  # NULLs, text and 64-bit values in integer columns
                t = rng.choice(sorted(tables))
                cols = [r[1] for r in con.execute(f'PRAGMA table_info("{t}")')]
                if cols:
                    c = rng.choice(cols)
                    con.execute(f'UPDATE "{t}" SET "{c}" = ? WHERE rowid IN (SELECT rowid FROM "{t}" ORDER BY random() LIMIT ?)',
                                (rng.choice([None, "x", 2**63 - 1, -(2**63), 1.5, b"\xff\xfe", "", "9" * 30]), rng.randint(1, 20)))
            elif op == 5 and kern:  # negative durations
                con.execute(f"UPDATE {kern} SET end = start - ? WHERE rowid IN (SELECT rowid FROM {kern} ORDER BY random() LIMIT 5)",
                            (rng.choice([1, 10**9, 2**62]),))
            elif op == 6:  # a table dropped
                t = rng.choice(sorted(tables))
                con.execute(f'DROP TABLE IF EXISTS "{t}"')
                tables.discard(t)
            elif op == 7 and "StringIds" in tables:  # pathological names
                con.execute("UPDATE StringIds SET value = ? WHERE id IN (SELECT id FROM StringIds ORDER BY random() LIMIT 3)",
                            (_long_name(rng),))
            elif op == 8 and nvtx:  # NVTX with no eventType column semantics: every end NULL
                con.execute(f"UPDATE {nvtx} SET end = NULL WHERE rowid IN (SELECT rowid FROM {nvtx} ORDER BY random() LIMIT 20)")
        con.commit()
        return con.serialize()
    except sqlite3.Error:
        return db_bytes
    finally:
        con.close()


def mutant3(seed_doc: Any, seed_bytes: bytes, rng: random.Random, nsys_bytes: bytes | None = None) -> tuple[str, bytes]:
    """One fuzz input of the issue-20 generator: (kind, bytes), kind one of :data:`KINDS`.
    40 % Kineto traces from :func:`mutate_issue20` (a tenth of them with byte damage on top),
    20 % from :func:`mutant2`, 15 % nsys exports (:func:`mutate_nsys`), 25 % side inputs."""
    r = rng.random()
    if r < 0.4:
        data = mutate_issue20(seed_doc, rng)
        return "trace", mutate_bytes(data, rng) if rng.random() < 0.1 else data
    if r < 0.6:
        return "trace", mutant2(seed_doc, seed_bytes, rng)
    if r < 0.75 and nsys_bytes is not None:
        data = mutate_nsys(nsys_bytes, rng)
        return "nsys", mutate_bytes(data, rng) if rng.random() < 0.05 else data
    kind = rng.choice(KINDS[2:])
    return kind, side_input(kind, rng)
