"""The autoscaler examples (``examples/autoscaling/``): valid against their schemas, and their
trigger queries answered by a real Prometheus as the gate says.

- KEDA's ScaledObjects against the ScaledObject CRD (vendored in ``tests/fixtures/crds``) and
  their Prometheus trigger metadata against the scaler's keys (``tests/fixtures/schemas``);
- the HPA against Kubernetes' own schema (kubernetes-validate, strict);
- prometheus-adapter's rules against a schema of its config types (``tests/fixtures/schemas``);
- the Dynamo planner's PrometheusRule against prometheus-operator's CRD, and promtool.

Then a real Prometheus scrapes a target serving the series the queries read, one namespace per
case (the gate 1, 0, absent; WVA scaling down), and evaluates the PrometheusRule: each query is
asked with the example's namespace swapped for the case's, and answers the value that scales
out, holds, or lets a scale-down through.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml
from support.chart import KUBE_LATEST, crd_validators_from
from support.fakeengine import FakeEngine, FakeEngineThread
from support.paths import FIXTURES, ROOT
from support.promstack import start_prometheus

from exporter.lab.processes import wait_until

EXAMPLES = ROOT / "examples" / "autoscaling"
SCHEMAS = FIXTURES / "schemas"
MODEL = "meta-llama/Llama-3.1-8B-Instruct"
PLANNER_MODEL = "Qwen/Qwen3-32B"
GATE = "inference_pool:scale_out_eligible:bool"


def _load(name: str) -> dict[str, Any]:
    data = yaml.safe_load((EXAMPLES / name).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _schema(name: str) -> dict[str, Any]:
    data = yaml.safe_load((SCHEMAS / name).read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def _trigger(name: str) -> dict[str, Any]:
    (trigger,) = _load(name)["spec"]["triggers"]
    assert isinstance(trigger, dict)
    return trigger


@pytest.fixture(scope="module")
def validators() -> dict[tuple[str, str], jsonschema.Draft4Validator]:
    return crd_validators_from()


@pytest.mark.parametrize("name", ["keda-scaledobject.yaml", "keda-wva-gated.yaml"])
def test_scaled_objects_validate_against_the_crd(
    validators: dict[tuple[str, str], jsonschema.Draft4Validator], name: str
) -> None:
    doc = _load(name)
    validators[(doc["apiVersion"], doc["kind"])].validate(doc)
    trigger = _trigger(name)
    assert trigger["type"] == "prometheus"
    jsonschema.validate(trigger["metadata"], _schema("keda-prometheus-scaler.yaml"))
    # A blind pack or a lost engine is an error to KEDA (it keeps the replicas), never 0.
    assert trigger["metadata"]["ignoreNullValues"] == "false"


def test_a_typo_in_a_trigger_is_refused() -> None:
    metadata = dict(_trigger("keda-scaledobject.yaml")["metadata"], ignoreNullValue="false")
    with pytest.raises(jsonschema.ValidationError, match="ignoreNullValue"):
        jsonschema.validate(metadata, _schema("keda-prometheus-scaler.yaml"))


def test_the_hpa_validates_against_kubernetes() -> None:
    doc = _load("hpa-kv-gated.yaml")
    kubernetes_validate.validate(doc, KUBE_LATEST, strict=True)
    broken = yaml.safe_load(yaml.safe_dump(doc))
    broken["spec"]["metrics"][0]["external"]["target"]["valu"] = "1"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBE_LATEST, strict=True)


def test_the_adapter_rules_validate() -> None:
    schema = _schema("prometheus-adapter-config.yaml")
    jsonschema.Draft7Validator.check_schema(schema)
    jsonschema.validate(_load("prometheus-adapter-rules.yaml"), schema)
    # The HPA reads the adapter's metric by the name the rule gives it.
    (rule,) = _load("prometheus-adapter-rules.yaml")["externalRules"]
    metric = _load("hpa-kv-gated.yaml")["spec"]["metrics"][0]["external"]["metric"]["name"]
    assert rule["name"]["as"] == metric


def test_the_planner_rules_validate(
    validators: dict[tuple[str, str], jsonschema.Draft4Validator], tmp_path: Path
) -> None:
    doc = _load("dynamo-planner-rules.yaml")
    validators[(doc["apiVersion"], doc["kind"])].validate(doc)
    promtool = shutil.which("promtool")
    assert promtool, "promtool not found: run `make tools`"
    rules = tmp_path / "rules.yaml"
    rules.write_text(yaml.safe_dump(doc["spec"]), encoding="utf-8")
    result = subprocess.run(
        [promtool, "check", "rules", "--lint=all", "--lint-fatal", str(rules)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- the queries against a real Prometheus -------------------------------------------------------

# One namespace per case. Two pods of the model, 8 waiting on each, KV caches 95 % full; WVA
# wants 4 replicas of 2, the planner 4 decode and 3 prefill of 2 each.
CASES = {
    "capacity": 1,  # the gate: the backlog is capacity
    "blocked": 0,  # a host-side cause holds
    "blind": None,  # the pack does not see the pool
}


def _exposition() -> str:
    lines = []
    for ns, gate in (*CASES.items(), ("shrink", 0)):
        for pod in ("vllm-0", "vllm-1"):
            target = f'namespace="{ns}",pod="{pod}",model="{MODEL}"'
            lines.append(f"inference_queue_depth{{{target}}} 8")
            lines.append(f"inference_kv_cache_usage_ratio{{{target}}} 0.95")
        if gate is not None:
            lines.append(f'{GATE}{{namespace="{ns}",model="{MODEL}"}} {gate}')
            lines.append(f'{GATE}{{namespace="{ns}",model="{PLANNER_MODEL}"}} {gate}')
        variant = f'namespace="{ns}",variant_name="llama-8b-h100",accelerator_type="H100"'
        lines.append(f"wva_desired_replicas{{{variant}}} {1 if ns == 'shrink' else 4}")
        lines.append(f"wva_current_replicas{{{variant}}} 2")
        planner = f'namespace="{ns}"'
        lines.append(f"dynamo_planner_predicted_num_decode_replicas{{{planner}}} 4")
        lines.append(f"dynamo_planner_num_decode_replicas{{{planner}}} 2")
        lines.append(f"dynamo_planner_predicted_num_prefill_replicas{{{planner}}} 3")
        lines.append(f"dynamo_planner_num_prefill_replicas{{{planner}}} 2")
    return "\n".join(lines) + "\n"


def _adapter_query(namespace: str) -> str:
    """The adapter's metricsQuery as prometheus-adapter builds it for an external metric: its
    series, the HPA's namespace as the label matchers (pkg/naming BuildExternal: no group-by)."""
    (rule,) = _load("prometheus-adapter-rules.yaml")["externalRules"]
    query: str = rule["metricsQuery"]
    return (
        query.replace("<<.Series>>", GATE)
        .replace("<<.LabelMatchers>>", f'namespace="{namespace}"')
        .replace("<<.GroupBy>>", "")
    )


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory: pytest.TempPathFactory) -> Any:
    tmp = tmp_path_factory.mktemp("autoscaling")
    # The planner's rules once per case: each copy reads and records its own namespace.
    spec = _load("dynamo-planner-rules.yaml")["spec"]
    groups = []
    (group,) = spec["groups"]
    for ns in (*CASES, "shrink"):
        rules = [
            {**rule, "expr": rule["expr"].replace('namespace="llm"', f'namespace="{ns}"')}
            for rule in group["rules"]
        ]
        groups.append({"name": f"{group['name']}.{ns}", "rules": rules})
    path = tmp / "planner.yaml"
    path.write_text(yaml.safe_dump({"groups": groups}), encoding="utf-8")
    target = FakeEngineThread(FakeEngine(metrics_body=_exposition()))
    server = start_prometheus(tmp, [target.url.removeprefix("http://")], [path])
    try:
        # A scrape, then an evaluation of the planner's records (each every second).
        wait_until(
            lambda: len(server.query("inference_pool:dynamo_planner_decode_replicas:gated")) == 4,
            30,
            "the planner's records of every case",
        )
        yield server
    finally:
        server.stop()
        target.stop()


def _value(server: Any, query: str) -> float | None:
    result = server.query(query)
    assert len(result) <= 1, result
    return float(result[0]["value"][1]) if result else None


@pytest.mark.parametrize(
    ("case", "keda", "adapter", "wva"),
    [
        # the backlog is capacity: the queue (8 a pod), the KV usage and WVA's 4 go through
        ("capacity", 8.0, 0.95, 4.0),
        # a cause the pods need fixed holds: the triggers report their thresholds (hold)
        ("blocked", 4.0, 0.9, 2.0),
        # the pack cannot see the pool: held too, never scaled out blind
        ("blind", 4.0, 0.9, 2.0),
        # WVA scales down through a closed gate: fewer replicas never need the gate
        ("shrink", 4.0, 0.9, 1.0),
    ],
)
def test_trigger_queries_answer_as_the_gate_says(
    prometheus: Any, case: str, keda: float, adapter: float, wva: float
) -> None:
    def local(query: str) -> str:
        return query.replace('namespace="llm"', f'namespace="{case}"')

    queue = _trigger("keda-scaledobject.yaml")
    assert _value(prometheus, local(queue["metadata"]["query"])) == keda
    assert float(queue["metadata"]["threshold"]) == 4.0  # what a closed gate reports
    kv = _value(prometheus, _adapter_query(case))
    assert kv is not None and round(kv, 6) == adapter
    target = _load("hpa-kv-gated.yaml")["spec"]["metrics"][0]["external"]["target"]
    assert target == {"type": "Value", "value": "900m"}  # 0.9, what a closed gate reports
    assert _value(prometheus, local(_trigger("keda-wva-gated.yaml")["metadata"]["query"])) == wva


@pytest.mark.parametrize(
    ("case", "decode", "blocked"),
    [("capacity", 4.0, None), ("blocked", 2.0, 2.0), ("blind", 2.0, 2.0)],
)
def test_the_planner_records_hold_back_what_would_not_help(
    prometheus: Any, case: str, decode: float, blocked: float | None
) -> None:
    ns = f'{{namespace="{case}"}}'
    assert _value(prometheus, f"inference_pool:dynamo_planner_decode_replicas:gated{ns}") == decode
    assert (
        _value(prometheus, f"inference_pool:dynamo_planner_decode_scale_up_blocked:replicas{ns}")
        == blocked
    )
    prefill = 3.0 if case == "capacity" else 2.0
    assert (
        _value(prometheus, f"inference_pool:dynamo_planner_prefill_replicas:gated{ns}") == prefill
    )
