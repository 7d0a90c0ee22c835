"""The layouts the chart installs, on one machine: who reads the GPUs, and how Prometheus
scrapes it. The demo and the drills run them (:class:`~exporter.lab.stack.Stack`), and the
tests that run a node agent take their stand-ins from here.

``node`` (the chart's default, ``mode: node``)
    A node agent per node reads the GPUs (NVML, or here a replayed trace) and asks the
    kubelet's PodResources API which pod holds each; the sidecars read the engines without
    NVML (``--no-collector.nvml --gpu.read-by``). Here the kubelet is a stand-in
    (:class:`Kubelet`: the real PodResources v1 protocol on a unix socket, its pods plain data;
    :func:`start_node` gives a pod every GPU its agent reads), and so is kube-state-metrics
    (:class:`MetricsServer` with :func:`kube_pod_info`, which the node profile reads for each
    pod's own share of a time-sliced GPU). Prometheus scrapes them as the chart's two
    PodMonitors do (:func:`scrape_configs`): the sidecars with their pod's ``namespace`` and
    ``pod`` as target labels, the agents with ``honor_labels``, so the pod that
    ``inference_gpu_pod_info`` names is kept.
``sidecar`` (``mode: sidecar``)
    The sidecar reads its GPUs itself; one job.
``dcgm`` (``mode: dcgm``)
    dcgm-exporter reads the GPUs and labels each with the pod the kubelet gave it; the sidecars
    run without NVML. Here dcgm-exporter is a stand-in (:class:`DcgmExporter`: the
    ``DCGM_FI_*`` fields the pack reads, in DCGM's units, from the replayed trace or NVML),
    scraped with ``honor_labels`` as the GPU operator's ServiceMonitor does. dcgm-exporter
    reports no peak figure, and the replayed GPU (the host's measured peaks) is no product of
    the table the dcgm profile reads peaks from: the layout's site config gives its peaks
    (``gpu_peaks``, :func:`dcgm_site_config`), as a site does for a product the table lacks.

Each layout loads its own profile at ``fast``'s speed (:func:`rule_profile`: ``fast-node``,
``fast``, ``fast-dcgm``). grpc and protobuf (the ``node`` extra) are imported only when a
stand-in kubelet serves. No torch is imported here.
"""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from exporter.backends.nvml_api import GPM_BASE_NAMES, NvmlApi, NvmlError
from exporter.backends.podresources_client import SERVICE
from exporter.backends.replay import ReplayApi, load_trace
from exporter.hardware.gpus import peaks_of
from exporter.lab.processes import (
    Child,
    LocalServer,
    StackError,
    http_get,
    reply,
    start_exporter,
    wait_until,
)
from exporter.signatures.params import PREFILL_PRECISION
from exporter.signatures.site import Source, fast_profile

if TYPE_CHECKING:
    import grpc

    from exporter.backends.kubelet import podresources_v1_pb2 as pb

# Layout -> what it is, as the demo's screen says it; the first is the chart's default. A
# layout's name is its rule profile's source.
LAYOUTS: dict[str, str] = {
    "node": "the node agent reads the GPUs and the kubelet names their pod (the chart's default)",
    "sidecar": "the sidecar reads its GPUs itself (the chart's mode: sidecar)",
    "dcgm": "dcgm-exporter reads the GPUs and names their pod (the chart's mode: dcgm)",
}
DEFAULT_LAYOUT = "node"
# The jobs Prometheus scrapes, as the chart's PodMonitors name them.
SIDECAR_JOB = "inference-bottleneck-exporter"
AGENT_JOB = "inference-bottleneck-exporter-node"
KSM_JOB = "kube-state-metrics"
DCGM_JOB = "gpu-operator/nvidia-dcgm-exporter"
GPU_RESOURCE = "nvidia.com/gpu"  # the NVIDIA device plugin's, IDs ``GPU-<uuid>``
# The node agent's collectors, as the chart's DaemonSet runs it (helm/.../_helpers.tpl).
AGENT_COLLECTORS = (
    "--collector.nvml",
    "--collector.cpu",
    "--collector.podresources",
    "--no-collector.engine",
    "--no-collector.tokenizer",
    "--no-collector.process",
    "--no-collector.model",
)
# The node the stand-ins describe, and the agents' own pods (a DaemonSet's, one per node).
NODE_NAME = "lab-node"
AGENT_NAMESPACE = "monitoring"
DCGM_NAMESPACE = "gpu-operator"


def rule_profile(layout: str) -> str:
    """The rule profile a layout loads: its source's, at ``fast``'s speed."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
    return fast_profile(cast("Source", layout))


# --- Prometheus ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """One scrape target: its address and the target labels a PodMonitor would give it."""

    address: str  # host:port
    labels: dict[str, str]


def scrape_configs(
    sidecars: Sequence[Target],
    agents: Sequence[Target] = (),
    kube_state_metrics: Target | None = None,
    dcgm_exporters: Sequence[Target] = (),
) -> list[dict[str, Any]]:
    """The scrape jobs of a layout: the sidecars (their pod's labels on every series); the
    node agents, kube-state-metrics and dcgm-exporters with ``honor_labels`` (the pod each of
    their series names stays that pod's)."""

    def job(name: str, targets: Sequence[Target], honor: bool) -> dict[str, Any]:
        out: dict[str, Any] = {"job_name": name}
        if honor:
            out["honor_labels"] = True
        out["static_configs"] = [
            {"targets": [t.address], "labels": dict(t.labels)} for t in targets
        ]
        return out

    jobs = [job(SIDECAR_JOB, sidecars, False)]
    if agents:
        jobs.append(job(AGENT_JOB, agents, True))
    if kube_state_metrics is not None:
        jobs.append(job(KSM_JOB, [kube_state_metrics], True))
    if dcgm_exporters:
        jobs.append(job(DCGM_JOB, dcgm_exporters, True))
    return jobs


# --- the node agent's and the sidecar's command lines --------------------------------------------


def agent_flags(
    socket: Path,
    *,
    listen: str = "127.0.0.1:0",
    trace: Path | None = None,
    interval: str = "1s",
    deadline: str = "500ms",
    gpu_poll: str = "1s",
) -> list[str]:
    """The node agent's flags: the chart's DaemonSet's, at the lab's speed (the kubelet asked
    every ``interval``, the GPUs polled every ``gpu_poll``), ``trace`` replayed instead of
    NVML when given."""
    flags = [
        "--web.listen-address",
        listen,
        *AGENT_COLLECTORS,
        f"--podresources.socket={socket}",
        f"--podresources.interval={interval}",
        f"--podresources.deadline={deadline}",
        f"--gpu.poll-interval={gpu_poll}",
    ]
    if trace is not None:
        flags += ["--gpu.replay-file", str(trace)]
    return flags


def sidecar_flags(layout: str, reader_url: str = "") -> list[str]:
    """What a layout adds to a sidecar's flags: in the node and dcgm layouts no NVML, and the
    landing page says who reads its GPUs (the chart's ``--gpu.read-by``)."""
    if layout == "sidecar":
        return []
    who = "the node agent" if layout == "node" else "dcgm-exporter"
    return ["--no-collector.nvml", "--gpu.read-by", f"{who} at {reader_url}"]


# --- the stand-in kubelet ------------------------------------------------------------------------


@dataclass
class Container:
    name: str
    devices: dict[str, list[str]] = field(default_factory=dict)  # resource -> device IDs


@dataclass
class Pod:
    namespace: str
    name: str
    containers: list[Container]
    uid: str = ""  # kube-state-metrics' ``uid``; empty: one derived from namespace and name

    def __post_init__(self) -> None:
        if not self.uid:
            self.uid = str(uuid.uuid5(uuid.NAMESPACE_URL, f"pod/{self.namespace}/{self.name}"))


class Kubelet:
    """A kubelet's PodResources v1 service (``List``, ``GetAllocatableResources``, ``Get``) over
    pods that are plain data, changed while it serves (:meth:`end_pod`, :meth:`give`).

    Faults are switches: ``hang`` (seconds each answer is held back), ``fail`` (a gRPC status
    code), ``without_get`` (a kubelet before 1.27, or its ``KubeletPodResourcesGet`` gate off),
    ``without_allocatable`` (before 1.23). ``calls`` lists the methods asked, in order.
    """

    def __init__(self, pods: list[Pod], offer: dict[str, list[str]] | None = None) -> None:
        self.pods = pods
        self.offer = offer if offer is not None else {}
        self.calls: list[str] = []
        self.hang: float = 0.0
        self.fail: grpc.StatusCode | None = None
        self.without_get = False
        self.without_allocatable = False
        self._lock = threading.Lock()

    def end_pod(self, namespace: str, name: str) -> None:
        with self._lock:
            self.pods = [p for p in self.pods if (p.namespace, p.name) != (namespace, name)]

    def give(
        self, namespace: str, name: str, container: str, resource: str, ids: list[str]
    ) -> None:
        """Assign devices ``ids`` of ``resource`` to a container (and offer them)."""
        with self._lock:
            for pod in self.pods:
                for c in pod.containers:
                    if (pod.namespace, pod.name, c.name) == (namespace, name, container):
                        c.devices[resource] = list(ids)
            offered = self.offer.setdefault(resource, [])
            offered += [i for i in ids if i not in offered]

    def _pod(self, pod: Pod) -> pb.PodResources:
        from exporter.backends.kubelet import podresources_v1_pb2 as pb  # noqa: PLC0415

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
            context.abort(self.fail, "a fault injected into the stand-in kubelet")

    def list(self, request: pb.ListPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        from exporter.backends.kubelet import podresources_v1_pb2 as pb  # noqa: PLC0415

        self._serve("List", context)
        with self._lock:
            return pb.ListPodResourcesResponse(pod_resources=[self._pod(p) for p in self.pods])

    def allocatable(
        self, request: pb.AllocatableResourcesRequest, context: grpc.ServicerContext
    ) -> Any:
        import grpc  # noqa: PLC0415

        from exporter.backends.kubelet import podresources_v1_pb2 as pb  # noqa: PLC0415

        if self.without_allocatable:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "method not implemented")
        self._serve("GetAllocatableResources", context)
        with self._lock:
            return pb.AllocatableResourcesResponse(
                devices=[
                    pb.ContainerDevices(resource_name=r, device_ids=ids)
                    for r, ids in self.offer.items()
                ]
            )

    def get(self, request: pb.GetPodResourcesRequest, context: grpc.ServicerContext) -> Any:
        import grpc  # noqa: PLC0415

        from exporter.backends.kubelet import podresources_v1_pb2 as pb  # noqa: PLC0415

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
        import grpc  # noqa: PLC0415

        from exporter.backends.kubelet import podresources_v1_pb2 as pb  # noqa: PLC0415

        def unary(
            fn: Callable[..., Any], request: Any, response: Any
        ) -> grpc.RpcMethodHandler[Any, Any]:
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
def serve_kubelet(kubelet: Kubelet, socket: Path) -> Iterator[Path]:
    """Serve ``kubelet`` on the unix socket ``socket`` until the block ends."""
    import grpc  # noqa: PLC0415

    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((kubelet.handler(),))
    server.add_insecure_port(f"unix://{socket}")
    server.start()
    try:
        yield socket
    finally:
        server.stop(grace=None).wait(5)


# --- the stand-in kube-state-metrics -------------------------------------------------------------


def kube_pod_info(pods: Sequence[Pod], node: str = NODE_NAME) -> str:
    """kube-state-metrics' ``kube_pod_info`` of ``pods`` (the labels the rules read, and the
    node and owner kind it always has)."""
    lines = ["# HELP kube_pod_info Information about pod.", "# TYPE kube_pod_info gauge"]
    for pod in pods:
        lines.append(
            f'kube_pod_info{{namespace="{pod.namespace}",pod="{pod.name}",uid="{pod.uid}",'
            f'node="{node}",created_by_kind="StatefulSet"}} 1'
        )
    return "\n".join(lines) + "\n"


class MetricsServer(LocalServer):
    """A ``/metrics`` endpoint on 127.0.0.1 serving ``body()`` at each scrape, in a thread of
    this process: the stand-in kube-state-metrics."""

    def __init__(self, body: Callable[[], str]) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path.split("?", 1)[0] != "/metrics":
                    self.send_error(404)
                    return
                reply(self, 200, body().encode(), "text/plain; version=0.0.4; charset=utf-8")

            def log_message(self, format: str, *args: Any) -> None:
                return

        super().__init__(Handler, "metrics-stand-in")


# --- the stand-in dcgm-exporter ------------------------------------------------------------------


@dataclass(frozen=True)
class DcgmField:
    """One field dcgm-exporter serves: its name, type, and its value from one NVML reading."""

    name: str
    kind: str  # gauge or counter
    help: str
    value: Callable[[NvmlApi, object, dict[str, float]], float]


def _gpm(name: str) -> Callable[[NvmlApi, object, dict[str, float]], float]:
    """A DCGM profiling field (a ratio) from the GPM metric of the same meaning (a percent)."""
    return lambda api, handle, gpm: gpm[name] / 100


# The fields the rule pack and the dashboards read (of NVIDIA/dcgm-exporter's
# etc/default-counters.csv and dcp-metrics-included.csv), in dcgm-exporter's units: MiB, W, mJ,
# MHz, percent for the DEV fields, ratios for the PROF ones. Xids are not served: the lab's
# traces have none.
DCGM_FIELDS = (
    DcgmField(
        "DCGM_FI_DEV_GPU_UTIL",
        "gauge",
        "GPU utilization (in %).",
        lambda api, h, gpm: api.utilization_rates(h)[0],
    ),
    DcgmField(
        "DCGM_FI_DEV_MEM_COPY_UTIL",
        "gauge",
        "Memory utilization (in %).",
        lambda api, h, gpm: api.utilization_rates(h)[1],
    ),
    DcgmField(
        "DCGM_FI_DEV_FB_USED",
        "gauge",
        "Framebuffer memory used (in MiB).",
        lambda api, h, gpm: api.memory_info(h)[0] // 2**20,
    ),
    DcgmField(
        "DCGM_FI_DEV_FB_FREE",
        "gauge",
        "Framebuffer memory free (in MiB).",
        lambda api, h, gpm: (api.memory_info(h)[1] - api.memory_info(h)[0]) // 2**20,
    ),
    DcgmField(
        "DCGM_FI_DEV_POWER_USAGE",
        "gauge",
        "Power draw (in W).",
        lambda api, h, gpm: api.power_usage_mw(h) / 1000,
    ),
    DcgmField(
        "DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION",
        "counter",
        "Total energy consumption since boot (in mJ).",
        lambda api, h, gpm: api.total_energy_mj(h),
    ),
    DcgmField(
        "DCGM_FI_DEV_GPU_TEMP",
        "gauge",
        "GPU temperature (in C).",
        lambda api, h, gpm: api.temperature_c(h),
    ),
    DcgmField(
        "DCGM_FI_DEV_SM_CLOCK",
        "gauge",
        "SM clock frequency (in MHz).",
        lambda api, h, gpm: api.clock_mhz(h, "sm"),
    ),
    DcgmField(
        "DCGM_FI_DEV_MEM_CLOCK",
        "gauge",
        "Memory clock frequency (in MHz).",
        lambda api, h, gpm: api.clock_mhz(h, "mem"),
    ),
    DcgmField(
        "DCGM_FI_DEV_CLOCKS_EVENT_REASONS",
        "gauge",
        "Current clock event reasons (bitmask).",
        lambda api, h, gpm: api.clock_event_reasons(h),
    ),
    DcgmField(
        "DCGM_FI_PROF_GR_ENGINE_ACTIVE",
        "gauge",
        "Ratio of time the graphics engine is active.",
        _gpm("graphics_util"),
    ),
    DcgmField(
        "DCGM_FI_PROF_SM_ACTIVE",
        "gauge",
        "The ratio of cycles an SM has at least 1 warp assigned.",
        _gpm("sm_util"),
    ),
    DcgmField(
        "DCGM_FI_PROF_SM_OCCUPANCY",
        "gauge",
        "The ratio of number of warps resident on an SM.",
        _gpm("sm_occupancy"),
    ),
    DcgmField(
        "DCGM_FI_PROF_PIPE_TENSOR_ACTIVE",
        "gauge",
        "Ratio of cycles the tensor (HMMA) pipe is active.",
        _gpm("any_tensor_util"),
    ),
    DcgmField(
        "DCGM_FI_PROF_DRAM_ACTIVE",
        "gauge",
        "Ratio of cycles the device memory interface is active sending or receiving data.",
        _gpm("dram_bw_util"),
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_TX_BYTES",
        "gauge",
        "The rate of data transmitted over the PCIe bus - including both protocol headers "
        "and data payloads - in bytes per second.",
        lambda api, h, gpm: gpm["pcie_tx_per_sec"] * 2**20,
    ),
    DcgmField(
        "DCGM_FI_PROF_PCIE_RX_BYTES",
        "gauge",
        "The rate of data received over the PCIe bus - including both protocol headers and "
        "data payloads - in bytes per second.",
        lambda api, h, gpm: gpm["pcie_rx_per_sec"] * 2**20,
    ),
)


class DcgmExporter(MetricsServer):
    """dcgm-exporter in Kubernetes mode, standing in: at each scrape the :data:`DCGM_FIELDS` of
    every GPU ``api`` reads (a replayed trace, or NVML), labelled as dcgm-exporter labels them
    (``gpu``, ``UUID``, ``pci_bus_id``, ``device``, ``modelName``, ``Hostname``,
    ``DCGM_FI_DRIVER_VERSION``) and with the pod the ``kubelet`` gives the GPU to (``container``,
    ``namespace``, ``pod``; empty for a GPU no pod holds). A field the GPU does not answer is
    left out, as DCGM leaves a blank field out. ``api`` is initialised here and shut down by
    :meth:`close`."""

    def __init__(self, api: NvmlApi, kubelet: Kubelet, hostname: str = NODE_NAME) -> None:
        self.api = api
        self.kubelet = kubelet
        self.hostname = hostname
        self._lock = threading.Lock()
        self._gpm: dict[int, object] = {}  # each GPU's previous GPM sample
        api.init()
        self.gpus = [api.handle(i) for i in range(api.device_count())]
        self.uuids = [api.uuid(h) for h in self.gpus]
        super().__init__(self.exposition)

    def _holders(self) -> dict[str, tuple[str, str, str]]:
        """GPU UUID -> (container, namespace, pod), from the kubelet's assignments."""
        out: dict[str, tuple[str, str, str]] = {}
        for pod in list(self.kubelet.pods):
            for c in pod.containers:
                for ids in c.devices.values():
                    for device in ids:
                        out[device.split("::", 1)[0]] = (c.name, pod.namespace, pod.name)
        return out

    def _gpm_reading(self, index: int) -> dict[str, float]:
        """GPM's percents and rates between this scrape's sample and the previous one."""
        handle = self.gpus[index]
        try:
            if not self.api.gpm_supported(handle):
                return {}
            newer = self.api.gpm_sample(handle)
        except NvmlError:
            return {}
        older = self._gpm.get(index)
        self._gpm[index] = newer
        if older is None:
            return {}  # GPM needs two samples: the first scrape has no profiling fields
        try:
            found = self.api.gpm_metrics(older, newer, list(GPM_BASE_NAMES))
        except NvmlError:
            return {}
        finally:
            self.api.gpm_free(older)
        return {GPM_BASE_NAMES[m]: v for m, v in found.items() if v is not None}

    def exposition(self) -> str:
        with self._lock:
            holders = self._holders()
            driver = self.api.driver_version()
            readings = []
            for index, handle in enumerate(self.gpus):
                holder = holders.get(self.uuids[index], ("", "", ""))
                labels = (
                    f'gpu="{index}",UUID="{self.uuids[index]}",'
                    f'pci_bus_id="{self.api.pci_bus_id(handle)}",device="nvidia{index}",'
                    f'modelName="{self.api.name(handle)}",Hostname="{self.hostname}",'
                    f'DCGM_FI_DRIVER_VERSION="{driver}",container="{holder[0]}",'
                    f'namespace="{holder[1]}",pod="{holder[2]}"'
                )
                readings.append((handle, labels, self._gpm_reading(index)))
            lines = []
            for f in DCGM_FIELDS:
                samples = []
                for handle, labels, gpm in readings:
                    with contextlib.suppress(NvmlError, KeyError):
                        samples.append(
                            f"{f.name}{{{labels}}} {float(f.value(self.api, handle, gpm))!r}"
                        )
                if samples:
                    lines += [f"# HELP {f.name} {f.help}", f"# TYPE {f.name} {f.kind}", *samples]
            return "\n".join(lines) + "\n"

    def close(self) -> None:
        super().close()
        with contextlib.suppress(NvmlError):
            self.api.shutdown()


def replayed_gpu_peaks(traces: Sequence[Path]) -> dict[str, dict[str, float]]:
    """The site config's ``gpu_peaks`` of the GPUs ``traces`` replay: each product name (the
    stand-in dcgm-exporter's ``modelName``) with the peaks its NVML facts give, the figures the
    sidecar and the node agent export for it. The first trace's wins for a name."""
    out: dict[str, dict[str, float]] = {}
    for path in traces:
        for gpu in load_trace(path).gpus:
            peaks = peaks_of(gpu.name, gpu.facts)
            figures: dict[str, float] = {}
            if peaks.memory_bandwidth:
                figures["memory_bandwidth_bytes_per_second"] = peaks.memory_bandwidth
            flops = peaks.flops.get(PREFILL_PRECISION)
            if flops:
                figures[f"{PREFILL_PRECISION}_flops"] = flops
            if figures:
                out.setdefault(gpu.name, figures)
    return out


def dcgm_site_config(config: Path | None, traces: Sequence[Path], out: Path) -> Path | None:
    """The dcgm layout's site config: ``config`` (a YAML mapping, or none) with the replayed
    GPUs' peaks added under ``gpu_peaks`` (:func:`replayed_gpu_peaks`; a product the config
    names keeps its figures), written to ``out``; ``config`` as it is where nothing is
    replayed (real GPUs: the product table knows them)."""
    import yaml  # noqa: PLC0415

    peaks = replayed_gpu_peaks(traces)
    if not peaks:
        return config
    data: dict[str, Any] = {}
    if config is not None:
        loaded = yaml.safe_load(config.read_text(encoding="utf-8"))
        data = dict(loaded) if isinstance(loaded, dict) else {}
    given = dict(data.get("gpu_peaks") or {})
    data["gpu_peaks"] = {**peaks, **given}
    out.write_text(yaml.safe_dump(data, sort_keys=False), encoding="utf-8")
    return out


# --- one node: its kubelet and its agent ---------------------------------------------------------


@dataclass
class Node:
    """A stand-in node: its kubelet (in this process), and what reads its GPUs: in the node
    layout a node agent (a child process), in the dcgm layout a stand-in dcgm-exporter (a
    thread here)."""

    index: int
    layout: str
    kubelet: Kubelet
    url: str  # the agent's or dcgm-exporter's
    agent: Child | None  # the node agent (node layout)
    _close: Callable[[], None]

    @property
    def target(self) -> Target:
        """Its scrape target: the agent's DaemonSet pod, or dcgm-exporter's."""
        if self.layout == "dcgm":
            labels = {"namespace": DCGM_NAMESPACE, "pod": f"nvidia-dcgm-exporter-{self.index}"}
        else:
            labels = {"namespace": AGENT_NAMESPACE, "pod": f"ibe-node-{self.index}"}
        return Target(self.url.removeprefix("http://"), labels)

    def close(self) -> None:
        """Stop what reads the GPUs, then the kubelet."""
        self._close()


def start_dcgm_node(index: int, pods: list[Pod], *, trace: Path | None) -> Node:
    """Node ``index`` of the dcgm layout: a kubelet holding ``pods`` (not served: only the
    stand-in dcgm-exporter asks it) that gives each pod's first container every GPU, and the
    stand-in dcgm-exporter reading them (``trace`` replayed, or NVML)."""
    api: NvmlApi
    if trace is not None:
        api = ReplayApi(load_trace(trace))
    else:
        from exporter.backends.nvml_library import PynvmlApi  # noqa: PLC0415

        api = PynvmlApi()
    kubelet = Kubelet(pods)
    try:
        exporter = DcgmExporter(api, kubelet, hostname=f"{NODE_NAME}-{index}")
    except NvmlError as err:
        raise StackError(f"the stand-in dcgm-exporter reads no GPU: {err}") from None
    for pod in pods:
        kubelet.give(pod.namespace, pod.name, pod.containers[0].name, GPU_RESOURCE, exporter.uuids)
    return Node(index, "dcgm", kubelet, exporter.url, None, exporter.close)


def socket_path(workdir: Path, index: int) -> Path:
    """The kubelet's socket in ``workdir``, or under /tmp where that path is too long for a
    unix socket (108 bytes)."""
    path = workdir / f"kubelet-{index}.sock"
    if len(str(path)) < 100:
        return path
    import tempfile  # noqa: PLC0415

    return Path(tempfile.mkdtemp(prefix="ibe-kubelet-")) / f"{index}.sock"


def start_node(
    workdir: Path,
    index: int,
    pods: list[Pod],
    *,
    trace: Path | None,
    port: int = 0,
    timeout: float = 30.0,
) -> Node:
    """Start node ``index``: its stand-in kubelet holding ``pods``, and its node agent
    (``trace`` replayed, or NVML); then give each pod's first container every GPU the agent
    reads, as the device plugin would give a pod that asks for them all, and wait until the
    agent has matched them. Raises :class:`StackError` when the agent does not start, reads
    no GPU or does not match them within ``timeout``."""
    kubelet = Kubelet(pods)
    socket = socket_path(workdir, index)
    serving = serve_kubelet(kubelet, socket)
    serving.__enter__()

    def close_kubelet() -> None:
        serving.__exit__(None, None, None)

    try:
        agent, url = start_exporter(
            f"node-agent-{index}",
            [*agent_flags(socket, listen=f"127.0.0.1:{port}", trace=trace), "--log.format", "json"],
            workdir,
            timeout=timeout,
        )
    except BaseException:
        close_kubelet()
        raise

    def close() -> None:
        agent.stop()
        close_kubelet()

    node = Node(index, "node", kubelet, url, agent, close)
    try:
        uuids: list[str] = []

        def read_gpus() -> bool:
            uuids[:] = gpu_uuids(url)
            return bool(uuids)

        wait_until(read_gpus, timeout, "GPUs in the node agent's /metrics", child=agent)
        for pod in pods:
            kubelet.give(pod.namespace, pod.name, pod.containers[0].name, GPU_RESOURCE, uuids)
        wait_until(
            lambda: attributed(url) >= len(uuids),
            timeout,
            "the kubelet's pods on its GPUs (inference_podresources_devices)",
            child=agent,
        )
    except BaseException:
        node.close()
        raise
    return node


def _samples(url: str, name: str) -> list[tuple[dict[str, str], float]]:
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    status, body = http_get(url + "/metrics", 5)
    if status != 200:
        raise StackError(f"{url}/metrics: HTTP {status}")
    return [
        (dict(s.labels), float(s.value))
        for family in text_string_to_metric_families(body.decode())
        for s in family.samples
        if s.name == name
    ]


def gpu_uuids(url: str) -> list[str]:
    """The UUIDs of the whole GPUs an exporter reads (its ``inference_gpu_info``; MIG devices
    left out)."""
    found = _samples(url, "inference_gpu_info")
    return sorted({labels["uuid"] for labels, _ in found if labels["uuid"].startswith("GPU-")})


def attributed(url: str) -> float:
    """How many devices a node agent has matched to the kubelet's pods."""
    found = _samples(url, "inference_podresources_devices")
    return sum(v for labels, v in found if labels.get("state") == "attributed")
