"""``python -m exporter.lab.gateway``: a stand-in for llm-d's endpoint picker with flow control,
in front of the reference engines.

The drills' gateway (``tests/drills``, ``docs/drills.md``): what the picker does to a request
and what it says about it, small enough to run beside an engine on one host. As the picker
(llm-d/llm-d-router ``pkg/epp``, with the Gateway API inference extension's saturation
detector and its defaults):

- every ``--refresh`` it reads each endpoint's ``/metrics`` (vLLM's
  ``vllm:num_requests_waiting`` and ``vllm:kv_cache_usage_perc``);
- an endpoint's saturation is the larger of its queue over ``--queue-depth-threshold`` and its
  KV cache over ``--kv-cache-threshold``; an endpoint whose metrics are missing or older than
  ``--staleness`` counts as saturated (1.0): the detector fails closed. The pool's saturation
  is the mean of its endpoints' (1.0 for an empty pool);
- flow control holds every inference request (``POST /v1/completions``,
  ``/v1/chat/completions``) in its queue and dispatches the oldest while the pool's saturation
  is below 1.0, to the endpoint with fresh metrics and the shortest queue. A request that
  waits longer than ``--request-ttl`` is evicted (503, ``EvictedTTL``), one that finds the
  queue full is refused (429, ``RejectedCapacity``), one whose client leaves is
  ``EvictedContextCancelled``;
- ``/metrics`` has the picker's 2026 names (``llm_d_epp_flow_control_queue_size``,
  ``..._pool_saturation{stage="effective"}``, ``..._requests_total{outcome}``,
  ``..._request_queue_duration_seconds``, ``..._stale_endpoints``, ``llm_d_epp_ready_endpoints``),
  with their labels (``inference_pool``, ``model_name`` as the request named it,
  ``target_model_name`` the pool's, ``fairness_id``, ``priority``): the sidecar reads them with
  ``--engine.type llmd-epp`` as it reads a real picker.

Two differences, both for a small shared machine: the metrics are read every 100 ms with a
staleness of 2 s (upstream: 50 ms and 200 ms; a busy 2-core host answers a poll late, and a
late answer would gate a healthy pool), and there is one priority band and no fairness policy
(requests that name no ``InferenceObjective``).

Injection ``stale-endpoints`` (``--inject stale-endpoints``): the gateway's reads of every
endpoint's metrics go to a port nothing listens on - as when an engine's metrics move to
another port, or a network policy drops the picker's scrape, while the serving port still
answers. The metrics turn stale, every endpoint counts as saturated, and flow control holds
every request until its TTL evicts it while the engines idle: the gateway sheds load on stale
metrics, and more replicas would be gated the same way. ``POST /lab/injection
{"stale-endpoints": false}`` mends the scrape (``GET`` shows the state).

Other requests (``GET /v1/models``, ``POST /tokenize``, ``GET /health``) pass to the first
endpoint. Prints ``listening on http://HOST:PORT`` on stderr once it serves; SIGTERM or SIGINT
stops it.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import logging
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NoReturn

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from exporter.config import ArgumentParser, parse_duration, usage_error

if TYPE_CHECKING:
    from aiohttp import ClientSession, web

PROG = "python -m exporter.lab.gateway"
log = logging.getLogger("exporter.lab.gateway")

#: The gateway's injections (the engine's are :mod:`exporter.lab.refengine.inject`'s).
GATEWAY_INJECTIONS = frozenset({"stale-endpoints"})
DEFAULT_POOL = "reference-pool"
DETECTOR = "utilization-detector"
FAIRNESS_HEADER = "x-gateway-inference-fairness-id"
DEFAULT_FAIRNESS = "default-flow"
PRIORITY = "0"  # one band: requests that name no InferenceObjective
INFERENCE_PATHS = ("/v1/completions", "/v1/chat/completions")
# The picker's queue-duration buckets (pkg/epp/metrics).
QUEUE_BUCKETS = (
    0.0001,
    0.0005,
    0.001,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
    60.0,
)
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
HOP_BY_HOP = frozenset(
    {"connection", "keep-alive", "transfer-encoding", "content-length", "host", "upgrade"}
)


@dataclass(frozen=True)
class GatewayConfig:
    endpoints: tuple[str, ...]  # the engines' base URLs (the pool's endpoints)
    model: str  # the model the pool serves (target_model_name)
    pool: str = DEFAULT_POOL
    refresh_s: float = 0.1
    staleness_s: float = 2.0
    queue_depth_threshold: float = 5.0
    kv_cache_threshold: float = 0.8
    request_ttl_s: float = 30.0
    max_queue: int = 512
    injections: frozenset[str] = frozenset()


@dataclass
class Endpoint:
    url: str
    fresh_at: float | None = None  # monotonic time of the last metrics read that answered
    waiting: float = 0.0
    kv_cache: float = 0.0

    def stale(self, now: float, staleness_s: float) -> bool:
        return self.fresh_at is None or now - self.fresh_at > staleness_s


@dataclass
class Waiting:
    """A request in flow control's queue."""

    model: str  # as the request named it
    fairness_id: str
    arrived: float
    dispatched: asyncio.Future[Endpoint] = field(
        default_factory=lambda: asyncio.get_running_loop().create_future()
    )


def closed_port() -> int:
    """A loopback port nothing listens on (bound, then closed: a connection is refused)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def read_load(text: str) -> tuple[float, float]:
    """Requests waiting (summed) and KV-cache usage (the largest) from a vLLM exposition."""
    waiting, kv_cache = 0.0, 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:num_requests_waiting":
                waiting += sample.value
            elif sample.name == "vllm:kv_cache_usage_perc":
                kv_cache = max(kv_cache, sample.value)
    return waiting, kv_cache


class Metrics:
    """The picker's series, in a registry of their own."""

    def __init__(self, cfg: GatewayConfig) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.queue_size = Gauge(
            "llm_d_epp_flow_control_queue_size",
            "Current number of requests actively held in the Flow Control queue.",
            ["fairness_id", "inference_pool", "model_name", "priority", "target_model_name"],
            registry=r,
        )
        self.saturation = Gauge(
            "llm_d_epp_flow_control_pool_saturation",
            "Pool saturation signal gating Flow Control dispatch. 1.0 is the gating set point.",
            ["inference_pool", "stage"],
            registry=r,
        )
        self.stale = Gauge(
            "llm_d_epp_flow_control_stale_endpoints",
            "Number of candidate endpoints whose metrics are missing or older than the "
            "staleness threshold, as of the most recent saturation evaluation.",
            ["detector"],
            registry=r,
        )
        self.requests = Counter(
            "llm_d_epp_flow_control_requests",
            "Total number of requests processed by the Flow Control layer.",
            ["inference_pool", "outcome", "priority"],
            registry=r,
        )
        self.queue_duration = Histogram(
            "llm_d_epp_flow_control_request_queue_duration_seconds",
            "Distribution of total time requests spend in the Flow Control layer (from "
            "enqueue to final outcome).",
            [
                "fairness_id",
                "inference_pool",
                "model_name",
                "outcome",
                "priority",
                "target_model_name",
            ],
            buckets=QUEUE_BUCKETS,
            registry=r,
        )
        self.ready = Gauge(
            "llm_d_epp_ready_endpoints",
            "The number of ready endpoints in the inference server pool.",
            ["name"],
            registry=r,
        )
        # The pool's model has a queue from the start (empty), as a picker that has seen a
        # request of it: the sidecar gives the picker's model-less series to its one model.
        self.queue_size.labels(DEFAULT_FAIRNESS, cfg.pool, cfg.model, PRIORITY, cfg.model).set(0)
        self.saturation.labels(cfg.pool, "effective").set(1.0)
        self.stale.labels(DETECTOR).set(0)
        self.ready.labels(cfg.pool).set(len(cfg.endpoints))


class Gateway:
    def __init__(self, cfg: GatewayConfig, session: ClientSession) -> None:
        self.cfg = cfg
        self.session = session
        self.endpoints = [Endpoint(url.rstrip("/")) for url in cfg.endpoints]
        self.queue: deque[Waiting] = deque()
        self.metrics = Metrics(cfg)
        self.stale_endpoints = "stale-endpoints" in cfg.injections
        self._dead_port = closed_port()
        self._wake = asyncio.Event()

    # --- the saturation detector ---------------------------------------------------------------
    def metrics_url(self, endpoint: Endpoint) -> str:
        """Where the gateway reads an endpoint's metrics: its own, or (``stale-endpoints``) a
        port nothing listens on."""
        if self.stale_endpoints:
            return f"http://127.0.0.1:{self._dead_port}/metrics"
        return endpoint.url + "/metrics"

    async def refresh(self) -> None:
        """Read every endpoint's metrics once (each read bounded by the staleness)."""
        from aiohttp import ClientError, ClientTimeout  # noqa: PLC0415

        timeout = ClientTimeout(total=self.cfg.staleness_s)
        for endpoint in self.endpoints:
            with contextlib.suppress(ClientError, TimeoutError, OSError, ValueError):
                async with self.session.get(self.metrics_url(endpoint), timeout=timeout) as resp:
                    if resp.status != 200:
                        continue
                    text = await resp.text()
                endpoint.waiting, endpoint.kv_cache = read_load(text)
                endpoint.fresh_at = time.monotonic()

    def endpoint_saturation(self, endpoint: Endpoint, now: float) -> float:
        if endpoint.stale(now, self.cfg.staleness_s):
            return 1.0
        return max(
            endpoint.waiting / self.cfg.queue_depth_threshold,
            endpoint.kv_cache / self.cfg.kv_cache_threshold,
        )

    def saturation(self, now: float) -> float:
        """The pool's saturation: the mean of its endpoints' (1.0 for an empty pool)."""
        if not self.endpoints:
            return 1.0
        return sum(self.endpoint_saturation(e, now) for e in self.endpoints) / len(self.endpoints)

    def evaluate(self) -> float:
        now = time.monotonic()
        value = self.saturation(now)
        stale = sum(1 for e in self.endpoints if e.stale(now, self.cfg.staleness_s))
        self.metrics.saturation.labels(self.cfg.pool, "effective").set(value)
        self.metrics.stale.labels(DETECTOR).set(stale)
        return value

    async def detector(self) -> None:
        while True:
            await self.refresh()
            self.evaluate()
            self._wake.set()
            await asyncio.sleep(self.cfg.refresh_s)

    # --- flow control --------------------------------------------------------------------------
    async def dispatcher(self) -> None:
        """Dispatch the oldest request while the pool is below saturation; the dispatched
        request counts against its endpoint until the next read shows it."""
        while True:
            await self._wake.wait()
            self._wake.clear()
            now = time.monotonic()
            while self.queue and self.saturation(now) < 1.0:
                fresh = [e for e in self.endpoints if not e.stale(now, self.cfg.staleness_s)]
                if not fresh:
                    break
                endpoint = min(fresh, key=lambda e: e.waiting)
                item = self.queue.popleft()
                self._count_queue(item, -1)
                if item.dispatched.done():
                    continue
                item.dispatched.set_result(endpoint)
                endpoint.waiting += 1  # until the next read says otherwise

    def _count_queue(self, item: Waiting, delta: int) -> None:
        cfg = self.cfg
        self.metrics.queue_size.labels(
            item.fairness_id, cfg.pool, item.model, PRIORITY, cfg.model
        ).inc(delta)

    def _outcome(self, item: Waiting, outcome: str) -> None:
        cfg = self.cfg
        self.metrics.requests.labels(cfg.pool, outcome, PRIORITY).inc()
        self.metrics.queue_duration.labels(
            item.fairness_id, cfg.pool, item.model, outcome, PRIORITY, cfg.model
        ).observe(time.monotonic() - item.arrived)

    async def admit(self, model: str, fairness_id: str) -> tuple[Endpoint | None, int, str]:
        """Hold the request in flow control until it is dispatched (the endpoint), evicted or
        refused (None, the HTTP status and the outcome)."""
        item = Waiting(model, fairness_id, time.monotonic())
        if len(self.queue) >= self.cfg.max_queue:
            self._outcome(item, "RejectedCapacity")
            return None, 429, "RejectedCapacity"
        self.queue.append(item)
        self._count_queue(item, +1)
        self._wake.set()
        try:
            endpoint = await asyncio.wait_for(
                asyncio.shield(item.dispatched), self.cfg.request_ttl_s
            )
        except TimeoutError:
            self._leave(item)
            self._outcome(item, "EvictedTTL")
            return None, 503, "EvictedTTL"
        except asyncio.CancelledError:  # the client went away
            self._leave(item)
            self._outcome(item, "EvictedContextCancelled")
            raise
        self._outcome(item, "Dispatched")
        return endpoint, 200, "Dispatched"

    def _leave(self, item: Waiting) -> None:
        if item in self.queue:
            self.queue.remove(item)
            self._count_queue(item, -1)
        if not item.dispatched.done():
            item.dispatched.cancel()

    # --- HTTP ----------------------------------------------------------------------------------
    def app(self) -> web.Application:
        from aiohttp import web  # noqa: PLC0415

        app = web.Application(client_max_size=4 * 2**20)
        app.router.add_get("/metrics", self.metrics_page)
        app.router.add_get("/lab/injection", self.injection_page)
        app.router.add_post("/lab/injection", self.injection_page)
        for path in INFERENCE_PATHS:
            app.router.add_post(path, self.inference)
        app.router.add_route("*", "/{tail:.*}", self.passthrough)
        return app

    async def metrics_page(self, request: web.Request) -> web.Response:
        from aiohttp import web  # noqa: PLC0415

        self.evaluate()
        body = generate_latest(self.metrics.registry)
        return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})

    async def injection_page(self, request: web.Request) -> web.Response:
        """``GET``: the gateway's injections; ``POST {"stale-endpoints": bool}``: on or off
        (400 with the reason for anything else)."""
        from aiohttp import web  # noqa: PLC0415

        if request.method == "POST":
            try:
                body = await request.json()
            except ValueError:
                body = None
            if (
                not isinstance(body, dict)
                or set(body) - GATEWAY_INJECTIONS
                or not all(isinstance(v, bool) for v in body.values())
            ):
                return web.json_response(
                    {"error": 'expected {"stale-endpoints": true|false}'}, status=400
                )
            self.stale_endpoints = bool(body.get("stale-endpoints", self.stale_endpoints))
            log.info("stale-endpoints %s", "on" if self.stale_endpoints else "off")
        return web.json_response({"stale-endpoints": self.stale_endpoints})

    async def inference(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web  # noqa: PLC0415

        body = await request.read()
        model = ""
        with contextlib.suppress(ValueError, AttributeError):
            model = str(json.loads(body).get("model") or "")
        fairness = request.headers.get(FAIRNESS_HEADER, DEFAULT_FAIRNESS)
        endpoint, status, outcome = await self.admit(model or self.cfg.model, fairness)
        if endpoint is None:
            return web.json_response(
                {"error": {"message": f"flow control: {outcome}", "code": status}}, status=status
            )
        return await self._forward(request, endpoint, body)

    async def passthrough(self, request: web.Request) -> web.StreamResponse:
        from aiohttp import web  # noqa: PLC0415

        if not self.endpoints:
            return web.json_response({"error": "no endpoints"}, status=503)
        return await self._forward(request, self.endpoints[0], await request.read())

    async def _forward(
        self, request: web.Request, endpoint: Endpoint, body: bytes
    ) -> web.StreamResponse:
        """The request to ``endpoint``, its answer streamed back chunk by chunk."""
        from aiohttp import ClientError, ClientTimeout, web  # noqa: PLC0415

        headers = {k: v for k, v in request.headers.items() if k.lower() not in HOP_BY_HOP}
        url = endpoint.url + request.rel_url.path_qs
        try:
            async with self.session.request(
                request.method,
                url,
                data=body or None,
                headers=headers,
                timeout=ClientTimeout(total=None, sock_connect=10),
            ) as upstream:
                out = web.StreamResponse(
                    status=upstream.status,
                    headers={
                        k: v for k, v in upstream.headers.items() if k.lower() not in HOP_BY_HOP
                    },
                )
                await out.prepare(request)
                async for chunk in upstream.content.iter_any():
                    await out.write(chunk)
                await out.write_eof()
                return out
        except (ClientError, OSError) as err:
            return web.json_response({"error": f"endpoint {endpoint.url}: {err}"}, status=502)


# --- the command ---------------------------------------------------------------------------------


def parser() -> argparse.ArgumentParser:
    p = ArgumentParser(
        prog=PROG,
        description=(
            "A stand-in for llm-d's endpoint picker with flow control: holds requests while "
            "its pool is saturated (or its endpoints' metrics are stale) and serves the "
            "picker's metrics."
        ),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8081, help="port; 0 picks a free one")
    p.add_argument(
        "--endpoint",
        action="append",
        default=[],
        required=True,
        help="an engine of the pool (base URL; repeat for more)",
    )
    p.add_argument("--model", required=True, help="the model the pool serves")
    p.add_argument("--pool", default=DEFAULT_POOL, help="the InferencePool's name")
    p.add_argument("--refresh", default="100ms", help="how often the endpoints' metrics are read")
    p.add_argument("--staleness", default="2s", help="metrics older than this are stale")
    p.add_argument("--queue-depth-threshold", type=float, default=5.0, help="saturated queue")
    p.add_argument("--kv-cache-threshold", type=float, default=0.8, help="saturated KV cache")
    p.add_argument("--request-ttl", default="30s", help="evict a request queued this long")
    p.add_argument("--max-queue", type=int, default=512, help="refuse requests beyond this")
    p.add_argument(
        "--inject",
        action="append",
        default=[],
        help=f"injection ({', '.join(sorted(GATEWAY_INJECTIONS))}); repeatable",
    )
    p.add_argument("--log-level", default="info", help="debug, info, warning, error")
    return p


def _fail(message: str) -> NoReturn:
    usage_error(PROG, message)


def config(argv: Sequence[str] | None = None) -> tuple[GatewayConfig, argparse.Namespace]:
    """The gateway's configuration from its flags; a bad one ends the command (exit 2)."""
    args = parser().parse_args(argv)
    unknown = set(args.inject) - GATEWAY_INJECTIONS
    if unknown:
        _fail(f"--inject: unknown injection {sorted(unknown)[0]!r} (known: stale-endpoints)")
    try:
        durations = {
            name: parse_duration(getattr(args, name))
            for name in ("refresh", "staleness", "request_ttl")
        }
    except ValueError as err:
        _fail(str(err))
    for name, value in durations.items():
        if value <= 0:
            _fail(f"--{name.replace('_', '-')}: must be above zero")
    for name in ("queue_depth_threshold", "kv_cache_threshold"):
        if getattr(args, name) <= 0:
            _fail(f"--{name.replace('_', '-')}: must be above zero")
    if args.max_queue < 1:
        _fail("--max-queue: must be at least 1")
    if not 0 <= args.port <= 65535:
        _fail(f"--port: {args.port} is not a port")
    cfg = GatewayConfig(
        endpoints=tuple(args.endpoint),
        model=args.model,
        pool=args.pool,
        refresh_s=durations["refresh"],
        staleness_s=durations["staleness"],
        queue_depth_threshold=args.queue_depth_threshold,
        kv_cache_threshold=args.kv_cache_threshold,
        request_ttl_s=durations["request_ttl"],
        max_queue=args.max_queue,
        injections=frozenset(args.inject),
    )
    return cfg, args


def main(argv: Sequence[str] | None = None) -> int:
    cfg, args = config(argv)
    logging.basicConfig(
        level=getattr(logging, str(args.log_level).upper(), logging.INFO),
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )
    return asyncio.run(_serve(cfg, args.host, args.port))


async def _serve(cfg: GatewayConfig, host: str, port: int) -> int:
    from aiohttp import ClientSession, TCPConnector, web  # noqa: PLC0415

    async with ClientSession(connector=TCPConnector(limit=0)) as session:
        gateway = Gateway(cfg, session)
        tasks: list[asyncio.Task[Any]] = [
            asyncio.create_task(gateway.detector()),
            asyncio.create_task(gateway.dispatcher()),
        ]
        runner = web.AppRunner(gateway.app(), handle_signals=False, access_log=None)
        await runner.setup()
        site = web.TCPSite(runner, host, port, shutdown_timeout=1.0)
        try:
            await site.start()
        except OSError as err:
            for task in tasks:
                task.cancel()
            await runner.cleanup()
            sys.stderr.write(f"{PROG}: error: cannot listen on {host}:{port}: {err.strerror}\n")
            return 1
        for address in runner.addresses:
            shown = f"[{address[0]}]" if ":" in str(address[0]) else address[0]
            log.info("listening on http://%s:%s", shown, address[1])
        if cfg.injections:
            log.info("injected: %s", ", ".join(sorted(cfg.injections)))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await stop.wait()
        log.info("shutting down")
        for task in tasks:
            task.cancel()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(runner.cleanup(), timeout=3.0)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
