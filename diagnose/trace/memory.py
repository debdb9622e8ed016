"""Large buffers on transparent huge pages (Linux): the decompressed document of a large trace.

Touching fresh memory costs one page fault per 4 KiB page. On a virtual machine a fault is
expensive: inflating a 255 MB document into a plain ``bytes`` took 62,000 faults and about
0.13 s of system time, half the gunzip (the 2-core VM of ``benchmarks/README.md``). Memory
advised with ``madvise(MADV_HUGEPAGE)`` is backed by 2 MiB pages where the kernel's
transparent huge pages are enabled (``always``, or ``madvise`` as on most distributions);
``MADV_POPULATE_WRITE`` (Linux 5.14) then maps the whole range in one call, so the inflate
writes into memory already there: the same 255 MB in ~400 faults and 0.02 s of system time.
Where either advice is unknown (older kernels, other systems) the calls fail harmlessly and
the memory is ordinary.

Nothing here changes a value: :func:`filled_bytes` returns an ordinary ``bytes`` object.
"""
from __future__ import annotations

import mmap
import sys
from typing import Callable

#: Below this size, a buffer is allocated the ordinary way (the faults saved are few).
MIN_BYTES = 32 * 2**20

_HUGE = 2**21  # transparent huge page size on x86-64 and arm64 (4 KiB base pages)
_MADV_POPULATE_WRITE = 23  # linux/mman.h (5.14); not in Python's mmap module before 3.13


def _libc():
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    libc.madvise.restype = ctypes.c_int
    return libc


def _advise(libc, addr: int, size: int) -> None:
    """Advise huge pages on the whole 2 MiB-aligned part of [addr, addr + size) and map all of
    it at once (each advice may fail: the memory then stays ordinary)."""
    start = (addr + _HUGE - 1) & ~(_HUGE - 1)
    end = (addr + size) & ~(_HUGE - 1)
    if end > start and hasattr(mmap, "MADV_HUGEPAGE"):
        libc.madvise(start, end - start, mmap.MADV_HUGEPAGE)
    page = mmap.PAGESIZE
    start = (addr + page - 1) & ~(page - 1)
    end = (addr + size) & ~(page - 1)
    if end > start:
        libc.madvise(start, end - start, _MADV_POPULATE_WRITE)


def filled_bytes(size: int, fill: Callable[[memoryview], int]) -> bytes | None:
    """A new ``bytes`` of ``size`` bytes on huge pages, written by ``fill(view)`` (a writable
    byte view of it) before anyone else sees it; ``fill`` returns how many bytes it wrote.
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
        _advise(_libc(), addr, size)
        view = memoryview((ctypes.c_char * size).from_address(addr)).cast("B")
    except (OSError, AttributeError, ValueError, TypeError, MemoryError):
        return None
    try:
        done = fill(view)
    finally:
        view.release()
    # never hashed nor shared before this point: writing into it was the construction
    return out if done == size else None
