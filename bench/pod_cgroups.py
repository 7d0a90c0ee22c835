"""What mapping NVML's processes to pods costs the node agent (``--gpu.host-procfs`` / hostPID).

Writes a host ``/proc`` tree of N processes (as many cgroup forms as the kubelet makes: systemd
and cgroupfs drivers, cgroup v1's many lines and v2's one, plus host daemons), then maps all of
them the way one poll of every GPU does (:meth:`PodProcesses.owners`: one ``cgroup`` read per
process, no cache), and reports wall and CPU milliseconds per refresh. Also maps the real
``/proc`` of this machine (every process here), for the real kernel's file reads.

    python bench/pod_cgroups.py [--processes 500] [--rounds 50]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from exporter.backends.pod_cgroups import PodProcesses

FORMS = (
    "0::/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/"
    "cri-containerd-{c}.scope\n",
    "0::/kubepods/besteffort/pod{d}/{c}\n",
    "".join(f"{n}:ctl{n}:/kubepods/burstable/pod{{d}}/{{c}}\n" for n in range(12, 0, -1)),
    "0::/system.slice/nvidia-persistenced.service\n",
)


def write_tree(root: Path, processes: int) -> list[int]:
    pids = []
    for i in range(processes):
        pid = 1000 + i
        uid = f"{i:08x}-5e6f-4a7b-8c9d-0e1f2a3b4c5d"
        text = FORMS[i % len(FORMS)].format(u=uid.replace("-", "_"), d=uid, c=f"{i:064x}")
        (root / str(pid)).mkdir(parents=True)
        (root / str(pid) / "cgroup").write_text(text)
        pids.append(pid)
    return pids


def measure(pods: PodProcesses, pids: list[int], rounds: int) -> tuple[float, float]:
    """Median wall and CPU milliseconds of mapping ``pids`` once."""
    walls, cpus = [], []
    for _ in range(rounds):
        wall, cpu = time.perf_counter(), time.process_time()
        pods.owners(pids)
        walls.append((time.perf_counter() - wall) * 1e3)
        cpus.append((time.process_time() - cpu) * 1e3)
    return statistics.median(walls), statistics.median(cpus)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=500)
    parser.add_argument("--rounds", type=int, default=50)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        pids = write_tree(root, args.processes)
        wall, cpu = measure(PodProcesses(root), pids, args.rounds)
        print(f"written tree, {len(pids)} processes: {wall:.2f} ms wall, {cpu:.2f} ms CPU")
    real = [int(p.name) for p in Path("/proc").iterdir() if p.name.isdigit()]
    wall, cpu = measure(PodProcesses(Path("/proc")), real, args.rounds)
    print(f"this machine's /proc, {len(real)} processes: {wall:.2f} ms wall, {cpu:.2f} ms CPU")


if __name__ == "__main__":
    main()
