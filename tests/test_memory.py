"""Huge-page buffers (diagnose.trace.hugepages) and the gunzip into them: same bytes as the
ordinary inflate, and every odd gzip file still takes the ordinary path and its errors."""
from __future__ import annotations

import gzip
import sys
import zlib

import pytest

from diagnose.errors import TraceFormatError
from diagnose.trace import hugepages
from diagnose.trace.reading import _inflate_huge, read_bytes_partial

linux = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="huge pages: Linux only")


def _doc(n_bytes: int) -> bytes:
    """A JSON trace of at least ``n_bytes`` whose events differ (so it does not compress to nothing)."""
    head, tail = b'{"traceEvents":[', b"]}"
    ev = b'{"ph":"X","cat":"kernel","name":"k%07d","ts":%d,"dur":3,"pid":0,"tid":7,"args":{"correlation":%d}}'
    n = n_bytes // 90 + 1
    return head + b",".join(ev % (i, 1000 + 5 * i, i) for i in range(n)) + tail


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> tuple[bytes, bytes]:
    doc = _doc(hugepages.MIN_BYTES + 2**20)
    return doc, gzip.compress(doc, compresslevel=1, mtime=0)


@linux
def test_filled_bytes_is_an_ordinary_bytes_written_by_fill():
    size = hugepages.MIN_BYTES + 12345
    pattern = bytes(range(251)) * (size // 251 + 1)

    def fill(view: memoryview) -> int:
        view[:] = pattern[:size]
        return size

    out = hugepages.filled_bytes(size, fill)
    assert type(out) is bytes and len(out) == size and out == pattern[:size]
    assert hash(out) == hash(bytes(pattern[:size]))
    assert out[1000:1004] == pattern[1000:1004] and out.find(b"\xfa\x00\x01") == 250


def test_filled_bytes_declines_small_sizes_and_short_fills():
    assert hugepages.filled_bytes(hugepages.MIN_BYTES - 1, lambda v: len(v)) is None
    if sys.platform.startswith("linux"):
        assert hugepages.filled_bytes(hugepages.MIN_BYTES, lambda v: len(v) - 1) is None


@linux
def test_large_gzip_inflates_on_huge_pages_to_the_same_bytes(big, tmp_path):
    doc, gz = big
    out = _inflate_huge(gz, None)
    assert out is not None and type(out) is bytes and out == doc
    p = tmp_path / "big.json.gz"
    p.write_bytes(gz)
    got, cut = read_bytes_partial(str(p))
    assert cut is None and got == doc


def test_odd_gzip_files_take_the_ordinary_path(big, tmp_path):
    doc, gz = big
    # two members: the trailer holds only the last one's size
    two = gz + gzip.compress(b" ", mtime=0)
    assert _inflate_huge(two, None) is None
    p = tmp_path / "two.json.gz"
    p.write_bytes(two)
    assert read_bytes_partial(str(p)) == (doc + b" ", None)
    # a trailer whose size field is wrong (a member over 4 GiB reads modulo 2**32)
    wrong = gz[:-4] + (len(doc) + 1).to_bytes(4, "little")
    assert _inflate_huge(wrong, None) is None
    # a CRC that does not match: the ordinary path reports the corruption
    bad_crc = gz[:-8] + bytes(4) + gz[-4:]
    assert _inflate_huge(bad_crc, None) is None
    p = tmp_path / "crc.json.gz"
    p.write_bytes(bad_crc)
    with pytest.raises(TraceFormatError, match="corrupt gzip data"):
        read_bytes_partial(str(p))
    # over the inflate limit: refused by the ordinary path's check
    assert _inflate_huge(gz, len(doc) - 1) is None
    # a cut stream: the ordinary path returns what inflated and says so
    cut = gz[: len(gz) // 2] + gz[-4:]  # keeps a plausible size field
    assert _inflate_huge(cut, None) is None
    p = tmp_path / "cut.json.gz"
    p.write_bytes(gz[: len(gz) // 2])
    part, why = read_bytes_partial(str(p))
    assert why is not None and "cut short" in why and doc.startswith(part) and len(part) > 0
    assert zlib.decompressobj(31).decompress(gz[: len(gz) // 2]) == part
