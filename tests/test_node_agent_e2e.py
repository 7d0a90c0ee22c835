"""The node layout end to end: the real node agent, two real sidecars, a real Prometheus
evaluating the ``node`` rule profile.

The node agent is the real CLI (``support.node_agent``: only the NVML library is the stand-in,
with a live utilisation buffer) with the lab's node-agent flags (the chart's DaemonSet's:
:func:`exporter.lab.layouts.agent_flags`), asking the lab's stand-in kubelet (the real
PodResources v1 protocol on a unix socket) about the pods of :mod:`support.kubelet` which pod
holds each GPU. Two sidecars, without NVML, poll fake vLLM engines whose
queues grow: ``serving/vllm-0`` holds GPU 0 (10 % busy: starved), ``serving/vllm-7`` GPU 7
(80 %: busy). Prometheus scrapes them as the demo and the drills do (:func:`exporter.lab.layouts.scrape_configs`:
the sidecars with their pod's ``namespace`` and ``pod`` as target labels, as a PodMonitor gives
them, the agent with ``honor_labels``), and evaluates the node profile generated with windows of
seconds (``for`` 5 s) every second.
``InferenceGPUStarvedQueueGrowing`` must fire for vllm-0 and never for vllm-7.

The per-pod shares ride along: the agent maps the time-sliced GPU's two processes to pods
through a host ``/proc`` whose cgroups name notebook-a's and notebook-b's pod UIDs
(``--gpu.host-procfs``, as with hostPID), and a stand-in kube-state-metrics serves
``kube_pod_info`` for them (the lab's). notebook-a, whose own share is 10 % of a GPU 100 % busy while its
queue grows, is contended (``InferenceGPUContended``) and starved on its own share; the
dedicated GPUs' pods are never contended.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from support.fakeengine import FakeEngine
from support.kubelet import device_plugin_node, device_plugin_offer
from support.node_agent import SHARED_TENANTS
from support.paths import ROOT
from support.process import ExporterProcess
from support.promstack import PROC, SIDECAR_FLAGS, Feeder, Load, Stack, address, wait_until

from exporter.lab import processes
from exporter.lab.layouts import (
    Kubelet,
    MetricsServer,
    Pod,
    Target,
    agent_flags,
    kube_pod_info,
    scrape_configs,
    serve_kubelet,
)
from exporter.signatures.__main__ import profile_files
from exporter.signatures.site import parse_config

STARVED = "InferenceGPUStarvedQueueGrowing"
CONTENDED = "InferenceGPUContended"
SITE = {
    "windows": {
        "rate": "10s",
        "latency": "10s",
        "queue_trend": "10s",
        "pulsing": "20s",
        "xid": "20s",
        "baseline": "60s",
    },
    "signatures": {STARVED: {"for": "5s"}, CONTENDED: {"for": "5s"}},
}
# vllm-0 holds GPU 0 (10 %), vllm-7 GPU 7 (80 %), notebook-a a replica of the shared GPU 11.
SIDECARS = {"vllm-0": "serving", "vllm-7": "serving", "notebook-a": "dev"}
# The shared GPU's tenants: host PID -> (namespace, pod, pod UID).
TENANTS = {
    5001: ("dev", "notebook-a", "4a1b2c3d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"),
    5002: ("dev", "notebook-b", "9e8d7c6b-5a4f-4e3d-8c2b-1a0f9e8d7c6b"),
}
KTHREAD_FLAGS = 0x208040  # kthreadd's stat flags: PF_KTHREAD marks the host's /proc


def host_procfs(tmp: Path) -> Path:
    """A host /proc: kthreadd, and the shared GPU's processes in their pods' cgroups (cgroup v2,
    systemd driver, containerd)."""
    assert set(TENANTS) == set(SHARED_TENANTS)  # the stand-in NVML's PIDs
    proc = tmp / "host-proc"
    (proc / "2").mkdir(parents=True)
    rest = " ".join(["0"] * 40)
    (proc / "2" / "stat").write_text(f"2 (kthreadd) S 0 0 0 0 -1 {KTHREAD_FLAGS} {rest}\n")
    for pid, (_, _, uid) in TENANTS.items():
        (proc / str(pid)).mkdir()
        pod_slice = f"kubepods-besteffort-pod{uid.replace('-', '_')}.slice"
        (proc / str(pid) / "cgroup").write_text(
            f"0::/kubepods.slice/kubepods-besteffort.slice/{pod_slice}/"
            f"cri-containerd-{pid:064x}.scope\n"
        )
    return proc


def tenant_pods() -> list[Pod]:
    """The shared GPU's pods as kube-state-metrics knows them (their UIDs)."""
    return [Pod(namespace, pod, [], uid) for namespace, pod, uid in TENANTS.values()]


def node_rules(tmp: Path) -> list[Path]:
    """The node profile with windows of seconds, as a site would generate its own."""
    files = profile_files(parse_config(SITE, "node"), tmp / "rules")
    (tmp / "rules").mkdir()
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return sorted(files)


def prometheus_config(
    sidecars: dict[str, str], agent: str, ksm: str, rule_files: list[Path]
) -> dict[str, Any]:
    return {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "rule_files": [str(p) for p in rule_files],
        "scrape_configs": scrape_configs(
            [
                Target(target, {"namespace": SIDECARS[pod], "pod": pod})
                for pod, target in sidecars.items()
            ],
            [Target(agent, {"namespace": "monitoring", "pod": "ibe-node-7xk2p"})],
            Target(ksm, {"namespace": "kube-system"}),
        ),
    }


def test_starved_pod_fires_in_the_node_layout(
    tmp_path: Path, exporter_process: Callable[..., ExporterProcess]
) -> None:
    started = time.monotonic()
    stack = Stack()
    kubelet = Kubelet(device_plugin_node(), device_plugin_offer())
    socket = tmp_path / "kubelet.sock"
    with serve_kubelet(kubelet, socket):
        try:
            agent = ExporterProcess(
                [
                    *agent_flags(socket),
                    f"--path.procfs={PROC}",
                    f"--gpu.host-procfs={host_procfs(tmp_path)}",
                ],
                {"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}"},
                module="support.node_agent",
            )
            stack.add(agent.close)
            ksm = MetricsServer(lambda: kube_pod_info(tenant_pods(), node="gpu-node-1"))
            stack.add(ksm.close)
            engines = {pod: FakeEngine.run_in_thread() for pod in SIDECARS}
            for engine in engines.values():
                stack.add(engine.stop)
            # Both queues grow alike: only the GPU each pod holds tells them apart.
            feeder = Feeder([(e, Load(queue=1, queue_growth=1.0)) for e in engines.values()])
            stack.add(feeder.stop)
            # The agent and the sidecars start side by side, then each is waited for.
            procs = {
                pod: exporter_process(
                    "--engine.url", engine.url + "/metrics", *SIDECAR_FLAGS, "--no-collector.nvml"
                )
                for pod, engine in engines.items()
            }
            for proc in (agent, *procs.values()):
                proc.wait_ready()
            sidecars = {pod: address(proc) for pod, proc in procs.items()}
            prometheus = processes.start_prometheus(
                tmp_path,
                prometheus_config(sidecars, address(agent), ksm.address, node_rules(tmp_path)),
                args=("--log.level=warn",),
            )
            stack.add(prometheus.stop)

            def alerts() -> dict[tuple[str, str], str]:
                found = prometheus.query(f'ALERTS{{alertname=~"{STARVED}|{CONTENDED}"}}')
                return {
                    (a["metric"]["alertname"], a["metric"]["pod"]): a["metric"]["alertstate"]
                    for a in found
                }

            seen: list[dict[tuple[str, str], str]] = []
            expected = {
                (STARVED, "vllm-0"): "firing",
                (STARVED, "notebook-a"): "firing",
                (CONTENDED, "notebook-a"): "firing",
            }

            def fired() -> bool:
                seen.append(alerts())
                return all(seen[-1].get(key) == state for key, state in expected.items())

            wait_until(fired, 70, "the starved and contended pods' alerts firing")
            # Each pod's GPU utilisation is its own GPU's, as the agent reads it.
            util = {
                r["metric"]["pod"]: float(r["value"][1])
                for r in prometheus.query("inference:gpu_utilization:mean10s")
            }
            assert util["vllm-0"] < 0.2 and util["vllm-7"] > 0.7, util
            # notebook-a's own share of its GPU, from its process's samples, named by its UID
            (share,) = prometheus.query("inference_gpu:engine_utilization:mean10s")
            assert share["metric"]["pod"] == "notebook-a"
            assert float(share["value"][1]) == pytest.approx(0.10, abs=0.01)
            time.sleep(2)  # a few more evaluations: the busy pod stays quiet
            seen.append(alerts())
            assert all((STARVED, "vllm-7") not in state for state in seen), seen
            assert seen[-1] == expected
        finally:
            stack.close()
    assert time.monotonic() - started < 90
