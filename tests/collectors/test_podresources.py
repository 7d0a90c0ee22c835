"""The node agent's GPU-to-pod attribution: a fake kubelet speaking PodResources v1 and the
stand-in NVML with the same UUIDs, one device-plugin node (exporter/lab/layouts.py)."""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from prometheus_client.samples import Sample
from support.clock import FakeClock
from support.kubelet import (
    FREE_GPU,
    GPUS,
    MIG_GPU,
    MIG_UUID,
    SHARED_GPU,
    NodeNvml,
    device_plugin_node,
    device_plugin_offer,
    gpu_uuid,
)

from exporter.backends.gpu_reader import GpuIdentity, MigSlice
from exporter.backends.podresources_client import PodResourcesClient
from exporter.collectors import build_shared, default_settings
from exporter.collectors.nvml import NvmlCollector
from exporter.collectors.podresources import (
    STALE_INTERVALS,
    PodResourcesCollector,
    check,
    device_of,
)
from exporter.collectors.podresources import build as podresources_build
from exporter.collectors.shared_state import GpuDevices
from exporter.config import ConfigError
from exporter.lab.layouts import Container, Kubelet, Pod, serve_kubelet
from exporter.metrics import CATALOGUE, HOLDER_LABELS

BY_FAMILY_NAME = {spec.family_name: spec for spec in CATALOGUE}

INTERVAL = 10.0


@pytest.fixture
def socket_dir() -> Iterator[Path]:
    path = Path(tempfile.mkdtemp(prefix="kl-", dir="/tmp"))  # a unix socket path fits in 108 B
    yield path
    for child in path.iterdir():
        child.unlink()
    path.rmdir()


@pytest.fixture
def devices() -> Iterator[GpuDevices]:
    """NVML's devices as the nvml collector enumerates them on the stand-in node."""
    published = GpuDevices()
    nvml = NvmlCollector(NodeNvml, poll_interval=60, published=published)
    nvml.start()
    try:
        assert nvml.wait_ready(10)
        yield published
    finally:
        nvml.stop(5)


@pytest.fixture
def kubelet(socket_dir: Path) -> Iterator[tuple[Kubelet, Path]]:
    fake = Kubelet(device_plugin_node(), device_plugin_offer())
    with serve_kubelet(fake, socket_dir / "kubelet.sock") as socket:
        yield fake, socket


@pytest.fixture
def clock() -> FakeClock:
    return FakeClock()


@pytest.fixture
def collector(
    kubelet: tuple[Kubelet, Path], devices: GpuDevices, clock: FakeClock
) -> Iterator[PodResourcesCollector]:
    client = PodResourcesClient(kubelet[1], deadline=0.3)
    made = PodResourcesCollector(client, devices, interval=INTERVAL, clock=clock)
    yield made
    made.stop(5)


def samples(collector: PodResourcesCollector, name: str) -> list[Sample]:
    return [s for f in collector.collect().metrics for s in f.samples if s.name == name]


def holders(collector: PodResourcesCollector) -> dict[tuple[str, str], set[str]]:
    """(gpu, uuid) -> {namespace/pod/container}."""
    out: dict[tuple[str, str], set[str]] = {}
    for s in samples(collector, "inference_gpu_pod_info"):
        key = (s.labels["gpu"], s.labels["uuid"])
        out.setdefault(key, set()).add(
            f"{s.labels['namespace']}/{s.labels['pod']}/{s.labels['container']}"
        )
        assert s.value == 1.0
    return out


def states(collector: PodResourcesCollector) -> dict[str, float]:
    return {
        s.labels["state"]: s.value for s in samples(collector, "inference_podresources_devices")
    }


def test_every_device_is_attributed_to_its_container(collector: PodResourcesCollector) -> None:
    collector.refresh()
    expected = {(str(n), gpu_uuid(n)): {f"serving/vllm-{n}/vllm"} for n in range(8)}
    expected[("8", gpu_uuid(8))] = {"serving/vllm-tp2/vllm"}
    expected[("9", gpu_uuid(9))] = {"serving/vllm-tp2/vllm"}
    expected[(f"{MIG_GPU}:0", MIG_UUID)] = {"batch/embed-mig/tei"}
    expected[(str(SHARED_GPU), gpu_uuid(SHARED_GPU))] = {
        "dev/notebook-a/jupyter",
        "dev/notebook-b/jupyter",
    }
    assert holders(collector) == expected
    pods = {s.labels["gpu"]: s.value for s in samples(collector, "inference_gpu_pods")}
    assert pods == {gpu: (2.0 if gpu == str(SHARED_GPU) else 1.0) for gpu, _ in expected}
    # GPU 10 itself is in MIG mode (the device plugin offers its MIG devices, not it); GPU 12
    # is offered and held by no pod.
    assert states(collector) == {
        "attributed": 12.0,
        "unallocated": 1.0,
        "unknown_to_kubelet": 1.0,
        "unknown_to_nvml": 0.0,
    }
    assert (str(FREE_GPU), gpu_uuid(FREE_GPU)) not in holders(collector)
    assert collector.collect().success


def test_a_pod_that_ends_leaves_at_the_next_refresh(
    collector: PodResourcesCollector, kubelet: tuple[Kubelet, Path]
) -> None:
    collector.refresh()
    assert ("3", gpu_uuid(3)) in holders(collector)
    kubelet[0].end_pod("serving", "vllm-3")
    kubelet[0].end_pod("dev", "notebook-b")
    collector.refresh()
    got = holders(collector)
    assert ("3", gpu_uuid(3)) not in got
    assert got[(str(SHARED_GPU), gpu_uuid(SHARED_GPU))] == {"dev/notebook-a/jupyter"}
    assert states(collector)["unallocated"] == 2.0


def test_devices_unknown_either_way_are_counted_never_attributed(
    collector: PodResourcesCollector, kubelet: tuple[Kubelet, Path]
) -> None:
    fake = kubelet[0]
    stranger = "GPU-00000000-dead-beef-0000-000000000000"
    fake.pods.append(Pod("serving", "ghost", [Container("vllm", {"nvidia.com/gpu": [stranger]})]))
    fake.offer["nvidia.com/gpu"] = [gpu_uuid(n) for n in range(4)]  # the plugin knows only 4
    collector.refresh()
    got = holders(collector)
    assert all("serving/ghost/vllm" not in h for h in got.values())
    counts = states(collector)
    assert counts["unknown_to_nvml"] == 1.0
    # Of the 13 GPUs and one MIG device: 12 held; GPUs 10 and 12 offered by none.
    assert counts["unknown_to_kubelet"] == 2.0
    assert counts["attributed"] == 12.0
    assert collector.collect().success


def test_kubelet_errors_fail_the_collector_and_age_out_the_attribution(
    collector: PodResourcesCollector, kubelet: tuple[Kubelet, Path], clock: FakeClock
) -> None:
    collector.refresh()
    kubelet[0].fail = grpc.StatusCode.UNAVAILABLE
    collector.refresh()
    out = collector.collect()
    assert not out.success
    assert out.error.startswith("kubelet PodResources unavailable: List: kubelet unavailable")
    assert len(holders(collector)) == 12  # kept: one lost answer
    clock.advance(STALE_INTERVALS * INTERVAL + 1)
    assert holders(collector) == {}  # too old: a pod may have ended since
    kubelet[0].fail = None
    collector.refresh()
    assert collector.collect().success
    assert len(holders(collector)) == 12


def test_missing_socket_and_nvml_not_up(devices: GpuDevices, socket_dir: Path) -> None:
    client = PodResourcesClient(socket_dir / "absent.sock", deadline=0.3)
    made = PodResourcesCollector(client, devices, interval=INTERVAL)
    made.refresh()
    out = made.collect()
    assert (out.success, out.metrics) == (False, [])
    assert "missing" in out.error and "absent.sock does not exist" in out.error
    nothing = PodResourcesCollector(client, GpuDevices(), interval=INTERVAL)
    nothing.refresh()
    assert "NVML has not enumerated" in nothing.collect().error


def test_a_hanging_kubelet_never_holds_up_a_scrape(
    kubelet: tuple[Kubelet, Path], devices: GpuDevices
) -> None:
    kubelet[0].hang = 1.0
    client = PodResourcesClient(kubelet[1], deadline=0.3)
    made = PodResourcesCollector(client, devices, interval=2.0)
    made.start()
    try:
        time.sleep(0.1)  # the first refresh is in flight, waiting on the kubelet
        started = time.monotonic()
        out = made.collect()
        assert time.monotonic() - started < 0.05
        assert not out.success
        assert made.wait_ready(5)
        assert "deadline" in made.collect().error
    finally:
        made.stop(5)


def test_kubelet_without_allocatable_still_attributes(
    collector: PodResourcesCollector, kubelet: tuple[Kubelet, Path]
) -> None:
    kubelet[0].without_allocatable = True
    collector.refresh()
    assert len(holders(collector)) == 12
    # Without the offer, NVML devices no pod holds are unallocated, none unknown_to_kubelet.
    assert states(collector)["unknown_to_kubelet"] == 0.0
    assert states(collector)["unallocated"] == GPUS + 1 - 12


def _gpu(index: int) -> GpuIdentity:
    return GpuIdentity(index, gpu_uuid(index), "H100", "", "disabled", False)


def _mig() -> GpuIdentity:
    piece = MigSlice(MIG_GPU, gpu_uuid(MIG_GPU), "H100", 2, 9, 0, "1g.10gb")
    return GpuIdentity(MIG_GPU, MIG_UUID, "H100 MIG 1g.10gb", "", "slice", False, mig=piece)


@pytest.mark.parametrize(
    ("device_id", "label"),
    [
        (gpu_uuid(1), "1"),
        (f"{gpu_uuid(1)}::7", "1"),  # a time-slicing replica
        ("1", "1"),  # deviceIDStrategy: index
        (MIG_UUID, f"{MIG_GPU}:2"),
        (f"MIG-{gpu_uuid(MIG_GPU)}/9/0", f"{MIG_GPU}:2"),  # MIG UUIDs before R470
        (f"{MIG_GPU}:2", f"{MIG_GPU}:2"),  # index strategy, MIG
        (f"MIG-{gpu_uuid(MIG_GPU)}/9/1", None),  # another compute instance
        (gpu_uuid(5), None),
        ("7", None),
    ],
)
def test_device_plugin_ids(device_id: str, label: str | None) -> None:
    found = device_of(device_id, [_gpu(0), _gpu(1), _mig()])
    assert (found.label if found is not None else None) == label


def test_deadline_must_fit_the_interval() -> None:
    with pytest.raises(ConfigError, match=r"podresources\.deadline"):
        check(default_settings(podresources_interval=2.0, podresources_deadline=2.0))


def test_the_sidecar_runs_without_grpc() -> None:
    """grpc comes with the node extra: a sidecar's collectors, even with podresources built,
    import it only when the kubelet is first asked."""
    code = (
        "import sys\n"
        "from exporter.collectors import build_collectors, default_settings\n"
        "built = build_collectors(default_settings(collector_podresources=True))\n"
        "assert 'podresources' in [c.name for c in built]\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('grpc', 'google')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert done.stdout.strip() == "[]", done.stdout + done.stderr


def test_the_agent_files_each_device_series_under_its_holders(
    kubelet: tuple[Kubelet, Path],
) -> None:
    """The nvml and podresources collectors as the node agent builds them (one Shared): every
    series of one device carries the pod holding it, a copy per pod on the time-sliced GPU, and
    none on a device no pod holds; the per-pod shares and the collector's own series do not."""
    settings = default_settings(
        collector_podresources=True,
        podresources_socket=kubelet[1],
        podresources_interval=INTERVAL,
    )
    shared = build_shared(settings)
    attribution = podresources_build(settings, shared)
    nvml = NvmlCollector(
        NodeNvml,
        poll_interval=60,
        published=shared.gpu_devices,
        holders=shared.gpu_holders,
    )
    nvml.start()
    try:
        assert nvml.wait_ready(10)
        nvml.poll_now()
        attribution.refresh()
        held = holders(attribution)
        families = nvml.collect().metrics
    finally:
        nvml.stop(5)
        attribution.stop(5)
    filed: dict[tuple[str, str], set[str]] = {}
    relabelled = 0
    for family in families:
        spec = BY_FAMILY_NAME[family.name]
        for s in family.samples:
            own = set(spec.labels) | ({"le"} if s.name.endswith("_bucket") else set())
            if not spec.holder_labelled:
                assert set(s.labels) == own, (s.name, s.labels)
                continue
            relabelled += 1
            assert set(s.labels) == own | set(HOLDER_LABELS), (s.name, s.labels)
            holder = f"{s.labels['namespace']}/{s.labels['pod']}/{s.labels['container']}"
            filed.setdefault(s.labels["gpu"], set()).add(holder)
    assert relabelled
    nobody = {gpu: found for gpu, found in filed.items() if found == {"//"}}
    # every held device under its holders (the shared GPU under both), the others under none
    by_index = {gpu: found for (gpu, _), found in held.items()}
    assert {gpu: found for gpu, found in filed.items() if gpu not in nobody} == by_index
    assert str(FREE_GPU) in nobody
    assert str(MIG_GPU) in nobody  # the GPU itself: its MIG devices are held
    assert len(by_index[str(SHARED_GPU)]) == 2
