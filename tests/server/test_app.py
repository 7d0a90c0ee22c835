"""The HTTP side of :class:`exporter.server.app.Exporter`, in process, with fake collectors."""

from __future__ import annotations

import asyncio
import gzip
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from support.metrics import metric_value

from exporter import __version__
from exporter.collectors import default_settings
from exporter.collectors.base import Collection, Collector
from exporter.config import Settings
from exporter.server.app import Exporter

TIMEOUT = 0.3
TEXT = "text/plain; version=0.0.4; charset=utf-8"
# prometheus_client may append parameters (e.g. escaping=underscores) after these.
OPENMETRICS = "application/openmetrics-text; version=1.0.0; charset=utf-8"


class Good(Collector):
    """A gauge and a counter, ready once ``ready`` is set (bounded by the caller's timeout)."""

    name = "good"

    def __init__(self, *, ready: bool = True) -> None:
        self.ready = threading.Event()
        if ready:
            self.ready.set()
        self.waited: list[float] = []

    def wait_ready(self, timeout: float) -> bool:
        self.waited.append(timeout)
        return self.ready.wait(timeout)

    def collect(self) -> Collection:
        gauge = GaugeMetricFamily("fake_queue_depth", "Requests waiting.")
        gauge.add_metric([], 3.0)
        counter = CounterMetricFamily("fake_requests", "Requests served.", labels=["code"])
        counter.add_metric(["200"], 17.0)
        return Collection(metrics=[gauge, counter])


class Bad(Collector):
    name = "bad"

    def collect(self) -> Collection:
        raise RuntimeError("<script>alert('x')</script> & more")


Client = TestClient[web.Request, web.Application]
ClientFactory = Callable[..., Awaitable[tuple[Exporter, Client]]]


@pytest.fixture
async def serve() -> AsyncIterator[ClientFactory]:
    """Start an Exporter on 127.0.0.1 behind aiohttp's test server; stop it afterwards."""
    running: list[tuple[Exporter, Client]] = []

    async def start(
        collectors: Sequence[Collector], settings: Settings | None = None, **client: Any
    ) -> tuple[Exporter, Client]:
        exporter = Exporter(settings or default_settings(scrape_timeout=TIMEOUT), collectors)
        test_client = TestClient(TestServer(exporter.make_app(), host="127.0.0.1"), **client)
        await test_client.start_server()
        exporter.start()
        running.append((exporter, test_client))
        return exporter, test_client

    yield start
    for exporter, test_client in running:
        for collector in exporter.collectors:
            ready = getattr(collector, "ready", None)
            if isinstance(ready, threading.Event):
                ready.set()
        await wait_ready(exporter)
        await test_client.close()
        exporter.stop(1.0)


async def wait_ready(exporter: Exporter, timeout: float = 5.0) -> float:
    """Seconds until ``exporter.ready``; fails after ``timeout``."""
    start = time.monotonic()
    while not exporter.ready:
        assert time.monotonic() - start < timeout, "exporter never became ready"
        await asyncio.sleep(0.01)
    return time.monotonic() - start


async def get_text(client: Client, path: str, **headers: str) -> tuple[int, str, str]:
    resp = await client.get(path, headers=headers)
    return resp.status, resp.headers.get("Content-Type", ""), await resp.text()


async def test_ready_waits_for_first_collection_but_at_most_the_timeout(
    serve: ClientFactory,
) -> None:
    never = Good(ready=False)  # a GPU that never answers
    started = time.monotonic()
    exporter, client = await serve([never])
    assert (await client.get("/-/ready")).status == 503
    assert (await client.get("/-/healthy")).status == 200
    # poll over HTTP, as the kubelet does
    while (await client.get("/-/ready")).status != 200:
        assert time.monotonic() - started < TIMEOUT + 1.0, "readiness not bounded by the timeout"
        assert (await client.get("/-/healthy")).status == 200
        await asyncio.sleep(0.01)
    took = time.monotonic() - started
    assert TIMEOUT - 0.02 <= took < TIMEOUT + 0.5
    assert len(never.waited) == 1 and never.waited[0] <= TIMEOUT
    resp = await client.get("/-/ready")
    assert resp.status == 200 and await resp.text() == "Ready.\n"
    assert (await client.get("/-/healthy")).status == 200
    # the first collection ran: the landing page shows a result, not "not run yet"
    assert exporter.coordinator.statuses["good"].success is True


async def test_ready_as_soon_as_the_collector_is(serve: ClientFactory) -> None:
    slow = Good(ready=False)
    exporter, client = await serve([slow])
    resp = await client.get("/-/ready")
    assert resp.status == 503
    assert await resp.text() == "Not ready: first collection still running.\n"
    await asyncio.sleep(0.05)
    assert (await client.get("/-/ready")).status == 503
    released = time.monotonic()
    slow.ready.set()
    assert await wait_ready(exporter) < TIMEOUT / 2
    assert time.monotonic() - released < TIMEOUT / 2
    assert (await client.get("/-/ready")).status == 200


async def test_metrics_text_and_openmetrics(serve: ClientFactory) -> None:
    exporter, client = await serve([Good(), Bad()])
    await wait_ready(exporter)
    status, ctype, body = await get_text(client, "/metrics", **{"Accept-Encoding": "identity"})
    assert status == 200
    assert ctype == TEXT
    assert metric_value(body, "fake_queue_depth") == 3
    assert metric_value(body, "fake_requests_total", {"code": "200"}) == 17
    assert metric_value(body, "inference_scrape_collector_success", {"collector": "good"}) == 1
    assert metric_value(body, "inference_scrape_collector_success", {"collector": "bad"}) == 0
    assert metric_value(body, "inference_exporter_build_info", {"version": __version__}) == 1
    assert "# EOF" not in body

    status, ctype, body = await get_text(
        client,
        "/metrics",
        Accept="application/openmetrics-text; version=1.0.0,text/plain;version=0.0.4;q=0.5",
    )
    assert status == 200
    assert ctype.startswith(OPENMETRICS)
    assert body.endswith("# EOF\n")
    assert "# TYPE fake_requests counter\n" in body
    assert 'fake_requests_total{code="200"} 17.0\n' in body

    # a browser's Accept header gets the classic text format
    status, ctype, _ = await get_text(
        client, "/metrics", Accept="text/html,application/xhtml+xml,*/*;q=0.8"
    )
    assert status == 200 and ctype == TEXT


async def test_metrics_gzip_only_when_asked(serve: ClientFactory) -> None:
    exporter, client = await serve([Good()], auto_decompress=False)
    await wait_ready(exporter)
    resp = await client.get("/metrics", headers={"Accept-Encoding": "gzip"})
    assert resp.status == 200
    assert resp.headers["Content-Encoding"] == "gzip"
    assert resp.headers["Content-Type"] == TEXT
    raw = await resp.read()
    assert raw[:2] == b"\x1f\x8b"
    text = gzip.decompress(raw).decode()
    assert metric_value(text, "fake_queue_depth") == 3

    resp = await client.get("/metrics", headers={"Accept-Encoding": "identity"})
    assert "Content-Encoding" not in resp.headers
    assert metric_value((await resp.read()).decode(), "fake_queue_depth") == 3


async def test_metrics_name_filter(serve: ClientFactory) -> None:
    exporter, client = await serve([Good(), Bad()])
    await wait_ready(exporter)

    def families(body: str) -> list[str]:
        return [line.split()[2] for line in body.splitlines() if line.startswith("# TYPE ")]

    def samples(body: str) -> list[str]:
        return [line for line in body.splitlines() if not line.startswith("#")]

    # a counter asked for by its sample name (what users see in Prometheus)
    _, _, body = await get_text(client, "/metrics?name[]=fake_requests_total")
    assert samples(body) == ['fake_requests_total{code="200"} 17.0']
    # ... or by its family name
    _, _, body = await get_text(client, "/metrics?name[]=fake_requests")
    assert samples(body) == ['fake_requests_total{code="200"} 17.0']

    _, _, body = await get_text(
        client, "/metrics?name[]=fake_queue_depth&name[]=inference_scrape_collector_success"
    )
    assert families(body) == ["fake_queue_depth", "inference_scrape_collector_success"]
    assert sorted(samples(body)) == [
        "fake_queue_depth 3.0",
        'inference_scrape_collector_success{collector="bad"} 0.0',
        'inference_scrape_collector_success{collector="good"} 1.0',
    ]

    status, _, body = await get_text(client, "/metrics?name[]=no_such_metric")
    assert status == 200 and body == ""

    # the filter applies to OpenMetrics too
    _, _, body = await get_text(
        client,
        "/metrics?name[]=fake_requests_total",
        Accept="application/openmetrics-text; version=1.0.0",
    )
    assert samples(body) == ['fake_requests_total{code="200"} 17.0']
    assert body.endswith("# EOF\n")


async def test_landing_page_lists_collectors_and_escapes_errors(serve: ClientFactory) -> None:
    good, bad = Good(ready=False), Bad()
    exporter, client = await serve([good, bad])
    status, ctype, page = await get_text(client, "/")
    assert status == 200 and ctype.startswith("text/html")
    assert "<td>good</td><td>not run yet</td>" in page
    good.ready.set()
    await wait_ready(exporter)
    status, ctype, page = await get_text(client, "/")
    assert status == 200 and ctype.startswith("text/html")
    assert f"inference-bottleneck-exporter {__version__}" in page
    assert '<a href="/metrics">/metrics</a>' in page
    assert "<td>good</td><td>ok</td>" in page
    assert "<td>bad</td><td>FAILING</td>" in page
    assert (
        "<td>RuntimeError: &lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt; &amp; more</td>"
        in page
    )
    assert "<script>" not in page


async def test_methods_and_unknown_paths(serve: ClientFactory) -> None:
    exporter, client = await serve([Good()])
    await wait_ready(exporter)
    assert (await client.post("/metrics", data=b"x")).status == 405
    assert (await client.post("/-/ready")).status == 405
    assert (await client.get("/nope")).status == 404


async def test_custom_telemetry_path(serve: ClientFactory) -> None:
    exporter, client = await serve(
        [Good()], default_settings(scrape_timeout=TIMEOUT, web_telemetry_path="/probe")
    )
    await wait_ready(exporter)
    status, _, body = await get_text(client, "/probe")
    assert status == 200 and metric_value(body, "fake_queue_depth") == 3
    assert (await client.get("/metrics")).status == 404
    _, _, page = await get_text(client, "/")
    assert '<a href="/probe">/probe</a>' in page


class Doubtful(Good):
    name = "doubtful"

    def notices(self) -> list[str]:
        return ["GPU 1 is <someone else's>"]


async def test_landing_page_shows_collector_notices_escaped(serve: ClientFactory) -> None:
    exporter, client = await serve([Doubtful()])
    await wait_ready(exporter)
    _, _, page = await get_text(client, "/")
    assert "<p><strong>doubtful:</strong> GPU 1 is &lt;someone else&#x27;s&gt;</p>" in page


class Gpu(Collector):
    """Emits the GPU utilisation the landing page's history tracks."""

    name = "gpu"

    def collect(self) -> Collection:
        gauge = GaugeMetricFamily("inference_gpu_utilization_ratio", "GPU busy.", labels=["gpu"])
        gauge.add_metric(["0"], 0.75)
        return Collection(metrics=[gauge])


async def test_landing_page_charts_the_last_minutes(serve: ClientFactory) -> None:
    exporter, client = await serve([Gpu()])
    await wait_ready(exporter)
    await get_text(client, "/metrics")
    _, _, page = await get_text(client, "/")
    assert '<table id="history"' in page
    assert '<tr data-series="inference_gpu_utilization_ratio">' in page
    assert 'class="spark"' in page and "<td>75 %</td>" in page
    assert "default-src 'none'" in page and "<script" not in page
