"""The nvidia-ml-py adapter over a stand-in pynvml module: identity and hardware facts, MIG
devices, per-process reads."""

from __future__ import annotations

import dataclasses

import pynvml
import pytest
from support.pynvml_fake import H100_SXM, L4, Error, FakeGpu, FakeMig, fake_pynvml

from exporter.backends import nvml_api
from exporter.backends.gpu_reader import (
    GpuIdentity,
    GpuReader,
    read_facts,
    read_identity,
    read_mig_slices,
)
from exporter.backends.nvml_library import PynvmlApi
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


# --- MIG devices and per-process reads ---------------------------------------------------------
# The H200 of a real `nvidia-smi -q` capture in MIG mode (driver 590.48.01; nvidia_gpu_exporter's
# internal/captures/linux-x86_64__nvidia-h200-mig__590.48.01.txt): GPU instance 2 holds two
# compute instances (1c.3g.71gb, 2c.3g.71gb) sharing 71424 MiB; GPU instance 3 is a 2g.35gb,
# 9 and 10 are 1g.18gb; 143771 MiB in all. SM counts and memory are the capture's.
MIB = 1024 * 1024
H200_MIG = FakeGpu(
    name="NVIDIA H200",
    uuid="GPU-00000000-0000-0000-0000-000000000000",
    pci_bus_id="00000000:83:00.0",
    mig_mode=(1, 1),
    gpm_supported=True,
    memory_bus_width=6144,
    max_clocks_mhz={pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201},
    cuda_cores=Error(pynvml.NVML_ERROR_NOT_SUPPORTED),
    compute_capability=(9, 0),
    utilization=(0, 0),  # what the GPU would answer outside MIG mode: never reached here
    samples=[(1, 50)],
    memory=(16959 * MIB, 143771 * MIB),
    power_mw=295_000,
    temperature_c=36,
    clocks_mhz={pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 3201},
    max_mig_devices=7,
    mig_devices={
        0: FakeMig(
            "MIG-00000000-0000-0000-0000-000000000000",
            "NVIDIA H200 MIG 1c.3g.71gb",
            2,
            0,
            (16, 3, 1, 71424),
            (16925 * MIB, 71424 * MIB),
        ),
        1: FakeMig(
            "MIG-00000001-0000-0000-0000-000000000001",
            "NVIDIA H200 MIG 2c.3g.71gb",
            2,
            1,
            (32, 3, 2, 71424),
            (16925 * MIB, 71424 * MIB),
            [(12249, 2194 * MIB), (12250, 1170 * MIB), (12267, 13526 * MIB)],
        ),
        2: FakeMig(
            "MIG-00000002-0000-0000-0000-000000000002",
            "NVIDIA H200 MIG 2g.35gb",
            3,
            0,
            (32, 2, 2, 33280),
            (17 * MIB, 33280 * MIB),
        ),
        3: FakeMig(
            "MIG-00000003-0000-0000-0000-000000000003",
            "NVIDIA H200 MIG 1g.18gb",
            9,
            0,
            (16, 1, 1, 16384),
            (9 * MIB, 16384 * MIB),
        ),
        # slot 4 empty: indices are sparse when profiles take several slots
        5: FakeMig(
            "MIG-00000004-0000-0000-0000-000000000004",
            "NVIDIA H200 MIG 1g.18gb",
            10,
            0,
            (16, 1, 1, 16384),
            (9 * MIB, 16384 * MIB),
        ),
    },
    gpm_instances={2: {1: 97.0, 2: 95.5, 10: 61.0}, 3: {1: 0.0, 10: 0.0}},
)


def mig_slices() -> tuple[PynvmlApi, object, list[tuple[GpuIdentity, object]]]:
    api, (handle,) = opened(H200_MIG)
    parent = read_identity(api, 0, handle)
    return api, handle, read_mig_slices(api, parent, handle)


def test_mig_enumeration_skips_empty_slots_and_names_profiles() -> None:
    _, _, slices = mig_slices()
    got = [
        (i.label, i.uuid[-4:], i.mig.profile, i.mig.gpu_instance_id, i.mig.compute_instance_id)
        for i, _ in slices
        if i.mig is not None
    ]
    assert got == [
        ("0:0", "0000", "1c.3g.71gb", 2, 0),
        ("0:1", "0001", "2c.3g.71gb", 2, 1),
        ("0:2", "0002", "2g.35gb", 3, 0),
        ("0:3", "0003", "1g.18gb", 9, 0),
        ("0:5", "0004", "1g.18gb", 10, 0),
    ]
    first = slices[0][0]
    assert first.mig_mode == "slice" and first.gpm_supported
    assert first.pci_bus_id == "00000000:83:00.0" and first.mig is not None
    assert first.mig.parent_uuid == H200_MIG.uuid
    assert first.mig.attributes == nvml_api.MigAttributes(16, 3, 1, 71424)


def test_mig_memory_share_is_whole_eighths_of_the_gpu() -> None:
    _, _, slices = mig_slices()
    shares = [i.mig.memory_fraction for i, _ in slices if i.mig is not None]
    # 71424/143771 = 0.497 -> 4/8, 33280/143771 = 0.231 -> 2/8, 16384/143771 = 0.114 -> 1/8
    assert shares == [0.5, 0.5, 0.25, 0.125, 0.125]


def test_mig_parent_memory_unreadable_falls_back_to_the_name() -> None:
    unprivileged = dataclasses.replace(
        H200_MIG,
        name="NVIDIA H100 80GB HBM3",
        memory=Error(pynvml.NVML_ERROR_NO_PERMISSION),
        mig_devices={
            0: FakeMig("MIG-a", "NVIDIA H100 80GB HBM3 MIG 1g.10gb", 9, 0, (16, 1, 1, 9984))
        },
    )
    api, (handle,) = opened(unprivileged)
    ((identity, _),) = read_mig_slices(api, read_identity(api, 0, handle), handle)
    assert identity.mig is not None
    assert identity.mig.parent_memory_total_bytes == 80 * 1024**3
    assert identity.mig.memory_fraction == 0.125


def test_no_mig_devices_without_mig_mode() -> None:
    api, (handle,) = opened(H100_SXM)
    assert read_mig_slices(api, read_identity(api, 0, handle), handle) == []


def test_device_level_calls_are_not_supported_on_a_mig_handle() -> None:
    api, _, slices = mig_slices()
    _, mig = slices[1]
    for call in (
        lambda: api.utilization_rates(mig),
        lambda: api.utilization_samples(mig, 0),
        lambda: api.process_utilization(mig, 0),
        lambda: api.power_usage_mw(mig),
        lambda: api.temperature_c(mig),
        lambda: api.clock_mhz(mig, "sm"),
    ):
        with pytest.raises(nvml_api.NvmlError) as err:
            call()
        assert err.value.code == nvml_api.NOT_SUPPORTED
    # what a MIG handle does answer: its GPU instance's memory and its processes
    assert api.memory_info(mig) == (16925 * MIB, 71424 * MIB)
    assert [p.pid for p in api.compute_processes(mig)] == [12249, 12250, 12267]


def test_utilisation_is_not_supported_on_a_gpu_in_mig_mode() -> None:
    api, handle, _ = mig_slices()
    with pytest.raises(nvml_api.NvmlError) as err:
        api.utilization_rates(handle)
    assert err.value.code == nvml_api.NOT_SUPPORTED
    assert api.power_usage_mw(handle) == 295_000  # the physical GPU's own fields still answer


def test_mig_device_reader_reads_memory_gpm_and_processes_only() -> None:
    api, parent, slices = mig_slices()
    identity, mig = slices[1]
    clock = [100.0]
    reader = GpuReader(api, identity, mig, clock=lambda: clock[0], parent=parent, processes=True)
    library = api._lib
    first = reader.read()
    clock[0] += 3.0
    second = reader.read()
    assert first.memory_used_bytes == 16925 * MIB and first.gpm == {}
    # GPU instance 2's GPM values, sampled through the parent with nvmlGpmMigSampleGet
    assert second.gpm == {"graphics_util": 97.0, "sm_util": 95.5, "dram_bw_util": 61.0}
    assert second.gpm_interval_s == 3.0
    assert second.power_mw is None and second.samples == [] and second.util_gpu_pct is None
    assert second.processes is not None and len(second.processes) == 3
    assert second.process_samples is None  # not supported on MIG
    asked = {name for name, _ in library.calls}
    for parent_only in ("nvmlDeviceGetPowerUsage", "nvmlDeviceGetClockInfo"):
        assert parent_only not in asked
    # Unsupported fields cost one call each, once: steady state is 3 calls per read.
    before = reader.calls
    clock[0] += 3.0
    reader.read()
    assert reader.calls - before == 3
    assert {"samples", "utilization_rates", "process_utilization"} <= reader.unsupported
    reader.close()
    assert library.library.samples == {}  # every GPM sample freed


def test_a_vanished_gpu_instance_fails_the_read() -> None:
    # The GPU instance was destroyed (MIG reconfigured): its GPM sample is NOT_FOUND, which is
    # not a missing field but a device that no longer exists (the collector re-enumerates).
    api, (handle,) = opened(dataclasses.replace(H200_MIG, gpm_instances={}))
    parent = read_identity(api, 0, handle)
    identity, mig = read_mig_slices(api, parent, handle)[0]
    reader = GpuReader(api, identity, mig, clock=lambda: 0.0, parent=handle)
    with pytest.raises(nvml_api.NvmlError) as err:
        reader.read()
    assert err.value.code == nvml_api.NOT_FOUND


def test_a100_mig_has_no_gpm() -> None:
    a100 = dataclasses.replace(
        H200_MIG, name="NVIDIA A100-SXM4-80GB", gpm_supported=False, gpm_instances={}
    )
    api, (handle,) = opened(a100)
    slices = read_mig_slices(api, read_identity(api, 0, handle), handle)
    assert slices and not any(i.gpm_supported for i, _ in slices)


# --- per-process reads on a whole GPU ----------------------------------------------------------
SHARED = dataclasses.replace(
    H100_SXM,
    utilization=(90, 40),
    processes=[(4242, 30 * 1024**3), (5151, 20 * 1024**3), (6000, None)],
    process_samples=[
        (4242, 1_000, 20, 5),
        (5151, 1_100, 65, 30),
        (4242, 2_000, 25, 6),
        (5151, 2_100, 60, 28),
    ],
)


def test_compute_processes_with_memory_not_available() -> None:
    api, (handle,) = opened(SHARED)
    procs = api.compute_processes(handle)
    assert procs == [
        nvml_api.ProcessMemory(4242, 30 * 1024**3),
        nvml_api.ProcessMemory(5151, 20 * 1024**3),
        nvml_api.ProcessMemory(6000, None),  # NVML_VALUE_NOT_AVAILABLE, as the binding maps it
    ]


def test_no_compute_processes_is_an_empty_list() -> None:
    api, (handle,) = opened(dataclasses.replace(SHARED, processes=[]))
    assert api.compute_processes(handle) == []


def test_process_utilization_sample_buffer() -> None:
    api, (handle,) = opened(SHARED)
    everything = api.process_utilization(handle, 0)
    assert [(s.pid, s.timestamp_us, s.sm_pct) for s in everything] == [
        (4242, 1_000, 20),
        (5151, 1_100, 65),
        (4242, 2_000, 25),
        (5151, 2_100, 60),
    ]
    newer = api.process_utilization(handle, 1_100)
    assert [s.timestamp_us for s in newer] == [2_000, 2_100]
    # nothing newer: the driver answers NOT_FOUND, which means "no activity", not an error
    assert api.process_utilization(handle, 2_100) == []


def test_process_utilization_buffer_grows_between_the_two_calls() -> None:
    api, (handle,) = opened(dataclasses.replace(SHARED, grow_between_calls=1))
    assert len(api.process_utilization(handle, 0)) == 4  # sized again once
    api, (handle,) = opened(dataclasses.replace(SHARED, grow_between_calls=2))
    assert api.process_utilization(handle, 0) == []  # left in the buffer for the next poll


def test_driver_without_the_versioned_process_symbol() -> None:
    # nvidia-ml-py raises NVMLLibraryMismatchError (not an NVMLError) when the driver lacks
    # nvmlDeviceGetComputeRunningProcesses_v3: the adapter answers FUNCTION_NOT_FOUND.
    module = fake_pynvml([SHARED], missing=("nvmlDeviceGetComputeRunningProcesses_v3",))
    api = PynvmlApi(library=module)
    api.init()
    with pytest.raises(nvml_api.NvmlError) as err:
        api.compute_processes(api.handle(0))
    assert err.value.code == nvml_api.FUNCTION_NOT_FOUND


def test_reader_per_process_cursor() -> None:
    api, (handle,) = opened(SHARED)
    identity = read_identity(api, 0, handle)
    reader = GpuReader(api, identity, handle, clock=lambda: 0.0, processes=True)
    first = reader.read()
    assert first.process_samples is not None and len(first.process_samples) == 4
    assert reader.last_process_us == 2_100
    second = reader.read()
    assert second.process_samples == []  # never counted twice
    off = GpuReader(api, identity, handle, clock=lambda: 0.0)
    assert off.read().processes is None  # per-process reads off: no calls
