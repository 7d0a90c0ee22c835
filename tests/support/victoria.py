"""VictoriaMetrics, vmalert, vmagent and Prometheus in agent mode on loopback, and promtool's
test series for VictoriaMetrics.

The binaries are Debian's ``victoria-metrics`` package (``make tools`` installs it): a test that
needs one fails, never skips, when it is missing. Everything binds 127.0.0.1 on ports the
kernel hands out; every wait is bounded.

:func:`expand` reads promtool's series notation (``0+18x40``, ``_x20``, ``1x3 0x10``) so a
promtool unit test's input series can be loaded into VictoriaMetrics as they are, and
:func:`replay` has vmalert evaluate rule files over that past time range (its replay mode),
writing the records and ``ALERTS`` back.
"""

from __future__ import annotations

import json
import re
import subprocess
import urllib.parse
import urllib.request
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from exporter.lab.processes import (
    Child,
    Server,
    find_binary,
    free_port,
    http_get,
    spawn,
    wait_until,
)

# The samples of one series: seconds from the start of its test group, value (None: missing).
Point = tuple[float, float | None]
# A number as promtool reads one: 16, 0.5, 3.35e+12 (an exponent's sign is not an operator).
_NUMBER = r"(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?"
_TOKEN = re.compile(
    rf"^(?P<start>[+-]?(?:{_NUMBER}|Inf|NaN))(?:(?P<op>[+-])(?P<step>{_NUMBER}))?x(?P<n>\d+)$"
)


def binary(name: str) -> str:
    found = find_binary(name)
    if found is None:
        pytest.fail(f"{name} not found: run `make tools` (apt-get install victoria-metrics)")
    return found


def expand(values: str) -> list[float | None]:
    """promtool's ``values`` notation, expanded: ``a+bxn`` is ``a, a+b, ... a+n*b`` (n+1
    values), ``axn`` is ``a`` n+1 times, ``_`` a missing sample, ``_xn`` n of them."""
    out: list[float | None] = []
    for token in str(values).split():
        if token == "_":
            out.append(None)
            continue
        if token.startswith("_x"):
            out += [None] * int(token[2:])
            continue
        match = _TOKEN.match(token)
        if match is None:
            out.append(float(token))
            continue
        start, n = float(match["start"]), int(match["n"])
        step = float(match["step"] or 0) * (-1 if match["op"] == "-" else 1)
        out += [start + i * step for i in range(n + 1)]
    return out


def series_lines(series: str, values: str, start_ms: int, interval_s: float) -> Iterable[str]:
    """One promtool input series as Prometheus text lines with millisecond timestamps."""
    for i, value in enumerate(expand(values)):
        if value is not None:
            yield f"{series} {value!r} {start_ms + round(i * interval_s * 1000)}"


@dataclass
class VictoriaMetrics:
    """A single-node VictoriaMetrics: its child process and URL."""

    server: Server

    @property
    def url(self) -> str:
        return self.server.url

    def stop(self) -> None:
        self.server.stop()

    def import_text(self, lines: Sequence[str]) -> None:
        """Samples in Prometheus text format with timestamps (``/api/v1/import/prometheus``)."""
        body = ("\n".join(lines) + "\n").encode()
        request = urllib.request.Request(
            self.url + "/api/v1/import/prometheus", data=body, method="POST"
        )
        with urllib.request.urlopen(request, timeout=30) as response:
            assert response.status == 204, response.read()

    def flush(self) -> None:
        """Make everything ingested so far searchable now (``/internal/force_flush``)."""
        status, body = http_get(self.url + "/internal/force_flush", 10)
        assert status == 200, body

    def get(self, path: str, **params: str) -> Any:
        url = self.url + path + "?" + urllib.parse.urlencode(params)
        with urllib.request.urlopen(url, timeout=30) as response:
            return json.loads(response.read())

    def query(self, expr: str, at: float) -> list[dict[str, Any]]:
        data = self.get("/api/v1/query", query=expr, time=f"{at:.3f}")["data"]
        result: list[dict[str, Any]] = data["result"]
        return result

    def export(self, match: str) -> list[dict[str, Any]]:
        """Every raw sample of the series ``match`` selects (``/api/v1/export``, JSON lines)."""
        url = self.url + "/api/v1/export?" + urllib.parse.urlencode({"match[]": match})
        with urllib.request.urlopen(url, timeout=30) as response:
            text = response.read().decode()
        return [json.loads(line) for line in text.splitlines() if line.strip()]


def start_victoria_metrics(workdir: Path, *, timeout: float = 30.0) -> VictoriaMetrics:
    """VictoriaMetrics with its data in ``workdir``, ready; samples of any age are kept (the
    tests write at fixed past times) and no query result is cached (replays read what they
    just wrote)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    child = spawn(
        "victoria-metrics",
        [
            binary("victoria-metrics"),
            f"-httpListenAddr=127.0.0.1:{port}",
            f"-storageDataPath={workdir / 'vm-data'}",
            "-retentionPeriod=100y",
            "-search.disableCache",
            "-search.latencyOffset=0s",
            "-loggerLevel=WARN",
        ],
        workdir,
    )
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: http_get(url + "/health", 2)[0] == 200, timeout, "health", child=child)
    except BaseException:
        child.stop()
        raise
    return VictoriaMetrics(Server(child, url))


def replay(
    vm: VictoriaMetrics,
    rule_files: Sequence[Path],
    start: float,
    end: float,
    workdir: Path,
    *,
    interval: str = "1m",
    timeout: float = 240.0,
) -> str:
    """vmalert's replay mode: every group of ``rule_files`` evaluated over ``[start, end]``
    (Unix seconds) every ``interval`` against ``vm``, records and ``ALERTS`` written back to it
    (stored when this returns; :meth:`VictoriaMetrics.flush` makes them searchable). No rule
    of ``rule_files`` may read another's output: vmalert does not wait between rules. Returns
    its log; a failed replay fails the test with the log's tail."""
    args = [
        binary("vmalert"),
        *(f"-rule={path}" for path in rule_files),
        f"-datasource.url={vm.url}",
        f"-remoteWrite.url={vm.url}",
        f"-replay.timeFrom={_rfc3339(start)}",
        f"-replay.timeTo={_rfc3339(end)}",
        f"-evaluationInterval={interval}",
        # One point per evaluation, as Prometheus evaluates (the default step is 5m).
        f"-datasource.queryStep={interval}",
        "-replay.disableProgressBar",
        # The caller orders the rules so that none reads another of the same replay: no
        # pause after each rule is needed for its results to be stored.
        "-replay.rulesDelay=0s",
        f"-httpListenAddr=127.0.0.1:{free_port()}",
    ]
    log = workdir / "vmalert-replay.log"
    with log.open("wb") as sink:
        result = subprocess.run(
            args, stdout=sink, stderr=subprocess.STDOUT, timeout=timeout, check=False
        )
    text = log.read_text(errors="replace")
    if result.returncode != 0:
        pytest.fail(f"vmalert replay exited {result.returncode}:\n{text[-3000:]}")
    return text


def _wait_health(child: Child, url: str, timeout: float) -> None:
    try:
        wait_until(lambda: http_get(url, 2)[0] == 200, timeout, "health", child=child)
    except BaseException:
        child.stop()
        raise


def start_vmagent(
    workdir: Path,
    scrape_config: Path,
    remote_write: str,
    labels: dict[str, str],
    *,
    timeout: float = 30.0,
) -> Child:
    """vmagent scraping ``scrape_config`` and writing everything to ``remote_write`` with
    ``labels`` added to every series (``-remoteWrite.label``, a cluster's name)."""
    port = free_port()
    child = spawn(
        "vmagent",
        [
            binary("vmagent"),
            f"-promscrape.config={scrape_config}",
            f"-remoteWrite.url={remote_write}",
            *(f"-remoteWrite.label={k}={v}" for k, v in labels.items()),
            f"-remoteWrite.tmpDataPath={workdir / 'vmagent-data'}",
            "-remoteWrite.flushInterval=200ms",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-loggerLevel=WARN",
        ],
        workdir,
    )
    _wait_health(child, f"http://127.0.0.1:{port}/health", timeout)
    return child


def start_vmalert(
    workdir: Path,
    rule_files: Sequence[Path],
    vm: VictoriaMetrics,
    *,
    interval: str = "1s",
    timeout: float = 30.0,
) -> Server:
    """vmalert evaluating ``rule_files`` against ``vm`` every ``interval``, writing records and
    alert state back to it and restoring state from it, as in a deployment. Alerts go to an
    address nothing listens on (the tests read ``ALERTS`` and the rules' state)."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    child = spawn(
        "vmalert",
        [
            binary("vmalert"),
            *(f"-rule={path}" for path in rule_files),
            f"-datasource.url={vm.url}",
            f"-remoteWrite.url={vm.url}",
            f"-remoteRead.url={vm.url}",
            f"-notifier.url=http://127.0.0.1:{free_port()}",
            f"-evaluationInterval={interval}",
            "-remoteWrite.flushInterval=200ms",
            f"-httpListenAddr=127.0.0.1:{port}",
            "-loggerLevel=WARN",
        ],
        workdir,
    )
    url = f"http://127.0.0.1:{port}"
    _wait_health(child, url + "/health", timeout)
    return Server(child, url)


def start_prometheus_agent(
    workdir: Path, config: dict[str, Any], *, timeout: float = 30.0
) -> Child:
    """Prometheus in agent mode (scrape and remote-write, no queries, no rules) with
    ``config``, ready."""
    workdir.mkdir(parents=True, exist_ok=True)
    path = workdir / "prometheus-agent.yml"
    path.write_text(json.dumps(config), encoding="utf-8")
    port = free_port()
    prometheus = find_binary("prometheus")
    if prometheus is None:
        pytest.fail("prometheus not found: run `make tools`")
    child = spawn(
        "prometheus-agent",
        [
            prometheus,
            "--enable-feature=agent",
            f"--config.file={path}",
            f"--storage.agent.path={workdir / 'agent-data'}",
            f"--web.listen-address=127.0.0.1:{port}",
            "--log.level=warn",
        ],
        workdir,
    )
    _wait_health(child, f"http://127.0.0.1:{port}/-/ready", timeout)
    return child


def _rfc3339(seconds: float) -> str:
    import datetime as dt  # noqa: PLC0415

    return dt.datetime.fromtimestamp(seconds, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


__all__ = [
    "Child",
    "VictoriaMetrics",
    "expand",
    "replay",
    "series_lines",
    "start_prometheus_agent",
    "start_victoria_metrics",
    "start_vmagent",
    "start_vmalert",
]
