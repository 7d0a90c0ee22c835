"""The families of one ``nvml`` scrape, filled GPU by GPU: each GPU's identity, health,
hardware peaks and Xids, then, while it is healthy, its utilisation histogram and every row of
the field table (:data:`exporter.collectors.nvml_fields.FIELDS`)."""

from __future__ import annotations

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.metrics_core import Metric

from exporter import metrics as m
from exporter.backends.pod_cgroups import PodContainer
from exporter.collectors.nvml_fields import FIELDS
from exporter.collectors.nvml_state import GpuState


def _by_owner(item: tuple[PodContainer, float]) -> tuple[str, str]:
    return item[0].pod_uid, item[0].container_id


def _family(name: str) -> GaugeMetricFamily | CounterMetricFamily:
    """A fresh family of the catalogue's type for ``name``."""
    if m.BY_NAME[name].type == "counter":
        return m.counter(name)
    return m.gauge(name)


class GpuFamilies:
    """The families of one scrape; :meth:`add_gpu` each GPU, then :meth:`families`."""

    def __init__(self) -> None:
        self.calls = m.counter("inference_nvml_calls_total")
        self.info = m.gauge("inference_gpu_info")
        self.mig_mode = m.gauge("inference_gpu_mig_mode_info")
        self.up = m.gauge("inference_gpu_up")
        self.xid = m.counter("inference_gpu_xid_errors_total")
        self.histogram = m.histogram("inference_gpu_utilization_samples")
        self.busy = m.counter("inference_gpu_busy_seconds_total")
        self.peak_bandwidth = m.gauge("inference_gpu_peak_memory_bandwidth_bytes_per_second")
        self.peak_flops = m.gauge("inference_gpu_peak_flops")
        self.mig_info = m.gauge("inference_gpu_mig_info")
        self.mig_instance = m.gauge("inference_gpu_mig_instance_info")
        self.pod_util = m.gauge("inference_gpu_pod_utilization_ratio")
        self.pod_memory = m.gauge("inference_gpu_pod_memory_used_bytes")
        self.pod_busy = m.counter("inference_gpu_pod_busy_seconds_total")
        self.unattributed = m.gauge("inference_gpu_pod_unattributed_processes")
        self.fields: dict[str, GaugeMetricFamily | CounterMetricFamily] = {}
        for row in FIELDS:
            self.fields.setdefault(row.metric, _family(row.metric))

    def families(self) -> list[Metric]:
        """Every family with at least one series, in exposition order."""
        families: list[Metric] = [self.calls, self.info, self.mig_mode, self.up, self.xid]
        families += [self.histogram, self.busy, self.peak_bandwidth, self.peak_flops]
        families += [self.mig_info, self.mig_instance, *self.fields.values()]
        families += [self.pod_util, self.pod_busy, self.pod_memory, self.unattributed]
        return [family for family in families if family.samples]

    def add_gpu(self, state: GpuState, healthy: bool) -> None:
        """One GPU's series; its readings only while ``healthy``. Call with ``state.lock``."""
        identity = state.identity
        labels = [identity.label, identity.uuid]
        self.calls.add_metric([identity.label], float(state.calls))
        self.info.add_metric([*labels, identity.name, identity.pci_bus_id], 1.0)
        self.mig_mode.add_metric([*labels, identity.mig_mode], 1.0)
        piece = identity.mig
        if piece is not None:
            self.mig_info.add_metric([*labels, piece.parent_uuid, piece.profile], 1.0)
            instance = [str(piece.gpu_instance_id), str(piece.compute_instance_id)]
            self.mig_instance.add_metric([*labels, *instance], 1.0)
        self.up.add_metric(labels, 1.0 if healthy else 0.0)
        # Facts of the hardware, not readings: present whether or not the GPU answers now.
        if state.peaks is not None:
            if state.peaks.memory_bandwidth is not None:
                self.peak_bandwidth.add_metric(labels, state.peaks.memory_bandwidth)
            for precision, value in sorted(state.peaks.flops.items()):
                self.peak_flops.add_metric([*labels, precision], value)
        for xid, count in sorted(state.xids.items()):
            self.xid.add_metric([*labels, str(xid)], float(count))
        latest = state.latest
        if not healthy or latest is None:
            return
        self._add_histogram(state, labels)
        for row in FIELDS:
            family = self.fields[row.metric]
            for extra, value in row.samples(state, latest):
                family.add_metric([*labels, *extra], value)
        self._add_pods(state, labels)

    def _add_pods(self, state: GpuState, labels: list[str]) -> None:
        """Each container's share and memory of the GPU, and the processes of no pod."""
        for owner, value in sorted((state.pod_util or {}).items(), key=_by_owner):
            self.pod_util.add_metric([*labels, owner.pod_uid, owner.container_id], value)
        for owner, value in sorted(state.pod_busy_seconds.items(), key=_by_owner):
            self.pod_busy.add_metric([*labels, owner.pod_uid, owner.container_id], value)
        for owner, value in sorted((state.pod_memory or {}).items(), key=_by_owner):
            self.pod_memory.add_metric([*labels, owner.pod_uid, owner.container_id], value)
        for reason, count in (state.unattributed or {}).items():
            self.unattributed.add_metric([*labels, reason], float(count))

    def _add_histogram(self, state: GpuState, labels: list[str]) -> None:
        """Every driver sample in the histogram, and their integral in busy seconds."""
        counts = state.samples
        if not counts.n:
            return
        rendered = state.hist_rendered
        # The samples change once per poll and scrapes come far more often: render them once.
        if rendered is None or rendered[0] is not counts or rendered[1] != counts.n:
            one = m.histogram("inference_gpu_utilization_samples")
            one.add_metric(labels, counts.buckets(), counts.total)
            rendered = state.hist_rendered = (counts, counts.n, one.samples)
        self.histogram.samples.extend(rendered[2])
        self.busy.add_metric(labels, state.busy_seconds)
