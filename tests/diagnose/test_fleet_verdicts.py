"""Issue 34's "done when", end to end through ``diagnose``: an llm-d fleet starved behind its
gateway, a cluster on dcgm-exporter 4.10, a Triton serving five models and a stalled vLLM each
get the right verdict (``test_stalls_and_gateways.py`` ranks the same causes over hand-written
scrapes of the sidecar's own series, in process).

Each runs the real sidecar over an engine exposition on loopback whose numbers move, and
``diagnose`` as the on-call runs it: ``--prometheus.url`` over a real Prometheus with the pack
(the gateway's fleet, the dcgm layout), or ``--target`` over the sidecar (Triton). The site
config's windows are one minute (six seconds once the ``fast`` profiles scale them).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families
from signatures.test_dcgm_generations import renames
from support.fakeengine import FakeEngine
from support.paths import FIXTURES, ROOT, TRACE
from support.process import ExporterProcess
from support.promstack import SIDECAR_FLAGS, Stack, address, start_prometheus, trace, wait_until

from exporter.backends.replay import ReplayApi, load_trace
from exporter.lab import processes
from exporter.lab.layouts import (
    DCGM_NAMESPACE,
    GPU_RESOURCE,
    Container,
    DcgmExporter,
    Kubelet,
    MetricsServer,
    Pod,
    Target,
    scrape_configs,
)
from exporter.signatures import all_signatures, parse_config
from exporter.signatures.__main__ import profile_files

QWEN = "Qwen/Qwen3-0.6B"
SITE = {"windows": {name: "1m" for name in ("rate", "latency", "queue_trend", "pulsing", "xid")}}
STARVED = "InferenceGPUStarvedQueueGrowing"
STALE = "InferenceGatewayStaleEndpoints"
QUEUE_WAIT = "InferenceQueueWaitDominatesLatency"
STALLED = "InferenceEngineStalled"
ADVICE = {s.alert: s.advice for s in all_signatures(parse_config({}))}


@pytest.fixture
def stack() -> Iterator[Stack]:
    started = Stack()
    try:
        yield started
    finally:
        started.close()


class Moving:
    """A fake engine whose exposition is ``render(seconds since start)``, redrawn every 0.2 s."""

    def __init__(self, stack: Stack, render: Callable[[float], str]) -> None:
        self.render = render
        self.server = FakeEngine.run_in_thread()
        stack.add(self.server.stop)
        self.url = self.server.url
        self.began = time.monotonic()
        self.server.engine.metrics_body = render(0.0)
        self._stop = threading.Event()
        thread = threading.Thread(target=self._run, name="moving-engine", daemon=True)
        thread.start()
        stack.add(lambda: (self._stop.set(), thread.join(5)))

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.server.engine.metrics_body = self.render(time.monotonic() - self.began)


def diagnose(*args: str) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.cli", "diagnose", *args, "--output", "json"],
        capture_output=True,
        text=True,
        timeout=90,
        cwd=ROOT,
        check=False,
    )
    assert proc.returncode in (0, 1), proc.stderr
    report: dict[str, Any] = json.loads(proc.stdout)
    return report


def holding(report: dict[str, Any]) -> list[tuple[str, str]]:
    """(alert, target) of every finding that holds, in rank order."""
    return [(f["alert"], f["target"]) for f in report["findings"] if f["status"] == "holds"]


def advice_for(report: dict[str, Any], target: str) -> dict[str, Any]:
    found = [a for a in report["scaling_advice"] if a["target"] == target]
    assert found, f"no advice for {target}: {report['scaling_advice']}"
    return found[0]


def rules(tmp_path: Path, profile: str) -> tuple[Path, list[Path]]:
    """:data:`SITE` for diagnose's ``--config``, and the ``profile``'s rule files under it."""
    site = tmp_path / "site.yaml"
    site.write_text(yaml.safe_dump(SITE), encoding="utf-8")
    files = profile_files(parse_config(SITE, profile), tmp_path / "rules")
    (tmp_path / "rules").mkdir()
    for path, text in files.items():
        path.write_text(text, encoding="utf-8")
    return site, sorted(files)


def vllm(waiting: float, running: float = 4, kv: float = 0.1) -> str:
    return (
        "# TYPE vllm:num_requests_running gauge\n"
        f'vllm:num_requests_running{{engine="0",model_name="{QWEN}"}} {running}\n'
        "# TYPE vllm:num_requests_waiting gauge\n"
        f'vllm:num_requests_waiting{{engine="0",model_name="{QWEN}"}} {waiting}\n'
        "# TYPE vllm:kv_cache_usage_perc gauge\n"
        f'vllm:kv_cache_usage_perc{{engine="0",model_name="{QWEN}"}} {kv}\n'
    )


# --- an llm-d fleet starved behind its gateway -----------------------------------------------


class Picker:
    """llm-d's endpoint picker with flow control (its 2026 names): the pool saturated, its
    queue growing a request a second; ``stale`` endpoints whose metrics it finds stale."""

    def __init__(self) -> None:
        self.stale = 1

    def render(self, t: float) -> str:
        pool = 'inference_pool="qwen-pool"'
        return (
            "# TYPE llm_d_epp_flow_control_queue_size gauge\n"
            f'llm_d_epp_flow_control_queue_size{{fairness_id="default",{pool},'
            f'model_name="qwen",priority="0",target_model_name="{QWEN}"}} {5 + int(t)}\n'
            "# TYPE llm_d_epp_flow_control_pool_saturation gauge\n"
            f'llm_d_epp_flow_control_pool_saturation{{{pool},stage="effective"}} 1\n'
            "# TYPE llm_d_epp_flow_control_stale_endpoints gauge\n"
            'llm_d_epp_flow_control_stale_endpoints{detector="utilization-detector"} '
            f"{self.stale}\n"
            "# TYPE llm_d_epp_flow_control_requests_total counter\n"
            f'llm_d_epp_flow_control_requests_total{{{pool},outcome="Dispatched",priority="0"}} '
            f"{100 + int(2 * t)}\n"
            "# TYPE llm_d_epp_ready_endpoints gauge\n"
            'llm_d_epp_ready_endpoints{name="qwen-pool"} 1\n'
        )


@pytest.mark.timeout(150)
def test_an_llm_d_fleet_starved_behind_its_gateway(
    tmp_path: Path, stack: Stack, exporter_process: Callable[..., ExporterProcess]
) -> None:
    """The pool's queue is the gateway's; the engine's own is empty, its GPU a fifth busy.
    With an endpoint's metrics stale the gateway's cause ranks first and its advice, on the
    gateway and on the engine it feeds, is the scrape alone (the starved GPU its consequence);
    once the picker reads every endpoint, the starved GPUs are the verdict, on the engine,
    with the gateway's queue as its own."""
    site, files = rules(tmp_path, "fast")
    picker = Picker()
    gateway_engine = Moving(stack, picker.render)
    gateway = exporter_process(
        "--engine.url",
        gateway_engine.url + "/metrics",
        "--engine.type",
        "llmd-epp",
        "--no-collector.nvml",
        *SIDECAR_FLAGS,
    )
    engine = Moving(stack, lambda t: vllm(waiting=0))
    model_server = exporter_process(
        "--engine.url",
        engine.url + "/metrics",
        "--gpu.replay-file",
        str(trace(tmp_path, utilization=0.2)),
        *SIDECAR_FLAGS,
    )
    gateway.wait_ready()
    model_server.wait_ready()
    prometheus = start_prometheus(tmp_path, [address(gateway), address(model_server)], files)
    stack.add(prometheus.stop)
    pack = ("--prometheus.url", prometheus.url, "--config", str(site), "--profile", "fast")

    def holds(alert: str) -> Callable[[], bool]:
        expr = f'inference:bottleneck_signature:holding{{alertname="{alert}"}}'
        return lambda: bool(prometheus.query(expr))

    def alerting(alert: str) -> Callable[[], bool]:
        return lambda: bool(prometheus.query(f'ALERTS{{alertname="{alert}"}}'))

    # the gateway's cause, and the starved GPU it explains (its alert pending or firing)
    wait_until(lambda: holds(STALE)() and alerting(STARVED)(), 60, f"{STALE} holding and {STARVED}")
    report = diagnose(*pack)
    held = holding(report)
    assert held and held[0] == (STALE, address(gateway)), held
    # the consequence, explained: below its cause, on the engine the gateway's cause covers
    assert held.index((STALE, address(gateway))) < held.index((STARVED, address(model_server)))
    by_alert = {(f["alert"], f["target"]): f for f in report["findings"]}
    assert by_alert[(STALE, address(gateway))]["covers"] == [address(model_server)]
    starved = by_alert[(STARVED, address(model_server))]
    assert starved["explained_by"] == f"{STALE} on {address(gateway)}", starved
    first = advice_for(report, address(gateway))
    assert first["action"] == "fix_gateway_scrape" and first["blocks_scale_out"], first
    # the engine's advice is the gateway's scrape alone: no second fix for its starved GPU
    engine_advice = advice_for(report, address(model_server))
    assert engine_advice["action"] == "fix_gateway_scrape", engine_advice
    assert engine_advice["cause"] == STALE and engine_advice["also"] == [], engine_advice
    assert engine_advice["cause_target"] == address(gateway), engine_advice
    actions = {a["action"] for a in report["scaling_advice"]}
    assert actions == {"fix_gateway_scrape"}, report["scaling_advice"]

    picker.stale = 0  # the picker reads every endpoint again; the pool stays saturated
    wait_until(lambda: not holds(STALE)() and holds(STARVED)(), 40, f"{STARVED} alone")
    report = diagnose(*pack)
    held = holding(report)
    assert held and held[0] == (STARVED, address(model_server)), held
    assert STALE not in [alert for alert, _ in held], held
    starved = report["findings"][0]
    evidence = {e["key"]: e["value"] for e in starved["evidence"]}
    # the engine's queue is the gateway's (the picker's queue grows by one a second)
    assert evidence["depth"] >= 5, evidence
    first = advice_for(report, address(model_server))
    assert first["action"] == ADVICE[STARVED].action, first
    assert first["blocks_scale_out"] == ADVICE[STARVED].blocks_scale_out, first


# --- a cluster on dcgm-exporter 4.10 -----------------------------------------------------------


def newest_generation(text: str) -> str:
    """A dcgm-exporter 4.8 exposition in 4.10's names, units and labels (the release notes'
    renames, tests/fixtures/upstream/dcgm-exporter-renames-4.9-4.10.csv)."""
    metrics, labels = renames()
    out = []
    for old_line in text.splitlines():
        line = old_line
        match = re.match(r"^(# (?:HELP|TYPE) )?([A-Z][A-Z0-9_]+)(.*)$", line)
        if match and match[2] in metrics:
            new, factor = metrics[match[2]]
            head, rest = match[1] or "", match[3]
            if not head:
                body, value = rest.rsplit(" ", 1)
                rest = f"{body} {float(value) * factor!r}"
            line = f"{head}{new}{rest}"
        for old, new_label in labels.items():
            line = line.replace(f"{old}=", f"{new_label}=")
        out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.timeout(150)
def test_a_cluster_on_dcgm_exporter_4_10(
    tmp_path: Path, stack: Stack, exporter_process: Callable[..., ExporterProcess]
) -> None:
    """The dcgm layout after the upgrade: dcgm-exporter 4.10 labels the engine's GPU (a fifth
    busy) with its pod under its new names and units, the engine's queue grows: the starved
    GPU is the verdict, and no GPU input is missing."""
    site, files = rules(tmp_path, "fast-dcgm")
    engine = Moving(stack, lambda t: vllm(waiting=2 + int(t)))
    pod = Pod("drill", "vllm-0", [Container("engine")])
    kubelet = Kubelet([pod])
    dcgm = DcgmExporter(ReplayApi(load_trace(trace(tmp_path, utilization=0.2))), kubelet)
    stack.add(dcgm.close)
    kubelet.give(pod.namespace, pod.name, "engine", GPU_RESOURCE, dcgm.uuids)
    newest = MetricsServer(lambda: newest_generation(dcgm.exposition()))
    stack.add(newest.close)
    served = newest_generation(dcgm.exposition())
    assert "DCGM_FI_DEV_GPU_UTIL_RATIO{" in served and "DCGM_FI_DEV_GPU_UTIL{" not in served
    assert "DCGM_FI_SYSTEM_DRIVER_VERSION=" in served
    sidecar = exporter_process(
        "--engine.url",
        engine.url + "/metrics",
        *SIDECAR_FLAGS,
        "--no-collector.nvml",
        "--gpu.read-by",
        f"dcgm-exporter at {newest.url}",
    )
    sidecar.wait_ready()
    scrape = scrape_configs(
        [Target(address(sidecar), {"namespace": pod.namespace, "pod": pod.name})],
        dcgm_exporters=[Target(newest.address, {"namespace": DCGM_NAMESPACE, "pod": "dcgm-0"})],
    )
    config = {
        "global": {"scrape_interval": "1s", "evaluation_interval": "1s", "scrape_timeout": "900ms"},
        "rule_files": [str(p) for p in files],
        "scrape_configs": scrape,
    }
    prometheus = processes.start_prometheus(tmp_path / "prometheus", config)
    stack.add(prometheus.stop)
    expr = f'inference:bottleneck_signature:holding{{alertname="{STARVED}"}}'
    wait_until(lambda: bool(prometheus.query(expr)), 60, f"{STARVED} holding in Prometheus")
    report = diagnose(
        "--prometheus.url", prometheus.url, "--config", str(site), "--profile", "fast-dcgm"
    )
    held = holding(report)
    assert held and held[0][0] == STARVED, held
    first = report["findings"][0]
    assert first["labels"]["pod"] == "vllm-0", first["labels"]
    evidence = {e["key"]: e["value"] for e in first["evidence"]}
    assert evidence["util"] == pytest.approx(20, abs=8), evidence
    missing = report["missing_inputs"]
    assert not [line for line in missing if line.startswith("GPU utilisation")], missing


# --- a Triton serving five models -------------------------------------------------------------

TRITON = FIXTURES / "engines" / "triton-trtllm-ensemble-handwritten.txt"
TRITON_CONFIGS = FIXTURES / "engines" / "triton-trtllm-ensemble-configs-handwritten.json"
FIVE = ("ensemble", "postprocessing", "preprocessing", "tensorrt_llm", "tensorrt_llm_bls")
#: Where clients' requests enter: the ensemble and the BLS model (no ensemble composes them).
ENTRY = ("ensemble", "tensorrt_llm_bls")
#: What the clients wait: 3,000 s of queue in 4,010 s of requests (800 + 200 of about 4 s).
CLIENT_SHARE = 3000.17 / (3208 + 802)


def triton(t: float) -> str:
    """The five-model fixture with every counter grown as the minutes pass (its rates in the
    fixture's proportions: 10 % of the totals a second), its gauges as they are."""
    factor = 1.0 + t / 10.0
    counters: set[str] = set()
    out = []
    for line in TRITON.read_text(encoding="utf-8").splitlines():
        if line.startswith("# TYPE ") and line.endswith(" counter"):
            counters.add(line.split()[2])
        if not line.startswith("#") and line.split("{", 1)[0] in counters:
            series, value = line.rsplit(" ", 1)
            out.append(f"{series} {float(value) * factor:.1f}")
        else:
            out.append(line)
    return "\n".join(out) + "\n"


@pytest.mark.timeout(90)
def test_a_triton_serving_five_models(
    tmp_path: Path, stack: Stack, exporter_process: Callable[..., ExporterProcess]
) -> None:
    """One series per model Triton serves, each named; the requests wait in tensorrt_llm's
    queue (3 of every 4 s) while the GPU is busy: the pod's verdict is queue wait, a capacity
    limit, and the waiting model is tensorrt_llm alone. Triton's API says which models are the
    ensemble's steps, so the share is the clients' 75 %, not the 37 % of request time summed
    over nested models."""
    engine = Moving(stack, triton)
    configs = json.loads(TRITON_CONFIGS.read_text(encoding="utf-8"))
    engine.server.engine.model_configs = {k: v for k, v in configs.items() if k != "_source"}
    sidecar = exporter_process(
        "--engine.url", engine.url + "/metrics", *SIDECAR_FLAGS, "--gpu.replay-file", str(TRACE)
    )
    sidecar.wait_ready()
    sidecar.wait_for(lambda: 'model="tensorrt_llm_bls"' in sidecar.get("/metrics")[2].decode(), 15)
    samples = [
        sample
        for family in text_string_to_metric_families(sidecar.get("/metrics")[2].decode())
        for sample in family.samples
        if sample.name.startswith("inference_")
    ]

    def models(name: str) -> list[str]:
        return sorted(s.labels["model"] for s in samples if s.name == name)

    assert models("inference_engine_info") == list(FIVE)
    assert models("inference_queue_time_seconds_count") == list(FIVE)
    assert models("inference_e2e_request_latency_seconds_count") == list(ENTRY)
    assert [s.value for s in samples if s.name == "inference_engine_model_config_up"] == [1.0]
    assert not [s.name for s in samples if s.labels.get("model") == ""]
    depth = {s.labels["model"]: s.value for s in samples if s.name == "inference_queue_depth"}
    assert depth == {m: 12.0 if m == "tensorrt_llm" else 0.0 for m in FIVE}, depth

    report = diagnose(
        "--target", sidecar.base, "--duration", "4s", "--interval", "1s", "--profile", "sidecar"
    )
    held = [alert for alert, _ in holding(report)]
    assert held and held[0] == QUEUE_WAIT, held
    evidence = {e["key"]: e["value"] for e in report["findings"][0]["evidence"]}
    assert evidence["share"] == pytest.approx(100 * CLIENT_SHARE, abs=2), evidence
    advice = report["scaling_advice"]
    assert advice and advice[0]["cause"] == QUEUE_WAIT and advice[0]["action"] == "scale_out", (
        advice
    )


# --- a stalled vLLM ---------------------------------------------------------------------------


def stalled_vllm(t: float) -> str:
    """vLLM with six requests waiting, none running, its KV cache at 1 % and no token generated
    since: admission stopped (vllm#53130), and the clients stopped sending, so the queue no
    longer grows."""
    return vllm(waiting=6, running=0, kv=0.01) + (
        "# TYPE vllm:generation_tokens_total counter\n"
        f'vllm:generation_tokens_total{{engine="0",model_name="{QWEN}"}} 50000\n'
        "# TYPE vllm:prompt_tokens_total counter\n"
        f'vllm:prompt_tokens_total{{engine="0",model_name="{QWEN}"}} 120000\n'
    )


@pytest.mark.timeout(90)
def test_a_stalled_vllm(
    tmp_path: Path, stack: Stack, exporter_process: Callable[..., ExporterProcess]
) -> None:
    """The stall is the verdict, its advice a restart, not more replicas; the GPU it leaves
    idle is its consequence, not a second cause."""
    engine = Moving(stack, stalled_vllm)
    sidecar = exporter_process(
        "--engine.url",
        engine.url + "/metrics",
        *SIDECAR_FLAGS,
        "--gpu.replay-file",
        str(trace(tmp_path, utilization=0.02)),
    )
    sidecar.wait_ready()
    report = diagnose(
        "--target", sidecar.base, "--duration", "4s", "--interval", "1s", "--profile", "sidecar"
    )
    held = [alert for alert, _ in holding(report)]
    assert held and held[0] == STALLED, held
    assert STARVED not in held, held
    first = report["findings"][0]
    assert first["severity"] == "critical", first
    evidence = {e["key"]: e["value"] for e in first["evidence"]}
    assert evidence["waiting"] == 6, evidence
    advice = report["scaling_advice"][0]
    assert advice["cause"] == STALLED and advice["action"] == "restart_engine", advice
    assert advice["blocks_scale_out"] and "scaling out would not help" in advice["text"], advice
