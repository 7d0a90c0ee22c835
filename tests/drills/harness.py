"""Run one drill: the whole stack, the load, and a record of what fired, paged and ranked.

A drill starts, in its layout (``Scenario.layout``: the chart's default ``node``, or
``sidecar`` or ``dcgm``), the reference engine with the scenario's injection (unsized: a size
zero, or an admission cap that is the injection itself), the sidecar, what reads the GPU
(replaying the scenario's GPU trace, or NVML on a GPU machine: the node agent, the sidecar
itself or dcgm-exporter), Prometheus with the layout's fast rules and Alertmanager with the pack's
configuration paging a local PagerDuty capture. Then it measures what the engine serves on
this machine (:mod:`drills.calibrate`, a few seconds, while Prometheus already scrapes; a
gateway drill starts Prometheus after it, :func:`_watch_after_calibration`), sizes
its load and its injection from that (:mod:`drills.sizing`; the injection's sizes through the
engine's ``POST /lab/injection``), and starts the load. It polls Prometheus's alerts every
second and stops when the expected alert has fired, has paged twice (a repeat, to compare
``dedup_key``) and ``diagnose`` has ranked the signatures - or at the drill's deadline, from
the rule pack's timings (:func:`drills.scenarios.deadline`). A healthy drill always runs to
its deadline.

``DRILL_SLOWDOWN=8`` runs every reference engine with its model worker 8 times slower
(``--worker-slowdown``, a wait after each forward pass, as a slower accelerator) and replays a
GPU 8 times slower to match: the same matrix on a much slower machine (``make drills-slow``).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import os
import platform
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

import yaml
from drills import slo as drill_slo
from drills.calibrate import (
    CAL_OUTPUT_TOKENS,
    Calibration,
    CalibrationError,
    calibrate,
    thread_share,
)
from drills.scenarios import (
    DISAGG_SITE_CONFIG,
    ENGINE_ARGS,
    FRONTEND,
    KEEP_UP_DRILL,
    DisaggScenario,
    Load,
    Scenario,
    deadline,
)
from drills.sizing import KEEP_UP, Plan, plan
from drills.timing import PAGES_S
from prometheus_client.parser import text_string_to_metric_families

from exporter.lab import tritonmodel
from exporter.lab.layouts import rule_profile
from exporter.lab.processes import child_pythonpath, http_get, stop_process
from exporter.lab.refengine import DEFAULT_MODEL_NAME, hostpeak
from exporter.lab.refengine.cli import auto_threads
from exporter.lab.refengine.gputrace import HostPeaks, measure_host, write_trace
from exporter.lab.stack import JOB, TARGET_LABELS, Stack, StackConfig, StackError
from exporter.signatures.site import parse_config

POLL_S = 1.0
PAGES_FOR_DEDUP = 2
TRITON_MODEL = tritonmodel.MODEL  # the model the drills' PyTriton serves
MAX_SLOWDOWN = 100.0


def slowdown() -> float:
    """``DRILL_SLOWDOWN``: how many times slower every reference engine's model worker runs
    (1, its own speed, when unset). A bad value stops the run with one line."""
    raw = os.environ.get("DRILL_SLOWDOWN", "").strip() or "1"
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not 1.0 <= value <= MAX_SLOWDOWN:
        raise ValueError(f"DRILL_SLOWDOWN: a factor from 1 to {MAX_SLOWDOWN:g}, not {raw!r}")
    return value


def speed(factor: float) -> str:
    """The name of a run's speed, as the report heads its section."""
    return "natural" if factor == 1.0 else f"slow-{factor:g}x"


@functools.cache
def host_peaks() -> HostPeaks:
    """This host's peaks (fastest passes), measured once per session."""
    return measure_host()


_FASTEST = [0.0]  # the fastest decode stream seen this session (bytes/s)


def drill_peaks(factor: float, sized: Sized) -> HostPeaks:
    """The replayed GPU's peaks for one drill: the host's, as one thread can have them now
    (on a shared host, the share its neighbours leave: :meth:`HostPeaks.available`; the
    sustained rate measured as the drill starts), divided by the worker's slowdown."""
    # In this process (torch imported once per session, its own scheduling group as the
    # engine's): the second back to back is the whole cost.
    sustained = float(hostpeak.measure_sustained(auto_threads())["decode_stream_sustained"])
    host = host_peaks()
    # A fastest pass taken while the host was busy is only a lower bound on its peak: a
    # faster sustained rate later raises it.
    _FASTEST[0] = max(_FASTEST[0], host.memory_bandwidth, sustained)
    host = replace(host, memory_bandwidth=_FASTEST[0], sustained_bandwidth=sustained)
    peaks = host.available().slowed(factor)
    sized.host = {
        "fastest_bytes_per_s": host.memory_bandwidth,
        "sustained_bytes_per_s": host.sustained_bandwidth,
        "replayed_bytes_per_s": peaks.memory_bandwidth,
    }
    return peaks


ENGINE_NAMES = {"reference": "reference engine", "llamacpp": "llama-server", "triton": "PyTriton"}


def layout(scenario: Scenario | DisaggScenario) -> str:
    """Where a drill's processes run, for the report: the layout (who reads the GPUs, and the
    rule profile Prometheus loads), then the processes, every one a child of one host on
    127.0.0.1 (:mod:`exporter.lab.stack`)."""
    gpu = "the real GPU (NVML)" if getattr(scenario, "look", None) is None else "a replayed GPU"
    reader = READERS[scenario.layout]
    where = f"{scenario.layout} layout ({rule_profile(scenario.layout)} rules): one host: "
    if isinstance(scenario, DisaggScenario):
        return (
            f"{where}prefill + decode reference engines ({scenario.admitted} decode slots), "
            f"a sidecar each{reader and f', a {reader} each'}, Prometheus, Alertmanager; {gpu}"
        )
    engine = ENGINE_NAMES.get(scenario.engine, scenario.engine)
    slots = (
        f" ({scenario.admitted} of {scenario.full} slots)" if scenario.engine == "reference" else ""
    )
    front = "a stand-in llm-d gateway and its sidecar, " if scenario.gateway else ""
    return (
        f"{where}{front}{engine}{slots}, sidecar{reader and f', {reader}'}, Prometheus, "
        f"Alertmanager; {gpu}"
    )


# What reads the GPUs beside the sidecar, by layout (the sidecar itself: nothing).
READERS = {"node": "node agent", "sidecar": "", "dcgm": "dcgm-exporter"}


def _slowed(args: list[str], factor: float) -> list[str]:
    return [*args, "--worker-slowdown", f"{factor:g}"] if factor > 1.0 else args


@dataclass
class Sized:
    """What a drill measured and chose before its load, and how long it then waited."""

    slowdown: float = 1.0
    calibration: dict[str, Any] | None = None
    plan: dict[str, Any] | None = None
    sizes: dict[str, Any] | None = None  # the engine's answer to the sizes it was given
    deadline_s: float = 0.0
    deadline_how: str = ""
    host: dict[str, float] | None = None  # the host's decode stream rates, and the replayed
    layout: str = ""  # where the drill's processes ran (:func:`layout`)


@dataclass
class AlertSeen:
    pending_at: float | None = None  # seconds after the load started
    firing_at: float | None = None
    severity: str = ""
    description: str = ""
    summary: str = ""  # as the alert fired (a burn-rate page names its cause here)
    # When its `for` began again before it fired (Prometheus gave it a new activeAt: its
    # condition lapsed for an evaluation), seconds after the load started.
    restarted_at: list[float] = field(default_factory=list)

    def told(self) -> str:
        """As a failing drill's message tells it."""
        fired = "never" if self.firing_at is None else f"{self.firing_at}s"
        text = f"pending {self.pending_at}s, firing {fired}"
        if self.restarted_at:
            again = ", ".join(f"{t:g}" for t in self.restarted_at)
            text += f", its `for` began again at {again} s"
        return text


@dataclass
class DrillResult:
    scenario: str
    expected: str | None
    started: str
    engine: str = "reference"
    duration_s: float = 0.0
    alerts: dict[str, AlertSeen] = field(default_factory=dict)
    pages: list[dict[str, Any]] = field(default_factory=list)
    diagnose: dict[str, Any] | None = None
    diagnose_error: str = ""
    signals: dict[str, float | None] = field(default_factory=dict)
    load: dict[str, Any] | None = None
    error: str = ""
    workdir: str = ""
    instance: str = ""  # the sidecar's scrape address, Prometheus's ``instance`` label
    gateway_instance: str = ""  # the gateway's sidecar's, where a gateway fronts the engine
    restarted_at: float | None = None  # when the engine was killed and started again
    sized: Sized = field(default_factory=Sized)
    failed: str = ""  # the first line of the drill's failed check (empty: its checks held)
    slo: dict[str, Any] = field(default_factory=dict)  # drills.slo.SloWatch, as JSON

    def fired(self) -> dict[str, float]:
        return {a: s.firing_at for a, s in self.alerts.items() if s.firing_at is not None}

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


# Signals recorded when the expected alert fires, or at the end of a healthy drill or of one
# whose alert never fired (for docs/drills.md and for a failing drill's message).
SIGNALS = {
    "gpu_util": "inference:gpu_utilization:mean30s",
    "queue_depth": "inference:queue_depth:sum",
    "queue_trend_per_min": "60 * inference:queue_depth:deriv1m",
    "queue_share": "inference:queue_time_per_e2e_latency:ratio30s",
    "tokenizer_ms": "1000 * inference:tokenizer_latency_seconds:median30s",
    "itl_ms": "1000 * inference:inter_token_latency_seconds:median30s",
    "decode_efficiency": "min(inference:decode_roofline_efficiency:ratio30s)",
    "hottest_thread": "inference:engine_hottest_thread_cpu:mean30s",
    "softirq_node": "inference:cpu_softirq:ratio30s",
    "softirq_core": "inference:cpu_softirq_hottest_core:mean30s",
    "kv_cache": "inference:kv_cache_usage:max",
    "running": "inference:requests_running:mean30s",
}
# ... and where a gateway fronts the engine (drills.scenarios.GATEWAY_SCENARIOS): its queue, the
# engine's share of it, and the scale-out gate on the engine's pod and pool.
GATEWAY_SIGNALS = {
    "gateway_queue": "sum(inference_gateway:queue_depth:sum)",
    "gateway_stale": "max(inference_gateway_stale_endpoints)",
    "gateway_saturation": "max(inference_gateway_pool_saturation)",
    "gateway_shed_per_s": "sum(inference_gateway:requests_shed:rate30s)",
    "gateway_dispatched": 'sum(inference_gateway_requests_total{outcome="dispatched"})',
    "pool_gpu_util": "max(inference_gateway:pool_gpu_utilization:mean30s)",
    # 0 where the engine's share is the gateway's whole queue (one engine in the pool): one
    # query, so both records are of one evaluation
    "engine_share_less_gateway_queue": (
        'sum(inference:gateway_queue_depth_share:sum{pod="reference-0"})'
        " - sum(inference_gateway:queue_depth:sum)"
    ),
    "engine_own_queue": 'sum(inference_queue_depth{pod="reference-0"})',
    # the most requests the engine ran while Prometheus watched: none (the load stops at the
    # gateway; the calibration before Prometheus started)
    "engine_ran": 'max(max_over_time(inference_requests_running{pod="reference-0"}[1h]))',
    "scale_out_blocked": 'max(inference:scale_out_blocked:flag{pod="reference-0"})',
    "scale_out_eligible": 'max(inference:scale_out_eligible:bool{pod="reference-0"})',
    "pool_scale_out_eligible": "max(inference_pool:scale_out_eligible:bool)",
    "engine_advice_fix_gateway_scrape": (
        'max(inference:scaling_advice:info{pod="reference-0",advice="fix_gateway_scrape"})'
    ),
    # what else the pack advises on the engine's pod: nothing (the starved GPU's fix is the
    # gateway's consequence, left out of the advice while the gateway's cause held)
    "engine_advice_other": (
        'count(inference:scaling_advice:info{pod="reference-0",advice!="fix_gateway_scrape"})'
    ),
    "pool_advice_fix_gateway_scrape": (
        'max(inference_pool:scaling_advice:ratio{advice="fix_gateway_scrape"})'
    ),
}


def route_key(severity: str) -> str:
    return f'{{}}/{{alertname=~"Inference.+"}}/{{severity="{severity}"}}'


def expected_dedup_key(alertname: str, severity: str, instance: str) -> str:
    """Alertmanager's dedup_key for one group: SHA-256 of the route path and group labels."""
    labels = {"alertname": alertname, "instance": instance, "job": JOB, **TARGET_LABELS}
    body = ", ".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    return hashlib.sha256(f"{route_key(severity)}:{{{body}}}".encode()).hexdigest()


def machine() -> str:
    model = ""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{len(os.sched_getaffinity(0))} CPUs ({model or platform.machine()})"


def run_drill(scenario: Scenario, workdir: Path, *, device: str = "cpu") -> DrillResult:
    workdir.mkdir(parents=True, exist_ok=True)
    result = DrillResult(
        engine=scenario.engine,
        scenario=scenario.name,
        expected=scenario.expected,
        started=time.strftime("%Y-%m-%d %H:%M:%S"),
        workdir=str(workdir),
    )
    factor = slowdown() if scenario.engine == "reference" else 1.0
    wait = deadline(scenario)
    result.sized = Sized(
        slowdown=factor, deadline_s=wait.seconds, deadline_how=wait.how, layout=layout(scenario)
    )
    trace = (
        write_trace(scenario.look, workdir / "trace.jsonl", drill_peaks(factor, result.sized))
        if scenario.look
        else None
    )
    engine_args = _slowed([*ENGINE_ARGS, *scenario.engine_args, "--device", device], factor)
    if scenario.engine != "reference":
        engine_args = list(scenario.engine_args)  # the third-party server's own flags
    rules_config = None
    site_config = scenario.site_config()
    if site_config:
        rules_config = workdir / "site-config.yaml"
        rules_config.write_text(site_config, encoding="utf-8")
    cfg = StackConfig(
        workdir=workdir,
        layout=scenario.layout,
        injections=scenario.injections,
        engine_args=engine_args,
        trace=trace,
        rules_config=rules_config,
        engine=scenario.engine,
        gateway=scenario.gateway,
        prometheus_later=scenario.gateway,
    )
    began = time.monotonic()
    with Stack(cfg) as stack:
        result.instance = urllib.parse.urlsplit(stack.sidecar_url).netloc
        result.gateway_instance = urllib.parse.urlsplit(stack.gateway_sidecar_url).netloc
        try:
            sized = _size(stack, scenario, result.sized)
        except (CalibrationError, ValueError, OSError) as err:
            result.error = f"calibration: {err}"
            return _done(result, began, workdir)
        watch = drill_slo.SloWatch()
        if scenario.engine == "reference" and not scenario.gpu:  # the CPU matrix's
            _set_objectives(stack, scenario, result.sized, watch, workdir)
        if cfg.prometheus_later:
            try:
                _watch_after_calibration(stack)
            except (StackError, OSError) as err:
                result.error = f"prometheus: {err}"
                return _done(result, began, workdir)
        load = _start_load(stack, sized, wait.seconds, workdir)
        t0 = time.monotonic()
        try:
            _observe(stack, scenario, result, t0, watch)
            if result.diagnose is None and not result.diagnose_error:
                _evidence(stack, result)
        finally:
            result.slo = watch.to_json()
            result.load = _stop_load(load, workdir / "load.json")
            if device != "cpu":
                _keep_gpu_evidence(stack, workdir)
            if stack.capture is not None:
                result.pages = [
                    {
                        "after_s": round(p.at - t0, 1),
                        "receiver": p.receiver,
                        "alertname": p.alertname,
                        "body": p.body,
                    }
                    for p in stack.capture.snapshot()
                ]
    return _done(result, began, workdir)


def _set_objectives(
    stack: Stack,
    scenario: Scenario | DisaggScenario,
    sized: Sized,
    watch: drill_slo.SloWatch,
    workdir: Path,
) -> None:
    """The drill's objectives from its calibration and what its injection adds to a request
    (:mod:`drills.slo`, :attr:`drills.sizing.Plan.adds`) in its site config, and Prometheus's
    rules reloaded with them. Where that fails the drill runs on without them and
    ``watch.error`` says why (its checks of the advice still run)."""
    assert sized.calibration is not None
    share = float((sized.plan or {}).get("keep_up", KEEP_UP))
    keep_up = share if scenario.sizing == KEEP_UP_DRILL else 0.0
    disagg = isinstance(scenario, DisaggScenario)
    objectives = drill_slo.choose(
        sized.calibration,
        keep_up,
        adds=(sized.plan or {}).get("adds") or {},
        margins=drill_slo.DISAGG_MARGINS if disagg else drill_slo.MARGINS,
    )
    watch.objectives, watch.how = objectives.text(), objectives.how
    # On the site config the stack's rules were written from (the scenario's, plus what its
    # layout adds: the dcgm layout's GPU peaks), so reloading with objectives keeps the rest.
    current = stack.cfg.rules_config
    if current is not None:
        base = current.read_text("utf-8")
    elif isinstance(scenario, DisaggScenario):
        base = DISAGG_SITE_CONFIG
    else:
        base = scenario.site_config()
    config = workdir / "site-config-slo.yaml"
    config.write_text(objectives.site_config(DEFAULT_MODEL_NAME, base), encoding="utf-8")
    try:
        stack.reload_rules(config)
    except (StackError, OSError) as err:
        watch.error = f"the rules with the objectives did not load: {err}"


# How long a drill whose Prometheus starts after the calibration waits for the engine's sidecar
# to see the calibration's last request finish (it polls the engine every second).
IDLE_WAIT_S = 15.0


def _watch_after_calibration(stack: Stack) -> None:
    """Start Prometheus once the engine's sidecar reports no request running: the pack then
    never reads the calibration's traffic. A gateway drill needs this: none of its load reaches
    the engine, so whatever the pack finds on the engine besides the gateway's cause came from
    the calibration, and a signature the calibration's full batch trips in the first evaluation
    after the cold-start guard opens stays in the engine's advice for the cause hold (8x slower:
    the decode-overhead signature, a 16-sequence burst read against the replayed roofline, held
    at 29 s and stayed in the advice until 59 s, as the gateway's alert fired at 60 s)."""
    deadline_at = time.monotonic() + IDLE_WAIT_S
    while _exposed(stack.sidecar_url, "inference_requests_running") != 0.0:
        if time.monotonic() > deadline_at:
            raise StackError(
                f"the engine's sidecar still reports requests running {IDLE_WAIT_S:g} s after "
                "the calibration"
            )
        time.sleep(POLL_S / 4)
    stack.start_prometheus()


def _exposed(url: str, name: str) -> float | None:
    """The sum of ``name``'s samples in the exposition at ``url`` (None: no answer, or none)."""
    try:
        status, body = http_get(url + "/metrics", 5)
    except OSError:
        return None
    if status != 200:
        return None
    values = [
        float(sample.value)
        for family in text_string_to_metric_families(body.decode())
        for sample in family.samples
        if sample.name == name
    ]
    return sum(values) if values else None


def _done(result: DrillResult | DisaggResult, began: float, workdir: Path) -> Any:
    result.duration_s = round(time.monotonic() - began, 1)
    (workdir / "result.json").write_text(json.dumps(asdict(result), indent=2), "utf-8")
    return result


def _size(stack: Stack, scenario: Scenario | DisaggScenario, sized: Sized) -> Load:
    """Calibrate the drill's engine, size its load and injection, and give the engine the
    injection's sizes; the load to run."""
    engine = getattr(scenario, "engine", "reference")
    reference, triton = engine == "reference", engine == "triton"
    base = scenario.load
    # An overload needs only one sequence: what its admitted sequences serve, or (cpu-contention)
    # at most what a full batch would serve if batching were free (a rate above it floods).
    needs_full = scenario.sizing == KEEP_UP_DRILL
    cal: Calibration = calibrate(
        stack.engine_url,
        prompt_tokens=base.prompt_tokens,
        full=scenario.full if needs_full else None,
        api="triton" if triton else "openai",
        output_tokens=CAL_OUTPUT_TOKENS,
        model=DEFAULT_MODEL_NAME if reference else None,
        disaggregated=isinstance(scenario, DisaggScenario),
        served_model=TRITON_MODEL if triton else "",
        per_token=reference,
    )
    if "frontend-gil" in scenario.injections:
        _front_end_room(cal, scenario.site_config() if isinstance(scenario, Scenario) else "")
    sized.calibration = cal.to_json()
    chosen: Plan = plan(
        scenario.sizing,
        scenario.injections,
        base,
        cal,
        admitted=scenario.admitted,
        full=scenario.full,
        deadline_s=sized.deadline_s,
        cpus=len(os.sched_getaffinity(0)) if reference else 0,
    )
    sized.plan = chosen.to_json()
    if chosen.sizes:
        status, body = _post_json(stack.engine_url + "/lab/injection", chosen.sizes)
        if status != 200:
            raise CalibrationError(f"the engine refused the sizes {chosen.sizes}: {body!r}")
        sized.sizes = json.loads(body)
    return chosen.load


# How long frontend-gil waits for a machine whose neighbours leave one thread a core.
ROOM_WAIT_S = 60.0
ROOM_EVERY_S = 5.0


def _front_end_room(cal: Calibration, site_config: str) -> None:
    """frontend-gil's cause is one thread holding a core: its alert reads the busiest engine
    thread above a share of one core. Where the node's other runnable threads hold a thread
    below that share, no front-end can saturate a core and the alert cannot fire, whatever the
    injection's size: wait (up to :data:`ROOM_WAIT_S`) for one thread to get that share, and
    say so if it never does. Each measurement is kept in the calibration."""
    cfg = parse_config(yaml.safe_load(site_config) or {} if site_config else {}, "fast")
    need = cfg.ratio(FRONTEND, "hottest_thread_above")
    seen = [float(cal.extra["thread_share"])]
    deadline_at = time.monotonic() + ROOM_WAIT_S
    while seen[-1] < need and time.monotonic() < deadline_at:
        time.sleep(ROOM_EVERY_S)
        seen.append(round(thread_share(), 3))
    cal.extra["thread_share"] = seen[-1]
    cal.extra["thread_shares"] = seen
    if seen[-1] < need:
        load = Path("/proc/loadavg").read_text().split()[0]
        raise CalibrationError(
            f"one busy thread got {max(seen):.2f} of a core at most over {ROOM_WAIT_S:g} s "
            f"(load average {load}): a front-end thread cannot pass {FRONTEND}'s {need:g} of a "
            "core on this machine now; its neighbours hold the CPU (measured: "
            + ", ".join(f"{v:.2f}" for v in seen)
            + ")"
        )


def _post_json(url: str, body: dict[str, Any]) -> tuple[int, bytes]:
    req = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


# What a GPU drill keeps beside its result (bench/gpu/run.sh packs it): the real GPU's readings
# through the rule pack at the end of the run, and the sidecar's last exposition.
GPU_SIGNALS = {
    "gpu_util": "inference:gpu_utilization:mean30s",
    "engine_own_util": "inference:gpu_own_utilization:mean30s",
    "sm_active": "inference:gpu_sm_active:mean30s",
    "hbm_util": "inference:gpu_memory_bandwidth_utilization:mean30s",
    "busy_samples": "inference:gpu_utilization_busy_samples:ratio1m",
    "idle_samples": "inference:gpu_utilization_idle_samples:ratio1m",
    "samples_per_min": "inference:gpu_utilization_samples:increase1m",
    "peak_bandwidth_bytes_per_s": "inference:gpu_peak_memory_bandwidth_bytes_per_second:min",
    "peak_bf16_flops": "inference:gpu_peak_bf16_flops:min",
    "decode_efficiency": "min(inference:decode_roofline_efficiency:ratio30s)",
    "decode_floor_ms": "1000 * inference:decode_floor_seconds:mean30s",
    "itl_ms": "1000 * inference:inter_token_latency_seconds:mean30s",
    "prefill_efficiency": "min(inference:prefill_compute_efficiency:ratio30s)",
    "generation_tokens_per_s": "sum(inference:generation_tokens:rate30s)",
    "kv_cache": "inference:kv_cache_usage:max",
    "memory_used_ratio": (
        "max(inference_gpu_memory_used_bytes / inference_gpu_memory_total_bytes)"
    ),
}


def _keep_gpu_evidence(stack: Stack, workdir: Path) -> None:
    signals = {key: stack.scalar(expr) for key, expr in GPU_SIGNALS.items()}
    (workdir / "gpu-signals.json").write_text(json.dumps(signals, indent=2), "utf-8")
    with contextlib.suppress(OSError):
        status, body = http_get(stack.sidecar_url + "/metrics", timeout=10)
        if status == 200:
            (workdir / "sidecar-metrics.txt").write_bytes(body)
    # the node layout's GPUs are the node agent's (dcgm layout: dcgm-exporter's)
    for name, url in (("node-agent", stack.agent_url), ("dcgm-exporter", stack.dcgm_url)):
        with contextlib.suppress(OSError):
            status, body = http_get(url + "/metrics", timeout=10) if url else (0, b"")
            if status == 200:
                (workdir / f"{name}-metrics.txt").write_bytes(body)


def _start_load(
    stack: Stack, load: Load, deadline_s: float, workdir: Path
) -> subprocess.Popen[bytes]:
    """The drill's open-loop load, for its deadline and the pages after it (stopped earlier
    when the drill ends)."""
    cmd = [
        sys.executable,
        "-m",
        "exporter.cli",
        "load",
        "--url",
        stack.front_url,
        "--rate",
        f"{load.rate:.4g}",
        "--prompt-tokens",
        str(load.prompt_tokens),
        "--output-tokens",
        str(load.output_tokens),
        "--duration",
        f"{deadline_s + PAGES_S + 60:g}s",
        "--drain",
        "5s",
        "--progress",
        "off",
        "--output",
        "json",
    ]
    if stack.cfg.engine == "triton":
        cmd += ["--api", "triton", "--model", TRITON_MODEL]
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": child_pythonpath()}
    with (workdir / "load.json").open("wb") as out, (workdir / "load.log").open("wb") as err:
        return subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=env)


def _stop_load(proc: subprocess.Popen[bytes], summary: Path) -> dict[str, Any] | None:
    stop_process(proc, 20)  # the load generator prints its summary on SIGTERM
    try:
        loaded: dict[str, Any] = json.loads(summary.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return loaded


def _observe(
    stack: Stack, scenario: Scenario, result: DrillResult, t0: float, watch: drill_slo.SloWatch
) -> None:
    """Until the deadline; once the expected alert fires, until its page and the repeat came
    (at most PAGES_S after it fired, or after ``diagnose`` when that took longer). The burn
    and the advice every :data:`drills.slo.SAMPLE_S` meanwhile (``watch``)."""
    end = t0 + result.sized.deadline_s
    restart = scenario.restart_at_s
    sampled = -drill_slo.SAMPLE_S
    active: dict[str, str] = {}
    first = FirstLook(stack)
    while time.monotonic() < end:
        now = time.monotonic() - t0
        if now - sampled >= drill_slo.SAMPLE_S and first.ready():
            sampled = now
            watch.samples.append(_slo_sample(stack, now, scenario.expected, pool=False))
        if restart is not None and now >= restart:
            stack.restart_engine()
            result.restarted_at = round(now, 1)
            restart = None
        see_alerts(result.alerts, stack.alerts(), now, active)
        for child in stack.children:
            if not child.alive():
                result.error = f"{child.name} exited: {child.log_tail(5)}"
                return
        if scenario.expected is not None and scenario.expected in result.fired():
            if result.diagnose is None and not result.diagnose_error:
                # What the on-call would do when paged: ask diagnose, now.
                _evidence(stack, result)
                fired = t0 + result.fired()[scenario.expected]
                end = max(fired + PAGES_S, time.monotonic() + POLL_S)
            if stack.capture is None:
                return
            pages = [
                p
                for p in stack.capture.snapshot()
                if p.alertname == scenario.expected and p.action == "trigger"
            ]
            if len(pages) >= PAGES_FOR_DEDUP:
                return
        time.sleep(POLL_S)


def see_alerts(
    seen_by_name: dict[str, AlertSeen],
    alerts: list[dict[str, Any]],
    now: float,
    active: dict[str, str],
) -> None:
    """Note what Prometheus lists ``now``: when each alert first pended and fired, and each time
    a pending one's ``activeAt`` moved (its condition lapsed for an evaluation and its ``for``
    began again: what a drill whose alert never fired asks first). ``active`` holds each listed
    alert's last ``activeAt`` by its labels, from one call to the next, so a lapse is seen
    even where no poll caught the alert missing."""
    for alert in alerts:
        labels = alert["labels"]
        seen = seen_by_name.setdefault(labels["alertname"], AlertSeen())
        seen.severity = labels.get("severity", "")
        if seen.pending_at is None:
            seen.pending_at = round(now, 1)
        key = json.dumps(labels, sort_keys=True)
        began = str(alert.get("activeAt", ""))
        if key in active and active[key] != began and seen.firing_at is None:
            seen.restarted_at.append(round(now, 1))
        active[key] = began
        if alert["state"] == "firing" and seen.firing_at is None:
            seen.firing_at = round(now, 1)
            seen.description = alert.get("annotations", {}).get("description", "")
            seen.summary = alert.get("annotations", {}).get("summary", "")


# How far back the drill reads the verdicts: every query of one look at one time, which the
# rule evaluation before it has finished writing (a cause that begins to hold and the gate it
# closes are then read from the same evaluation).
LOOK_BACK_S = 1.0


class Scraping(Protocol):
    """What :class:`FirstLook` asks of Prometheus (:class:`exporter.lab.stack.Stack`)."""

    def scraped_every_target(self) -> bool: ...

    def evaluated_since(self, when: float) -> bool: ...


class FirstLook:
    """When a drill may begin to read the pack's verdicts: once Prometheus has scraped every
    target and then evaluated every rule group, :data:`LOOK_BACK_S` before the look. Until
    then the pack sees no exporter (``absent(up)``, or no ``up`` yet for a target): the CI
    check of e968669 found ``InferenceExporterDown`` holding in the first seconds (up to 7 s)
    of 14 of its drills, with nothing wrong. The advice, read over its window, still names that
    evaluation's ``fix_monitoring`` for a while: what the pack said, and reported so."""

    def __init__(self, stack: Scraping, clock: Callable[[], float] = time.time) -> None:
        self.stack = stack
        self.clock = clock
        self.scraped_at: float | None = None  # when every target was seen scraped
        self.evaluated_at: float | None = None  # when every group was seen evaluated since

    def ready(self) -> bool:
        with contextlib.suppress(OSError, ValueError, KeyError):
            if self.scraped_at is None:
                if self.stack.scraped_every_target():
                    self.scraped_at = self.clock()
            elif self.evaluated_at is None and self.stack.evaluated_since(self.scraped_at):
                self.evaluated_at = self.clock()
        return self.evaluated_at is not None and self.clock() - LOOK_BACK_S >= self.evaluated_at


def _slo_sample(stack: Stack, now: float, signature: str | None, *, pool: bool) -> drill_slo.Sample:
    at = time.time() - LOOK_BACK_S
    return drill_slo.sample(
        lambda expr: stack.query(expr, at), now - LOOK_BACK_S, signature, pool=pool
    )


def _evidence(stack: Stack, result: DrillResult) -> None:
    """The signals and diagnose's ranking, at the moment the expected alert fired (healthy: at
    the end of the run)."""
    result.signals = {k: stack.scalar(e) for k, e in SIGNALS.items()}
    if stack.gateway_url:
        result.signals.update({k: stack.scalar(e) for k, e in GATEWAY_SIGNALS.items()})
    _diagnose(stack, result)


def _diagnose(stack: Stack, result: DrillResult | DisaggResult) -> None:
    cmd = [
        sys.executable,
        "-m",
        "exporter.cli",
        "diagnose",
        "--prometheus.url",
        stack.prometheus_url,
        "--profile",
        rule_profile(stack.cfg.layout),
        *(["--config", str(stack.cfg.rules_config)] if stack.cfg.rules_config else []),
        "--output",
        "json",
        # The post-mortem the on-call would attach, from the drill's own Prometheus.
        "--report",
        str(Path(result.workdir) / POSTMORTEM),
        "--report.range",
        "15m",
    ]
    env = {**os.environ, "PYTHONPATH": child_pythonpath()}
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=60, check=False, env=env)
    if proc.returncode not in (0, 1):
        result.diagnose_error = proc.stderr.strip() or f"exit code {proc.returncode}"
        return
    try:
        result.diagnose = json.loads(proc.stdout)
    except json.JSONDecodeError:
        result.diagnose_error = f"not JSON: {proc.stdout[:200]!r}"


# The HTML post-mortem `diagnose --report` writes in each drill's work directory.
POSTMORTEM = "postmortem.html"


def dump_results(results: dict[str, DrillResult]) -> None:
    """The results so far as JSON where ``DRILL_RESULTS`` says (bench/gpu/run.sh)."""
    dump = os.environ.get("DRILL_RESULTS")
    if dump:
        data = {name: {**r.to_json(), "fired": r.fired()} for name, r in results.items()}
        Path(dump).write_text(json.dumps(data, indent=2), encoding="utf-8")


@contextlib.contextmanager
def noting_failure(result: DrillResult | DisaggResult) -> Iterator[None]:
    """A failed check's first line kept in the result (for the report), then raised on."""
    try:
        yield
    except AssertionError as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        result.failed = (lines[0] if lines else "a check failed")[:160]
        raise


def has_gpu() -> bool:
    """An NVIDIA driver on this machine: the GPU drills run only where this holds."""
    return Path("/dev/nvidiactl").exists()


# --- disaggregated drills ------------------------------------------------------------------------

# The engines' own series a disaggregated drill follows (vLLM's names; NIXL's on both servers).
ENGINE_SERIES = (
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:time_to_first_token_seconds_sum",
    "vllm:time_to_first_token_seconds_count",
    "vllm:nixl_xfer_time_seconds_sum",
    "vllm:nixl_xfer_time_seconds_count",
    "vllm:nixl_bytes_transferred_sum",
    "vllm:nixl_num_failed_transfers_total",
    "vllm:nixl_num_kv_expired_reqs_total",
    "vllm:request_success_total",
)
WARM_UP_S = 10.0
SAMPLE_S = 2.0
# The pool records a disaggregated drill reads when its signature fires (healthy: at the end).
POOL_SIGNALS = {
    "transfer_share": "inference_pool:ttft_transfer:ratio30s",
    "transfer_s": "inference_pool:kv_transfer_seconds:mean30s",
    "decode_queue": "inference_pool:decode_queue_depth:mean30s",
    "decode_trend_per_min": "60 * inference_pool:decode_queue_depth:deriv1m",
    "prefill_queue": "inference_pool:prefill_queue_depth:mean30s",
    "prefill_trend_per_min": "60 * inference_pool:prefill_queue_depth:deriv1m",
    "decode_kv_cache": "inference_pool:decode_kv_cache_usage:mean30s",
    "decode_running": "inference_pool:decode_requests_running:mean30s",
    "ratio_suggested": "inference_pool:prefill_decode_ratio:suggested30s",
}


@dataclass
class DisaggResult:
    scenario: str
    signature: str | None
    started: str
    duration_s: float = 0.0
    alerts: dict[str, AlertSeen] = field(default_factory=dict)
    pods: dict[str, list[str]] = field(default_factory=dict)  # alert -> the pods it is on
    # Each role's series, sampled every SAMPLE_S: (seconds after the load started, values).
    samples: dict[str, list[tuple[float, dict[str, float]]]] = field(default_factory=dict)
    load: dict[str, Any] | None = None
    error: str = ""
    workdir: str = ""
    pages: list[dict[str, Any]] = field(default_factory=list)
    diagnose: dict[str, Any] | None = None
    diagnose_error: str = ""
    signals: dict[str, float | None] = field(default_factory=dict)
    missed_polls: int = 0  # engine polls that failed (each a sample missing)
    sized: Sized = field(default_factory=Sized)
    failed: str = ""  # the first line of the drill's failed check (empty: its checks held)
    slo: dict[str, Any] = field(default_factory=dict)  # drills.slo.SloWatch, as JSON

    def fired(self) -> dict[str, float]:
        return {a: s.firing_at for a, s in self.alerts.items() if s.firing_at is not None}

    def window(self, role: str) -> tuple[dict[str, float], dict[str, float]]:
        """The first sample after the warm-up and the last one."""
        series = self.samples[role]
        first = next((v for t, v in series if t >= WARM_UP_S), series[-1][1])
        return first, series[-1][1]

    def delta(self, role: str, name: str) -> float:
        first, last = self.window(role)
        return last.get(name, 0.0) - first.get(name, 0.0)

    def transfer_share(self) -> float | None:
        """Mean KV transfer time over mean time to first token on the decode server, after
        the warm-up."""
        xfers = self.delta("decode", "vllm:nixl_xfer_time_seconds_count")
        ttfts = self.delta("decode", "vllm:time_to_first_token_seconds_count")
        if xfers <= 0 or ttfts <= 0:
            return None
        xfer = self.delta("decode", "vllm:nixl_xfer_time_seconds_sum") / xfers
        return xfer / (self.delta("decode", "vllm:time_to_first_token_seconds_sum") / ttfts)

    def gauge(self, role: str, name: str) -> list[float]:
        return [v.get(name, 0.0) for t, v in self.samples[role] if t >= WARM_UP_S]


def engine_values(url: str) -> dict[str, float] | None:
    """The followed series of one engine's /metrics (summed over label sets); None when the
    poll failed (the drill then misses one sample, as a scrape would)."""
    try:
        status, body = http_get(url + "/metrics", 5)
    except OSError:  # refused or timed out: seen once on a loaded machine, the engine alive
        return None
    if status != 200:
        return None
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(body.decode()):
        for sample in family.samples:
            if sample.name in ENGINE_SERIES:
                values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return values


def run_disagg_drill(scenario: DisaggScenario, workdir: Path) -> DisaggResult:
    """A prefill and a decode engine with their sidecars, Prometheus and Alertmanager, the
    load on the decode front; the engines' series and the alerts, until the deadline."""
    workdir.mkdir(parents=True, exist_ok=True)
    result = DisaggResult(
        scenario=scenario.name,
        signature=scenario.signature,
        started=time.strftime("%Y-%m-%d %H:%M:%S"),
        workdir=str(workdir),
    )
    rules_config = workdir / "site-config.yaml"
    rules_config.write_text(DISAGG_SITE_CONFIG, encoding="utf-8")
    factor = slowdown()
    wait = deadline(scenario)
    result.sized = Sized(
        slowdown=factor, deadline_s=wait.seconds, deadline_how=wait.how, layout=layout(scenario)
    )
    peaks = drill_peaks(factor, result.sized)
    cfg = StackConfig(
        workdir=workdir,
        layout=scenario.layout,
        injections=scenario.injections,
        engine_args=_slowed([*ENGINE_ARGS, *scenario.engine_args, "--device", "cpu"], factor),
        trace=write_trace(scenario.look, workdir / "trace.jsonl", peaks),
        prefill_args=_slowed([*ENGINE_ARGS, *scenario.prefill_args, "--device", "cpu"], factor),
        prefill_trace=write_trace("starved", workdir / "prefill-trace.jsonl", peaks),
        rules_config=rules_config,
        # vLLM's metrics do not say a server's role in the pair: each sidecar is told.
        sidecar_args=("--engine.role", "decode"),
        prefill_sidecar_args=("--engine.role", "prefill"),
    )
    began = time.monotonic()
    with Stack(cfg) as stack:
        try:
            sized = _size(stack, scenario, result.sized)
        except (CalibrationError, ValueError, OSError) as err:
            result.error = f"calibration: {err}"
            return _done(result, began, workdir)
        watch = drill_slo.SloWatch()
        _set_objectives(stack, scenario, result.sized, watch, workdir)
        load = _start_load(stack, sized, wait.seconds, workdir)
        t0 = time.monotonic()
        try:
            _follow(stack, scenario, result, t0, watch)
            if not result.error and result.diagnose is None and not result.diagnose_error:
                _pool_evidence(stack, result)
        finally:
            result.slo = watch.to_json()
            result.load = _stop_load(load, workdir / "load.json")
            result.pages = _pages(stack, t0)
    return _done(result, began, workdir)


def _follow(
    stack: Stack,
    scenario: DisaggScenario,
    result: DisaggResult,
    t0: float,
    watch: drill_slo.SloWatch,
) -> None:
    urls = {"prefill": stack.prefill_url, "decode": stack.engine_url}
    end = result.sized.deadline_s
    active: dict[str, str] = {}
    first = FirstLook(stack)
    while (now := time.monotonic() - t0) < end:
        if first.ready():
            watch.samples.append(_slo_sample(stack, now, scenario.signature, pool=True))
        for role, url in urls.items():
            values = engine_values(url)
            if values is None:
                result.missed_polls += 1
            else:
                result.samples.setdefault(role, []).append((round(now, 1), values))
        alerts = stack.alerts()
        see_alerts(result.alerts, alerts, now, active)
        for alert in alerts:
            pods = result.pods.setdefault(alert["labels"]["alertname"], [])
            if alert["labels"].get("pod", "") not in pods:
                pods.append(alert["labels"].get("pod", ""))
        for child in stack.children:
            if not child.alive():
                result.error = f"{child.name} exited: {child.log_tail(5)}"
                return
        if scenario.signature is not None and scenario.signature in result.fired():
            if result.diagnose is None and not result.diagnose_error:
                _pool_evidence(stack, result)  # what the on-call would do when paged
                fired = result.fired()[scenario.signature]
                end = max(fired + PAGES_S, time.monotonic() - t0 + SAMPLE_S)
            if any(p["alertname"] == scenario.signature for p in _pages(stack, t0)):
                return
        time.sleep(SAMPLE_S)


def _pool_evidence(stack: Stack, result: DisaggResult) -> None:
    """The pool records and diagnose's ranking, when the signature fired (healthy: at the end)."""
    result.signals = {k: stack.scalar(e) for k, e in POOL_SIGNALS.items()}
    _diagnose(stack, result)


def _pages(stack: Stack, t0: float) -> list[dict[str, Any]]:
    """The PagerDuty triggers Alertmanager sent so far."""
    if stack.capture is None:
        return []
    return [
        {
            "after_s": round(p.at - t0, 1),
            "receiver": p.receiver,
            "alertname": p.alertname,
            "body": p.body,
        }
        for p in stack.capture.snapshot()
        if p.action == "trigger"
    ]
