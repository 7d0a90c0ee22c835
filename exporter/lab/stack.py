"""The whole pipeline on one machine: engine, sidecar, Prometheus, Alertmanager, PagerDuty.

Used by ``demo`` and the drills (``tests/drills``)::

    reference engine --/metrics, /tokenize--> sidecar --scrape--> Prometheus (fast rules)
                                                                   --> Alertmanager
                                                                   --> PagerDuty capture

Every process is a child with its log in the work directory, bound to 127.0.0.1 only.
Prometheus and Alertmanager are optional (``prometheus``, ``alertmanager`` or Debian's
``prometheus-alertmanager`` on ``PATH``). The rules are generated from the signature catalogue
(profile ``fast``: windows and ``for`` scaled by 1/10); Alertmanager runs the pack's own
configuration (``alertmanager_yaml``) with three changes only: the PagerDuty URL points at the
local capture endpoint, the routing keys are files in the work directory, and group_wait,
group_interval and repeat_interval are shortened (``--am-timing``) so that a drill sees a
page and its repeat within seconds. No torch is imported here.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import IO, Any

import yaml

# The reference engine's front-end process, not its worker or injection helpers.
PROCESS_MATCH = r"-m exporter\.reference(?:\s|$)"
ENGINE_LISTEN = re.compile(r"listening on http://(\S+):(\d+)")
SIDECAR_LISTEN = re.compile(r"listening on (127\.0\.0\.1|\[::1\]):(\d+)")
JOB = "inference-bottleneck-exporter"
TARGET_LABELS = {"namespace": "drill", "pod": "reference-0"}


class StackError(RuntimeError):
    """A component did not start; the message names it and points at its log."""


def free_port(preferred: int = 0) -> int:
    """``preferred`` when it is free on 127.0.0.1, else a free port the kernel picks."""
    for port in (preferred, 0) if preferred else (0,):
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            try:
                sock.bind(("127.0.0.1", port))
            except OSError:
                continue
            return int(sock.getsockname()[1])
    raise StackError("no free TCP port on 127.0.0.1")


def find_binary(*names: str) -> str | None:
    for name in names:
        path = shutil.which(name)
        if path:
            return path
    return None


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    request = urllib.request.Request(url, headers={"Accept": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            return int(resp.status), resp.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()


@dataclass
class Child:
    """One child process with its log file."""

    name: str
    proc: subprocess.Popen[bytes]
    log_path: Path
    _log: IO[bytes]

    def alive(self) -> bool:
        return self.proc.poll() is None

    def log_tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self._log.close()


def package_root() -> str:
    """The directory that holds this ``exporter`` package (for children's PYTHONPATH)."""
    import exporter  # noqa: PLC0415

    return str(Path(exporter.__file__).resolve().parent.parent)


def child_pythonpath() -> str:
    path = os.environ.get("PYTHONPATH", "")
    return package_root() + (os.pathsep + path if path else "")


def spawn(name: str, cmd: Sequence[str], workdir: Path, env: dict[str, str] | None = None) -> Child:
    """Start ``cmd`` in ``workdir`` with its output in ``<workdir>/<name>.log``; this package
    is importable in the child whether or not it is installed."""
    log_path = workdir / f"{name}.log"
    pythonpath = child_pythonpath()
    log = log_path.open("wb")
    proc = subprocess.Popen(
        list(cmd),
        stdin=subprocess.DEVNULL,
        stdout=log,
        stderr=subprocess.STDOUT,
        cwd=workdir,
        env={**os.environ, "PYTHONUNBUFFERED": "1", "PYTHONPATH": pythonpath, **(env or {})},
        start_new_session=True,  # Ctrl-C reaches the parent only, which stops us in order
    )
    return Child(name, proc, log_path, log)


def wait_until(
    check: Callable[[], bool], timeout: float, child: Child, what: str, step: float = 0.2
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not child.alive():
            raise StackError(
                f"{child.name} exited (code {child.proc.returncode}) before {what}; "
                f"log {child.log_path}:\n{child.log_tail()}"
            )
        with contextlib.suppress(OSError, ValueError):
            if check():
                return
        time.sleep(step)
    raise StackError(f"{child.name}: no {what} after {timeout:.0f}s; log {child.log_path}")


def _log_match(child: Child, pattern: re.Pattern[str]) -> re.Match[str] | None:
    try:
        text = child.log_path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    return pattern.search(text)


# --- PagerDuty capture ---------------------------------------------------------------------------


@dataclass
class Page:
    at: float  # time.monotonic() when received
    path: str
    body: dict[str, Any]

    @property
    def alertname(self) -> str:
        details = self.body.get("payload", {}).get("custom_details", {})
        return str(details.get("alertname", ""))

    @property
    def action(self) -> str:
        return str(self.body.get("event_action", ""))

    @property
    def receiver(self) -> str:
        return self.path.strip("/")


class PagerDutyCapture:
    """A local stand-in for the PagerDuty Events API v2: records every event it is sent."""

    def __init__(self) -> None:
        self.pages: list[Page] = []
        self._lock = threading.Lock()
        capture = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(min(length, 1 << 20))
                try:
                    body = json.loads(raw)
                except json.JSONDecodeError:
                    self.send_response(400)
                    self.end_headers()
                    return
                with capture._lock:
                    capture.pages.append(Page(time.monotonic(), self.path, body))
                answer = json.dumps(
                    {
                        "status": "success",
                        "message": "Event processed",
                        "dedup_key": body.get("dedup_key"),
                    }
                ).encode()
                self.send_response(202)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(answer)))
                self.end_headers()
                self.wfile.write(answer)

            def log_message(self, format: str, *args: Any) -> None:
                return

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(
            target=self._server.serve_forever, name="pagerduty-capture", daemon=True
        )
        self._thread.start()

    def snapshot(self) -> list[Page]:
        with self._lock:
            return list(self.pages)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()


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
    from exporter.signatures.config import load_config  # noqa: PLC0415

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


def write_rules(workdir: Path, profile: str = "fast", config: Path | None = None) -> list[Path]:
    """The pack's recording rules and alerts for ``profile`` and the site ``config``."""
    from exporter.signatures.config import load_config  # noqa: PLC0415
    from exporter.signatures.render import alerts_yaml, recording_rules_yaml  # noqa: PLC0415

    cfg = load_config(config, profile)
    records = workdir / "recording_rules.yaml"
    alerts = workdir / "alerts.yaml"
    records.write_text(recording_rules_yaml(cfg), encoding="utf-8")
    alerts.write_text(alerts_yaml(cfg), encoding="utf-8")
    return [records, alerts]


def prometheus_config(
    sidecar: str,
    alertmanager: str | None,
    rules: list[Path],
    interval: float,
    labels: dict[str, str] | None = None,
) -> str:
    config: dict[str, Any] = {
        "global": {"scrape_interval": f"{interval:g}s", "evaluation_interval": f"{interval:g}s"},
        "rule_files": [str(p) for p in rules],
        "scrape_configs": [
            {
                "job_name": JOB,
                "static_configs": [{"targets": [sidecar], "labels": dict(labels or TARGET_LABELS)}],
            }
        ],
    }
    if alertmanager:
        config["alerting"] = {"alertmanagers": [{"static_configs": [{"targets": [alertmanager]}]}]}
    return str(yaml.safe_dump(config, sort_keys=False))


# --- the stack -----------------------------------------------------------------------------------


@dataclass
class StackConfig:
    workdir: Path
    injections: Sequence[str] = ()
    engine_args: Sequence[str] = ()
    trace: Path | None = None  # None: real NVML
    prometheus: bool = True
    alertmanager: bool = True
    interval: float = 2.0  # scrape and rule evaluation
    probe_interval: str = "1s"  # the sidecar's shortest: medians of 30 probes in a 30 s window
    am_timing: AmTiming = field(default_factory=AmTiming)
    rules_config: Path | None = None  # site config of the rule pack (fast profile)
    engine_port: int = 0
    sidecar_port: int = 0
    prometheus_port: int = 0
    alertmanager_port: int = 0
    start_timeout: float = 240.0
    target_labels: dict[str, str] = field(default_factory=lambda: dict(TARGET_LABELS))


class Stack:
    """Starts the components in order (:meth:`start`) and stops them in reverse (:meth:`stop`)."""

    def __init__(self, cfg: StackConfig) -> None:
        self.cfg = cfg
        self.children: list[Child] = []
        self.capture: PagerDutyCapture | None = None
        self.engine_url = ""
        self.sidecar_url = ""
        self.prometheus_url = ""
        self.alertmanager_url = ""
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

    def child(self, name: str) -> Child:
        for c in self.children:
            if c.name == name:
                return c
        raise KeyError(name)

    def start(self) -> None:
        cfg = self.cfg
        cfg.workdir.mkdir(parents=True, exist_ok=True)
        self._start_engine()
        self._start_sidecar()
        if self.alertmanager_bin:
            self._start_alertmanager()
        if self.prometheus_bin:
            self._start_prometheus()

    def _start_engine(self) -> None:
        cfg = self.cfg
        cmd = [
            sys.executable,
            "-m",
            "exporter.lab.engine",
            "--port",
            str(free_port(cfg.engine_port) if cfg.engine_port else 0),
            *[arg for name in cfg.injections for arg in ("--inject", name)],
            *cfg.engine_args,
        ]
        engine = spawn("engine", cmd, cfg.workdir)
        self.children.append(engine)
        wait_until(
            lambda: _log_match(engine, ENGINE_LISTEN) is not None,
            cfg.start_timeout,
            engine,
            "'listening on' line",
        )
        match = _log_match(engine, ENGINE_LISTEN)
        assert match is not None
        self.engine_url = f"http://{match.group(1)}:{match.group(2)}"

    def _start_sidecar(self) -> None:
        cfg = self.cfg
        port = free_port(cfg.sidecar_port) if cfg.sidecar_port else 0
        cmd = [
            sys.executable,
            "-m",
            "exporter.cli",
            "--web.listen-address",
            f"127.0.0.1:{port}",
            "--engine.url",
            f"{self.engine_url}/metrics",
            "--engine.poll-interval",
            "1s",
            "--gpu.poll-interval",
            "1s",
            "--tokenizer.probe-interval",
            cfg.probe_interval,
            "--process.match",
            PROCESS_MATCH,
            "--log.format",
            "json",
        ]
        if cfg.trace is not None:
            cmd += ["--gpu.replay-file", str(cfg.trace)]
        sidecar = spawn("sidecar", cmd, cfg.workdir)
        self.children.append(sidecar)
        wait_until(
            lambda: _log_match(sidecar, SIDECAR_LISTEN) is not None, 30, sidecar, "listen address"
        )
        match = _log_match(sidecar, SIDECAR_LISTEN)
        assert match is not None
        self.sidecar_url = f"http://{match.group(1)}:{match.group(2)}"
        wait_until(
            lambda: http_get(self.sidecar_url + "/-/ready", 2)[0] == 200, 30, sidecar, "readiness"
        )

    def _start_alertmanager(self) -> None:
        cfg = self.cfg
        assert self.alertmanager_bin is not None
        self.capture = PagerDutyCapture()
        key = cfg.workdir / "pagerduty-routing-key"
        key.write_text("drill-routing-key-0000000000000000\n", encoding="utf-8")
        conf = cfg.workdir / "alertmanager.yml"
        conf.write_text(alertmanager_config(self.capture.url, key, cfg.am_timing), "utf-8")
        port = free_port(cfg.alertmanager_port)
        data = cfg.workdir / "alertmanager-data"
        data.mkdir(exist_ok=True)
        cmd = [
            self.alertmanager_bin,
            f"--config.file={conf}",
            f"--storage.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--cluster.listen-address=",
            "--log.level=warn",
        ]
        self.alertmanager_url = self._start_ready("alertmanager", cmd, port, 30)

    def _start_prometheus(self) -> None:
        cfg = self.cfg
        assert self.prometheus_bin is not None
        rules = write_rules(cfg.workdir, config=cfg.rules_config)
        am = urllib.parse.urlsplit(self.alertmanager_url).netloc if self.alertmanager_url else None
        sidecar = urllib.parse.urlsplit(self.sidecar_url).netloc
        conf = cfg.workdir / "prometheus.yml"
        text = prometheus_config(sidecar, am, rules, cfg.interval, cfg.target_labels)
        conf.write_text(text, encoding="utf-8")
        port = free_port(cfg.prometheus_port)
        data = cfg.workdir / "prometheus-data"
        data.mkdir(exist_ok=True)
        cmd = [
            self.prometheus_bin,
            f"--config.file={conf}",
            f"--storage.tsdb.path={data}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ]
        self.prometheus_url = self._start_ready("prometheus", cmd, port, 60)

    def _start_ready(self, name: str, cmd: Sequence[str], port: int, timeout: float) -> str:
        """Starts a Prometheus-style server listening on ``port`` and waits for its
        ``/-/ready``; returns its URL."""
        child = spawn(name, cmd, self.cfg.workdir)
        self.children.append(child)
        url = f"http://127.0.0.1:{port}"
        wait_until(lambda: http_get(url + "/-/ready", 2)[0] == 200, timeout, child, "readiness")
        return url

    def stop(self) -> None:
        for child in reversed(self.children):
            with contextlib.suppress(OSError):
                child.stop()
        self.children.clear()
        if self.capture is not None:
            self.capture.close()
            self.capture = None

    # --- Prometheus API --------------------------------------------------------------------------
    def alerts(self) -> list[dict[str, Any]]:
        """Prometheus's active alerts (pending and firing)."""
        status, body = http_get(self.prometheus_url + "/api/v1/alerts")
        if status != 200:
            return []
        alerts: list[dict[str, Any]] = json.loads(body)["data"]["alerts"]
        return alerts

    def query(self, expr: str) -> list[dict[str, Any]]:
        url = self.prometheus_url + "/api/v1/query?" + urllib.parse.urlencode({"query": expr})
        status, body = http_get(url)
        if status != 200:
            return []
        result: list[dict[str, Any]] = json.loads(body)["data"]["result"]
        return result

    def scalar(self, expr: str) -> float | None:
        result = self.query(expr)
        if not result:
            return None
        return float(result[0]["value"][1])
