"""Where the pods of an object are: one :class:`Place` per pod template, by kind.

Workloads carry a pod template (``spec.template``; a CronJob's one level down); the serving
stacks' custom resources carry pod specs, or parts of them, in their own fields:

======================  ===================================================================
kind                    where the sidecar goes
======================  ===================================================================
Pod                     ``spec`` (the admission webhook's case)
Deployment, StatefulSet ``spec.template`` (and DaemonSet, ReplicaSet, Job)
CronJob                 ``spec.jobTemplate.spec.template``
LeaderWorkerSet         ``spec.leaderWorkerTemplate.leaderTemplate`` and ``workerTemplate``
InferenceService        ``spec.predictor`` (KServe appends its containers to the pod)
ServingRuntime          ``spec`` (containers; pod labels in ``spec.labels``)
LLMInferenceService     ``spec.template``, ``spec.worker``, ``spec.prefill.template`` and
                        ``spec.prefill.worker`` (pod specs; no pod labels)
NIMService              ``spec.sidecarContainers`` (name, image, command, args, env only)
DynamoGraphDeployment   each ``spec.services.<name>.extraPodSpec`` (its ``mainContainer`` is
                        the engine; pod labels in ``extraPodMetadata``)
any other kind          every pod template under ``spec``: a field named ``template`` or
                        ``...Template`` whose ``spec`` lists containers, at any depth (AIBrix's
                        StormService ``spec.template.spec.roles[].template``, RoleBasedGroup's
                        ``spec.roles[].standalonePattern.template``, Kthena's ModelServing
                        ``spec.template.roles[].entryTemplate`` and ``workerTemplate``)
======================  ===================================================================

A kind of the table is read as the table says, any other kind by its pod templates, wherever
they are: the serving stacks add orchestrators faster than a table can list them, and they all
nest the Kubernetes ``PodTemplateSpec`` under a field named so. A template whose field names a
worker (``workerTemplate``) is a multi-node worker's: only a container that declares the
engine's port serves its API.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

Path = tuple[str | int, ...]

# What a NIMService's sidecarContainers keep of a container.
NIM_FIELDS = frozenset({"name", "image", "command", "args", "env"})
Shape = Callable[[dict[str, Any]], dict[str, Any]]


def nim_sidecar(container: dict[str, Any]) -> dict[str, Any]:
    """A container as a NIMService's ``sidecarContainers`` take it: its image as the operator's
    ``{repository, tag, pullPolicy}``, and only the fields it keeps."""
    out = {k: v for k, v in container.items() if k in NIM_FIELDS}
    reference = str(container["image"])
    name, _, digest = reference.partition("@")
    repository, colon, tag = name.rpartition(":")
    if not colon or "/" in tag:
        repository, tag = name, "latest"
    image = {"repository": repository, "tag": f"{tag}@{digest}" if digest else tag}
    if "imagePullPolicy" in container:
        image["pullPolicy"] = container["imagePullPolicy"]
    out["image"] = image
    return out


def get(doc: Any, path: Path) -> Any:
    """The value at ``path``, or None where any step is missing."""
    node = doc
    for step in path:
        if isinstance(step, int):
            if not isinstance(node, list) or step >= len(node):
                return None
        elif not isinstance(node, Mapping) or step not in node:
            return None
        node = node[step]
    return node


def _containers(path: Path) -> Callable[[Any], list[Any]]:
    return lambda doc: list(found) if isinstance(found := get(doc, path), list) else []


@dataclass(frozen=True)
class Place:
    """One pod template of an object: where its spec, containers and labels are.

    ``engines`` gives the containers the engine may be in (a custom resource may keep the
    engine outside the spec the sidecar joins); ``init`` says the spec has init containers
    (native sidecars), ``share_pid`` that it has ``shareProcessNamespace``, ``fields`` the
    container fields the kind keeps (None: all)."""

    name: str
    spec: Path
    containers: str
    labels: Path | None
    engines: Callable[[Any], list[Any]]
    init: bool = True
    share_pid: bool = True
    fields: frozenset[str] | None = field(default=None)
    shape: Shape | None = None
    # Worker templates of a multi-node engine: only a container that declares the engine's
    # port serves its API (the others run the engine's workers: Ray, vLLM --headless).
    declared_port: bool = False
    # Annotations of the pod (KServe's prometheus.kserve.io/port and /path name the engine's
    # metrics where its container does not say).
    annotations: Path | None = None


def _template(name: str, template: Path, *, declared_port: bool = False) -> Place:
    spec = (*template, "spec")
    return Place(
        name,
        spec,
        "containers",
        (*template, "metadata", "labels"),
        _containers((*spec, "containers")),
        declared_port=declared_port,
        annotations=(*template, "metadata", "annotations"),
    )


def _podspec(name: str, spec: Path, labels: Path | None) -> Place:
    return Place(name, spec, "containers", labels, _containers((*spec, "containers")))


# KServe's base LLMInferenceServiceConfig (config/llmisvcconfig/config-llm-template.yaml) runs
# the container named main as `vllm serve ... --port 8000` in llm-d's image; a
# LLMInferenceService's own `main` only adds to it.
LLMISVC_MAIN: dict[str, Any] = {
    "image": "ghcr.io/llm-d/llm-d-cuda",
    "command": ["vllm", "serve"],
    "args": ["--port", "8000"],
    "ports": [{"containerPort": 8000, "protocol": "TCP"}],
}


def _llmisvc_engines(spec: Path) -> Callable[[Any], list[Any]]:
    def engines(doc: Any) -> list[Any]:
        found = get(doc, (*spec, "containers"))
        out = []
        for container in found if isinstance(found, list) else []:
            main = isinstance(container, Mapping) and container.get("name") == "main"
            out.append({**LLMISVC_MAIN, **container} if main else container)
        return out

    return engines


def _nim_engine(doc: Any) -> list[Any]:
    """A NIMService's engine container as the operator builds it: its image and port."""
    image = get(doc, ("spec", "image")) or {}
    repository, tag = image.get("repository", ""), image.get("tag", "")
    container: dict[str, Any] = {
        "name": "nim",
        "image": f"{repository}:{tag}" if tag else repository,
    }
    port = get(doc, ("spec", "expose", "service", "port"))
    if isinstance(port, int):
        container["env"] = [{"name": "NIM_SERVER_PORT", "value": str(port)}]
    return [container]


def _kserve_predictor(doc: Any) -> list[Any]:
    """An InferenceService's containers, and the one KServe makes of ``predictor.model``.

    ``predictor.model`` is a container (args, env, ports) run by the ServingRuntime of its
    format; the Hugging Face runtime (KServe's own, the LLM one) serves the vLLM engine in
    process, its metrics with its API on ``--http_port`` (8080): taken here as a vLLM on 8080
    unless the model's own args or ports say otherwise."""
    predictor = get(doc, ("spec", "predictor")) or {}
    containers = list(predictor.get("containers") or [])
    model = predictor.get("model")
    if isinstance(model, Mapping):
        container = {k: v for k, v in model.items() if k not in ("modelFormat", "storageUri")}
        container["name"] = "kserve-container"
        fmt = str(get(model, ("modelFormat", "name")) or "").lower()
        if fmt == "huggingface" and "image" not in container:
            container["command"] = ["vllm"]
            http = [a for a in container.get("args") or [] if str(a).startswith("--http_port")]
            port = str(http[-1]).split("=", 1)[-1] if http else "8080"
            container["args"] = [*(container.get("args") or []), "--port", port]
        containers.insert(0, container)
    return containers


def _dynamo(doc: Any, name: str) -> Iterator[Place]:
    services = get(doc, ("spec", "services"))
    if not isinstance(services, Mapping):
        return
    for service in services:
        extra = ("spec", "services", service, "extraPodSpec")
        if not isinstance(get(doc, extra), Mapping):
            continue

        def engines(d: Any, extra: Path = extra) -> list[Any]:
            main = get(d, (*extra, "mainContainer"))
            return [main, *(get(d, (*extra, "containers")) or [])] if main else []

        metadata = ("spec", "services", service, "extraPodMetadata")
        yield Place(
            f"{name} service {service}",
            extra,
            "containers",
            (*metadata, "labels"),
            engines,
            annotations=(*metadata, "annotations"),
        )


def _lws(doc: Any, name: str) -> Iterator[Place]:
    base = ("spec", "leaderWorkerTemplate")
    for key in ("leaderTemplate", "workerTemplate"):
        if isinstance(get(doc, (*base, key)), Mapping):
            yield _template(f"{name} {key}", (*base, key), declared_port=key == "workerTemplate")


def _llmisvc(doc: Any, name: str) -> Iterator[Place]:
    paths: tuple[tuple[str, ...], ...] = (
        ("template",),
        ("worker",),
        ("prefill", "template"),
        ("prefill", "worker"),
    )
    for path in paths:
        spec = ("spec", *path)
        if isinstance(get(doc, spec), Mapping):
            worker = path[-1] == "worker"
            engines = _containers((*spec, "containers")) if worker else _llmisvc_engines(spec)
            yield Place(
                f"{name} {'.'.join(path)}", spec, "containers", None, engines, declared_port=worker
            )


# LeaderWorkerSet labels each pod of a group with its index; the leader is 0 (LLMInferenceService
# runs its multi-node pods on LeaderWorkerSet too).
LWS_WORKER_INDEX = "leaderworkerset.sigs.k8s.io/worker-index"


def _lws_worker(doc: Any) -> bool:
    index = get(doc, ("metadata", "labels", LWS_WORKER_INDEX))
    return index is not None and str(index) != "0"


def _is_template_field(key: object) -> bool:
    return isinstance(key, str) and (key == "template" or key.endswith("Template"))


def _is_pod_template(node: Any) -> bool:
    spec = node.get("spec") if isinstance(node, Mapping) else None
    return isinstance(spec, Mapping) and isinstance(spec.get("containers"), list)


def _step(node: Any, step: str | int) -> str:
    """A path step as people read it: a list item by its name where it has one."""
    if isinstance(step, int):
        item = node[step] if isinstance(node, list) else None
        label = item.get("name") if isinstance(item, Mapping) else None
        return f"[{label}]" if isinstance(label, str) and label else f"[{step}]"
    return f".{step}"


def _nested(node: Any, path: Path, shown: str) -> Iterator[tuple[Path, str]]:
    """Every pod template at or below ``node`` (not inside another): its path, as shown."""
    if isinstance(node, Mapping):
        for key, value in node.items():
            here, text = (*path, key), shown + _step(node, key)
            if _is_template_field(key) and _is_pod_template(value):
                yield here, text
            else:
                yield from _nested(value, here, text)
    elif isinstance(node, list):
        for index, value in enumerate(node):
            yield from _nested(value, (*path, index), shown + _step(node, index))


def _any_kind(doc: Mapping[str, Any], name: str) -> Iterator[Place]:
    """The pod templates of a kind this module does not know (see the module docstring)."""
    for path, shown in _nested(doc.get("spec"), ("spec",), ""):
        worker = "worker" in str(path[-1]).lower()
        yield _template(f"{name} {shown.lstrip('.')}", path, declared_port=worker)


def places(doc: Mapping[str, Any]) -> list[Place]:
    """The pod templates of a Kubernetes object (none for a Service, a ConfigMap, ...)."""
    kind = str(doc.get("kind", ""))
    name = (
        f"{kind}/{get(doc, ('metadata', 'name')) or get(doc, ('metadata', 'generateName')) or ''}"
    )
    found: Sequence[Place]
    if kind == "Pod":
        found = [
            Place(
                name,
                ("spec",),
                "containers",
                ("metadata", "labels"),
                _containers(("spec", "containers")),
                annotations=("metadata", "annotations"),
                declared_port=_lws_worker(doc),
            )
        ]
    elif kind in ("Deployment", "StatefulSet", "DaemonSet", "ReplicaSet", "Job"):
        found = [_template(name, ("spec", "template"))]
    elif kind == "CronJob":
        found = [_template(name, ("spec", "jobTemplate", "spec", "template"))]
    elif kind == "LeaderWorkerSet":
        found = list(_lws(doc, name))
    elif kind == "InferenceService":
        predictor = ("spec", "predictor")
        found = [
            Place(
                name,
                predictor,
                "containers",
                (*predictor, "labels"),
                _kserve_predictor,
                annotations=(*predictor, "annotations"),
            )
        ]
    elif kind in ("ServingRuntime", "ClusterServingRuntime"):
        spec = ("spec",)
        found = [
            Place(
                name,
                spec,
                "containers",
                ("spec", "labels"),
                _containers(("spec", "containers")),
                share_pid=False,
                annotations=("spec", "annotations"),
            )
        ]
    elif kind == "LLMInferenceService":
        found = list(_llmisvc(doc, name))
    elif kind == "NIMService":
        found = [
            Place(
                name,
                ("spec",),
                "sidecarContainers",
                ("spec", "labels"),
                _nim_engine,
                init=False,
                share_pid=False,
                fields=NIM_FIELDS,
                shape=nim_sidecar,
                annotations=("spec", "annotations"),
            )
        ]
    elif kind == "DynamoGraphDeployment":
        found = list(_dynamo(doc, name))
    else:
        found = list(_any_kind(doc, name))
    return list(found)
