"""Build large Kineto traces by replicating a real one with shifted timestamps (deterministic).

Each copy shifts every ``ts`` by (copy index) x (source span + 1 ms) and offsets correlation
and external ids, so the result is one long, consistent trace: shares stay equal to the
source's (modulo the 1 ms seams), counts scale by the number of copies.

    python benchmarks/make_large_trace.py SRC OUT.json.gz --target-mb 316
    python benchmarks/make_large_trace.py SRC OUT.json.gz --copies 8
    python benchmarks/make_large_trace.py SRC OUT.sqlite --nsys --copies 100   (from an nsys SQLite)

``--target-mb`` counts uncompressed JSON bytes. Output is gzipped when OUT ends with .gz.
"""
from __future__ import annotations

import argparse
import gzip
import os
import shutil
import sqlite3
import sys

import orjson

_ID_KEYS = ("correlation", "External id", "external id")


def _load(src: str) -> dict:
    with open(src, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return orjson.loads(raw)


def replicate_kineto(src: str, out: str, copies: int | None = None, target_mb: float | None = None) -> dict:
    """Write ``copies`` shifted replicas of ``src``'s events into one trace at ``out``.

    Returns:
        {"copies", "events", "bytes"} of the written trace (bytes uncompressed).
    """
    doc = _load(src)
    events = doc.pop("traceEvents")
    body = [e for e in events if e.get("ph") != "M"]
    meta = [e for e in events if e.get("ph") == "M"]
    ts = [e["ts"] for e in body if isinstance(e.get("ts"), (int, float))]
    span = (max(ts) - min(ts)) if ts else 0.0
    shift_us = span + 1000.0
    max_id = 0
    for e in body:
        a = e.get("args")
        if isinstance(a, dict):
            for k in _ID_KEYS:
                v = a.get(k)
                if isinstance(v, int):
                    max_id = max(max_id, v)
        if isinstance(e.get("id"), int):
            max_id = max(max_id, e["id"])
    id_step = max_id + 1
    one = len(orjson.dumps(body))
    if copies is None:
        copies = max(1, int(round(target_mb * 1e6 / max(one, 1))))
    opener = gzip.open if out.endswith(".gz") else open
    tmp = out + ".tmp"
    written = 0
    n_events = len(meta)
    with opener(tmp, "wb", **({"compresslevel": 1} if out.endswith(".gz") else {})) as f:
        head = orjson.dumps(doc)[:-1]  # top-level keys without the closing brace
        f.write(head + (b"," if len(doc) else b"") + b'"traceEvents":[')
        written += len(head) + 16
        first = True
        for e in meta:
            f.write((b"" if first else b",") + orjson.dumps(e))
            first = False
        for c in range(copies):
            dt = c * shift_us
            di = c * id_step
            chunk = []
            for e in body:
                e2 = dict(e)
                if isinstance(e2.get("ts"), (int, float)):
                    e2["ts"] = e2["ts"] + dt
                a = e2.get("args")
                if isinstance(a, dict) and di:
                    a2 = dict(a)
                    for k in _ID_KEYS:
                        if isinstance(a2.get(k), int) and a2[k] >= 0:
                            a2[k] += di
                    e2["args"] = a2
                if isinstance(e2.get("id"), int) and di:
                    e2["id"] += di
                chunk.append(orjson.dumps(e2))
            blob = b",".join(chunk)
            f.write((b"" if first else b",") + blob)
            first = False
            written += len(blob) + 1
            n_events += len(body)
        f.write(b"]}")
    os.replace(tmp, out)
    return {"copies": copies, "events": n_events, "bytes": written}


def replicate_nsys(src: str, out: str, copies: int) -> dict:
    """Copy an nsys SQLite and append ``copies - 1`` shifted replicas of its activity rows."""
    shutil.copyfile(src, out)
    con = sqlite3.connect(out)
    tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
    act = [t for t in tables if t.startswith("CUPTI_ACTIVITY_KIND_") or t.startswith("NVTX_EVENTS")]
    lo, hi = None, None
    for t in act:
        cols = [r[1] for r in con.execute(f"pragma table_info({t})")]
        if "start" in cols:
            a, b = con.execute(f"select min(start), max(coalesce(end, start)) from {t}").fetchone()
            if a is not None:
                lo = a if lo is None else min(lo, a)
                hi = b if hi is None else max(hi, b)
    shift = (hi - lo) + 1_000_000 if lo is not None else 0
    max_corr = 0
    for t in act:
        cols = [r[1] for r in con.execute(f"pragma table_info({t})")]
        if "correlationId" in cols:
            max_corr = max(max_corr, con.execute(f"select coalesce(max(correlationId), 0) from {t}").fetchone()[0])
    for t in act:
        cols = [r[1] for r in con.execute(f"pragma table_info({t})")]
        base = con.execute(f"select * from {t}").fetchall()
        if not base:
            continue
        idx_s = cols.index("start") if "start" in cols else None
        idx_e = cols.index("end") if "end" in cols else None
        idx_c = cols.index("correlationId") if "correlationId" in cols else None
        rows = []
        for c in range(1, copies):
            for r in base:
                r = list(r)
                if idx_s is not None and r[idx_s] is not None:
                    r[idx_s] += c * shift
                if idx_e is not None and r[idx_e] is not None:
                    r[idx_e] += c * shift
                if idx_c is not None and r[idx_c] is not None:
                    r[idx_c] += c * (max_corr + 1)
                rows.append(r)
        con.executemany(f"insert into {t} values ({','.join('?' * len(cols))})", rows)
    con.commit()
    con.execute("vacuum")
    con.close()
    return {"copies": copies, "bytes": os.path.getsize(out)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("src")
    ap.add_argument("out")
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--copies", type=int)
    g.add_argument("--target-mb", type=float)
    ap.add_argument("--nsys", action="store_true", help="SRC and OUT are nsys SQLite files")
    a = ap.parse_args(argv)
    if a.nsys:
        res = replicate_nsys(a.src, a.out, a.copies or 10)
    else:
        res = replicate_kineto(a.src, a.out, a.copies, a.target_mb)
    print(orjson.dumps(res).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
