"""The node agent against eight NVML sidecars on one 8-GPU node of eight 1-GPU pods.

Measures, in this process (no exporter process, no HTTP: the collectors themselves):

* the ``podresources`` refresh (``List`` and ``GetAllocatableResources`` over the kubelet's
  protocol on a unix socket, matched to NVML's devices): milliseconds per refresh, wall and
  CPU, on the realistic node of ``tests/support/kubelet.py`` and on a 110-pod node (the
  kubelet's default pod limit);
* NVML calls per second and CPU: one node agent reading the 8 GPUs, against eight sidecars
  that each read every GPU they see (``all-visible``, the old chart default), over the same
  wall time, through the stand-in NVML (nvidia-ml-py's own bindings over a fake C library);
* series: what the agent exports (GPU series once, plus the attribution) against what eight
  sidecars export (every GPU's series eight times).

    python bench/attribution.py [--seconds 20]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))

from support.kubelet import (
    NodeNvml,
    device_plugin_node,
    device_plugin_offer,
    gpu_uuid,
    node_gpus,
)
from support.nvml import FaultyApi

from exporter.backends.podresources_client import PodResourcesClient
from exporter.collectors.nvml import NvmlCollector
from exporter.collectors.podresources import PodResourcesCollector
from exporter.collectors.shared_state import GpuDevices
from exporter.lab.layouts import Container, Kubelet, Pod, serve_kubelet

GPUS = 8


def eight_gpu_nvml() -> NodeNvml:
    return NodeNvml(node_gpus()[:GPUS])


def big_node() -> list[Pod]:
    """110 pods: eight hold a GPU, the rest CPU-only pods with CPU and memory assignments."""
    pods = [
        Pod("serving", f"vllm-{n}", [Container("vllm", {"nvidia.com/gpu": [gpu_uuid(n)]})])
        for n in range(GPUS)
    ]
    pods += [
        Pod("apps", f"web-{n}", [Container("web"), Container("proxy")]) for n in range(110 - GPUS)
    ]
    return pods


def refresh_cost(
    pods: list[Pod], offer: dict[str, list[str]], devices: GpuDevices, rounds: int
) -> tuple[float, float]:
    """Mean wall and CPU milliseconds of one refresh."""
    with tempfile.TemporaryDirectory(prefix="kl-", dir="/tmp") as tmp:
        kubelet = Kubelet(pods, offer)
        with serve_kubelet(kubelet, Path(tmp) / "kubelet.sock") as socket:
            collector = PodResourcesCollector(PodResourcesClient(socket), devices)
            collector.refresh()  # the channel's connection
            wall, cpu = time.perf_counter(), time.process_time()
            for _ in range(rounds):
                collector.refresh()
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            assert collector.collect().success
            collector.stop(5)
    return 1000 * wall / rounds, 1000 * cpu / rounds


def run_nvml(
    count: int,
    seconds: float,
    published: GpuDevices | None = None,
    nvml: Callable[[], NodeNvml] = eight_gpu_nvml,
) -> tuple[int, float, int]:
    """NVML calls, CPU seconds and series of ``count`` collectors each reading every GPU."""
    apis = [FaultyApi(nvml()) for _ in range(count)]
    collectors = [
        NvmlCollector(lambda api=api: api, poll_interval=3.0, published=published) for api in apis
    ]
    cpu = time.process_time()
    for c in collectors:
        c.start()
    for c in collectors:
        assert c.wait_ready(30)
    time.sleep(seconds)
    series = sum(len(f.samples) for c in collectors for f in c.collect().metrics)
    cpu = time.process_time() - cpu
    for c in collectors:
        c.stop(5)
    calls = sum(sum(Counter(api.calls).values()) for api in apis)
    return calls, cpu, series


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=20.0)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    devices = GpuDevices()
    calls, cpu, gpu_series = run_nvml(1, args.seconds, devices)
    realistic = GpuDevices()  # 13 GPUs, one in MIG mode with a MIG device
    run_nvml(1, 0.1, realistic, NodeNvml)
    eight = {"nvidia.com/gpu": [gpu_uuid(n) for n in range(GPUS)]}
    for name, pods, offer, node_devices in (
        ("realistic node", device_plugin_node(), device_plugin_offer(), realistic),
        ("110-pod node", big_node(), eight, devices),
    ):
        wall, cpu_ms = refresh_cost(pods, offer, node_devices, args.rounds)
        print(f"podresources refresh, {name}: {wall:.2f} ms wall, {cpu_ms:.2f} ms CPU")
    with tempfile.TemporaryDirectory(prefix="kl-", dir="/tmp") as tmp:
        kubelet = Kubelet(big_node()[:GPUS], {"nvidia.com/gpu": [gpu_uuid(n) for n in range(GPUS)]})
        with serve_kubelet(kubelet, Path(tmp) / "kubelet.sock") as socket:
            agent = PodResourcesCollector(PodResourcesClient(socket), devices)
            agent.refresh()
            attribution_series = sum(len(f.samples) for f in agent.collect().metrics)
            agent.stop(5)
    sidecar_calls, sidecar_cpu, sidecar_series = run_nvml(GPUS, args.seconds)
    print(f"over {args.seconds:g} s, 8 GPUs polled every 3 s:")
    print(
        f"  node agent : {calls / args.seconds:6.1f} NVML calls/s, "
        f"{100 * cpu / args.seconds:5.2f} % of a core, {gpu_series + attribution_series} series "
        f"({gpu_series} GPU + {attribution_series} attribution)"
    )
    print(
        f"  8 sidecars : {sidecar_calls / args.seconds:6.1f} NVML calls/s, "
        f"{100 * sidecar_cpu / args.seconds:5.2f} % of a core, {sidecar_series} series"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
