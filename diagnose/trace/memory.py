"""Memory for a large trace's load (Linux, glibc): fewer page faults.

Touching fresh memory costs one page fault per 4 KiB page, and on a virtual machine a fault
is expensive (~2-4 µs on the 2-core VM of ``benchmarks/README.md``).

* :func:`filled_bytes`: the decompressed document is written into a ``bytes`` whose pages
  are all mapped at once beforehand (``madvise(MADV_POPULATE_WRITE)``, Linux 5.14): one
  call instead of 62,000 faults for a 255 MB document. Where the advice is unknown (older
  kernels) the call fails harmlessly and the pages fault in as the inflate writes them.
  Huge pages (``MADV_HUGEPAGE``) were tried and left out: after another large process has
  freed its memory the kernel compacts memory to find 2 MiB pages, and the same inflate
  then took 0.2-0.7 s of system time instead of 0.1 s.
* :func:`freed_memory_reused`: the document is freed once its events are decoded, and the
  analysis then allocates about as much again (the 255 MB replica: ~150 MB of frames and
  arrays). By default glibc serves blocks that large with their own ``mmap`` and unmaps
  them when freed, so each is fresh memory; while the command runs, blocks come from the
  heap and freed heap memory stays mapped for the next allocations.

Nothing here changes a value: :func:`filled_bytes` returns an ordinary ``bytes`` object.
"""
from __future__ import annotations

import contextlib
import mmap
import os
import sys
from typing import Callable, Iterator

#: Below this size, a buffer is allocated the ordinary way (the faults saved are few).
MIN_BYTES = 32 * 2**20

_MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14); not in Python's mmap module before 3.13


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.madvise.restype = ctypes.c_int
    return libc


def _populate(libc, addr: int, size: int) -> None:
    """Map every whole page of [addr, addr + size) at once (the advice may fail: the pages
    then fault in one by one when written)."""
    page = mmap.PAGESIZE
    start = (addr + page - 1) & ~(page - 1)
    end = (addr + size) & ~(page - 1)
    if end > start:
        libc.madvise(start, end - start, _MADV_POPULATE_WRITE)


def filled_bytes(size: int, fill: Callable[[memoryview], int]) -> bytes | None:
    """A new ``bytes`` of ``size`` bytes, its pages mapped at once, written by ``fill(view)``
    (a writable byte view of it) before anyone else sees it; ``fill`` returns how many bytes
    it wrote.
    None when that is not exactly ``size`` (the caller makes its bytes another way), when
    ``size`` is under :data:`MIN_BYTES`, or off Linux CPython.

    Raises:
        Exception: whatever ``fill`` raises.
    """
    if size < MIN_BYTES or not sys.platform.startswith("linux") or sys.implementation.name != "cpython":
        return None
    try:
        import ctypes

        new = ctypes.pythonapi.PyBytes_FromStringAndSize
        new.restype = ctypes.py_object
        new.argtypes = (ctypes.c_void_p, ctypes.c_ssize_t)
        out = new(None, size)  # uninitialised: malloc maps it, nothing touched yet
        addr = ctypes.cast(ctypes.c_char_p(out), ctypes.c_void_p).value
        _populate(_libc(), addr, size)
        view = memoryview((ctypes.c_char * size).from_address(addr)).cast("B")
    except (OSError, AttributeError, ValueError, TypeError, MemoryError):
        return None
    try:
        done = fill(view)
    finally:
        view.release()
    # never hashed nor shared before this point: writing into it was the construction
    return out if done == size else None


# mallopt(3) parameters (glibc's malloc.h) and the defaults restored afterwards
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD, _M_MMAP_MAX, _M_ARENA_MAX = -1, -3, -4, -8
_KEEP = ((_M_MMAP_MAX, 0),  # no block from its own mmap: every one from the heap
         (_M_TRIM_THRESHOLD, 2**31 - 1),  # never give the heap's top back to the system
         (_M_ARENA_MAX, 1))  # threads (the read-ahead) allocate from the same heap
# Afterwards: glibc's state once its dynamic threshold has adapted to large blocks freed
# (what it does by default; setting any of these turns the adaptation off, so the
# thresholds are set where it stops: blocks from 32 MiB get their own mmap, the heap's top
# is trimmed beyond twice that), at most 65,536 mmaps, 8 arenas per CPU.
_AFTER = ((_M_MMAP_THRESHOLD, 32 * 2**20), (_M_TRIM_THRESHOLD, 64 * 2**20), (_M_MMAP_MAX, 65536),
          (_M_ARENA_MAX, 8 * (os.cpu_count() or 1)))


def _glibc_mallopt():
    """glibc's ``mallopt`` as a callable, None elsewhere (musl, macOS, Windows)."""
    try:
        if not sys.platform.startswith("linux") or not os.confstr("CS_GNU_LIBC_VERSION").startswith("glibc"):
            return None
        import ctypes

        f = ctypes.CDLL(None).mallopt
    except (OSError, ValueError, AttributeError):
        return None
    f.argtypes = (ctypes.c_int, ctypes.c_int)
    f.restype = ctypes.c_int
    return f


@contextlib.contextmanager
def freed_memory_reused() -> Iterator[None]:
    """For the block, glibc's malloc takes every block from the heap (none from its own
    ``mmap``), every thread from the main heap, and keeps freed memory mapped, so that memory
    freed (the decompressed document) serves the next allocations (the analysis) without
    page faults. Afterwards the thresholds glibc's own adaptation ends at are set
    (:data:`_AFTER`); what the block kept stays mapped until the heap's top is next trimmed.
    Nothing where the C library is not glibc (musl, macOS, Windows)."""
    mallopt = _glibc_mallopt()
    if mallopt is not None:
        for param, value in _KEEP:
            mallopt(param, value)
    try:
        yield
    finally:
        if mallopt is not None:
            for param, value in _AFTER:
                mallopt(param, value)
