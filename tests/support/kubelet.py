"""A realistic GPU node for the kubelet's PodResources tests (hand-written).

The stand-in kubelet itself, which speaks the real protocol, is the lab's
(:class:`exporter.lab.layouts.Kubelet`, served by ``serve_kubelet``); here is what it serves.
:func:`device_plugin_node` is a realistic node: device IDs as the NVIDIA device plugin names
them (``GPU-<uuid>`` for whole GPUs, ``GPU-<uuid>::<n>`` for time-slicing replicas,
``MIG-<uuid>`` under ``nvidia.com/mig-<profile>`` with the mixed strategy), and
:func:`node_gpus` the stand-in NVML's GPUs with the same UUIDs.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import pynvml

from exporter.backends.nvml_api import NvmlError
from exporter.backends.nvml_library import PynvmlApi
from exporter.lab.layouts import Container, Pod
from support.pynvml_fake import H100_SXM, FakeGpu, FakeMig, fake_pynvml


def gpu_uuid(n: int) -> str:
    return f"GPU-6513270e-269e-0d37-f2a7-4de452e6b4{n:02d}"


MIG_UUID = "MIG-a1b2c3d4-0000-5111-8222-933344445555"
MIG_GPU = 10  # the GPU in MIG mode
SHARED_GPU = 11  # the time-sliced GPU
FREE_GPU = 12  # offered, held by no pod
GPUS = 13


def node_gpus() -> list[FakeGpu]:
    """The stand-in NVML's view of the node: 13 H100s, GPU 10 in MIG mode with one 1g.10gb
    device (slot 0), each GPU busy at 10 * (index + 1) percent (capped at 100)."""
    gpus = []
    for n in range(GPUS):
        gpu = FakeGpu(
            name=H100_SXM.name,
            uuid=gpu_uuid(n),
            pci_bus_id=f"00000000:{0x18 + n:02X}:00.0",
            gpm_supported=False,
            memory_bus_width=H100_SXM.memory_bus_width,
            max_clocks_mhz=dict(H100_SXM.max_clocks_mhz),
            cuda_cores=H100_SXM.cuda_cores,
            compute_capability=H100_SXM.compute_capability,
            utilization=(min(100, 10 * (n + 1)), 5),
            memory=(10 * 2**30, 80 * 2**30),
        )
        if n == MIG_GPU:
            gpu.mig_mode = (1, 1)
            gpu.utilization = pynvml_not_supported()
            gpu.max_mig_devices = 7
            gpu.mig_devices = {
                0: FakeMig(
                    uuid=MIG_UUID,
                    name="NVIDIA H100 80GB HBM3 MIG 1g.10gb",
                    gpu_instance_id=9,
                    memory=(2**30, 10 * 2**30),
                )
            }
        gpus.append(gpu)
    return gpus


class NodeNvml(PynvmlApi):
    """The stand-in NVML of the node: nvidia-ml-py's adapter over :func:`node_gpus`. The fake
    C library has no event sets, so Xid events answer NOT_SUPPORTED, as on a vGPU guest."""

    def __init__(self, gpus: list[FakeGpu] | None = None) -> None:
        super().__init__(library=fake_pynvml(node_gpus() if gpus is None else gpus))

    def register_xid_events(self, handles: Sequence[object]) -> None:
        raise NvmlError(pynvml.NVML_ERROR_NOT_SUPPORTED)


def pynvml_not_supported() -> Any:
    from support.pynvml_fake import Error  # noqa: PLC0415

    return Error(pynvml.NVML_ERROR_NOT_SUPPORTED)


def device_plugin_node() -> list[Pod]:
    """Eight 1-GPU pods, one 2-GPU pod, a MIG pod, two pods sharing a time-sliced GPU."""
    gpu = "nvidia.com/gpu"
    pods = [
        Pod("serving", f"vllm-{n}", [Container("vllm", {gpu: [gpu_uuid(n)]})]) for n in range(8)
    ]
    pods.append(
        Pod(
            "serving",
            "vllm-tp2",
            [
                Container("vllm", {gpu: [gpu_uuid(8), gpu_uuid(9)]}),
                Container("inference-bottleneck-exporter"),
            ],
        )
    )
    pods.append(
        Pod("batch", "embed-mig", [Container("tei", {"nvidia.com/mig-1g.10gb": [MIG_UUID]})])
    )
    pods += [
        Pod("dev", "notebook-a", [Container("jupyter", {gpu: [f"{gpu_uuid(SHARED_GPU)}::0"]})]),
        Pod("dev", "notebook-b", [Container("jupyter", {gpu: [f"{gpu_uuid(SHARED_GPU)}::3"]})]),
    ]
    pods.append(Pod("kube-system", "coredns-1", [Container("coredns", {"cpu": []})]))
    return pods


def device_plugin_offer() -> dict[str, list[str]]:
    """What the node's device plugins offer (GetAllocatableResources)."""
    whole = [gpu_uuid(n) for n in range(GPUS) if n not in (MIG_GPU, SHARED_GPU)]
    replicas = [f"{gpu_uuid(SHARED_GPU)}::{r}" for r in range(4)]
    return {"nvidia.com/gpu": whole + replicas, "nvidia.com/mig-1g.10gb": [MIG_UUID]}
