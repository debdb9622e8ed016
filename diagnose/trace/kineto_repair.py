"""Reading a Kineto document that does not decode as it is (a split of
:mod:`diagnose.trace.kineto`): its top-level keys found with repairs (invalid UTF-8 and raw
control characters become U+FFFD, decimal commas become points, a document cut short keeps
its complete events), each repair recorded for the trace's quality notes.
"""
from __future__ import annotations

import re

import msgspec

from diagnose.errors import TraceFormatError

_raw_items_dec = msgspec.json.Decoder(list[msgspec.Raw])


_BYTE_POS = re.compile(r"\(byte (\d+)\)")


# "key": 0,5 is never valid JSON (after a value and a comma an object needs a key string), so
# a digit,digit right after a key's colon is a number written with a decimal comma.
_DECIMAL_COMMA = re.compile(rb'("\s*:\s*-?\d+),(\d+)(?=\s*[,}\]])')


_CONTROL = re.compile(rb"[\x00-\x08\x0b\x0c\x0e-\x1f]")


_REPLACEMENT = "\ufffd".encode()


def _is_text_error(e: BaseException) -> bool:
    """Invalid UTF-8: msgspec < 0.23 raises UnicodeDecodeError, 0.23+ a DecodeError saying so."""
    return isinstance(e, UnicodeDecodeError) or "utf-8" in str(e).lower()


def _where(buf: bytes, pos: int) -> str:
    line = buf.count(b"\n", 0, pos) + 1
    col = pos - (buf.rfind(b"\n", 0, pos) + 1) + 1
    return f"byte {pos:,} (line {line}, column {col})"


def _split_top(path: str, buf: bytes, lenient: bool = False) -> tuple[dict[str, msgspec.Raw], bool, bytes, list[tuple[str, str, int | None]]]:
    """Return (top-level keys -> raw values, legacy_list, the bytes parsed, repairs made).

    Repairs (always): invalid UTF-8 and raw control characters inside strings become U+FFFD.
    Repairs (``lenient`` only): numbers written with a decimal comma inside event args.
    A document cut short is parsed up to its last complete event (``truncated`` repair).

    Raises:
        TraceFormatError: empty, not JSON, or malformed in a way no repair covers.
    """
    repairs: list[tuple[str, str, int | None]] = []
    head = buf[:64].lstrip()
    if not head:
        raise TraceFormatError(f"{path}: empty file")
    if head[:1] not in (b"{", b"[") or head[1:2] == b"\x00":
        raise TraceFormatError(f"{path}: not a JSON trace (expected a Kineto/Chrome trace object){_encoding_hint(bytes(buf[:8]))}")
    for _attempt in range(4):
        if head[:1] == b"[":
            try:
                _raw_items_dec.decode(buf)  # syntax only: a number beyond float64 is an event's problem
                return {"traceEvents": msgspec.Raw(buf)}, True, buf, repairs
            except (msgspec.DecodeError, UnicodeDecodeError) as e:
                err = e
        else:
            try:
                return msgspec.json.decode(buf, type=dict[str, msgspec.Raw]), False, buf, repairs
            except (msgspec.DecodeError, UnicodeDecodeError) as e:
                err = e
        msg = str(err)
        if _is_text_error(err) or "invalid character" in msg:
            if any(r[0] == "text" for r in repairs):
                break
            fixed = _CONTROL.sub(_REPLACEMENT, buf.decode("utf-8", errors="replace").encode("utf-8"))
            repairs.append(("text", "invalid UTF-8 bytes or raw control characters replaced by U+FFFD", None))
            buf = fixed
            continue
        if "truncated" in msg:
            recovered = _recover_truncated(buf)
            if recovered is None:
                raise TraceFormatError(f"{path}: JSON cut short and no complete event could be recovered") from None
            top, n_cut = recovered
            repairs.append(("truncated", f"JSON cut short: {len(buf) - n_cut:,} trailing bytes after the last complete event were dropped", n_cut))
            return top, False, buf, repairs
        m = _BYTE_POS.search(msg)
        pos = int(m.group(1)) if m else None
        window = buf[max(0, (pos or 0) - 40):(pos or 0) + 40] if pos is not None else b""
        if pos is not None and _DECIMAL_COMMA.search(window):
            if lenient and not any(r[0] == "decimal_comma" for r in repairs):
                n = len(_DECIMAL_COMMA.findall(buf))
                buf = _DECIMAL_COMMA.sub(rb"\1.\2", buf)
                repairs.append(("decimal_comma", f"{n} number(s) written with a decimal comma repaired (--lenient)", n))
                continue
            raise TraceFormatError(
                f"{path}: invalid JSON at {_where(buf, pos)}: a number written with a decimal comma "
                f"(a locale bug in the exporter); rerun with --lenient to repair it"
            ) from None
        where = f" at {_where(buf, pos)}" if pos is not None else ""
        raise TraceFormatError(f"{path}: invalid JSON{where} ({msg})") from None
    raise TraceFormatError(f"{path}: invalid JSON ({err})") from None


def _encoding_hint(head: bytes) -> str:
    """What a document that is not UTF-8 JSON looks like it is in (UTF-16/32 without a
    byte-order mark: every other byte zero), for the error message."""
    if len(head) >= 4 and head[1:2] == b"\x00" and head[3:4] == b"\x00":
        return ": it looks like UTF-16 or UTF-32 text without a byte-order mark; save it as UTF-8"
    if len(head) >= 4 and head[0:1] == b"\x00" and head[2:3] == b"\x00":
        return ": it looks like big-endian UTF-16 or UTF-32 text without a byte-order mark; save it as UTF-8"
    return ""


def _recover_truncated(buf: bytes, max_tries: int = 64) -> tuple[dict[str, msgspec.Raw], int] | None:
    """Parse a Kineto document cut short: the keys before ``traceEvents`` and every complete
    event. Returns (top-level raw values, bytes used) or None."""
    k = buf.find(b'"traceEvents"')
    if k < 0:
        return None
    lb = buf.find(b"[", k)
    if lb < 0:
        return None
    top: dict[str, msgspec.Raw] = {}
    head = buf[:k].rstrip().rstrip(b",").rstrip()
    if head.startswith(b"{") and len(head) > 1:
        try:
            top = msgspec.json.decode(head + b"}", type=dict[str, msgspec.Raw])
        except (msgspec.DecodeError, UnicodeDecodeError):
            top = {}
    end = len(buf)
    for _ in range(max_tries):
        end = buf.rfind(b"}", lb, end)
        if end < 0:
            break
        candidate = buf[lb:end + 1] + b"]"
        try:
            msgspec.json.decode(candidate)
        except (msgspec.DecodeError, UnicodeDecodeError):
            continue
        top["traceEvents"] = msgspec.Raw(candidate)
        return top, end + 1
    top["traceEvents"] = msgspec.Raw(b"[]")
    return top, lb + 1
