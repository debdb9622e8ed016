"""Build large Kineto traces by replicating a real one with shifted timestamps (deterministic).

Each copy shifts every ``ts`` by (copy index) x (source span + 1 ms) and offsets correlation
and external ids, so the result is one long, consistent trace: counts and times scale by the
number of copies, ratio-of-sums shares stay equal, and the GPU window gains one seam per copy
(the source's CPU-only head and tail plus 1 ms), which is GPU idle time.

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

import msgspec

_ID_KEYS = ("correlation", "External id", "external id")


def _load(src: str) -> dict:
    with open(src, "rb") as f:
        raw = f.read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return msgspec.json.decode(raw)


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
    ends = [e["ts"] + (e.get("dur") or 0) for e in body if isinstance(e.get("ts"), (int, float)) and isinstance(e.get("dur", 0), (int, float))]
    span = (max(ends) - min(ts)) if ts else 0.0
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
    one = len(msgspec.json.encode(body))
    if copies is None:
        copies = max(1, int(round(target_mb * 1e6 / max(one, 1))))
    opener = gzip.open if out.endswith(".gz") else open
    tmp = out + ".tmp"
    written = 0
    n_events = len(meta)
    with opener(tmp, "wb", **({"compresslevel": 1} if out.endswith(".gz") else {})) as f:
        head = msgspec.json.encode(doc)[:-1]  # top-level keys without the closing brace
        f.write(head + (b"," if len(doc) else b"") + b'"traceEvents":[')
        written += len(head) + 16
        first = True
        for e in meta:
            f.write((b"" if first else b",") + msgspec.json.encode(e))
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
                chunk.append(msgspec.json.encode(e2))
            blob = b",".join(chunk)
            f.write((b"" if first else b",") + blob)
            first = False
            written += len(blob) + 1
            n_events += len(body)
        f.write(b"]}")
    os.replace(tmp, out)
    return {"copies": copies, "events": n_events, "bytes": written, "shift_us": shift_us}


def replicate_nsys(src: str, out: str, copies: int) -> dict:
    """Copy an nsys SQLite and append ``copies - 1`` shifted replicas of its activity rows.

    Every ``CUPTI_ACTIVITY_KIND_*`` / ``NVTX_EVENTS*`` row is copied ``copies - 1`` times, copy
    ``c`` shifted by ``c`` x (source span + 1 ms) in ``start``/``end`` and by ``c`` x (max
    correlation id + 1) in ``correlationId``. The copies are made in SQL (``INSERT ... SELECT``
    with shifted columns, one statement per table and copy), so 1 GB takes seconds, not minutes.
    """
    shutil.copyfile(src, out)
    con = sqlite3.connect(out)
    con.execute("pragma journal_mode=off")
    con.execute("pragma synchronous=off")
    tables = [r[0] for r in con.execute("select name from sqlite_master where type='table'")]
    act = [t for t in tables if t.startswith("CUPTI_ACTIVITY_KIND_") or t.startswith("NVTX_EVENTS")]
    cols_of = {t: [r[1] for r in con.execute(f'pragma table_info("{t}")')] for t in act}
    lo, hi = None, None
    for t in act:
        if "start" in cols_of[t]:
            a, b = con.execute(f'select min(start), max(coalesce("end", start)) from "{t}"').fetchone()
            if a is not None:
                lo = a if lo is None else min(lo, a)
                hi = b if hi is None else max(hi, b)
    shift = (hi - lo) + 1_000_000 if lo is not None else 0
    max_corr = 0
    for t in act:
        if "correlationId" in cols_of[t]:
            max_corr = max(max_corr, con.execute(f'select coalesce(max(correlationId), 0) from "{t}"').fetchone()[0])
    for t in act:
        cols = cols_of[t]
        n0 = con.execute(f'select max(rowid) from "{t}"').fetchone()[0]
        if n0 is None:
            continue
        names = ", ".join(f'"{c}"' for c in cols)
        for c in range(1, copies):
            dt, dc = c * shift, c * (max_corr + 1)
            sel = []
            for col in cols:
                if col in ("start", "end"):
                    sel.append(f'"{col}" + {dt}')  # NULL stays NULL
                elif col == "correlationId":
                    sel.append(f'"{col}" + {dc}')
                else:
                    sel.append(f'"{col}"')
            con.execute(f'insert into "{t}" ({names}) select {", ".join(sel)} from "{t}" where rowid <= {n0}')
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
    print(msgspec.json.encode(res).decode())
    return 0


if __name__ == "__main__":
    sys.exit(main())
