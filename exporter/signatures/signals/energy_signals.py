"""What a token costs: the energy of a pod's GPUs per generated and per prompt token, the share
of it spent idle, and (where the site config prices a GPU-hour) the cost per million tokens.

**The pod's GPUs.** A tensor-parallel pod is counted over all its GPUs. A GPU shared with other
tenants (time-slicing, MPS) is split by the engine's own share of its work where that is known
(:data:`~.shared_gpu_signals.GPU_ENGINE_SHARE` over
:data:`~.shared_gpu_signals.GPU_DEVICE_UTILIZATION`); where it is not, the node layout splits it
evenly between the pods the kubelet gave it to (``inference_gpu_pods``), while the sidecar and
dcgm-exporter, which cannot tell tenants apart, count it whole. The same weights split a
GPU-hour's price. A MIG device has no energy counter of its own, so a pod on MIG devices gets
no energy (and no cost) figures.

**Prompt and generated tokens.** A pod's energy goes to its prompt and its generated tokens in
proportion to the time its requests spend in prefill and in decode (the engine's
``inference_prefill_time_seconds`` and ``inference_decode_time_seconds``; OpenCost's
``compute_time`` split of input and output cost), and to each model of a pod in proportion to
its requests' share of that time, so the two add up to the pod's energy. Prompt tokens served
from the prefix cache (``inference_prompt_tokens_cached_total``) are left out: they cost no
compute. Where an engine reports no phase times, all of the energy goes to the generated tokens
(each model's by its share of them) and there is no figure per prompt token.

**Pools.** Per pool (the join labels that do not name a pod, ``model``; in the pools' rule
group): the pods' energy of each kind over their tokens of that kind, every role of
disaggregated serving together, with
``model_name`` beside ``model`` so that they join OpenCost's ``llm_*_cost_per_million_tokens``
(labels ``namespace``, ``model_name``).

The pod's power, idle share and cost per hour read per-GPU series, so they are evaluated with
the GPU records (``inference.records.gpu``); the figures per token in a group of their own
(``inference.records.energy``), the pools' with the pools'. Each layout reads the GPUs' energy
from its own source: ``sidecar`` from the sidecar's NVML
collector, ``node`` from the node agent by pod (:mod:`.node_join`), ``dcgm`` from
``DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION`` (mJ; ``DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL`` from
dcgm-exporter 4.9; it has no idle energy, so no idle share there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from exporter.metrics import GPU_LABELS
from exporter.signatures.promql_text import by, num, on
from exporter.signatures.signals import dcgm_fields
from exporter.signatures.signals.dcgm_fields import dcgm_quantity
from exporter.signatures.signals.dcgm_join import dcgm_per_target
from exporter.signatures.signals.node_join import cluster_labels
from exporter.signatures.signals.roofline_signals import model_rate, product_matcher
from exporter.signatures.signals.shared_gpu_signals import GPU_DEVICE_UTILIZATION, GPU_ENGINE_SHARE
from exporter.signatures.signals.signal import ByLayout, Rule, Signal
from exporter.signatures.signals.signal_context import pod_labels
from exporter.signatures.signals.signal_groups import ENERGY_GROUP, GPU_GROUP, POOL_GROUP
from exporter.signatures.site import SiteConfig

if TYPE_CHECKING:
    from exporter.signatures.signals.signal_context import SignalContext

_ENERGY = "inference_gpu_energy_joules_total"
_IDLE = "inference_gpu_idle_energy_joules_total"
#: Seconds in the hour a price is given for.
HOUR = 3600


def priced(cfg: SiteConfig) -> bool:
    """Whether the site config prices a GPU-hour: the cost records exist only then."""
    return cfg.cost.priced


# --- each GPU's share of the pod --------------------------------------------------------------


def _share(ctx: SignalContext) -> str:
    """The engine's (pod's) share of each GPU it shares with other tenants, where known."""
    per_gpu = on((*ctx.join, *GPU_LABELS))
    return (
        f"clamp(\n{ctx.name(GPU_ENGINE_SHARE)}\n/ {per_gpu}\n"
        f"({ctx.name(GPU_DEVICE_UTILIZATION)} > 0),\n0, 1\n)"
    )


PerGpu = Callable[["SignalContext"], str]


def _own_sidecar(ctx: SignalContext, per_gpu: PerGpu) -> str:
    """Per target, the sum over its GPUs of ``per_gpu`` (one series per GPU of the sidecar's
    labels), a shared GPU's times the engine's share where it is known."""
    gpu = on((*ctx.join, *GPU_LABELS))
    value = per_gpu(ctx)
    return (
        f"sum {ctx.by_target} (\n{value}\n* {gpu} group_left ()\n{_share(ctx)}\n"
        f"or {gpu}\n{value}\n)"
    )


def _energy_share_node(ctx: SignalContext) -> str:
    """The target's share (0-1) of each GPU its pod holds: the pod's share of a shared GPU's
    work where the agent maps its processes to pods (hostPID), else an even split between the
    pods holding it (``inference_gpu_pods``, the node's own), else the whole GPU. One series
    per target and GPU, the GPUs of :data:`GPU_DEVICE_UTILIZATION`: the power, idle-energy and
    cost records weigh each GPU's own series by it, so the joins that decide the weight are
    evaluated once a minute and not once per record (``docs/scale.md``)."""
    gpu, device = on((*ctx.join, *GPU_LABELS)), ctx.name(GPU_DEVICE_UTILIZATION)
    # One weight per GPU whichever agent reports it: a GPU's UUID names it on every node.
    any_agent = (*cluster_labels(ctx), *GPU_LABELS)
    pods = ctx.sidecar_series("inference_gpu_pods")
    mapped = ctx.sidecar_series("inference_gpu_pod_utilization_ratio")
    whole = f"0 * {device} + 1"
    known = f"{_share(ctx)}\nand {on(any_agent)}\n{mapped}"
    even = f"(\n{whole}\n)\n/ {on(any_agent)} group_left ()\nmax {by(any_agent)} ({pods})"
    return f"{known}\nor {gpu}\n{even}\nor {gpu}\n{whole}"


#: The target's share of each of its pod's GPUs in the node layout: what its power, idle
#: energy and cost count of the GPU.
GPU_ENERGY_SHARE = Signal(
    "inference_gpu:energy_share:ratio{rate}",
    "ratio",
    GPU_GROUP,
    ByLayout(
        sidecar=None,
        node=Rule(
            _energy_share_node,
            "the target's share (0-1) of each GPU its pod holds, by which its power, idle "
            "energy and cost count the GPU: the pod's own share of a shared GPU's work where "
            "the node agent maps processes to pods, else an even split between the pods "
            "holding it, else 1",
        ),
        dcgm=None,
    ),
    "share of the GPU's energy",
)


def _own_node(ctx: SignalContext, per_gpu: PerGpu) -> str:
    """Per target, the sum over the GPUs its pod holds of ``per_gpu`` (the node agent's series,
    one copy per pod holding the GPU) times the target's share of the GPU
    (:data:`GPU_ENERGY_SHARE`). The share is on the left: it carries the target's labels, so
    the agent's copies need no join to the target-info signal; the weight and the value meet
    on the pod and the GPU."""
    held = (*pod_labels(ctx), *GPU_LABELS)
    value = f"max {by(held)} ({per_gpu(ctx)})"
    return (
        f"sum {ctx.by_target} (\n{ctx.name(GPU_ENERGY_SHARE)}\n* {on(held)} group_left ()\n"
        f"{value}\n)"
    )


def _rate(metric: str) -> PerGpu:
    return lambda ctx: f"rate({ctx.sidecar_series(metric)}[{ctx.window('rate')}])"


def _dcgm_power(ctx: SignalContext) -> str:
    rate = ctx.window("rate")
    energy = dcgm_quantity(ctx, dcgm_fields.ENERGY, lambda s: f"rate({s}[{rate}])")
    return dcgm_per_target(ctx, energy, "sum")


#: Watts the target's GPUs draw, its share of a shared GPU's: the energy its tokens cost.
POWER = Signal(
    "inference:gpu_power_watts:mean{rate}",
    "watts",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(
            lambda ctx: _own_sidecar(ctx, _rate(_ENERGY)),
            "mean power (W) of the target's GPUs from their energy counters, a GPU shared with "
            "other tenants by the engine's share of its work where known",
        ),
        node=Rule(
            lambda ctx: _own_node(ctx, _rate(_ENERGY)),
            "mean power (W) of the GPUs the target's pod holds (the node agent's energy "
            "counters), a shared GPU by the pod's share of its work, else split evenly between "
            "the pods holding it",
        ),
        dcgm=Rule(
            _dcgm_power,
            "mean power (W) of the pod's GPUs (DCGM_FI_DEV_TOTAL_ENERGY_CONSUMPTION in mJ, "
            "DCGM_FI_DEV_GPU_ENERGY_JOULES_TOTAL from dcgm-exporter 4.9)",
        ),
    ),
    "GPU power",
)


def _idle(ctx: SignalContext, own: Callable[[SignalContext, PerGpu], str]) -> str:
    return f"{own(ctx, _rate(_IDLE))}\n/ {on(ctx.join)}\n({ctx.name(POWER)} > 0)"


_IDLE_HELP = (
    "share (0-1) of the energy of the target's GPUs spent in poll intervals in which nothing "
    "ran (every driver sample 0 %): a lower bound"
)

#: The share of the pod's GPU energy spent while nothing ran on them.
IDLE_ENERGY = Signal(
    "inference:gpu_idle_energy:ratio{rate}",
    "ratio",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(lambda ctx: _idle(ctx, _own_sidecar), _IDLE_HELP),
        node=Rule(lambda ctx: _idle(ctx, _own_node), _IDLE_HELP + " (the node agent's)"),
        dcgm=None,
    ),
    "idle energy",
)


# --- the price of the pod's GPUs --------------------------------------------------------------


def _prices(cfg: SiteConfig, label: str, per_gpu: Callable[[str], str]) -> str:
    """Each GPU's price of an hour: ``per_gpu(matcher)`` groups the GPUs whose product matches
    (``""``: every GPU), the products of the config first, then the default price."""
    cost = cfg.cost
    priced_gpus = [
        f"{num(price)} * {per_gpu(product_matcher([name], label))}"
        for name, price in cost.by_product
    ]
    if cost.gpu_hour_price is not None:
        priced_gpus.append(f"{num(cost.gpu_hour_price)} * {per_gpu('')}")
    return "(\n" + "\nor\n".join(priced_gpus) + "\n)"


def _info_prices(ctx: SignalContext, labels: tuple[str, ...]) -> str:
    def gpus(matcher: str) -> str:
        info = ctx.sidecar_series("inference_gpu_info", *([matcher] if matcher else []))
        return f"group {by(labels)} ({info})"

    return _prices(ctx.cfg, "name", gpus)


def _cost_dcgm(ctx: SignalContext) -> str:
    keep = by((*ctx.cfg.dcgm.dcgm_labels, "UUID"))

    def gpus(matcher: str) -> str:
        matchers = [matcher] if matcher else []
        util = dcgm_quantity(ctx, dcgm_fields.UTILIZATION, lambda s: s, *matchers, scale=False)
        return f"group {keep} ({util})"

    return dcgm_per_target(ctx, _prices(ctx.cfg, "modelName", gpus), "sum")


_COST_HELP = (
    "what the target's GPUs cost per hour at the site's price of a GPU-hour, a shared GPU by "
    "the same share as its energy"
)

#: What the pod's GPUs cost an hour (the site config's currency).
COST = Signal(
    "inference:gpu_cost_per_hour:mean{rate}",
    "cost",
    GPU_GROUP,
    ByLayout(
        sidecar=Rule(
            lambda ctx: _own_sidecar(ctx, lambda c: _info_prices(c, (*c.join, *GPU_LABELS))),
            _COST_HELP,
            only_if=priced,
        ),
        node=Rule(
            lambda ctx: _own_node(ctx, lambda c: _info_prices(c, (*pod_labels(c), *GPU_LABELS))),
            _COST_HELP + " (the GPUs the pod holds, the node agent's)",
            only_if=priced,
        ),
        dcgm=Rule(_cost_dcgm, _COST_HELP + " (the pod's GPUs by modelName)", only_if=priced),
    ),
    "GPU cost per hour",
)


# --- per token --------------------------------------------------------------------------------


def _computed_prompt(ctx: SignalContext) -> str:
    prompt = model_rate("inference_prompt_tokens_total", "rate")(ctx)
    cached = model_rate("inference_prompt_tokens_cached_total", "rate")(ctx)
    return f"{prompt}\n-\n(\n{cached}\nor\n0 * {prompt}\n)"


# The engine's counters per target and model, each read once for every record below (PromQL
# has no common subexpressions): the energy per token read them twelve times an evaluation, the
# pools' figures eight more. First in the energy group, so its records read this evaluation's.

#: Tokens generated per second, per target and model.
MODEL_GENERATED = Signal(
    "inference:model_generation_tokens:rate{rate}",
    "tokens_per_second",
    ENERGY_GROUP,
    Rule(model_rate("inference_generation_tokens_total", "rate"), "tokens generated per second"),
    "tokens/s",
)

#: Prompt tokens computed per second (prefix-cache hits left out), per target and model.
MODEL_PROMPT_COMPUTED = Signal(
    "inference:model_prompt_tokens_computed:rate{rate}",
    "tokens_per_second",
    ENERGY_GROUP,
    Rule(
        _computed_prompt,
        "prompt tokens computed per second: prompt tokens less those served from the prefix "
        "cache, where the engine counts them",
    ),
    "prompt tokens/s computed",
)

#: Requests in prefill, mean over the window (prefill seconds per second), per target and model.
MODEL_PREFILL = Signal(
    "inference:model_prefill_seconds:rate{rate}",
    "requests",
    ENERGY_GROUP,
    Rule(
        model_rate("inference_prefill_time_seconds_sum", "rate"),
        "seconds per second the requests spend in prefill (the requests in prefill, mean)",
    ),
    "in prefill",
)

#: Requests in decode, mean over the window (decode seconds per second), per target and model.
MODEL_DECODE = Signal(
    "inference:model_decode_seconds:rate{rate}",
    "requests",
    ENERGY_GROUP,
    Rule(
        model_rate("inference_decode_time_seconds_sum", "rate"),
        "seconds per second the requests spend in decode (the requests in decode, mean)",
    ),
    "in decode",
)

_PHASES = {"prefill": MODEL_PREFILL, "decode": MODEL_DECODE}


class _Tokens:
    """The engine's counters per target and model over the rate window, from the records
    above."""

    def __init__(self, ctx: SignalContext) -> None:
        self.ctx = ctx
        self.on_model = on((*ctx.join, "model"))
        self.to_target = f"{on(ctx.join)} group_left ()"

    def generated(self) -> str:
        return self.ctx.name(MODEL_GENERATED)

    def computed_prompt(self) -> str:
        """Prompt tokens less those served from the prefix cache (where counted)."""
        return self.ctx.name(MODEL_PROMPT_COMPUTED)

    def engine_seconds(self) -> str:
        """Seconds per second the target's requests spend in prefill and decode, all models."""
        ctx = self.ctx
        prefill, decode = (f"sum {ctx.by_target} ({ctx.name(s)})" for s in _PHASES.values())
        return f"(\n{prefill}\n+ {on(ctx.join)}\n{decode}\n)"

    def share(self, phase: str) -> str:
        """Each model's share of the target's engine time spent in ``phase``."""
        seconds = self.ctx.name(_PHASES[phase])
        return f"{seconds}\n/ {self.to_target}\n({self.engine_seconds()} > 0)"


def _per_generated(ctx: SignalContext) -> str:
    t = _Tokens(ctx)
    generated = t.generated()
    by_tokens = f"{generated}\n/ {t.to_target}\n(sum {ctx.by_target} ({generated}) > 0)"
    decode_share = f"(\n{t.share('decode')}\nor\n{by_tokens}\n)"
    return (
        f"{ctx.name(POWER)}\n* {on(ctx.join)} group_right ()\n{decode_share}\n"
        f"/ {t.on_model}\n({generated} > 0)"
    )


#: Joules per generated token, per target and model.
ENERGY_PER_GENERATED = Signal(
    "inference:energy_per_generated_token_joules:ratio{rate}",
    "joules",
    ENERGY_GROUP,
    Rule(
        _per_generated,
        "GPU energy per generated token (J): the pod's power times the share of its engine "
        "time the model's requests spend in decode, over the tokens generated per second (all "
        "of it where the engine reports no phase times)",
    ),
    "J per generated token",
)


def _per_prompt(ctx: SignalContext) -> str:
    t = _Tokens(ctx)
    return (
        f"{ctx.name(POWER)}\n* {on(ctx.join)} group_right ()\n({t.share('prefill')})\n"
        f"/ {t.on_model}\n({t.computed_prompt()} > 0)"
    )


#: Joules per prompt token computed (prefix-cache hits left out), per target and model.
ENERGY_PER_PROMPT = Signal(
    "inference:energy_per_prompt_token_joules:ratio{rate}",
    "joules",
    ENERGY_GROUP,
    Rule(
        _per_prompt,
        "GPU energy per prompt token computed (J; prefix-cache hits left out): the pod's power "
        "times the share of its engine time the model's requests spend in prefill, over the "
        "prompt tokens computed per second (engines that report phase times)",
    ),
    "J per prompt token",
)


def _cost_of(energy: Signal) -> Callable[[SignalContext], str]:
    """Cost per million tokens: the tokens' energy times what a joule of the pod's costs."""

    def expr(ctx: SignalContext) -> str:
        per_joule = f"{ctx.name(COST)}\n/ {on(ctx.join)}\n({ctx.name(POWER)} > 0)"
        return (
            f"{ctx.name(energy)}\n* {on(ctx.join)} group_left ()\n(\n{per_joule}\n)\n"
            f"* {num(1e6 / HOUR)}"
        )

    return expr


COST_PER_GENERATED = Signal(
    "inference:cost_per_million_generated_tokens:ratio{rate}",
    "cost",
    ENERGY_GROUP,
    Rule(
        _cost_of(ENERGY_PER_GENERATED),
        "cost of a million generated tokens: the GPUs' cost per hour split as their energy is",
        only_if=priced,
    ),
    "cost per 1M generated tokens",
)

COST_PER_PROMPT = Signal(
    "inference:cost_per_million_prompt_tokens:ratio{rate}",
    "cost",
    ENERGY_GROUP,
    Rule(
        _cost_of(ENERGY_PER_PROMPT),
        "cost of a million prompt tokens computed: the GPUs' cost per hour split as their "
        "energy is",
        only_if=priced,
    ),
    "cost per 1M prompt tokens",
)


# --- per pool ---------------------------------------------------------------------------------


def _pool(ctx: SignalContext) -> tuple[str, ...]:
    return (*ctx.pool, "model")


def _model_name(expr: str) -> str:
    """``expr`` with ``model_name`` beside ``model``: OpenCost's label for the model."""
    return f'label_replace(\n{expr},\n"model_name", "$1", "model", "(.*)"\n)'


Count = Callable[[_Tokens], str]


def _pool_mean(per_token: Signal, tokens: Count) -> Callable[[SignalContext], str]:
    """A per-token figure of the pool: each pod's weighted by its tokens (the pods that have
    the figure)."""

    def expr(ctx: SignalContext) -> str:
        t = _Tokens(ctx)
        count, figure = tokens(t), ctx.name(per_token)
        pool = by(_pool(ctx))
        weighted = f"sum {pool} (\n{figure}\n* {t.on_model}\n{count}\n)"
        counted = f"sum {pool} (\n{count}\nand {t.on_model}\n{figure}\n)"
        return _model_name(f"{weighted}\n/\n({counted} > 0)")

    return expr


def _pool_signal(name: str, per_token: Signal, tokens: Count, what: str) -> Signal:
    fill = per_token.fill
    only_if = fill.only_if if isinstance(fill, Rule) else None
    return Signal(
        name,
        per_token.unit,
        POOL_GROUP,
        Rule(
            _pool_mean(per_token, tokens),
            f"{what} of the model in the pool, every pod's (and role's) together; labelled "
            "model_name too, as OpenCost's inference cost metrics are",
            only_if=only_if,
        ),
        per_token.title,
    )


POOL_ENERGY_PER_GENERATED = _pool_signal(
    "inference_pool:energy_per_generated_token_joules:ratio{rate}",
    ENERGY_PER_GENERATED,
    _Tokens.generated,
    "GPU energy per generated token (J)",
)
POOL_ENERGY_PER_PROMPT = _pool_signal(
    "inference_pool:energy_per_prompt_token_joules:ratio{rate}",
    ENERGY_PER_PROMPT,
    _Tokens.computed_prompt,
    "GPU energy per prompt token computed (J)",
)
POOL_COST_PER_GENERATED = _pool_signal(
    "inference_pool:cost_per_million_generated_tokens:ratio{rate}",
    COST_PER_GENERATED,
    _Tokens.generated,
    "cost of a million generated tokens",
)
POOL_COST_PER_PROMPT = _pool_signal(
    "inference_pool:cost_per_million_prompt_tokens:ratio{rate}",
    COST_PER_PROMPT,
    _Tokens.computed_prompt,
    "cost of a million prompt tokens computed",
)


def _pool_idle(ctx: SignalContext) -> str:
    info = ctx.latest("inference_engine_info")
    models = f"group {by((*ctx.join, 'model'))} ({info})"
    pool, to_models = by(_pool(ctx)), f"{on(ctx.join)} group_right ()"
    idle = f"{ctx.name(IDLE_ENERGY)}\n* {on(ctx.join)}\n{ctx.name(POWER)}"
    spent = f"sum {pool} (\n(\n{idle}\n)\n* {to_models}\n{models}\n)"
    total = f"sum {pool} (\n{ctx.name(POWER)}\n* {to_models}\n{models}\n)"
    return _model_name(f"{spent}\n/\n({total} > 0)")


_POOL_IDLE_HELP = (
    "share (0-1) of the energy of the pool's GPUs (every pod serving the model) spent while "
    "nothing ran on them; labelled model_name too"
)

POOL_IDLE_ENERGY = Signal(
    "inference_pool:gpu_idle_energy:ratio{rate}",
    "ratio",
    POOL_GROUP,
    ByLayout(
        sidecar=Rule(_pool_idle, _POOL_IDLE_HELP),
        node=Rule(_pool_idle, _POOL_IDLE_HELP),
        dcgm=None,
    ),
    "idle energy",
)
