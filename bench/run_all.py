"""The overhead suite: the exporter side by side with node_exporter, in one run.

What runs (each process on its own; this one only scrapes and reads /proc):

* the exporter (``bench/run_exporter.py``: the real CLI at its defaults) on an 8-GPU synthetic
  replay trace and the real /proc, reading a fake engine (``bench/engine_server.py``) that
  serves the full vLLM fixture; then the same with a Triton exposition of 50 models;
* the same on a trace where GPU 0's NVML call hangs, and with the engine endpoint hanging;
* Debian's ``prometheus-node-exporter`` with its default collectors, measured the same way;
* prometheus_client's bare ``generate_latest`` of the same series (in this process): a floor;
* scaling runs: 1, 8 and 16 GPUs; Triton expositions of about 100, 1k and 10k series.

Two scrape clients: ``prometheus`` sends Prometheus 2.42's headers (OpenMetrics preferred,
gzip), ``text`` asks for the classic text format without gzip (curl, the tests). Results go to
``bench/results/<UTC time>.json`` and ``bench/results/latest.json``; ``bench/report.py``
regenerates the tables of ``docs/performance.md`` from them (done at the end unless
``--no-docs``).

    python bench/run_all.py [--quick] [--no-docs]
    python bench/run_all.py --real-nvml --only vllm node-exporter   # on a machine with GPUs

``--only`` or ``--real-nvml`` make a partial run: its JSON is written, the docs are not.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import common as c
import expositions
import floor
import report

sys.path.insert(0, str(c.ROOT))

from support.synthetic import synthetic_trace_lines


@dataclass(frozen=True)
class Plan:
    """How long each measurement runs (seconds) and how many scrapes it makes."""

    warmup: int = 20
    idle_s: float = 60.0  # CPU time has 10 ms resolution: 0.017 % of a core over 60 s
    batches: int = 40
    batch_size: int = 50  # CPU time has 10 ms resolution: 0.2 ms per scrape at 50
    text_batches: int = 20
    paced10_s: float = 20.0
    paced1_s: float = 15.0
    hang_s: float = 10.0
    soak_total: int = 10_000
    side_idle_s: float = 15.0
    side_batches: int = 20
    scale_idle_s: float = 10.0
    scale_batches: int = 8
    scale_batch_size: int = 25
    floor_calls: int = 200


QUICK = Plan(
    warmup=5,
    idle_s=5.0,
    batches=6,
    batch_size=10,
    text_batches=6,
    paced10_s=3.0,
    paced1_s=3.0,
    hang_s=3.0,
    soak_total=300,
    side_idle_s=3.0,
    side_batches=4,
    scale_idle_s=3.0,
    scale_batches=3,
    scale_batch_size=10,
    floor_calls=20,
)

GPU_SCALE = (1, 8, 16)
SERIES_SCALE = (100, 1_000, 10_000)
TRITON_MODELS = 50
MAIN_GPUS = 8


def log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


# --- inputs ----------------------------------------------------------------------------------


def write_trace(path: Path, gpus: int, hang_gpu: int | None = None, hang_at: float = 0.0) -> Path:
    """A 120 s synthetic trace; with ``hang_gpu``, that GPU's records from ``hang_at`` on for
    5 s (longer than a poll interval, so a poll meets one) make the call hang for an hour: the
    GPU's poller stays stuck for the rest of the run."""
    lines = synthetic_trace_lines(gpus=gpus, duration_s=120.0)
    if hang_gpu is not None:
        out = [lines[0]]
        for line in lines[1:]:
            record = json.loads(line)
            if record["gpu"] == hang_gpu and 0 <= record["t"] - hang_at < 5.0:
                record["hang_s"] = 3600.0
                out.append(json.dumps(record, sort_keys=True, separators=(",", ":")))
            else:
                out.append(line)
        lines = out
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


# --- measuring one exporter ------------------------------------------------------------------


class Probe:
    """Text-format reads of an exporter's own metrics, outside the measured scrapes."""

    def __init__(self, base: str) -> None:
        self.scraper = c.Scraper(base, c.CLIENTS["text"])

    def text(self) -> str:
        return self.scraper.get().decode()

    def wait_for(self, name: str, labels: str, value: float, timeout: float) -> float:
        """Seconds until ``name{labels}`` reads ``value``; raises after ``timeout``."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            if c.sample_sum(self.text(), name, labels) == value:
                return time.monotonic() - start
            time.sleep(0.25)
        raise RuntimeError(f"{name}{{{labels}}} did not become {value} in {timeout:g}s")


def nvml_calls(text: str) -> float:
    return c.sample_sum(text, "inference_nvml_calls_total")


def warm_up(ex: c.Running, plan: Plan) -> dict[str, c.Scraper]:
    scrapers = {name: c.Scraper(ex.base, headers) for name, headers in c.CLIENTS.items()}
    for scraper in scrapers.values():
        for _ in range(plan.warmup):
            scraper.get()
    return scrapers


def body_sizes(scrapers: dict[str, c.Scraper], text: str) -> dict[str, Any]:
    return {
        "series": c.series_count(text),
        "text_bytes": len(text.encode()),
        "prometheus_bytes_on_wire": len(scrapers["prometheus"].get()),
    }


def hang_window(
    ex: c.Running, scraper: c.Scraper, plan: Plan, idle: float, baseline: dict[str, Any]
) -> dict[str, Any]:
    during = c.paced(ex.proc, scraper, 10.0, plan.hang_s, idle)
    return {"during": during, "verdict": unchanged(baseline["latency_ms"], during["latency_ms"])}


def unchanged(before: dict[str, float], after: dict[str, float]) -> dict[str, Any]:
    """Same latency within the noise of a shared machine: p50 within +25 %, p99 within +50 %
    or +2 ms of the baseline measured just before in the same process."""
    p50_ok = after["p50"] <= before["p50"] * 1.25 + 0.2
    p99_ok = after["p99"] <= max(before["p99"] * 1.5, before["p99"] + 2.0)
    return {
        "p50_ratio": round(after["p50"] / before["p50"], 2),
        "p99_ratio": round(after["p99"] / before["p99"], 2),
        "unchanged": p50_ok and p99_ok,
    }


def measure_main(
    ex: c.Running, engine: c.EngineServer, gpus: int, plan: Plan, full: bool
) -> dict[str, Any]:
    """Everything for one engine; ``full`` adds latency at 1/s, the engine hang and the soak."""
    scrapers = warm_up(ex, plan)
    probe = Probe(ex.base)
    first = probe.text()
    calls0, t0 = nvml_calls(first), time.monotonic()
    out: dict[str, Any] = {"gpus": gpus, **body_sizes(scrapers, first)}
    scrapes = plan.warmup * len(scrapers) + 2
    idle_s = plan.idle_s if full else plan.side_idle_s
    log(f"  idle {idle_s:g}s")
    idle, by_thread = c.idle_by_thread(ex.proc.pid, idle_s)
    out["idle_cpu_share"] = round(idle, 5)
    out["idle_cpu_share_by_thread"] = by_thread
    out["rss_mib_steady"] = c.rss_mib(ex.proc)
    batches = plan.batches if full else plan.side_batches
    text_batches = plan.text_batches if full else plan.side_batches
    for client, count in (("prometheus", batches), ("text", text_batches)):
        log(f"  {count}x{plan.batch_size} scrapes back to back, client {client}")
        result = c.scrape_batches(ex.proc, scrapers[client], idle, count, plan.batch_size)
        out[f"scrape_{client}"] = result.as_json()
        scrapes += count * plan.batch_size
    log(f"  paced 10/s for {plan.paced10_s:g}s")
    out["paced_10"] = c.paced(ex.proc, scrapers["prometheus"], 10.0, plan.paced10_s, idle)
    scrapes += out["paced_10"]["latency_ms"]["n"]
    if full:
        log(f"  paced 1/s for {plan.paced1_s:g}s")
        out["paced_1"] = c.paced(ex.proc, scrapers["prometheus"], 1.0, plan.paced1_s, idle)
        out["paced_10_text"] = c.paced(ex.proc, scrapers["text"], 10.0, plan.paced10_s / 2, idle)
        scrapes += out["paced_1"]["latency_ms"]["n"] + out["paced_10_text"]["latency_ms"]["n"]
        log(f"  baseline paced 10/s for {plan.hang_s:g}s, then the engine endpoint hangs")
        before = c.paced(ex.proc, scrapers["prometheus"], 10.0, plan.hang_s, idle)
        engine.set_mode("hang")
        took = probe.wait_for("inference_engine_up", "", 0.0, 20.0)
        hang = hang_window(ex, scrapers["prometheus"], plan, idle, before)
        hang["baseline"] = before
        hang["detected_after_s"] = round(took, 1)
        hang["engine_up_at_end"] = c.sample_sum(probe.text(), "inference_engine_up")
        out["engine_hang"] = hang
        scrapes += hang["during"]["latency_ms"]["n"] + before["latency_ms"]["n"]
        engine.set_mode("ok")
        soak = max(0, plan.soak_total - scrapes)
        log(f"  soak: {soak} more scrapes (client text) to {plan.soak_total}")
        soak_cpu = c.scrape_batches(ex.proc, scrapers["text"], idle, max(1, -(-soak // 50)), 50)
        scrapes += len(soak_cpu.latencies_s)
        out["soak_text_cpu_ms_per_scrape_median"] = soak_cpu.as_json()["cpu_ms_per_scrape_median"]
    out["scrapes_total"] = scrapes
    out["rss_mib_end"] = c.rss_mib(ex.proc)
    last = probe.text()
    out["nvml_calls_per_gpu_per_s"] = round(
        (nvml_calls(last) - calls0) / (time.monotonic() - t0) / gpus, 3
    )
    out["run_s"] = round(time.monotonic() - t0, 1)
    out["exposition_text"] = last
    return out


def nvml_hang_at(plan: Plan) -> float:
    """Trace time of the hang: after start-up, warm-up, the idle rate and the baseline."""
    return min(plan.side_idle_s, 5.0) + plan.hang_s + 10.0


def measure_nvml_hang(trace: Path, engine: c.EngineServer, logdir: Path, plan: Plan) -> Any:
    """Latency at 10/s before and while GPU 0's NVML call hangs, in one exporter process."""
    with c.exporter(trace, engine.metrics_url, logdir) as ex:
        scrapers = warm_up(ex, plan)
        probe = Probe(ex.base)
        idle = c.idle_rate(ex.proc, min(plan.side_idle_s, 5.0))
        if c.sample_sum(probe.text(), "inference_gpu_up", 'gpu="0"') != 1.0:
            raise RuntimeError("GPU 0 already down before the NVML hang")
        log(f"  baseline paced 10/s for {plan.hang_s:g}s")
        before = c.paced(ex.proc, scrapers["prometheus"], 10.0, plan.hang_s, idle)
        if c.sample_sum(probe.text(), "inference_gpu_up", 'gpu="0"') != 1.0:
            raise RuntimeError("GPU 0 hung during the baseline: start the hang later")
        took = probe.wait_for("inference_gpu_up", 'gpu="0"', 0.0, nvml_hang_at(plan) + 30.0)
        log(f"  GPU 0 hung (seen after {took:.1f}s); paced 10/s for {plan.hang_s:g}s")
        result = hang_window(ex, scrapers["prometheus"], plan, idle, before)
        text = probe.text()
        result["baseline"] = before
        result["gpu0_up_at_end"] = c.sample_sum(text, "inference_gpu_up", 'gpu="0"')
        result["gpus_up_at_end"] = c.sample_sum(text, "inference_gpu_up")
        result["nvml_collector_success_at_end"] = c.sample_sum(
            text, "inference_scrape_collector_success", 'collector="nvml"'
        )
        return result


def measure_node_exporter(binary: str, logdir: Path, plan: Plan) -> dict[str, Any]:
    with c.node_exporter(binary, logdir) as ne:
        scrapers = warm_up(ne, plan)
        text = Probe(ne.base).text()
        out: dict[str, Any] = {"version": c.node_exporter_version(binary)}
        out.update(body_sizes(scrapers, text))
        log(f"  idle {plan.side_idle_s:g}s")
        idle = c.idle_rate(ne.proc, plan.side_idle_s)
        out["idle_cpu_share"] = round(idle, 5)
        out["rss_mib_steady"] = c.rss_mib(ne.proc)
        for client in ("prometheus", "text"):
            log(f"  {plan.side_batches}x{plan.batch_size} scrapes back to back, client {client}")
            result = c.scrape_batches(
                ne.proc, scrapers[client], idle, plan.side_batches, plan.batch_size
            )
            out[f"scrape_{client}"] = result.as_json()
        log(f"  paced 10/s for {plan.paced10_s:g}s")
        out["paced_10"] = c.paced(ne.proc, scrapers["prometheus"], 10.0, plan.paced10_s, idle)
        out["rss_mib_end"] = c.rss_mib(ne.proc)
        return out


def engine_poll(body: str, calls: int) -> dict[str, Any]:
    """CPU of one engine poll's parse + recognise + normalise, in this process: the
    collector's path now and the two before it, side by side (``bench/engine_poll.py``)."""
    import engine_poll as poll  # noqa: PLC0415

    return poll.measure(body, calls)


def measure_scaling_point(
    trace: Path, body: Path, gpus: int, logdir: Path, plan: Plan
) -> dict[str, Any]:
    with (
        c.EngineServer(body, logdir) as engine,
        c.exporter(trace, engine.metrics_url, logdir) as ex,
    ):
        scrapers = warm_up(ex, plan)
        probe = Probe(ex.base)
        first = probe.text()
        calls0, t0 = nvml_calls(first), time.monotonic()
        out: dict[str, Any] = {"gpus": gpus, **body_sizes(scrapers, first)}
        idle, by_thread = c.idle_by_thread(ex.proc.pid, plan.scale_idle_s)
        out["idle_cpu_share"] = round(idle, 5)
        out["idle_cpu_share_by_thread"] = by_thread
        batches = c.scrape_batches(
            ex.proc, scrapers["prometheus"], idle, plan.scale_batches, plan.scale_batch_size
        )
        out["scrape_prometheus"] = batches.as_json()
        text_batches = c.scrape_batches(
            ex.proc, scrapers["text"], idle, plan.scale_batches, plan.scale_batch_size
        )
        out["scrape_text"] = text_batches.as_json()
        out["rss_mib_end"] = c.rss_mib(ex.proc)
        out["nvml_calls_per_gpu_per_s"] = round(
            (nvml_calls(probe.text()) - calls0) / (time.monotonic() - t0) / gpus, 3
        )
    text = body.read_text()
    out["engine_series"] = expositions.series_of(text)
    out["engine_bytes"] = len(text.encode())
    poll = engine_poll(text, 3 if plan.floor_calls < 100 else 9)
    out["engine_poll"] = poll
    out["engine_digest_ms"] = poll["now"]["median_ms"]
    out["engine_digest_before_ms"] = poll["families kept"]["median_ms"]
    out["engine_digest_full_parse_ms"] = poll["full parse"]["median_ms"]
    out["engine_digest_share_of_core"] = round(out["engine_digest_ms"] / 1000 / 5.0, 5)
    return out


# --- the suite -------------------------------------------------------------------------------


PARTS = ("vllm", "triton", "nvml-hang", "node-exporter", "scaling")


def run(plan: Plan, workdir: Path, parts: tuple[str, ...] = PARTS, real: bool = False) -> Any:
    results: dict[str, Any] = {
        "started_utc": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "machine": c.machine(),
        "plan": asdict(plan),
    }
    wall0 = time.monotonic()
    traces = {g: write_trace(workdir / f"trace-{g}gpu.jsonl", g) for g in GPU_SCALE}
    hang_trace = write_trace(
        workdir / "trace-8gpu-hang.jsonl", MAIN_GPUS, hang_gpu=0, hang_at=nvml_hang_at(plan)
    )
    bodies = {"vllm": expositions.VLLM}
    triton = workdir / f"triton-{TRITON_MODELS}-models.txt"
    triton.write_text(expositions.triton_exposition(TRITON_MODELS))
    bodies["triton"] = triton
    models: dict[int, int] = {}
    for target in SERIES_SCALE:
        models[target], text = expositions.triton_for_series(target)
        path = workdir / f"triton-{target}-series.txt"
        path.write_text(text)
        bodies[f"series-{target}"] = path

    main_trace: Path | None = traces[MAIN_GPUS]
    gpus = MAIN_GPUS
    if real:
        main_trace, gpus = None, real_gpu_count()
        results["real_nvml_gpus"] = gpus
    for name in ("vllm", "triton"):
        if name not in parts:
            continue
        what = "full vLLM exposition" if name == "vllm" else f"Triton, {TRITON_MODELS} models"
        log(f"exporter, {gpus} GPUs ({'real NVML' if real else 'replay'}), engine: {what}")
        with (
            c.EngineServer(bodies[name], workdir) as engine,
            c.exporter(main_trace, engine.metrics_url, workdir) as ex,
        ):
            run_ = measure_main(ex, engine, gpus, plan, full=name == "vllm")
        run_["engine_series"] = expositions.series_of(bodies[name].read_text())
        exposition = run_.pop("exposition_text")
        if name == "vllm":
            log("floor: prometheus_client generate_latest of the same series, in process")
            results["floor"] = floor.measure(exposition, plan.floor_calls)
        else:
            run_["engine_models"] = TRITON_MODELS
        results[f"exporter_{name}"] = run_

    if "nvml-hang" in parts:
        log("exporter, 8 GPUs, vLLM engine, GPU 0's NVML call hangs")
        with c.EngineServer(bodies["vllm"], workdir) as engine:
            results["nvml_hang"] = measure_nvml_hang(hang_trace, engine, workdir, plan)

    binary = c.node_exporter_binary()
    if "node-exporter" not in parts:
        pass
    elif binary is None:
        log("node_exporter not installed (apt-get install prometheus-node-exporter): skipped")
        results["node_exporter"] = None
    else:
        log(f"node_exporter ({binary}), default collectors")
        results["node_exporter"] = measure_node_exporter(binary, workdir, plan)

    if "scaling" in parts:
        results["scaling"] = scaling_runs(plan, workdir, traces, bodies, models)
    results["wall_s"] = round(time.monotonic() - wall0, 1)
    results["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results


def real_gpu_count() -> int:
    import pynvml  # noqa: PLC0415

    pynvml.nvmlInit()
    try:
        return int(pynvml.nvmlDeviceGetCount())
    finally:
        pynvml.nvmlShutdown()


def scaling_runs(
    plan: Plan,
    workdir: Path,
    traces: dict[int, Path],
    bodies: dict[str, Path],
    models: dict[int, int],
) -> dict[str, Any]:
    scaling: dict[str, Any] = {"gpus": [], "series": []}
    for gpus in GPU_SCALE:
        log(f"scaling: {gpus} GPUs, vLLM engine")
        point = measure_scaling_point(traces[gpus], bodies["vllm"], gpus, workdir, plan)
        scaling["gpus"].append(point)
    for target in SERIES_SCALE:
        log(f"scaling: 8 GPUs, Triton engine, about {target} series")
        point = measure_scaling_point(
            traces[MAIN_GPUS], bodies[f"series-{target}"], MAIN_GPUS, workdir, plan
        )
        point["target_series"] = target
        point["engine_models"] = models[target]
        scaling["series"].append(point)
    return scaling


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="short run to check the suite")
    parser.add_argument("--no-docs", action="store_true", help="leave docs/performance.md")
    parser.add_argument("--out", type=Path, default=c.RESULTS, help="results folder")
    parser.add_argument(
        "--only", nargs="+", choices=PARTS, default=PARTS, help="run only these parts"
    )
    parser.add_argument(
        "--real-nvml",
        action="store_true",
        help="the vLLM and Triton runs read this machine's GPUs through NVML, not a trace",
    )
    parser.add_argument("--soak", type=int, default=None, help="scrapes of the vLLM run")
    args = parser.parse_args()
    plan = QUICK if args.quick else Plan()
    if args.soak is not None:
        plan = replace(plan, soak_total=args.soak)
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-") as tmp:
        results = run(plan, Path(tmp), tuple(args.only), args.real_nvml)
    partial = tuple(args.only) != PARTS or args.real_nvml
    results["parts"] = list(args.only)
    results["quick"] = args.quick
    stamp = results["started_utc"].replace(":", "").replace("-", "")
    kind = "-quick" if args.quick else "-partial" if partial else ""
    path = args.out / f"run-{stamp}{kind}.json"
    path.write_text(json.dumps(results, indent=2) + "\n")
    log(f"results: {path}, {results['wall_s']:.0f}s")
    if partial:
        return 0
    results["targets"] = report.targets(results)
    text = json.dumps(results, indent=2) + "\n"
    path.write_text(text)
    (args.out / "latest.json").write_text(text)
    print(report.summary(results))
    if not args.no_docs:
        if args.quick:
            log("--quick: docs/performance.md left as it is")
        else:
            report.update_docs(results)
            log("docs/performance.md regenerated")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
