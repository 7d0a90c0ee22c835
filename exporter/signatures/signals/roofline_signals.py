"""How far each served model is from its hardware limit, and where its requests' time goes
(``docs/roofline.md``): the decode floor and efficiency, the prefill efficiency, the latency
budget and the workload shape. One series per target and ``model``.

The GPU peaks are the sidecar's in the sidecar layout, the node agent's (by pod) in the node
layout; dcgm-exporter reports none, so the dcgm layout takes the sidecar's where its nvml
collector runs, else the site config's (``gpu_peaks``) or the product table's by
dcgm-exporter's ``modelName``: a product neither knows has no roofline in that
layout. The model facts
(``--model.path``) and the engine's figures are per GPU of the engine, so they set against one
GPU's peak: the target's slowest GPU (``min``), which sets the pace of a tensor-parallel step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from exporter.hardware.gpus import PRODUCTS, GpuFacts, Peaks, peaks_of
from exporter.signatures.params import PREFILL_PRECISION
from exporter.signatures.promql_text import by, num, on
from exporter.signatures.signals import dcgm_fields
from exporter.signatures.signals.dcgm_fields import dcgm_quantity
from exporter.signatures.signals.dcgm_join import dcgm_per_target
from exporter.signatures.signals.node_join import node_per_target
from exporter.signatures.signals.signal import ByLayout, Rule, Signal
from exporter.signatures.signals.signal_context import DECODES
from exporter.signatures.signals.signal_groups import ROOFLINE_GROUP
from exporter.signatures.site import ProductPeaks

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext

_REGEX_META = frozenset(".+*?()|{}^$")
_PRECISION = f'precision="{PREFILL_PRECISION}"'
_BANDWIDTH = "inference_gpu_peak_memory_bandwidth_bytes_per_second"


class _PerModel:
    """PromQL over the sidecar's series, one series per target and ``model``, over the site
    config's ``window`` (the latency window unless told)."""

    def __init__(self, ctx: SignalContext, window: str = "latency") -> None:
        self.ctx = ctx
        self.by_model = by((*ctx.join, "model"))
        self.on_model = on((*ctx.join, "model"))
        self.to_target = f"{on(ctx.join)} group_left ()"
        self.window = ctx.window(window)

    def max(self, metric: str) -> str:
        """The largest value of a model gauge (the model facts), through missed scrapes."""
        return f"max {self.by_model} ({self.ctx.latest(metric)})"

    def rate(self, metric: str, *matchers: str) -> str:
        """A counter's rate over the window."""
        series = self.ctx.sidecar_series(metric, *matchers)
        return f"sum {self.by_model} (rate({series}[{self.window}]))"

    def mean(self, metric: str, *matchers: str) -> str:
        """A gauge's mean over the window."""
        series = self.ctx.sidecar_series(metric, *matchers)
        return f"sum {self.by_model} (avg_over_time({series}[{self.window}]))"

    def share_of_e2e(self, metric: str) -> str:
        """A latency sum's rate as a share of the end-to-end latency's."""
        return f"{self.rate(metric)}\n/\n({self.ctx.name(MODEL_E2E_SECONDS)} > 0)"


# --- the engine's counters the records below read more than once -----------------------------


def model_rate(metric: str, window: str = "latency") -> Callable[[SignalContext], str]:
    """A record of ``metric``'s rate per target and model over the site config's ``window``."""
    return lambda ctx: _PerModel(ctx, window).rate(metric)


# Each read once per evaluation for the records below (PromQL has no common subexpressions):
# the end-to-end latency's sum five times, its count three, the prompt tokens three. First in
# the roofline group, so its records read this evaluation's.

#: End-to-end seconds of the requests finished per second, per target and model.
MODEL_E2E_SECONDS = Signal(
    "inference:model_e2e_seconds:rate{latency}",
    "requests",
    ROOFLINE_GROUP,
    Rule(
        model_rate("inference_e2e_request_latency_seconds_sum"),
        "end-to-end seconds of the requests finished per second (the requests in the engine, mean)",
    ),
    "in the engine",
)

#: Requests finished per second, per target and model.
MODEL_REQUESTS = Signal(
    "inference:model_requests_finished:rate{latency}",
    "requests_per_second",
    ROOFLINE_GROUP,
    Rule(
        model_rate("inference_e2e_request_latency_seconds_count"),
        "requests finished per second",
    ),
    "finished/s",
)

#: Prompt tokens per second (prefix-cache hits included), per target and model.
MODEL_PROMPT = Signal(
    "inference:model_prompt_tokens:rate{latency}",
    "tokens_per_second",
    ROOFLINE_GROUP,
    Rule(model_rate("inference_prompt_tokens_total"), "prompt tokens per second"),
    "prompt tokens/s",
)


# --- the GPUs' peaks --------------------------------------------------------------------------


def _sidecar_peak(ctx: SignalContext, metric: str, *matchers: str) -> str:
    return f"min {ctx.by_target} ({ctx.latest(metric, *matchers)})"


def _node_peak(ctx: SignalContext, metric: str, *matchers: str) -> str:
    return node_per_target(ctx, "min", ctx.latest(metric, *matchers))


def site_peaks(product: ProductPeaks) -> Peaks:
    """A product's peaks as the site config gives them."""
    return Peaks(product.memory_bandwidth, dict(product.flops), "the site config (gpu_peaks)")


def product_peak(ctx: SignalContext, figure: Callable[[Peaks], float | None]) -> str:
    """The slowest GPU of each target from dcgm-exporter's ``modelName``: the site config's
    figure for the product (``gpu_peaks``), else the product table's
    (:data:`exporter.hardware.gpus.PRODUCTS`, the sidecar's own fallback). One constant per
    figure over the GPUs of the products that have it; the site's, listed first, win."""
    keep = by((*ctx.cfg.dcgm.dcgm_labels, "UUID"))

    def gpus(values: dict[float, list[str]]) -> list[str]:
        return [
            f"{num(value)} * group {keep} ({_dcgm_gpus(ctx, product_matcher(products))})"
            for value, products in sorted(values.items())
        ]

    site: dict[float, list[str]] = {}
    for product in ctx.cfg.gpu_peaks:
        value = figure(site_peaks(product))
        if value:
            site.setdefault(value, []).append(product.name)
    table: dict[float, list[str]] = {}
    for name in PRODUCTS:
        value = figure(peaks_of(name, GpuFacts()))
        if value:
            table.setdefault(value, []).append(name)
    both = [*gpus(site), *gpus(table)]
    return dcgm_per_target(ctx, "(\n" + "\nor\n".join(both) + "\n)", "min")


def _dcgm_gpus(ctx: SignalContext, matcher: str) -> str:
    """The GPUs dcgm-exporter reports utilisation of (either generation), of ``matcher``."""
    return dcgm_quantity(ctx, dcgm_fields.UTILIZATION, ctx.last, matcher, scale=False)


def product_matcher(products: Sequence[str], label: str = "modelName") -> str:
    """``label`` (dcgm-exporter's ``modelName``; the sidecar's ``inference_gpu_info`` has
    ``name``) as NVML names the products, in any case and spacing. Prometheus anchors the
    regex; a metacharacter goes in a class, not behind a backslash, which a PromQL string would
    take as its own escape."""
    alternatives = "|".join(
        "".join(f"[{char}]" if char in _REGEX_META else char for char in name).replace(" ", " +")
        for name in products
    )
    return f'{label}=~"(?i){alternatives}"'


def _peak(
    sidecar_metric: str, figure: Callable[[Peaks], float | None], help_text: str, *matchers: str
) -> ByLayout:
    """A peak in each layout: the sidecar's, the node agent's by pod, or (dcgm) the
    sidecar's where its nvml collector runs, else the product table's."""

    def dcgm(ctx: SignalContext) -> str:
        own = _sidecar_peak(ctx, sidecar_metric, *matchers)
        return f"{own}\nor\n{product_peak(ctx, figure)}"

    return ByLayout(
        sidecar=Rule(lambda ctx: _sidecar_peak(ctx, sidecar_metric, *matchers), help_text),
        node=Rule(lambda ctx: _node_peak(ctx, sidecar_metric, *matchers), help_text),
        dcgm=Rule(dcgm, help_text),
    )


PEAK_BANDWIDTH = Signal(
    "inference:gpu_peak_memory_bandwidth_bytes_per_second:min",
    "bytes_per_second",
    ROOFLINE_GROUP,
    _peak(
        _BANDWIDTH,
        lambda peaks: peaks.memory_bandwidth,
        "theoretical peak HBM bandwidth of the target's slowest GPU, bytes per second",
    ),
    "peak HBM bandwidth",
)

PEAK_FLOPS = Signal(
    f"inference:gpu_peak_{PREFILL_PRECISION}_flops:min",
    "flops",
    ROOFLINE_GROUP,
    _peak(
        "inference_gpu_peak_flops",
        lambda peaks: peaks.flops.get(PREFILL_PRECISION),
        f"dense {PREFILL_PRECISION} tensor peak of the target's slowest GPU, FLOP per second",
        _PRECISION,
    ),
    "peak FLOPs",
)


# --- decode and prefill against the peaks -----------------------------------------------------


def _kv_cache_bytes(ctx: SignalContext) -> str:
    m = _PerModel(ctx)
    usage = ctx.sidecar_series("inference_kv_cache_usage_ratio", DECODES)
    return (
        f"max {m.by_model} (avg_over_time({usage}[{m.window}]))\n"
        f"* {m.on_model}\n{m.max('inference_kv_cache_capacity_tokens')}\n"
        f"* {m.on_model}\n{m.max('inference_model_kv_cache_bytes_per_token')}"
    )


KV_CACHE_BYTES = Signal(
    "inference:kv_cache_bytes_in_use:mean{latency}",
    "bytes",
    ROOFLINE_GROUP,
    Rule(
        _kv_cache_bytes,
        "live KV-cache bytes one GPU of the engine reads per decode step: usage x "
        "capacity (tokens) x bytes per token on one GPU, mean over the window (engines "
        "that decode: a disaggregated prefill engine has no decode floor)",
    ),
    "live KV-cache bytes",
)


def _decode_floor(ctx: SignalContext) -> str:
    m = _PerModel(ctx)
    return (
        f"(\n{m.max('inference_model_weight_bytes')}\n+ {m.on_model}\n"
        f"{ctx.name(KV_CACHE_BYTES)}\n)\n/ {m.to_target}\n{ctx.name(PEAK_BANDWIDTH)}"
    )


DECODE_FLOOR = Signal(
    "inference:decode_floor_seconds:mean{latency}",
    "seconds",
    ROOFLINE_GROUP,
    Rule(
        _decode_floor,
        "the HBM floor of one decode step: (weight bytes + live KV bytes) / peak "
        "bandwidth, seconds",
    ),
    "floor",
)


def _inter_token_mean(ctx: SignalContext) -> str:
    m = _PerModel(ctx)
    return (
        f"{m.rate('inference_inter_token_latency_seconds_sum', DECODES)}\n/\n"
        f"({m.rate('inference_inter_token_latency_seconds_count', DECODES)} > 0)"
    )


INTER_TOKEN_MEAN = Signal(
    "inference:inter_token_latency_seconds:mean{latency}",
    "seconds",
    ROOFLINE_GROUP,
    Rule(
        _inter_token_mean,
        "mean inter-token latency, the decode step a request sees, seconds (engines that "
        "decode: not a disaggregated prefill engine)",
    ),
    "observed step",
)


def _decode_efficiency(ctx: SignalContext) -> str:
    m = _PerModel(ctx)
    return (
        f"(\n{ctx.name(DECODE_FLOOR)}\n/\n{ctx.name(INTER_TOKEN_MEAN)}\n)\nor\n(\n"
        f"({m.rate('inference_estimated_read_bytes_total', DECODES)} > 0)\n"
        f"/ {m.to_target}\n{ctx.name(PEAK_BANDWIDTH)}\n)"
    )


DECODE_EFFICIENCY = Signal(
    "inference:decode_roofline_efficiency:ratio{latency}",
    "ratio",
    ROOFLINE_GROUP,
    Rule(
        _decode_efficiency,
        "decode roofline efficiency (0-1): the HBM floor of a step / the mean "
        "inter-token latency; without the model facts, the engine's estimated read "
        "bytes per second / peak bandwidth (a time average: idle time reads low); read "
        "where decode runs, never on a disaggregated prefill engine",
    ),
    "decode efficiency",
)


def _roofline_tokens(ctx: SignalContext) -> str:
    m = _PerModel(ctx)
    return f"{m.mean('inference_requests_running', DECODES)}\n/\n{ctx.name(DECODE_FLOOR)}"


ROOFLINE_TOKENS = Signal(
    "inference:roofline_generation_tokens:rate{latency}",
    "tokens_per_second",
    ROOFLINE_GROUP,
    Rule(
        _roofline_tokens,
        "tokens per second the running batch would generate with every step at its "
        "HBM floor (mean requests running / floor)",
    ),
    "roofline",
)


def _roofline_throughput(ctx: SignalContext) -> str:
    m = _PerModel(ctx)
    return (
        f"{m.rate('inference_generation_tokens_total', DECODES)}\n/\n"
        f"({ctx.name(ROOFLINE_TOKENS)} > 0)"
    )


ROOFLINE_THROUGHPUT = Signal(
    "inference:decode_roofline_throughput:ratio{latency}",
    "ratio",
    ROOFLINE_GROUP,
    Rule(
        _roofline_throughput,
        "generated tokens per second as a share of the roofline's at the current batch",
    ),
    "share of the roofline",
)


def _prefill_efficiency(ctx: SignalContext) -> str:
    m = _PerModel(ctx)
    prompt = ctx.name(MODEL_PROMPT)
    cached = m.rate("inference_prompt_tokens_cached_total")
    return (
        f"{m.max('inference_model_flops_per_token')}\n* {m.on_model}\n"
        f"(\n{prompt}\n-\n({cached}\nor\n0 * {prompt})\n)\n"
        f"/ {m.on_model}\n({m.rate('inference_prefill_time_seconds_sum')} > 0)\n"
        f"/ {m.to_target}\n{ctx.name(PEAK_FLOPS)}"
    )


PREFILL_EFFICIENCY = Signal(
    "inference:prefill_compute_efficiency:ratio{latency}",
    "ratio",
    ROOFLINE_GROUP,
    Rule(
        _prefill_efficiency,
        "prefill compute efficiency (0-1): FLOPs of the prompt tokens computed (cached "
        "ones left out) per second of prefill / the tensor peak; prompts prefilled "
        "together are each charged the whole step, so it reads low for batched prefills",
    ),
    "prefill efficiency",
)


# --- the latency budget and the workload's shape ----------------------------------------------


def _e2e(m: _PerModel) -> str:
    return m.ctx.name(MODEL_E2E_SECONDS)


def _requests(m: _PerModel) -> str:
    return m.ctx.name(MODEL_REQUESTS)


E2E_MEAN = Signal(
    "inference:e2e_request_latency_seconds:mean{latency}",
    "seconds",
    ROOFLINE_GROUP,
    Rule(
        lambda ctx: f"{_e2e(_PerModel(ctx))}\n/\n({_requests(_PerModel(ctx))} > 0)",
        "mean end-to-end request latency, seconds",
    ),
    "end to end",
)


def _budget_queue(ctx: SignalContext) -> str:
    m = _PerModel(ctx)
    return f"{ctx.queue_less_transfer((*ctx.join, 'model'), m.window)}\n/\n({_e2e(m)} > 0)"


BUDGET_QUEUE = Signal(
    "inference:latency_budget_queue:ratio{latency}",
    "ratio",
    ROOFLINE_GROUP,
    Rule(
        _budget_queue,
        "latency budget: share of end-to-end latency waiting in the engine's queue (a "
        "decode engine's wait for the KV transfer left out: that is the transfer's share)",
    ),
    "queue",
)

BUDGET_TRANSFER = Signal(
    "inference:latency_budget_transfer:ratio{latency}",
    "ratio",
    ROOFLINE_GROUP,
    Rule(
        lambda ctx: _PerModel(ctx).share_of_e2e("inference_kv_transfer_seconds_sum"),
        "latency budget: share of end-to-end latency in the KV-cache transfer between "
        "prefill and decode engines (disaggregated serving; absent elsewhere)",
    ),
    "KV transfer",
)

BUDGET_PREFILL = Signal(
    "inference:latency_budget_prefill:ratio{latency}",
    "ratio",
    ROOFLINE_GROUP,
    Rule(
        lambda ctx: _PerModel(ctx).share_of_e2e("inference_prefill_time_seconds_sum"),
        "latency budget: share of end-to-end latency in prefill",
    ),
    "prefill",
)

BUDGET_DECODE = Signal(
    "inference:latency_budget_decode:ratio{latency}",
    "ratio",
    ROOFLINE_GROUP,
    Rule(
        lambda ctx: _PerModel(ctx).share_of_e2e("inference_decode_time_seconds_sum"),
        "latency budget: share of end-to-end latency in decode",
    ),
    "decode",
)


def _budget_host(ctx: SignalContext) -> str:
    queue = ctx.name(BUDGET_QUEUE)
    return (
        f"1 - (\n{queue}\n+\n{ctx.name(BUDGET_PREFILL)}\n+\n"
        f"{ctx.name(BUDGET_DECODE)}\n+\n"
        f"(\n{ctx.name(BUDGET_TRANSFER)}\nor\n0 * {queue}\n)\n)"
    )


BUDGET_HOST = Signal(
    "inference:latency_budget_host:ratio{latency}",
    "ratio",
    ROOFLINE_GROUP,
    Rule(
        _budget_host,
        "latency budget: share of end-to-end latency outside queue, prefill, decode and "
        "the KV transfer (tokenize, detokenize, post-processing, streaming on the host)",
    ),
    "host",
)

PROMPT_TOKENS = Signal(
    "inference:request_prompt_tokens:mean{latency}",
    "tokens",
    ROOFLINE_GROUP,
    Rule(
        lambda ctx: f"{ctx.name(MODEL_PROMPT)}\n/\n({_requests(_PerModel(ctx))} > 0)",
        "workload shape: mean prompt tokens per finished request",
    ),
    "prompt",
)

OUTPUT_TOKENS = Signal(
    "inference:request_generation_tokens:mean{latency}",
    "tokens",
    ROOFLINE_GROUP,
    Rule(
        lambda ctx: (
            f"{_PerModel(ctx).rate('inference_generation_tokens_total')}\n/\n"
            f"({_requests(_PerModel(ctx))} > 0)"
        ),
        "workload shape: mean generated tokens per finished request",
    ),
    "output",
)
