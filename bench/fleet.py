"""The rule pack at fleet scale: a real Prometheus scraping N simulated sidecars.

A *fleet* is N GPUs in pods of 8, 4, 2 and 1 GPUs (half the GPUs in 8-GPU pods, a quarter in
4-GPU pods, 15 % in 2-GPU and 10 % in 1-GPU pods: 3.3 GPUs per pod on average). Every pod is
one sidecar: the exposition the real CLI serves at its defaults, captured once at start-up from
``python -m exporter.cli`` on an 8-GPU synthetic replay trace, reading a fake vLLM engine that
serves the full vLLM fixture (histograms and all, normalised by the sidecar) and watching two
processes named like vLLM's. Each pod serves that exposition with its own GPU count (the lines of
GPUs it lacks dropped), its own GPU UUIDs, counters that grow at the captured rate times a
per-pod factor and gauges that move every scrape, so Prometheus stores and compresses what a
real fleet sends.

The pods are N *targets* of one job, as a PodMonitor makes them: one simulator process answers
``/pods/<i>/metrics`` on one loopback port, and a file_sd target list gives each target its
``__metrics_path__`` and the labels the Prometheus Operator sets (``namespace``, ``pod``,
``container``, ``endpoint``, ``instance``, ``job``). One target with ``honor_labels`` would be
cheaper to serve but not what Prometheus does for a fleet: a scrape loop, a staleness tracker,
``up`` and the ``scrape_*`` series per target, and the rules' per-target aggregations over
series that really belong to different targets.

Prometheus (Debian's 2.42) loads the pack's ``recording_rules.yaml`` and ``alerts.yaml``
(profile ``sidecar``) and scrapes every 15 s (the chart's PodMonitor default) and evaluates
every 30 s (the Prometheus Operator's default). After a warm-up that fills the longest window
the records read (10 min), the run samples for ``--measure`` minutes: each rule group's
``prometheus_rule_group_last_duration_seconds`` and each rule's evaluation time from
``/api/v1/rules`` (one value per evaluation, medians reported), the active series
(``prometheus_tsdb_head_series``; the fleet's own series, the pack's recorded series and the
raw series the pack's selectors read, counted by queries), Prometheus's RSS (median of samples)
and CPU (cores, over the measuring window).

    python bench/fleet.py run --gpus 1000 5000 10000 [--warmup 11] [--measure 5]
    python bench/fleet.py serve --gpus 1000 --port 9400 --targets /tmp/targets.json

``run`` writes ``bench/results/fleet-<UTC time>.json`` and ``bench/results/fleet-latest.json``;
``python bench/fleet.py report`` prints the tables of ``docs/scale.md`` from the latest.
This is a benchmark: it is not part of the test suite.
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
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "bench"))

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

from exporter.lab.processes import stop_process  # noqa: E402

SCRAPE_INTERVAL_S = 15
EVALUATION_INTERVAL_S = 30
JOB = "llm/inference-bottleneck-exporter"
NAMESPACES = 20
# GPUs per pod and the share of the fleet's GPUs in pods of that size.
POD_MIX = ((8, 0.50), (4, 0.25), (2, 0.15), (1, 0.10))
RULES = ROOT / "alert_rules"
_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{.*\})? (\S+)$")
_GPU = re.compile(r'\bgpu="(\d+)"')
_UUID = re.compile(r'uuid="(GPU-[^"]+)"')
# Gauges that hold still in a real sidecar: identities, limits, capacities, start times.
_CONSTANT = (
    "_info",
    "_start_time_seconds",
    "_max_fds",
    "_memory_total_bytes",
    "_cpu_online",
    "_probe_tokens",
    "_processes",
)


# --- the fleet ---------------------------------------------------------------------------------


def pod_sizes(gpus: int) -> list[int]:
    """GPUs per pod for a fleet of ``gpus``, in a fixed interleaved order (deterministic)."""
    # One unit of 80 GPUs holds the mix exactly: 5x8, 5x4, 6x2, 8x1 (24 pods).
    unit: list[int] = []
    counts = {size: round(share * 80 / size) for size, share in POD_MIX}
    while any(counts.values()):
        for size, _ in POD_MIX:
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


def fleet(gpus: int) -> list[PodIdentity]:
    pods = []
    for i, size in enumerate(pod_sizes(gpus)):
        namespace = f"llm-{i % NAMESPACES:02d}"
        model = {8: "llama-70b", 4: "mixtral", 2: "llama-8b-tp2", 1: "llama-8b"}[size]
        address = f"10.{(i >> 16) & 255}.{(i >> 8) & 255}.{i & 255}:10960"
        pods.append(PodIdentity(i, size, namespace, f"{model}-{i:05d}", address))
    return pods


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


class PodBody:
    """One pod's exposition at any time ``t`` (seconds since the simulator started)."""

    def __init__(self, template: Template, pod: PodIdentity) -> None:
        self.pod = pod
        # Pods differ in load by up to 20 %: a healthy fleet, GPUs mostly 50-90 % busy.
        factor = 0.8 + 0.2 * _unit(f"rate/{pod.index}")
        uuids = {
            old: f"GPU-{pod.index:08x}-{k:04x}-4{pod.index % 4096:03x}-8000-{k:012x}"
            for k, old in enumerate(template.uuids())
        }
        statics: list[str] = []
        pending = ""
        self.values: list[tuple[float, float, int, float]] = []  # (v0, rate, kind, phase)
        for entry in template.lines:
            if isinstance(entry, str):
                pending += entry + "\n"
                continue
            if entry.gpu is not None and entry.gpu >= pod.gpus:
                continue
            head = entry.head
            match = _UUID.search(head)
            if match:
                head = head.replace(match[1], uuids[match[1]])
            statics.append(pending + head + " ")
            pending = "\n"
            kind = {"counter": 0, "flag": 1, "gauge": 2, "clock": 3}[entry.kind]
            phase = 2 * math.pi * _unit(f"{pod.index}/{head}")
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


def capture(workdir: Path) -> tuple[str, float]:
    """The real sidecar's exposition (8 GPUs, vLLM) and its uptime when it was read."""
    trace = workdir / "trace-8gpu.jsonl"
    write_synthetic_trace(trace, gpus=8, duration_s=120.0)
    with (
        engine_lookalikes(),
        EngineServer(FIXTURES / "vllm.txt", workdir) as engine,
        exporter(trace, engine.metrics_url, workdir) as sidecar,
    ):
        deadline = time.monotonic() + 60
        headers = {"Accept": "text/plain;version=0.0.4"}
        while True:
            request = urllib.request.Request(sidecar.base + "/metrics", headers=headers)
            with urllib.request.urlopen(request, timeout=10) as response:
                text = response.read().decode()
            ready = (
                "inference_tokenizer_probe_tokens{" in text
                and 'inference_engine_up{engine="vllm"} 1.0' in text
                and re.search(r"^inference_engine_processes [2-9]", text, re.M) is not None
                and "inference_engine_hottest_thread_cpu_ratio " in text
                # GPM needs two samples a period apart: the H100's full set of series
                and "inference_gpu_sm_active_ratio{" in text
            )
            if ready or time.monotonic() > deadline:
                break
            time.sleep(1)
        if not ready:
            raise RuntimeError("the sidecar never reported the engine, its probe and processes")
        start = re.search(r"^process_start_time_seconds (\S+)$", text, re.M)
        age = time.time() - float(start[1]) if start else 10.0
    return text, age


# --- the simulator server -----------------------------------------------------------------------


async def _serve(bodies: list[PodBody], port: int, ready: Path | None) -> None:
    from aiohttp import web  # noqa: PLC0415

    t0 = time.monotonic()

    async def metrics(request: web.Request) -> web.Response:
        index = int(request.match_info["index"])
        if not 0 <= index < len(bodies):
            raise web.HTTPNotFound()
        body = bodies[index].render(time.monotonic() - t0)
        return web.Response(body=body, content_type="text/plain", charset="utf-8")

    app = web.Application()
    app.router.add_get("/pods/{index}/metrics", metrics)
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


def serve(args: argparse.Namespace) -> int:
    workdir = Path(tempfile.mkdtemp(prefix="fleet-capture-"))
    if args.exposition:
        data = json.loads(Path(args.exposition).read_text())
        text, age = data["text"], data["age_s"]
    else:
        text, age = capture(workdir)
    template = Template.parse(text, age)
    pods = fleet(args.gpus)
    bodies = [PodBody(template, pod) for pod in pods]
    address = f"127.0.0.1:{args.port}"
    Path(args.targets).write_text(json.dumps([pod.target(address) for pod in pods]))
    print(f"fleet: {args.gpus} GPUs, {len(pods)} pods on {address}", flush=True)
    asyncio.run(_serve(bodies, args.port, Path(args.ready) if args.ready else None))
    shutil.rmtree(workdir, ignore_errors=True)
    return 0


# --- Prometheus ---------------------------------------------------------------------------------


def prometheus_config(targets: Path, rules: Sequence[Path]) -> dict[str, Any]:
    return {
        "global": {
            "scrape_interval": f"{SCRAPE_INTERVAL_S}s",
            "scrape_timeout": "10s",
            "evaluation_interval": f"{EVALUATION_INTERVAL_S}s",
        },
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [{"job_name": "fleet", "file_sd_configs": [{"files": [str(targets)]}]}],
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


def rule_costs(api: Api, rules: Sequence[Path], repeat: int = 3) -> dict[str, dict[str, float]]:
    """Each rule's expression as an instant query with ``stats=all``: the samples it reads
    (deterministic, whatever else the machine runs), the series it returns (what a record
    writes, or the alert instances), and the fastest of ``repeat`` evaluations."""
    out: dict[str, dict[str, float]] = {}
    for path in rules:
        for group in yaml.safe_load(path.read_text())["groups"]:
            for rule in group["rules"]:
                name = rule.get("record") or rule.get("alert")
                key = f"{group['name']}/{name}"
                if key in out:
                    key += f"#{sum(1 for k in out if k.startswith(key))}"
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
    for group in api.get("/api/v1/rules")["data"]["groups"]:
        for rule in group["rules"]:
            name = rule.get("name", "")
            key = f"{group['name']}/{name}"
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


def measure_scale(  # noqa: PLR0917
    gpus: int,
    warmup_min: float,
    measure_min: float,
    workdir: Path,
    exposition: Path,
    pack: Path = RULES,
) -> dict[str, Any]:
    """One fleet size: the simulator, Prometheus, the warm-up, the measurements."""
    scale_dir = workdir / f"fleet-{gpus}"
    scale_dir.mkdir(parents=True, exist_ok=True)
    sim_port, prom_port = free_port(), free_port()
    targets, ready = scale_dir / "targets.json", scale_dir / "ready"
    running = Running()
    try:
        sim = subprocess.Popen(
            [
                sys.executable,
                str(Path(__file__)),
                "serve",
                "--gpus",
                str(gpus),
                "--port",
                str(sim_port),
                "--targets",
                str(targets),
                "--ready",
                str(ready),
                "--exposition",
                str(exposition),
            ],
            stdout=(scale_dir / "sim.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        running.processes.append(sim)
        deadline = time.monotonic() + 600
        while not ready.exists():
            if sim.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the simulator did not start; see {scale_dir / 'sim.log'}")
            time.sleep(0.5)
        rules = [pack / "recording_rules.yaml", pack / "alerts.yaml"]
        config = scale_dir / "prometheus.yml"
        config.write_text(json.dumps(prometheus_config(targets, rules), indent=2))
        prom = subprocess.Popen(
            [
                shutil.which("prometheus") or "prometheus",
                f"--config.file={config}",
                f"--storage.tsdb.path={scale_dir / 'data'}",
                f"--web.listen-address=127.0.0.1:{prom_port}",
                "--storage.tsdb.retention.time=2h",
            ],
            stdout=(scale_dir / "prometheus.log").open("wb"),
            stderr=subprocess.STDOUT,
        )
        running.processes.append(prom)
        api = Api(f"http://127.0.0.1:{prom_port}")
        pods = len(pod_sizes(gpus))
        started = time.monotonic()
        while True:
            with contextlib.suppress(OSError, KeyError, IndexError, ValueError):
                if api.scalar(f'count(up{{job="{JOB}"}} == 1)') >= pods:
                    break
            if prom.poll() is not None or time.monotonic() - started > 300:
                raise RuntimeError(f"targets not up; see {scale_dir / 'prometheus.log'}")
            time.sleep(2)
        took = time.monotonic() - started
        print(f"  {gpus} GPUs: {pods} targets up after {took:.0f} s", flush=True)
        # The cold start: active alerts by state every 30 s while the windows fill.
        cold_start: list[dict[str, Any]] = []
        while time.monotonic() - started < warmup_min * 60:
            found = api.get("/api/v1/query", query="count by (alertname, alertstate) (ALERTS)")
            cold_start.append(
                {
                    "s": round(time.monotonic() - started),
                    "alerts": {
                        f"{r['metric']['alertname']}/{r['metric']['alertstate']}": int(
                            float(r["value"][1])
                        )
                        for r in found["data"]["result"]
                    },
                }
            )
            time.sleep(30)
        proc = psutil.Process(prom.pid)
        sim_proc = psutil.Process(sim.pid)
        cpu0 = proc.cpu_times()
        sim_cpu0 = sim_proc.cpu_times()
        wall0 = time.monotonic()
        load0 = os.getloadavg()
        sample = Sample()
        while time.monotonic() - wall0 < measure_min * 60:
            _poll(api, proc, sample)
            time.sleep(EVALUATION_INTERVAL_S / 3)
        wall = time.monotonic() - wall0
        cpu1, sim_cpu1 = proc.cpu_times(), sim_proc.cpu_times()
        cores = (cpu1.user + cpu1.system - cpu0.user - cpu0.system) / wall
        sim_cores = (sim_cpu1.user + sim_cpu1.system - sim_cpu0.user - sim_cpu0.system) / wall
        load1 = os.getloadavg()
        own = api.text("/metrics")
        head = _metric_values(own, "prometheus_tsdb_head_series").get(
            "prometheus_tsdb_head_series", 0.0
        )
        # The fleet's own series: everything of the job but records and alert state (which
        # carry the job label as a join label).
        fleet_series = api.scalar(
            f'count({{job="{JOB}",__name__!~"inference(_gpu)?:.+|ALERTS|ALERTS_FOR_STATE"}})'
        )
        recorded = api.scalar('count({__name__=~"inference(_gpu)?:.+"})')
        alerts = api.scalar("count(ALERTS)")
        read = raw_read(api, pack_selectors(rules))
        scrape_p50 = api.scalar(f'quantile(0.5, scrape_duration_seconds{{job="{JOB}"}})')
        up = api.scalar(f'count(up{{job="{JOB}"}} == 1)')
        firing = api.get("/api/v1/query", query="count by (alertname, alertstate) (ALERTS)")
        groups = {
            name: {
                "median_ms": round(_median(list(values.values())) * 1000, 1),
                "max_ms": round(max(values.values()) * 1000, 1),
                "evaluations": len(values),
            }
            for name, values in sorted(sample.groups.items())
        }
        rule_times = {
            name: round(_median([v for v in values.values() if v > 0]) * 1000, 2)
            for name, values in sample.rules.items()
        }
        costs = rule_costs(api, rules)
        return {
            "gpus": gpus,
            "pods": pods,
            "targets_up": up,
            "head_series": head,
            "fleet_series": fleet_series,
            "recorded_series": recorded,
            "alerts_series": alerts,
            "raw_series_read": read,
            "rss_mib_median": round(_median(sample.rss_mib), 1),
            "rss_mib_max": round(max(sample.rss_mib), 1),
            "cpu_cores": round(cores, 3),
            "simulator_cpu_cores": round(sim_cores, 3),
            "scrape_duration_p50_s": round(scrape_p50, 4),
            "measured_s": round(wall, 1),
            "groups": groups,
            "load_average": [round(load0[0], 2), round(load1[0], 2)],
            "rules_ms": dict(sorted(rule_times.items(), key=lambda kv: -kv[1])),
            "rule_costs": costs,
            "cold_start": cold_start,
            "alerts": [
                {**r["metric"], "count": int(float(r["value"][1]))}
                for r in firing["data"]["result"]
            ],
        }
    finally:
        running.stop()
        shutil.rmtree(scale_dir / "data", ignore_errors=True)


def run(args: argparse.Namespace) -> int:
    if shutil.which("prometheus") is None:
        print("prometheus not found: apt-get install prometheus", file=sys.stderr)
        return 2
    workdir = Path(tempfile.mkdtemp(prefix="fleet-"))
    started = dt.datetime.now(dt.UTC)
    print(f"capturing the sidecar's exposition (work dir {workdir})", flush=True)
    text, age = capture(workdir)
    exposition = workdir / "exposition.json"
    exposition.write_text(json.dumps({"text": text, "age_s": age}))
    per_pod = {
        size: sum(1 for line in Template.parse(text, age).lines if _keeps(line, size))
        for size, _ in POD_MIX
    }
    scales = []
    for gpus in args.gpus:
        print(f"fleet of {gpus} GPUs", flush=True)
        result = measure_scale(gpus, args.warmup, args.measure, workdir, exposition, args.rules)
        scales.append(result)
        long = ("rules_ms", "rule_costs", "cold_start")
        brief = {k: v for k, v in result.items() if k not in long}
        print(json.dumps(brief), flush=True)
    out = {
        "started": started.isoformat(timespec="seconds"),
        "machine": machine(),
        "prometheus": subprocess.run(
            ["prometheus", "--version"], capture_output=True, text=True, check=False
        ).stdout.splitlines()[0],
        "scrape_interval_s": SCRAPE_INTERVAL_S,
        "evaluation_interval_s": EVALUATION_INTERVAL_S,
        "warmup_min": args.warmup,
        "measure_min": args.measure,
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


def report(args: argparse.Namespace) -> int:
    """The tables of docs/scale.md from a results file (default: the latest run)."""
    data = json.loads(Path(args.results).read_text())
    scales = data["scales"]
    groups = sorted({g for scale in scales for g in scale["groups"]})
    head = ["GPUs", "pods", "raw series", "recorded", "recorded / raw read", "RSS MiB", "CPU"]
    head += [f"`{g}` ms" for g in groups]
    print("| " + " | ".join(head) + " |")
    print("|" + "---|" * len(head))
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


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p_run = sub.add_parser("run", help="measure Prometheus with the pack at fleet sizes")
    p_run.add_argument("--gpus", type=int, nargs="+", default=[1000, 5000, 10000])
    p_run.add_argument("--warmup", type=float, default=11.0, help="minutes before measuring")
    p_run.add_argument("--measure", type=float, default=5.0, help="minutes of measurement")
    p_run.add_argument(
        "--rules", type=Path, default=RULES, help=f"the pack's directory (default {RULES})"
    )
    p_run.add_argument("--label", default="", help="a name for this run in the results file")
    p_serve = sub.add_parser("serve", help="only the simulator")
    p_serve.add_argument("--gpus", type=int, required=True)
    p_serve.add_argument("--port", type=int, required=True)
    p_serve.add_argument("--targets", required=True, help="file_sd target file to write")
    p_serve.add_argument("--ready", help="file to create once listening")
    p_serve.add_argument("--exposition", help="a captured exposition (JSON) instead of capturing")
    p_report = sub.add_parser("report", help="the tables of docs/scale.md")
    p_report.add_argument("results", nargs="?", default=str(RESULTS / "fleet-latest.json"))
    args = parser.parse_args(argv)
    if args.command == "run":
        return run(args)
    if args.command == "report":
        return report(args)
    return serve(args)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    raise SystemExit(main())
