"""GPU peak table: completeness, trace-name resolution, --gpu names, flag overrides."""

from __future__ import annotations

import dataclasses

import pytest

from diagnose.errors import DiagnoseError
from diagnose.hardware import (
    GpuPeak,
    gpu_by_name,
    gpu_names,
    load_gpu_table,
    peak_from_overrides,
    resolve_gpu,
)

EXPECTED_ROWS = {
    "V100-32GB-SXM2",
    "A100-40GB-SXM",
    "A100-80GB-SXM",
    "A100-40GB-PCIe",
    "A100-80GB-PCIe",
    "A10G",
    "L4",
    "L40S",
    "RTX-4090",
    "RTX-4080-Laptop",
    "H100-SXM",
    "H100-PCIe",
    "H200",
    "H20",
    "B200",
    "MI210",
    "MI250X",
    "MI300X",
    "MI355X",
}


def test_table_loads_with_every_row() -> None:
    rows = load_gpu_table()
    assert {r.name for r in rows} == EXPECTED_ROWS
    assert len(rows) == len(EXPECTED_ROWS)
    assert set(gpu_names()) == EXPECTED_ROWS


@pytest.mark.parametrize("row", load_gpu_table(), ids=lambda r: r.name)
def test_row_complete(row: GpuPeak) -> None:
    assert row.vendor in {"NVIDIA", "AMD"}
    assert row.aliases and all(isinstance(a, str) and a for a in row.aliases)
    assert row.dense_fp16_tflops > 0
    assert row.dense_fp8_tflops is None or row.dense_fp8_tflops > 0
    assert row.memory_bandwidth_tbps > 0
    assert row.memory_gb > 0
    assert row.source.strip()
    assert row.source_url.startswith("https://")
    assert row.ridge_flop_per_byte == pytest.approx(row.dense_fp16_tflops / row.memory_bandwidth_tbps)
    assert row.overrides == ()


def test_dense_not_sparse_reference_figures() -> None:
    h100 = gpu_by_name("H100-SXM")
    assert (h100.dense_fp16_tflops, h100.dense_fp8_tflops) == (989.4, 1978.9)
    assert h100.memory_bandwidth_tbps == 3.35
    assert gpu_by_name("A100-80GB-SXM").dense_fp16_tflops == 312.0
    mi300x = gpu_by_name("MI300X")
    assert (mi300x.dense_fp16_tflops, mi300x.memory_bandwidth_tbps) == (1307.4, 5.3)
    # parts without FP8 units
    for name in ("V100-32GB-SXM2", "A100-80GB-SXM", "MI210", "MI250X"):
        assert gpu_by_name(name).dense_fp8_tflops is None
    # FP8 dense is 2x FP16 dense wherever both exist (L40S's datasheet is 1.2 % off: 733
    # vs 2 * 362.05); a 4x ratio would mean a sparsity figure slipped into one column.
    for row in load_gpu_table():
        if row.dense_fp8_tflops is not None:
            assert row.dense_fp8_tflops == pytest.approx(2 * row.dense_fp16_tflops, rel=0.015)


@pytest.mark.parametrize(
    ("device", "row"),
    [
        ("NVIDIA H100 80GB HBM3", "H100-SXM"),
        ("NVIDIA H100 PCIe", "H100-PCIe"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB-SXM"),
        ("NVIDIA A100-SXM4-40GB", "A100-40GB-SXM"),
        ("NVIDIA A100-PG509-200", "A100-40GB-SXM"),
        ("NVIDIA A100-PCIE-40GB", "A100-40GB-PCIe"),
        ("NVIDIA A100 80GB PCIe", "A100-80GB-PCIe"),
        ("Tesla V100-SXM2-32GB", "V100-32GB-SXM2"),
        ("Tesla V100-DGXS-32GB", "V100-32GB-SXM2"),
        ("AMD Instinct MI300X", "MI300X"),
        ("AMD Instinct MI300X VF", "MI300X"),
        ("AMD Instinct MI210", "MI210"),
        ("AMD Instinct MI250X/MI250", "MI250X"),
        ("AMD Instinct MI355X", "MI355X"),
        ("NVIDIA GeForce RTX 4080 Laptop GPU", "RTX-4080-Laptop"),
        ("NVIDIA GeForce RTX 4090", "RTX-4090"),
        ("NVIDIA H200", "H200"),
        ("NVIDIA H20", "H20"),
        ("NVIDIA B200", "B200"),
        ("NVIDIA L4", "L4"),
        ("NVIDIA L40S", "L40S"),
        ("NVIDIA A10G", "A10G"),
        ("nvidia h100 80gb hbm3", "H100-SXM"),  # case-insensitive
    ],
)
def test_resolve_trace_names(device: str, row: str) -> None:
    found = resolve_gpu(device)
    assert found is not None and found.name == row


@pytest.mark.parametrize(
    "device",
    ["", "   ", "AMD Radeon Graphics", "NVIDIA GB200", "NVIDIA H100 NVL", "NVIDIA H200 NVL",
     "NVIDIA GeForce RTX 4090 D", "Tesla V100-SXM2-16GB", "NVIDIA L40", "cpu"],
)
def test_unknown_or_empty_resolves_to_none(device: str) -> None:
    assert resolve_gpu(device) is None


def test_most_specific_alias_wins() -> None:
    base = gpu_by_name("H100-SXM")
    generic = dataclasses.replace(base, name="generic", aliases=("h100",))
    specific = dataclasses.replace(base, name="specific", aliases=("h100 pcie",))
    for order in ((generic, specific), (specific, generic)):
        assert resolve_gpu("NVIDIA H100 PCIe", table=order).name == "specific"
        assert resolve_gpu("NVIDIA H100 80GB HBM3", table=order).name == "generic"


@pytest.mark.parametrize(
    ("flag", "row"),
    [
        ("H100-SXM", "H100-SXM"),
        ("h100-sxm", "H100-SXM"),
        ("H100 SXM", "H100-SXM"),
        ("h200", "H200"),
        ("A100-80GB-SXM", "A100-80GB-SXM"),
        ("a100-80gb-pcie", "A100-80GB-PCIe"),
        ("mi300x", "MI300X"),
        ("NVIDIA A100-SXM4-80GB", "A100-80GB-SXM"),  # a trace name also works
    ],
)
def test_gpu_by_name(flag: str, row: str) -> None:
    assert gpu_by_name(flag).name == row


def test_gpu_by_name_unknown_lists_valid_names() -> None:
    with pytest.raises(DiagnoseError) as info:
        gpu_by_name("TPU-v5")
    msg = str(info.value)
    assert "TPU-v5" in msg and "H100-SXM" in msg and "MI300X" in msg and "\n" not in msg
    with pytest.raises(DiagnoseError):
        gpu_by_name("")


def test_peak_from_overrides() -> None:
    assert peak_from_overrides() is None
    assert peak_from_overrides(device_name="AMD Radeon Graphics") is None
    assert peak_from_overrides(device_name="NVIDIA H200").name == "H200"

    custom = peak_from_overrides(peak_tflops=300, bandwidth_tbps=2)
    assert custom.name == "custom"
    assert (custom.dense_fp16_tflops, custom.memory_bandwidth_tbps) == (300.0, 2.0)
    assert custom.ridge_flop_per_byte == 150.0

    partial = peak_from_overrides(bandwidth_tbps=2)
    assert partial.memory_bandwidth_tbps == 2.0 and partial.dense_fp16_tflops is None
    assert partial.ridge_flop_per_byte is None

    over = peak_from_overrides(gpu="H100-SXM", bandwidth_tbps=3.0)
    assert over.name == "H100-SXM"
    assert (over.dense_fp16_tflops, over.memory_bandwidth_tbps) == (989.4, 3.0)
    assert over.overrides == ("memory_bandwidth_tbps",)
    # --gpu wins over the trace device name
    assert peak_from_overrides(gpu="L4", device_name="NVIDIA H200").name == "L4"
    # the table itself is untouched
    assert gpu_by_name("H100-SXM").memory_bandwidth_tbps == 3.35

    with pytest.raises(DiagnoseError, match="unknown GPU"):
        peak_from_overrides(gpu="nope")
    with pytest.raises(DiagnoseError, match="--peak-tflops"):
        peak_from_overrides(peak_tflops=0)
