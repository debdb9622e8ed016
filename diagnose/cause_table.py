"""The cause table (``diagnose/data/causes.yaml``): every cause of GPU waiting, its precedence
in the host classifier, whether it is the step's own cost, its colour in every view, and its
levers; and the levers themselves. The only place these are defined: :mod:`diagnose.vocab`
re-exports them (``GAP_CAUSES``, ``CAUSE_COLORS``, ``LEVERS``...), the analyzers, the rules
engine and the views read them from there.

The file is converted with msgspec into :class:`CauseTable` (unknown keys, wrong types and
missing fields are refused with the path of the offending value), then checked: names are
unique, colours are ``#rrggbb``, every lever a cause names exists, precedences are 1..n
without repeats.
"""
from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Optional

import msgspec

from diagnose.yamlio import load_yaml

CAUSES_FILE = "causes.yaml"
_COLOR = re.compile(r"^#[0-9a-fA-F]{6}$")


class Cause(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One cause (see the comments at the top of ``causes.yaml``)."""

    name: str
    label: str
    short: str
    precedence: Optional[int]
    external: bool
    color: str
    levers: list[str]
    basis: str


class Lever(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """A fix direction a cause or a rule recommends. ``present_when``: a condition (rule
    condition language, finding names with dots) showing the lever is already in place."""

    name: str
    text: str
    present_when: str = ""
    present_text: str = ""


class CauseTable(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    causes: list[Cause]
    levers: list[Lever]

    def cause(self, name: str) -> Cause:
        """The cause called ``name``.

        Raises:
            KeyError: no such cause.
        """
        for c in self.causes:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def host_order(self) -> tuple[str, ...]:
        """Causes read from the host's activity, in the order the classifier tests them."""
        return tuple(c.name for c in sorted((c for c in self.causes if c.precedence is not None), key=lambda c: c.precedence))


class CauseTableError(ValueError):
    """The packaged cause table is malformed (a packaging bug, never user input)."""


def check(table: CauseTable, where: str = f"diagnose/data/{CAUSES_FILE}") -> CauseTable:
    """Checks types cannot express.

    Raises:
        CauseTableError: duplicate names, a bad colour, an unknown lever, precedences not 1..n.
    """
    names = [c.name for c in table.causes]
    levers = [lv.name for lv in table.levers]
    for what, seq in (("cause", names), ("lever", levers)):
        dup = sorted({n for n in seq if seq.count(n) > 1})
        if dup:
            raise CauseTableError(f"{where}: {what} names repeated: {', '.join(dup)}")
    for c in table.causes:
        if not _COLOR.match(c.color):
            raise CauseTableError(f"{where}: cause {c.name!r}: color {c.color!r} is not #rrggbb")
        for lv in c.levers:
            if lv not in levers:
                raise CauseTableError(f"{where}: cause {c.name!r}: lever {lv!r} is not in levers")
    prec = sorted(c.precedence for c in table.causes if c.precedence is not None)
    if prec != list(range(1, len(prec) + 1)):
        raise CauseTableError(f"{where}: precedences must be 1..{len(prec)} without repeats, got {prec}")
    return table


@lru_cache(maxsize=None)
def cause_table() -> CauseTable:
    """The packaged cause table, checked (cached).

    Raises:
        CauseTableError: the file does not fit :class:`CauseTable` or fails :func:`check`.
    """
    text = resources.files("diagnose.data").joinpath(CAUSES_FILE).read_text(encoding="utf-8")
    try:
        table = msgspec.convert(load_yaml(text), CauseTable)
    except msgspec.ValidationError as e:
        raise CauseTableError(f"diagnose/data/{CAUSES_FILE}: {e}") from None
    return check(table)


def causes_markdown() -> str:
    """The README's cause table (between its ``causes`` markers): cause, precedence, whether
    it is the step's own cost, colour, levers, meaning."""
    t = cause_table()
    text = {lv.name: lv.name for lv in t.levers}
    rows = ["| cause | host precedence | the step's own cost | colour | levers | meaning |", "|---|---|---|---|---|---|"]
    for c in t.causes:
        prec = str(c.precedence) if c.precedence is not None else "—"
        levers = ", ".join(f"`{text[x]}`" for x in c.levers) or "—"
        rows.append(f"| `{c.name}` | {prec} | {'no (external)' if c.external else 'yes'} | `{c.color}` | {levers} | {c.label} |")
    rows += ["", "| lever | what to change |", "|---|---|"]
    rows += [f"| `{lv.name}` | {lv.text} |" for lv in t.levers]
    return "\n".join(rows)


if __name__ == "__main__":  # pragma: no cover - `python -m diagnose.cause_table` prints the README table
    print(causes_markdown())
