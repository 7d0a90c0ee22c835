"""A kubelet's PodResources v1 service on a unix socket, for tests (hand-written).

It speaks the real protocol: a grpcio server with the vendored ``.proto``'s messages on the
method paths a kubelet serves (``/v1.PodResourcesLister/List``, ``GetAllocatableResources``,
``Get``). Pods are plain data the test changes while it runs (a pod ends: ``end_pod``); faults
are switches: ``hang`` (answers after the client's deadline), ``fail`` (a gRPC status code),
``without_get`` (a kubelet before 1.27, or with the ``KubeletPodResourcesGet`` gate off),
``without_allocatable`` (before 1.23).

:func:`device_plugin_node` is a realistic node: device IDs as the NVIDIA device plugin names
them (``GPU-<uuid>`` for whole GPUs, ``GPU-<uuid>::<n>`` for time-slicing replicas,
``MIG-<uuid>`` under ``nvidia.com/mig-<profile>`` with the mixed strategy), and
:func:`node_gpus` the stand-in NVML's GPUs with the same UUIDs.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pynvml

from exporter.backends.kubelet import podresources_v1_pb2 as pb
from exporter.backends.nvml_api import NvmlError
from exporter.backends.nvml_library import PynvmlApi
from exporter.backends.podresources_client import SERVICE
from support.pynvml_fake import H100_SXM, FakeGpu, FakeMig, fake_pynvml


@dataclass
class FakeContainer:
    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource -> device IDs


@dataclass
class FakePod:
    namespace: str
    name: str
    containers: list[FakeContainer]


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


def device_plugin_node() -> list[FakePod]:
    """Eight 1-GPU pods, one 2-GPU pod, a MIG pod, two pods sharing a time-sliced GPU."""
    gpu = "nvidia.com/gpu"
    pods = [
        FakePod("serving", f"vllm-{n}", [FakeContainer("vllm", {gpu: [gpu_uuid(n)]})])
        for n in range(8)
    ]
    pods.append(
        FakePod(
            "serving",
            "vllm-tp2",
            [
                FakeContainer("vllm", {gpu: [gpu_uuid(8), gpu_uuid(9)]}),
                FakeContainer("inference-bottleneck-exporter"),
            ],
        )
    )
    pods.append(
        FakePod(
            "batch", "embed-mig", [FakeContainer("tei", {"nvidia.com/mig-1g.10gb": [MIG_UUID]})]
        )
    )
    pods += [
        FakePod(
            "dev", "notebook-a", [FakeContainer("jupyter", {gpu: [f"{gpu_uuid(SHARED_GPU)}::0"]})]
        ),
        FakePod(
            "dev", "notebook-b", [FakeContainer("jupyter", {gpu: [f"{gpu_uuid(SHARED_GPU)}::3"]})]
        ),
    ]
    pods.append(FakePod("kube-system", "coredns-1", [FakeContainer("coredns", {"cpu": []})]))
    return pods


def device_plugin_offer() -> dict[str, list[str]]:
    """What the node's device plugins offer (GetAllocatableResources)."""
    whole = [gpu_uuid(n) for n in range(GPUS) if n not in (MIG_GPU, SHARED_GPU)]
    replicas = [f"{gpu_uuid(SHARED_GPU)}::{r}" for r in range(4)]
    return {"nvidia.com/gpu": whole + replicas, "nvidia.com/mig-1g.10gb": [MIG_UUID]}


class FakeKubelet:
    """The PodResourcesLister service; see the module docstring."""

    def __init__(self, pods: list[FakePod], offer: dict[str, list[str]] | None = None) -> None:
        self.pods = pods
        self.offer = offer if offer is not None else {}
        self.calls: list[str] = []
        self.hang: float = 0.0  # seconds each answer is held back
        self.fail: grpc.StatusCode | None = None
        self.without_get = False
        self.without_allocatable = False  # a kubelet before 1.23 (or its gate off)
        self._lock = threading.Lock()

    def end_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self.pods = [p for p in self.pods if (p.namespace, p.name) != (namespace, name)]

    def _pod(self, pod: FakePod) -> pb.PodResources:
        return pb.PodResources(
            name=pod.name,
            namespace=pod.namespace,
            containers=[
                pb.ContainerResources(
                    name=c.name,
                    devices=[
                        pb.ContainerDevices(resource_name=r, device_ids=ids)
                        for r, ids in c.devices.items()
                    ],
                )
                for c in pod.containers
            ],
        )

    def _serve(self, method: str, context: grpc.ServicerContext) -> None:
        with self._lock:
            self.calls.append(method)
        if self.hang:
            time.sleep(self.hang)
        if self.fail is not None:
            context.abort(self.fail, "injected by the test")

    def list(self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        self._serve("List", context)
        with self._lock:
            return pb.ListPodResourcesResponse(pod_resources=[self._pod(p) for p in self.pods])

    def allocatable(self, request: pb.AllocatableResourcesRequest, context: Any) -> Any:
        if self.without_allocatable:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "method not implemented")
        self._serve("GetAllocatableResources", context)
        return pb.AllocatableResourcesResponse(
            devices=[
                pb.ContainerDevices(resource_name=r, device_ids=ids)
                for r, ids in self.offer.items()
            ]
        )

    def get(self, request: pb.GetPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        if self.without_get:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "method Get not implemented")
        self._serve("Get", context)
        with self._lock:
            for pod in self.pods:
                if (pod.namespace, pod.name) == (request.pod_namespace, request.pod_name):
                    return pb.GetPodResourcesResponse(pod_resources=self._pod(pod))
        context.abort(grpc.StatusCode.NOT_FOUND, f"pod {request.pod_name} not found")
        return None

    def handler(self) -> grpc.GenericRpcHandler:
        def unary(fn: Callable[..., Any], request: Any, response: Any) -> grpc.RpcMethodHandler:
            return grpc.unary_unary_rpc_method_handler(
                fn,
                request_deserializer=request.FromString,
                response_serializer=response.SerializeToString,
            )

        return grpc.method_handlers_generic_handler(
            SERVICE.lstrip("/"),
            {
                "List": unary(self.list, pb.ListPodResourcesRequest, pb.ListPodResourcesResponse),
                "GetAllocatableResources": unary(
                    self.allocatable,
                    pb.AllocatableResourcesRequest,
                    pb.AllocatableResourcesResponse,
                ),
                "Get": unary(self.get, pb.GetPodResourcesRequest, pb.GetPodResourcesResponse),
            },
        )


@contextmanager
def serve(kubelet: FakeKubelet, socket: Path) -> Iterator[Path]:
    """Serve ``kubelet`` on the unix socket ``socket`` until the block ends."""
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((kubelet.handler(),))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield socket
    finally:
        server.stop(grace=None).wait(5)
