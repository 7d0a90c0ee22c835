"""The one function that puts the sidecar into a pod template: :func:`plan`.

It returns JSON Patch operations (RFC 6902) on the whole object: the admission webhook sends
them as they are, ``inject`` applies them with :func:`apply` to the manifest it read. Only the
fields the sidecar owns are touched (its container, the PodMonitor's pod labels,
``shareProcessNamespace``); a second run over its own output plans nothing.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from exporter.inject.endpoint import Endpoint, find_engine, from_annotations
from exporter.inject.places import Path, Place, get
from exporter.inject.sidecar import Values, build_container

Operation = dict[str, Any]

# Per-pod overrides, as pod (or pod template) annotations.
ANNOTATION_INJECT = "inference-bottleneck-exporter.io/inject"
ANNOTATION_ENGINE_URL = "inference-bottleneck-exporter.io/engine-url"


class PlacementError(ValueError):
    """A pod template the sidecar cannot be put in (the message is one line)."""


@dataclass(frozen=True)
class Options:
    """How to inject, beyond the chart's values: a native sidecar (None: ``sidecar.native``)
    and the engine's URL when it is not to be found from the containers."""

    native: bool | None = None
    engine_url: str | None = None


@dataclass
class Plan:
    """What :func:`plan` decided for one pod template."""

    place: Place
    endpoint: Endpoint | None
    operations: list[Operation] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def pointer(path: Path) -> str:
    """RFC 6901: ``~`` and ``/`` escaped in each step."""
    return "".join("/" + str(step).replace("~", "~0").replace("/", "~1") for step in path)


def _add(path: Path, value: Any) -> Operation:
    return {"op": "add", "path": pointer(path), "value": copy.deepcopy(value)}


def _find(doc: Any, spec: Path, name: str, lists: tuple[str, ...]) -> tuple[str, int] | None:
    for key in lists:
        for index, container in enumerate(get(doc, (*spec, key)) or []):
            if isinstance(container, Mapping) and container.get("name") == name:
                return key, index
    return None


def _endpoint(doc: Any, place: Place, values: Values, options: Options) -> Endpoint | None:
    configured = values.sidecar.get("config") or {}
    url = options.engine_url or configured.get("engine.url")
    found = find_engine(
        place.engines(doc), skip=values.container_name, declared_port=place.declared_port
    )
    if not url and found is None and place.annotations is not None:
        annotations = get(doc, place.annotations)
        if isinstance(annotations, Mapping):
            url = from_annotations(annotations)
    if url:
        return Endpoint(found.container if found else "", found.engine if found else "", str(url))
    return found


def _container(values: Values, place: Place, endpoint: Endpoint, native: bool) -> dict[str, Any]:
    flags: dict[str, str | bool] = {"engine.url": endpoint.url}
    if not place.share_pid:
        flags["collector.process"] = False  # the engine's processes are out of its sight
    container = build_container(values.with_config(**flags), native=native)
    return place.shape(container) if place.shape is not None else container


def _check_ports(doc: Any, place: Place, values: Values) -> None:
    """The PodMonitor selects the sidecar's port by name: an engine port of the same name
    would be scraped too (the engine twice over, once by its own monitor)."""
    for key in ("containers", "initContainers"):
        for container in get(doc, (*place.spec, key)) or []:
            if not isinstance(container, Mapping) or container.get("name") == values.container_name:
                continue
            for port in container.get("ports") or []:
                if isinstance(port, Mapping) and port.get("name") == values.port_name:
                    raise PlacementError(
                        f"{place.name}: container {container.get('name')!r} has a port named "
                        f"{values.port_name!r}, the sidecar's; set sidecar.portName"
                    )


def _container_ops(
    doc: Any, place: Place, container: dict[str, Any], native: bool, name: str
) -> list[Operation]:
    want = "initContainers" if native and place.init else place.containers
    lists = (place.containers, "initContainers") if place.init else (place.containers,)
    found = _find(doc, place.spec, name, lists)
    if found is not None:
        key, index = found
        if key == want:
            current = get(doc, (*place.spec, key, index))
            if current == container:
                return []
            return [
                {"op": "replace", "path": pointer((*place.spec, key, index)), "value": container}
            ]
        ops: list[Operation] = [{"op": "remove", "path": pointer((*place.spec, key, index))}]
        return ops + _append(doc, place.spec, want, container)
    return _append(doc, place.spec, want, container)


def _append(doc: Any, spec: Path, key: str, container: dict[str, Any]) -> list[Operation]:
    if not isinstance(get(doc, (*spec, key)), list):
        return [_add((*spec, key), [container])]
    return [_add((*spec, key, "-"), container)]


def _mapping_ops(doc: Any, path: Path, wanted: Mapping[str, Any]) -> list[Operation]:
    """Add the entries of ``wanted`` to the mapping at ``path``, creating missing parents."""
    missing = {k: v for k, v in wanted.items() if get(doc, (*path, k)) != v}
    if not missing:
        return []
    for depth in range(len(path)):
        # A missing step is made, with what lies below it (a list on the way is kept).
        if get(doc, path[: depth + 1]) is None:
            value: Any = dict(missing)
            for step in reversed(path[depth + 1 :]):
                value = {step: value}
            return [_add(path[: depth + 1], value)]
    return [_add((*path, k), v) for k, v in missing.items()]


def plan(doc: Any, place: Place, values: Values, options: Options = Options()) -> Plan:
    """The operations that put the sidecar into one pod template of ``doc``.

    Raises :class:`PlacementError` where the template cannot take it (no container list, a
    port name taken). A template without an engine (a router, a Ray worker) gets no
    operations and a note, unless an engine URL is given."""
    if not isinstance(get(doc, place.spec), Mapping):
        raise PlacementError(f"{place.name}: no pod spec at {pointer(place.spec)}")
    for key in (place.containers, "initContainers"):
        found = get(doc, (*place.spec, key))
        if found is not None and not (
            isinstance(found, list) and all(isinstance(c, Mapping) for c in found)
        ):
            raise PlacementError(
                f"{place.name}: {pointer((*place.spec, key))} is not a list of containers"
            )
    endpoint = _endpoint(doc, place, values, options)
    result = Plan(place, endpoint)
    if endpoint is None:
        result.notes.append(f"{place.name}: no engine container found, left as it is")
        return result
    _check_ports(doc, place, values)
    native = (values.native if options.native is None else options.native) and place.init
    container = _container(values, place, endpoint, native)
    ops = _container_ops(doc, place, container, native, values.container_name)
    if place.labels is not None:
        ops += _mapping_ops(doc, place.labels, values.pod_labels)
    else:
        result.notes.append(
            f"{place.name}: this kind sets no pod labels; select its pods in the PodMonitor"
        )
    # hostPID already shows the engine's processes (and excludes shareProcessNamespace).
    host_pid = get(doc, (*place.spec, "hostPID")) is True
    if place.share_pid and values.process_collector() and not host_pid:
        ops += _mapping_ops(doc, place.spec, {"shareProcessNamespace": True})
    if place.fields is not None:
        result.notes.append(
            f"{place.name}: keeps only {', '.join(sorted(place.fields))} of the sidecar "
            "(no port, probes or securityContext); the admission webhook completes it"
        )
    result.operations = ops
    return result


def _parent(doc: Any, path: str) -> tuple[Any, str]:
    steps = [s.replace("~1", "/").replace("~0", "~") for s in path.split("/")[1:]]
    node = doc
    for step in steps[:-1]:
        node = node[int(step)] if isinstance(node, list) else node[step]
    return node, steps[-1]


def apply(doc: Any, operations: list[Operation]) -> Any:
    """The operations (add, replace, remove; as :func:`plan` makes them) applied to a copy."""
    out = copy.deepcopy(doc)
    for op in operations:
        parent, last = _parent(out, op["path"])
        if isinstance(parent, list):
            index = len(parent) if last == "-" else int(last)
            if op["op"] == "add":
                parent.insert(index, copy.deepcopy(op["value"]))
            elif op["op"] == "replace":
                parent[index] = copy.deepcopy(op["value"])
            else:
                del parent[index]
        elif op["op"] == "remove":
            del parent[last]
        else:
            parent[last] = copy.deepcopy(op["value"])
    return out
