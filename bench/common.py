"""Shared pieces of the benchmarks: processes under test, a scrape client, CPU and RSS readers.

Every measured process runs on its own (the exporter, the fake engine, node_exporter); the
benchmark process only sends requests and reads ``/proc``. CPU per scrape is measured in
batches: the process's CPU time over a batch of scrapes, minus its idle rate (measured just
before, with no scrapes) times the batch's wall time, divided by the batch size. Latency is
per request, client side, over one keep-alive connection as Prometheus keeps it.
"""

from __future__ import annotations

import contextlib
import http.client
import math
import os
import re
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil

from exporter.lab.processes import stop_process

ROOT = Path(__file__).resolve().parent.parent
BENCH = ROOT / "bench"
RESULTS = BENCH / "results"
FIXTURES = ROOT / "tests" / "fixtures" / "engines"
MIB = 2**20

# What Prometheus 2.42 (Debian bookworm's) sends with each scrape. It prefers OpenMetrics, so
# this is the encoder an exporter really runs in production, and it asks for gzip.
PROMETHEUS_ACCEPT = (
    "application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
    "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1"
)
CLIENTS: dict[str, dict[str, str]] = {
    # Prometheus's own request: OpenMetrics preferred, gzip.
    "prometheus": {
        "Accept": PROMETHEUS_ACCEPT,
        "Accept-Encoding": "gzip",
        "User-Agent": "Prometheus/2.42.0",
        "X-Prometheus-Scrape-Timeout-Seconds": "10",
    },
    # The classic text format without compression (curl, older scrapers, the tests).
    "text": {"Accept": "text/plain;version=0.0.4", "User-Agent": "bench"},
}

_LISTEN = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


# --- small numbers ---------------------------------------------------------------------------


def percentile(values: Sequence[float], q: float) -> float:
    """Nearest-rank percentile (``q`` in 0..100): with 100 values, p99 is the second largest."""
    if not values:
        return math.nan
    ordered = sorted(values)
    rank = max(1, math.ceil(q / 100 * len(ordered)))
    return ordered[rank - 1]


def summary_ms(seconds: Sequence[float]) -> dict[str, float]:
    """p50 / p99 / max of durations, in milliseconds, rounded for the JSON."""
    return {
        "p50": round(percentile(seconds, 50) * 1000, 3),
        "p99": round(percentile(seconds, 99) * 1000, 3),
        "max": round(max(seconds) * 1000, 3) if seconds else math.nan,
        "n": len(seconds),
    }


def cpu_seconds(proc: psutil.Process) -> float:
    """User + system CPU of the process, all its threads (those that exited included)."""
    times = proc.cpu_times()
    return float(times.user + times.system)


def rss_mib(proc: psutil.Process) -> float:
    return round(proc.memory_info().rss / MIB, 2)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def machine() -> dict[str, Any]:
    """What the numbers were measured on."""
    load = os.getloadavg()
    cpu_model = ""
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
    import platform  # noqa: PLC0415

    return {
        "cpus": os.cpu_count(),
        "cpu_model": cpu_model,
        "memory_gib": round(psutil.virtual_memory().total / 2**30, 1),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "load_average_at_start": [round(x, 2) for x in load],
    }


# --- the scrape client -----------------------------------------------------------------------


class Scraper:
    """GETs over one keep-alive connection, reconnecting when the server closes it."""

    def __init__(self, base: str, headers: dict[str, str], timeout: float = 10.0) -> None:
        match = re.match(r"http://([^:/]+):(\d+)", base)
        if not match:
            raise ValueError(f"bad base URL {base!r}")
        self.host, self.port = match.group(1), int(match.group(2))
        self.headers = headers
        self.timeout = timeout
        self._conn: http.client.HTTPConnection | None = None

    def _connection(self) -> http.client.HTTPConnection:
        if self._conn is None:
            self._conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout)
        return self._conn

    def get(self, path: str = "/metrics") -> bytes:
        for attempt in (1, 2):
            conn = self._connection()
            try:
                conn.request("GET", path, headers=self.headers)
                response = conn.getresponse()
                body = response.read()
                if response.status != 200:
                    raise RuntimeError(f"GET {path}: HTTP {response.status}")
                if response.getheader("Connection", "").lower() == "close":
                    self.close()
                return body
            except (http.client.HTTPException, ConnectionError):
                self.close()
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")

    def timed(self, path: str = "/metrics") -> float:
        start = time.perf_counter()
        self.get(path)
        return time.perf_counter() - start

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None


def series_count(text: str) -> int:
    return sum(1 for line in text.splitlines() if line and not line.startswith("#"))


def sample_sum(text: str, name: str, labels: str = "") -> float:
    """Sum of the samples of ``name`` (text format) whose label block contains ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") or line.startswith(name + " "):
            if labels and labels not in line:
                continue
            total += float(line.rsplit(" ", 1)[1])
    return total


# --- measurements of one process -------------------------------------------------------------


def idle_rate(proc: psutil.Process, seconds: float) -> float:
    """CPU seconds per wall second with nobody scraping."""
    c0, w0 = cpu_seconds(proc), time.monotonic()
    time.sleep(seconds)
    return (cpu_seconds(proc) - c0) / (time.monotonic() - w0)


_CLK_TCK = os.sysconf("SC_CLK_TCK")


def thread_cpu(pid: int) -> dict[int, tuple[str, float]]:
    """``tid -> (name, CPU seconds)`` of the live threads of ``pid`` (clock-tick resolution)."""
    out: dict[int, tuple[str, float]] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            stat = (task / "stat").read_text()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / _CLK_TCK)
    return out


def thread_group(name: str) -> str:
    """Threads grouped for the report: every GPU poller together, pools by prefix."""
    if name.startswith("nvml-gpu"):
        return "nvml-gpu*"
    if name.startswith("scrape_"):
        return "scrape pool"
    if name.startswith("pool-"):
        return "asyncio default executors"
    if name.startswith("collect-"):
        return name.rsplit("_", 1)[0]
    if name in ("python", "python3") or name.startswith("python"):
        return "main (HTTP server)"
    return name


def idle_by_thread(pid: int, seconds: float) -> tuple[float, dict[str, float]]:
    """Idle CPU share of a core over ``seconds``, total and by thread group."""
    proc = psutil.Process(pid)
    c0, t0, w0 = cpu_seconds(proc), thread_cpu(pid), time.monotonic()
    time.sleep(seconds)
    c1, t1, wall = cpu_seconds(proc), thread_cpu(pid), time.monotonic() - w0
    groups: dict[str, float] = {}
    for tid, (name, after) in t1.items():
        before = t0.get(tid, (name, 0.0))[1]
        key = thread_group(name)
        groups[key] = groups.get(key, 0.0) + (after - before) / wall
    return (c1 - c0) / wall, {k: round(v, 5) for k, v in sorted(groups.items()) if v > 0}


@dataclass
class Batches:
    """CPU per scrape from back-to-back batches, and every request's latency."""

    per_scrape_s: list[float] = field(default_factory=list)
    latencies_s: list[float] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        ms = [x * 1000 for x in self.per_scrape_s]
        return {
            "cpu_ms_per_scrape_median": round(statistics.median(ms), 3),
            "cpu_ms_per_scrape_p99": round(percentile(ms, 99), 3),
            "batches": len(ms),
            "batch_size": len(self.latencies_s) // max(1, len(ms)),
            "back_to_back_latency_ms": summary_ms(self.latencies_s),
        }


def cpu_ms(fn: Callable[[], object], calls: int) -> float:
    """Median CPU milliseconds of ``fn`` in process, over batches of 10 calls (after one
    unmeasured call: caches, imports)."""
    fn()
    per_call = []
    for _ in range(max(1, calls // 10)):
        start = time.process_time()
        for _ in range(10):
            fn()
        per_call.append((time.process_time() - start) / 10)
    return round(statistics.median(per_call) * 1000, 3)


def scrape_batches(
    proc: psutil.Process, scraper: Scraper, idle: float, batches: int, size: int
) -> Batches:
    out = Batches()
    for _ in range(batches):
        c0, w0 = cpu_seconds(proc), time.monotonic()
        for _ in range(size):
            out.latencies_s.append(scraper.timed())
        used = cpu_seconds(proc) - c0 - idle * (time.monotonic() - w0)
        out.per_scrape_s.append(max(used, 0.0) / size)
    return out


def paced(
    proc: psutil.Process, scraper: Scraper, rate: float, seconds: float, idle: float
) -> dict[str, Any]:
    """Scrapes at a fixed rate (each starts on its own tick, not after the previous one)."""
    n = max(1, round(rate * seconds))
    latencies: list[float] = []
    late = 0
    c0, w0 = cpu_seconds(proc), time.monotonic()
    start = time.perf_counter() + 0.05
    for k in range(n):
        due = start + k / rate
        wait = due - time.perf_counter()
        if wait > 0:
            time.sleep(wait)
        else:
            late += 1
        latencies.append(scraper.timed())
    wall = time.monotonic() - w0
    used = cpu_seconds(proc) - c0 - idle * wall
    return {
        "rate_per_s": rate,
        "latency_ms": summary_ms(latencies),
        "cpu_ms_per_scrape": round(max(used, 0.0) / n * 1000, 3),
        "late_starts": late,
    }


# --- processes under test --------------------------------------------------------------------


@dataclass
class Running:
    """A process under test, with the URL it serves."""

    popen: subprocess.Popen[bytes]
    base: str
    log: Path
    proc: psutil.Process = field(init=False)

    def __post_init__(self) -> None:
        self.proc = psutil.Process(self.popen.pid)

    def stop(self) -> None:
        stop_process(self.popen)


def _wait_for_url(base: str, path: str, popen: subprocess.Popen[bytes], log: Path) -> None:
    scraper = Scraper(base, {}, timeout=2.0)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"{base}: exited with {popen.returncode}; see {log}")
        try:
            scraper.get(path)
            return
        except (OSError, RuntimeError, http.client.HTTPException):
            time.sleep(0.05)
        finally:
            scraper.close()
    raise RuntimeError(f"{base}{path} not answering after 30 s; see {log}")


@contextlib.contextmanager
def exporter(
    trace: Path | None,
    engine_url: str,
    logdir: Path,
    args: Sequence[str] = (),
    root: Path = ROOT,
) -> Iterator[Running]:
    """The real CLI at its defaults, on ``trace`` (None: real NVML) and the real /proc,
    reading ``engine_url``.

    ``root``: the source tree to run (a patched copy for before/after comparisons)."""
    log = Path(tempfile.mkstemp(prefix="exporter-", suffix=".log", dir=logdir)[1])
    with log.open("wb") as sink:
        popen = subprocess.Popen(
            [
                sys.executable,
                str(root / "bench" / "run_exporter.py"),
                "--web.listen-address",
                "127.0.0.1:0",
                *(["--gpu.replay-file", str(trace)] if trace is not None else []),
                "--engine.url",
                engine_url,
                "--log.level",
                "info",
                *args,
            ],
            cwd=root,
            stdout=subprocess.DEVNULL,
            stderr=sink,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
    running: Running | None = None
    try:
        deadline = time.monotonic() + 30
        while running is None:
            text = log.read_text(errors="replace")
            match = _LISTEN.search(text)
            if match:
                package = re.search(r"run_exporter: package (\S+)", text)
                expected = str(root / "exporter")
                if package is None or package.group(1) != expected:
                    raise RuntimeError(f"expected the package at {expected}; see {log}")
                running = Running(popen, f"http://127.0.0.1:{match.group(1)}", log)
            elif popen.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"exporter did not start; see {log}")
            else:
                time.sleep(0.05)
        _wait_for_url(running.base, "/-/ready", popen, log)
        yield running
    finally:
        if running is not None:
            running.stop()
        elif popen.poll() is None:
            popen.kill()
            popen.wait(5)


class EngineServer:
    """``bench/engine_server.py`` in its own process: a fake engine serving one body."""

    def __init__(self, body: Path, logdir: Path) -> None:
        self.log = logdir / f"engine-{body.stem}.log"
        self._sink = self.log.open("wb")
        self.popen = subprocess.Popen(
            [sys.executable, str(BENCH / "engine_server.py"), "--body", str(body)],
            cwd=ROOT,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=self._sink,
            text=True,
        )
        assert self.popen.stdout is not None
        line = self.popen.stdout.readline().strip()
        if not line.startswith("url "):
            self.close()
            raise RuntimeError(f"engine server did not start: {line!r}; see {self.log}")
        self.url = line.split(" ", 1)[1]
        self.metrics_url = self.url + "/metrics"

    def set_mode(self, mode: str) -> None:
        assert self.popen.stdin is not None and self.popen.stdout is not None
        self.popen.stdin.write(mode + "\n")
        self.popen.stdin.flush()
        answer = self.popen.stdout.readline().strip()
        if answer != f"mode {mode}":
            raise RuntimeError(f"engine server: {answer!r}")

    def close(self) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(OSError):
                assert self.popen.stdin is not None
                self.popen.stdin.close()
            try:
                self.popen.wait(15)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)
        for pipe in (self.popen.stdin, self.popen.stdout):
            if pipe is not None:
                with contextlib.suppress(OSError):
                    pipe.close()
        self._sink.close()

    def __enter__(self) -> EngineServer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


NODE_EXPORTER_NAMES = ("prometheus-node-exporter", "node_exporter")


def node_exporter_binary() -> str | None:
    for name in NODE_EXPORTER_NAMES:
        found = shutil.which(name)
        if found:
            return found
    return None


@contextlib.contextmanager
def node_exporter(binary: str, logdir: Path) -> Iterator[Running]:
    """node_exporter with its default collectors, on a free loopback port."""
    port = free_port()
    log = logdir / "node-exporter.log"
    with log.open("wb") as sink:
        popen = subprocess.Popen(
            [binary, f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL,
            stderr=sink,
        )
    running = Running(popen, f"http://127.0.0.1:{port}", log)
    try:
        _wait_for_url(running.base, "/metrics", popen, log)
        yield running
    finally:
        running.stop()


def node_exporter_version(binary: str) -> str:
    try:
        out = subprocess.run(
            [binary, "--version"], capture_output=True, text=True, timeout=10, check=False
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    text = (out.stdout or out.stderr).splitlines()
    return text[0].strip() if text else "unknown"
