"""Peak bandwidth and dense tensor FLOPs from NVML facts, against NVIDIA's datasheets.

The NVML inputs are what the driver answers on each GPU (nvidia-smi / NVML outputs in public
repositories, cited in ``exporter/hardware/gpus.py``); CUDA cores are SMs x cores per SM (an L4
answers 7424). The expected figures are the datasheets' dense (non-sparse: half the starred)
numbers, which the computed peaks must match within 3 %.
"""

from __future__ import annotations

from dataclasses import dataclass

import pytest

from exporter.hardware.gpus import (
    ARCHITECTURES,
    PRODUCTS,
    GpuFacts,
    memory_bandwidth,
    peaks_of,
    slice_peaks,
    sm_count,
    tensor_flops,
)

T = 1e12
G = 1e9


@dataclass(frozen=True)
class Datasheet:
    name: str  # as nvmlDeviceGetName returns it
    facts: GpuFacts  # as NVML answers
    bandwidth: float  # bytes/s
    flops: dict[str, float]  # dense


GPUS = [
    Datasheet(
        "NVIDIA A100-SXM4-80GB",
        GpuFacts(5120, 1593, 1410, 108 * 64, (8, 0)),
        2039 * G,  # A100 datasheet: 2,039 GB/s (SXM 80GB)
        {"bf16": 312 * T, "fp16": 312 * T, "int8": 624 * T},  # 624*/1248* sparse
    ),
    Datasheet(
        "NVIDIA H100 80GB HBM3",
        GpuFacts(5120, 2619, 1980, 132 * 128, (9, 0)),
        3.35 * T,  # H100 SXM: 3.35 TB/s
        {"bf16": 1979 / 2 * T, "fp8": 3958 / 2 * T, "int8": 3958 / 2 * T},
    ),
    Datasheet(
        "NVIDIA H100 PCIe",
        GpuFacts(5120, 1593, 1755, 114 * 128, (9, 0)),
        2.0 * T,  # H100 PCIe: 2 TB/s
        {"bf16": 1513 / 2 * T, "fp8": 3026 / 2 * T, "int8": 3026 / 2 * T},
    ),
    Datasheet(
        "NVIDIA H200",
        GpuFacts(6144, 3201, 1980, 132 * 128, (9, 0)),
        4.8 * T,  # H200: 4.8 TB/s
        {"bf16": 1979 / 2 * T, "fp8": 3958 / 2 * T},
    ),
    Datasheet(
        "NVIDIA L4",
        GpuFacts(192, 6251, 2040, 7424, (8, 9)),
        300 * G,  # L4: 300 GB/s
        {"bf16": 242 / 2 * T, "fp8": 485 / 2 * T, "int8": 485 / 2 * T},
    ),
    Datasheet(
        "NVIDIA L40S",
        GpuFacts(384, 9001, 2520, 142 * 128, (8, 9)),
        864 * G,  # L40S: 864 GB/s
        {"bf16": 362.05 * T, "fp8": 1466 / 2 * T, "int8": 1466 / 2 * T},
    ),
    Datasheet(
        "NVIDIA B200",
        GpuFacts(8192, 3996, 1965, 148 * 128, (10, 0)),
        8.0 * T,  # DGX B200: 64 TB/s over 8 GPUs
        {"bf16": 4.5 / 2 * 1000 * T, "fp8": 9 / 2 * 1000 * T, "int8": 9 / 2 * 1000 * T},
    ),
]


def within(value: float | None, expected: float, tolerance: float = 0.03) -> bool:
    return value is not None and abs(value - expected) <= tolerance * expected


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_peaks_match_the_datasheet_within_3_percent(gpu: Datasheet) -> None:
    peaks = peaks_of(gpu.name, gpu.facts)
    assert within(peaks.memory_bandwidth, gpu.bandwidth), peaks
    for precision, expected in gpu.flops.items():
        assert within(peaks.flops.get(precision), expected), (precision, peaks)


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_bandwidth_formula_alone_is_within_3_percent(gpu: Datasheet) -> None:
    # The formula on NVML's own numbers, before any datasheet correction.
    facts = gpu.facts
    assert facts.memory_bus_width_bits and facts.max_memory_clock_mhz
    raw = memory_bandwidth(facts.memory_bus_width_bits, facts.max_memory_clock_mhz)
    assert within(raw, gpu.bandwidth)


def test_nvml_max_clock_overstates_hopper_and_the_table_corrects_it() -> None:
    h100 = GPUS[1]
    assert h100.facts.max_sm_clock_mhz and h100.facts.compute_capability
    at_max = tensor_flops(132, h100.facts.max_sm_clock_mhz, h100.facts.compute_capability)
    assert at_max["bf16"] / h100.flops["bf16"] == pytest.approx(1.082, abs=0.002)
    assert not within(at_max["bf16"], h100.flops["bf16"])
    corrected = peaks_of(h100.name, h100.facts)
    assert corrected.flops["bf16"] == pytest.approx(132 * 1830e6 * 4096)
    assert "datasheet tensor clock" in corrected.basis


@pytest.mark.parametrize("gpu", GPUS, ids=lambda g: g.name)
def test_without_nvml_facts_the_product_table_gives_the_same_peaks(gpu: Datasheet) -> None:
    # A trace recorded before the facts existed: only the name is known.
    from_nvml = peaks_of(gpu.name, gpu.facts)
    from_table = peaks_of(gpu.name, GpuFacts())
    assert from_table.memory_bandwidth == pytest.approx(from_nvml.memory_bandwidth)
    assert from_table.flops == pytest.approx(from_nvml.flops)


def test_sm_count_from_cuda_cores() -> None:
    assert sm_count(7424, (8, 9)) == 58  # L4 (NVML answers 7424)
    assert sm_count(6912, (8, 0)) == 108  # A100: 64 cores per SM
    assert sm_count(16896, (9, 0)) == 132
    assert sm_count(5120, (7, 0)) == 80
    assert sm_count(16897, (9, 0)) is None  # not a whole number of SMs
    assert sm_count(16896, (9, 9)) is None  # unknown architecture
    assert sm_count(0, (9, 0)) is None


def test_nvml_core_count_wins_over_the_table() -> None:
    # NVML's answer is the hardware; a table row only fills gaps.
    facts = GpuFacts(5120, 2619, 1980, 100 * 128, (9, 0))
    peaks = peaks_of("NVIDIA H100 80GB HBM3", facts)
    assert peaks.flops["bf16"] == pytest.approx(100 * 1830e6 * 4096)


def test_mig_mode_falls_back_to_the_table_sm_count() -> None:
    # nvmlDeviceGetNumGpuCores answers NOT_SUPPORTED in MIG mode: whole-GPU peaks from the table.
    facts = GpuFacts(5120, 2619, 1980, None, (9, 0))
    assert peaks_of("NVIDIA H100 80GB HBM3", facts).flops["bf16"] == pytest.approx(989.4e12, 1e-3)


def test_unknown_product_uses_the_formulas() -> None:
    # An A40 is not in the product table: 84 SMs x 1740 MHz x 1024 = 149.7 TFLOPS, its datasheet.
    peaks = peaks_of("NVIDIA A40", GpuFacts(384, 7251, 1740, 84 * 128, (8, 6)))
    assert within(peaks.flops["bf16"], 149.7e12, 0.005)
    assert peaks.memory_bandwidth == pytest.approx(696.1e9, rel=1e-3)  # datasheet 696 GB/s
    assert "fp8" not in peaks.flops  # Ampere has no FP8


def test_unknown_product_without_facts_has_no_peaks() -> None:
    peaks = peaks_of("NVIDIA Imaginary GPU", GpuFacts())
    assert peaks.memory_bandwidth is None and peaks.flops == {}


def test_unknown_architecture_keeps_the_bandwidth() -> None:
    peaks = peaks_of("NVIDIA Next", GpuFacts(8192, 4000, 2000, 20000, (11, 0)))
    assert peaks.memory_bandwidth == pytest.approx(8192 / 8 * 4000e6 * 2)
    assert peaks.flops == {}
    assert "compute capability (11, 0)" in peaks.basis


def test_geforce_runs_fp32_accumulation_at_half_rate() -> None:
    # RTX 4090: NVML max 3105 MHz (the curve ceiling), rated boost 2520; Ada whitepaper 165.2
    # TFLOPS BF16 with FP32 accumulation, 660.6 TOPS INT8.
    peaks = peaks_of("NVIDIA GeForce RTX 4090", GpuFacts(384, 10501, 3105, 128 * 128, (8, 9)))
    assert within(peaks.flops["bf16"], 165.2e12, 0.005)
    assert within(peaks.flops["int8"], 660.6e12, 0.005)
    assert within(peaks.memory_bandwidth, 1008e9, 0.005)  # nvbench: 1008 GB/s


def test_volta_has_fp16_only() -> None:
    peaks = peaks_of("Tesla V100-SXM2-32GB", GpuFacts(4096, 877, 1530, 5120, (7, 0)))
    assert set(peaks.flops) == {"fp16"}
    assert within(peaks.flops["fp16"], 125e12)  # V100 SXM2 datasheet: 125 TFLOPS tensor
    assert within(peaks.memory_bandwidth, 900e9)


def test_h20_gets_its_datasheet_peaks() -> None:
    # Throttled per SM: SMs x clock x 4096 would be 4.3 times too high.
    peaks = peaks_of("NVIDIA H20", GpuFacts(6144, 2619, 1980, 78 * 128, (9, 0)))
    assert peaks.flops["bf16"] == 148e12
    assert peaks.memory_bandwidth == 4.0e12


def test_name_matching_ignores_case_and_spacing() -> None:
    a = peaks_of("  nvidia  h100 80gb hbm3 ", GpuFacts())
    b = peaks_of("NVIDIA H100 80GB HBM3", GpuFacts())
    assert a == b and a.memory_bandwidth is not None


def test_tables_are_consistent() -> None:
    for cc, arch in ARCHITECTURES.items():
        assert arch.cuda_cores_per_sm in {64, 128}, cc
        assert arch.flops_per_sm_clock and arch.source
        assert set(arch.flops_per_sm_clock) <= {"fp16", "bf16", "fp8", "int8"}
    for name, product in PRODUCTS.items():
        assert name == name.lower().strip(), name
        assert product.compute_capability in ARCHITECTURES, name
        assert product.source, name
        if product.tensor_clock_mhz is not None:
            assert product.tensor_clock_mhz < product.max_sm_clock_mhz, name


def test_slice_peaks_go_with_memory_eighths_and_sms() -> None:
    whole = peaks_of("NVIDIA H100 80GB HBM3", GpuFacts(compute_capability=(9, 0)))
    assert whole.sms == 132
    one = slice_peaks(whole, sms=16, memory_fraction=1 / 8)
    assert one.memory_bandwidth == pytest.approx(whole.memory_bandwidth / 8)  # type: ignore[operator]
    assert one.flops["bf16"] == pytest.approx(989.4e12 * 16 / 132, rel=1e-3)
    assert one.sms == 16
    # seven 1g slices hold 112 of 132 SMs: slices/7 would overstate each by 18 %
    assert 7 * one.flops["bf16"] < whole.flops["bf16"]


def test_slice_peaks_unknown_shares_are_absent() -> None:
    whole = peaks_of("NVIDIA H100 80GB HBM3", GpuFacts(compute_capability=(9, 0)))
    none = slice_peaks(whole, sms=None, memory_fraction=None)
    assert none.memory_bandwidth is None and none.flops == {}
    assert "unknown" in none.basis
    unknown_gpu = peaks_of("NVIDIA Unknown", GpuFacts())
    assert slice_peaks(unknown_gpu, sms=16, memory_fraction=0.125).flops == {}


def test_datasheet_peaks_carry_the_table_sm_count() -> None:
    assert peaks_of("NVIDIA H20", GpuFacts()).sms == 78
