"""Recording rules: the signals the signatures read, filled by each profile from its source.

Every record is named ``level:metric:operation``. Level ``inference`` has one series per
scrape target of the sidecar (the join labels); level ``inference_gpu`` adds ``gpu`` and
``uuid``. The alert expressions only ever read these names, so a profile can swap where a
signal comes from (the sidecar's NVML collector or dcgm-exporter) without touching them.

dcgm-exporter series belong to the GPU's pod (``namespace``, ``pod``) but not to the
sidecar's scrape target (their ``instance`` and ``job`` are dcgm-exporter's). They are
aggregated by the dcgm join labels and then given the target's remaining join labels from
``inference:exporter_build_info:group``, one series per sidecar target.

The roofline records (:meth:`_Builder.roofline`, ``docs/roofline.md``) are per target and
served ``model``: the decode floor and efficiency, the prefill efficiency, the latency budget
and the workload shape. Their GPU peaks are the sidecar's; the dcgm profile falls back to the
product table by dcgm-exporter's ``modelName`` when the sidecar runs without NVML.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace

from exporter.config import format_duration as duration
from exporter.config import parse_duration
from exporter.hardware.gpus import PRODUCTS, GpuFacts, Peaks, peaks_of
from exporter.metrics import CLOCK_EVENT_BITS
from exporter.signatures.definitions import RECORD_NAME, RecordingRule
from exporter.signatures.params import PREFILL_PRECISION
from exporter.signatures.promql_text import by, num, on, regex_alternatives, selector
from exporter.signatures.site import SiteConfig

GPU_LABELS = ("gpu", "uuid")
PROBE = 'source="probe"'
SOFTIRQ = 'mode="softirq"'
DCGM_REQUIRED = ("namespace", "pod")
_RANGE = re.compile(r"\[([0-9smhdwy]+)\]")
_REGEX_META = frozenset(".+*?()|{}^$")


@dataclass(frozen=True)
class Records:
    """The record names of one configuration (windows appear in the names)."""

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
    prompt_tokens: str
    output_tokens: str

    @staticmethod
    def history(seconds: float) -> str:
        """The record that is 1 per target once the target has ``seconds`` of history."""
        return f"inference:exporter_build_info:history{duration(seconds)}"

    @classmethod
    def of(cls, cfg: SiteConfig) -> Records:
        rate = duration(cfg.window("rate"))
        latency = duration(cfg.window("latency"))
        trend = duration(cfg.window("queue_trend"))
        pulse = duration(cfg.window("pulsing"))
        xid = duration(cfg.window("xid"))
        return cls(
            target_info="inference:exporter_build_info:group",
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
                if cfg.profile.source == "dcgm"
                else "inference_gpu_temperature_celsius"
            ),
            sm_clock=(
                "inference_gpu:sm_clock_hertz:max"
                if cfg.profile.source == "dcgm"
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
            prompt_tokens=f"inference:request_prompt_tokens:mean{latency}",
            output_tokens=f"inference:request_generation_tokens:mean{latency}",
        )


# Record groups by what their cost grows with: a target's engine gauges and counters, CPU and
# history; the engine's and the probe's latency histograms (tens of buckets per target); the
# per-GPU series, as rates over windows (utilisation, its samples, HBM) and as their state now
# (framebuffer, Xids, clock events); the roofline, per target and model, from the GPUs'
# peaks, the model's facts and the engine's counters. Each stays a small share of its interval
# at fleet scale (docs/scale.md), and Prometheus evaluates them side by side.
TARGET_GROUP = "inference.records"
LATENCY_GROUP = "inference.records.latency"
GPU_GROUP = "inference.records.gpu"
GPU_STATE_GROUP = "inference.records.gpu_state"
ROOFLINE_GROUP = "inference.records.roofline"
RECORD_GROUPS = (TARGET_GROUP, LATENCY_GROUP, GPU_GROUP, GPU_STATE_GROUP, ROOFLINE_GROUP)


def recording_rules(cfg: SiteConfig) -> list[RecordingRule]:
    """All recording rules of the configuration's profile, in evaluation order: the groups of
    :data:`RECORD_GROUPS`, one after the other.

    Every record's ``window`` is resolved (never ``None``), and the history records of the
    cold-start guard come first, ahead of every record that reads them.
    """
    builder = _Builder(cfg)
    rules = resolve_windows(builder.rules())
    windows = sorted(({rule.window or 0.0 for rule in rules} | builder.history_windows) - {0.0})
    ordered = [*builder.history(windows), *rules]
    return [rule for group in RECORD_GROUPS for rule in ordered if rule.group == group]


def resolve_windows(rules: Sequence[RecordingRule]) -> list[RecordingRule]:
    """``rules`` with each ``window=None`` replaced by the history the record needs: the
    longest range its expression reads, or the longest window of the records it reads
    (records are resolved in order, so a record reads only records above it)."""
    known: dict[str, float] = {}
    out = []
    for rule in rules:
        window = rule.window
        if window is None:
            ranges = [parse_duration(text) for text in _RANGE.findall(rule.expr)]
            inner = [known.get(name, 0.0) for name in RECORD_NAME.findall(rule.expr)]
            window = max([0.0, *ranges, *inner])
        known[rule.record] = window
        out.append(replace(rule, window=window))
    return out


def record_windows(cfg: SiteConfig) -> dict[str, float]:
    """Each record of the configuration and the history (seconds) it needs."""
    return {rule.record: rule.window or 0.0 for rule in recording_rules(cfg)}


class _Builder:
    def __init__(self, cfg: SiteConfig) -> None:
        self.cfg = cfg
        self.r = Records.of(cfg)
        self.history_windows: set[float] = set()
        self.join = cfg.join_labels
        self.by_target = by(self.join)
        self.by_gpu = by((*self.join, *GPU_LABELS))

    # --- selectors ----------------------------------------------------------------------------

    def s(self, metric: str, *extra: str) -> str:
        """A sidecar series selector."""
        return selector(metric, self.cfg.selectors.sidecar, *extra)

    def d(self, metric: str, *extra: str) -> str:
        """A dcgm-exporter series selector: only series attributed to a pod."""
        attributed = [
            f'{source}!=""' for target, source in self.cfg.dcgm.labels if target in DCGM_REQUIRED
        ]
        return selector(metric, *extra, self.cfg.selectors.dcgm, attributed)

    def _renamed(self, expr: str, *, gpu: bool) -> str:
        """dcgm-exporter labels renamed to the join labels (and UUID to uuid)."""
        for target, source in self.cfg.dcgm.labels:
            if target != source:
                expr = f'label_replace({expr}, "{target}", "$1", "{source}", "(.*)")'
        if gpu:
            expr = f'label_replace({expr}, "uuid", "$1", "UUID", "(.*)")'
        return expr

    def dcgm_target(self, inner: str, aggregation: str = "avg") -> str:
        """Per-target value from dcgm series ``inner`` (a range function over one metric)."""
        dj = self.cfg.dcgm.target_labels
        grouped = f"{aggregation} {by(dj)} ({self._renamed(inner, gpu=False)})"
        return f"{grouped}\n* {on(dj)} group_right ()\n{self.r.target_info}"

    def dcgm_gpu(self, inner: str, keep: tuple[str, ...] = ()) -> str:
        """Per-GPU value from dcgm series ``inner``, with the target's join labels."""
        dj = self.cfg.dcgm.target_labels
        rest = [label for label in self.join if label not in dj]
        grouped = f"max {by((*dj, *GPU_LABELS, *keep))} ({self._renamed(inner, gpu=True)})"
        return f"{grouped}\n* {on(dj)} group_left ({', '.join(rest)})\n{self.r.target_info}"

    # --- rules --------------------------------------------------------------------------------

    def history_of(self, seconds: float) -> str:
        """The history record of ``seconds``, for a record that reads it itself."""
        self.history_windows.add(seconds)
        return self.r.history(seconds)

    def history(self, windows: Sequence[float]) -> list[RecordingRule]:
        """The cold-start guard's records: one per window the other records read.

        A rate over a window that holds only the last minute of data reads low (Prometheus
        divides the extrapolated increase by the whole window), a regression over two points is
        noise: after a restart of Prometheus, or for a new pod, a signature would go pending on
        a half-empty window. ``history<w>`` is 1 for a target whose sidecar was scraped
        between ``2w`` and ``w`` ago - its series reach back a whole window - and absent
        before; an alert reading a record of window ``w`` requires it (``and on (<join>)``).
        One series per target and window, over the one build-info series of each target.
        """
        info = self.s("inference_exporter_build_info")
        return [
            RecordingRule(
                self.r.history(seconds),
                f"group {self.by_target} (max_over_time({info}[{duration(seconds)}] offset "
                f"{duration(seconds)}))",
                f"1 per sidecar target with at least {duration(seconds)} of history: the "
                f"cold-start guard of the alerts over {duration(seconds)} windows",
                window=0.0,
            )
            for seconds in windows
        ]

    def rules(self) -> list[RecordingRule]:
        dcgm = self.cfg.profile.source == "dcgm"
        # The join labels of each target, for dcgm-exporter series: the sidecar profile has
        # nothing to join and does not record it.
        out = [self.target_info()] if dcgm else []
        out += self.common()
        out += [replace(rule, group=ROOFLINE_GROUP) for rule in self.roofline()]
        gpu = self.dcgm_gpu_rules() if dcgm else self.sidecar_gpu()
        gpu += self.shared_gpu()
        r = self.r
        state = {
            r.memory_used,
            r.xid_new,
            r.clock_events,
            r.temperature,
            r.sm_clock,
            r.dcgm_xid_changed,
            r.dcgm_clock_reasons,
        }
        return out + [
            replace(rule, group=GPU_STATE_GROUP if rule.record in state else GPU_GROUP)
            for rule in gpu
        ]

    def target_info(self) -> RecordingRule:
        return RecordingRule(
            self.r.target_info,
            f"group {self.by_target} ({self.s('inference_exporter_build_info')})",
            "1 per sidecar scrape target: the join labels every other record carries",
        )

    def shared_gpu(self) -> list[RecordingRule]:
        """The engine's own share of GPUs it shares with other tenants (time-slicing, MPS).

        A GPU counts as shared while other processes hold a compute context on it; the
        sidecar's NVML collector tells them apart. dcgm-exporter does not, so in the dcgm
        profile no GPU counts as shared and the target's own utilisation is the GPUs'.
        """
        r, bt, bg = self.r, self.by_target, self.by_gpu
        rate = duration(self.cfg.window("rate"))
        on_gpu = on((*self.join, *GPU_LABELS))
        if self.cfg.profile.source == "dcgm":
            device = RecordingRule(
                r.gpu_device_utilization,
                self.dcgm_gpu(f"avg_over_time({self.d('DCGM_FI_DEV_GPU_UTIL')}[{rate}]) / 100"),
                "mean utilisation (0-1) of each GPU (DCGM_FI_DEV_GPU_UTIL, %)",
            )
            share = RecordingRule(
                r.gpu_engine_share,
                f"{r.gpu_device_utilization} unless {r.gpu_device_utilization}",
                "none: dcgm-exporter does not tell the engine's processes from other tenants'",
            )
            own = RecordingRule(
                r.gpu_own_utilization,
                r.gpu_utilization,
                "mean GPU utilisation (0-1) over the target's GPUs (no per-process shares here)",
            )
        else:
            engine = self.s("inference_gpu_engine_utilization_ratio")
            others = self.s("inference_gpu_processes", 'owner="other"')
            busy = self.s("inference_gpu_busy_seconds_total")
            device = RecordingRule(
                r.gpu_device_utilization,
                f"max {bg} (rate({busy}[{rate}]))",
                "mean utilisation (0-1) of each GPU, every tenant's work together",
            )
            share = RecordingRule(
                r.gpu_engine_share,
                f"max {bg} (avg_over_time({engine}[{rate}]))\n"
                f"and {on_gpu}\n"
                f"(max {bg} (max_over_time({others}[{rate}])) > 0)",
                "the engine's own mean share (0-1) of each GPU that other tenants' processes "
                "share; absent on a GPU the engine has to itself",
            )
            own = RecordingRule(
                r.gpu_own_utilization,
                f"avg {bt} (\n{r.gpu_engine_share}\nor\n{r.gpu_device_utilization}\n)",
                "mean GPU utilisation (0-1) over the target's GPUs, counting only the "
                "engine's own share of a GPU shared with other tenants",
            )
        others_share = RecordingRule(
            r.gpu_other_tenants,
            f"clamp(\n{r.gpu_device_utilization}\n- {on_gpu}\n{r.gpu_engine_share},\n0, 1\n)",
            "other tenants' mean share (0-1) of each shared GPU: its utilisation less the engine's",
        )
        return [device, share, others_share, own]

    def common(self) -> list[RecordingRule]:
        """Records from the sidecar's engine, tokenizer, process and cpu collectors."""
        r, bt = self.r, self.by_target
        rate = duration(self.cfg.window("rate"))
        latency = duration(self.cfg.window("latency"))
        trend = duration(self.cfg.window("queue_trend"))
        return [
            RecordingRule(
                r.requests_running,
                f"sum {bt} (avg_over_time({self.s('inference_requests_running')}[{rate}]))",
                "requests in the running batch, mean over the window",
            ),
            RecordingRule(
                r.generation_tokens,
                f"sum {bt} (rate({self.s('inference_generation_tokens_total')}[{rate}]))",
                "tokens generated per second",
            ),
            RecordingRule(
                r.tokens_per_request,
                f"{r.generation_tokens}\n/\n({r.requests_running} > 0)",
                "decode speed one running request sees, tokens per second",
            ),
            RecordingRule(
                r.traffic,
                f"clamp({r.requests_running} > 0, 1, 1)\n"
                f"or\nclamp({r.generation_tokens} > 0, 1, 1)\n"
                # Engines that count neither running requests nor tokens (Triton) still
                # count the requests they finish.
                f"or\nclamp(sum {bt} (rate({self.s('inference_e2e_request_latency_seconds_count')}"
                f"[{rate}])) > 0, 1, 1)",
                "1 while the target has traffic (requests running, tokens generated or "
                "requests finished); absent when idle",
            ),
            RecordingRule(
                r.queue_depth,
                f"sum {bt} ({self.s('inference_queue_depth')})",
                "requests waiting in the engine's queue now",
            ),
            RecordingRule(
                r.queue_trend,
                f"sum {bt} (deriv({self.s('inference_queue_depth')}[{trend}]))",
                "queue growth in requests per second (linear regression over the window)",
            ),
            RecordingRule(
                r.queue_wait_share,
                f"sum {bt} (rate({self.s('inference_queue_time_seconds_sum')}[{latency}]))\n"
                f"/\n"
                f"sum {bt} (rate({self.s('inference_e2e_request_latency_seconds_sum')}"
                f"[{latency}]))",
                "share of end-to-end request latency spent waiting in the queue",
            ),
            RecordingRule(
                r.tokenizer_median,
                f"histogram_quantile(0.5, sum by ({', '.join((*self.join, 'le'))}) "
                f"(rate({self.s('inference_tokenizer_latency_seconds_bucket', PROBE)}"
                f"[{latency}])))",
                "median latency of the tokenizer probe (~512-token prompt), seconds",
                group=LATENCY_GROUP,
            ),
            RecordingRule(
                r.inter_token_median,
                f"histogram_quantile(0.5, sum by ({', '.join((*self.join, 'le'))}) "
                f"(rate({self.s('inference_inter_token_latency_seconds_bucket')}[{latency}])))",
                "median inter-token latency (one decode step as a request sees it), seconds",
                group=LATENCY_GROUP,
            ),
            RecordingRule(
                r.hottest_thread,
                f"max {bt} (avg_over_time("
                f"{self.s('inference_engine_hottest_thread_cpu_ratio')}[{rate}]))",
                "CPU share of the engine's busiest thread (1 = one full core)",
            ),
            RecordingRule(
                r.softirq_share,
                f"sum {bt} (rate({self.s('inference_cpu_seconds_total', SOFTIRQ)}"
                f"[{rate}]))\n/\n"
                f"sum {bt} (rate({self.s('inference_cpu_seconds_total')}[{rate}]))",
                "softirq share of all CPU time of the node",
            ),
            RecordingRule(
                r.softirq_hottest_core,
                f"max {bt} (avg_over_time("
                f"{self.s('inference_cpu_softirq_hottest_core_ratio')}[{rate}]))",
                "softirq share of the node's busiest core",
            ),
            RecordingRule(
                r.kv_cache,
                f"max {bt} ({self.s('inference_kv_cache_usage_ratio')})",
                "KV-cache usage (0-1) where the engine reports it",
            ),
        ]

    def sidecar_gpu(self) -> list[RecordingRule]:
        """GPU records from the sidecar's NVML collector."""
        cfg, r, bt, bg = self.cfg, self.r, self.by_target, self.by_gpu
        rate = duration(cfg.window("rate"))
        pulse = duration(cfg.window("pulsing"))
        xid = duration(cfg.window("xid"))
        idle = num(cfg.ratio("InferenceGPUUtilizationPulsing", "idle_sample_at_most"))
        busy = num(cfg.ratio("InferenceGPUUtilizationPulsing", "busy_sample_above"))
        reasons = regex_alternatives(cfg.names("InferenceGPUThrottled", "reasons"))
        samples = "inference_gpu_utilization_samples"
        idle_bucket = self.s(f"{samples}_bucket", f'le="{idle}"')
        busy_bucket = self.s(f"{samples}_bucket", f'le="{busy}"')
        throttled = self.s("inference_gpu_clock_event_active", f'reason=~"{reasons}"')
        xids = self.s("inference_gpu_xid_errors_total")
        by_xid = by((*self.join, *GPU_LABELS, "xid"))
        return [
            RecordingRule(
                r.gpu_utilization,
                f"avg {bt} (rate({self.s('inference_gpu_busy_seconds_total')}[{rate}]))",
                "mean GPU utilisation (0-1) over the target's GPUs, from every driver sample",
            ),
            RecordingRule(
                r.utilization_samples,
                f"sum {bt} (increase({self.s(samples + '_count')}[{pulse}]))",
                "driver utilisation samples in the window, the two shares' denominator",
            ),
            RecordingRule(
                r.idle_samples,
                f"sum {bt} (increase({idle_bucket}[{pulse}]))\n/\n{r.utilization_samples}",
                f"share of driver utilisation samples at or below {idle}",
            ),
            RecordingRule(
                r.busy_samples,
                f"1 - (\nsum {bt} (increase({busy_bucket}[{pulse}]))\n/\n"
                f"{r.utilization_samples}\n)",
                f"share of driver utilisation samples above {busy}",
            ),
            RecordingRule(
                r.hbm_bandwidth,
                f"avg {bt} (rate({self.s('inference_gpu_dram_active_seconds_total')}[{rate}]))",
                "mean HBM bandwidth utilisation (0-1) over the target's GPUs (GPM, Hopper+)",
            ),
            RecordingRule(
                r.sm_active,
                f"avg {bt} (avg_over_time({self.s('inference_gpu_sm_active_ratio')}[{rate}]))",
                "mean share of time the SMs had a warp resident (0-1) over the target's GPUs "
                "(GPM, Hopper+)",
            ),
            RecordingRule(
                r.memory_used,
                f"max {bg} (\n{self.s('inference_gpu_memory_used_bytes')}\n/\n"
                f"{self.s('inference_gpu_memory_total_bytes')}\n)",
                "framebuffer used / total per GPU",
            ),
            RecordingRule(
                r.xid_new,
                f"sum {by_xid} (increase({xids}[{xid}]) > 0 and {xids} offset {xid})\n"
                f"or\n(\n"
                f"sum {by_xid} ({xids} unless {xids} offset {xid})\n"
                f"and {on(self.join)}\n{self.history_of(cfg.window('xid'))}\n)",
                "Xid errors in the window per GPU and Xid: the increase of a counter that "
                "existed a window ago; a counter that appeared within the window counts whole "
                "(its first increment is invisible to Prometheus' increase()), once the target "
                "has a window of history (before, every old counter would look new). "
                "MetricsQL's increase() counts a counter that starts with a small value whole "
                "by itself; the offset keeps both engines to the same rule",
                window=0.0,
            ),
            RecordingRule(
                r.clock_events,
                f"max {by((*self.join, *GPU_LABELS, 'reason'))} ({throttled} > 0)",
                "1 per GPU and reason while a hardware or thermal clock event reason holds "
                "the clocks down; absent otherwise (a fleet writes what is throttled, not a "
                "zero per GPU and reason)",
            ),
        ]

    def held_down(self, per_gpu: str) -> str:
        """``per_gpu`` only for the GPUs with a clock event reason active: the throttling
        alert's evidence, one series per throttled GPU instead of one per GPU (filtered before
        any aggregation, so a healthy fleet costs one set lookup per GPU)."""
        return f"{per_gpu}\nand {on((*self.join, *GPU_LABELS))}\n{self.r.clock_events}"

    def dcgm_gpu_rules(self) -> list[RecordingRule]:
        """GPU records from dcgm-exporter."""
        cfg, r, bt = self.cfg, self.r, self.by_target
        rate = duration(cfg.window("rate"))
        pulse = duration(cfg.window("pulsing"))
        xid = duration(cfg.window("xid"))
        idle = num(100 * cfg.ratio("InferenceGPUUtilizationPulsing", "idle_sample_at_most"))
        busy = num(100 * cfg.ratio("InferenceGPUUtilizationPulsing", "busy_sample_above"))
        util = self.d("DCGM_FI_DEV_GPU_UTIL")
        used, free = self.d("DCGM_FI_DEV_FB_USED"), self.d("DCGM_FI_DEV_FB_FREE")
        last = self.d("DCGM_FI_DEV_XID_ERRORS")
        any_last = selector("DCGM_FI_DEV_XID_ERRORS", cfg.selectors.dcgm)
        # DCGM 3.3 renamed the field; accept either name.
        reasons_metric = self.d(
            "", '__name__=~"DCGM_FI_DEV_CLOCK_THROTTLE_REASONS|DCGM_FI_DEV_CLOCKS_EVENT_REASONS"'
        )
        critical = cfg.ints("InferenceGPUXidErrors", "critical_xids")
        xid_rules = [
            f'label_replace(clamp({r.dcgm_xid_changed} == {code}, 1, 1), "xid", "{code}", "", "")'
            for code in critical
        ]
        others = " or ".join(f"{r.dcgm_xid_changed} == {code}" for code in critical)
        xid_rules.append(
            "label_replace(\nlabel_replace(\n"
            f"clamp({r.dcgm_xid_changed}, 1, 1) unless ({others}),\n"
            '"xid", "other", "", ""\n),\n"xid", "$1", "err_code", "(.+)"\n)'
        )
        reasons = cfg.names("InferenceGPUThrottled", "reasons")
        reason_rules = [
            f"label_replace(floor({r.dcgm_clock_reasons} / {CLOCK_EVENT_BITS[name]}) % 2 == 1, "
            f'"reason", "{name}", "", "")'
            for name in reasons
        ]
        return [
            RecordingRule(
                r.gpu_utilization,
                self.dcgm_target(f"avg_over_time({util}[{rate}]) / 100"),
                "mean GPU utilisation (0-1) over the pod's GPUs (DCGM_FI_DEV_GPU_UTIL, %)",
            ),
            RecordingRule(
                r.dcgm_idle_sample,
                self.dcgm_gpu(f"{util} <= bool {idle}"),
                f"1 when a GPU's latest utilisation reading is at or below {idle} %",
            ),
            RecordingRule(
                r.dcgm_busy_sample,
                self.dcgm_gpu(f"{util} > bool {busy}"),
                f"1 when a GPU's latest utilisation reading is above {busy} %",
            ),
            RecordingRule(
                r.idle_samples,
                f"avg {bt} (avg_over_time({r.dcgm_idle_sample}[{pulse}]))",
                f"share of utilisation readings at or below {idle} % (one per evaluation)",
            ),
            RecordingRule(
                r.busy_samples,
                f"avg {bt} (avg_over_time({r.dcgm_busy_sample}[{pulse}]))",
                f"share of utilisation readings above {busy} % (one per evaluation)",
            ),
            RecordingRule(
                r.hbm_bandwidth,
                self.dcgm_target(f"avg_over_time({self.d('DCGM_FI_PROF_DRAM_ACTIVE')}[{rate}])"),
                "mean DRAM-interface activity (0-1) over the pod's GPUs "
                "(DCGM_FI_PROF_DRAM_ACTIVE, a profiling field)",
            ),
            RecordingRule(
                r.sm_active,
                self.dcgm_target(f"avg_over_time({self.d('DCGM_FI_PROF_SM_ACTIVE')}[{rate}])"),
                "mean share of time the SMs had a warp resident (0-1) over the pod's GPUs "
                "(DCGM_FI_PROF_SM_ACTIVE, a profiling field)",
            ),
            RecordingRule(
                r.memory_used,
                self.dcgm_gpu(f"{used} / ({used} + {free})"),
                "framebuffer used / (used + free) per GPU (DCGM_FI_DEV_FB_USED, _FB_FREE, MiB)",
            ),
            RecordingRule(
                r.dcgm_xid_changed,
                self.dcgm_gpu(
                    f"({last} != 0)\nand\n(\nchanges({last}[{xid}]) > 0\nor\n"
                    f"({last} unless {last} offset {xid})\nand on (UUID)\n"
                    f"group by (UUID) ({any_last} offset {xid})\n)",
                    keep=("err_code",),
                ),
                "the last Xid of a GPU (DCGM_FI_DEV_XID_ERRORS) where it changed, or appeared "
                "in the window while the GPU was already reported a window ago (before, every "
                "old Xid would look new)",
                window=0.0,
            ),
            RecordingRule(
                r.xid_new,
                "max without (err_code) (\n" + "\nor\n".join(xid_rules) + "\n)",
                "1 per GPU and Xid with a new Xid in the window (DCGM keeps only the last "
                "Xid, so repeats of the same Xid are not counted)",
            ),
            RecordingRule(
                r.dcgm_clock_reasons,
                self.dcgm_gpu(reasons_metric),
                "clock event reason bitmask per GPU (DCGM_FI_DEV_CLOCKS_EVENT_REASONS, "
                "formerly _CLOCK_THROTTLE_REASONS; not in dcgm-exporter's default counters)",
            ),
            RecordingRule(
                r.clock_events,
                "\nor\n".join(reason_rules),
                "1 per GPU and reason while a hardware or thermal clock event reason holds "
                "the clocks down",
            ),
            RecordingRule(
                r.temperature,
                self.held_down(self.dcgm_gpu(self.d("DCGM_FI_DEV_GPU_TEMP"))),
                "GPU die temperature of the GPUs whose clocks are held down (DCGM_FI_DEV_GPU_TEMP)",
            ),
            RecordingRule(
                r.sm_clock,
                self.held_down(self.dcgm_gpu(f"{self.d('DCGM_FI_DEV_SM_CLOCK')} * 1000000")),
                "current SM clock of the GPUs whose clocks are held down "
                "(DCGM_FI_DEV_SM_CLOCK, MHz)",
            ),
        ]

    def roofline(self) -> list[RecordingRule]:
        """How far each served model is from its hardware limit, and where its requests' time
        goes (docs/roofline.md): one series per target and ``model``.

        The GPU peaks are the sidecar's in every profile (dcgm-exporter reports none); the
        model facts (``--model.path``) and the engine's figures are per GPU of the engine, so
        they set against one GPU's peak: the target's slowest GPU (``min``), which sets the
        pace of a tensor-parallel step.
        """
        r = self.r
        lat = duration(self.cfg.window("latency"))
        bt = self.by_target
        precision = f'precision="{PREFILL_PRECISION}"'
        bm = by((*self.join, "model"))
        om = on((*self.join, "model"))
        to_target = f"{on(self.join)} group_left ()"

        def most(metric: str) -> str:
            return f"max {bm} ({self.s(metric)})"

        def rate(metric: str) -> str:
            return f"sum {bm} (rate({self.s(metric)}[{lat}]))"

        def mean(metric: str) -> str:
            return f"sum {bm} (avg_over_time({self.s(metric)}[{lat}]))"

        peak_bandwidth = (
            f"min {bt} ({self.s('inference_gpu_peak_memory_bandwidth_bytes_per_second')})"
        )
        peak_flops = f"min {bt} ({self.s('inference_gpu_peak_flops', precision)})"
        if self.cfg.profile.source == "dcgm":
            # The sidecar's own figures where its nvml collector runs; else the product table's
            # by the name dcgm-exporter gives each GPU.
            peak_bandwidth += f"\nor\n{self.product_peak(lambda p: p.memory_bandwidth)}"
            peak_flops += f"\nor\n{self.product_peak(lambda p: p.flops.get(PREFILL_PRECISION))}"
        e2e = rate("inference_e2e_request_latency_seconds_sum")
        requests = rate("inference_e2e_request_latency_seconds_count")
        prompt = rate("inference_prompt_tokens_total")
        cached = rate("inference_prompt_tokens_cached_total")

        def share(metric: str) -> str:
            return f"{rate(metric)}\n/\n({e2e} > 0)"

        return [
            RecordingRule(
                r.peak_bandwidth,
                peak_bandwidth,
                "theoretical peak HBM bandwidth of the target's slowest GPU, bytes per second",
            ),
            RecordingRule(
                r.peak_flops,
                peak_flops,
                f"dense {PREFILL_PRECISION} tensor peak of the target's slowest GPU, FLOP per "
                "second",
            ),
            RecordingRule(
                r.kv_cache_bytes,
                f"max {bm} (avg_over_time({self.s('inference_kv_cache_usage_ratio')}[{lat}]))\n"
                f"* {om}\n{most('inference_kv_cache_capacity_tokens')}\n"
                f"* {om}\n{most('inference_model_kv_cache_bytes_per_token')}",
                "live KV-cache bytes one GPU of the engine reads per decode step: usage x "
                "capacity (tokens) x bytes per token on one GPU, mean over the window",
            ),
            RecordingRule(
                r.decode_floor,
                f"(\n{most('inference_model_weight_bytes')}\n+ {om}\n{r.kv_cache_bytes}\n)\n"
                f"/ {to_target}\n{r.peak_bandwidth}",
                "the HBM floor of one decode step: (weight bytes + live KV bytes) / peak "
                "bandwidth, seconds",
            ),
            RecordingRule(
                r.inter_token_mean,
                f"{rate('inference_inter_token_latency_seconds_sum')}\n/\n"
                f"({rate('inference_inter_token_latency_seconds_count')} > 0)",
                "mean inter-token latency, the decode step a request sees, seconds",
            ),
            RecordingRule(
                r.decode_efficiency,
                f"(\n{r.decode_floor}\n/\n{r.inter_token_mean}\n)\nor\n(\n"
                f"({rate('inference_estimated_read_bytes_total')} > 0)\n"
                f"/ {to_target}\n{r.peak_bandwidth}\n)",
                "decode roofline efficiency (0-1): the HBM floor of a step / the mean "
                "inter-token latency; without the model facts, the engine's estimated read "
                "bytes per second / peak bandwidth (a time average: idle time reads low)",
            ),
            RecordingRule(
                r.roofline_tokens,
                f"{mean('inference_requests_running')}\n/\n{r.decode_floor}",
                "tokens per second the running batch would generate with every step at its "
                "HBM floor (mean requests running / floor)",
            ),
            RecordingRule(
                r.roofline_throughput,
                f"{rate('inference_generation_tokens_total')}\n/\n({r.roofline_tokens} > 0)",
                "generated tokens per second as a share of the roofline's at the current batch",
            ),
            RecordingRule(
                r.prefill_efficiency,
                f"{most('inference_model_flops_per_token')}\n* {om}\n"
                f"(\n{prompt}\n-\n({cached}\nor\n0 * {prompt})\n)\n"
                f"/ {om}\n({rate('inference_prefill_time_seconds_sum')} > 0)\n"
                f"/ {to_target}\n{r.peak_flops}",
                "prefill compute efficiency (0-1): FLOPs of the prompt tokens computed (cached "
                "ones left out) per second of prefill / the tensor peak; prompts prefilled "
                "together are each charged the whole step, so it reads low for batched prefills",
            ),
            RecordingRule(
                r.e2e_mean,
                f"{e2e}\n/\n({requests} > 0)",
                "mean end-to-end request latency, seconds",
            ),
            RecordingRule(
                r.budget_queue,
                share("inference_queue_time_seconds_sum"),
                "latency budget: share of end-to-end latency waiting in the engine's queue",
            ),
            RecordingRule(
                r.budget_prefill,
                share("inference_prefill_time_seconds_sum"),
                "latency budget: share of end-to-end latency in prefill",
            ),
            RecordingRule(
                r.budget_decode,
                share("inference_decode_time_seconds_sum"),
                "latency budget: share of end-to-end latency in decode",
            ),
            RecordingRule(
                r.budget_host,
                f"1 - (\n{r.budget_queue}\n+\n{r.budget_prefill}\n+\n{r.budget_decode}\n)",
                "latency budget: share of end-to-end latency outside queue, prefill and decode "
                "(tokenize, detokenize, post-processing, streaming on the host)",
            ),
            RecordingRule(
                r.prompt_tokens,
                f"{prompt}\n/\n({requests} > 0)",
                "workload shape: mean prompt tokens per finished request",
            ),
            RecordingRule(
                r.output_tokens,
                f"{rate('inference_generation_tokens_total')}\n/\n({requests} > 0)",
                "workload shape: mean generated tokens per finished request",
            ),
        ]

    def product_peak(self, figure: Callable[[Peaks], float | None]) -> str:
        """The slowest GPU of each target from dcgm-exporter's ``modelName`` and the product
        table (:data:`exporter.hardware.gpus.PRODUCTS`, the sidecar's own fallback): one
        constant per figure over the GPUs of the products that have it."""
        names: dict[float, list[str]] = {}
        for name in PRODUCTS:
            value = figure(peaks_of(name, GpuFacts()))
            if value:
                names.setdefault(value, []).append(name)
        keep = by((*self.cfg.dcgm.dcgm_labels, "UUID"))
        gpus = [
            f"{num(value)} * group {keep} "
            f"({self.d('DCGM_FI_DEV_GPU_UTIL', self.product_matcher(products))})"
            for value, products in sorted(names.items())
        ]
        return self.dcgm_target("(\n" + "\nor\n".join(gpus) + "\n)", "min")

    @staticmethod
    def product_matcher(products: Sequence[str]) -> str:
        """``modelName`` as NVML names the products, in any case and spacing. Prometheus
        anchors the regex; a metacharacter goes in a class, not behind a backslash, which a
        PromQL string would take as its own escape."""
        alternatives = "|".join(
            "".join(f"[{c}]" if c in _REGEX_META else c for c in name).replace(" ", " +")
            for name in products
        )
        return f'modelName=~"(?i){alternatives}"'
