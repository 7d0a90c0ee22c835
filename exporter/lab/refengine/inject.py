"""Bottleneck injection for the reference engine: each one a real cause, not a fake metric.

===================  ======================================================================
``tokenizer-slow``   requests (and ``/tokenize``) are tokenized by the pure-Python BPE path
                     (:meth:`~exporter.lab.refengine.bpe.BpeTokenizer.encode_slow`) on one
                     dedicated thread: the request path waits for it, it holds the GIL;
                     with ``--tokenizer-slow-us-per-token`` it takes at least that much
                     CPU time per token (more pure-Python work when the path was faster)
``frontend-gil``     CPU-heavy pure-Python pre-processing of every request and
                     post-processing of every streamed chunk, in the event-loop thread
``queue-flood``      the scheduler admits at most ``--flood-max-num-seqs`` (1) running
                     sequences: admission capacity below the offered load, the queue grows
``cpu-contention``   busy-looping processes, four per usable CPU (``--contention-procs``),
                     compete with the engine: a node oversubscribed by its neighbours
``softirq``          a helper process floods a UDP socket on 127.0.0.1 (see below)
``h2d-stall``        a synchronous copy of ``--h2d-stall-mib`` (4096) MiB from pageable host
                     memory before the kernels of every ``--h2d-stall-every`` (24th) step
                     (CUDA only), timed with :class:`exporter.instrument.torch_h2d.H2DTimer`
``memory-pressure``  the KV block pool holds ``--memory-pressure-blocks`` (40) blocks, less
                     than the load's sequences need, so it stays nearly full and preempts;
                     on CUDA the cache also takes device memory up to ``--memory-fill``
                     (0.96) of it
``hbm-saturation``   after ``--hbm-saturation-after`` (120) seconds, a neighbour on the same
                     GPU (a thread of the model worker with its own CUDA stream) copies
                     ``--hbm-saturation-mib`` (4096) MiB device to device back to back:
                     HBM bandwidth saturates and decode, which reads the weights and the
                     KV cache every step, slows down (CUDA only)
``decode-overhead``  the model worker does ``--decode-overhead-ms`` (12) ms of pure-Python
                     CPU work on its step path before every decode step: host work between
                     the device's steps (scheduling, input preparation, sampling set-up) that
                     is not overlapped with them, so each step takes several times its
                     memory floor while the memory bus idles
``kv-transfer-slow`` a disaggregated pair's KV link (``--role prefill|decode``) is
                     throttled to ``--kv-link-mib-s`` (4) MiB/s: the prefill server writes
                     and the decode server reads the cache in 64 KiB pieces with sleeps
                     between them, so reading a request's cache takes longer than its
                     prefill (:mod:`exporter.lab.refengine.kv_transfer`)
``decode-pool-short`` the decode server (``--role decode``) admits at most
                     ``--decode-pool-slots`` (2) running sequences: more requests decode at
                     once than it has slots, its queue grows while the prefill server,
                     which runs each prompt once, idles
===================  ======================================================================

Sizes. The injections that have a size (:data:`INJECTION_SIZES`: the tokenizer's time per
token, the front-end's CPU per request and per chunk, the decode overhead, the KV link's rate,
the softirq flood's share of the node)
take it from their flag at start-up, and ``POST /lab/injection`` with a JSON object of new
sizes changes them while the engine runs (``GET`` shows them): a drill starts the engine
with an injection of size zero, measures what the engine serves on this machine, and sizes
the injection from that when its load starts (``tests/drills``). A size that is unknown, out
of bounds, or of an injection the engine does not run is refused (400) and nothing changes.

Helper processes (``cpu-contention``, ``softirq``) are ``python -m exporter.lab.refengine.inject``
children of the engine. Each is bounded: it stops by itself after ``--inject-duration``
(default 10 minutes, at most an hour), when the engine exits (parent-death signal, and a check
of the parent twice a second), and when the engine stops it.

The softirq flood. It sends UDP datagrams from one socket to another, both bound to 127.0.0.1
only: nothing leaves the host. Each send is a 61,600-byte datagram with ``UDP_SEGMENT`` 1400
(generic segmentation offload, as QUIC servers send), which the loopback receive path splits
into 44 packets of 1400 bytes in NET_RX softirq context; the receiving socket has a 64 KiB
buffer and is never read, so the packets are dropped after the kernel has done the receive
work (``RcvbufErrors`` in ``/proc/net/snmp``). The helper is pinned to the last usable CPU -
a NIC whose interrupts all land on one core - and paces itself: every half second it reads
``/proc/stat`` and adjusts its duty cycle so that softirq takes ``--softirq-target`` (0.15) of
the node's CPU time - three times the signature's 5 % - without taking more than 90 % of its
own core (on a large node the busiest core then crosses the signature's 50 % instead), and
never sends more than ``--softirq-max-rate`` datagrams per second (default 100,000).
Without ``UDP_SEGMENT`` (kernels before 4.18) it sends plain 1400-byte datagrams. The engine
pins itself (every thread, and the model worker it spawns) to the same core
(:func:`pin_engine`), so the flood's softirq work takes CPU time where the engine runs; the
helpers get the node's CPUs back (``--cpus``). The target is a size (``softirq_target``): an
engine started with ``--softirq-target 0`` runs no flood until ``POST /lab/injection`` sets one,
and a new target restarts the flood (:meth:`Helpers.retarget`), so a drill measures the engine
without it first.
"""

from __future__ import annotations

import contextlib
import ctypes
import math
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from exporter.config import ArgumentParser

CPU_ONLY = frozenset({"tokenizer-slow", "frontend-gil", "queue-flood", "cpu-contention", "softirq"})
CUDA_ONLY = frozenset({"h2d-stall", "hbm-saturation"})
# Injections into a disaggregated pair (a decode engine reading from a prefill one).
DISAGGREGATED = frozenset({"kv-transfer-slow", "decode-pool-short"})
INJECTIONS: dict[str, str] = {
    "tokenizer-slow": "pure-Python tokenizer on one thread on the request path",
    "frontend-gil": "CPU-heavy pre/post-processing in the event-loop thread",
    "queue-flood": "admission capacity (max running sequences) below the offered load",
    "cpu-contention": "busy-looping processes competing for every CPU",
    "softirq": "bounded loopback UDP flood raising NET_RX softirq time",
    "h2d-stall": "synchronous pageable host-to-device copies between steps (CUDA)",
    "memory-pressure": "KV cache pool smaller than the load needs (device memory at 96 % on CUDA)",
    "hbm-saturation": "a neighbour streaming device memory on the same GPU, after a while (CUDA)",
    "decode-overhead": "host work on the model worker's step path before every decode step",
    "kv-transfer-slow": "the KV link between a prefill and a decode server throttled",
    "decode-pool-short": "the decode server's slots below the requests decoding at once",
}


@dataclass(frozen=True)
class Size:
    """How big one injection is: the start-up flag ``--<name, dashes for underscores>`` and the
    key of the engine's ``/lab/injection``, which changes it while the engine runs (a drill
    measures the engine first, then sizes the injection from what it measured)."""

    injection: str
    default: float
    low: float
    high: float
    help: str
    above_low: bool = False  # the size must be more than ``low``, not ``low`` itself

    def problem(self, value: float) -> str:
        """Why ``value`` cannot be this size ("" when it can)."""
        if not math.isfinite(value) or value > self.high or value < self.low:
            return f"must be from {self.low:g} to {self.high:g}, got {value:g}"
        if self.above_low and value == self.low:
            return f"must be above {self.low:g} and at most {self.high:g}, got {value:g}"
        return ""


#: The most of its own core the softirq flood takes (``--core-cap``).
SOFTIRQ_CORE_CAP = 0.9

INJECTION_SIZES: dict[str, Size] = {
    "tokenizer_slow_us_per_token": Size(
        "tokenizer-slow",
        0.0,
        0.0,
        100_000.0,
        "tokenizer-slow: CPU microseconds per token at least: the pure-Python path, then more "
        "pure-Python work of the tokenizer thread when that was faster (0: the path alone)",
    ),
    "gil_request_ms": Size(
        "frontend-gil", 500.0, 0.0, 60_000.0, "frontend-gil: CPU ms per request"
    ),
    "gil_chunk_ms": Size(
        "frontend-gil", 2.0, 0.0, 1_000.0, "frontend-gil: CPU ms per stream chunk"
    ),
    "decode_overhead_ms": Size(
        "decode-overhead",
        12.0,
        0.0,
        10_000.0,
        "decode-overhead: CPU ms of host work before every decode step",
    ),
    "kv_link_mib_s": Size(
        "kv-transfer-slow", 4.0, 0.0, 100_000.0, "kv-transfer-slow: the link's MiB/s", True
    ),
    "softirq_target": Size(
        "softirq",
        0.15,
        0.0,
        0.95,
        "softirq: the share of the node's CPU time the flood keeps in softirq (0: no flood; "
        "a new size restarts the flood)",
    ),
}


def check_sizes(changes: Mapping[str, object], injections: frozenset[str]) -> dict[str, float]:
    """``changes`` (size name -> number) checked against :data:`INJECTION_SIZES` and the
    injections the engine runs; ValueError (one line) for an unknown name, a bad number, or
    the size of an injection that is not injected. All or nothing: nothing is returned when
    one is bad."""
    checked: dict[str, float] = {}
    for name, raw in changes.items():
        size = INJECTION_SIZES.get(name)
        if size is None:
            raise ValueError(f"unknown size {name!r} (known: {', '.join(INJECTION_SIZES)})")
        if isinstance(raw, bool) or not isinstance(raw, int | float):
            raise ValueError(f"{name}: must be a number, got {raw!r}")
        problem = size.problem(float(raw))
        if problem:
            raise ValueError(f"{name}: {problem}")
        if size.injection not in injections:
            raise ValueError(f"{name}: {size.injection} is not injected")
        checked[name] = float(raw)
    return checked


BURNERS_PER_CPU = 4
MAX_BURNERS = 128
MAX_DURATION_S = 3600.0
DEFAULT_DURATION_S = 600.0
UDP_SEGMENT = 103  # linux/udp.h
SOL_UDP = 17
SEGMENT_BYTES = 1400
SEGMENTS_PER_SEND = 44
PR_SET_PDEATHSIG = 1


def parse(values: Iterable[str]) -> frozenset[str]:
    """Injections from ``--inject`` values (repeatable, comma-separated); ValueError if unknown."""
    names: set[str] = set()
    for value in values:
        for raw in value.split(","):
            name = raw.strip()
            if not name or name == "none":
                continue
            if name not in INJECTIONS:
                raise ValueError(f"unknown injection {name!r} (known: {', '.join(INJECTIONS)})")
            names.add(name)
    return frozenset(names)


# --- frontend-gil ------------------------------------------------------------------------------

_PUNCTUATION = frozenset(".,;:!?'\"()[]{}-")


def hold_gil(text: str, cpu_seconds: float) -> int:
    """Pure-Python text processing (character classification over the last 1 KiB of
    ``text``, pass after pass) until this thread has used ``cpu_seconds`` of CPU time.

    This is the shape of request validation or output filtering written in Python: it never
    releases the GIL, and while it runs the event loop serves nobody."""
    deadline = time.thread_time() + cpu_seconds
    window = text[-1024:] or "."
    score = 0
    while time.thread_time() < deadline:
        for ch in window:
            if ch.isalpha():
                score += 1
            elif ch in _PUNCTUATION:
                score += 2
            elif ch.isspace():
                score -= 1
    return score


# --- helper processes --------------------------------------------------------------------------


@dataclass
class Helpers:
    """The helper processes of one engine; :meth:`stop` ends them all."""

    procs: list[subprocess.Popen[bytes]]
    # The softirq flood's command but its target (None: softirq not injected), and its process.
    flood_cmd: list[str] | None = None
    flood: subprocess.Popen[bytes] | None = None

    @classmethod
    def start(
        cls,
        injections: frozenset[str],
        *,
        duration: float,
        contention_procs: int = 0,
        softirq_target: float = 0.15,
        softirq_max_rate: float = 100000.0,
        cpus: Sequence[int] = (),
    ) -> Helpers:
        """``cpus``: the node's CPUs the helpers run on (:func:`pin_engine`'s answer, where the
        engine pinned itself to one of them); by default the caller's own."""
        duration = min(max(duration, 1.0), MAX_DURATION_S)
        common = ["--parent", str(os.getpid()), "--duration", f"{duration:g}"]
        if cpus:
            common += ["--cpus", ",".join(str(c) for c in cpus)]
        cmds: list[list[str]] = []
        if "cpu-contention" in injections:
            count = contention_procs or min(MAX_BURNERS, BURNERS_PER_CPU * len(usable_cpus()))
            cmds += [["burn", *common] for _ in range(count)]
        procs = [_spawn(cmd) for cmd in cmds]
        helpers = cls(procs)
        if "softirq" in injections:
            helpers.flood_cmd = ["softirq", *common, "--max-rate", f"{softirq_max_rate:g}"]
            helpers.retarget(softirq_target)
        return helpers

    def retarget(self, target: float) -> None:
        """The softirq flood keeps ``target`` of the node in softirq from now: the running one
        stops, a new one starts where ``target`` is above 0 (a drill starts the engine with
        none, measures the healthy engine, then floods: ``POST /lab/injection``)."""
        if self.flood_cmd is None:
            return
        if self.flood is not None:
            _end([self.flood])
            self.procs.remove(self.flood)
            self.flood = None
        if target > 0:
            self.flood = _spawn([*self.flood_cmd, "--target", f"{target:g}"])
            self.procs.append(self.flood)

    def stop(self, timeout: float = 3.0) -> None:
        _end(self.procs, timeout)


def _spawn(cmd: list[str]) -> subprocess.Popen[bytes]:
    return subprocess.Popen(
        [sys.executable, "-m", "exporter.lab.refengine.inject", *cmd], stdin=subprocess.DEVNULL
    )


def _end(procs: Sequence[subprocess.Popen[bytes]], timeout: float = 3.0) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.terminate()
    deadline = time.monotonic() + timeout
    for proc in procs:
        try:
            proc.wait(max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def usable_cpus() -> list[int]:
    return sorted(os.sched_getaffinity(0))


def pin_engine(injections: frozenset[str]) -> list[int]:
    """With ``softirq`` injected, pin every thread of this process to the core the flood pins
    itself to (the last usable CPU), before the model worker is spawned (it inherits the
    affinity): the flood's softirq work then takes CPU time from the engine where it runs, as a
    NIC's interrupts do on the core that serves. The node's CPUs before (for the helpers, which
    must keep the whole node), or an empty list where nothing was pinned."""
    if "softirq" not in injections:
        return []
    node = usable_cpus()
    core = {node[-1]}
    for task in Path("/proc/self/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            os.sched_setaffinity(int(task.name), core)
    return node


def _parent_alive(parent: int) -> bool:
    """The helper's parent still runs: it is our parent and not a zombie. A parent whose main
    thread has exited while another thread lives on shows as a zombie and keeps its PID, so the
    parent-death signal (sent when the forking thread exits) and ``getppid()`` alone miss it."""
    if os.getppid() != parent:
        return False
    try:
        stat = Path(f"/proc/{parent}/stat").read_text()
    except OSError:
        return False
    # The state follows the parenthesised command name, which may itself hold parentheses.
    return stat[stat.rindex(")") + 2 :][:1] not in ("Z", "X")


def _die_with_parent(parent: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if not _parent_alive(parent):
        raise SystemExit(0)


def _burn(parent: int, duration: float) -> int:
    """A pure-Python busy loop: one CPU's worth of competition for the engine."""
    end = time.monotonic() + duration
    x = 1.0
    while True:
        for _ in range(200_000):
            x = x * 1.0000001 + 1e-9
        if time.monotonic() >= end or not _parent_alive(parent):
            return 0


def _softirq_ticks(cpu: int, proc: Path = Path("/proc")) -> tuple[float, float, float, float]:
    """(softirq, all) ticks of the whole node, then of ``cpu``, from ``/proc/stat``."""
    node: tuple[float, float] | None = None
    core: tuple[float, float] | None = None
    prefix = f"cpu{cpu} "
    for line in (proc / "stat").read_text().splitlines():
        if line.startswith(("cpu ", prefix)):
            values = [float(v) for v in line.split()[1:]]
            # user nice system idle iowait irq softirq steal (guest time is inside user)
            pair = (values[6], sum(values[:8]))
            if line.startswith("cpu "):
                node = pair
            else:
                core = pair
    if node is None or core is None:
        raise RuntimeError(f"cpu or cpu{cpu} missing from /proc/stat")
    return (*node, *core)


def _flood_sockets() -> tuple[socket.socket, socket.socket, tuple[str, int], bytes]:
    rx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    rx.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
    rx.bind(("127.0.0.1", 0))
    tx = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    tx.bind(("127.0.0.1", 0))
    try:
        tx.setsockopt(SOL_UDP, UDP_SEGMENT, SEGMENT_BYTES)
        payload = b"\x00" * (SEGMENT_BYTES * SEGMENTS_PER_SEND)
    except OSError:
        payload = b"\x00" * SEGMENT_BYTES
    return rx, tx, rx.getsockname(), payload


def _softirq(parent: int, duration: float, target: float, core_cap: float, max_rate: float) -> int:
    """Loopback UDP flood paced so that softirq takes ``target`` of the node's CPU time, without
    taking more than ``core_cap`` of the pinned core."""
    cpus = usable_cpus()
    cpu = cpus[-1]
    with contextlib.suppress(OSError):
        os.sched_setaffinity(0, {cpu})
    rx, tx, dest, payload = _flood_sockets()
    tick = 0.01
    per_tick_max = max(1, int(max_rate * tick))
    duty = 0.3
    # At full duty the flood keeps about 70 % of its core in softirq: one step of the duty
    # cycle moves the node's share by about 0.7 / CPUs.
    gain = 0.5 * len(cpus) / 0.7
    end = time.monotonic() + duration
    last = _softirq_ticks(cpu)
    next_check = time.monotonic() + 0.5
    with rx, tx:
        while True:
            start = time.monotonic()
            if start >= end or not _parent_alive(parent):
                return 0
            sent = 0
            busy_until = start + tick * duty
            while sent < per_tick_max and time.monotonic() < busy_until:
                with contextlib.suppress(BlockingIOError, OSError):
                    tx.sendto(payload, dest)
                sent += 1
            rest = start + tick - time.monotonic()
            if rest > 0:
                time.sleep(rest)
            if time.monotonic() >= next_check:
                now = _softirq_ticks(cpu)
                node_total, core_total = now[1] - last[1], now[3] - last[3]
                if node_total > 0 and core_total > 0:
                    error = target - (now[0] - last[0]) / node_total
                    error = min(error, (core_cap - (now[2] - last[2]) / core_total) / len(cpus))
                    duty = min(1.0, max(0.02, duty + gain * error))
                last = now
                next_check = time.monotonic() + 0.5


def main(argv: Sequence[str] | None = None) -> int:
    parser = ArgumentParser(
        prog="python -m exporter.lab.refengine.inject",
        description="Helper processes of the reference engine's injections (bounded).",
    )
    parser.add_argument("kind", choices=("burn", "softirq"))
    parser.add_argument("--parent", type=int, required=True, help="exit when this PID is gone")
    parser.add_argument("--duration", type=float, default=DEFAULT_DURATION_S)
    parser.add_argument(
        "--target",
        type=float,
        default=INJECTION_SIZES["softirq_target"].default,
        help="softirq share of the node",
    )
    parser.add_argument(
        "--core-cap", type=float, default=SOFTIRQ_CORE_CAP, help="at most this of the core"
    )
    parser.add_argument("--max-rate", type=float, default=100000.0, help="sends per second")
    parser.add_argument(
        "--cpus", default="", help="run on these CPUs (comma-separated; default: the parent's)"
    )
    args = parser.parse_args(argv)
    if args.cpus:
        try:
            cpus = {int(c) for c in args.cpus.split(",")}
        except ValueError:
            parser.error(f"--cpus: not a list of CPU numbers: {args.cpus!r}")
        with contextlib.suppress(OSError):
            os.sched_setaffinity(0, cpus)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    _die_with_parent(args.parent)
    duration = min(max(args.duration, 0.0), MAX_DURATION_S)
    try:
        if args.kind == "burn":
            return _burn(args.parent, duration)
        target = min(max(args.target, 0.0), 0.95)
        cap = min(max(args.core_cap, 0.0), 0.95)
        return _softirq(args.parent, duration, target, cap, max(1.0, args.max_rate))
    except KeyboardInterrupt:
        return 0


if __name__ == "__main__":
    raise SystemExit(main())
