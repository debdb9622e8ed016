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
* ``NVTX_EVENTS*`` push/pop (eventType 59) and start/end (60) ranges -> ``annotations``
  (scope "cpu", device -1); marks (34) and other NVTX records are skipped.
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

Bulk loads use ``pandas.read_sql`` (in chunks of ``CHUNK_ROWS``) on a read-only ``sqlite3``
connection with only the needed columns; the kernel name id is chosen in SQL, ``StringIds``
values are fetched once per distinct id and mapped with numpy (no per-row Python). The
per-row ``globalPid`` is read only when several processes make pid-qualified correlation
necessary.
"""
from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from diagnose.errors import TraceFormatError
from diagnose.trace.apis import api_kind
from diagnose.trace.model import (
    ANNOTATION_COLUMNS,
    GPU_COLUMNS,
    RUNTIME_COLUMNS,
    SYNC_COLUMNS,
    DeviceInfo,
    Trace,
    frame,
)

_SQLITE_MAGIC = b"SQLite format 3\x00"

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
GRAPH_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
DRIVER_TABLE = "CUPTI_ACTIVITY_KIND_DRIVER"
SYNC_TABLE = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
GPU_INFO_TABLE = "TARGET_INFO_GPU"
NVTX_PREFIX = "NVTX_EVENTS"

#: Tables whose absence is worth a ``nsys_table_absent`` note (nothing of that kind captured).
EXPECTED_TABLES = (KERNEL_TABLE, MEMCPY_TABLE, MEMSET_TABLE, RUNTIME_TABLE)
#: At least one of these (or an ``NVTX_EVENTS*`` table) must exist for a file to be an nsys export.
KNOWN_TABLES = (
    KERNEL_TABLE,
    MEMCPY_TABLE,
    MEMSET_TABLE,
    GRAPH_TABLE,
    RUNTIME_TABLE,
    DRIVER_TABLE,
    SYNC_TABLE,
    GPU_INFO_TABLE,
)

NVTX_PUSH_POP = 59
NVTX_START_END = 60
NVTX_MARK = 34  # instant marks: never loaded

_MASK24 = 0xFFFFFF
_VERSION_SUFFIX = re.compile(r"_v\d{4,5}$")

# CUPTI copy kinds (nsys ENUM_CUDA_MEMCPY_OPER ids) in Kineto's short spelling.
_COPY_KIND = {
    0: "Unknown", 1: "HtoD", 2: "DtoH", 3: "HtoA", 4: "AtoH", 5: "AtoA", 6: "AtoD",
    7: "DtoA", 8: "DtoD", 9: "HtoH", 10: "PtoP", 11: "UVM HtoD", 12: "UVM DtoH",
    13: "UVM DtoD",
}
# nsys ENUM_CUDA_MEM_KIND ids (note: nsys numbers from Pageable = 0, unlike CUPTI).
_MEM_KIND = {
    0: "Pageable", 1: "Pinned", 2: "Device", 3: "Array", 4: "Managed", 5: "Device Static",
    6: "Managed Static", 7: "Unknown",
}
# nsys ENUM_CUPTI_SYNC_TYPE ids -> Kineto cuda_sync event names.
_SYNC_NAME = {
    0: "Unknown Sync", 1: "Event Sync", 2: "Stream Wait Event", 3: "Stream Sync",
    4: "Context Sync",
}
_INVALID_U32 = 0xFFFFFFFF
_DATA_LOSS = re.compile(r"\b(dropped|lost|discarded|overflow(ed)?)\b", re.I)


def load_nsys_rep(path: str) -> Trace:
    """Export an Nsight Systems ``.nsys-rep`` to SQLite with ``nsys`` and load it.

    The export is written to a private temporary directory that is removed afterwards;
    nothing is written next to ``path`` and the input is never modified.

    Args:
        path: the ``.nsys-rep`` (or legacy ``.qdrep``) report.

    Returns:
        The :class:`Trace` of the exported SQLite, ``source_path`` set to ``path`` and
        ``metadata["nsys"]["exported_from_rep"]`` True.

    Raises:
        TraceFormatError: the file is missing, ``nsys`` is not on PATH, or the export failed
            (also everything :func:`load_nsys_sqlite` raises).
    """
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
        trace = load_nsys_sqlite(out)
    trace.source_path = path
    trace.metadata.setdefault("nsys", {})["exported_from_rep"] = True
    return trace


def load_nsys_sqlite(path: str) -> Trace:
    """Load an Nsight Systems SQLite export into the normalized :class:`Trace`.

    The file is opened read-only (``file:...?mode=ro``). Frames are sorted: ``gpu`` by
    (device, start_ns, end_ns), ``runtime``/``annotations``/``gpu_syncs`` by start_ns.

    Args:
        path: the ``.sqlite`` written by ``nsys export --type sqlite``.

    Returns:
        Trace with ``source_format="nsys-sqlite"``; data-quality notes in ``trace.quality``
        (codes ``nsys_table_absent``, ``nsys_no_nvtx``, ``nsys_nvtx_unterminated``,
        ``nsys_graph_level``, ``nsys_unresolved_names``, ``nsys_negative_duration``,
        ``nsys_unknown_device``, ``nsys_diagnostic_data_loss``).

    Raises:
        TraceFormatError: the file is missing, not SQLite, corrupt, or an SQLite database
            without any Nsight Systems table.
    """
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
    try:
        return _load(con, path)
    except (sqlite3.Error, pd.errors.DatabaseError) as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        raise TraceFormatError(f"{path}: unreadable SQLite ({msg})") from None
    finally:
        con.close()


# --------------------------------------------------------------------------------------------

#: Rows per ``pandas.read_sql`` chunk: bounds the transient tuple lists on 1 GB exports.
CHUNK_ROWS = 1_000_000
#: Ids per ``StringIds`` lookup query (below SQLite's historical 999-parameter limit).
_IDS_PER_QUERY = 900
_NULL_END = np.iinfo(np.int64).min

_Cols = dict[str, tuple[tuple[str, ...], Any]]


def _check_file(path: str) -> None:
    if not os.path.exists(path):
        raise TraceFormatError(f"{path}: no such file")
    if not os.path.isfile(path):
        raise TraceFormatError(f"{path}: not a regular file")


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _sql_lit(v: Any) -> str:
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return str(int(v))


class _Db:
    """A read-only connection plus the schema (table name -> set of column names)."""

    def __init__(self, con: sqlite3.Connection, path: str) -> None:
        self.con = con
        self.path = path
        names = [r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view')")]
        self.tables: dict[str, set[str]] = {
            n: {r[1] for r in con.execute(f"PRAGMA table_info({_q(n)})")} for n in names
        }

    def has(self, table: str, column: str | None = None) -> bool:
        cols = self.tables.get(table)
        return cols is not None and (column is None or column in cols)

    def col(self, table: str, cands: tuple[str, ...]) -> str | None:
        """The first of ``cands`` that ``table`` has."""
        return next((c for c in cands if self.has(table, c)), None)

    def read(
        self,
        table: str,
        cols: _Cols,
        where: str = "",
        exprs: dict[str, str] | None = None,
        text: tuple[str, ...] = (),
    ) -> dict[str, np.ndarray]:
        """Bulk-read columns as arrays: int64, or object for the aliases in ``text``.

        Args:
            table: table to read.
            cols: alias -> (candidate column names, default). The first existing candidate
                is selected, NULLs COALESCEd to the default; default None = required column.
            where: optional SQL condition.
            exprs: alias -> raw SQL expression, selected as well.
            text: aliases kept as object arrays of str/None.

        Raises:
            TraceFormatError: a required column is missing, or a value is not an integer.
        """
        parts = [f"{e} AS {_q(a)}" for a, e in (exprs or {}).items()]
        for alias, (cands, default) in cols.items():
            col = self.col(table, cands)
            if col is None:
                if default is None:
                    raise TraceFormatError(f"{self.path}: table {table} has no column {cands[0]!r}")
                parts.append(f"{_sql_lit(default)} AS {_q(alias)}")
            elif default is None:
                parts.append(f"{_q(col)} AS {_q(alias)}")
            else:
                parts.append(f"COALESCE({_q(col)}, {_sql_lit(default)}) AS {_q(alias)}")
        aliases = [*(exprs or {}), *cols]
        sql = f"SELECT {', '.join(parts)} FROM {_q(table)}" + (f" WHERE {where}" if where else "")
        chunks: dict[str, list[np.ndarray]] = {a: [] for a in aliases}
        for df in pd.read_sql(sql, self.con, chunksize=CHUNK_ROWS):
            for a in aliases:
                if a in text:
                    chunks[a].append(_dedup_text(df[a]))
                else:
                    try:
                        chunks[a].append(df[a].to_numpy(dtype=np.int64))
                    except (TypeError, ValueError):
                        raise TraceFormatError(
                            f"{self.path}: non-integer value in {table}.{a}"
                        ) from None
        return {
            a: np.concatenate(v) if v else np.array([], dtype=object if a in text else np.int64)
            for a, v in chunks.items()
        }

    def strings(self, ids: np.ndarray) -> pd.Series:
        """``StringIds`` values for ``ids`` (Series: id -> str); unknown ids are absent."""
        uniq = np.unique(ids[ids >= 0]).tolist() if len(ids) else []
        if not uniq or not (self.has("StringIds", "id") and self.has("StringIds", "value")):
            return pd.Series([], dtype=object, index=pd.Index([], dtype=np.int64))
        got_ids: list[int] = []
        got_vals: list[str] = []
        for i in range(0, len(uniq), _IDS_PER_QUERY):
            part = uniq[i : i + _IDS_PER_QUERY]
            marks = ",".join("?" * len(part))
            for k, v in self.con.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", part):
                got_ids.append(k)
                got_vals.append("" if v is None else str(v))
        return pd.Series(
            np.asarray(got_vals, dtype=object), index=pd.Index(np.asarray(got_ids, dtype=np.int64))
        )

    def distinct_pids(self, table: str) -> np.ndarray | None:
        """Distinct pids of ``table``'s ``globalPid`` (None when the column is absent)."""
        if not self.has(table, "globalPid"):
            return None
        rows = self.con.execute(f'SELECT DISTINCT "globalPid" FROM {_q(table)}').fetchall()
        g = np.asarray([r[0] for r in rows if isinstance(r[0], int)], dtype=np.int64)
        return np.unique((g >> 24) & _MASK24)


def _dedup_text(s: pd.Series) -> np.ndarray:
    """Object array of the column's strings (None for NULL), repeated values sharing one object."""
    codes, uniques = pd.factorize(s, use_na_sentinel=True)
    vals = np.asarray(uniques, dtype=object)
    out = np.empty(len(codes), dtype=object)
    ok = codes >= 0
    out[ok] = vals[codes[ok]]
    return out


def _lookup(ids: np.ndarray, strings: pd.Series) -> np.ndarray:
    """Map int ids to strings, vectorized: object array with None where unresolved."""
    out = np.full(len(ids), None, dtype=object)
    if len(strings) == 0 or len(ids) == 0:
        return out
    pos = strings.index.get_indexer(ids)
    ok = pos >= 0
    out[ok] = strings.to_numpy(dtype=object)[pos[ok]]
    return out


def _combo_names(keys: np.ndarray, build: Callable[[int], str]) -> np.ndarray:
    """Name rows by a small integer key: ``build(key)`` runs once per distinct key."""
    if len(keys) == 0:
        return np.array([], dtype=object)
    uniq, inv = np.unique(keys, return_inverse=True)
    labels = np.array([build(int(k)) for k in uniq.tolist()], dtype=object)
    return labels[inv.reshape(-1)]


def _df(cols: dict[str, np.ndarray]) -> pd.DataFrame:
    """DataFrame keeping object arrays as object dtype (pandas 3 would infer ``str``)."""
    return pd.DataFrame(
        {c: pd.Series(v, dtype=object) if v.dtype == object else v for c, v in cols.items()}
    )


class _Notes:
    """Counters turned into quality notes at the end of a load."""

    def __init__(self) -> None:
        self.unresolved = 0
        self.negative = 0


def _load(con: sqlite3.Connection, path: str) -> Trace:
    db = _Db(con, path)
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
        gpu = pd.concat(gpu_parts, ignore_index=True) if len(gpu_parts) > 1 else gpu_parts[0]
        gpu = _drop_negative(gpu, notes)
        gpu = gpu.sort_values(["device", "start_ns", "end_ns"], kind="stable").reset_index(drop=True)
        trace.gpu = frame(GPU_COLUMNS, {c: gpu[c] for c in GPU_COLUMNS})
    if len(runtime["name"]):
        rt = _drop_negative(_df(runtime), notes)
        rt = rt.sort_values("start_ns", kind="stable").reset_index(drop=True)
        trace.runtime = frame(RUNTIME_COLUMNS, {c: rt[c] for c in RUNTIME_COLUMNS})

    syncs = _syncs(db, runtime, composite)
    if syncs is not None and len(syncs):
        trace.gpu_syncs = frame(SYNC_COLUMNS, {c: syncs[c] for c in SYNC_COLUMNS})

    _annotations(db, nvtx_tables, trace, notes)
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
    loss = meta.get("diagnostic_data_loss")
    if loss:
        trace.partial = True
        trace.note("nsys_diagnostic_data_loss", f"nsys reported lost trace data: {loss[0]}", len(loss))
    return trace


def _drop_negative(df: pd.DataFrame, notes: _Notes) -> pd.DataFrame:
    keep = df["end_ns"].to_numpy() >= df["start_ns"].to_numpy()
    if keep.all():
        return df
    notes.negative += int((~keep).sum())
    return df[keep]


_TIME_COLS: _Cols = {"start": (("start",), None), "end": (("end",), None)}
_ACTIVITY_WHERE = '"start" IS NOT NULL AND "end" IS NOT NULL'


def _gpu_cols(db: _Db, table: str, composite: bool) -> _Cols:
    cols: _Cols = {
        **_TIME_COLS,
        "device": (("deviceId",), 0),
        "stream": (("streamId",), -1),
        "correlation": (("correlationId",), -1),
    }
    if composite:
        cols["gpid"] = (("globalPid",), -1)
    return cols


def _correlation(d: dict[str, np.ndarray], composite: bool) -> np.ndarray:
    c = d["correlation"]
    if not composite:
        return c
    gp = d["gpid"]
    return np.where((c >= 0) & (gp >= 0), (((gp >> 24) & _MASK24) << 32) | c, -1)


def _gpu_frame(d: dict[str, np.ndarray], kind: str, names: np.ndarray, composite: bool, nbytes: np.ndarray | None = None) -> pd.DataFrame:
    n = len(d["start"])
    return _df(
        {
            "kind": np.full(n, kind, dtype=object),
            "name": names,
            "device": d["device"],
            "stream": d["stream"],
            "start_ns": d["start"],
            "end_ns": d["end"],
            "correlation": _correlation(d, composite),
            "external_id": np.full(n, -1, dtype=np.int64),
            "bytes": nbytes if nbytes is not None else np.full(n, -1, dtype=np.int64),
        }
    )


def _kernels(db: _Db, notes: _Notes, composite: bool) -> pd.DataFrame | None:
    if not db.has(KERNEL_TABLE):
        return None
    cands = [c for c in ("demangledName", "shortName", "mangledName") if db.has(KERNEL_TABLE, c)]
    if not cands:
        name_expr = "-1"
    elif len(cands) == 1 or not db.has("StringIds", "value"):
        name_expr = f"COALESCE({_q(cands[0])}, -1)"
    else:
        # The first candidate whose string is non-empty, picked in SQL: one id column per row.
        good = "(SELECT id FROM StringIds WHERE value <> '')"
        whens = " ".join(f"WHEN {_q(c)} IN {good} THEN {_q(c)}" for c in cands[:-1])
        name_expr = f"CASE {whens} ELSE COALESCE({_q(cands[-1])}, -1) END"
    d = db.read(KERNEL_TABLE, _gpu_cols(db, KERNEL_TABLE, composite), _ACTIVITY_WHERE, {"nameId": name_expr})
    names = _lookup(d["nameId"], db.strings(d["nameId"]))
    missing = np.equal(names, None)
    notes.unresolved += int(missing.sum())
    names[missing] = ""
    return _gpu_frame(d, "kernel", names, composite)


def _graphs(db: _Db, notes: _Notes, composite: bool) -> pd.DataFrame | None:
    if not db.has(GRAPH_TABLE):
        return None
    cols = _gpu_cols(db, GRAPH_TABLE, composite)
    cols["graph"] = (("graphId", "graphExecId"), -1)
    d = db.read(GRAPH_TABLE, cols, _ACTIVITY_WHERE)
    names = _combo_names(d["graph"], lambda g: f"cudaGraph {g}" if g >= 0 else "cudaGraph")
    return _gpu_frame(d, "kernel", names, composite)


def _mem_kinds(db: _Db) -> dict[int, str]:
    """Memory-kind labels from ENUM_CUDA_MEM_KIND when exported, else the 3.16/3.17 values."""
    out = dict(_MEM_KIND)
    if db.has("ENUM_CUDA_MEM_KIND", "id") and db.has("ENUM_CUDA_MEM_KIND", "label"):
        for i, lab in db.con.execute("SELECT id, label FROM ENUM_CUDA_MEM_KIND"):
            if isinstance(i, int) and lab:
                out[i] = str(lab)
    return out


def _memcpys(db: _Db, notes: _Notes, composite: bool) -> pd.DataFrame | None:
    if not db.has(MEMCPY_TABLE):
        return None
    cols = _gpu_cols(db, MEMCPY_TABLE, composite)
    cols.update(
        {
            "bytes": (("bytes",), -1),
            "copyKind": (("copyKind",), 0),
            "srcKind": (("srcKind",), -1),
            "dstKind": (("dstKind",), -1),
        }
    )
    d = db.read(MEMCPY_TABLE, cols, _ACTIVITY_WHERE)
    mem = _mem_kinds(db)

    def build(key: int) -> str:
        c, s, t = key >> 32, (key >> 16) & 0xFFFF, key & 0xFFFF
        base = f"Memcpy {_COPY_KIND.get(c, 'Unknown')}"
        if s == 0xFFFF or t == 0xFFFF:
            return base
        return f"{base} ({mem.get(s, 'Unknown')} -> {mem.get(t, 'Unknown')})"

    ck, sk, dk = (d[c] & 0xFFFF for c in ("copyKind", "srcKind", "dstKind"))
    names = _combo_names((ck << 32) | (sk << 16) | dk, build)
    return _gpu_frame(d, "memcpy", names, composite, d["bytes"])


def _memsets(db: _Db, notes: _Notes, composite: bool) -> pd.DataFrame | None:
    if not db.has(MEMSET_TABLE):
        return None
    cols = _gpu_cols(db, MEMSET_TABLE, composite)
    cols.update({"bytes": (("bytes",), -1), "memKind": (("memKind",), -1)})
    d = db.read(MEMSET_TABLE, cols, _ACTIVITY_WHERE)
    mem = _mem_kinds(db)
    names = _combo_names(d["memKind"], lambda k: "Memset" if k < 0 else f"Memset ({mem.get(k, 'Unknown')})")
    return _gpu_frame(d, "memset", names, composite, d["bytes"])


def _runtime(db: _Db, notes: _Notes) -> dict[str, np.ndarray]:
    """Runtime + driver API rows as column arrays (RUNTIME_COLUMNS), unsorted."""
    parts: list[dict[str, np.ndarray]] = []
    for table in (RUNTIME_TABLE, DRIVER_TABLE):
        if not db.has(table):
            continue
        d = db.read(
            table,
            {
                **_TIME_COLS,
                "correlation": (("correlationId",), -1),
                "nameId": (("nameId",), -1),
                "gtid": (("globalTid",), 0),
            },
            _ACTIVITY_WHERE,
        )
        strings = db.strings(d["nameId"])
        # Clean and classify each distinct name once, then map by position.
        clean = pd.Series(
            np.array([_VERSION_SUFFIX.sub("", v) for v in strings.to_numpy()], dtype=object),
            index=strings.index,
            dtype=object,
        )
        kinds = pd.Series(np.array([api_kind(v) for v in clean.to_numpy()], dtype=object), index=strings.index, dtype=object)
        names = _lookup(d["nameId"], clean)
        missing = np.equal(names, None)
        notes.unresolved += int(missing.sum())
        names[missing] = ""
        kind = _lookup(d["nameId"], kinds)
        kind[missing] = "other"
        gtid = d["gtid"]
        parts.append(
            {
                "name": names,
                "api_kind": kind,
                "start_ns": d["start"],
                "end_ns": d["end"],
                "correlation": d["correlation"],
                "pid": (gtid >> 24) & _MASK24,
                "tid": gtid & _MASK24,
            }
        )
    if not parts:
        return {c: np.array([], dtype=object if t == "object" else np.int64) for c, t in RUNTIME_COLUMNS.items()}
    return {c: np.concatenate([p[c] for p in parts]) for c in RUNTIME_COLUMNS}


_API_SYNC = (
    (re.compile(r"StreamWaitEvent", re.I), "Stream Wait Event"),
    (re.compile(r"StreamSynchronize", re.I), "Stream Sync"),
    (re.compile(r"EventSynchronize", re.I), "Event Sync"),
    (re.compile(r"(Device|Ctx|Context)Synchronize", re.I), "Context Sync"),
)


def _sync_name_for_api(name: str) -> str | None:
    for pat, label in _API_SYNC:
        if pat.search(name):
            return label
    return None


def _syncs(db: _Db, runtime: dict[str, np.ndarray], composite: bool) -> pd.DataFrame | None:
    """GPU-side synchronization records, named like Kineto's ``cuda_sync`` events.

    The name comes from the runtime/driver call sharing the record's correlation id when
    there is one: the exported ``syncType`` was seen to say "stream wait event" (2) for
    ``cudaStreamSynchronize`` calls in both sample exports. ``syncType`` is the fallback.
    """
    if not db.has(SYNC_TABLE):
        return None
    cols = _gpu_cols(db, SYNC_TABLE, composite)
    cols["syncType"] = (("syncType",), 0)
    d = db.read(SYNC_TABLE, cols, _ACTIVITY_WHERE)
    corr = _correlation(d, composite)
    names = _combo_names(d["syncType"], lambda k: _SYNC_NAME.get(k, "Unknown Sync"))
    if len(corr) and len(runtime["name"]):
        rt = _df({"correlation": runtime["correlation"], "name": runtime["name"]})
        rt = rt[rt["correlation"] >= 0].drop_duplicates("correlation")
        by_corr = pd.Series(rt["name"].to_numpy(dtype=object), index=pd.Index(rt["correlation"].to_numpy()))
        api = _lookup(corr, by_corr)
        labels = {a: _sync_name_for_api(a) for a in set(api.tolist()) if a is not None}
        for a, label in labels.items():
            if label is not None:
                names[api == a] = label
    stream = d["stream"]
    out = _df(
        {
            "name": names,
            "device": d["device"],
            "stream": np.where(stream == _INVALID_U32, -1, stream),
            "start_ns": d["start"],
            "end_ns": d["end"],
        }
    )
    out = out[out["end_ns"] >= out["start_ns"]]
    return out.sort_values("start_ns", kind="stable").reset_index(drop=True)


def _pick_nvtx_table(db: _Db, tables: list[str]) -> str | None:
    """``NVTX_EVENTS`` itself when usable, else the last (highest-suffixed) usable match."""
    usable = [t for t in tables if db.has(t, "start") and db.has(t, "end")]
    if not usable:
        return None
    return NVTX_PREFIX if NVTX_PREFIX in usable else usable[-1]


def _annotations(db: _Db, tables: list[str], trace: Trace, notes: _Notes) -> None:
    table = _pick_nvtx_table(db, tables)
    if table is None:
        trace.note("nsys_no_nvtx", "no NVTX captured")
        return
    trace.metadata["nsys"]["nvtx_table"] = table
    # Push/pop and start/end ranges only; marks (34), domain/category records are skipped.
    where = f'"eventType" IN ({NVTX_PUSH_POP}, {NVTX_START_END})' if db.has(table, "eventType") else ""
    cols: _Cols = {
        "start": (("start",), None),
        "end": (("end",), _NULL_END),  # NULL end: unterminated range (or a mark, w/o eventType)
        "text": (("text",), ""),
        "textId": (("textId",), -1),
        "gtid": (("globalTid",), 0),
    }
    d = db.read(table, cols, where + (" AND " if where else "") + '"start" IS NOT NULL', text=("text",))
    start, end = d["start"], d["end"]
    open_ = end == _NULL_END
    unterminated = int(open_.sum())
    if unterminated:
        trace.note(
            "nsys_nvtx_unterminated",
            f"{unterminated} NVTX range(s) without an end (unterminated) were skipped",
            unterminated,
        )
    keep = ~open_ & (end >= start)
    notes.negative += int((~open_ & (end < start)).sum())
    if not keep.any():
        return
    names = d["text"][keep]
    need = np.equal(names, None) | np.equal(names, "")
    if need.any():
        ids = d["textId"][keep][need]
        names[need] = _lookup(ids, db.strings(ids))
        missing = np.equal(names, None)
        notes.unresolved += int(missing.sum())
        names[missing] = ""
    gtid = d["gtid"][keep]
    n = len(names)
    ann = _df(
        {
            "name": names,
            "scope": np.full(n, "cpu", dtype=object),
            "device": np.full(n, -1, dtype=np.int64),
            "start_ns": start[keep],
            "end_ns": end[keep],
            "pid": (gtid >> 24) & _MASK24,
            "tid": gtid & _MASK24,
        }
    )
    ann = ann.sort_values("start_ns", kind="stable").reset_index(drop=True)
    trace.annotations = frame(ANNOTATION_COLUMNS, {c: ann[c] for c in ANNOTATION_COLUMNS})


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
