"""Decode roofline efficiency of the reference engine on this host, healthy and decode-overhead.

What the ``decode-overhead`` drill rests on, measured without Prometheus: for each run and each
case (no injection, then ``--inject decode-overhead``),

1. this host's peaks, measured as the drill traces measure them
   (:func:`exporter.lab.refengine.gputrace.measure_host`: read-only stream, fastest of 10);
2. the reference engine (the drills' configuration plus ``--engine-arg``\\ s) writing its model
   directory, under the drills' load (``inference-bottleneck-exporter load``: Poisson 2
   requests/s, 256 prompt and 192 output tokens) for ``--warm-up`` and then ``--measure``
   seconds;
3. over the measured window, from the engine's own ``/metrics``: mean inter-token latency
   (increase of ``vllm:inter_token_latency_seconds`` sum over count), mean KV tokens in use
   (``vllm:kv_cache_usage_perc`` sampled each second x ``num_gpu_blocks`` x ``block_size`` of
   ``vllm:cache_config_info``), and the read rate of ``vllm:estimated_read_bytes_per_gpu_total``;
4. the model's facts read from its directory by the sidecar's own code
   (:func:`exporter.backends.hfmodel.load_model`): weight bytes per step and KV bytes per token.

Then ``floor = (weight bytes + KV bytes per token x KV tokens) / bandwidth`` and
``efficiency = floor / mean ITL`` (the decode roofline efficiency), and, where the engine
counts its reads, ``read rate / bandwidth``. It prints one line per run and case, then the
medians per case; ``--json FILE`` keeps everything.

    PYTHONPATH=. python bench/decode_roofline.py --runs 3
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from exporter.backends.hfmodel import load_model  # noqa: E402
from exporter.engines import parse_exposition  # noqa: E402
from exporter.lab.processes import child_pythonpath, stop_process  # noqa: E402
from exporter.lab.refengine.gputrace import HostPeaks, measure_host  # noqa: E402

LISTEN = re.compile(r"listening on (http://\S+)")
CASES = {"healthy": [], "decode-overhead": ["--inject", "decode-overhead"]}
# The drills' load (tests/drills/scenarios.py LOAD).
RATE, PROMPT, OUTPUT = 2.0, 256, 192


def scrape(url: str) -> dict[str, Any]:
    """The engine's samples this script reads, by name (and labels for cache_config_info)."""
    with urllib.request.urlopen(url + "/metrics", timeout=10) as resp:
        families = parse_exposition(resp.read().decode())
    out: dict[str, Any] = {}
    for family in families:
        for s in family.samples:
            if s.name == "vllm:cache_config_info":
                out["cache"] = dict(s.labels)
            elif s.name in (
                "vllm:inter_token_latency_seconds_sum",
                "vllm:inter_token_latency_seconds_count",
                "vllm:kv_cache_usage_perc",
                "vllm:estimated_read_bytes_per_gpu_total",
                "vllm:generation_tokens_total",
                "vllm:num_requests_waiting",
            ):
                out[s.name] = float(s.value)
    return out


def start_engine(workdir: Path, args: list[str]) -> tuple[subprocess.Popen[bytes], str]:
    log = (workdir / "engine.log").open("wb")
    proc = subprocess.Popen(
        [sys.executable, "-m", "exporter.lab.refengine", "--port", "0", *args],
        stdout=log,
        stderr=subprocess.STDOUT,
        stdin=subprocess.DEVNULL,
        env={**os.environ, "PYTHONPATH": child_pythonpath()},
    )
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:
        match = LISTEN.search((workdir / "engine.log").read_text(errors="replace"))
        if match:
            return proc, match.group(1)
        if proc.poll() is not None:
            break
        time.sleep(0.2)
    stop_process(proc, 10)
    raise RuntimeError("engine did not start: " + (workdir / "engine.log").read_text()[-2000:])


def one(case: str, host: HostPeaks, args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="decode-roofline-") as tmp:
        workdir = Path(tmp)
        model_dir = workdir / "model"
        engine_args = [*CASES[case], "--model-dir", str(model_dir), *args.engine_arg]
        engine, url = start_engine(workdir, engine_args)
        load = subprocess.Popen(
            [
                sys.executable, "-m", "exporter.cli", "load", "--url", url,
                "--rate", f"{RATE:g}", "--prompt-tokens", str(PROMPT),
                "--output-tokens", str(OUTPUT),
                "--duration", f"{args.warm_up + args.measure + 10:g}s",
                "--drain", "1s", "--progress", "off", "--output", "json",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            stdin=subprocess.DEVNULL,
            env={**os.environ, "PYTHONPATH": child_pythonpath()},
        )  # fmt: skip
        try:
            time.sleep(args.warm_up)
            first = scrape(url)
            usage: list[float] = []
            end = time.monotonic() + args.measure
            while time.monotonic() < end:
                usage.append(scrape(url)["vllm:kv_cache_usage_perc"])
                time.sleep(1.0)
            last = scrape(url)
        finally:
            stop_process(load, 20)
            stop_process(engine, 20)
        facts = load_model(model_dir)
    assert facts.weight_bytes is not None and facts.kv_cache_bytes_per_token is not None

    def delta(name: str) -> float:
        return float(last[name] - first[name])

    itl = delta("vllm:inter_token_latency_seconds_sum") / delta(
        "vllm:inter_token_latency_seconds_count"
    )
    cache = last["cache"]
    capacity = int(cache["num_gpu_blocks"]) * int(cache["block_size"])
    kv_tokens = statistics.fmean(usage) * capacity
    floor = (
        facts.weight_bytes + facts.kv_cache_bytes_per_token * kv_tokens
    ) / host.memory_bandwidth
    read_rate = delta("vllm:estimated_read_bytes_per_gpu_total") / args.measure
    return {
        "case": case,
        "bandwidth": host.memory_bandwidth,
        "matmul_flops": host.matmul_flops,
        "weight_bytes": facts.weight_bytes,
        "kv_bytes_per_token": facts.kv_cache_bytes_per_token,
        "kv_tokens": kv_tokens,
        "floor_s": floor,
        "itl_s": itl,
        "efficiency": floor / itl,
        "read_share": read_rate / host.memory_bandwidth,
        "tokens_per_s": delta("vllm:generation_tokens_total") / args.measure,
        "waiting_end": last["vllm:num_requests_waiting"],
    }


def line(r: dict[str, Any]) -> str:
    return (
        f"{r['case']:<16} bw {r['bandwidth'] / 1e9:5.1f} GB/s  weights "
        f"{r['weight_bytes'] / 1e6:5.1f} MB  KV {r['kv_tokens']:5.0f} tok "
        f"({r['kv_tokens'] * r['kv_bytes_per_token'] / 1e6:4.1f} MB)  floor "
        f"{r['floor_s'] * 1e3:5.2f} ms  ITL {r['itl_s'] * 1e3:6.2f} ms  efficiency "
        f"{r['efficiency']:.2f}  reads/peak {r['read_share']:.2f}  "
        f"{r['tokens_per_s']:4.0f} tok/s  waiting {r['waiting_end']:.0f}"
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--warm-up", type=float, default=20.0, help="seconds before measuring")
    parser.add_argument("--measure", type=float, default=60.0, help="seconds measured")
    parser.add_argument("--case", action="append", choices=sorted(CASES), help="default: both")
    parser.add_argument("--engine-arg", action="append", default=[], help="extra engine flag")
    parser.add_argument("--json", type=Path, help="write every run here")
    args = parser.parse_args()
    cases = args.case or list(CASES)
    results: list[dict[str, Any]] = []
    for run in range(args.runs):
        for case in cases:
            host = measure_host()
            r = {"run": run, **one(case, host, args)}
            results.append(r)
            print(f"run {run}: {line(r)}", flush=True)
    print(f"medians of {args.runs} run(s):")
    for case in cases:
        mine = [r for r in results if r["case"] == case]
        med = {
            k: statistics.median(r[k] for r in mine)
            for k in mine[0]
            if isinstance(mine[0][k], float)
        }
        print("  " + line({"case": case, **med}))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
