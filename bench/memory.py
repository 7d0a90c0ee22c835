"""Where the exporter's RSS comes from: its mappings, and bare interpreters for comparison.

Starts the exporter (real NVML with ``--real-nvml``, else an 8-GPU replay trace) reading the
fake vLLM engine, waits for it to settle, and reports RSS, USS and PSS, the anonymous and
file-backed shares and the largest mappings by RSS (``/proc/<pid>/smaps``). For comparison, it
measures bare interpreters in subprocesses: Python alone, Python with the exporter's imports,
and the same after ``nvmlInit()`` (``--real-nvml``).

    python bench/memory.py [--real-nvml] [--top 12]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common as c
import expositions
import psutil
import run_all

_BARE = """
import os, sys
sys.path.insert(0, {root!r})
stage = sys.argv[1]
if stage != "python":
    import aiohttp, prometheus_client, psutil, yaml  # noqa
    import exporter.server.app, exporter.collectors.engine, exporter.collectors.nvml  # noqa
    import exporter.collectors.process, exporter.collectors.cpu  # noqa
if stage == "nvml":
    import pynvml
    pynvml.nvmlInit()
    [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
for line in open("/proc/self/status"):
    if line.startswith("VmRSS"):
        print(int(line.split()[1]) / 1024)
"""


def mappings(pid: int, top: int) -> dict[str, Any]:
    """RSS by mapping (smaps), summed per path, largest first; anonymous and file shares."""
    by_path: dict[str, float] = {}
    anon = file_backed = 0.0
    path = "?"
    try:
        lines = Path(f"/proc/{pid}/smaps").read_text().splitlines()
    except OSError as err:
        return {"error": str(err)}
    for line in lines:
        parts = line.split()
        if not parts:
            continue
        if not parts[0].endswith(":") and "-" in parts[0]:
            path = parts[5] if len(parts) > 5 else "[anon]"
        elif parts[0] == "Rss:":
            mib = int(parts[1]) / 1024
            by_path[path] = by_path.get(path, 0.0) + mib
            if path.startswith("/") and not path.startswith("/dev/"):
                file_backed += mib
            else:
                anon += mib
    largest = sorted(by_path.items(), key=lambda kv: -kv[1])[:top]
    return {
        "anonymous_and_device_mib": round(anon, 2),
        "file_backed_mib": round(file_backed, 2),
        "largest": [[p, round(v, 2)] for p, v in largest],
    }


def bare(stage: str) -> float:
    out = subprocess.run(
        [sys.executable, "-c", _BARE.format(root=str(c.ROOT)), stage],
        capture_output=True,
        text=True,
        check=True,
    )
    return round(float(out.stdout.strip()), 2)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--real-nvml", action="store_true")
    parser.add_argument("--top", type=int, default=12)
    parser.add_argument("--settle", type=float, default=8.0, help="seconds before reading")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    out: dict[str, Any] = {"machine": c.machine(), "real_nvml": args.real_nvml}
    with tempfile.TemporaryDirectory(prefix="bench-memory-") as tmp:
        work = Path(tmp)
        trace = None if args.real_nvml else run_all.write_trace(work / "trace.jsonl", 8)
        with (
            c.EngineServer(expositions.VLLM, work) as engine,
            c.exporter(trace, engine.metrics_url, work) as ex,
        ):
            scraper = c.Scraper(ex.base, c.CLIENTS["prometheus"])
            for _ in range(50):
                scraper.get()
            time.sleep(args.settle)
            info = psutil.Process(ex.proc.pid).memory_full_info()
            out["exporter"] = {
                "rss_mib": round(info.rss / c.MIB, 2),
                "uss_mib": round(getattr(info, "uss", 0) / c.MIB, 2),
                "pss_mib": round(getattr(info, "pss", 0) / c.MIB, 2),
                **mappings(ex.proc.pid, args.top),
            }
    stages = ["python", "imports"] + (["nvml"] if args.real_nvml else [])
    out["bare_rss_mib"] = {stage: bare(stage) for stage in stages}
    text = json.dumps(out, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
