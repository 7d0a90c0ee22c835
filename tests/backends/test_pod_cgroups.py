"""Host processes mapped to pods by their cgroup, over /proc trees written by hand in the
formats the kubelet's cgroup drivers and runtimes produce (systemd and cgroupfs drivers, cgroup
v1 and v2, containerd, CRI-O, Docker, a reader in its own cgroup namespace)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from exporter.backends.pod_cgroups import (
    GONE,
    HOST,
    POD,
    UNREADABLE,
    PodContainer,
    PodProcesses,
    pod_of_cgroup,
)

UID = "4a1b2c3d-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
UNDERSCORED = UID.replace("-", "_")
CID = "8f3c2a" + "0" * 52 + "abcdef"  # 64 hex digits
OTHER_CID = "1" * 64

V1_CGROUPFS = "\n".join(
    [
        f"12:memory:/kubepods/burstable/pod{UID}/{CID}",
        f"11:cpu,cpuacct:/kubepods/burstable/pod{UID}/{CID}",
        f"1:name=systemd:/kubepods/burstable/pod{UID}/{CID}",
        "",
    ]
)
CASES = {
    # cgroup v2, systemd driver, containerd (the common case on current distributions)
    "v2-systemd-burstable": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice/"
        f"cri-containerd-{CID}.scope\n",
        PodContainer(UID, CID),
    ),
    "v2-systemd-besteffort": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}"
        f".slice/cri-containerd-{CID}.scope\n",
        PodContainer(UID, CID),
    ),
    "v2-systemd-guaranteed": (
        f"0::/kubepods.slice/kubepods-pod{UNDERSCORED}.slice/cri-containerd-{CID}.scope\n",
        PodContainer(UID, CID),
    ),
    "v2-systemd-crio": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice/"
        f"crio-{CID}.scope\n",
        PodContainer(UID, CID),
    ),
    "v2-systemd-docker": (
        f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UNDERSCORED}"
        f".slice/docker-{CID}.scope\n",
        PodContainer(UID, CID),
    ),
    # the reader in its own cgroup namespace sees the path relative to its root
    "v2-cgroupns-relative": (
        f"0::/../../kubepods-burstable-pod{UNDERSCORED}.slice/cri-containerd-{CID}.scope\n",
        PodContainer(UID, CID),
    ),
    # kind: a kubelet nested in a container, its slices prefixed
    "v2-kind-nested": (
        f"0::/system.slice/docker-{OTHER_CID}.scope/kubelet.slice/kubelet-kubepods.slice/"
        f"kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UNDERSCORED}.slice/"
        f"cri-containerd-{CID}.scope\n",
        PodContainer(UID, CID),
    ),
    "v2-cgroupfs-guaranteed": (f"0::/kubepods/pod{UID}/{CID}\n", PodContainer(UID, CID)),
    "v1-cgroupfs-burstable": (V1_CGROUPFS, PodContainer(UID, CID)),
    "v1-cgroupfs-besteffort": (
        f"4:devices:/kubepods/besteffort/pod{UID}/{CID}\n2:cpuset:/\n",
        PodContainer(UID, CID),
    ),
    "v1-systemd": (
        f"13:pids:/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}"
        f".slice/cri-containerd-{CID}.scope\n"
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice/"
        f"cri-containerd-{CID}.scope\n",
        PodContainer(UID, CID),
    ),
    # a process in the pod's own cgroup (no container scope): the pod, no container ID
    "v2-pod-level": (
        f"0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UNDERSCORED}.slice\n",
        PodContainer(UID, ""),
    ),
    # upper-case hex is written lower case, as the API writes UIDs
    "v2-upper-case": (
        f"0::/kubepods/pod{UID.upper()}/{CID.upper()}\n",
        PodContainer(UID, CID),
    ),
}
NOT_PODS = {
    "host-daemon": "0::/system.slice/nvidia-persistenced.service\n",
    "mps-server": "0::/system.slice/nvidia-mps.service\n",
    "user-session": "0::/user.slice/user-1000.slice/session-3.scope\n",
    "docker-outside-kubernetes": f"0::/system.slice/docker-{CID}.scope\n",
    "v1-root": "12:memory:/\n11:cpu,cpuacct:/\n1:name=systemd:/init.scope\n",
    # "pod" not followed by a UID is no pod's
    "a-slice-named-pod": "0::/system.slice/podman-pod.slice/app.scope\n",
    "kubepods-without-pod": "0::/kubepods.slice/kubepods-burstable.slice\n",
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_each_cgroup_form_names_its_pod(name: str) -> None:
    text, expected = CASES[name]
    assert pod_of_cgroup(text) == expected


@pytest.mark.parametrize("name", sorted(NOT_PODS))
def test_processes_outside_pods_are_no_pods(name: str) -> None:
    assert pod_of_cgroup(NOT_PODS[name]) is None


def write(proc: Path, pid: int, cgroup: str) -> None:
    (proc / str(pid)).mkdir(parents=True)
    (proc / str(pid) / "cgroup").write_text(cgroup)


@pytest.fixture
def proc(tmp_path: Path) -> Path:
    """A host /proc: one process of each form, host daemons, and an unreadable file."""
    root = tmp_path / "proc"
    for pid, name in enumerate(sorted(CASES), start=1000):
        write(root, pid, CASES[name][0])
    for pid, name in enumerate(sorted(NOT_PODS), start=2000):
        write(root, pid, NOT_PODS[name])
    write(root, 3000, "")  # a zombie: its cgroup file is empty
    (root / "3001").mkdir()
    (root / "3001" / "cgroup").mkdir()  # reading it fails with EISDIR: unreadable
    return root


def test_lookups_over_a_proc_tree(proc: Path) -> None:
    pods = PodProcesses(proc)
    owners = pods.owners([*range(1000, 1000 + len(CASES)), *range(2000, 2000 + len(NOT_PODS))])
    found = {pid: o for pid, o in owners.items() if o.result == POD}
    assert len(found) == len(CASES)
    assert {o.owner.pod_uid for o in found.values() if o.owner is not None} == {UID}
    hosts = [pid for pid, o in owners.items() if o.result == HOST]
    assert sorted(hosts) == list(range(2000, 2000 + len(NOT_PODS)))
    assert pods.lookup(4242).result == GONE  # ended between NVML's list and the read
    assert pods.lookup(3000).result == GONE
    assert pods.lookup(3001).result == UNREADABLE


def test_this_machines_own_procfs_is_read_without_error() -> None:
    # The real format: this test process is in some cgroup (pod or not); the read succeeds.
    result = PodProcesses(Path("/proc")).lookup(os.getpid()).result
    assert result in (POD, HOST)
