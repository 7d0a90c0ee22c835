"""A stand-in for the ``pynvml`` module (nvidia-ml-py) that answers as NVML does on given GPUs.

It lets :class:`exporter.backends.nvml.PynvmlApi` run without a GPU: the adapter receives it
through ``PynvmlApi(library=...)``. Errors are nvidia-ml-py's own classes (``NVMLError(3)`` is an
``NVMLError_NotSupported`` with ``.value == 3``), and constants are its own, so the adapter's
error mapping is exercised as on a GPU. Only the identity and hardware-fact calls are modelled;
``drop`` removes bindings the way an older nvidia-ml-py lacks them.

Each device answers from :class:`FakeGpu`; a field set to an ``int`` error code (e.g.
``pynvml.NVML_ERROR_NOT_SUPPORTED``) raises that error, as the driver does: for instance
``nvmlDeviceGetNumGpuCores`` on a GPU in MIG mode, or ``nvmlDeviceGetMigMode`` on an L4.
"""

# ruff: noqa: N802 - the functions carry pynvml's own names

from __future__ import annotations

import types
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import pynvml

NOT_SUPPORTED = pynvml.NVML_ERROR_NOT_SUPPORTED


@dataclass(frozen=True)
class Error:
    """An NVML return code the fake answers with instead of a value."""

    code: int


@dataclass
class FakeGpu:
    """What one GPU answers (values as nvidia-ml-py returns them)."""

    name: str
    uuid: str
    pci_bus_id: str = "00000000:18:00.0"
    mig_mode: tuple[int, int] | Error = (0, 0)
    gpm_supported: bool = False
    memory_bus_width: int | Error = Error(NOT_SUPPORTED)
    max_clocks_mhz: dict[int, int | Error] = field(default_factory=dict)
    cuda_cores: int | Error = Error(NOT_SUPPORTED)
    compute_capability: tuple[int, int] | Error = Error(NOT_SUPPORTED)


H100_SXM = FakeGpu(
    name="NVIDIA H100 80GB HBM3",
    uuid="GPU-6513270e-269e-0d37-f2a7-4de452e6b438",
    gpm_supported=True,
    memory_bus_width=5120,
    max_clocks_mhz={pynvml.NVML_CLOCK_SM: 1980, pynvml.NVML_CLOCK_MEM: 2619},
    cuda_cores=132 * 128,
    compute_capability=(9, 0),
)
L4 = FakeGpu(
    name="NVIDIA L4",
    uuid="GPU-11111111-2222-3333-4444-555555555555",
    pci_bus_id="00000000:2A:00.0",
    mig_mode=Error(NOT_SUPPORTED),  # no MIG on an L4
    memory_bus_width=192,
    max_clocks_mhz={pynvml.NVML_CLOCK_SM: 2040, pynvml.NVML_CLOCK_MEM: 6251},
    cuda_cores=7424,
    compute_capability=(8, 9),
)


class _PciInfo:
    def __init__(self, bus_id: str) -> None:
        self.busId = bus_id.encode()  # a c_char array: bytes


class _GpmSupport:
    def __init__(self, supported: bool) -> None:
        self.isSupportedDevice = int(supported)


class _Handle:
    def __init__(self, index: int) -> None:
        self.index = index


def fake_pynvml(
    gpus: list[FakeGpu], *, driver: str = "550.54.15", drop: Iterable[str] = ()
) -> types.ModuleType:
    """A module answering for ``gpus``; ``module.calls`` lists ``(function, gpu index)``."""
    module = types.ModuleType("pynvml")
    calls: list[tuple[str, int | None]] = []
    initialised = [False]

    def answer(value: Any) -> Any:
        if isinstance(value, Error):
            raise pynvml.NVMLError(value.code)
        return value

    def device(fn: str, handle: object) -> FakeGpu:
        if not initialised[0]:
            raise pynvml.NVMLError(pynvml.NVML_ERROR_UNINITIALIZED)
        if not isinstance(handle, _Handle) or not 0 <= handle.index < len(gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        calls.append((fn, handle.index))
        return gpus[handle.index]

    def nvmlInit() -> None:
        initialised[0] = True

    def nvmlShutdown() -> None:
        initialised[0] = False

    def nvmlSystemGetDriverVersion() -> str:
        return driver

    def nvmlDeviceGetCount() -> int:
        return len(gpus)

    def nvmlDeviceGetHandleByIndex(index: int) -> _Handle:
        if not 0 <= index < len(gpus):
            raise pynvml.NVMLError(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return _Handle(index)

    def nvmlDeviceGetUUID(handle: object) -> str:
        return device("nvmlDeviceGetUUID", handle).uuid

    def nvmlDeviceGetName(handle: object) -> str:
        return device("nvmlDeviceGetName", handle).name

    def nvmlDeviceGetPciInfo(handle: object) -> _PciInfo:
        return _PciInfo(device("nvmlDeviceGetPciInfo", handle).pci_bus_id)

    def nvmlDeviceGetMigMode(handle: object) -> tuple[int, int]:
        mode: tuple[int, int] = answer(device("nvmlDeviceGetMigMode", handle).mig_mode)
        return mode

    def nvmlGpmQueryDeviceSupport(handle: object) -> _GpmSupport:
        return _GpmSupport(device("nvmlGpmQueryDeviceSupport", handle).gpm_supported)

    def nvmlDeviceGetMemoryBusWidth(handle: object) -> int:
        width: int = answer(device("nvmlDeviceGetMemoryBusWidth", handle).memory_bus_width)
        return width

    def nvmlDeviceGetMaxClockInfo(handle: object, clock_type: int) -> int:
        clocks = device("nvmlDeviceGetMaxClockInfo", handle).max_clocks_mhz
        if clock_type not in clocks:
            raise pynvml.NVMLError(NOT_SUPPORTED)
        mhz: int = answer(clocks[clock_type])
        return mhz

    def nvmlDeviceGetNumGpuCores(handle: object) -> int:
        cores: int = answer(device("nvmlDeviceGetNumGpuCores", handle).cuda_cores)
        return cores

    def nvmlDeviceGetCudaComputeCapability(handle: object) -> tuple[int, int]:
        cc: tuple[int, int] = answer(
            device("nvmlDeviceGetCudaComputeCapability", handle).compute_capability
        )
        return cc

    functions = {name: fn for name, fn in locals().items() if name.startswith("nvml")}
    for name, fn in functions.items():
        if name not in set(drop):
            setattr(module, name, fn)
    module.NVMLError = pynvml.NVMLError  # type: ignore[attr-defined]
    for name in dir(pynvml):
        if name.startswith(("NVML_CLOCK_", "NVML_ERROR_", "NVML_DEVICE_MIG_")):
            setattr(module, name, getattr(pynvml, name))
    module.calls = calls  # type: ignore[attr-defined]
    return module
