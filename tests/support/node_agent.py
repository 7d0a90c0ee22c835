"""``python -m support.node_agent [flags]``: the exporter's real CLI over the stand-in NVML of the
node in :mod:`support.kubelet` (hand-written), for tests that run a node agent as a process.

The stand-in's GPUs keep a live utilisation buffer: each read finds the driver's samples of the
last two seconds (one every 1/6 s, as the driver keeps them), at the GPU's fixed utilisation
(GPU ``n`` at ``10 * (n + 1)`` percent), so the busy-seconds counter grows as on a GPU. The
time-sliced GPU (``SHARED_GPU``, notebook-a's and notebook-b's) runs two processes,
:data:`SHARED_TENANTS` (host PID: SM percent), with live per-process samples; a test gives the
agent a host ``/proc`` whose cgroups name their pods (``--gpu.host-procfs``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator

from exporter.backends import nvml_library
from support.kubelet import SHARED_GPU, NodeNvml, node_gpus
from support.pynvml_fake import Error

SAMPLE_PERIOD_US = 166_667
BUFFER_US = 2_000_000
# The time-sliced GPU's processes: host PID -> SM percent (notebook-a's, notebook-b's).
SHARED_TENANTS = {5001: 10, 5002: 85}


class LiveSamples:
    """The driver's utilisation buffer of one GPU, read at wall-clock time."""

    def __init__(self, percent: int) -> None:
        self.percent = percent

    def __iter__(self) -> Iterator[tuple[int, int]]:
        now = int(time.time() * 1e6) // SAMPLE_PERIOD_US * SAMPLE_PERIOD_US
        for ts in range(now - BUFFER_US, now + 1, SAMPLE_PERIOD_US):
            yield ts, self.percent


class LiveProcessSamples:
    """The driver's per-process samples of one GPU, one per process and second, read at
    wall-clock time (whole seconds: the sizing call and the filling call see the same)."""

    def __init__(self, shares: dict[int, int]) -> None:
        self.shares = shares

    def __iter__(self) -> Iterator[tuple[int, int, int, int]]:
        now = int(time.time()) * 1_000_000
        for ts in (now - 1_000_000, now):
            for pid, sm in self.shares.items():
                yield pid, ts, sm, 0


class LiveNodeNvml(NodeNvml):
    """:class:`NodeNvml` whose whole GPUs have a live utilisation buffer."""

    def __init__(self) -> None:
        gpus = node_gpus()
        for gpu in gpus:
            if not isinstance(gpu.utilization, Error):
                gpu.samples = LiveSamples(gpu.utilization[0])  # type: ignore[assignment]
        shared = gpus[SHARED_GPU]
        shared.processes = [(pid, 2**30) for pid in SHARED_TENANTS]
        shared.process_samples = LiveProcessSamples(SHARED_TENANTS)  # type: ignore[assignment]
        super().__init__(gpus)


def main() -> int:
    # nvml's build() imports the library adapter when it runs: the stand-in takes its place.
    nvml_library.PynvmlApi = LiveNodeNvml  # type: ignore[misc]
    from exporter.cli import main as cli_main  # noqa: PLC0415

    return cli_main()


if __name__ == "__main__":
    sys.exit(main())
