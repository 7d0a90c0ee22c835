"""The whole pipeline on one machine: engine, sidecar, node agent, Prometheus, Alertmanager,
PagerDuty.

Used by ``demo`` and the drills (``tests/drills``), in a layout of :mod:`exporter.lab.layouts`
(``StackConfig.layout``). The ``node`` layout, the chart's default::

    reference engine --/metrics, /tokenize--> sidecar (no NVML) --scrape--+
    replayed GPU or NVML --> node agent <--PodResources-- stand-in kubelet |
                                        --scrape (honor_labels)-----------+--> Prometheus
    stand-in kube-state-metrics (kube_pod_info) --scrape-----------------+    (fast-node rules)
                                                                               --> Alertmanager
                                                                               --> PagerDuty capture

The ``sidecar`` layout: the sidecar reads the replayed GPU (or NVML) itself, and Prometheus
loads the ``fast`` rules. The ``dcgm`` layout: a stand-in dcgm-exporter (a thread here) reads
it and labels it with its pod, and Prometheus loads the ``fast-dcgm`` rules. In the node and
dcgm layouts each pod has a node of its own (a stand-in kubelet, and a node agent or
dcgm-exporter reading that pod's replayed GPU), and the kubelet gives the pod every GPU there.

Disaggregated (``StackConfig.prefill_args`` set): a prefill engine (``--role prefill``) starts
first, the engine above becomes its decode server and the pair's front (``--role decode
--prefill-url``), and a second sidecar watches the prefill engine; Prometheus scrapes both
sidecars, the prefill one with ``pod`` ``reference-prefill-0``.

With a gateway (``StackConfig.gateway``): a stand-in llm-d endpoint picker
(:mod:`exporter.lab.gateway`) in front of the engine, holding requests in its flow-control queue
while it finds the pool saturated; it takes the gateway's injections (``stale-endpoints``), the
engine the others. A sidecar of its own reads it (``--engine.type llmd-epp``, no GPU), scraped
with ``pod`` ``gateway-0``; the load goes to it (``Stack.front_url``).

Every process is a child with its log in the work directory, bound to 127.0.0.1 only; the
stand-in kubelets, kube-state-metrics and dcgm-exporters serve from threads of this process. The
engine writes its model's Hugging Face description to ``<workdir>/model`` (``--model-dir``)
and the sidecar reads it (``--model.path``), as a sidecar reads the served model's mounted
directory, so the model's roofline facts are the real model's.
Prometheus and Alertmanager are optional (``prometheus``, ``alertmanager`` or Debian's
``prometheus-alertmanager`` on ``PATH``); with ``prometheus_later`` Prometheus starts only when
the caller says (:meth:`Stack.start_prometheus`), after what it must not see. The rules are
generated from the signature catalogue (the layout's profile at ``fast``'s speed: windows and
``for`` scaled by 1/10); Alertmanager runs the pack's own configuration (``alertmanager_yaml``)
with three changes only: the PagerDuty URL points at the local capture endpoint, the routing
keys are files in the work directory, and group_wait, group_interval and repeat_interval are
shortened (``--am-timing``) so that a drill sees a page and its repeat within seconds. No torch
is imported here.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from pathlib import Path
from typing import Any

import yaml

from exporter.lab import layouts
from exporter.lab.gateway import GATEWAY_INJECTIONS
from exporter.lab.layouts import DEFAULT_LAYOUT, MetricsServer, Node, Pod, Target
from exporter.lab.processes import (
    Child,
    PagerDutyCapture,
    Server,
    StackError,
    fast_sidecar_flags,
    find_binary,
    free_port,
    http_get,
    log_match,
    spawn,
    start_alertmanager,
    start_exporter,
    start_prometheus,
    uninterrupted,
    wait_until,
)

__all__ = ["JOB", "TARGET_LABELS", "PagerDutyCapture", "Stack", "StackConfig", "StackError"]

# The reference engine's front-end process, not its worker or injection helpers.
PROCESS_MATCH = r"-m exporter\.lab\.refengine(?:\s|$)"
ENGINE_LISTEN = re.compile(r"listening on http://(\S+):(\d+)")
JOB = layouts.SIDECAR_JOB
# Injections that act on the node, not inside the engine: any engine can be drilled with them
# (a third-party engine's helpers run in its session: exporter.lab.thirdparty.with_helpers).
OUTSIDE = frozenset({"cpu-contention", "softirq"})
TARGET_LABELS = {"namespace": "drill", "pod": "reference-0"}
PREFILL_TARGET_LABELS = {"namespace": "drill", "pod": "reference-prefill-0"}
GATEWAY_TARGET_LABELS = {"namespace": "drill", "pod": "gateway-0"}
# The stand-in gateway's process, for its sidecar's process collectors.
GATEWAY_PROCESS_MATCH = r"-m exporter\.lab\.gateway(?:\s|$)"


def _flag(args: Sequence[str], name: str) -> str:
    """The value of flag ``name`` in ``args`` (``--name value`` or ``--name=value``; the last
    one), or empty."""
    value = ""
    for index, arg in enumerate(args):
        if arg == name and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith(name + "="):
            value = arg.split("=", 1)[1]
    return value


# --- configuration files -------------------------------------------------------------------------


@dataclass(frozen=True)
class AmTiming:
    group_wait: str = "1s"
    group_interval: str = "2s"
    repeat_interval: str = "4s"


def alertmanager_config(pd_url: str, key_file: Path, timing: AmTiming) -> str:
    """The pack's Alertmanager configuration with every PagerDuty receiver sending to
    ``<pd_url>/<receiver name>`` (so a test sees which receiver paged), its routing keys read
    from ``key_file``, and short timings."""
    from exporter.signatures.alertmanager import alertmanager_yaml  # noqa: PLC0415
    from exporter.signatures.site import load_config  # noqa: PLC0415

    config = yaml.safe_load(alertmanager_yaml(load_config(None, "sidecar")))
    config.setdefault("global", {})["pagerduty_url"] = pd_url

    def retime(route: dict[str, Any]) -> None:
        for key in ("group_wait", "group_interval", "repeat_interval"):
            if key in route or route is config["route"]:
                route[key] = getattr(timing, key)
        for child in route.get("routes", []):
            retime(child)

    retime(config["route"])
    for receiver in config.get("receivers", []):
        for pd in receiver.get("pagerduty_configs", []):
            pd["url"] = f"{pd_url}/{receiver['name']}"
            if "routing_key_file" in pd:
                pd["routing_key_file"] = str(key_file)
    return str(yaml.safe_dump(config, sort_keys=False, width=1000))


def write_rules(
    workdir: Path, profile: str = layouts.rule_profile(DEFAULT_LAYOUT), config: Path | None = None
) -> list[Path]:
    """The pack's recording rules and alerts for ``profile`` and the site ``config``."""
    from exporter.signatures.render import alerts_yaml, recording_rules_yaml  # noqa: PLC0415
    from exporter.signatures.site import load_config  # noqa: PLC0415

    cfg = load_config(config, profile)
    records = workdir / "recording_rules.yaml"
    alerts = workdir / "alerts.yaml"
    records.write_text(recording_rules_yaml(cfg), encoding="utf-8")
    alerts.write_text(alerts_yaml(cfg), encoding="utf-8")
    return [records, alerts]


def prometheus_config(
    scrape: list[dict[str, Any]],
    alertmanager: str | None,
    rules: list[Path],
    interval: float,
) -> str:
    """Prometheus scraping the ``scrape`` jobs (:func:`exporter.lab.layouts.scrape_configs`)
    every ``interval`` seconds and evaluating ``rules`` as often."""
    config: dict[str, Any] = {
        "global": {"scrape_interval": f"{interval:g}s", "evaluation_interval": f"{interval:g}s"},
        "rule_files": [str(p) for p in rules],
        "scrape_configs": scrape,
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return str(yaml.safe_dump(config, sort_keys=False))


# --- the stack -----------------------------------------------------------------------------------


@dataclass
class StackConfig:
    workdir: Path
    # Who reads the GPUs (exporter.lab.layouts): "node" (the chart's default), "sidecar", "dcgm".
    layout: str = DEFAULT_LAYOUT
    injections: Sequence[str] = ()
    engine_args: Sequence[str] = ()
    trace: Path | None = None  # None: real NVML
    prometheus: bool = True
    # Prometheus only once the caller calls Stack.start_prometheus (a drill that calibrates its
    # engine first, so the pack never reads the calibration's traffic in its windows).
    prometheus_later: bool = False
    alertmanager: bool = True
    interval: float = 2.0  # scrape and rule evaluation
    probe_interval: str = "1s"  # the sidecar's shortest: medians of 30 probes in a 30 s window
    am_timing: AmTiming = field(default_factory=AmTiming)
    rules_config: Path | None = None  # site config of the rule pack (the layout's fast profile)
    engine_port: int = 0
    sidecar_port: int = 0
    agent_port: int = 0  # the node agent of the engine's node (node layout)
    prometheus_port: int = 0
    alertmanager_port: int = 0
    start_timeout: float = 240.0
    target_labels: dict[str, str] = field(default_factory=lambda: dict(TARGET_LABELS))
    sidecar_args: Sequence[str] = ()  # more flags of the engine's sidecar
    # Disaggregated: the prefill engine's flags (None: one colocated engine) and its sidecar's.
    prefill_args: Sequence[str] | None = None
    prefill_sidecar_args: Sequence[str] = ()
    prefill_trace: Path | None = None  # the prefill sidecar's replayed GPU (None: ``trace``)
    # "reference", or a third-party engine of :mod:`exporter.lab.thirdparty` ("llamacpp",
    # "triton"): its ``engine_args`` are that server's flags, and injections that act from
    # outside an engine (cpu-contention, softirq) run in its session (thirdparty.with_helpers).
    engine: str = "reference"
    # A stand-in llm-d endpoint picker in front of the engine (exporter.lab.gateway), with its
    # own sidecar; ``gateway_args`` are more of its flags.
    gateway: bool = False
    gateway_args: Sequence[str] = ()


class Stack:
    """Starts the components in order (:meth:`start`) and stops them in reverse (:meth:`stop`)."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.children: list[Child] = []
        self.capture: PagerDutyCapture | None = None
        self.engine_url = ""
        self.metrics_url = ""  # the engine's Prometheus endpoint (Triton: a port of its own)
        self.prefill_url = ""
        self.sidecar_url = ""
        self.prefill_sidecar_url = ""
        self.gateway_url = ""  # the stand-in gateway in front of the engine (cfg.gateway)
        self.gateway_sidecar_url = ""
        self.prometheus_url = ""
        self.alertmanager_url = ""
        # The node layout's stand-in nodes (the engine's first) and kube-state-metrics.
        self.nodes: list[Node] = []
        self.kube_state_metrics: MetricsServer | None = None
        self.prometheus_bin = find_binary("prometheus") if cfg.prometheus else None
        self.alertmanager_bin = (
            find_binary("alertmanager", "prometheus-alertmanager")
            if cfg.alertmanager and self.prometheus_bin
            else None
        )

    def __enter__(self) -> Stack:
        try:
            self.start()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def model_dir(self) -> Path:
        """Where the engine writes its model's description, for the sidecar's model collector."""
        return self.cfg.workdir / "model"

    @property
    def front_url(self) -> str:
        """Where clients send requests: the gateway where there is one, else the engine."""
        return self.gateway_url or self.engine_url

    def child(self, name: str) -> Child:
        for c in self.children:
            if c.name == name:
                return c
        raise KeyError(name)

    @property
    def agent_url(self) -> str:
        """The node agent that reads the engine's GPUs (node layout; else empty)."""
        return self.nodes[0].url if self.nodes and self.cfg.layout == "node" else ""

    @property
    def dcgm_url(self) -> str:
        """The stand-in dcgm-exporter that reads the engine's GPUs (dcgm layout; else empty)."""
        return self.nodes[0].url if self.nodes and self.cfg.layout == "dcgm" else ""

    def _pods(self) -> list[tuple[dict[str, str], Path | None, int]]:
        """Each pod's target labels, replayed GPU and agent port: the engine's, then the
        prefill engine's."""
        cfg = self.cfg
        pods = [(dict(cfg.target_labels), cfg.trace, cfg.agent_port)]
        if cfg.prefill_args is not None:
            pods.append((dict(PREFILL_TARGET_LABELS), cfg.prefill_trace or cfg.trace, 0))
        return pods

    def start(self) -> None:
        cfg = self.cfg
        cfg.workdir.mkdir(parents=True, exist_ok=True)
        layouts.rule_profile(cfg.layout)  # an unknown layout fails before anything starts
        if set(cfg.injections) & GATEWAY_INJECTIONS and not cfg.gateway:
            raise StackError("stale-endpoints is a gateway's injection: set StackConfig.gateway")
        if cfg.layout == "dcgm":
            # The replayed GPUs' peaks, which dcgm-exporter does not report, for Prometheus's
            # rules and for whoever reads ``cfg.rules_config`` after (diagnose, the demo).
            traces = [t for t in (cfg.trace, cfg.prefill_trace) if t is not None]
            site = layouts.dcgm_site_config(
                cfg.rules_config, traces, cfg.workdir / "site-config-dcgm.yaml"
            )
            self.cfg = cfg = replace(cfg, rules_config=site)
        if cfg.layout != "sidecar":
            self._start_nodes()
        if cfg.prefill_args is not None:
            self.prefill_url = self._engine(
                "prefill",
                ["--role", "prefill", *cfg.prefill_args],
                cfg.workdir / "prefill-model",
                0,
            )
            self.prefill_sidecar_url = self._sidecar(
                "sidecar-prefill",
                self.prefill_url + "/metrics",
                cfg.workdir / "prefill-model",
                0,
                cfg.prefill_sidecar_args,
                trace=cfg.prefill_trace or cfg.trace,
                node=1,
            )
        self._start_engine()
        self._start_sidecar()
        if cfg.gateway:
            self._start_gateway()
        if self.alertmanager_bin:
            self._start_alertmanager()
        if self.prometheus_bin and not cfg.prometheus_later:
            self._start_prometheus()

    def start_prometheus(self) -> None:
        """Start Prometheus where ``cfg.prometheus_later`` held it back, with the rules of
        ``cfg.rules_config`` as it names them now (:meth:`reload_rules` before this records
        the site config only)."""
        if not self.cfg.prometheus_later or self.prometheus_url:
            raise StackError("Prometheus starts with the stack unless prometheus_later is set")
        if self.prometheus_bin:
            self._start_prometheus()

    def _start_nodes(self) -> None:
        """One stand-in node per pod, its kubelet giving the pod every GPU that the node's
        agent (node layout) or dcgm-exporter (dcgm layout) reads; in the node layout,
        kube-state-metrics naming the pods."""
        pods = []
        for index, (labels, trace, port) in enumerate(self._pods()):
            pod = Pod(labels["namespace"], labels["pod"], [layouts.Container("engine")])
            if self.cfg.layout == "dcgm":
                node = layouts.start_dcgm_node(index, [pod], trace=trace)
            else:
                node = layouts.start_node(
                    self.cfg.workdir, index, [pod], trace=trace, port=free_port(port) if port else 0
                )
            self.nodes.append(node)
            if node.agent is not None:
                self.children.append(node.agent)
            pods.append(pod)
        if self.cfg.layout == "node":
            self.kube_state_metrics = MetricsServer(lambda: layouts.kube_pod_info(pods))

    def _start_engine(self) -> None:
        cfg = self.cfg
        if cfg.engine != "reference":
            self._start_thirdparty()
            return
        args = [
            *[
                arg
                for name in cfg.injections
                if name not in GATEWAY_INJECTIONS
                for arg in ("--inject", name)
            ],
            *cfg.engine_args,
        ]
        if self.prefill_url:
            args += ["--role", "decode", "--prefill-url", self.prefill_url]
        self.engine_url = self._engine("engine", args, self.model_dir, cfg.engine_port)
        self.metrics_url = self.engine_url + "/metrics"

    def _engine(self, name: str, args: Sequence[str], model_dir: Path, port: int) -> str:
        cmd = [
            sys.executable,
            "-m",
            "exporter.lab.refengine",
            "--port",
            str(free_port(port) if port else 0),
            "--model-dir",
            str(model_dir),
            *args,
        ]
        return self._spawn_listening(name, cmd)

    def _spawn_listening(self, name: str, cmd: list[str]) -> str:
        """Start ``cmd`` as child ``name`` and return its URL once its log says where it listens
        (the reference engine's and the stand-in gateway's 'listening on' line)."""
        child = spawn(name, cmd, self.cfg.workdir)
        self.children.append(child)
        wait_until(
            lambda: log_match(child, ENGINE_LISTEN) is not None,
            self.cfg.start_timeout,
            "'listening on' line",
            child=child,
        )
        match = log_match(child, ENGINE_LISTEN)
        assert match is not None
        return f"http://{match.group(1)}:{match.group(2)}"

    def _start_gateway(self) -> None:
        """The stand-in endpoint picker in front of the engine, and its sidecar."""
        from exporter.lab.refengine import DEFAULT_MODEL_NAME  # noqa: PLC0415

        cfg = self.cfg
        cmd = [
            sys.executable,
            "-m",
            "exporter.lab.gateway",
            "--port",
            "0",
            "--endpoint",
            self.engine_url,
            "--model",
            _flag(cfg.engine_args, "--served-model-name") or DEFAULT_MODEL_NAME,
            *[
                arg
                for name in cfg.injections
                if name in GATEWAY_INJECTIONS
                for arg in ("--inject", name)
            ],
            *cfg.gateway_args,
        ]
        self.gateway_url = self._spawn_listening("gateway", cmd)
        sidecar, self.gateway_sidecar_url = start_exporter(
            "sidecar-gateway",
            [
                "--web.listen-address",
                "127.0.0.1:0",
                "--engine.url",
                self.gateway_url + "/metrics",
                "--engine.type",
                "llmd-epp",
                *fast_sidecar_flags(engine_poll="1s", engine_timeout="2s", scrape_timeout="2s"),
                "--log.format",
                "json",
                # The gateway's pod has no GPU.
                "--no-collector.nvml",
                "--process.match",
                GATEWAY_PROCESS_MATCH,
            ],
            cfg.workdir,
        )
        self.children.append(sidecar)

    def _start_thirdparty(self) -> None:
        from exporter.lab import thirdparty  # noqa: PLC0415

        cfg = self.cfg
        own = thirdparty.ENGINE_INJECTIONS.get(cfg.engine, {})
        inside = set(cfg.injections) - OUTSIDE - set(own) - GATEWAY_INJECTIONS
        if inside:
            raise StackError(
                f"{cfg.engine} takes only injections from outside the engine "
                f"({', '.join(sorted(OUTSIDE))}), not {', '.join(sorted(inside))}"
            )
        launched = thirdparty.start(
            cfg.engine,
            cfg.workdir,
            cfg.engine_args,
            injections=cfg.injections,
            port=cfg.engine_port,
        )
        self.children += launched.children
        self.engine_url = launched.api_url
        self.metrics_url = launched.metrics_url

    def restart_engine(self) -> None:
        """Kill llama-server (SIGKILL, whatever it was doing) and start it again on the same
        port, its counters from zero: what an engine crash and its restart look like to the
        sidecar. Only for an engine whose metrics share its serving port."""
        from exporter.lab import thirdparty  # noqa: PLC0415

        cfg = self.cfg
        if cfg.engine != "llamacpp":
            raise StackError(f"restart_engine: not for {cfg.engine}")
        old = self.child("engine")
        old.proc.kill()
        old.stop()
        self.children.remove(old)
        old.log_path.replace(cfg.workdir / "engine-killed.log")
        port = urllib.parse.urlsplit(self.engine_url).port or 0
        launched = thirdparty.start(
            cfg.engine,
            cfg.workdir,
            cfg.engine_args,
            injections=cfg.injections,
            port=port,
            exact_port=True,
        )
        self.children[:0] = launched.children  # stopped last, as at the start
        if launched.metrics_url != self.metrics_url:
            raise StackError(f"the restarted engine came up at {launched.metrics_url}")

    def _start_sidecar(self) -> None:
        cfg = self.cfg
        # An engine whose API is not on its metrics port (Triton: 8000 and 8002 in production,
        # two free ports here) is told where its API is, as a user deploying it would.
        api, metrics = (
            urllib.parse.urlsplit(self.engine_url),
            urllib.parse.urlsplit(self.metrics_url),
        )
        api_args = (
            ["--engine.api-url", f"{api.scheme}://{api.netloc}"]
            if self.engine_url and api.netloc != metrics.netloc
            else []
        )
        self.sidecar_url = self._sidecar(
            "sidecar",
            self.metrics_url,
            self.model_dir,
            cfg.sidecar_port,
            [*api_args, *cfg.sidecar_args],
            trace=cfg.trace,
        )

    def _sidecar(
        self,
        name: str,
        metrics_url: str,
        model_dir: Path,
        port: int,
        args: Sequence[str],
        *,
        trace: Path | None,
        node: int = 0,
    ) -> str:
        cfg = self.cfg
        port = free_port(port) if port else 0
        cmd = [
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--engine.url",
            metrics_url,
            # The reference engine under an injected bottleneck may answer a poll slowly:
            # a 1 s poll with the default 2 s timeouts.
            *fast_sidecar_flags(
                engine_poll="1s", engine_timeout="2s", probe=cfg.probe_interval, scrape_timeout="2s"
            ),
            "--log.format",
            "json",
            *layouts.sidecar_flags(cfg.layout, self.nodes[node].url if self.nodes else ""),
            *args,
        ]
        if cfg.engine == "reference":
            # A third-party engine's processes are found by the default --process.match (every
            # engine's process regex) and it has no Hugging Face model directory.
            cmd += ["--process.match", PROCESS_MATCH, "--model.path", str(model_dir)]
        if trace is not None and cfg.layout == "sidecar":
            cmd += ["--gpu.replay-file", str(trace)]
        sidecar, url = start_exporter(name, cmd, cfg.workdir)
        self.children.append(sidecar)
        return url

    def _start_alertmanager(self) -> None:
        cfg = self.cfg
        self.capture = PagerDutyCapture()
        key = cfg.workdir / "pagerduty-routing-key"
        key.write_text("drill-routing-key-0000000000000000\n", encoding="utf-8")
        config = alertmanager_config(self.capture.url, key, cfg.am_timing)
        server = start_alertmanager(cfg.workdir, config, port=cfg.alertmanager_port)
        self.alertmanager_url = self._keep(server)

    def _start_prometheus(self) -> None:
        cfg = self.cfg
        rules = write_rules(cfg.workdir, layouts.rule_profile(cfg.layout), cfg.rules_config)
        am = urllib.parse.urlsplit(self.alertmanager_url).netloc if self.alertmanager_url else None
        urls = [self.sidecar_url]
        if self.prefill_sidecar_url:
            urls.append(self.prefill_sidecar_url)
        sidecars = [
            Target(urllib.parse.urlsplit(url).netloc, labels)
            for url, (labels, _, _) in zip(urls, self._pods(), strict=True)
        ]
        if self.gateway_sidecar_url:
            netloc = urllib.parse.urlsplit(self.gateway_sidecar_url).netloc
            sidecars.append(Target(netloc, dict(GATEWAY_TARGET_LABELS)))
        ksm = self.kube_state_metrics
        scrape = layouts.scrape_configs(
            sidecars,
            [node.target for node in self.nodes if node.layout == "node"],
            Target(ksm.address, {"namespace": "kube-system"}) if ksm is not None else None,
            [node.target for node in self.nodes if node.layout == "dcgm"],
        )
        config = prometheus_config(scrape, am, rules, cfg.interval)
        server = start_prometheus(cfg.workdir, config, port=cfg.prometheus_port)
        self.prometheus_url = self._keep(server)

    def reload_rules(self, config: Path, timeout: float = 30.0) -> None:
        """Rewrite the rule files from the site config ``config`` and have Prometheus load them,
        waiting until it has: a drill sets objectives from what it measured once the stack runs.
        Rules whose text is unchanged keep their state (pending alerts stay pending);
        ``cfg.rules_config`` names the new file for whoever reads the rules next."""
        self.cfg.rules_config = config
        if self.cfg.prometheus_later and not self.prometheus_url:
            return  # Prometheus loads them when it starts (start_prometheus)
        write_rules(self.cfg.workdir, layouts.rule_profile(self.cfg.layout), config)
        Server(self.child("prometheus"), self.prometheus_url).reload(timeout)

    def _keep(self, server: Server) -> str:
        self.children.append(server.child)
        return server.url

    def stop(self) -> None:
        """Stop every child (in reverse order, each waited for: SIGTERM, then SIGKILL to its
        session) and the stand-ins; Ctrl-C and SIGTERM wait until it is done."""
        with uninterrupted():
            for child in reversed(self.children):
                with contextlib.suppress(OSError):
                    child.stop()
            self.children.clear()
            for node in self.nodes:
                node.close()
            self.nodes.clear()
            if self.kube_state_metrics is not None:
                self.kube_state_metrics.close()
                self.kube_state_metrics = None
            if self.capture is not None:
                self.capture.close()
                self.capture = None

    # --- Prometheus API --------------------------------------------------------------------------
    def alerts(self) -> list[dict[str, Any]]:
        """Prometheus's active alerts (pending and firing)."""
        data = self._api("/api/v1/alerts")
        alerts: list[dict[str, Any]] = data["alerts"] if data else []
        return alerts

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result, now or ``at`` (a Unix time: several queries that must
        see one rule evaluation's results ask at one time a moment back)."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        data = self._api("/api/v1/query?" + urllib.parse.urlencode(params))
        result: list[dict[str, Any]] = data["result"] if data else []
        return result

    def scraped_every_target(self) -> bool:
        """Whether Prometheus has scraped each of its targets at least once (a failed scrape
        counts: its ``up`` is 0). Before, the pack sees no exporter where one runs."""
        targets = self._api("/api/v1/targets").get("activeTargets", [])
        return bool(targets) and all(t.get("health", "unknown") != "unknown" for t in targets)

    def evaluated_since(self, when: float) -> bool:
        """Whether Prometheus has evaluated every rule group since ``when`` (a Unix time)."""
        groups = self._api("/api/v1/rules").get("groups", [])
        return bool(groups) and all(
            datetime.fromisoformat(g["lastEvaluation"]).timestamp() > when for g in groups
        )

    def _api(self, path: str) -> dict[str, Any]:
        """The ``data`` of a Prometheus API answer; empty where it did not answer 200."""
        status, body = http_get(self.prometheus_url + path)
        if status != 200:
            return {}
        data: dict[str, Any] = json.loads(body)["data"]
        return data

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        if not result:
            return None
        return float(result[0]["value"][1])
