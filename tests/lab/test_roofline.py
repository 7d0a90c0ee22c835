"""The roofline path on a CPU: the lab's engine and replayed GPU give the sidecar real facts.

The stack (as the drills and the demo start it, here in the sidecar layout: ``demo --layout
sidecar``) runs the reference engine, which writes its model directory, and the sidecar with
``--model.path`` on it and a drill trace carrying this host's measured peaks: the sidecar's model
collector and NVML replay turn them into the contract metrics, which must be the real model's
and the host's.
"""

from __future__ import annotations

import json
import time
import urllib.request
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from exporter.backends.hfmodel import load_model
from exporter.lab.refengine.gputrace import (
    BUS_WIDTH_BITS,
    FLOPS_PER_CLOCK,
    measure_host,
    write_trace,
)
from exporter.lab.stack import Stack, StackConfig


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): float(s.value)
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


def value(
    metrics: dict[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    found = [
        v for (n, ls), v in metrics.items() if n == name and labels.items() <= dict(ls).items()
    ]
    assert len(found) == 1, (name, labels, sorted(k for k in metrics if k[0] == name))
    return found[0]


@pytest.mark.timeout(300)
def test_sidecar_reports_the_reference_models_facts_and_the_hosts_peaks(tmp_path: Path) -> None:
    host = measure_host()
    trace = write_trace("starved", tmp_path / "trace.jsonl", host=host)
    cfg = StackConfig(
        workdir=tmp_path / "stack",
        layout="sidecar",
        trace=trace,
        prometheus=False,
        alertmanager=False,
    )
    with Stack(cfg) as stack:
        deadline = time.monotonic() + 60
        metrics = scrape(stack.sidecar_url)
        while not any(n == "inference_model_weight_bytes" for n, _ in metrics):
            assert time.monotonic() < deadline, "no model metrics from the sidecar"
            time.sleep(0.5)
            metrics = scrape(stack.sidecar_url)
        model_dir = stack.model_dir
        config = json.loads((model_dir / "config.json").read_text())
        facts = load_model(model_dir)
    d, layers, vocab = config["n_embd"], config["n_layer"], config["vocab_size"]
    model = {"engine": "vllm", "model": "reference-tiny"}
    # The tiny model in float32: 4 blocks, the final norm and the tied LM head are streamed.
    streamed = layers * (12 * d * d + 13 * d) + 2 * d + vocab * d
    assert value(metrics, "inference_model_weight_bytes", **model) == streamed * 4
    assert facts.weight_bytes == streamed * 4
    kv = value(metrics, "inference_model_kv_cache_bytes_per_token", **model)
    assert kv == 2 * layers * d * 4 == 8192
    assert value(metrics, "inference_model_flops_per_token", **model) == facts.flops_per_token
    gpu = {"gpu": "0"}
    # The trace gives the peaks as NVML facts, whole MHz of clock: the host's rates within half
    # a MHz (at a few GB/s, a MHz of a 64-bit bus is 0.25 % of the rate).
    nvml = host.facts()
    per_mhz = BUS_WIDTH_BITS / 8 * 2e6
    bandwidth = value(metrics, "inference_gpu_peak_memory_bandwidth_bytes_per_second", **gpu)
    assert bandwidth == pytest.approx(nvml.max_memory_clock_mhz * per_mhz, rel=1e-9)
    assert abs(bandwidth - host.memory_bandwidth) <= per_mhz / 2
    flops = value(metrics, "inference_gpu_peak_flops", precision="bf16", **gpu)
    assert flops == pytest.approx(nvml.max_sm_clock_mhz * FLOPS_PER_CLOCK * 1e6, rel=1e-9)
    assert abs(flops - host.matmul_flops) <= FLOPS_PER_CLOCK * 1e6 / 2
