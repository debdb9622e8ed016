"""GPU peak table and device-name resolution for analytic bounds.

The table ships as package data (``diagnose/data/gpus.yaml``), one row per part with its
vendor source. Peaks are dense tensor-core figures (never 2:4 sparsity figures); units are
named in every field: TFLOP/s = 1e12 FLOP/s, TB/s = 1e12 B/s, GB = the vendor's capacity
label. The ridge point of a row is peak FLOP/s / peak B/s (docs/prefill-decode.md section 3).

``--gpu`` takes a row name, a short name of the table (``H100`` is the SXM part: the tool
says so and how to pick the PCIe card) or a device name as traces write it; an unknown name
is refused with the closest names (``H10``: did you mean H100-SXM, H100-PCIe, ...).
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
from dataclasses import dataclass
from typing import Any, Iterable

from diagnose.errors import DiagnoseError
from diagnose.tables import gpu_table


@dataclass(frozen=True)
class GpuPeak:
    """Peak figures of one GPU.

    Attributes:
        name: row name accepted by ``--gpu`` (e.g. "H100-SXM").
        vendor: "NVIDIA", "AMD", or "" for a peak given only by flags.
        aliases: regexes matched case-insensitively against trace device names.
        dense_fp16_tflops: dense FP16/BF16 tensor-core peak, TFLOP/s; None if unknown.
        dense_fp8_tflops: dense FP8 tensor-core peak, TFLOP/s; None where the part has none.
        fp32_tflops: FP32 peak without tensor cores (NVIDIA CUDA-core SIMT; AMD CDNA FP32
            matrix), TFLOP/s; None if unpublished.
        tf32_tflops: dense TF32 tensor-core peak, TFLOP/s; None where the part has none.
        precision_source: the document the fp32/tf32 figures come from.
        memory_bandwidth_tbps: peak device-memory bandwidth, TB/s; None if unknown.
        memory_gb: memory capacity label in GB; None if unknown.
        source: vendor document the figures come from.
        source_url: its address.
        note: caveats (ambiguous or derived figures), or None.
        overrides: names of fields given by command-line flags.
        selection: how this row was chosen, for the reports ("--gpu MI300X", "--gpu H100,
            taken as H100-SXM; for the PCIe card give --gpu H100-PCIe ...", "the trace's
            device name 'NVIDIA H200'", "--peak-tflops/--bandwidth-tbps"); "" for a row read
            from the table directly.
    """

    name: str
    vendor: str
    aliases: tuple[str, ...]
    dense_fp16_tflops: float | None
    dense_fp8_tflops: float | None
    memory_bandwidth_tbps: float | None
    memory_gb: float | None
    source: str
    source_url: str
    note: str | None = None
    overrides: tuple[str, ...] = ()
    selection: str = ""
    fp32_tflops: float | None = None
    tf32_tflops: float | None = None
    precision_source: str = ""

    def peak_tflops_for(self, dtype: str | None) -> float | None:
        """The compute peak (TFLOP/s) work of ``dtype`` runs against (:data:`diagnose.vocab.DTYPES`):
        ``fp32`` the FP32 peak without tensor cores, ``tf32`` the TF32 tensor peak, ``fp16``/
        ``bf16`` (and None: unknown) the dense FP16/BF16 tensor peak, ``fp8`` the FP8 peak;
        ``fp4``/``int8`` the FP8 peak where the part has one (the table has no FP4/INT8
        column; Blackwell's FP4 is 2x its FP8), else FP16/BF16. A dtype whose peak the table
        lacks falls back to the FP16/BF16 peak."""
        by = {"fp32": self.fp32_tflops, "tf32": self.tf32_tflops, "fp8": self.dense_fp8_tflops,
              "fp4": self.dense_fp8_tflops, "int8": self.dense_fp8_tflops}
        v = by.get(dtype) if dtype is not None else None
        return v if v else self.dense_fp16_tflops

    @property
    def ridge_flop_per_byte(self) -> float | None:
        """Ridge point = dense FP16 peak FLOP/s / peak B/s, FLOP/B (docs/prefill-decode.md section 3)."""
        if not self.dense_fp16_tflops or not self.memory_bandwidth_tbps:
            return None
        return self.dense_fp16_tflops / self.memory_bandwidth_tbps

    def to_dict(self) -> dict[str, Any]:
        """The one serialisation of a peak, as the JSON report's ``gpu`` object uses it.

        Returns:
            ``name``; ``peak_tflops`` (dense FP16/BF16, TFLOP/s) and ``peak_tbps`` (memory
            bandwidth, TB/s), each None when unknown; ``ridge_flop_per_byte`` (FLOP/B or
            None); ``source`` (the datasheet, or "command-line flags"); ``overrides`` (list
            of the fields replaced by flags); ``selection`` (how the row was chosen: see the
            attribute).
        """
        return {
            "name": self.name,
            "peak_tflops": self.dense_fp16_tflops,
            "peak_tbps": self.memory_bandwidth_tbps,
            "ridge_flop_per_byte": self.ridge_flop_per_byte,
            "source": self.source,
            "overrides": list(self.overrides),
            "selection": self.selection,
        }


def _positive_number(value: Any) -> bool:
    """A positive finite number (inf would make every MFU/MBU 0; NaN passes no comparison)."""
    return not isinstance(value, bool) and isinstance(value, (int, float)) and 0 < value < math.inf


@functools.lru_cache(maxsize=1)
def load_gpu_table() -> tuple[GpuPeak, ...]:
    """The packaged GPU peak table (``diagnose/data/gpus.yaml``, typed by :mod:`diagnose.tables`).

    Returns:
        The rows, in file order.

    Raises:
        DiagnoseError: the table is malformed (missing field, non-positive number, bad
            regex, duplicate name).
    """
    rows = tuple(
        GpuPeak(
            name=r.name,
            vendor=r.vendor,
            aliases=tuple(r.aliases),
            dense_fp16_tflops=r.dense_fp16_tflops,
            dense_fp8_tflops=r.dense_fp8_tflops,
            memory_bandwidth_tbps=r.memory_bandwidth_tbps,
            memory_gb=r.memory_gb,
            source=r.source,
            source_url=r.source_url,
            note=None if r.note is None else r.note.strip(),
            fp32_tflops=r.fp32_tflops,
            tf32_tflops=r.tf32_tflops,
            precision_source=r.precision_source,
        )
        for r in gpu_table().gpus
    )
    seen: set[str] = set()
    for row in rows:
        key = _normalize(row.name)
        if key in seen:
            raise DiagnoseError(f"gpus.yaml has two rows named {row.name!r}")
        seen.add(key)
    return rows


def _normalize(name: str) -> str:
    return re.sub(r"[^a-z0-9]", "", name.lower())


def resolve_gpu(device_name: str, table: Iterable[GpuPeak] | None = None) -> GpuPeak | None:
    """Find the table row for a device name as it appears in a trace.

    Every alias is tried with a case-insensitive ``re.search``. When several rows match,
    the most specific alias wins: the longest matched text, then the longest pattern.

    Args:
        device_name: e.g. "NVIDIA H100 80GB HBM3", "AMD Instinct MI300X VF".
        table: rows to search; defaults to :func:`load_gpu_table`.

    Returns:
        The row, or None when the name is empty/whitespace or nothing matches.
    """
    if not isinstance(device_name, str) or not device_name.strip():
        return None
    rows = load_gpu_table() if table is None else tuple(table)
    best: tuple[int, int] | None = None
    found: GpuPeak | None = None
    for row in rows:
        for alias in row.aliases:
            m = re.search(alias, device_name, re.IGNORECASE)
            if m is None:
                continue
            score = (m.end() - m.start(), len(alias))
            if best is None or score > best:
                best, found = score, row
    return found


def gpu_names(table: Iterable[GpuPeak] | None = None) -> list[str]:
    """Row names accepted by ``--gpu``."""
    return [row.name for row in (load_gpu_table() if table is None else table)]


@functools.lru_cache(maxsize=1)
def gpu_short_names() -> dict[str, tuple[str, str]]:
    """Short ``--gpu`` names of the table (``short_names`` in ``gpus.yaml``).

    Returns:
        normalized short name -> (row name, how to pick the family's other parts).
    """
    return {_normalize(s.name): (s.row, s.others) for s in gpu_table().short_names}


def suggest_gpu_names(name: str, n: int = 5) -> list[str]:
    """Row names close to an unknown ``--gpu`` value, best first (at most ``n``).

    Names that start with the value come first ("H10" -> H100-SXM, H100-PCIe), then the
    closest by :func:`difflib.get_close_matches` (ratio >= 0.55) over row names and short
    names; a short name stands for its row. Case and punctuation are ignored.
    """
    key = _normalize(name or "")
    if not key:
        return []
    cands: dict[str, str] = {_normalize(r.name): r.name for r in load_gpu_table()}
    for short, (row, _) in gpu_short_names().items():
        cands.setdefault(short, row)
    out: list[str] = []
    for k in sorted(cands, key=lambda k: (len(k), k)):
        if k.startswith(key) and cands[k] not in out:
            out.append(cands[k])
    for k in difflib.get_close_matches(key, list(cands), n=len(cands), cutoff=0.55):
        if cands[k] not in out:
            out.append(cands[k])
    return out[:n]


def gpu_by_name(name: str) -> GpuPeak:
    """Row for a ``--gpu NAME`` flag.

    Matching ignores case and punctuation ("h100-sxm", "H100 SXM", "h200",
    "a100-80gb-sxm"); then the table's short names ("H100" is the SXM part: the returned
    row's ``selection`` says so and names the PCIe row); failing that, the name is resolved
    like a trace device name ("NVIDIA A100-SXM4-80GB").

    Returns:
        The row, its ``selection`` saying how ``name`` was read.

    Raises:
        DiagnoseError: unknown name; the one-line message gives the closest names
            (:func:`suggest_gpu_names`) and every valid one.
    """
    rows = load_gpu_table()
    key = _normalize(name or "")
    if key:
        for row in rows:
            if _normalize(row.name) == key:
                return dataclasses.replace(row, selection=f"--gpu {name}")
        short = gpu_short_names().get(key)
        if short is not None:
            target, others = short
            row = next(r for r in rows if r.name == target)
            return dataclasses.replace(row, selection=f"--gpu {name}, taken as {row.name}; {others}")
    row = resolve_gpu(name or "")
    if row is not None:
        return dataclasses.replace(row, selection=f"--gpu {name}, taken as {row.name}")
    close = suggest_gpu_names(name)
    hint = f"did you mean {', '.join(close)}? " if close else ""
    raise DiagnoseError(f"unknown GPU {name!r}: {hint}valid names: {', '.join(gpu_names(rows))}")


def peak_from_overrides(
    gpu: str | None = None,
    peak_tflops: float | None = None,
    bandwidth_tbps: float | None = None,
    device_name: str = "",
) -> GpuPeak | None:
    """Peak figures from ``--gpu``, ``--peak-tflops``/``--bandwidth-tbps`` and a trace name.

    The base row is ``gpu_by_name(gpu)`` when ``gpu`` is given, else
    ``resolve_gpu(device_name)``. Flags replace the row's dense FP16 peak and bandwidth
    (recorded in ``overrides``). Without a row, flags alone give a row named "custom"
    whose unknown fields are None.

    Args:
        gpu: ``--gpu`` value, or None.
        peak_tflops: dense peak override, TFLOP/s (> 0).
        bandwidth_tbps: bandwidth override, TB/s (> 0).
        device_name: device name from a trace.

    Returns:
        The peak, or None when nothing is known.

    Raises:
        DiagnoseError: unknown ``gpu`` or a non-positive override.
    """
    for value, flag in ((peak_tflops, "--peak-tflops"), (bandwidth_tbps, "--bandwidth-tbps")):
        if value is not None and not _positive_number(value):
            raise DiagnoseError(f"{flag} must be a positive finite number, got {value!r}")
    if gpu is not None:
        base = gpu_by_name(gpu)
    else:
        base = resolve_gpu(device_name)
        if base is not None:
            base = dataclasses.replace(base, selection=f"the trace's device name {device_name!r}")
    if base is None and peak_tflops is None and bandwidth_tbps is None:
        return None
    if base is None:
        base = GpuPeak(
            name="custom",
            vendor="",
            aliases=(),
            dense_fp16_tflops=None,
            dense_fp8_tflops=None,
            memory_bandwidth_tbps=None,
            memory_gb=None,
            source="command-line flags",
            source_url="",
            selection="--peak-tflops/--bandwidth-tbps",
        )
    changes: dict[str, Any] = {}
    if peak_tflops is not None:
        changes["dense_fp16_tflops"] = float(peak_tflops)
    if bandwidth_tbps is not None:
        changes["memory_bandwidth_tbps"] = float(bandwidth_tbps)
    if not changes:
        return base
    return dataclasses.replace(base, overrides=base.overrides + tuple(changes), **changes)


def describe_peak(gpu: dict[str, Any]) -> str:
    """One line for the peaks a report used (its ``gpu`` object, :meth:`GpuPeak.to_dict`):
    row name, dense FP16/BF16 TFLOP/s, TB/s and how the row was chosen, e.g. "MI300X:
    1307.4 TFLOP/s dense FP16/BF16, 5.3 TB/s; from --gpu MI300X"."""
    def num(v: Any, unit: str) -> str:
        return f"{v:g} {unit}" if isinstance(v, (int, float)) else f"? {unit}"  # a peak no flag gave

    how = gpu.get("selection") or gpu.get("source") or ""
    over = [o for o in gpu.get("overrides") or [] if gpu.get("name") != "custom"]
    if over:
        how += ("; " if how else "") + "flags override " + ", ".join(over)
    return (f"{gpu.get('name')}: {num(gpu.get('peak_tflops'), 'TFLOP/s')} dense FP16/BF16, "
            f"{num(gpu.get('peak_tbps'), 'TB/s')}" + (f"; from {how}" if how else ""))


def describe_devices(devices: Iterable[dict[str, Any]], gpu: dict[str, Any] | None = None) -> str:
    """The devices of a report as one line ("2: AMD Instinct MI300X"). A device the trace
    does not name shows the part whose peaks were used when there is one ("2: (unnamed in
    the trace; peaks of MI300X)"), else "(unnamed)"."""
    out = []
    for x in devices:
        name = x.get("name")
        if not name:
            if not gpu or not gpu.get("name"):
                name = "(unnamed)"
            elif gpu["name"] == "custom":
                name = "(unnamed in the trace; peaks from --peak-tflops/--bandwidth-tbps)"
            else:
                name = f"(unnamed in the trace; peaks of {gpu['name']})"
        out.append(f"{x.get('id')}: {name}")
    return ", ".join(out)
