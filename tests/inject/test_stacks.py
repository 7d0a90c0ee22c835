"""``inject`` and the webhook on each serving stack's own manifests (tests/fixtures/stacks/,
each naming its source on line one): the engine URL found, the same sidecar from both, every
input field kept, a second run changing nothing, the result valid and as restricted as the
input was."""

from __future__ import annotations

import contextlib
import io
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jsonpatch
import kubernetes_validate
import pytest
import yaml
from support.chart import KUBE_LATEST, crd_validators_from
from support.paths import FIXTURES
from support.podsecurity import restricted_violations
from support.stacks import SIDECAR, operator_pod
from support.webhook import Webhook, patched, review

from exporter.cli import load_settings
from exporter.inject.cli import run
from exporter.inject.patch import Options
from exporter.inject.places import get, places
from exporter.inject.sidecar import Values
from exporter.inject.webhook import Settings, decide

STACKS = FIXTURES / "stacks"
CORE = {"Deployment", "StatefulSet", "DaemonSet", "Job", "CronJob", "Pod", "Service"}

# Per fixture: the pod template (as inject names it) -> the engine URL its sidecar reads; a
# template not named gets no sidecar (a router, a Ray or headless worker).
EXPECTED: dict[str, dict[str, str]] = {
    "vllm-production-stack.yaml": {
        "Deployment/vllm-opt125m-deployment-vllm": "http://127.0.0.1:8000/metrics",
    },
    "llm-d-modelservice-pd.yaml": {
        "Deployment/pd-llm-d-modelservice-decode": "http://127.0.0.1:8200/metrics",
        "Deployment/pd-llm-d-modelservice-prefill": "http://127.0.0.1:8000/metrics",
    },
    "lws-vllm-multinode.yaml": {
        "LeaderWorkerSet/vllm leaderTemplate": "http://127.0.0.1:8080/metrics",
    },
    "kserve-inferenceservice-huggingface.yaml": {
        "InferenceService/llama-31-8b-instruct": "http://127.0.0.1:8080/metrics",
    },
    "kserve-servingruntime-huggingface.yaml": {
        "ClusterServingRuntime/kserve-huggingfaceserver": "http://127.0.0.1:8080/metrics",
    },
    "kserve-llminferenceservice.yaml": {
        "LLMInferenceService/qwen3-coder-tool-calling template": "http://127.0.0.1:8000/metrics",
    },
    "kserve-llminferenceservice-pd-multinode.yaml": {
        "LLMInferenceService/deepseek-r1-0528-pd template": "http://127.0.0.1:8000/metrics",
        "LLMInferenceService/deepseek-r1-0528-pd prefill.template": "http://127.0.0.1:8000/metrics",
    },
    "nim-nimservice.yaml": {
        "NIMService/meta-llama-3-2-1b-instruct": "http://127.0.0.1:8000/v1/metrics",
    },
    "nim-nimservice-multinode.yaml": {
        "NIMService/deepseek-r1": "http://127.0.0.1:8000/v1/metrics",
    },
    "dynamo-vllm-disagg.yaml": {
        "DynamoGraphDeployment/vllm-disagg service Frontend": "http://127.0.0.1:8000/metrics",
        "DynamoGraphDeployment/vllm-disagg service VllmDecodeWorker": "http://127.0.0.1:9090/metrics",
        "DynamoGraphDeployment/vllm-disagg service VllmPrefillWorker": "http://127.0.0.1:9090/metrics",
    },
    # Kinds inject has no table for: their pod templates found under template fields, the
    # engine in a shell-wrapped command line (StormService) or only in its image (Kthena).
    "aibrix-stormservice-vllm-1p1d.yaml": {
        "StormService/vllm-1p1d template.spec.roles[prefill].template": (
            "http://127.0.0.1:8000/metrics"
        ),
        "StormService/vllm-1p1d template.spec.roles[decode].template": (
            "http://127.0.0.1:8000/metrics"
        ),
    },
    "kthena-modelserving-vllm-pd.yaml": {
        "ModelServing/deepseek-v2-lite template.roles[prefill].entryTemplate": (
            "http://127.0.0.1:8000/metrics"
        ),
        "ModelServing/deepseek-v2-lite template.roles[decode].entryTemplate": (
            "http://127.0.0.1:8000/metrics"
        ),
    },
}
# Fixtures whose engines declare a port named as the sidecar's: injected with these values.
WITH_VALUES: dict[str, tuple[str, dict[str, str]]] = {
    "rbg-sglang-pd-standalone.yaml": (
        "sidecar: {portName: exporter}\n",
        {
            "RoleBasedGroup/sglang-pd-inference roles[prefill].standalonePattern.template": (
                "http://127.0.0.1:8000/metrics"
            ),
            "RoleBasedGroup/sglang-pd-inference roles[decode].standalonePattern.template": (
                "http://127.0.0.1:8000/metrics"
            ),
        },
    ),
}


def test_every_fixture_is_listed_and_names_its_source() -> None:
    assert sorted(p.name for p in STACKS.glob("*.yaml")) == sorted([*EXPECTED, *WITH_VALUES])
    for path in STACKS.glob("*.yaml"):
        assert path.read_text().startswith("# github.com/"), path.name


@dataclass
class Result:
    returncode: int
    stdout: str
    stderr: str


def inject(text: str, *args: str) -> Result:
    """The inject command in this process (the real process is tested in test_inject_cli)."""
    stdin, stdout, stderr = io.StringIO(text), io.StringIO(), io.StringIO()
    saved = sys.stdin
    sys.stdin = stdin
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                code = run(list(args))
            except SystemExit as err:
                code = int(err.code or 0)
    finally:
        sys.stdin = saved
    return Result(code, stdout.getvalue(), stderr.getvalue())


def _docs(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


def _sidecars(docs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    found = {}
    for doc in docs:
        for place in places(doc) or []:
            for container in get(doc, (*place.spec, place.containers)) or []:
                if container.get("name") == SIDECAR:
                    found[place.name] = container
            for container in get(doc, (*place.spec, "initContainers")) or []:
                if container.get("name") == SIDECAR:
                    found[place.name] = container
    return found


def _url(container: dict[str, Any]) -> str:
    (arg,) = [a for a in container["args"] if a.startswith("--engine.url=")]
    return str(arg.split("=", 1)[1])


def contains(before: Any, after: Any, path: str = "") -> list[str]:
    """Where ``after`` lost or changed something ``before`` had (lists may grow at the end)."""
    if isinstance(before, dict):
        if not isinstance(after, dict):
            return [path]
        return [
            p
            for k, v in before.items()
            for p in (contains(v, after[k], f"{path}/{k}") if k in after else [f"{path}/{k}"])
        ]
    if isinstance(before, list):
        if not isinstance(after, list) or len(after) < len(before):
            return [path]
        return [p for i, v in enumerate(before) for p in contains(v, after[i], f"{path}/{i}")]
    return [] if before == after else [path]


@pytest.fixture(scope="module")
def validators() -> dict[tuple[str, str], Any]:
    return crd_validators_from()


@pytest.fixture(scope="module")
def outputs() -> dict[str, tuple[str, str]]:
    """Fixture name -> (input, inject's output)."""
    out = {}
    for name in EXPECTED:
        text = (STACKS / name).read_text()
        result = inject(text)
        assert result.returncode == 0, (name, result.stderr)
        out[name] = (text, result.stdout)
    return out


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_sidecar_reads_the_right_engine(name: str, outputs: dict[str, tuple[str, str]]) -> None:
    _, text = outputs[name]
    urls = {place: _url(c) for place, c in _sidecars(_docs(text)).items()}
    assert urls == EXPECTED[name]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_every_input_field_is_kept_and_a_second_run_changes_nothing(
    name: str, outputs: dict[str, tuple[str, str]]
) -> None:
    before, after = outputs[name]
    old, new = _docs(before), _docs(after)
    assert [d["kind"] for d in old] == [d["kind"] for d in new]
    for a, b in zip(old, new, strict=True):
        assert contains(a, b) == [], a["kind"]
        assert list(b)[: len(a)] == list(a)  # key order kept
    again = inject(after)
    assert again.returncode == 0 and again.stdout == after


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_result_validates(
    name: str, outputs: dict[str, tuple[str, str]], validators: dict[tuple[str, str], Any]
) -> None:
    for doc in _docs(outputs[name][1]):
        key = (doc["apiVersion"], doc["kind"])
        if doc["kind"] in CORE:
            kubernetes_validate.validate(doc, KUBE_LATEST, strict=True)
        elif key in validators:
            errors = sorted(validators[key].iter_errors(doc), key=str)
            assert not errors, f"{key}: {errors[0].message}"
        for place in places(doc) or []:
            if place.init and place.fields is None and doc["kind"] not in CORE:
                kubernetes_validate.validate(_as_pod(doc, place), KUBE_LATEST, strict=True)


# Kinds whose pod templates are a Kubernetes PodTemplateSpec or PodSpec, whole.
WHOLE_POD_SPECS = {"LeaderWorkerSet", "LLMInferenceService"}


def _as_pod(doc: dict[str, Any], place: Any) -> dict[str, Any]:
    """A custom resource's pod spec as a Pod, to validate with Kubernetes' own schema: the
    whole spec where the kind's field is a PodSpec; else (a PodSpec with fields of the stack's
    own: KServe's predictor, Dynamo's extraPodSpec) the containers and the fields the sidecar
    sets. A container the stack completes later (KServe's `main`) gets a placeholder image."""
    spec = get(doc, place.spec)
    if doc["kind"] not in WHOLE_POD_SPECS:
        spec = {k: spec[k] for k in ("containers", "shareProcessNamespace") if k in spec}
    spec = {**spec, "containers": [{"image": "engine", **c} for c in spec.get("containers", [])]}
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "p"}, "spec": spec}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_webhook_gives_the_stacks_pods_the_same_sidecar(
    name: str, outputs: dict[str, tuple[str, str]]
) -> None:
    injected = _sidecars(_docs(outputs[name][1]))
    settings = Settings(Values.of({"mode": "dcgm"}), Options(), 2.0, 1 << 20)
    seen = 0
    for doc in _docs(outputs[name][0]):
        for place in places(doc) or []:
            pod = operator_pod(doc, place)
            review = {"request": {"uid": "u", "kind": {"kind": "Pod"}, "object": pod}}
            uid, result, patch, _ = decide(review, "annotation", settings)
            if place.name not in EXPECTED[name]:
                assert result == "no_engine", place.name
                continue
            assert (uid, result) == ("u", "injected")
            out = jsonpatch.JsonPatch(patch).apply(pod)
            (sidecar,) = [c for c in out["spec"]["containers"] if c["name"] == SIDECAR]
            expected = injected[place.name]
            if place.share_pid:
                assert sidecar == expected
                assert out["spec"]["shareProcessNamespace"] is True
            else:
                # The kind keeps part of a container, or shares no process namespace: the
                # webhook, seeing the pod, gives it the whole sidecar and the process collector.
                shaped = place.shape(sidecar) if place.shape is not None else sidecar
                assert {k: v for k, v in shaped.items() if k != "args"} == {
                    k: v for k, v in expected.items() if k != "args"
                }
                args = [a for a in expected["args"] if a != "--no-collector.process"]
                assert args == sidecar["args"]
            seen += 1
    assert seen == len(EXPECTED[name])


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_as_restricted_as_the_input(name: str, outputs: dict[str, tuple[str, str]]) -> None:
    for before, after in zip(_docs(outputs[name][0]), _docs(outputs[name][1]), strict=True):
        for place in places(before) or []:
            if place.fields is not None:
                continue
            old, new = get(before, place.spec), get(after, place.spec)
            old_pod = {**old, "containers": list(old.get("containers") or [])}
            new_pod = {**new, "containers": list(new.get("containers") or [])}
            added = set(restricted_violations(new_pod)) - set(restricted_violations(old_pod))
            assert added == set(), place.name


def test_a_runtime_without_shared_processes_gets_no_process_collector() -> None:
    text = inject((STACKS / "kserve-servingruntime-huggingface.yaml").read_text()).stdout
    ((_, sidecar),) = _sidecars(_docs(text)).items()
    assert "--no-collector.process" in sidecar["args"]
    assert "shareProcessNamespace" not in _docs(text)[0]["spec"]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_exporter_takes_the_sidecars_arguments(
    name: str, outputs: dict[str, tuple[str, str]]
) -> None:
    """What the real CLI makes of each injected sidecar's arguments (the NIMService's too)."""
    for place, sidecar in _sidecars(_docs(outputs[name][1])).items():
        env = {e["name"]: e["value"] for e in sidecar.get("env", []) if "value" in e}
        settings, _ = load_settings(sidecar["args"], env)
        assert list(settings.values["engine.url"]) == [EXPECTED[name][place]]
        assert settings.listen[1] == 10960


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Webhook]:
    hook = Webhook(tmp_path_factory.mktemp("pki"))
    yield hook
    hook.close()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_webhook_over_https_answers_the_stacks_pods_alike(name: str, webhook: Webhook) -> None:
    """The stacks' pods sent as the API server sends them: the same answers as in process."""
    settings = Settings(Values.of({"mode": "dcgm"}), Options(), 2.0, 1 << 20)
    for number, doc in enumerate(_docs((STACKS / name).read_text())):
        for place in places(doc) or []:
            pod = operator_pod(doc, place)
            uid = f"{name}-{number}"
            status, answer, _ = webhook.post(review(pod, uid))
            assert status == 200
            _, result, patch, _ = decide(
                {"request": {"uid": uid, "kind": {"kind": "Pod"}, "object": pod}},
                "annotation",
                settings,
            )
            response = answer["response"]
            assert response["uid"] == uid and response["allowed"] is True
            assert result == ("injected" if place.name in EXPECTED[name] else "no_engine")
            if patch is None:
                assert "patch" not in response
            else:
                assert patched(pod, response) == jsonpatch.JsonPatch(patch).apply(pod)


# --- orchestrators inject has no table for ----------------------------------------------------


def test_a_kind_whose_engine_port_clashes_says_so_and_takes_the_values(tmp_path: Path) -> None:
    """RoleBasedGroup (sgl-project/rbg): its SGLang servers name a port metrics, as the sidecar
    does; the router, whose arguments name the SGLang servers, is no engine."""
    for name, (values, expected) in WITH_VALUES.items():
        text = (STACKS / name).read_text()
        refused = inject(text)
        assert refused.returncode == 2
        assert "roles[prefill].standalonePattern.template: container 'prefill' has a port " in (
            refused.stderr
        )
        path = tmp_path / "values.yaml"
        path.write_text(values)
        result = inject(text, "--values", str(path))
        assert result.returncode == 0, result.stderr
        urls = {place: _url(c) for place, c in _sidecars(_docs(result.stdout)).items()}
        assert urls == expected
        assert inject(result.stdout, "--values", str(path)).stdout == result.stdout


def test_an_orchestrator_without_a_known_engine_says_why_and_what_to_do() -> None:
    """The StormService with its engine started by a script inject cannot read: the pod
    templates are found, and the error says none runs a known engine; with --engine-url each
    template gets the sidecar."""
    text = (STACKS / "aibrix-stormservice-vllm-1p1d.yaml").read_text()
    hidden = text.replace('command: ["sh", "-c"]', 'command: ["/opt/start.sh"]').replace(
        "vllm-openai:", "serving:"
    )
    refused = inject(hidden)
    assert refused.returncode == 2 and refused.stdout == ""
    assert refused.stderr.count("\n") == 1, refused.stderr
    assert "no engine found in the 2 pod templates found (StormService/vllm-1p1d " in (
        refused.stderr
    )
    assert "give --engine-url, or let the admission webhook inject the pods" in refused.stderr
    given = inject(hidden, "--engine-url", "http://127.0.0.1:8000/metrics")
    assert given.returncode == 0, given.stderr
    assert set(_sidecars(_docs(given.stdout))) == set(
        EXPECTED["aibrix-stormservice-vllm-1p1d.yaml"]
    )


def test_the_next_orchestrator_too() -> None:
    """HAND-WRITTEN: an imaginary kind nesting pod templates as the serving stacks do (a
    template field in a list of groups, a worker template, a pod spec under another name).
    Its templates are found, only the engine's gets a sidecar, a worker only on a declared
    port."""
    doc = {
        "apiVersion": "serving.example.com/v1",
        "kind": "InferenceFleet",
        "metadata": {"name": "fleet"},
        "spec": {
            "groups": [
                {
                    "name": "serve",
                    "podTemplate": {
                        "metadata": {"labels": {"app": "x"}},
                        "spec": {
                            "containers": [{"name": "engine", "image": "vllm/vllm-openai:v0.11.0"}]
                        },
                    },
                    "workerTemplate": {
                        "spec": {"containers": [{"name": "w", "image": "vllm/vllm-openai:v0.11.0"}]}
                    },
                },
                {
                    "name": "cache",
                    "template": {"spec": {"containers": [{"name": "c", "image": "redis"}]}},
                },
            ],
            "podSpec": {"containers": [{"name": "ignored", "image": "vllm/vllm-openai"}]},
        },
    }
    assert [p.name for p in places(doc)] == [
        "InferenceFleet/fleet groups[serve].podTemplate",
        "InferenceFleet/fleet groups[serve].workerTemplate",
        "InferenceFleet/fleet groups[cache].template",
    ]
    result = inject(yaml.safe_dump(doc))
    assert result.returncode == 0, result.stderr
    urls = {place: _url(c) for place, c in _sidecars(_docs(result.stdout)).items()}
    assert urls == {
        "InferenceFleet/fleet groups[serve].podTemplate": "http://127.0.0.1:8000/metrics"
    }
    (out,) = _docs(result.stdout)
    assert get(out, ("spec", "groups", 0, "podTemplate", "metadata", "labels", "app")) == "x"
    assert len(get(out, ("spec", "podSpec", "containers"))) == 1
    none = inject(yaml.safe_dump({**doc, "spec": {"groups": []}}))
    assert none.returncode == 2
    assert "no pod template found in InferenceFleet/fleet" in none.stderr
    assert "the admission webhook injects any pod" in none.stderr
