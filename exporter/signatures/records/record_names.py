"""The name of every recording rule of a configuration: what the alerts, the dashboards and
``diagnose`` read.

Every record is named ``level:metric:operation``. Level ``inference`` has one series per
scrape target of the sidecar (the join labels); level ``inference_gpu`` adds ``gpu`` and
``uuid``. Windows appear in the names, so the names follow the site config.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.config import format_duration
from exporter.signatures.params import PREFILL_PRECISION
from exporter.signatures.site import SiteConfig

# The join labels of each sidecar target, one series per target.
TARGET_INFO = "inference:exporter_build_info:group"


@dataclass(frozen=True)
class RecordNames:
    """The record names of one configuration, one attribute per record."""

    target_info: str
    gpu_utilization: str
    # Shared GPUs (time-slicing, MPS): per GPU, and the target's own share.
    gpu_device_utilization: str
    gpu_engine_share: str
    gpu_other_tenants: str
    gpu_own_utilization: str
    utilization_samples: str
    idle_samples: str
    busy_samples: str
    hbm_bandwidth: str
    requests_running: str
    generation_tokens: str
    tokens_per_request: str
    traffic: str
    queue_depth: str
    queue_trend: str
    queue_wait_share: str
    tokenizer_median: str
    inter_token_median: str
    hottest_thread: str
    softirq_share: str
    softirq_hottest_core: str
    kv_cache: str
    memory_used: str
    xid_new: str
    clock_events: str
    temperature: str
    sm_clock: str
    dcgm_idle_sample: str
    dcgm_busy_sample: str
    dcgm_xid_changed: str
    dcgm_clock_reasons: str
    sm_active: str
    peak_bandwidth: str
    peak_flops: str
    kv_cache_bytes: str
    decode_floor: str
    inter_token_mean: str
    decode_efficiency: str
    roofline_tokens: str
    roofline_throughput: str
    prefill_efficiency: str
    e2e_mean: str
    budget_queue: str
    budget_prefill: str
    budget_decode: str
    budget_host: str
    budget_transfer: str
    prompt_tokens: str
    output_tokens: str
    # Pools of disaggregated serving: per pool (the join labels less pod and instance) and
    # model; the per-role ones are templates of ``{role}`` (prefill, decode): see ``of_role``.
    pool_engines: str
    pool_queue: str
    pool_queue_trend: str
    pool_running: str
    pool_kv_cache: str
    pool_engines_needed: str
    pool_ratio_now: str
    pool_ratio_suggested: str
    kv_transfer_mean: str
    ttft_transfer_share: str
    ttft_queue_mean: str
    ttft_prefill_mean: str
    ttft_queue_share: str
    ttft_prefill_share: str
    # The latency budget of each pool, one series per pool, model and role.
    pool_budget_queue: str
    pool_budget_prefill: str
    pool_budget_transfer: str
    pool_budget_decode: str
    kv_failure_ratio: str

    @staticmethod
    def history(seconds: float) -> str:
        """The record that is 1 per target once the target has ``seconds`` of history."""
        return f"inference:exporter_build_info:history{format_duration(seconds)}"

    @staticmethod
    def of_role(template: str, role: str) -> str:
        """A per-role pool record's name: ``inference_pool:prefill_queue_depth:mean5m``."""
        return template.format(role=role)

    @staticmethod
    def pool_history(seconds: float) -> str:
        """The record that is 1 per pool and model once its engines have ``seconds`` of
        history: the cold-start guard of the pool signatures."""
        return f"inference_pool:engine_info:history{format_duration(seconds)}"

    @classmethod
    def of(cls, cfg: SiteConfig) -> RecordNames:
        """The record names of ``cfg``: its windows, and its profile's source of GPU series."""
        rate = format_duration(cfg.window_seconds("rate"))
        latency = format_duration(cfg.window_seconds("latency"))
        trend = format_duration(cfg.window_seconds("queue_trend"))
        pulse = format_duration(cfg.window_seconds("pulsing"))
        xid = format_duration(cfg.window_seconds("xid"))
        return cls(
            target_info=TARGET_INFO,
            gpu_utilization=f"inference:gpu_utilization:mean{rate}",
            gpu_device_utilization=f"inference_gpu:utilization:mean{rate}",
            gpu_engine_share=f"inference_gpu:engine_utilization:mean{rate}",
            gpu_other_tenants=f"inference_gpu:other_tenants_utilization:mean{rate}",
            gpu_own_utilization=f"inference:gpu_own_utilization:mean{rate}",
            utilization_samples=f"inference:gpu_utilization_samples:increase{pulse}",
            idle_samples=f"inference:gpu_utilization_idle_samples:ratio{pulse}",
            busy_samples=f"inference:gpu_utilization_busy_samples:ratio{pulse}",
            hbm_bandwidth=f"inference:gpu_memory_bandwidth_utilization:mean{rate}",
            requests_running=f"inference:requests_running:mean{rate}",
            generation_tokens=f"inference:generation_tokens:rate{rate}",
            tokens_per_request=f"inference:generation_tokens_per_request:rate{rate}",
            traffic="inference:traffic:active",
            queue_depth="inference:queue_depth:sum",
            queue_trend=f"inference:queue_depth:deriv{trend}",
            queue_wait_share=f"inference:queue_time_per_e2e_latency:ratio{latency}",
            tokenizer_median=f"inference:tokenizer_latency_seconds:median{latency}",
            inter_token_median=f"inference:inter_token_latency_seconds:median{latency}",
            hottest_thread=f"inference:engine_hottest_thread_cpu:mean{rate}",
            softirq_share=f"inference:cpu_softirq:ratio{rate}",
            softirq_hottest_core=f"inference:cpu_softirq_hottest_core:mean{rate}",
            kv_cache="inference:kv_cache_usage:max",
            memory_used="inference_gpu:memory_used:ratio",
            xid_new=f"inference_gpu:xid_errors:increase{xid}",
            clock_events="inference_gpu:clock_event_active:max",
            # The sidecar's own series name a GPU as the records would: its evidence reads
            # them where an alert needs them, instead of a record of every GPU every time.
            temperature=(
                "inference_gpu:temperature_celsius:max"
                if cfg.profile.source != "sidecar"
                else "inference_gpu_temperature_celsius"
            ),
            sm_clock=(
                "inference_gpu:sm_clock_hertz:max"
                if cfg.profile.source != "sidecar"
                else "inference_gpu_sm_clock_hertz"
            ),
            dcgm_idle_sample="inference_gpu:gpu_utilization_idle_sample:bool",
            dcgm_busy_sample="inference_gpu:gpu_utilization_busy_sample:bool",
            dcgm_xid_changed=f"inference_gpu:dcgm_xid_errors_last:changed{xid}",
            dcgm_clock_reasons="inference_gpu:dcgm_clock_event_reasons:max",
            sm_active=f"inference:gpu_sm_active:mean{rate}",
            peak_bandwidth="inference:gpu_peak_memory_bandwidth_bytes_per_second:min",
            peak_flops=f"inference:gpu_peak_{PREFILL_PRECISION}_flops:min",
            kv_cache_bytes=f"inference:kv_cache_bytes_in_use:mean{latency}",
            decode_floor=f"inference:decode_floor_seconds:mean{latency}",
            inter_token_mean=f"inference:inter_token_latency_seconds:mean{latency}",
            decode_efficiency=f"inference:decode_roofline_efficiency:ratio{latency}",
            roofline_tokens=f"inference:roofline_generation_tokens:rate{latency}",
            roofline_throughput=f"inference:decode_roofline_throughput:ratio{latency}",
            prefill_efficiency=f"inference:prefill_compute_efficiency:ratio{latency}",
            e2e_mean=f"inference:e2e_request_latency_seconds:mean{latency}",
            budget_queue=f"inference:latency_budget_queue:ratio{latency}",
            budget_prefill=f"inference:latency_budget_prefill:ratio{latency}",
            budget_decode=f"inference:latency_budget_decode:ratio{latency}",
            budget_host=f"inference:latency_budget_host:ratio{latency}",
            budget_transfer=f"inference:latency_budget_transfer:ratio{latency}",
            prompt_tokens=f"inference:request_prompt_tokens:mean{latency}",
            output_tokens=f"inference:request_generation_tokens:mean{latency}",
            pool_engines="inference_pool:{role}_engines:count",
            pool_queue=f"inference_pool:{{role}}_queue_depth:mean{rate}",
            pool_queue_trend=f"inference_pool:{{role}}_queue_depth:deriv{trend}",
            pool_running=f"inference_pool:{{role}}_requests_running:mean{rate}",
            pool_kv_cache=f"inference_pool:{{role}}_kv_cache_usage:mean{rate}",
            pool_engines_needed=f"inference_pool:{{role}}_engines_needed:estimate{rate}",
            pool_ratio_now="inference_pool:prefill_decode_ratio:current",
            pool_ratio_suggested=f"inference_pool:prefill_decode_ratio:suggested{rate}",
            kv_transfer_mean=f"inference_pool:kv_transfer_seconds:mean{latency}",
            ttft_transfer_share=f"inference_pool:ttft_transfer:ratio{latency}",
            ttft_queue_mean=f"inference_pool:ttft_queue_seconds:mean{latency}",
            ttft_prefill_mean=f"inference_pool:ttft_prefill_seconds:mean{latency}",
            ttft_queue_share=f"inference_pool:ttft_queue:ratio{latency}",
            ttft_prefill_share=f"inference_pool:ttft_prefill:ratio{latency}",
            pool_budget_queue=f"inference_pool:latency_budget_queue:ratio{latency}",
            pool_budget_prefill=f"inference_pool:latency_budget_prefill:ratio{latency}",
            pool_budget_transfer=f"inference_pool:latency_budget_transfer:ratio{latency}",
            pool_budget_decode=f"inference_pool:latency_budget_decode:ratio{latency}",
            kv_failure_ratio=f"inference_pool:kv_transfer_failures:ratio{rate}",
        )
