"""Nsight Systems export tables -> the normalized trace frames: kernels, CUDA graphs, copies,
fills, runtime/driver calls, synchronizations, NVTX ranges, profiler overhead (a split of
:mod:`diagnose.trace.nsys`, whose docstring describes what is read).
"""
from __future__ import annotations

import re
from typing import Any, Callable

import numpy as np
import pandas as pd
from pandas.api.types import union_categoricals

from diagnose.trace.apis import api_kind
from diagnose.trace.model import ANNOTATION_COLUMNS, RUNTIME_COLUMNS, Trace, categorical, factorize, frame
from diagnose.trace.nsys_db import _MASK24, _NULL_END, _Cols, _Db, _Factor, _q, _Strings


KERNEL_TABLE = "CUPTI_ACTIVITY_KIND_KERNEL"


MEMCPY_TABLE = "CUPTI_ACTIVITY_KIND_MEMCPY"


MEMSET_TABLE = "CUPTI_ACTIVITY_KIND_MEMSET"


GRAPH_TABLE = "CUPTI_ACTIVITY_KIND_GRAPH_TRACE"


RUNTIME_TABLE = "CUPTI_ACTIVITY_KIND_RUNTIME"


DRIVER_TABLE = "CUPTI_ACTIVITY_KIND_DRIVER"


OSRT_TABLE = "OSRT_API"  # OS runtime calls (nsys --trace osrt): host events, never launches


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


def _combo_names(keys: np.ndarray, build: Callable[[int], str]) -> pd.Categorical:
    """Name rows by a small integer key: ``build(key)`` runs once per distinct key."""
    if len(keys) == 0:
        return categorical(np.zeros(0, np.int64), np.array([], dtype=object))
    uniq, inv = np.unique(keys, return_inverse=True)
    labels = np.array([build(int(k)) for k in uniq.tolist()], dtype=object)
    return categorical(inv.reshape(-1), labels)


def _names(strings: _Strings, ids: np.ndarray, notes: _Notes) -> pd.Categorical:
    """The strings of ``ids`` as a categorical, from their positions in ``strings`` (no string
    is hashed per row); "" for an id ``StringIds`` lacks, counted as unresolved."""
    pos = strings.index(ids)
    missing = pos < 0
    notes.unresolved += int(missing.sum())
    return categorical(np.where(missing, len(strings.values), pos), np.append(strings.values, ""))


def _df(cols: dict[str, np.ndarray]) -> pd.DataFrame:
    """DataFrame keeping object arrays as object dtype (pandas 3 would infer ``str``)."""
    return pd.DataFrame(
        {c: pd.Series(v, dtype=object) if v.dtype == object else v for c, v in cols.items()}
    )  # a categorical (names) stays one


class _Notes:
    """Counters turned into quality notes at the end of a load."""

    def __init__(self) -> None:
        self.unresolved = 0
        self.negative = 0


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
    return _gpu_frame(d, "kernel", _names(db.strings(d["nameId"]), d["nameId"], notes), composite)


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
    names = _names(db.strings(d["nameId"]), d["nameId"], notes)
    gtid = d["gtid"]
    df = _drop_negative(_df({"name": names, "start_ns": d["start"], "end_ns": d["end"],
                             "pid": (gtid >> 24) & _MASK24, "tid": gtid & _MASK24}), notes)
    return df.sort_values("start_ns", kind="stable").reset_index(drop=True)


def _runtime(db: _Db, notes: _Notes) -> dict[str, np.ndarray]:
    """Runtime + driver API rows as column arrays (RUNTIME_COLUMNS), unsorted."""
    parts: list[dict[str, np.ndarray]] = []
    for table in (RUNTIME_TABLE, DRIVER_TABLE, OSRT_TABLE):
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
        if table == OSRT_TABLE:  # OS calls: never a launch (their correlation ids are another space)
            d["correlation"] = np.full(len(d["start"]), -1, dtype=np.int64)
        # Clean and classify each distinct name once, then map by position.
        clean = db.strings(d["nameId"]).map(lambda v: _VERSION_SUFFIX.sub("", v))
        names = _names(clean, d["nameId"], notes)
        if table == OSRT_TABLE:
            kind = np.full(len(d["start"]), "os", dtype=object)
        else:
            kind = clean.map(api_kind).take(d["nameId"])
            kind[np.equal(kind, None)] = "other"
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
        return {c: np.array([], dtype=np.int64 if t == "int64" else object) for c, t in RUNTIME_COLUMNS.items()}
    return {c: (union_categoricals([p[c] for p in parts]) if len(parts) > 1 else parts[0][c]) if c == "name"
            else np.concatenate([p[c] for p in parts]) for c in RUNTIME_COLUMNS}


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
    names = np.asarray(_combo_names(d["syncType"], lambda k: _SYNC_NAME.get(k, "Unknown Sync")), dtype=object)
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
            "correlation": corr if len(corr) == len(names) else np.full(len(names), -1, dtype=np.int64),
            "wait_stream": np.full(len(names), -1, dtype=np.int64),  # not exported
            "wait_record_correlation": np.full(len(names), -1, dtype=np.int64),
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
