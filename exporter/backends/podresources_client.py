"""The kubelet's PodResources v1 API: which device the kubelet gave to which container.

The kubelet serves ``v1.PodResourcesLister`` over gRPC on a unix socket
(``/var/lib/kubelet/pod-resources/kubelet.sock``): ``List`` (every pod's devices),
``GetAllocatableResources`` (every device the node's device plugins offer) and, on kubelets
that have it, ``Get`` (one pod's). Every call here carries a deadline, and every failure is
a :class:`PodResourcesError` whose ``kind`` says what went wrong in one word; the caller never
sees a gRPC exception or waits longer than the deadline.

grpc is imported only when a client is made: a sidecar that never talks to the kubelet runs
without it (it comes with the ``node`` extra).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    import grpc

    from exporter.backends.kubelet import podresources_v1_pb2 as pb

DEFAULT_SOCKET = Path("/var/lib/kubelet/pod-resources/kubelet.sock")
SERVICE = "/v1.PodResourcesLister"
# A node with hundreds of pods and their CPU and memory assignments outgrows gRPC's default
# 4 MiB receive limit; the kubelet itself sends up to 16 MiB.
MAX_MESSAGE_BYTES = 16 * 1024 * 1024

ErrorKind = Literal["missing", "permission", "unavailable", "deadline", "unimplemented", "error"]


class PodResourcesError(Exception):
    """A call that gave no answer; ``str()`` is one line, ``kind`` one word."""

    def __init__(self, kind: ErrorKind, message: str) -> None:
        self.kind: ErrorKind = kind
        super().__init__(message)


@dataclass(frozen=True)
class Assignment:
    """One device the kubelet assigned to one container."""

    namespace: str
    pod: str
    container: str
    resource: str
    device_id: str


@dataclass(frozen=True)
class Device:
    """One device a device plugin offers on the node."""

    resource: str
    device_id: str


def _assignments(pods: Iterable[pb.PodResources]) -> list[Assignment]:
    return [
        Assignment(pod.namespace, pod.name, container.name, devices.resource_name, device_id)
        for pod in pods
        for container in pod.containers
        for devices in container.devices
        for device_id in devices.device_ids
    ]


class PodResourcesClient:
    """A client of one kubelet socket; one channel, reused. Thread-safe (grpc channels are)."""

    def __init__(self, socket: Path = DEFAULT_SOCKET, *, deadline: float = 2.0) -> None:
        self.socket = socket
        self.deadline = deadline
        self._channel: grpc.Channel | None = None

    def _call(self, method: str, request: Any, response: Any) -> Any:
        """One unary call with the deadline; every failure as :class:`PodResourcesError`."""
        self._check_socket()
        import grpc  # noqa: PLC0415 - only the node agent needs grpc

        if self._channel is None:
            self._channel = grpc.insecure_channel(
                f"unix://{self.socket}",
                options=[("grpc.max_receive_message_length", MAX_MESSAGE_BYTES)],
            )
        call: Callable[..., Any] = self._channel.unary_unary(
            f"{SERVICE}/{method}",
            request_serializer=type(request).SerializeToString,
            response_deserializer=response.FromString,
        )
        try:
            return call(request, timeout=self.deadline)
        except grpc.RpcError as err:
            raise _error(method, err, self.deadline) from None

    def _check_socket(self) -> None:
        # gRPC would retry a missing or forbidden socket until the deadline and then say only
        # "unavailable": the two causes a user fixes in the manifest are named up front.
        if not self.socket.exists():
            raise PodResourcesError(
                "missing", f"{self.socket} does not exist (mount the kubelet's pod-resources dir)"
            )
        if not os.access(self.socket, os.R_OK | os.W_OK):
            raise PodResourcesError(
                "permission", f"{self.socket}: permission denied (the kubelet socket is root's)"
            )

    def list_devices(self) -> list[Assignment]:
        """Every device assigned to a container of a pod on the node (``List``)."""
        from exporter.backends.kubelet import podresources_v1_pb2 as pb  # noqa: PLC0415

        reply = self._call("List", pb.ListPodResourcesRequest(), pb.ListPodResourcesResponse)
        return _assignments(reply.pod_resources)

    def allocatable(self) -> list[Device]:
        """Every device the node's device plugins offer (``GetAllocatableResources``)."""
        from exporter.backends.kubelet import podresources_v1_pb2 as pb  # noqa: PLC0415

        reply = self._call(
            "GetAllocatableResources",
            pb.AllocatableResourcesRequest(),
            pb.AllocatableResourcesResponse,
        )
        return [
            Device(devices.resource_name, device_id)
            for devices in reply.devices
            for device_id in devices.device_ids
        ]

    def get(self, namespace: str, pod: str) -> list[Assignment]:
        """One pod's devices (``Get``; kind ``unimplemented`` where the kubelet lacks it, as
        before Kubernetes 1.27 or with the ``KubeletPodResourcesGet`` gate off)."""
        from exporter.backends.kubelet import podresources_v1_pb2 as pb  # noqa: PLC0415

        request = pb.GetPodResourcesRequest(pod_name=pod, pod_namespace=namespace)
        reply = self._call("Get", request, pb.GetPodResourcesResponse)
        if not reply.HasField("pod_resources"):
            return []
        return _assignments([reply.pod_resources])

    def pod_devices(self, namespace: str, pod: str) -> list[Assignment]:
        """One pod's devices: ``Get``, or ``List`` filtered where the kubelet has no ``Get``."""
        try:
            return self.get(namespace, pod)
        except PodResourcesError as err:
            if err.kind != "unimplemented":
                raise
        return [a for a in self.list_devices() if a.namespace == namespace and a.pod == pod]

    def close(self) -> None:
        if self._channel is not None:
            self._channel.close()
            self._channel = None


def _error(method: str, err: grpc.RpcError, deadline: float) -> PodResourcesError:
    import grpc  # noqa: PLC0415

    code = err.code() if isinstance(err, grpc.Call) else None
    details = (err.details() if isinstance(err, grpc.Call) else None) or str(err)
    details = " ".join(details.split())
    if code == grpc.StatusCode.DEADLINE_EXCEEDED:
        return PodResourcesError("deadline", f"{method}: no answer within {deadline:g} s")
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return PodResourcesError("unimplemented", f"{method}: the kubelet does not serve it")
    if code == grpc.StatusCode.UNAVAILABLE:
        if "ermission denied" in details:
            return PodResourcesError("permission", f"{method}: {details}")
        return PodResourcesError("unavailable", f"{method}: kubelet unavailable ({details})")
    name = code.name if code is not None else "error"
    return PodResourcesError("error", f"{method}: {name} ({details})")
