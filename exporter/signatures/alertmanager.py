"""An example Alertmanager configuration for the pack, generated from the catalogue.

Severity decides the receiver: ``critical`` pages through PagerDuty (Events API v2),
``warning`` goes to a low-urgency PagerDuty service (a ticket, nobody is woken), ``info``
goes nowhere. Notifications are grouped per alert name and scrape target (the join labels),
so one signature on one inference pod is one PagerDuty incident. The inhibitions name the
catalogue's alerts and ``signature`` groups, so they follow the catalogue.

PagerDuty's ``dedup_key`` is not configurable in Alertmanager: Events v2 notifications carry
the SHA-256 (hex) of the aggregation group's key, ``<route path>:<group labels>``
(``notify.Key.Hash`` in Alertmanager's ``notify/pagerduty``), which is stable for as long as
the group exists; its repeats and its resolve reach the same incident.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from exporter.signatures.catalogue import all_signatures
from exporter.signatures.definitions import FAMILIES, SEVERITIES, Severity, Signature
from exporter.signatures.render import GENERATOR
from exporter.signatures.signals.engine_signals import QUEUE_DEPTH, QUEUE_TREND, QUEUE_WAIT_SHARE
from exporter.signatures.site import SiteConfig

PREFIX = "Inference"
ALERTS_MATCHER = f'alertname=~"{PREFIX}.+"'
PAGER = "pagerduty"
LOW_URGENCY = "pagerduty-low-urgency"
NULL = "null"
RECEIVER_OF: dict[Severity, str] = {"critical": PAGER, "warning": LOW_URGENCY, "info": NULL}
ROUTING_KEY_FILES = {
    PAGER: "/etc/alertmanager/secrets/pagerduty/routing-key",
    LOW_URGENCY: "/etc/alertmanager/secrets/pagerduty/low-urgency-routing-key",
}
# (group_wait, group_interval, repeat_interval) per severity route.
TIMERS: dict[str, tuple[str, str, str]] = {
    "critical": ("30s", "5m", "4h"),
    "warning": ("2m", "15m", "24h"),
}
EXPORTER_DOWN = "InferenceExporterDown"
GPU_LOST = "InferenceGPULost"
ENGINE_DOWN = "InferenceEngineMetricsDown"
PAGERDUTY_SEVERITIES = ("critical", "warning", "info")


def _yaml_string(text: str) -> str:
    """A YAML single-quoted scalar (Go templates are full of double quotes); text with a
    line break becomes a double-quoted one, where ``\\n`` survives."""
    if "\n" in text:
        return json.dumps(text, ensure_ascii=False)
    return "'" + text.replace("'", "''") + "'"


def _matcher_list(items: Sequence[str]) -> str:
    return "[" + ", ".join(_yaml_string(item) for item in items) + "]"


def group_labels(cfg: SiteConfig) -> tuple[str, ...]:
    return ("alertname", *cfg.join_labels)


def notification_target_template(join: Sequence[str]) -> str:
    """Go template naming the group's scrape target (``namespace/pod``, else ``instance``)."""
    label = ".GroupLabels."
    parts = []
    if "pod" in join:
        namespace = (
            "{{ with .GroupLabels.namespace }}{{ . }}/{{ end }}" if "namespace" in join else ""
        )
        parts.append(f"{{{{ if {label}pod }}}}{namespace}{{{{ {label}pod }}}}")
    fallback = [name for name in join if name not in ("namespace", "pod")]
    first = "if" if not parts else "else if"
    for name in fallback:
        parts.append(f"{{{{ {first} {label}{name} }}}}{{{{ {label}{name} }}}}")
        first = "else if"
    # A group without target labels (the exporter-absent alert): PagerDuty needs a source.
    parts.append("{{ else }}inference-bottleneck-exporter{{ end }}")
    return "".join(parts)


def severity_template() -> str:
    """Our severity label as a PagerDuty severity (critical, error, warning, info)."""
    branches = [
        f'{{{{ {"if" if index == 0 else "else if"} eq .CommonLabels.severity "{severity}" }}}}'
        f"{severity}"
        for index, severity in enumerate(PAGERDUTY_SEVERITIES)
    ]
    return "".join(branches) + "{{ else }}error{{ end }}"


FIRST_ALERT = (
    "{{ with .Alerts.Firing }}{{ with index . 0 }}{{ .Annotations.%s }}{{ end }}"
    "{{ else }}{{ with index .Alerts 0 }}{{ .Annotations.%s }}{{ end }}{{ end }}"
)


def summary_template() -> str:
    """``payload.summary``: the first alert's summary and its description with the evidence."""
    return (
        '{{ if eq .Status "resolved" }}[RESOLVED] {{ end }}'
        + FIRST_ALERT % ("summary", "summary")
        + ": "
        + FIRST_ALERT % ("description", "description")
        + "{{ if gt (len .Alerts.Firing) 1 }} ({{ len .Alerts.Firing }} firing){{ end }}"
    )


def _queue_readers(cfg: SiteConfig, signatures: Sequence[Signature]) -> list[str]:
    """Alerts outside the ``queue`` family whose condition reads the engine's queue."""
    queue_records = [sig.record(cfg) for sig in (QUEUE_DEPTH, QUEUE_TREND, QUEUE_WAIT_SHARE)]
    return [
        sig.alert
        for sig in signatures
        if sig.family != "queue"
        and any(record in rule.expr for rule in sig.rules for record in queue_records)
    ]


def _receiver(name: str, join: Sequence[str]) -> list[str]:
    prefix = "        "
    details = {
        "alertname": "{{ .CommonLabels.alertname }}",
        "severity": "{{ .CommonLabels.severity }}",
        "signature": "{{ .CommonLabels.signature }}",
        "target": notification_target_template(join),
        "summary": FIRST_ALERT % ("summary", "summary"),
        # every alert of the group, one per line (a pod with two lost GPUs: two lines)
        "description": (
            "{{ range $i, $a := .Alerts }}{{ if $i }}\n{{ end }}"
            '{{ if eq $a.Status "resolved" }}[RESOLVED] {{ end }}{{ $a.Annotations.description }}'
            "{{ end }}"
        ),
        "runbook_url": "{{ .CommonAnnotations.runbook_url }}",
    }
    out = [
        f"  - name: {name}",
        "    pagerduty_configs:",
        f"      - routing_key_file: {ROUTING_KEY_FILES[name]}",
        "        send_resolved: true",
        "        client: inference-bottleneck-exporter",
        f"        client_url: {_yaml_string('{{ .ExternalURL }}')}",
        f"        severity: {_yaml_string(severity_template())}",
        "        # payload.summary (Alertmanager's `description` field; cut at 1024 characters)",
        f"        description: {_yaml_string(summary_template())}",
        f"        source: {_yaml_string(notification_target_template(join))}",
        f"        class: {_yaml_string('{{ .CommonLabels.signature }}')}",
        f"        component: {_yaml_string('{{ .CommonLabels.alertname }}')}",
        f"        group: {_yaml_string('{{ .GroupLabels.namespace }}')}"
        if "namespace" in join
        else "",
        "        # payload.custom_details, besides Alertmanager's own firing/resolved/num_*",
        f"{prefix}details:",
    ]
    out += [f"{prefix}  {key}: {_yaml_string(value)}" for key, value in details.items()]
    out += [
        f"{prefix}links:",
        f"{prefix}  - href: {_yaml_string('{{ .CommonAnnotations.runbook_url }}')}",
        f"{prefix}    text: {_yaml_string('Runbook: {{ .CommonLabels.alertname }}')}",
        f"{prefix}  - href: {_yaml_string('{{ (index .Alerts 0).GeneratorURL }}')}",
        f"{prefix}    text: {_yaml_string('The alert expression in Prometheus')}",
    ]
    return [line for line in out if line]


def alertmanager_yaml(cfg: SiteConfig) -> str:
    """``alert_rules/alertmanager.yaml``: routes, inhibitions and receivers for the pack."""
    signatures = all_signatures(cfg)
    join = cfg.join_labels
    groups = group_labels(cfg)
    width = max(len(sig.alert) for sig in signatures)
    out = [
        "# Alertmanager configuration for inference-bottleneck-exporter's alerts: a complete,",
        "# working example (amtool check-config); copy the route subtree, the inhibitions and",
        "# the receivers into your own configuration.",
        f"# Generated by `{GENERATOR}` from exporter/signatures/; do not edit.",
        "# CI fails when this file differs from a fresh generation.",
        "#",
        "# Receivers by severity: critical -> pagerduty (Events API v2, high urgency: pages the",
        "# on-call), warning -> pagerduty-low-urgency (a PagerDuty service with low urgency: an",
        "# incident that works as a ticket), info -> null (never notified; Prometheus and Grafana",
        "# still show it).",
        "#",
    ]
    family_width = max(len(family) for family in FAMILIES)
    for sig in signatures:
        receivers = ", ".join(f"{s} -> {RECEIVER_OF[s]}" for s in sig.severities)
        out.append(f"#   {sig.alert:<{width}}  {sig.family:<{family_width}}  {receivers}")
    out += [
        "#",
        "# Grouping: one notification group per alert name and scrape target",
        f"# ({', '.join(join)}): one signature on one inference pod is one PagerDuty",
        "# incident. Alertmanager sets the Events v2 dedup_key itself: the SHA-256 of the group",
        "# key (route path and group labels), the same for every repeat and for the resolve.",
        "# Routing keys are read from files (a mounted Secret), never written here.",
        "global:",
        "  resolve_timeout: 5m",
        "  pagerduty_url: https://events.pagerduty.com/v2/enqueue",
        "route:",
        "  # Alerts that are not this pack's; replace with your own default.",
        f"  receiver: {LOW_URGENCY}",
        f"  group_by: [{', '.join(groups)}]",
        "  group_wait: 30s",
        "  group_interval: 5m",
        "  repeat_interval: 4h",
        "  routes:",
        "    # This pack's alerts. One without a known severity falls back to the parent's",
        "    # receiver, so nothing is dropped silently.",
        f"    - matchers: {_matcher_list([ALERTS_MATCHER])}",
        "      routes:",
    ]
    for severity in SEVERITIES:
        receiver = RECEIVER_OF[severity]
        out += [
            f"        - matchers: {_matcher_list(['severity=' + _double_quoted(severity)])}",
            f"          receiver: {_yaml_string(receiver) if receiver == NULL else receiver}",
        ]
        if severity in TIMERS:
            wait, interval, repeat = TIMERS[severity]
            out += [
                f"          group_wait: {wait}",
                f"          group_interval: {interval}",
                f"          repeat_interval: {repeat}",
            ]
    # A pool's alerts belong to no one target (no pod label): no target's GPU explains them.
    signatures_only = "|".join(family for family in FAMILIES if family not in ("meta", "pool"))
    readers = _queue_readers(cfg, signatures)
    equal = f"[{', '.join(join)}]"
    lost = "alertname=" + _double_quoted(GPU_LOST)
    down = "alertname=" + _double_quoted(EXPORTER_DOWN)
    engine = "alertname=" + _double_quoted(ENGINE_DOWN)
    queue_family = "signature=" + _double_quoted("queue")
    queue_readers = "alertname=~" + _double_quoted("|".join(readers))
    out += [
        "inhibit_rules:",
        "  # A lost GPU stalls the whole pod: the target's signatures are its consequences.",
        f"  - source_matchers: {_matcher_list([lost])}",
        "    target_matchers:",
        f"      - {_yaml_string(ALERTS_MATCHER)}",
        f"      - {_yaml_string('alertname!=' + _double_quoted(GPU_LOST))}",
        f"      - {_yaml_string('signature=~' + _double_quoted(signatures_only))}",
        f"    equal: {equal}",
        "  # Without the sidecar's scrape every other alert of the target is blind or stale.",
        f"  - source_matchers: {_matcher_list([down])}",
        "    target_matchers:",
        f"      - {_yaml_string(ALERTS_MATCHER)}",
        f"      - {_yaml_string('alertname!=' + _double_quoted(EXPORTER_DOWN))}",
        f"    equal: {equal}",
        "  # Engine metrics unreadable: the target's queue-based signatures see stale queues.",
        f"  - source_matchers: {_matcher_list([engine])}",
        f"    target_matchers: {_matcher_list([ALERTS_MATCHER, queue_family])}",
        f"    equal: {equal}",
    ]
    if readers:
        out += [
            f"  - source_matchers: {_matcher_list([engine])}",
            f"    target_matchers: {_matcher_list([queue_readers])}",
            f"    equal: {equal}",
        ]
    critical = "severity=" + _double_quoted("critical")
    warning = "severity=" + _double_quoted("warning")
    out += [
        "  # A critical alert makes the warning of the same alert on the same target redundant",
        "  # (a critical Xid and an ordinary one on the same pod).",
        f"  - source_matchers: {_matcher_list([ALERTS_MATCHER, critical])}",
        f"    target_matchers: {_matcher_list([ALERTS_MATCHER, warning])}",
        f"    equal: [{', '.join(groups)}]",
        "receivers:",
        f"  - name: {_yaml_string(NULL)}",
    ]
    out += _receiver(PAGER, join)
    out += _receiver(LOW_URGENCY, join)
    return "\n".join(out) + "\n"


def _double_quoted(text: str) -> str:
    """``"text"``: a matcher value in a YAML single-quoted matcher."""
    return f'"{text}"'
