"""Row "What each token costs": joules per token, the cost per million tokens at the site's
price of a GPU-hour, and the share of the GPUs' energy spent idle.

The panels read the rule pack's energy signals (``exporter/signatures/signals/energy_signals.py``,
``docs/energy.md``): a pod's energy split between its prompt and generated tokens by the time
its requests spend in prefill and decode, a shared GPU by the engine's own share of its work.
The cost panel is there only where the site config prices a GPU-hour (``cost:``; its
dashboards are generated from it, ``python -m dashboards --config site.yaml``).
"""

from __future__ import annotations

from collections.abc import Sequence

from dashboards.bottlenecks.roofline import model_legend
from dashboards.common import MODEL, AnyPanel, Query, Unit, signal, site, target_legend, timeseries
from exporter.signatures.signals.energy_signals import (
    COST,
    COST_PER_GENERATED,
    COST_PER_PROMPT,
    ENERGY_PER_GENERATED,
    ENERGY_PER_PROMPT,
    IDLE_ENERGY,
    POWER,
)

TITLE = "What each token costs"


def joules_per_token() -> AnyPanel:
    return timeseries(
        "Energy per token",
        "Joules of GPU energy per generated token and per prompt token computed (prefix-cache "
        "hits left out), per served model: the pod's GPU energy - a tensor-parallel pod's over "
        "all its GPUs, a shared GPU's by the engine's own share of its work - split between "
        "prompt and generated tokens by the time requests spend in prefill and in decode. "
        "Engines that report no phase times put it all on generated tokens. Idle time is in "
        "it: a pod that idles pays for every token it serves. Bad: rising at a steady load; "
        "far above another pool's for the same model and GPU.",
        [
            Query(signal(ENERGY_PER_GENERATED, MODEL), f"generated {model_legend()}"),
            Query(signal(ENERGY_PER_PROMPT, MODEL), f"prompt {model_legend()}"),
        ],
        unit=Unit.of(ENERGY_PER_GENERATED.unit),
        span=8,
    )


def cost_per_million_tokens() -> AnyPanel:
    currency = site().cost.currency
    return timeseries(
        f"Cost per million tokens ({currency})",
        "What a million generated and a million prompt tokens cost at the site's price of a "
        "GPU-hour (the site config's cost.gpu_hour_price, per product where it lists one), "
        "split as the energy is; the pod's GPUs' cost per hour on the right (docs/energy.md). "
        "It charges the GPUs only, by the pod's share of each GPU; "
        "OpenCost's llm_*_cost_per_million_tokens, which the pool records join by namespace "
        "and model_name, add CPU, memory and shared infrastructure. Bad: far above the price "
        "of the same tokens elsewhere - an idle or underfilled pod.",
        [
            Query(signal(COST_PER_GENERATED, MODEL), f"generated {model_legend()}"),
            Query(signal(COST_PER_PROMPT, MODEL), f"prompt {model_legend()}"),
            Query(
                signal(COST),
                f"GPUs per hour {target_legend()}",
                axis="right",
                unit=Unit.of(COST.unit),
            ),
        ],
        unit=Unit.of(COST_PER_GENERATED.unit),
        right_label=f"{currency} per hour",
        span=8,
    )


def idle_energy() -> AnyPanel:
    return timeseries(
        "Energy spent idle",
        "The share of the pod's GPU energy burnt in poll intervals in which nothing ran on the "
        "GPU (every driver sample 0 %: a lower bound), and the pod's GPU power (right). Bad: a "
        "large idle share - capacity paid for and waiting; on Blackwell with power smoothing "
        "on, its floor keeps the draw up while nothing runs. dcgm-exporter has no idle energy: "
        "the share is empty in the dcgm layout.",
        [
            Query(signal(IDLE_ENERGY), f"idle share {target_legend()}"),
            Query(
                signal(POWER),
                f"power {target_legend()}",
                axis="right",
                unit=Unit.of(POWER.unit),
            ),
        ],
        unit=Unit.of(IDLE_ENERGY.unit),
        maximum=1.0,
        right_label="GPU power",
        span=8,
    )


def panels() -> Sequence[AnyPanel]:
    # The cost records exist only where the site prices a GPU-hour: so does their panel.
    cost = [cost_per_million_tokens()] if site().cost.priced else []
    return [joules_per_token(), *cost, idle_energy()]
