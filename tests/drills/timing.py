"""How long a drill waits, from the rule pack's own timings: never a number tuned to a machine.

An injected drill's alert can fire no earlier than the longest window its rule reads (its
cold-start guard, :attr:`~exporter.signatures.definitions.AlertRule.history`: the condition
cannot even go pending before the window holds that much of the cause) plus its ``for``. The
drill gives it that, plus a stated margin: :data:`ONSET_S` for the cause to show once the load
runs (the first requests under the injection finish, the first probes answer) and
:data:`LAG_S` for the pipeline between a condition and the drill seeing its alert fire. An
alert that fires later is a finding, not a flake. A healthy drill stays quiet for the longest
``window + for`` of the signatures it guards against, plus :data:`LAG_S`: had one of those
causes been there, its alert would have fired by then.

All in the profile the drill's Prometheus loads: its layout's at ``fast``'s speed (``fast``,
``fast-node``, ``fast-dcgm``: windows and ``for`` scaled by 1/10), with the drill's own site
config.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from functools import cache

import yaml

from exporter.signatures import all_signatures, parse_config

# The pipeline from a condition that holds to the drill seeing its alert fire: the sidecar's
# engine poll (1 s), a Prometheus scrape (2 s), one evaluation of the recording rules and one
# of the alerts (2 s each; a record lags an evaluation), the drill's poll of the alerts (1 s).
LAG_S = 1.0 + 2.0 + 2.0 * 2 + 1.0
# For the injected cause to show in the windows once the load has started: the first requests
# under the injection finish (queue time and latencies are observed as a request finishes),
# the first probes answer, a queue builds past its first request.
ONSET_S = 20.0
# After the alert fires: Alertmanager's group_wait (1 s), the repeat of the page
# (repeat_interval 4 s, sent at a group_interval of 2 s), each a drill poll apart (1 s), and an
# evaluation of slack.
PAGES_S = 1.0 + 4.0 + 2.0 + 2 * 1.0 + 2.0


@dataclass(frozen=True)
class RuleTiming:
    """One alert's timing in a fast profile under a site config: the longest window its
    rules read (their cold-start guard) and their ``for``, the slowest variant's."""

    alert: str
    windows_s: float
    for_s: float

    @property
    def earliest_s(self) -> float:
        """The earliest the alert can fire after its cause starts."""
        return self.windows_s + self.for_s


@cache
def rule_timing(alert: str, site_config: str = "", profile: str = "fast") -> RuleTiming:
    """``alert``'s timing in ``profile`` (the drill's layout's fast one) with ``site_config``
    (YAML; empty: defaults)."""
    data = yaml.safe_load(site_config) if site_config else {}
    cfg = parse_config(data or {}, profile)
    for sig in all_signatures(cfg):
        if sig.alert == alert:
            slowest = max(sig.rules, key=lambda r: r.history + r.for_seconds)
            return RuleTiming(alert, slowest.history, slowest.for_seconds)
    raise KeyError(f"no signature {alert!r} in the pack")


@dataclass(frozen=True)
class Deadline:
    """How long a drill waits after its load starts, and how that was reckoned."""

    seconds: float
    how: str


def fire_deadline(
    alert: str, site_config: str, *, onset_s: float = ONSET_S, profile: str = "fast"
) -> Deadline:
    """By when ``alert`` must fire: its windows + its ``for`` (in ``profile``) + the onset +
    the lag."""
    t = rule_timing(alert, site_config, profile)
    seconds = t.windows_s + t.for_s + onset_s + LAG_S
    return Deadline(
        seconds,
        f"{t.windows_s:g} s window + {t.for_s:g} s `for` + {onset_s:g} s onset + {LAG_S:g} s lag",
    )


def quiet_deadline(alerts: Iterable[str], site_config: str, profile: str = "fast") -> Deadline:
    """How long a healthy drill stays quiet: the slowest of ``alerts`` (window + ``for``, in
    ``profile``) plus the lag."""
    slowest = max(
        (rule_timing(a, site_config, profile) for a in alerts), key=lambda t: t.earliest_s
    )
    return Deadline(
        slowest.earliest_s + LAG_S,
        f"{slowest.alert}'s {slowest.windows_s:g} s window + {slowest.for_s:g} s `for` "
        f"+ {LAG_S:g} s lag",
    )
