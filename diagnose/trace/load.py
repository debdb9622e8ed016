"""Open any supported trace by content: Kineto JSON (plain or gzip), nsys SQLite, .nsys-rep."""
from __future__ import annotations

import os

from diagnose.errors import TraceFormatError
from diagnose.trace.model import Trace
from diagnose.trace.normalize import normalize

_SQLITE_MAGIC = b"SQLite format 3\x00"


def load_trace(path: str, lenient: bool = False, progress=None) -> Trace:
    """Load ``path`` into a :class:`Trace`, choosing the loader from the file's first bytes,
    then apply the shared normalization (:mod:`diagnose.trace.normalize`).

    Args:
        path: Kineto JSON (.json/.json.gz), nsys SQLite, or .nsys-rep.
        lenient: Kineto only: repair numbers written with a decimal comma.
        progress: optional ``progress(done, total)`` callback (large Kineto files).

    Raises:
        TraceFormatError: the file is missing, unreadable, or in no supported format.
    """
    if not os.path.exists(path):
        raise TraceFormatError(f"{path}: no such file")
    if os.path.isdir(path):
        raise TraceFormatError(f"{path}: is a directory, expected a trace file")
    try:
        with open(path, "rb") as f:
            head = f.read(16)
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read ({e.strerror})") from None
    if head.startswith(_SQLITE_MAGIC):
        from diagnose.trace.nsys import load_nsys_sqlite

        trace = load_nsys_sqlite(path)
    elif path.endswith((".sqlite", ".sqlite3", ".db")):
        raise TraceFormatError(f"{path}: not an SQLite database (expected an nsys SQLite export)")
    elif path.endswith(".nsys-rep") or path.endswith(".qdrep"):
        from diagnose.trace.nsys import load_nsys_rep

        trace = load_nsys_rep(path)
    else:
        from diagnose.trace.kineto import load_kineto

        trace = load_kineto(path, lenient=lenient, progress=progress)
    return normalize(trace)
