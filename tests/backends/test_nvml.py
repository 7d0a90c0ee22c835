"""The nvidia-ml-py adapter's identity and hardware-fact calls, over a stand-in pynvml module."""

from __future__ import annotations

import dataclasses

import pynvml
import pytest
from support.pynvml_fake import H100_SXM, L4, Error, fake_pynvml

from exporter.backends import nvml_api
from exporter.backends.gpu import read_facts, read_identity
from exporter.backends.nvml import PynvmlApi
from exporter.hardware.gpus import GpuFacts, peaks_of

FACT_CALLS = {
    "nvmlDeviceGetMemoryBusWidth",
    "nvmlDeviceGetMaxClockInfo",
    "nvmlDeviceGetNumGpuCores",
    "nvmlDeviceGetCudaComputeCapability",
}


def opened(*gpus: object, drop: tuple[str, ...] = ()) -> tuple[PynvmlApi, list[object]]:
    module = fake_pynvml(list(gpus), drop=drop)  # type: ignore[arg-type]
    api = PynvmlApi(library=module)
    api.init()
    return api, [api.handle(i) for i in range(api.device_count())]


def test_h100_identity_and_facts() -> None:
    api, (handle,) = opened(H100_SXM)
    identity = read_identity(api, 0, handle)
    assert identity.name == "NVIDIA H100 80GB HBM3"
    assert identity.pci_bus_id == "00000000:18:00.0"  # bytes from the PCI struct, decoded
    assert identity.mig_mode == "disabled" and identity.gpm_supported
    assert identity.facts == GpuFacts(
        memory_bus_width_bits=5120,
        max_memory_clock_mhz=2619,
        max_sm_clock_mhz=1980,
        cuda_cores=16896,
        compute_capability=(9, 0),
    )
    peaks = peaks_of(identity.name, identity.facts)
    assert peaks.memory_bandwidth == pytest.approx(3.352e12, rel=1e-3)
    assert peaks.flops["bf16"] == pytest.approx(989.4e12, rel=1e-3)


def test_facts_cost_five_calls_once() -> None:
    api, (handle,) = opened(H100_SXM)
    library = api._lib
    read_facts(api, handle)
    made = [name for name, _ in library.calls if name in FACT_CALLS]
    assert sorted(made) == sorted([*FACT_CALLS, "nvmlDeviceGetMaxClockInfo"])


def test_l4_without_mig_or_gpm() -> None:
    api, (handle,) = opened(L4)
    identity = read_identity(api, 0, handle)
    assert identity.mig_mode == "unsupported" and not identity.gpm_supported
    assert identity.facts.cuda_cores == 7424
    peaks = peaks_of(identity.name, identity.facts)
    assert peaks.flops["fp8"] == pytest.approx(58 * 2040e6 * 2048)


def test_mig_mode_core_count_not_supported() -> None:
    # nvml.h: "On MIG-enabled GPUs, querying the device's core count is currently not supported"
    mig = dataclasses.replace(H100_SXM, mig_mode=(1, 1), cuda_cores=Error(3))
    api, (handle,) = opened(mig)
    identity = read_identity(api, 0, handle)
    assert identity.mig_mode == "enabled"
    assert identity.facts.cuda_cores is None
    assert identity.facts.compute_capability == (9, 0)
    # whole-GPU peaks all the same, from the product table's SM count
    assert peaks_of(identity.name, identity.facts).flops["bf16"] == pytest.approx(989.4e12, 1e-3)


def test_older_nvidia_ml_py_without_the_bindings() -> None:
    api, (handle,) = opened(
        H100_SXM, drop=("nvmlDeviceGetMemoryBusWidth", "nvmlDeviceGetNumGpuCores")
    )
    with pytest.raises(nvml_api.NvmlError) as err:
        api.cuda_cores(handle)
    assert err.value.code == nvml_api.FUNCTION_NOT_FOUND
    facts = read_identity(api, 0, handle).facts
    assert facts.memory_bus_width_bits is None and facts.cuda_cores is None
    assert facts.max_memory_clock_mhz == 2619 and facts.compute_capability == (9, 0)
    # the table fills in what the library could not ask
    assert peaks_of(H100_SXM.name, facts).memory_bandwidth == pytest.approx(3.352e12, 1e-3)


def test_every_fact_not_supported() -> None:
    bare = dataclasses.replace(
        L4,
        name="NVIDIA Unknown",
        memory_bus_width=Error(pynvml.NVML_ERROR_NOT_SUPPORTED),
        max_clocks_mhz={},
        cuda_cores=Error(pynvml.NVML_ERROR_NOT_SUPPORTED),
        compute_capability=Error(pynvml.NVML_ERROR_NOT_SUPPORTED),
    )
    api, (handle,) = opened(bare)
    identity = read_identity(api, 0, handle)
    assert identity.facts == GpuFacts()
    peaks = peaks_of(identity.name, identity.facts)
    assert peaks.memory_bandwidth is None and peaks.flops == {}


def test_zero_answers_count_as_unknown() -> None:
    # Some virtualised GPUs answer 0 rather than NOT_SUPPORTED.
    api, (handle,) = opened(dataclasses.replace(L4, memory_bus_width=0, cuda_cores=0))
    facts = read_facts(api, handle)
    assert facts.memory_bus_width_bits is None and facts.cuda_cores is None


def test_gpu_level_errors_propagate() -> None:
    lost = dataclasses.replace(H100_SXM, memory_bus_width=Error(pynvml.NVML_ERROR_GPU_IS_LOST))
    api, (handle,) = opened(lost)
    with pytest.raises(nvml_api.NvmlError) as err:
        read_identity(api, 0, handle)
    assert err.value.code == nvml_api.GPU_IS_LOST


def test_calls_before_init_are_uninitialised() -> None:
    api = PynvmlApi(library=fake_pynvml([H100_SXM]))
    with pytest.raises(nvml_api.NvmlError) as err:
        api.device_count()
    assert err.value.code == nvml_api.UNINITIALIZED
