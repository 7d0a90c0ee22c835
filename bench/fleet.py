"""The rule pack at fleet scale: a real Prometheus scraping N simulated sidecars.

A *fleet* is N GPUs in pods of 8, 4, 2 and 1 GPUs (``--mix default``: half the GPUs in 8-GPU
pods, a quarter in 4-GPU pods, 15 % in 2-GPU and 10 % in 1-GPU pods, 3.3 GPUs per pod on
average; ``--mix 1``: every pod one GPU; ``--mix 1+2``: half the GPUs in 2-GPU pods), packed
onto 8-GPU nodes. Every pod is one sidecar: the exposition the real CLI serves at its defaults,
captured once at start-up from ``python -m exporter.cli`` on an 8-GPU synthetic replay trace,
reading a fake vLLM engine that serves the full vLLM fixture (histograms and all, normalised by
the sidecar) and watching two processes named like vLLM's. Each pod serves that exposition with
its own GPU count (the lines of GPUs it lacks dropped), its own GPU UUIDs, counters that grow at
the captured rate times a per-pod factor and gauges that move every scrape, so Prometheus stores
and compresses what a real fleet sends.

Three layouts (``--layout``; several are measured side by side):

* ``sidecar`` - today's: each pod's sidecar reads its own GPUs through NVML; the pack's
  ``sidecar`` profile (``alert_rules/``).
* ``node`` - the chart's node mode: the sidecars run without NVML (captured with
  ``--no-collector.nvml``), and one node agent per 8-GPU node (captured with the chart's agent
  flags: ``nvml``, ``cpu`` and ``podresources`` against the tests' fake kubelet, the real
  PodResources protocol) exports the node's GPUs once, each GPU's series filed under the pod
  that holds it (``namespace``, ``pod``, ``container``) and ``inference_gpu_pod_info`` naming
  it; the agents are a second job scraped with ``honor_labels`` (the chart's second PodMonitor)
  and the pack's ``node`` profile (``alert_rules/node/``) reads them by pod.

Disaggregated fleets (``--pool-pods-per-model``): ``--pool-models`` models, each served by that
many 1-GPU pods, half ``prefill`` and half ``decode`` (the sidecar captured with
``--engine.role`` over vLLM's fixture plus the NixlConnector families of the hand-written NIXL
fixtures), each model in its own namespace; each is measured by two Prometheus side by side,
one with the full pack and one without the ``pool`` family (its record group and its alerts).

The pods are *targets* of one job, as a PodMonitor makes them: one simulator process per fleet
answers ``/pods/<i>/metrics`` (and ``/nodes/<j>/metrics``) on one loopback port, and a file_sd
target list gives each target its ``__metrics_path__`` and the labels the Prometheus Operator
sets (``namespace``, ``pod``, ``container``, ``endpoint``, ``instance``, ``job``). One target
with ``honor_labels`` would be cheaper to serve but not what Prometheus does for a fleet: a
scrape loop, a staleness tracker, ``up`` and the ``scrape_*`` series per target, and the rules'
per-target aggregations over series that really belong to different targets.

Prometheus (Debian's 2.42) scrapes every 15 s (the chart's PodMonitor default) and evaluates
every 30 s (the Prometheus Operator's default). Every fleet of a batch (one ``--gpus`` size with
its layouts and mixes; the disaggregated fleets join the first) runs at once, each with its own
simulator and Prometheus, so all of them meet the same machine. After a warm-up that fills the
longest window the records read (10 min), the run samples for ``--measure`` minutes: each rule
group's ``prometheus_rule_group_last_duration_seconds`` and each rule's evaluation time from
``/api/v1/rules`` (one value per evaluation, medians reported), the active series
(``prometheus_tsdb_head_series``; the fleet's own series by job, the pack's recorded series and
the raw series the pack's selectors read, counted by queries), Prometheus's RSS (median of
samples) and CPU (cores, over the measuring window).

    python bench/fleet.py run --gpus 1000 5000 10000 [--warmup 11] [--measure 5]
    python bench/fleet.py run --gpus 800 --layout sidecar node --mix 1 1+2 \
        --pool-pods-per-model 4 16 64 --pool-models 8
    python bench/fleet.py serve --gpus 1000 --port 9400 --targets /tmp/targets.json

``run`` writes ``bench/results/fleet-<UTC time>.json`` and ``bench/results/fleet-latest.json``;
``python bench/fleet.py report`` prints the tables of ``docs/scale.md`` from the latest.
This is a benchmark: the test suite checks its fleets and expositions
(``tests/test_fleet_bench.py``), not its numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime as dt
import hashlib
import json
import math
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))
sys.path.insert(0, str(ROOT / "tests"))

import prom_profile  # noqa: E402
from common import (  # noqa: E402
    FIXTURES,
    MIB,
    RESULTS,
    EngineServer,
    exporter,
    free_port,
    machine,
)
from support.synthetic import write_synthetic_trace  # noqa: E402

from exporter.lab.layouts import AGENT_COLLECTORS, DCGM_JOB  # noqa: E402
from exporter.lab.processes import stop_process  # noqa: E402
from exporter.signatures.signals.signal_groups import POOL_GROUP  # noqa: E402

SCRAPE_INTERVAL_S = 15
EVALUATION_INTERVAL_S = 30
# The longest CPU profile taken of each Prometheus in the measuring window.
PROFILE_S = 180
# Memory the machine keeps free: below it the run stops.
MIN_AVAILABLE = 1.5 * 1024**3
JOB = "llm/inference-bottleneck-exporter"
NAMESPACES = 20
# GPUs per pod and the share of the fleet's GPUs in pods of that size.
POD_MIX = ((8, 0.50), (4, 0.25), (2, 0.15), (1, 0.10))
MIXES = {"default": POD_MIX, "1": ((1, 1.0),), "1+2": ((2, 0.5), (1, 0.5))}
NODE_GPUS = 8
# The node layout's agents: a DaemonSet in its own namespace, scraped with honor_labels.
NODE_JOB = "monitoring/inference-bottleneck-exporter-node"
ROLES = ("prefill", "decode")
# dcgm-exporter (the dcgm layout): a DaemonSet of the GPU operator, scraped with honor_labels,
# as the lab's (exporter.lab.layouts.DCGM_JOB).
LAYOUTS = ("sidecar", "node", "dcgm")
RULES = ROOT / "alert_rules"
CHART_VALUES = ROOT / "helm" / "inference-bottleneck-exporter" / "values.yaml"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")
_GPU = re.compile(r'\bgpu="(\d+)"')
_UUID = re.compile(r'uuid="(GPU-[^"]+)"')
# Gauges that hold still in a real sidecar: identities, limits, capacities, start times, how
# many pods hold a GPU (a count: moved by 10 %, a GPU of one pod would read as shared), a bit
# mask (moved, its bits would read as other reasons).
_CONSTANT = (
    "_info",
    "_gpu_pods",
    "_start_time_seconds",
    "_max_fds",
    "_memory_total_bytes",
    "_cpu_online",
    "_probe_tokens",
    "_processes",
    "_throttle_reasons",
)


# --- the fleet ---------------------------------------------------------------------------------


def pod_sizes(gpus: int, mix: str = "default") -> list[int]:
    """GPUs per pod for a fleet of ``gpus``, in a fixed interleaved order (deterministic).

    ``mix``: ``default`` (:data:`POD_MIX`), ``1`` (every pod one GPU) or ``1+2`` (half the
    GPUs in 2-GPU pods, half in 1-GPU pods)."""
    # One unit holds the mix exactly; the default's 80 GPUs: 5x8, 5x4, 6x2, 8x1 (24 pods).
    counts = {size: round(share * 80 / size) for size, share in MIXES[mix]}
    unit: list[int] = []
    while any(counts.values()):
        for size, _ in MIXES[mix]:
            if counts[size]:
                unit.append(size)
                counts[size] -= 1
    out: list[int] = []
    total = 0
    while total < gpus:
        for size in unit:
            if total >= gpus:
                break
            taken = min(size, gpus - total)
            out.append(taken)
            total += taken
    return out


@dataclass(frozen=True)
class PodIdentity:
    index: int
    gpus: int
    namespace: str
    pod: str
    instance: str
    node: int = 0  # the 8-GPU node it runs on
    first_gpu: int = 0  # the node's GPU index of its first GPU
    template: str = "sidecar"  # which captured exposition it serves
    model: str = ""  # the model label its engine series carry ("": the captured one)

    def target(self, address: str) -> dict[str, Any]:
        """The file_sd entry: what a PodMonitor's relabelling gives the target."""
        return {
            "targets": [address],
            "labels": {
                "__metrics_path__": f"/pods/{self.index}/metrics",
                "namespace": self.namespace,
                "pod": self.pod,
                "container": "exporter",
                "endpoint": "metrics",
                "instance": self.instance,
                "job": JOB,
            },
        }


@dataclass(frozen=True)
class NodeIdentity:
    """One node agent (the node layout's DaemonSet pod) and the pods on its node."""

    index: int
    pods: tuple[PodIdentity, ...]

    @property
    def instance(self) -> str:
        return f"10.250.{(self.index >> 8) & 255}.{self.index & 255}:10960"

    def target(self, address: str, layout: str = "node") -> dict[str, Any]:
        """The file_sd entry of the node's agent (``node``) or dcgm-exporter (``dcgm``): its
        own pod's labels (``honor_labels`` keeps the holders' namespace, pod and container that
        ``inference_gpu_pod_info``, or dcgm-exporter's pod mapping, carries)."""
        dcgm = layout == "dcgm"
        return {
            "targets": [address],
            "labels": {
                "__metrics_path__": f"/nodes/{self.index}/metrics",
                "namespace": "gpu-operator" if dcgm else "monitoring",
                "pod": f"{'nvidia-dcgm-exporter' if dcgm else 'ibe-node'}-{self.index:05d}",
                "container": "nvidia-dcgm-exporter" if dcgm else "inference-bottleneck-exporter",
                "endpoint": "metrics",
                "instance": self.instance.replace(":10960", ":9400") if dcgm else self.instance,
                "job": DCGM_JOB if dcgm else NODE_JOB,
            },
        }

    def holder(self, gpu: int) -> PodIdentity | None:
        for pod in self.pods:
            if pod.first_gpu <= gpu < pod.first_gpu + pod.gpus:
                return pod
        return None


def _address(i: int) -> str:
    return f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}:10960"


def _on_nodes(sizes: Sequence[int]) -> list[tuple[int, int]]:
    """(node, first GPU) of each pod: first fit, largest pods first, on 8-GPU nodes (the
    sizes divide 8, so every node but the last is full)."""
    free: list[int] = []
    place: dict[int, tuple[int, int]] = {}
    for i in sorted(range(len(sizes)), key=lambda k: (-sizes[k], k)):
        node = next((n for n, left in enumerate(free) if left >= sizes[i]), len(free))
        if node == len(free):
            free.append(NODE_GPUS)
        place[i] = (node, NODE_GPUS - free[node])
        free[node] -= sizes[i]
    return [place[i] for i in range(len(sizes))]


def fleet(gpus: int, mix: str = "default") -> list[PodIdentity]:
    sizes = pod_sizes(gpus, mix)
    pods = []
    for i, (size, (node, first)) in enumerate(zip(sizes, _on_nodes(sizes), strict=True)):
        namespace = f"llm-{i % NAMESPACES:02d}"
        model = {8: "llama-70b", 4: "mixtral", 2: "llama-8b-tp2", 1: "llama-8b"}[size]
        pods.append(PodIdentity(i, size, namespace, f"{model}-{i:05d}", _address(i), node, first))
    return pods


def pool_fleet(models: int, pods_per_model: int) -> list[PodIdentity]:
    """Disaggregated serving: ``models`` models, each served by ``pods_per_model`` 1-GPU
    pods, half prefill and half decode, each model in its own namespace (one pool per model
    and role)."""
    pods = []
    for m in range(models):
        for k in range(pods_per_model):
            i = len(pods)
            role = ROLES[k % 2]
            name = f"model-{m:02d}"
            pods.append(
                PodIdentity(
                    i,
                    1,
                    f"llm-{m:02d}",
                    f"{name}-{role}-{k // 2:03d}",
                    _address(i),
                    i // NODE_GPUS,
                    i % NODE_GPUS,
                    template=role,
                    model=f"org/{name}",
                )
            )
    return pods


def nodes(pods: Sequence[PodIdentity]) -> list[NodeIdentity]:
    by_node: dict[int, list[PodIdentity]] = {}
    for pod in pods:
        by_node.setdefault(pod.node, []).append(pod)
    return [NodeIdentity(n, tuple(by_node[n])) for n in sorted(by_node)]


# --- the exposition template --------------------------------------------------------------------


def _unit(seed: str) -> float:
    """A deterministic number in [0, 1) from a string."""
    digest = hashlib.blake2b(seed.encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big") / 2**64


@dataclass
class Line:
    """One sample line of the captured exposition."""

    head: str  # name and label block, up to the space before the value
    value: float
    # "counter" (cumulative: counters and histograms), "flag" (constant), "clock" (a Unix
    # time that follows the clock), "gauge" (moves every scrape)
    kind: str
    gpu: int | None
    rate: float = 0.0  # per second, counters


@dataclass
class Template:
    """The captured exposition, split into comment blocks and sample lines."""

    lines: list[str | Line] = field(default_factory=list)
    age_s: float = 1.0

    @classmethod
    def parse(cls, text: str, age_s: float) -> Template:
        types: dict[str, str] = {}
        out = cls(age_s=max(age_s, 1.0))
        for raw in text.splitlines():
            if not raw:
                continue
            if raw.startswith("#"):
                parts = raw.split()
                if len(parts) >= 4 and parts[1] == "TYPE":
                    types[parts[2]] = parts[3]
                out.lines.append(raw)
                continue
            match = _SAMPLE.match(raw)
            if match is None:
                raise ValueError(f"cannot read exposition line {raw!r}")
            name, labels, value = match[1], match[2] or "", float(match[3])
            family = name
            for suffix in ("_bucket", "_count", "_sum", "_created"):
                if name.endswith(suffix) and name[: -len(suffix)] in types:
                    family = name[: -len(suffix)]
            kind = types.get(family, "gauge")
            if kind in ("counter", "histogram", "summary"):
                cls_kind = "counter"
            elif name.endswith("_timestamp_seconds"):
                cls_kind = "clock"
            elif name.endswith(_CONSTANT) or (
                value in (0.0, 1.0) and name.endswith(("_up", "_success", "_active"))
            ):
                cls_kind = "flag"
            else:
                cls_kind = "gauge"
            gpu = _GPU.search(labels)
            line = Line(f"{name}{labels}", value, cls_kind, int(gpu[1]) if gpu else None)
            if cls_kind == "counter":
                line.rate = value / out.age_s
            out.lines.append(line)
        return out

    def uuids(self) -> list[str]:
        found: list[str] = []
        for line in self.lines:
            if isinstance(line, Line):
                match = _UUID.search(line.head)
                if match and match[1] not in found:
                    found.append(match[1])
        return found


_MODEL = re.compile(r'\bmodel="[^"]*"')
_HOLDER = re.compile(r'\b(namespace|pod|container)="[^"]*"')
Rewrite = Callable[[Line], "str | None"]


class Body:
    """One target's exposition at any time ``t`` (seconds since the simulator started): the
    template's lines that ``rewrite`` keeps, with the heads it gives them."""

    def __init__(self, template: Template, seed: str, rewrite: Rewrite) -> None:
        # Targets differ in load by up to 20 %: a healthy fleet, GPUs mostly 50-90 % busy.
        factor = 0.8 + 0.2 * _unit(f"rate/{seed}")
        statics: list[str] = []
        pending = ""
        self.values: list[tuple[float, float, int, float]] = []  # (v0, rate, kind, phase)
        for entry in template.lines:
            if isinstance(entry, str):
                pending += entry + "\n"
                continue
            head = rewrite(entry)
            if head is None:
                continue
            statics.append(pending + head + " ")
            pending = "\n"
            kind = {"counter": 0, "flag": 1, "gauge": 2, "clock": 3}[entry.kind]
            phase = 2 * math.pi * _unit(f"{seed}/{head}")
            self.values.append((entry.value, entry.rate * factor, kind, phase))
        self.statics = statics
        self.tail = pending

    def render(self, t: float) -> bytes:
        parts: list[str] = []
        append = parts.append
        now = time.time()
        for static, (v0, rate, kind, phase) in zip(self.statics, self.values, strict=True):
            append(static)
            if kind == 0:
                append(repr(v0 + rate * t))
            elif kind == 1:
                append(repr(v0))
            elif kind == 3:
                append(repr(now))
            else:
                # Gauges move every scrape (+-10 %), as utilisation, power and clocks do.
                append(repr(v0 * (1.0 + 0.1 * math.sin(t / 97.0 + phase))))
        append(self.tail)
        return "".join(parts).encode()


def _uuid_of(owner: int, k: int) -> str:
    return f"GPU-{owner:08x}-{k:04x}-4{owner % 4096:03x}-8000-{k:012x}"


#: What the simulated engines' waiting queues show (``--state``). ``healthy``: none waits (a fleet
#: that keeps up; no signature holds). ``starved``: the captured fixture's 7 waiting requests,
#: moving +-10 % with every gauge, beside the replayed GPUs' utilisation under 60 %: every pod
#: starved with a queue, and half of them growing at any time - InferenceGPUStarvedQueueGrowing
#: pending on half the fleet, its annotations' queries run for each such pod every evaluation
#: (the only state until 2026-12-06, whose docstring called the fleet healthy).
STATES = ("healthy", "starved")
_QUEUE_DEPTH = "inference_queue_depth{"


def in_state(template: Template, state: str) -> Template:
    """A sidecar's template with its engine's waiting queue as ``state`` has it
    (:data:`STATES`): none waiting where healthy, the captured queue where starved. Once per
    template, not per pod."""
    if state not in STATES:
        raise ValueError(f"unknown fleet state {state!r}: one of {', '.join(STATES)}")
    if state == "starved":
        return template
    return Template(
        [
            replace(e, value=0.0, kind="flag")
            if isinstance(e, Line) and e.head.startswith(_QUEUE_DEPTH)
            else e
            for e in template.lines
        ],
        template.age_s,
    )


def pod_body(template: Template, pod: PodIdentity) -> Body:
    """A sidecar's exposition: the template's GPUs cut to the pod's, with its own UUIDs (none
    where the sidecar runs without NVML) and its model (the template already in the fleet's
    state: :func:`in_state`)."""
    uuids = {old: _uuid_of(pod.index, k) for k, old in enumerate(template.uuids())}

    def rewrite(line: Line) -> str | None:
        if line.gpu is not None and line.gpu >= pod.gpus:
            return None
        head = line.head
        match = _UUID.search(head)
        if match:
            head = head.replace(match[1], uuids[match[1]])
        if pod.model:
            head = _MODEL.sub(f'model="{pod.model}"', head)
        return head

    return Body(template, str(pod.index), rewrite)


def node_body(template: Template, node: NodeIdentity) -> Body:
    """A node agent's exposition: its node's eight GPUs with their own UUIDs, each GPU's series
    filed under the pod that holds it (``namespace``, ``pod``, ``container``, as the agent's
    ``podresources`` collector has the ``nvml`` collector label them; empty for a GPU no pod
    holds), and its ``inference_gpu_pod_info`` naming that pod (dropped for a GPU no pod holds).

    The captured agent's GPUs are held by 1-GPU pods from its start, so its counters are each
    pod's own already, as the agent counts them from a pod's start on its GPU."""
    uuids = {old: _uuid_of(1_000_000 + node.index, k) for k, old in enumerate(template.uuids())}

    def rewrite(line: Line) -> str | None:
        head = line.head
        match = _UUID.search(head)
        if match:
            head = head.replace(match[1], uuids[match[1]])
        if line.gpu is None:
            return head
        holder = node.holder(line.gpu)
        if holder is None and head.startswith(("inference_gpu_pod_info{", "inference_gpu_pods{")):
            return None
        labels = (
            {"namespace": holder.namespace, "pod": holder.pod, "container": "engine"}
            if holder is not None
            else dict.fromkeys(("namespace", "pod", "container"), "")
        )
        return _HOLDER.sub(lambda m: f'{m[1]}="{labels[m[1]]}"', head)

    return Body(template, f"node/{node.index}", rewrite)


# dcgm-exporter's fields per GPU (hand-written: the gauges and counters of NVIDIA/dcgm-exporter
# etc/dcp-metrics-included.csv at commit 084a245dc715966ea2c72b00fde311b6795a6ffb, plus
# DCGM_FI_PROF_SM_ACTIVE, commented out there, which the pack's dcgm profile reads), with
# values of a busy H100: (field, type, value). Counters are given as their value after
# DCGM_AGE_S seconds, so they grow at value / age.
DCGM_FIELDS = (
    ("DCGM_FI_DEV_SM_CLOCK", "gauge", 1755.0),
    ("DCGM_FI_DEV_MEM_CLOCK", "gauge", 2619.0),
    ("DCGM_FI_DEV_MEMORY_TEMP", "gauge", 47.0),
    ("DCGM_FI_DEV_GPU_TEMP", "gauge", 55.0),
    ("DCGM_FI_DEV_POWER_USAGE", "gauge", 430.0),
    ("DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION", "counter", 430.0 * 1000 * 1000),  # mJ
    ("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "counter", 0.0),
    ("DCGM_FI_DEV_GPU_UTIL", "gauge", 74.0),
    ("DCGM_FI_DEV_MEM_COPY_UTIL", "gauge", 41.0),
    ("DCGM_FI_DEV_ENC_UTIL", "gauge", 0.0),
    ("DCGM_FI_DEV_DEC_UTIL", "gauge", 0.0),
    ("DCGM_FI_DEV_XID_ERRORS", "gauge", 0.0),
    ("DCGM_FI_DEV_FB_FREE", "gauge", 5430.0),
    ("DCGM_FI_DEV_FB_USED", "gauge", 75650.0),
    ("DCGM_FI_DEV_FB_RESERVED", "gauge", 567.0),
    ("DCGM_FI_DEV_RETIRED_SBE", "counter", 0.0),
    ("DCGM_FI_DEV_RETIRED_DBE", "counter", 0.0),
    ("DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL", "counter", 0.0),
    ("DCGM_FI_DEV_VGPU_LICENSE_STATUS", "gauge", 0.0),
    ("DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "counter", 0.0),
    ("DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS", "counter", 0.0),
    ("DCGM_FI_DEV_ROW_REMAP_FAILURE", "gauge", 0.0),
    ("DCGM_FI_PROF_GR_ENGINE_ACTIVE", "gauge", 0.71),
    ("DCGM_FI_PROF_SM_ACTIVE", "gauge", 0.58),
    ("DCGM_FI_PROF_PIPE_TENSOR_ACTIVE", "gauge", 0.22),
    ("DCGM_FI_PROF_DRAM_ACTIVE", "gauge", 0.47),
    ("DCGM_FI_PROF_PCIE_TX_BYTES", "gauge", 2.1e8),
    ("DCGM_FI_PROF_PCIE_RX_BYTES", "gauge", 9.6e8),
)
DCGM_AGE_S = 1000.0
_DCGM_HOLDER = re.compile(r'\b(Hostname|UUID|container|namespace|pod)="[^"]*"')


def dcgm_template() -> Template:
    """One dcgm-exporter's exposition for an 8-GPU node, its labels in dcgm-exporter's order;
    the holders (``namespace``, ``pod``, ``container``) are set per node (:func:`dcgm_body`)."""
    lines: list[str] = []
    for name, kind, value in DCGM_FIELDS:
        lines += [f"# HELP {name} {name}.", f"# TYPE {name} {kind}"]
        for k in range(NODE_GPUS):
            labels = (
                f'gpu="{k}",UUID="GPU-{k}",pci_bus_id="00000000:{0x18 + k:02X}:00.0",'
                f'device="nvidia{k}",modelName="NVIDIA H100 80GB HBM3",Hostname="node",'
                'DCGM_FI_DRIVER_VERSION="570.124.06",container="",namespace="",pod=""'
            )
            lines.append(f"{name}{{{labels}}} {value!r}")
    return Template.parse("\n".join(lines) + "\n", DCGM_AGE_S)


def dcgm_body(template: Template, node: NodeIdentity) -> Body:
    """A node's dcgm-exporter: its eight GPUs with their own UUIDs, each labelled with the pod
    holding it (empty labels, which Prometheus drops, for a GPU no pod holds)."""

    def rewrite(line: Line) -> str | None:
        gpu = line.gpu if line.gpu is not None else -1
        holder = node.holder(gpu)
        labels = {
            "Hostname": f"node-{node.index:05d}",
            "UUID": _uuid_of(1_000_000 + node.index, gpu),
            "container": "engine" if holder else "",
            "namespace": holder.namespace if holder else "",
            "pod": holder.pod if holder else "",
        }
        return _DCGM_HOLDER.sub(lambda m: f'{m[1]}="{labels[m[1]]}"', line.head)

    return Body(template, f"dcgm/{node.index}", rewrite)


# --- capture ------------------------------------------------------------------------------------


@contextlib.contextmanager
def engine_lookalikes() -> Iterator[None]:
    """Two idle processes whose command lines the sidecar's default --process.match takes for
    vLLM's (the API server and the engine core), so the process collector reports them."""
    procs = [
        subprocess.Popen(
            ["bash", "-c", f'exec -a "{argv0}" sleep 600'],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        for argv0 in ("vllm", "VLLM::EngineCore")
    ]
    try:
        yield
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(5)


# What each captured exposition must show before it is taken (a sidecar: the engine, its
# tokenizer probe and processes, and the H100's GPM series, which need two samples a period
# apart; a node agent: the GPUs and who holds them).
_SIDECAR_READY = (
    "inference_tokenizer_probe_tokens{",
    'inference_engine_up{engine="vllm"',
    "inference_engine_hottest_thread_cpu_ratio ",
)
_GPM_READY = ("inference_gpu_sm_active_ratio{",)
# The node agent's families that must show under a holder before its exposition is taken: a
# counter, the sampled histogram and the idle-energy counter, which the node profile's
# utilisation-share and energy records read by pod.
_HELD_FAMILIES = (
    "inference_gpu_busy_seconds_total",
    "inference_gpu_utilization_samples_count",
    "inference_gpu_idle_energy_joules_total",
)


@dataclass(frozen=True)
class Capture:
    """One exposition to capture: the engine body, the exporter's flags, what must show."""

    body: str  # a fixture under tests/fixtures/engines, or "vllm+nixl-<role>"
    args: tuple[str, ...] = ()
    nvml: bool = True
    ready: tuple[str, ...] = _SIDECAR_READY + _GPM_READY
    kubelet: bool = False


CAPTURES = {
    # today's sidecar: every collector at its defaults, NVML on the pod's GPUs
    "sidecar": Capture("vllm.txt"),
    # the node layout's sidecar: the same without NVML (the chart's --no-collector.nvml)
    "sidecar-nonvml": Capture("vllm.txt", ("--no-collector.nvml",), False, _SIDECAR_READY),
    # the node layout's agent: NVML on the node's GPUs, the host's CPU, the kubelet's answer
    "agent": Capture(
        "vllm.txt", AGENT_COLLECTORS, True, (*_GPM_READY, "inference_gpu_pod_info{"), True
    ),
    # disaggregated serving: vLLM's full exposition plus NixlConnector's, by role
    "prefill": Capture("vllm+nixl-prefill", ("--engine.role", "prefill")),
    "decode": Capture("vllm+nixl-decode", ("--engine.role", "decode")),
}


def disaggregated_body(role: str, workdir: Path) -> Path:
    """vLLM's full fixture with the NixlConnector families of the ``role``'s hand-written
    fixture appended (their model renamed to vLLM's fixture's, so both are one engine's)."""
    base = (FIXTURES / "vllm.txt").read_text()
    model = re.search(r'model_name="([^"]*)"', base)
    assert model is not None
    nixl = (FIXTURES / f"vllm-nixl-{role}-handwritten.txt").read_text()
    lines = [
        re.sub(r'model_name="[^"]*"', f'model_name="{model[1]}"', line)
        for line in nixl.splitlines()
        if "vllm:nixl_" in line
    ]
    path = workdir / f"vllm-nixl-{role}.txt"
    path.write_text(base.rstrip("\n") + "\n" + "\n".join(lines) + "\n")
    return path


@contextlib.contextmanager
def _kubelet(trace: Path, workdir: Path, wanted: bool) -> Iterator[tuple[str, ...]]:
    """A kubelet's PodResources socket (the lab's stand-in, the real protocol) in which eight
    1-GPU pods hold the trace's eight GPUs: the flag that points the agent at it."""
    if not wanted:
        yield ()
        return
    from exporter.lab.layouts import Container, Kubelet, Pod, serve_kubelet  # noqa: PLC0415

    uuids = [gpu["uuid"] for gpu in json.loads(trace.read_text().splitlines()[0])["gpus"]]
    pods = [
        Pod("serving", f"vllm-{n}", [Container("vllm", {"nvidia.com/gpu": [uuid]})])
        for n, uuid in enumerate(uuids)
    ]
    kubelet = Kubelet(pods, {"nvidia.com/gpu": uuids})
    with serve_kubelet(kubelet, workdir / "kubelet.sock") as socket:
        yield (f"--podresources.socket={socket}",)


def capture(workdir: Path, kind: str = "sidecar", args: Sequence[str] = ()) -> tuple[str, float]:
    """The real CLI's exposition (8 GPUs, vLLM) as ``kind`` (:data:`CAPTURES`) serves it, and
    its uptime when it was read. ``args`` are added to the CLI's (a test's shorter poll
    intervals: the same series, sooner)."""
    spec = CAPTURES[kind]
    trace = workdir / "trace-8gpu.jsonl"
    if not trace.exists():
        write_synthetic_trace(trace, gpus=8, duration_s=120.0)
    if spec.body.startswith("vllm+nixl-"):
        body = disaggregated_body(spec.body.removeprefix("vllm+nixl-"), workdir)
    else:
        body = FIXTURES / spec.body
    with (
        engine_lookalikes(),
        EngineServer(body, workdir) as engine,
        _kubelet(trace, workdir, spec.kubelet) as kubelet_flags,
        exporter(
            trace if spec.nvml else None,
            engine.metrics_url,
            workdir,
            (*spec.args, *kubelet_flags, *args),
        ) as sidecar,
    ):
        deadline = time.monotonic() + 60
        headers = {"Accept": "text/plain;version=0.0.4"}
        while True:
            request = urllib.request.Request(sidecar.base + "/metrics", headers=headers)
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read().decode()
            processes = (
                # the agent: its GPUs' series filed under the pods holding them, in each
                # family the node profile reads by pod
                all(
                    re.search(rf'^{family}\{{[^}}]*pod="[^"]+"', text, re.M)
                    for family in _HELD_FAMILIES
                )
                if kind == "agent"
                else re.search(r"^inference_engine_processes [2-9]", text, re.M) is not None
            ) and (
                # the driver's utilisation samples counted (their shares read increases)
                not spec.nvml
                or re.search(r"^inference_gpu_utilization_samples_count\{.*\} [1-9]", text, re.M)
                is not None
            )
            ready = processes and all(marker in text for marker in spec.ready)
            if ready or time.monotonic() > deadline:
                break
            time.sleep(1)
        if not ready:
            missing = [marker for marker in spec.ready if marker not in text]
            raise RuntimeError(f"the {kind} exposition never showed {missing or 'processes'}")
        start = re.search(r"^process_start_time_seconds (\S+)$", text, re.M)
        age = time.time() - float(start[1]) if start else 10.0
    return text, age


# --- the simulator server -----------------------------------------------------------------------


def capture_all(workdir: Path) -> dict[str, dict[str, Any]]:
    """Every kind of exposition the fleets serve (:data:`CAPTURES`), captured now: kind -> its
    text and age, as ``--exposition`` files hold them."""
    captured: dict[str, dict[str, Any]] = {}
    for kind in CAPTURES:
        text, age = capture(workdir, kind)
        captured[kind] = {"text": text, "age_s": age}
    return captured


async def _serve(bodies: dict[str, list[Body]], port: int, ready: Path | None) -> None:
    from aiohttp import web  # noqa: PLC0415

    t0 = time.monotonic()

    async def metrics(request: web.Request) -> web.Response:
        kind, index = request.match_info["kind"], int(request.match_info["index"])
        served = bodies.get(kind, [])
        if not 0 <= index < len(served):
            raise web.HTTPNotFound()
        body = served[index].render(time.monotonic() - t0)
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/{kind}/{index}/metrics", metrics)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", port, backlog=4096)
    await site.start()
    if ready is not None:
        ready.write_text("ready\n")
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    await stop.wait()
    await runner.cleanup()


@dataclass(frozen=True)
class Scenario:
    """One simulated fleet: its size, pod mix, layout, or disaggregated pools."""

    gpus: int = 0
    layout: str = "sidecar"
    mix: str = "default"
    pool_models: int = 0  # > 0: a disaggregated fleet (pool_fleet) instead of ``gpus``
    pods_per_model: int = 0
    state: str = "healthy"  # what the engines' queues show (STATES)

    @property
    def name(self) -> str:
        suffix = "" if self.state == "healthy" else f"-{self.state}"
        if self.pool_models:
            return f"pool-{self.pool_models}x{self.pods_per_model}{suffix}"
        return f"{self.layout}-{self.gpus}-mix{self.mix}{suffix}"

    def pods(self) -> list[PodIdentity]:
        if self.pool_models:
            return pool_fleet(self.pool_models, self.pods_per_model)
        return fleet(self.gpus, self.mix)

    def agents(self) -> list[NodeIdentity]:
        """The per-node exporters: the node agents (``node``) or dcgm-exporters (``dcgm``)."""
        return nodes(self.pods()) if self.layout in ("node", "dcgm") else []

    def args(self) -> list[str]:
        return [
            "--gpus",
            str(self.gpus),
            "--layout",
            self.layout,
            "--mix",
            self.mix,
            "--pool-models",
            str(self.pool_models),
            "--pods-per-model",
            str(self.pods_per_model),
            "--state",
            self.state,
        ]


def _templates(args: argparse.Namespace, workdir: Path) -> dict[str, Template]:
    """The captured expositions by kind, from ``--exposition`` (JSON: kind -> text and age,
    or one ``{"text", "age_s"}``, the sidecar's) or captured now."""
    if args.exposition:
        data = json.loads(Path(args.exposition).read_text())
        if "text" in data:
            data = {"sidecar": data}
    else:
        data = capture_all(workdir)
    return {kind: Template.parse(d["text"], d["age_s"]) for kind, d in data.items()}


def serve(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="fleet-capture-"))
    scenario = Scenario(
        args.gpus, args.layout, args.mix, args.pool_models, args.pods_per_model, args.state
    )
    templates = _templates(args, workdir)
    pods, agents = scenario.pods(), scenario.agents()
    sidecar = "sidecar-nonvml" if scenario.layout in ("node", "dcgm") else "sidecar"
    if scenario.layout == "dcgm":
        per_node = [dcgm_body(dcgm_template(), node) for node in agents]
    else:
        per_node = [node_body(templates["agent"], node) for node in agents]
    names = {sidecar if pod.template == "sidecar" else pod.template for pod in pods}
    stated = {name: in_state(templates[name], scenario.state) for name in names}
    bodies = {
        "pods": [
            pod_body(stated[sidecar if pod.template == "sidecar" else pod.template], pod)
            for pod in pods
        ],
        "nodes": per_node,
    }
    address = f"127.0.0.1:{args.port}"
    Path(args.targets).write_text(json.dumps([pod.target(address) for pod in pods]))
    if args.node_targets:
        entries = [a.target(address, scenario.layout) for a in agents]
        Path(args.node_targets).write_text(json.dumps(entries))
    print(f"fleet {scenario.name}: {len(pods)} pods, {len(agents)} node agents on {address}")
    asyncio.run(_serve(bodies, args.port, Path(args.ready) if args.ready else None))
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


# --- Prometheus ---------------------------------------------------------------------------------


def prometheus_config(
    targets: Path,
    rules: Sequence[Path],
    node_targets: Path | None = None,
    evaluation_interval_s: float = EVALUATION_INTERVAL_S,
) -> dict[str, Any]:
    scrape: list[dict[str, Any]] = [
        {"job_name": "fleet", "file_sd_configs": [{"files": [str(targets)]}]}
    ]
    if node_targets is not None:
        # The node agents' PodMonitor keeps the holders' labels (the chart's honorLabels).
        scrape.append(
            {
                "job_name": "fleet-node",
                "honor_labels": True,
                "file_sd_configs": [{"files": [str(node_targets)]}],
            }
        )
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "scrape_timeout": "10s",
            "evaluation_interval": f"{evaluation_interval_s:g}s",
        },
        "rule_files": [str(p) for p in rules],
        "scrape_configs": scrape,
    }


class Api:
    def __init__(self, base: str) -> None:
        self.base = base

    def get(self, path: str, **params: str) -> Any:
        url = self.base + path + ("?" + urllib.parse.urlencode(params) if params else "")
        with urllib.request.urlopen(url, timeout=120) as response:
            return json.loads(response.read())

    def text(self, path: str) -> str:
        with urllib.request.urlopen(self.base + path, timeout=60) as response:
            return str(response.read().decode())

    def scalar(self, query: str) -> float:
        result = self.get("/api/v1/query", query=query)["data"]["result"]
        return float(result[0]["value"][1]) if result else 0.0


def _metric_values(text: str, name: str) -> dict[str, float]:
    out = {}
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            head, value = line.rsplit(" ", 1)
            out[head] = float(value)
    return out


def _group_of(head: str) -> str:
    match = re.search(r'rule_group="[^"]*;([^"]+)"', head)
    return match[1] if match else head


def pack_selectors(rules: Sequence[Path]) -> list[str]:
    """The raw series selectors of the pack's rule expressions (inference_*, up), deduplicated."""
    found: list[str] = []
    pattern = re.compile(r"\b((?:inference_[a-z0-9_]+|up)(?![a-z0-9_:])(?:\{[^}]*\})?)")
    for path in rules:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                for selector in pattern.findall(rule["expr"]):
                    if selector not in found:
                        found.append(selector)
    return found


def raw_read(api: Api, selectors: Sequence[str]) -> int:
    """Series the pack's selectors select, each counted once.

    Per metric name, a selector without label matchers covers every other; the selectors that
    remain for one name in this pack (``le="0.05"`` / ``le="0.9"``, one ``reason=~``) are
    disjoint, so their counts add up."""
    by_name: dict[str, list[str]] = {}
    for selector in selectors:
        name = selector.split("{", 1)[0]
        by_name.setdefault(name, []).append(selector)
    total = 0
    for name, sels in by_name.items():
        bare = [s for s in sels if "{" not in s]
        chosen = bare[:1] if bare else sels
        for selector in chosen:
            total += int(api.scalar(f"count({selector})"))
        del name
    return total


def _rule_key(seen: list[str], group: str, name: str) -> str:
    """``group/name``, and ``group/name#n`` for the n-th rule after the first of that name in
    the group; ``seen`` holds the keys given so far and gets this one."""
    key = f"{group}/{name}"
    count = sum(1 for k in seen if k == key or k.startswith(key + "#"))
    if count:
        key += f"#{count}"
    seen.append(key)
    return key


def rule_costs(api: Api, rules: Sequence[Path], repeat: int = 3) -> dict[str, dict[str, float]]:
    """Each rule's expression as an instant query with ``stats=all``: the samples it reads
    (deterministic, whatever else the machine runs), the series it returns (what a record
    writes, or the alert instances), and the fastest of ``repeat`` evaluations."""
    out: dict[str, dict[str, float]] = {}
    for path in rules:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                key = _rule_key(list(out), group["name"], rule.get("record") or rule.get("alert"))
                best, samples, series = math.inf, 0.0, 0.0
                for _ in range(repeat):
                    data = api.get("/api/v1/query", query=rule["expr"], stats="all")["data"]
                    stats = data["stats"]
                    best = min(best, stats["timings"]["evalTotalTime"])
                    samples = stats["samples"]["totalQueryableSamples"]
                    series = len(data["result"])
                out[key] = {
                    "samples": samples,
                    "series": series,
                    "eval_ms": round(best * 1000, 2),
                }
    return out


@dataclass
class Sample:
    rss_mib: list[float] = field(default_factory=list)
    groups: dict[str, dict[float, float]] = field(default_factory=dict)
    rules: dict[str, dict[str, float]] = field(default_factory=dict)
    intervals: dict[str, float] = field(default_factory=dict)  # each group's, seconds


def _poll(api: Api, proc: psutil.Process, sample: Sample) -> None:
    text = api.text("/metrics")
    durations = _metric_values(text, "prometheus_rule_group_last_duration_seconds")
    stamps = _metric_values(text, "prometheus_rule_group_last_evaluation_timestamp_seconds")
    for head, seconds in durations.items():
        stamp_head = head.replace(
            "prometheus_rule_group_last_duration_seconds",
            "prometheus_rule_group_last_evaluation_timestamp_seconds",
        )
        stamp = stamps.get(stamp_head, 0.0)
        if stamp > 0:
            sample.groups.setdefault(_group_of(head), {})[stamp] = seconds
    seen: list[str] = []
    for group in api.get("/api/v1/rules")["data"]["groups"]:
        sample.intervals[group["name"]] = float(group.get("interval", 0.0))
        for rule in group["rules"]:
            # Rules of a group that share a name (the verdicts' holding records) are told apart
            # as rule_costs tells them: by their order in the group.
            key = _rule_key(seen, group["name"], rule.get("name", ""))
            sample.rules.setdefault(key, {})[rule["lastEvaluation"]] = rule["evaluationTime"]
    sample.rss_mib.append(proc.memory_info().rss / MIB)


def _median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else math.nan


@dataclass
class Running:
    processes: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def stop(self) -> None:
        for proc in reversed(self.processes):
            stop_process(proc, timeout=30)


@dataclass(frozen=True)
class Pack:
    """A rule pack as Prometheus loads it: its label and its rule files."""

    label: str
    files: tuple[Path, ...]
    record_interval: str = ""  # the record groups' own interval; "": the global one
    alert_interval: str = ""  # the alert groups' own interval; "": the global one; NO_ALERTS


def pack_of(directory: Path) -> Pack:
    return Pack(directory.name, (directory / "recording_rules.yaml", directory / "alerts.yaml"))


def family_alerts(family: str) -> set[str]:
    """The alerts of one signature family, from the catalogue."""
    from exporter.signatures.catalogue import all_signatures  # noqa: PLC0415
    from exporter.signatures.site import parse_config  # noqa: PLC0415

    return {s.alert for s in all_signatures(parse_config({}, "sidecar")) if s.family == family}


def without_family(pack: Pack, family: str, group: str, workdir: Path) -> Pack:
    """``pack`` without one signature family: its records' ``group`` and its alerts (copies
    of the files in ``workdir``)."""
    alerts = family_alerts(family)
    label = f"{pack.label}-without-{family}"
    out = workdir / label
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for path in pack.files:
        doc = yaml.safe_load(path.read_text())
        groups = []
        for g in doc["groups"]:
            if g["name"] == group:
                continue
            rules = [r for r in g["rules"] if r.get("alert") not in alerts]
            groups.append({**g, "rules": rules})
        (out / path.name).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        files.append(out / path.name)
    return Pack(label, tuple(files))


def _chart_interval(key: str) -> str:
    """``prometheusRule.<key>`` as the chart installs it; empty: Prometheus' global one."""
    values = yaml.safe_load(CHART_VALUES.read_text())
    return str(values["prometheusRule"].get(key) or "")


def chart_record_interval() -> str:
    """The record groups' evaluation interval the chart installs (``recordInterval``)."""
    return _chart_interval("recordInterval")


def chart_alert_interval() -> str:
    """The alert groups' evaluation interval the chart installs (``alertInterval``)."""
    return _chart_interval("alertInterval")


#: The groups the chart's ``recordInterval`` times: every group whose name starts so (its
#: template's test), the signals' record groups and the SLO and verdict records with them.
#: Every other group is an alert group, which its ``alertInterval`` times.
RECORD_GROUP_PREFIX = "inference.records"
#: ``--alert-interval off``: the pack without its alert groups, what the records alone cost
#: (a measurement, not a configuration the chart installs).
NO_ALERTS = "off"


def with_intervals(pack: Pack, records: str, workdir: Path, alerts: str = "") -> Pack:
    """``pack`` as the chart installs it with ``recordInterval: records`` and ``alertInterval:
    alerts``: its record groups (``inference.records*``, the SLO and verdict records included)
    evaluated every ``records``, its alert groups every ``alerts`` (copies in ``workdir``); an
    empty one leaves its groups at the global interval, and ``pack`` itself is returned where
    both are. (Until 2026-12-06 only the signals' groups were timed: the SLO and verdict
    records stayed at the global interval, unlike the chart.) A group generated with an interval
    of its own (the SLO budget's) keeps it, as in the chart. ``alerts`` = :data:`NO_ALERTS`
    leaves the alert groups out: what the records alone cost."""
    if not records and not alerts:
        return pack
    label = pack.label + (f"-records{records}" if records else "")
    label += "-no-alerts" if alerts == NO_ALERTS else (f"-alerts{alerts}" if alerts else "")
    out = workdir / label
    out.mkdir(parents=True, exist_ok=True)
    files = []
    for path in pack.files:
        doc = yaml.safe_load(path.read_text())
        groups = []
        for g in doc["groups"]:
            is_record = g["name"].startswith(RECORD_GROUP_PREFIX)
            if alerts == NO_ALERTS and not is_record:
                continue
            interval = records if is_record else alerts
            groups.append({"interval": interval, **g} if interval else g)
        (out / path.name).write_text(yaml.safe_dump({"groups": groups}, sort_keys=False))
        files.append(out / path.name)
    return Pack(label, tuple(files), records, alerts)


@dataclass
class Instance:
    """One Prometheus: one scenario's simulator scraped, one pack evaluated."""

    scenario: Scenario
    pack: Pack
    directory: Path
    sim: subprocess.Popen[bytes]
    prom: subprocess.Popen[bytes]
    api: Api
    targets: int
    sample: Sample = field(default_factory=Sample)
    cold_start: list[dict[str, Any]] = field(default_factory=list)
    cpu0: float = 0.0


def _start_simulator(
    scenario: Scenario, directory: Path, exposition: Path
) -> tuple[subprocess.Popen[bytes], Path, Path | None]:
    directory.mkdir(parents=True, exist_ok=True)
    targets, ready = directory / "targets.json", directory / "ready"
    node_targets = directory / "targets-node.json" if scenario.agents() else None
    sim = subprocess.Popen(
        [
            sys.executable,
            str(Path(__file__)),
            "serve",
            *scenario.args(),
            "--port",
            str(free_port()),
            "--targets",
            str(targets),
            "--ready",
            str(ready),
            "--exposition",
            str(exposition),
            *(["--node-targets", str(node_targets)] if node_targets else []),
        ],
        stdout=(directory / "sim.log").open("wb"),
        stderr=subprocess.STDOUT,
    )
    deadline = time.monotonic() + 600
    while not ready.exists():
        if sim.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the simulator did not start; see {directory / 'sim.log'}")
        time.sleep(0.5)
    return sim, targets, node_targets


def _start_prometheus(  # noqa: PLR0917
    directory: Path,
    targets: Path,
    node_targets: Path | None,
    pack: Pack,
    binary: str,
    evaluation_interval_s: float = EVALUATION_INTERVAL_S,
    memory_limit: str = "",
) -> tuple[subprocess.Popen[bytes], Api]:
    port = free_port()
    config = directory / "scrape-and-rules.yml"
    settings = prometheus_config(targets, pack.files, node_targets, evaluation_interval_s)
    config.write_text(json.dumps(settings, indent=2))
    prom = subprocess.Popen(
        [
            binary,
            f"--config.file={config}",
            f"--storage.tsdb.path={directory / 'data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--storage.tsdb.retention.time=2h",
        ],
        stdout=(directory / "prometheus.log").open("wb"),
        stderr=subprocess.STDOUT,
        # Go's soft memory limit: the garbage collector works harder near it
        env={**os.environ, "GOMEMLIMIT": memory_limit} if memory_limit else None,
    )
    return prom, Api(f"http://127.0.0.1:{port}")


def _alerts_now(api: Api) -> dict[str, int]:
    found = api.get("/api/v1/query", query="count by (alertname, alertstate) (ALERTS)")
    return {
        f"{r['metric']['alertname']}/{r['metric']['alertstate']}": int(float(r["value"][1]))
        for r in found["data"]["result"]
    }


def measure_side_by_side(  # noqa: PLR0917
    runs: Sequence[tuple[Scenario, Sequence[Pack]]],
    warmup_min: float,
    measure_min: float,
    workdir: Path,
    exposition: Path,
    cost_repeat: int = 3,
    binary: str = "prometheus",
    evaluation_interval_s: float = EVALUATION_INTERVAL_S,
    memory_limit: str = "",
    profile_s: int = PROFILE_S,
) -> list[dict[str, Any]]:
    """Every scenario's simulator and, per pack, a Prometheus over it, all at once: one warm-up,
    one measuring window, so every number of the batch met the same machine."""
    running = Running()
    instances: list[Instance] = []
    try:
        for scenario, packs in runs:
            sim_dir = workdir / scenario.name
            sim, targets, node_targets = _start_simulator(scenario, sim_dir, exposition)
            running.processes.append(sim)
            count = len(scenario.pods()) + len(scenario.agents())
            for pack in packs:
                directory = sim_dir / pack.label
                directory.mkdir(parents=True, exist_ok=True)
                prom, api = _start_prometheus(
                    directory,
                    targets,
                    node_targets,
                    pack,
                    binary,
                    evaluation_interval_s,
                    memory_limit,
                )
                running.processes.append(prom)
                instances.append(Instance(scenario, pack, directory, sim, prom, api, count))
        started = time.monotonic()
        for inst in instances:
            while True:
                with contextlib.suppress(OSError, KeyError, IndexError, ValueError):
                    if inst.api.scalar("count(up == 1)") >= inst.targets:
                        break
                if inst.prom.poll() is not None or time.monotonic() - started > 600:
                    raise RuntimeError(f"targets not up; see {inst.directory / 'prometheus.log'}")
                _memory_left()
                time.sleep(2)
            took = time.monotonic() - started
            print(f"  {inst.scenario.name} / {inst.pack.label}: {inst.targets} up, {took:.0f} s")
        # The cold start: active alerts by state every 30 s while the windows fill.
        while time.monotonic() - started < warmup_min * 60:
            _alive(instances)
            for inst in instances:
                with contextlib.suppress(OSError, KeyError, ValueError):
                    inst.cold_start.append(
                        {"s": round(time.monotonic() - started), "alerts": _alerts_now(inst.api)}
                    )
            time.sleep(30)
        sims = {id(inst.sim): inst.sim for inst in instances}
        sim_cpu0 = {k: _cpu(p.pid) for k, p in sims.items()}
        for inst in instances:
            inst.cpu0 = _cpu(inst.prom.pid)
        wall0 = time.monotonic()
        load0 = os.getloadavg()
        loads = [load0[0]]
        # Each Prometheus's own CPU profile over most of the window, all at once.
        seconds = max(10, min(profile_s, round(measure_min * 60) - 20))
        with ThreadPoolExecutor(max_workers=max(1, len(instances))) as pool:
            profiles = {id(i): pool.submit(cpu_profile, i.api, seconds) for i in instances}
            while time.monotonic() - wall0 < measure_min * 60:
                _alive(instances)
                for inst in instances:
                    # a poll Prometheus did not answer in time is one sample fewer
                    with contextlib.suppress(OSError):
                        _poll(inst.api, psutil.Process(inst.prom.pid), inst.sample)
                loads.append(os.getloadavg()[0])
                time.sleep(evaluation_interval_s / 3)
            parts = {key: future.result() for key, future in profiles.items()}
        wall = time.monotonic() - wall0
        sim_cores = {k: (_cpu(p.pid) - sim_cpu0[k]) / wall for k, p in sims.items()}
        cores = {id(i): (_cpu(i.prom.pid) - i.cpu0) / wall for i in instances}
        load = [round(load0[0], 2), round(os.getloadavg()[0], 2)]
        out = []
        for inst in instances:
            result = _results(inst, cost_repeat)
            result.update(
                cpu_cores=round(cores[id(inst)], 3),
                simulator_cpu_cores=round(sim_cores[id(inst.sim)], 3),
                measured_s=round(wall, 1),
                load_average=load,
                load_average_window={
                    "min": round(min(loads), 2),
                    "median": round(statistics.median(loads), 2),
                    "max": round(max(loads), 2),
                },
                cpu_profile=parts[id(inst)],
                cold_start=inst.cold_start,
            )
            out.append(result)
        return out
    finally:
        running.stop()
        for inst in instances:
            shutil.rmtree(inst.directory / "data", ignore_errors=True)


def cpu_profile(api: Api, seconds: int) -> dict[str, float]:
    """Prometheus's CPU over ``seconds`` by part (:mod:`prom_profile`): CPU seconds per part
    and ``seconds``; empty where the profile could not be taken."""
    try:
        with urllib.request.urlopen(
            f"{api.base}/debug/pprof/profile?seconds={seconds}", timeout=seconds + 60
        ) as response:
            raw = response.read()
    except OSError:
        return {}
    out = {
        part: round(value, 3) for part, value in prom_profile.parts(prom_profile.parse(raw)).items()
    }
    return {**out, "seconds": float(seconds)}


def _memory_left() -> None:
    """Stops the run before the machine runs out of memory (the kernel's OOM killer would pick
    a process of whoever shares the machine)."""
    available = psutil.virtual_memory().available
    if available < MIN_AVAILABLE:
        raise RuntimeError(
            f"only {available / 1024**3:.1f} GiB of memory left: stopped (--prometheus-memory-"
            "limit bounds each Prometheus)"
        )


def _alive(instances: Sequence[Instance]) -> None:
    """Stops the run as soon as a simulator or a Prometheus is gone (numbers without it would
    compare unlike things), or memory runs out."""
    _memory_left()
    for inst in instances:
        for what, proc in (("simulator", inst.sim), ("prometheus", inst.prom)):
            if proc.poll() is not None:
                raise RuntimeError(
                    f"{inst.scenario.name}/{inst.pack.label}: the {what} exited "
                    f"({proc.returncode}); see {inst.directory}"
                )


def _cpu(pid: int) -> float:
    times = psutil.Process(pid).cpu_times()
    return float(times.user + times.system)


_RECORDED = r"inference[a-z_]*:.+"


def _or_default(failed: list[str], what: str, call: Callable[[], Any], default: Any) -> Any:
    """``call()``, or ``default`` where Prometheus did not answer in time (on a loaded machine a
    count over every series can take minutes): one figure missing, named in ``failed``, rather
    than every measurement of the run lost."""
    try:
        return call()
    except OSError as error:
        failed.append(f"{what}: {error}")
        return default


def _results(inst: Instance, cost_repeat: int) -> dict[str, Any]:
    """What one Prometheus measured, once the window is over. The window's own figures (group
    times, RSS, CPU) are kept whatever the queries after it answer."""
    api, sc, sample = inst.api, inst.scenario, inst.sample
    failed: list[str] = []

    def scalar(query: str) -> float:
        return float(_or_default(failed, query, lambda: api.scalar(query), math.nan))

    head = _metric_values(
        _or_default(failed, "/metrics", lambda: api.text("/metrics"), ""),
        "prometheus_tsdb_head_series",
    ).get("prometheus_tsdb_head_series", math.nan)
    own = f'__name__!~"{_RECORDED}|ALERTS|ALERTS_FOR_STATE"'
    # The fleet's own series: everything of the jobs but records and alert state (which carry
    # the job label as a join label).
    sidecar_series = scalar(f'count({{job="{JOB}",{own}}})')
    agent_series = scalar(f'count({{job=~"{NODE_JOB}|{DCGM_JOB}",{own}}})')
    pods = len(sc.pods())
    gpus = sum(p.gpus for p in sc.pods())
    groups = {
        name: {
            "median_ms": round(_median(list(values.values())) * 1000, 1),
            "max_ms": round(max(values.values()) * 1000, 1),
            "evaluations": len(values),
            "interval_s": sample.intervals.get(name, 0.0),
        }
        for name, values in sorted(sample.groups.items())
    }
    rule_times = {
        name: round(_median([v for v in values.values() if v > 0]) * 1000, 2)
        for name, values in sample.rules.items()
    }
    alerts_query = "count by (alertname, alertstate) (ALERTS)"
    firing = _or_default(
        failed,
        alerts_query,
        lambda: api.get("/api/v1/query", query=alerts_query),
        {"data": {"result": []}},
    )
    fleet_series = sidecar_series + agent_series
    return {
        "scenario": sc.name,
        "state": sc.state,
        "layout": sc.layout,
        "mix": sc.mix,
        "pool_models": sc.pool_models,
        "pods_per_model": sc.pods_per_model,
        "pack": inst.pack.label,
        "record_interval": inst.pack.record_interval,
        "alert_interval": inst.pack.alert_interval,
        "gpus": gpus,
        "pods": pods,
        "node_agents": len(sc.agents()),
        "targets_up": scalar("count(up == 1)"),
        "head_series": head,
        "fleet_series": fleet_series,
        "sidecar_series": sidecar_series,
        "agent_series": agent_series,
        "series_per_gpu": round(fleet_series / gpus, 1),
        "series_per_pod": round(fleet_series / pods, 1),
        "recorded_series": scalar(f'count({{__name__=~"{_RECORDED}"}})'),
        # Checks that the layouts recorded what they should: each pod's GPU utilisation (the
        # node layout's join of agent, attribution and sidecar), and every pool.
        "pods_with_gpu_record": scalar("count(inference:gpu_utilization:mean5m)"),
        "pools_recorded": scalar(
            "count(inference_pool:prefill_engines:count)"
            " + count(inference_pool:decode_engines:count)"
        ),
        "alerts_series": scalar("count(ALERTS)"),
        "raw_series_read": _or_default(
            failed,
            "raw series read",
            lambda: raw_read(api, pack_selectors(inst.pack.files)),
            math.nan,
        ),
        "rss_mib_median": round(_median(sample.rss_mib), 1),
        "rss_mib_max": round(max(sample.rss_mib), 1),
        "scrape_duration_p50_s": round(scalar("quantile(0.5, scrape_duration_seconds)"), 4),
        "groups": groups,
        "groups_total_median_ms": round(sum(g["median_ms"] for g in groups.values()), 1),
        "rules_ms": dict(sorted(rule_times.items(), key=lambda kv: -kv[1])),
        "rule_costs": _or_default(
            failed, "rule costs", lambda: rule_costs(api, inst.pack.files, cost_repeat), {}
        )
        if cost_repeat
        else {},
        "alerts": [
            {**r["metric"], "count": int(float(r["value"][1]))} for r in firing["data"]["result"]
        ],
        "failed_queries": failed,
    }


def batches(args: argparse.Namespace, workdir: Path) -> list[list[tuple[Scenario, list[Pack]]]]:
    """What ``run`` measures: per fleet size, every layout and mix side by side; the
    disaggregated fleets (with and without the pool family) join the first batch."""
    sidecar = pack_of(args.rules)
    chosen = [("sidecar", sidecar)]
    chosen += [(layout, pack_of(args.rules / layout)) for layout in LAYOUTS if layout != "sidecar"]
    chosen += [(layout, pack_of(Path(directory))) for layout, directory in args.pack]
    packs: dict[str, list[Pack]] = {}
    labels: dict[str, list[str]] = {}
    for layout, given in chosen:
        seen = labels.setdefault(layout, [])
        # one directory per pack: a second one of the same name is numbered
        pack = (
            replace(given, label=f"{given.label}-{len(seen) + 1}") if given.label in seen else given
        )
        seen.append(given.label)
        packs.setdefault(layout, []).extend(
            with_intervals(pack, interval, workdir, alerts)
            for interval in args.record_interval
            for alerts in args.alert_interval
        )
    out: list[list[tuple[Scenario, list[Pack]]]] = [
        [
            (Scenario(gpus, layout, mix, state=args.state), packs[layout])
            for layout in args.layout
            for mix in args.mix
        ]
        for gpus in args.gpus
    ]
    if args.pool_pods_per_model:
        without = without_family(sidecar, "pool", POOL_GROUP, workdir)
        pools = [
            (
                Scenario(
                    layout="sidecar",
                    pool_models=args.pool_models,
                    pods_per_model=n,
                    state=args.state,
                ),
                [
                    with_intervals(p, args.record_interval[0], workdir, args.alert_interval[0])
                    for p in (sidecar, without)
                ],
            )
            for n in args.pool_pods_per_model
        ]
        if out:
            out[0] += pools
        else:
            out.append(pools)
    return out


def _stop_on_signal(signum: int, _frame: object) -> None:
    """SIGTERM ends the run as Ctrl-C does: the simulators and Prometheus servers stopped,
    their data removed."""
    raise SystemExit(128 + signum)


def run(args: argparse.Namespace) -> int:
    signal.signal(signal.SIGTERM, _stop_on_signal)
    binary = shutil.which(args.prometheus)
    if binary is None:
        print(f"{args.prometheus} not found: apt-get install prometheus", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="fleet-"))
    started = dt.datetime.now(dt.UTC)
    print(f"capturing the expositions (work dir {workdir})", flush=True)
    captured = capture_all(workdir)
    exposition = workdir / "exposition.json"
    exposition.write_text(json.dumps(captured))
    per_pod = {
        kind: {
            size: sum(
                1 for line in Template.parse(d["text"], d["age_s"]).lines if _keeps(line, size)
            )
            for size, _ in POD_MIX
        }
        for kind, d in captured.items()
    }
    scales: list[dict[str, Any]] = []
    for batch in batches(args, workdir):
        names = ", ".join(f"{sc.name} ({'/'.join(p.label for p in packs)})" for sc, packs in batch)
        print(f"side by side: {names}", flush=True)
        results = measure_side_by_side(
            batch,
            args.warmup,
            args.measure,
            workdir,
            exposition,
            args.cost_repeat,
            binary,
            args.evaluation_interval,
            args.prometheus_memory_limit,
            args.profile,
        )
        for result in results:
            long = ("rules_ms", "rule_costs", "cold_start")
            print(json.dumps({k: v for k, v in result.items() if k not in long}), flush=True)
        scales += results
    out = {
        "started": started.isoformat(timespec="seconds"),
        "command": " ".join(["python", "bench/fleet.py", *sys.argv[1:]]),
        "machine": machine(),
        "prometheus": subprocess.run(
            [binary, "--version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()[0],
        "scrape_interval_s": SCRAPE_INTERVAL_S,
        "evaluation_interval_s": args.evaluation_interval,
        "record_intervals": args.record_interval,
        "alert_intervals": args.alert_interval,
        "prometheus_memory_limit": args.prometheus_memory_limit,
        "warmup_min": args.warmup,
        "measure_min": args.measure,
        "profile_s": args.profile,
        "rules": str(args.rules),
        "series_per_pod_exposition": per_pod,
        "scales": scales,
    }
    RESULTS.mkdir(parents=True, exist_ok=True)
    stamp = started.strftime("%Y%m%dT%H%M%SZ")
    name = f"fleet-{args.label}-{stamp}" if args.label else f"fleet-{stamp}"
    out["label"] = args.label
    for path in (RESULTS / f"{name}.json", RESULTS / "fleet-latest.json"):
        path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {RESULTS / f'{name}.json'}")
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _keeps(line: str | Line, gpus: int) -> bool:
    return isinstance(line, Line) and (line.gpu is None or line.gpu < gpus)


def _slope(xs: Sequence[float], ys: Sequence[float]) -> tuple[float, float]:
    """Least-squares line ``y = a + b x``: ``(a, b)``."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    var = sum((x - mx) ** 2 for x in xs)
    b = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / var if var else 0.0
    return my - b * mx, b


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"


def _print_head(head: Sequence[str]) -> None:
    """A Markdown table's head row and the line under it."""
    print(_row(head))
    print("|" + "---|" * len(head))


def _rules_cores(sc: dict[str, Any]) -> float:
    """Cores Prometheus spent evaluating its rule groups (its CPU profile); NaN without one."""
    profile = sc.get("cpu_profile", {})
    return profile["rules"] / profile["seconds"] if profile.get("seconds") else math.nan


def _alerts_every(sc: dict[str, Any], default: str) -> str:
    alerts = str(sc.get("alert_interval") or default)
    return "none (records only)" if alerts == NO_ALERTS else alerts


def _name(sc: dict[str, Any]) -> str:
    interval = sc.get("record_interval") or "global"
    alerts = _alerts_every(sc, "global")
    return f"{sc['layout']} ({sc['pack']}, records {interval}, alerts {alerts})"


def report_layouts(scales: Sequence[dict[str, Any]]) -> None:
    """The sidecar and node layouts side by side, and the node layout's ratios (each node pack
    against the sidecar pack at the same size, mix and record and alert intervals)."""
    runs = [sc for sc in scales if not sc.get("pool_models")]
    head = ["layout", "pack", "records every", "alerts every", "GPUs per pod", "GPUs", "pods"]
    head += ["agents"]
    head += ["series", "per GPU", "recorded", "RSS MiB", "CPU cores", "rules' cores"]
    head += ["rules' share", "all groups ms"]
    _print_head(head)
    for sc in runs:
        row = [
            sc["layout"],
            f"`{sc['pack']}`",
            sc.get("record_interval") or "(global)",
            _alerts_every(sc, "(global)"),
            sc["mix"],
            f"{sc['gpus']:,}",
            f"{sc['pods']:,}",
            f"{sc['node_agents']:,}",
            f"{sc['fleet_series']:,.0f}",
            f"{sc['series_per_gpu']:.1f}",
            f"{sc['recorded_series']:,.0f}",
            f"{sc['rss_mib_median']:,.0f}",
            f"{sc['cpu_cores']:.3f}",
            f"{_rules_cores(sc):.3f}",
            f"{100 * rules_share(sc):.1f} %",
            f"{sc['groups_total_median_ms']:,.0f}",
        ]
        print(_row(row))
    print()
    gpu = ("inference.records.gpu", "inference.records.gpu_state")
    for sc in runs:
        if sc["layout"] != "node":
            continue
        same = ("gpus", "mix", "record_interval", "alert_interval")
        base = next(
            (
                b
                for b in runs
                if b["layout"] == "sidecar" and all(b.get(k) == sc.get(k) for k in same)
            ),
            None,
        )
        if base is None:
            continue
        mine = {
            "series": sc["fleet_series"],
            "recorded": sc["recorded_series"],
            "RSS": sc["rss_mib_median"],
            "CPU": sc["cpu_cores"],
            "rules' CPU": _rules_cores(sc),
            "all groups": sc["groups_total_median_ms"],
            "GPU record groups": sum(sc["groups"][g]["median_ms"] for g in gpu),
        }
        theirs = {
            "series": base["fleet_series"],
            "recorded": base["recorded_series"],
            "RSS": base["rss_mib_median"],
            "CPU": base["cpu_cores"],
            "rules' CPU": _rules_cores(base),
            "all groups": base["groups_total_median_ms"],
            "GPU record groups": sum(base["groups"][g]["median_ms"] for g in gpu),
        }
        ratios = ", ".join(
            f"{k} {mine[k] / theirs[k]:.2f}" if theirs[k] else f"{k} -" for k in mine
        )
        print(
            f"{_name(sc)} / {_name(base)}, {sc['gpus']:,} GPUs, mix {sc['mix']}: {ratios}; "
            f"pods with a GPU record {sc.get('pods_with_gpu_record', 0):.0f} of {sc['pods']} "
            f"(sidecar {base.get('pods_with_gpu_record', 0):.0f})"
        )


def rules_share(sc: dict[str, Any]) -> float:
    """The share of Prometheus's CPU its rule groups took, from its CPU profile (the
    benchmark's own API queries left out); NaN without a profile."""
    parts = {k: v for k, v in sc.get("cpu_profile", {}).items() if k != "seconds"}
    total = sum(v for k, v in parts.items() if k != "query")
    return parts.get("rules", 0.0) / total if total else math.nan


def _percent_of(ms: float, interval_s: float) -> str:
    return f"{100 * ms / 1000 / interval_s:.1f} %" if interval_s else "-"


def report_groups(scales: Sequence[dict[str, Any]]) -> None:
    """Each rule group's evaluation time against its interval, each fleet side by side, and
    what share of Prometheus's CPU the whole pack took."""
    runs = [sc for sc in scales if not sc.get("pool_models")]
    if not runs:
        return
    groups = sorted({g for sc in runs for g in sc["groups"]})
    head = ["group"] + [f"{_name(sc)}, {sc['gpus']:,} GPUs" for sc in runs]
    print()
    print("Median (max) evaluation time, ms, and as % of the group's interval:")
    print()
    _print_head(head)
    for g in groups:
        cells = [f"`{g}`"]
        for sc in runs:
            found = sc["groups"].get(g)
            if found is None:
                cells.append("-")
                continue
            interval = found.get("interval_s") or sc.get("evaluation_interval_s", 0.0)
            median, top = found["median_ms"], found["max_ms"]
            cells.append(
                f"{median:,.0f} ({top:,.0f}): "
                f"{_percent_of(median, interval)} ({_percent_of(top, interval)})"
            )
        print(_row(cells))
    cells = ["all groups (sum of medians), rules' share of Prometheus's CPU (profile)"]
    cells += [f"{sc['groups_total_median_ms']:,.0f}: {100 * rules_share(sc):.1f} %" for sc in runs]
    print(_row(cells))
    if not all(sc.get("rule_costs") for sc in runs):
        return
    # Wall times on a loaded machine hold the waits for a core; a rule's expression as an
    # instant query, the fastest of a few, is closer to what its evaluation costs.
    print()
    print("Each group's rules as instant queries after the window, fastest of each, ms, and as")
    print("% of the group's interval:")
    print()
    _print_head(head)
    for g in groups:
        cells = [f"`{g}`"]
        for sc in runs:
            found = sc["groups"].get(g)
            cost = sum(v["eval_ms"] for k, v in sc["rule_costs"].items() if k.split("/")[0] == g)
            interval = (found or {}).get("interval_s") or sc.get("evaluation_interval_s", 0.0)
            cells.append(f"{cost:,.0f}: {_percent_of(cost, interval)}")
        print(_row(cells))


def report_rules(scales: Sequence[dict[str, Any]], top: int = 10) -> None:
    """The costliest rules: each rule's median evaluation time in the window (Prometheus's
    own ``evaluationTime``), the first run's ``top`` and the ``top`` of every other run, side by
    side, with the samples each reads (its instant query's statistics)."""
    runs = [sc for sc in scales if not sc.get("pool_models") and sc.get("rules_ms")]
    if not runs:
        return
    keys: list[str] = []
    for sc in runs:
        keys += [k for k in list(sc["rules_ms"])[:top] if k not in keys]
    keys.sort(key=lambda k: -max(sc["rules_ms"].get(k, 0.0) for sc in runs))
    print()
    print(f"The {top} costliest rules of each run, median evaluation time, ms (samples read):")
    print()
    head = ["rule"] + [f"{_name(sc)}, {sc['gpus']:,} GPUs" for sc in runs]
    _print_head(head)
    for key in keys:
        cells = [f"`{key}`"]
        for sc in runs:
            ms = sc["rules_ms"].get(key)
            samples = sc.get("rule_costs", {}).get(key, {}).get("samples")
            read = f" ({samples:,.0f})" if samples is not None else ""
            cells.append("-" if ms is None else f"{ms:,.1f}{read}")
        print(_row(cells))
    cells = ["all rules (sum of medians)"]
    cells += [f"{sum(sc['rules_ms'].values()):,.0f}" for sc in runs]
    print(_row(cells))


def report_pools(scales: Sequence[dict[str, Any]]) -> None:
    """The disaggregated fleets with and without the pool family."""
    runs = [sc for sc in scales if sc.get("pool_models")]
    if not runs:
        return
    pool_alerts = family_alerts("pool")
    head = ["pods per model", "pods", "pack", "pools", "recorded", "RSS MiB"]
    head += ["`records.pool` ms", "pool alerts ms", "`signatures` ms", "all groups ms"]
    print()
    _print_head(head)
    for sc in runs:
        alerts = sum(
            ms for key, ms in sc["rules_ms"].items() if key.split("/", 1)[1] in pool_alerts
        )
        pool = sc["groups"].get(POOL_GROUP, {}).get("median_ms", 0.0)
        row = [
            str(sc["pods_per_model"]),
            f"{sc['pods']:,}",
            "without pool" if "without" in sc["pack"] else "full",
            f"{sc.get('pools_recorded', 0):.0f}",
            f"{sc['recorded_series']:,.0f}",
            f"{sc['rss_mib_median']:,.0f}",
            f"{pool:,.1f}",
            f"{alerts:,.1f}",
            f"{sc['groups']['inference.signatures']['median_ms']:,.1f}",
            f"{sc['groups_total_median_ms']:,.1f}",
        ]
        print(_row(row))


def report(args: argparse.Namespace) -> int:
    """The tables of docs/scale.md from a results file (default: the latest run)."""
    data = json.loads(Path(args.results).read_text())
    scales = data["scales"]
    if "layout" in scales[0]:
        print(f"command: {data.get('command', '')}; machine: {data['machine']}")
        for sc in scales:
            sc.setdefault("evaluation_interval_s", data.get("evaluation_interval_s", 30.0))
        report_layouts(scales)
        report_groups(scales)
        report_rules(scales)
        report_pools(scales)
        return 0
    groups = sorted({g for scale in scales for g in scale["groups"]})
    head = ["GPUs", "pods", "raw series", "recorded", "recorded / raw read", "RSS MiB", "CPU"]
    head += [f"`{g}` ms" for g in groups]
    _print_head(head)
    for sc in scales:
        row = [
            f"{sc['gpus']:,}",
            f"{sc['pods']:,}",
            f"{sc['fleet_series']:,.0f}",
            f"{sc['recorded_series']:,.0f}",
            f"{100 * sc['recorded_series'] / sc['raw_series_read']:.1f} %",
            f"{sc['rss_mib_median']:,.0f}",
            f"{sc['cpu_cores']:.2f}",
        ]
        row += [f"{sc['groups'][g]['median_ms']:,.0f}" for g in groups]
        print("| " + " | ".join(row) + " |")
    xs = [sc["gpus"] / 1000 for sc in scales]
    print()
    for label, key in (
        ("raw series", "fleet_series"),
        ("recorded series", "recorded_series"),
        ("RSS MiB", "rss_mib_median"),
        ("CPU cores", "cpu_cores"),
    ):
        a, b = _slope(xs, [sc[key] for sc in scales])
        print(f"per 1,000 GPUs: {label} {b:,.3f} (intercept {a:,.1f})")
    for g in groups:
        a, b = _slope(xs, [sc["groups"][g]["median_ms"] for sc in scales])
        print(f"per 1,000 GPUs: {g} {b:,.1f} ms (intercept {a:,.1f})")
    total = [sum(sc["groups"][g]["median_ms"] for g in groups) for sc in scales]
    a, b = _slope(xs, total)
    print(f"per 1,000 GPUs: all groups {b:,.1f} ms per evaluation (intercept {a:,.1f})")
    return 0


def _layout_pack(text: str) -> tuple[str, str]:
    layout, _, directory = text.partition("=")
    if layout not in LAYOUTS or not (Path(directory) / "recording_rules.yaml").is_file():
        raise argparse.ArgumentTypeError(
            f"{text!r}: want LAYOUT=DIR, LAYOUT one of {', '.join(LAYOUTS)} and DIR holding "
            "recording_rules.yaml and alerts.yaml"
        )
    return layout, directory


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="measure Prometheus with the pack at fleet sizes")
    p_run.add_argument("--gpus", type=int, nargs="*", default=[1000, 5000, 10000])
    p_run.add_argument(
        "--layout",
        nargs="+",
        choices=LAYOUTS,
        default=["sidecar"],
        help="sidecar: a sidecar per pod reads its GPUs; node: sidecars without NVML and one "
        "node agent per 8-GPU node (the node rule profile); dcgm: sidecars without NVML and one "
        "dcgm-exporter per node (the dcgm rule profile); several are measured side by side",
    )
    p_run.add_argument(
        "--mix", nargs="+", choices=sorted(MIXES), default=["default"], help="GPUs per pod"
    )
    p_run.add_argument(
        "--pool-pods-per-model",
        type=int,
        nargs="*",
        default=[],
        help="disaggregated fleets (half prefill, half decode pods per model), each measured "
        "with and without the pool family, side by side with the first size",
    )
    p_run.add_argument("--pool-models", type=int, default=8, help="models of those fleets")
    p_run.add_argument("--warmup", type=float, default=11.0, help="minutes before measuring")
    p_run.add_argument("--measure", type=float, default=5.0, help="minutes of measurement")
    p_run.add_argument(
        "--profile",
        type=int,
        default=PROFILE_S,
        metavar="SECONDS",
        help=f"length of each Prometheus's CPU profile in the window (default {PROFILE_S}); "
        "a multiple of the groups' intervals, so that it holds whole evaluations of each",
    )
    p_run.add_argument(
        "--cost-repeat",
        type=int,
        default=3,
        help="evaluations of each rule as an instant query at the end (0: none)",
    )
    p_run.add_argument(
        "--rules", type=Path, default=RULES, help=f"the pack's directory (default {RULES})"
    )
    p_run.add_argument(
        "--evaluation-interval",
        type=float,
        default=EVALUATION_INTERVAL_S,
        metavar="SECONDS",
        help="Prometheus's rule evaluation interval (default: the Prometheus Operator's "
        f"{EVALUATION_INTERVAL_S} s; the scrape interval is {SCRAPE_INTERVAL_S} s)",
    )
    p_run.add_argument(
        "--record-interval",
        nargs="+",
        default=None,
        metavar="DURATION",
        help="the record groups' evaluation interval, as the chart's prometheusRule."
        "recordInterval sets it (default: the chart's, "
        f"{chart_record_interval() or 'none'}); '' for none (the global one); several are "
        "measured side by side",
    )
    p_run.add_argument(
        "--alert-interval",
        nargs="+",
        default=None,
        metavar="DURATION",
        help="the alert groups' evaluation interval, as the chart's prometheusRule."
        f"alertInterval sets it (default: the chart's, {chart_alert_interval() or 'none'}); "
        f"'' for none (the global one); '{NO_ALERTS}' for no alert group at all (what the "
        "records alone cost); several are measured side by side, each at every record interval",
    )
    p_run.add_argument(
        "--pack",
        nargs="+",
        default=[],
        type=_layout_pack,
        metavar="LAYOUT=DIR",
        help="another rule pack (recording_rules.yaml and alerts.yaml in DIR) measured on that "
        "layout's fleet beside the shipped one, e.g. node=/tmp/old/alert_rules/node",
    )
    p_run.add_argument(
        "--prometheus-memory-limit",
        default="",
        metavar="SIZE",
        help="GOMEMLIMIT of each Prometheus (e.g. 7GiB): where several large fleets share the "
        "machine's memory (default: none)",
    )
    p_run.add_argument("--label", default="", help="a name for this run in the results file")
    p_run.add_argument(
        "--state",
        choices=STATES,
        default="healthy",
        help="the fleet's engines: healthy (no request waits, no signature holds) or starved "
        "(the captured 7 waiting requests beside GPUs under 60 %%: the starved-queue signature "
        "pending on half the pods, as every run before 2026-12-06 measured)",
    )
    p_run.add_argument(
        "--prometheus", default="prometheus", help="the Prometheus binary (default: on PATH)"
    )
    p_serve = sub.add_parser("serve", help="only the simulator")
    p_serve.add_argument("--gpus", type=int, required=True)
    p_serve.add_argument("--layout", choices=LAYOUTS, default="sidecar")
    p_serve.add_argument("--mix", choices=sorted(MIXES), default="default")
    p_serve.add_argument("--pool-models", type=int, default=0)
    p_serve.add_argument("--pods-per-model", type=int, default=0)
    p_serve.add_argument("--state", choices=STATES, default="healthy")
    p_serve.add_argument("--port", type=int, required=True)
    p_serve.add_argument("--targets", required=True, help="file_sd target file to write")
    p_serve.add_argument("--node-targets", help="file_sd target file of the node agents")
    p_serve.add_argument("--ready", help="file to create once listening")
    p_serve.add_argument("--exposition", help="captured expositions (JSON) instead of capturing")
    p_report = sub.add_parser("report", help="the tables of docs/scale.md")
    p_report.add_argument("results", nargs="?", default=str(RESULTS / "fleet-latest.json"))
    args = parser.parse_args(argv)
    if args.command == "run":
        sizes = [*args.gpus, *args.pool_pods_per_model, args.pool_models]
        if min(sizes) < 1 or not (args.gpus or args.pool_pods_per_model):
            print("fleet: sizes must be positive, and a run needs --gpus or pools", file=sys.stderr)
            return 2
        if not 1 <= args.evaluation_interval <= 3600:
            print("fleet: --evaluation-interval must be 1 to 3600 seconds", file=sys.stderr)
            return 2
        if not 10 <= args.profile <= 3600:
            print("fleet: --profile must be 10 to 3600 seconds", file=sys.stderr)
            return 2
        if args.prometheus_memory_limit and not re.fullmatch(
            r"[0-9]+(B|KiB|MiB|GiB|TiB)", args.prometheus_memory_limit
        ):
            print("fleet: --prometheus-memory-limit must be like 7GiB", file=sys.stderr)
            return 2
        if args.record_interval is None:
            args.record_interval = [chart_record_interval()]
        if any(i and not re.fullmatch(r"([0-9]+(ms|s|m|h))+", i) for i in args.record_interval):
            print("fleet: --record-interval must be a duration (1m, 30s) or ''", file=sys.stderr)
            return 2
        if args.alert_interval is None:
            args.alert_interval = [chart_alert_interval()]
        if any(
            i and i != NO_ALERTS and not re.fullmatch(r"([0-9]+(ms|s|m|h))+", i)
            for i in args.alert_interval
        ):
            print(
                f"fleet: --alert-interval must be a duration (1m, 30s), '' or {NO_ALERTS}",
                file=sys.stderr,
            )
            return 2
        return run(args)
    if args.command == "report":
        return report(args)
    return serve(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
