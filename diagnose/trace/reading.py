"""Reading trace files: format sniffing, gunzip, and reading on a background thread.

Kept free of heavy imports (no numpy/pandas) so that ``diagnose run`` can start reading and
decompressing a large trace (:class:`Prefetch`) while the analysis modules are still being
imported.

Gzip bombs: the gzip trailer's size field is modulo 2**32 and written by whoever made the
file, so the inflated size is checked while inflating. Inflating stops with one clear error
once the output passes :data:`MAX_INFLATE_RATIO` (100) times the compressed size, and at
least :data:`INFLATE_FLOOR_BYTES` (64 MiB). Real traces inflate 10-31x (the shared corpus:
9.9x to 30.3x; the 316 MB and 2 GB benchmark replicas of HTA's rank0 trace 11.8x and 11.9x);
a 1 MB file inflating to 1 GiB (~1000x, DEFLATE's ceiling) is refused after ~100 MB, with a
peak memory near that. The environment variable ``DIAGNOSE_MAX_INFLATE_RATIO`` sets another
ratio (``0``: no limit); the error message says so.
"""
from __future__ import annotations

import os
import threading
import zlib

from diagnose.errors import TraceFormatError
from diagnose.trace import memory

try:  # ISA-L: the same inflate, faster than zlib (_inflate, _inflate_large); zlib without it
    from isal import isal_zlib
except ImportError:  # pragma: no cover
    isal_zlib = None

SQLITE_MAGIC = b"SQLite format 3\x00"


def sniff(path: str) -> str:
    """The loader for ``path`` by content (and extension for .nsys-rep): "nsys-sqlite",
    "nsys-rep" or "kineto".

    Raises:
        TraceFormatError: missing, a directory, unreadable, a .sqlite that is not SQLite, or
            a tar archive (``diagnose run`` reads those itself, :mod:`diagnose.archive`).
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
    if path.lower().endswith((".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")):
        raise TraceFormatError(f"{path}: a tar archive of traces, not one trace: `diagnose run --trace {path}` reads "
                               "it as one trace per rank; for other commands unpack it (tar xf) and give one trace")
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


#: Refuse gzip data that inflates to more than this many times its compressed size. Real
#: traces inflate 10-31x (the shared corpus: 9.9x to 30.3x; the 316 MB and 2 GB benchmark
#: replicas 11-12x); DEFLATE's ceiling is ~1032x, which only crafted or degenerate input
#: (a "gzip bomb": 1 MB inflating to 1 GiB) comes near. Overridable with the environment
#: variable DIAGNOSE_MAX_INFLATE_RATIO (a number; 0 turns the check off).
MAX_INFLATE_RATIO = 100.0
RATIO_ENV = "DIAGNOSE_MAX_INFLATE_RATIO"
#: Inflating up to this many bytes is always allowed, whatever the ratio (small files).
INFLATE_FLOOR_BYTES = 64 * 2**20


def inflate_ratio(path: str) -> float | None:
    """The inflate ratio in force: DIAGNOSE_MAX_INFLATE_RATIO, else :data:`MAX_INFLATE_RATIO`
    (None: no limit).

    Raises:
        TraceFormatError: DIAGNOSE_MAX_INFLATE_RATIO is set but is not a number.
    """
    env = os.environ.get(RATIO_ENV, "").strip()
    if not env:
        return MAX_INFLATE_RATIO
    try:
        ratio = float(env)
    except ValueError:
        raise TraceFormatError(f"{path}: {RATIO_ENV}={env!r} is not a number (a ratio such as 200, or 0 for no limit)") from None
    return ratio if 0 < ratio < float("inf") else None


def inflate_limit(path: str, compressed: int) -> int | None:
    """The most bytes gzip data of ``compressed`` bytes may inflate to (None: no limit): the
    ratio times the compressed size, and never less than :data:`INFLATE_FLOOR_BYTES`."""
    ratio = inflate_ratio(path)
    return None if ratio is None else max(INFLATE_FLOOR_BYTES, int(ratio * compressed))


class _TooLarge(Exception):
    pass


def _inflate(raw: bytes, decompressobj, limit: int | None) -> tuple[list[bytes], bool]:
    """Inflate every gzip member of ``raw`` (trailing zero padding ignored), never producing
    more than ``limit`` bytes: (pieces, cut short?). One call per member, whose output buffer
    grows in place (ISA-L, 2 GB: 2.5 s and output + input in memory).

    Raises:
        _TooLarge: more than ``limit`` bytes would come out.
        Exception: the decompressor's error for corrupt data.
    """
    parts: list[bytes] = []
    total = 0
    rest = raw
    while True:
        d = decompressobj(31)
        out = d.decompress(rest, 0 if limit is None else limit - total + 1)
        parts.append(out)
        total += len(out)
        if limit is not None and total > limit:
            raise _TooLarge(total)
        if not d.eof:  # the input ran out inside the member
            return parts, True
        rest = d.unused_data
        if not rest or (len(rest) < 2**20 and not any(rest)):  # end, or zero padding
            return parts, False


def _inflate_large(raw: bytes, limit: int | None) -> bytes | None:
    """A large single-member gzip file inflated with ISA-L straight into a ``bytes`` whose
    pages are mapped at once (:func:`diagnose.trace.memory.filled_bytes`: no page fault per
    4 KiB written, no copy of a growing buffer); None (the caller inflates as usual, and
    classifies any error) unless the gzip trailer's size field is exactly the size inflated
    and the stream then ends cleanly, CRC checked: a file of several members, over 4 GiB, cut,
    corrupt or beyond ``limit``."""
    size = int.from_bytes(raw[-4:], "little")  # ISIZE: the last member's size modulo 2**32
    if isal_zlib is None or size < memory.MIN_BYTES or (limit is not None and size > limit):
        return None

    def fill(view: memoryview) -> int:
        reader = isal_zlib._GzipReader(raw)
        pos = 0
        while pos < size:
            n = reader.readinto(view[pos:])
            if not n:
                break
            pos += n
        return pos if reader.read(1) == b"" else -1  # the end: reads the trailer, checks its CRC

    try:
        return memory.filled_bytes(size, fill)
    except Exception:  # noqa: BLE001 - corrupt or cut: the ordinary path says which
        return None


def _too_large(path: str, compressed: int, limit: int) -> TraceFormatError:
    return TraceFormatError(
        f"{path}: gzip data inflates to more than {limit / 1e6:,.0f} MB from {compressed / 1e6:,.1f} MB "
        f"(over {inflate_ratio(path):g}x; real traces inflate 10-30x): refused as a likely decompression bomb; "
        f"to load it anyway set {RATIO_ENV} to a higher ratio (0: no limit)")


def read_bytes_partial(path: str) -> tuple[bytes, str | None]:
    """Like :func:`read_bytes`, but a gzip stream cut short returns what decompressed, plus a
    description of the cut (None when the file is whole).

    Raises:
        TraceFormatError: missing/unreadable file, gzip data that is corrupt (not just cut),
            or that inflates beyond :func:`inflate_limit` (a decompression bomb), or text
            whose byte-order mark names an encoding it is not in. A UTF-8 byte-order mark is
            dropped and UTF-16/UTF-32 text (with its mark) comes back as UTF-8.
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
        return _utf8(path, raw), None
    limit = inflate_limit(path, len(raw))
    whole = _inflate_large(raw, limit)
    if whole is not None:
        return _utf8(path, whole), None
    if isal_zlib is not None:  # fast path; a cut or corrupt stream is classified by zlib below
        try:
            parts, cut = _inflate(raw, isal_zlib.decompressobj, limit)
            if not cut:
                return _utf8(path, parts[0] if len(parts) == 1 else b"".join(parts)), None
        except _TooLarge:
            raise _too_large(path, len(raw), limit) from None
        except Exception:  # noqa: BLE001 - corrupt: classified below
            pass
        parts = []
    try:
        parts, cut = _inflate(raw, zlib.decompressobj, limit)
    except _TooLarge:
        raise _too_large(path, len(raw), limit) from None
    except zlib.error as e:
        raise TraceFormatError(f"{path}: corrupt gzip data ({e})") from None
    out = _utf8(path, parts[0] if len(parts) == 1 else b"".join(parts))
    if not cut:
        return out, None
    if not out:
        raise TraceFormatError(f"{path}: gzip stream cut before any data") from None
    return out, f"gzip stream cut short after {len(raw):,} compressed bytes ({len(out):,} bytes recovered)"


def _utf8(path: str, data: bytes) -> bytes:
    """The document as UTF-8: a UTF-8 byte-order mark dropped, UTF-16/UTF-32 text with its
    mark (PowerShell's ``Out-File``, some editors) transcoded; other bytes as they are.

    Raises:
        TraceFormatError: a UTF-16/32 mark followed by bytes invalid in that encoding.
    """
    if data[:1] not in (b"\xef", b"\xff", b"\xfe", b"\x00"):  # no byte-order mark: the common case, no copy
        return data
    from diagnose.errors import DiagnoseError
    from diagnose.inputs import utf8_without_bom

    try:
        return utf8_without_bom(data, path)[0]
    except DiagnoseError as e:
        raise TraceFormatError(str(e)) from None


class Prefetch:
    """:func:`read_bytes_partial` of a Kineto file on a daemon thread, started at once.

    gunzip (zlib and ISA-L) releases the GIL, so the read overlaps whatever the caller does
    next (on the command line: importing pandas and the analyzers, ~0.5 s).
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self.started = None  # the Kineto decode started on the result (diagnose.trace.kineto.start_prefetched)
        self._result: tuple[bytes, str | None] | None = None
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="diagnose-prefetch", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        try:
            self._result = read_bytes_partial(self.path)
        except BaseException as e:  # noqa: BLE001 - re-raised in result()
            self._error = e

    def peek(self) -> tuple[bytes, str | None] | None:
        """Wait for the read; its result without handing it over, or None when it failed
        (:meth:`result` raises the error)."""
        self._thread.join()
        return self._result if self._error is None else None

    def take_started(self):
        """The started decode (or None), handed over once."""
        out, self.started = self.started, None
        return out

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
