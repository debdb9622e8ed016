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
    "GH200",
    "GH200-144GB",
    "H800",
    "H800-PCIe",
    "A800-80GB-SXM",
    "A800-80GB-PCIe",
    "RTX-3090",
    "T4",
    "MI325X",
    "GB200",
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
        # issue 24: GPUs real traces name
        ("NVIDIA GH200 480GB", "GH200"),
        ("NVIDIA GH200 144G HBM3e", "GH200-144GB"),
        ("NVIDIA H800", "H800"),
        ("NVIDIA H800 PCIe", "H800-PCIe"),
        ("NVIDIA A800-SXM4-80GB", "A800-80GB-SXM"),
        ("NVIDIA A800 80GB PCIe", "A800-80GB-PCIe"),
        ("NVIDIA GeForce RTX 3090", "RTX-3090"),
        ("Tesla T4", "T4"),
        ("AMD Instinct MI325X", "MI325X"),
        ("NVIDIA GB200", "GB200"),
    ],
)
def test_resolve_trace_names(device: str, row: str) -> None:
    found = resolve_gpu(device)
    assert found is not None and found.name == row


@pytest.mark.parametrize(
    "device",
    ["", "   ", "AMD Radeon Graphics", "NVIDIA GeForce RTX 3090 Ti", "NVIDIA H100 NVL", "NVIDIA H200 NVL",
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


# -- --gpu short names and did-you-mean (issue 27) ---------------------------------------------


@pytest.mark.parametrize(
    ("flag", "row", "other"),
    [
        ("H100", "H100-SXM", "--gpu H100-PCIe"),
        ("h100", "H100-SXM", "--gpu H100-PCIe"),
        ("A100", "A100-80GB-SXM", "A100-40GB-SXM, A100-80GB-PCIe, A100-40GB-PCIe"),
        ("A100-80GB", "A100-80GB-SXM", "--gpu A100-80GB-PCIe"),
        ("a100 pcie", "A100-80GB-PCIe", "--gpu A100-40GB-PCIe"),
        ("V100", "V100-32GB-SXM2", "--peak-tflops"),
        ("H200-SXM", "H200", "H200 NVL"),
        ("4090", "RTX-4090", "4090 D"),
    ],
)
def test_short_names_say_which_part_and_how_to_pick_another(flag: str, row: str, other: str) -> None:
    peak = gpu_by_name(flag)
    assert peak.name == row
    assert peak.selection.startswith(f"--gpu {flag}, taken as {row}; ")
    assert other in peak.selection
    assert peak.to_dict()["selection"] == peak.selection
    # the figures are the row's own
    assert peak.dense_fp16_tflops == dataclasses.replace(peak, selection="").dense_fp16_tflops
    assert gpu_by_name(row).selection == f"--gpu {row}"


def test_short_names_never_match_trace_device_names() -> None:
    # "H100" alone in a trace stays unknown: the trace could be either part
    assert resolve_gpu("H100") is None
    assert resolve_gpu("NVIDIA A100") is None


@pytest.mark.parametrize(
    ("flag", "first"),
    [
        ("H10", ["H100-SXM", "H100-PCIe"]),
        ("MI300", ["MI300X"]),
        ("mi250", ["MI250X"]),
        ("B20", ["B200"]),
        ("A10", ["A100-80GB-SXM", "A10G"]),
    ],
)
def test_unknown_name_suggests_the_closest(flag: str, first: list[str]) -> None:
    from diagnose.hardware import suggest_gpu_names

    got = suggest_gpu_names(flag)
    assert got[: len(first)] == first and len(got) <= 5
    with pytest.raises(DiagnoseError) as info:
        gpu_by_name(flag)
    msg = str(info.value)
    assert msg.startswith(f"unknown GPU {flag!r}: did you mean {', '.join(got)}? valid names: ")
    assert "\n" not in msg
    assert suggest_gpu_names("TPU-v5") == [] and suggest_gpu_names("") == []


def test_selection_of_trace_names_and_flags() -> None:
    assert peak_from_overrides(device_name="NVIDIA H200").selection == "the trace's device name 'NVIDIA H200'"
    assert peak_from_overrides(peak_tflops=300, bandwidth_tbps=2).selection == "--peak-tflops/--bandwidth-tbps"
    over = peak_from_overrides(gpu="H100", bandwidth_tbps=3.0)
    assert over.name == "H100-SXM" and over.overrides == ("memory_bandwidth_tbps",)
    assert over.selection.startswith("--gpu H100, taken as H100-SXM")


def test_cli_shows_the_chosen_device_wherever_a_peak_is_used(monkeypatch) -> None:
    """The vLLM sample's device has no name: after --gpu the report names the part (and how it
    was chosen) and never asks for --gpu; --gpu H10 is refused with suggestions."""
    import json

    from click.testing import CliRunner

    from conftest import ROOT
    from diagnose.cli import main

    sample = str(ROOT / "samples" / "tracelens" / "vllm_decode_mi300x.json.gz")
    monkeypatch.setenv("COLUMNS", "200")  # one header line, unwrapped
    plain = CliRunner().invoke(main, ["run", "--trace", sample]).output
    assert "GPU devices: 2: (unnamed)\n" in plain and "peaks" not in plain.splitlines()[1]
    # the 50-line report keeps the ask on a line of its own (data quality may shrink to its codes)
    assert "► MFU/MBU skipped, the device's peaks are unknown: give --gpu NAME" in plain

    out = CliRunner().invoke(main, ["run", "--trace", sample, "--gpu", "H100"]).output
    assert ("GPU devices: 2: (unnamed in the trace; peaks of H100-SXM); peaks H100-SXM: 989.4 TFLOP/s dense FP16/BF16, "
            "3.35 TB/s; from --gpu H100, taken as H100-SXM; for the PCIe card give --gpu H100-PCIe") in out
    assert "give --gpu NAME" not in out and "use --gpu" not in out

    d = json.loads(CliRunner().invoke(main, ["run", "--trace", sample, "--gpu", "MI300X", "--format", "json"]).output)
    assert d["gpu"]["name"] == "MI300X" and d["gpu"]["selection"] == "--gpu MI300X"
    unnamed = [q["message"] for q in d["quality"] if q["code"] == "unnamed_device"]
    assert unnamed == ["device 2 has no name in the trace: peaks from --gpu MI300X"]
    assert not [q for q in d["quality"] if q["code"] == "unknown_device_peak"]

    bad = CliRunner().invoke(main, ["run", "--trace", sample, "--gpu", "H10"])
    assert bad.exit_code == 2
    assert bad.output.startswith("error: unknown GPU 'H10': did you mean H100-SXM, H100-PCIe, ")
    assert bad.output.count("\n") == 1

    g = CliRunner().invoke(main, ["gate", "--trace", sample, "--gpu", "H100"])
    assert g.output.splitlines()[1] == ("peaks: H100-SXM: 989.4 TFLOP/s dense FP16/BF16, 3.35 TB/s; from --gpu H100, taken as "
                                        "H100-SXM; for the PCIe card give --gpu H100-PCIe (the H100 NVL is not in the table)")

    b = CliRunner().invoke(main, ["bounds", "--model-config", "llama-3.1-8b", "--gpu", "H100", "--batch", "1"])
    assert b.exit_code == 0, b.output
    assert "Device H100-SXM: 989.4 TFLOP/s dense FP16/BF16, 3.35 TB/s; ridge point 295.3 FLOP/B. Chosen by --gpu H100, " \
           "taken as H100-SXM; for the PCIe card give --gpu H100-PCIe" in " ".join(b.output.split())


def test_describe_devices_and_peaks() -> None:
    from diagnose.hardware import describe_devices, describe_peak

    devs = [{"id": 2, "name": ""}, {"id": 3, "name": "AMD Instinct MI300X"}]
    assert describe_devices(devs) == "2: (unnamed), 3: AMD Instinct MI300X"
    mi = peak_from_overrides(gpu="MI300X").to_dict()
    assert describe_devices(devs, mi) == "2: (unnamed in the trace; peaks of MI300X), 3: AMD Instinct MI300X"
    custom = peak_from_overrides(peak_tflops=1000, bandwidth_tbps=5).to_dict()
    assert describe_devices(devs[:1], custom) == "2: (unnamed in the trace; peaks from --peak-tflops/--bandwidth-tbps)"
    assert describe_peak(custom) == "custom: 1000 TFLOP/s dense FP16/BF16, 5 TB/s; from --peak-tflops/--bandwidth-tbps"
    over = peak_from_overrides(gpu="H100-SXM", bandwidth_tbps=3.0).to_dict()
    assert describe_peak(over) == ("H100-SXM: 989.4 TFLOP/s dense FP16/BF16, 3 TB/s; from --gpu H100-SXM; flags override "
                                   "memory_bandwidth_tbps")
    partial = peak_from_overrides(bandwidth_tbps=2).to_dict()
    assert describe_peak(partial) == "custom: ? TFLOP/s dense FP16/BF16, 2 TB/s; from --peak-tflops/--bandwidth-tbps"


@pytest.mark.parametrize("row", load_gpu_table(), ids=lambda r: r.name)
def test_every_peak_has_a_source_and_fp32_below_the_tensor_peaks(row: GpuPeak) -> None:
    """Issue 24: fp32 (without tensor cores) and tf32 columns, a source for every peak
    (``source`` for FP16/BF16, FP8 and bandwidth; ``precision_source`` for FP32 and TF32)."""
    assert row.precision_source.strip()
    for v in (row.fp32_tflops, row.tf32_tflops):
        assert v is None or 0 < v <= row.dense_fp16_tflops
    if row.tf32_tflops is not None:
        assert row.fp32_tflops is not None and row.tf32_tflops >= row.fp32_tflops
    # the peak each dtype's work runs against
    assert row.peak_tflops_for("bf16") == row.peak_tflops_for(None) == row.dense_fp16_tflops
    assert row.peak_tflops_for("fp32") == (row.fp32_tflops or row.dense_fp16_tflops)


def test_dtype_peaks_from_the_datasheets() -> None:
    """Dense figures: H100 SXM FP32 66.9, TF32 494.7 (half the datasheet's 989 with sparsity),
    A100 FP32 19.5 / TF32 156, V100 FP32 15.7 and no TF32; MI300X FP32 163.4 / TF32 653.7."""
    h = gpu_by_name("H100-SXM")
    assert (h.fp32_tflops, h.tf32_tflops, h.peak_tflops_for("tf32"), h.peak_tflops_for("fp8")) == (66.9, 494.7, 494.7, 1978.9)
    assert round(h.dense_fp16_tflops / h.fp32_tflops, 1) == 14.8 and round(h.tf32_tflops / h.fp32_tflops, 1) == 7.4
    a = gpu_by_name("A100-80GB-SXM")
    assert (a.fp32_tflops, a.tf32_tflops) == (19.5, 156.0)
    v = gpu_by_name("V100-32GB-SXM2")
    assert (v.fp32_tflops, v.tf32_tflops, v.peak_tflops_for("tf32")) == (15.7, None, 125.0)
    m = gpu_by_name("MI300X")
    assert (m.fp32_tflops, m.tf32_tflops) == (163.4, 653.7)
    assert gpu_by_name("T4").fp32_tflops == 8.1 and gpu_by_name("GB200").tf32_tflops == 1250.0
