"""Every view right in every layout: one pod's dashboards, plots and diagnosis, compared across
the sidecar, node and dcgm layouts against real Prometheus servers.

Three small fleets of the same pods from the fleet simulator (``bench/fleet.py serve``): in the
``sidecar`` layout each pod's sidecar reads its GPUs; in ``node`` the sidecars run without NVML
and one node agent per node reads them (the real CLI's expositions, captured at start); in
``dcgm`` one dcgm-exporter per node does (its fields, hand-written in the simulator). Each fleet
is scraped by its own Prometheus loaded with its layout's rule profile. Then, for one inference
pod picked in the variables, every query of that layout's dashboards must have data in a layout
if it has data in another - but the exceptions below, each a series only one source has - and
so must the post-mortem's plots; ``diagnose --target`` of the pod in the node layout must say
which signatures it cannot see and why, and agree with the sidecar layout on the rest.
"""

from __future__ import annotations

import asyncio
import json
import math
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.dashboards import DASHBOARDS, PanelQuery, collect_queries, grafana_regex, load_boards
from support.global_interval import at_global_interval
from support.paths import FIXTURES, ROOT, bench_script
from support.process import ExporterProcess

from exporter.diagnose.evaluate import NO_GPUS, diagnose_target, gpu_readers
from exporter.diagnose.findings import Finding
from exporter.diagnose.timeline import PANELS, timeline
from exporter.lab import processes
from exporter.lab.processes import Server
from exporter.signatures import all_signatures
from exporter.signatures.signals.cpu_signals import SOFTIRQ_HOTTEST_CORE
from exporter.signatures.site import SiteConfig, parse_config

fleet = bench_script("fleet", "fleet_layouts")

LAYOUTS = ("sidecar", "node", "dcgm")
# 16 GPUs: an 8-GPU pod holding node 0; pods of 4, 2, 1 and 1 GPUs sharing node 1.
GPUS = 16
# The pod the variables pick: 2 GPUs on a node it shares with three other pods.
POD = next(p for p in fleet.fleet(GPUS) if p.gpus == 2)
VARIABLES = {
    "namespace": grafana_regex(POD.namespace),
    "pod": grafana_regex(POD.pod),
    "model": ".*",
    "gpu": ".*",
}
# The captures: the CLI's series at shorter poll intervals (the same series, sooner), and the
# served model's facts for the roofline (the sidecar's model collector).
FAST = (
    "--gpu.poll-interval=500ms",
    "--engine.poll-interval=500ms",
    "--tokenizer.probe-interval=1s",
)
MODEL = (f"--model.path={FIXTURES / 'models' / 'meta-llama__Llama-3.1-8B'}",)
DEADLINE_S = 60.0

Key = tuple[str, str, str]

# Queries without data in some layouts by nature: the layouts that lack it, and why. A query
# listed here must be empty in exactly those layouts and have data in the others.
EXCEPTIONS: dict[Key, tuple[frozenset[str], str]] = {
    ("ibe-inference-bottlenecks", "Driver utilisation samples over time", "A"): (
        frozenset({"dcgm"}),
        "dcgm-exporter keeps no driver utilisation samples (one reading per scrape)",
    ),
    ("ibe-inference-bottlenecks", "Samples at or below each level (time range)", "A"): (
        frozenset({"dcgm"}),
        "dcgm-exporter keeps no driver utilisation samples",
    ),
    ("ibe-gpu-detail", "SM active and occupancy", "B"): (
        frozenset({"dcgm"}),
        "DCGM_FI_PROF_SM_OCCUPANCY is not among dcgm-exporter's default fields",
    ),
    ("ibe-gpu-detail", "Clock events (throttle reasons)", "A"): (
        frozenset({"dcgm"}),
        "dcgm-exporter's default fields have no clock event reasons (the throttling signal "
        "decodes DCGM_FI_DEV_CLOCKS_EVENT_REASONS where a site adds it)",
    ),
    ("ibe-gpu-detail", "GPU answering NVML", "A"): (
        frozenset({"dcgm"}),
        "NVML's per-GPU answer is the sidecar's or the node agent's; dcgm-exporter has none",
    ),
    ("ibe-exporter-health", "NVML and GPUs answering", "A"): (
        frozenset({"node", "dcgm"}),
        "the pod's sidecar runs without NVML there; the node agent's NVML is its own target's",
    ),
    ("ibe-exporter-health", "NVML and GPUs answering", "B"): (
        frozenset({"dcgm"}),
        "NVML's per-GPU answer is the sidecar's or the node agent's; dcgm-exporter has none",
    ),
    ("ibe-exporter-health", "NVML calls per GPU per second", "A"): (
        frozenset({"dcgm"}),
        "the NVML calls are the sidecar's or the node agent's; dcgm-exporter counts none",
    ),
    ("ibe-inference-bottlenecks", "NVLink use vs SM activity", "A"): (
        frozenset({"dcgm"}),
        "DCGM_FI_PROF_NVLINK_TX_BYTES and _RX_BYTES are profiling fields, not among "
        "dcgm-exporter's default fields",
    ),
    ("ibe-inference-bottlenecks", "Energy spent idle", "A"): (
        frozenset({"dcgm"}),
        "dcgm-exporter has no idle energy (the sidecar and the node agent integrate it from "
        "the driver's samples)",
    ),
}


# Queries without data in any layout of this fleet, and why: a healthy fleet of colocated vLLM
# engines. Listed, so that a signal broken in every layout alike cannot pass unseen.
_ALERTS = "no alert fires in a healthy fleet"
_POOLS = "the engines run colocated: no pool, no KV-cache transfer"
NOWHERE: dict[Key, str] = {
    ("ibe-inference-bottlenecks", "Signature alerts now (pending and firing)", "A"): _ALERTS,
    ("ibe-inference-bottlenecks", "annotation: Signature alerts firing", ""): _ALERTS,
    ("ibe-exporter-health", "Poll and probe failures", "C"): "no engine series is dropped",
    ("ibe-gpu-detail", "Xid errors", "A"): "no GPU reports an Xid",
    ("ibe-gpu-detail", "GPU utilisation per GPU: the device and the engine's own share", "B"): (
        "no GPU is shared with another tenant's processes"
    ),
    ("ibe-inference-bottlenecks", "Tokenizer latency vs inter-token latency", "C"): (
        "vLLM reports no tokenizer histogram of its own"
    ),
    (
        "ibe-inference-bottlenecks",
        "Latency budget: queue, prefill, KV transfer, decode, host",
        "C",
    ): (_POOLS),
    **{
        ("ibe-inference-bottlenecks", title, ref): _POOLS
        for title, refs in (
            ("Pool queues: prefill and decode", "AB"),
            ("Time to first token: queue, prefill, KV transfer", "ABC"),
            ("Pool queue by stage", "A"),
            ("KV-cache transfer time", "ABC"),
            ("KV-cache transfer bandwidth", "A"),
            ("KV-cache transfer failures", "AB"),
            ("P/D routing decisions", "A"),
        )
        for ref in refs
    },
}


@dataclass
class Layout:
    name: str
    prometheus: Server
    pod_url: str  # the pod's sidecar, as the simulator serves it

    @property
    def cfg(self) -> SiteConfig:
        return parse_config({}, self.name)


def _answers(server: Server, queries: list[PanelQuery]) -> dict[Key, bool]:
    """Whether each query, for the picked pod, has a finite value now."""
    out = {}
    for query in queries:
        result = server.query(query.render(VARIABLES))
        out[query.key] = any(math.isfinite(float(s["value"][1])) for s in result)
    return out


def _queries(layout: str) -> list[PanelQuery]:
    directory = DASHBOARDS / ("" if layout == "sidecar" else layout)
    return collect_queries(load_boards(directory))


@pytest.fixture(scope="module")
def expositions(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The real CLI's expositions the simulator serves: a sidecar with NVML, one without, and a
    node agent (against the tests' fake kubelet), captured side by side."""
    workdir = tmp_path_factory.mktemp("capture")
    fleet.write_synthetic_trace(workdir / "trace-8gpu.jsonl", gpus=8, duration_s=120.0)
    kinds = ("sidecar", "sidecar-nonvml", "agent")
    with ThreadPoolExecutor(len(kinds)) as pool:
        futures = {
            kind: pool.submit(
                fleet.capture, workdir, kind, (*FAST, *(MODEL if kind != "agent" else ()))
            )
            for kind in kinds
        }
        captured = {kind: future.result() for kind, future in futures.items()}
    path = workdir / "expositions.json"
    path.write_text(json.dumps({k: {"text": t, "age_s": a} for k, (t, a) in captured.items()}))
    return path


def _simulate(layout: str, workdir: Path, expositions: Path) -> tuple[subprocess.Popen[bytes], str]:
    """The layout's fleet on a free port, ready; its Prometheus config."""
    port = processes.free_port()
    targets, nodes, ready = workdir / "targets.json", workdir / "nodes.json", workdir / "ready"
    with (workdir / "simulator.log").open("wb") as log:
        sim = subprocess.Popen(
            [
                sys.executable,
                str(ROOT / "bench" / "fleet.py"),
                "serve",
                *fleet.Scenario(GPUS, layout).args(),
                "--port",
                str(port),
                "--targets",
                str(targets),
                "--node-targets",
                str(nodes),
                "--ready",
                str(ready),
                "--exposition",
                str(expositions),
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    deadline = time.monotonic() + 60
    while not ready.exists():
        assert sim.poll() is None, (workdir / "simulator.log").read_text()
        assert time.monotonic() < deadline, "the simulator did not start"
        time.sleep(0.2)
    return sim, f"127.0.0.1:{port}"


@pytest.fixture(scope="module")
def layouts(
    expositions: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, Layout]]:
    """Each layout's fleet scraped every second by a Prometheus with its rule profile."""
    sims: list[subprocess.Popen[bytes]] = []
    servers: list[Server] = []
    out: dict[str, Layout] = {}
    try:
        for layout in LAYOUTS:
            workdir = tmp_path_factory.mktemp(layout)
            sim, address = _simulate(layout, workdir, expositions)
            sims.append(sim)
            rules = ROOT / "alert_rules" / ("" if layout == "sidecar" else layout)
            config = fleet.prometheus_config(
                workdir / "targets.json",
                at_global_interval(
                    [rules / "recording_rules.yaml", rules / "alerts.yaml"], workdir / "rules"
                ),
                workdir / "nodes.json" if layout != "sidecar" else None,
            )
            config["global"] = {
                "scrape_interval": "1s",
                "scrape_timeout": "1s",
                "evaluation_interval": "1s",
            }
            server = processes.start_prometheus(workdir, config)
            servers.append(server)
            out[layout] = Layout(layout, server, f"http://{address}/pods/{POD.index}/metrics")
        yield out
    finally:
        for server in servers:
            server.stop()
        for sim in sims:
            processes.stop_process(sim)


def _compare(answers: dict[str, dict[Key, bool]]) -> list[str]:
    """Queries with data in one layout and none in another, but the listed exceptions."""
    problems = []
    for key in answers["sidecar"]:
        empty = frozenset(layout for layout in LAYOUTS if not answers[layout][key])
        if not empty or len(empty) == len(LAYOUTS):
            continue
        expected = EXCEPTIONS.get(key, (frozenset(), ""))[0]
        if empty != expected:
            problems.append(f"{' / '.join(key)}: no data in {sorted(empty)}")
    return problems


def test_every_dashboard_query_has_data_in_every_layout(layouts: dict[str, Layout]) -> None:
    queries = {layout: _queries(layout) for layout in LAYOUTS}
    keys = {layout: [q.key for q in found] for layout, found in queries.items()}
    assert keys["node"] == keys["sidecar"] == keys["dcgm"], "the layouts' dashboards differ"
    assert set(EXCEPTIONS) <= set(keys["sidecar"]), "stale EXCEPTIONS keys"

    deadline = time.monotonic() + DEADLINE_S
    while True:
        answers = {
            layout: _answers(layouts[layout].prometheus, queries[layout]) for layout in LAYOUTS
        }
        problems = _compare(answers)
        # The rest shows once the windows hold two scrapes and the records read records.
        nowhere = {k for k in keys["sidecar"] if not any(answers[lay][k] for lay in LAYOUTS)}
        if (nowhere == NOWHERE.keys() and not problems) or time.monotonic() > deadline:
            break
        time.sleep(2.0)
    assert not problems, "queries empty in some layouts only:\n" + "\n".join(problems)
    assert nowhere == NOWHERE.keys(), (
        f"empty in every layout but not listed: {sorted(nowhere - NOWHERE.keys())}; "
        f"listed but with data: {sorted(NOWHERE.keys() - nowhere)}"
    )
    for key, (empty, reason) in EXCEPTIONS.items():
        assert reason
        for layout in LAYOUTS:
            assert answers[layout][key] == (layout not in empty), f"{key} in {layout}: stale"


def test_the_post_mortem_plots_the_same_in_every_layout(layouts: dict[str, Layout]) -> None:
    """The plots of ``diagnose --report`` for the pod: every series in every layout (the
    dcgm layout keeps no driver samples, so no idle and busy shares of them)."""
    scope = {"namespace": POD.namespace, "pod": POD.pod, "instance": POD.instance}
    scope["job"] = fleet.JOB
    missing: dict[str, set[str]] = {}
    deadline = time.monotonic() + DEADLINE_S
    while True:
        for name, layout in layouts.items():
            missing[name] = set(asyncio.run(_plots(layout, scope)))
        if not any(missing.values()) or time.monotonic() > deadline:
            break
        time.sleep(2.0)
    assert missing == {"sidecar": set(), "node": set(), "dcgm": set()}
    assert sum(len(p.series) for p in PANELS) >= 15


async def _plots(layout: Layout, scope: dict[str, str]) -> list[tuple[str, str]]:
    """(panel, query) of each plot series without data."""
    from exporter.backends.http import make_session  # noqa: PLC0415
    from exporter.diagnose.datasources import PrometheusBackend  # noqa: PLC0415

    findings: list[Finding] = []
    async with make_session() as session:
        backend = PrometheusBackend(session, layout.prometheus.url, 10.0, time.time())
        found = await timeline(backend, layout.cfg, findings, time.time(), 120.0, scope=scope)
    assert [p.spec.key for p in found.panels] == [p.key for p in PANELS]
    # A query names the layout's own record: compare the panels' series by their names.
    return [
        (p.spec.key, s.name)
        for p in found.panels
        for s in p.spec.series
        if any(query.startswith(s.signal.record(layout.cfg) + "{") for query in p.missing)
    ]


def test_diagnose_target_of_a_node_layout_pod_says_what_it_cannot_see(
    layouts: dict[str, Layout],
) -> None:
    """The pod's sidecar, sampled by ``diagnose --target``: with NVML (sidecar layout) and
    without (node layout). The signatures that read the GPUs are not evaluated there, with the
    reason; every other one comes out the same."""
    reports = {
        name: asyncio.run(
            diagnose_target(
                layouts[name].pod_url,
                SiteConfig(),
                span=2.0,
                interval=1.0,
                timeout=5.0,
                margin=0.2,
            )
        )
        for name in ("sidecar", "node")
    }
    blind = gpu_readers(SiteConfig())
    node, side = reports["node"], reports["sidecar"]
    assert {a for a, why in node.not_evaluated.items() if why == NO_GPUS} <= blind
    assert "InferenceGPUStarvedQueueGrowing" in node.not_evaluated
    assert not any(why == NO_GPUS for why in side.not_evaluated.values())

    def status(report: Any, alert: str) -> str:
        if alert in report.not_evaluated:
            return "not evaluated"
        if alert in report.no_data:
            return "no data"
        held = {f.status for f in report.findings if f.sig.alert == alert}
        return ",".join(sorted(held)) or "checked"

    for alert in sorted({sig.alert for sig in all_signatures(SiteConfig())} - blind):
        assert status(node, alert) == status(side, alert), alert


def test_the_landing_page_of_an_nvml_less_sidecar_names_who_reads_its_gpus() -> None:
    """The sidecar the chart's node mode runs (no NVML; the chart passes the node's name):
    its landing page says which node agent reads its GPUs, and names the rule pack's signal
    of each value it charts."""
    sidecar = ExporterProcess(
        [
            "--web.listen-address=127.0.0.1:0",
            "--no-collector.nvml",
            "--gpu.read-by=the node agent on gpu-node-7",
            "--engine.url=http://127.0.0.1:9/metrics",
        ]
    )
    charted = 'data-series="inference_cpu_softirq_hottest_core_ratio"'

    def scraped() -> bool:
        sidecar.get("/metrics")
        return charted in sidecar.get("/")[2].decode()

    try:
        sidecar.wait_ready()
        sidecar.wait_for(scraped, step=0.5)
        status, _, body = sidecar.get("/")
    finally:
        sidecar.close()
    page = body.decode()
    assert status == 200
    assert '<p id="gpus"><strong>GPUs:</strong> not read here' in page
    assert "the node agent on gpu-node-7 reads them" in page
    # its last minutes (the node's softirq load here: no engine), with the signal of each
    row = page.split('data-series="inference_cpu_softirq_hottest_core_ratio">', 1)[1]
    row = row.split("</tr>", 1)[0]
    assert f"<code>{SOFTIRQ_HOTTEST_CORE.record(SiteConfig())}</code>" in row
    assert 'data-series="inference_gpu_utilization_ratio"' not in page


def test_a_sidecar_that_reads_its_gpus_refuses_to_say_another_does() -> None:
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "--web.listen-address=127.0.0.1:0",
            "--gpu.read-by=the node agent on x",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        cwd=ROOT,
    )
    assert result.returncode == 2
    assert result.stderr.strip().endswith(
        "--gpu.read-by: this sidecar reads its GPUs itself (the nvml collector is on)"
    ), result.stderr
    assert result.stderr.count("\n") == 1
