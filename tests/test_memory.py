"""Prefaulted buffers (diagnose.trace.memory) and the gunzip into them: same bytes as the
ordinary inflate, and every odd gzip file still takes the ordinary path and its errors; the
allocator settings of a run are set and restored."""
from __future__ import annotations

import gzip
import sys
import zlib

import pytest

from diagnose.errors import TraceFormatError
from diagnose.trace import memory
from diagnose.trace.reading import _inflate_large, read_bytes_partial

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="madvise: Linux only")


def _doc(n_bytes: int) -> bytes:
    """A JSON trace of at least ``n_bytes`` whose events differ (so it does not compress to nothing)."""
    head, tail = b'{"traceEvents":[', b"]}"
    ev = b'{"ph":"X","cat":"kernel","name":"k%07d","ts":%d,"dur":3,"pid":0,"tid":7,"args":{"correlation":%d}}'
    n = n_bytes // 90 + 1
    return head + b",".join(ev % (i, 1000 + 5 * i, i) for i in range(n)) + tail


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[bytes, bytes]:
    doc = _doc(memory.MIN_BYTES + 2**20)
    return doc, gzip.compress(doc, compresslevel=1, mtime=0)


@linux
def test_filled_bytes_is_an_ordinary_bytes_written_by_fill():
    size = memory.MIN_BYTES + 12345
    pattern = bytes(range(251)) * (size // 251 + 1)

    def fill(view: memoryview) -> int:
        view[:] = pattern[:size]
        return size

    out = memory.filled_bytes(size, fill)
    assert type(out) is bytes and len(out) == size and out == pattern[:size]
    assert hash(out) == hash(bytes(pattern[:size]))
    assert out[1000:1004] == pattern[1000:1004] and out.find(b"\xfa\x00\x01") == 250


def test_filled_bytes_declines_small_sizes_and_short_fills():
    assert memory.filled_bytes(memory.MIN_BYTES - 1, lambda v: len(v)) is None
    if sys.platform.startswith("linux"):
        assert memory.filled_bytes(memory.MIN_BYTES, lambda v: len(v) - 1) is None


@linux
def test_large_gzip_inflates_into_a_prefaulted_buffer_to_the_same_bytes(big, tmp_path):
    doc, gz = big
    out = _inflate_large(gz, None)
    assert out is not None and type(out) is bytes and out == doc
    p = tmp_path / "big.json.gz"
    p.write_bytes(gz)
    got, cut = read_bytes_partial(str(p))
    assert cut is None and got == doc


def test_odd_gzip_files_take_the_ordinary_path(big, tmp_path):
    doc, gz = big
    # two members: the trailer holds only the last one's size
    two = gz + gzip.compress(b" ", mtime=0)
    assert _inflate_large(two, None) is None
    p = tmp_path / "two.json.gz"
    p.write_bytes(two)
    assert read_bytes_partial(str(p)) == (doc + b" ", None)
    # a trailer whose size field is wrong (a member over 4 GiB reads modulo 2**32)
    wrong = gz[:-4] + (len(doc) + 1).to_bytes(4, "little")
    assert _inflate_large(wrong, None) is None
    # a CRC that does not match: the ordinary path reports the corruption
    bad_crc = gz[:-8] + bytes(4) + gz[-4:]
    assert _inflate_large(bad_crc, None) is None
    p = tmp_path / "crc.json.gz"
    p.write_bytes(bad_crc)
    with pytest.raises(TraceFormatError, match="corrupt gzip data"):
        read_bytes_partial(str(p))
    # over the inflate limit: refused by the ordinary path's check
    assert _inflate_large(gz, len(doc) - 1) is None
    # a cut stream: the ordinary path returns what inflated and says so
    cut = gz[: len(gz) // 2] + gz[-4:]  # keeps a plausible size field
    assert _inflate_large(cut, None) is None
    p = tmp_path / "cut.json.gz"
    p.write_bytes(gz[: len(gz) // 2])
    part, why = read_bytes_partial(str(p))
    assert why is not None and "cut short" in why and doc.startswith(part) and len(part) > 0
    assert zlib.decompressobj(31).decompress(gz[: len(gz) // 2]) == part


glibc = pytest.mark.skipif(memory._glibc_mallopt() is None, reason="mallopt: glibc only")


_HEAP_SCRIPT = """
from diagnose.trace import memory

def rss():
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))

n = 96 * 2**20
with memory.freed_memory_reused():
    before = rss()
    block = b"x" * n
    del block
    kept = rss() - before
before = rss()
block = b"y" * n  # may reuse what the block kept
del block
print(kept, before - rss())
"""


@glibc
def test_freed_memory_stays_mapped_inside_the_block_and_not_after():
    """Inside the block a freed 96 MiB block stays mapped (the next allocations reuse it);
    after it, freed memory goes back to the system again. In a fresh interpreter: a long
    test process's heap may already hold free memory that the block would reuse."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", _HEAP_SCRIPT], capture_output=True, text=True, check=True).stdout
    kept, returned = (int(x) for x in out.split())
    n = 96 * 2**20
    assert kept >= 0.9 * n
    assert returned >= 0.9 * n


def test_freed_memory_reused_is_a_no_op_without_glibc(monkeypatch):
    monkeypatch.setattr(memory, "_glibc_mallopt", lambda: None)
    with memory.freed_memory_reused():
        assert b"z" * 10 == b"zzzzzzzzzz"

