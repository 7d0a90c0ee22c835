"""The signature catalogue: every alert of the pack, built from a :class:`SiteConfig`.

Each builder turns one rule of thumb from the seed articles into an alert: the condition over
the recording rules (:mod:`exporter.signatures.sources`), the evidence it quotes, and the
runbook. Thresholds, windows and ``for`` come from the config, never from literals here, so a
site's config regenerates the whole pack. ``python -m exporter.signatures`` renders it;
``diagnose`` evaluates the same expressions and evidence.
"""

from __future__ import annotations

from collections.abc import Callable

from exporter.config import format_duration as duration
from exporter.signatures.config import SiteConfig
from exporter.signatures.model import (
    TARGET,
    AlertRule,
    Check,
    Evidence,
    Fix,
    Runbook,
    Signature,
)
from exporter.signatures.promql import by, num, on, pct, regex_alternatives, selector
from exporter.signatures.sources import Records

T = TARGET
GPU = ("gpu", "uuid")


class _Ctx:
    """What every builder needs: the config, the record names and small formatters."""

    def __init__(self, cfg: SiteConfig) -> None:
        self.cfg = cfg
        self.r = Records.of(cfg)
        self.join = cfg.join_labels

    def for_(self, alert: str) -> float:
        return self.cfg.seconds(alert, "for")

    def ratio(self, alert: str, name: str) -> float:
        return self.cfg.ratio(alert, name)

    def win(self, name: str) -> str:
        return duration(self.cfg.window(name))

    def s(self, metric: str, *extra: str) -> str:
        return selector(metric, self.cfg.selectors.sidecar, *extra)

    def by(self, *extra: str) -> str:
        return by((*self.join, *extra))


def _percent(key: str, label: str, record: str, fmt: str = "%.0f") -> Evidence:
    return Evidence(key, label, f"100 * {record}{T}", "%", fmt)


# --- CPU side ---------------------------------------------------------------------------------


def gpu_starved_queue_growing(c: _Ctx) -> Signature:
    a = "InferenceGPUStarvedQueueGrowing"
    r = c.r
    util = c.ratio(a, "utilization_below")
    growth = c.ratio(a, "queue_growth_above")
    depth = c.ratio(a, "queue_depth_at_least")
    trend_s = c.cfg.window("queue_trend")
    trend = c.win("queue_trend")
    rule = AlertRule(
        severity="critical",
        expr=(
            f"{r.gpu_utilization} < {num(util)}\n"
            f"and\n{r.queue_trend} > {num(growth / trend_s)}\n"
            f"and\n{r.queue_depth} >= {num(depth)}"
        ),
        for_seconds=c.for_(a),
        summary="GPU starved while the queue grows on {target}",
        description=(
            f"Mean GPU utilisation {{util}} % (below {pct(util)} %) while the queue grew by "
            f"{{growth}} requests in {trend} to {{depth}} waiting: the CPU side (tokenizer, "
            "scheduler, host-to-device copies) cannot feed the GPU, and more GPUs will not help."
        ),
        evidence=(
            _percent("util", "mean GPU utilisation", r.gpu_utilization),
            Evidence(
                "growth",
                f"queue growth over {trend}",
                f"{num(trend_s)} * {r.queue_trend}{T}",
                "requests",
                "%+.0f",
            ),
            Evidence("depth", "requests waiting", f"{r.queue_depth}{T}", "requests"),
        ),
        when=(
            f"mean GPU utilisation < {pct(util)} % and the queue depth trend over {trend} "
            f"> {num(growth)} requests and at least {num(depth)} request waiting"
        ),
    )
    return Signature(
        alert=a,
        group="cpu",
        title="GPU starved while the queue grows",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                "Requests are piling up in the engine's queue, yet the GPU is idle a large part "
                "of the time. A GPU-bound server looks the other way round: the queue grows "
                "only once the GPU is saturated. Here something on the host side - "
                "tokenization, request parsing, batch assembly, the scheduler loop, "
                "synchronous host-to-device copies - delivers work more slowly than the GPU "
                "finishes it. In a typical request the GPU accounts for only 50-70 % of "
                "end-to-end latency; the rest is CPU, network and queueing, and this signature "
                "is the point where the CPU share starts to cap throughput. Adding GPUs "
                "makes it worse: each one is fed even less."
            ),
            queries=(
                (
                    "engine processes' CPU time, per process (a process near 1 core is saturated)",
                    f"rate({c.s('inference_engine_process_cpu_seconds_total')}[{c.win('rate')}])",
                ),
                ("median tokenizer probe latency (ms)", f"1000 * {r.tokenizer_median}"),
                ("median decode step, inter-token latency (ms)", f"1000 * {r.inter_token_median}"),
            ),
            on_node=(
                Check(
                    "py-spy dump --pid $(pgrep -f 'vllm|sglang' | head -1)",
                    "the API server / scheduler thread's stack: time in tokenizer encode, JSON "
                    "parsing, or Python-side batching instead of waiting on CUDA",
                ),
                Check(
                    "py-spy top --pid <engine pid>",
                    "which Python functions hold the GIL; a hot tokenizer or "
                    "detokenizer call is the classic culprit",
                ),
                Check(
                    "pidstat -t -p <engine pid> 1 5",
                    "one thread at ~100 % of a core (GIL-bound) while the others idle",
                ),
                Check(
                    "nvidia-smi dmon -s u -d 1",
                    "sm % dropping to near 0 between bursts: the GPU waits for input",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Use the fast (Rust) tokenizer",
                    "HuggingFace `use_fast=True` / the `tokenizers` library is 5-10x faster "
                    "than the pure-Python tokenizer; check the engine did not fall back to a "
                    "slow one (vLLM logs a warning).",
                ),
                Fix(
                    "hours",
                    "Give the engine more CPU",
                    "raise the pod's CPU request/limit and check it is not CFS-throttled; "
                    "pin the engine away from the cores that handle NIC interrupts.",
                ),
                Fix(
                    "hours",
                    "Move tokenization off the serving event loop",
                    "tokenize in a thread/process pool or a separate front-end process "
                    "(vLLM's multi-process API server, SGLang's tokenizer manager) so the "
                    "loop that schedules GPU work never waits for it.",
                ),
                Fix(
                    "days",
                    "Batch tokenization and make host-to-device copies asynchronous",
                    "tokenize many prompts per call; use pinned host memory and non-blocking "
                    "copies so the GPU never waits on a synchronous transfer.",
                ),
                Fix(
                    "weeks",
                    "Scale out the front-end or disaggregate",
                    "more front-end replicas per GPU, or separate prefill and decode so each "
                    "side is fed and scaled on its own.",
                ),
            ),
        ),
    )


def tokenizer_slower_than_decode(c: _Ctx) -> Signature:
    a = "InferenceTokenizerSlowerThanDecode"
    r = c.r
    factor = c.ratio(a, "decode_step_factor")
    scaled = r.inter_token_median if factor == 1 else f"{num(factor)} * {r.inter_token_median}"
    rule = AlertRule(
        severity="warning",
        expr=f"{r.tokenizer_median} > {scaled}\nand\n{r.traffic}",
        for_seconds=c.for_(a),
        summary="Tokenizer slower than a decode step on {target}",
        description=(
            "Median tokenizer latency {tok} ms (probe, ~512-token prompt) exceeds the median "
            "inter-token latency {itl} ms while the server has traffic: tokenizing one prompt "
            "costs more than one decode step, so the front-end CPU, not the GPU, sets the pace."
        ),
        evidence=(
            Evidence(
                "tok", "median tokenizer latency", f"1000 * {r.tokenizer_median}{T}", "ms", "%.1f"
            ),
            Evidence(
                "itl",
                "median inter-token latency",
                f"1000 * {r.inter_token_median}{T}",
                "ms",
                "%.1f",
            ),
        ),
        when=(
            f"median tokenizer probe latency > {num(factor)} x median inter-token latency, "
            "with traffic"
        ),
    )
    return Signature(
        alert=a,
        group="cpu",
        title="Tokenizer slower than a decode step",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                "The sidecar tokenizes a fixed ~512-token prompt through the engine's own "
                "tokenize endpoint and subtracts the round trip of a 1-token call, so the "
                "number is the tokenizer's CPU time as the engine experiences it. A fast "
                "tokenizer needs about 1.5 ms for 512 tokens on one core; a decode step of a "
                "large model takes tens of milliseconds. When tokenizing a prompt takes longer "
                "than a decode step, every new request costs the front-end more CPU time than "
                "the GPU spends per token, and at high request rates the tokenizer - not the "
                "GPU - limits throughput (1000 requests/s of 512 tokens need about 1.5 "
                "core-seconds per second even with the fast tokenizer)."
            ),
            queries=(
                (
                    "probe round trip of a 1-token call (front-end/event-loop latency), ms",
                    f"1000 * histogram_quantile(0.5, sum {c.by('le')} "
                    f"(rate({c.s('inference_tokenizer_probe_rtt_seconds_bucket')}"
                    f"[{c.win('latency')}])))",
                ),
                (
                    "probe failures",
                    f"rate({c.s('inference_tokenizer_probe_failures_total')}[{c.win('rate')}])",
                ),
            ),
            on_node=(
                Check(
                    "py-spy dump --pid <engine front-end pid>",
                    "threads inside tokenizer encode (transformers tokenization_utils, "
                    "sentencepiece) rather than the scheduler",
                ),
                Check(
                    'python -c "from transformers import AutoTokenizer as T; '
                    "print(T.from_pretrained('<model>').is_fast)\"",
                    "False means the slow pure-Python tokenizer is in use",
                ),
                Check(
                    "top -H -p <engine pid>",
                    "a tokenizer or API-server thread pinned near 100 %",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Switch to the fast tokenizer",
                    "install `tokenizers`, ship `tokenizer.json` with the model, and make sure "
                    "the engine does not force `use_fast=False` (5-10x faster).",
                ),
                Fix(
                    "hours",
                    "Cache and batch",
                    "chat templates and system prompts repeat: cache their token ids; tokenize "
                    "requests in batches, which uses the Rust tokenizer's parallelism.",
                ),
                Fix(
                    "days",
                    "Tokenize outside the serving loop",
                    "a process pool (threads do not help against the GIL with slow tokenizers) "
                    "or a separate tokenizer service / client-side tokenization.",
                ),
            ),
            caveats=(
                "The probe measures a ~512-token prompt; if your prompts are much longer, real "
                "tokenization costs more than the probe shows.",
            ),
        ),
    )


def frontend_cpu_saturated(c: _Ctx) -> Signature:
    a = "InferenceFrontendCPUSaturated"
    r = c.r
    hot = c.ratio(a, "hottest_thread_above")
    util = c.ratio(a, "utilization_below")
    rule = AlertRule(
        severity="warning",
        expr=f"{r.hottest_thread} > {num(hot)}\nand\n{r.gpu_utilization} < {num(util)}",
        for_seconds=c.for_(a),
        summary="Engine front-end thread saturated on {target}",
        description=(
            f"The busiest engine thread uses {{thread}} % of a core (threshold {pct(hot)} %) "
            f"while mean GPU utilisation is {{util}} % (below {pct(util)} %): a single "
            "GIL-bound thread (HTTP handling, tokenization, scheduling) caps throughput "
            "however many cores the node has."
        ),
        evidence=(
            _percent("thread", "busiest engine thread, share of one core", r.hottest_thread),
            _percent("util", "mean GPU utilisation", r.gpu_utilization),
        ),
        when=(
            f"busiest engine thread > {pct(hot)} % of a core and mean GPU utilisation "
            f"< {pct(util)} %"
        ),
    )
    return Signature(
        alert=a,
        group="cpu",
        title="GIL-bound engine front-end",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                "Python engines run their API server, detokenizer and often the scheduler in "
                "one interpreter; only one thread holds the GIL at a time. When the busiest "
                "thread sits near a full core while the GPU is under-used, adding cores does "
                "nothing: that one thread is the bottleneck. Node-wide CPU graphs hide it "
                "(one saturated thread is 1 % of a 96-core node)."
            ),
            queries=(
                (
                    "CPU of each engine process (cores)",
                    f"rate({c.s('inference_engine_process_cpu_seconds_total')}[{c.win('rate')}])",
                ),
            ),
            on_node=(
                Check(
                    "top -H -p <engine pid>",
                    "one thread at 95-100 % while its siblings idle",
                ),
                Check(
                    "py-spy dump --pid <engine pid>",
                    "what that thread runs: request parsing, detokenization, logits "
                    "processing, Python-side sampling",
                ),
                Check(
                    "py-spy record -o flame.svg --pid <engine pid> --duration 30",
                    "a flame graph of the hot thread to find the dominant Python function",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Turn off per-request Python work",
                    "disable request logging / verbose stats, logprobs and guided decoding "
                    "where not needed; they run in the hot thread.",
                ),
                Fix(
                    "hours",
                    "Run the API server in separate processes",
                    "engines that support it (e.g. vLLM's multi-process front-end, several API "
                    "server processes) move HTTP and tokenization out of the scheduler's "
                    "process.",
                ),
                Fix(
                    "days",
                    "Continuous batching and fewer, larger steps",
                    "fewer scheduler iterations per generated token means less Python per "
                    "token; raise max batched tokens if memory allows.",
                ),
                Fix(
                    "weeks",
                    "Scale out",
                    "more engine replicas with smaller GPU slices, each with its own front-end "
                    "thread.",
                ),
            ),
        ),
    )


# --- network ----------------------------------------------------------------------------------


def softirq_cpu_high(c: _Ctx) -> Signature:
    a = "InferenceSoftirqCPUHigh"
    r = c.r
    node = c.ratio(a, "node_share_above")
    core = c.ratio(a, "hottest_core_above")
    rule = AlertRule(
        severity="warning",
        expr=f"{r.softirq_share} > {num(node)}\nor\n{r.softirq_hottest_core} > {num(core)}",
        for_seconds=c.for_(a),
        summary="Softirq load high on the node of {target}",
        description=(
            f"Softirq takes {{node}} % of the node's CPU time (threshold {pct(node)} %) and "
            f"{{core}} % of its busiest core (threshold {pct(core)} %): interrupt handling, "
            "usually NET_RX for request and streaming traffic, eats the CPU that tokenizes and "
            "schedules for the GPU."
        ),
        evidence=(
            _percent("node", "softirq share of node CPU", r.softirq_share, "%.1f"),
            _percent("core", "softirq share of the busiest core", r.softirq_hottest_core),
        ),
        when=(f"softirq > {pct(node)} % of node CPU time, or > {pct(core)} % of the busiest core"),
    )
    return Signature(
        alert=a,
        group="network",
        title="Softirq load steals CPU from the GPU's feeders",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                "Softirq time is the kernel processing deferred interrupt work - mostly "
                "packets (NET_RX/NET_TX), also block I/O and timers. Above about 5 % of all "
                "CPU time (the `si` column of `top`) the network stack competes with the "
                "engine's front-end for CPU. The node average often looks harmless while one "
                "core, the one the NIC queue's interrupts are pinned to, spends most of its "
                "time in softirq; any engine thread scheduled there crawls."
            ),
            queries=(
                (
                    "softirq invocations per second by vector",
                    f"rate({c.s('inference_softirqs_total')}[{c.win('rate')}])",
                ),
            ),
            on_node=(
                Check(
                    "mpstat -I SUM -P ALL 1 5",
                    "interrupts per second per CPU; with `mpstat -P ALL 1` the %soft column "
                    "shows the core that drowns",
                ),
                Check(
                    "watch -d -n1 cat /proc/softirqs",
                    "which vector grows fastest (NET_RX, NET_TX) and on which CPU",
                ),
                Check(
                    "grep -E 'mlx|eth|ens|virtio' /proc/interrupts",
                    "NIC queue interrupts all landing on one or two CPUs",
                ),
                Check(
                    "ethtool -l <iface>; cat /sys/class/net/<iface>/queues/rx-*/rps_cpus",
                    "too few RX queues, and RPS disabled (all zeros)",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Spread NIC interrupts",
                    "run irqbalance, or set `/proc/irq/<n>/smp_affinity` so queue interrupts "
                    "use several cores away from the engine's cores.",
                ),
                Fix(
                    "hours",
                    "Enable RPS/RFS and more RX queues",
                    "`ethtool -L <iface> combined <n>`; write a CPU mask to `rps_cpus` to "
                    "spread receive processing in software.",
                ),
                Fix(
                    "days",
                    "Cut packet rates",
                    "coalesce streamed tokens into fewer SSE chunks, enable compression and "
                    "keep-alive at the gateway, and use interrupt coalescing (`ethtool -C`).",
                ),
                Fix(
                    "weeks",
                    "Offload",
                    "SR-IOV/RDMA NICs, or move TLS termination and the gateway off the GPU node.",
                ),
            ),
            caveats=(
                "Softirq figures are node-wide: every inference pod on the node reports the same "
                "values, so the alert fires once per pod of a busy node.",
            ),
        ),
    )


# --- memory -----------------------------------------------------------------------------------


def hbm_bandwidth_saturated(c: _Ctx) -> Signature:
    a = "InferenceHBMBandwidthSaturated"
    r = c.r
    bw = c.ratio(a, "bandwidth_above")
    drop = c.ratio(a, "per_request_drop_above")
    base = c.win("baseline")
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{r.hbm_bandwidth} > {num(bw)}\n"
            f"and\n{r.tokens_per_request} < {num(round(1 - drop, 9))} * "
            f"({r.tokens_per_request} offset {base})"
        ),
        for_seconds=c.for_(a),
        summary="HBM bandwidth saturated, decode slowing on {target}",
        description=(
            f"HBM bandwidth utilisation {{bw}} % (threshold {pct(bw)} %) while generation "
            f"speed per running request fell to {{now}} tokens/s from {{before}} tokens/s "
            f"{base} earlier, with {{running}} requests running: decode is memory-bound and "
            "more concurrent decodes only split the same bandwidth."
        ),
        evidence=(
            _percent("bw", "HBM bandwidth utilisation", r.hbm_bandwidth),
            Evidence(
                "now",
                "tokens/s per running request",
                f"{r.tokens_per_request}{T}",
                "tokens/s",
                "%.1f",
            ),
            Evidence(
                "before",
                f"tokens/s per running request {base} earlier",
                f"{r.tokens_per_request}{T} offset {base}",
                "tokens/s",
                "%.1f",
            ),
            Evidence("running", "requests running", f"{r.requests_running}{T}", "requests"),
        ),
        when=(
            f"HBM bandwidth utilisation > {pct(bw)} % and tokens/s per running request more "
            f"than {pct(drop)} % below its value {base} earlier"
        ),
    )
    return Signature(
        alert=a,
        group="memory",
        title="HBM bandwidth wall: too many concurrent decodes",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                "Decode is memory-bound: every step reads all weights plus the KV cache of "
                "every running sequence from HBM while doing little arithmetic on it (a 70B "
                "model in FP16 reads about 140 GB of weights per step; at 2 TB/s that alone "
                "is ~70 ms). Once the memory bandwidth is saturated, admitting more "
                "concurrent requests no longer raises total throughput much - each request "
                "just gets slower, and per-token latency (ITL) climbs. High GPU utilisation "
                "with falling tokens/s per request is the symptom; the GPU is busy waiting "
                "for memory, not computing."
            ),
            queries=(
                (
                    "total generation throughput (tokens/s): flat while concurrency rises",
                    r.generation_tokens,
                ),
                ("requests running", r.requests_running),
                ("median inter-token latency (ms)", f"1000 * {r.inter_token_median}"),
            ),
            on_node=(
                Check(
                    "nvidia-smi dmon -s um -d 1",
                    "sm % high and mem % (memory controller) pinned near 100",
                ),
                Check(
                    "dcgmi dmon -e 1005,1002 -d 1000",
                    "DRAM active (1005) near 1 with SM active (1002) well below",
                ),
                Check(
                    "ncu --metrics dram__throughput.avg.pct_of_peak_sustained_elapsed "
                    "--target-processes all -c 20 <cmd>",
                    "(staging only) decode kernels at >90 % of peak DRAM throughput",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Cap concurrency",
                    "lower max concurrent sequences (vLLM `--max-num-seqs`, SGLang "
                    "`--max-running-requests`) to the knee where tokens/s stops rising; "
                    "per-request speed recovers, total throughput barely moves.",
                ),
                Fix(
                    "hours",
                    "Quantise the KV cache",
                    "FP8 KV cache halves the bytes each decode step reads per sequence.",
                ),
                Fix(
                    "days",
                    "Quantise the weights",
                    "AWQ/GPTQ W4A16 or FP8 weights cut the per-step weight read 2-4x; "
                    "validate quality on your own data.",
                ),
                Fix(
                    "weeks",
                    "Split the model or scale out",
                    "tensor parallelism across more GPUs adds their bandwidth; "
                    "disaggregated decode instances on high-bandwidth GPUs; more replicas.",
                ),
            ),
            caveats=(
                "The sidecar profile needs GPM (Hopper or newer) for HBM bandwidth; on older "
                "GPUs the record is absent and this alert cannot fire. The dcgm profile uses "
                "DCGM_FI_PROF_DRAM_ACTIVE, a profiling field that must be enabled in "
                "dcgm-exporter's counters.",
                f"The comparison needs {base} of history; it cannot fire during the first "
                f"{base} after a target appears.",
            ),
        ),
    )


def gpu_memory_headroom_low(c: _Ctx) -> Signature:
    a = "InferenceGPUMemoryHeadroomLow"
    r = c.r
    kv = c.ratio(a, "kv_cache_above")
    fb = c.ratio(a, "framebuffer_above")
    engines = regex_alternatives(c.cfg.names(a, "preallocating_engines"))
    preallocating = c.s("inference_engine_up", f'engine=~"{engines}"')
    kv_rule = AlertRule(
        severity="warning",
        expr=f"{r.kv_cache} > {num(kv)}",
        for_seconds=c.for_(a),
        summary="KV cache nearly full on {target}",
        description=(
            f"KV cache {{kv}} % full (threshold {pct(kv)} %): the engine is about to stop "
            "admitting, queue or preempt (recompute or swap) requests; keep 10-15 % headroom."
        ),
        evidence=(_percent("kv", "KV-cache usage", r.kv_cache),),
        when=f"KV-cache usage > {pct(kv)} % (engines that report it)",
        labels=(("condition", "kv_cache"),),
    )
    fb_rule = AlertRule(
        severity="warning",
        expr=(
            f"{r.memory_used} > {num(fb)}\n"
            f"unless {on(c.join)}\n(\n{r.kv_cache}\nor\n"
            f"group {by(c.join)} ({preallocating})\n)"
        ),
        for_seconds=c.for_(a),
        summary="GPU {labels.gpu} framebuffer nearly full on {target}",
        description=(
            f"GPU {{labels.gpu}} framebuffer {{fb}} % used (threshold {pct(fb)} %) and the "
            "engine reports no KV-cache usage: the next allocation may fail with CUDA out "
            "of memory."
        ),
        scope=("gpu", "uuid"),
        evidence=(_percent("fb", "framebuffer used", r.memory_used),),
        when=(
            f"framebuffer used/total > {pct(fb)} % on a GPU whose engine reports no KV-cache "
            f"usage and is not one that pre-allocates ({engines.replace('|', ', ')})"
        ),
        labels=(("condition", "framebuffer"),),
    )
    return Signature(
        alert=a,
        group="memory",
        title="GPU memory headroom low",
        rules=(kv_rule, fb_rule),
        runbook=Runbook(
            meaning=(
                "Over-committing GPU memory is worse than under-using it: when the KV cache "
                "fills up the engine stops admitting requests, preempts running ones "
                "(recomputing or swapping their KV blocks over PCIe) and latency jumps; when "
                "the framebuffer itself is exhausted, the next allocation fails with CUDA out "
                "of memory and the process dies. Keep a 10-15 % safety margin on the KV "
                "cache."
            ),
            queries=(
                ("requests waiting (preempted requests return to the queue)", r.queue_depth),
                (
                    "engine of each target (pre-allocating engines skip the framebuffer rule)",
                    c.s("inference_engine_up"),
                ),
            ),
            on_node=(
                Check(
                    "nvidia-smi --query-gpu=index,memory.used,memory.total --format=csv -l 5",
                    "framebuffer use per GPU over time; a steady climb is a leak, a flat ~90 % "
                    "is a pre-allocating engine",
                ),
                Check(
                    "nvidia-smi --query-compute-apps=pid,used_memory --format=csv",
                    "which processes hold the memory (a second process on the GPU?)",
                ),
                Check(
                    "kubectl logs <pod> -c <engine> | grep -iE 'preempt|swap|out of memory'",
                    "vLLM/SGLang warnings about preemption or OOM",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Limit concurrency or context",
                    "lower max running sequences or `--max-model-len` so the KV cache of "
                    "admitted requests fits with headroom.",
                ),
                Fix(
                    "hours",
                    "Give the KV cache more room",
                    "raise the engine's memory fraction a little (vLLM "
                    "`--gpu-memory-utilization`, SGLang `--mem-fraction-static`) only if "
                    "nothing else shares the GPU; enable prefix caching to share blocks.",
                ),
                Fix(
                    "days",
                    "Quantise KV cache or weights",
                    "FP8 KV cache doubles the tokens that fit; weight quantisation frees "
                    "memory for KV blocks.",
                ),
                Fix(
                    "weeks",
                    "More memory per replica",
                    "tensor parallelism over more GPUs or GPUs with larger HBM; scale out.",
                ),
            ),
            caveats=(
                "vLLM and SGLang (and TGI) reserve most of the framebuffer for their KV cache at "
                "start-up (vLLM `--gpu-memory-utilization` defaults to 0.9), so a framebuffer "
                "at 90 %+ is normal for them and is never alerted on; for them only the KV-cache "
                "usage counts. The framebuffer rule covers engines that report no KV cache "
                "and do not pre-allocate.",
                "TensorRT-LLM under Triton also pre-allocates (about 90 % of free memory for "
                "the KV cache); add `triton` to preallocating_engines when it serves LLMs.",
            ),
        ),
    )


# --- queue ------------------------------------------------------------------------------------


def queue_wait_dominates_latency(c: _Ctx) -> Signature:
    a = "InferenceQueueWaitDominatesLatency"
    r = c.r
    share = c.ratio(a, "queue_share_above")
    rule = AlertRule(
        severity="warning",
        expr=f"{r.queue_wait_share} > {num(share)}\nand\n{r.traffic}",
        for_seconds=c.for_(a),
        summary="Queue wait dominates request latency on {target}",
        description=(
            f"Requests spend {{share}} % of their end-to-end latency waiting in the engine's "
            f"queue (threshold {pct(share)} %), {{depth}} waiting now: the offered load "
            "exceeds what the server admits."
        ),
        evidence=(
            _percent("share", "queue time share of end-to-end latency", r.queue_wait_share),
            Evidence("depth", "requests waiting", f"{r.queue_depth}{T}", "requests"),
        ),
        when=f"queue time > {pct(share)} % of end-to-end latency (rate of sums), with traffic",
    )
    return Signature(
        alert=a,
        group="queue",
        title="Queue wait dominates latency",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                "Queueing is the most variable part of request latency: near 0 ms at low load, "
                "hundreds of milliseconds to seconds at peak. When more than a third of every "
                "request's time is spent waiting to be admitted, the server is short of "
                "capacity for its load - or its admission limits are set below what the GPU "
                "could handle. Check GPU utilisation first: a busy GPU means scale out, an "
                "idle one means the limit or the CPU side is the problem (see "
                "InferenceGPUStarvedQueueGrowing)."
            ),
            queries=(
                ("mean GPU utilisation", r.gpu_utilization),
                ("KV-cache usage (full cache = no room to admit)", r.kv_cache),
                ("requests running", r.requests_running),
            ),
            on_node=(
                Check(
                    "kubectl logs <pod> -c <engine> | grep -iE 'waiting|pending|running'",
                    "vLLM/SGLang periodic stats: running vs waiting requests",
                ),
                Check(
                    "nvidia-smi dmon -s u -d 1",
                    "GPU sm % - saturated (scale out) or idle (raise admission limits)",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Raise admission limits if the GPU has room",
                    "max running sequences / max batched tokens; watch KV cache and ITL.",
                ),
                Fix(
                    "hours",
                    "Prioritise and shed",
                    "priority scheduling for interactive traffic, rate limits or 429s at the "
                    "gateway instead of unbounded queues.",
                ),
                Fix(
                    "days",
                    "Autoscale on queue depth",
                    "scale replicas on inference_queue_depth or this ratio rather than on GPU "
                    "utilisation.",
                ),
                Fix(
                    "weeks",
                    "Add capacity",
                    "more replicas, or disaggregated prefill/decode pools scaled separately.",
                ),
            ),
        ),
    )


# --- GPU --------------------------------------------------------------------------------------


def gpu_utilization_pulsing(c: _Ctx) -> Signature:
    a = "InferenceGPUUtilizationPulsing"
    r = c.r
    lo = c.ratio(a, "idle_sample_at_most")
    lo_share = c.ratio(a, "idle_share_above")
    hi = c.ratio(a, "busy_sample_above")
    hi_share = c.ratio(a, "busy_share_above")
    win = c.win("pulsing")
    rule = AlertRule(
        severity="warning",
        expr=(
            f"{r.idle_samples} > {num(lo_share)}\n"
            f"and\n{r.busy_samples} > {num(hi_share)}\n"
            f"and\n{r.traffic}"
        ),
        for_seconds=c.for_(a),
        summary="GPU utilisation pulses between idle and saturated on {target}",
        description=(
            f"Over {win}, {{idle}} % of GPU utilisation samples were idle (at most {pct(lo)} %) "
            f"and {{busy}} % saturated (above {pct(hi)} %), mean {{util}} %: the GPU works in "
            "bursts and waits in between, typically for synchronous host-to-device copies or "
            "CPU-side batch assembly."
        ),
        evidence=(
            _percent("idle", "idle samples", r.idle_samples),
            _percent("busy", "saturated samples", r.busy_samples),
            _percent("util", "mean GPU utilisation", r.gpu_utilization),
        ),
        when=(
            f"over {win}, > {pct(lo_share)} % of utilisation samples <= {pct(lo)} % and "
            f"> {pct(hi_share)} % above {pct(hi)} %, with traffic"
        ),
    )
    return Signature(
        alert=a,
        group="cpu",
        title="Bursty feeding: utilisation pulses",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                "The mean utilisation hides a pattern: the GPU alternates between running "
                "flat out and sitting idle. That is the signature of a pipeline without "
                "overlap - the host prepares a batch (tokenizes, pads, builds tensors), copies "
                "it synchronously over PCIe while the GPU waits at 0 %, then the GPU bursts to "
                "100 % and waits again. Very long prompts make it worse: copying a 128K-token "
                "context alone can idle the GPU for tens to hundreds of milliseconds."
            ),
            queries=(
                (
                    "distribution of driver utilisation samples (sidecar profile)",
                    f"sum {c.by('le')} (increase("
                    f"{c.s('inference_gpu_utilization_samples_bucket')}[{win}]))",
                ),
                (
                    "host-to-device PCIe traffic in bursts",
                    f"{c.s('inference_gpu_pcie_rx_bytes_per_second')}",
                ),
            ),
            on_node=(
                Check(
                    "nvidia-smi dmon -s ut -d 1",
                    "sm % swinging between ~0 and ~100 from one second to the next, rxpci "
                    "spikes in the idle gaps",
                ),
                Check(
                    "nsys profile -t cuda,nvtx,osrt -d 20 -p <engine pid>",
                    "(staging) gaps on the GPU timeline aligned with cudaMemcpy (H2D) or "
                    "cudaStreamSynchronize, CPU busy in the gaps",
                ),
                Check(
                    "py-spy dump --pid <engine pid>",
                    "the scheduler thread inside batch assembly or .to(device)/.item() calls",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Use an engine with continuous batching",
                    "iteration-level scheduling keeps the GPU stepping while requests come and "
                    "go; a naive generate() loop per request pulses by construction.",
                ),
                Fix(
                    "hours",
                    "Pinned memory and non-blocking copies",
                    "allocate host tensors in pinned memory and copy with non_blocking=True on "
                    "a side stream so transfers overlap compute.",
                ),
                Fix(
                    "days",
                    "Pipeline the CPU work",
                    "prepare batch N+1 (tokenize, pad, assemble) while batch N runs; remove "
                    ".item() and other synchronising calls from the step loop; CUDA graphs "
                    "cut launch gaps.",
                ),
                Fix(
                    "weeks",
                    "Chunked prefill or disaggregation",
                    "split long prompts into chunks mixed with decode steps, or move prefill to "
                    "its own instances.",
                ),
            ),
            caveats=(
                "The sidecar profile counts every driver sample (about six per second); the "
                "dcgm profile sees one utilisation reading per rule evaluation, so short pulses "
                "are sampled, not counted.",
                f"Samples exactly at {pct(hi)} % count as not saturated: the threshold is a "
                "bucket bound of inference_gpu_utilization_samples.",
            ),
        ),
    )


def gpu_underutilized(c: _Ctx) -> Signature:
    a = "InferenceGPUUnderutilized"
    r = c.r
    util = c.ratio(a, "utilization_below")
    for_ = duration(c.for_(a))
    rule = AlertRule(
        severity="info",
        expr=f"{r.gpu_utilization} < {num(util)}\nand\n{r.requests_running} > 0",
        for_seconds=c.for_(a),
        summary="GPU underutilised on {target}",
        description=(
            f"Mean GPU utilisation {{util}} % (below {pct(util)} %) for {for_} while "
            "{running} requests run on average: the GPU waits most of the time."
        ),
        evidence=(
            _percent("util", "mean GPU utilisation", r.gpu_utilization),
            Evidence("running", "requests running", f"{r.requests_running}{T}", "requests", "%.1f"),
        ),
        when=f"mean GPU utilisation < {pct(util)} % while requests are running",
    )
    return Signature(
        alert=a,
        group="gpu",
        title="GPU underutilised under load",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                f"Sustained utilisation below {pct(util)} % with requests in flight means the "
                "GPU spends most of its time waiting - for the CPU, for copies, for the "
                "scheduler, or because the load is too small for the GPU. It is a cost "
                "signal (info, not paged): one real deployment went from 12 % to 65-75 % "
                "utilisation and 8x throughput by moving tokenization to a thread pool, "
                "switching to an engine with paged attention and continuous batching, "
                "quantising to W4A16 and raising the batch budget. The other signatures "
                "usually say which of these applies."
            ),
            queries=(
                ("which other signatures hold for this target", 'ALERTS{alertstate="firing"}'),
                ("generation throughput (tokens/s)", r.generation_tokens),
            ),
            on_node=(
                Check(
                    "nvidia-smi dmon -s u -d 1",
                    "steady low sm % (load too small, or a slow feeder) vs pulses (see "
                    "InferenceGPUUtilizationPulsing)",
                ),
                Check(
                    "py-spy dump --pid <engine pid>",
                    "where the engine's threads spend the time the GPU idles",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Check the other signatures",
                    "tokenizer, front-end, softirq and pulsing alerts name the feeder that "
                    "starves the GPU.",
                ),
                Fix(
                    "hours",
                    "Raise the batch budget",
                    "max batched tokens and max sequences, if KV-cache headroom allows.",
                ),
                Fix(
                    "days",
                    "Right-size",
                    "a smaller GPU or MIG slice, or more models per GPU, when the load is "
                    "simply small.",
                ),
            ),
        ),
    )


def gpu_xid_errors(c: _Ctx) -> Signature:
    a = "InferenceGPUXidErrors"
    r = c.r
    critical = regex_alternatives(c.cfg.ints(a, "critical_xids"))
    win = c.win("xid")
    count = Evidence("count", f"new Xid errors in {win}", None, "errors")
    crit = AlertRule(
        severity="critical",
        expr=f'{r.xid_new}{{xid=~"{critical}"}} > 0',
        for_seconds=c.for_(a),
        summary="GPU {labels.gpu} reported Xid {labels.xid} on {target}",
        description=(
            "GPU {labels.gpu} ({labels.uuid}) reported Xid {labels.xid} ({count} new in the "
            f"last {win}): an Xid of this class ({critical.replace('|', ', ')}) means the "
            "GPU's state cannot be trusted until it is reset; drain the node."
        ),
        scope=("gpu", "uuid", "xid"),
        evidence=(count,),
        when=f"a new Xid {critical.replace('|', ', ')} within {win}",
    )
    warn = AlertRule(
        severity="warning",
        expr=f'{r.xid_new}{{xid!~"{critical}"}} > 0',
        for_seconds=c.for_(a),
        summary="GPU {labels.gpu} reported Xid {labels.xid} on {target}",
        description=(
            "GPU {labels.gpu} ({labels.uuid}) reported Xid {labels.xid} ({count} new in the "
            f"last {win}): usually an application fault (13, 31, 43) or a driver event; "
            "repeated Xids on one GPU point at hardware."
        ),
        scope=("gpu", "uuid", "xid"),
        evidence=(count,),
        when=f"any other new Xid within {win}",
    )
    return Signature(
        alert=a,
        group="gpu",
        title="GPU Xid errors",
        rules=(crit, warn),
        runbook=Runbook(
            meaning=(
                "Xids are the driver's error reports, logged by the kernel as `NVRM: Xid`. "
                "Some are the application's fault (13 graphics engine exception, 31 MMU "
                "fault, 43 channel stopped - often an out-of-bounds kernel); some mean the GPU "
                "is broken until reset: 48 double-bit ECC error, 79 GPU has fallen off the "
                "bus, 94 contained ECC error, 95 uncontained ECC error. The critical set is "
                f"configurable (default {critical.replace('|', ', ')})."
            ),
            queries=(("new Xids per GPU", r.xid_new),),
            on_node=(
                Check(
                    "dmesg -T | grep -i xid",
                    "the Xid lines with PCI address, the process and the error text",
                ),
                Check(
                    "nvidia-smi -q -d ECC,ROW_REMAPPER,PAGE_RETIREMENT",
                    "volatile/aggregate double-bit ECC counts, pending row remaps",
                ),
                Check(
                    "nvidia-smi -q | grep -iA2 'retired\\|remapp'",
                    "a remap pending means a reset is needed to apply it",
                ),
                Check(
                    "nvidia-bug-report.sh",
                    "the full report NVIDIA support asks for, before resetting anything",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Drain and reset",
                    "cordon the node, move the pods, `nvidia-smi -r -i <gpu>` (or reboot) for "
                    "48/79/95; restart the application for 94 and the application Xids.",
                ),
                Fix(
                    "hours",
                    "Find the faulting code",
                    "for 13/31/43, reproduce with CUDA_LAUNCH_BLOCKING=1 and compute-sanitizer; "
                    "check custom kernels and mismatched CUDA/driver versions.",
                ),
                Fix(
                    "days",
                    "Replace the GPU",
                    "repeated ECC Xids or row-remap failures on one GPU: RMA it.",
                ),
            ),
            caveats=(
                "The dcgm profile reads DCGM_FI_DEV_XID_ERRORS, which holds only the last Xid "
                "of a GPU: a repeat of the same Xid is invisible and the count is 1. Enable "
                "DCGM_EXP_XID_ERRORS_COUNT in dcgm-exporter for counts.",
            ),
        ),
    )


def gpu_throttled(c: _Ctx) -> Signature:
    a = "InferenceGPUThrottled"
    r = c.r
    for_ = duration(c.for_(a))
    rule = AlertRule(
        severity="warning",
        expr=f"{r.clock_events} > 0",
        for_seconds=c.for_(a),
        summary="GPU {labels.gpu} clocks held down ({labels.reason}) on {target}",
        description=(
            f"GPU {{labels.gpu}} ({{labels.uuid}}) has been slowed by {{labels.reason}} for "
            f"{for_}; die at {{temp}} °C, SM clock {{clock}} MHz: every kernel runs slower "
            "until the cause (cooling, power delivery) is fixed."
        ),
        scope=("gpu", "uuid", "reason"),
        evidence=(
            Evidence("temp", "GPU temperature", f"{r.temperature}{T}", "°C", scope=GPU),
            Evidence("clock", "SM clock", f"{r.sm_clock}{T} / 1000000", "MHz", scope=GPU),
        ),
        when=(
            "a hardware or thermal clock event reason ("
            + ", ".join(c.cfg.names(a, "reasons"))
            + ") active"
        ),
    )
    return Signature(
        alert=a,
        group="gpu",
        title="GPU clocks throttled by hardware or heat",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                "The driver reports why clocks are below maximum. Power capping and idle "
                "clocks are normal; hardware slowdown, thermal slowdown and power brake are "
                "not - they cut SM clocks by up to half and with them decode speed, "
                "and they usually mean cooling, a failing fan or PSU, or an external power "
                "brake signal."
            ),
            queries=(
                ("GPU temperature", r.temperature),
                ("SM clock (MHz)", f"{r.sm_clock} / 1000000"),
            ),
            on_node=(
                Check(
                    "nvidia-smi -q -d PERFORMANCE",
                    "'Clocks Event Reasons' (older drivers: 'Clocks Throttle Reasons') with the "
                    "active ones marked Active",
                ),
                Check(
                    "nvidia-smi dmon -s pc -d 1",
                    "power, temperature and SM clock together, second by second",
                ),
                Check(
                    "ipmitool sdr type Temperature; ipmitool sdr type Fan",
                    "inlet temperature and fan speeds of the chassis",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Check the chassis",
                    "blocked airflow, failed fans, inlet temperature above spec.",
                ),
                Fix(
                    "hours",
                    "Move the load",
                    "drain the node if one GPU throttles persistently; it slows every "
                    "tensor-parallel peer to its pace.",
                ),
                Fix(
                    "days",
                    "Hardware service",
                    "re-seat or replace the GPU, check PSU and power brake wiring with the vendor.",
                ),
            ),
            caveats=(
                "The dcgm profile needs DCGM_FI_DEV_CLOCKS_EVENT_REASONS (formerly "
                "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS) in dcgm-exporter's counters; it is not "
                "in the default set.",
            ),
        ),
    )


# --- meta -------------------------------------------------------------------------------------


def exporter_down(c: _Ctx) -> Signature:
    a = "InferenceExporterDown"
    up = selector("up", c.cfg.selectors.exporter)
    for_ = duration(c.for_(a))
    down = AlertRule(
        severity="warning",
        expr=f"min {by(c.join)} ({up}) == 0",
        for_seconds=c.for_(a),
        summary="Inference exporter {target} is down",
        description=(
            "Prometheus has failed to scrape the inference-bottleneck-exporter sidecar at "
            f"{{labels.instance}} for {for_}: every signature of this target is blind."
        ),
        when="the sidecar's scrape target is down",
        labels=(("condition", "down"),),
    )
    absent = AlertRule(
        severity="warning",
        expr=f"absent({up})",
        for_seconds=c.for_(a),
        summary="No inference exporter target is discovered",
        description=(
            f"No scrape target matching {up} has existed for {for_}: Prometheus finds no "
            "inference-bottleneck-exporter sidecar, so no signature can fire."
        ),
        when=f"no target matches {up}",
        labels=(("condition", "absent"),),
    )
    return Signature(
        alert=a,
        group="meta",
        title="Exporter down or not discovered",
        rules=(down, absent),
        runbook=Runbook(
            meaning=(
                "Either Prometheus cannot scrape a sidecar (the pod is gone, the container "
                "crashed, a network policy blocks the port) or it discovers none at all "
                "(the PodMonitor's selector, namespace selector or the Prometheus "
                "`podMonitorSelector` no longer match). Without the scrape, every other "
                "alert of the target is silent."
            ),
            queries=(("scrape health of the sidecars", up),),
            on_node=(
                Check(
                    "kubectl get pods -A -l <sidecar pod label> -o wide",
                    "the inference pods and whether the sidecar container is ready",
                ),
                Check(
                    "kubectl logs <pod> -c <sidecar container> --tail 50",
                    "start-up or configuration errors of the exporter",
                ),
                Check(
                    "curl -s http://<pod ip>:10960/-/ready; curl -s http://<pod ip>:10960/metrics "
                    "| head",
                    "the sidecar answers locally",
                ),
                Check(
                    "Prometheus UI -> Status -> Targets (filter 'inference')",
                    "the scrape error, or the target missing from discovery",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Restart or fix the sidecar",
                    "a crash-looping sidecar logs one line saying which flag or file is wrong.",
                ),
                Fix(
                    "hours",
                    "Fix discovery",
                    "PodMonitor labels vs Prometheus podMonitorSelector, namespace selector, "
                    "port name; NetworkPolicy allowing Prometheus to port 10960.",
                ),
            ),
        ),
    )


def collector_failing(c: _Ctx) -> Signature:
    a = "InferenceCollectorFailing"
    for_ = duration(c.for_(a))
    rule = AlertRule(
        severity="warning",
        expr=f"min {c.by('collector')} ({c.s('inference_scrape_collector_success')}) == 0",
        for_seconds=c.for_(a),
        summary="Collector {labels.collector} failing on {target}",
        description=(
            f"Collector {{labels.collector}} has failed every scrape for {for_} (last run took "
            "{took} s): its metrics are missing and the signatures that read them stay silent; "
            "the exporter's log says why."
        ),
        scope=("collector",),
        evidence=(
            Evidence(
                "took",
                "collector duration",
                f"{c.s('inference_scrape_collector_duration_seconds')}{T}",
                "s",
                "%.3f",
            ),
        ),
        when="inference_scrape_collector_success == 0",
    )
    return Signature(
        alert=a,
        group="meta",
        title="A collector keeps failing",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                "One collector of the sidecar (nvml, cpu, engine, tokenizer, process) cannot "
                "read its source or misses its deadline. The scrape still succeeds - one "
                "failing collector never fails the others - but its metrics are absent, and "
                "every signature built on them is silent, not green."
            ),
            queries=(
                (
                    "collector durations vs the scrape deadline",
                    c.s("inference_scrape_collector_duration_seconds"),
                ),
            ),
            on_node=(
                Check(
                    "kubectl logs <pod> -c <sidecar container> | grep -i <collector>",
                    "the collector's error (permission, missing /proc path, NVML error, "
                    "engine URL)",
                ),
                Check(
                    "curl -s http://<pod ip>:10960/",
                    "the landing page lists each collector's last status and error",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Fix the collector's source",
                    "engine URL/port, /proc mount, shareProcessNamespace for the process "
                    "collector, NVIDIA runtime for nvml.",
                ),
                Fix(
                    "minutes",
                    "Disable collectors that cannot work here",
                    "`--no-collector.<name>` removes the alert and the noise.",
                ),
            ),
        ),
    )


def engine_metrics_down(c: _Ctx) -> Signature:
    a = "InferenceEngineMetricsDown"
    for_ = duration(c.for_(a))
    rate = c.win("rate")
    rule = AlertRule(
        severity="warning",
        expr=f"min {c.by('engine')} ({c.s('inference_engine_up')}) == 0",
        for_seconds=c.for_(a),
        summary="Engine metrics unreadable on {target}",
        description=(
            f"The sidecar has not read the {{labels.engine}} engine's metrics endpoint for "
            f"{for_} ({{failures}} failed polls in the last {rate}): queue, latency and KV-cache "
            "signals are missing for this target."
        ),
        scope=("engine",),
        evidence=(
            Evidence(
                "failures",
                f"failed polls in {rate}",
                f"sum(increase({c.s('inference_engine_poll_failures_total')}{T}[{rate}]))",
                "polls",
            ),
        ),
        when="inference_engine_up == 0",
    )
    return Signature(
        alert=a,
        group="meta",
        title="Engine metrics unreadable",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                "The sidecar polls the engine's own /metrics and normalises it into "
                "inference_queue_depth, inference_requests_running, latency histograms and "
                "KV-cache usage. When the poll fails, every queue- and latency-based signature "
                "of the target is silent. The engine may be down (then users notice), "
                "starting (loading weights takes minutes), or the URL is wrong."
            ),
            queries=(
                (
                    "failed polls by reason (connect, timeout, status, too_large, parse)",
                    f"rate({c.s('inference_engine_poll_failures_total')}[{c.win('rate')}])",
                ),
            ),
            on_node=(
                Check(
                    "kubectl exec <pod> -c <sidecar container> -- "
                    "wget -qO- http://127.0.0.1:8000/metrics | head",
                    "the engine answers on the URL the sidecar uses",
                ),
                Check(
                    "kubectl logs <pod> -c <engine> --tail 50",
                    "the engine still loading, crashed, or out of memory",
                ),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Point the sidecar at the right URL",
                    "`--engine.url` (port, path, scheme); some engines need metrics enabled.",
                ),
                Fix(
                    "hours",
                    "Raise the poll timeout or size limit",
                    "very large /metrics pages (many LoRA adapters, many models) can exceed "
                    "the defaults; the failure reason says which.",
                ),
            ),
        ),
    )


def nvml_unavailable(c: _Ctx) -> Signature:
    a = "InferenceNVMLUnavailable"
    for_ = duration(c.for_(a))
    rule = AlertRule(
        severity="warning",
        expr=f"min {c.by()} ({c.s('inference_nvml_up')}) == 0",
        for_seconds=c.for_(a),
        summary="NVML unavailable in the sidecar of {target}",
        description=(
            f"NVML has not initialised in the sidecar for {for_}: the NVIDIA driver library "
            "is not visible in the container, so GPU metrics and every GPU-based signature "
            "are missing."
        ),
        when="inference_nvml_up == 0",
    )
    return Signature(
        alert=a,
        group="meta",
        title="NVML unavailable",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                "The sidecar reads the GPU through libnvidia-ml. Without it (no NVIDIA "
                "container runtime for the sidecar, no GPU visible to it, a driver/library "
                "mismatch) the exporter runs on but has no GPU data; GPU signatures go silent."
            ),
            queries=(("NVML state per target", c.s("inference_nvml_up")),),
            on_node=(
                Check(
                    "kubectl exec <pod> -c <sidecar container> -- ls /usr/lib/x86_64-linux-gnu "
                    "| grep nvidia-ml",
                    "libnvidia-ml.so.1 mounted into the sidecar",
                ),
                Check(
                    "kubectl exec <pod> -c <sidecar container> -- env | grep NVIDIA_",
                    "NVIDIA_VISIBLE_DEVICES set to the pod's GPUs (or 'all') for the sidecar too",
                ),
                Check("nvidia-smi", "the driver works on the node at all"),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Expose the GPU to the sidecar",
                    "runtimeClassName: nvidia and NVIDIA_VISIBLE_DEVICES matching the engine's "
                    "GPUs; the sidecar must not request GPUs of its own.",
                ),
                Fix(
                    "minutes",
                    "Or use the dcgm profile",
                    "if dcgm-exporter already runs on the node, disable the nvml collector "
                    "and generate the rules with --profile dcgm.",
                ),
            ),
        ),
    )


def gpu_lost(c: _Ctx) -> Signature:
    a = "InferenceGPULost"
    for_ = duration(c.for_(a))
    rule = AlertRule(
        severity="critical",
        expr=f"min {c.by('gpu', 'uuid')} ({c.s('inference_gpu_up')}) == 0",
        for_seconds=c.for_(a),
        summary="GPU {labels.gpu} lost on {target}",
        description=(
            f"GPU {{labels.gpu}} ({{labels.uuid}}) has not answered NVML for {for_}: it errors "
            "or hangs (Xid 79, fallen off the bus, is the usual cause) and requests on it stall "
            "or fail."
        ),
        scope=("gpu", "uuid"),
        when="inference_gpu_up == 0",
    )
    return Signature(
        alert=a,
        group="gpu",
        title="GPU lost",
        rules=(rule,),
        runbook=Runbook(
            meaning=(
                "Every NVML call for this GPU fails or hangs past its deadline. The engine "
                "using it is stuck or crashed; a tensor-parallel group stalls entirely. This "
                "needs a person: the GPU will not come back without a reset."
            ),
            queries=(("Xids on the same GPU", c.r.xid_new),),
            on_node=(
                Check("nvidia-smi", "'GPU is lost' / 'Unable to determine the device handle'"),
                Check("dmesg -T | grep -iE 'xid|nvrm'", "Xid 79 or 'fallen off the bus'"),
                Check("lspci | grep -i nvidia", "the GPU missing from the PCI bus"),
            ),
            fixes=(
                Fix(
                    "minutes",
                    "Drain the node",
                    "cordon, evict the inference pods so traffic moves to healthy replicas.",
                ),
                Fix("hours", "Reset or reboot", "`nvidia-smi -r -i <gpu>`, else reboot."),
                Fix(
                    "days",
                    "Hardware service",
                    "repeated loss of the same GPU: reseat, check PCIe risers and power, RMA.",
                ),
            ),
        ),
    )


BUILDERS: tuple[Callable[[_Ctx], Signature], ...] = (
    gpu_starved_queue_growing,
    tokenizer_slower_than_decode,
    frontend_cpu_saturated,
    softirq_cpu_high,
    hbm_bandwidth_saturated,
    gpu_memory_headroom_low,
    queue_wait_dominates_latency,
    gpu_utilization_pulsing,
    gpu_underutilized,
    exporter_down,
    collector_failing,
    engine_metrics_down,
    nvml_unavailable,
    gpu_lost,
    gpu_xid_errors,
    gpu_throttled,
)


def catalogue(cfg: SiteConfig) -> tuple[Signature, ...]:
    """Every signature of the pack, in the issue's order."""
    ctx = _Ctx(cfg)
    return tuple(build(ctx) for build in BUILDERS)
