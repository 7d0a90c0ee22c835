"""Injections: names, the GIL holder, and helper processes that stop by themselves."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from exporter.lab.engine import inject


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
            "exporter.lab.engine.inject",
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
            "exporter.lab.engine.inject",
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
        "p = subprocess.Popen([sys.executable, '-m', 'exporter.lab.engine.inject', 'burn', "
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


def test_helpers_stop() -> None:
    helpers = inject.Helpers.start(frozenset({"cpu-contention"}), duration=60, contention_procs=2)
    assert len(helpers.procs) == 2
    helpers.stop()
    assert all(p.poll() is not None for p in helpers.procs)
