"""Injections: names, the GIL holder, and helper processes that stop by themselves."""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter.lab.refengine import inject


def test_parse_combines_and_rejects() -> None:
    assert inject.parse(["tokenizer-slow,softirq", "queue-flood"]) == {
        "tokenizer-slow",
        "softirq",
        "queue-flood",
    }
    assert inject.parse([]) == frozenset()
    assert inject.parse(["none"]) == frozenset()
    with pytest.raises(ValueError, match="unknown injection 'gpu-melt'"):
        inject.parse(["softirq,gpu-melt"])


def test_hold_gil_spends_cpu_time_of_this_thread() -> None:
    start = time.thread_time()
    inject.hold_gil("some text, with punctuation!", 0.05)
    assert 0.05 <= time.thread_time() - start < 0.5


def _net_rx() -> int:
    for line in Path("/proc/softirqs").read_text().splitlines():
        if line.strip().startswith("NET_RX:"):
            return sum(int(v) for v in line.split()[1:])
    raise AssertionError("no NET_RX line in /proc/softirqs")


def test_softirq_flood_raises_net_rx_and_stops_by_itself() -> None:
    before = _net_rx()
    started = time.monotonic()
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.lab.refengine.inject",
            "softirq",
            "--parent",
            str(os.getpid()),
            "--duration",
            "2",
        ],
        timeout=30,
        check=True,
    )
    assert proc.returncode == 0
    assert time.monotonic() - started < 15
    assert _net_rx() - before > 1000


def test_burner_stops_by_itself() -> None:
    started = time.monotonic()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.lab.refengine.inject",
            "burn",
            "--parent",
            str(os.getpid()),
            "--duration",
            "1",
        ],
        timeout=30,
        check=True,
    )
    assert time.monotonic() - started < 15


def test_helpers_die_with_their_parent(tmp_path: Path) -> None:
    # A parent that starts a helper for an hour and exits at once: the helper must follow.
    script = (
        "import subprocess, sys, os\n"
        "p = subprocess.Popen([sys.executable, '-m', 'exporter.lab.refengine.inject', 'burn', "
        "'--parent', str(os.getpid()), '--duration', '3600'])\n"
        "print(p.pid, flush=True)\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=30, check=True
    )
    pid = int(out.stdout.strip())
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        status = Path(f"/proc/{pid}/stat")
        if status.exists() and status.read_text().split()[2] == "Z":
            return
        time.sleep(0.1)
    os.kill(pid, 9)
    raise AssertionError("the helper outlived its parent")


def test_helpers_die_with_a_parent_whose_main_thread_ended(tmp_path: Path) -> None:
    # A parent whose main thread ends while a thread that started the helper lives on: the
    # parent shows as a zombie and keeps its PID, and the parent-death signal (sent when the
    # forking thread exits) never comes. The helper must see the zombie and stop.
    script = (
        "import ctypes, os, subprocess, sys, threading, time\n"
        "def start():\n"
        "    p = subprocess.Popen([sys.executable, '-m', 'exporter.lab.refengine.inject', "
        "'burn', '--parent', str(os.getpid()), '--duration', '3600'])\n"
        "    print(p.pid, flush=True)\n"
        "    time.sleep(30)\n"
        "threading.Thread(target=start).start()\n"
        "time.sleep(2)\n"
        "ctypes.CDLL(None).pthread_exit(None)\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, text=True, start_new_session=True
    )
    try:
        assert parent.stdout is not None
        pid = int(parent.stdout.readline().strip())
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            status = Path(f"/proc/{pid}/stat")
            try:
                state = status.read_text().rsplit(")", 1)[1].split()[0]
            except (OSError, IndexError):
                return
            if state == "Z":
                return
            time.sleep(0.1)
        os.kill(pid, 9)
        raise AssertionError("the helper outlived its parent's main thread")
    finally:
        parent.kill()
        parent.wait(10)
        if parent.stdout is not None:
            parent.stdout.close()


def test_helpers_stop() -> None:
    helpers = inject.Helpers.start(frozenset({"cpu-contention"}), duration=60, contention_procs=2)
    assert len(helpers.procs) == 2
    helpers.stop()
    assert all(p.poll() is not None for p in helpers.procs)


@pytest.mark.parametrize(("injections", "most"), [({"frontend-gil"}, 2), (set(), 0)])
def test_frontend_gil_preprocesses_a_bounded_number_of_requests_at_once(
    injections: set[str], most: int
) -> None:
    """A backlog of requests waits at the gate: the event loop's turn holds at most
    GIL_REQUESTS_AT_ONCE pre-processing slices, so the engine's /metrics keeps answering."""
    from exporter.lab.refengine.bpe import train  # noqa: PLC0415
    from exporter.lab.refengine.server import (  # noqa: PLC0415
        GIL_REQUESTS_AT_ONCE,
        Frontend,
        FrontendConfig,
    )
    from exporter.lab.refengine.worker import WorkerConfig  # noqa: PLC0415

    assert most in (0, GIL_REQUESTS_AT_ONCE)
    cfg = FrontendConfig(
        model_name="ref",
        max_model_len=64,
        injections=frozenset(injections),
        sizes={"gil_request_ms": 6.0},
    )
    frontend = Frontend(cfg, train(vocab_size=300), WorkerConfig(vocab_size=300, eos_id=0))
    inside = 0
    seen: list[int] = []

    async def gil(text: str, ms: float) -> None:  # the real one, counted
        nonlocal inside
        inside += 1
        seen.append(inside)
        try:
            inject.hold_gil(text, ms / 2000.0)
            await asyncio.sleep(0)
            inject.hold_gil(text, ms / 2000.0)
        finally:
            inside -= 1

    frontend._gil = gil  # type: ignore[method-assign]
    turns = 0

    async def main() -> None:
        work = asyncio.gather(*(frontend._preprocess(f"request {i}") for i in range(12)))
        while not work.done():  # what a scrape sees: the loop keeps turning
            nonlocal turns
            turns += 1
            await asyncio.sleep(0)
        await work

    asyncio.run(asyncio.wait_for(main(), timeout=30))
    assert max(seen, default=0) == most
    assert len(seen) == (12 if injections else 0)
    if injections:
        # the loop turned between the slices, at least once for each pair let through
        assert turns >= 12 // GIL_REQUESTS_AT_ONCE


def test_slow_tokenizer_takes_at_least_its_size_per_token() -> None:
    """tokenizer-slow at a size: the pure-Python path, then more pure-Python CPU of the
    tokenizer's thread up to the size per token; the ids stay the tokenizer's."""
    from exporter.lab.refengine.bpe import train  # noqa: PLC0415
    from exporter.lab.refengine.server import Frontend, FrontendConfig  # noqa: PLC0415
    from exporter.lab.refengine.worker import WorkerConfig  # noqa: PLC0415

    tok = train(vocab_size=300)
    cfg = FrontendConfig(
        model_name="ref", max_model_len=64, injections=frozenset({"tokenizer-slow"})
    )
    frontend = Frontend(cfg, tok, WorkerConfig(vocab_size=300, eos_id=0))
    text = "the river keeper counts boats in the evening"
    assert frontend.injection()["sizes"] == {"tokenizer_slow_us_per_token": 0.0}
    with pytest.raises(ValueError, match="decode-overhead is not injected"):
        frontend.resize({"tokenizer_slow_us_per_token": 2000.0, "decode_overhead_ms": 1.0})
    assert frontend.sizes["tokenizer_slow_us_per_token"] == 0.0  # all or nothing
    frontend.resize({"tokenizer_slow_us_per_token": 2000.0})
    began = time.thread_time()
    ids = frontend._encode_slow(text)
    took = time.thread_time() - began
    assert ids == tok.encode(text)
    assert took >= len(ids) * 0.002


_PIN = """
import json, os, sys, threading, time
from exporter.lab.refengine import inject
ev = threading.Event()
before = threading.Thread(target=ev.wait)  # a thread that runs before the pinning
before.start()
node = inject.pin_engine(frozenset(sys.argv[1].split(",")) - {""})
tasks = {t: sorted(os.sched_getaffinity(int(t))) for t in os.listdir("/proc/self/task")}
helpers = inject.Helpers.start(frozenset({"cpu-contention"}), duration=30, contention_procs=1,
                               cpus=node)
time.sleep(1.5)  # the burner sets its affinity as it starts
burner = sorted(os.sched_getaffinity(helpers.procs[0].pid))
helpers.stop()
ev.set()
before.join()
print(json.dumps({"node": node, "tasks": tasks, "burner": burner}))
"""


@pytest.mark.parametrize("injections", ["softirq", "cpu-contention,queue-flood"])
def test_softirq_pins_the_engine_to_the_flood_core_and_not_its_helpers(injections: str) -> None:
    """Issue 35: with softirq injected every thread of the engine (those started before too)
    runs on the flood's core, the last usable CPU, which the model worker inherits; the helpers
    keep the node's CPUs. Without it nothing is pinned."""
    import json  # noqa: PLC0415

    mine = sorted(os.sched_getaffinity(0))
    out = subprocess.run(
        [sys.executable, "-c", _PIN, injections], capture_output=True, timeout=60, check=True
    )
    got = json.loads(out.stdout)
    assert len(got["tasks"]) >= 2  # the main thread and the one started before
    if injections == "softirq":
        assert got["node"] == mine
        assert all(cpus == [mine[-1]] for cpus in got["tasks"].values()), got
    else:
        assert got["node"] == []
        assert all(cpus == mine for cpus in got["tasks"].values()), got
    assert got["burner"] == mine


def test_helper_cpus_must_be_numbers() -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "exporter.lab.refengine.inject",
            "burn",
            "--parent",
            "1",
            "--cpus",
            "0,x",
        ],
        capture_output=True,
        timeout=30,
        check=False,
    )
    assert proc.returncode == 2
    assert b"--cpus" in proc.stderr
