"""What every dashboard shares: variables, selectors, units, thresholds and panel factories.

Row modules build panels only through the factories here, so every panel gets the same
datasource (the ``$datasource`` variable), a description, fixed sizes, and queries that filter
by the same template variables.

Like a monitoring mixin's ``_config``, the rule pack's site config
(``exporter.signatures.site``) drives the dashboards as it drives the rules: its join labels
are the ``by (...)`` grouping, the target variables and the legends; its sidecar selector goes
on every ``inference_*`` series and its exporter selector on ``up``, ``scrape_*`` and
``process_*``; the alert parameters are the dashed threshold lines, so a panel's red line sits
where the alert fires. Without a site config the shipped defaults apply.

Selectors tolerate targets without some target label (a static scrape config has no
``namespace``/``pod``): the variables' "All" value is ``.*``, which also matches an absent
label, and every matcher on them is a regular-expression matcher.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Literal, Protocol, Self, TypeVar

from grafana_foundation_sdk.builders import bargauge, heatmap, prometheus, stat, statetimeline
from grafana_foundation_sdk.builders import common as common_builders
from grafana_foundation_sdk.builders import table as table_builders
from grafana_foundation_sdk.builders import timeseries as timeseries_builders
from grafana_foundation_sdk.builders.dashboard import (
    AnnotationQuery,
    Dashboard,
    DashboardLink,
    DatasourceVariable,
    FieldColor,
    QueryVariable,
    Row,
    ThresholdsConfig,
)
from grafana_foundation_sdk.cog import builder as cogbuilder
from grafana_foundation_sdk.cog import variants as cogvariants
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common as common_models
from grafana_foundation_sdk.models import dashboard as dashboard_models
from grafana_foundation_sdk.models.heatmap import HeatmapColorMode, HeatmapColorScale
from grafana_foundation_sdk.models.prometheus import PromQueryFormat
from prometheus_client.utils import floatToGoString

from exporter.metrics import GPU_LABELS
from exporter.signatures.promql_text import selector, split_matchers
from exporter.signatures.signals.dcgm_join import dcgm_matchers, dcgm_per_gpu, dcgm_series
from exporter.signatures.signals.node_join import holder_matchers, node_per_gpu
from exporter.signatures.signals.shared_gpu_signals import GPU_DEVICE_UTILIZATION
from exporter.signatures.signals.signal import Signal
from exporter.signatures.signals.signal import Unit as SignalUnit
from exporter.signatures.signals.signal_context import SignalContext
from exporter.signatures.site import CLUSTER, SignatureConfigError, SiteConfig, Source

# --- identity ---------------------------------------------------------------------------------

TAG = "inference-bottleneck-exporter"

DATASOURCE = dashboard_models.DataSourceRef(type_val="prometheus", uid="${datasource}")

# --- units (Grafana unit ids) -----------------------------------------------------------------


class Unit:
    """Grafana unit ids of the exporter's base units."""

    RATIO = "percentunit"  # 0-1 shown as percent
    SECONDS = "s"
    BYTES = "bytes"
    BYTES_PER_SECOND = "Bps"
    WATTS = "watt"
    JOULES = "joule"
    HERTZ = "hertz"
    CELSIUS = "celsius"
    COUNT = "short"
    PER_SECOND = "suffix: /s"
    TOKENS_PER_SECOND = "suffix: tok/s"
    CALLS_PER_SECOND = "suffix: calls/s"
    CORES = "suffix: cores"
    STATE = "none"
    FLOPS = "suffix: FLOP/s"
    REQUESTS_PER_SECOND = "suffix: req/s"

    @classmethod
    def of(cls, unit: SignalUnit) -> str:
        """The Grafana unit of a signal's unit."""
        return {
            "ratio": cls.RATIO,
            "seconds": cls.SECONDS,
            "requests": cls.COUNT,
            "requests_per_second": cls.REQUESTS_PER_SECOND,
            "tokens": cls.COUNT,
            "tokens_per_second": cls.TOKENS_PER_SECOND,
            "bytes": cls.BYTES,
            "bytes_per_second": cls.BYTES_PER_SECOND,
            "flops": cls.FLOPS,
            "celsius": cls.CELSIUS,
            "hertz": cls.HERTZ,
            "count": cls.COUNT,
            "flag": cls.STATE,
            "watts": cls.WATTS,
            "joules": cls.JOULES,
            "cost": cls.currency(site().cost.currency),
        }[unit]

    @staticmethod
    def currency(code: str) -> str:
        """Grafana's unit of a currency: its own for the common ones, else the code after the
        number."""
        return f"currency{code}" if code in _GRAFANA_CURRENCIES else f"suffix: {code}"


#: Currencies Grafana has a unit of its own for (``currencyUSD``, ...).
_GRAFANA_CURRENCIES = frozenset({"USD", "EUR", "GBP", "JPY", "CHF", "INR", "BRL", "SEK", "NOK"})


# --- the site -------------------------------------------------------------------------------

# The site config the dashboards are being built for. ``generate`` sets it for one generation
# (``using(cfg)``); the helpers below read it when a row module calls them, never at import, so
# one process can build the shipped dashboards and a site's side by side.
_SITE: ContextVar[SiteConfig] = ContextVar("dashboards_site")
_SHIPPED = SiteConfig()

# The one template variable that is not a target label; a join label may not take its name.
DATASOURCE_VARIABLE = "datasource"


@contextmanager
def using(cfg: SiteConfig) -> Iterator[SiteConfig]:
    """Build dashboards for ``cfg`` inside the block (the shipped defaults outside it)."""
    check_site(cfg)
    token = _SITE.set(cfg)
    try:
        yield cfg
    finally:
        _SITE.reset(token)


def check_site(cfg: SiteConfig) -> None:
    """Refuse a config the dashboards cannot follow, as the rule pack refuses a bad one."""
    for index, label in enumerate(cfg.join_labels):
        if label == DATASOURCE_VARIABLE:
            raise SignatureConfigError(
                f"join_labels[{index}]",
                f"{label!r} is the name of the dashboards' data source variable",
            )


def site() -> SiteConfig:
    """The site config of the dashboards being built."""
    return _SITE.get(_SHIPPED)


def layout() -> Source:
    """Where the GPU series come from in the profile being built: the sidecar's NVML, the node
    agent (``node``), dcgm-exporter (``dcgm``)."""
    return site().profile.source


# --- selectors --------------------------------------------------------------------------------


def target_labels() -> tuple[str, ...]:
    """The labels of one scrape target: the rule pack's join labels, its ``by (...)`` grouping.

    By default ``namespace, pod, instance, job`` (a PodMonitor's target; a static config has
    ``instance, job``).
    """
    return site().join_labels


def exporter_labels() -> tuple[str, ...]:
    """The labels every series of one exporter shares in every layout: ``instance`` and
    ``job`` (and ``cluster``). A series of a GPU meets its exporter's series of no GPU (the
    driver's) on these: the node agent files the first under the pod holding the GPU, the
    second under none."""
    cluster = (CLUSTER,) if CLUSTER in site().join_labels else ()
    return (*cluster, "instance", "job")


def variable_labels() -> tuple[str, ...]:
    """The target labels with a template variable, in the join labels' order.

    Every join label but ``job`` (the exporter's targets share one, picked by the exporter
    selector), and but ``instance`` where ``pod`` names the target (it is then the pod's
    address): ``namespace, pod`` by default, ``instance`` for a site that joins on it alone.
    """
    labels = [label for label in target_labels() if label != "job"]
    if "pod" in labels and "instance" in labels:
        labels.remove("instance")
    return tuple(labels)


def column_labels() -> tuple[str, ...]:
    """The target labels a table shows: every join label but ``job``."""
    return tuple(label for label in target_labels() if label != "job") or target_labels()


def target_legend(*, short: bool = False) -> str:
    """A series' target in a legend: its join labels but ``namespace`` and ``job``.

    ``{{pod}} {{instance}}`` by default; ``short`` leaves out the address (``{{pod}}``).
    """
    labels = [label for label in target_labels() if label not in ("namespace", "job")]
    if short and len(labels) > 1 and "instance" in labels:
        labels.remove("instance")
    return " ".join("{{" + label + "}}" for label in labels or target_labels())


def gpu_legend() -> str:
    return target_legend() + " GPU {{gpu}}"


def target_matchers() -> tuple[str, ...]:
    """One regex matcher per target variable: ``namespace=~"$namespace", pod=~"$pod"``."""
    return tuple(f'{label}=~"${label}"' for label in variable_labels())


def sidecar_matchers() -> tuple[str, ...]:
    """The site's matchers of every ``inference_*`` series (``selectors.sidecar``)."""
    return tuple(split_matchers(site().selectors.sidecar))


def exporter_matchers() -> tuple[str, ...]:
    """Series that are not ``inference_*`` (up, scrape_*, process_*) exist for every target
    Prometheus scrapes; these matchers pick the sidecar's, as the InferenceExporterDown alert
    does (``selectors.exporter``)."""
    return tuple(split_matchers(site().selectors.exporter))


def _is_sidecar_series(metric: str) -> bool:
    """A series the sidecar exports (not a recording rule's, not Prometheus's own)."""
    return metric.startswith("inference_") and ":" not in metric


GPU = 'gpu=~"$gpu"'
MODEL = 'model=~"$model"'

RATE_INTERVAL = "$__rate_interval"
RANGE = "$__range"


def _body(matchers: Sequence[str]) -> str:
    return "{" + ", ".join(matchers) + "}" if matchers else ""


def series(metric: str, *matchers: str) -> str:
    """``metric{<target variables>, <site selector>, <matchers>}``.

    The site's sidecar selector goes on the sidecar's own series only, as in the rules; a
    panel passes ``*exporter_matchers()`` for ``up``, ``scrape_*`` and ``process_*``.
    """
    site_matchers = sidecar_matchers() if _is_sidecar_series(metric) else ()
    own = [part for text in matchers for part in split_matchers(text)]
    return metric + _body((*target_matchers(), *site_matchers, *own))


def signal(sig: Signal, *matchers: str) -> str:
    """A signal of the rule pack (a recording rule the alerts read) as the site's pack names
    it, ``{<target variables>, <matchers>}``."""
    return series(sig.record(site()), *matchers)


class Select(Protocol):
    """Builds a selector of one raw series of the layout's source, narrowed to the GPU
    variable unless the series is not per GPU (``per_gpu=False``: a node's driver)."""

    def __call__(self, metric: str, *matchers: str, per_gpu: bool = True) -> str: ...


#: PromQL of one per-GPU reading, given how to select the source's series.
Reading = Callable[[Select], str]


def gpu_reading(nvml: Reading, dcgm: Reading | None = None, *, keep: Sequence[str] = ()) -> str:
    """A per-GPU reading from the layout's own source, one series per target, GPU (and ``keep``
    label), with the target's join labels: where no signal exists (per-GPU detail).

    ``nvml`` is PromQL over the NVML collector's series (``inference_gpu_*``): the sidecar's
    own, or (``node``) the node agent's, filed under the pod holding each GPU; ``dcgm`` over
    dcgm-exporter's (``DCGM_FI_*``), joined by pod. The joins are the rules' own
    (:mod:`exporter.signatures.signals.node_join`, :mod:`~exporter.signatures.signals.dcgm_join`),
    narrowed to the dashboard's variables before joining. Where dcgm-exporter has no such
    reading (``dcgm=None``), the sidecar's series, which are absent there: no data.
    """
    ctx = SignalContext(site())
    extra = tuple(label for label in keep if label not in GPU_LABELS)
    labels = ", ".join((*target_labels(), "gpu", *extra))
    source = layout()
    if source == "node":
        # the agent files each device's series under its pod: narrowed to it before the join
        held = holder_matchers(ctx, target_matchers())

        def agent(metric: str, *matchers: str, per_gpu: bool = True) -> str:
            # a series of no GPU (the driver's) is the agent's own, under no pod
            gpu = (GPU, *held) if per_gpu else ()
            return selector(metric, site().selectors.sidecar, *gpu, *matchers)

        inner = node_per_gpu(ctx, nvml(agent), extra, pod=target_matchers())
    elif source == "dcgm" and dcgm is not None:
        narrowed = dcgm_matchers(ctx, target_matchers())

        def exporter(metric: str, *matchers: str, per_gpu: bool = True) -> str:
            gpu = (GPU,) if per_gpu else ()
            return dcgm_series(ctx, metric, *gpu, *matchers, *narrowed)

        inner = dcgm_per_gpu(ctx, dcgm(exporter), extra, target=target_matchers())
    else:

        def own(metric: str, *matchers: str, per_gpu: bool = True) -> str:
            return series(metric, *((GPU,) if per_gpu else ()), *matchers)

        inner = nvml(own)
    return f"max by ({labels}) (\n{inner}\n)"


def gpu_gauge(nvml: str, dcgm: str | None = None, scale: str = "") -> str:
    """One gauge per GPU (:func:`gpu_reading`): the NVML collector's ``nvml``, or
    dcgm-exporter's field ``dcgm`` followed by ``scale`` (`` * 1000000`` for its MHz)."""

    def own(select: Select) -> str:
        return select(nvml)

    def exporter(select: Select) -> str:
        return f"{select(dcgm or '')}{scale}"

    return gpu_reading(own, exporter if dcgm else None)


def gpu_variable_source() -> str:
    """The series the GPU variable lists its values from: the per-GPU utilisation signal, which
    carries each target's GPUs in every layout (the agent's or dcgm-exporter's index where they
    read the GPUs)."""
    return series(GPU_DEVICE_UTILIZATION.record(site()))


def over(metric: str, *matchers: str, window: str = RATE_INTERVAL) -> str:
    """``metric{...}[window]``, the argument of rate(), increase(), avg_over_time()."""
    return f"{series(metric, *matchers)}[{window}]"


def rate(metric: str, *matchers: str) -> str:
    return f"rate({over(metric, *matchers)})"


def by(aggregation: str, inner: str, *extra: str) -> str:
    """``aggregation by (<target labels>, extra...) (inner)``."""
    return f"{aggregation} by ({', '.join((*target_labels(), *extra))}) ({inner})"


def mean_per_request(histogram: str, *matchers: str) -> str:
    """Mean of a histogram's observations per target: rate of the sum over rate of the count."""
    return (
        f"{by('sum', rate(histogram + '_sum', *matchers))}\n/\n"
        f"{by('sum', rate(histogram + '_count', *matchers))}"
    )


def quantile(q: float, histogram: str, *matchers: str, extra: Sequence[str] = ()) -> str:
    buckets = by("sum", rate(histogram + "_bucket", *matchers), *extra, "le")
    return f"histogram_quantile({q}, {buckets})"


def le(bound: float) -> str:
    """A bucket bound as the exporter writes it in the ``le`` label."""
    text: str = floatToGoString(bound)  # type: ignore[no-untyped-call]
    return text


# --- alert thresholds -------------------------------------------------------------------------


def alert_threshold(alert: str, param: str) -> float:
    """An alert parameter of the site config (``exporter/signatures/params.py`` defaults)."""
    return site().ratio(alert, param)


def alert_names(alert: str, param: str) -> tuple[str, ...]:
    return site().names(alert, param)


def alert_ints(alert: str, param: str) -> tuple[int, ...]:
    return site().ints(alert, param)


def pct(ratio: float) -> str:
    return f"{ratio * 100:g} %"


# --- queries ----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Query:
    """One PromQL target of a panel; ``axis="right"`` puts its series on a second y axis."""

    expr: str
    legend: str = ""
    instant: bool = False
    format: Literal["time_series", "table", "heatmap"] = "time_series"
    axis: Literal["left", "right"] = "left"
    unit: str | None = None
    stack: bool | None = None
    dashed: bool = False
    thresholds: tuple[tuple[float, str], ...] = field(default_factory=tuple)


def _ref(index: int) -> str:
    return chr(ord("A") + index)


def _target(query: Query, ref: str) -> prometheus.Dataquery:
    target = (
        prometheus.Dataquery()
        .expr(query.expr)
        .ref_id(ref)
        .datasource(DATASOURCE)
        .format(PromQueryFormat(query.format))
    )
    if query.legend:
        target = target.legend_format(query.legend)
    return target.instant() if query.instant else target.range()


def steps(*levels: tuple[float, str], base: str = "green") -> ThresholdsConfig:
    """Absolute thresholds: ``base`` below the first level, then each level's colour."""
    return (
        ThresholdsConfig()
        .mode(dashboard_models.ThresholdsMode.ABSOLUTE)
        .steps(
            [
                dashboard_models.Threshold(value=None, color=base),
                *(dashboard_models.Threshold(value=v, color=c) for v, c in levels),
            ]
        )
    )


def warn(level: float) -> tuple[float, str]:
    return (level, "red")


# --- panels -----------------------------------------------------------------------------------


class PanelBuilder(Protocol):
    """What every panel builder of the SDK has in common (the factories use only this)."""

    def title(self, title: str) -> Self: ...
    def description(self, description: str) -> Self: ...
    def datasource(self, datasource: dashboard_models.DataSourceRef) -> Self: ...
    def span(self, w: int) -> Self: ...
    def height(self, h: int) -> Self: ...
    def unit(self, unit: str) -> Self: ...
    def with_target(self, target: cogbuilder.Builder[cogvariants.Dataquery]) -> Self: ...


P = TypeVar("P", bound=PanelBuilder)


def _base(
    panel: P,
    *,
    title: str,
    description: str,
    queries: Sequence[Query],
    unit: str,
    span: int,
    height: int,
) -> P:
    panel = (
        panel.title(title)
        .description(description)
        .datasource(DATASOURCE)
        .span(span)
        .height(height)
        .unit(unit)
    )
    for index, query in enumerate(queries):
        panel = panel.with_target(_target(query, _ref(index)))
    return panel


def _legend() -> common_builders.VizLegendOptions:
    return (
        common_builders.VizLegendOptions()
        .display_mode(common_models.LegendDisplayMode.LIST)
        .placement(common_models.LegendPlacement.BOTTOM)
        .show_legend(True)
    )


def _tooltip() -> common_builders.VizTooltipOptions:
    return (
        common_builders.VizTooltipOptions()
        .mode(common_models.TooltipDisplayMode.MULTI)
        .sort(common_models.SortOrder.DESCENDING)
    )


def timeseries(
    title: str,
    description: str,
    queries: Sequence[Query],
    *,
    unit: str,
    span: int = 12,
    height: int = 8,
    thresholds: Sequence[tuple[float, str]] = (),
    minimum: float | None = 0.0,
    maximum: float | None = None,
    stack: bool = False,
    bars: bool = False,
    right_label: str = "",
) -> timeseries_builders.Panel:
    """A time series panel.

    ``thresholds`` are drawn as dashed lines for the whole panel; a query's own
    ``thresholds`` (two series with different limits on one panel) apply to its series only.
    """
    panel = _base(
        timeseries_builders.Panel(),
        title=title,
        description=description,
        queries=queries,
        unit=unit,
        span=span,
        height=height,
    )
    panel = (
        panel.legend(_legend())
        .tooltip(_tooltip())
        .line_width(1)
        .fill_opacity(30 if stack else 10)
        .show_points(common_models.VisibilityMode.NEVER)
        .span_nulls(False)
        .draw_style(
            common_models.GraphDrawStyle.BARS if bars else common_models.GraphDrawStyle.LINE
        )
        .stacking(
            common_builders.StackingConfig().mode(
                common_models.StackingMode.NORMAL if stack else common_models.StackingMode.NONE
            )
        )
    )
    two_axes = any(query.axis == "right" for query in queries)
    if not two_axes:
        # With a second axis the left axis's limits go to its queries only (below).
        if minimum is not None:
            panel = panel.min(minimum)
        if maximum is not None:
            panel = panel.max(maximum)
    if thresholds:
        panel = panel.thresholds(steps(*thresholds)).thresholds_style(
            common_builders.GraphThresholdsStyleConfig().mode(
                common_models.GraphThresholdsStyleMode.DASHED
            )
        )
    for index, query in enumerate(queries):
        limits = (minimum, maximum) if two_axes and query.axis == "left" else (None, None)
        properties = _overrides(query, right_label, *limits)
        if properties:
            panel = panel.override_by_query(_ref(index), properties)
    return panel


def _overrides(
    query: Query, right_label: str, minimum: float | None, maximum: float | None
) -> list[dashboard_models.DynamicConfigValue]:
    """Field overrides of one query's series: axis, unit, limits, stacking, style, thresholds."""

    def prop(name: str, value: object) -> dashboard_models.DynamicConfigValue:
        return dashboard_models.DynamicConfigValue(id_val=name, value=value)

    properties: list[dashboard_models.DynamicConfigValue] = []
    if query.axis == "right":
        properties += [
            prop("custom.axisPlacement", "right"),
            prop("custom.axisLabel", right_label),
            prop("custom.thresholdsStyle", {"mode": "off"}),
            prop("min", 0),
        ]
    if minimum is not None:
        properties.append(prop("min", minimum))
    if maximum is not None:
        properties.append(prop("max", maximum))
    if query.unit is not None:
        properties.append(prop("unit", query.unit))
    if query.stack is not None:
        mode = common_models.StackingMode.NORMAL if query.stack else common_models.StackingMode.NONE
        properties.append(prop("custom.stacking", {"group": "A", "mode": str(mode)}))
        if not query.stack:
            properties.append(prop("custom.fillOpacity", 0))
    if query.dashed:
        properties.append(prop("custom.lineStyle", {"dash": [10, 10], "fill": "dash"}))
    if query.thresholds:
        properties += [
            prop("thresholds", steps(*query.thresholds).build()),
            prop("custom.thresholdsStyle", {"mode": "dashed"}),
        ]
    return properties


def stat_panel(
    title: str,
    description: str,
    queries: Sequence[Query],
    *,
    unit: str,
    span: int = 6,
    height: int = 4,
    thresholds: Sequence[tuple[float, str]] = (),
    base: str = "green",
) -> stat.Panel:
    """A single number (the last value of each series), coloured by ``thresholds``."""
    return (
        _base(
            stat.Panel(),
            title=title,
            description=description,
            queries=queries,
            unit=unit,
            span=span,
            height=height,
        )
        .thresholds(steps(*thresholds, base=base))
        .color_scheme(FieldColor().mode(dashboard_models.FieldColorModeId.THRESHOLDS))
        .color_mode(common_models.BigValueColorMode.BACKGROUND)
        .graph_mode(common_models.BigValueGraphMode.NONE)
        .text_mode(common_models.BigValueTextMode.VALUE)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )


UP_DOWN = [
    dashboard_models.ValueMap(
        options={
            "0": dashboard_models.ValueMappingResult(text="down", color="red", index=0),
            "1": dashboard_models.ValueMappingResult(text="up", color="green", index=1),
        }
    )
]
OK_FAILING = [
    dashboard_models.ValueMap(
        options={
            "0": dashboard_models.ValueMappingResult(text="failing", color="red", index=0),
            "1": dashboard_models.ValueMappingResult(text="ok", color="green", index=1),
        }
    )
]
OFF_ACTIVE = [
    dashboard_models.ValueMap(
        options={
            "0": dashboard_models.ValueMappingResult(text="-", color="transparent", index=0),
            "1": dashboard_models.ValueMappingResult(text="active", color="orange", index=1),
        }
    )
]


def state_timeline(
    title: str,
    description: str,
    queries: Sequence[Query],
    *,
    mappings: list[dashboard_models.ValueMap],
    span: int = 12,
    height: int = 8,
) -> statetimeline.Panel:
    """One lane per series; ``mappings`` name and colour the states (0/1 gauges)."""
    return (
        _base(
            statetimeline.Panel(),
            title=title,
            description=description,
            queries=queries,
            unit=Unit.STATE,
            span=span,
            height=height,
        )
        .mappings(list(mappings))
        .color_scheme(FieldColor().mode(dashboard_models.FieldColorModeId.THRESHOLDS))
        .show_value(common_models.VisibilityMode.NEVER)
        .merge_values(True)
        .row_height(0.8)
        .fill_opacity(80)
        .legend(_legend().show_legend(False))
        .tooltip(_tooltip())
    )


def table_panel(
    title: str,
    description: str,
    queries: Sequence[Query],
    *,
    columns: Sequence[str],
    span: int = 24,
    height: int = 6,
    links: dict[str, tuple[str, str]] | None = None,
) -> table_builders.Panel:
    """An instant table showing ``columns`` (labels) in that order; other columns hidden.

    ``links`` maps a column to (title, URL) of a data link on its cells.
    """
    order = {name: index for index, name in enumerate(columns)}
    organize = dashboard_models.DataTransformerConfig(
        id_val="organize",
        options={
            "excludeByName": {"Time": True, "Value": True, "__name__": True},
            "indexByName": order,
            "includeByName": {name: True for name in columns},
        },
    )
    panel = (
        _base(
            table_builders.Panel(),
            title=title,
            description=description,
            queries=queries,
            unit=Unit.STATE,
            span=span,
            height=height,
        )
        .with_transformation(organize)
        .align(common_models.FieldTextAlignment.AUTO)
        .inspect(False)
        .show_header(True)
        .cell_height(common_models.TableCellHeight.SM)
    )
    for column, (link_title, url) in sorted((links or {}).items()):
        panel = panel.override_by_name(
            column,
            [
                dashboard_models.DynamicConfigValue(
                    id_val="links", value=[{"title": link_title, "url": url, "targetBlank": True}]
                )
            ],
        )
    return panel


def heatmap_panel(
    title: str,
    description: str,
    queries: Sequence[Query],
    *,
    y_unit: str,
    span: int = 12,
    height: int = 8,
) -> heatmap.Panel:
    """A heatmap of Prometheus histogram buckets (queries with ``format="heatmap"``)."""
    return (
        _base(
            heatmap.Panel(),
            title=title,
            description=description,
            queries=queries,
            unit=Unit.COUNT,
            span=span,
            height=height,
        )
        .calculate(False)
        .y_axis(heatmap.YAxisConfig().unit(y_unit).axis_placement(common_models.AxisPlacement.LEFT))
        .rows_frame(heatmap.RowsHeatmapOptions().layout(common_models.HeatmapCellLayout.LE))
        .color(
            heatmap.HeatmapColorOptions()
            .mode(HeatmapColorMode.SCHEME)
            .scheme("Oranges")
            .fill("dark-orange")
            .scale(HeatmapColorScale.EXPONENTIAL)
            .exponent(0.5)
            .steps(64)
            .reverse(False)
        )
        .cell_gap(1)
        .hide_from(common_builders.HideSeriesConfig().legend(False).tooltip(False).viz(False))
        .show_value(common_models.VisibilityMode.NEVER)
        .mode(common_models.TooltipDisplayMode.SINGLE)
        .show_y_histogram()
        .show_legend()
    )


def bar_gauge(
    title: str,
    description: str,
    queries: Sequence[Query],
    *,
    unit: str,
    span: int = 12,
    height: int = 8,
    minimum: float = 0.0,
    maximum: float | None = None,
    thresholds: Sequence[tuple[float, str]] = (),
) -> bargauge.Panel:
    """Horizontal bars, one per series (instant queries)."""
    panel = (
        _base(
            bargauge.Panel(),
            title=title,
            description=description,
            queries=queries,
            unit=unit,
            span=span,
            height=height,
        )
        .min(minimum)
        .thresholds(steps(*thresholds, base="blue"))
        .display_mode(common_models.BarGaugeDisplayMode.BASIC)
        .orientation(common_models.VizOrientation.HORIZONTAL)
        .show_unfilled(True)
        .reduce_options(common_builders.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
    )
    return panel if maximum is None else panel.max(maximum)


AnyPanel = (
    timeseries_builders.Panel
    | stat.Panel
    | statetimeline.Panel
    | table_builders.Panel
    | heatmap.Panel
    | bargauge.Panel
)

# --- variables and dashboards -----------------------------------------------------------------

_ALL = dashboard_models.VariableOption(selected=True, text="All", value="$__all")


def _query_variable(
    name: str, label: str, query: str, description: str, *, numeric: bool = False
) -> QueryVariable:
    return (
        QueryVariable(name)
        .label(label)
        .description(description)
        .datasource(DATASOURCE)
        .query(query)
        .refresh(dashboard_models.VariableRefresh.ON_TIME_RANGE_CHANGED)
        .sort(
            dashboard_models.VariableSort.NUMERICAL_ASC
            if numeric
            else dashboard_models.VariableSort.ALPHABETICAL_ASC
        )
        .multi(True)
        .include_all(True)
        .all_value(".*")
        .current(_ALL)
    )


# Names and descriptions of the target variables the shipped join labels have; any other join
# label gets a generic one.
_TARGET_VARIABLES: dict[str, tuple[str, str]] = {
    "namespace": (
        "Namespace",
        "Kubernetes namespace of the sidecar's pod (empty for static scrape targets; "
        "All also matches those).",
    ),
    "pod": ("Pod", "Inference pod whose sidecar is scraped (a PodMonitor adds the label)."),
    "instance": (
        "Instance",
        "Address (host:port) of the sidecar's scrape target, its name under a static scrape "
        "config.",
    ),
}


def _target_variable(index: int, label: str) -> QueryVariable:
    """The variable of one target label, its values narrowed by the variables before it."""
    title, description = _TARGET_VARIABLES.get(
        label,
        (
            label.replace("_", " ").capitalize(),
            f"The `{label}` label of the sidecar's scrape target, a join label of the rule "
            "pack (empty where a target lacks it; All also matches those).",
        ),
    )
    narrowed = _body((*target_matchers()[:index], *sidecar_matchers()))
    query = f"label_values(inference_exporter_build_info{narrowed}, {label})"
    return _query_variable(label, title, query, description)


def variables(*names: str) -> list[cogbuilder.Builder[dashboard_models.VariableModel]]:
    """The template variables of a dashboard: datasource, one per target label (the site's
    join labels, :func:`variable_labels`), then ``names`` (``model``, ``gpu``)."""
    known: dict[str, cogbuilder.Builder[dashboard_models.VariableModel]] = {
        "model": _query_variable(
            "model",
            "Model",
            f"label_values({series('inference_queue_depth')}, model)",
            "Model label of the engine's metrics (empty for engines without one).",
        ),
        "gpu": _query_variable(
            "gpu",
            "GPU",
            f"label_values({gpu_variable_source()}, gpu)",
            "GPU index as its source numbers it: inside the pod (the sidecar's NVML), on the "
            "node (the node agent, dcgm-exporter).",
            numeric=True,
        ),
    }
    datasource = (
        DatasourceVariable(DATASOURCE_VARIABLE)
        .label("Data source")
        .description("The Prometheus that scrapes the inference-bottleneck-exporter sidecars.")
        .type("prometheus")
    )
    targets = [_target_variable(i, label) for i, label in enumerate(variable_labels())]
    return [datasource, *targets, *(known[name] for name in names)]


class RowModule(Protocol):
    """A module of one dashboard row: its title and its panels, left to right."""

    TITLE: str

    def panels(self) -> Sequence[AnyPanel]: ...


def signature_annotation() -> AnnotationQuery:
    """Regions on every time series while a signature alert fires."""
    return (
        AnnotationQuery()
        .name("Signature alerts firing")
        .datasource(DATASOURCE)
        .enable(True)
        .hide(False)
        .icon_color("red")
        .expr(series("ALERTS", 'alertstate="firing"', 'signature!=""'))
    )


def build_dashboard(
    *,
    uid: str,
    title: str,
    description: str,
    variable_names: Sequence[str] = (),
    rows: Sequence[RowModule],
    annotations: Sequence[AnnotationQuery] = (),
) -> dashboard_models.Dashboard:
    """Assemble rows of panels into a dashboard; panel ids are their position (1, 2, ...).

    The target variables come from the site config; ``variable_names`` adds ``model``, ``gpu``.
    """
    board = (
        Dashboard(title)
        .uid(uid)
        .description(description)
        .tags([TAG])
        .editable()
        .tooltip(dashboard_models.DashboardCursorSync.CROSSHAIR)
        .time("now-1h", "now")
        .refresh("30s")
        .timezone("browser")
        .variables(variables(*variable_names))
        .link(
            DashboardLink("Inference dashboards")
            .type(dashboard_models.DashboardLinkType.DASHBOARDS)
            .tags([TAG])
            .as_dropdown(False)
            .include_vars(True)
            .keep_time(True)
        )
    )
    if annotations:
        board = board.annotations(list(annotations))
    next_id = 1
    for row in rows:
        board = board.with_row(Row(row.TITLE).id(next_id))
        next_id += 1
        for panel in row.panels():
            board = board.with_panel(panel.id(next_id))
            next_id += 1
    return board.build()


def render(model: dashboard_models.Dashboard) -> str:
    """The JSON Grafana imports, deterministic: sorted keys, two-space indent, final newline."""
    return json.dumps(model, cls=JSONEncoder, sort_keys=True, indent=2, ensure_ascii=False) + "\n"
