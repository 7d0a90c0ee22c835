"""The drill matrix: one scenario per injected cause, what must fire, what may fire with it.

Every CPU drill runs the same load (:data:`LOAD`; one drill a lighter one, with the reason)
against the same reference engine configuration; only the injection differs, and - where the cause leaves the GPU busy - the
replayed GPU (see :mod:`exporter.lab.refengine.gputrace`). Co-firing is allowed only where it is
written down here with the reason; any other alert that fires fails the drill.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Load:
    rate: float = 2.0
    prompt_tokens: int = 256
    output_tokens: int = 192


LOAD = Load()

# The engine of every drill: the defaults (tiny model, 16 sequences, 1 torch thread on a small
# machine, worker at nice 5 on CPU) plus what a scenario adds.
ENGINE_ARGS: tuple[str, ...] = ()

# The site config of every CPU drill (a scenario's own ``rules_config`` replaces it). The
# reference engine on a CPU spends about half of each healthy decode step in Python (the
# dispatch of ~70 small operators, sampling): its decode roofline efficiency read 0.27-0.70 in
# the healthy drills measured, under the default 0.33 on a busy machine with nothing injected,
# and 0.07-0.11 in the decode-overhead drill. The CPU drills put InferenceDecodeOverheadBound's
# threshold at 0.17, near the geometric middle of the two worst readings (0.27 and 0.11): each
# side then has about 1.6x of room. Prometheus and diagnose get the same file; GPU drills run
# the defaults.
CPU_SITE_CONFIG = "signatures:\n  InferenceDecodeOverheadBound:\n    efficiency_below: 0.17\n"

STARVED = "InferenceGPUStarvedQueueGrowing"
TOKENIZER = "InferenceTokenizerSlowerThanDecode"
FRONTEND = "InferenceFrontendCPUSaturated"
SOFTIRQ = "InferenceSoftirqCPUHigh"
QUEUE_WAIT = "InferenceQueueWaitDominatesLatency"
PULSING = "InferenceGPUUtilizationPulsing"
HBM = "InferenceHBMBandwidthSaturated"
MEMORY = "InferenceGPUMemoryHeadroomLow"
DECODE = "InferenceDecodeOverheadBound"
HOST = "InferenceHostLatencyShareHigh"


@dataclass(frozen=True)
class Scenario:
    name: str
    injections: tuple[str, ...]
    expected: str | None  # None: nothing may fire (healthy)
    why: str
    deadline_s: float  # from the start of the load
    look: str | None = "starved"  # replayed GPU; None: the real GPU through NVML
    allowed: dict[str, str] = field(default_factory=dict)  # co-firing alert -> reason
    look: str = "starved"
    engine_args: tuple[str, ...] = ()
    gpu: bool = False
    rules_config: str = ""  # site config of the rule pack (YAML), for Prometheus and diagnose
    load: Load = LOAD
    load_why: str = ""  # why a drill runs another load than LOAD
    engine: str = "reference"  # or a third-party engine (EXTERNAL_ENGINES)
    restart_at_s: float | None = None  # the engine is killed and started again then

    def site_config(self) -> str:
        """The rule pack's site config this drill runs with (empty: the defaults)."""
        if self.rules_config:
            return self.rules_config
        return "" if self.gpu else CPU_SITE_CONFIG


SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="healthy",
        injections=(),
        expected=None,
        why=(
            "the same load and engine with nothing injected, on the same 40 % GPU as the "
            "CPU-side drills: every GPU-gated signature is armed, so the quiet run shows that "
            "their CPU-side halves stay false"
        ),
        deadline_s=150.0,
    ),
    Scenario(
        name="tokenizer-slow",
        injections=("tokenizer-slow",),
        expected=TOKENIZER,
        why=(
            "the probe's ~512-token prompt takes the pure-Python BPE path (7-10x the Rust "
            "one) on the engine's single tokenizer thread, longer than one decode step"
        ),
        load=Load(rate=1.0),
        load_why=(
            "at 2 requests/s the batch holds about three sequences and a decode step takes "
            "5-7 ms, inside the 5-7.5 ms bucket of the inter-token histogram, whose "
            "interpolated median can reach the slow tokenizer's 7-8 ms; at 1 request/s the "
            "batch is one or two sequences and the step stays well below it"
        ),
        deadline_s=240.0,
    ),
    Scenario(
        name="frontend-gil",
        injections=("frontend-gil",),
        expected=FRONTEND,
        why=(
            "pure-Python pre-processing (500 ms of CPU per request, a whole core at 2 "
            "requests/s; two requests at a time, the rest wait for a turn) and post-processing "
            "of every chunk run in the event-loop thread: it sits above 90 % of a core while "
            "the GPU is starved, and still answers the engine's /metrics between its slices"
        ),
        deadline_s=240.0,
        allowed={
            TOKENIZER: (
                "the tokenizer probe's two round trips queue behind the saturated event loop "
                "(its runbook: a saturated front-end slows both); their difference can exceed "
                "a decode step"
            ),
            DECODE: (
                "the saturated event loop streams every token late: the inter-token latency a "
                "request sees grows to several times the decode floor while the memory bus "
                "idles - host work between steps, as the signature says"
            ),
            HOST: (
                "the pre- and post-processing is request time outside queue, prefill and "
                "decode: the host's share of end-to-end latency is what the injection adds"
            ),
        },
    ),
    Scenario(
        name="queue-flood",
        injections=("queue-flood",),
        expected=QUEUE_WAIT,
        why=(
            "the scheduler admits one sequence at a time: the offered 2 requests/s exceed "
            "what it admits, requests wait in the queue for most of their latency"
        ),
        deadline_s=200.0,
        look="busy",
        allowed={
            TOKENIZER: (
                "with one sequence admitted every decode step runs at batch 1, about 2 ms on "
                "the tiny model - as long as the fast tokenizer takes for the probe's prompt, "
                "so the two medians can cross (a real model's decode step is 20-50 ms)"
            ),
        },
    ),
    Scenario(
        name="cpu-contention",
        injections=("cpu-contention",),
        expected=STARVED,
        why=(
            "four busy-looping processes per CPU take the host's CPU: the engine falls behind "
            "the offered load, the queue grows while the GPU idles"
        ),
        deadline_s=180.0,
        allowed={
            QUEUE_WAIT: (
                "a growing queue is, after a while, most of every request's latency: the "
                "consequence of the starved engine, ranked below it by severity"
            ),
            DECODE: (
                "the model worker, which stands in for the GPU's kernels on a CPU, gets a "
                "sliver of a core: every decode step takes tens of times its floor while the "
                "replayed memory bus idles - on a GPU host the same contention delays the host "
                "work between steps, which this signature reports; a warning, ranked below "
                "the critical starved queue"
            ),
        },
    ),
    Scenario(
        name="softirq",
        injections=("softirq",),
        expected=SOFTIRQ,
        why=(
            "the loopback UDP flood keeps NET_RX softirq at 15 % of the node's CPU time, three "
            "times the threshold"
        ),
        deadline_s=170.0,
    ),
    # GPU-only: the same harness on a real GPU (bench/gpu/run.sh), NVML instead of a replay.
    Scenario(
        name="healthy-gpu",
        injections=(),
        expected=None,
        why=(
            "the same load with nothing injected on the real GPU: the GPU-side signatures read "
            "NVML (utilisation samples, GPM bandwidth, memory) and must stay quiet"
        ),
        # Short: a lent GPU's minutes go to the injected drills (bench/gpu/run.sh).
        deadline_s=60.0,
        look=None,
        gpu=True,
    ),
    Scenario(
        name="h2d-stall",
        injections=("h2d-stall",),
        expected=PULSING,
        why=(
            "a synchronous 4 GiB copy from pageable memory every 24 steps leaves the GPU "
            "idle between bursts of kernels: utilisation samples pulse"
        ),
        deadline_s=200.0,
        look=None,
        gpu=True,
        allowed={
            STARVED: "the stalls slow the engine: the queue may grow while the GPU waits",
        },
    ),
    Scenario(
        name="memory-pressure",
        injections=("memory-pressure",),
        expected=MEMORY,
        why=(
            "the KV block pool holds 640 tokens, fewer than the running sequences need, and "
            "the cache takes 96 % of device memory: usage stays above 90 %, sequences are "
            "preempted"
        ),
        deadline_s=200.0,
        look=None,
        gpu=True,
        allowed={
            STARVED: "preempted sequences requeue: the queue grows while the GPU waits",
            QUEUE_WAIT: "requeued sequences wait most of their latency",
        },
    ),
)

DECODE_OVERHEAD_MS = 60

SCENARIOS += (
    Scenario(
        name="decode-overhead",
        injections=("decode-overhead",),
        expected=DECODE,
        why=(
            f"{DECODE_OVERHEAD_MS} ms of host work on the model worker's step path before every "
            "decode step: each step takes several times its floor (the time its weight and KV "
            "reads take at the rate this host's kernels stream them, the trace's peak) while "
            "the replayed GPU's memory bus stays under half busy"
        ),
        engine_args=("--decode-overhead-ms", str(DECODE_OVERHEAD_MS)),
        load=Load(rate=0.5),
        load_why=(
            "at 2 requests/s the slowed steps would fill the 16-sequence batch and the queue "
            "would grow: the starved-queue signature (critical) would then outrank the cause; "
            "at 0.5 requests/s the engine keeps up with the overhead"
        ),
        deadline_s=200.0,
        allowed={
            STARVED: (
                "on a machine slower than the one the load was sized on the slowed steps may "
                "not keep up: the queue grows while the GPU waits, the consequence of the "
                "overhead"
            ),
            QUEUE_WAIT: "the growing queue is, after a while, most of every request's latency",
        },
    ),
)

HBM_AFTER_S = 120

SCENARIOS += (
    Scenario(
        name="hbm-saturation",
        injections=("hbm-saturation",),
        expected=HBM,
        why=(
            f"after {HBM_AFTER_S} s of normal decoding a neighbour on the same GPU copies "
            "4 GiB device to device back to back: HBM bandwidth goes above 90 % and each "
            "request's decode speed falls below 80 % of what it was 2 minutes earlier"
        ),
        # The signature compares decode speed with one baseline window earlier (1 h; 6 min
        # in the fast profile), longer than a lent GPU session allows next to the other
        # drills: this drill's site config makes it 20 min (2 min fast) and the `for` 5 min
        # (30 s), so the alert can fire between 150 s and 240 s, before the baseline window
        # itself reaches into the saturated period.
        rules_config=(
            "windows:\n  baseline: 20m\n"
            "signatures:\n  InferenceHBMBandwidthSaturated:\n    for: 5m\n"
        ),
        engine_args=("--hbm-saturation-after", str(HBM_AFTER_S)),
        deadline_s=250.0,
        look=None,
        gpu=True,
        allowed={
            STARVED: "a slower engine may let the queue grow while NVML samples show gaps",
            QUEUE_WAIT: "slower decoding makes requests wait longer in the queue",
        },
    ),
)

CPU_SCENARIOS = tuple(s for s in SCENARIOS if not s.gpu)
GPU_SCENARIOS = tuple(s for s in SCENARIOS if s.gpu)
BY_NAME = {s.name: s for s in SCENARIOS}

# --- third-party engines ---------------------------------------------------------------------
#
# llama.cpp's llama-server and Triton (PyTriton), each run as it ships (exporter/lab/thirdparty.py)
# with the drills whose cause acts from outside the engine, or through the engine's own
# configuration (queue-flood: one slot, one model instance). The sidecar recognises the engine
# by its metric names (no --engine.type). The two engines of one scenario run side by side.
# Not Triton under cpu-contention: its busy-loopers share the engine's session (as they must
# to contend at all under autogroup scheduling) and PyTriton's model start-up, which hands each
# instance its configuration with a 1 s deadline, failed under them three times in three; run
# once with the busy-loopers in another session, its 0.1 ms of host work a step kept up and
# nothing fired.

EXTERNAL_ENGINES = ("llamacpp", "triton")

# What an engine does not export, and so which signatures it cannot fire (docs/engines.md).
BLIND: dict[str, dict[str, str]] = {
    "llamacpp": {
        QUEUE_WAIT: (
            "llama-server counts deferred requests (the queue depth) but exports no queue time "
            "and no end-to-end latency"
        ),
        TOKENIZER: (
            "its /tokenize is probed, but the signature compares the probe with the median "
            "inter-token latency, which llama-server does not export"
        ),
        DECODE: "no inter-token latency: only cumulative generation seconds",
        HOST: "no end-to-end, prefill or decode time per request",
        MEMORY: "builds since mid-2025 no longer export the KV-cache usage ratio",
    },
    "triton": {
        TOKENIZER: "Triton knows nothing of tokens: no tokenize endpoint, no inter-token latency",
        DECODE: "no inter-token latency: Triton times whole requests",
        HOST: "no prefill or decode time per request (compute time spans the whole request)",
        MEMORY: "KV-cache usage only from the TensorRT-LLM backend, not from a Python model",
    },
}

LLAMA_RESTART_S = 50.0

# Short prompts; llama-server at 3 requests/s of 128 tokens (384 tokens/s: its tiny model
# decodes a token in under a millisecond, so the healthy engine needs a fraction of a core,
# more than the contended one gets), Triton at 2 requests/s of 192 tokens (one instance then
# falls behind in queue-flood, four keep up).
EXTERNAL_LOADS = {
    "llamacpp": Load(rate=3.0, prompt_tokens=64, output_tokens=128),
    "triton": Load(rate=2.0, prompt_tokens=64, output_tokens=192),
}


def _external(
    engine: str, base: Scenario, expected: str | None, why: str, **kw: object
) -> Scenario:
    return Scenario(
        name=base.name,
        injections=base.injections,
        expected=expected,
        why=why,
        deadline_s=float(kw.get("deadline_s", base.deadline_s)),  # type: ignore[arg-type]
        look=base.look,
        allowed=dict(kw.get("allowed", {})),  # type: ignore[call-overload]
        load=EXTERNAL_LOADS[engine],
        engine=engine,
        restart_at_s=kw.get("restart_at_s"),  # type: ignore[arg-type]
    )


def _external_matrix() -> tuple[Scenario, ...]:
    base = {s.name: s for s in SCENARIOS}
    return (
        _external(
            "llamacpp",
            base["healthy"],
            None,
            (
                f"nothing injected; {LLAMA_RESTART_S:.0f} s into the load llama-server is "
                "killed (SIGKILL) and started again on the same port: its counters start from "
                "zero, the polls fail for a few seconds, and nothing may fire"
            ),
            deadline_s=120.0,
            restart_at_s=LLAMA_RESTART_S,
        ),
        _external("triton", base["healthy"], None, "nothing injected", deadline_s=120.0),
        _external(
            "llamacpp",
            base["queue-flood"],
            None,
            (
                "one slot (--parallel 1): a request that arrives while it is busy is deferred "
                "(llamacpp:requests_deferred), but llama-server exports no queue time, so "
                "InferenceQueueWaitDominatesLatency cannot fire, and on the busy GPU nothing "
                "else may"
            ),
            deadline_s=120.0,
        ),
        _external(
            "triton",
            base["queue-flood"],
            QUEUE_WAIT,
            (
                "one model instance (--instances 1) takes about 0.65 s a request: at 2 requests/s "
                "the rest wait in Triton's queue (nv_inference_queue_duration_us)"
            ),
        ),
        _external(
            "llamacpp",
            base["cpu-contention"],
            STARVED,
            (
                "four busy-looping processes per CPU take the host: llama-server's two threads "
                "decode slower than the offered load, its deferred requests grow while the GPU "
                "idles"
            ),
        ),
        _external("llamacpp", base["softirq"], SOFTIRQ, base["softirq"].why),
        _external("triton", base["softirq"], SOFTIRQ, base["softirq"].why),
    )


EXTERNAL_SCENARIOS = _external_matrix()
EXTERNAL_NAMES = tuple(dict.fromkeys(s.name for s in EXTERNAL_SCENARIOS))


# --- disaggregated serving -----------------------------------------------------------------------

KV_BOUND = "InferenceKVTransferBound"
DECODE_SHORT = "InferenceDecodePoolShort"
PREFILL_SHORT = "InferencePrefillPoolShort"
KV_FAILING = "InferenceKVTransferFailing"
# The pool family: what a disaggregated drill may fire (healthy: none of them).
POOL_ALERTS = (KV_BOUND, KV_FAILING, PREFILL_SHORT, DECODE_SHORT)
# The share of time-to-first-token the KV transfer takes above which the pair is transfer-bound
# (the signature's example threshold).
KV_SHARE_BOUND = 0.3
# The site config of the disaggregated drills: the CPU drills' one, and the pool signatures'
# `for` at 5 min (30 s in the fast profile) instead of 10 min (1 min), as the HBM drill sets its
# own. The pool-short rules' cold-start guard needs a queue-trend window (1 min fast) of the
# pool's history; with the default `for` on top a drill would take three and a half minutes,
# with this one about two. Thresholds and windows stay the shipped ones (transfer > 30 % of
# time to first token, a queue of at least one request, 30 s and 1 min windows).
DISAGG_SITE_CONFIG = CPU_SITE_CONFIG + "".join(
    f"  {alert}:\n    for: 5m\n" for alert in (KV_BOUND, PREFILL_SHORT, DECODE_SHORT)
)


@dataclass(frozen=True)
class DisaggScenario:
    """A prefill and a decode reference engine (the decode one the pair's front), each with
    its sidecar, under one load; the injections go to the decode engine, ``prefill_args`` to
    the prefill one. The decode engine's sidecar replays the GPU ``look``, the prefill
    engine's ``starved`` (a GPU waiting for work)."""

    name: str
    injections: tuple[str, ...]
    signature: str | None  # the signature the drill is for; None: healthy
    why: str
    deadline_s: float
    engine_args: tuple[str, ...] = ()
    prefill_args: tuple[str, ...] = ()
    load: Load = LOAD
    load_why: str = ""
    allowed: dict[str, str] = field(default_factory=dict)  # co-firing alert -> reason
    look: str = "starved"


DISAGG_LOAD = Load(rate=2.0, prompt_tokens=256, output_tokens=64)
DISAGG_SCENARIOS: tuple[DisaggScenario, ...] = (
    DisaggScenario(
        name="healthy-disagg",
        injections=(),
        signature=None,
        why=(
            "the pair with nothing injected: each request's 2 MiB cache crosses the loopback "
            "link in a few tens of milliseconds at most (42 ms on a busy 2-core machine, 4 % "
            "of the time to first token); decode keeps up. No alert may fire, and `diagnose` "
            "may find no pool signature holding at the end; the per-pod ones it may find are "
            "the CPU matrix's to judge (its healthy drill asserts them): the latency budget "
            "does not split a disaggregated request yet, so on the decode pod the remote "
            "prefill and the transfer, on the prefill pod the wait until the cache is read, "
            "count as host time (29 % and 47 % at load 9), and "
            "`InferenceHostLatencyShareHigh` goes pending; on a machine at load 10 "
            "`InferenceDecodeOverheadBound` held too"
        ),
        # The pool-short signatures' cold-start guard holds from a minute after Prometheus's
        # first scrape, their `for` is 30 s: 100 s covers the earliest any could fire.
        deadline_s=100.0,
        load=DISAGG_LOAD,
    ),
    DisaggScenario(
        name="kv-transfer-slow",
        injections=("kv-transfer-slow",),
        signature=KV_BOUND,
        why=(
            "the decode server reads each request's 2 MiB cache at 4 MiB/s: the transfer "
            "takes about half a second, most of the time to first token (a healthy pair's "
            "transfer took 4 % of it), while decode has free slots"
        ),
        deadline_s=120.0,
        load=Load(rate=0.5, prompt_tokens=256, output_tokens=64),
        load_why=(
            "vLLM counts a request whose KV cache is still crossing the link as waiting, and "
            "so does the reference engine: at 2 requests/s the half-second transfers kept a "
            "mean of one request in the decode server's queue, the decode pool looked short "
            "and the signature's 'decode has no queue' never held; at 0.5 requests/s about "
            "0.3 wait"
        ),
    ),
    DisaggScenario(
        name="decode-pool-short",
        injections=("decode-pool-short",),
        signature=DECODE_SHORT,
        why=(
            "the decode server admits one sequence at a time: requests wait for a decode slot, "
            "its queue grows, while the prefill server runs each prompt once and idles"
        ),
        engine_args=("--decode-pool-slots", "1"),
        deadline_s=120.0,
        # A decode engine decoding its one sequence back to back keeps its GPU busy (as in the
        # queue-flood drill): a starved-looking one with the growing queue would add the
        # critical InferenceGPUStarvedQueueGrowing, which diagnose ranks first.
        look="busy",
        allowed={
            "InferenceQueueWaitDominatesLatency": (
                "the decode engine's own queue holds the requests: on that pod queue wait "
                "dominates latency; the pool signature says which pool to grow"
            ),
        },
        load=Load(rate=2.0, prompt_tokens=256, output_tokens=512),
        load_why=(
            "512 output tokens at one sequence a time take about a second even on a quiet "
            "machine (2 ms a token), twice the half second between requests (256 took 0.5 s "
            "there: the queue only hovered)"
        ),
    ),
)
DISAGG_BY_NAME = {s.name: s for s in DISAGG_SCENARIOS}
