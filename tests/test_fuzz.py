"""Property-based fuzzing of the two surfaces strangers can reach.

- The engine exposition path (parse, recognise, normalise): whatever bytes an engine sends,
  the only outcome besides a snapshot is a ValueError, and the snapshot stays bounded.
- The HTTP surface: odd paths, methods, query strings and header sizes never crash the
  server or make it answer 5xx, and memory stays bounded.

CI runs a small profile; ``HYPOTHESIS_PROFILE=nightly`` runs 10,000 examples per property.
"""

from __future__ import annotations

import math
import os
import tracemalloc
from collections.abc import AsyncIterator

import pytest
from aiohttp import ClientSession, ClientTimeout
from aiohttp.test_utils import TestServer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from exporter.collectors import default_settings
from exporter.collectors.base import Collection, Collector
from exporter.engines import ENGINES, detect, normalise, parse_exposition
from exporter.server.app import Exporter

settings.register_profile(
    "ci", max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.register_profile(
    "nightly", max_examples=10_000, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

NAMES = [
    "vllm:num_requests_waiting",
    "vllm:num_requests_running",
    "vllm:kv_cache_usage_perc",
    "vllm:time_to_first_token_seconds",
    "sglang:num_queue_reqs",
    "tgi_queue_size",
    "tgi_request_duration",
    "nv_inference_pending_request_count",
    "nv_inference_request_duration_us",
    "llamacpp:requests_deferred",
    "inference_queue_depth",
    "inference_tokenizer_latency_seconds",
    # engines without a prefix, products, values from labels, replicas, per-stage latencies
    "num_requests_running",
    "num_request_max",
    "gpu_cache_usage_perc",
    "time_to_first_token_seconds",
    "trtllm_kv_cache_max_blocks",
    "trtllm_kv_cache_tokens_per_block",
    "vllm:cache_config_info",
    "vllm:num_requests_waiting_by_reason",
    "vllm:estimated_flops_per_gpu_total",
    "sglang:per_stage_req_latency_seconds",
    "dynamo_frontend_model_total_kv_blocks",
    "dynamo_frontend_time_to_first_token_seconds",
    "lmdeploy:num_requests_waiting",
    "ray_vllm_num_requests_waiting",
]
LABELS = [
    "model_name",
    "model",
    "version",
    "engine",
    "le",
    "quantile",
    "source",
    "x",
    "reason",
    "tp_rank",
    "dp_rank",
    "stage",
    "num_gpu_blocks",
    "block_size",
    "kv_cache_size_tokens",
    "name",
]
VALUES = st.one_of(
    st.floats(allow_nan=True, allow_infinity=True).map(repr),
    st.sampled_from(["NaN", "+Inf", "-Inf", "1e400", "-0", "0x10", "1_000", ""]),
    st.integers(-(10**20), 10**20).map(str),
)
LABEL_VALUES = st.text(
    alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12
).map(lambda v: v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n"))


@st.composite
def exposition_lines(draw: st.DrawFn) -> str:
    name = draw(st.sampled_from(NAMES)) + draw(
        st.sampled_from(["", "_bucket", "_sum", "_count", "_total", "_created"])
    )
    kind = draw(st.sampled_from(["gauge", "counter", "histogram", "summary", "untyped", "bogus"]))
    labels = draw(st.dictionaries(st.sampled_from(LABELS), LABEL_VALUES, max_size=3))
    label_text = ",".join(f'{k}="{v}"' for k, v in labels.items())
    sample = f"{name}{{{label_text}}} {draw(VALUES)}" if labels else f"{name} {draw(VALUES)}"
    lines = []
    if draw(st.booleans()):
        lines.append(f"# TYPE {name} {kind}")
    if draw(st.booleans()):
        lines.append(f"# HELP {name} {draw(st.text(max_size=20))}")
    lines.append(sample)
    return "\n".join(lines)


def check(text: str) -> None:
    try:
        families = parse_exposition(text)
    except ValueError:
        return
    found = detect(families)
    for engine in (*ENGINES, found):
        if engine is None:
            continue
        snapshot = normalise(families, engine, max_series=50)
        for series in snapshot.series:
            assert math.isfinite(series.value)
            assert math.isfinite(series.sum) and math.isfinite(series.count)
        per_metric: dict[str, int] = {}
        for series in snapshot.series:
            per_metric[series.name] = per_metric.get(series.name, 0) + 1
        assert all(n <= 50 for n in per_metric.values())


@given(st.lists(exposition_lines(), max_size=30).map("\n".join))
def test_structured_expositions_never_escape(text: str) -> None:
    check(text + "\n")


@given(st.binary(max_size=2048))
def test_random_bytes_never_escape(data: bytes) -> None:
    check(data.decode("utf-8", errors="replace"))


@given(st.text(max_size=500))
def test_random_text_never_escapes(text: str) -> None:
    check(text)


class Static(Collector):
    name = "static"
    blocking = False

    def collect(self) -> Collection:
        return Collection()


@pytest.fixture
async def server() -> AsyncIterator[TestServer]:
    exporter = Exporter(default_settings(scrape_timeout=0.5), [Static()])
    srv = TestServer(exporter.make_app(), host="127.0.0.1")
    await srv.start_server()
    exporter.ready = True
    try:
        yield srv
    finally:
        await srv.close()
        exporter.stop(1)


PATH_CHARS = st.characters(codec="ascii", exclude_characters="#?", min_codepoint=33)


async def test_http_surface_fuzz(server: TestServer) -> None:
    seen: set[int] = set()

    @settings(max_examples=150)
    @given(
        method=st.sampled_from(
            ["GET", "HEAD", "POST", "PUT", "DELETE", "OPTIONS", "PATCH", "TRACE"]
        ),
        path=st.one_of(
            st.sampled_from(["/", "/metrics", "/-/healthy", "/-/ready", "//metrics", "/metrics/"]),
            st.text(alphabet=PATH_CHARS, max_size=60).map(lambda p: "/" + p),
        ),
        query=st.text(alphabet=PATH_CHARS, max_size=40),
        header=st.text(
            alphabet=st.characters(codec="ascii", min_codepoint=32, max_codepoint=126), max_size=300
        ),
    )
    def inner(method: str, path: str, query: str, header: str) -> None:
        pending.append((method, path, query, header))

    pending: list[tuple[str, str, str, str]] = []
    inner()
    timeout = ClientTimeout(total=5)
    tracemalloc.start()
    try:
        async with ClientSession(timeout=timeout) as session:
            base = f"http://127.0.0.1:{server.port}"
            for method, path, query, header in pending:
                url = base + path + (f"?{query}" if query else "")
                async with session.request(
                    method, url, headers={"X-Fuzz": header}, allow_redirects=False
                ) as response:
                    await response.read()
                    seen.add(response.status)
                    assert response.status < 500, (method, url, response.status)
            # huge headers: refused by the parser, never a crash
            async with session.get(base + "/metrics", headers={"X-Big": "a" * 70_000}) as response:
                assert response.status in {400, 431}
            async with session.get(base + "/metrics") as response:
                assert response.status == 200
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024
    assert 200 in seen and (404 in seen or 405 in seen)
