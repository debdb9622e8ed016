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
"""
from __future__ import annotations

import os
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pandas as pd

from diagnose.errors import TraceFormatError
from diagnose.trace.apis import api_kind
from diagnose.trace.model import (
    ANNOTATION_COLUMNS,
    GPU_COLUMNS,
    OVERHEAD_COLUMNS,
    RUNTIME_COLUMNS,
    SYNC_COLUMNS,
    DeviceInfo,
    Trace,
    factorize,
    frame,
)
from diagnose.trace.reading import SQLITE_MAGIC as _SQLITE_MAGIC

KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"
MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"
MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"
GRAPH_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"
RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"
DRIVER_TABLE = "CUPTI_ACTIVITY_KIND_DRIVER"
SYNC_TABLE = "CUPTI_ACTIVITY_KIND_SYNCHRONIZATION"
OVERHEAD_TABLE = "PROFILER_OVERHEAD"
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


#: Environment variable choosing the bulk reader when ``load_nsys_sqlite(reader=None)``.
READER_ENV = "DIAGNOSE_NSYS_READER"
READERS = ("auto", "adbc", "sqlite3")


def adbc_available() -> bool:
    """True when ``adbc_driver_sqlite`` (and pyarrow) import: the columnar reader can be used."""
    return _adbc_modules() is not None


def _adbc_modules() -> tuple[Any, Any] | None:
    """(adbc_driver_sqlite.dbapi, pyarrow), imported on first use; None when either is absent."""
    global _ADBC
    if _ADBC is None:
        try:
            import adbc_driver_sqlite.dbapi as dbapi
            import pyarrow as pa
        except ImportError:
            _ADBC = False
        else:
            _ADBC = (dbapi, pa)
    return _ADBC or None


_ADBC: Any = None


class ReaderChoiceError(TraceFormatError, ValueError):
    """A bad ``reader`` argument or ``DIAGNOSE_NSYS_READER`` value: a ValueError for callers,
    one ``error:`` line and exit 2 at the command line (the environment is user input)."""


def _pick_reader(reader: str | None) -> str:
    want = reader if reader is not None else (os.environ.get(READER_ENV) or "auto")
    want = want.strip().lower()
    if want not in READERS:
        raise ReaderChoiceError(f"nsys reader ({READER_ENV} or reader=) must be one of {', '.join(READERS)}, not {want[:40]!r}")
    if want == "auto":
        return "adbc" if adbc_available() else "sqlite3"
    if want == "adbc" and not adbc_available():
        raise ReaderChoiceError("nsys reader 'adbc' needs the adbc-driver-sqlite package (pip install adbc-driver-sqlite)")
    return want


# --------------------------------------------------------------------------------------------

#: Rows per ``pandas.read_sql`` chunk (sqlite3 reader): bounds the transient tuple lists on 1 GB exports.
CHUNK_ROWS = 1_000_000
#: Rows per Arrow batch (adbc reader). The driver infers each column's type from the first
#: batch of a result; when a later batch disagrees the read fails and that one query is redone
#: by the sqlite3 reader (also when a column comes back as another type or with NULLs).
ARROW_BATCH_ROWS = 1 << 18
#: The adbc reader splits a table with more rows than this into rowid ranges read on parallel
#: connections (threads: the driver releases the GIL while it steps SQLite).
SPLIT_ROWS = 1_000_000
#: At most this many parallel range reads (capped by the CPUs this process may use).
MAX_READ_THREADS = 8
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


def _cpus() -> int:
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


class _Db:
    """A read-only connection plus the schema (table name -> set of column names).

    Small queries (schema, metadata, distinct pids) go through ``con`` (sqlite3). Bulk column
    reads (:meth:`read`) and ``StringIds`` go through the chosen reader: ``"adbc"`` (Arrow
    tables from ``adbc-driver-sqlite`` connections opened on the same read-only URI) or
    ``"sqlite3"`` (``pandas.read_sql``). Both return the same arrays.
    """

    def __init__(self, con: sqlite3.Connection, path: str, uri: str = "", reader: str = "sqlite3") -> None:
        self.con = con
        self.path = path
        self.uri = uri
        self.reader = reader
        #: Tables whose adbc read was redone with sqlite3 (type inference disagreed, or an error).
        self.fallbacks: list[str] = []
        self._arrow_pool: list[Any] = []
        self._all_strings: _Strings | None | bool = None  # False: the Arrow read did not fit
        kinds = dict(con.execute("SELECT name, type FROM sqlite_master WHERE type IN ('table', 'view')").fetchall())
        self.tables: dict[str, set[str]] = {
            n: {r[1] for r in con.execute(f"PRAGMA table_info({_q(n)})")} for n in kinds
        }
        # Plain tables whose rowid can order and split a scan (not views, no column named rowid;
        # WITHOUT ROWID tables fail the probe).
        self._rowid_tables: set[str] = set()
        for n, k in kinds.items():
            if k == "table" and not ({"rowid", "_rowid_", "oid"} & {c.lower() for c in self.tables[n]}):
                try:
                    con.execute(f"SELECT rowid FROM {_q(n)} LIMIT 0")
                except sqlite3.Error:
                    continue
                self._rowid_tables.add(n)

    def close(self) -> None:
        for c in self._arrow_pool:
            try:
                c.close()
            except Exception:  # noqa: BLE001 - closing a read-only connection; nothing to save
                pass
        self._arrow_pool = []

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
    ) -> dict[str, Any]:
        """Bulk-read columns: int64 arrays, or a :class:`_Factor` for the aliases in ``text``.

        Rows come in rowid order (the table's storage order) whichever reader is used.

        Args:
            table: table to read.
            cols: alias -> (candidate column names, default). The first existing candidate
                is selected, NULLs COALESCEd to the default; default None = required column.
            where: optional SQL condition.
            exprs: alias -> raw SQL expression, selected as well.
            text: aliases read as strings, returned factorized (codes + distinct values).

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
        select = f"SELECT {', '.join(parts)} FROM {_q(table)}"
        if self.reader == "adbc":
            got = self._read_arrow(table, select, where, aliases, text)
            if got is not None:
                return got
            self.fallbacks.append(table)
        return self._read_sqlite3(table, self._sql(table, select, where), aliases, text)

    def _sql(self, table: str, select: str, where: str, rows: tuple[int, int] | None = None) -> str:
        conds = [f"({where})"] if where else []
        if rows is not None:
            conds.append(f"rowid BETWEEN {rows[0]} AND {rows[1]}")
        sql = select + (f" WHERE {' AND '.join(conds)}" if conds else "")
        return sql + (" ORDER BY rowid" if table in self._rowid_tables else "")

    def _read_sqlite3(self, table: str, sql: str, aliases: list[str], text: tuple[str, ...]) -> dict[str, Any]:
        chunks: dict[str, list[Any]] = {a: [] for a in aliases}
        for df in pd.read_sql(sql, self.con, chunksize=CHUNK_ROWS):
            for a in aliases:
                if a in text:
                    codes, uniques = pd.factorize(df[a], use_na_sentinel=True)
                    chunks[a].append((codes, np.asarray(uniques, dtype=object)))
                else:
                    try:
                        chunks[a].append(_int64_column(df[a]))
                    except (TypeError, ValueError):
                        raise TraceFormatError(
                            f"{self.path}: non-integer value in {table}.{a}"
                        ) from None
        return {
            a: _Factor.concat(v) if a in text else np.concatenate(v) if v else np.array([], dtype=np.int64)
            for a, v in chunks.items()
        }

    # ---- adbc reader

    def _arrow_cons(self, n: int) -> list[Any]:
        dbapi = _adbc_modules()[0]  # type: ignore[index]
        while len(self._arrow_pool) < n:
            self._arrow_pool.append(dbapi.connect(self.uri, autocommit=True))
        return self._arrow_pool[:n]

    def _row_ranges(self, table: str) -> list[tuple[int, int] | None]:
        """Contiguous rowid ranges splitting a big table for parallel reads ([None]: one read)."""
        threads = min(MAX_READ_THREADS, _cpus())
        if threads < 2 or table not in self._rowid_tables:
            return [None]
        t = _q(table)  # two subqueries: SQLite's O(log n) min/max shortcut needs one aggregate each
        lo, hi = self.con.execute(f"SELECT (SELECT min(rowid) FROM {t}), (SELECT max(rowid) FROM {t})").fetchone()
        if not isinstance(lo, int) or not isinstance(hi, int):
            return [None]
        n = hi - lo + 1
        k = min(threads, n // SPLIT_ROWS)
        if k < 2:
            return [None]
        bounds = [lo + (n * i) // k for i in range(k + 1)]
        return [(bounds[i], bounds[i + 1] - 1) for i in range(k)]

    def _fetch(self, sqls: list[str], aliases: list[str], text: tuple[str, ...]) -> dict[str, Any] | None:
        """Columns of ``sqls`` (row ranges of one result, read in parallel when several, joined
        in order); None when the driver failed or a column is not what sqlite3 would give."""
        try:
            cons = self._arrow_cons(len(sqls))
            if len(sqls) == 1:
                parts = [_fetch_part(cons[0], sqls[0], aliases, text)]
            else:
                with ThreadPoolExecutor(len(sqls), thread_name_prefix="diagnose-nsys") as ex:
                    parts = list(ex.map(lambda c, q: _fetch_part(c, q, aliases, text), cons, sqls))
        except Exception:  # noqa: BLE001 - any driver error or type surprise: sqlite3 redoes the query
            return None
        out: dict[str, Any] = {}
        for a in aliases:
            chunks = [c for p in parts for c in p[a]]
            if a in text:
                out[a] = _Factor.concat(chunks)
            elif len(chunks) == 1:
                out[a] = chunks[0]
            else:
                out[a] = np.concatenate(chunks) if chunks else np.array([], dtype=np.int64)
        return out

    def _read_arrow(
        self, table: str, select: str, where: str, aliases: list[str], text: tuple[str, ...]
    ) -> dict[str, Any] | None:
        """Columns from the adbc reader, or None when the sqlite3 reader must redo the query."""
        try:
            ranges = self._row_ranges(table)
        except sqlite3.Error:
            ranges = [None]
        out = self._fetch([self._sql(table, select, where, r) for r in ranges], aliases, text)
        if len(ranges) > 1:
            _trim_memory()
        return out

    # ---- StringIds

    def strings(self, ids: np.ndarray) -> _Strings:
        """``StringIds`` values of the ids in ``ids`` (a lookup table; unknown ids are absent)."""
        ids = np.asarray(ids, dtype=np.int64)
        if not len(ids) or not (self.has("StringIds", "id") and self.has("StringIds", "value")):
            return _Strings.empty()
        if self.reader == "adbc":
            if self._all_strings is None:
                self._all_strings = self._arrow_strings() or False
            if isinstance(self._all_strings, _Strings):
                return self._all_strings.subset(ids)
        uniq = np.unique(ids[ids >= 0]).tolist()
        got_ids: list[int] = []
        got_vals: list[str] = []
        for i in range(0, len(uniq), _IDS_PER_QUERY):
            part = uniq[i : i + _IDS_PER_QUERY]
            marks = ",".join("?" * len(part))
            for k, v in self.con.execute(f"SELECT id, value FROM StringIds WHERE id IN ({marks})", part):
                got_ids.append(k)
                got_vals.append("" if v is None else str(v))
        return _Strings(np.asarray(got_ids, dtype=np.int64), np.asarray(got_vals, dtype=object))

    def _arrow_strings(self) -> _Strings | None:
        """All of ``StringIds`` in one Arrow read (None: not as expected, use the sqlite3 lookup)."""
        sql = "SELECT id, value FROM StringIds WHERE typeof(id) = 'integer' AND id >= 0"
        got = self._fetch([sql], ["id", "value"], ("value",))
        if got is None:
            return None
        vals = got["value"].values()
        vals[np.equal(vals, None)] = ""
        return _Strings(got["id"], vals)

    def distinct_pids(self, table: str) -> np.ndarray | None:
        """Distinct pids of ``table``'s ``globalPid`` (None when the column is absent)."""
        if not self.has(table, "globalPid"):
            return None
        rows = self.con.execute(f'SELECT DISTINCT "globalPid" FROM {_q(table)}').fetchall()
        g = np.asarray([r[0] for r in rows if isinstance(r[0], int)], dtype=np.int64)
        return np.unique((g >> 24) & _MASK24)


def _int64_column(col: pd.Series) -> np.ndarray:
    """A column read by pandas as int64 (REALs truncated, as SQLite's own cast does). SQLite
    stores a number too large for INTEGER (a 30-digit value in an integer column) as REAL,
    and pandas reads NULL as NaN: cast, they would become garbage, so they are refused.

    Raises:
        ValueError: text, NaN or a value beyond int64 (1e30).
    """
    if col.dtype.kind == "f":
        v = col.to_numpy()
        if not (np.isfinite(v) & (np.abs(v) < 2.0**63)).all():
            raise ValueError("not an int64")
    return col.to_numpy(dtype=np.int64)


def _trim_memory() -> None:
    """Hand memory freed by a big parallel read back to the OS.

    The driver's Arrow buffers are malloc'd in the reader threads, so glibc keeps them in
    per-thread arenas the main thread never reuses (~0.6 GB after a 1 GB export):
    ``malloc_trim`` returns them. A no-op where glibc is not the allocator.
    """
    global _LIBC
    if _LIBC is None:
        _LIBC = False
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                libc = ctypes.CDLL("libc.so.6")
                libc.malloc_trim.argtypes = [ctypes.c_size_t]
                _LIBC = libc
            except (OSError, AttributeError):
                pass
    if _LIBC:
        _LIBC.malloc_trim(0)


_LIBC: Any = None


class _Mismatch(Exception):
    """An Arrow column is not what the sqlite3 reader would return without conversion."""


def _fetch_part(con: Any, sql: str, aliases: list[str], text: tuple[str, ...]) -> dict[str, list[Any]]:
    """One query on an adbc connection, as per-alias chunk lists: int64 numpy arrays (zero-copy
    views of the Arrow buffers), or (codes, distinct values) for the ``text`` aliases.

    Raises:
        _Mismatch: a column is not int64 without NULLs (strings for ``text``): the driver
            infers types from the data, so such a result is left to the sqlite3 reader.
    """
    _, pa = _adbc_modules()  # type: ignore[misc]
    cur = con.cursor()
    try:
        cur.adbc_statement.set_options(**{"adbc.sqlite.query.batch_rows": str(ARROW_BATCH_ROWS)})
        cur.execute(sql)
        tbl = cur.fetch_arrow_table()
    finally:
        cur.close()
    out: dict[str, list[Any]] = {}
    for i, a in enumerate(aliases):
        chunks = [c for c in tbl.column(i).chunks if len(c)]
        if a in text:
            if any(not (pa.types.is_string(c.type) or pa.types.is_large_string(c.type)) for c in chunks):
                raise _Mismatch(a)
            out[a] = [_arrow_factor(c) for c in chunks]
        else:
            if any(c.type != pa.int64() or c.null_count for c in chunks):
                raise _Mismatch(a)
            out[a] = [c.to_numpy() for c in chunks]
    return out


def _arrow_factor(chunk: Any) -> tuple[np.ndarray, np.ndarray]:
    """(codes, distinct values) of one Arrow string array, hashed in Arrow (-1 codes for NULL)."""
    enc = chunk.dictionary_encode()
    idx = enc.indices
    codes = idx.fill_null(-1).to_numpy() if idx.null_count else idx.to_numpy()
    return codes, np.array(enc.dictionary.to_pylist(), dtype=object)


class _Factor:
    """A string column as int64 ``codes`` into distinct ``uniques`` (-1: NULL); the object
    array (:meth:`values`) is built once, every repeated value sharing one str object."""

    def __init__(self, codes: np.ndarray, uniques: np.ndarray) -> None:
        self.codes = codes
        self.uniques = uniques

    @classmethod
    def concat(cls, parts: list[tuple[np.ndarray, np.ndarray]]) -> _Factor:
        """Join per-chunk (codes, uniques) factorizations into one with shared uniques."""
        if not parts:
            return cls(np.array([], dtype=np.int64), np.array([], dtype=object))
        if len(parts) == 1:
            codes, uniques = parts[0]
            return cls(np.asarray(codes, dtype=np.int64), uniques)
        canon: dict[Any, int] = {}
        out = []
        for codes, uniques in parts:
            remap = np.array([canon.setdefault(u, len(canon)) for u in uniques.tolist()] + [-1], dtype=np.int64)
            out.append(remap[codes])  # code -1 picks the trailing -1
        return cls(np.concatenate(out), np.array(list(canon), dtype=object))

    def values(self) -> np.ndarray:
        """Object array of str (None for NULL)."""
        table = np.append(self.uniques, None)  # code -1 -> None
        return table[self.codes]


class _Strings:
    """``StringIds`` id -> string, looked up vectorized: ids sorted, with a dense id -> position
    table when the ids are compact (else a binary search)."""

    def __init__(self, ids: np.ndarray, values: np.ndarray) -> None:
        ok = ids >= 0
        ids = np.asarray(ids[ok], dtype=np.int64)
        order = np.argsort(ids, kind="stable")
        self.ids = ids[order]
        self.values = np.asarray(values[ok], dtype=object)[order]
        self._lut: np.ndarray | None = None
        top = int(self.ids[-1]) + 1 if len(self.ids) else 0
        if len(self.ids) and top <= 4 * len(self.ids) + 1_000_000:
            self._lut = np.full(top, -1, dtype=np.int64)
            self._lut[self.ids] = np.arange(len(self.ids), dtype=np.int64)

    @classmethod
    def empty(cls) -> _Strings:
        return cls(np.array([], dtype=np.int64), np.array([], dtype=object))

    def __len__(self) -> int:
        return len(self.ids)

    def index(self, ids: np.ndarray) -> np.ndarray:
        """Position in :attr:`values` of each of ``ids`` (-1 where unknown)."""
        if not len(self.ids):
            return np.full(len(ids), -1, dtype=np.int64)
        if self._lut is not None:
            ok = (ids >= 0) & (ids < len(self._lut))
            return np.where(ok, self._lut[np.where(ok, ids, 0)], -1)
        slot = np.minimum(np.searchsorted(self.ids, ids), len(self.ids) - 1)
        return np.where(self.ids[slot] == ids, slot, -1)

    def take(self, ids: np.ndarray) -> np.ndarray:
        """Strings of ``ids``: object array with None where an id is unknown."""
        return np.append(self.values, None)[self.index(ids)]

    def subset(self, ids: np.ndarray) -> _Strings:
        """The entries whose id occurs in ``ids``."""
        pos = self.index(ids)
        mark = np.zeros(len(self.ids), dtype=bool)
        mark[pos[pos >= 0]] = True
        return _Strings(self.ids[mark], self.values[mark])

    def map(self, fn: Callable[[str], Any]) -> _Strings:
        """Same ids, ``fn`` applied once to each value."""
        return _Strings(self.ids, np.array([fn(v) for v in self.values.tolist()], dtype=object))


def _const(n: int, value: Any) -> np.ndarray:
    """Object array of ``n`` times ``value`` (``np.full`` with a str is ~20x slower)."""
    out = np.empty(n, dtype=object)
    out[:] = value
    return out


def _lookup(ids: np.ndarray, strings: pd.Series) -> np.ndarray:
    """Map int keys to values through a Series, vectorized: object array with None where absent."""
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
        gpu = pd.concat(gpu_parts, ignore_index=True) if len(gpu_parts) > 1 else gpu_parts[0]
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
            "kind": _const(n, kind),
            "name": names,
            "device": d["device"],
            "stream": d["stream"],
            "start_ns": d["start"],
            "end_ns": d["end"],
            "correlation": _correlation(d, composite),
            "external_id": np.full(n, -1, dtype=np.int64),
            "bytes": nbytes if nbytes is not None else np.full(n, -1, dtype=np.int64),
            "pid": np.where(d["gpid"] >= 0, (d["gpid"] >> 24) & _MASK24, -1) if composite else np.full(n, -1, dtype=np.int64),
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
    names = db.strings(d["nameId"]).take(d["nameId"])
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


def _overhead(db: _Db, notes: _Notes) -> pd.DataFrame | None:
    """``PROFILER_OVERHEAD`` (nsys's own cost: CUPTI buffer flushes, instrumentation, ...)
    -> the ``overhead`` frame, like Kineto's ``"cat": "overhead"`` events."""
    if not db.has(OVERHEAD_TABLE):
        return None
    d = db.read(OVERHEAD_TABLE, {**_TIME_COLS, "nameId": (("nameId",), -1), "gtid": (("globalTid",), 0)}, _ACTIVITY_WHERE)
    names = db.strings(d["nameId"]).take(d["nameId"])
    missing = np.equal(names, None)
    notes.unresolved += int(missing.sum())
    names[missing] = ""
    gtid = d["gtid"]
    df = _drop_negative(_df({"name": names, "start_ns": d["start"], "end_ns": d["end"],
                             "pid": (gtid >> 24) & _MASK24, "tid": gtid & _MASK24}), notes)
    return df.sort_values("start_ns", kind="stable").reset_index(drop=True)


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
        # Clean and classify each distinct name once, then map by position.
        clean = db.strings(d["nameId"]).map(lambda v: _VERSION_SUFFIX.sub("", v))
        names = clean.take(d["nameId"])
        missing = np.equal(names, None)
        notes.unresolved += int(missing.sum())
        names[missing] = ""
        kind = clean.map(api_kind).take(d["nameId"])
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
        # Only the API rows sharing a sync record's correlation (in row order: first one wins).
        rc = runtime["correlation"]
        sel = np.nonzero((rc >= 0) & np.isin(rc, corr[corr >= 0]))[0]
        rt = _df({"correlation": rc[sel], "name": runtime["name"][sel]})
        rt = rt.drop_duplicates("correlation")
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
        "gtid": (("globalTid",), 0),
    }
    cond = where + (" AND " if where else "") + '"start" IS NOT NULL'
    d = db.read(table, cols, cond, text=("text",))
    start, end, gtid = d["start"], d["end"], d["gtid"]
    text: _Factor = d["text"]
    # Names stay codes into a small table of distinct strings until the end: rows whose text is
    # NULL or "" take their textId's StringIds value ("" and counted when unresolved).
    names = np.append(text.uniques, None)  # code -1 (NULL text) -> last
    blank = np.array([u is None or u == "" for u in text.uniques.tolist()] + [True], dtype=bool)
    need = blank[text.codes]
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
    codes = text.codes
    if need.any():
        ids = _nvtx_text_ids(db, table, cond, need)
        if not keep.all():
            ids = ids[keep[need]]
    if not keep.all():
        idx = np.nonzero(keep)[0]
        start, end, gtid, codes, need = start[idx], end[idx], gtid[idx], codes[idx], need[idx]
    if need.any():
        strings = db.strings(ids)
        pos = strings.index(ids)
        missing = pos < 0
        notes.unresolved += int(missing.sum())
        base = len(names)
        names = np.concatenate([names, strings.values, np.array([""], dtype=object)])
        codes = codes.copy()
        codes[need] = np.where(missing, base + len(strings.values), base + pos)
    if len(start) > 1 and not (start[1:] >= start[:-1]).all():
        order = np.argsort(start, kind="stable")
        start, end, gtid, codes = start[order], end[order], gtid[order], codes[order]
    n = len(start)
    # categorical straight from the codes: millions of ranges share a few hundred names
    name_codes, distinct = factorize(np.array(["" if v is None else v for v in names.tolist()], dtype=object))
    trace.annotations = frame(
        ANNOTATION_COLUMNS,
        {
            "name": pd.Categorical.from_codes(name_codes[codes], dtype=pd.CategoricalDtype(pd.Index(distinct, dtype=object))),
            "scope": pd.Categorical.from_codes(np.zeros(n, dtype=np.int8), dtype=pd.CategoricalDtype(pd.Index(["cpu"], dtype=object))),
            "device": np.full(n, -1, dtype=np.int64),
            "start_ns": start,
            "end_ns": end,
            "pid": (gtid >> 24) & _MASK24,
            "tid": gtid & _MASK24,
        },
    )


def _nvtx_text_ids(db: _Db, table: str, cond: str, need: np.ndarray) -> np.ndarray:
    """``textId`` of the NVTX rows flagged in ``need`` (those without text), in row order.

    Read only for the rows whose text is NULL or "" (one more pass over the table, one column),
    rather than as a fifth column of every row: most ranges carry their text.
    """
    count = int(need.sum())
    if not db.has(table, "textId"):
        return np.full(count, -1, dtype=np.int64)
    col: _Cols = {"textId": (("textId",), -1)}
    blank = f"({_q('text')} IS NULL OR {_q('text')} = '')" if db.has(table, "text") else ""
    ids = db.read(table, col, cond + (f" AND {blank}" if blank else ""))["textId"]
    if len(ids) != count:  # SQL and Python disagree on what is blank: take every row's textId
        ids = db.read(table, col, cond)["textId"][need]
    return ids


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
