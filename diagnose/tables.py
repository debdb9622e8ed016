"""The packaged data tables, typed: each YAML file in ``diagnose/data/`` is converted with
msgspec into Structs (unknown keys, wrong types and missing fields are refused with the path
of the offending value), then checked for what types cannot say (regexes compile, numbers
are positive). One loader for every table instead of hand validation per table.
"""
from __future__ import annotations

import re
from functools import lru_cache
from importlib import resources
from typing import Any, Literal, Optional

import msgspec

from diagnose.errors import DiagnoseError
from diagnose.vocab import CATEGORIES, STEP_PHASES
from diagnose.yamlio import load_yaml


class CategoryRow(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    category: Literal[tuple(c for c in CATEGORIES if c not in ("memcpy", "memset"))]  # type: ignore[valid-type]
    pattern: str
    source: str


class CategoryTable(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    categories: list[CategoryRow]


class MarkerGrammar(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    pattern: str
    source: str
    phase_map: Optional[dict[str, Literal[STEP_PHASES]]] = None  # type: ignore[valid-type]
    evidence: Literal["marker", "profiler_step"] = "marker"


class NotStepRow(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    pattern: str
    source: str


class FrameGrammar(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    pattern: str
    source: str
    inner: Optional[str] = None


class PhaseFrame(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    phase: Literal[STEP_PHASES]  # type: ignore[valid-type]
    pattern: str
    source: str


class MarkerTable(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    grammars: list[MarkerGrammar]
    not_steps: list[NotStepRow] = []
    frames: list[FrameGrammar] = []
    phase_frames: list[PhaseFrame] = []


HOST_TESTS = ("lazy_loading", "profiler", "profiler_frame", "module_load", "blocking", "poll", "sync_frame", "compile",
              "data_loading", "guard", "dynamo_entry", "framework_frame", "stream_wait", "os_wait")
HOST_EVENT_KINDS = ("overhead", "runtime", "op", "range", "frame", "os")


class HostCallRow(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    """One test of the host-cause classifier (``diagnose/data/host_calls.yaml``)."""

    test: Literal[HOST_TESTS]  # type: ignore[valid-type]
    cause: Optional[str]
    scope: Literal["chain", "innermost", "graph_entry"]
    events: list[Literal[HOST_EVENT_KINDS]]  # type: ignore[valid-type]
    pattern: str
    source: str


class HostCallTable(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    rows: list[HostCallRow]


class GpuRow(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    vendor: str
    aliases: list[str]
    dense_fp16_tflops: float
    dense_fp8_tflops: Optional[float]
    fp32_tflops: Optional[float]
    tf32_tflops: Optional[float]
    precision_source: str
    memory_bandwidth_tbps: float
    memory_gb: float
    source: str
    source_url: str
    note: Optional[str]


class GpuShortName(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    row: str
    others: str


class GpuTable(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    gpus: list[GpuRow]
    short_names: list[GpuShortName] = []


class FindingRow(msgspec.Struct, forbid_unknown_fields=True, frozen=True):
    name: str
    unit: str
    description: str


def _compile(pattern: str, where: str, flags: int = 0, check_repeats: bool = False) -> None:
    """Compile a table's regex (``re`` caches it for the analyzers); with ``check_repeats``
    also refuse one that nests repeats (exponential backtracking on a hostile name,
    :func:`diagnose.patterns.check_pattern`): the shipped tables are checked so by the test
    suite (``tests/test_robustness3.py``), not on every run (0.1 s of parsing per process).

    Raises:
        DiagnoseError: the pattern does not compile (or nests repeats, when checked).
    """
    if check_repeats:
        from diagnose.patterns import check_pattern

        check_pattern(pattern, where, flags)
        return
    try:
        re.compile(pattern, flags)
    except (re.error, RecursionError, OverflowError) as e:
        raise DiagnoseError(f"{where}: invalid regex {pattern[:80]!r} ({e})") from None


def load_table(filename: str, kind: Any, check_repeats: bool = False):
    """``diagnose/data/<filename>`` converted to ``kind``; ``check_repeats``: also refuse a
    regex that nests repeats (:func:`_compile`).

    Raises:
        DiagnoseError: the file does not fit the type (the message names the file and path),
            a regex does not compile, or a number is not positive.
    """
    text = resources.files("diagnose.data").joinpath(filename).read_text(encoding="utf-8")
    try:
        table = msgspec.convert(load_yaml(text), kind)
    except msgspec.ValidationError as e:
        raise DiagnoseError(f"diagnose/data/{filename}: {e}") from None
    if isinstance(table, dict):
        return table
    if isinstance(table, GpuTable):
        for r in table.gpus:
            if not r.aliases:
                raise DiagnoseError(f"diagnose/data/{filename}: row {r.name!r}: aliases must not be empty")
            for a in r.aliases:
                _compile(a, f"diagnose/data/{filename}: row {r.name!r}", re.IGNORECASE, check_repeats)
            for k in ("dense_fp16_tflops", "memory_bandwidth_tbps", "memory_gb", "dense_fp8_tflops", "fp32_tflops", "tf32_tflops"):
                v = getattr(r, k)
                if v is not None and not v > 0:
                    raise DiagnoseError(f"diagnose/data/{filename}: row {r.name!r}: {k} must be a positive number")
        rows = {r.name for r in table.gpus}
        for s in table.short_names:
            if s.row not in rows:
                raise DiagnoseError(f"diagnose/data/{filename}: short name {s.name!r} maps to {s.row!r}, which is not a row")
    else:
        rows = list(getattr(table, "categories", None) or getattr(table, "grammars", None) or getattr(table, "rows", None) or ())
        for extra in ("not_steps", "frames", "phase_frames"):
            rows += list(getattr(table, extra, None) or ())
        for r in rows:
            _compile(r.pattern, f"diagnose/data/{filename}", re.IGNORECASE, check_repeats)
            if getattr(r, "inner", None):
                _compile(r.inner, f"diagnose/data/{filename}", re.IGNORECASE, check_repeats)
    return table


@lru_cache(maxsize=None)
def category_table() -> CategoryTable:
    return load_table("kernel_categories.yaml", CategoryTable)


@lru_cache(maxsize=None)
def marker_table() -> MarkerTable:
    return load_table("step_markers.yaml", MarkerTable)


@lru_cache(maxsize=None)
def host_call_table() -> HostCallTable:
    """The host classifier's tests; each row's cause is one of the cause table's host causes.

    Raises:
        DiagnoseError: the file does not fit, a regex does not compile, a test is listed twice
            or names a cause the cause table does not read from the host.
    """
    from diagnose.vocab import HOST_CAUSES

    table = load_table("host_calls.yaml", HostCallTable)
    seen = set()
    for r in table.rows:
        if r.test in seen:
            raise DiagnoseError(f"diagnose/data/host_calls.yaml: test {r.test!r} listed twice")
        seen.add(r.test)
        if r.cause is not None and r.cause not in HOST_CAUSES:
            raise DiagnoseError(f"diagnose/data/host_calls.yaml: test {r.test!r}: cause {r.cause!r} is not a host cause of "
                                f"diagnose/data/causes.yaml ({', '.join(HOST_CAUSES)})")
    missing = [t for t in HOST_TESTS if t not in seen]
    if missing:
        raise DiagnoseError(f"diagnose/data/host_calls.yaml: tests missing: {', '.join(missing)}")
    return table


@lru_cache(maxsize=None)
def gpu_table() -> GpuTable:
    return load_table("gpus.yaml", GpuTable)


@lru_cache(maxsize=None)
def finding_table() -> dict[str, list[FindingRow]]:
    """The finding catalog, by declaring module (``diagnose/data/findings.yaml``)."""
    return load_table("findings.yaml", dict[str, list[FindingRow]])
