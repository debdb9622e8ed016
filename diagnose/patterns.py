"""Regexes applied to text a trace controls (kernel, API, marker, device and module names):
bounded work per input byte.

Python's ``re`` backtracks. A pattern ``A.*B`` searched in a name made of many ``A``s costs
the square of the name's length (a 400 KB kernel name took minutes), and nested repeats
such as ``(a+)+`` cost an exponential. Two rules bound the work:

* every pattern this project ships (the classification tables in ``diagnose/data/`` and the
  patterns in the code) is linear in the text: no nested unbounded repeats (checked when the
  tables load, :func:`check_pattern`), and no unanchored ``A.*B`` search (written as
  ``^(?s:(?:(?!A).)*)A.*B``: only the first ``A`` is tried); ``tests/test_robustness3.py``
  times each one on adversarial text of growing length;
* a pattern from outside (``--phase-regex``, a model config's ``modules_to_not_convert``
  regexes) must pass :func:`check_pattern` too, and is matched on the first
  :data:`MATCH_PREFIX_CHARS` characters of the text only (:func:`clip`), so that even a
  quadratic user pattern costs at most that many steps per character.
"""
from __future__ import annotations

import re
from collections.abc import Callable
from functools import lru_cache

try:  # Python 3.11+
    from re import _parser as _sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_parse as _sre_parse  # type: ignore[no-redef]

from diagnose.errors import DiagnoseError

#: Characters of a name that patterns from outside (and step markers) are matched against.
#: The longest name in the shared corpus is 5,123 characters, its base name (what the kernel
#: categories read) 1,677; step markers are under 100.
MATCH_PREFIX_CHARS = 4096

_REPEATS = {_sre_parse.MAX_REPEAT, _sre_parse.MIN_REPEAT}
_POSSESSIVE = getattr(_sre_parse, "POSSESSIVE_REPEAT", None)
if _POSSESSIVE is not None:
    _REPEATS.add(_POSSESSIVE)
_MAXREPEAT = _sre_parse.MAXREPEAT


def clip(text: str) -> str:
    """The first :data:`MATCH_PREFIX_CHARS` characters of ``text``."""
    return text if len(text) <= MATCH_PREFIX_CHARS else text[:MATCH_PREFIX_CHARS]


def _nested(items, depth: int) -> int:
    """Largest number of unbounded repeats nested in one another in a parsed pattern."""
    best = depth
    for op, av in items:
        if op in _REPEATS:
            lo, hi, sub = av
            d = depth + (1 if hi == _MAXREPEAT or hi > 64 else 0)
            best = max(best, _nested(sub, d))
        elif op is _sre_parse.SUBPATTERN:
            best = max(best, _nested(av[-1], depth))
        elif op is _sre_parse.BRANCH:
            for b in av[1]:
                best = max(best, _nested(b, depth))
        elif op in (_sre_parse.ASSERT, _sre_parse.ASSERT_NOT):  # atomic: never backtracked into
            best = max(best, _nested(av[1], 0))
        elif op is _sre_parse.GROUPREF_EXISTS:
            for b in av[1:]:
                if b is not None:
                    best = max(best, _nested(b, depth))
        elif getattr(_sre_parse, "ATOMIC_GROUP", None) is not None and op is _sre_parse.ATOMIC_GROUP:
            best = max(best, _nested(av, depth))
    return best


def star_height(pattern: str, flags: int = 0) -> int:
    """How deeply unbounded repeats (``*``, ``+``, ``{n,}``) nest in ``pattern``: 1 for
    ``a.*b``, 2 for ``(a+)+`` (exponential backtracking).

    Raises:
        re.error: the pattern does not parse.
    """
    return _nested(_sre_parse.parse(pattern, flags), 0)


def check_pattern(pattern: str, where: str, flags: int = 0) -> re.Pattern:
    """Compile ``pattern``, refusing one whose backtracking can be exponential (unbounded
    repeats nested in one another, such as ``(a+)+`` or ``(.*)*``).

    Raises:
        DiagnoseError: the pattern does not compile, or nests unbounded repeats (the message
            starts with ``where``).
    """
    try:
        rx = re.compile(pattern, flags)
        height = star_height(pattern, flags)
    except (re.error, RecursionError, OverflowError) as e:
        raise DiagnoseError(f"{where}: invalid regex {pattern[:80]!r} ({e})") from None
    if height > 1:
        raise DiagnoseError(f"{where}: regex {pattern[:80]!r} nests repeats (such as (a+)+): its matching time can "
                            "grow exponentially with the text; rewrite it without a repeat inside a repeat")
    return rx


@lru_cache(maxsize=256)
def outside_pattern(pattern: str, flags: int = 0) -> re.Pattern | None:
    """A pattern from a config file or trace metadata, compiled once; None when it does not
    compile or nests repeats (:func:`check_pattern`)."""
    try:
        return check_pattern(pattern, "pattern", flags)
    except DiagnoseError:
        return None


def ascii_folded(rx: re.Pattern) -> Callable[[str], bool]:
    """``bool(rx.search(text))`` for a case-insensitive ``rx`` (``re.I``), faster on ASCII
    text: that text lower-cased, searched with a case-sensitive twin of ``rx`` whose letters
    are lower-cased. CPython's ``re`` finds literal prefixes and first-character sets only
    for case-sensitive patterns: the twin searched the 174 kernel names (308 characters on
    average) of a training trace 6-9x faster.

    The twin stands for ``rx`` only where that is exact, which is checked on the parsed
    patterns: ``rx`` is ASCII (no ``ſ`` or Kelvin sign matching ``s`` or ``k``), holds no
    case-sensitive group (``(?-i:...)``) and no character range that takes some upper-case letters
    without their whole run, and the twin parses to ``rx``'s tree with each upper-case
    letter lower-cased (an escape such as ``\\x41``, or a named group, fails this). For ASCII
    text, lower-casing changes only A-Z, and a case-insensitive match reads text only
    through case-insensitive comparisons, so both searches agree. Other patterns, and text
    that is not ASCII, are searched with ``rx`` itself."""
    twin = _lower_twin(rx) if rx.flags & re.IGNORECASE else None
    if twin is None:
        return lambda text: rx.search(text) is not None
    search, slow = twin.search, rx.search
    return lambda text: (search(text.lower()) if text.isascii() else slow(text)) is not None


@lru_cache(maxsize=256)
def _lower_twin(rx: re.Pattern) -> re.Pattern | None:
    """The case-sensitive twin of ``rx`` (:func:`ascii_folded`), None where it is not exact;
    built once per pattern (each analysis, each rank of a multi-trace run, asks again)."""
    pattern = rx.pattern
    if not isinstance(pattern, str) or not pattern.isascii():
        return None
    flags = rx.flags & ~re.IGNORECASE
    out, i = [], 0
    while i < len(pattern):  # letters lower-cased, escapes kept as written
        if pattern[i] == "\\":
            out.append(pattern[i:i + 2])
            i += 2
        else:
            out.append(pattern[i].lower())
            i += 1
    try:
        want = _lowered(_sre_parse.parse(pattern, rx.flags))
        got = _shape(_sre_parse.parse("".join(out), flags))
        twin = re.compile("".join(out), flags)
    except (re.error, _Inexact, RecursionError):
        return None
    return twin if want == got else None


class _Inexact(Exception):
    pass


_UPPER = range(ord("A"), ord("Z") + 1)


def _low(c: int) -> int:
    return c + 32 if c in _UPPER else c


def _lowered(x):
    """A parsed pattern as nested tuples (:func:`_shape`) with its upper-case letters
    lower-cased. Raises _Inexact where lower-casing would change what it matches."""
    if isinstance(x, _sre_parse.SubPattern):
        return ("sub", tuple(_lowered_item(op, av) for op, av in x.data))
    if isinstance(x, (list, tuple)):
        return tuple(_lowered(v) for v in x)
    return x


def _lowered_item(op, av):
    if op in (_sre_parse.LITERAL, _sre_parse.NOT_LITERAL):
        return (op, _low(av))
    if op is _sre_parse.RANGE:
        lo, hi = av
        upper = [c for c in _UPPER if lo <= c <= hi]
        if upper and not (lo in _UPPER and hi in _UPPER):
            raise _Inexact  # e.g. [A-z]: also takes [ \ ] ^ _ `, which lower-casing cannot keep apart
        return (op, (_low(lo), _low(hi)))
    if op is _sre_parse.SUBPATTERN and av[2] & re.IGNORECASE:
        raise _Inexact  # (?-i:...): a case-sensitive part
    if op is _sre_parse.IN:
        return (op, tuple(_lowered_item(o, a) for o, a in av))
    return (op, _lowered(av))


def _shape(x):
    """A parsed pattern as nested tuples, comparable with ``==``."""
    if isinstance(x, _sre_parse.SubPattern):
        return ("sub", tuple((op, _shape(av)) for op, av in x.data))
    if isinstance(x, (list, tuple)):
        return tuple(_shape(v) for v in x)
    return x
