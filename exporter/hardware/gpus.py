"""A GPU's theoretical peaks from the facts NVML reports about it.

Peak DRAM bandwidth is ``bus width / 8 x maximum memory clock x 2``. NVML reports half the
per-pin data rate as the memory clock for HBM2/2e/3/3e and GDDR6/6X alike (H100 2619 MHz ↔
5.24 Gb/s per pin, L4 6251 MHz ↔ 12.5 Gb/s), so one formula serves every part; NVIDIA's nvbench
prints the same derivation ("1008 GB/sec (384-bit DDR @10501MHz)" on an RTX 4090, NVIDIA/nvbench
PR #207). Third-party spec sites that print a GDDR6 *command* clock (L4 "1563 MHz") are a
quarter of that and must not be mixed in.

Dense tensor peak is ``SMs x clock x FLOPs per SM per clock`` of the architecture. NVML has no
SM count for a whole GPU (``nvmlDeviceGetAttributes().multiprocessorCount`` answers for MIG
devices only), but ``nvmlDeviceGetNumGpuCores`` returns the CUDA (FP32) core count, and every
architecture has a fixed number per SM: an L4 answers 7424 = 58 SMs x 128. Where NVML cannot
answer (MIG mode, old drivers, traces recorded before these facts existed) the product table
below supplies the SM count and clocks.

NVML's maximum SM clock is not always the clock NVIDIA's datasheet peaks use: H100 SXM/H200 peak
at 1830 MHz against NVML's 1980 (+8 %), H100 PCIe at 1620 against 1755, HGX B200 at ~1856
against 1965, GeForce and RTX workstation Ada parts at their rated boost against a 3105 MHz
curve ceiling (+23 %). The product table overrides the clock for those, and the bandwidth where
the datasheet figure differs from the formula (H100 PCIe, H200, B200). H20 is throttled per SM
and gets its datasheet peaks outright.

Sources are tagged as in the research notes: [V] read in the source, [V3] a third-party
reproduction of the vendor figure, [M] the vendor datasheet or whitepaper as remembered (URL
given, not re-read), [?] uncertain.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field

#: The precisions a peak is given for (label ``precision``). ``fp16`` and ``bf16`` mean FP32
#: accumulation, what PyTorch/cuBLAS GEMMs use; ``int8`` counts integer operations.
PRECISIONS = ("fp16", "bf16", "fp8", "int8")

#: GeForce parts run FP16/BF16 and FP8 tensor MMA with FP32 accumulation at half the rate of
#: the data-centre and workstation parts of the same architecture (RTX 4090: 165.2 TFLOPS
#: BF16 against 330.3 with FP16 accumulation; Ada whitepaper appendix [M], reproduced [V3]).
#: INT8 (INT32 accumulation) runs at full rate there (660.6 TOPS on the 4090).
_GEFORCE_HALF_RATE = frozenset({"fp16", "bf16", "fp8"})


@dataclass(frozen=True)
class GpuFacts:
    """What NVML says about a GPU's limits; ``None`` where it did not answer.

    Read once per GPU (``nvmlDeviceGetMemoryBusWidth``, ``nvmlDeviceGetMaxClockInfo`` for the
    SM and memory clocks, ``nvmlDeviceGetNumGpuCores``, ``nvmlDeviceGetCudaComputeCapability``)
    and carried by replay traces.
    """

    memory_bus_width_bits: int | None = None
    max_memory_clock_mhz: int | None = None
    max_sm_clock_mhz: int | None = None
    cuda_cores: int | None = None
    compute_capability: tuple[int, int] | None = None


@dataclass(frozen=True)
class Architecture:
    """Per-SM properties of one compute capability."""

    name: str
    cuda_cores_per_sm: int
    #: Dense tensor FLOPs (int8: operations) per SM per clock; a missing precision has no
    #: tensor support on the architecture.
    flops_per_sm_clock: Mapping[str, int]
    source: str


# Dense tensor throughput per SM per clock (1 FMA = 2 FLOPs) and FP32 cores per SM.
ARCHITECTURES: dict[tuple[int, int], Architecture] = {
    (7, 0): Architecture(
        "Volta",
        64,
        {"fp16": 1024},
        "Volta whitepaper: 8 tensor cores/SM x 64 FMA/clk [M]; V100 PCIe 80 SMs x 1024 at "
        "1367 MHz = 112 TF (NVIDIA forum, Crovella) [V]. No BF16, no INT8 tensor path; "
        "5120 cores / 80 SMs",
    ),
    (7, 5): Architecture(
        "Turing",
        64,
        {"fp16": 1024, "int8": 2048},
        "T4 datasheet 65 TF FP16 / 130 TOPS INT8 = 40 SMs x 1590 MHz x 1024 / 2048 [M]; "
        "2560 cores / 40 SMs",
    ),
    (8, 0): Architecture(
        "Ampere (GA100)",
        64,
        {"fp16": 2048, "bf16": 2048, "int8": 4096},
        "A100 whitepaper: 4 tensor cores/SM x 256 FMA/clk; 108 x 1410 MHz x 2048 = 311.9 TF "
        "(NVIDIA forum, Crovella) [V]; 6912 cores / 108 SMs [M]",
    ),
    (8, 6): Architecture(
        "Ampere (GA10x)",
        128,
        {"fp16": 1024, "bf16": 1024, "int8": 2048},
        "A10 72 x 1695 MHz x 1024 = 125 TF = datasheet [M]; A40 84 x 1740 x 1024 = 149.7 TF = "
        "datasheet [V3]",
    ),
    (8, 9): Architecture(
        "Ada Lovelace",
        128,
        {"fp16": 1024, "bf16": 1024, "fp8": 2048, "int8": 2048},
        "L4 58 x 2040 MHz x 1024 = 121.2 TF vs 121 (242 sparse), FP8 x 2048 = 242.3 vs 242.5 "
        "[V3]; NVML: L4 7424 cores = 58 x 128 [V3]",
    ),
    (9, 0): Architecture(
        "Hopper",
        128,
        {"fp16": 4096, "bf16": 4096, "fp8": 8192, "int8": 8192},
        "'4096 FLOP/clk per SM' (NVIDIA forum, Crovella) [V]; H100 SXM 528 tensor cores x "
        "1024 x 1.83 GHz = 989.4 TF BF16 (Lockwood) [V]; 16896 cores / 132 SMs [M]",
    ),
    (10, 0): Architecture(
        "Blackwell (data centre)",
        128,
        {"fp16": 8192, "bf16": 8192, "fp8": 16384, "int8": 16384},
        "back-derived from NVIDIA's per-GPU table: GB200 2.5 PF dense BF16 = 148 SMs x "
        "2062 MHz x 8192, FP8 5 PF = x 16384 [V3]",
    ),
    (12, 0): Architecture(
        "Blackwell (RTX)",
        128,
        {"fp16": 1024, "bf16": 1024, "fp8": 2048, "int8": 2048},
        "RTX 5090 419.2 TF FP16 (FP16 acc., 838.4 sparse) = 170 SMs x 2407 MHz x 1024 [V3]",
    ),
}


@dataclass(frozen=True)
class Product:
    """One GPU product: its NVML facts (the fallback when NVML does not answer) and where its
    datasheet differs from what the formulas give with those facts."""

    sms: int
    compute_capability: tuple[int, int]
    max_sm_clock_mhz: int
    memory_bus_width_bits: int | None
    max_memory_clock_mhz: int | None
    source: str
    #: The clock the datasheet's tensor peaks use, where NVML's maximum is higher.
    tensor_clock_mhz: int | None = None
    #: The datasheet bandwidth (bytes/s), where the formula differs from it.
    memory_bandwidth: float | None = None
    #: Datasheet dense peaks, for parts the per-SM arithmetic does not describe.
    flops: Mapping[str, float] = field(default_factory=dict)
    #: NVLink peak in one direction (bytes/s, headers included): links x each link's speed
    #: as ``nvidia-smi nvlink -s`` prints it; ``None`` for a part without NVLink.
    nvlink_bandwidth: float | None = None


T = 1e12

# Keyed by the name nvmlDeviceGetName returns (compared case-insensitively, spaces collapsed).
PRODUCTS: dict[str, Product] = {
    "tesla v100-sxm2-16gb": Product(
        80,
        (7, 0),
        1530,
        4096,
        877,
        "nvidia-smi -q V100 SXM2: max SM 1530, memory 877 MHz [V]; NVLink 2: 6 links x 25.781 GB/s"
        " (nvidia-smi nvlink -s) [M]",
        nvlink_bandwidth=6 * 25.781e9,
    ),
    "tesla v100-sxm2-32gb": Product(
        80,
        (7, 0),
        1530,
        4096,
        877,
        "nvidia-smi V100-SXM2-32GB: 1530 MHz, 877 MHz [V]; NVLink 2: 6 links x 25.781 GB/s [M]",
        nvlink_bandwidth=6 * 25.781e9,
    ),
    "tesla t4": Product(
        40, (7, 5), 1590, 256, 5001, "nvidia-smi -q T4: max SM 1590, memory 5001 MHz [V]"
    ),
    "nvidia a100-sxm4-40gb": Product(
        108,
        (8, 0),
        1410,
        5120,
        1215,
        "nvidia-smi A100-SXM4-40GB: 1410 MHz, 1215 MHz [V]; NVLink 3: 12 links x 25 GB/s each way "
        "[M]",
        nvlink_bandwidth=12 * 25e9,
    ),
    "nvidia a100-sxm4-80gb": Product(
        108,
        (8, 0),
        1410,
        5120,
        1593,
        "nvidia-smi A100-SXM4-80GB: 1410 MHz, 1593 MHz [V]; NVLink 3: 12 links x 25 GB/s each way "
        "[M]",
        nvlink_bandwidth=12 * 25e9,
    ),
    "nvidia a100-pcie-40gb": Product(
        108, (8, 0), 1410, 5120, 1215, "A100 PCIe 40GB: 1410 MHz, 1215 MHz [M]"
    ),
    "nvidia a100 80gb pcie": Product(
        108, (8, 0), 1410, 5120, 1512, "A100 PCIe 80GB: 1410 MHz, 1512 MHz [M][?] (1935 GB/s)"
    ),
    "nvidia a10": Product(72, (8, 6), 1695, 384, 6251, "A10: boost 1695 MHz [V3], 6251 MHz [M]"),
    "nvidia l4": Product(
        58, (8, 9), 2040, 192, 6251, "nvidia-smi L4: max SM 2040, max memory 6251 MHz [V]"
    ),
    "nvidia l40s": Product(
        142, (8, 9), 2520, 384, 9001, "nvidia-smi L40S: max SM 2520, max memory 9001 MHz [V]"
    ),
    "nvidia h100 80gb hbm3": Product(
        132,
        (9, 0),
        1980,
        5120,
        2619,
        "H100 SXM5: nvidia-smi 1980 MHz, 2619 MHz [V]; datasheet peaks at 1.83 GHz "
        "(Lockwood: 989.4 TF BF16) [V]; NVLink 4: 18 links x 26.562 GB/s (nvidia-smi nvlink -s, "
        "docs/nvml.md) [V]",
        tensor_clock_mhz=1830,
        nvlink_bandwidth=18 * 26.562e9,
    ),
    "nvidia h100 pcie": Product(
        114,
        (9, 0),
        1755,
        5120,
        1593,
        "H100 PCIe: 'max boost clock for TC usage on H100 PCIE is 1620MHz' against 1755 "
        "(NVIDIA forum, Crovella) [V]; memory clock [M][?]; datasheet 2 TB/s, 756 TF BF16 [V3]",
        tensor_clock_mhz=1620,
        memory_bandwidth=2.0 * T,
    ),
    "nvidia h100 nvl": Product(
        132,
        (9, 0),
        1785,
        6144,
        2619,
        "H100 NVL (per GPU): datasheet 3.9 TB/s, 835.5 TF BF16 (1671 sparse) [M], i.e. a "
        "~1545 MHz tensor clock; clocks and bus width [?]; NVLink bridge 600 GB/s both ways [M][?]",
        tensor_clock_mhz=1545,
        memory_bandwidth=3.9 * T,
        nvlink_bandwidth=300e9,
    ),
    "nvidia h200": Product(
        132,
        (9, 0),
        1980,
        6144,
        3201,
        "H200 SXM: nvidia-smi -q max 1980 MHz, memory 3201 MHz [V]; datasheet 4.8 TB/s, "
        "989.5 TF BF16 (1979 sparse) [V3]; NVLink 4: 18 links x 26.562 GB/s [M]",
        tensor_clock_mhz=1830,
        memory_bandwidth=4.8 * T,
        nvlink_bandwidth=18 * 26.562e9,
    ),
    "nvidia h200 nvl": Product(
        132,
        (9, 0),
        1785,
        6144,
        3201,
        "H200 NVL: datasheet 4.8 TB/s, 835.5 TF BF16 (1671 sparse) [V3]; clocks [?]; NVLink bridge"
        " 900 GB/s both ways [M][?]",
        tensor_clock_mhz=1545,
        memory_bandwidth=4.8 * T,
        nvlink_bandwidth=450e9,
    ),
    "nvidia h20": Product(
        78,
        (9, 0),
        1980,
        6144,
        2619,
        "H20 (throttled per SM, no NVIDIA datasheet): 4.0 TB/s, 148 TF FP16/BF16, 296 TOPS "
        "INT8 [V3]; FP8 296 [M]; 78 SMs [V3]; clocks [?]; NVLink 4, 900 GB/s both ways [M]",
        memory_bandwidth=4.0 * T,
        flops={"fp16": 148 * T, "bf16": 148 * T, "fp8": 296 * T, "int8": 296 * T},
        nvlink_bandwidth=18 * 26.562e9,
    ),
    "nvidia b200": Product(
        148,
        (10, 0),
        1965,
        8192,
        3996,
        "HGX B200: 148 SMs [V]; max SM clock 1965 MHz measured [V3]; memory 3996 MHz observed "
        "[V]; bus width [M]; datasheet 8 TB/s (DGX B200 64 TB/s over 8 GPUs; a newer HGX table "
        "says 7.7) and 2.25 PF dense BF16 (4.5 sparse) [V3] = a ~1856 MHz tensor clock; NVLink 5: "
        "18 links x 50 GB/s each way (1.8 TB/s both ways) [M]",
        tensor_clock_mhz=1856,
        memory_bandwidth=8.0 * T,
        nvlink_bandwidth=18 * 50e9,
    ),
    "nvidia gb200": Product(
        148,
        (10, 0),
        2062,
        8192,
        None,
        "GB200 (per Blackwell GPU): max SM clock 2062 MHz [V3]; 8 TB/s, 2.5 PF dense BF16 "
        "(5 sparse) [V3]; NVLink 5: 18 links x 50 GB/s each way [M]",
        memory_bandwidth=8.0 * T,
        nvlink_bandwidth=18 * 50e9,
    ),
    "nvidia geforce rtx 4090": Product(
        128,
        (8, 9),
        3105,
        384,
        10501,
        "nvidia-smi RTX 4090: 3105 MHz, 10501 MHz [V]; rated boost 2520 MHz, 165.2 TF BF16 "
        "with FP32 accumulation (Ada whitepaper) [M][V3]",
        tensor_clock_mhz=2520,
    ),
    "nvidia rtx 6000 ada generation": Product(
        142,
        (8, 9),
        3105,
        384,
        10001,
        "nvidia-smi RTX 6000 Ada: 3105 MHz, 10001 MHz [V]; rated boost 2505 MHz, 1457 TF FP8 "
        "sparse [M]",
        tensor_clock_mhz=2505,
    ),
}


def product_of(name: str) -> Product | None:
    """The product table's row for an NVML device name, if any."""
    return PRODUCTS.get(re.sub(r"\s+", " ", name.strip()).lower())


def _is_geforce(name: str) -> bool:
    return "geforce" in name.lower()


@dataclass(frozen=True)
class Peaks:
    """A GPU's theoretical peaks; ``None`` / missing precisions where they cannot be known.

    ``basis`` says in words where the figures came from, for the log.
    """

    memory_bandwidth: float | None
    flops: dict[str, float]
    basis: str
    #: The SMs the tensor peaks count (the whole GPU's, outside MIG mode).
    sms: int | None = None
    #: The NVLink peak in one direction from the product table (the sidecar reads its own
    #: from the driver, ``inference_gpu_nvlink_peak_bytes_per_second``); ``None`` without NVLink.
    nvlink_bandwidth: float | None = None


def memory_bandwidth(bus_width_bits: int, max_memory_clock_mhz: int) -> float:
    """Peak DRAM bandwidth in bytes/s: bus width / 8 x memory clock x 2 (double data rate of
    the clock NVML reports)."""
    return bus_width_bits / 8 * max_memory_clock_mhz * 1e6 * 2


def sm_count(cuda_cores: int, compute_capability: tuple[int, int]) -> int | None:
    """SMs from NVML's CUDA core count; None for an unknown architecture or an odd count."""
    arch = ARCHITECTURES.get(compute_capability)
    if arch is None or cuda_cores <= 0 or cuda_cores % arch.cuda_cores_per_sm:
        return None
    return cuda_cores // arch.cuda_cores_per_sm


def tensor_flops(
    sms: int, clock_mhz: float, compute_capability: tuple[int, int], *, geforce: bool = False
) -> dict[str, float]:
    """Dense tensor peaks by precision: SMs x clock x FLOPs per SM per clock."""
    arch = ARCHITECTURES.get(compute_capability)
    if arch is None:
        return {}
    out = {}
    for precision, per_clock in arch.flops_per_sm_clock.items():
        rate = per_clock / 2 if geforce and precision in _GEFORCE_HALF_RATE else per_clock
        out[precision] = sms * clock_mhz * 1e6 * rate
    return out


def peaks_of(name: str, facts: GpuFacts) -> Peaks:
    """The peaks of GPU ``name`` from its NVML facts, filled in and corrected by the tables.

    NVML's answers take precedence for what the hardware *is* (bus width, memory clock, core
    count, compute capability); the product table supplies what NVML did not answer and the
    datasheet's clock, bandwidth or peaks where they differ from the formulas.
    """
    product = product_of(name)
    notes: list[str] = []
    bandwidth = _bandwidth(facts, product, notes)
    flops, sms = _flops(name, facts, product, notes)
    nvlink = product.nvlink_bandwidth if product is not None else None
    return Peaks(
        memory_bandwidth=bandwidth,
        flops=flops,
        basis="; ".join(notes),
        sms=sms,
        nvlink_bandwidth=nvlink,
    )


def slice_peaks(whole: Peaks, *, sms: int | None, memory_fraction: float | None) -> Peaks:
    """A MIG device's share of its GPU's peaks.

    Bandwidth goes with memory, in eighths of the GPU ("a GPU memory slice is roughly one
    eighth of the total GPU memory resources, including both capacity and bandwidth", NVIDIA's
    MIG user guide), and is shared by the compute instances of one GPU instance. Tensor FLOPs
    go with SMs: the MIG device's own count (``nvmlDeviceGetAttributes``) over the SMs the
    whole-GPU peak counts, not compute slices / 7, because SM counts do not scale with slices
    (an H100's 1g.10gb has 16 of 132 SMs, seven of them 112). Clocks are the GPU's.
    """
    notes: list[str] = []
    bandwidth = None
    if whole.memory_bandwidth is not None and memory_fraction is not None:
        bandwidth = whole.memory_bandwidth * memory_fraction
        notes.append(f"bandwidth {memory_fraction * 8:.0f}/8 of the GPU's")
    else:
        notes.append("bandwidth unknown (no memory share)")
    flops: dict[str, float] = {}
    if sms and whole.sms and whole.flops:
        flops = {p: v * sms / whole.sms for p, v in whole.flops.items()}
        notes.append(f"tensor {sms} of the GPU's {whole.sms} SMs")
    else:
        notes.append("tensor peaks unknown (no SM count)")
    return Peaks(memory_bandwidth=bandwidth, flops=flops, basis="; ".join(notes), sms=sms)


def _bandwidth(facts: GpuFacts, product: Product | None, notes: list[str]) -> float | None:
    if product is not None and product.memory_bandwidth is not None:
        notes.append(f"bandwidth {product.memory_bandwidth / 1e9:.0f} GB/s from the datasheet")
        return product.memory_bandwidth
    bus = facts.memory_bus_width_bits or (product.memory_bus_width_bits if product else None)
    clock = facts.max_memory_clock_mhz or (product.max_memory_clock_mhz if product else None)
    if not bus or not clock:
        notes.append("bandwidth unknown (no bus width or memory clock)")
        return None
    where = "NVML" if facts.memory_bus_width_bits and facts.max_memory_clock_mhz else "table"
    notes.append(f"bandwidth {bus} bit x {clock} MHz x 2 ({where})")
    return memory_bandwidth(bus, clock)


def _flops(
    name: str, facts: GpuFacts, product: Product | None, notes: list[str]
) -> tuple[dict[str, float], int | None]:
    if product is not None and product.flops:
        notes.append("tensor peaks from the datasheet")
        return dict(product.flops), product.sms
    cc = facts.compute_capability or (product.compute_capability if product else None)
    if cc is None or cc not in ARCHITECTURES:
        notes.append(f"tensor peaks unknown (compute capability {cc})")
        return {}, None
    sms = sm_count(facts.cuda_cores, cc) if facts.cuda_cores else None
    if sms is None and product is not None:
        sms = product.sms
    clock: float | None = facts.max_sm_clock_mhz or (product.max_sm_clock_mhz if product else None)
    clock_note = "NVML max" if facts.max_sm_clock_mhz else "table max"
    tensor_clock = product.tensor_clock_mhz if product is not None else None
    if tensor_clock is not None and (clock is None or tensor_clock < clock):
        clock_note = f"datasheet tensor clock, {clock_note} {clock}"
        clock = tensor_clock
    if sms is None or not clock:
        notes.append("tensor peaks unknown (no SM count or clock)")
        return {}, sms
    geforce = _is_geforce(name)
    notes.append(
        f"tensor {sms} SMs x {clock:.0f} MHz ({clock_note}) x {ARCHITECTURES[cc].name} rate"
        + (", GeForce half-rate FP32 accumulation" if geforce else "")
    )
    return tensor_flops(sms, clock, cc, geforce=geforce), sms
