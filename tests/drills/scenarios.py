"""The drill matrix: one scenario per injected cause, what must fire, what may fire with it.

Every CPU drill starts from the same load (:data:`LOAD`) against the same reference engine
configuration; only the injection differs, and - where the cause leaves the GPU busy - the
replayed GPU (see :mod:`exporter.lab.refengine.gputrace`). Before the load, each drill measures
what its engine serves on this machine and sizes the load and the injection from that
(:mod:`drills.calibrate`, :mod:`drills.sizing`): a drill whose cause is a lack of capacity
offers a set factor more than the engine admits (:data:`OVERLOAD_DRILL`), the others keep well
within what it serves (:data:`KEEP_UP_DRILL`). How long a drill waits comes from the rule
pack's timings (:func:`deadline`). Co-firing is allowed only where it is written down here with
the reason; any other alert that fires fails the drill.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from drills.timing import ONSET_S, Deadline, fire_deadline, quiet_deadline

from exporter.lab.layouts import DEFAULT_LAYOUT, rule_profile
from exporter.lab.thirdparty import LLAMA_PARALLEL, TRITON_INSTANCES


@dataclass(frozen=True)
class Load:
    rate: float = 2.0
    prompt_tokens: int = 256
    output_tokens: int = 192


LOAD = Load()

# How a drill sizes its load from what its engine serves (drills.sizing).
KEEP_UP_DRILL = "keep up"  # within what the engine's full batch serves: no queue
OVERLOAD_DRILL = "overload"  # a set factor more than its admitted sequences serve
# The reference engine's full batch (--max-num-seqs, its default) and queue-flood's admission
# (--flood-max-num-seqs, its default).
MAX_NUM_SEQS = 16
FLOOD_SEQS = 1

# The engine of every drill: the defaults (tiny model, 16 sequences, 1 torch thread on a small
# machine, worker at nice 5 on CPU) plus what a scenario adds.
ENGINE_ARGS: tuple[str, ...] = ()

# The site config of every CPU drill (a scenario's own ``rules_config`` replaces it). The
# reference engine on a CPU spends about half of each healthy decode step in Python (the
# dispatch of ~70 small operators, sampling): its decode roofline efficiency read 0.27-0.70 in
# the healthy drills measured, under the default 0.33 on a busy machine with nothing injected,
# and 0.05-0.11 in the decode-overhead drill (its host work 12 decode steps: drills.sizing's
# OVERHEAD_STEPS; with 6 it read 0.135-0.17, and a CI run's alert began its `for` again when
# a fuller batch took it over 0.17). The CPU drills put InferenceDecodeOverheadBound's
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
    look: str | None = "starved"  # replayed GPU; None: the real GPU through NVML
    allowed: dict[str, str] = field(default_factory=dict)  # co-firing alert -> reason
    engine_args: tuple[str, ...] = ()
    gpu: bool = False
    rules_config: str = ""  # site config of the rule pack (YAML), for Prometheus and diagnose
    load: Load = LOAD  # before sizing (drills.sizing)
    engine: str = "reference"  # or a third-party engine (EXTERNAL_ENGINES)
    restart_at_s: float | None = None  # the engine is killed and started again then
    sizing: str = KEEP_UP_DRILL
    admitted: int = MAX_NUM_SEQS  # the sequences the engine admits at once in this drill
    full: int = MAX_NUM_SEQS  # the engine's full batch
    onset_s: float = ONSET_S  # for the cause to show once the load runs (drills.timing)
    quiet_s: float | None = None  # a healthy drill's watch, where a budget sets it (GPU)
    quiet_why: str = ""
    # Who reads the GPUs (exporter.lab.layouts; the rules: that layout's fast profile).
    layout: str = DEFAULT_LAYOUT
    # A stand-in llm-d endpoint picker in front of the engine (exporter.lab.gateway): the load
    # goes to it, its injections (stale-endpoints) to it.
    gateway: bool = False

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
    ),
    Scenario(
        name="tokenizer-slow",
        injections=("tokenizer-slow",),
        expected=TOKENIZER,
        why=(
            "the probe's ~512-token prompt takes the pure-Python BPE path on the engine's "
            "single tokenizer thread, held to three of the decode steps measured at the full "
            "batch, the longest: the tokenizer is slower than a decode step on any machine"
        ),
    ),
    Scenario(
        name="frontend-gil",
        injections=("frontend-gil",),
        # No pre-processing until the load starts: the calibration measures the engine.
        engine_args=("--gil-request-ms", "0", "--gil-chunk-ms", "0"),
        expected=FRONTEND,
        why=(
            "pure-Python pre-processing (CPU time per request sized to offer one and a half "
            "cores at the load's rate; two requests at a time, the rest wait for a turn) and "
            "post-processing of every chunk run in the event-loop thread: it sits above 90 % "
            "of a core while the GPU is starved, and still answers the engine's /metrics "
            "between its slices"
        ),
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
            "the scheduler admits one sequence at a time: the load offers three times what one "
            "sequence serves (measured), requests wait in the queue for most of their latency"
        ),
        look="busy",
        sizing=OVERLOAD_DRILL,
        admitted=FLOOD_SEQS,
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
            "four busy-looping processes per CPU take the host's CPU: the load offers three "
            "times the most the contended engine's full batch could serve (measured with the "
            "busy-loopers running; the drill's own load where that is more), the queue grows "
            "while the GPU idles"
        ),
        sizing=OVERLOAD_DRILL,
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
            "the loopback UDP flood keeps NET_RX softirq at 15 % or more of the node's CPU "
            "time, three times the threshold at least, on the core the engine runs on: the "
            "share of that core that slows a healthy decode step to three quarters of the "
            "drill's inter-token objective (at most half of it); it starts once the drill has "
            "measured the engine without it"
        ),
        # No flood until the drill sizes it: its objectives come from the engine without.
        engine_args=("--softirq-target", "0"),
        allowed={
            DECODE: (
                "the flood's interrupts run on the engine's core, between its decode steps: "
                "the steps stretch far above their floor while the replayed memory bus idles "
                "(pending beside softirq in a fresh-clone CI run); the consequence, which the "
                "softirq signature explains and diagnose ranks below it"
            ),
        },
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
        quiet_s=60.0,
        quiet_why=(
            "a lent GPU's minutes go to the injected drills (bench/gpu/run.sh): a minute, "
            "shorter than the slowest GPU signature's window and `for`"
        ),
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
        look=None,
        gpu=True,
        allowed={
            STARVED: "preempted sequences requeue: the queue grows while the GPU waits",
            QUEUE_WAIT: "requeued sequences wait most of their latency",
        },
    ),
)

SCENARIOS += (
    Scenario(
        name="decode-overhead",
        injections=("decode-overhead",),
        expected=DECODE,
        why=(
            "host work on the model worker's step path before every decode step, six decode "
            "steps' worth (measured at the two sequences the load keeps running): each step "
            "takes several times its floor (the time its weight and KV reads take at the rate "
            "this host's kernels stream them, the trace's peak) while the replayed GPU's "
            "memory bus stays under half busy"
        ),
        # No overhead until the load starts: the calibration measures the plain step.
        engine_args=("--decode-overhead-ms", "0"),
        allowed={
            STARVED: (
                "should the machine slow down after the calibration the slowed steps may not "
                "keep up: the queue grows while the GPU waits, the consequence of the overhead"
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
        onset_s=HBM_AFTER_S + ONSET_S,
        look=None,
        gpu=True,
        allowed={
            STARVED: "a slower engine may let the queue grow while NVML samples show gaps",
            QUEUE_WAIT: "slower decoding makes requests wait longer in the queue",
        },
    ),
)

# --- layouts (issue 33 item 4) -----------------------------------------------------------------
#
# Every drill runs in the chart's default layout, ``node`` (a node agent reads the GPUs, the
# sidecar has no NVML, Prometheus loads ``fast-node``), but one CPU drill in each other layout:
# softirq in the sidecar layout (its signature reads the node's CPU, which every sidecar
# reads), frontend-gil in the dcgm layout (its signature is GPU-gated: the starved GPU is read
# through dcgm-exporter's utilisation and the ``fast-dcgm`` rules' join to the pod; its
# post-mortem's roofline plot reads the replayed GPU's peaks, which the lab's dcgm layout gives
# its site config, as a site gives those of a product the table lacks). Both are among the
# quickest (118 s). Third-party engines (their softirq drills too: the alert names the engine's
# pod, never the node agent's) and the disaggregated pair run in the node layout.
OTHER_LAYOUTS = {"softirq": "sidecar", "frontend-gil": "dcgm"}
SCENARIOS = tuple(
    replace(s, layout=OTHER_LAYOUTS[s.name]) if s.name in OTHER_LAYOUTS else s for s in SCENARIOS
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
# more than the contended one gets), Triton at 2 requests/s of 192 tokens; each sized to what
# the engine serves as the reference engine's drills are (drills.sizing).
EXTERNAL_LOADS = {
    "llamacpp": Load(rate=3.0, prompt_tokens=64, output_tokens=128),
    "triton": Load(rate=2.0, prompt_tokens=64, output_tokens=192),
}
# The engines' slots (llama-server's --parallel, Triton's model instances) as the drills run
# them; queue-flood admits one.
EXTERNAL_SLOTS = {"llamacpp": LLAMA_PARALLEL, "triton": TRITON_INSTANCES}


def _external(
    engine: str, base: Scenario, expected: str | None, why: str, **kw: object
) -> Scenario:
    slots = EXTERNAL_SLOTS[engine]
    return Scenario(
        name=base.name,
        injections=base.injections,
        expected=expected,
        why=why,
        look=base.look,
        allowed=dict(kw.get("allowed", {})),  # type: ignore[call-overload]
        load=EXTERNAL_LOADS[engine],
        engine=engine,
        restart_at_s=kw.get("restart_at_s"),  # type: ignore[arg-type]
        sizing=base.sizing,
        admitted=min(slots, base.admitted),
        full=slots,
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
            restart_at_s=LLAMA_RESTART_S,
        ),
        _external("triton", base["healthy"], None, "nothing injected"),
        _external(
            "llamacpp",
            base["queue-flood"],
            None,
            (
                "one slot (--parallel 1): a request that arrives while it is busy is deferred "
                "(llamacpp:requests_deferred), but llama-server exports no queue time, so "
                "InferenceQueueWaitDominatesLatency cannot fire, and on the busy GPU nothing "
                "else may; the load offers three times what one slot serves, as for the others"
            ),
        ),
        _external(
            "triton",
            base["queue-flood"],
            QUEUE_WAIT,
            (
                "one model instance (--instances 1): the load offers three times what it serves "
                "(measured), the rest wait in Triton's queue (nv_inference_queue_duration_us)"
            ),
        ),
        _external(
            "llamacpp",
            base["cpu-contention"],
            STARVED,
            (
                "four busy-looping processes per CPU take the host: the load offers three times what "
                "the contended llama-server serves (or its own, where that is more), its "
                "deferred requests grow while the GPU idles"
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
    engine_args: tuple[str, ...] = ()
    prefill_args: tuple[str, ...] = ()
    load: Load = LOAD  # before sizing (drills.sizing)
    load_why: str = ""  # why the drill starts from another load than DISAGG_LOAD
    allowed: dict[str, str] = field(default_factory=dict)  # co-firing alert -> reason
    look: str = "starved"
    sizing: str = KEEP_UP_DRILL
    admitted: int = MAX_NUM_SEQS  # the decode engine's slots
    full: int = MAX_NUM_SEQS
    onset_s: float = ONSET_S
    layout: str = DEFAULT_LAYOUT  # who reads the GPUs (Scenario.layout)


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
        load=DISAGG_LOAD,
    ),
    DisaggScenario(
        name="kv-transfer-slow",
        injections=("kv-transfer-slow",),
        signature=KV_BOUND,
        why=(
            "the decode server reads each request's 2 MiB cache over a link throttled so that "
            "the transfer takes twice the pair's measured time to first token: most of the "
            "time to first token (a healthy pair's transfer took 4 % of it), while decode has "
            "free slots. vLLM counts a request whose KV cache is still crossing the link as "
            "waiting, and so does the reference engine: the rate keeps 0.1 requests reading "
            "on average (0.3 at most, where fewer would finish 0.25 a second) (at 2 requests/s the half-second transfers kept a mean of one request "
            "in the decode server's queue, the decode pool looked short and the signature's "
            "'decode has no queue' never held)"
        ),
        # The link unthrottled until the load starts: the calibration measures the pair.
        engine_args=("--kv-link-mib-s", "100000"),
        load=DISAGG_LOAD,
    ),
    DisaggScenario(
        name="decode-pool-short",
        injections=("decode-pool-short",),
        signature=DECODE_SHORT,
        why=(
            "the decode server admits one sequence at a time: the load offers three times what it "
            "serves (measured), requests wait for a decode slot, its queue grows, while the "
            "prefill server runs each prompt once and idles (requests decode twelve times as "
            "long as their first token takes: the prefill server a quarter busy)"
        ),
        engine_args=("--decode-pool-slots", "1"),
        sizing=OVERLOAD_DRILL,
        admitted=1,
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
        load_why="up to 512 output tokens, so that decoding can take twelve times the prefill",
    ),
)
DISAGG_BY_NAME = {s.name: s for s in DISAGG_SCENARIOS}


# --- the gateway (issue 34) ---------------------------------------------------------------------
#
# The reference engine behind a stand-in llm-d endpoint picker (exporter/lab/gateway.py) that
# holds requests in its flow-control queue while it finds its pool saturated, and serves the
# picker's metrics to a sidecar of its own (--engine.type llmd-epp). Kept apart from the CPU
# matrix (tests/drills/test_gateway_drill.py): its alert fires on the gateway's target, not the
# engine's.

STALE_ENDPOINTS = "InferenceGatewayStaleEndpoints"
GATEWAY_SCENARIOS: tuple[Scenario, ...] = (
    Scenario(
        name="gateway-stale-endpoints",
        injections=("stale-endpoints",),
        expected=STALE_ENDPOINTS,
        why=(
            "the gateway's reads of the engine's metrics go to a port nothing listens on (the "
            "engine's serving port still answers): the metrics turn stale, the saturation "
            "detector counts the endpoint as saturated (1.0), and flow control holds every "
            "request until its 30 s TTL evicts it - the load keeps well within what the engine "
            "serves, none of it reaches the engine, whose GPU idles"
        ),
        gateway=True,
        allowed={
            STARVED: (
                "the engine's share of the gateway's queue grows while its GPU idles: the "
                "consequence, which the gateway's signature explains and diagnose ranks below it"
            ),
        },
    ),
)
GATEWAY_BY_NAME = {s.name: s for s in GATEWAY_SCENARIOS}


# --- how long each drill waits ---------------------------------------------------------------

# The signatures the CPU matrix fires: a healthy drill stays quiet as long as the slowest of
# them would take to fire.
CPU_DRILLED = tuple(dict.fromkeys(s.expected for s in CPU_SCENARIOS if s.expected))


def deadline(scenario: Scenario | DisaggScenario) -> Deadline:
    """How long the drill waits after its load starts (drills.timing): an injected drill for
    its alert's windows, ``for``, onset and lag; a healthy one for the slowest of the alerts it
    guards against (the CPU matrix's, or the pool family's), or its stated budget. The timings
    are those of the profile the drill's Prometheus loads (its layout's)."""
    profile = rule_profile(scenario.layout)
    if isinstance(scenario, DisaggScenario):
        if scenario.signature is not None:
            return fire_deadline(
                scenario.signature, DISAGG_SITE_CONFIG, onset_s=scenario.onset_s, profile=profile
            )
        return quiet_deadline(POOL_ALERTS, DISAGG_SITE_CONFIG, profile)
    if scenario.expected is not None:
        return fire_deadline(
            scenario.expected, scenario.site_config(), onset_s=scenario.onset_s, profile=profile
        )
    if scenario.quiet_s is not None:
        return Deadline(scenario.quiet_s, scenario.quiet_why)
    return quiet_deadline(CPU_DRILLED, scenario.site_config(), profile)
