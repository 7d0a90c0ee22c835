"""The stand-in endpoint picker (exporter/lab/gateway.py): it dispatches while its pool has room,
holds and evicts requests while the pool's metrics are stale, and says so under the picker's
names, which the sidecar's ``llmd-epp`` mapping reads into the gateway's series.

In process, on loopback: the gateway's app and a small engine (vLLM's metric names, a streamed
completion) each on an aiohttp runner of port 0.
"""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from exporter.engines import digest, poll_keys
from exporter.lab.gateway import Gateway, GatewayConfig, read_load
from exporter.lab.processes import child_pythonpath
from exporter.lab.stack import Stack, StackConfig, StackError

MODEL = "reference-tiny"


@dataclass
class Engine:
    """vLLM's /metrics (the queue and KV cache the gateway reads) and a streamed completion."""

    waiting: float = 0.0
    kv_cache: float = 0.1
    served: list[str] = field(default_factory=list)

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/metrics", self.metrics)
        app.router.add_post("/v1/completions", self.completions)
        app.router.add_get("/v1/models", self.models)
        return app

    async def metrics(self, request: web.Request) -> web.Response:
        body = (
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{engine="0",model_name="{MODEL}"}} {self.waiting}\n'
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{engine="0",model_name="{MODEL}"}} {self.kv_cache}\n'
        )
        return web.Response(text=body)

    async def completions(self, request: web.Request) -> web.StreamResponse:
        self.served.append((await request.json())["prompt"])
        out = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await out.prepare(request)
        for token in ("a", "b"):
            await out.write(f"data: {json.dumps({'choices': [{'text': token}]})}\n\n".encode())
        await out.write(b"data: [DONE]\n\n")
        await out.write_eof()
        return out

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": MODEL}]})


async def serve(app: web.Application) -> tuple[web.AppRunner, str]:
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    host, port = runner.addresses[0][:2]
    return runner, f"http://{host}:{port}"


@dataclass
class Lab:
    engine: Engine
    gateway: Gateway
    url: str
    session: aiohttp.ClientSession

    async def complete(self, prompt: str) -> tuple[int, str]:
        body = {"model": MODEL, "prompt": prompt, "max_tokens": 2, "stream": True}
        async with self.session.post(self.url + "/v1/completions", json=body) as resp:
            return resp.status, await resp.text()

    async def metrics(self) -> str:
        async with self.session.get(self.url + "/metrics") as resp:
            return await resp.text()


@pytest.fixture
async def lab(request: pytest.FixtureRequest) -> AsyncIterator[Lab]:
    injections = frozenset(getattr(request, "param", ()))
    engine = Engine()
    engine_runner, engine_url = await serve(engine.app())
    async with aiohttp.ClientSession() as session:
        cfg = GatewayConfig(
            endpoints=(engine_url,),
            model=MODEL,
            refresh_s=0.05,
            staleness_s=0.5,
            request_ttl_s=1.0,
            max_queue=3,
            injections=injections,
        )
        gateway = Gateway(cfg, session)
        tasks = [asyncio.create_task(gateway.detector()), asyncio.create_task(gateway.dispatcher())]
        runner, url = await serve(gateway.app())
        try:
            yield Lab(engine, gateway, url, session)
        finally:
            for task in tasks:
                task.cancel()
            await runner.cleanup()
            await engine_runner.cleanup()


def series(text: str) -> dict[tuple[str, ...], float]:
    """The gateway's exposition as the sidecar reads it (``llmd-epp``): non-histogram series,
    by name, model and labels (sorted)."""
    snap = digest(text, "llmd-epp", keys=poll_keys())
    assert snap.engine == "llmd-epp"
    return {
        (s.name, s.model, *sorted(f"{k}={v}" for k, v in s.labels)): s.value
        for s in snap.series
        if s.kind != "histogram"
    }


async def test_a_pool_with_room_gets_every_request_streamed_through(lab: Lab) -> None:
    await asyncio.sleep(0.2)  # the first read of the engine's metrics
    status, text = await lab.complete("hello")
    assert status == 200 and text.endswith("data: [DONE]\n\n") and '"text": "b"' in text
    assert lab.engine.served == ["hello"]
    read = series(await lab.metrics())
    pool = "pool=reference-pool"
    assert read[("inference_gateway_stale_endpoints", MODEL)] == 0
    assert read[("inference_gateway_queue_depth", MODEL, pool, "priority=0")] == 0
    assert read[("inference_gateway_requests_total", MODEL, "outcome=dispatched", pool)] == 1
    assert read[("inference_gateway_pool_saturation", MODEL, pool, "stage=effective")] < 1.0
    assert read[("inference_gateway_ready_endpoints", MODEL, pool)] == 1
    # Other requests pass to the engine as they are.
    async with lab.session.get(lab.url + "/v1/models") as resp:
        assert (await resp.json())["data"][0]["id"] == MODEL


async def test_a_saturated_pool_holds_requests_until_it_has_room(lab: Lab) -> None:
    lab.engine.waiting = 5  # the queue-depth threshold: saturated
    await asyncio.sleep(0.2)
    pending = asyncio.create_task(lab.complete("held"))
    await asyncio.sleep(0.3)
    assert not pending.done() and lab.engine.served == []
    held = series(await lab.metrics())
    assert held[("inference_gateway_queue_depth", MODEL, "pool=reference-pool", "priority=0")] == 1
    assert held[("inference_gateway_stale_endpoints", MODEL)] == 0
    lab.engine.waiting = 0
    status, _ = await pending
    assert status == 200 and lab.engine.served == ["held"]


@pytest.mark.parametrize("lab", [("stale-endpoints",)], indirect=True)
async def test_stale_endpoint_metrics_gate_every_request_while_the_engine_idles(lab: Lab) -> None:
    """The engine answers, its metrics do not reach the gateway: every request waits its TTL
    and is evicted (503), one beyond the queue's room is refused (429), none reaches the
    engine; mended, the next request passes."""
    await asyncio.sleep(0.7)  # past the staleness: never read
    queued = [asyncio.create_task(lab.complete(f"r{i}")) for i in range(3)]
    await asyncio.sleep(0.2)
    assert await lab.complete("one too many") == (429, await_text(429, "RejectedCapacity"))
    held = series(await lab.metrics())
    pool = "pool=reference-pool"
    assert held[("inference_gateway_stale_endpoints", MODEL)] == 1
    assert held[("inference_gateway_pool_saturation", MODEL, pool, "stage=effective")] == 1.0
    assert held[("inference_gateway_queue_depth", MODEL, pool, "priority=0")] == 3
    statuses = [status for status, _ in await asyncio.gather(*queued)]
    assert statuses == [503, 503, 503] and lab.engine.served == []
    shed = series(await lab.metrics())
    assert shed[("inference_gateway_requests_total", MODEL, "outcome=evicted_ttl", pool)] == 3
    assert shed[("inference_gateway_requests_total", MODEL, "outcome=rejected_capacity", pool)] == 1
    assert (
        shed[("inference_requests_rejected_total", MODEL, "layer=gateway", "reason=capacity")] == 1
    )
    assert shed[("inference_gateway_queue_depth", MODEL, pool, "priority=0")] == 0
    # The scrape mended: fresh metrics, room, the request reaches the engine.
    async with lab.session.post(
        lab.url + "/lab/injection", json={"stale-endpoints": False}
    ) as resp:
        assert await resp.json() == {"stale-endpoints": False}
    await asyncio.sleep(0.2)
    status, _ = await lab.complete("mended")
    assert status == 200 and lab.engine.served == ["mended"]
    async with lab.session.post(lab.url + "/lab/injection", json={"stale": 1}) as resp:
        assert resp.status == 400


def await_text(status: int, outcome: str) -> str:
    """The body the gateway answers a request it does not dispatch with."""
    return json.dumps({"error": {"message": f"flow control: {outcome}", "code": status}})


def test_read_load_sums_the_queue_and_takes_the_fullest_cache() -> None:
    text = (
        'vllm:num_requests_waiting{engine="0"} 2\nvllm:num_requests_waiting{engine="1"} 3\n'
        'vllm:kv_cache_usage_perc{engine="0"} 0.2\nvllm:kv_cache_usage_perc{engine="1"} 0.7\n'
    )
    assert read_load(text) == (5.0, 0.7)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--model", "m"], "the following arguments are required: --endpoint"),
        (["--endpoint", "http://x", "--model", "m", "--inject", "x"], "unknown injection 'x'"),
        (["--endpoint", "http://x", "--model", "m", "--staleness", "0s"], "--staleness: must"),
        (["--endpoint", "http://x", "--model", "m", "--request-ttl", "soon"], "not a duration"),
        (["--endpoint", "http://x", "--model", "m", "--max-queue", "0"], "--max-queue: must"),
    ],
)
def test_bad_flags_end_in_one_line_and_exit_2(args: list[str], message: str) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "exporter.lab.gateway", *args],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
        env={"PYTHONPATH": child_pythonpath()},
    )
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr


def test_a_gateway_injection_without_a_gateway_is_refused_before_anything_starts(
    tmp_path: Path,
) -> None:
    stack = Stack(
        StackConfig(tmp_path, injections=("stale-endpoints",), prometheus=False, alertmanager=False)
    )
    with pytest.raises(StackError, match="stale-endpoints is a gateway's injection"):
        stack.start()
    assert stack.children == [] and stack.nodes == []
