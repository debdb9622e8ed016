"""Reading an Nsight Systems SQLite export: the read-only connection, the two bulk readers
(ADBC/Arrow and sqlite3) and ``StringIds`` lookups (a split of :mod:`diagnose.trace.nsys`,
whose docstring describes what is read and how).
"""
from __future__ import annotations

import os
import sqlite3
import sys
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable

import numpy as np
import pandas as pd

from diagnose.errors import TraceFormatError


_MASK24 = 0xFFFFFF


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
