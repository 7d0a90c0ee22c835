"""Which of the PIDs NVML reports are the engine's processes.

NVML reports **host** PIDs: the driver knows nothing of PID namespaces. The sidecar finds the
engine's processes in its own PID namespace (the ``process`` collector, with
``shareProcessNamespace: true`` on the pod), so the two must be matched:

* When the sidecar's ``/proc`` is the host's (``hostPID: true``, or the exporter outside any
  container), an NVML PID is a local PID.
* Otherwise the host's ``/proc`` mounted into the sidecar (``--gpu.host-procfs``, a read-only
  ``hostPath``) maps it: ``<host proc>/<pid>/status`` lists the process's PID in each PID
  namespace it belongs to, outermost first (``NStgid``, proc(5)), so the innermost entry is
  its PID in the pod. That number could belong to another pod's process too, so the match is
  confirmed by the start time (``stat`` field 22, clock ticks since boot, the same in every
  namespace): the same PID number *and* the same start tick is the same process.
* Neither: the NVML PIDs cannot be told apart, and the per-process shares are not exported
  (``available`` is false).

Whether a ``/proc`` is the host's: PID 2 of the initial PID namespace is ``kthreadd``, a kernel
thread; kernel threads exist in no other PID namespace, so a ``/proc`` whose PID 2 is a kernel
thread (``PF_KTHREAD`` in ``stat`` flags) is the host's.

Everything read here is world-readable (``stat``, ``status``); nothing needs ptrace rights.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Protocol

# include/linux/sched.h: "I am a kernel thread".
PF_KTHREAD = 0x00200000
_STAT_FLAGS = 9  # 1-based fields of /proc/<pid>/stat
_STAT_STARTTIME = 22


class EngineProcesses(Protocol):
    """Tells the engine's processes among the host PIDs NVML reports."""

    @property
    def available(self) -> bool:
        """Whether attribution is possible at all (else per-process reads are pointless)."""
        ...

    def engine(self, host_pids: Iterable[int]) -> frozenset[int] | None:
        """The engine's PIDs among ``host_pids``; None while the engine's own PIDs are not
        known yet."""
        ...


def _stat_fields(proc: Path, pid: int | str) -> list[str] | None:
    """``/proc/<pid>/stat`` split into fields; the command (field 2) may hold spaces and
    parentheses, so the fields after it are counted from the last ``)``."""
    try:
        text = (proc / str(pid) / "stat").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    head, sep, tail = text.rpartition(")")
    if not sep:
        return None
    pid_field = head.split("(", 1)[0].strip()
    return [pid_field, head.split("(", 1)[-1], *tail.split()]


def start_time(proc: Path, pid: int) -> int | None:
    """Start of the process in clock ticks since boot; None if it is gone or unreadable."""
    fields = _stat_fields(proc, pid)
    if fields is None or len(fields) < _STAT_STARTTIME:
        return None
    with contextlib.suppress(ValueError):
        return int(fields[_STAT_STARTTIME - 1])
    return None


def namespace_pids(proc: Path, pid: int) -> list[int] | None:
    """The process's PID in each PID namespace it belongs to, from the one ``proc`` was
    mounted in inwards (``NStgid``; ``Tgid`` on kernels before 4.1)."""
    try:
        text = (proc / str(pid) / "status").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    tgid: list[int] | None = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in ("NStgid", "Tgid"):
            try:
                pids = [int(v) for v in value.split()]
            except ValueError:
                return None
            if key == "NStgid":
                return pids or None
            tgid = pids
    return tgid or None


def is_host_procfs(proc: Path) -> bool:
    """Whether ``proc`` shows the initial PID namespace (its PID 2 is a kernel thread)."""
    fields = _stat_fields(proc, 2)
    if fields is None or len(fields) < _STAT_FLAGS:
        return False
    try:
        flags = int(fields[_STAT_FLAGS - 1])
    except ValueError:
        return False
    return bool(flags & PF_KTHREAD)


class HostPids:
    """:class:`EngineProcesses` matching NVML's host PIDs to the engine's local PIDs.

    ``local`` returns the engine's PIDs in the sidecar's namespace (None until the process
    collector has looked). ``host_procfs`` is the host's ``/proc`` where it is mounted
    elsewhere; ``procfs`` the sidecar's own.
    """

    def __init__(
        self,
        local: Callable[[], frozenset[int] | None],
        *,
        host_procfs: Path | None = None,
        procfs: Path = Path("/proc"),
    ) -> None:
        self._local = local
        self._procfs = procfs
        if host_procfs is not None:
            self.root: Path | None = host_procfs
        elif is_host_procfs(procfs):
            self.root = procfs
        else:
            self.root = None

    @property
    def available(self) -> bool:
        return self.root is not None

    def engine(self, host_pids: Iterable[int]) -> frozenset[int] | None:
        local = self._local()
        root = self.root
        if local is None or root is None:
            return None
        found: set[int] = set()
        for pid in host_pids:
            if self._is_engine(root, pid, local):
                found.add(pid)
        return frozenset(found)

    def _is_engine(self, root: Path, pid: int, local: frozenset[int]) -> bool:
        pids = namespace_pids(root, pid)
        if not pids:
            return False
        for candidate in reversed(pids):  # innermost first: the pod's namespace
            if candidate in local:
                started = start_time(root, pid)
                return started is not None and started == start_time(self._procfs, candidate)
        return False


class FixedPids:
    """:class:`EngineProcesses` from a fixed set of host PIDs (a replay trace's)."""

    def __init__(self, pids: Iterable[int]) -> None:
        self.pids = frozenset(pids)

    @property
    def available(self) -> bool:
        return True

    def engine(self, host_pids: Iterable[int]) -> frozenset[int] | None:
        return self.pids.intersection(host_pids)
