"""How far each served model is from its hardware limit, and where its requests' time goes
(``docs/roofline.md``): the decode floor and efficiency, the prefill efficiency, the latency
budget and the workload shape. One series per target and ``model``.

The GPU peaks are the sidecar's in every profile (dcgm-exporter reports none); the dcgm
profile falls back to the product table by dcgm-exporter's ``modelName`` when the sidecar runs
without NVML. The model facts (``--model.path``) and the engine's figures are per GPU of the
engine, so they set against one GPU's peak: the target's slowest GPU (``min``), which sets the
pace of a tensor-parallel step.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import replace

from exporter.hardware.gpus import PRODUCTS, GpuFacts, Peaks, peaks_of
from exporter.signatures.definitions import RecordingRule
from exporter.signatures.params import PREFILL_PRECISION
from exporter.signatures.promql_text import by, num, on
from exporter.signatures.records.dcgm_records import dcgm_per_target, dcgm_series
from exporter.signatures.records.node_records import node_peaks
from exporter.signatures.records.record_context import DECODES, RecordContext
from exporter.signatures.records.record_groups import ROOFLINE_GROUP

_REGEX_META = frozenset(".+*?()|{}^$")


class _PerModel:
    """PromQL over the sidecar's series, one series per target and ``model``."""

    def __init__(self, ctx: RecordContext) -> None:
        self.ctx = ctx
        self.by_model = by((*ctx.join, "model"))
        self.latency = ctx.window("latency")

    def max(self, metric: str) -> str:
        """The largest value of a model gauge (the model facts)."""
        return f"max {self.by_model} ({self.ctx.sidecar_series(metric)})"

    def rate(self, metric: str, *matchers: str) -> str:
        """A counter's rate over the latency window."""
        series = self.ctx.sidecar_series(metric, *matchers)
        return f"sum {self.by_model} (rate({series}[{self.latency}]))"

    def mean(self, metric: str, *matchers: str) -> str:
        """A gauge's mean over the latency window."""
        series = self.ctx.sidecar_series(metric, *matchers)
        return f"sum {self.by_model} (avg_over_time({series}[{self.latency}]))"

    def share_of_e2e(self, metric: str) -> str:
        """A latency sum's rate as a share of the end-to-end latency's."""
        e2e = self.rate("inference_e2e_request_latency_seconds_sum")
        return f"{self.rate(metric)}\n/\n({e2e} > 0)"


def roofline_records(ctx: RecordContext) -> list[RecordingRule]:
    """The roofline records, in :data:`ROOFLINE_GROUP`."""
    return [
        replace(rule, group=ROOFLINE_GROUP)
        for rule in [*_peak_records(ctx), *_decode_records(ctx), *_latency_budget_records(ctx)]
    ]


def _peak_records(ctx: RecordContext) -> list[RecordingRule]:
    """The target's slowest GPU's peak HBM bandwidth and tensor FLOPs."""
    precision = f'precision="{PREFILL_PRECISION}"'
    bandwidth = ctx.sidecar_series("inference_gpu_peak_memory_bandwidth_bytes_per_second")
    peak_bandwidth = f"min {ctx.by_target} ({bandwidth})"
    flops = ctx.sidecar_series("inference_gpu_peak_flops", precision)
    peak_flops = f"min {ctx.by_target} ({flops})"
    if ctx.from_node:
        peak_bandwidth, peak_flops = node_peaks(ctx, precision)
    if ctx.from_dcgm:
        # The sidecar's own figures where its nvml collector runs; else the product table's
        # by the name dcgm-exporter gives each GPU.
        product_bandwidth = product_peak(ctx, lambda peaks: peaks.memory_bandwidth)
        product_flops = product_peak(ctx, lambda peaks: peaks.flops.get(PREFILL_PRECISION))
        peak_bandwidth += f"\nor\n{product_bandwidth}"
        peak_flops += f"\nor\n{product_flops}"
    return [
        RecordingRule(
            ctx.records.peak_bandwidth,
            peak_bandwidth,
            "theoretical peak HBM bandwidth of the target's slowest GPU, bytes per second",
        ),
        RecordingRule(
            ctx.records.peak_flops,
            peak_flops,
            f"dense {PREFILL_PRECISION} tensor peak of the target's slowest GPU, FLOP per second",
        ),
    ]


def _decode_records(ctx: RecordContext) -> list[RecordingRule]:
    """The decode floor, the decode and prefill efficiencies against the peaks."""
    records = ctx.records
    per_model = _PerModel(ctx)
    on_model = on((*ctx.join, "model"))
    to_target = f"{on(ctx.join)} group_left ()"
    usage = ctx.sidecar_series("inference_kv_cache_usage_ratio", DECODES)
    prompt = per_model.rate("inference_prompt_tokens_total")
    cached = per_model.rate("inference_prompt_tokens_cached_total")
    return [
        RecordingRule(
            records.kv_cache_bytes,
            f"max {per_model.by_model} (avg_over_time({usage}[{per_model.latency}]))\n"
            f"* {on_model}\n{per_model.max('inference_kv_cache_capacity_tokens')}\n"
            f"* {on_model}\n{per_model.max('inference_model_kv_cache_bytes_per_token')}",
            "live KV-cache bytes one GPU of the engine reads per decode step: usage x "
            "capacity (tokens) x bytes per token on one GPU, mean over the window (engines "
            "that decode: a disaggregated prefill engine has no decode floor)",
        ),
        RecordingRule(
            records.decode_floor,
            f"(\n{per_model.max('inference_model_weight_bytes')}\n+ {on_model}\n"
            f"{records.kv_cache_bytes}\n)\n/ {to_target}\n{records.peak_bandwidth}",
            "the HBM floor of one decode step: (weight bytes + live KV bytes) / peak "
            "bandwidth, seconds",
        ),
        RecordingRule(
            records.inter_token_mean,
            f"{per_model.rate('inference_inter_token_latency_seconds_sum', DECODES)}\n/\n"
            f"({per_model.rate('inference_inter_token_latency_seconds_count', DECODES)} > 0)",
            "mean inter-token latency, the decode step a request sees, seconds (engines that "
            "decode: not a disaggregated prefill engine)",
        ),
        RecordingRule(
            records.decode_efficiency,
            f"(\n{records.decode_floor}\n/\n{records.inter_token_mean}\n)\nor\n(\n"
            f"({per_model.rate('inference_estimated_read_bytes_total', DECODES)} > 0)\n"
            f"/ {to_target}\n{records.peak_bandwidth}\n)",
            "decode roofline efficiency (0-1): the HBM floor of a step / the mean "
            "inter-token latency; without the model facts, the engine's estimated read "
            "bytes per second / peak bandwidth (a time average: idle time reads low); read "
            "where decode runs, never on a disaggregated prefill engine",
        ),
        RecordingRule(
            records.roofline_tokens,
            f"{per_model.mean('inference_requests_running', DECODES)}\n/\n{records.decode_floor}",
            "tokens per second the running batch would generate with every step at its "
            "HBM floor (mean requests running / floor)",
        ),
        RecordingRule(
            records.roofline_throughput,
            f"{per_model.rate('inference_generation_tokens_total', DECODES)}\n/\n"
            f"({records.roofline_tokens} > 0)",
            "generated tokens per second as a share of the roofline's at the current batch",
        ),
        RecordingRule(
            records.prefill_efficiency,
            f"{per_model.max('inference_model_flops_per_token')}\n* {on_model}\n"
            f"(\n{prompt}\n-\n({cached}\nor\n0 * {prompt})\n)\n"
            f"/ {on_model}\n({per_model.rate('inference_prefill_time_seconds_sum')} > 0)\n"
            f"/ {to_target}\n{records.peak_flops}",
            "prefill compute efficiency (0-1): FLOPs of the prompt tokens computed (cached "
            "ones left out) per second of prefill / the tensor peak; prompts prefilled "
            "together are each charged the whole step, so it reads low for batched prefills",
        ),
    ]


def _latency_budget_records(ctx: RecordContext) -> list[RecordingRule]:
    """Where a request's end-to-end latency goes, and the workload's shape."""
    records = ctx.records
    per_model = _PerModel(ctx)
    e2e = per_model.rate("inference_e2e_request_latency_seconds_sum")
    requests = per_model.rate("inference_e2e_request_latency_seconds_count")
    prompt = per_model.rate("inference_prompt_tokens_total")
    return [
        RecordingRule(
            records.e2e_mean,
            f"{e2e}\n/\n({requests} > 0)",
            "mean end-to-end request latency, seconds",
        ),
        RecordingRule(
            records.budget_queue,
            f"{ctx.queue_less_transfer((*ctx.join, 'model'), per_model.latency)}\n/\n({e2e} > 0)",
            "latency budget: share of end-to-end latency waiting in the engine's queue (a "
            "decode engine's wait for the KV transfer left out: that is the transfer's share)",
        ),
        RecordingRule(
            records.budget_transfer,
            per_model.share_of_e2e("inference_kv_transfer_seconds_sum"),
            "latency budget: share of end-to-end latency in the KV-cache transfer between "
            "prefill and decode engines (disaggregated serving; absent elsewhere)",
        ),
        RecordingRule(
            records.budget_prefill,
            per_model.share_of_e2e("inference_prefill_time_seconds_sum"),
            "latency budget: share of end-to-end latency in prefill",
        ),
        RecordingRule(
            records.budget_decode,
            per_model.share_of_e2e("inference_decode_time_seconds_sum"),
            "latency budget: share of end-to-end latency in decode",
        ),
        RecordingRule(
            records.budget_host,
            f"1 - (\n{records.budget_queue}\n+\n{records.budget_prefill}\n+\n"
            f"{records.budget_decode}\n+\n"
            f"(\n{records.budget_transfer}\nor\n0 * {records.budget_queue}\n)\n)",
            "latency budget: share of end-to-end latency outside queue, prefill, decode and "
            "the KV transfer (tokenize, detokenize, post-processing, streaming on the host)",
        ),
        RecordingRule(
            records.prompt_tokens,
            f"{prompt}\n/\n({requests} > 0)",
            "workload shape: mean prompt tokens per finished request",
        ),
        RecordingRule(
            records.output_tokens,
            f"{per_model.rate('inference_generation_tokens_total')}\n/\n({requests} > 0)",
            "workload shape: mean generated tokens per finished request",
        ),
    ]


def product_peak(ctx: RecordContext, figure: Callable[[Peaks], float | None]) -> str:
    """The slowest GPU of each target from dcgm-exporter's ``modelName`` and the product
    table (:data:`exporter.hardware.gpus.PRODUCTS`, the sidecar's own fallback): one
    constant per figure over the GPUs of the products that have it."""
    names: dict[float, list[str]] = {}
    for name in PRODUCTS:
        value = figure(peaks_of(name, GpuFacts()))
        if value:
            names.setdefault(value, []).append(name)
    keep = by((*ctx.cfg.dcgm.dcgm_labels, "UUID"))
    gpus = [
        f"{num(value)} * group {keep} "
        f"({dcgm_series(ctx, 'DCGM_FI_DEV_GPU_UTIL', product_matcher(products))})"
        for value, products in sorted(names.items())
    ]
    return dcgm_per_target(ctx, "(\n" + "\nor\n".join(gpus) + "\n)", "min")


def product_matcher(products: Sequence[str]) -> str:
    """``modelName`` as NVML names the products, in any case and spacing. Prometheus
    anchors the regex; a metacharacter goes in a class, not behind a backslash, which a
    PromQL string would take as its own escape."""
    alternatives = "|".join(
        "".join(f"[{char}]" if char in _REGEX_META else char for char in name).replace(" ", " +")
        for name in products
    )
    return f'modelName=~"(?i){alternatives}"'
