"""The series budget and the label limit (``exporter.metrics.SERIES_BUDGET``), on a real exposition.

The CLI at its defaults but for faster polls (which change when series appear, not which) on
a synthetic 2-GPU H100 replay trace and this machine's /proc (the CPU modes and softirq
vectors every Linux kernel has), reading the fake engine that serves the captured vLLM scrape,
with two processes named as vLLM's API server and engine core for the process collector. Its
series are counted by what multiplies them - per GPU, per engine, per engine process, per
sidecar - and must equal the budget: a change that adds series fails here until the budget is
raised on purpose (and ``docs/metrics.md`` shows it). Every series, with the target labels a
PodMonitor adds, stays within the label limit; so does every metric of the catalogue, emitted
here or not (Xids, MIG).
"""

from __future__ import annotations

import re
import subprocess
from collections import Counter
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from support.fakeengine import FakeEngine, FakeEngineThread
from support.paths import FIXTURES
from support.process import ExporterProcess
from support.synthetic import write_synthetic_trace

from exporter.lab.processes import fast_sidecar_flags, stop_process
from exporter.metrics import BY_NAME, CATALOGUE, POD_MONITOR_TARGET_LABELS, SERIES_BUDGET

GPUS = 2
ENGINE_PROCESSES = ("vllm", "VLLM::EngineCore")
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? \S+$")
_LABEL = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="(?:[^"\\]|\\.)*"')


@pytest.fixture
def engine() -> Iterator[FakeEngineThread]:
    body = (FIXTURES / "engines" / "vllm.txt").read_text(encoding="utf-8")
    with FakeEngine.run_in_thread(metrics_body=body, flavour="vllm") as running:
        yield running


@pytest.fixture
def engine_processes() -> Iterator[None]:
    """Idle processes whose command lines the default --process.match takes for vLLM's."""
    procs = [
        subprocess.Popen(["bash", "-c", f'exec -a "{name}" sleep 300']) for name in ENGINE_PROCESSES
    ]
    try:
        yield
    finally:
        for proc in procs:
            stop_process(proc, timeout=5)


def _spec(name: str) -> str | None:
    """The catalogue collector of a sample name, histogram suffixes resolved."""
    for suffix in ("", "_bucket", "_count", "_sum"):
        base = name.removesuffix(suffix) if suffix else name
        if base in BY_NAME and (not suffix or BY_NAME[base].type == "histogram"):
            return BY_NAME[base].collector
    return None


def _samples(text: str) -> list[tuple[str, list[str]]]:
    out = []
    for line in text.splitlines():
        if line and not line.startswith("#"):
            match = _SAMPLE.match(line)
            assert match, line
            out.append((match[1], _LABEL.findall(match[2] or "")))
    return out


def _complete(text: str) -> bool:
    names = {name for name, _ in _samples(text)}
    processes = sum(
        1 for n, _ in _samples(text) if n == "inference_engine_process_cpu_seconds_total"
    )
    return (
        'inference_engine_up{engine="vllm"} 1.0' in text
        and "inference_tokenizer_probe_rtt_seconds_count" in names
        and "inference_gpu_utilization_samples_bucket" in names
        # GPM's series (NVLink's bytes among them) come with the second poll
        and "inference_gpu_nvlink_transmit_bytes_total" in names
        # both need two reads a window apart
        and "inference_cpu_softirq_hottest_core_ratio" in names
        and "inference_engine_hottest_thread_cpu_ratio" in names
        and processes == len(ENGINE_PROCESSES)
    )


def test_series_budget_and_label_limit(
    engine: FakeEngineThread,
    engine_processes: None,
    exporter_process: Callable[..., ExporterProcess],
    tmp_path: Path,
) -> None:
    # H100s: GPM (bandwidth, SM activity) adds the most series a GPU has.
    trace = write_synthetic_trace(tmp_path / "trace.jsonl", gpus=GPUS, duration_s=60.0)
    proc = exporter_process(
        "--gpu.replay-file",
        str(trace),
        "--engine.url",
        engine.url + "/metrics",
        *fast_sidecar_flags(),
    )
    proc.wait_ready()
    proc.wait_for(lambda: _complete(proc.get("/metrics")[2].decode()), timeout=30)
    samples = _samples(proc.get("/metrics")[2].decode())

    counts: Counter[str] = Counter()
    for name, labels in samples:
        collector = _spec(name)
        if "gpu" in labels:
            counts["gpu"] += 1
        elif name == "inference_engine_process_cpu_seconds_total":
            counts["engine process"] += 1
        elif collector in ("engine", "tokenizer"):
            counts["engine"] += 1
        else:
            counts["sidecar"] += 1
    budget = SERIES_BUDGET
    assert counts["gpu"] % GPUS == 0
    measured = {
        "per_gpu": counts["gpu"] // GPUS,
        "per_engine": counts["engine"],
        "per_engine_process": counts["engine process"] // len(ENGINE_PROCESSES),
        "per_sidecar": counts["sidecar"],
    }
    expected = {name: getattr(budget, name) for name in measured}
    assert measured == expected, (
        "the exposition differs from exporter.metrics.SERIES_BUDGET: raise (or lower) the "
        "budget on purpose and regenerate docs/metrics.md (python build-tools/docgen.py)"
    )
    assert len(samples) == budget.per_pod(GPUS, len(ENGINE_PROCESSES))

    # The label limit, with the labels a PodMonitor adds to every series of the target.
    for name, labels in samples:
        assert not set(labels) & set(POD_MONITOR_TARGET_LABELS), (name, labels)
        carried = len(labels) + len(POD_MONITOR_TARGET_LABELS)
        assert carried <= budget.max_labels, f"{name}{{{','.join(labels)}}}: {carried} labels"


def test_every_catalogued_metric_fits_the_label_limit() -> None:
    """Metrics this exposition lacks (an Xid, MIG devices) are held to the limit too."""
    for spec in CATALOGUE:
        own = (*spec.labels, *(("le",) if spec.type == "histogram" else ()))
        # The node agent's attribution carries namespace, pod and container of the pod that
        # holds the GPU; Prometheus keeps them over the target's (honorLabels), so they count
        # once.
        carried = len(set(own) | set(POD_MONITOR_TARGET_LABELS))
        assert carried <= SERIES_BUDGET.max_labels, f"{spec.name}{own}: {carried} labels"
