"""Where a scrape's CPU goes: the exporter in this process, its render profiled without HTTP.

Builds the exporter as the CLI does (same settings, all collectors at their defaults) on an
N-GPU synthetic trace, the real /proc and a fake engine (``bench/engine_server.py``) serving an
exposition, waits for the first collection, then:

* splits one scrape into collection (``registry.collect()``), encoding (text, OpenMetrics) and
  gzip, each the median CPU over batches;
* profiles ``Exporter.render`` for the request given (cProfile, or pyinstrument with
  ``--pyinstrument`` when installed) and prints the functions with the most own time.

Only the thread that renders is profiled; the ``cpu`` collector's read of /proc runs in its
worker thread and shows as waiting. HTTP (aiohttp) is not included: the difference between the
exporter's CPU per scrape (``bench/run_all.py``) and ``render`` here is the server's share.

    python bench/profile_scrape.py [--gpus 8] [--engine vllm|triton50|triton10k]
        [--client prometheus|text] [--pyinstrument]
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import gzip
import io
import pstats
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import common as c
import expositions

sys.path.insert(0, str(c.ROOT))

from prometheus_client.exposition import choose_encoder
from support.synthetic import write_synthetic_trace

from exporter.cli import load_settings
from exporter.collectors import build_collectors
from exporter.server.app import Exporter
from exporter.server.exposition import TextEncoder


class _Collected:
    def __init__(self, metrics: list[Any]) -> None:
        self.metrics = metrics

    def collect(self) -> list[Any]:
        return self.metrics


def breakdown(exporter: Exporter, accept: str, calls: int) -> dict[str, float]:
    collected = _Collected(list(exporter.registry.collect()))
    encoder, _ = choose_encoder(accept)
    body = exporter.render(accept, [])[0]
    text = TextEncoder()
    return {
        "render, as served (ms)": c.cpu_ms(lambda: exporter.render(accept, []), calls),
        "collection: registry.collect() (ms)": c.cpu_ms(
            lambda: list(exporter.registry.collect()), calls
        ),
        "encode collected families, encoder chosen for the request (ms)": c.cpu_ms(
            lambda: encoder(collected), calls
        ),
        "encode collected families, exporter's TextEncoder (ms)": c.cpu_ms(
            lambda: text.encode(collected), calls
        ),
        "gzip level 6 of the body (ms)": c.cpu_ms(lambda: gzip.compress(body, 6), calls),
        "gzip level 1 of the body (ms)": c.cpu_ms(lambda: gzip.compress(body, 1), calls),
    }


def profile(fn: Callable[[], object], calls: int, top: int, use_pyinstrument: bool) -> str:
    if use_pyinstrument:
        from pyinstrument import Profiler  # noqa: PLC0415

        profiler = Profiler(interval=0.0005)
        profiler.start()
        for _ in range(calls):
            fn()
        profiler.stop()
        return str(profiler.output_text(unicode=False, color=False, show_all=False))
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    out = io.StringIO()
    pstats.Stats(prof, stream=out).sort_stats("tottime").print_stats(top)
    return out.getvalue()


async def _run(args: argparse.Namespace, trace: Path, engine_url: str) -> None:
    settings, _ = load_settings(
        ["--gpu.replay-file", str(trace), "--engine.url", engine_url, "--log.level", "warn"], {}
    )
    exporter = Exporter(settings, build_collectors(settings))
    exporter.start()
    try:
        while not exporter.ready:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)
        accept = c.CLIENTS[args.client].get("Accept", "")
        loop = asyncio.get_running_loop()
        parts = await loop.run_in_executor(None, breakdown, exporter, accept, args.calls)
        for name, value in parts.items():
            print(f"{value:8.3f}  {name}")
        print()
        text = await loop.run_in_executor(
            None,
            profile,
            lambda: exporter.render(accept, []),
            args.calls,
            args.top,
            args.pyinstrument,
        )
        print(text)
    finally:
        await loop.run_in_executor(None, exporter.stop, 5.0)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--gpus", type=int, default=8)
    parser.add_argument("--engine", choices=("vllm", "triton50", "triton10k"), default="vllm")
    parser.add_argument("--client", choices=tuple(c.CLIENTS), default="prometheus")
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--pyinstrument", action="store_true")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-profile-") as tmp:
        work = Path(tmp)
        trace = write_synthetic_trace(work / "trace.jsonl", gpus=args.gpus, duration_s=120.0)
        body = expositions.VLLM
        if args.engine == "triton50":
            body = work / "triton-50.txt"
            body.write_text(expositions.triton_exposition(50))
        elif args.engine == "triton10k":
            body = work / "triton-10k.txt"
            body.write_text(expositions.triton_for_series(10_000)[1])
        with c.EngineServer(body, work) as engine:
            asyncio.run(_run(args, trace, engine.metrics_url))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
