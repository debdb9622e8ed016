"""Open any supported trace by content: Kineto JSON (plain or gzip), nsys SQLite, .nsys-rep."""
from __future__ import annotations

from diagnose.trace.model import Trace
from diagnose.trace.normalize import normalize
from diagnose.trace.reading import Prefetch, sniff


def load_trace(path: str, lenient: bool = False, progress=None, prefetch: Prefetch | None = None,
               workers: int | None = None) -> Trace:
    """Load ``path`` into a :class:`Trace`, choosing the loader from the file's first bytes,
    then apply the shared normalization (:mod:`diagnose.trace.normalize`).

    Args:
        path: Kineto JSON (.json/.json.gz), nsys SQLite, or .nsys-rep.
        lenient: Kineto only: repair numbers written with a decimal comma.
        progress: optional ``progress(done, total)`` callback (large Kineto files).
        prefetch: a :class:`~diagnose.trace.reading.Prefetch` of ``path`` already reading it
            (Kineto only; ignored otherwise), perhaps with its decode started
            (:func:`~diagnose.trace.kineto.start_prefetched`).
        workers: Kineto only: processes decoding a large file (see
            :func:`diagnose.trace.kineto.workers_default`); 1 for this process only.

    Raises:
        TraceFormatError: the file is missing, unreadable, or in no supported format.
    """
    kind = sniff(path)
    if kind == "nsys-sqlite":
        from diagnose.trace.nsys import load_nsys_sqlite

        trace = load_nsys_sqlite(path)
    elif kind == "nsys-rep":
        from diagnose.trace.nsys import load_nsys_rep

        trace = load_nsys_rep(path)
    else:
        from diagnose.trace.kineto import load_kineto

        buf, cut = prefetch.result() if prefetch is not None else (None, None)
        started = prefetch.take_started() if prefetch is not None else None
        trace = load_kineto(path, buf=buf, lenient=lenient, progress=progress, gz_cut=cut, workers=workers,
                            started=started)
    return normalize(trace)
