"""Reading trace files: format sniffing, gunzip, and reading on a background thread.

Kept free of heavy imports (no numpy/pandas) so that ``diagnose run`` can start reading and
decompressing a large trace (:class:`Prefetch`) while the analysis modules are still being
imported.
"""
from __future__ import annotations

import gzip
import os
import threading
import zlib

from diagnose.errors import TraceFormatError

try:  # ISA-L: the same inflate, faster than zlib (see _gunzip_isal); stdlib gzip without it
    from isal import isal_zlib
except ImportError:  # pragma: no cover
    isal_zlib = None

SQLITE_MAGIC = b"SQLite format 3\x00"


def sniff(path: str) -> str:
    """The loader for ``path`` by content (and extension for .nsys-rep): "nsys-sqlite",
    "nsys-rep" or "kineto".

    Raises:
        TraceFormatError: missing, a directory, unreadable, or a .sqlite that is not SQLite.
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
    if head.startswith(SQLITE_MAGIC):
        return "nsys-sqlite"
    if path.endswith((".sqlite", ".sqlite3", ".db")):
        raise TraceFormatError(f"{path}: not an SQLite database (expected an nsys SQLite export)")
    if path.endswith((".nsys-rep", ".qdrep")):
        return "nsys-rep"
    return "kineto"


def read_bytes(path: str) -> bytes:
    """Read a file, gunzipping it when it starts with the gzip magic.

    Raises:
        TraceFormatError: missing/unreadable file, corrupt or truncated gzip stream.
    """
    data, cut = read_bytes_partial(path)
    if cut:
        raise TraceFormatError(f"{path}: {cut}")
    return data


def _gunzip_isal(raw: bytes) -> bytes | None:
    """Gunzip a whole, valid stream (every member) with ISA-L: one inflate call per member,
    whose output buffer grows in place (2 GB: 2.5 s and output + input in memory, against
    6.5 s and twice the output for ``gzip.decompress``). None when ISA-L is missing or the
    stream is cut or corrupt (the stdlib path then says which)."""
    if isal_zlib is None:
        return None
    parts: list[bytes] = []
    rest = raw
    try:
        while True:
            d = isal_zlib.decompressobj(31)
            parts.append(d.decompress(rest))
            if not d.eof:  # cut short
                return None
            rest = d.unused_data
            if not rest or (len(rest) < 2**20 and not any(rest)):  # end, or zero padding
                break
    except Exception:  # noqa: BLE001 - corrupt: classified by the stdlib path
        return None
    return parts[0] if len(parts) == 1 else b"".join(parts)


def read_bytes_partial(path: str) -> tuple[bytes, str | None]:
    """Like :func:`read_bytes`, but a gzip stream cut short returns what decompressed, plus a
    description of the cut (None when the file is whole).

    Raises:
        TraceFormatError: missing/unreadable file, or gzip data that is corrupt (not just cut).
    """
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        raise TraceFormatError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise TraceFormatError(f"{path}: is a directory, expected a trace file") from None
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot read ({e.strerror})") from None
    if raw[:2] != b"\x1f\x8b":
        return raw, None
    out = _gunzip_isal(raw)
    if out is not None:
        return out, None
    try:
        return gzip.decompress(raw), None
    except EOFError:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        try:
            out = d.decompress(raw)
        except zlib.error as e:
            raise TraceFormatError(f"{path}: corrupt gzip data ({e})") from None
        if not out:
            raise TraceFormatError(f"{path}: gzip stream cut before any data") from None
        return out, f"gzip stream cut short after {len(raw):,} compressed bytes ({len(out):,} bytes recovered)"
    except (OSError, zlib.error) as e:
        raise TraceFormatError(f"{path}: corrupt gzip data ({e})") from None


class Prefetch:
    """:func:`read_bytes_partial` of a Kineto file on a daemon thread, started at once.

    gunzip (zlib and ISA-L) releases the GIL, so the read overlaps whatever the caller does
    next (on the command line: importing pandas and the analyzers, ~0.5 s).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._result: tuple[bytes, str | None] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="diagnose-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = read_bytes_partial(self.path)
        except BaseException as e:  # noqa: BLE001 - re-raised in result()
            self._error = e

    def result(self) -> tuple[bytes, str | None]:
        """(decompressed bytes, description of a gzip cut or None); the result is handed over
        once (the reference is dropped so the bytes can be freed after loading).

        Raises:
            TraceFormatError: as :func:`read_bytes_partial`.
        """
        self._thread.join()
        if self._error is not None:
            raise self._error
        out, self._result = self._result, None
        if out is None:
            raise RuntimeError("Prefetch.result() called twice")
        return out
