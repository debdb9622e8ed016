"""What a forked decoding worker sends back through its pipe (:mod:`diagnose.trace.kineto`):
its columns state as a protocol-5 pickle whose arrays travel out of band, each array's bytes
written as they are in memory (no copy into the pickle) and read back into buffers of known
size (the arrays are views of them).

Format: the count of parts and their sizes (little-endian uint64), the pickle, then each
array's bytes in the pickle's order.
"""
from __future__ import annotations

import pickle
import struct


def send_state(f, state: dict) -> None:
    """Write ``state`` to the pipe ``f`` for :func:`receive_state`: the count of parts and their
    sizes (little-endian uint64), a pickle (protocol 5) whose arrays travel out of band,
    then each array's bytes as they are in memory (no copy into the pickle)."""
    bufs: list[pickle.PickleBuffer] = []
    head = pickle.dumps(state, protocol=5, buffer_callback=bufs.append)
    raws = [b.raw() for b in bufs]
    sizes = [len(head), *(r.nbytes for r in raws)]
    f.write(struct.pack(f"<{len(sizes) + 1}Q", len(sizes), *sizes))
    f.write(head)
    for r in raws:
        f.write(r)


def _read_exactly(f, n: int) -> bytearray | None:
    """``n`` bytes from the unbuffered file ``f`` (None when it ends first)."""
    out = bytearray(n)
    view = memoryview(out)
    got = 0
    while got < n:
        k = f.readinto(view[got:])
        if not k:
            return None
        got += k
    return out


def receive_state(f) -> dict | None:
    """What :func:`send_state` wrote (None when the stream is cut); the arrays are views of the
    buffers read."""
    count = _read_exactly(f, 8)
    if count is None:
        return None
    n = struct.unpack("<Q", count)[0]
    sizes = _read_exactly(f, 8 * n) if 0 < n < 2**20 else None
    if sizes is None:
        return None
    parts = [_read_exactly(f, size) for size in struct.unpack(f"<{n}Q", sizes)]
    if any(p is None for p in parts):
        return None
    return pickle.loads(parts[0], buffers=parts[1:])
