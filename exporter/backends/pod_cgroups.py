"""Which pod and container a host process belongs to, from its cgroup (``/proc/<pid>/cgroup``).

The node agent (hostPID, or the host's ``/proc`` mounted at ``--gpu.host-procfs``) maps the
host PIDs NVML reports to pods this way. The kubelet puts every container's processes in a
cgroup under its pod's, and the pod's cgroup is named after the pod UID:

* systemd cgroup driver (cgroup v1 or v2): ``…/kubepods.slice/kubepods-burstable.slice/
  kubepods-burstable-pod<uid>.slice/cri-containerd-<id>.scope`` — the UID's dashes written as
  underscores (systemd reserves ``-`` for nesting); guaranteed pods have no QoS slice
  (``kubepods-pod<uid>.slice``), CRI-O names the container ``crio-<id>.scope``, Docker
  ``docker-<id>.scope``; kind and other nested kubelets add prefixes
  (``kubelet-kubepods-…``).
* cgroupfs driver: ``…/kubepods/burstable/pod<uid>/<id>`` (``besteffort``, or none for
  guaranteed).

A reader in its own cgroup namespace sees other processes' paths relative to its own root
(``/../../kubepods-…``), so the pod is found by path segment, wherever it is. cgroup v1 lists
one line per hierarchy (``<n>:<controllers>:<path>``), v2 one (``0::<path>``); the first line
that names a pod decides.

A process in no pod's cgroup (a host daemon, the MPS server, a system service) is ``host``: it is
counted, never attributed. A process that ended between NVML's list and this read is ``gone``,
one whose file cannot be read ``unreadable``. ``cgroup`` is world-readable (mode 0444, no ptrace
check), so an agent without capabilities reads it.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

# Kubernetes pod UIDs are RFC 4122 UUIDs; a static pod's is the manifest's 32-digit hash.
_UID = (
    r"[0-9a-fA-F]{8}[-_]?[0-9a-fA-F]{4}[-_]?[0-9a-fA-F]{4}[-_]?[0-9a-fA-F]{4}[-_]?[0-9a-fA-F]{12}"
)
_SYSTEMD_POD = re.compile(rf"^(?:[\w-]*-)?pod({_UID})\.slice$")
_CGROUPFS_POD = re.compile(rf"^pod({_UID})$")
_SYSTEMD_CONTAINER = re.compile(
    r"^(?:cri-containerd|crio|docker|containerd)-([0-9a-fA-F]{12,})\.scope$"
)
_CGROUPFS_CONTAINER = re.compile(r"^(?:[a-z-]+-)?([0-9a-fA-F]{12,})$")

# What a lookup can find (``inference_gpu_pod_unattributed_processes{reason}`` counts the last
# three).
POD = "pod"
HOST = "host"
GONE = "gone"
UNREADABLE = "unreadable"
UNATTRIBUTED = (HOST, GONE, UNREADABLE)


@dataclass(frozen=True)
class PodContainer:
    """A pod UID as the Kubernetes API writes it (dashes, lower case) and the container's ID
    (empty when the process sits in the pod's cgroup itself)."""

    pod_uid: str
    container_id: str


def pod_of_path(path: str) -> PodContainer | None:
    """The pod and container named by one cgroup path; None outside every pod."""
    if "pod" not in path:
        return None
    segments = [s for s in path.split("/") if s and s != ".."]
    for i, segment in enumerate(segments):
        if "pod" not in segment:
            continue
        match = _SYSTEMD_POD.match(segment) or _CGROUPFS_POD.match(segment)
        if match is None:
            continue
        uid = match.group(1).replace("_", "-").lower()
        container = ""
        if i + 1 < len(segments):
            nxt = segments[i + 1]
            found = _SYSTEMD_CONTAINER.match(nxt) or _CGROUPFS_CONTAINER.match(nxt)
            if found is not None:
                container = found.group(1).lower()
        return PodContainer(uid, container)
    return None


def pod_of_cgroup(text: str) -> PodContainer | None:
    """The pod and container of a ``/proc/<pid>/cgroup`` file's contents; None outside pods."""
    for line in text.splitlines():
        _, _, path = line.partition(":")
        _, _, path = path.partition(":")
        found = pod_of_path(path)
        if found is not None:
            return found
    return None


@dataclass(frozen=True)
class Lookup:
    """One process's owner: ``result`` one of pod, host, gone, unreadable; ``owner`` set for pod."""

    result: str
    owner: PodContainer | None = None


class PodProcesses:
    """Maps host PIDs to pods through ``<root>/<pid>/cgroup``, ``root`` the host's ``/proc``.

    No cache: a PID is looked up on each poll it appears in (one small file read), so a
    reused PID is never credited to the pod of the process it once was.
    """

    def __init__(self, root: Path) -> None:
        self.root = root

    def lookup(self, pid: int) -> Lookup:
        """The owner of host process ``pid``."""
        try:
            with open(f"{self.root}/{pid}/cgroup", encoding="utf-8", errors="replace") as file:
                text = file.read()
        except (FileNotFoundError, ProcessLookupError):
            return Lookup(GONE)
        except OSError:
            return Lookup(UNREADABLE)
        if not text.strip():
            return Lookup(GONE)  # a zombie's cgroup file is empty
        owner = pod_of_cgroup(text)
        return Lookup(POD, owner) if owner is not None else Lookup(HOST)

    def owners(self, pids: Iterable[int]) -> dict[int, Lookup]:
        """The owner of each of ``pids``."""
        return {pid: self.lookup(pid) for pid in set(pids)}
