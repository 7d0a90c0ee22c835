"""The node agent's device series, each filed under the pod holding the device.

With the ``podresources`` collector on (the node agent), every series of the ``nvml``
collector that names one device (label ``gpu``) carries ``namespace``, ``pod``
and ``container`` of the pod the kubelet gave the device to. Prometheus keeps them over the
agent's own target labels (``honorLabels``), so the agent's series of a device are that pod's,
as its sidecar's would be: the ``node`` rule profile and the dashboards read them by pod, with
no join to ``inference_gpu_pod_info`` at evaluation time (``docs/scale.md``).

* **Shared devices.** A device several pods hold (time-slicing, MPS replicas) has one copy of
  each series per pod, as each pod's sidecar would export it: a series per device and pod, as
  dcgm-exporter's ``--kubernetes-virtual-gpus`` does. ``container`` names the pod's containers
  that hold the device (comma-separated, sorted, where several do). Sum a node's devices from
  the series of one pod each, or from ``inference_gpu_pods`` (the holders per device).
* **No holder.** A device no pod holds, and every device while the kubelet's answer is unknown,
  carries the three labels empty: Prometheus then keeps none (an empty exported label hides the
  target's), so its series are the node's, filed under no pod (not the agent's own).
* **Counters per holder.** A copy's counters and histograms count from the moment its pod got
  the device, as a sidecar started in that pod would: a pod that takes over a GPU inherits
  neither its predecessor's busy seconds nor its Xids, and an Xid counter appears for the pod
  only once it counts for the pod. While the attribution is unknown, each pod keeps its
  starting point, so its counters go on where they were once the kubelet answers again.
* **The per-pod shares** (``inference_gpu_pod_*``: a process's own pod, named by its UID) and
  the series of no device (the driver, NVML's health, how the GPUs were chosen) stay the
  node's.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Sample

from exporter.collectors.shared_state import Holder, Holders
from exporter.metrics import HOLDER_LABELS, NODE_OWN_PREFIX

_NOBODY = dict.fromkeys(HOLDER_LABELS, "")
#: Labelled counters that exist only once they count: a holder's copy appears when its count
#: does (an Xid the pod has not seen is no series of the pod's).
SPARSE_COUNTERS = frozenset({"inference_gpu_xid_errors_total"})
_CUMULATIVE = frozenset({"counter", "histogram"})

_Key = tuple[str, tuple[tuple[str, str], ...]]  # a sample's name and labels


def _of_device(s: Sample) -> bool:
    return "gpu" in s.labels


def relabelled(family: Metric) -> bool:
    """Whether ``family``'s series are given their device's holders (the catalogue's
    :attr:`~exporter.metrics.MetricSpec.holder_labelled`)."""
    return not family.name.startswith(NODE_OWN_PREFIX) and any(
        _of_device(s) for s in family.samples
    )


def _pods(holders: Sequence[Holder]) -> list[dict[str, str]]:
    """One label set per pod among ``holders``, its holding containers joined."""
    containers: dict[tuple[str, str], list[str]] = {}
    for h in holders:
        containers.setdefault((h.namespace, h.pod), []).append(h.container)
    return [
        {"namespace": ns, "pod": pod, "container": ",".join(sorted(set(names)))}
        for (ns, pod), names in sorted(containers.items())
    ]


class HolderLabels:
    """Gives the nvml collector's families their devices' holders, scrape after scrape (see
    the module docstring); keeps each holder's starting point of each counter."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # (device, namespace, pod) -> the device's cumulative values when the pod got it
        self._starts: dict[tuple[str, str, str], dict[_Key, float]] = {}

    def apply(self, families: Iterable[Metric], holders: Holders | None) -> list[Metric]:
        """``families`` with every device's series labelled with its holders (``holders``:
        by device label; None: unknown, every device the node's)."""
        families = list(families)
        with self._lock:
            if holders is not None:
                self._forget_departed(holders)
            self._start_arrivals(families, holders)
            for family in families:
                if relabelled(family):
                    family.samples = self._samples(family, holders)
        return families

    def _forget_departed(self, holders: Holders) -> None:
        """Drop the starting points of pods that no longer hold their device."""
        for key in list(self._starts):
            device, namespace, pod = key
            if not any((h.namespace, h.pod) == (namespace, pod) for h in holders.get(device, ())):
                del self._starts[key]

    def _start_arrivals(self, families: Sequence[Metric], holders: Holders | None) -> None:
        """A pod seen on a device for the first time starts its counters at the device's
        values now (a cumulative series that appears later is all its own: it starts at 0)."""
        if not holders:
            return
        arrivals = {
            (device, pod["namespace"], pod["pod"])
            for device, held in holders.items()
            for pod in _pods(held)
        } - set(self._starts)
        if not arrivals:
            return
        for key in arrivals:
            self._starts[key] = {}
        for family in families:
            if family.type not in _CUMULATIVE or not relabelled(family):
                continue
            for s in family.samples:
                device = s.labels.get("gpu", "")
                for key in arrivals:
                    if key[0] == device:
                        self._starts[key][_key(s)] = s.value

    def _samples(self, family: Metric, holders: Holders | None) -> list[Sample]:
        cumulative = family.type in _CUMULATIVE
        out: list[Sample] = []
        for s in family.samples:
            if not _of_device(s):
                out.append(s)
                continue
            pods = _pods(holders.get(s.labels["gpu"], ())) if holders is not None else []
            if not pods:
                out.append(s._replace(labels={**s.labels, **_NOBODY}))
                continue
            for pod in pods:
                value = s.value
                if cumulative:
                    value = self._since_start(s, pod)
                    if value == 0 and s.name in SPARSE_COUNTERS:
                        continue
                out.append(s._replace(labels={**s.labels, **pod}, value=value))
        return out

    def _since_start(self, s: Sample, pod: dict[str, str]) -> float:
        """A cumulative value counted from the pod's start on the device; a value below the
        start (the device's counter was reset) starts the pod over at 0."""
        starts = self._starts.setdefault((s.labels["gpu"], pod["namespace"], pod["pod"]), {})
        key = _key(s)
        start = starts.get(key, 0.0)
        if s.value < start:
            starts[key] = start = 0.0
        return s.value - start


def _key(s: Sample) -> _Key:
    return s.name, tuple(sorted(s.labels.items()))
