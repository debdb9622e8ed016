"""Nsight Systems loader: the SQLite export (``nsys export --type sqlite``) and ``.nsys-rep``.

What is read (export schemas 3.16 / 3.17 checked on real files; every column is looked up
with ``PRAGMA table_info`` first, so older or newer schemas degrade instead of failing):

* ``CUPTI_ACTIVITY_KIND_KERNEL`` / ``_MEMCPY`` / ``_MEMSET`` -> ``gpu`` (kind "kernel" /
  "memcpy" / "memset"). Kernel names come from ``demangledName`` (falling back to
  ``shortName``, then ``mangledName``) through ``StringIds``. Copies and fills are named the
  way Kineto names them (``Memcpy HtoD (Pageable -> Device)``, ``Memset (Device)``).
* ``CUPTI_ACTIVITY_KIND_GRAPH_TRACE`` (``--cuda-graph-trace=graph``: one row per graph
  launch, no per-node kernels) -> one "kernel" row named ``cudaGraph <graphId>``.
* ``CUPTI_ACTIVITY_KIND_RUNTIME`` (which also holds driver calls, ``eventClass`` 1) and
  ``CUPTI_ACTIVITY_KIND_DRIVER`` when present -> ``runtime``. nsys appends the CUPTI
  callback version to runtime names (``cudaLaunchKernel_v7000``); the ``_vNNNN[N]`` suffix
  is stripped so names match Kineto's (``cudaGetDeviceProperties_v2_v12000`` ->
  ``cudaGetDeviceProperties_v2``; ``cuGetProcAddress_v2`` is kept).
* ``CUPTI_ACTIVITY_KIND_SYNCHRONIZATION`` -> ``gpu_syncs`` (Kineto names: "Event Sync",
  "Stream Wait Event", "Stream Sync", "Context Sync", taken from the API call with the same
  correlation id when there is one, else from ``syncType``; stream -1 for context syncs).
* ``OSRT_API`` (``--trace osrt``: pthread, poll, read, ioctl...) -> ``runtime`` with
  ``api_kind`` "os" and no correlation: what the host thread was doing between CUDA calls
  (the host-cause classifier reads them; an OS wait there is waiting for another thread).
* ``NVTX_EVENTS*`` push/pop (eventType 59) and start/end (60) ranges -> ``annotations``
  (scope "cpu", device -1); marks (34) and other NVTX records are skipped.
* ``PROFILER_OVERHEAD`` (CUPTI buffer flushes, instrumentation...) -> ``overhead``.
* ``TARGET_INFO_GPU`` -> ``devices``; ``META_DATA_EXPORT``, ``META_DATA_CAPTURE``,
  ``TARGET_INFO_CUDA_DEVICE`` (3.17+) and ``TARGET_INFO_SESSION_START_TIME`` -> ``metadata["nsys"]``.

Times are already integer ns (relative to the session start; the absolute UTC origin is
``metadata["nsys"]["session_start_utc_ns"]`` when recorded). ``pid``/``tid`` are decoded from
``globalTid``: pid = (globalTid >> 24) & 0xFFFFFF, tid = globalTid & 0xFFFFFF.

Correlation ids are per process in CUPTI. When CUDA calls or GPU work from more than one
process are present (multi-process serving, or a helper process as in the 3.17 sample),
``correlation`` is ``(pid << 32) | correlationId`` on both ``gpu`` and ``runtime`` so that a
launch is never matched with another process's kernel; ``metadata["nsys"]["correlation"]``
says which encoding was used ("correlationId" or "pid<<32|correlationId").

Bulk loads select only the needed columns (the kernel name id is chosen in SQL) and come in
one of two ways, with the same result (``metadata["nsys"]["reader"]`` says which was used):

* ``"adbc"`` (the default: ``adbc-driver-sqlite`` is a dependency): columnar reads through
  ADBC into Arrow, then numpy without per-row Python; tables over ``SPLIT_ROWS`` rows are
  read in rowid ranges on parallel read-only connections (the driver releases the GIL).
  The driver infers column types from the data, so a query whose columns do not come back
  as int64 without NULLs (or strings for NVTX text) is redone with sqlite3 and listed in
  ``metadata["nsys"]["reader_fallbacks"]``.
* ``"sqlite3"`` (the fallback when the package does not import, or ``DIAGNOSE_NSYS_READER=sqlite3``):
  ``pandas.read_sql`` in chunks of ``CHUNK_ROWS`` rows.

Either way the input is opened read-only (``file:...?mode=ro``), rows are read in rowid
order, ``StringIds`` are mapped to names through a vectorized id lookup table, and string
columns stay factorized (codes into their distinct values) until the frame is built, so
repeated names share one ``str``. The per-row ``globalPid`` is read only when several
processes make pid-qualified correlation necessary; ``gpu.pid`` is then each activity's
process, else the one process's pid (-1 when the export names none).

The loader is three modules: this one opens the file and assembles the
:class:`~diagnose.trace.model.Trace`; :mod:`diagnose.trace.nsys_db` reads the export (the
connection, the ADBC and sqlite3 readers, ``StringIds``); :mod:`diagnose.trace.nsys_tables`
turns each table into its frame.
"""
from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from diagnose.errors import TraceFormatError
from diagnose.trace.model import GPU_COLUMNS, OVERHEAD_COLUMNS, RUNTIME_COLUMNS, SYNC_COLUMNS, DeviceInfo, Trace, concat_named, frame
from diagnose.trace.nsys_db import (  # noqa: F401 - the reader's public names, importable from here
    ARROW_BATCH_ROWS,
    CHUNK_ROWS,
    MAX_READ_THREADS,
    READER_ENV,
    READERS,
    SPLIT_ROWS,
    ReaderChoiceError,
    _check_file,
    _Db,
    _Factor,
    _fetch_part,
    _pick_reader,
    _q,
    _Strings,
    adbc_available,
)
from diagnose.trace.nsys_tables import (  # noqa: F401 - the export's table names, importable from here
    DRIVER_TABLE,
    EXPECTED_TABLES,
    GPU_INFO_TABLE,
    GRAPH_TABLE,
    KERNEL_TABLE,
    KNOWN_TABLES,
    MEMCPY_TABLE,
    MEMSET_TABLE,
    NVTX_MARK,
    NVTX_PREFIX,
    NVTX_PUSH_POP,
    NVTX_START_END,
    OVERHEAD_TABLE,
    RUNTIME_TABLE,
    SYNC_TABLE,
    _annotations,
    _df,
    _drop_negative,
    _graphs,
    _kernels,
    _memcpys,
    _memsets,
    _Notes,
    _overhead,
    _runtime,
    _syncs,
)
from diagnose.trace.reading import SQLITE_MAGIC as _SQLITE_MAGIC


_DATA_LOSS = re.compile(r"\b(dropped|lost|discarded|overflow(ed)?)\b", re.I)


def load_nsys_rep(path: str, reader: str | None = None) -> Trace:
    """Export an Nsight Systems ``.nsys-rep`` to SQLite with ``nsys`` and load it.

    The export is written to a private temporary directory that is removed afterwards;
    nothing is written next to ``path`` and the input is never modified.

    Args:
        path: the ``.nsys-rep`` (or legacy ``.qdrep``) report.
        reader: bulk reader for the export, as for :func:`load_nsys_sqlite`.

    Returns:
        The :class:`Trace` of the exported SQLite, ``source_path`` set to ``path`` and
        ``metadata["nsys"]["exported_from_rep"]`` True.

    Raises:
        TraceFormatError: the file is missing, ``nsys`` is not on PATH, or the export failed
            (also everything :func:`load_nsys_sqlite` raises).
    """
    _pick_reader(reader)  # a bad reader fails before the (slow) export
    _check_file(path)
    nsys = shutil.which("nsys")
    if nsys is None:
        raise TraceFormatError(
            f"{path}: .nsys-rep needs Nsight Systems' `nsys` on PATH to export it to SQLite; "
            "run `nsys export --type sqlite FILE` and pass the .sqlite"
        )
    with tempfile.TemporaryDirectory(prefix="diagnose-nsys-") as tmp:
        out = os.path.join(tmp, "x.sqlite")
        try:
            proc = subprocess.run(
                [nsys, "export", "--type", "sqlite", "--output", out, os.path.abspath(path)],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                text=True,
                errors="replace",
                cwd=tmp,
            )
        except OSError as e:
            raise TraceFormatError(f"{path}: cannot run `nsys export` ({e})") from None
        if proc.returncode != 0 or not os.path.isfile(out):
            lines = [ln.strip() for ln in (proc.stderr + "\n" + proc.stdout).splitlines() if ln.strip()]
            why = lines[-1] if lines else f"exit status {proc.returncode}"
            raise TraceFormatError(f"{path}: `nsys export --type sqlite` failed: {why}")
        trace = load_nsys_sqlite(out, reader)
    trace.source_path = path
    trace.metadata.setdefault("nsys", {})["exported_from_rep"] = True
    return trace


def load_nsys_sqlite(path: str, reader: str | None = None) -> Trace:
    """Load an Nsight Systems SQLite export into the normalized :class:`Trace`.

    The file is opened read-only (``file:...?mode=ro``). Frames are sorted: ``gpu`` by
    (device, start_ns, end_ns), ``runtime``/``annotations``/``gpu_syncs`` by start_ns.

    Args:
        path: the ``.sqlite`` written by ``nsys export --type sqlite``.
        reader: how the bulk columns are read: ``"adbc"`` (columnar, Arrow, through
            ``adbc-driver-sqlite``), ``"sqlite3"`` (the standard library, via
            ``pandas.read_sql``) or ``"auto"`` (adbc when importable). None: the
            ``DIAGNOSE_NSYS_READER`` environment variable, else ``"auto"``. Both readers
            give the same Trace; the one used is ``metadata["nsys"]["reader"]``.

    Returns:
        Trace with ``source_format="nsys-sqlite"``; data-quality notes in ``trace.quality``
        (codes ``nsys_table_absent``, ``nsys_no_nvtx``, ``nsys_nvtx_unterminated``,
        ``nsys_graph_level``, ``nsys_unresolved_names``, ``nsys_negative_duration``,
        ``nsys_unknown_device``, ``nsys_diagnostic_data_loss``).

    Raises:
        TraceFormatError: the file is missing, not SQLite, corrupt, or an SQLite database
            without any Nsight Systems table.
        ValueError: ``reader`` is not one of the above, or ``"adbc"`` without the package.
    """
    kind = _pick_reader(reader)
    _check_file(path)
    with open(path, "rb") as f:
        head = f.read(16)
    if not head.startswith(_SQLITE_MAGIC):
        raise TraceFormatError(f"{path}: not an SQLite file (expected an `nsys export --type sqlite` output)")
    uri = Path(path).resolve().as_uri() + "?mode=ro"
    try:
        con = sqlite3.connect(uri, uri=True)
    except sqlite3.Error as e:
        raise TraceFormatError(f"{path}: cannot open SQLite read-only ({e})") from None
    db: _Db | None = None
    try:
        db = _Db(con, path, uri, kind)
        return _load(db, path)
    except (sqlite3.Error, pd.errors.DatabaseError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceFormatError(f"{path}: unreadable SQLite ({msg})") from None
    finally:
        if db is not None:
            db.close()
        con.close()


def _load(db: _Db, path: str) -> Trace:
    nvtx_tables = sorted(t for t in db.tables if t.startswith(NVTX_PREFIX))
    if not any(t in db.tables for t in KNOWN_TABLES) and not nvtx_tables:
        raise TraceFormatError(
            f"{path}: SQLite file without Nsight Systems tables (no CUPTI_ACTIVITY_KIND_*, "
            f"NVTX_EVENTS or TARGET_INFO_GPU) — not an `nsys export --type sqlite` output"
        )
    trace = Trace(source_path=path, source_format="nsys-sqlite")
    notes = _Notes()
    meta: dict[str, Any] = _metadata(db)
    trace.metadata["nsys"] = meta

    absent = [t for t in EXPECTED_TABLES if t not in db.tables]
    if absent:
        trace.note(
            "nsys_table_absent",
            f"tables absent from the export (nothing of that kind captured): {', '.join(absent)}",
            len(absent),
        )

    runtime = _runtime(db, notes)
    # Correlation ids are per process: qualify them with the pid when several processes appear.
    pid_sets = [np.unique(runtime["pid"])]
    pid_known = True
    for t in (KERNEL_TABLE, GRAPH_TABLE, MEMCPY_TABLE, MEMSET_TABLE, SYNC_TABLE):
        if db.has(t):
            pids = db.distinct_pids(t)
            if pids is None:
                pid_known = False
            else:
                pid_sets.append(pids)
    composite = pid_known and len(np.unique(np.concatenate(pid_sets))) > 1
    meta["correlation"] = "pid<<32|correlationId" if composite else "correlationId"
    if composite:
        c = runtime["correlation"]
        runtime["correlation"] = np.where(c >= 0, (runtime["pid"] << 32) | c, -1)

    gpu_parts: list[pd.DataFrame] = []
    for loader in (_kernels, _graphs, _memcpys, _memsets):
        part = loader(db, notes, composite)
        if part is None:
            continue
        gpu_parts.append(part)
        if loader is _graphs:
            trace.note(
                "nsys_graph_level",
                "graph-level records: per-kernel detail unavailable (CUDA graphs traced with "
                "--cuda-graph-trace=graph: one row per graph launch, named 'cudaGraph <graphId>')",
                len(part),
            )
    if gpu_parts:
        gpu = concat_named(gpu_parts)
        gpu = _drop_negative(gpu, notes)
        gpu = gpu.sort_values(["device", "start_ns", "end_ns"], kind="stable").reset_index(drop=True)
        if not composite and pid_known:  # one process (or none named): its pid on every row
            pids = np.unique(np.concatenate(pid_sets))
            if len(pids) == 1:
                gpu["pid"] = int(pids[0])
        trace.gpu = frame(GPU_COLUMNS, {c: gpu[c] for c in GPU_COLUMNS})
    if len(runtime["name"]):
        rt = _drop_negative(_df(runtime), notes)
        rt = rt.sort_values("start_ns", kind="stable").reset_index(drop=True)
        trace.runtime = frame(RUNTIME_COLUMNS, {c: rt[c] for c in RUNTIME_COLUMNS})

    syncs = _syncs(db, runtime, composite)
    if syncs is not None and len(syncs):
        trace.gpu_syncs = frame(SYNC_COLUMNS, {c: syncs[c] for c in SYNC_COLUMNS})

    _annotations(db, nvtx_tables, trace, notes)
    overhead = _overhead(db, notes)
    if overhead is not None and len(overhead):
        trace.overhead = frame(OVERHEAD_COLUMNS, {c: overhead[c] for c in OVERHEAD_COLUMNS})
    trace.devices = _devices(db)

    if len(trace.gpu) and trace.devices:
        known = {d.id for d in trace.devices}
        missing = sorted(set(np.unique(trace.gpu["device"].to_numpy()).tolist()) - known)
        if missing:
            trace.note(
                "nsys_unknown_device",
                f"GPU activity on device id(s) {missing} not described in {GPU_INFO_TABLE}",
                len(missing),
            )
    if notes.unresolved:
        trace.note(
            "nsys_unresolved_names",
            f"{notes.unresolved} row(s) whose name id is not in StringIds (name left empty)",
            notes.unresolved,
        )
    if notes.negative:
        trace.note(
            "nsys_negative_duration",
            f"{notes.negative} row(s) with end < start were excluded",
            notes.negative,
        )
    meta["reader"] = db.reader
    if db.fallbacks:  # the adbc reader handed these tables to sqlite3 (same result, slower)
        meta["reader_fallbacks"] = sorted(set(db.fallbacks))
    loss = meta.get("diagnostic_data_loss")
    if loss:
        trace.partial = True
        trace.note("nsys_diagnostic_data_loss", f"nsys reported lost trace data: {loss[0]}", len(loss))
    from diagnose.trace.ranks import label_process_ranks

    return label_process_ranks(trace)  # several processes with GPU work: one rank each (TP jobs)


def _devices(db: _Db) -> list[DeviceInfo]:
    if not db.has(GPU_INFO_TABLE):
        return []
    rows = db.con.execute(f"SELECT * FROM {_q(GPU_INFO_TABLE)}")
    names = [d[0] for d in rows.description]
    out: list[DeviceInfo] = []
    seen: set[int] = set()
    for i, row in enumerate(rows.fetchall()):
        r = dict(zip(names, row))
        dev_id = _first_int(r, ("id", "cuDevice", "deviceId"))
        if dev_id is None:
            dev_id = i
        if dev_id in seen:
            continue
        seen.add(dev_id)
        major = _first_int(r, ("computeMajor", "smMajor", "computeCapabilityMajor"))
        minor = _first_int(r, ("computeMinor", "smMinor", "computeCapabilityMinor"))
        out.append(
            DeviceInfo(
                id=dev_id,
                name=str(r.get("name") or ""),
                total_memory_bytes=_first_int(r, ("totalMemory", "globalMemorySize", "totalGlobalMem")),
                compute_capability=f"{major}.{minor}" if major is not None and minor is not None else None,
                num_sms=_first_int(r, ("smCount", "multiProcessorCount", "numSms")),
            )
        )
    out.sort(key=lambda d: d.id)
    return out


def _first_int(r: dict[str, Any], keys: tuple[str, ...]) -> int | None:
    for k in keys:
        v = r.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            return v
    return None


def _metadata(db: _Db) -> dict[str, Any]:
    meta: dict[str, Any] = {"tables": sorted(t for t in db.tables if t.startswith(("CUPTI_", "NVTX_")))}
    if db.has("META_DATA_EXPORT", "name") and db.has("META_DATA_EXPORT", "value"):
        kv = dict(db.con.execute("SELECT name, value FROM META_DATA_EXPORT").fetchall())
        for src, dst in (
            ("EXPORT_SCHEMA_VERSION", "export_schema_version"),
            ("EXPORT_PRODUCT_VERSION", "export_product_version"),
        ):
            if kv.get(src) is not None:
                meta[dst] = str(kv[src])
    if db.has("META_DATA_CAPTURE", "name") and db.has("META_DATA_CAPTURE", "value"):
        modes = sorted(
            {
                str(v)
                for (v,) in db.con.execute(
                    "SELECT value FROM META_DATA_CAPTURE WHERE name LIKE '%CUDA_GRAPH_TRACE_OPTIONS:MODE'"
                )
                if v is not None
            }
        )
        if modes:
            meta["cuda_graph_trace_mode"] = modes[0] if len(modes) == 1 else modes
    if db.has("TARGET_INFO_SESSION_START_TIME", "utcEpochNs"):
        row = db.con.execute("SELECT utcEpochNs FROM TARGET_INFO_SESSION_START_TIME LIMIT 1").fetchone()
        if row and isinstance(row[0], int):
            meta["session_start_utc_ns"] = row[0]
    if all(db.has("TARGET_INFO_CUDA_DEVICE", c) for c in ("gpuId", "cudaId", "pid")):
        meta["cuda_devices"] = [
            {"gpu_id": g, "cuda_id": c, "pid": p}
            for g, c, p in db.con.execute("SELECT gpuId, cudaId, pid FROM TARGET_INFO_CUDA_DEVICE")
        ]
    if db.has("DIAGNOSTIC_EVENT", "text"):
        texts = [str(t) for (t,) in db.con.execute("SELECT text FROM DIAGNOSTIC_EVENT") if t is not None]
        loss = [t for t in texts if _DATA_LOSS.search(t)]
        if loss:
            meta["diagnostic_data_loss"] = loss
    return meta
