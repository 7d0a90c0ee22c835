"""Quick overhead check of one exporter: RSS, CPU per scrape, latency, idle CPU, NVML calls.

The full suite with node_exporter side by side, engines and scaling is ``bench/run_all.py``
(``make bench``); this runs only the exporter on an N-GPU synthetic replay trace and the real
/proc, with no engine listening (the engine collector counts connection failures), and prints
JSON. Same method as the suite (``bench/common.py``): CPU per scrape from batches (process CPU
over a batch minus the idle rate, divided by the batch size), latency per request over one
keep-alive connection.

    python bench/bench_scrape.py --gpus 1 8 16 [--client prometheus|text] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import common as c

sys.path.insert(0, str(c.ROOT))

from support.synthetic import write_synthetic_trace


def run(gpus: int, args: argparse.Namespace, work: Path) -> dict[str, Any]:
    trace = write_synthetic_trace(work / f"trace-{gpus}gpu.jsonl", gpus=gpus, duration_s=120.0)
    nobody = f"http://127.0.0.1:{c.free_port()}/metrics"
    with c.exporter(trace, nobody, work, ["--gpu.poll-interval", args.poll]) as ex:
        scraper = c.Scraper(ex.base, c.CLIENTS[args.client])
        probe = c.Scraper(ex.base, c.CLIENTS["text"])
        for _ in range(20):  # warm-up: imports, first allocations
            scraper.get()
        text = probe.get().decode()
        calls0, t0 = c.sample_sum(text, "inference_nvml_calls_total"), time.monotonic()
        idle, by_thread = c.idle_by_thread(ex.proc.pid, args.idle)
        batches = c.scrape_batches(ex.proc, scraper, idle, args.batches, args.batch_size)
        calls1 = c.sample_sum(probe.get().decode(), "inference_nvml_calls_total")
        return {
            "gpus": gpus,
            "client": args.client,
            "series": c.series_count(text),
            "rss_mib_end": c.rss_mib(ex.proc),
            **batches.as_json(),
            "idle_cpu_share": round(idle, 5),
            "idle_cpu_share_by_thread": by_thread,
            "nvml_calls_per_gpu_per_s": round(
                (calls1 - calls0) / (time.monotonic() - t0) / gpus, 3
            ),
            "poll_interval": args.poll,
        }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, nargs="+", default=[8])
    parser.add_argument("--client", choices=tuple(c.CLIENTS), default="prometheus")
    parser.add_argument("--batches", type=int, default=10)
    parser.add_argument("--batch-size", type=int, default=50)
    parser.add_argument("--idle", type=float, default=10.0, help="idle measurement, seconds")
    parser.add_argument("--poll", default="3s", help="--gpu.poll-interval of the exporter")
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-scrape-") as tmp:
        runs = [run(g, args, Path(tmp)) for g in args.gpus]
    text = json.dumps({"machine": c.machine(), "runs": runs}, indent=2)
    print(text)
    if args.json:
        args.json.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
