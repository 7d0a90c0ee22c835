"""Overhead of the sidecar: RSS, CPU per /metrics scrape, idle CPU, NVML calls per GPU per second.

Runs the real CLI process on an N-GPU synthetic replay trace and the real /proc, on loopback.
CPU per scrape is measured in batches (process CPU time over a batch of scrapes, minus the
idle rate measured just before, divided by the batch size) and reported as the median over
batches; latency is per request. Not a test: numbers go to docs/performance.md.

    python bench/bench_scrape.py --gpus 8 [--batches 10 --batch-size 50] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.backends.synthetic import write_synthetic_trace  # noqa: E402

LISTEN = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


def start(trace: Path, poll: str) -> tuple[subprocess.Popen[str], str]:
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "exporter.cli",
            "--web.listen-address",
            "127.0.0.1:0",
            "--gpu.replay-file",
            str(trace),
            "--gpu.poll-interval",
            poll,
            "--log.level",
            "info",
        ],
        cwd=ROOT,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        line = proc.stderr.readline()
        match = LISTEN.search(line)
        if match:
            return proc, f"http://127.0.0.1:{match.group(1)}"
    proc.kill()
    raise SystemExit("exporter did not start")


def get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as response:
        body: bytes = response.read()
        return body


def cpu_seconds(p: psutil.Process) -> float:
    times = p.cpu_times()
    return float(times.user + times.system)


def calls_total(text: str) -> float:
    return sum(
        float(line.rsplit(" ", 1)[1])
        for line in text.splitlines()
        if line.startswith("inference_nvml_calls_total{")
    )


def run(gpus: int, batches: int, batch_size: int, idle_s: float, poll: str) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        trace = Path(tmp) / f"trace-{gpus}gpu.jsonl"
        write_synthetic_trace(trace, gpus=gpus, duration_s=120.0)
        proc, base = start(trace, poll)
        try:
            ps = psutil.Process(proc.pid)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                try:
                    if urllib.request.urlopen(base + "/-/ready", timeout=2).status == 200:
                        break
                except OSError:
                    time.sleep(0.05)
            for _ in range(20):  # warm-up: imports, first allocations
                get(base + "/metrics")
            rss_start = ps.memory_info().rss
            body = get(base + "/metrics")
            series = sum(1 for line in body.decode().splitlines() if not line.startswith("#"))
            calls0, t0 = calls_total(body.decode()), time.monotonic()
            # Idle: background polling only.
            c0 = cpu_seconds(ps)
            time.sleep(idle_s)
            idle_rate = (cpu_seconds(ps) - c0) / idle_s
            per_scrape: list[float] = []
            latencies: list[float] = []
            for _ in range(batches):
                c0, w0 = cpu_seconds(ps), time.monotonic()
                for _ in range(batch_size):
                    s = time.perf_counter()
                    get(base + "/metrics")
                    latencies.append(time.perf_counter() - s)
                used = cpu_seconds(ps) - c0 - idle_rate * (time.monotonic() - w0)
                per_scrape.append(max(used, 0.0) / batch_size)
            body = get(base + "/metrics")
            calls1, t1 = calls_total(body.decode()), time.monotonic()
            rss_end = ps.memory_info().rss
            latencies.sort()
            return {
                "gpus": gpus,
                "series": series,
                "scrapes": batches * batch_size,
                "rss_mib_start": rss_start / 2**20,
                "rss_mib_end": rss_end / 2**20,
                "cpu_ms_per_scrape_median": statistics.median(per_scrape) * 1000,
                "cpu_ms_per_scrape_batches": [round(x * 1000, 3) for x in per_scrape],
                "latency_ms_p50": latencies[len(latencies) // 2] * 1000,
                "latency_ms_p99": latencies[int(len(latencies) * 0.99)] * 1000,
                "idle_cpu_share_of_core": idle_rate,
                "nvml_calls_per_gpu_per_second": (calls1 - calls0) / (t1 - t0) / gpus,
                "poll_interval": poll,
            }
        finally:
            proc.terminate()
            proc.wait(10)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, nargs="+", default=[8])
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--idle", type=float, default=10.0, help="idle measurement, seconds")
    parser.add_argument("--poll", default="3s", help="--gpu.poll-interval of the exporter")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    results = {
        "machine": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "platform": platform.platform(),
        },
        "runs": [run(g, args.batches, args.batch_size, args.idle, args.poll) for g in args.gpus],
    }
    text = json.dumps(results, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
