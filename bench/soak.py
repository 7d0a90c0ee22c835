"""Soak: many scrapes while the engine flaps and a GPU is lost and recovered, watching RSS.

Runs the real CLI on a 2-GPU replay trace in which GPU 0 is lost (``GPU_IS_LOST``) for a few
seconds of every 20 s loop, against a fake engine that alternates between healthy, HTTP 500,
hanging and garbage every few seconds. Scrapes back to back over loopback and reports RSS at the
start (after a warm-up) and at the end, and the growth. Target: growth < 2 MiB over
10,000 scrapes.

    python bench/soak.py --scrapes 10000 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT))

from fakeengine import FakeEngine  # noqa: E402
from support.synthetic import synthetic_trace_lines  # noqa: E402

LISTEN = re.compile(r"listening on 127\.0\.0\.1:(\d+)")


def flapping_trace(path: Path) -> None:
    """A 20 s, 2-GPU synthetic trace where GPU 0 is lost from t=8 s to t=12 s."""
    lines = synthetic_trace_lines(gpus=2, duration_s=20.0)
    out = [lines[0]]
    for line in lines[1:]:
        record = json.loads(line)
        if record["gpu"] == 0 and 8.0 <= record["t"] < 12.0:
            record["error"] = "GPU_IS_LOST"
        out.append(json.dumps(record))
    path.write_text("\n".join(out) + "\n")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--scrapes", type=int, default=10_000)
    parser.add_argument("--warmup", type=int, default=500)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    stop = threading.Event()
    with tempfile.TemporaryDirectory() as tmp, FakeEngine.run_in_thread() as engine:
        trace = Path(tmp) / "flapping.jsonl"
        flapping_trace(trace)

        def flap() -> None:
            modes = ["ok", "500", "ok", "hang", "ok", "garbage"]
            i = 0
            while not stop.wait(3.0):
                i += 1
                engine.set_mode(modes[i % len(modes)], route="all")

        flapper = threading.Thread(target=flap, daemon=True)
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
                "500ms",
                "--engine.url",
                engine.url + "/metrics",
                "--engine.poll-interval",
                "500ms",
                "--engine.timeout",
                "500ms",
                "--tokenizer.probe-interval",
                "1s",
                "--scrape.timeout",
                "500ms",
            ],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},
        )
        try:
            assert proc.stderr is not None
            port = None
            deadline = time.monotonic() + 30
            while port is None and time.monotonic() < deadline:
                match = LISTEN.search(proc.stderr.readline())
                port = match.group(1) if match else None
            if port is None:
                raise SystemExit("exporter did not start")
            # keep draining the log so the process never blocks on a full pipe
            threading.Thread(target=lambda: [None for _ in proc.stderr], daemon=True).start()  # type: ignore[union-attr]
            url = f"http://127.0.0.1:{port}/metrics"
            ps = psutil.Process(proc.pid)
            flapper.start()
            for _ in range(args.warmup):
                urllib.request.urlopen(url, timeout=10).read()
            rss_start = ps.memory_info().rss
            started = time.monotonic()
            slowest = 0.0
            for _ in range(args.scrapes):
                t = time.perf_counter()
                urllib.request.urlopen(url, timeout=10).read()
                slowest = max(slowest, time.perf_counter() - t)
            elapsed = time.monotonic() - started
            rss_end = ps.memory_info().rss
            threads = ps.num_threads()
        finally:
            stop.set()
            proc.terminate()
            proc.wait(10)
    result: dict[str, Any] = {
        "scrapes": args.scrapes,
        "seconds": round(elapsed, 1),
        "rss_mib_start": round(rss_start / 2**20, 2),
        "rss_mib_end": round(rss_end / 2**20, 2),
        "rss_growth_mib": round((rss_end - rss_start) / 2**20, 2),
        "slowest_scrape_ms": round(slowest * 1000, 1),
        "threads_at_end": threads,
    }
    print(json.dumps(result, indent=2))
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0 if result["rss_growth_mib"] < 2 else 1


if __name__ == "__main__":
    raise SystemExit(main())
