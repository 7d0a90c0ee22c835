"""Many clusters, one store: the two deployment paths of docs/deployment.md, on loopback.

One real sidecar (the CLI on the bundled 2-GPU trace) stands for a pod that two clusters both
run under the same namespace, pod and instance - the case a ``cluster`` join label exists for.

* Per-cluster Prometheus evaluating the pack, remote-writing to a central store: a Prometheus
  with the shipped rules and ``external_labels: {cluster: eu-1}`` remote-writes raw series and
  records to VictoriaMetrics; they arrive there carrying ``cluster``.
* Collectors in every cluster, the pack evaluated centrally: Prometheus in agent mode
  (cluster eu-1) and vmagent (cluster us-1) scrape the same sidecar and remote-write to one
  VictoriaMetrics; vmalert evaluates the pack generated with ``cluster`` first in its join
  labels against it, as deployed (records and alert state written back). Every rule
  evaluates without an error, and the records keep the two clusters apart - where the pack
  without a cluster join label would merge them into one target.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from support.paths import TRACE
from support.process import ExporterProcess
from support.promstack import RULES, binary
from support.victoria import (
    VictoriaMetrics,
    start_prometheus_agent,
    start_victoria_metrics,
    start_vmagent,
    start_vmalert,
)

from exporter.lab.processes import Child, fast_sidecar_flags, spawn, wait_until
from exporter.signatures import parse_config, recording_rules
from exporter.signatures.render import alerts_yaml, pack_recording_rules, recording_rules_yaml

JOB = "llm/inference-bottleneck-exporter"
# What a PodMonitor would give the target; the same in both clusters.
TARGET = {"namespace": "llm", "pod": "vllm-0", "container": "exporter", "endpoint": "metrics"}
UTIL = "inference:gpu_utilization:mean5m"


@pytest.fixture
def sidecar(exporter_process: Callable[..., ExporterProcess]) -> str:
    proc = exporter_process(
        "--gpu.replay-file",
        str(TRACE),
        "--no-collector.engine",
        "--no-collector.tokenizer",
        "--no-collector.process",
        *fast_sidecar_flags(),
    )
    proc.wait_ready()
    return proc.base.removeprefix("http://")


@pytest.fixture
def vm(tmp_path: Path) -> Iterator[VictoriaMetrics]:
    store = start_victoria_metrics(tmp_path / "vm")
    try:
        yield store
    finally:
        store.stop()


def _scrape_config(target: str) -> dict[str, Any]:
    return {
        "job_name": JOB,
        "scrape_interval": "1s",
        "static_configs": [{"targets": [target], "labels": TARGET}],
    }


def _clusters(vm: VictoriaMetrics, expr: str) -> dict[str, list[dict[str, str]]]:
    """Series of ``expr`` in the store now, by their ``cluster`` label."""
    vm.flush()
    out: dict[str, list[dict[str, str]]] = {}
    for item in vm.query(expr, time.time()):
        out.setdefault(item["metric"].get("cluster", ""), []).append(item["metric"])
    return out


def _stop(children: list[Child]) -> None:
    for child in reversed(children):
        child.stop()


def test_per_cluster_prometheus_remote_writes_raw_series_and_records(
    sidecar: str, vm: VictoriaMetrics, tmp_path: Path
) -> None:
    work = tmp_path / "eu-1"
    work.mkdir()
    config = {
        "global": {
            "scrape_interval": "1s",
            "evaluation_interval": "1s",
            "external_labels": {"cluster": "eu-1"},
        },
        "rule_files": [str(RULES / "recording_rules.yaml"), str(RULES / "alerts.yaml")],
        "scrape_configs": [_scrape_config(sidecar)],
        "remote_write": [
            {"url": vm.url + "/api/v1/write", "queue_config": {"batch_send_deadline": "200ms"}}
        ],
    }
    (work / "prometheus.yml").write_text(json.dumps(config), encoding="utf-8")
    child = spawn(
        "prometheus",
        [
            binary("prometheus"),
            f"--config.file={work / 'prometheus.yml'}",
            f"--storage.tsdb.path={work / 'data'}",
            "--web.listen-address=127.0.0.1:0",
            "--log.level=warn",
        ],
        work,
    )
    try:
        # The records are evaluated in the cluster, over series without a cluster label, and
        # carry it from the remote write on.
        wait_until(
            lambda: (
                set(_clusters(vm, UTIL)) == {"eu-1"}
                and set(_clusters(vm, "inference_gpu_busy_seconds_total")) == {"eu-1"}
            ),
            60,
            "the eu-1 records and raw series in VictoriaMetrics",
            child=child,
        )
        (record,) = _clusters(vm, UTIL)["eu-1"]
        assert {k: record[k] for k in ("namespace", "pod", "job")} == {
            "namespace": "llm",
            "pod": "vllm-0",
            "job": JOB,
        }
    finally:
        child.stop()


def test_agents_write_to_one_store_where_vmalert_evaluates_the_pack(
    sidecar: str, vm: VictoriaMetrics, tmp_path: Path
) -> None:
    children: list[Child] = []
    try:
        children.append(
            start_prometheus_agent(
                tmp_path / "eu-1",
                {
                    "global": {"external_labels": {"cluster": "eu-1"}},
                    "scrape_configs": [_scrape_config(sidecar)],
                    "remote_write": [
                        {
                            "url": vm.url + "/api/v1/write",
                            "queue_config": {"batch_send_deadline": "200ms"},
                        }
                    ],
                },
            )
        )
        us = tmp_path / "us-1"
        us.mkdir()
        (us / "scrape.yml").write_text(
            json.dumps({"scrape_configs": [_scrape_config(sidecar)]}), encoding="utf-8"
        )
        children.append(
            start_vmagent(us, us / "scrape.yml", vm.url + "/api/v1/write", {"cluster": "us-1"})
        )
        busy = "inference_gpu_busy_seconds_total"
        wait_until(
            lambda: set(_clusters(vm, busy)) == {"eu-1", "us-1"},
            60,
            "both clusters' series in VictoriaMetrics",
        )

        site = parse_config({"join_labels": ["cluster", "namespace", "pod", "instance", "job"]})
        pack = tmp_path / "pack"
        pack.mkdir()
        (pack / "recording_rules.yaml").write_text(recording_rules_yaml(site), encoding="utf-8")
        (pack / "alerts.yaml").write_text(alerts_yaml(site), encoding="utf-8")
        vmalert = start_vmalert(
            tmp_path / "vmalert", [pack / "recording_rules.yaml", pack / "alerts.yaml"], vm
        )
        children.append(vmalert.child)
        wait_until(
            lambda: set(_clusters(vm, UTIL)) == {"eu-1", "us-1"},
            60,
            "one utilisation record per cluster",
            child=vmalert.child,
        )
        # Every rule of the pack evaluated, none with an error.
        groups = vmalert.get_json("/api/v1/rules")["data"]["groups"]
        rules = [rule for group in groups for rule in group["rules"]]
        alerts = yaml.safe_load(alerts_yaml(site))["groups"]
        assert len(rules) == len(pack_recording_rules(site)) + sum(len(g["rules"]) for g in alerts)
        errors = {rule["name"]: rule["lastError"] for rule in rules if rule.get("lastError")}
        assert errors == {}
        for cluster in ("eu-1", "us-1"):
            (record,) = _clusters(vm, UTIL)[cluster]
            assert record["pod"] == "vllm-0" and record["namespace"] == "llm"

        # The shipped pack, without the cluster join label, makes one target of the two.
        default = {r.record: r.expr for r in recording_rules(parse_config({}))}
        assert set(_clusters(vm, default[UTIL])) == {""}
    finally:
        _stop(children)
