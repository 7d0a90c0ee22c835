"""``inference-bottleneck-exporter webhook``: the mutating admission webhook.

The API server sends an ``AdmissionReview`` (``admission.k8s.io/v1``) for each pod created;
the answer adds the sidecar with a JSON Patch made by :func:`exporter.inject.patch.plan`, the
code ``inject`` runs. Two paths, one per entry of the chart's MutatingWebhookConfiguration:

``/mutate``
    pods that opt in with the annotation ``inference-bottleneck-exporter.io/inject: "true"``;
``/mutate-namespace``
    every pod of a labelled namespace (the configuration's ``namespaceSelector``) that does not
    opt out with ``"false"``.

Every request gets a valid review allowing the pod, with or without a patch, within
``--review.timeout``: also a malformed or oversized review and a client that stops sending
(the ``uid`` is then read from what arrived, where it can be). A webhook must never be why an
inference pod is not created; the chart's configuration also says ``failurePolicy: Ignore``.
``/metrics`` counts the reviews by outcome (``inference_webhook_*``).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import re
import time
from collections import Counter
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NoReturn

import yaml
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from exporter import __version__, logs, metrics
from exporter.config import (
    HTTP_OPTIONS,
    ArgumentParser,
    ConfigError,
    HttpOptions,
    add_flag,
    format_duration,
    given_flags,
    options_from,
    parse_address,
    parse_duration,
    resolve,
    usage_error,
)
from exporter.inject.patch import (
    ANNOTATION_ENGINE_URL,
    ANNOTATION_INJECT,
    Options,
    PlacementError,
    plan,
)
from exporter.inject.places import places
from exporter.inject.sidecar import Values, ValuesError, native_default

PROG = "inference-bottleneck-exporter webhook"
log = logging.getLogger("exporter.webhook")
REVIEW_VERSION = "admission.k8s.io/v1"
# The API server's own limit on a request body is 3 MiB; a pod is far smaller.
DEFAULT_MAX_BYTES = 3 * 1024 * 1024
_UID = re.compile(rb'"uid"\s*:\s*"([0-9A-Za-z-]{1,64})"')
RESULTS = (
    "injected",  # a patch added the sidecar, or brought it up to date
    "unchanged",  # the pod has the sidecar as it would be made
    "not_requested",  # no opt-in (or an opt-out)
    "no_engine",  # opted in, but no engine container found
    "refused",  # opted in, but the pod cannot take the sidecar (a port name taken)
    "not_a_pod",
    "malformed",
    "oversized",
    "timeout",
)
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5)


@dataclass
class Stats:
    """What the webhook did, for ``/metrics``."""

    reviews: Counter[tuple[str, str]] = field(default_factory=Counter)
    buckets: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS) + 1))
    total: float = 0.0

    def observe(self, webhook: str, result: str, seconds: float) -> None:
        self.reviews[(webhook, result)] += 1
        self.total += seconds
        for i, bound in enumerate(BUCKETS):
            if seconds <= bound:
                self.buckets[i] += 1
        self.buckets[-1] += 1


class StatsCollector(Collector):
    """Emits ``inference_webhook_reviews_total{webhook,result}`` (every result, from 0) and
    ``inference_webhook_review_duration_seconds``."""

    def __init__(self, stats: Stats) -> None:
        self.stats = stats

    def collect(self) -> Iterator[Metric]:
        reviews = metrics.counter("inference_webhook_reviews_total")
        for webhook in ("annotation", "namespace"):
            for result in RESULTS:
                reviews.add_metric([webhook, result], self.stats.reviews[(webhook, result)])
        yield reviews
        duration = metrics.histogram("inference_webhook_review_duration_seconds")
        cumulative = [(str(b), float(n)) for b, n in zip(BUCKETS, self.stats.buckets, strict=False)]
        cumulative.append(("+Inf", float(self.stats.buckets[-1])))
        duration.add_metric([], cumulative, self.stats.total)
        yield duration


@dataclass(frozen=True)
class Settings:
    values: Values
    options: Options
    timeout: float
    max_bytes: int
    http: HttpOptions = field(default_factory=HttpOptions)


def _review(
    uid: str, patch: list[dict[str, Any]] | None, warnings: Sequence[str]
) -> dict[str, Any]:
    response: dict[str, Any] = {"uid": uid, "allowed": True}
    if patch:
        response["patchType"] = "JSONPatch"
        response["patch"] = base64.b64encode(json.dumps(patch).encode()).decode()
    if warnings:
        response["warnings"] = [w[:256] for w in warnings]
    return {"apiVersion": REVIEW_VERSION, "kind": "AdmissionReview", "response": response}


def _wanted(pod: Mapping[str, Any], webhook: str) -> bool:
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    opt = str(annotations.get(ANNOTATION_INJECT, "")).lower()
    return opt != "false" if webhook == "namespace" else opt == "true"


def decide(
    review: Any, webhook: str, settings: Settings
) -> tuple[str, str, list[dict[str, Any]] | None, list[str]]:
    """(uid, result, patch, warnings) for a parsed review; never raises."""
    request = review.get("request") if isinstance(review, Mapping) else None
    if not isinstance(request, Mapping) or not isinstance(request.get("uid"), str):
        return "", "malformed", None, []
    uid = request["uid"]
    pod = request.get("object")
    kind = (
        (request.get("kind") or {}).get("kind")
        if isinstance(request.get("kind"), Mapping)
        else None
    )
    if kind != "Pod" or not isinstance(pod, Mapping) or request.get("subResource"):
        return uid, "not_a_pod", None, []
    if not _wanted(pod, webhook):
        return uid, "not_requested", None, []
    annotations = (pod.get("metadata") or {}).get("annotations") or {}
    url = annotations.get(ANNOTATION_ENGINE_URL) or settings.options.engine_url
    options = Options(native=settings.options.native, engine_url=url)
    pod = {**pod, "kind": "Pod"}
    try:
        (place,) = places(pod) or []
        result = plan(pod, place, settings.values, options)
    except PlacementError as err:
        return uid, "refused", None, [f"{ANNOTATION_INJECT}: {err}"]
    except (ValueError, TypeError, KeyError, AttributeError) as err:
        return uid, "malformed", None, [f"{ANNOTATION_INJECT}: unreadable pod ({err})"]
    if result.endpoint is None:
        return (
            uid,
            "no_engine",
            None,
            [f"{ANNOTATION_INJECT}: no engine container found; set {ANNOTATION_ENGINE_URL}"],
        )
    if not result.operations:
        return uid, "unchanged", None, []
    return uid, "injected", result.operations, []


async def _read(request: web.Request, settings: Settings) -> tuple[bytes, str | None]:
    """The body, or what arrived of it and why it is not all (oversized, timeout)."""
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(settings.timeout):
            while True:
                chunk = await request.content.read(65536)
                if not chunk:
                    return b"".join(chunks), None
                size += len(chunk)
                if size > settings.max_bytes:
                    return b"".join(chunks)[:4096] + chunk[:4096], "oversized"
                chunks.append(chunk)
    except TimeoutError:
        return b"".join(chunks)[:4096], "timeout"
    except (ConnectionError, asyncio.IncompleteReadError):
        return b"".join(chunks)[:4096], "malformed"


def make_app(settings: Settings, stats: Stats, extra: Sequence[Collector] = ()) -> web.Application:
    """The webhook's routes; ``/metrics`` serves ``stats`` and the ``extra`` collectors (the
    HTTP server's limits)."""
    app = web.Application(client_max_size=settings.max_bytes)

    async def review(request: web.Request) -> web.Response:
        started = time.monotonic()
        webhook = "namespace" if request.path == "/mutate-namespace" else "annotation"
        body, problem = await _read(request, settings)
        if problem is not None:
            match = _UID.search(body)
            uid = match.group(1).decode() if match else ""
            result, patch, warnings = problem, None, list[str]()
        else:
            try:
                parsed = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                parsed = None
            uid, result, patch, warnings = decide(parsed, webhook, settings)
            if not uid and (match := _UID.search(body)):
                uid = match.group(1).decode()
        stats.observe(webhook, result, time.monotonic() - started)
        log.info("review %s: %s (%s)", uid or "-", result, webhook)
        response = web.json_response(_review(uid, patch, warnings))
        if problem is not None:
            response.force_close()  # the rest of that body is not read
        return response

    async def metrics_page(request: web.Request) -> web.Response:
        registry = CollectorRegistry()
        registry.register(StatsCollector(stats))
        for collector in extra:
            registry.register(collector)
        return web.Response(
            body=generate_latest(registry), content_type="text/plain", charset="utf-8"
        )

    async def ok(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    app.router.add_post("/mutate", review)
    app.router.add_post("/mutate-namespace", review)
    app.router.add_get("/metrics", metrics_page)
    app.router.add_get("/-/healthy", ok)
    app.router.add_get("/-/ready", ok)
    return app


def _fail(message: str) -> NoReturn:
    usage_error(PROG, message)


def parser() -> ArgumentParser:
    p = ArgumentParser(
        prog=PROG,
        description="Mutating admission webhook: adds the exporter sidecar to the pods that "
        f'ask for it ({ANNOTATION_INJECT}: "true", or a labelled namespace).',
    )
    p.add_argument("--web.listen-address", dest="listen", default=":9443", help="(default :9443)")
    p.add_argument(
        "--web.config.file",
        dest="web_config",
        type=Path,
        required=True,
        help="TLS (and other web settings) in exporter-toolkit's format; the API server calls "
        "webhooks over HTTPS only.",
    )
    p.add_argument("--values", type=Path, default=None, help="The chart's values (YAML or JSON).")
    p.add_argument(
        "--engine-url", default=None, help="Engine metrics URL for pods without one found."
    )
    native = p.add_mutually_exclusive_group()
    native.add_argument("--native-sidecar", dest="native", action="store_const", const=True)
    native.add_argument("--no-native-sidecar", dest="native", action="store_const", const=False)
    p.add_argument("--kube-version", default="", help="From 1.29 the sidecar is a native one.")
    p.add_argument(
        "--review.timeout",
        dest="timeout",
        default="2s",
        help="Time to read a review before answering it without a patch (default 2s; keep it "
        "under the configuration's timeoutSeconds).",
    )
    p.add_argument(
        "--review.max-bytes",
        dest="max_bytes",
        type=int,
        default=DEFAULT_MAX_BYTES,
        help=f"Largest review read (default {DEFAULT_MAX_BYTES}).",
    )
    for option in HTTP_OPTIONS:  # the same flags as serve's, from the same declarations
        add_flag(p, option, env=False)
    p.add_argument("--log.level", dest="log_level", default="info", choices=logs.LEVEL_NAMES)
    p.add_argument("--log.format", dest="log_format", default="logfmt", choices=("logfmt", "json"))
    return p


def load_values(path: Path | None) -> Values:
    user: Any = {}
    if path is not None:
        try:
            user = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (OSError, yaml.YAMLError) as err:
            raise ConfigError("--values", f"{path}: {' '.join(str(err).split())}") from None
        if not isinstance(user, dict):
            raise ConfigError("--values", f"{path} is not a mapping of the chart's values")
    user.setdefault("mode", "dcgm")
    try:
        return Values.of(user)
    except ValuesError as err:
        raise ConfigError("--values", f"{err}") from None


def settings_from(args: Any) -> Settings:
    values = load_values(args.values)
    try:
        timeout = parse_duration(args.timeout)
    except ValueError as err:
        raise ConfigError("--review.timeout", f"{err}") from None
    if not 0 < timeout <= 30:
        raise ConfigError("--review.timeout", f"{args.timeout} must be more than 0 and at most 30s")
    if not 1024 <= args.max_bytes <= 64 * 1024 * 1024:
        raise ConfigError(
            "--review.max-bytes", f"{args.max_bytes} must be between 1 KiB and 64 MiB"
        )
    native = args.native if args.native is not None else native_default(args.kube_version)
    if native and args.kube_version and not native_default(args.kube_version):
        raise ConfigError("--native-sidecar", f"needs Kubernetes >= 1.29, not {args.kube_version}")
    http_values, _ = resolve(HTTP_OPTIONS, given_flags(HTTP_OPTIONS, args), {}, {})
    http = options_from(HttpOptions, http_values)
    http.check()
    if http.read_body_timeout < timeout:
        raise ConfigError(
            "--web.read-body-timeout",
            f"{format_duration(http.read_body_timeout)} is shorter than --review.timeout "
            f"{args.timeout}: a slow review would be cut instead of answered",
        )
    return Settings(
        values,
        Options(native=native or values.native, engine_url=args.engine_url),
        timeout,
        args.max_bytes,
        http,
    )


async def _serve(settings: Settings, listen: tuple[str, int], web_config: Path) -> int:
    from exporter.server.limits import HttpGuard  # noqa: PLC0415
    from exporter.server.listen import start_site, wait_for_stop_signal  # noqa: PLC0415
    from exporter.server.websec import WebSecurity  # noqa: PLC0415

    security = WebSecurity(web_config)
    if security.context is None:
        log.error(
            "%s has no tls_server_config: the API server calls webhooks over HTTPS", web_config
        )
        return 2
    stats = Stats()
    guard = HttpGuard(settings.http)
    app = make_app(settings, stats, (guard,))
    security.install(app)
    try:
        runner = await start_site(app, listen[0], listen[1], security.context, guard)
    except OSError as err:
        log.error("cannot listen on %s:%s: %s", *listen, err.strerror or err)
        return 1
    for address in runner.addresses:
        host, port = address[0], address[1]
        log.info(
            "listening on %s:%s (webhook, version %s)",
            f"[{host}]" if ":" in host else host,
            port,
            __version__,
        )
    await wait_for_stop_signal()
    await runner.cleanup()
    return 0


def run(argv: Sequence[str]) -> int:
    args = parser().parse_args(list(argv))
    try:
        settings = settings_from(args)
        listen = parse_address(args.listen)
        from exporter.server.websec import parse_web_config  # noqa: PLC0415

        parse_web_config(args.web_config)
    except ConfigError as err:
        _fail(str(err))
    except ValueError as err:
        _fail(f"--web.listen-address: {err}")
    logs.setup(args.log_level, args.log_format)
    return asyncio.run(_serve(settings, listen, args.web_config))
