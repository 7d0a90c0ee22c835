"""Matching NVML's host PIDs to the engine's processes, over procfs trees written in the
formats of fs/proc/array.c (``stat``, ``status``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporter.backends.pidns import (
    FixedPids,
    HostPids,
    is_host_procfs,
    namespace_pids,
    start_time,
)

KTHREAD_FLAGS = 0x208040  # what kthreadd's stat shows: PF_KTHREAD | PF_NOFREEZE | ...
USER_FLAGS = 0x400100


def write_process(
    proc: Path, pid: int, *, comm: str, start: int, nstgid: list[int], flags: int = USER_FLAGS
) -> None:
    d = proc / str(pid)
    d.mkdir(parents=True)
    # pid (comm) state ppid pgrp session tty tpgid flags ... starttime (field 22) ...
    # minflt .. cstime, priority, nice, num_threads, itrealvalue, starttime, vsize ...
    rest = ["0"] * 8 + ["20", "0", "1", "0", str(start)] + ["0"] * 30
    (d / "stat").write_text(f"{nstgid[0]} ({comm}) S 1 1 1 0 -1 {flags} {' '.join(rest)}\n")
    ids = "\t".join(map(str, nstgid))
    (d / "status").write_text(
        f"Name:\t{comm}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t{nstgid[0]}\n"
        f"Ngid:\t0\nPid:\t{nstgid[0]}\nPPid:\t1\nNStgid:\t{ids}\nNSpid:\t{ids}\n"
    )


@pytest.fixture
def host(tmp_path: Path) -> Path:
    """The host's /proc: kthreadd, two engines of two pods (both PID 7 in their pod), and a
    process of the host itself."""
    proc = tmp_path / "host-proc"
    write_process(proc, 2, comm="kthreadd", start=0, nstgid=[2], flags=KTHREAD_FLAGS)
    write_process(proc, 41000, comm="vllm", start=5000, nstgid=[41000, 7])  # our pod
    write_process(proc, 41001, comm="VLLM::EngineCore", start=5010, nstgid=[41001, 8])
    write_process(proc, 52000, comm="vllm", start=6000, nstgid=[52000, 7])  # the other pod
    write_process(proc, 900, comm="nvidia-cuda-mps", start=100, nstgid=[900])
    return proc


@pytest.fixture
def pod(tmp_path: Path) -> Path:
    """The sidecar's own /proc, in the pod's PID namespace (shareProcessNamespace)."""
    proc = tmp_path / "pod-proc"
    write_process(proc, 1, comm="pause", start=4990, nstgid=[1])
    write_process(proc, 2, comm="sh", start=4995, nstgid=[2])  # PID 2, not a kernel thread
    write_process(proc, 7, comm="vllm", start=5000, nstgid=[7])
    write_process(proc, 8, comm="VLLM::EngineCore", start=5010, nstgid=[8])
    return proc


def test_stat_and_status_fields(host: Path) -> None:
    assert start_time(host, 41001) == 5010
    assert namespace_pids(host, 41001) == [41001, 8]
    assert start_time(host, 12345) is None and namespace_pids(host, 12345) is None


def test_a_command_with_spaces_and_parentheses(tmp_path: Path) -> None:
    write_process(tmp_path, 5, comm="odd ) name (x", start=77, nstgid=[5])
    assert start_time(tmp_path, 5) == 77


def test_host_procfs_is_told_by_kthreadd(host: Path, pod: Path, tmp_path: Path) -> None:
    assert is_host_procfs(host)
    assert not is_host_procfs(pod)
    assert not is_host_procfs(tmp_path / "nowhere")


def test_the_real_proc_of_this_machine_is_answered() -> None:
    # Whatever namespace the tests run in, the check reads this kernel's format without error.
    assert isinstance(is_host_procfs(Path("/proc")), bool)


def test_pod_namespace_with_the_host_proc_mounted(host: Path, pod: Path) -> None:
    engine = HostPids(lambda: frozenset({7, 8}), host_procfs=host, procfs=pod)
    assert engine.available
    # 52000 is PID 7 in the other pod: same number, different start time, not ours.
    assert engine.engine([41000, 41001, 52000, 900, 31337]) == frozenset({41000, 41001})


def test_pod_namespace_without_the_host_proc_cannot_attribute(pod: Path) -> None:
    engine = HostPids(lambda: frozenset({7, 8}), procfs=pod)
    assert not engine.available
    assert engine.engine([41000, 7]) is None


def test_host_pid_namespace(host: Path) -> None:
    # hostPID: the process collector sees host PIDs and /proc is the host's.
    engine = HostPids(lambda: frozenset({41000, 41001}), procfs=host)
    assert engine.available
    assert engine.engine([41000, 41001, 52000]) == frozenset({41000, 41001})


def test_engine_pids_not_known_yet(host: Path, pod: Path) -> None:
    engine = HostPids(lambda: None, host_procfs=host, procfs=pod)
    assert engine.available and engine.engine([41000]) is None


def test_a_restarted_engine_reusing_the_pid_is_matched_again(host: Path, pod: Path) -> None:
    engine = HostPids(lambda: frozenset({7}), host_procfs=host, procfs=pod)
    (pod / "7" / "stat").write_text((pod / "7" / "stat").read_text().replace(" 5000 ", " 5999 "))
    assert engine.engine([41000]) == frozenset()  # PID 7 is now another process


def test_fixed_pids() -> None:
    fixed = FixedPids([4242, 4243])
    assert fixed.available
    assert fixed.engine([4242, 5151]) == frozenset({4242})
