"""Sizing: a drill's load and injection from what its calibration measured on this machine.

Every size is a set factor of something measured (:mod:`drills.calibrate`), never a number
that holds on one machine only. The measurements, for requests of the drill's prompt:

- ``P``: time to first token, one sequence at a time (the prefill and the first token);
- ``t(1)``: the decode step of one sequence, ``t(n)``: of the engine's full batch of ``n``
  (straight between the two for the batches in between);

and, from them, what the engine serves: with ``a`` sequences admitted, requests of ``o``
output tokens finish at ``a / (P + (o - 1) t(a))`` a second when each runs alone in its slot,
and at ``1 / (P + (o - 1) t(n) / n)`` when the batch is full (each request takes its prefill
and an ``n``-th of each of its decode steps).

How each kind of drill uses them:

- **keep up** (the healthy drills, and those whose cause is not a lack of capacity): the
  load's rate is at most :data:`KEEP_UP` of what the full batch serves, so no queue forms;
  the drill's own rate when that is lower. Where even :data:`MIN_RATE` would be more, the
  requests are shortened (not below :data:`MIN_OUTPUT` tokens) until it is not;
- **overload** (``queue-flood``, ``decode-pool-short``, ``cpu-contention``): the rate is
  :data:`OVERLOAD` times what the admitted sequences serve (under ``cpu-contention``: the most
  the contended engine's full batch could serve, from one sequence measured with the
  busy-loopers running, batching taken as free; the drill's own rate where that is more), so
  the queue
  grows by twice what the engine serves every second, on any machine - and still grows should
  a shared machine's neighbours go quiet after the calibration and the engine serve up to
  three times as much; requests are shortened where fewer than :data:`MIN_RATE` would finish
  a second (each 30 s window of the fast profile then holds several), and lengthened where
  the queue would otherwise pass :data:`IN_FLIGHT_BUDGET` requests before the deadline (the
  load generator's bound on open requests would then stop its growth);
- **injection sizes**, each relative to the step it competes with: the slow tokenizer takes
  :data:`TOKENIZER_STEPS` decode steps of the full batch (the longest step) for the sidecar's
  probe, and at least :data:`TOKENIZER_TTFTS` healthy first tokens for a request's prompt
  (so that the drill's objective on the first token can lie between the two: drills.slo),
  its thread busy :data:`TOKENIZER_CPU` of a core at most;
  the decode overhead is :data:`OVERHEAD_STEPS` decode steps of the :data:`OVERHEAD_BATCH`
  sequences its load keeps running; the front-end's pre-processing offers
  :data:`GIL_CORES` cores of work at the load's rate; a slow KV link takes
  :data:`KV_TTFTS` times the pair's time to first token for one request's cache, at a rate
  that keeps :data:`KV_WAITING` requests reading on average (up to :data:`KV_WAITING_MAX` where
  fewer would finish under :data:`MIN_RATE` a second); the decode pool's requests
  decode :data:`DECODE_TTFTS` times as long as their first token takes (with shorter prompts,
  whose prefill takes in proportion to its tokens, where such requests would finish fewer
  than :data:`MIN_RATE` a second); the softirq flood takes the share of the engine's core
  that stretches a healthy decode step to :data:`SOFTIRQ_REACH` of the drill's inter-token
  objective (at most :data:`SOFTIRQ_ENGINE_MAX`), under half a keep-up load
  (:data:`SOFTIRQ_KEEP_UP`).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from drills.calibrate import Calibration
from drills.scenarios import Load
from drills.slo import choose, healthy_estimate

from exporter.lab.refengine.inject import INJECTION_SIZES, SOFTIRQ_CORE_CAP

# The softirq flood's share of the node's CPU time at least (three times the signature's 5 %:
# the engine's default) and the most of its own core it takes.
SOFTIRQ_TARGET = INJECTION_SIZES["softirq_target"].default
# The flood's share of the engine's core is sized against the drill's inter-token objective: the
# share that stretches a healthy step (drills.slo.healthy_estimate) to SOFTIRQ_REACH of the
# objective, a step taking 1 / (1 - share) as long. With 30 % of the core (the flood's size until
# 2026-12-07) the median gap came out at 0.89 to 0.92 times that in three runs, at 0.49 to 0.6
# of the objective, and burned the budget 0.4x to 3.1x over 1m (under 1 in a CI run): the tail
# past the objective is thin until the median nears it. Sized so, at SOFTIRQ_KEEP_UP, four runs
# (33 to 50 % of the core) burned 8.4x to 13x over 1m and the same drill without the flood
# 0.09x at most (two runs; docs/slo.md). At most SOFTIRQ_ENGINE_MAX of the core.
SOFTIRQ_REACH = 0.75
SOFTIRQ_ENGINE_MAX = 0.5
# The softirq drill's load, as a share of what the full batch serves: half a keep-up load. At
# KEEP_UP the engine's batch of two or three sequences keeps its core about 45 % busy (by the
# calibration's steps), and a flood of 41 to 49 % of that core tipped it into a batch of 9 to 10
# and a growing queue in two of three runs (2026-12-07); at half the load it has room.
SOFTIRQ_KEEP_UP = 0.15
KEEP_UP = 0.3  # a keep-up load: at most this share of what the full batch serves
OVERLOAD = 3.0  # an overload: this many times what the admitted sequences serve
MIN_RATE = 0.25  # requests a second below which requests are shortened (7 in 30 s)
MIN_OUTPUT = 16  # output tokens a request keeps at least
MIN_PROMPT = 32  # prompt tokens a request keeps at least
MAX_MODEL_LEN = 1024  # the reference engine's --max-model-len: prompt + output at most
# The load's prompts are drawn words sized by an estimate of tokens per word: a prompt of P
# tokens may come out a tenth longer. A request the engine's context cannot hold is refused
# (HTTP 400), so a lengthened request leaves this much room (a fast quiet machine lengthened
# queue-flood's to 256 + 767 tokens and the engine refused every one).
PROMPT_SLACK = 0.25
IN_FLIGHT_BUDGET = 256  # an overload's queue by its deadline at most (the load keeps 512)
TOKENIZER_STEPS = 3.0  # the slow tokenizer: the probe takes this many decode steps
TOKENIZER_CPU = 0.5  # ... and its thread at most this share of a core (probes and prompts)
TOKENIZER_TTFTS = 2.0  # ... and a prompt this many healthy first tokens, where that allows
OVERHEAD_STEPS = 12.0  # decode-overhead: host work of this many decode steps (scenarios.py)
OVERHEAD_BATCH = 2  # ... of this batch, which its load keeps running
GIL_CORES = 1.5  # frontend-gil: pre-processing offered, in cores of CPU time
KV_TTFTS = 2.0  # kv-transfer-slow: one request's cache takes this many times to first token
KV_WAITING = 0.1  # ... at a rate that keeps this many requests reading their cache
KV_WAITING_MAX = 0.3  # ... or up to this many, where fewer would finish under MIN_RATE a second
DECODE_TTFTS = 12.0  # decode-pool-short: decoding takes this many times to first token
PROBE_INTERVAL_S = 1.0  # the drills' sidecar probes the tokenizer this often

KEEP_UP_DRILL = "keep up"
OVERLOAD_DRILL = "overload"


@dataclass(frozen=True)
class Engine:
    """The engine model of :mod:`drills.sizing` (its docstring) from one calibration."""

    prefill_s: float  # P
    step_one_s: float  # t(1)
    step_full_s: float  # t(n)
    full: int  # n
    prompt_tokens: int = 256  # the prompt P was measured with

    @classmethod
    def of(cls, cal: Calibration, full: int) -> Engine:
        """From a calibration; one measured by whole requests (no time per token) puts all of
        a request's time on its tokens, so that requests as long as measured come out right."""
        one = cal.one
        step_full = cal.full.step_s if cal.full is not None else one.step_s
        prefill = one.ttft_s if one.tpot_s is not None else 0.0
        return cls(prefill, one.step_s, max(step_full, one.step_s), full, one.prompt_tokens)

    def prefill(self, prompt: int) -> float:
        """P for a prompt of ``prompt`` tokens (in proportion to the one measured)."""
        return self.prefill_s * prompt / self.prompt_tokens

    def step(self, batch: float) -> float:
        """The decode step at ``batch`` sequences (straight between one and the full batch)."""
        if self.full <= 1:
            return self.step_one_s
        share = min(1.0, max(0.0, (batch - 1) / (self.full - 1)))
        return self.step_one_s + share * (self.step_full_s - self.step_one_s)

    def served(self, admitted: int, output: int, overhead_s: float = 0.0) -> float:
        """Requests a second ``admitted`` sequences serve, each running in its own slot."""
        return admitted / (self.prefill_s + (output - 1) * (self.step(admitted) + overhead_s))

    def served_full(self, output: int, overhead_s: float = 0.0) -> float:
        """Requests a second the full batch serves."""
        per_token = (self.step_full_s + overhead_s) / self.full
        return 1.0 / (self.prefill_s + (output - 1) * per_token)


@dataclass
class Plan:
    """What a drill runs: its load, the injection's sizes (``POST /lab/injection`` when the load
    starts), and how each was chosen."""

    load: Load
    sizes: dict[str, float] = field(default_factory=dict)
    served: float = 0.0  # requests/s the engine serves for these requests, as sized against
    how: list[str] = field(default_factory=list)
    # What the injection adds to a request's latency, per objective (drills.slo's kinds: "ttft",
    # "itl"), in seconds: the drill's objective for that kind lies between a healthy request
    # and one delayed so much (drills.slo.choose).
    adds: dict[str, float] = field(default_factory=dict)
    # A keep-up load's share of what the full batch serves (drills.slo.choose's ``keep_up``).
    keep_up: float = KEEP_UP

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _longest(limit: float, engine: Engine, served: Any, base: int) -> int:
    """The most output tokens (at most ``base``, at least MIN_OUTPUT) for which ``served(o)``
    is at least ``limit``."""
    output = base
    while output > MIN_OUTPUT and served(output) < limit:
        output = max(MIN_OUTPUT, int(output * 0.8))
    return output


def keep_up(engine: Engine, base: Load, plan: Plan, overhead_s: float = 0.0) -> Load:
    """At most ``plan.keep_up`` (:data:`KEEP_UP` unless the drill says) of what the full batch
    serves; shorter requests below MIN_RATE."""
    share = plan.keep_up
    full = engine.served_full(base.output_tokens, overhead_s)
    if share * full >= base.rate:
        plan.served = full
        plan.how.append(
            f"the full batch serves {full:.2f}/s: the drill's {base.rate:g}/s is within "
            f"{share:g} of it"
        )
        return base
    output = _longest(
        MIN_RATE / share,
        engine,
        lambda o: engine.served_full(o, overhead_s),
        base.output_tokens,
    )
    full_then = engine.served_full(output, overhead_s)
    rate = min(base.rate, share * full_then)
    plan.served = full_then
    shorter = f", requests of {output} tokens" if output != base.output_tokens else ""
    plan.how.append(
        f"the full batch serves {full:.2f}/s of {base.output_tokens}-token requests: "
        f"{rate:.2f}/s{shorter} ({share:g} of {full_then:.2f}/s)"
    )
    return Load(rate=round(rate, 3), prompt_tokens=base.prompt_tokens, output_tokens=output)


def overload(
    engine: Engine, base: Load, plan: Plan, admitted: int, *, full: bool, deadline_s: float
) -> Load:
    """OVERLOAD times what the admitted sequences serve; ``full``: what the full batch serves
    at most, each of its steps as short as one sequence's (batching for free)."""

    def served(o: int) -> float:
        return engine.served_full(o) if full else engine.served(admitted, o)

    def finishing(o: int) -> float:  # what surely finishes: one sequence at a time
        return engine.served(1, o) if full else served(o)

    output = _longest(MIN_RATE, engine, finishing, base.output_tokens)
    output = _bounded(served, output, base.prompt_tokens, deadline_s)
    capacity = served(output)
    rate = OVERLOAD * capacity
    plan.served = capacity
    what = (
        f"the full batch of {engine.full} (at most)"
        if full
        else f"{admitted} admitted sequence{'s' if admitted > 1 else ''}"
    )
    shorter = f" (requests of {output} tokens)" if output != base.output_tokens else ""
    plan.how.append(f"{what} serve {capacity:.2f}/s{shorter}: {OVERLOAD:g}x that is {rate:.2f}/s")
    return Load(rate=round(rate, 3), prompt_tokens=base.prompt_tokens, output_tokens=output)


def _room(prompt: int) -> int:
    """The longest output a request of a ``prompt``-token prompt may ask for."""
    return MAX_MODEL_LEN - prompt - int(prompt * PROMPT_SLACK) - 1


def _bounded(served: Any, output: int, prompt: int, deadline_s: float) -> int:
    """``output``, lengthened (to what the engine's context allows) while an overload's queue,
    growing by (OVERLOAD - 1) x ``served(o)`` a second, would pass IN_FLIGHT_BUDGET by the
    deadline."""
    longest = _room(prompt)
    while output < longest and (OVERLOAD - 1) * served(output) * deadline_s > IN_FLIGHT_BUDGET:
        output = min(longest, int(output * 1.25) + 1)
    return output


def plan(
    kind: str,
    injections: tuple[str, ...],
    base: Load,
    cal: Calibration,
    *,
    admitted: int,
    full: int,
    deadline_s: float,
    cpus: int = 0,
) -> Plan:
    """The drill's plan: ``kind`` (:data:`KEEP_UP_DRILL` or :data:`OVERLOAD_DRILL`), the
    injections it sizes, its base load, its calibration, the sequences its engine admits, its
    full batch and its deadline; ``cpus``: the node's CPUs where the reference engine runs the
    softirq flood (it starts it once sized), 0 where something else runs it."""
    engine = Engine.of(cal, full)
    out = Plan(load=base)
    if "decode-overhead" in injections:
        _decode_overhead(engine, base, out)
    elif "kv-transfer-slow" in injections:
        _kv_transfer(engine, base, cal, out)
    elif "decode-pool-short" in injections:
        _decode_pool(engine, base, out, admitted, deadline_s)
    elif kind == OVERLOAD_DRILL:
        contended = "cpu-contention" in injections
        out.load = overload(engine, base, out, admitted, full=contended, deadline_s=deadline_s)
        if contended and out.load.rate < base.rate:
            out.how.append(f"the drill's own {base.rate:g}/s is more, and offered")
            out.load = Load(base.rate, out.load.prompt_tokens, out.load.output_tokens)
    else:
        if "softirq" in injections and cpus:
            out.keep_up = SOFTIRQ_KEEP_UP
        out.load = keep_up(engine, base, out)
    if "tokenizer-slow" in injections:
        _tokenizer(engine, cal, out)
    if "softirq" in injections and cpus:
        _softirq(out, cpus, cal, out.keep_up if kind == KEEP_UP_DRILL else 0.0)
    if "frontend-gil" in injections:
        ms = GIL_CORES * 1000.0 / out.load.rate
        out.sizes["gil_request_ms"] = round(ms, 1)
        out.sizes["gil_chunk_ms"] = 2.0
        out.how.append(
            f"pre-processing {ms:.0f} ms of CPU per request: {GIL_CORES:g} cores at "
            f"{out.load.rate:g}/s, and 2 ms per streamed chunk"
        )
    return out


def _softirq(plan: Plan, cpus: int, cal: Calibration, keep_up: float) -> None:
    """The flood starts after the calibration: the drill's objectives come from the engine
    without it (drills.slo's margins, as a healthy drill's). The engine runs on the flood's core
    (``exporter.lab.refengine.inject.pin_engine``), of which the flood takes the share that
    stretches a healthy step to :data:`SOFTIRQ_REACH` of the drill's inter-token objective (so
    that the cause burns an objective the healthy engine keeps), at most
    :data:`SOFTIRQ_ENGINE_MAX`; and never less than :data:`SOFTIRQ_TARGET` of the node (three
    times the signature's threshold) or, where that is more than one core, the flood's cap of
    its core (:data:`SOFTIRQ_CORE_CAP`: the busiest core then crosses the signature's share)."""
    measured = cal.to_json()
    _, healthy = healthy_estimate(measured, keep_up)
    objective = choose(measured, keep_up).itl_s
    wanted = 1.0 - healthy / (SOFTIRQ_REACH * objective)
    floor = min(SOFTIRQ_CORE_CAP, SOFTIRQ_TARGET * cpus)
    share = max(floor, min(SOFTIRQ_ENGINE_MAX, wanted))
    target = round(share / cpus, 4)
    plan.sizes["softirq_target"] = target
    stretched = healthy / (1.0 - share)
    plan.how.append(
        f"once calibrated, the flood keeps {target:.1%} of the node's {cpus} CPUs in softirq: "
        f"{share:.0%} of the core the engine runs on, a healthy step of "
        f"{healthy * 1000:.1f} ms stretched to {stretched * 1000:.1f} ms, "
        f"{stretched / objective:.2f} of the {objective * 1000:g} ms objective"
    )


def _tokenizer(engine: Engine, cal: Calibration, plan: Plan) -> None:
    if not cal.probe_tokens:
        raise ValueError("tokenizer-slow is sized from the tokenizer probe: none measured")
    load = plan.load
    # The full batch's step, the longest the engine takes: the median inter-token latency
    # stays below it at any batch the load keeps, and the drill's own streams (which the
    # one-sequence calibration did not carry) lengthen the steps toward it.
    step = engine.step_full_s
    # What a healthy request's first token takes (drills.slo.healthy_estimate): the prompt's
    # tokenization should add TOKENIZER_TTFTS of it, so that the drill's objective on the
    # first token can lie between a healthy request and a tokenized one (the cause alone
    # burns it), where the thread's share allows.
    healthy = engine.prefill_s + step
    per_token = max(
        TOKENIZER_STEPS * step / cal.probe_tokens,
        TOKENIZER_TTFTS * healthy / max(1, load.prompt_tokens),
    )
    # The tokenizer's thread: one probe a second and every request's prompt.
    cpu = (cal.probe_tokens / PROBE_INTERVAL_S + load.rate * load.prompt_tokens) * per_token
    if cpu > TOKENIZER_CPU:
        per_token *= TOKENIZER_CPU / cpu
    probe_s = per_token * cal.probe_tokens
    prompt_s = per_token * load.prompt_tokens
    # A request waits for the probe it arrives during: half of one, as often as one runs.
    waits_s = min(1.0, probe_s / PROBE_INTERVAL_S) * probe_s / 2.0
    plan.sizes["tokenizer_slow_us_per_token"] = round(per_token * 1e6, 1)
    plan.adds["ttft"] = round(prompt_s + waits_s, 4)
    plan.how.append(
        f"decode step {1000 * step:.1f} ms at the full batch: the slow tokenizer takes "
        f"{1000 * probe_s:.0f} ms for the probe's {cal.probe_tokens} tokens "
        f"({probe_s / step:.1f} steps; the fast one {_ms(cal.tokenizer_s)}) and "
        f"{1000 * prompt_s:.0f} ms for a prompt ({prompt_s / healthy:.1f}x a healthy first "
        f"token, {1000 * healthy:.0f} ms), {1000 * waits_s:.0f} ms more behind the probes"
    )


def _decode_overhead(engine: Engine, base: Load, plan: Plan) -> None:
    step = engine.step(OVERHEAD_BATCH)
    overhead = OVERHEAD_STEPS * step
    plan.sizes["decode_overhead_ms"] = round(1000 * overhead, 1)

    def served(o: int) -> float:  # the rate that keeps OVERHEAD_BATCH running
        return OVERHEAD_BATCH / (engine.prefill_s + (o - 1) * (step + overhead))

    output = _longest(MIN_RATE, engine, served, base.output_tokens)
    rate = min(base.rate, served(output), KEEP_UP * engine.served_full(output, overhead))
    plan.served = served(output)
    plan.load = Load(round(rate, 3), base.prompt_tokens, output)
    shorter = f", requests of {output} tokens" if output != base.output_tokens else ""
    plan.how.append(
        f"decode step {1000 * step:.1f} ms at {OVERHEAD_BATCH} sequences: "
        f"{1000 * overhead:.0f} ms of host work before each ({OVERHEAD_STEPS:g} steps); "
        f"{rate:.2f}/s{shorter} keeps about {OVERHEAD_BATCH} running"
    )


def _kv_transfer(engine: Engine, base: Load, cal: Calibration, plan: Plan) -> None:
    if not cal.kv_bytes:
        raise ValueError("kv-transfer-slow is sized from the KV bytes of a request: none")
    transfer = KV_TTFTS * engine.prefill_s
    mib_s = cal.kv_bytes / transfer / 2**20
    plan.sizes["kv_link_mib_s"] = round(mib_s, 3)
    plan.adds["ttft"] = round(transfer, 4)  # the decode server's first token waits for it
    load = keep_up(engine, base, plan)
    # A request reading its cache counts as waiting (vLLM's and the reference engine's queue):
    # each one a scrape sees is a moment's queue of 1, and a queue of 1 that grew, on a starved
    # GPU, is InferenceGPUStarvedQueueGrowing's condition (critical: diagnose would rank it
    # first at that moment). Few reading, then - but enough requests for each window.
    rate = min(load.rate, max(KV_WAITING / transfer, min(MIN_RATE, KV_WAITING_MAX / transfer)))
    plan.load = Load(round(rate, 3), load.prompt_tokens, load.output_tokens)
    plan.how.append(
        f"time to first token {1000 * engine.prefill_s:.0f} ms, a request's cache "
        f"{cal.kv_bytes / 2**20:.2f} MiB: the link at {mib_s:.2f} MiB/s takes "
        f"{transfer:.2f} s ({KV_TTFTS:g}x); {rate:.2f}/s keeps {rate * transfer:.2f} reading"
    )


def _decode_pool(engine: Engine, base: Load, plan: Plan, admitted: int, deadline_s: float) -> None:
    """Requests that decode DECODE_TTFTS times as long as their first token takes; their
    prompts shortened where such requests would finish fewer than MIN_RATE a second."""
    step = engine.step(admitted)
    longest_prefill = 1.0 / (DECODE_TTFTS * MIN_RATE)
    prompt = base.prompt_tokens
    if engine.prefill(prompt) > longest_prefill:
        prompt = max(MIN_PROMPT, int(prompt * longest_prefill / engine.prefill_s))
    prefill = engine.prefill(prompt)
    shaped = Engine(prefill, engine.step_one_s, engine.step_full_s, engine.full, prompt)
    output = max(MIN_OUTPUT, 1 + math.ceil((DECODE_TTFTS - 1) * prefill / step))
    output = _bounded(lambda o: shaped.served(admitted, o), output, prompt, deadline_s)
    output = min(output, _room(prompt))
    capacity = shaped.served(admitted, output)
    rate = OVERLOAD * capacity
    plan.served = capacity
    plan.load = Load(round(rate, 3), prompt, output)
    shorter = f", prompts of {prompt} tokens" if prompt != base.prompt_tokens else ""
    plan.how.append(
        f"time to first token {1000 * engine.prefill_s:.0f} ms, decode step "
        f"{1000 * step:.1f} ms: requests of {output} tokens decode at least "
        f"{DECODE_TTFTS:g}x as long as their first token takes{shorter}; {admitted} decode "
        f"slot(s) serve {capacity:.2f}/s, {OVERLOAD:g}x that is {rate:.2f}/s (the prefill "
        f"server busy {rate * prefill:.0%})"
    )


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1000 * seconds:.1f} ms"
