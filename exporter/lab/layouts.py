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

Each layout loads its own profile at ``fast``'s speed (:func:`rule_profile`: ``fast-node``,
``fast``). grpc and protobuf (the ``node`` extra) are imported only when a stand-in kubelet
serves. No torch is imported here.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent import futures
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any

from exporter.backends.podresources_client import SERVICE
from exporter.lab.processes import (
    Child,
    LocalServer,
    StackError,
    http_get,
    reply,
    start_exporter,
    wait_until,
)
from exporter.signatures.site import fast_profile

if TYPE_CHECKING:
    import grpc

    from exporter.backends.kubelet import podresources_v1_pb2 as pb

# Layout -> what it is, as the demo's screen says it; the first is the chart's default.
LAYOUTS: dict[str, str] = {
    "node": "the node agent reads the GPUs and the kubelet names their pod (the chart's default)",
    "sidecar": "the sidecar reads its GPUs itself (the chart's mode: sidecar)",
}
DEFAULT_LAYOUT = "node"
# The jobs Prometheus scrapes, as the chart's PodMonitors name them.
SIDECAR_JOB = "inference-bottleneck-exporter"
AGENT_JOB = "inference-bottleneck-exporter-node"
KSM_JOB = "kube-state-metrics"
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


def rule_profile(layout: str) -> str:
    """The rule profile a layout loads: its source's, at ``fast``'s speed."""
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r} (known: {', '.join(LAYOUTS)})")
    return fast_profile("node" if layout == "node" else "sidecar")


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
) -> list[dict[str, Any]]:
    """The scrape jobs of a layout: the sidecars (their pod's labels on every series), the
    node agents and kube-state-metrics with ``honor_labels`` (the pod each of their series
    names stays that pod's)."""

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


def sidecar_flags(layout: str, agent_url: str = "") -> list[str]:
    """What a layout adds to a sidecar's flags: in the node layout no NVML, and the landing
    page says who reads its GPUs (the chart's ``--gpu.read-by``)."""
    if layout != "node":
        return []
    return ["--no-collector.nvml", "--gpu.read-by", f"the node agent at {agent_url}"]


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


# --- one node: its kubelet and its agent ---------------------------------------------------------


@dataclass
class Node:
    """A stand-in node: its kubelet, serving in this process, and its node agent, a child."""

    index: int
    kubelet: Kubelet
    agent: Child
    url: str  # the agent's
    _close_kubelet: Callable[[], None]

    @property
    def target(self) -> Target:
        """The agent's scrape target: its own DaemonSet pod."""
        labels = {"namespace": AGENT_NAMESPACE, "pod": f"ibe-node-{self.index}"}
        return Target(self.url.removeprefix("http://"), labels)

    def close(self) -> None:
        """Stop the agent, then the kubelet."""
        self.agent.stop()
        self._close_kubelet()


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
    node = Node(index, kubelet, agent, url, close_kubelet)
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
