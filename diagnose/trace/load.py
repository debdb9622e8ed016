"""Open any supported trace by content: Kineto JSON (plain or gzip), nsys SQLite, .nsys-rep."""
from __future__ import annotations

import os

from diagnose.errors import TraceFormatError
from diagnose.trace.model import Trace

_SQLITE_MAGIC = b"SQLite format 3\x00"


def load_trace(path: str) -> Trace:
    """Load ``path`` into a :class:`Trace`, choosing the loader from the file's first bytes.

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

        return load_nsys_sqlite(path)
    if path.endswith(".nsys-rep") or path.endswith(".qdrep"):
        from diagnose.trace.nsys import load_nsys_rep

        return load_nsys_rep(path)
    from diagnose.trace.kineto import load_kineto

    return load_kineto(path)
