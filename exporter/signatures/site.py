"""Site configuration of the rule pack, like a monitoring mixin's ``_config``.

One YAML file sets thresholds, windows, ``for`` durations, selectors, the join labels and the
runbook URL pattern; everything has a default, so an empty file (or none) gives the shipped
pack. A profile picks where the GPU signals come from and how time is scaled:

``sidecar`` (default)
    every signal from this exporter's ``inference_*`` metrics.
``dcgm``
    GPU utilisation, HBM activity, framebuffer, Xids and clock events from an existing
    dcgm-exporter (``DCGM_FI_*``), joined to the sidecar's engine/CPU metrics by pod.
``node``
    GPU signals from the node agent (a DaemonSet: the ``nvml`` and ``podresources``
    collectors), which files each device's series under the pod holding it; joined to the
    sidecars (no NVML) by ``namespace`` and ``pod``, as the dcgm profile joins dcgm-exporter.
``fast``
    the sidecar profile with every window and ``for`` scaled by 1/10, for drills and
    end-to-end tests.
``fast-node``, ``fast-dcgm``
    the node and dcgm profiles scaled as ``fast`` scales the sidecar's: what the demo and the
    drills load in those layouts (:func:`fast_profile`). Generated where they run
    (``python -m exporter.signatures --profile fast-node --out rules/``), not shipped.

A gateway in front of the engines (llm-d's endpoint picker) is scraped through a sidecar of its
own; its queue belongs to the engines of its pool, found by the ``gateway.join`` labels and
``model`` (:class:`GatewayJoin`).

``cost`` sets the price of a GPU-hour: the cost per million tokens is recorded only where a
price is set (:class:`Cost`).

Every mistake raises :class:`SignatureConfigError`, whose ``str()`` is one line naming the
field (``signatures.InferenceGPUStarvedQueueGrowing.utilization_below: must be ...``).
"""

from __future__ import annotations

import contextlib
import math
import re
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any, Literal

import yaml

from exporter.config import parse_duration
from exporter.metrics import CLOCK_EVENT_BITS, UTILIZATION_BUCKETS
from exporter.signatures import site_errors
from exporter.signatures.params import PARAMS, PREFILL_PRECISION, Param, ParamValue
from exporter.signatures.promql_text import LABEL_NAME, split_matchers
from exporter.signatures.site_errors import describe
from exporter.signatures.slo_config import ScalingConfig, SloConfig, parse_scaling, parse_slo

Source = Literal["sidecar", "dcgm", "node"]

DEFAULT_RUNBOOK_URL = (
    "https://github.com/inference-bottleneck-exporter/inference-bottleneck-exporter"
    "/blob/main/docs/runbooks/{alertname}.md"
)
# Identify one scrape target whether Prometheus found it through a PodMonitor (namespace,
# pod, instance=podIP:port, job=namespace/podmonitor) or a static config (instance, job).
# Labels a target lacks are simply empty in every aggregation, so both kinds work.
DEFAULT_JOIN_LABELS = ("namespace", "pod", "instance", "job")
# The label a site adds to every series where one store holds many clusters (Prometheus'
# external_labels, vmagent's -remoteWrite.label): list it first in join_labels there.
CLUSTER = "cluster"
DEFAULT_EXPORTER_SELECTOR = 'job=~".*inference-bottleneck-exporter.*"'
# Labels the rules themselves use; a join label of the same name would collide with them.
RESERVED_LABELS = frozenset(
    {
        "__name__",
        "alertname",
        "severity",
        "signature",
        "gpu",
        "uuid",
        "UUID",
        "xid",
        "reason",
        "collector",
        "engine",
        "model",
        "role",
        "stage",
        "mode",
        "source",
        "le",
        "pool",
        "layer",
        "priority",
        "outcome",
        # the SLO records and the scaling advice (exporter/signatures/slo/)
        "slo",
        "advice",
        "cause",
        "blocks_scale_out",
        "long_window",
        "short_window",
    }
)
#: An invalid site configuration; ``str()`` is the one line the user sees (defined apart, in
#: :mod:`.site_errors`, for the parts of the config read by modules of their own).
SignatureConfigError = site_errors.SignatureConfigError
_ENGINE_NAME = re.compile(r"^[a-z0-9][a-z0-9_.-]*$")
_CURRENCY = re.compile(r"^[A-Z]{3}$")


@dataclass(frozen=True)
class Profile:
    name: str
    source: Source
    time_scale: float
    summary: str


# How ``fast`` scales time: windows and ``for`` at 1/10, so minutes of evidence take seconds.
FAST_SCALE = 0.1

# The profiles of the shipped pack (alert_rules/, the chart's rule and dashboard sets).
PROFILES: dict[str, Profile] = {
    "sidecar": Profile(
        "sidecar", "sidecar", 1.0, "every signal from the sidecar's inference_* metrics"
    ),
    "dcgm": Profile(
        "dcgm",
        "dcgm",
        1.0,
        "GPU signals from dcgm-exporter (DCGM_FI_*), joined to the sidecar by pod",
    ),
    "node": Profile(
        "node",
        "node",
        1.0,
        "GPU signals from the node agent, each device's filed under the pod the kubelet gave "
        "it to, joined to the sidecar by pod",
    ),
    "fast": Profile(
        "fast", "sidecar", FAST_SCALE, "the sidecar profile with windows and `for` scaled by 1/10"
    ),
}
# The other sources' profiles at ``fast``'s speed: not shipped, generated where they run.
FAST_VARIANTS: dict[str, Profile] = {
    f"fast-{p.source}": Profile(
        f"fast-{p.source}",
        p.source,
        FAST_SCALE,
        f"the {p.name} profile with windows and `for` scaled by 1/10",
    )
    for p in PROFILES.values()
    if p.time_scale == 1.0 and p.source != "sidecar"
}
# Every profile a command or a config can name.
ALL_PROFILES: dict[str, Profile] = {**PROFILES, **FAST_VARIANTS}


def fast_profile(source: Source) -> str:
    """The name of ``source``'s profile at ``fast``'s speed: ``fast`` for the sidecar,
    ``fast-node`` and ``fast-dcgm`` for the others."""
    return next(
        p.name for p in ALL_PROFILES.values() if p.source == source and p.time_scale == FAST_SCALE
    )


@dataclass(frozen=True)
class Windows:
    """Look-back windows of the recording rules, in seconds (before the profile's scale)."""

    rate: float = 300.0
    latency: float = 300.0
    queue_trend: float = 600.0
    pulsing: float = 600.0
    xid: float = 600.0
    baseline: float = 3600.0
    last_sample: float = 60.0


WINDOW_HELP = {
    "rate": "rates and means of utilisation, bandwidth, tokens, CPU time",
    "latency": "medians of tokenizer and inter-token latency, queue share of latency",
    "queue_trend": "deriv() of the queue depth",
    "pulsing": "share of idle and saturated utilisation samples",
    "xid": "new Xid errors",
    "baseline": "how far back generation speed per request is compared",
    "last_sample": (
        "how long a series read as it is now (model size, GPU peaks and count, the engines "
        "of a pool, queue depths, KV-cache use, the sidecar's join labels) keeps its last "
        "sample through missed scrapes, so one failed scrape restarts no alert's `for`; at "
        "least twice the scrape interval"
    ),
}


@dataclass(frozen=True)
class Selectors:
    """Extra label matchers (PromQL, without braces)."""

    exporter: str = DEFAULT_EXPORTER_SELECTOR
    sidecar: str = ""
    dcgm: str = ""


SELECTOR_HELP = {
    "exporter": "picks the sidecar's `up` series (InferenceExporterDown)",
    "sidecar": 'added to every inference_* series (e.g. cluster="prod")',
    "dcgm": "added to every DCGM_FI_* series (dcgm profile)",
}


@dataclass(frozen=True)
class DcgmJoin:
    """How dcgm-exporter series name the pod that holds the GPU.

    ``labels`` maps each join label of the target to the dcgm-exporter label carrying the same
    value: ``namespace: namespace, pod: pod`` when Prometheus keeps dcgm-exporter's labels
    (``honorLabels: true``), ``namespace: exported_namespace, pod: exported_pod`` otherwise.
    """

    labels: tuple[tuple[str, str], ...] = (("namespace", "namespace"), ("pod", "pod"))

    @classmethod
    def default(cls, join_labels: tuple[str, ...]) -> DcgmJoin:
        """``namespace`` and ``pod``, and ``cluster`` where it is a join label: where rules are
        evaluated over many clusters, dcgm-exporter series carry the same ``cluster`` label as
        the sidecar's, and two pods of one name in two clusters must not meet."""
        labels = tuple(
            (label, label) for label in (CLUSTER, "namespace", "pod") if label in join_labels
        )
        required = tuple((label, label) for label in ("namespace", "pod"))
        return cls(labels if all(pair in labels for pair in required) else cls.labels)

    @property
    def target_labels(self) -> tuple[str, ...]:
        return tuple(t for t, _ in self.labels)

    @property
    def dcgm_labels(self) -> tuple[str, ...]:
        return tuple(d for _, d in self.labels)


# Join labels that name one pod or scrape target: a gateway's pool never joins on them.
TARGET_ONLY_LABELS = ("pod", "instance", "job")


@dataclass(frozen=True)
class GatewayJoin:
    """How a gateway's queue finds the engines of the pool it feeds.

    A gateway (llm-d's endpoint picker) serves one ``InferencePool``, whose selector picks the
    model-server pods of the pool's namespace; the picker runs in that namespace, and the model
    each request is sent with (``target_model_name``) is the name the engine serves, the same
    ``model`` label on both sides. So a gateway's series join the engine targets on ``labels``
    (the join labels that name neither a pod nor a scrape job: ``namespace``, and ``cluster``
    where it is a join label) and ``model``. ``job`` stays out: the gateway's sidecar and the
    engines' are often scraped by different monitors. A namespace with two pools of one model
    adds a target label that tells them apart (a PodMonitor relabeling of the pool's pod label,
    on the gateway's pod and the engines' alike) to ``labels``.
    """

    labels: tuple[str, ...] = ("namespace",)

    @classmethod
    def default(cls, join_labels: tuple[str, ...]) -> GatewayJoin:
        return cls(tuple(label for label in join_labels if label not in TARGET_ONLY_LABELS))


@dataclass(frozen=True)
class Cost:
    """What a GPU-hour costs the site: the cost records (cost per million tokens, a pod's GPUs'
    cost per hour) exist only where a price is set.

    ``gpu_hour_price`` is the price of one GPU-hour in ``currency``; ``by_product`` the price of
    particular products by the name NVML gives them (``NVIDIA H100 80GB HBM3``, compared in any
    case and spacing), before ``gpu_hour_price`` for the rest.
    """

    gpu_hour_price: float | None = None
    currency: str = "USD"
    by_product: tuple[tuple[str, float], ...] = ()

    @property
    def priced(self) -> bool:
        """Whether any GPU has a price (the cost records exist)."""
        return self.gpu_hour_price is not None or bool(self.by_product)


COST_HELP = {
    "gpu_hour_price": "price of one GPU-hour (a number above 0; no cost records without it)",
    "currency": "ISO 4217 code of the prices, for the views' units (default USD)",
    "gpu_hour_price_by_product": "price of a GPU-hour per product, by NVML's name",
}


@dataclass(frozen=True)
class ProductPeaks:
    """The peaks of one GPU product as the site gives them, by the name NVML gives it (and
    dcgm-exporter's ``modelName``): for a product the table (:data:`exporter.hardware.gpus.
    PRODUCTS`) lacks, or a figure the site knows better. The dcgm layout's roofline reads
    them (dcgm-exporter reports no peak figure); the sidecar and the node agent read theirs
    from NVML.

    ``name`` is compared in any case and spacing; ``None``: the site does not give that figure.
    """

    name: str
    memory_bandwidth: float | None = None  # bytes per second
    flops: tuple[tuple[str, float], ...] = ()  # (precision, dense FLOP per second)


GPU_PEAK_HELP = {
    "memory_bandwidth_bytes_per_second": "theoretical peak HBM bandwidth, bytes per second",
    f"{PREFILL_PRECISION}_flops": (
        f"dense {PREFILL_PRECISION} tensor peak, FLOP per second (the prefill efficiency's)"
    ),
}


@dataclass(frozen=True)
class SiteConfig:
    """The validated configuration; windows and durations are unscaled seconds."""

    profile: Profile = PROFILES["sidecar"]
    runbook_url: str = DEFAULT_RUNBOOK_URL
    join_labels: tuple[str, ...] = DEFAULT_JOIN_LABELS
    selectors: Selectors = field(default_factory=Selectors)
    dcgm: DcgmJoin = field(default_factory=DcgmJoin)
    windows: Windows = field(default_factory=Windows)
    overrides: Mapping[str, Mapping[str, ParamValue]] = field(default_factory=dict)
    gateway: GatewayJoin = field(default_factory=GatewayJoin)
    cost: Cost = field(default_factory=Cost)
    #: The service-level objectives and their burn-rate alerts (:mod:`.slo_config`).
    slo: SloConfig = field(default_factory=SloConfig)
    #: When a backlog is capacity, for the scaling advice (:mod:`.slo_config`).
    scaling: ScalingConfig = field(default_factory=ScalingConfig)
    #: GPU products' peaks the site gives (:class:`ProductPeaks`), for the dcgm layout.
    gpu_peaks: tuple[ProductPeaks, ...] = ()

    def with_profile(self, name: str) -> SiteConfig:
        """The same site settings under another profile (validated for it)."""
        profile = _profile(name)
        if profile.source == "dcgm":
            _check_dcgm_join(self.dcgm, self.join_labels)
        if profile.source == "node":
            _check_node_join(self.join_labels)
        return SiteConfig(
            profile=profile,
            runbook_url=self.runbook_url,
            join_labels=self.join_labels,
            selectors=self.selectors,
            dcgm=self.dcgm,
            windows=self.windows,
            overrides=self.overrides,
            gateway=self.gateway,
            cost=self.cost,
            slo=self.slo,
            scaling=self.scaling,
            gpu_peaks=self.gpu_peaks,
        )

    def window_seconds(self, name: str) -> float:
        """A window in seconds after the profile's time scale."""
        return float(getattr(self.windows, name)) * self.profile.time_scale

    def param(self, alert: str, name: str) -> ParamValue:
        value = self.overrides.get(alert, {}).get(name)
        if value is not None:
            return value
        for spec in PARAMS[alert]:
            if spec.name == name:
                return spec.default
        raise KeyError(f"{alert} has no parameter {name}")

    def ratio(self, alert: str, name: str) -> float:
        value = self.param(alert, name)
        if not isinstance(value, float):
            raise TypeError(f"{alert}.{name} is not a number")
        return value

    def seconds(self, alert: str, name: str = "for") -> float:
        """A duration parameter in seconds after the profile's time scale."""
        return self.ratio(alert, name) * self.profile.time_scale

    def ints(self, alert: str, name: str) -> tuple[int, ...]:
        value = self.param(alert, name)
        if not isinstance(value, tuple) or not all(isinstance(v, int) for v in value):
            raise TypeError(f"{alert}.{name} is not a list of integers")
        return tuple(int(v) for v in value)

    def names(self, alert: str, name: str) -> tuple[str, ...]:
        value = self.param(alert, name)
        if not isinstance(value, tuple) or not all(isinstance(v, str) for v in value):
            raise TypeError(f"{alert}.{name} is not a list of names")
        return tuple(str(v) for v in value)


def _profile(name: str) -> Profile:
    try:
        return ALL_PROFILES[name]
    except KeyError:
        raise SignatureConfigError(
            "profile", f"unknown profile {name!r} (known: {', '.join(ALL_PROFILES)})"
        ) from None


def load_config(path: Path | None = None, profile: str = "sidecar") -> SiteConfig:
    """Read and validate a site config file; ``None`` gives the defaults."""
    if path is None:
        return parse_config({}, profile)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as err:
        raise SignatureConfigError(str(path), f"cannot read ({err.strerror})") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as err:
        where = getattr(err, "problem_mark", None)
        line = f" at line {where.line + 1}" if where is not None else ""
        raise SignatureConfigError(str(path), f"not valid YAML{line}") from None
    return parse_config({} if data is None else data, profile)


def parse_config(data: object, profile: str = "sidecar") -> SiteConfig:
    """Validate a parsed YAML document (a mapping) into a :class:`SiteConfig`."""
    root = _mapping(data, "config")
    _known_keys(
        root,
        "",
        (
            "runbook_url",
            "join_labels",
            "selectors",
            "dcgm",
            "gateway",
            "windows",
            "signatures",
            "cost",
            "slo",
            "scaling",
            "gpu_peaks",
        ),
    )
    join_labels = _join_labels(root.get("join_labels", list(DEFAULT_JOIN_LABELS)))
    cfg = SiteConfig(
        runbook_url=_runbook_url(root.get("runbook_url", DEFAULT_RUNBOOK_URL)),
        join_labels=join_labels,
        selectors=_selectors(root.get("selectors", {})),
        dcgm=_dcgm(root.get("dcgm", {}), join_labels),
        windows=_windows(root.get("windows", {})),
        overrides=_signatures(root.get("signatures", {})),
        gateway=_gateway(root.get("gateway", {}), join_labels),
        cost=_cost(root.get("cost", {})),
        slo=parse_slo(root.get("slo")),
        scaling=parse_scaling(root.get("scaling")),
        gpu_peaks=_gpu_peaks(root.get("gpu_peaks") or {}),
    )
    return cfg.with_profile(profile)


def _mapping(value: object, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise SignatureConfigError(where, f"must be a mapping, got {_kind(value)}")
    for key in value:
        if not isinstance(key, str):
            raise SignatureConfigError(where, f"keys must be strings, got {key!r}")
    return value


def _kind(value: object) -> str:
    return describe(value)


def _join(prefix: str, key: str) -> str:
    return f"{prefix}.{key}" if prefix else key


def _known_keys(value: Mapping[str, Any], prefix: str, known: tuple[str, ...]) -> None:
    for key in value:
        if key not in known:
            raise SignatureConfigError(
                _join(prefix, key), f"unknown key (known: {', '.join(known)})"
            )


def _runbook_url(value: object) -> str:
    if not isinstance(value, str) or "{alertname}" not in value:
        raise SignatureConfigError(
            "runbook_url", f"must be a string containing {{alertname}}, got {_kind(value)}"
        )
    return value


def _label_name(value: object, where: str) -> str:
    if not isinstance(value, str) or not LABEL_NAME.match(value):
        raise SignatureConfigError(where, f"must be a Prometheus label name, got {_kind(value)}")
    return value


def _join_labels(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise SignatureConfigError("join_labels", f"must be a list of labels, got {_kind(value)}")
    if not value:
        raise SignatureConfigError("join_labels", "must list at least one label")
    labels: list[str] = []
    for index, item in enumerate(value):
        label = _label_name(item, f"join_labels[{index}]")
        if label in RESERVED_LABELS:
            raise SignatureConfigError(
                f"join_labels[{index}]", f"{label!r} is a label the rules use themselves"
            )
        if label in labels:
            raise SignatureConfigError(f"join_labels[{index}]", f"{label!r} is listed twice")
        labels.append(label)
    return tuple(labels)


def _selectors(value: object) -> Selectors:
    section = _mapping(value, "selectors")
    names = tuple(f.name for f in fields(Selectors))
    _known_keys(section, "selectors", names)
    out: dict[str, str] = {}
    for name in names:
        if name not in section:
            continue
        text = section[name]
        where = f"selectors.{name}"
        if text is None:
            text = ""
        if not isinstance(text, str):
            raise SignatureConfigError(where, f"must be a string of matchers, got {_kind(text)}")
        try:
            matchers = split_matchers(text)
        except ValueError as err:
            raise SignatureConfigError(where, str(err)) from None
        if name == "exporter" and not matchers:
            raise SignatureConfigError(
                where, 'must select the exporter\'s scrape targets (e.g. job="...")'
            )
        out[name] = ",".join(matchers)
    return Selectors(**out)


def _dcgm(value: object, join_labels: tuple[str, ...]) -> DcgmJoin:
    section = _mapping(value, "dcgm")
    _known_keys(section, "dcgm", ("join",))
    if "join" not in section:
        return DcgmJoin.default(join_labels)
    join = _mapping(section["join"], "dcgm.join")
    if not join:
        raise SignatureConfigError("dcgm.join", "must map at least one join label")
    pairs: list[tuple[str, str]] = []
    for target, dcgm_label in join.items():
        where = f"dcgm.join.{target}"
        if target not in join_labels:
            raise SignatureConfigError(
                where, f"{target!r} is not one of join_labels ({', '.join(join_labels)})"
            )
        pairs.append((target, _label_name(dcgm_label, where)))
    return DcgmJoin(tuple(pairs))


def _gateway(value: object, join_labels: tuple[str, ...]) -> GatewayJoin:
    section = _mapping(value, "gateway")
    _known_keys(section, "gateway", ("join",))
    if "join" not in section:
        return GatewayJoin.default(join_labels)
    items = section["join"]
    if not isinstance(items, list):
        raise SignatureConfigError("gateway.join", f"must be a list of labels, got {_kind(items)}")
    labels: list[str] = []
    for index, item in enumerate(items):
        where = f"gateway.join[{index}]"
        label = _label_name(item, where)
        if label not in join_labels:
            raise SignatureConfigError(
                where, f"{label!r} is not one of join_labels ({', '.join(join_labels)})"
            )
        if label in TARGET_ONLY_LABELS:
            raise SignatureConfigError(
                where,
                f"{label!r} names one scrape target; a gateway and the engines of its pool "
                "are different targets",
            )
        if label in labels:
            raise SignatureConfigError(where, f"{label!r} is listed twice")
        labels.append(label)
    return GatewayJoin(tuple(labels))


def _check_node_join(join_labels: tuple[str, ...]) -> None:
    """The node profile gives a GPU to the target of the pod that holds it (namespace, pod)."""
    for label in ("namespace", "pod"):
        if label not in join_labels:
            raise SignatureConfigError(
                "join_labels",
                f"the node profile joins GPUs to pods by namespace and pod; {label!r} is missing",
            )


def _check_dcgm_join(dcgm: DcgmJoin, join_labels: tuple[str, ...]) -> None:
    """The dcgm profile joins on labels the sidecar's targets must carry too."""
    for label in dcgm.target_labels:
        if label not in join_labels:
            raise SignatureConfigError(
                "dcgm.join",
                f"the dcgm profile joins on {label!r}, which is not in join_labels; "
                "set dcgm.join to join labels that dcgm-exporter series carry",
            )


def _duration(value: object, where: str, *, allow_zero: bool) -> float:
    if not isinstance(value, str):
        raise SignatureConfigError(
            where, f"must be a duration string such as 5m, got {_kind(value)}"
        )
    try:
        seconds = parse_duration(value)
    except ValueError as err:
        raise SignatureConfigError(where, str(err)) from None
    if seconds <= 0 and not allow_zero:
        raise SignatureConfigError(where, "must be longer than 0s")
    return seconds


def _windows(value: object) -> Windows:
    section = _mapping(value, "windows")
    names = tuple(f.name for f in fields(Windows))
    _known_keys(section, "windows", names)
    return Windows(
        **{
            name: _duration(section[name], f"windows.{name}", allow_zero=False)
            for name in names
            if name in section
        }
    )


def _price(value: object, where: str) -> float:
    number = _number(value, where)
    if number <= 0:
        raise SignatureConfigError(where, f"must be a price above 0, got {value}")
    return number


def _cost(value: object) -> Cost:
    section = _mapping(value, "cost")
    _known_keys(section, "cost", tuple(COST_HELP))
    price = None
    if section.get("gpu_hour_price") is not None:
        price = _price(section["gpu_hour_price"], "cost.gpu_hour_price")
    currency = section.get("currency", Cost.currency)
    if not isinstance(currency, str) or not _CURRENCY.match(currency):
        raise SignatureConfigError(
            "cost.currency", f"must be an ISO 4217 code such as USD or EUR, got {_kind(currency)}"
        )
    where = "cost.gpu_hour_price_by_product"
    products = _mapping(section.get("gpu_hour_price_by_product", {}), where)
    by_product: list[tuple[str, float]] = []
    seen: set[str] = set()
    for name, raw in products.items():
        key = " ".join(name.split()).lower()
        if not key:
            raise SignatureConfigError(where, "a product name must not be empty")
        if key in seen:
            raise SignatureConfigError(f"{where}.{name}", "is listed twice")
        seen.add(key)
        by_product.append((" ".join(name.split()), _price(raw, f"{where}.{name}")))
    return Cost(price, currency, tuple(by_product))


def _gpu_peaks(value: object) -> tuple[ProductPeaks, ...]:
    section = _mapping(value, "gpu_peaks")
    out: list[ProductPeaks] = []
    seen: set[str] = set()
    for name, raw in section.items():
        where = f"gpu_peaks.{name}"
        key = " ".join(name.split()).lower()
        if not key:
            raise SignatureConfigError("gpu_peaks", "a product name must not be empty")
        if key in seen:
            raise SignatureConfigError(where, "is listed twice")
        seen.add(key)
        figures = _mapping(raw, where)
        _known_keys(figures, where, tuple(GPU_PEAK_HELP))
        if not figures:
            raise SignatureConfigError(where, f"give at least one of {', '.join(GPU_PEAK_HELP)}")
        peaks = {k: _peak(v, f"{where}.{k}") for k, v in figures.items()}
        bandwidth = peaks.get("memory_bandwidth_bytes_per_second")
        flops = tuple(
            (k.removesuffix("_flops"), v) for k, v in peaks.items() if k.endswith("_flops")
        )
        out.append(ProductPeaks(" ".join(name.split()), bandwidth, flops))
    return tuple(out)


def _peak(value: object, where: str) -> float:
    """A peak above 0. Also a string that is a number: YAML 1.1 (PyYAML) reads ``1.792e12``,
    with no sign in its exponent, as a string, where YAML 1.2 and a reader see a number."""
    if isinstance(value, str):
        with contextlib.suppress(ValueError):
            value = float(value)
    number = _number(value, where)
    if number <= 0:
        raise SignatureConfigError(where, f"must be a peak above 0, got {value}")
    return number


def _signatures(value: object) -> dict[str, dict[str, ParamValue]]:
    section = _mapping(value, "signatures")
    out: dict[str, dict[str, ParamValue]] = {}
    for alert, body in section.items():
        where = f"signatures.{alert}"
        if alert not in PARAMS:
            raise SignatureConfigError(where, "unknown alert (see docs/runbooks/ for the names)")
        params = {p.name: p for p in PARAMS[alert]}
        settings = _mapping(body, where)
        _known_keys(settings, where, tuple(params))
        out[alert] = {
            name: _param(params[name], raw, f"{where}.{name}") for name, raw in settings.items()
        }
    return out


def _number(value: object, where: str) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SignatureConfigError(where, f"must be a number, got {_kind(value)}")
    if not math.isfinite(value):
        raise SignatureConfigError(where, "must be a finite number")
    return float(value)


def _list(value: object, where: str) -> list[object]:
    if not isinstance(value, list):
        raise SignatureConfigError(where, f"must be a list, got {_kind(value)}")
    if not value:
        raise SignatureConfigError(where, "must not be empty")
    return list(value)


def _param(spec: Param, value: object, where: str) -> ParamValue:
    kind = spec.kind
    if kind == "duration":
        return _duration(value, where, allow_zero=True)
    if kind in ("ratio", "bucket"):
        number = _number(value, where)
        if not 0.0 <= number <= 1.0:
            raise SignatureConfigError(where, f"must be a ratio from 0 to 1, got {value}")
        bounds = UTILIZATION_BUCKETS[:-1]
        if kind == "bucket" and number not in bounds:
            raise SignatureConfigError(
                where,
                f"must be a bucket bound of inference_gpu_utilization_samples "
                f"({', '.join(map(str, bounds))}), got {value}",
            )
        return number
    if kind == "number":
        number = _number(value, where)
        if number < 0:
            raise SignatureConfigError(where, f"must be 0 or more, got {value}")
        return number
    if kind == "factor":
        number = _number(value, where)
        if number <= 0:
            raise SignatureConfigError(where, f"must be more than 0, got {value}")
        return number
    items = _list(value, where)
    if kind == "xids":
        xids: list[int] = []
        for index, item in enumerate(items):
            if isinstance(item, bool) or not isinstance(item, int) or item <= 0:
                raise SignatureConfigError(
                    f"{where}[{index}]", f"must be a positive Xid number, got {_kind(item)}"
                )
            xids.append(item)
        return tuple(sorted(set(xids)))
    names: list[str] = []
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise SignatureConfigError(f"{where}[{index}]", f"must be a string, got {_kind(item)}")
        if kind == "reasons" and item not in CLOCK_EVENT_BITS:
            raise SignatureConfigError(
                f"{where}[{index}]",
                f"unknown clock event reason {item!r} (known: {', '.join(CLOCK_EVENT_BITS)})",
            )
        if kind == "names" and not _is_engine_name(item):
            raise SignatureConfigError(f"{where}[{index}]", f"{item!r} is not an engine name")
        if item not in names:
            names.append(item)
    return tuple(names)


def _is_engine_name(text: str) -> bool:
    return _ENGINE_NAME.match(text) is not None
