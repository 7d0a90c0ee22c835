"""``inference-bottleneck-exporter demo``: the whole pipeline on this machine, live.

Starts the reference engine (with ``--inject`` causes), the sidecar reading it, and what
reads the GPU (NVML when this machine has an NVIDIA driver, else a replayed GPU) in the
chart's default layout: a node agent beside the NVML-less sidecar, a stand-in kubelet
giving the demo's pod its GPUs, a stand-in kube-state-metrics, Prometheus scraping both as the
chart's PodMonitors do with the ``fast-node`` rules (``--layout sidecar``: the sidecar reads
the GPU itself, the ``fast`` rules; ``--layout dcgm``: a stand-in dcgm-exporter, the
``fast-dcgm`` rules; :mod:`exporter.lab.layouts`); Alertmanager paging a local
PagerDuty capture when the binaries are installed (``make tools``); and an open-loop load.
The terminal shows the layout, the key numbers, the signatures Prometheus evaluates, the pages
Alertmanager sent, and where to look: on a terminal as one screen that redraws in place
(:mod:`exporter.lab.screen`; ``q`` quits, ``d`` shows ``diagnose``'s verdict), else as blocks
of lines. Ctrl-C stops everything and prints what fired.

The replayed GPU: without injections the bundled showcase trace
(``exporter/data/replay-2gpu-synthetic.jsonl``, GPU 0 pulsing around 67 %); with one, the
drill trace of that cause (:mod:`exporter.lab.refengine.gputrace`: a GPU waiting on its host at
40 %, or busy at 88 % for ``queue-flood``), so the GPU-gated signatures can fire as they do in
the drills. ``--trace`` picks another.

``kv-transfer-slow`` and ``decode-pool-short`` need a disaggregated pair: with either, the demo
runs a prefill engine behind the decode one (its own sidecar, and in the node layout its own
node, scraped by the same Prometheus).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib.util
import math
import shutil
import signal
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn, TextIO

from exporter.config import ArgumentParser, parse_duration, usage_error
from exporter.lab.layouts import DEFAULT_LAYOUT, LAYOUTS, rule_profile
from exporter.lab.loadgen import (
    LiveState,
    LoadConfig,
    Summary,
    completions_url,
    format_summary,
    percentiles,
    run,
)
from exporter.lab.processes import uninterrupted
from exporter.lab.refengine import gputrace, inject
from exporter.lab.stack import OUTSIDE, PagerDutyCapture, Stack, StackConfig, StackError
from exporter.lab.thirdparty import ENGINE_INJECTIONS
from exporter.signatures.promql_text import pct

if TYPE_CHECKING:
    from exporter.diagnose.diagnosis import Report
    from exporter.lab.screen import ScreenState, ScreenView

PROG = "inference-bottleneck-exporter demo"
PORTS = {
    "engine": 8000,
    "sidecar": 10960,
    "agent": 10961,
    "prometheus": 9090,
    "alertmanager": 9093,
}
DEMO_LABELS = {"namespace": "demo", "pod": "reference-0"}


def _fail(message: str) -> NoReturn:
    usage_error(PROG, message)


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog=PROG,
        description=(
            "Run the reference engine, a load, the sidecar, Prometheus and Alertmanager here, "
            "and watch the signatures; Ctrl-C stops everything."
        ),
    )
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        metavar="NAME[,NAME]",
        help="bottlenecks to inject: " + ", ".join(inject.INJECTIONS),
    )
    p.add_argument("--rate", type=float, default=2.0, help="requests per second (default 2)")
    p.add_argument("--prompt-tokens", type=int, default=256, help="prompt size (default 256)")
    p.add_argument("--output-tokens", type=int, default=192, help="tokens per answer (192)")
    p.add_argument("--duration", default="", help="stop after this long (default: Ctrl-C)")
    p.add_argument("--device", default="auto", help="engine device: auto, cpu, cuda")
    p.add_argument(
        "--trace",
        default="auto",
        help="GPU replay without a GPU: auto, bundled, starved, busy or a trace file",
    )
    p.add_argument(
        "--layout",
        choices=tuple(LAYOUTS),
        default=DEFAULT_LAYOUT,
        help="who reads the GPU: node (the chart's default: a node agent beside the NVML-less "
        "sidecar), sidecar (NVML in the sidecar) or dcgm (a stand-in dcgm-exporter)",
    )
    p.add_argument("--no-prometheus", action="store_true", help="do not start Prometheus")
    p.add_argument("--no-alertmanager", action="store_true", help="do not start Alertmanager")
    p.add_argument("--refresh", default="2s", help="screen refresh interval (default 2s)")
    p.add_argument(
        "--plain",
        action="store_true",
        help="print blocks of lines instead of the screen (so does a pipe or a log)",
    )
    p.add_argument("--workdir", type=Path, help="keep configs and logs here (default: temporary)")
    p.add_argument("--engine-arg", action="append", default=[], help="extra engine flag")
    p.add_argument(
        "--engine",
        choices=("reference", *ENGINE_INJECTIONS),
        default="reference",
        help="the engine: the reference engine, or llama.cpp's llama-server or Triton as they "
        "ship (make thirdparty builds them)",
    )
    return p


def _has_gpu() -> bool:
    return Path("/dev/nvidiactl").exists()


def pick_trace(choice: str, injections: frozenset[str], workdir: Path) -> tuple[Path | None, str]:
    """The replay file for what reads the GPU, the node agent or the sidecar (None: NVML), and
    how to describe it."""
    if choice == "auto" and _has_gpu():
        return None, "NVML (this machine's GPUs)"
    if choice == "auto":
        if not injections:
            choice = "bundled"
        else:
            looks = {gputrace.SCENARIO_LOOK.get(i, "starved") for i in injections}
            choice = "busy" if looks == {"busy"} else "starved"
    if choice == "bundled":
        ref = resources.files("exporter").joinpath("data/replay-2gpu-synthetic.jsonl")
        path = workdir / "replay-2gpu-synthetic.jsonl"
        path.write_bytes(ref.read_bytes())
        return path, "replay of the bundled synthetic 2-GPU trace"
    if choice in gputrace.LOOKS:
        level = gputrace.LOOKS[choice]
        host = gputrace.measure_host()
        path = gputrace.write_trace(choice, workdir / f"trace-{choice}.jsonl", host=host)
        return path, (
            f"replay of the '{choice}' drill trace (synthetic, ~{level:.0f} %; this host's "
            f"{host.memory_bandwidth / 1e9:.1f} GB/s, {host.matmul_flops / 1e9:.0f} GFLOP/s)"
        )
    path = Path(choice)
    if not path.is_file():
        _fail(f"--trace: {choice!r} is not auto, bundled, starved, busy or a file")
    return path.resolve(), f"replay of {path}"


# --- live numbers from the sidecar ---------------------------------------------------------------


@dataclass
class Sample:
    at: float
    values: dict[str, float] = field(default_factory=dict)


def _scrape(url: str) -> list[Any]:
    """Every sample of an exporter's ``/metrics``."""
    from prometheus_client.parser import text_string_to_metric_families  # noqa: PLC0415

    with urllib.request.urlopen(url + "/metrics", timeout=5) as resp:
        text = resp.read().decode("utf-8", errors="replace")
    return [s for family in text_string_to_metric_families(text) for s in family.samples]


def _read_exporter(url: str, only: str = "") -> dict[str, float]:
    """An exporter's samples summed by name (the CPU's by mode too), those named ``only*``."""
    values: dict[str, float] = {}
    for s in _scrape(url):
        key = s.name
        if not key.startswith(only):
            continue
        if s.name == "inference_cpu_seconds_total":
            key = f"{s.name}:{s.labels.get('mode', '')}"
        elif s.name.endswith("_bucket") or s.name.endswith("_created"):
            continue
        values[key] = values.get(key, 0.0) + float(s.value)
    return values


# dcgm-exporter's utilisation gauge, in percent.
DCGM_UTIL = "DCGM_FI_DEV_GPU_UTIL"


def read_sample(sidecar: str, agent: str = "", dcgm: str = "") -> Sample:
    """The sidecar's numbers, and the GPU's from what reads it: the node agent (node layout)
    or dcgm-exporter (dcgm layout: its mean utilisation now, and how many GPUs), whose GPUs
    the stand-in kubelet gave to the demo's pod (all of them)."""
    values = _read_exporter(sidecar)
    if agent:
        values.update(_read_exporter(agent, "inference_gpu_"))
    if dcgm:
        util = [float(s.value) for s in _scrape(dcgm) if s.name == DCGM_UTIL]
        if util:
            values[DCGM_UTIL] = sum(util) / len(util)
            values["inference_gpu_up"] = len(util)
    return Sample(time.monotonic(), values)


def _rate(a: Sample, b: Sample, name: str) -> float | None:
    if name not in a.values or name not in b.values or b.at <= a.at:
        return None
    return max(0.0, b.values[name] - a.values[name]) / (b.at - a.at)


def _pct(value: float | None, digits: int = 0) -> str:
    return "-" if value is None or math.isnan(value) else f"{pct(value, digits)} %"


def _ms(value: float | None) -> str:
    return "-" if value is None or math.isnan(value) else f"{1000 * value:.1f} ms"


# --- the view ------------------------------------------------------------------------------------


@dataclass
class View:
    """The plain view, for a pipe or a log (``--plain``): a block of lines every 10 s."""

    out: TextIO
    header: list[str]
    last_print: float = 0.0

    def show(self, lines: list[str]) -> None:
        now = time.monotonic()
        if now - self.last_print < 10:
            return
        stamp = time.strftime("%H:%M:%S")
        self.out.write(f"--- {stamp}\n" + "\n".join(lines) + "\n")
        self.last_print = now
        self.out.flush()


def _load_lines(state: LiveState, rate: float) -> list[str]:
    recent = [r for r in state.results[-200:] if r.ok]
    done = sum(1 for r in state.results if r.ok)
    failed = len(state.results) - done
    ttft = percentiles([r.ttft for r in recent if r.ttft is not None])
    itl = percentiles([g for r in recent for g in r.itl])
    e2e = percentiles([r.e2e for r in recent if r.e2e is not None])
    open_ = state.sent - len(state.results)
    return [
        f" load       {rate:g} req/s offered, {state.sent} sent, {done} done, {failed} failed, "
        f"{open_} open",
        f"            client p50: TTFT {_ms(ttft.get('p50'))}, gap between chunks "
        f"{_ms(itl.get('p50'))}, end-to-end {_ms(e2e.get('p50'))}",
    ]


def _engine_lines(prev: Sample | None, cur: Sample | None) -> list[str]:
    if cur is None:
        return [" engine     (waiting for the sidecar)"]
    v = cur.values
    lines = [
        f" engine     queue {v.get('inference_queue_depth', 0):.0f}, running "
        f"{v.get('inference_requests_running', 0):.0f}, KV cache "
        f"{_pct(v.get('inference_kv_cache_usage_ratio'))}"
        + (
            f", {_rate(prev, cur, 'inference_generation_tokens_total') or 0:.0f} tokens/s"
            if prev
            else ""
        ),
    ]
    if prev is None:
        return lines
    gpus = v.get("inference_gpu_up")
    util = _gpu_util(prev, cur)
    softirq = _rate(prev, cur, "inference_cpu_seconds_total:softirq")
    total = sum(
        _rate(prev, cur, k) or 0.0 for k in cur.values if k.startswith("inference_cpu_seconds_")
    )
    node = softirq / total if softirq is not None and total else None
    lines += [
        f" GPU        utilisation {_pct(util)} (mean of {gpus or 0:.0f} GPU)",
        f" host CPU   softirq {_pct(node, 1)} of the node, "
        f"{_pct(v.get('inference_cpu_softirq_hottest_core_ratio'))} of its busiest core; "
        f"busiest engine thread {_pct(v.get('inference_engine_hottest_thread_cpu_ratio'))} of "
        "a core",
    ]
    tok = _mean(prev, cur, "inference_tokenizer_latency_seconds")
    itl = _mean(prev, cur, "inference_inter_token_latency_seconds")
    lines.append(f" tokenizer  probe {_ms(tok)} for ~512 tokens, decode step {_ms(itl)} (means)")
    return lines


def _gpu_util(prev: Sample, cur: Sample) -> float | None:
    """Mean utilisation of the GPUs between two samples, from their busy-seconds counters
    (dcgm layout: dcgm-exporter's utilisation gauge now)."""
    if DCGM_UTIL in cur.values:
        return cur.values[DCGM_UTIL] / 100
    busy = _rate(prev, cur, "inference_gpu_busy_seconds_total")
    gpus = cur.values.get("inference_gpu_up")
    return busy / gpus if busy is not None and gpus else None


def _mean(prev: Sample, cur: Sample, histogram: str) -> float | None:
    """A histogram's mean between two samples."""
    count = _rate(prev, cur, f"{histogram}_count")
    total = _rate(prev, cur, f"{histogram}_sum")
    return total / count if count and total is not None else None


def reading(prev: Sample | None, cur: Sample | None, state: LiveState) -> dict[str, float | None]:
    """The screen's sparkline values now (None where not known yet)."""
    recent = [r.e2e for r in state.results[-50:] if r.ok and r.e2e is not None]
    out: dict[str, float | None] = {"latency": percentiles(recent).get("p50")}
    if cur is not None:
        out["queue"] = cur.values.get("inference_queue_depth")
        out["thread"] = cur.values.get("inference_engine_hottest_thread_cpu_ratio")
    if prev is not None and cur is not None:
        out["gpu"] = _gpu_util(prev, cur)
        out["tokenizer"] = _mean(prev, cur, "inference_tokenizer_latency_seconds")
        out["decode"] = _mean(prev, cur, "inference_inter_token_latency_seconds")
    return out


def fetch_alerts(prometheus: str) -> list[dict[str, Any]] | None:
    """Prometheus's alerts, firing first then by name; None when it does not answer."""
    import json  # noqa: PLC0415

    try:
        with urllib.request.urlopen(prometheus + "/api/v1/alerts", timeout=3) as resp:
            alerts: list[dict[str, Any]] = json.loads(resp.read())["data"]["alerts"]
    except (OSError, ValueError, KeyError):
        return None
    order = {"firing": 0, "pending": 1}
    return sorted(alerts, key=lambda a: (order.get(a["state"], 2), a["labels"]["alertname"]))


def _alert_lines(
    prometheus: str, alerts: list[dict[str, Any]] | None, profile: str = "fast"
) -> list[str]:
    if not prometheus:
        return [
            " signatures Prometheus is not installed (make tools); instead run:",
            "            inference-bottleneck-exporter diagnose --target <sidecar URL>",
        ]
    if alerts is None:
        return [" signatures (Prometheus not answering)"]
    if not alerts:
        return [" signatures none pending or firing"]
    lines = [f" signatures ({profile} profile: windows and `for` are 1/10 of production)"]
    for a in alerts:
        since = a.get("activeAt", "")[11:19]
        lines.append(
            f"   {a['state'].upper():<8} {a['labels'].get('severity', ''):<8} "
            f"{a['labels']['alertname']} (active since {since} UTC)"
        )
        if a["state"] == "firing":
            text = a.get("annotations", {}).get("description", "")
            lines.append("            " + (text[:150] + "..." if len(text) > 150 else text))
    return lines


def last_page(capture: PagerDutyCapture | None) -> tuple[int, str]:
    """How many PagerDuty events Alertmanager sent, and the last one in a line."""
    pages = capture.snapshot() if capture is not None else []
    if not pages:
        return 0, ""
    payload = pages[-1].body.get("payload", {})
    return len(pages), f"[{payload.get('severity', '')}] {payload.get('summary', '')}"


def _page_lines(capture: PagerDutyCapture | None) -> list[str]:
    if capture is None:
        return []
    count, text = last_page(capture)
    if not count:
        return [" pages      none yet (Alertmanager -> local PagerDuty capture)"]
    return [f" pages      {count} PagerDuty events; last: {text[:120]}"]


async def _live(
    args: argparse.Namespace, stack: Stack, view: View | ScreenView
) -> Summary | ValueError:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    if not isinstance(view, View):
        view.attach(loop, stop, _diagnose_with(stack))
    duration = parse_duration(args.duration) if args.duration else 7 * 86400.0
    triton = stack.cfg.engine == "triton"
    cfg = LoadConfig(
        url=stack.engine_url if triton else completions_url(stack.engine_url),
        rate=args.rate,
        prompt_tokens=args.prompt_tokens,
        output_tokens=args.output_tokens,
        duration=duration,
        drain=0.0,
        api="triton" if triton else "openai",
        model="tiny" if triton else "",
    )
    state = LiveState()
    load = asyncio.create_task(run(cfg, None, stop=stop, state=state))
    refresh = parse_duration(args.refresh)
    prev: Sample | None = None
    cur: Sample | None = None
    while not stop.is_set() and not load.done():
        with contextlib.suppress(OSError, ValueError):
            sample = await loop.run_in_executor(
                None, read_sample, stack.sidecar_url, stack.agent_url, stack.dcgm_url
            )
            prev, cur = cur, sample
        alerts = (
            await loop.run_in_executor(None, fetch_alerts, stack.prometheus_url)
            if stack.prometheus_url
            else None
        )
        dead = [c.name for c in stack.children if not c.alive()]
        stopped = f"{', '.join(dead)} exited: see the logs in {stack.cfg.workdir}" if dead else ""
        if isinstance(view, View):
            lines = [
                *_load_lines(state, args.rate),
                *_engine_lines(prev, cur),
                "",
                *_alert_lines(stack.prometheus_url, alerts, rule_profile(stack.cfg.layout)),
                *_page_lines(stack.capture),
            ]
            if stopped:
                lines.append(f" STOPPED    {stopped}")
            view.show(lines)
        else:
            view.update(
                reading(prev, cur, state),
                load=_load_lines(state, args.rate)[0].split(maxsplit=1)[1],
                alerts=alerts,
                page=last_page(stack.capture),
                stopped=stopped,
            )
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), timeout=refresh)
    stop.set()
    try:
        return await load
    except ValueError as err:
        return err


def main(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    try:
        injections = inject.parse(args.inject)
        if args.duration:
            parse_duration(args.duration)
        parse_duration(args.refresh)
    except ValueError as err:
        _fail(str(err))
    if not 0 < args.rate <= 1000:
        _fail("--rate: must be more than 0 and at most 1000")
    reference = args.engine == "reference"
    missing = [m for m in ("torch", "tokenizers") if importlib.util.find_spec(m) is None]
    if missing and reference:
        _fail(
            f"the demo needs {' and '.join(missing)}: pip install "
            "'inference-bottleneck-exporter[reference]' (make demo does it)"
        )
    node = [m for m in ("grpc", "google.protobuf") if importlib.util.find_spec(m.split(".")[0])]
    if args.layout == "node" and len(node) < 2:
        _fail(
            "the node layout's agent needs grpcio and protobuf: pip install "
            "'inference-bottleneck-exporter[node]' (make demo does it), or --layout sidecar"
        )
    if not reference:
        allowed = OUTSIDE | set(ENGINE_INJECTIONS[args.engine])
        if injections - allowed:
            _fail(
                f"--inject: {args.engine} takes only {', '.join(sorted(allowed))}, not "
                f"{', '.join(sorted(injections - allowed))}"
            )
    if injections & inject.CUDA_ONLY and not _has_gpu():
        _fail(f"{', '.join(sorted(injections & inject.CUDA_ONLY))} needs an NVIDIA GPU")
    keep = args.workdir is not None
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="ibe-demo-"))
    workdir.mkdir(parents=True, exist_ok=True)
    trace, gpu_text = pick_trace(args.trace, injections, workdir)
    stack = Stack(
        StackConfig(
            workdir=workdir,
            layout=args.layout,
            injections=sorted(injections),
            engine_args=["--device", args.device, *args.engine_arg]
            if reference
            else list(args.engine_arg),
            engine=args.engine,
            trace=trace,
            prometheus=not args.no_prometheus,
            alertmanager=not args.no_alertmanager,
            engine_port=PORTS["engine"],
            sidecar_port=PORTS["sidecar"],
            agent_port=PORTS["agent"],
            prometheus_port=PORTS["prometheus"],
            alertmanager_port=PORTS["alertmanager"],
            target_labels=dict(DEMO_LABELS),
            prefill_args=(
                ["--device", args.device, *args.engine_arg]
                if injections & inject.DISAGGREGATED
                else None
            ),
        )
    )
    parts = (
        ["a prefill and a decode reference engine", "their sidecars"]
        if stack.cfg.prefill_args is not None
        else [ENGINE_NAMES[args.engine], "the sidecar"]
    )
    reader = {"node": "node agent", "dcgm": "stand-in dcgm-exporter"}.get(args.layout)
    if reader:
        parts.append(f"their {reader}s" if stack.cfg.prefill_args is not None else f"the {reader}")
    if stack.prometheus_bin:
        parts.append("Prometheus")
    if stack.alertmanager_bin:
        parts.append("Alertmanager")
    print(
        f"starting {', '.join(parts)} in the {args.layout} layout... (logs in {workdir})",
        flush=True,
    )
    # From here on SIGTERM is Ctrl-C: whenever it comes (starting, running, stopping), every
    # child is stopped and waited for before the demo exits.
    signal.signal(signal.SIGTERM, _interrupt)
    summary: Summary | ValueError | None = None
    fired: list[str] = []
    try:
        try:
            stack.start()
        except (StackError, OSError) as err:
            sys.stderr.write(f"{PROG}: error: {err}\n")
            return 1
        summary, fired = _run(args, stack, injections, gpu_text)
    except KeyboardInterrupt:
        return 130
    finally:
        stack.stop()
    print(_goodbye(summary, fired, workdir, keep))
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    return 0


def _interrupt(signum: int, frame: object) -> NoReturn:
    raise KeyboardInterrupt


def _run(
    args: argparse.Namespace, stack: Stack, injections: frozenset[str], gpu_text: str
) -> tuple[Summary | ValueError | None, list[str]]:
    """The live view until Ctrl-C, SIGTERM, ``q`` or ``--duration``: the load's summary and
    what fired at the end."""
    header = _header(stack, injections, gpu_text, args.engine)
    screen = sys.stdout.isatty() and sys.stdin.isatty() and not args.plain
    view: View | ScreenView
    if screen:
        from exporter.lab.screen import ScreenView  # noqa: PLC0415

        view = ScreenView(_screen_state(stack, injections, gpu_text, args.engine))
    else:
        print("\n".join(header), flush=True)
        view = View(sys.stdout, header)
    summary: Summary | ValueError | None = None
    try:
        summary = asyncio.run(_live(args, stack, view))
    except KeyboardInterrupt:
        pass  # a signal between the loop's handlers: stop as Ctrl-C does
    finally:
        # asyncio put SIGTERM back to its default when its loop closed
        signal.signal(signal.SIGTERM, _interrupt)
        if not isinstance(view, View):
            view.close()
    with uninterrupted():
        return summary, _fired(stack)


ENGINE_NAMES = {
    "reference": "the reference engine",
    "llamacpp": "llama.cpp's llama-server",
    "triton": "Triton (PyTriton)",
}
ENGINE_APIS = {
    "reference": "/v1/completions, /tokenize, /metrics",
    "llamacpp": "/v1/completions, /tokenize, /slots, /metrics",
    "triton": "/v2/models/tiny/generate; metrics on their own port",
}


def layout_text(layout: str) -> str:
    """The layout as the demo's header says it, with the others a flag away."""
    others = " or ".join(name for name in LAYOUTS if name != layout)
    return f"{layout}: {LAYOUTS[layout]}; --layout {others} for the others"


def _places(stack: Stack, engine: str = "reference") -> list[tuple[str, str, str]]:
    """What runs where: (what, URL, the URL with what to open there)."""
    nonvml = stack.cfg.layout != "sidecar"
    pod = "/".join(stack.cfg.target_labels[k] for k in ("namespace", "pod"))
    sidecar = f"{stack.sidecar_url}/  and  {stack.sidecar_url}/metrics"
    places = [
        ("engine", stack.engine_url, f"{stack.engine_url}  ({ENGINE_NAMES[engine]}: "
         f"{ENGINE_APIS[engine]})"),
        ("sidecar", stack.sidecar_url, sidecar + ("  (no NVML)" if nonvml else "")),
    ]  # fmt: skip
    if stack.agent_url:
        places.append(
            (
                "node agent",
                stack.agent_url,
                f"{stack.agent_url}/metrics  (a stand-in kubelet gives {pod} its GPUs)",
            )
        )
    if stack.dcgm_url:
        places.append(
            (
                "dcgm-exporter",
                stack.dcgm_url,
                f"{stack.dcgm_url}/metrics  (a stand-in: the DCGM fields of {pod}'s GPUs)",
            )
        )
    if stack.prometheus_url:
        profile = rule_profile(stack.cfg.layout)
        places.append(
            (
                "Prometheus",
                stack.prometheus_url,
                f"{stack.prometheus_url}/alerts  ({profile} rules)",
            )
        )
    if stack.alertmanager_url:
        places.append(
            (
                "Alertmanager",
                stack.alertmanager_url,
                f"{stack.alertmanager_url}  -> local PagerDuty capture",
            )
        )
    return places


def _header(
    stack: Stack, injections: frozenset[str], gpu_text: str, engine: str = "reference"
) -> list[str]:
    what = ", ".join(sorted(injections)) or "nothing (a healthy server)"
    lines = [
        f"inference-bottleneck-exporter demo - injected: {what}    (Ctrl-C stops everything)",
        f" {'layout':<10} {layout_text(stack.cfg.layout)}",
    ]
    lines += [f" {what:<10} {full}" for what, _, full in _places(stack, engine)]
    lines += [f" {'GPU':<10} {gpu_text}", ""]
    return lines


def _diagnose_with(stack: Stack) -> Callable[[], Awaitable[Report]] | None:
    """What the screen's ``d`` runs: diagnose through the demo's Prometheus (the layout's
    fast rules)."""
    if not stack.prometheus_url:
        return None
    from exporter.diagnose.evaluate import diagnose_prometheus  # noqa: PLC0415
    from exporter.signatures.site import load_config  # noqa: PLC0415

    cfg = load_config(stack.cfg.rules_config, rule_profile(stack.cfg.layout))
    url = stack.prometheus_url

    def run() -> Awaitable[Report]:
        return diagnose_prometheus(url, cfg, 10.0, 0.1)

    return run


def _screen_state(
    stack: Stack, injections: frozenset[str], gpu_text: str, engine: str = "reference"
) -> ScreenState:
    from exporter.lab.screen import ScreenState  # noqa: PLC0415

    what = ", ".join(sorted(injections)) or "nothing (a healthy server)"
    places = _places(stack, engine)
    short = [(w, urllib.parse.urlsplit(u).netloc or u, full) for w, u, full in places]
    reader = {"node": "node agent", "dcgm": "dcgm-exporter"}.get(stack.cfg.layout, "sidecar")
    return ScreenState(
        title=f"inference-bottleneck-exporter demo ({stack.cfg.layout} layout) - injected: {what}",
        places=short,
        gpu=f"read by the {reader}: {gpu_text}",
        alerts=[] if stack.prometheus_url else None,
        alerts_note="" if stack.prometheus_url else "Prometheus not installed (make tools)",
    )


def _fired(stack: Stack) -> list[str]:
    if not stack.prometheus_url:
        return []
    with contextlib.suppress(OSError, ValueError, KeyError):
        return sorted({a["labels"]["alertname"] for a in stack.alerts() if a["state"] == "firing"})
    return []


def _goodbye(
    summary: Summary | ValueError | None, fired: list[str], workdir: Path, keep: bool
) -> str:
    lines = ["", "stopped."]
    if isinstance(summary, Summary):
        lines.append(format_summary(summary))
    elif summary is not None:
        lines.append(f"load: {summary}")
    lines.append("firing at the end: " + (", ".join(fired) if fired else "nothing"))
    if keep:
        lines.append(f"configs and logs: {workdir}")
    return "\n".join(lines)
