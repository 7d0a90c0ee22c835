"""Where the numbers come from: a Prometheus's HTTP API, or scrapes of one sidecar.

Both answer :meth:`Backend.value` for a sub-expression of an alert or evidence query.
:class:`PrometheusBackend` sends its text to ``/api/v1/query``; :class:`TargetBackend`
evaluates its syntax tree with :class:`exporter.diagnose.promql_eval.Evaluator` over the samples
:func:`sample_target` took, after :func:`target_evaluator` has computed the pack's recording
rules from them.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
import urllib.parse
from collections.abc import Sequence
from typing import Any, Protocol

from prometheus_client.parser import text_string_to_metric_families

from exporter.backends.http import FetchError, fetch, make_session
from exporter.diagnose.errors import DiagnoseError
from exporter.diagnose.promql_eval import NAME, Evaluator, Labels, Sample, Scrape, Value
from exporter.diagnose.promql_syntax import Node, PromQLError
from exporter.signatures.promql_text import split_matchers
from exporter.signatures.signals import recording_rules
from exporter.signatures.site import SiteConfig

MAX_BODY = 16 * 1024 * 1024
DEFAULT_METRICS_PATH = "/metrics"
BUILD_INFO = "inference_exporter_build_info"


class Backend(Protocol):
    async def value(self, text: str, node: Node) -> Value: ...


# --- Prometheus -------------------------------------------------------------------------------


class PrometheusBackend:
    """Instant queries through ``/api/v1/query``, all at one evaluation time."""

    def __init__(self, session: Any, base: str, timeout: float, at: float) -> None:
        self.session = session
        self.base = base
        self.endpoint = base.rstrip("/") + "/api/v1/query"
        self.timeout = timeout
        self.at = at

    async def value(self, text: str, node: Node) -> Value:
        return await self.query(text)

    async def query(self, expr: str) -> Value:
        params = urllib.parse.urlencode({"query": expr, "time": f"{self.at:.3f}"})
        try:
            result = await fetch(
                self.session,
                f"{self.endpoint}?{params}",
                timeout=self.timeout,
                max_bytes=MAX_BODY,
                headers={"Accept": "application/json"},
            )
            body = json.loads(result.body)
        except FetchError as err:
            if err.reason == "status" and err.status in (400, 422):
                raise PromQLError(f"Prometheus rejected {expr!r}") from None
            raise DiagnoseError(f"cannot query {self.endpoint}: {err.message}") from None
        except ValueError:
            raise DiagnoseError(f"{self.endpoint} did not answer with JSON") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error", "unknown error") if isinstance(body, dict) else "?"
            raise PromQLError(f"Prometheus: {error}")
        data = body.get("data", {})
        kind, result_data = data.get("resultType"), data.get("result")
        if kind == "scalar":
            return _float(result_data[1])
        if kind != "vector":
            raise PromQLError(f"unexpected result type {kind!r}")
        return [
            Sample(tuple(sorted(item["metric"].items())), _float(item["value"][1]))
            for item in result_data
        ]

    async def _api(self, path: str, params: dict[str, str]) -> Any:
        """The ``data`` of a successful answer of ``/api/v1/<path>``."""
        url = self.base.rstrip("/") + f"/api/v1/{path}?" + urllib.parse.urlencode(params)
        try:
            result = await fetch(
                self.session,
                url,
                timeout=self.timeout,
                max_bytes=MAX_BODY,
                headers={"Accept": "application/json"},
            )
            body = json.loads(result.body)
        except FetchError as err:
            if err.reason == "status" and err.status in (400, 422):
                raise PromQLError(f"Prometheus rejected {params.get('query')!r}") from None
            raise DiagnoseError(f"cannot query {self.base}: {err.message}") from None
        except ValueError:
            raise DiagnoseError(f"{self.base} did not answer with JSON") from None
        if not isinstance(body, dict) or body.get("status") != "success":
            error = body.get("error", "unknown error") if isinstance(body, dict) else "?"
            raise PromQLError(f"Prometheus: {error}")
        return body.get("data", {})

    async def query_range(self, expr: str, start: float, end: float, step: float) -> Matrix:
        """``expr`` every ``step`` seconds from ``start`` to ``end``."""
        data = await self._api(
            "query_range",
            {"query": expr, "start": f"{start:.3f}", "end": f"{end:.3f}", "step": f"{step:.3f}"},
        )
        return _matrix(data)

    async def samples(self, selector: str, start: float, end: float) -> Matrix:
        """The raw samples of ``selector`` between ``start`` and ``end`` (a range selector
        read at ``end``): their own timestamps, so scrape gaps show."""
        window = max(int(end - start), 1)
        data = await self._api("query", {"query": f"{selector}[{window}s]", "time": f"{end:.3f}"})
        return _matrix(data)

    async def vector(self, expr: str) -> list[Sample]:
        value = await self.query(expr)
        if not isinstance(value, list):
            raise DiagnoseError(f"{self.endpoint}: {expr!r} is not an instant vector")
        return value

    async def check_records(self, cfg: SiteConfig) -> None:
        """Fail with one line unless this Prometheus holds this profile's recording rules."""
        url = self.base
        present = await self.vector(
            'count by (__name__) ({__name__=~"inference(_gpu|_pool|_gateway)?:.+"})'
        )
        names = {s.get(NAME) for s in present}
        if not names:
            sidecars = await self.vector(f"count({BUILD_INFO})")
            count = sidecars[0].value if sidecars else 0
            if count:
                raise DiagnoseError(
                    f"{url} scrapes {count:.0f} sidecar(s) but has none of the pack's recording "
                    "rules (inference:*): load alert_rules/recording_rules.yaml, or use --target"
                )
            raise DiagnoseError(f"{url} has no inference-bottleneck-exporter series ({BUILD_INFO})")
        rules = recording_rules(cfg)
        # The records whose names carry their window (``mean5m``, ``rate1m``) differ between
        # profiles; a record that reads a range but names no window (``inference:traffic:active``)
        # is the same in every profile and tells nothing.
        windowed = {r.record for r in rules if "[" in r.expr and _WINDOW_IN_NAME.search(r.record)}
        unknown = sorted(names - {r.record for r in rules})
        if unknown and not names & windowed:
            example = f" (found e.g. {unknown[0]})"
            raise DiagnoseError(
                f"{url} holds recording rules of another profile or site config{example}; "
                f"pass the --profile and --config the loaded pack was generated with"
            )


_WINDOW_IN_NAME = re.compile(r"\d+(?:ms|[smhdwy])(?![a-z])")

Matrix = list[tuple[Labels, list[tuple[float, float]]]]


def _matrix(data: Any) -> Matrix:
    if not isinstance(data, dict) or data.get("resultType") != "matrix":
        kind = data.get("resultType") if isinstance(data, dict) else None
        raise PromQLError(f"unexpected result type {kind!r}")
    return [
        (
            tuple(sorted(item["metric"].items())),
            [(float(t), _float(v)) for t, v in item.get("values", [])],
        )
        for item in data["result"]
    ]


def _float(text: object) -> float:
    try:
        return float(str(text))
    except ValueError:
        return math.nan


# --- one sidecar, sampled ---------------------------------------------------------------------


class TargetBackend:
    """Evaluates over scrapes of the sidecar with
    :class:`exporter.diagnose.promql_eval.Evaluator`."""

    def __init__(self, evaluator: Evaluator) -> None:
        self.evaluator = evaluator

    async def value(self, text: str, node: Node) -> Value:
        return self.evaluator.eval(node)


def metrics_url(url: str) -> str:
    """``url`` with ``/metrics`` as its path when it names none."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise DiagnoseError(f"{url!r} is not an http(s) URL")
    if parts.path in ("", "/"):
        parts = parts._replace(path=DEFAULT_METRICS_PATH)
    return urllib.parse.urlunsplit(parts)


def target_labels(cfg: SiteConfig) -> frozenset[str]:
    """Labels Prometheus attaches to a target: matchers on them do not apply to a scrape."""
    names = set(cfg.join_labels)
    for text in (cfg.selectors.exporter, cfg.selectors.sidecar, cfg.selectors.dcgm):
        for matcher in split_matchers(text) if text.strip() else []:
            names.add(matcher.split("=")[0].rstrip("!~"))
    return frozenset(names)


def scrape_samples(text: str) -> dict[Labels, float]:
    """Every sample of a ``/metrics`` page by its labels (``__name__`` among them), as
    Prometheus would store them: NaN and infinities kept, the first of a repeated series, a
    label with an empty value left out.

    Raises :class:`ValueError` when the text is not an exposition."""
    samples: dict[Labels, float] = {}
    try:
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name.endswith("_created"):
                    continue
                # An empty label value is no label, in Prometheus' storage as here.
                present = {k: v for k, v in sample.labels.items() if v != ""}
                labels = tuple(sorted({**present, NAME: sample.name}.items()))
                samples.setdefault(labels, float(sample.value))
    # The parser raises ValueError for most garbage, and other exceptions for some.
    except Exception as exc:
        message = " ".join(str(exc).split())[:120] or type(exc).__name__
        raise ValueError(f"malformed exposition: {message}") from exc
    return samples


async def sample_target(url: str, span: float, interval: float, timeout: float) -> list[Scrape]:
    """Scrapes of ``url`` every ``interval`` over ``span`` seconds (at least two)."""
    count = max(2, int(span // interval) + 1)
    step = span / (count - 1)
    loop = asyncio.get_running_loop()
    start = loop.time()
    out: list[Scrape] = []
    async with make_session() as session:
        for i in range(count):
            delay = start + i * step - loop.time()
            if delay > 0:
                await asyncio.sleep(delay)
            try:
                result = await fetch(session, url, timeout=timeout, max_bytes=MAX_BODY)
            except FetchError as err:
                raise DiagnoseError(f"cannot read {url}: {err.message}") from None
            try:
                samples = scrape_samples(result.body.decode("utf-8", errors="replace"))
            except ValueError as err:
                raise DiagnoseError(f"{url} is not a Prometheus exposition ({err})") from None
            if i == 0 and not any(dict(k).get(NAME) == BUILD_INFO for k in samples):
                raise DiagnoseError(
                    f"{url} is not an inference-bottleneck-exporter /metrics page (no {BUILD_INFO})"
                )
            out.append(Scrape(time.time(), samples))
    return out


def target_evaluator(scrapes: Sequence[Scrape], cfg: SiteConfig) -> Evaluator:
    """An evaluator over ``scrapes`` holding the pack's recording rules computed from them."""
    baseline = cfg.window_seconds("baseline")
    evaluator = Evaluator(
        scrapes,
        ignored_labels=target_labels(cfg),
        # Window offsets (new Xid counters) compare with the first sample; the baseline
        # compares a rate with its value an hour earlier, which samples cannot give.
        needs_history=lambda seconds: seconds == baseline,
    )
    for rule in recording_rules(cfg):
        try:
            evaluator.record(rule.record, rule.expr)
        except PromQLError as err:
            raise DiagnoseError(f"recording rule {rule.record}: {err}") from None
    return evaluator
