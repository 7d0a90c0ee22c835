"""How the nvml collector chose its GPUs (inference_gpu_attribution_info) and what it says when
the GPUs it sees are plainly not all the engine's."""

from __future__ import annotations

import logging
import time

import pytest
from support.kubelet import NodeNvml, node_gpus

from exporter.backends.pidns import FixedPids
from exporter.collectors import build_shared, default_settings
from exporter.collectors.nvml import NvmlCollector, build


def method_of(monkeypatch: pytest.MonkeyPatch, visible: str | None, **overrides: object) -> str:
    if visible is None:
        monkeypatch.delenv("NVIDIA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("NVIDIA_VISIBLE_DEVICES", visible)
    settings = default_settings(**overrides)
    return build(settings, build_shared(settings)).attribution.method


def test_the_method_follows_how_the_devices_were_given(monkeypatch: pytest.MonkeyPatch) -> None:
    uuid = node_gpus()[0].uuid
    assert method_of(monkeypatch, None) == "all-visible"
    assert method_of(monkeypatch, "all") == "all-visible"
    assert method_of(monkeypatch, f"{uuid}::2") == "visible-devices"
    assert method_of(monkeypatch, "all", gpu_devices="0,1") == "devices-flag"
    assert method_of(monkeypatch, None, gpu_attribution="dra") == "dra"
    assert method_of(monkeypatch, "all", gpu_attribution="whole-node") == "whole-node"


class TwoTenants(NodeNvml):
    """The node's NVML with the engine (PID 100) on GPU 0 and another pod's process on GPU 1."""

    def __init__(self) -> None:
        gpus = node_gpus()[:2]
        gpus[0].processes = [(100, 2**30)]
        gpus[1].processes = [(200, 2**30)]
        super().__init__(gpus)


def run(method: str) -> NvmlCollector:
    collector = NvmlCollector(
        TwoTenants,
        poll_interval=0.5,
        engine=FixedPids({100}),
        attribution=method,
        devices=("0", "1"),
    )
    collector.start()
    assert collector.wait_ready(10)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:  # the first per-process reads
        collector.collect()
        if collector.notices() or method != "all-visible":
            break
        time.sleep(0.05)
    return collector


def test_all_visible_with_another_workloads_gpu_says_so(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.WARNING)
    collector = run("all-visible")
    try:
        out = collector.collect()
        info = [
            s for f in out.metrics for s in f.samples if s.name == "inference_gpu_attribution_info"
        ]
        assert [(s.labels, s.value) for s in info] == [({"method": "all-visible"}, 1.0)]
        (notice,) = collector.notices()
        assert notice.startswith("GPU 1 run other workloads' processes and none of the engine's")
        collector.collect()
        said = [r for r in caplog.records if "cannot tell the engine's" in r.getMessage()]
        assert len(said) == 1  # one line, not one per scrape
    finally:
        collector.stop(5)


def test_a_method_that_names_the_gpus_is_not_doubted() -> None:
    collector = run("visible-devices")
    try:
        time.sleep(1.2)  # per-process reads done: GPU 1 is still another workload's
        collector.collect()
        assert collector.notices() == []
        out = collector.collect()
        info = [
            s for f in out.metrics for s in f.samples if s.name == "inference_gpu_attribution_info"
        ]
        assert info[0].labels == {"method": "visible-devices"}
    finally:
        collector.stop(5)
