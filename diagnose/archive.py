"""A tar archive of traces (``.tar.gz``, ``.tgz``, ``.tar``, ``.tar.bz2``, ``.tar.xz``) read as
a fleet, one trace per rank, as ``--trace-dir`` reads a directory.

The archive is never unpacked where the user keeps it: trace members are copied into a
private temporary directory (removed afterwards), each under its own numbered folder with its
base name, so a member name cannot reach outside that directory (``../``, absolute paths, links
and device files are never written). Reading is bounded before any data is copied:

* at most :data:`MAX_MEMBERS` entries are read from the archive, and at most
  :data:`MAX_TRACES` traces are kept;
* the entries' sizes, as their headers declare them, may add up to at most the inflate limit
  of a gzip trace of the archive's size (:func:`diagnose.trace.reading.inflate_limit`: 100x the
  archive, never less than 64 MiB; ``DIAGNOSE_MAX_INFLATE_RATIO`` sets another ratio), checked
  before the stream is read past an entry, so a decompression bomb costs neither disk nor time;
* a member is copied with exactly the bytes its header declares.

What is not read is listed (``skipped``: the member and why), never silently dropped.
"""
from __future__ import annotations

import os
import posixpath
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator

from diagnose.errors import TraceFormatError

if TYPE_CHECKING:  # tarfile is imported when an archive is read (is_archive stays free for `run`'s start-up)
    import tarfile

#: File names read as archives of traces.
ARCHIVE_SUFFIXES = (".tar.gz", ".tgz", ".tar", ".tar.bz2", ".tbz2", ".tar.xz", ".txz")
#: Entries read from one archive (directories included); more is refused.
MAX_MEMBERS = 4096
#: Traces analysed from one archive; more is refused (a fleet of ranks, not a dataset).
MAX_TRACES = 1024
#: Member names kept as trace files (as ``--trace-dir`` reads them).
TRACE_SUFFIXES = (".json", ".json.gz", ".sqlite")
_SAFE_NAME = re.compile(r"^[^\x00-\x1f/\\]{1,255}$")


def is_archive(path: str) -> bool:
    """True when ``path`` names a tar archive by its suffix (``.tar.gz``, ``.tgz``, ...)."""
    return str(path).lower().endswith(ARCHIVE_SUFFIXES)


@dataclass
class ArchiveTraces:
    """The traces of an archive, copied into ``directory``.

    Attributes:
        archive: the archive's path, as given.
        directory: the temporary directory holding the copies (removed on exit).
        paths: copies of the trace members, in archive order.
        members: member name of each path (``paths[i]`` is ``members[i]``).
        skipped: (member name, why) for every entry that is not read.
    """

    archive: str
    directory: str
    paths: list[str] = field(default_factory=list)
    members: list[str] = field(default_factory=list)
    skipped: list[tuple[str, str]] = field(default_factory=list)

    def label(self, path: str) -> str:
        """How a copy is shown: ``archive.tar.gz:member/name.json``."""
        try:
            return f"{self.archive}:{self.members[self.paths.index(path)]}"
        except ValueError:
            return path


def _skip_reason(member: tarfile.TarInfo, base: str) -> str | None:
    if member.isdir():
        return ""  # folders are walked, not reported
    if member.issym() or member.islnk():
        return "a link (not followed)"
    if not member.isfile():
        return "not a regular file"
    if not _SAFE_NAME.match(base) or base in (".", ".."):
        return "an unusable file name"
    if base.startswith("."):
        return "a hidden file"
    if not base.lower().endswith(TRACE_SUFFIXES):
        return "not a trace file name (*.json, *.json.gz, *.sqlite)"
    return None


@contextmanager
def archive_traces(path: str) -> Iterator[ArchiveTraces]:
    """Copy the trace members of the tar archive ``path`` into a temporary directory.

    Args:
        path: a tar archive, plain or compressed (gzip, bzip2, xz).

    Yields:
        :class:`ArchiveTraces`; the directory and its copies are removed when the ``with``
        block ends, whatever happens in it.

    Raises:
        TraceFormatError: missing or unreadable file, not a tar archive, corrupt or truncated,
            more than :data:`MAX_MEMBERS` entries or :data:`MAX_TRACES` traces, entries larger
            in all than the inflate limit, or no trace member at all.
    """
    import shutil
    import tarfile
    import tempfile

    from diagnose.trace.reading import RATIO_ENV, inflate_limit

    if not os.path.isfile(path):
        raise TraceFormatError(f"{path}: no such file")
    try:
        compressed = os.path.getsize(path)
        tf = tarfile.open(path, mode="r:*")
    except (tarfile.TarError, EOFError, OSError):
        raise TraceFormatError(f"{path}: not a readable tar archive (plain, gzip, bzip2 or xz); if it holds traces, "
                               "unpack it and give them with --trace-dir") from None
    limit = inflate_limit(path, compressed)
    tmp = tempfile.mkdtemp(prefix="diagnose-archive-")
    out = ArchiveTraces(archive=path, directory=tmp)
    try:
        with tf:
            declared = 0
            for i, member in enumerate(_members(tf, path)):
                if i >= MAX_MEMBERS:
                    raise TraceFormatError(f"{path}: more than {MAX_MEMBERS} entries: not read (unpack it and give "
                                           "the traces with --trace-dir)")
                declared += max(0, member.size)
                if limit is not None and declared > limit:
                    raise TraceFormatError(
                        f"{path}: its entries add up to more than {limit / 1e6:,.0f} MB from a {compressed / 1e6:,.1f} MB "
                        f"archive: refused as a likely decompression bomb; to read it anyway set {RATIO_ENV} to a "
                        "higher ratio (0: no limit)")
                base = posixpath.basename(member.name.rstrip("/"))
                why = _skip_reason(member, base)
                if why is not None:
                    if why:
                        out.skipped.append((member.name, why))
                    continue
                if len(out.paths) >= MAX_TRACES:
                    raise TraceFormatError(f"{path}: more than {MAX_TRACES} traces: not read")
                folder = os.path.join(tmp, str(len(out.paths)))
                os.mkdir(folder)
                dest = os.path.join(folder, base)
                _copy_member(tf, member, dest, path)
                out.paths.append(dest)
                out.members.append(member.name)
        if not out.paths:
            what = "; ".join(f"{n} ({w})" for n, w in out.skipped[:5]) or "no files"
            raise TraceFormatError(f"{path}: no trace in the archive ({what})")
        yield out
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _one_line(e: BaseException) -> str:
    return " ".join(str(e).split()) or type(e).__name__


def _members(tf: tarfile.TarFile, path: str) -> Iterator[tarfile.TarInfo]:
    """The archive's entries one by one (the stream is read as the loop goes)."""
    import tarfile

    try:
        while True:
            member = tf.next()
            if member is None:
                return
            yield member
    except (tarfile.TarError, EOFError, OSError, ValueError) as e:
        raise TraceFormatError(f"{path}: corrupt or truncated tar archive ({_one_line(e)})") from None


def _copy_member(tf: tarfile.TarFile, member: tarfile.TarInfo, dest: str, path: str) -> None:
    """Copy exactly ``member.size`` bytes of ``member`` to the new file ``dest``."""
    import gzip
    import lzma
    import tarfile
    import zlib

    read_errors = (tarfile.TarError, EOFError, zlib.error, lzma.LZMAError, gzip.BadGzipFile)
    try:
        src = tf.extractfile(member)
    except read_errors as e:
        raise TraceFormatError(f"{path}: corrupt or truncated tar archive ({_one_line(e)})") from None
    if src is None:
        raise TraceFormatError(f"{path}: {member.name}: cannot be read")
    try:
        with src, open(dest, "xb") as f:
            left = member.size
            while left > 0:
                try:
                    chunk = src.read(min(left, 1 << 20))
                except read_errors as e:
                    raise TraceFormatError(f"{path}: corrupt or truncated tar archive ({_one_line(e)})") from None
                if not chunk:
                    raise TraceFormatError(f"{path}: {member.name}: truncated in the archive")
                f.write(chunk)
                left -= len(chunk)
    except OSError as e:
        raise TraceFormatError(f"{path}: cannot copy {member.name} to a temporary directory ({e.strerror or e})") from None
