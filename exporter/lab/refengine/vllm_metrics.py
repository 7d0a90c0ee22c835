"""The reference engine's ``/metrics``: vLLM's names, labels and meanings (V1 engine).

The sidecar reads them with its vLLM adapter (:mod:`exporter.engines.vllm`), so the drills
exercise that path end to end. As in vLLM, the front-end computes the request metrics when it
processes the model worker's outputs: time to first token and end-to-end latency on the
front-end's clock from the request's arrival, inter-token latency and the queue, prefill and
decode phases on the worker's clock (the engine core's timestamps in vLLM). Buckets are
:mod:`exporter.instrument`'s, finer than vLLM's at the low end, where a small model on a CPU
lives. Exposes (labels ``model_name``, ``engine="0"``)::

    vllm:num_requests_running, vllm:num_requests_waiting, vllm:kv_cache_usage_perc   gauges
    vllm:prompt_tokens_total, vllm:generation_tokens_total, vllm:num_preemptions_total,
    vllm:request_success_total{finished_reason}                                      counters
    vllm:time_to_first_token_seconds, vllm:inter_token_latency_seconds,
    vllm:e2e_request_latency_seconds, vllm:request_queue_time_seconds,
    vllm:request_prefill_time_seconds, vllm:request_decode_time_seconds              histograms
    vllm:estimated_flops_per_gpu_total, vllm:estimated_read_bytes_per_gpu_total,
    vllm:estimated_write_bytes_per_gpu_total                                         counters
    vllm:cache_config_info{block_size,cache_dtype,enable_prefix_caching,engine,
                           num_gpu_blocks}                                            gauge (1)
    inference_h2d_copy_seconds{model}     (h2d-stall only: the worker's H2DTimer, forwarded)

A prefill or decode server of a disaggregated pair (``--role``) also has NixlConnector's
metrics, as vLLM registers them on every server whose KV connector is NIXL (transcribed from
vllm-project/vllm ``vllm/distributed/kv_transfer/kv_connector/v1/nixl`` ``NixlPromMetrics``:
names, help texts, buckets; labels ``model_name``, ``engine``)::

    vllm:nixl_xfer_time_seconds, vllm:nixl_post_time_seconds,
    vllm:nixl_bytes_transferred, vllm:nixl_num_descriptors                           histograms
    vllm:nixl_num_failed_transfers, vllm:nixl_num_failed_notifications,
    vllm:nixl_num_kv_expired_reqs                                                     counters

The decode server reads the cache and observes the transfers and their failures; the prefill
server counts the requests whose cache expired before it was read. vLLM exposes no role or
``kv_transfer_config`` among its metrics (``cache_config_info`` carries the cache config
only), so neither does this engine: a sidecar is told the role (``--engine.role``).

The three ``estimated_*`` counters are vLLM's MFU counters (``--enable-mfu-metrics``), here
always on: the model worker adds up each step's real work
(:class:`~exporter.lab.refengine.worker.Work`). ``cache_config_info`` carries vLLM's labels
that mean something for this engine: the block size, the blocks of the KV pool, the cache
dtype (``auto``: the model's) and no prefix caching; vLLM's ``gpu_memory_utilization`` and
swap settings have no counterpart here and are left out.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from exporter.instrument import (
    E2E_BUCKETS,
    ITL_BUCKETS,
    PHASE_BUCKETS,
    QUEUE_BUCKETS,
    TTFT_BUCKETS,
)
from exporter.instrument.torch_h2d import HELP as H2D_HELP
from exporter.instrument.torch_h2d import NAME as H2D_NAME

ENGINE_INDEX = "0"


class _H2DForward(Collector):
    """Serves the worker process's H2D histogram snapshot under the instrument's name."""

    def __init__(self, model: str) -> None:
        self.model = model
        self.snapshot: tuple[tuple[tuple[float, float], ...], float] | None = None

    def collect(self) -> Iterator[Metric]:
        if self.snapshot is None:
            return
        buckets, total = self.snapshot
        family = HistogramMetricFamily(H2D_NAME, H2D_HELP, labels=["model"])
        family.add_metric(
            [self.model],
            [("+Inf" if le == float("inf") else repr(le), count) for le, count in buckets],
            total,
        )
        yield family


class EngineMetrics:
    """The metric objects, bound to one model, in their own registry."""

    def __init__(
        self, model: str, *, block_size: int, kv_blocks: int, kv_connector: bool = False
    ) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        labels = ["model_name", "engine"]
        bind = {"model_name": model, "engine": ENGINE_INDEX}

        def gauge(name: str, doc: str) -> Any:
            return Gauge(name, doc, labels, registry=r).labels(**bind)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(**bind)

        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(**bind)

        self.running = gauge(
            "vllm:num_requests_running", "Number of requests in model execution batches."
        )
        self.waiting = gauge(
            "vllm:num_requests_waiting", "Number of requests waiting to be processed."
        )
        self.kv_usage = gauge(
            "vllm:kv_cache_usage_perc", "KV-cache usage. 1 means 100 percent usage."
        )
        self.prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self.generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self.preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self._success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labels, "finished_reason"],
            registry=r,
        )
        self._bind = bind
        self.ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS,
        )
        self.itl = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            ITL_BUCKETS,
        )
        self.e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            E2E_BUCKETS,
        )
        self.queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            QUEUE_BUCKETS,
        )
        self.prefill_time = histogram(
            "vllm:request_prefill_time_seconds",
            "Histogram of time spent in PREFILL phase for request.",
            PHASE_BUCKETS,
        )
        self.decode_time = histogram(
            "vllm:request_decode_time_seconds",
            "Histogram of time spent in DECODE phase for request.",
            E2E_BUCKETS,
        )
        self.flops = counter(
            "vllm:estimated_flops_per_gpu",
            "Estimated number of floating point operations per GPU (for Model FLOPs "
            "Utilization calculations).",
        )
        self.read_bytes = counter(
            "vllm:estimated_read_bytes_per_gpu",
            "Estimated number of bytes read from memory per GPU (for Model FLOPs Utilization "
            "calculations).",
        )
        self.write_bytes = counter(
            "vllm:estimated_write_bytes_per_gpu",
            "Estimated number of bytes written to memory per GPU (for Model FLOPs Utilization "
            "calculations).",
        )
        info = Gauge(
            "vllm:cache_config_info",
            "Information of the LLMEngine CacheConfig",
            ["block_size", "cache_dtype", "enable_prefix_caching", "engine", "num_gpu_blocks"],
            registry=r,
        )
        info.labels(
            block_size=str(block_size),
            cache_dtype="auto",
            enable_prefix_caching="False",
            engine=ENGINE_INDEX,
            num_gpu_blocks=str(kv_blocks),
        ).set(1)
        self.h2d = _H2DForward(model)
        r.register(self.h2d)
        self._preemptions_seen = 0
        self.nixl = NixlMetrics(r, labels, bind) if kv_connector else None

    def work(self, flops: float, read_bytes: float, write_bytes: float) -> None:
        """One step's estimated work (see :class:`~exporter.lab.refengine.worker.Work`)."""
        self.flops.inc(flops)
        self.read_bytes.inc(read_bytes)
        self.write_bytes.inc(write_bytes)

    def success(self, reason: str) -> None:
        self._success.labels(**self._bind, finished_reason=reason).inc()

    def scheduler_state(
        self, *, running: int, waiting: int, kv_usage: float, preemptions: int
    ) -> None:
        self.running.set(running)
        self.waiting.set(waiting)
        self.kv_usage.set(kv_usage)
        if preemptions > self._preemptions_seen:
            self.preemptions.inc(preemptions - self._preemptions_seen)
            self._preemptions_seen = preemptions


# vLLM's NixlPromMetrics buckets: transfer time drops the first (1 ms) of the post-time list;
# bytes from 2 KiB to 8 GiB in powers of 4; descriptors.
NIXL_TIME_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 5.0)
NIXL_BYTES_BUCKETS = tuple(float(2 ** (10 + i)) for i in range(1, 25, 2))
NIXL_DESCRIPTOR_BUCKETS = (
    10.0, 20.0, 30.0, 50.0, 75.0, 100.0, 200.0, 400.0, 1000.0, 2000.0, 4000.0, 10000.0,
    20000.0, 50000.0,
)  # fmt: skip


class NixlMetrics:
    """NixlConnector's KV-transfer metrics, in the engine's registry."""

    def __init__(self, r: CollectorRegistry, labels: list[str], bind: dict[str, str]) -> None:
        def histogram(name: str, doc: str, buckets: tuple[float, ...]) -> Any:
            return Histogram(name, doc, labels, buckets=buckets, registry=r).labels(**bind)

        def counter(name: str, doc: str) -> Any:
            return Counter(name, doc, labels, registry=r).labels(**bind)

        self.xfer_time = histogram(
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            NIXL_TIME_BUCKETS[1:],
        )
        self.post_time = histogram(
            "vllm:nixl_post_time_seconds",
            "Histogram of transfer post time for NIXL KV Cache transfers.",
            NIXL_TIME_BUCKETS,
        )
        self.bytes_transferred = histogram(
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            NIXL_BYTES_BUCKETS,
        )
        self.descriptors = histogram(
            "vllm:nixl_num_descriptors",
            "Histogram of number of descriptors per NIXL  KV Cache transfers.",
            NIXL_DESCRIPTOR_BUCKETS,
        )
        self.failed_transfers = counter(
            "vllm:nixl_num_failed_transfers", "Number of failed NIXL KV Cache transfers."
        )
        self.failed_notifications = counter(
            "vllm:nixl_num_failed_notifications", "Number of failed NIXL KV Cache notifications."
        )
        self.expired = counter(
            "vllm:nixl_num_kv_expired_reqs",
            "Number of requests that had their KV expire. NOTE: This metric is tracked on the "
            "P instance.",
        )

    def transfer(self, *, post: float, xfer: float, nbytes: int, descriptors: int) -> None:
        self.post_time.observe(post)
        self.xfer_time.observe(xfer)
        self.bytes_transferred.observe(nbytes)
        self.descriptors.observe(descriptors)
