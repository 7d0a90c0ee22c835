"""The sidecar container and the pod fields it needs, built from the chart's values.

:func:`build_container` is the container the chart's named template
``inference-bottleneck-exporter.sidecar`` renders for the same values (``tests/inject``
renders the chart and compares, so the two cannot drift); ``inject`` and the admission webhook
take the same values (``--values``: a file of the chart's values, or its keys that matter here)
and add the result to pods they do not own.

:data:`DEFAULTS` are the chart's defaults for those keys (``values.yaml``; the same test
compares them).
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from exporter import __version__

# The chart's values.yaml, the keys the sidecar is built from.
DEFAULTS: dict[str, Any] = {
    "mode": "node",
    "image": {
        "repository": "inference-bottleneck-exporter/inference-bottleneck-exporter",
        "tag": "",
        "digest": "",
        "pullPolicy": "IfNotPresent",
    },
    "sidecar": {
        "containerName": "inference-bottleneck-exporter",
        "native": False,
        "port": 10960,
        "portName": "metrics",
        "config": {},
        "extraArgs": [],
        "extraEnv": [],
        "extraVolumeMounts": [],
        "resources": {
            "requests": {"cpu": "10m", "memory": "80Mi"},
            "limits": {"cpu": "200m", "memory": "128Mi"},
        },
        "securityContext": {
            "runAsNonRoot": True,
            "runAsUser": 65534,
            "runAsGroup": 65534,
            "readOnlyRootFilesystem": True,
            "allowPrivilegeEscalation": False,
            "capabilities": {"drop": ["ALL"]},
            "seccompProfile": {"type": "RuntimeDefault"},
        },
        "livenessProbe": {
            "httpGet": {"path": "/-/healthy", "port": "metrics"},
            "periodSeconds": 10,
            "timeoutSeconds": 5,
            "failureThreshold": 3,
        },
        "readinessProbe": {
            "httpGet": {"path": "/-/ready", "port": "metrics"},
            "periodSeconds": 5,
            "timeoutSeconds": 5,
            "failureThreshold": 12,
        },
        "podLabels": {"inference-bottleneck-exporter/sidecar": "true"},
    },
    "gpu": {
        "visibleDevices": "all",
        "driverCapabilities": "utility",
        "resourceClaims": [],
        "hostProcfs": False,
    },
}
# The top-level keys of the chart's values this module reads; others are ignored (a values
# file of the whole chart is welcome).
KEYS = tuple(DEFAULTS)
# The chart's modes: only `sidecar` gives the sidecar NVML; in the others (GPU series from
# dcgm-exporter or from the node agent) it reads no GPU.
Mode = Literal["sidecar", "dcgm", "node"]
MODES = ("sidecar", "dcgm", "node")
# Native sidecars (init containers with restartPolicy: Always) are on by default from 1.29.
NATIVE_SIDECAR_MINOR = 29


class ValuesError(ValueError):
    """Values the sidecar cannot be built from (the message is one line)."""


def _merge(base: Any, over: Any) -> Any:
    """Helm's values merge: maps merge key by key, anything else replaces."""
    if isinstance(base, dict) and isinstance(over, dict):
        out = dict(base)
        for key, value in over.items():
            out[key] = _merge(base.get(key), value) if key in base else copy.deepcopy(value)
        return out
    return copy.deepcopy(over)


@dataclass(frozen=True)
class Values:
    """The chart's values the sidecar is built from (defaults merged with the user's)."""

    tree: dict[str, Any]

    @classmethod
    def of(cls, user: Mapping[str, Any] | None = None) -> Values:
        tree = _merge(DEFAULTS, {k: v for k, v in (user or {}).items() if k in KEYS})
        values = cls(tree)
        values.check()
        return values

    @property
    def sidecar(self) -> dict[str, Any]:
        found: dict[str, Any] = self.tree["sidecar"]
        return found

    @property
    def mode(self) -> Mode:
        mode: Mode = self.tree["mode"]
        return mode

    @property
    def container_name(self) -> str:
        return str(self.sidecar["containerName"])

    @property
    def port_name(self) -> str:
        return str(self.sidecar["portName"])

    @property
    def pod_labels(self) -> dict[str, str]:
        return {str(k): str(v) for k, v in (self.sidecar["podLabels"] or {}).items()}

    @property
    def native(self) -> bool:
        return bool(self.sidecar["native"])

    def check(self) -> None:
        if self.tree["mode"] not in MODES:
            raise ValuesError(f"mode: {self.tree['mode']!r} is not one of {', '.join(MODES)}")
        if self.tree["gpu"].get("hostProcfs"):
            raise ValuesError(
                "gpu.hostProcfs: a hostPath volume is not injected (Pod Security refuses it); "
                "GPU attribution belongs to the node agent"
            )
        for key, value in (self.sidecar.get("config") or {}).items():
            if value is None or isinstance(value, dict | list):
                raise ValuesError(
                    f"sidecar.config.{key}: give a flag's value, true or false "
                    "(flags are dotted: engine.url)"
                )
        port = self.sidecar["port"]
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise ValuesError(f"sidecar.port: {port!r} is not a port number")
        if len(self.port_name) > 15:
            raise ValuesError(f"sidecar.portName: {self.port_name!r} is longer than 15 characters")

    def with_config(self, **flags: str | bool) -> Values:
        """These values with more of ``sidecar.config`` (an explicit entry wins)."""
        tree = copy.deepcopy(self.tree)
        tree["sidecar"]["config"] = {**flags, **(tree["sidecar"]["config"] or {})}
        return Values(tree)

    def process_collector(self) -> bool:
        """Whether the sidecar runs the process collector (it needs the engine's processes)."""
        config = self.sidecar.get("config") or {}
        enabled = config.get("collector.process", True) is not False
        return enabled and "--no-collector.process" not in (self.sidecar["extraArgs"] or [])


def image(values: Values) -> str:
    spec = values.tree["image"]
    tag = spec.get("tag") or __version__
    if spec.get("digest"):
        return f"{spec['repository']}:{tag}@{spec['digest']}"
    return f"{spec['repository']}:{tag}"


def _flag(name: str, value: Any) -> str:
    if isinstance(value, bool):
        return f"--{'' if value else 'no-'}{name}"
    if isinstance(value, float) and value.is_integer():
        value = int(value)  # Go's %v of a whole float64 from YAML
    return f"--{name}={value}"


def args(values: Values) -> list[str]:
    """The exporter's arguments, as the chart's ``inference-bottleneck-exporter.args``."""
    sidecar = values.sidecar
    out = [f"--web.listen-address=:{sidecar['port']}"]
    out += [_flag(k, v) for k, v in sorted((sidecar.get("config") or {}).items())]
    if values.mode != "sidecar":
        out.append("--no-collector.nvml")
        # dcgm: the chart's dcgm mode, or inject's and the webhook's sidecar without GPUs
        who = "the node agent" if values.mode == "node" else "dcgm-exporter or the node agent"
        out.append(f"--gpu.read-by={who} on $(NODE_NAME)")
    out += [str(a) for a in sidecar.get("extraArgs") or []]
    return out


def build_container(values: Values, *, native: bool | None = None) -> dict[str, Any]:
    """The exporter container for these values (keys in the named template's order).

    ``native`` (default: ``sidecar.native``) adds ``restartPolicy: Always``: the container
    then belongs in ``initContainers``."""
    sidecar = values.sidecar
    native = values.native if native is None else native
    container: dict[str, Any] = {
        "name": values.container_name,
        "image": image(values),
        "imagePullPolicy": values.tree["image"]["pullPolicy"],
    }
    if native:
        container["restartPolicy"] = "Always"
    container["args"] = args(values)
    gpu = values.tree["gpu"]
    env: list[Any] = []
    if values.mode == "sidecar" and gpu.get("visibleDevices"):
        env += [
            {"name": "NVIDIA_VISIBLE_DEVICES", "value": str(gpu["visibleDevices"])},
            {"name": "NVIDIA_DRIVER_CAPABILITIES", "value": str(gpu["driverCapabilities"])},
        ]
    if values.mode != "sidecar":  # the landing page names who reads the GPUs on its node
        node = {"fieldRef": {"fieldPath": "spec.nodeName"}}
        env.append({"name": "NODE_NAME", "valueFrom": node})
    env += copy.deepcopy(sidecar.get("extraEnv") or [])
    if env:
        container["env"] = env
    container["ports"] = [
        {"name": values.port_name, "containerPort": sidecar["port"], "protocol": "TCP"}
    ]
    container["livenessProbe"] = copy.deepcopy(sidecar["livenessProbe"])
    container["readinessProbe"] = copy.deepcopy(sidecar["readinessProbe"])
    resources = copy.deepcopy(sidecar.get("resources") or {})
    if values.mode == "sidecar" and gpu.get("resourceClaims"):
        resources["claims"] = [{"name": name} for name in gpu["resourceClaims"]]
    if resources:
        container["resources"] = resources
    container["securityContext"] = copy.deepcopy(sidecar["securityContext"])
    if sidecar.get("extraVolumeMounts"):
        container["volumeMounts"] = copy.deepcopy(sidecar["extraVolumeMounts"])
    return container


def native_default(kube_version: str | None) -> bool:
    """Whether a cluster of this version (``1.30``, ``v1.31.2``) has native sidecars."""
    if not kube_version:
        return False
    text = kube_version.lstrip("v")
    try:
        major, minor = (int(part.split("-")[0].split("+")[0]) for part in text.split(".")[:2])
    except ValueError:
        raise ValuesError(f"Kubernetes version {kube_version!r} is not MAJOR.MINOR") from None
    return (major, minor) >= (1, NATIVE_SIDECAR_MINOR)
