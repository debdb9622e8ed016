"""Analyse many traces at once (one per rank of a distributed engine) and compare the ranks.

Public API:

- :func:`discover` lists the trace files of a directory, in rank order.
- :func:`analyze_one` analyses one trace into its JSON report (never raises for a bad trace).
- :func:`analyze_many` runs :func:`analyze_one` over many traces serially, on local
  processes (``concurrent.futures.ProcessPoolExecutor``) or on a Dask cluster, and merges
  the reports into one fleet result (per-rank summary rows, stragglers, errors; ``failed``
  counts the traces that could not be analysed).
- :func:`analyze_merged` gives the same fleet result for ONE file that holds several ranks
  (SGLang's ProfileMerger output: quality code ``ranks_merged``), rank by rank.
- :func:`find_stragglers` is the straggler rule on plain numbers.

:func:`diagnose.report.fleet.render_fleet` prints the fleet result (beside the run renderer).

Only plain JSON-able report dicts travel between processes, never ``Analysis`` objects (their
activity DataFrame is large). With Dask, every worker must be able to read the trace paths
(shared file system) and import ``diagnose``.
"""
from __future__ import annotations

import dataclasses
import gzip
import json
import os
import re
import statistics
import time
from collections import Counter
from typing import Any, Sequence

from diagnose.errors import DiagnoseError, install_hint

FLEET_SCHEMA_VERSION = 1

#: Straggler rule parameters (see :func:`find_stragglers`).
STRAGGLER_MIN_EXCESS = 0.10
STRAGGLER_MAD_K = 3.0
STRAGGLER_MIN_RANKS = 3

#: How long to wait for a Dask scheduler given by address.
DASK_CONNECT_TIMEOUT = "10s"

EXECUTORS = ("auto", "serial", "process", "dask")

_TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite")
_NSYS_REP_SUFFIXES = (".nsys-rep", ".qdrep")
_RANK_IN_NAME = re.compile(r"(?:^|[^a-z0-9])rank[-_]?(\d+)(?!\d)", re.IGNORECASE)
_RANK_IN_HEAD = re.compile(rb'"distributedInfo"\s*:\s*\{.{0,2000}?"rank"\s*:\s*(\d+)', re.DOTALL)
_HEAD_BYTES = 64 * 1024


# ---------------------------------------------------------------- discovery


def rank_from_name(path: str) -> int | None:
    """Rank written in a file name (``rank-3``, ``rank3``, ``rank_3``, any case), else None."""
    m = _RANK_IN_NAME.search(os.path.basename(path))
    return int(m.group(1)) if m else None


def _head(path: str) -> tuple[bytes, bool]:
    """First 64 KiB of the (decompressed) file and whether that is the whole file."""
    try:
        if path.endswith(".gz"):
            with gzip.open(path, "rb") as f:
                buf = f.read(_HEAD_BYTES + 1)
        else:
            with open(path, "rb") as f:
                buf = f.read(_HEAD_BYTES + 1)
    except (OSError, EOFError, gzip.BadGzipFile):
        return b"", False
    return buf[:_HEAD_BYTES], len(buf) <= _HEAD_BYTES


def rank_from_head(path: str) -> int | None:
    """Kineto ``distributedInfo.rank`` when it is written in the first 64 KiB (where Kineto
    puts it), else None. Cheap: the rest of the file is not read."""
    if not path.endswith((".json", ".json.gz")):
        return None
    buf, _ = _head(path)
    m = _RANK_IN_HEAD.search(buf)
    return int(m.group(1)) if m else None


def _is_sidecar(path: str) -> bool:
    """A small, valid JSON document that is neither an object with ``traceEvents`` nor a list of
    events (e.g. vLLM's execution_details.json) is a sidecar, not a trace. Corrupt files are kept, so that they are reported as errors."""
    if not path.endswith((".json", ".json.gz")):
        return False
    buf, whole = _head(path)
    if not whole or b"traceEvents" in buf:
        return False
    try:
        doc = json.loads(buf)
    except (ValueError, RecursionError):  # not JSON, or nested too deeply: the loader says why
        return False
    if isinstance(doc, list):  # Chrome "JSON array" traces are lists of events (with "ph")
        return bool(doc) and not any(isinstance(e, dict) and "ph" in e for e in doc)
    return isinstance(doc, dict)


def discover(trace_dir: str) -> list[str]:
    """Trace files directly in ``trace_dir`` (one per rank), sorted by rank: the first part
    of :func:`discover_with_skipped`, which also says what was left out and why.

    Raises:
        DiagnoseError: the directory is missing, unreadable, or holds no trace.
    """
    return discover_with_skipped(trace_dir)[0]


def discover_with_skipped(trace_dir: str) -> tuple[list[str], list[tuple[str, str]]]:
    """Trace files directly in ``trace_dir`` (one per rank), sorted by rank, and the files
    left out with the reason.

    Files: ``*.json``, ``*.json.gz`` (``*.pt.trace.json(.gz)`` included), ``*.sqlite``, and
    ``*.nsys-rep``/``*.qdrep`` that have no ``.sqlite`` export of the same name beside them.
    Left out and listed: small JSON documents without ``traceEvents`` (sidecars such as vLLM's
    execution_details.json), ``.nsys-rep`` files whose export is read instead, tar archives
    (give them with ``--trace``), sub-directories and files of any other name. Hidden files
    are left out without a word.

    Order: the rank in the file name (``rank-N``, ``rankN``, ``rank_N``) first, else the
    Kineto ``distributedInfo.rank`` found in the file's first 64 KiB; ranked files come first
    in rank order (ties by name), then the others by name.

    Returns:
        (trace paths, [(path, why left out)] in name order).

    Raises:
        DiagnoseError: the directory is missing, unreadable, or holds no trace.
    """
    if not os.path.exists(trace_dir):
        raise DiagnoseError(f"{trace_dir}: no such directory")
    if not os.path.isdir(trace_dir):
        raise DiagnoseError(f"{trace_dir}: not a directory")
    try:
        names = sorted(os.listdir(trace_dir))
    except OSError as e:
        raise DiagnoseError(f"{trace_dir}: cannot list ({e.strerror})") from None
    from diagnose.archive import is_archive

    skipped: list[tuple[str, str]] = []
    files = []
    for n in names:
        if n.startswith("."):
            continue
        if os.path.isfile(os.path.join(trace_dir, n)):
            files.append(n)
        elif os.path.isdir(os.path.join(trace_dir, n)):
            skipped.append((os.path.join(trace_dir, n), "a directory (only files directly in --trace-dir are read)"))
    stems = {n[: -len(".sqlite")] for n in files if n.endswith(".sqlite")}
    found: list[str] = []
    for n in files:
        p = os.path.join(trace_dir, n)
        if n.endswith(_TRACE_SUFFIXES):
            if not _is_sidecar(p):
                found.append(p)
            else:
                skipped.append((p, "JSON without traceEvents: not a trace (a sidecar)"))
        elif n.endswith(_NSYS_REP_SUFFIXES):
            if n.rsplit(".", 1)[0] not in stems:
                found.append(p)
            else:
                skipped.append((p, "its .sqlite export beside it is read instead"))
        elif is_archive(n):
            skipped.append((p, "a tar archive: give it with --trace to read its traces"))
        else:
            skipped.append((p, "not a trace file name (*.json, *.json.gz, *.sqlite, *.nsys-rep)"))
    skipped.sort()
    if not found:
        left = "; ".join(f"{os.path.basename(q)} ({why})" for q, why in skipped[:5])
        raise DiagnoseError(f"{trace_dir}: no trace files (*.json, *.json.gz, *.sqlite, *.nsys-rep)"
                            + (f"; left out: {left}" if left else ""))

    return sort_by_rank(found), skipped


def sort_by_rank(paths: Sequence[str]) -> list[str]:
    """Trace files in rank order: the rank in the file name (``rank-N``, ``rankN``,
    ``rank_N``), else the Kineto ``distributedInfo.rank`` in the file's first 64 KiB; ranked
    files first (ties by name), then the others by name."""
    def key(p: str) -> tuple:
        r = rank_from_name(p)
        if r is None:
            r = rank_from_head(p)
        return (0, r, os.path.basename(p)) if r is not None else (1, 0, os.path.basename(p))

    return sorted(paths, key=key)


def skipped_notes(skipped: Sequence[tuple[str, str]]) -> list[str]:
    """Fleet notes for files left out of a run: one line naming each (at most 20, then a count)."""
    out = [f"skipped {p}: {why}" for p, why in list(skipped)[:20]]
    if len(skipped) > 20:
        out.append(f"skipped {len(skipped) - 20} more file(s)")
    return out


def relabel(result: dict[str, Any], labels: dict[str, str]) -> dict[str, Any]:
    """Replace the paths of a fleet result (rows, reports, errors, stragglers) by the labels
    they should be shown under (a member of an archive instead of its temporary copy)."""
    if not labels:
        return result

    def fix(p: Any) -> Any:
        return labels.get(p, p) if isinstance(p, str) else p

    for row in result.get("ranks") or []:
        row["path"] = fix(row.get("path"))
    for s in result.get("stragglers") or []:
        s["path"] = fix(s.get("path"))
    for e in result.get("errors") or []:
        e["path"] = fix(e.get("path"))
        if isinstance(e.get("error"), str):
            for tmp, label in labels.items():
                e["error"] = e["error"].replace(tmp, label)
    for r in result.get("reports") or []:
        src = r.get("source")
        if isinstance(src, dict):
            src["path"] = fix(src.get("path"))
    return result


# ---------------------------------------------------------------- one trace


def _one_line(e: BaseException) -> str:
    msg = " ".join(str(e).split()) or type(e).__name__
    if not isinstance(e, DiagnoseError):
        msg = f"{type(e).__name__}: {msg}"
    return msg if len(msg) <= 300 else msg[:297] + "..."


def _trace_rank(metadata: dict[str, Any]) -> tuple[int | None, int | None]:
    di = metadata.get("distributedInfo") if isinstance(metadata, dict) else None
    if not isinstance(di, dict):
        return None, None

    def as_int(v: Any) -> int | None:
        if isinstance(v, bool):
            return None
        if isinstance(v, int):
            return v
        if isinstance(v, str) and v.strip().isdigit():
            return int(v)
        return None

    return as_int(di.get("rank")), as_int(di.get("world_size"))


def analyze_one(path: str, options: Any = None, lenient: bool = False, ruleset: Any = None) -> dict[str, Any]:
    """Analyse one trace and return its JSON report (``Analysis.to_dict()`` with the symptom
    verdicts), plus ``rank``/``world_size`` (Kineto ``distributedInfo``, else the rank in the
    file name, else None) and ``rank_source`` ("trace" | "filename" | None).

    Never raises for a bad trace: a failure gives ``{"source": {"path": path}, "rank": ...,
    "error": "one line"}`` so that one bad rank does not stop a fleet run.
    """
    from diagnose.options import AnalysisOptions
    from diagnose.pipeline import attach_verdicts, run_analysis

    name_rank = rank_from_name(path)
    try:
        # one process per trace: the fleet is already parallel across traces
        opts = options or AnalysisOptions()
        if lenient and not opts.lenient:
            opts = opts.with_(lenient=True)
        analysis = run_analysis(path, opts, workers=1)
        attach_verdicts(analysis, ruleset)
        report = analysis.to_dict()
        rank, world = _trace_rank(analysis.metadata)
    except Exception as e:  # noqa: BLE001 - one bad rank must not kill the fleet run
        return {"source": {"path": path}, "rank": name_rank,
                "rank_source": "filename" if name_rank is not None else None, "error": _one_line(e)}
    if rank is not None:
        report["rank"], report["rank_source"] = rank, "trace"
    else:
        report["rank"], report["rank_source"] = name_rank, ("filename" if name_rank is not None else None)
    report["world_size"] = world
    return report


# ---------------------------------------------------------------- summary rows


def summarize(report: dict[str, Any]) -> dict[str, Any]:
    """One summary row for a rank's report, for the device the rules read
    (:func:`diagnose.findings.select_device`: the most GPU busy time). Phase numbers come from
    that device's decode phase when it has one, else from its 'all' row (named in ``phase``)."""
    from diagnose.findings import as_report, device_rows
    from diagnose.pipeline import device_headlines, top_symptoms_text

    rep = as_report(report)
    rows = device_rows(rep)
    dec, allp = rows.get("decode"), rows.get("all")
    ph = dec or allp
    dev_id = ph.device if ph is not None else None
    named = [d for d in rep.devices if d.id == dev_id] or (rep.devices if len(rep.devices) == 1 else [])
    device = (named[0].name or "") if named else ""
    syms = rep.symptoms or []
    return {
        "rank": report.get("rank"),
        "rank_source": report.get("rank_source"),
        "world_size": report.get("world_size"),
        "path": rep.source.path,
        "device": device,
        "phase": ph.name if ph is not None else None,
        "steps": ph.step_count if ph is not None else None,
        "tpot_p50_ms": rep.latency.tpot_ms.p50_ms,
        "tpot_p99_ms": rep.latency.tpot_ms.p99_ms,
        "launch_gap_share": ph.launch_gap_share if ph is not None else None,
        "gpu_idle_share": ph.gpu_idle_share if ph is not None else None,
        "gpu_busy_ms": ph.gpu_busy_ms if ph is not None else None,
        "wall_ms": ph.wall_ms if ph is not None else None,
        "all_wall_ms": allp.wall_ms if allp is not None else None,
        "mbu": ph.mbu if ph is not None else None,
        "top_symptom": top_symptoms_text(report),  # each device's, when the rank's trace holds several
        "device_headlines": device_headlines(report),
        "top_symptom_severity": syms[0].severity if syms else None,
        "partial": bool(rep.partial),
        "straggler": False,
    }


# ---------------------------------------------------------------- stragglers


def find_stragglers(values: Sequence[float | None], min_excess: float = STRAGGLER_MIN_EXCESS,
                    mad_k: float = STRAGGLER_MAD_K, min_ranks: int = STRAGGLER_MIN_RANKS) -> tuple[list[int], dict[str, Any]]:
    """Indices of the straggler values (higher = slower) and the statistics used.

    Rule: with ``m`` the median of the known values and ``MAD`` the median of ``|v - m|``,
    ``v`` is a straggler when ``v > m * (1 + min_excess)`` AND ``v - m > mad_k * MAD``, i.e.
    more than 10 % slower than the median rank and more than 3 MADs above it (defaults).
    The 10 % floor keeps noise out when the ranks are near-identical (MAD ~ 0); the MAD term
    keeps a broad, uneven spread from being called stragglers. Only the slow side is flagged.
    None values are ignored; with fewer than ``min_ranks`` known values nothing is flagged.
    """
    known = [(i, float(v)) for i, v in enumerate(values) if v is not None]
    stats: dict[str, Any] = {"compared": len(known), "median": None, "mad": None,
                             "min_excess": min_excess, "mad_k": mad_k}
    if len(known) < min_ranks:
        stats["note"] = f"straggler check needs at least {min_ranks} ranks with the metric, got {len(known)}"
        return [], stats
    xs = [v for _, v in known]
    med = statistics.median(xs)
    mad = statistics.median([abs(v - med) for v in xs])
    stats["median"], stats["mad"] = med, mad
    out = [i for i, v in known if v > med * (1.0 + min_excess) and v - med > mad_k * mad]
    return out, stats


STRAGGLER_DEFINITION = (
    "a rank is a straggler when its metric (decode TPOT p50 when every analysed rank has decode "
    "steps, else the 'all' phase wall time) is more than 10 % above the median across ranks AND "
    "more than 3 MAD (median absolute deviation) above it; at least 3 ranks needed"
)


def _straggler_metric(rows: list[dict[str, Any]]) -> str:
    if rows and all(r.get("tpot_p50_ms") is not None for r in rows):
        return "tpot_p50_ms"
    return "all_wall_ms"


# ---------------------------------------------------------------- executors


def _resolve_executor(executor: str, n: int, scheduler: Any) -> str:
    if executor not in EXECUTORS:
        raise DiagnoseError(f"unknown executor {executor!r}: choose one of {', '.join(EXECUTORS)}")
    if executor != "auto":
        return executor
    if scheduler is not None:
        return "dask"
    return "process" if n > 1 and (os.cpu_count() or 1) > 1 else "serial"


def _run_serial(paths: list[str], options: Any, lenient: bool, ruleset: Any = None) -> list[dict[str, Any]]:
    return [analyze_one(p, options, lenient, ruleset) for p in paths]


def _failed(path: str, e: BaseException) -> dict[str, Any]:
    r = rank_from_name(path)
    return {"source": {"path": path}, "rank": r, "rank_source": "filename" if r is not None else None,
            "error": _one_line(e)}


def _ignore_sigint() -> None:
    """Pool workers leave Ctrl-C to the parent, which stops the pool (no worker tracebacks)."""
    import signal

    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _run_process(paths: list[str], options: Any, lenient: bool, workers: int | None, ruleset: Any = None) -> tuple[list[dict[str, Any]], int]:
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    n = max(1, min(workers or os.cpu_count() or 1, len(paths)))
    # spawn: safe whatever threads the caller runs (fork with threads can deadlock).
    with ProcessPoolExecutor(max_workers=n, mp_context=multiprocessing.get_context("spawn"),
                             initializer=_ignore_sigint) as pool:
        futs = [pool.submit(analyze_one, p, options, lenient, ruleset) for p in paths]
        out = []
        for p, f in zip(paths, futs):
            try:
                out.append(f.result())
            except Exception as e:  # noqa: BLE001 - a worker died (BrokenProcessPool, OOM kill)
                out.append(_failed(p, e))
    return out, n


def _import_distributed():
    try:
        import distributed  # noqa: F401
        from distributed import Client
    except ImportError:
        raise DiagnoseError("the Dask executor needs dask.distributed, which is not installed: " + install_hint("dask")) from None
    return Client


def _run_dask(paths: list[str], options: Any, lenient: bool, scheduler: Any, workers: int | None, ruleset: Any = None) -> tuple[list[dict[str, Any]], int | None]:
    Client = _import_distributed()
    own = True
    try:
        if isinstance(scheduler, Client):
            client, own = scheduler, False
        elif scheduler is None:
            client = Client(n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None)
        elif isinstance(scheduler, str):
            client = Client(scheduler, timeout=DASK_CONNECT_TIMEOUT)
        else:  # a cluster object (LocalCluster, SLURMCluster ...)
            client = Client(scheduler)
    except DiagnoseError:
        raise
    except Exception as e:  # noqa: BLE001
        raise DiagnoseError(f"cannot connect to the Dask scheduler {scheduler!r}: {_one_line(e)}") from None
    try:
        keys = [f"diagnose-{i}-{os.path.basename(p)}" for i, p in enumerate(paths)]
        futs = client.map(analyze_one, paths, options=options, lenient=lenient, ruleset=ruleset, key=keys, pure=False)
        out = []
        for p, f in zip(paths, futs):
            try:
                out.append(f.result())
            except Exception as e:  # noqa: BLE001 - worker lost, KilledWorker, cancelled
                out.append(_failed(p, e))
        try:
            n = len(client.scheduler_info().get("workers", {}))
        except Exception:  # noqa: BLE001
            n = None
        return out, n
    finally:
        if own:
            cluster = getattr(client, "cluster", None) if scheduler is None else None
            client.close()
            if cluster is not None:
                cluster.close()


# ---------------------------------------------------------------- fleet


def _notes(rows: list[dict[str, Any]], n_traces: int) -> list[str]:
    notes = []
    for r in rows:
        nr = rank_from_name(r["path"] or "")
        if r["rank_source"] == "trace" and nr is not None and nr != r["rank"]:
            notes.append(f"{os.path.basename(r['path'])}: file name says rank {nr}, trace says rank {r['rank']} (the trace's rank is used)")
    dup = sorted(k for k, c in Counter(r["rank"] for r in rows if r["rank"] is not None).items() if c > 1)
    if dup:
        notes.append(f"rank(s) {', '.join(map(str, dup))} appear in more than one trace: are these traces from one run?")
    worlds = {r["world_size"] for r in rows if r["world_size"] is not None}
    if len(worlds) > 1:
        notes.append(f"traces disagree on world_size: {sorted(worlds)}")
    elif worlds:
        (w,) = worlds
        if n_traces < w:
            notes.append(f"world_size is {w} but {n_traces} trace(s) were given: ranks are missing")
    return notes


def analyze_many(paths: str | Sequence[str], options: Any = None, executor: str = "auto",
                 scheduler: Any = None, workers: int | None = None, lenient: bool = False, ruleset: Any = None,
                 skipped: Sequence[tuple[str, str]] = ()) -> dict[str, Any]:
    """Analyse every trace and merge the reports into one fleet result.

    Args:
        paths: trace files (their order is kept), or a directory (see :func:`discover`).
        options: :class:`diagnose.options.AnalysisOptions` for every trace.
        ruleset: :class:`diagnose.engine.RuleSet` for the verdicts (None: the packaged rules).
        executor: "serial"; "process" (local ``ProcessPoolExecutor``, spawn start method);
            "dask" (one task per trace on a ``dask.distributed`` cluster); "auto" = "dask" when
            ``scheduler`` is given, else "process" when there is more than one trace and more
            than one CPU, else "serial".
        scheduler: Dask only: a scheduler address ("tcp://host:8786"), a cluster object, or a
            ``distributed.Client`` (used, not closed). None: a local Dask cluster is started.
        workers: process pool size (default: CPU count, at most one per trace), or the number of
            local Dask workers when ``scheduler`` is None.
        lenient: Kineto only: repair numbers written with a decimal comma.
        skipped: (path, why) of files left out before the call (a directory's sidecars, an
            archive's other members); a directory given as ``paths`` adds its own.

    Returns:
        ``{"schema_version", "executor", "workers", "elapsed_s", "ranks": [summary rows],
        "stragglers": [...], "straggler_rule": {...}, "notes": [...], "errors": [...],
        "skipped": [{"path", "why"}], "reports": [full per-rank reports]}``; each skipped file
        is also a note. ``ranks`` and ``reports`` hold the traces that
        were analysed, in the same order; ``errors`` holds ``{rank, path, error}`` for the others.
        Straggler rule: see :func:`find_stragglers` and ``STRAGGLER_DEFINITION``.

    Raises:
        DiagnoseError: no traces, unknown executor, Dask missing or unreachable.
    """
    skipped = list(skipped)
    if isinstance(paths, (str, os.PathLike)):
        p = os.fspath(paths)
        if os.path.isdir(p):
            paths, more = discover_with_skipped(p)
            skipped += more
        else:
            paths = [p]
    paths = [os.fspath(p) for p in paths]
    if not paths:
        raise DiagnoseError("no trace files to analyse")
    if options is None:
        from diagnose.options import AnalysisOptions

        options = AnalysisOptions()
    kind = _resolve_executor(executor, len(paths), scheduler)
    t0 = time.perf_counter()
    if kind == "serial":
        results, n_workers = _run_serial(paths, options, lenient, ruleset), 1
    elif kind == "process":
        results, n_workers = _run_process(paths, options, lenient, workers, ruleset)
    else:
        results, n_workers = _run_dask(paths, options, lenient, scheduler, workers, ruleset)
    elapsed = time.perf_counter() - t0
    result = _fleet_result(results, kind, n_workers, elapsed, len(paths))
    result["skipped"] = [{"path": p, "why": why} for p, why in skipped]
    result["notes"] += skipped_notes(skipped)
    return result


def _fleet_result(results: list[dict[str, Any]], kind: str, n_workers: int | None, elapsed: float,
                  n_traces: int) -> dict[str, Any]:
    """The fleet result of per-rank reports (failed ones hold ``error``); see :func:`analyze_many`."""
    reports = [r for r in results if "error" not in r]
    errors = [{"rank": r.get("rank"), "path": r["source"]["path"], "error": r["error"]} for r in results if "error" in r]
    rows = [summarize(r) for r in reports]
    metric = _straggler_metric(rows)
    idx, stats = find_stragglers([r[metric] for r in rows])
    stragglers = []
    for i in idx:
        row = rows[i]
        row["straggler"] = True
        v = row[metric]
        stragglers.append({"rank": row["rank"], "path": row["path"], "metric": metric, "value": v,
                           "median": stats["median"],
                           "excess_share": round(v / stats["median"] - 1.0, 6) if stats["median"] else None})
    return {
        "schema_version": FLEET_SCHEMA_VERSION,
        "executor": kind,
        "workers": n_workers,
        "elapsed_s": round(elapsed, 3),
        "ranks": rows,
        "stragglers": stragglers,
        "straggler_rule": {"metric": metric, **stats, "definition": STRAGGLER_DEFINITION},
        "notes": _notes(rows, n_traces),
        "errors": errors,
        "failed": len(errors),
        "skipped": [],
        "reports": reports,
    }


def analyze_merged(trace: Any, options: Any = None, ruleset: Any = None) -> dict[str, Any]:
    """Analyse a file holding several ranks (SGLang's ProfileMerger output, quality code
    ``ranks_merged``) rank by rank, into the fleet result of :func:`analyze_many`: one row and
    one report per rank, as if each rank had been its own file in ``--trace-dir``.

    Args:
        trace: a loaded :class:`~diagnose.trace.Trace` (not sliced), or a path to load.
        options: :class:`diagnose.options.AnalysisOptions`; ``window`` and ``device`` apply to
            each rank on its own (as to each file of a ``--trace-dir`` run).
        ruleset: :class:`diagnose.engine.RuleSet` for the verdicts (None: the packaged rules).

    Returns:
        The :func:`analyze_many` result (``executor`` "serial"); each report and row also has
        ``rank_label`` / ``label`` (e.g. "TP01-DP00-PP00-EP00"); ``rank`` is the rank's
        position in label order and ``rank_source`` is "merged". A trace that is not merged
        gives one row. A rank that cannot be analysed is listed in ``errors``.

    Raises:
        DiagnoseError: the path cannot be loaded.
    """
    from diagnose.analyzers import analyze
    from diagnose.options import AnalysisOptions
    from diagnose.pipeline import attach_verdicts
    from diagnose.trace import load_trace, split_ranks
    from diagnose.trace.slice import parse_window, slice_trace

    opts = options or AnalysisOptions()
    if isinstance(trace, (str, os.PathLike)):
        trace = load_trace(os.fspath(trace), lenient=bool(getattr(opts, "lenient", False)))
    path = trace.source_path
    window_ms = parse_window(getattr(opts, "window", None))
    device = getattr(opts, "device", None)
    t0 = time.perf_counter()
    parts = split_ranks(trace)
    results: list[dict[str, Any]] = []
    for i, (label, one) in enumerate(parts):
        try:
            if window_ms is not None or device is not None:
                one = dataclasses.replace(one, quality=list(one.quality))  # the caller's trace stays whole
                slice_trace(one, window_ms, device)
            analysis = analyze(one, opts)
            attach_verdicts(analysis, ruleset, device)
            report = analysis.to_dict()
        except Exception as e:  # noqa: BLE001 - one bad rank must not stop the others
            report = {"source": {"path": path}, "error": _one_line(e)}
        if label:
            report.update(rank=i, rank_source="merged", rank_label=label, world_size=len(parts))
        else:
            rank, world = _trace_rank(trace.metadata)
            report.update(rank=rank, rank_source="trace" if rank is not None else None, world_size=world)
        results.append(report)
    out = _fleet_result(results, "serial", 1, time.perf_counter() - t0, len(parts))
    for row, report in zip(out["ranks"], out["reports"]):
        row["label"] = report.get("rank_label")
    for err, report in zip(out["errors"], [r for r in results if "error" in r]):
        err["label"] = report.get("rank_label")
    return out
