"""The node agent's device series filed under the pods holding each device
(``exporter/collectors/holder_labels.py``): the labels, shared devices, devices no pod holds,
counters per holder, a kubelet that stops answering. Families are built from the catalogue, as
the nvml collector builds them; the values are hand-written."""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from exporter import metrics as m
from exporter.collectors.holder_labels import HolderLabels
from exporter.collectors.shared_state import Holder, Holders

UUIDS = {"0": "GPU-aaaa", "1": "GPU-bbbb", "2": "GPU-cccc"}
VLLM = Holder("llm", "vllm-0", "vllm")
NOTEBOOK_A = Holder("dev", "notebook-a", "jupyter")
NOTEBOOK_B = Holder("dev", "notebook-b", "jupyter")
SIDECAR_OF_B = Holder("dev", "notebook-b", "exporter")


def scrape(
    busy: dict[str, float], xids: dict[str, float] | None = None, power: float = 300.0
) -> list[Metric]:
    """One scrape's families: busy seconds and power per device, Xid 79 counts, the driver
    samples histogram of device 0, a per-pod share, the NVML calls made for device 0 (no
    ``uuid``) and the driver (no device)."""
    families: list[Metric] = []
    counter = m.counter("inference_gpu_busy_seconds_total")
    gauge = m.gauge("inference_gpu_power_watts")
    for gpu, value in busy.items():
        counter.add_metric([gpu, UUIDS[gpu]], value)
        gauge.add_metric([gpu, UUIDS[gpu]], power)
    families += [counter, gauge]
    xid = m.counter("inference_gpu_xid_errors_total")
    for gpu, count in (xids or {}).items():
        xid.add_metric([gpu, UUIDS[gpu], "79"], count)
    families.append(xid)
    histogram = m.histogram("inference_gpu_utilization_samples")
    histogram.add_metric(["0", UUIDS["0"]], [("0.5", busy["0"]), ("+Inf", 2 * busy["0"])], 9.0)
    share = m.gauge("inference_gpu_pod_utilization_ratio")
    share.add_metric(["0", UUIDS["0"], "uid-1", "cid-1"], 0.4)
    calls = m.counter("inference_nvml_calls_total")
    calls.add_metric(["0"], 12.0)
    driver = m.gauge("inference_nvml_driver_info")
    driver.add_metric(["550.54.15"], 1.0)
    return [*families, histogram, share, calls, driver]


def series(families: list[Metric], name: str) -> dict[tuple[str, str, str, str], float]:
    """(gpu, namespace, pod, container) -> value of the samples called ``name``."""
    return {
        (
            s.labels.get("gpu", "?"),
            s.labels.get("namespace", "?"),
            s.labels.get("pod", "?"),
            s.labels.get("container", "?"),
        ): s.value
        for f in families
        for s in f.samples
        if s.name == name
    }


def test_each_device_is_its_holders_and_an_unheld_one_nobodys() -> None:
    holders: Holders = {"0": (VLLM,), "1": (NOTEBOOK_A, NOTEBOOK_B, SIDECAR_OF_B)}
    out = HolderLabels().apply(scrape({"0": 10.0, "1": 20.0, "2": 30.0}), holders)
    assert series(out, "inference_gpu_power_watts") == {
        ("0", "llm", "vllm-0", "vllm"): 300.0,
        # shared: one copy per pod; the pod's containers that hold it, joined
        ("1", "dev", "notebook-a", "jupyter"): 300.0,
        ("1", "dev", "notebook-b", "exporter,jupyter"): 300.0,
        # held by no pod: the labels empty, so Prometheus keeps none of them (not the agent's)
        ("2", "", "", ""): 300.0,
    }
    # every sample of a histogram is its holder's
    buckets = [s for f in out for s in f.samples if s.name.startswith("inference_gpu_util")]
    assert len(buckets) == 4
    assert all(s.labels["pod"] == "vllm-0" for s in buckets)
    # the per-pod shares name their own pod, the driver no device: the node's
    assert series(out, "inference_gpu_pod_utilization_ratio") == {("0", "?", "?", "?"): 0.4}
    assert series(out, "inference_nvml_driver_info") == {("?", "?", "?", "?"): 1.0}
    # a series naming the device by index alone is its holder's too (a counter: from the start)
    assert series(out, "inference_nvml_calls_total") == {("0", "llm", "vllm-0", "vllm"): 0.0}


def test_counters_count_from_when_the_pod_got_the_device() -> None:
    labels = HolderLabels()
    first: Holders = {"0": (VLLM,)}
    out = labels.apply(scrape({"0": 100.0}, {"0": 2.0}), first)
    # the pod's counters start at 0; the Xids it has not seen are no series of its own
    assert series(out, "inference_gpu_busy_seconds_total") == {("0", "llm", "vllm-0", "vllm"): 0.0}
    assert series(out, "inference_gpu_xid_errors_total") == {}
    assert {s.value for f in out for s in f.samples if s.name.endswith("_bucket")} == {0.0}
    out = labels.apply(scrape({"0": 130.0}, {"0": 3.0}), first)
    assert series(out, "inference_gpu_busy_seconds_total") == {("0", "llm", "vllm-0", "vllm"): 30.0}
    assert series(out, "inference_gpu_xid_errors_total") == {("0", "llm", "vllm-0", "vllm"): 1.0}
    # a gauge is the device's now, whoever holds it
    assert series(out, "inference_gpu_power_watts") == {("0", "llm", "vllm-0", "vllm"): 300.0}


def test_a_new_holder_inherits_nothing_of_its_predecessor() -> None:
    labels = HolderLabels()
    labels.apply(scrape({"0": 100.0}, {"0": 1.0}), {"0": (VLLM,)})
    labels.apply(scrape({"0": 150.0}, {"0": 4.0}), {"0": (VLLM,)})
    out = labels.apply(scrape({"0": 160.0}, {"0": 4.0}), {"0": (NOTEBOOK_A,)})
    assert series(out, "inference_gpu_busy_seconds_total") == {
        ("0", "dev", "notebook-a", "jupyter"): 0.0
    }
    assert series(out, "inference_gpu_xid_errors_total") == {}
    # the first pod comes back later: a new tenure, counted from 0 again
    out = labels.apply(scrape({"0": 170.0}, {"0": 4.0}), {"0": (VLLM,)})
    assert series(out, "inference_gpu_busy_seconds_total") == {("0", "llm", "vllm-0", "vllm"): 0.0}


def test_an_xid_kind_new_to_the_device_counts_whole_for_its_holders() -> None:
    labels = HolderLabels()
    labels.apply(scrape({"0": 100.0}), {"0": (VLLM,)})
    out = labels.apply(scrape({"0": 101.0}, {"0": 1.0}), {"0": (VLLM,)})
    assert series(out, "inference_gpu_xid_errors_total") == {("0", "llm", "vllm-0", "vllm"): 1.0}


def test_while_the_attribution_is_unknown_devices_are_the_nodes_and_pods_keep_their_start() -> None:
    labels = HolderLabels()
    labels.apply(scrape({"0": 100.0}), {"0": (VLLM,)})
    out = labels.apply(scrape({"0": 120.0}), None)
    assert series(out, "inference_gpu_busy_seconds_total") == {("0", "", "", ""): 120.0}
    out = labels.apply(scrape({"0": 140.0}), {"0": (VLLM,)})
    assert series(out, "inference_gpu_busy_seconds_total") == {("0", "llm", "vllm-0", "vllm"): 40.0}


def test_a_device_counter_that_restarts_restarts_the_pods() -> None:
    labels = HolderLabels()
    labels.apply(scrape({"0": 100.0}), {"0": (VLLM,)})
    out = labels.apply(scrape({"0": 5.0}), {"0": (VLLM,)})
    assert series(out, "inference_gpu_busy_seconds_total") == {("0", "llm", "vllm-0", "vllm"): 5.0}
    out = labels.apply(scrape({"0": 9.0}), {"0": (VLLM,)})
    assert series(out, "inference_gpu_busy_seconds_total") == {("0", "llm", "vllm-0", "vllm"): 9.0}
