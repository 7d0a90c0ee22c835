"""Recording rules: the signals the signatures read, filled by each profile from its source.

Every record is named ``level:metric:operation``. Level ``inference`` has one series per
scrape target of the sidecar (the join labels); level ``inference_gpu`` adds ``gpu`` and
``uuid``. The alert expressions only ever read these names, so a profile can swap where a
signal comes from (the sidecar's NVML collector or dcgm-exporter) without touching them.

dcgm-exporter series belong to the GPU's pod (``namespace``, ``pod``) but not to the
sidecar's scrape target (their ``instance`` and ``job`` are dcgm-exporter's). They are
aggregated by the dcgm join labels and then given the target's remaining join labels from
``inference:exporter_build_info:group``, one series per sidecar target.
"""

from __future__ import annotations

from dataclasses import dataclass

from exporter.config import format_duration as duration
from exporter.signatures.config import SiteConfig
from exporter.signatures.model import RecordingRule
from exporter.signatures.params import CLOCK_EVENT_BITS
from exporter.signatures.promql import by, num, on, regex_alternatives, selector

GPU_LABELS = ("gpu", "uuid")
PROBE = 'source="probe"'
SOFTIRQ = 'mode="softirq"'
DCGM_REQUIRED = ("namespace", "pod")


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
            temperature="inference_gpu:temperature_celsius:max",
            sm_clock="inference_gpu:sm_clock_hertz:max",
            dcgm_idle_sample="inference_gpu:gpu_utilization_idle_sample:bool",
            dcgm_busy_sample="inference_gpu:gpu_utilization_busy_sample:bool",
            dcgm_xid_changed=f"inference_gpu:dcgm_xid_errors_last:changed{xid}",
            dcgm_clock_reasons="inference_gpu:dcgm_clock_event_reasons:max",
        )


def recording_rules(cfg: SiteConfig) -> list[RecordingRule]:
    """All recording rules of the configuration's profile, in evaluation order."""
    return _Builder(cfg).rules()


class _Builder:
    def __init__(self, cfg: SiteConfig) -> None:
        self.cfg = cfg
        self.r = Records.of(cfg)
        self.join = cfg.join_labels
        self.by_target = by(self.join)
        self.by_gpu = by((*self.join, *GPU_LABELS))

    # --- selectors ----------------------------------------------------------------------------

    def s(self, metric: str, *extra: str) -> str:
        """A sidecar series selector."""
        return selector(metric, self.cfg.selectors.sidecar, *extra)

    def d(self, metric: str, *extra: str) -> str:
        """A dcgm-exporter series selector: only series attributed to a pod."""
        attributed = [f'{label}!=""' for label in self.cfg.dcgm.dcgm_labels]
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

    def rules(self) -> list[RecordingRule]:
        out = self.common()
        out += self.dcgm_gpu_rules() if self.cfg.profile.source == "dcgm" else self.sidecar_gpu()
        out += self.shared_gpu()
        return out

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
                r.target_info,
                f"group {bt} ({self.s('inference_exporter_build_info')})",
                "1 per sidecar scrape target: the join labels every other record carries",
            ),
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
                f"or\nclamp({r.generation_tokens} > 0, 1, 1)",
                "1 while the target has traffic (requests running or tokens generated); "
                "absent when idle",
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
            ),
            RecordingRule(
                r.inter_token_median,
                f"histogram_quantile(0.5, sum by ({', '.join((*self.join, 'le'))}) "
                f"(rate({self.s('inference_inter_token_latency_seconds_bucket')}[{latency}])))",
                "median inter-token latency (one decode step as a request sees it), seconds",
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
        count = f"sum {bt} (increase({self.s(samples + '_count')}[{pulse}]))"
        xids = self.s("inference_gpu_xid_errors_total")
        by_xid = by((*self.join, *GPU_LABELS, "xid"))
        return [
            RecordingRule(
                r.gpu_utilization,
                f"avg {bt} (rate({self.s('inference_gpu_busy_seconds_total')}[{rate}]))",
                "mean GPU utilisation (0-1) over the target's GPUs, from every driver sample",
            ),
            RecordingRule(
                r.idle_samples,
                f"sum {bt} (increase({idle_bucket}[{pulse}]))\n/\n{count}",
                f"share of driver utilisation samples at or below {idle}",
            ),
            RecordingRule(
                r.busy_samples,
                f"1 - (\nsum {bt} (increase({busy_bucket}[{pulse}]))\n/\n{count}\n)",
                f"share of driver utilisation samples above {busy}",
            ),
            RecordingRule(
                r.hbm_bandwidth,
                f"avg {bt} (rate({self.s('inference_gpu_dram_active_seconds_total')}[{rate}]))",
                "mean HBM bandwidth utilisation (0-1) over the target's GPUs (GPM, Hopper+)",
            ),
            RecordingRule(
                r.memory_used,
                f"max {bg} (\n{self.s('inference_gpu_memory_used_bytes')}\n/\n"
                f"{self.s('inference_gpu_memory_total_bytes')}\n)",
                "framebuffer used / total per GPU",
            ),
            RecordingRule(
                r.xid_new,
                f"sum {by_xid} (increase({xids}[{xid}])) > 0\n"
                f"or\n"
                f"sum {by_xid} ({xids} unless {xids} offset {xid})",
                "Xid errors in the window per GPU and Xid; a counter that appeared within "
                "the window counts whole (its first increment is invisible to increase())",
            ),
            RecordingRule(
                r.clock_events,
                f"max {by((*self.join, *GPU_LABELS, 'reason'))} ({throttled})",
                "1 while a hardware or thermal clock event reason holds the clocks down",
            ),
            RecordingRule(
                r.temperature,
                f"max {bg} ({self.s('inference_gpu_temperature_celsius')})",
                "GPU die temperature",
            ),
            RecordingRule(
                r.sm_clock,
                f"max {bg} ({self.s('inference_gpu_sm_clock_hertz')})",
                "current SM clock",
            ),
        ]

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
                r.memory_used,
                self.dcgm_gpu(f"{used} / ({used} + {free})"),
                "framebuffer used / (used + free) per GPU (DCGM_FI_DEV_FB_USED, _FB_FREE, MiB)",
            ),
            RecordingRule(
                r.dcgm_xid_changed,
                self.dcgm_gpu(
                    f"({last} != 0)\nand\n(changes({last}[{xid}]) > 0 or ({last} unless {last} "
                    f"offset {xid}))",
                    keep=("err_code",),
                ),
                "the last Xid of a GPU (DCGM_FI_DEV_XID_ERRORS) where it changed or appeared "
                "in the window",
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
                self.dcgm_gpu(self.d("DCGM_FI_DEV_GPU_TEMP")),
                "GPU die temperature (DCGM_FI_DEV_GPU_TEMP)",
            ),
            RecordingRule(
                r.sm_clock,
                self.dcgm_gpu(f"{self.d('DCGM_FI_DEV_SM_CLOCK')} * 1000000"),
                "current SM clock (DCGM_FI_DEV_SM_CLOCK, MHz)",
            ),
        ]
