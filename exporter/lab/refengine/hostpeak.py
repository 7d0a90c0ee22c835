"""This host's memory bandwidth and matrix-multiply rate, as the model worker can use them.

On a CPU-only machine the model worker's torch threads stand in for the GPU, and the drills
replay an NVML trace whose peaks should be this host's, so that the reference model's decode
floor ``(weight bytes + KV bytes in use) / peak bandwidth`` is real
(:mod:`exporter.lab.refengine.gputrace` writes them into the trace as NVML facts).

``python -m exporter.lab.refengine.hostpeak --threads N`` prints one JSON object::

    {"memory_bandwidth": 2.6e10, "decode_stream_bandwidth": 4.2e9,
     "decode_stream_sustained": 3.9e9, "matmul_flops": 9.5e10, "threads": 1,
     "buffer_bytes": 536870912, "passes": 10, "how": "..."}

* **Memory bandwidth** (bytes/s): a read-only stream, ``torch.sum`` over a float32 buffer of
  512 MiB (far beyond any last-level cache, so every pass comes from DRAM), with the
  worker's number of torch threads: what DRAM delivers.
* **Decode stream bandwidth** (bytes/s): the rate at which torch streams the reference
  model's weight matrices (every block's qkv, out, fc1, fc2 and the tied LM head, float32,
  the default ``tiny`` size) through one decode step's products at a batch of 4 sequences.
  This, not DRAM, is the ceiling of a decode step on a CPU: with a few rows per product,
  torch's CPU kernels repack the weights on every call and run out of arithmetic long before
  the memory bus (about 4 GB/s here against about 24 GB/s of DRAM reads). On a GPU the same
  products stream at close to the HBM peak, which is why the drill traces use this figure as
  the replayed GPU's peak bandwidth: the decode floor is then the time the step's kernels
  need, as the HBM floor is on a GPU.
* **Matrix-multiply rate** (FLOP/s): float32 ``1024 x 1024 @ 1024 x 1024`` products (2 x
  1024^3 FLOPs each; the operands stay in cache), the precision the CPU model runs in.

Each figure is the fastest of 10 timed passes after one untimed one, STREAM's convention for
a peak: a neighbour on the host (the machines these drills run on are shared) can only ever
slow a pass down, so the fastest pass is the closest to what the hardware delivers.

* **Sustained decode stream** (bytes/s): the same decode step's products back to back for
  :data:`SUSTAINED_S`, by the wall clock: what one thread gets now, neighbours included. A
  pass of a millisecond fits between two of the scheduler's preemptions, so the fastest pass
  shows the hardware even on a busy host; the model worker's steps run back to back and wait
  for the CPU like this. On a quiet host the two agree within a few per cent; on a shared
  busy one the sustained rate is the share of the hardware the worker can have.

It takes about five seconds with torch's import.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

BUFFER_BYTES = 512 * 2**20
MATMUL_N = 1024
PASSES = 10
SUSTAINED_S = 1.0
# The default reference model (exporter.lab.refengine.worker.SIZES["tiny"], the BPE vocabulary
# of exporter.lab.refengine.bpe) and the batch its drill load keeps running.
DECODE_LAYERS, DECODE_D_MODEL, DECODE_VOCAB, DECODE_BATCH = 4, 256, 2048, 4


def fastest(run: Callable[[], Any], passes: int = PASSES) -> float:
    """Seconds of the fastest of ``passes`` timed calls (after one untimed call)."""
    run()
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - start)
    return best


def sustained(run: Callable[[], Any], seconds: float = SUSTAINED_S) -> float:
    """Wall seconds per call of ``run`` called back to back for ``seconds``."""
    run()
    calls = 0
    start = time.perf_counter()
    while (elapsed := time.perf_counter() - start) < seconds:
        run()
        calls += 1
    return elapsed / max(1, calls)


def _decode_step(torch: Any, gen: Any) -> tuple[int, Callable[[], Any]]:
    """The weight products of one batched decode step of the tiny model: (bytes, the step)."""
    d = DECODE_D_MODEL
    shapes = [(3 * d, d), (d, d), (4 * d, d), (d, 4 * d)] * DECODE_LAYERS + [(DECODE_VOCAB, d)]
    weights = [torch.randn(*shape, generator=gen) for shape in shapes]
    inputs = {k: torch.randn(DECODE_BATCH, k, generator=gen) for k in (d, 4 * d)}

    def step() -> None:
        for w in weights:
            torch.nn.functional.linear(inputs[w.shape[1]], w)

    return sum(4 * w.numel() for w in weights), step


def measure_sustained(threads: int) -> dict[str, Any]:
    """The sustained decode stream alone, in this process (a second after torch's import)."""
    import torch  # noqa: PLC0415

    if threads > 0:
        torch.set_num_threads(threads)
    with torch.inference_mode():
        stream_bytes, step = _decode_step(torch, torch.Generator().manual_seed(0))
        steady = sustained(step)
    return {"decode_stream_sustained": stream_bytes / steady, "threads": torch.get_num_threads()}


def measure(threads: int) -> dict[str, Any]:
    import torch  # noqa: PLC0415

    if threads > 0:
        torch.set_num_threads(threads)
    with torch.inference_mode():
        buf = torch.ones(BUFFER_BYTES // 4, dtype=torch.float32)
        read = fastest(buf.sum)
        del buf
        gen = torch.Generator().manual_seed(0)
        a = torch.randn(MATMUL_N, MATMUL_N, generator=gen)
        b = torch.randn(MATMUL_N, MATMUL_N, generator=gen)
        mm = fastest(lambda: torch.mm(a, b))
        stream_bytes, step = _decode_step(torch, gen)
        stream = fastest(step)
        steady = sustained(step)
    used = torch.get_num_threads()
    return {
        "memory_bandwidth": BUFFER_BYTES / read,
        "decode_stream_bandwidth": stream_bytes / stream,
        "decode_stream_sustained": stream_bytes / steady,
        "matmul_flops": 2.0 * MATMUL_N**3 / mm,
        "threads": used,
        "buffer_bytes": BUFFER_BYTES,
        "passes": PASSES,
        "how": (
            f"fastest of {PASSES} passes on {used} torch thread(s): read-only sum over "
            f"{BUFFER_BYTES // 2**20} MiB of float32; the tiny model's weight matrices "
            f"({stream_bytes / 1e6:.1f} MB) through a batch-{DECODE_BATCH} decode step; "
            f"float32 {MATMUL_N}x{MATMUL_N} matmul; the decode step back to back for "
            f"{SUSTAINED_S:g} s by the wall clock (sustained)"
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    from exporter.config import ArgumentParser  # noqa: PLC0415

    parser = ArgumentParser(
        prog="python -m exporter.lab.refengine.hostpeak",
        description="Measure this host's memory read bandwidth and float32 matmul rate.",
    )
    parser.add_argument("--threads", type=int, default=1, help="torch threads (0: torch's)")
    args = parser.parse_args(argv)
    sys.stdout.write(json.dumps(measure(max(0, args.threads))) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
