"""Pod Security "restricted", checked as the admission controller checks a pod spec."""

from __future__ import annotations

from typing import Any

# Pod Security Standards, "restricted" (which includes "baseline"), as the admission
# controller checks them: https://kubernetes.io/docs/concepts/security/pod-security-standards/
RESTRICTED_VOLUMES = {
    "configMap",
    "csi",
    "downwardAPI",
    "emptyDir",
    "ephemeral",
    "persistentVolumeClaim",
    "projected",
    "secret",
}
SAFE_SYSCTLS = {
    "kernel.shm_rmid_forced",
    "net.ipv4.ip_local_port_range",
    "net.ipv4.ip_unprivileged_port_start",
    "net.ipv4.tcp_syncookies",
    "net.ipv4.ping_group_range",
    "net.ipv4.ip_local_reserved_ports",
    "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout",
    "net.ipv4.tcp_keepalive_intvl",
    "net.ipv4.tcp_keepalive_probes",
}


def restricted_violations(pod: dict[str, Any]) -> list[str]:
    out: list[str] = []
    psc = pod.get("securityContext", {})
    for field in ("hostNetwork", "hostPID", "hostIPC"):
        if pod.get(field):
            out.append(field)
    for volume in pod.get("volumes", []):
        kind = next(k for k in volume if k != "name")
        if kind not in RESTRICTED_VOLUMES:
            out.append(f"volume {volume['name']}: {kind}")
    out += [f"sysctl {s['name']}" for s in psc.get("sysctls", []) if s["name"] not in SAFE_SYSCTLS]
    if psc.get("runAsUser") == 0:
        out.append("pod runAsUser 0")
    containers = pod.get("containers", []) + pod.get("initContainers", [])
    for c in containers:
        sc, name = c.get("securityContext", {}), c["name"]
        if sc.get("privileged"):
            out.append(f"{name}: privileged")
        if sc.get("allowPrivilegeEscalation") is not False:
            out.append(f"{name}: allowPrivilegeEscalation not false")
        caps = sc.get("capabilities", {})
        if "ALL" not in caps.get("drop", []):
            out.append(f"{name}: capabilities not dropping ALL")
        if set(caps.get("add", [])) - {"NET_BIND_SERVICE"}:
            out.append(f"{name}: adds capabilities {caps['add']}")
        if (
            not (sc.get("runAsNonRoot") or psc.get("runAsNonRoot"))
            or sc.get("runAsNonRoot") is False
        ):
            out.append(f"{name}: runAsNonRoot not true")
        if sc.get("runAsUser") == 0:
            out.append(f"{name}: runAsUser 0")
        seccomp = (sc.get("seccompProfile") or psc.get("seccompProfile") or {}).get("type")
        if seccomp not in ("RuntimeDefault", "Localhost"):
            out.append(f"{name}: seccompProfile {seccomp}")
        if any(p.get("hostPort") for p in c.get("ports", [])):
            out.append(f"{name}: hostPort")
        if sc.get("procMount", "Default") != "Default":
            out.append(f"{name}: procMount")
    return out
